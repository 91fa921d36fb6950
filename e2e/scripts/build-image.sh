#!/usr/bin/env bash
# Builds the project's image, ghcr.io/storage-migrator/storage-migrator:<version>, on this machine
# without a registry, from the repository's Dockerfile and Debian's packages, and writes it as an
# OCI archive (see "Building the image" in the README):
#
#   1. the runtime root: a Debian 12 root made by mmdebstrap (variant essential plus
#      RUNTIME_PKGS, docs/man/locales left out, the nonroot user), apt sources taken from this
#      machine's own configuration; cached as a tar under the cache root of install-deps.sh,
#      keyed by BASE_REV, the package list and those sources, and imported once as an image into
#      a buildah storage that is kept under the same cache root;
#   2. the operator: cargo build --release --locked --bin storage-migrator, on the host;
#   3. buildah build of the Dockerfile with BINARY=context and RUNTIME_BASE=<the local root>: only
#      its RUN-free stages are built, so no container runtime and no registry are needed;
#   4. buildah push to target/image/storage-migrator-<version>.oci.tar (an OCI archive whose
#      index names the full reference), then check-image.sh checks what is inside.
#
# Needs root (mmdebstrap --mode=root, buildah's storage). One run at a time: it empties its
# buildah storage of everything but the cached base after each build. Installs buildah, mmdebstrap and umoci
# and jq with apt when missing. Idempotent; a warm run rebuilds only the final image. Never reads stdin.
#
# Usage: e2e/scripts/build-image.sh          (prints the archive's path on stdout)
# Env:   IMAGE_ARCHIVE=PATH                  write the archive elsewhere
#        STORAGE_MIGRATOR_CACHE=DIR          cache root (default ~/.cache/storage-migrator)
set -euo pipefail
exec </dev/null

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
CACHE_ROOT="${STORAGE_MIGRATOR_CACHE:-${XDG_CACHE_HOME:-${HOME:-/root}/.cache}/storage-migrator}"
# Bump BASE_REV when the way the root is made changes (the package list is in the key already).
BASE_REV="r1"
SUITE="bookworm"
# What the copy/verify/measure Jobs' scripts need beyond the essential set (sh, coreutils' du,
# stat, head, tail, tr, sort and stdbuf, GNU find, sed, grep): rsync, and CA certificates for the operator. Keep in step with the
# `runtime-debian` stage of the Dockerfile.
RUNTIME_PKGS=(rsync ca-certificates)
IMAGE_REPO="ghcr.io/storage-migrator/storage-migrator"
BUILDAH_DIR="$CACHE_ROOT/buildah"

log() { echo "build-image: $*" >&2; }
die() { log "error: $*"; exit 1; }
now() { date +%s.%N; }
took() { awk -v a="$1" -v b="$(now)" 'BEGIN{printf "%.1f s", b-a}'; }

[ "$(id -u)" = 0 ] || die "must run as root (mmdebstrap --mode=root and buildah's storage)"

