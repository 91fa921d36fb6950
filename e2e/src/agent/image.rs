//! The image table (an image name → host programs), the pull-policy decision between it and the
//! image store ([`crate::images`]), Kubernetes' command/args semantics, `$(VAR)` expansion and
//! the container environment (env, envFrom, fieldRef, resourceFieldRef, secretKeyRef,
//! configMapKeyRef; a stored image's Env below them). Pure functions; the caller fetches
//! ConfigMaps and Secrets and looks the image up in the store.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use k8s_openapi::api::core::v1::{ConfigMap, Container, EnvVarSource, Pod, Secret};

use crate::images::PullPolicy;
use crate::quantity;

/// PATH of a container that sets none (what common base images set).
pub const DEFAULT_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

#[derive(Debug, thiserror::Error, PartialEq)]
pub enum ImageError {
    /// No host program stands in for this image (reported as ErrImagePull).
    #[error(
        "image {0:?} is not available on this node: it is not in the node's image store (`localcluster image load`) and localcluster maps only etcd, busybox, alpine and debian images to host programs; there is no registry to pull from"
    )]
    Unknown(String),
    /// The program to run does not exist on the host (reported as a start error).
    #[error("exec: {0:?}: executable file not found in $PATH")]
    NotFound(String),
    #[error("no command given and the image has no entrypoint")]
    NoCommand,
}

/// What an image stands for on the host: its ENTRYPOINT and CMD.
#[derive(Debug, Clone, PartialEq)]
pub struct ImageConfig {
    pub entrypoint: Vec<String>,
    pub cmd: Vec<String>,
}

/// The repository part of an image reference (no tag, no digest): `quay.io/coreos/etcd:v3.4` →
/// `quay.io/coreos/etcd`.
pub fn repository(image: &str) -> &str {
    let no_digest = image.split('@').next().unwrap_or(image);
    let last_slash = no_digest.rfind('/').map_or(0, |i| i + 1);
    match no_digest[last_slash..].find(':') {
        Some(colon) => &no_digest[..last_slash + colon],
        None => no_digest,
    }
}

/// Looks an image up in the table.
pub fn lookup(image: &str) -> Result<ImageConfig, ImageError> {
    let repo = repository(image.trim());
    let last = repo.rsplit('/').next().unwrap_or(repo);
    let entry = |program: &str| ImageConfig {
        entrypoint: vec![program.to_string()],
        cmd: Vec::new(),
    };
    if last.starts_with("etcd") {
        Ok(entry("etcd"))
    } else if matches!(last, "busybox" | "alpine" | "debian") {
        Ok(entry("sh"))
    } else {
        Err(ImageError::Unknown(image.to_string()))
    }
}

/// Where a container's image comes from.
#[derive(Debug, Clone, PartialEq)]
pub enum ImageSource<S> {
    /// The node's image store (`localcluster image load`).
    Store(S),
    /// A host program of the table ([`lookup`]).
    Host(ImageConfig),
}

/// Why a container's image is not available (the container waits with [`PullError::reason`]).
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum PullError {
    /// In neither the store nor the table (any policy but `Never`).
    #[error(transparent)]
    NotPresent(ImageError),
    /// `Always` for an image that only the store holds: a kubelet without a registry cannot pull.
    #[error(
        "image {0:?} has imagePullPolicy Always, but localcluster has no registry to pull from (the node's image store holds it: use imagePullPolicy IfNotPresent or Never)"
    )]
    AlwaysWithoutRegistry(String),
    /// `Never` and not present.
    #[error("Container image {0:?} is not present with pull policy of Never")]
    NeverPull(String),
}

impl PullError {
    /// The container's waiting reason, as a kubelet reports it.
    pub fn reason(&self) -> &'static str {
        match self {
            PullError::NotPresent(_) | PullError::AlwaysWithoutRegistry(_) => "ErrImagePull",
            PullError::NeverPull(_) => "ErrImageNeverPull",
        }
    }
}

/// The kubelet's decision on a node without a registry: `Never` and `IfNotPresent` use the
/// store (`stored`, the store's lookup of `image`), `Always` cannot pull. The host-program table
/// stands for images the node has: it serves under any policy (after the store).
pub fn choose_source<S>(
    image: &str,
    policy: PullPolicy,
    stored: Option<S>,
) -> Result<ImageSource<S>, PullError> {
    let host = lookup(image);
    match (policy, stored, host) {
        (PullPolicy::Always, _, Ok(h)) => Ok(ImageSource::Host(h)),
        (PullPolicy::Always, Some(_), Err(_)) => {
            Err(PullError::AlwaysWithoutRegistry(image.to_string()))
        }
        (_, Some(s), _) if policy != PullPolicy::Always => Ok(ImageSource::Store(s)),
        (_, _, Ok(h)) => Ok(ImageSource::Host(h)),
        (PullPolicy::Never, _, Err(_)) => Err(PullError::NeverPull(image.to_string())),
        (_, _, Err(e)) => Err(PullError::NotPresent(e)),
    }
}

