#!/usr/bin/env bash
# Checks an OCI archive of the storage-migrator image against the image contract: the index
# names REF, layers are gzip OCI layers, the config (Entrypoint, Cmd, User, WorkingDir, PATH,
# version label) is the Dockerfile's, the nonroot user and CA certificates exist, and every tool
# the copy/verify/measure Jobs' scripts call (src/build/job.rs) runs from the image's own root
# (unpacked with umoci, run with chroot), as does the operator binary, as root and as nonroot,
# and its `tree-diff`, which the final copy pass runs.
# Exits non-zero on the first failed check. Called by build-image.sh; needs root, umoci and jq.
#
# Usage: e2e/scripts/check-image.sh ARCHIVE REF
set -euo pipefail
exec </dev/null

[ $# -eq 2 ] || { echo "usage: $0 ARCHIVE REF" >&2; exit 2; }
ARCHIVE="$1"
REF="$2"
VERSION="${REF##*:}"
# What the Jobs' scripts and the mounter pod run (besides shell built-ins: printf, kill, trap).
TOOLS=(sh rsync cp du stat find sed grep sort tr head tail sleep sync date)
ENTRYPOINT=/usr/local/bin/storage-migrator
NONROOT=65532

log() { echo "check-image: $*" >&2; }
fail() { log "FAILED: $*"; exit 1; }
for t in umoci jq chroot; do command -v "$t" >/dev/null || fail "$t is not installed"; done
[ -s "$ARCHIVE" ] || fail "no archive at $ARCHIVE"

WORK="$(mktemp -d /tmp/check-image.XXXXXX)"
trap 'rm -rf "$WORK"' EXIT
mkdir "$WORK/layout"
tar -C "$WORK/layout" -xf "$ARCHIVE" || fail "$ARCHIVE is not a tar"
L="$WORK/layout"
blob() { echo "$L/blobs/${1%%:*}/${1#*:}"; }

# --- index, manifest, config ---------------------------------------------------------------
[ -f "$L/oci-layout" ] || fail "no oci-layout file"
refs="$(jq -r '.manifests[].annotations["org.opencontainers.image.ref.name"]' "$L/index.json")"
[ "$refs" = "$REF" ] || fail "index.json names [$refs], expected exactly $REF"
manifest="$(blob "$(jq -r '.manifests[0].digest' "$L/index.json")")"
bad_layers="$(jq -r '.layers[].mediaType | select(. != "application/vnd.oci.image.layer.v1.tar+gzip")' "$manifest")"
[ -z "$bad_layers" ] || fail "layers of unexpected media types: $bad_layers"
config="$(blob "$(jq -r '.config.digest' "$manifest")")"
expect_config() { # jq filter, expected JSON (compact)
  local got
  got="$(jq -c "$1" "$config")"
  [ "$got" = "$2" ] || fail "config $1 is $got, expected $2"
  log "config $1 = $got"
}
expect_config '.config.Entrypoint' "[\"$ENTRYPOINT\"]"
expect_config '.config.Cmd' '["run"]'
expect_config '.config.User' "\"$NONROOT:$NONROOT\""
expect_config '.config.WorkingDir' '"/"'
expect_config '[.config.Env[] | select(startswith("PATH="))]' \
  '["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"]'
expect_config '.config.Labels["org.opencontainers.image.version"]' "\"$VERSION\""
expect_config '.config.Labels["org.opencontainers.image.licenses"]' '"Apache-2.0"'
expect_config '[.os, .architecture]' '["linux","amd64"]'

# --- the root filesystem -------------------------------------------------------------------
R="$WORK/rootfs"
umoci --log error raw unpack --image "$L:$REF" "$R" || fail "umoci could not unpack the image"
grep -qx "nonroot:x:$NONROOT:$NONROOT:nonroot:/home/nonroot:/usr/sbin/nologin" "$R/etc/passwd" \
  || fail "no nonroot user $NONROOT in /etc/passwd"
grep -qx "nonroot:x:$NONROOT:" "$R/etc/group" || fail "no nonroot group $NONROOT in /etc/group"
grep -q "BEGIN CERTIFICATE" "$R/etc/ssl/certs/ca-certificates.crt" \
  || fail "no CA bundle at /etc/ssl/certs/ca-certificates.crt"
log "nonroot user and group $NONROOT, CA bundle ($(grep -c 'BEGIN CERTIFICATE' "$R/etc/ssl/certs/ca-certificates.crt") certificates)"

# Each tool is looked up with the image's PATH inside the image's root, so a host program can
# never stand in for a missing one.
IMAGE_PATH="/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
in_image() { env -i "PATH=$IMAGE_PATH" chroot "$@"; }
for t in "${TOOLS[@]}"; do
  where="$(in_image "$R" /bin/sh -c "command -v $t")" || fail "$t is not in the image"
  log "tool $t: $where"
done
# rsync must keep ACLs and xattrs (-A -X) and hard links (-H); its banner lists what it can do.
banner="$(in_image "$R" rsync --version)" || fail "rsync does not run in the image"
for cap in ACLs xattrs hardlinks; do
  case "$banner" in *"$cap"*) ;; *) fail "the image's rsync lacks $cap" ;; esac
