{{/*
The operator's RBAC rules, in three scopes. src/permissions.rs holds the same table (RULES, each
rule with its RuleScope); a unit test compares the two, so edit both together.
*/}}

{{/* Cluster-scoped objects: a ClusterRole in every mode. */}}
{{- define "storage-migrator.rules.cluster" -}}
# Reclaim policy to Retain, claimRef re-pointing, migrated-by label (merge patches). Never delete.
# Watched as metadata only: a change of a volume a plan names wakes its request.
- apiGroups: [""]
  resources: ["persistentvolumes"]
  verbs: ["get", "list", "watch", "patch"]
# A member pod stuck terminating: is its node NotReady or gone (then it is force-deleted).
- apiGroups: [""]
  resources: ["nodes"]
  verbs: ["get"]
# Preflight: target class exists, binding modes match; watched as metadata, so that a list
# read is kept until a class changes.
- apiGroups: ["storage.k8s.io"]
  resources: ["storageclasses"]
  verbs: ["list", "watch"]
{{- end }}

{{/* Objects in the requests' namespaces: the ClusterRole (all namespaces) or a Role in each
watched namespace. */}}
{{- define "storage-migrator.rules.watched" -}}
# The requests: watched; the finalizer (merge patch); status records every step (patch).
- apiGroups: ["storagemigrator.io"]
  resources: ["storagemigrationrequests"]
  verbs: ["get", "list", "watch", "patch"]
- apiGroups: ["storagemigrator.io"]
  resources: ["storagemigrationrequests/status"]
  verbs: ["patch"]
# Owned Jobs and pods carry blockOwnerDeletion, which needs update on the owner's finalizers.
- apiGroups: ["storagemigrator.io"]
  resources: ["storagemigrationrequests/finalizers"]
  verbs: ["update"]
# Read, protect (retention policy, Kubernetes 1.23+), orphan-delete and recreate the target
# StatefulSet; the sets' metadata watched, so that a set read is kept until it changes.
- apiGroups: ["apps"]
  resources: ["statefulsets"]
  verbs: ["get", "list", "watch", "create", "delete", "patch"]
# A Deployment's claim: read the Deployment, scale it to zero and back (never its template);
# a claim target's pod leads through its ReplicaSet to its Deployment.
- apiGroups: ["apps"]
  resources: ["deployments"]
  verbs: ["get"]
- apiGroups: ["apps"]
  resources: ["deployments/scale"]
  verbs: ["patch"]
- apiGroups: ["apps"]
  resources: ["replicasets"]
  verbs: ["get"]
# Preflight of a Deployment's claim: an autoscaler that would change its replicas.
- apiGroups: ["autoscaling"]
  resources: ["horizontalpodautoscalers"]
  verbs: ["list"]
# Member pods (stop, recreate), mounter pods; watched (a change of a member or mounter pod
# wakes its request).
- apiGroups: [""]
  resources: ["pods"]
  verbs: ["list", "watch", "create", "delete"]
# Live copy progress: the tail of a running copy Job's pod's log.
- apiGroups: [""]
  resources: ["pods/log"]
  verbs: ["get"]
# Temporary claims, the swap (delete, recreate), ownerReference removal (get, then patch); the
# claims a request's plan names are watched (a change wakes the request).
- apiGroups: [""]
  resources: ["persistentvolumeclaims"]
  verbs: ["get", "list", "watch", "create", "delete", "patch"]
# Measure / pre-copy / copy / verify Jobs.
- apiGroups: ["batch"]
  resources: ["jobs"]
  verbs: ["list", "watch", "create", "delete"]
# The stash ConfigMap <request>-stash: created, read, patched one key at a time, deleted after
# success; ours watched as metadata (by our label), so that a stash read is kept until it
# changes.
- apiGroups: [""]
  resources: ["configmaps"]
  verbs: ["get", "list", "watch", "create", "patch", "delete"]
# etcd engine: TLS and auth Secrets named in a request (get by name only, never list).
- apiGroups: [""]
  resources: ["secrets"]
  verbs: ["get"]
# RedisSentinel engine: the Sentinels are the ready endpoints of the Service a request names
# (redisSentinel.sentinelService), read from its EndpointSlices by label.
- apiGroups: ["discovery.k8s.io"]
  resources: ["endpointslices"]
  verbs: ["list"]
# One Event per step (kube-runtime's Recorder: events.k8s.io/v1; patch when one repeats).
- apiGroups: ["events.k8s.io"]
  resources: ["events"]
  verbs: ["create", "patch"]
# A Job that creates no pod: the API server's reason, from its FailedCreate Events (core v1).
- apiGroups: [""]
  resources: ["events"]
  verbs: ["list"]
# Preflight: the namespace's Pod Security level (its own Namespace, by name; a Role in a
# namespace grants get on that Namespace only).
- apiGroups: [""]
  resources: ["namespaces"]
  verbs: ["get"]
# A member is not stopped while a PodDisruptionBudget that selects it allows no disruption
# (policy/v1); watched as metadata, so that a list read is kept until a budget changes.
- apiGroups: ["policy"]
  resources: ["poddisruptionbudgets"]
  verbs: ["list", "watch"]
{{- end }}

{{/* Leader election: a Role in the release namespace. */}}
{{- define "storage-migrator.rules.lease" -}}
- apiGroups: ["coordination.k8s.io"]
  resources: ["leases"]
  verbs: ["get", "list", "watch", "create", "update"]
{{- end }}