/// Kubernetes' rule: `command` replaces the entrypoint (and drops the image's cmd), `args`
/// replace the cmd. Both are `$(VAR)`-expanded against the container's environment.
pub fn command_line(
    image: &ImageConfig,
    command: Option<&[String]>,
    args: Option<&[String]>,
    env: &[(String, String)],
) -> Vec<String> {
    let lookup = env_lookup(env);
    let expand_all =
        |v: &[String]| -> Vec<String> { v.iter().map(|s| expand(s, &lookup)).collect() };
    let command = command.filter(|c| !c.is_empty());
    let args = args.filter(|a| !a.is_empty());
    match (command, args) {
        (Some(c), Some(a)) => [expand_all(c), expand_all(a)].concat(),
        (Some(c), None) => expand_all(c),
        (None, Some(a)) => [image.entrypoint.clone(), expand_all(a)].concat(),
        (None, None) => [image.entrypoint.clone(), image.cmd.clone()].concat(),
    }
}

/// Resolves argv[0] on the host: an absolute path that exists is kept; otherwise its basename
/// is looked up in `path_var` (so `/usr/local/bin/etcd` becomes `/usr/bin/etcd`).
pub fn resolve_program(argv0: &str, path_var: &str) -> Result<PathBuf, ImageError> {
    if argv0.is_empty() {
        return Err(ImageError::NoCommand);
    }
    let p = Path::new(argv0);
    if p.is_absolute() && is_executable(p) {
        return Ok(p.to_path_buf());
    }
    let base = p
        .file_name()
        .ok_or_else(|| ImageError::NotFound(argv0.to_string()))?;
    for dir in path_var.split(':').filter(|d| !d.is_empty()) {
        let candidate = Path::new(dir).join(base);
        if is_executable(&candidate) {
            return Ok(candidate);
        }
    }
    Err(ImageError::NotFound(argv0.to_string()))
}

fn is_executable(p: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

fn env_lookup(env: &[(String, String)]) -> impl Fn(&str) -> Option<String> + '_ {
    move |name| {
        env.iter()
            .rev()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.clone())
    }
}

/// Kubernetes' `$(VAR)` expansion: `$(NAME)` is replaced by NAME's value when it is defined and
/// kept as is otherwise; `$$` is an escaped `$`; any other `$` is kept.
pub fn expand(input: &str, lookup: &dyn Fn(&str) -> Option<String>) -> String {
    let bytes = input.as_bytes();
    let mut out = String::with_capacity(input.len());
    let mut checkpoint = 0;
    let mut cursor = 0;
    while cursor < bytes.len() {
        if bytes[cursor] == b'$' && cursor + 1 < bytes.len() {
            out.push_str(&input[checkpoint..cursor]);
            let rest = &input[cursor + 1..];
            let advance = match bytes[cursor + 1] {
                b'$' => {
                    out.push('$');
                    1
                }
                b'(' => match rest.find(')') {
                    Some(close) => {
                        let name = &rest[1..close];
                        match lookup(name) {
                            Some(v) => out.push_str(&v),
                            None => {
                                out.push_str("$(");
                                out.push_str(name);
                                out.push(')');
                            }
                        }
                        close + 1
                    }
                    None => {
                        out.push_str("$(");
                        1
                    }
                },
                _ => {
                    // `$` followed by another character: both are kept.
                    let ch_len = rest.chars().next().map_or(1, char::len_utf8);
                    out.push('$');
                    out.push_str(&rest[..ch_len]);
                    ch_len
                }
            };
            cursor += advance;
            checkpoint = cursor + 1;
        }
        cursor += 1;
    }
    if checkpoint < input.len() {
        out.push_str(&input[checkpoint..]);
    }
    out
}

/// Why a container's environment cannot be built yet (CreateContainerConfigError).
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum EnvError {
    #[error("configmap {0:?} not found")]
    ConfigMapNotFound(String),
    #[error("secret {0:?} not found")]
    SecretNotFound(String),
    #[error("couldn't find key {key} in ConfigMap {ns}/{name}")]
    ConfigMapKeyNotFound {
        ns: String,
        name: String,
        key: String,
    },
    #[error("couldn't find key {key} in Secret {ns}/{name}")]
    SecretKeyNotFound {
        ns: String,
        name: String,
        key: String,
    },
    #[error("unsupported fieldPath {0:?}")]
    FieldPath(String),
    #[error("unsupported resource {0:?}")]
    Resource(String),
}