VERSION="$(awk -F'"' '/^\[package\]/{p=1; next} /^\[/{p=0} p && /^version *=/{print $2; exit}' "$ROOT/Cargo.toml")"
[ -n "$VERSION" ] || die "no [package] version in $ROOT/Cargo.toml"
REF="$IMAGE_REPO:$VERSION"
OUT="${IMAGE_ARCHIVE:-$ROOT/target/image/storage-migrator-$VERSION.oci.tar}"

install_tools() {
  local need=() p
  for p in buildah mmdebstrap umoci jq; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || need+=("$p")
  done
  [ ${#need[@]} -eq 0 ] && return 0
  log "apt-get install ${need[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >&2
  apt-get install -y -qq --no-install-recommends "${need[@]}" >&2
}

# The machine's own apt sources for $SUITE (binary entries only), in deb822 form on stdout, so
# that no mirror is named here: deb822 stanzas of /etc/apt/sources.list.d/*.sources whose Types
# include `deb`, and one-line `deb` entries of sources.list and *.list.
host_sources() {
  local f
  for f in /etc/apt/sources.list.d/*.sources; do
    [ -f "$f" ] || continue
    awk -v suite="$SUITE" 'BEGIN{RS=""; ORS="\n\n"}
      $0 ~ "(^|\n)Types:[^\n]*[ \t]deb([ \t]|\n|$)" && $0 ~ "(^|\n)Suites:[^\n]*" suite &&
      $0 !~ "(^|\n)Enabled: *no" { sub(/Types:[^\n]*/, "Types: deb"); print }' "$f"
  done
  for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
    [ -f "$f" ] || continue
    awk -v suite="$SUITE" '$1 == "deb" && $0 ~ "[ \t]" suite "[ \t-]" { print; print "" }' "$f"
  done
}

# mmdebstrap's options apart from the sources; part of the cache key.
mmdebstrap_opts() {
  local IFS=,
  printf '%s\n' --mode=root --variant=essential "--include=${RUNTIME_PKGS[*]}" --format=tar \
    --skip=output/dev \
    --hook-dir=/usr/share/mmdebstrap/hooks/merged-usr \
    '--dpkgopt=path-exclude=/usr/share/man/*' '--dpkgopt=path-exclude=/usr/share/info/*' \
    '--dpkgopt=path-exclude=/usr/share/locale/*' '--dpkgopt=path-exclude=/usr/share/doc/*' \
    '--dpkgopt=path-include=/usr/share/doc/*/copyright' \
    "--customize-hook=echo 'nonroot:x:65532:65532:nonroot:/home/nonroot:/usr/sbin/nologin' >> \"\$1/etc/passwd\"" \
    "--customize-hook=echo 'nonroot:x:65532:' >> \"\$1/etc/group\"" \
    "--customize-hook=install -d -m 0755 -o 65532 -g 65532 \"\$1/home/nonroot\""
}

# Makes (once) the runtime root tar $1 with mmdebstrap from the sources file $2.
make_base_tar() {
  local tar="$1" sources="$2" opts=()
  [ -s "$tar" ] && { log "runtime root cached: $tar"; return 0; }
  mapfile -t opts < <(mmdebstrap_opts)
  log "making the runtime root with mmdebstrap ($SUITE, essential + ${RUNTIME_PKGS[*]})"
  mkdir -p "$(dirname "$tar")"
  local t0; t0="$(now)"
  mmdebstrap --quiet "${opts[@]}" "$SUITE" "$tar.tmp" "$sources" >&2
  mv "$tar.tmp" "$tar"
  log "runtime root made in $(took "$t0"): $tar ($(du -h "$tar" | cut -f1))"
}

buildah_() { buildah --root "$BUILDAH_DIR/root" --runroot "$BUILDAH_DIR/run" --storage-driver vfs "$@"; }

# Imports (once) the runtime root tar $1 as the image $2 in the dedicated buildah storage.
import_base() {
  local tar="$1" image="$2" ctr
  if buildah_ inspect --type image "$image" >/dev/null 2>&1; then
    log "runtime base image cached: $image"
    return 0
  fi
  log "importing the runtime root as $image"
  ctr="$(buildah_ from scratch)"
  if ! { buildah_ add "$ctr" "$tar" / >/dev/null && buildah_ commit --quiet --rm "$ctr" "$image" >/dev/null; }; then
    buildah_ rm "$ctr" >/dev/null 2>&1 || true
    die "could not import $tar"
  fi
}

build_binary() {
  log "cargo build --release --locked --bin storage-migrator"
  local t0; t0="$(now)"
  (cd "$ROOT" && cargo build --release --locked --bin storage-migrator >&2)
  # The Dockerfile takes target/release/storage-migrator from the build context ($ROOT): when
  # cargo builds elsewhere (CARGO_TARGET_DIR), the binary is copied there.
  local built="${CARGO_TARGET_DIR:-$ROOT/target}/release/storage-migrator"
  local context="$ROOT/target/release/storage-migrator"
  case "$built" in /*) ;; *) built="$ROOT/$built" ;; esac
  [ -x "$built" ] || die "cargo built no $built"
  if [ "$(realpath "$built")" != "$(realpath -m "$context")" ]; then
    install -D -m 0755 "$built" "$context"
  fi
  log "operator binary built in $(took "$t0")"
}

# buildah build of the Dockerfile from the local parts, then the OCI archive.
build_image() {
  local base_image="$1" t0
  t0="$(now)"
  log "buildah build $REF (BINARY=context, RUNTIME_BASE=$base_image)"
  buildah_ build --quiet --pull=never --layers=false \
    --build-arg BINARY=context --build-arg "RUNTIME_BASE=$base_image" \
    --build-arg "VERSION=$VERSION" \
    -t "$REF" -f "$ROOT/Dockerfile" "$ROOT" >/dev/null
  mkdir -p "$(dirname "$OUT")"
  rm -f "$OUT.tmp"
  buildah_ push --quiet "$REF" "oci-archive:$OUT.tmp:$REF" >&2
  mv "$OUT.tmp" "$OUT"
  # Keep only the runtime base in the dedicated storage (the image lives on in the archive):
  # buildah 1.28 leaves the working containers of stages used by COPY --from, and their images.
  buildah_ rm --all >/dev/null
  buildah_ rmi "$REF" >/dev/null
  buildah_ rmi --prune >/dev/null
  log "image built and archived in $(took "$t0")"
}

SOURCES=""
cleanup() { [ -z "$SOURCES" ] || rm -f "$SOURCES"; }
trap cleanup EXIT

main() {
  local start sources key base_tar base_image
  start="$(now)"
  install_tools
  sources="$(mktemp /tmp/build-image-sources.XXXXXX)"
  SOURCES="$sources"
  host_sources > "$sources"
  grep -q '^Types: deb\|^deb ' "$sources" \
    || die "no '$SUITE' deb entry in this machine's apt sources (/etc/apt/sources.list[.d])"
  key="$( { echo "$BASE_REV"; mmdebstrap_opts; cat "$sources"; } | sha256sum | cut -c1-12)"
  base_tar="$CACHE_ROOT/image-base-$BASE_REV-$key/rootfs.tar"
  base_image="localhost/storage-migrator-runtime-base:$BASE_REV-$key"

  make_base_tar "$base_tar" "$sources"
  import_base "$base_tar" "$base_image"
  build_binary
  build_image "$base_image"
  bash "$ROOT/e2e/scripts/check-image.sh" "$OUT" "$REF" >&2
  log "done in $(took "$start"): $OUT ($(du -h "$OUT" | cut -f1))"
  echo "$OUT"
}

main "$@"
