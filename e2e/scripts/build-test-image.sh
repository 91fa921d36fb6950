#!/usr/bin/env bash
# Builds a test database image by name, from Debian bookworm's packages and without a registry,
# and writes it as an OCI archive that `localcluster image load` takes:
#
#   1. a Debian root made by mmdebstrap (variant essential plus the image's packages, docs/man/
#      locales left out), apt sources taken from this machine's own configuration (as
#      build-image.sh does);
#   2. smoke checks of the image's programs, run from that root with chroot as the image's user;
#   3. buildah: the root imported from scratch, the image config (Entrypoint, Cmd, User as
#      uid:gid of the image's own user, WorkingDir, Env, labels with the packages' versions),
#      pushed as an OCI archive (gzip layers) whose index names the reference.
#
# The archive is cached under the cache root (~/.cache/storage-migrator/test-images/), keyed by
# the image's name, this script, its helpers, the mmdebstrap options (the package list and the
# hooks) and the apt sources: a second run prints the cached path at once. A new key builds anew
# and removes the older archives of the same name.
#
# Images (NAME: reference; user; entrypoint):
#   patroni    storage-migrator.test/patroni:pg15-bookworm; postgres; /usr/bin/patroni, which
#              takes its configuration from PATRONI_CONFIGURATION (or PATRONI_* variables).
#              postgresql-15, patroni (3.0.2) and python3-etcd (its etcd and etcd3 DCS modules
#              both import python-etcd; etcd3 talks to the v3 gRPC gateway with urllib3).
#              No cluster is created by the package (PGDATA comes from Patroni's config); no
#              /run/postgresql in a container: set unix_socket_directories (e.g. /tmp).
#   redis      storage-migrator.test/redis:7.0-bookworm; redis; /usr/bin/redis-server (no
#              config file: Redis' defaults, so protected mode is on: pass e.g.
#              `--protected-mode no` or a config). redis-sentinel and redis-cli are there too
#              (command: redis-sentinel CONF, with CONF writable: Sentinel rewrites it).
#   zookeeper  storage-migrator.test/zookeeper:3.8-bookworm; zookeeper; java ... QuorumPeerMain,
#              Cmd /etc/zookeeper/conf/zoo.cfg (Debian's example: standalone, dataDir
#              /tmp/zookeeper): args: [CONFIG] for another. ZooKeeper 3.8.0 and OpenJDK 17.
#   To add one: a define_NAME function setting what define_patroni sets, a smoke_NAME
#   function, and NAME in NAMES; nothing else changes.
#
# Needs root (mmdebstrap --mode=root, buildah's storage). Installs buildah, mmdebstrap and jq
# with apt when missing. Builds hold a lock (one at a time; a buildah storage of their own under
# the cache root, not build-image.sh's). Never reads stdin.
#
# Usage: e2e/scripts/build-test-image.sh NAME     prints the archive's path on stdout (logs on stderr)
#        e2e/scripts/build-test-image.sh --list   prints the names it knows
#        e2e/scripts/build-test-image.sh --ref NAME   prints the image reference only (no build)
# Env:   STORAGE_MIGRATOR_CACHE=DIR               cache root (default ~/.cache/storage-migrator)
set -euo pipefail
exec </dev/null

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
LOG_PREFIX="build-test-image"
SUITE="bookworm"
# Bump when the way images are made changes in a way the key does not see.
IMAGE_REV="r1"
# shellcheck source=lib/debian-root.sh
. "$HERE/lib/debian-root.sh"

NAMES=(patroni redis zookeeper)
REPO_PREFIX="storage-migrator.test"
BASE_PATH="/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

# --- the images --------------------------------------------------------------------------------
# Each define_NAME sets:
#   TAG         the reference's tag (stable: fixtures name it)
#   PKGS        Debian packages on top of the essential set
#   RUN_USER    the image's user, by name (created by a package; the config gets its uid:gid)
#   ENTRYPOINT  array; CMD array (may be empty)
#   WORKDIR     the image's working directory
#   ENV_VARS    array of NAME=VALUE for the config (PATH included)
#   HOOKS       array of extra mmdebstrap options (hooks), part of the cache key
# and smoke_NAME ROOT USERSPEC runs checks in the unpacked root (see in_root), printing on
# stderr, and sets LABEL_VERSION (the main program's version, for the labels).

