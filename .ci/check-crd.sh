#!/usr/bin/env bash
# Fails (with a diff) when the checked-in CRD YAML is stale: the top-level crds/ file or the copy
# the Helm chart ships. The CRD is generated from the Rust types (`storage-migrator crd`).
#   .ci/check-crd.sh          check
#   .ci/check-crd.sh --fix    regenerate both files
# CRDGEN_BIN=path/to/storage-migrator uses an already built binary (the test script sets it, so
# the workspace is not compiled a second time with other features).
set -euo pipefail
cd "$(dirname "$0")/.."

files=(crds/storagemigrationrequests.yaml charts/storage-migrator/crds/storagemigrationrequests.yaml)
generated=$(mktemp)
trap 'rm -f "$generated"' EXIT
if [[ -n "${CRDGEN_BIN:-}" ]]; then
  "$CRDGEN_BIN" crd >"$generated"
else
  # With every feature, as `cargo build --workspace --all-features` builds it: without, cargo
  # would re-link target/debug/storage-migrator without failpoints, and the e2e tests that set
  # one would then run a binary that ignores it.
  cargo run -q -p storage-migrator --all-features -- crd >"$generated"
fi

if [[ "${1:-}" == "--fix" ]]; then
  for f in "${files[@]}"; do
    mkdir -p "$(dirname "$f")"
    cp "$generated" "$f"
    echo "regenerated $f"
  done
  exit 0
fi

stale=0
for f in "${files[@]}"; do
  if [[ ! -f "$f" ]]; then
    echo "check-crd: $f is missing" >&2
    stale=1
  elif ! diff -u --label "$f (checked in)" --label "$f (generated)" "$f" "$generated"; then
    stale=1
  fi
done
if ((stale)); then
  echo "check-crd: the CRD is stale; regenerate with: .ci/check-crd.sh --fix" >&2
  exit 1
fi
echo "check-crd: ${files[*]} up to date"