done
log "rsync: $(printf '%s\n' "$banner" | head -n1)"
# The first copy pass uses cp only when it is GNU's (what its script checks).
cpv="$(in_image "$R" cp --version)" || fail "cp --version does not run in the image"
case "$cpv" in *"GNU coreutils"*) ;; *) fail "the image's cp is not GNU coreutils' (the first pass would fall back to rsync)" ;; esac
log "cp: $(printf '%s\n' "$cpv" | head -n1)"
used="$(in_image "$R" du -s -B1 /etc)" || fail "du -s -B1 does not run in the image"
log "du -s -B1 /etc: ${used%%[!0-9]*} bytes"
got="$(in_image "$R" /bin/sh -c 'printf "%s\n" "a,1.2" | sed -n "s/^a,\(.*\)/\1/p" | tr -d ".," | head -n 1 | grep -c 12')" \
  || fail "sh | sed | tr | head | grep pipeline failed in the image"
[ "$got" = 1 ] || fail "sh | sed | tr | head | grep printed $got, expected 1"

# --- the operator binary, run from the image's root as root and as nonroot -----------------
[ -x "$R$ENTRYPOINT" ] || fail "no executable $ENTRYPOINT"
v="$(in_image "$R" "$ENTRYPOINT" --version)" || fail "$ENTRYPOINT does not run in the image"
[ "$v" = "storage-migrator $VERSION" ] || fail "$ENTRYPOINT --version printed '$v'"
in_image --userspec="$NONROOT:$NONROOT" "$R" "$ENTRYPOINT" crd >"$WORK/crd.yaml" \
  || fail "$ENTRYPOINT does not run as $NONROOT:$NONROOT in the image"
grep -q "kind: CustomResourceDefinition" "$WORK/crd.yaml" || fail "$ENTRYPOINT crd printed no CRD"
log "operator: '$v', runs as $NONROOT:$NONROOT"
# The final pass lists what to copy with it, by the name its script calls, from the PATH.
td="$(in_image "$R" /bin/sh -c 'storage-migrator tree-diff /etc /etc --since 4102444800 --output /tmp/smr-list')" \
  || fail "storage-migrator tree-diff does not run in the image"
case "$td" in *" listed=0 "*) ;; *) fail "tree-diff of /etc with itself printed '$td', expected listed=0" ;; esac
rm -f "$R/tmp/smr-list"
log "tree-diff /etc /etc: $td"
log "OK: $ARCHIVE ($REF; tools: ${TOOLS[*]}; rsync with ACLs, xattrs, hard links; GNU cp)"
