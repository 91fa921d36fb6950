//! A container's security context as the kubelet and containerd turn it into a process. Pure
//! functions; `runtime::init` applies the result.
//!
//! - `runAsUser`, `runAsGroup`, `runAsNonRoot`: the container's value, else the pod's.
//! - `runAsNonRoot: true`: the kubelet refuses to create a container whose effective uid is 0
//!   (`runAsUser`, else the image's user, else root): the container waits with reason
//!   `CreateContainerConfigError` and the kubelet's message ([`verify_run_as_non_root`]).
//! - `readOnlyRootFilesystem`, `allowPrivilegeEscalation`, `privileged`, `capabilities`: the
//!   container's (a pod has none of these). `allowPrivilegeEscalation: false` sets
//!   `no_new_privs`; `privileged` gives every capability (and ignores add/drop, as containerd).
//! - Capabilities ([`capability_set`]): containerd's default set ([`DEFAULT_CAPABILITIES`]),
//!   then `add: [ALL]`, `drop: [ALL]`, the other adds, the other drops, in that order (so a cap
//!   both added and dropped is dropped). Names are taken with or without `CAP_`, any case.

use std::collections::BTreeSet;

use k8s_openapi::api::core::v1::{Container, Pod, PodSecurityContext, SecurityContext};

/// The capabilities containerd (and Docker) give every container that is not privileged.
pub const DEFAULT_CAPABILITIES: [&str; 14] = [
    "CAP_CHOWN",
    "CAP_DAC_OVERRIDE",
    "CAP_FSETID",
    "CAP_FOWNER",
    "CAP_MKNOD",
    "CAP_NET_RAW",
    "CAP_SETGID",
    "CAP_SETUID",
    "CAP_SETFCAP",
    "CAP_SETPCAP",
    "CAP_NET_BIND_SERVICE",
    "CAP_SYS_CHROOT",
    "CAP_KILL",
    "CAP_AUDIT_WRITE",
];

/// The effective security settings of one container.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Effective {
    pub run_as_user: Option<u32>,
    pub run_as_group: Option<u32>,
    pub run_as_non_root: bool,
    pub read_only_root: bool,
    /// `allowPrivilegeEscalation: false` (and only an explicit `false`).
    pub no_new_privs: bool,
    pub privileged: bool,
    /// `CAP_*` names, sorted.
    pub capabilities: Vec<String>,
}

/// The effective settings of container `c` of `pod`; `all_caps` are the capability names the
/// runtime knows (a privileged container gets them all; unknown names in add are ignored).
pub fn effective(pod: &Pod, c: &Container, all_caps: &[String]) -> Effective {
    let pod_sc = pod.spec.as_ref().and_then(|s| s.security_context.as_ref());
    let c_sc = c.security_context.as_ref();
    let pick = |from_c: fn(&SecurityContext) -> Option<i64>,
                from_pod: fn(&PodSecurityContext) -> Option<i64>| {
        c_sc.and_then(from_c)
            .or_else(|| pod_sc.and_then(from_pod))
            .and_then(|v| u32::try_from(v).ok())
    };
    let privileged = c_sc.and_then(|s| s.privileged) == Some(true);
    let caps = c_sc.and_then(|s| s.capabilities.as_ref());
    let list = |v: Option<&Vec<String>>| v.cloned().unwrap_or_default();
    Effective {
        run_as_user: pick(|s| s.run_as_user, |s| s.run_as_user),
        run_as_group: pick(|s| s.run_as_group, |s| s.run_as_group),
        run_as_non_root: c_sc
            .and_then(|s| s.run_as_non_root)
            .or_else(|| pod_sc.and_then(|s| s.run_as_non_root))
            == Some(true),
        read_only_root: c_sc.and_then(|s| s.read_only_root_filesystem) == Some(true),
        no_new_privs: c_sc.and_then(|s| s.allow_privilege_escalation) == Some(false),
        privileged,
        capabilities: capability_set(
            privileged,
            &list(caps.and_then(|c| c.add.as_ref())),
            &list(caps.and_then(|c| c.drop.as_ref())),
            all_caps,
        ),
    }
}