define_patroni() {
  TAG="pg15-bookworm"
  PKGS=(postgresql-15 patroni python3-etcd)
  RUN_USER="postgres"
  ENTRYPOINT=(/usr/bin/patroni)
  CMD=()
  WORKDIR="/var/lib/postgresql"
  ENV_VARS=("PATH=/usr/lib/postgresql/15/bin:$BASE_PATH" "LANG=C.UTF-8")
  # postgresql-common's postinst creates (and would start) a cluster 15/main: the image runs
  # none, so its data and config directories go (Patroni makes its data dir from its config).
  # The empty /var/run/postgresql stays out too: containers get a fresh /run.
  HOOKS=(
    '--customize-hook=rm -rf "$1/var/lib/postgresql/15" "$1/etc/postgresql/15"'
    '--customize-hook=rm -rf "$1/var/log/postgresql"/*'
  )
}

smoke_patroni() {
  local root="$1" user="$2" v
  v="$(in_root "$root" "$user" patroni --version)" || die "patroni --version failed in the image"
  log "smoke: $v"
  LABEL_VERSION="${v##* }"
  v="$(in_root "$root" "$user" postgres --version)" || die "postgres --version failed in the image"
  case "$v" in *"(PostgreSQL) 15."*) ;; *) die "postgres on the image's PATH is '$v', not 15" ;; esac
  log "smoke: $v ($(in_root "$root" "$user" sh -c 'command -v postgres'))"
  in_root "$root" "$user" pg_ctl --version >/dev/null || die "pg_ctl does not run"
  in_root "$root" "$user" psql --version >/dev/null || die "psql does not run"
  # The DCS modules Patroni loads for `etcd3:` and `etcd:` configs, and the PostgreSQL driver.
  in_root "$root" "$user" python3 -c 'import patroni.dcs.etcd3, patroni.dcs.etcd, psycopg2, urllib3' \
    || die "patroni's etcd3 DCS module does not import in the image"
  log "smoke: patroni.dcs.etcd3 imports"
  [ ! -e "$root/var/lib/postgresql/15/main" ] || die "a 15/main cluster was left in the image"
  [ -x "$root/usr/lib/postgresql/15/bin/initdb" ] || die "no /usr/lib/postgresql/15/bin/initdb"
}

define_redis() {
  TAG="7.0-bookworm"
  PKGS=(redis-server redis-sentinel)
  RUN_USER="redis"
  ENTRYPOINT=(/usr/bin/redis-server)
  CMD=()
  WORKDIR="/var/lib/redis"
  ENV_VARS=("PATH=$BASE_PATH" "LANG=C.UTF-8")
  HOOKS=()
}

smoke_redis() {
  local root="$1" user="$2" v p
  for p in redis-server redis-sentinel redis-cli; do
    v="$(in_root "$root" "$user" "$p" --version)" || die "$p --version failed in the image"
    log "smoke: $v"
  done
  v="$(in_root "$root" "$user" redis-server --version)"
  LABEL_VERSION="$(printf '%s\n' "$v" | sed -n 's/.* v=\([^ ]*\).*/\1/p')"
}

define_zookeeper() {
  TAG="3.8-bookworm"
  PKGS=(zookeeper default-jre-headless)
  RUN_USER="zookeeper"
  # The JVM straight away, not zkServer.sh: Debian's zkEnv.sh (its /etc/zookeeper/conf/environment)
  # sets ZOOCFG and file logging whatever the environment says, and its class path has no SLF4J
  # binding (nothing is logged). Here log4j 1.2 logs to the console (Debian's log4j.properties)
  # and the config file is the argument (Cmd: Debian's example, standalone, dataDir
  # /tmp/zookeeper). Four-letter words: only `srvr` is allowed by default (4lw.commands.whitelist).
  ENTRYPOINT=(/usr/bin/java -Xmx512m -XX:+ExitOnOutOfMemoryError
    -Dzookeeper.root.logger=INFO,CONSOLE -Dzookeeper.log.dir=/tmp
    -cp /etc/zookeeper/conf:/usr/share/java/zookeeper.jar:/usr/share/java/slf4j-log4j12.jar:/usr/share/java/log4j-1.2.jar
    org.apache.zookeeper.server.quorum.QuorumPeerMain)
  CMD=(/etc/zookeeper/conf/zoo.cfg)
  WORKDIR="/var/lib/zookeeper"
  ENV_VARS=("PATH=$BASE_PATH" "LANG=C.UTF-8")
  # The JRE's postinst links its man pages with update-alternatives, which fails when
  # /usr/share/man/man1 is missing (man pages are left out): the directory exists first.
  HOOKS=('--essential-hook=mkdir -p "$1/usr/share/man/man1"')
}

