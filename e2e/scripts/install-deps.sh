#!/usr/bin/env bash
# Installs everything the local cluster and the e2e tests need on a fresh Debian 12 machine,
# then builds (once) the Kubernetes 1.20.2 server binaries from Debian's `kubernetes` source
# package into a versioned cache directory. Idempotent: a warm machine returns in seconds.
#
# Usage: install-deps.sh            (prints the directory holding the server binaries)
set -euo pipefail

K8S_SRC_VERSION="1.20.5+really1.20.2-1.1+deb12u1"
CACHE_REV="r3"
CACHE_ROOT="${STORAGE_MIGRATOR_CACHE:-${XDG_CACHE_HOME:-${HOME:-/root}/.cache}/storage-migrator}"
BIN_DIR="$CACHE_ROOT/kubernetes-1.20.2-${CACHE_REV}/bin"

log() { echo "install-deps: $*" >&2; }

APT_PKGS=(etcd-server etcd-client rsync golang-go golang-github-modern-go-reflect2-dev
  protobuf-compiler libprotobuf-dev openssl iproute2 e2fsprogs util-linux mount kmod make dpkg-dev
  build-essential rsync acl attr ca-certificates curl
  busybox-static)

need_apt=()
for p in "${APT_PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || need_apt+=("$p")
done
# kubectl is a client only; Debian's package is named kubernetes-client.
command -v kubectl >/dev/null 2>&1 || need_apt+=(kubernetes-client)

export DEBIAN_FRONTEND=noninteractive
apt_updated=0
apt_update() { if [ "$apt_updated" = 0 ]; then apt-get update -qq >&2; apt_updated=1; fi; }
if [ ${#need_apt[@]} -gt 0 ]; then
  log "apt-get install ${need_apt[*]}"
  apt_update
  apt-get install -y -qq --no-install-recommends "${need_apt[@]}" >&2
fi

have_bins() {
  for b in kube-apiserver kube-controller-manager kube-scheduler; do
    [ -x "$BIN_DIR/$b" ] || return 1
  done
}

if have_bins; then
  echo "$BIN_DIR"
  exit 0
fi

# --- build the control plane from Debian's source package ---------------------------------
SRC_LIST=/etc/apt/sources.list.d/storage-migrator-deb-src.sources
if ! grep -rqs "deb-src" /etc/apt/sources.list /etc/apt/sources.list.d/; then
  # Derive a deb-src entry from the machine's own main entry, so no mirror is named here.
  if [ -f /etc/apt/sources.list.d/debian.sources ]; then
    awk 'BEGIN{RS="";ORS="\n\n"} /Suites:[^\n]*bookworm( |$|\n)/ && !/security/ {sub(/Types: deb/,"Types: deb-src"); print; exit}' \
      /etc/apt/sources.list.d/debian.sources > "$SRC_LIST"
  else
    grep -E '^deb .* bookworm main' /etc/apt/sources.list | head -n1 | sed 's/^deb /deb-src /' > "$SRC_LIST"
  fi
  apt_updated=0
fi
apt_update

WORK="$CACHE_ROOT/build-kubernetes-${CACHE_REV}"
rm -rf "$WORK"; mkdir -p "$WORK"
log "fetching the kubernetes source package ($K8S_SRC_VERSION)"
(cd "$WORK" && apt-get source -qq --download-only "kubernetes=$K8S_SRC_VERSION" >&2 \
  && dpkg-source --no-check -x ./*.dsc src >&2)

GOPATH_DIR="$WORK/gopath"
mkdir -p "$GOPATH_DIR/src/k8s.io"
ln -s "$WORK/src" "$GOPATH_DIR/src/k8s.io/kubernetes"
cd "$GOPATH_DIR/src/k8s.io/kubernetes"

# reflect2 1.0.1 panics at run time under Go 1.19; use Debian's 1.0.2.
R2=/usr/share/gocode/src/github.com/modern-go/reflect2
rm -rf vendor/github.com/modern-go/reflect2
mkdir -p vendor/github.com/modern-go/reflect2
cp -r "$R2"/. vendor/github.com/modern-go/reflect2/

export GOPATH="$GOPATH_DIR" GO111MODULE=off CGO_ENABLED=0 GOFLAGS="" GOCACHE="$WORK/gocache"
log "generating files (about 2 minutes)"
make generated_files >&2
# The version the components report (--version, the API server's /version): GOPATH mode builds
# the vendored copies, so the -X flags name the vendor paths (else it reports v0.0.0-master,
# which tools such as Helm compare with a chart's kubeVersion).
# The API server's /version comes from another copy of the same variables (client-go's and the
# legacy pkg/version), so every copy is set; -X of a package not linked in is ignored.
VERSION_FLAGS=""
for pkg in k8s.io/kubernetes/vendor/k8s.io/component-base/version \
  k8s.io/kubernetes/vendor/k8s.io/client-go/pkg/version k8s.io/kubernetes/pkg/version \
  k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  VERSION_FLAGS="$VERSION_FLAGS -X $pkg.gitVersion=v1.20.2 -X $pkg.gitMajor=1 -X $pkg.gitMinor=20"
  VERSION_FLAGS="$VERSION_FLAGS -X $pkg.gitTreeState=clean"
done
mkdir -p "$BIN_DIR.tmp"
for b in kube-apiserver kube-controller-manager kube-scheduler; do
  log "building $b"
  go build -ldflags "-s -w $VERSION_FLAGS" \
    -o "$BIN_DIR.tmp/$b" "./cmd/$b" >&2
done
rm -rf "$BIN_DIR"; mv "$BIN_DIR.tmp" "$BIN_DIR"
cd /; rm -rf "$WORK"
log "server binaries in $BIN_DIR"
echo "$BIN_DIR"
