# Helpers for scripts that make Debian roots with mmdebstrap and turn them into OCI archives
# with buildah, without a registry: sourced by build-test-image.sh. (build-image.sh keeps its
# own copy of host_sources and the tool install for now: src/image.rs reads that script's text.)
#
# Before sourcing, set LOG_PREFIX (what log lines start with) and SUITE (e.g. bookworm).
# Provides: log, die, now, took, cache_root, install_tools, host_sources, buildah_ (needs
# BUILDAH_DIR set before its first call).

log() { echo "${LOG_PREFIX:-debian-root}: $*" >&2; }
die() { log "error: $*"; exit 1; }
now() { date +%s.%N; }
took() { awk -v a="$1" -v b="$(now)" 'BEGIN{printf "%.1f s", b-a}'; }

# The cache root shared with install-deps.sh and build-image.sh.
cache_root() {
  echo "${STORAGE_MIGRATOR_CACHE:-${XDG_CACHE_HOME:-${HOME:-/root}/.cache}/storage-migrator}"
}

# Installs the Debian packages named in "$@" that are missing (apt-get, non-interactive).
install_tools() {
  local need=() p
  for p in "$@"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || need+=("$p")
  done
  [ ${#need[@]} -eq 0 ] && return 0
  log "apt-get install ${need[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >&2
  apt-get install -y -qq --no-install-recommends "${need[@]}" >&2
}

# The machine's own apt sources for $SUITE (binary entries only), in deb822 form on stdout, so
# that no mirror is named in any script: deb822 stanzas of /etc/apt/sources.list.d/*.sources
# whose Types include `deb`, and one-line `deb` entries of sources.list and *.list.
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

# buildah on a storage of its own (vfs driver: no overlay mounts needed).
buildah_() { buildah --root "$BUILDAH_DIR/root" --runroot "$BUILDAH_DIR/run" --storage-driver vfs "$@"; }
