{{/*
The operator's RBAC rules, in three scopes. src/permissions.rs holds the same table (RULES, each
rule with its RuleScope); a unit test compares the two, so edit both together.
*/}}

{{/* Cluster-scoped objects: a ClusterRole in every mode. */}}
{{- define "storage-migrator.rules.cluster" -}}
# Reclaim policy to Retain, claimRef re-pointing, migrated-by label. Never delete.
- apiGroups: [""]
  resources: ["persistentvolumes"]
  verbs: ["get", "list", "watch", "patch", "update"]
# Preflight: target class exists, binding modes match.
- apiGroups: ["storage.k8s.io"]
  resources: ["storageclasses"]
  verbs: ["get", "list", "watch"]
{{- end }}

{{/* Objects in the requests' namespaces: the ClusterRole (all namespaces) or a Role in each
watched namespace. */}}
{{- define "storage-migrator.rules.watched" -}}
# The requests: watched; the finalizer (update); status records every step.
- apiGroups: ["storagemigrator.io"]
  resources: ["storagemigrationrequests"]
  verbs: ["get", "list", "watch", "update", "patch"]
- apiGroups: ["storagemigrator.io"]
  resources: ["storagemigrationrequests/status"]
  verbs: ["get", "update", "patch"]
# Owned Jobs and pods carry blockOwnerDeletion, which needs update on the owner's finalizers.
- apiGroups: ["storagemigrator.io"]
  resources: ["storagemigrationrequests/finalizers"]
  verbs: ["update"]
# Read, protect (retention policy), orphan-delete and recreate the target StatefulSet.
- apiGroups: ["apps"]
  resources: ["statefulsets"]
  verbs: ["get", "list", "watch", "create", "delete", "patch"]
# Member pods (stop, recreate), mounter pods.
- apiGroups: [""]
  resources: ["pods"]
  verbs: ["get", "list", "watch", "create", "delete"]
# Temporary claims, the swap (delete, recreate), ownerReference removal.
- apiGroups: [""]
  resources: ["persistentvolumeclaims"]
  verbs: ["get", "list", "watch", "create", "delete", "patch"]
# Measure / pre-copy / copy / verify Jobs.
- apiGroups: ["batch"]
  resources: ["jobs"]
  verbs: ["get", "list", "watch", "create", "delete"]
# The stash ConfigMap <request>-stash: created, read, patched one key at a time, deleted after
# success.
- apiGroups: [""]
  resources: ["configmaps"]
  verbs: ["get", "create", "patch", "delete"]
# etcd engine: TLS and auth Secrets named in a request (get by name only, never list).
- apiGroups: [""]
  resources: ["secrets"]
  verbs: ["get"]
# One Event per step (events.k8s.io/v1 from kube-runtime; core v1 for older tooling).
- apiGroups: ["", "events.k8s.io"]
  resources: ["events"]
  verbs: ["create", "patch"]
{{- end }}

{{/* Leader election: a Role in the release namespace. */}}
{{- define "storage-migrator.rules.lease" -}}
- apiGroups: ["coordination.k8s.io"]
  resources: ["leases"]
  verbs: ["get", "create", "patch"]
{{- end }}