smoke_zookeeper() {
  local root="$1" user="$2" v
  v="$(in_root "$root" "$user" java -version 2>&1)" || die "java -version failed in the image"
  log "smoke: $(printf '%s\n' "$v" | head -n1)"
  [ -x "$root/usr/share/zookeeper/bin/zkServer.sh" ] || die "no /usr/share/zookeeper/bin/zkServer.sh"
  v="$(in_root "$root" "$user" sh -c 'java -cp "/usr/share/java/*" org.apache.zookeeper.version.VersionInfoMain')" \
    || die "ZooKeeper's classes do not load in the image"
  log "smoke: zookeeper $v"
  in_root "$root" "$user" test -r /usr/share/java/slf4j-log4j12.jar -a -r /usr/share/java/log4j-1.2.jar \
    || die "no SLF4J binding for log4j 1.2 in the image (ZooKeeper would log nothing)"
  LABEL_VERSION="$(printf '%s\n' "$v" | sed -n 's/.*version \([0-9][0-9.]*\).*/\1/p')"
}

# --- building ----------------------------------------------------------------------------------

# Runs "$@" in the root $1 as the user $2 (uid:gid) with the image's PATH and nothing else of
# this machine's environment, so a host program can never stand in for a missing one. A /proc
# is mounted there in a mount namespace of its own (gone with the command; psutil, which
# Patroni imports, wants /proc/stat).
in_root() {
  local root="$1" user="$2"; shift 2
  local path
  path="$(printf '%s\n' "${ENV_VARS[@]}" | sed -n 's/^PATH=//p')"
  env -i "PATH=${path:-$BASE_PATH}" LANG=C.UTF-8 HOME=/nonexistent \
    unshare --mount --propagation private -- /bin/sh -c \
      'root="$1"; user="$2"; shift 2; mount -t proc proc "$root/proc" && exec chroot --userspec="$user" "$root" "$@"' \
      in_root "$root" "$user" "$@"
}

# "$@" (no newlines in them) as a JSON array of strings (jq 1.6's --args would take words that
# start with - as options).
json_array() { printf '%s\n' "$@" | jq -cRn '[inputs]'; }

