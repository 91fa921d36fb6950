#!/usr/bin/env bash
# Installs everything the local cluster and the e2e tests need on a fresh Debian 12 machine,
# then builds (once) the control plane: kube-apiserver, kube-controller-manager,
# kube-scheduler and their etcd, from Kubernetes' published Go modules (the wrapper module
# e2e/kubernetes/, pinned by its go.mod and go.sum), into a cache directory keyed by the
# version and by a hash of that module. Idempotent: a warm machine returns in seconds.
#
# Usage: install-deps.sh            (prints the directory holding the server binaries)
# Needs: Go 1.26 or newer on PATH (the machine's own toolchain: nothing downloads another).
set -euo pipefail

K8S_VERSION="v1.37.2"
CACHE_REV="r1"
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
MODULE_DIR="$(cd "$HERE/../kubernetes" && pwd)"
CACHE_ROOT="${STORAGE_MIGRATOR_CACHE:-${XDG_CACHE_HOME:-${HOME:-/root}/.cache}/storage-migrator}"

log() { echo "install-deps: $*" >&2; }
die() { echo "install-deps: error: $*" >&2; exit 1; }

# etcd-server: Debian's etcd 3.4, the test database (any `etcd` image runs it); the control
# plane's own etcd is built below, since Kubernetes 1.37 needs etcd 3.5 or newer.
# buildah, mmdebstrap, umoci and jq: the images' builds (build-image.sh, build-test-image.sh
# install them too when run alone), here so that test-all.sh's builds running side by side never
# run apt-get at the same time.
APT_PKGS=(etcd-server etcd-client rsync protobuf-compiler libprotobuf-dev openssl iproute2
  e2fsprogs util-linux mount kmod make build-essential acl attr ca-certificates curl
  busybox-static buildah mmdebstrap umoci jq)

need_apt=()
for p in "${APT_PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || need_apt+=("$p")
done
# kubectl is a client only; Debian's package is named kubernetes-client.
command -v kubectl >/dev/null 2>&1 || need_apt+=(kubernetes-client)

export DEBIAN_FRONTEND=noninteractive
if [ ${#need_apt[@]} -gt 0 ]; then
  log "apt-get install ${need_apt[*]}"
  apt-get update -qq >&2
  apt-get install -y -qq --no-install-recommends "${need_apt[@]}" >&2
fi

# --- the control plane, from the pinned wrapper module --------------------------------------
key="$(cat "$MODULE_DIR/go.mod" "$MODULE_DIR/go.sum" "${BASH_SOURCE[0]}" | sha256sum | cut -c1-12)"
BIN_DIR="$CACHE_ROOT/kubernetes-${K8S_VERSION}-${CACHE_REV}-${key}/bin"
PROGRAMS=(kube-apiserver kube-controller-manager kube-scheduler etcd)

have_bins() {
  for b in "${PROGRAMS[@]}"; do [ -x "$BIN_DIR/$b" ] || return 1; done
}
if have_bins; then
  echo "$BIN_DIR"
  exit 0
fi

command -v go >/dev/null 2>&1 || die "no 'go' on PATH: building the control plane needs Go 1.26 or newer"
go_minor="$(go env GOVERSION | sed -n 's/^go1\.\([0-9]*\).*/\1/p')"
[ -n "$go_minor" ] && [ "$go_minor" -ge 26 ] \
  || die "$(go env GOVERSION) is too old: building Kubernetes ${K8S_VERSION} needs Go 1.26 or newer"
pinned="$(cd "$MODULE_DIR" && GOFLAGS=-mod=readonly go list -m -f '{{.Version}}' k8s.io/kubernetes)"
[ "$pinned" = "$K8S_VERSION" ] \
  || die "e2e/kubernetes/go.mod pins k8s.io/kubernetes $pinned, this script says $K8S_VERSION"

# The version every component reports (--version, the API server's /version, which Helm compares
# with a chart's kubeVersion); without it they report v0.0.0-master.
minor="$(echo "$K8S_VERSION" | cut -d. -f2)"
VERSION_FLAGS=""
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  VERSION_FLAGS="$VERSION_FLAGS -X $pkg.gitVersion=$K8S_VERSION -X $pkg.gitMajor=1"
  VERSION_FLAGS="$VERSION_FLAGS -X $pkg.gitMinor=$minor -X $pkg.gitTreeState=clean"
done

rm -rf "$BIN_DIR.tmp"; mkdir -p "$BIN_DIR.tmp"
export CGO_ENABLED=0 GOFLAGS=-mod=readonly GOTOOLCHAIN=local
cd "$MODULE_DIR"
log "downloading the modules of Kubernetes ${K8S_VERSION} (pinned by e2e/kubernetes/go.sum)"
go mod download >&2
for b in kube-apiserver kube-controller-manager kube-scheduler; do
  log "building $b ${K8S_VERSION}"
  go build -trimpath -ldflags "-s -w $VERSION_FLAGS" -o "$BIN_DIR.tmp/$b" "k8s.io/kubernetes/cmd/$b" >&2
done
log "building etcd $(go list -m -f '{{.Version}}' go.etcd.io/etcd/server/v3)"
go build -trimpath -ldflags "-s -w" -o "$BIN_DIR.tmp/etcd" go.etcd.io/etcd/server/v3 >&2
rm -rf "$BIN_DIR"; mv "$BIN_DIR.tmp" "$BIN_DIR"
log "server binaries in $BIN_DIR"
echo "$BIN_DIR"
