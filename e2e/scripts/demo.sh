#!/usr/bin/env bash
# The main job, on this machine: bring up the local three-node cluster, a three-member etcd
# StatefulSet on StorageClass `standard`, the operator, then migrate every member to StorageClass
# `fast` with a StorageMigrationRequest while showing its progress.
#
# The operator's image is built (build-image.sh) and loaded into the cluster's image store: its
# copy Jobs run it. By default the operator itself runs on this machine (log in STATE_DIR/logs);
# with --in-cluster it runs in the cluster from that image, installed by Helm from the chart.
#
# Usage: e2e/scripts/demo.sh [--in-cluster] [STATE_DIR]   run (default: ./.localcluster; reused if up)
#        e2e/scripts/demo.sh down [STATE_DIR]             stop the operator, then the local cluster
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT"
MODE=run
IN_CLUSTER=0
if [ "${1:-}" = down ]; then MODE=down; shift; fi
if [ "${1:-}" = --in-cluster ]; then IN_CLUSTER=1; shift; fi
STATE_DIR="$(realpath -m "${1:-$ROOT/.localcluster}")"
NS=demo
say() { printf '\n==> %s\n' "$*"; }
OPERATOR_PID="$STATE_DIR/pids/storage-migrator.pid"

operator_running() {
  # Running and really our operator (the pid may have been reused since).
  [ -f "$OPERATOR_PID" ] || return 1
  local pid; pid="$(cat "$OPERATOR_PID")"
  [ -r "/proc/$pid/cmdline" ] && tr '\0' ' ' < "/proc/$pid/cmdline" | grep -q "storage-migrator run"
}

if [ "$MODE" = down ]; then
  if operator_running; then
    say "stopping the operator"
    pid="$(cat "$OPERATOR_PID")"; kill "$pid"
    for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
  fi
  rm -f "$OPERATOR_PID"
  say "stopping the local cluster"
  exec "$ROOT/target/debug/localcluster" down --state-dir "$STATE_DIR"
fi

say "installing dependencies (first run builds the Kubernetes control plane: several minutes)"
bash e2e/scripts/install-deps.sh >/dev/null
cargo build -q --workspace --bins
say "building the operator's image (first run: the release build and a Debian root, minutes)"
ARCHIVE="$(bash e2e/scripts/build-image.sh)"

if [ -f "$STATE_DIR/cluster.json" ] && KUBECONFIG="$STATE_DIR/kubeconfig" kubectl get --raw /readyz >/dev/null 2>&1; then
  say "local cluster already up in $STATE_DIR"
  export KUBECONFIG="$STATE_DIR/kubeconfig"
else
  say "bringing up the local cluster in $STATE_DIR"
  # An assignment, not `eval "$(...)"`: a failed `up` stops the script here, with its own error.
  UP_ENV="$(target/debug/localcluster up --state-dir "$STATE_DIR")"
  eval "$UP_ENV"
  export KUBECONFIG
fi
target/debug/localcluster image load --state-dir "$STATE_DIR" "$ARCHIVE"
kubectl get nodes -L topology.kubernetes.io/zone
kubectl get storageclass

say "etcd StatefulSet (3 members on class standard) in namespace $NS"
kubectl create namespace "$NS" --dry-run=client -o yaml | kubectl apply -f - >/dev/null
kubectl -n "$NS" apply -f e2e/fixtures/etcd.yaml
kubectl -n "$NS" rollout status statefulset/etcd --timeout=180s
kubectl -n "$NS" get pods -o wide
kubectl -n "$NS" get pvc

kubectl apply -f crds/storagemigrationrequests.yaml >/dev/null
if [ "$IN_CLUSTER" = 1 ]; then
  say "installing the operator in the cluster with Helm (2 replicas, leader election)"
  if operator_running; then
    echo "stopping the operator this script started on this machine earlier (only one may act)"
    pid="$(cat "$OPERATOR_PID")"; kill "$pid"; rm -f "$OPERATOR_PID"
  fi
  HELM="$(bash e2e/scripts/install-helm.sh)/helm"
  # Helm's Kubernetes HTTP cache is keyed by the API server's address, which a later local
  # cluster may reuse: keep it with this cluster.
  mkdir -p "$STATE_DIR/helm-home"
  HOME="$STATE_DIR/helm-home" "$HELM" upgrade --install storage-migrator charts/storage-migrator \
    --namespace storage-migrator --create-namespace --set "watchNamespaces={$NS}" >/dev/null
  kubectl -n storage-migrator rollout status deployment/storage-migrator --timeout=180s
  kubectl -n storage-migrator get pods -o wide
  kubectl -n storage-migrator get lease storage-migrator
else
  say "starting the operator on this machine (log: $STATE_DIR/logs/storage-migrator.log)"
  if kubectl -n storage-migrator get deployment storage-migrator >/dev/null 2>&1; then
    echo "the operator is installed in the cluster (demo.sh --in-cluster ran before): use that, or" >&2
    echo "remove it first: helm uninstall storage-migrator -n storage-migrator" >&2
    exit 1
  fi
  if operator_running; then
    echo "already running"
  else
    setsid target/debug/storage-migrator run --http-address 127.0.0.1:9808 >>"$STATE_DIR/logs/storage-migrator.log" 2>&1 </dev/null &
    echo $! > "$OPERATOR_PID"
  fi
fi

say "migrating etcd to StorageClass fast"
kubectl -n "$NS" delete storagemigrationrequest etcd-to-fast --ignore-not-found >/dev/null
REQUEST="$STATE_DIR/etcd-to-fast.yaml"
cat >"$REQUEST" <<'YAML'
apiVersion: storagemigrator.io/v1alpha1
kind: StorageMigrationRequest
metadata:
  name: etcd-to-fast
spec:
  type: StorageClassChange
  target: {kind: StatefulSet, name: etcd}
  storageClassChange: {storageClassName: fast}
  timeout: 20m
  database: {engine: Etcd}     # Raft-aware: followers first, leadership handed over, leader last
YAML
# The user's path: plan (a dry run), apply, watch (kubectl smr = target/debug/kubectl-smr).
target/debug/kubectl-smr -n "$NS" plan -f "$REQUEST"
kubectl -n "$NS" apply -f "$REQUEST"
watch_rc=0
target/debug/kubectl-smr -n "$NS" watch etcd-to-fast || watch_rc=$?
phase="$(kubectl -n "$NS" get smr etcd-to-fast -o jsonpath='{.status.phase}')"
kubectl -n "$NS" get smr etcd-to-fast -o jsonpath='{.status.message}{"\n"}'
kubectl -n "$NS" get pvc
kubectl -n "$NS" get pods -o wide
say "events of the request"
kubectl -n "$NS" get events --field-selector involvedObject.kind=StorageMigrationRequest \
  --sort-by=.metadata.creationTimestamp -o custom-columns=TIME:.metadata.creationTimestamp,REASON:.reason,MESSAGE:.message
echo
echo "export KUBECONFIG=$KUBECONFIG"
echo "stop everything with: e2e/scripts/demo.sh down $STATE_DIR"
# Exit 0 when, and only when, the migration ended Successful.
if [ "$phase" = Successful ] && [ "$watch_rc" = 0 ]; then
  say "result: etcd-to-fast Successful"
  exit 0
fi
say "result: etcd-to-fast ended ${phase:-without a phase} (kubectl smr watch exited $watch_rc)" >&2
exit 1
