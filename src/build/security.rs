//! The security contexts of the pods the operator creates: each gets only what its work needs.
//!
//! | pod | uid | capabilities | mounts |
//! |---|---|---|---|
//! | copy, pre-copy ([`COPY_CAPABILITIES`]) | 0 | CHOWN, DAC_OVERRIDE, FOWNER, FSETID, MKNOD, SETFCAP | source read-only, target read-write |
//! | verify, measure ([`READ_CAPABILITIES`]) | 0 | DAC_OVERRIDE | all read-only |
//! | mounter | 65532 (non-root) | none | target read-only |
//!
//! Every container also gets `drop: [ALL]` (the runtime's default set is not kept),
//! `allowPrivilegeEscalation: false` (no_new_privs: no setuid binary or file capability can
//! raise them), `readOnlyRootFilesystem: true` (the scripts write only to the target and the
//! termination log, which the kubelet mounts) and the `RuntimeDefault` seccomp profile (on the
//! pod, so it covers every container). All of it fits Pod Security's `baseline` level, which
//! allows these capabilities and uid 0; `restricted` refuses both (preflight denies such a
//! namespace, see `plan::preflight`).

use k8s_openapi::api::core::v1::{
    Capabilities, PodSecurityContext, SeccompProfile, SecurityContext,
};

/// What rsync `-aHAXS --numeric-ids` needs, as uid 0, to recreate a tree of files owned by
/// anyone with their owners, modes, ACLs and xattrs. Each is shown needed by the e2e test
/// `mover_caps` (the copy, or its verification, fails without it):
/// - `CHOWN`: give each file its numeric owner and group;
/// - `DAC_OVERRIDE`: read files and enter directories whose mode excludes root's uid (`0600` of
///   another user, `0000`), and write into directories copied with a mode that has no `w`;
///   it covers everything `DAC_READ_SEARCH` would (not in `baseline`'s list, so not used);
/// - `FOWNER`: set modes, times, ACLs and xattrs on files that belong to another uid (after
///   the chown);
/// - `FSETID`: keep the setgid bit of a file whose group is not root's (the kernel clears it
///   on chmod without this);
/// - `MKNOD`: recreate character and block device files;
/// - `SETFCAP`: copy file capabilities (the `security.capability` xattr).
///
/// Not given: `SYS_ADMIN`, so `trusted.*` xattrs are not seen nor copied.
pub const COPY_CAPABILITIES: [&str; 6] = [
    "CHOWN",
    "DAC_OVERRIDE",
    "FOWNER",
    "FSETID",
    "MKNOD",
    "SETFCAP",
];

/// What the read-only Jobs (verify, measure) need to read every file and enter every
/// directory whatever its mode. `DAC_OVERRIDE` rather than the narrower `DAC_READ_SEARCH`:
/// Pod Security's `baseline` level allows the former only, and every mount these pods have is
/// read-only (as is their root), so the write access it adds has nothing to act on.
pub const READ_CAPABILITIES: [&str; 1] = ["DAC_OVERRIDE"];

/// The non-root uid and gid of the mounter (the image's `nonroot` user).
pub const MOUNTER_UID: i64 = 65532;

/// The `RuntimeDefault` seccomp profile.
fn runtime_default() -> SeccompProfile {
    SeccompProfile {
        type_: "RuntimeDefault".to_string(),
        localhost_profile: None,
    }
}

/// The pod's security context: `uid` (and the same gid), non-root when it is not 0, the
/// `RuntimeDefault` seccomp profile.
pub fn pod_security(uid: i64) -> PodSecurityContext {
    PodSecurityContext {
        run_as_user: Some(uid),
        run_as_group: Some(uid),
        run_as_non_root: Some(uid != 0),
        seccomp_profile: Some(runtime_default()),
        ..Default::default()
    }
}

/// A container's security context: every capability dropped but `add`, no privilege
/// escalation, not privileged, read-only root, `RuntimeDefault` seccomp.
pub fn container_security(add: &[&str]) -> SecurityContext {
    SecurityContext {
        capabilities: Some(Capabilities {
            add: (!add.is_empty()).then(|| add.iter().map(|c| c.to_string()).collect()),
            drop: Some(vec!["ALL".to_string()]),
        }),
        allow_privilege_escalation: Some(false),
        privileged: Some(false),
        read_only_root_filesystem: Some(true),
        seccomp_profile: Some(runtime_default()),
        ..Default::default()
    }
}

/// The capabilities Pod Security's `baseline` level lets a container add.
#[cfg(test)]
pub(crate) const BASELINE_CAPABILITIES: [&str; 13] = [
    "AUDIT_WRITE",
    "CHOWN",
    "DAC_OVERRIDE",
    "FOWNER",
    "FSETID",
    "KILL",
    "MKNOD",
    "NET_BIND_SERVICE",
    "SETFCAP",
    "SETGID",
    "SETPCAP",
    "SETUID",
    "SYS_CHROOT",
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_added_capability_is_one_baseline_allows() {
        for cap in COPY_CAPABILITIES.iter().chain(&READ_CAPABILITIES) {
            assert!(BASELINE_CAPABILITIES.contains(cap), "{cap}");
        }
    }

    #[test]
    fn containers_drop_everything_else_and_cannot_escalate() {
        let sc = container_security(&COPY_CAPABILITIES);
        let caps = sc.capabilities.unwrap();
        assert_eq!(caps.drop, Some(vec!["ALL".to_string()]));
        assert_eq!(caps.add.unwrap(), COPY_CAPABILITIES);
        assert_eq!(sc.allow_privilege_escalation, Some(false));
        assert_eq!(sc.privileged, Some(false));
        assert_eq!(sc.read_only_root_filesystem, Some(true));
        assert_eq!(sc.seccomp_profile.unwrap().type_, "RuntimeDefault");
        let none = container_security(&[]).capabilities.unwrap();
        assert_eq!(none.add, None);
        let pod = pod_security(MOUNTER_UID);
        assert_eq!(pod.run_as_non_root, Some(true));
        assert_eq!(pod_security(0).run_as_non_root, Some(false));
    }
}