# mmdebstrap's options apart from the sources; part of the cache key.
mmdebstrap_opts() {
  local IFS=,
  printf '%s\n' --mode=root --variant=essential "--include=${PKGS[*]}" --format=tar \
    --skip=output/dev \
    --hook-dir=/usr/share/mmdebstrap/hooks/merged-usr \
    '--dpkgopt=path-exclude=/usr/share/man/*' '--dpkgopt=path-exclude=/usr/share/info/*' \
    '--dpkgopt=path-exclude=/usr/share/locale/*' '--dpkgopt=path-exclude=/usr/share/doc/*' \
    '--dpkgopt=path-include=/usr/share/doc/*/copyright' \
    '--customize-hook=rm -rf "$1"/var/cache/apt/* "$1"/var/lib/apt/lists/*'
  [ ${#HOOKS[@]} -eq 0 ] || printf '%s\n' "${HOOKS[@]}"
}

# The user's uid:gid from the root's /etc/passwd.
user_ids() {
  local root="$1" name="$2" ids
  ids="$(awk -F: -v n="$name" '$1 == n {print $3 ":" $4; exit}' "$root/etc/passwd")"
  [ -n "$ids" ] || die "no user $name in the image's /etc/passwd"
  echo "$ids"
}

# The installed versions of the image's packages, "name=version ..." (from the root's dpkg).
pkg_versions() {
  local root="$1" p out=()
  for p in "${PKGS[@]}"; do
    out+=("$p=$(dpkg-query --admindir="$root/var/lib/dpkg" -W -f='${Version}' "$p")")
  done
  echo "${out[*]}"
}

# Builds the archive $1 for reference $2 from the sources file $3.
build_archive() {
  local out="$1" ref="$2" sources="$3" work opts=() t0 ctr mnt ids label_pkgs img
  work="$(mktemp -d "$CACHE_DIR/work.XXXXXX")"
  WORK="$work"
  mapfile -t opts < <(mmdebstrap_opts)
  log "making the root with mmdebstrap ($SUITE, essential + ${PKGS[*]})"
  t0="$(now)"
  # Not --quiet: that would hide apt's and dpkg's own error messages.
  mmdebstrap "${opts[@]}" "$SUITE" "$work/rootfs.tar" "$sources" >&2
  log "root made in $(took "$t0") ($(du -h "$work/rootfs.tar" | cut -f1))"

  t0="$(now)"
  ctr="$(buildah_ from scratch)"
  CTR="$ctr"
  buildah_ add "$ctr" "$work/rootfs.tar" / >/dev/null
  rm -f "$work/rootfs.tar"
  mnt="$(buildah_ mount "$ctr")"
  ids="$(user_ids "$mnt" "$RUN_USER")"
  log "user $RUN_USER is $ids"
  LABEL_VERSION=""
  "smoke_$NAME" "$mnt" "$ids"
  label_pkgs="$(pkg_versions "$mnt")"
  log "packages: $label_pkgs"
  buildah_ umount "$ctr" >/dev/null

  local cfg=(--user "$ids" --workingdir "$WORKDIR"
    --entrypoint "$(json_array "${ENTRYPOINT[@]}")"
    --label "org.opencontainers.image.title=$NAME"
    --label "org.opencontainers.image.version=$LABEL_VERSION"
    --label "org.opencontainers.image.description=storage-migrator test image $NAME ($SUITE)"
    --label "storage-migrator.test/packages=$label_pkgs"
    --os linux --arch amd64)
  local e
  for e in "${ENV_VARS[@]}"; do cfg+=(--env "$e"); done
  [ ${#CMD[@]} -eq 0 ] || cfg+=(--cmd "$(json_array "${CMD[@]}")")
  buildah_ config "${cfg[@]}" "$ctr"
  img="localhost/storage-migrator-test-$NAME:$KEY"
  buildah_ commit --quiet --rm "$ctr" "$img" >/dev/null
  CTR=""
  rm -f "$out.tmp"
  OUT_TMP="$out.tmp"
  buildah_ push --quiet "$img" "oci-archive:$out.tmp:$ref" >&2
  buildah_ rmi "$img" >/dev/null
  check_archive "$out.tmp" "$ref"
  mv "$out.tmp" "$out"
  OUT_TMP=""
  log "image committed and archived in $(took "$t0")"
  rm -rf "$work"
  WORK=""
}

# The archive's index names exactly $2, its layers are gzip OCI layers, its config has the
# entrypoint and user asked for.
check_archive() {
  local archive="$1" ref="$2" d refs manifest config
  d="$(mktemp -d "$CACHE_DIR/check.XXXXXX")"
  CHECK_DIR="$d"
  tar -C "$d" -xf "$archive" oci-layout index.json
  refs="$(jq -r '.manifests[].annotations["org.opencontainers.image.ref.name"]' "$d/index.json")"
  [ "$refs" = "$ref" ] || die "the archive's index names [$refs], expected $ref"
  manifest="$(jq -r '.manifests[0].digest | sub(":"; "/")' "$d/index.json")"
  tar -C "$d" -xf "$archive" "blobs/$manifest"
  [ -z "$(jq -r '.layers[].mediaType | select(. != "application/vnd.oci.image.layer.v1.tar+gzip")' "$d/blobs/$manifest")" ] \
    || die "the archive has layers that are not tar+gzip"
  config="$(jq -r '.config.digest | sub(":"; "/")' "$d/blobs/$manifest")"
  tar -C "$d" -xf "$archive" "blobs/$config"
  log "config: $(jq -c '{User: .config.User, Entrypoint: .config.Entrypoint, Cmd: .config.Cmd, WorkingDir: .config.WorkingDir}' "$d/blobs/$config")"
  [ "$(jq -c '.config.Entrypoint' "$d/blobs/$config")" = "$(json_array "${ENTRYPOINT[@]}")" ] \
    || die "the archive's Entrypoint is not ${ENTRYPOINT[*]}"
  rm -rf "$d"
  CHECK_DIR=""
}

usage() {
  echo "usage: $0 NAME | --list | --ref NAME   (NAME: ${NAMES[*]})" >&2
  exit 2
}

WORK=""
CTR=""
SOURCES=""
CHECK_DIR=""
OUT_TMP=""
cleanup() {
  [ -z "$CTR" ] || buildah_ rm "$CTR" >/dev/null 2>&1 || true
  [ -z "$WORK" ] || rm -rf "$WORK"
  [ -z "$CHECK_DIR" ] || rm -rf "$CHECK_DIR"
  [ -z "$OUT_TMP" ] || rm -f "$OUT_TMP"
  [ -z "$SOURCES" ] || rm -f "$SOURCES"
}

main() {
  [ $# -ge 1 ] || usage
  case "$1" in
    --list) printf '%s\n' "${NAMES[@]}"; return 0 ;;
    --ref) [ $# -eq 2 ] || usage; ONLY_REF=1; shift ;;
    -*) usage ;;
    *) [ $# -eq 1 ] || usage; ONLY_REF=0 ;;
  esac
  NAME="$1"
  local known=0 n
  for n in "${NAMES[@]}"; do [ "$n" = "$NAME" ] && known=1; done
  [ "$known" = 1 ] || { log "unknown image '$NAME'"; usage; }
  "define_$NAME"
  local ref="$REPO_PREFIX/$NAME:$TAG"
  if [ "$ONLY_REF" = 1 ]; then echo "$ref"; return 0; fi

  [ "$(id -u)" = 0 ] || die "must run as root (mmdebstrap --mode=root and buildah's storage)"
  local start; start="$(now)"
  local cache; cache="$(cache_root)"
  CACHE_DIR="$cache/test-images"
  BUILDAH_DIR="$cache/buildah-test-images"
  mkdir -p "$CACHE_DIR"

  SOURCES="$(mktemp /tmp/build-test-image-sources.XXXXXX)"
  host_sources > "$SOURCES"
  grep -q '^Types: deb\|^deb ' "$SOURCES" \
    || die "no '$SUITE' deb entry in this machine's apt sources (/etc/apt/sources.list[.d])"
  KEY="$( { echo "$IMAGE_REV $NAME $ref"; mmdebstrap_opts; cat "$SOURCES";
            cat "${BASH_SOURCE[0]}" "$HERE/lib/debian-root.sh"; } | sha256sum | cut -c1-12)"
  local out="$CACHE_DIR/$NAME-$KEY.oci.tar"
  if [ -s "$out" ]; then
    log "cached: $out ($ref, $(du -h "$out" | cut -f1))"
    echo "$out"
    return 0
  fi

  # One build at a time (the buildah storage is shared by the names).
  exec 9>"$CACHE_DIR/.lock"
  flock 9
  if [ -s "$out" ]; then
    log "built meanwhile: $out"
    echo "$out"
    return 0
  fi
  install_tools buildah mmdebstrap jq
  build_archive "$out" "$ref" "$SOURCES"
  local old
  for old in "$CACHE_DIR/$NAME"-*.oci.tar "$CACHE_DIR/$NAME"-*.oci.tar.tmp; do
    [ -e "$old" ] && [ "$old" != "$out" ] || continue
    log "removing the older archive $old"
    rm -f "$old"
  done
  log "done in $(took "$start"): $out ($ref, $(du -h "$out" | cut -f1))"
  echo "$out"
}

trap cleanup EXIT
main "$@"