/// `CAP_<NAME>` in upper case, whether `name` had the prefix or not.
pub fn cap_name(name: &str) -> String {
    let upper = name.trim().to_ascii_uppercase();
    if upper.starts_with("CAP_") {
        upper
    } else {
        format!("CAP_{upper}")
    }
}

/// The capability set of a container (see the module docs); sorted `CAP_*` names.
pub fn capability_set(
    privileged: bool,
    add: &[String],
    drop: &[String],
    all_caps: &[String],
) -> Vec<String> {
    let all: BTreeSet<String> = all_caps.iter().map(|c| cap_name(c)).collect();
    if privileged {
        return all.into_iter().collect();
    }
    let is_all = |s: &String| s.trim().eq_ignore_ascii_case("ALL");
    let mut set: BTreeSet<String> = DEFAULT_CAPABILITIES.iter().map(|c| c.to_string()).collect();
    if add.iter().any(is_all) {
        set.extend(all.iter().cloned());
    }
    if drop.iter().any(is_all) {
        set.clear();
    }
    set.extend(
        add.iter()
            .filter(|a| !is_all(a))
            .map(|a| cap_name(a))
            .filter(|a| all.contains(a)),
    );
    for d in drop.iter().filter(|d| !is_all(d)) {
        set.remove(&cap_name(d));
    }
    set.into_iter().collect()
}