/// What the environment of a pod's containers may refer to besides the pod itself.
#[derive(Debug, Clone, Default)]
pub struct EnvContext {
    pub pod_ip: String,
    pub host_ip: String,
    /// The pod's hostname (HOSTNAME).
    pub hostname: String,
    pub config_maps: BTreeMap<String, ConfigMap>,
    pub secrets: BTreeMap<String, Secret>,
    /// Service-account tokens for the pod's projected `serviceAccountToken` sources, by
    /// audience ("" for the API server's own), requested through the TokenRequest API and bound
    /// to the pod, as a kubelet does.
    pub service_account_tokens: BTreeMap<String, String>,
    /// Variables of Services every container gets (the `kubernetes` Service's, from
    /// `agent::apiproxy::service_env`); the container's own env and envFrom win.
    pub service_env: Vec<(String, String)>,
}

/// Names of the ConfigMaps and Secrets a pod's env, envFrom and volumes refer to.
pub fn referenced_objects(pod: &Pod) -> (Vec<String>, Vec<String>) {
    let mut cms = Vec::new();
    let mut secrets = Vec::new();
    let Some(spec) = pod.spec.as_ref() else {
        return (cms, secrets);
    };
    let containers = spec
        .init_containers
        .iter()
        .flatten()
        .chain(spec.containers.iter());
    for c in containers {
        for ef in c.env_from.iter().flatten() {
            if let Some(r) = &ef.config_map_ref {
                cms.push(r.name.clone());
            }
            if let Some(r) = &ef.secret_ref {
                secrets.push(r.name.clone());
            }
        }
        for e in c.env.iter().flatten() {
            if let Some(vf) = &e.value_from {
                if let Some(r) = &vf.config_map_key_ref {
                    cms.push(r.name.clone());
                }
                if let Some(r) = &vf.secret_key_ref {
                    secrets.push(r.name.clone());
                }
            }
        }
    }
    for v in spec.volumes.iter().flatten() {
        if let Some(cm) = &v.config_map {
            cms.push(cm.name.clone());
        }
        if let Some(s) = v.secret.as_ref().and_then(|s| s.secret_name.clone()) {
            secrets.push(s);
        }
        for src in v.projected.iter().flat_map(|p| p.sources.iter().flatten()) {
            if let Some(cm) = &src.config_map {
                cms.push(cm.name.clone());
            }
            if let Some(s) = &src.secret {
                secrets.push(s.name.clone());
            }
        }
    }
    cms.sort();
    cms.dedup();
    secrets.sort();
    secrets.dedup();
    (cms, secrets)
}

/// All data of a ConfigMap as text (binaryData lossily decoded).
pub fn config_map_data(cm: &ConfigMap) -> BTreeMap<String, Vec<u8>> {
    let mut out: BTreeMap<String, Vec<u8>> = cm
        .data
        .iter()
        .flatten()
        .map(|(k, v)| (k.clone(), v.clone().into_bytes()))
        .collect();
    for (k, v) in cm.binary_data.iter().flatten() {
        out.insert(k.clone(), v.0.clone());
    }
    out
}

/// All data of a Secret (data and stringData).
pub fn secret_data(s: &Secret) -> BTreeMap<String, Vec<u8>> {
    let mut out: BTreeMap<String, Vec<u8>> = s
        .data
        .iter()
        .flatten()
        .map(|(k, v)| (k.clone(), v.0.clone()))
        .collect();
    for (k, v) in s.string_data.iter().flatten() {
        out.insert(k.clone(), v.clone().into_bytes());
    }
    out
}

/// The value of a downward-API `fieldPath` for `pod`.
pub fn field_value(pod: &Pod, ctx: &EnvContext, path: &str) -> Result<String, EnvError> {
    let meta = &pod.metadata;
    let spec = pod.spec.as_ref();
    let map_entry = |prefix: &str, map: Option<&BTreeMap<String, String>>| -> Option<String> {
        let key = path.strip_prefix(prefix)?.strip_suffix("']")?;
        Some(map.and_then(|m| m.get(key)).cloned().unwrap_or_default())
    };
    if let Some(v) = map_entry("metadata.labels['", meta.labels.as_ref()) {
        return Ok(v);
    }
    if let Some(v) = map_entry("metadata.annotations['", meta.annotations.as_ref()) {
        return Ok(v);
    }
    Ok(match path {
        "metadata.name" => meta.name.clone().unwrap_or_default(),
        "metadata.namespace" => meta.namespace.clone().unwrap_or_default(),
        "metadata.uid" => meta.uid.clone().unwrap_or_default(),
        "metadata.labels" => format_map(meta.labels.as_ref()),
        "metadata.annotations" => format_map(meta.annotations.as_ref()),
        "status.podIP" => ctx.pod_ip.clone(),
        "status.podIPs" => ctx.pod_ip.clone(),
        "status.hostIP" | "status.hostIPs" => ctx.host_ip.clone(),
        "spec.nodeName" => spec.and_then(|s| s.node_name.clone()).unwrap_or_default(),
        "spec.serviceAccountName" => spec
            .and_then(|s| s.service_account_name.clone())
            .unwrap_or_else(|| "default".into()),
        other => return Err(EnvError::FieldPath(other.to_string())),
    })
}

