#!/usr/bin/env bash
# Checks the Helm chart with the real Helm 4 (installed by install-helm.sh):
#   - `helm lint --strict`;
#   - `helm template` with the default values and with each variant below, every rendered
#     manifest (and the chart's CRD) validated against the Kubernetes OpenAPI schemas of the
#     oldest supported version (1.30, the chart's kubeVersion) and the newest
#     kubernetes-validate carries (1.37), strictly (an unknown field fails);
#   - bad values are refused at the values schema, with the field named.
# Usage: e2e/scripts/check-chart.sh
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
CHART="$ROOT/charts/storage-migrator"
TOOLS="$(bash "$ROOT/e2e/scripts/install-helm.sh")"
HELM="$TOOLS/helm"
VALIDATE="$TOOLS/kubernetes-validate"
OUT="$(mktemp -d "${TMPDIR:-/tmp}/check-chart.XXXXXX")"
trap 'rm -rf "$OUT"' EXIT
fail() { echo "check-chart: $*" >&2; exit 1; }

"$HELM" lint --strict "$CHART"

variants=(
  "defaults|"
  "one-namespace|--set watchNamespaces={databases}"
  "namespaces|--set watchNamespaces={databases,cache}"
  "text-logs|--set logFormat=text --set logLevel=debug"
  "no-rbac|--set rbac.create=false --set serviceAccount.create=false --set serviceAccount.name=ops"
  "pinned-image|--set image.repository=registry.example/smr --set image.tag=0.1.0-rc1 --set image.pullPolicy=Always"
  "single-replica|--set replicaCount=1 --set leaderElection.enabled=false --set metrics.service.enabled=false"
)
for v in "${variants[@]}"; do
  name="${v%%|*}"
  # shellcheck disable=SC2206
  args=(${v#*|})
  "$HELM" template smr "$CHART" --namespace storage-migrator --include-crds "${args[@]}" \
    >"$OUT/$name.yaml" || fail "helm template ($name) failed"
  for k in 1.30 1.37; do
    "$VALIDATE" --strict --quiet -k "$k" "$OUT/$name.yaml" \
      || fail "rendered manifests ($name) do not validate against Kubernetes $k"
  done
  echo "check-chart: $name: $(grep -c '^kind:' "$OUT/$name.yaml") objects valid against 1.30 and 1.37"
done

# With watchNamespaces the ClusterRole keeps only cluster-scoped objects; each namespace gets a
# Role with the rest, and the release namespace a Role for the Lease.
ns_doc() { awk -v RS='\n---\n' -v k="$1" -v n="$2" '$0 ~ "kind: "k"\n" && $0 ~ n' "$OUT/namespaces.yaml"; }
# Whether the input has a line matching the extended regex $1. It reads all its input: `grep -q`
# exits at the first match, and with pipefail the writer's SIGPIPE then fails the pipeline.
has() { grep -E "$1" >/dev/null; }
ns_doc ClusterRole "name: smr-storage-migrator" | has 'persistentvolumes' \
  || fail "namespaced mode: the ClusterRole lacks persistentvolumes"
if ns_doc ClusterRole "name: smr-storage-migrator" | has '"(pods|jobs|secrets)"'; then
  fail "namespaced mode: the ClusterRole grants namespaced objects"
fi
for n in databases cache; do
  ns_doc Role "namespace: $n" | has '"pods"' || fail "namespaced mode: no Role in $n"
done
ns_doc Role "name: smr-storage-migrator-leader-election" | has '"leases"' \
  || fail "no Lease Role in the release namespace"
echo "check-chart: namespaces: ClusterRole cluster-scoped only; Roles in databases, cache; Lease Role"

# Bad values fail at the schema, naming the field.
bad=(
  "logFormat|--set logFormat=xml"
  "pullPolicy|--set image.pullPolicy=Sometimes"
  "replicaCount|--set replicaCount=-1"
  "leaderElection|--set replicaCount=2 --set leaderElection.enabled=false"
  "renewGraceSeconds|--set leaderElection.renewGraceSeconds=30"
  "imagee|--set imagee.tag=1"
  "watchNamespaces|--set watchNamespaces={Databases}"
  "watchNamespace|--set watchNamespace=databases"
  "cluster|--set copyLimits.cluster=0"
)
for b in "${bad[@]}"; do
  field="${b%%|*}"
  # shellcheck disable=SC2206
  args=(${b#*|})
  if "$HELM" template smr "$CHART" "${args[@]}" >/dev/null 2>"$OUT/err"; then
    fail "values '${args[*]}' were accepted; the schema must refuse them"
  fi
  grep -q "$field" "$OUT/err" || fail "error for '${args[*]}' does not name $field: $(cat "$OUT/err")"
  echo "check-chart: '${args[*]}' refused: $(grep -m1 "$field" "$OUT/err" | sed 's/^ *//')"
done
# The ServiceMonitor renders (its CRD is not in the Kubernetes schemas, so only its shape is
# checked here).
"$HELM" template smr "$CHART" --set metrics.serviceMonitor.enabled=true \
  --show-only templates/servicemonitor.yaml >"$OUT/sm.yaml"
grep -q "^kind: ServiceMonitor" "$OUT/sm.yaml" && grep -q "port: http-metrics" "$OUT/sm.yaml" \
  || fail "the ServiceMonitor does not render: $(cat "$OUT/sm.yaml")"
echo "check-chart: ServiceMonitor renders"
# The copy caps reach the operator's environment only when set.
"$HELM" template smr "$CHART" --show-only templates/deployment.yaml >"$OUT/nocaps.yaml"
if has 'MAX_COPIES' <"$OUT/nocaps.yaml"; then fail "copy caps rendered without copyLimits"; fi
"$HELM" template smr "$CHART" --set copyLimits.cluster=4 --set copyLimits.perNode=1 \
  --show-only templates/deployment.yaml >"$OUT/caps.yaml"
tr -d '\n ' <"$OUT/caps.yaml" | has 'name:MAX_COPIESvalue:"4"-name:MAX_COPIES_PER_NODEvalue:"1"' \
  || fail "copyLimits do not render as MAX_COPIES, MAX_COPIES_PER_NODE: $(grep -A1 MAX_COPIES "$OUT/caps.yaml")"
echo "check-chart: copyLimits render as MAX_COPIES and MAX_COPIES_PER_NODE"
echo "check-chart: ok (helm $("$HELM" version --short))"