/// The kubelet's check of `runAsNonRoot` (its messages included). `image_uid`: the uid of the
/// image's user, None when the image names none (then it runs as root).
pub fn verify_run_as_non_root(
    pod: &Pod,
    c: &Container,
    eff: &Effective,
    image_uid: Option<u32>,
) -> Result<(), String> {
    if !eff.run_as_non_root {
        return Ok(());
    }
    let pod_name = format!(
        "{}_{}({})",
        pod.metadata.name.as_deref().unwrap_or_default(),
        pod.metadata.namespace.as_deref().unwrap_or_default(),
        pod.metadata.uid.as_deref().unwrap_or_default()
    );
    match (eff.run_as_user, image_uid.unwrap_or(0)) {
        (Some(0), _) => Err(format!(
            "container's runAsUser breaks non-root policy (pod: {pod_name:?}, container: {})",
            c.name
        )),
        (Some(_), _) => Ok(()),
        (None, 0) => Err(format!(
            "container has runAsNonRoot and image will run as root (pod: {pod_name:?}, container: {})",
            c.name
        )),
        (None, _) => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(v: &[&str]) -> Vec<String> {
        v.iter().map(|x| x.to_string()).collect()
    }

    fn all() -> Vec<String> {
        let mut v = s(&DEFAULT_CAPABILITIES);
        v.extend(s(&["CAP_SYS_ADMIN", "CAP_NET_ADMIN", "CAP_SYS_PTRACE"]));
        v
    }

    fn defaults_without(gone: &[&str]) -> Vec<String> {
        let mut v: Vec<String> = s(&DEFAULT_CAPABILITIES)
            .into_iter()
            .filter(|c| !gone.contains(&c.as_str()))
            .collect();
        v.sort();
        v
    }

    #[test]
    fn capabilities_follow_containerd() {
        let none: Vec<String> = Vec::new();
        assert_eq!(
            capability_set(false, &none, &none, &all()),
            defaults_without(&[])
        );
        assert_eq!(
            capability_set(false, &none, &s(&["ALL"]), &all()),
            Vec::<String>::new()
        );
        assert_eq!(
            capability_set(false, &none, &s(&["chown", "CAP_KILL"]), &all()),
            defaults_without(&["CAP_CHOWN", "CAP_KILL"])
        );
        // drop ALL then add one: only that one.
        assert_eq!(
            capability_set(false, &s(&["NET_ADMIN"]), &s(&["all"]), &all()),
            s(&["CAP_NET_ADMIN"])
        );
        // add ALL then drop one: everything but that one.
        let mut want: Vec<String> = all().into_iter().filter(|c| c != "CAP_CHOWN").collect();
        want.sort();
        assert_eq!(
            capability_set(false, &s(&["ALL"]), &s(&["CHOWN"]), &all()),
            want
        );
        // A cap both added and dropped is dropped; unknown names are not added.
        assert_eq!(
            capability_set(
                false,
                &s(&["SYS_ADMIN", "BOGUS"]),
                &s(&["SYS_ADMIN"]),
                &all()
            ),
            defaults_without(&[])
        );
        // Privileged: all, whatever add/drop say.
        let mut every = all();
        every.sort();
        assert_eq!(capability_set(true, &none, &s(&["ALL"]), &all()), every);
    }

    fn pod(yaml: serde_json::Value) -> Pod {
        serde_json::from_value(yaml).unwrap()
    }

    #[test]
    fn container_settings_win_over_the_pods() {
        let p = pod(serde_json::json!({
            "metadata": {"name": "p", "namespace": "n", "uid": "u1"},
            "spec": {
                "securityContext": {"runAsUser": 1000, "runAsGroup": 2000, "runAsNonRoot": true},
                "containers": [
                    {"name": "a"},
                    {"name": "b", "securityContext": {
                        "runAsUser": 0, "runAsNonRoot": false,
                        "readOnlyRootFilesystem": true, "allowPrivilegeEscalation": false,
                        "capabilities": {"drop": ["ALL"], "add": ["CHOWN"]}}},
                    {"name": "c", "securityContext": {"allowPrivilegeEscalation": true, "privileged": true}}
                ]
            }
        }));
        let cs = &p.spec.as_ref().unwrap().containers;
        let a = effective(&p, &cs[0], &all());
        assert_eq!((a.run_as_user, a.run_as_group), (Some(1000), Some(2000)));
        assert!(a.run_as_non_root && !a.read_only_root && !a.no_new_privs && !a.privileged);
        assert_eq!(a.capabilities, defaults_without(&[]));
        let b = effective(&p, &cs[1], &all());
        assert_eq!((b.run_as_user, b.run_as_group), (Some(0), Some(2000)));
        assert!(!b.run_as_non_root && b.read_only_root && b.no_new_privs);
        assert_eq!(b.capabilities, s(&["CAP_CHOWN"]));
        let c = effective(&p, &cs[2], &all());
        assert!(c.privileged && !c.no_new_privs);
        assert_eq!(c.capabilities.len(), all().len());
    }

    #[test]
    fn run_as_non_root_refuses_an_effective_uid_zero() {
        let p = pod(serde_json::json!({
            "metadata": {"name": "p", "namespace": "n", "uid": "u1"},
            "spec": {"containers": [{"name": "app"}]}
        }));
        let c = &p.spec.as_ref().unwrap().containers[0];
        let eff = |uid: Option<u32>, non_root: bool| Effective {
            run_as_user: uid,
            run_as_non_root: non_root,
            ..Default::default()
        };
        // Not asked: anything goes.
        assert!(verify_run_as_non_root(&p, c, &eff(Some(0), false), None).is_ok());
        assert_eq!(
            verify_run_as_non_root(&p, c, &eff(Some(0), true), Some(1000)),
            Err(
                "container's runAsUser breaks non-root policy (pod: \"p_n(u1)\", container: app)"
                    .to_string()
            )
        );
        assert!(verify_run_as_non_root(&p, c, &eff(Some(1000), true), Some(0)).is_ok());
        // No runAsUser: the image's user decides; an image without one runs as root.
        assert_eq!(
            verify_run_as_non_root(&p, c, &eff(None, true), None),
            Err("container has runAsNonRoot and image will run as root (pod: \"p_n(u1)\", container: app)".to_string())
        );
        assert!(verify_run_as_non_root(&p, c, &eff(None, true), Some(0)).is_err());
        assert!(verify_run_as_non_root(&p, c, &eff(None, true), Some(65532)).is_ok());
    }
}