/// Downward API format of labels/annotations: `key="value"` lines, sorted by key.
pub fn format_map(map: Option<&BTreeMap<String, String>>) -> String {
    map.iter()
        .flat_map(|m| m.iter())
        .map(|(k, v)| format!("{k}={v:?}\n"))
        .collect()
}

/// Node capacity reported for every node (also the default of unset resource limits).
pub const NODE_CPU: &str = "8";
pub const NODE_MEMORY: &str = "16Gi";

/// The value of a `resourceFieldRef` (limits/requests of cpu, memory, ephemeral-storage),
/// divided by `divisor` and rounded up, as the kubelet does. Unset limits are the node's
/// allocatable.
pub fn resource_value(
    container: &Container,
    resource: &str,
    divisor: Option<&str>,
) -> Result<String, EnvError> {
    let res = container.resources.as_ref();
    let (kind, name) = resource
        .split_once('.')
        .ok_or_else(|| EnvError::Resource(resource.to_string()))?;
    let set = match kind {
        "limits" => res.and_then(|r| r.limits.as_ref()),
        "requests" => res.and_then(|r| r.requests.as_ref()),
        _ => return Err(EnvError::Resource(resource.to_string())),
    }
    .and_then(|m| m.get(name))
    .map(|q| q.0.clone());
    let default = match name {
        "cpu" => NODE_CPU,
        "memory" => NODE_MEMORY,
        "ephemeral-storage" => "100Gi",
        _ => return Err(EnvError::Resource(resource.to_string())),
    };
    let value = match (kind, set) {
        (_, Some(v)) => v,
        ("requests", None) => "0".to_string(),
        (_, None) => default.to_string(),
    };
    let v = quantity_value(&value).ok_or_else(|| EnvError::Resource(value.clone()))?;
    let d = divisor
        .map(|d| quantity_value(d).ok_or_else(|| EnvError::Resource(d.to_string())))
        .transpose()?
        .filter(|d| *d > 0.0)
        .unwrap_or(1.0);
    Ok(format!("{}", (v / d).ceil() as i64))
}

/// The value of a Kubernetes quantity (`500m`, `2`, `1Gi`, `3M`, `1e3`).
fn quantity_value(q: &str) -> Option<f64> {
    quantity::parse(q).ok().map(|q| q.as_f64())
}

fn is_env_name(s: &str) -> bool {
    !s.is_empty()
        && !s.starts_with(|c: char| c.is_ascii_digit())
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-' || c == '.')
}

fn set_var(env: &mut Vec<(String, String)>, name: &str, value: String) {
    match env.iter_mut().find(|(k, _)| k == name) {
        Some(slot) => slot.1 = value,
        None => env.push((name.to_string(), value)),
    }
}

/// The complete environment of `container` as the kubelet builds it: envFrom (in order), then
/// env (later entries win, values `$(VAR)`-expanded against what came before), then the
/// defaults a container runtime adds (PATH, HOSTNAME, HOME) where unset.
///
/// The Service variables of `ctx.service_env` (`KUBERNETES_SERVICE_HOST`, ...) come first, as
/// with the kubelet: `$(VAR)` can refer to them and the container's own variables replace them.
pub fn build_env(
    pod: &Pod,
    container: &Container,
    ctx: &EnvContext,
) -> Result<Vec<(String, String)>, EnvError> {
    let mut env = container_env(pod, container, ctx)?;
    add_defaults(&mut env, &ctx.hostname, "/root");
    Ok(env)
}

/// The environment of a container run from a stored image: the image's `Env` (`NAME=value`
/// entries) first, the container's own variables (`container_env`, from [`container_env`])
/// overriding them by name, then the runtime defaults where still unset (HOME: `home`, the
/// image user's home).
pub fn env_over_image(
    image_env: &[String],
    container_env: &[(String, String)],
    hostname: &str,
    home: &str,
) -> Vec<(String, String)> {
    let mut env: Vec<(String, String)> = Vec::new();
    for entry in image_env {
        let (k, v) = entry.split_once('=').unwrap_or((entry.as_str(), ""));
        if !k.is_empty() {
            set_var(&mut env, k, v.to_string());
        }
    }
    for (k, v) in container_env {
        set_var(&mut env, k, v.clone());
    }
    add_defaults(&mut env, hostname, home);
    env
}

/// PATH, HOSTNAME and HOME where unset (what a container runtime adds).
fn add_defaults(env: &mut Vec<(String, String)>, hostname: &str, home: &str) {
    for (k, v) in [
        ("PATH", DEFAULT_PATH),
        ("HOSTNAME", hostname),
        ("HOME", home),
    ] {
        if !env.iter().any(|(n, _)| n == k) {
            env.push((k.to_string(), v.to_string()));
        }
    }
}

/// The container's own variables: envFrom (in order), then env (later entries win, values
/// `$(VAR)`-expanded against what came before). No defaults.
pub fn container_env(
    pod: &Pod,
    container: &Container,
    ctx: &EnvContext,
) -> Result<Vec<(String, String)>, EnvError> {
    let mut env: Vec<(String, String)> = ctx.service_env.clone();
    add_env_from(container, ctx, &mut env)?;
    for var in container.env.iter().flatten() {
        let value = if let Some(vf) = &var.value_from {
            match value_from(pod, container, ctx, vf)? {
                Some(value) => value,
                None => continue,
            }
        } else {
            let raw = var.value.clone().unwrap_or_default();
            let snapshot = env.clone();
            expand(&raw, &env_lookup(&snapshot))
        };
        set_var(&mut env, &var.name, value);
    }
    Ok(env)
}

/// Adds the variables of every `envFrom` source, in order (keys that are not valid names are
/// skipped; a missing optional source adds nothing).
fn add_env_from(
    container: &Container,
    ctx: &EnvContext,
    env: &mut Vec<(String, String)>,
) -> Result<(), EnvError> {
    for ef in container.env_from.iter().flatten() {
        let prefix = ef.prefix.clone().unwrap_or_default();
        let data = if let Some(r) = &ef.config_map_ref {
            match ctx.config_maps.get(&r.name) {
                Some(cm) => config_map_data(cm),
                None if r.optional == Some(true) => continue,
                None => return Err(EnvError::ConfigMapNotFound(r.name.clone())),
            }
        } else if let Some(r) = &ef.secret_ref {
            match ctx.secrets.get(&r.name) {
                Some(s) => secret_data(s),
                None if r.optional == Some(true) => continue,
                None => return Err(EnvError::SecretNotFound(r.name.clone())),
            }
        } else {
            continue;
        };
        for (k, v) in data {
            let name = format!("{prefix}{k}");
            if is_env_name(&name) {
                set_var(env, &name, String::from_utf8_lossy(&v).into_owned());
            }
        }
    }
    Ok(())
}

/// The value of an env var's `valueFrom`; `None` when an optional ConfigMap/Secret (or its key)
/// is missing, so the variable is left unset.
fn value_from(
    pod: &Pod,
    container: &Container,
    ctx: &EnvContext,
    vf: &EnvVarSource,
) -> Result<Option<String>, EnvError> {
    if let Some(f) = &vf.field_ref {
        field_value(pod, ctx, &f.field_path).map(Some)
    } else if let Some(r) = &vf.resource_field_ref {
        let target = match &r.container_name {
            Some(n) if !n.is_empty() => pod
                .spec
                .as_ref()
                .and_then(|s| s.containers.iter().find(|c| &c.name == n))
                .unwrap_or(container),
            _ => container,
        };
        resource_value(
            target,
            &r.resource,
            r.divisor.as_ref().map(|q| q.0.as_str()),
        )
        .map(Some)
    } else if let Some(r) = &vf.config_map_key_ref {
        let optional = r.optional == Some(true);
        let Some(cm) = ctx.config_maps.get(&r.name) else {
            return missing(optional, EnvError::ConfigMapNotFound(r.name.clone()));
        };
        match config_map_data(cm).get(&r.key) {
            Some(v) => Ok(Some(String::from_utf8_lossy(v).into_owned())),
            None => missing(
                optional,
                EnvError::ConfigMapKeyNotFound {
                    ns: pod.metadata.namespace.clone().unwrap_or_default(),
                    name: r.name.clone(),
                    key: r.key.clone(),
                },
            ),
        }
    } else if let Some(r) = &vf.secret_key_ref {
        let optional = r.optional == Some(true);
        let Some(s) = ctx.secrets.get(&r.name) else {
            return missing(optional, EnvError::SecretNotFound(r.name.clone()));
        };
        match secret_data(s).get(&r.key) {
            Some(v) => Ok(Some(String::from_utf8_lossy(v).into_owned())),
            None => missing(
                optional,
                EnvError::SecretKeyNotFound {
                    ns: pod.metadata.namespace.clone().unwrap_or_default(),
                    name: r.name.clone(),
                    key: r.key.clone(),
                },
            ),
        }
    } else {
        Ok(Some(String::new()))
    }
}

/// A missing reference: no value when it is optional, else `err`.
fn missing(optional: bool, err: EnvError) -> Result<Option<String>, EnvError> {
    if optional { Ok(None) } else { Err(err) }
}

/// The PATH of an environment (the default when unset).
pub fn path_of(env: &[(String, String)]) -> &str {
    env.iter()
        .rev()
        .find(|(k, _)| k == "PATH")
        .map_or(DEFAULT_PATH, |(_, v)| v.as_str())
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::ByteString;

    fn map(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let m: BTreeMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        move |k| m.get(k).cloned()
    }

    #[test]
    fn expansion_follows_kubernetes_rules() {
        let m = map(&[("A", "x"), ("EMPTY", "")]);
        assert_eq!(expand("$(A)", &m), "x");
        assert_eq!(expand("a-$(A)-b", &m), "a-x-b");
        assert_eq!(expand("$(A)$(A)", &m), "xx");
        assert_eq!(expand("$$(A)", &m), "$(A)");
        assert_eq!(expand("$$$(A)", &m), "$x");
        assert_eq!(expand("$(UNKNOWN)", &m), "$(UNKNOWN)");
        assert_eq!(expand("$(EMPTY)z", &m), "z");
        assert_eq!(expand("$(A", &m), "$(A");
        assert_eq!(expand("$A", &m), "$A");
        assert_eq!(expand("tail$", &m), "tail$");
        assert_eq!(expand("$", &m), "$");
        assert_eq!(expand("é$(A)é", &m), "éxé");
        assert_eq!(expand("$é", &m), "$é");
        assert_eq!(expand("", &m), "");
    }

    #[test]
    fn image_table() {
        for etcd in [
            "quay.io/coreos/etcd:v3.4.13",
            "registry.k8s.io/etcd:3.5.9-0",
            "gcr.io/etcd-development/etcd@sha256:abc",
            "bitnami/etcd",
            "localhost:5000/etcd:1",
        ] {
            assert_eq!(lookup(etcd).unwrap().entrypoint, vec!["etcd"], "{etcd}");
        }
        for sh in [
            "busybox",
            "busybox:1.36",
            "docker.io/library/alpine:3",
            "debian:bookworm-slim",
        ] {
            assert_eq!(lookup(sh).unwrap().entrypoint, vec!["sh"], "{sh}");
        }
        for unknown in [
            "nginx",
            "registry:5000/nginx:1",
            "postgres:16",
            "etc/busybox2",
            "ghcr.io/storage-migrator/storage-migrator-mover:0.1.0",
            "ghcr.io/storage-migrator/storage-migrator:0.1.0",
            "storage-migrator-mover@sha256:00",
        ] {
            assert_eq!(lookup(unknown), Err(ImageError::Unknown(unknown.into())));
        }
        assert_eq!(repository("localhost:5000/etcd:1"), "localhost:5000/etcd");
        assert_eq!(repository("localhost:5000/etcd"), "localhost:5000/etcd");
    }

    #[test]
    fn pull_policy_decisions() {
        use PullPolicy::*;
        let ours = "ghcr.io/storage-migrator/storage-migrator:0.1.0";
        let src = |image: &str, p, stored: Option<u8>| choose_source(image, p, stored);
        // The store serves IfNotPresent and Never; Always cannot pull without a registry.
        assert_eq!(src(ours, IfNotPresent, Some(1)), Ok(ImageSource::Store(1)));
        assert_eq!(src(ours, Never, Some(1)), Ok(ImageSource::Store(1)));
        let always = src(ours, Always, Some(1)).unwrap_err();
        assert_eq!(always, PullError::AlwaysWithoutRegistry(ours.into()));
        assert_eq!(always.reason(), "ErrImagePull");
        // Absent everywhere: ErrImagePull naming the image, or ErrImageNeverPull.
        for p in [Always, IfNotPresent] {
            let e = src(ours, p, None).unwrap_err();
            assert_eq!(e.reason(), "ErrImagePull");
            assert!(e.to_string().contains(ours), "{e}");
        }
        let never = src(ours, Never, None).unwrap_err();
        assert_eq!(never.reason(), "ErrImageNeverPull");
        assert!(never.to_string().contains(ours), "{never}");
        // Host programs stand in for images the node has, under any policy; a loaded image of
        // the same name wins where the store is used.
        for p in [Always, IfNotPresent, Never] {
            assert!(matches!(src("busybox", p, None), Ok(ImageSource::Host(_))));
        }
        assert!(matches!(
            src("busybox", Always, Some(1)),
            Ok(ImageSource::Host(_))
        ));
        assert_eq!(src("busybox", Never, Some(1)), Ok(ImageSource::Store(1)));
    }

    #[test]
    fn image_env_comes_first_container_env_overrides() {
        let image_env: Vec<String> = ["PATH=/img/bin", "A=image", "B=image", "EQ=x=y", "NOVAL"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        let container = vec![("B".to_string(), "container".to_string())];
        let env = env_over_image(&image_env, &container, "pod-0", "/home/nonroot");
        let get = |k: &str| env.iter().find(|(n, _)| n == k).map(|(_, v)| v.as_str());
        assert_eq!(get("PATH"), Some("/img/bin"));
        assert_eq!(get("A"), Some("image"));
        assert_eq!(get("B"), Some("container"));
        assert_eq!(get("EQ"), Some("x=y"));
        assert_eq!(get("NOVAL"), Some(""));
        assert_eq!(get("HOME"), Some("/home/nonroot"));
        assert_eq!(get("HOSTNAME"), Some("pod-0"));
        assert_eq!(env.iter().filter(|(n, _)| n == "B").count(), 1);
        let bare = env_over_image(&[], &[], "h", "/");
        assert_eq!(path_of(&bare), DEFAULT_PATH);
    }

    #[test]
    fn command_and_args_semantics() {
        let img = ImageConfig {
            entrypoint: vec!["etcd".into()],
            cmd: vec!["--default".into()],
        };
        let env = vec![("NAME".to_string(), "etcd-0".to_string())];
        let s = |v: &[&str]| v.iter().map(|x| x.to_string()).collect::<Vec<_>>();
        assert_eq!(
            command_line(&img, None, None, &env),
            s(&["etcd", "--default"])
        );
        assert_eq!(
            command_line(&img, None, Some(&s(&["--name=$(NAME)"])), &env),
            s(&["etcd", "--name=etcd-0"])
        );
        assert_eq!(
            command_line(&img, Some(&s(&["/bin/sh", "-c"])), None, &env),
            s(&["/bin/sh", "-c"])
        );
        assert_eq!(
            command_line(
                &img,
                Some(&s(&["/usr/local/bin/etcd"])),
                Some(&s(&["$(NAME)", "$$(NAME)"])),
                &env
            ),
            s(&["/usr/local/bin/etcd", "etcd-0", "$(NAME)"])
        );
    }

    #[test]
    fn programs_resolve_on_the_host() {
        let dir = std::env::temp_dir().join(format!("sm-image-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let prog = dir.join("myprog");
        std::fs::write(&prog, "#!/bin/sh\n").unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&prog, std::fs::Permissions::from_mode(0o755)).unwrap();
        let path = format!("/nonexistent:{}", dir.display());
        assert_eq!(resolve_program("myprog", &path).unwrap(), prog);
        assert_eq!(
            resolve_program("/usr/local/bin/myprog", &path).unwrap(),
            prog
        );
        assert_eq!(resolve_program(prog.to_str().unwrap(), "").unwrap(), prog);
        assert_eq!(
            resolve_program("nothere", &path),
            Err(ImageError::NotFound("nothere".into()))
        );
        assert_eq!(
            resolve_program("sh", DEFAULT_PATH)
                .unwrap()
                .file_name()
                .unwrap(),
            "sh"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    fn fixture() -> Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "etcd-0", "namespace": "db", "uid": "1234-5678",
                          "labels": {"app": "etcd", "b": "x\"y"}, "annotations": {"note": "n"}},
            "spec": {
                "nodeName": "node-b",
                "serviceAccountName": "sa",
                "containers": [{
                    "name": "etcd", "image": "quay.io/coreos/etcd:v3.4.13",
                    "resources": {"limits": {"memory": "1Gi", "cpu": "500m"}},
                    "envFrom": [
                        {"configMapRef": {"name": "cm"}, "prefix": "CM_"},
                        {"secretRef": {"name": "missing", "optional": true}}
                    ],
                    "env": [
                        {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
                        {"name": "POD_NS", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
                        {"name": "POD_UID", "valueFrom": {"fieldRef": {"fieldPath": "metadata.uid"}}},
                        {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
                        {"name": "HOST_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.hostIP"}}},
                        {"name": "NODE", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
                        {"name": "SA", "valueFrom": {"fieldRef": {"fieldPath": "spec.serviceAccountName"}}},
                        {"name": "APP", "valueFrom": {"fieldRef": {"fieldPath": "metadata.labels['app']"}}},
                        {"name": "NOTE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.annotations['note']"}}},
                        {"name": "PEER", "value": "http://$(POD_NAME).etcd:2380"},
                        {"name": "LATER", "value": "$(DEFINED_LATER)"},
                        {"name": "DEFINED_LATER", "value": "v"},
                        {"name": "CM_a", "value": "override"},
                        {"name": "KEY", "valueFrom": {"configMapKeyRef": {"name": "cm", "key": "b"}}},
                        {"name": "SEC", "valueFrom": {"secretKeyRef": {"name": "sec", "key": "pw"}}},
                        {"name": "OPT", "valueFrom": {"secretKeyRef": {"name": "sec", "key": "nope", "optional": true}}},
                        {"name": "MEM", "valueFrom": {"resourceFieldRef": {"resource": "limits.memory", "divisor": "1Mi"}}},
                        {"name": "CPU", "valueFrom": {"resourceFieldRef": {"resource": "limits.cpu"}}},
                        {"name": "PATH", "value": "/bin"}
                    ]
                }]
            }
        }))
        .unwrap()
    }

    fn ctx() -> EnvContext {
        let cm: ConfigMap = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "cm"}, "data": {"a": "1", "b": "2", "bad key": "x"}
        }))
        .unwrap();
        let sec = Secret {
            data: Some(BTreeMap::from([(
                "pw".to_string(),
                ByteString(b"s3cr3t".to_vec()),
            )])),
            ..Default::default()
        };
        EnvContext {
            pod_ip: "198.18.7.3".into(),
            host_ip: "127.0.0.1".into(),
            hostname: "etcd-0".into(),
            config_maps: BTreeMap::from([("cm".to_string(), cm)]),
            secrets: BTreeMap::from([("sec".to_string(), sec)]),
            service_env: Vec::new(),
            ..Default::default()
        }
    }

    #[test]
    fn service_variables_come_first_and_yield_to_the_containers() {
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p"},
            "spec": {"containers": [{
                "name": "c",
                "env": [
                    {"name": "URL", "value": "https://$(KUBERNETES_SERVICE_HOST):$(KUBERNETES_SERVICE_PORT)"},
                    {"name": "KUBERNETES_SERVICE_PORT", "value": "6443"}
                ]
            }]}
        }))
        .unwrap();
        let cx = EnvContext {
            service_env: vec![
                ("KUBERNETES_SERVICE_HOST".into(), "198.19.7.1".into()),
                ("KUBERNETES_SERVICE_PORT".into(), "443".into()),
            ],
            ..ctx()
        };
        let c = &pod.spec.as_ref().unwrap().containers[0];
        let env = build_env(&pod, c, &cx).unwrap();
        let get = |k: &str| env.iter().find(|(n, _)| n == k).map(|(_, v)| v.as_str());
        assert_eq!(get("URL"), Some("https://198.19.7.1:443"));
        assert_eq!(get("KUBERNETES_SERVICE_HOST"), Some("198.19.7.1"));
        assert_eq!(get("KUBERNETES_SERVICE_PORT"), Some("6443"));
        assert_eq!(
            env.iter()
                .filter(|(n, _)| n == "KUBERNETES_SERVICE_PORT")
                .count(),
            1
        );
    }

    #[test]
    fn env_is_built_like_the_kubelet() {
        let pod = fixture();
        let c = &pod.spec.as_ref().unwrap().containers[0];
        let env = build_env(&pod, c, &ctx()).unwrap();
        let get = |k: &str| env.iter().find(|(n, _)| n == k).map(|(_, v)| v.as_str());
        assert_eq!(get("CM_a"), Some("override"));
        assert_eq!(get("CM_b"), Some("2"));
        assert_eq!(get("CM_bad key"), None);
        assert_eq!(get("POD_NAME"), Some("etcd-0"));
        assert_eq!(get("POD_NS"), Some("db"));
        assert_eq!(get("POD_UID"), Some("1234-5678"));
        assert_eq!(get("POD_IP"), Some("198.18.7.3"));
        assert_eq!(get("HOST_IP"), Some("127.0.0.1"));
        assert_eq!(get("NODE"), Some("node-b"));
        assert_eq!(get("SA"), Some("sa"));
        assert_eq!(get("APP"), Some("etcd"));
        assert_eq!(get("NOTE"), Some("n"));
        assert_eq!(get("PEER"), Some("http://etcd-0.etcd:2380"));
        assert_eq!(get("LATER"), Some("$(DEFINED_LATER)"));
        assert_eq!(get("KEY"), Some("2"));
        assert_eq!(get("SEC"), Some("s3cr3t"));
        assert_eq!(get("OPT"), None);
        assert_eq!(get("MEM"), Some("1024"));
        assert_eq!(get("CPU"), Some("1"));
        assert_eq!(get("PATH"), Some("/bin"));
        assert_eq!(get("HOSTNAME"), Some("etcd-0"));
        assert_eq!(get("HOME"), Some("/root"));
        assert_eq!(get("KUBERNETES_SERVICE_HOST"), None);
        assert_eq!(path_of(&env), "/bin");
    }

    #[test]
    fn missing_references_are_errors_unless_optional() {
        let pod = fixture();
        let c = &pod.spec.as_ref().unwrap().containers[0];
        let mut cx = ctx();
        cx.secrets.clear();
        assert_eq!(
            build_env(&pod, c, &cx),
            Err(EnvError::SecretNotFound("sec".into()))
        );
        let mut cx = ctx();
        cx.config_maps.clear();
        assert_eq!(
            build_env(&pod, c, &cx),
            Err(EnvError::ConfigMapNotFound("cm".into()))
        );
        assert_eq!(
            referenced_objects(&pod),
            (
                vec!["cm".to_string()],
                vec!["missing".to_string(), "sec".to_string()]
            )
        );
    }

    #[test]
    fn downward_maps_and_quantities() {
        let pod = fixture();
        assert_eq!(
            field_value(&pod, &ctx(), "metadata.labels").unwrap(),
            "app=\"etcd\"\nb=\"x\\\"y\"\n"
        );
        assert!(field_value(&pod, &ctx(), "spec.bogus").is_err());
        assert_eq!(quantity_value("500m"), Some(0.5));
        assert_eq!(quantity_value("2Gi"), Some(2.0 * 1024.0 * 1024.0 * 1024.0));
        assert_eq!(quantity_value("1e3"), Some(1000.0));
        assert_eq!(quantity_value("x"), None);
    }
}
