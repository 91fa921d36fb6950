//! Names of the objects we create: deterministic, DNS-1123 labels of at most 63 characters.
//!
//! Why deterministic: every action is idempotent and a restarted operator must find the objects
//! its predecessor created (a create that answers 409 means "already done"), so a name is a pure
//! function of the request and the member, never random. Why ≤63 characters and a DNS-1123
//! label even where the API would accept a longer subdomain: a Job's name becomes the value of
//! the `job-name` label of its pods (label values are ≤63), and pods' names become host names.
//! Why a hash suffix: names are truncated to fit, and the hash (over the untruncated inputs, the
//! request's name included) keeps two members, two kinds or two requests from colliding.

use sha2::{Digest, Sha256};

use super::JobKind;

/// Longest DNS-1123 label.
pub const MAX_LABEL: usize = 63;
/// Longest DNS-1123 subdomain (object names of most kinds).
pub const MAX_SUBDOMAIN: usize = 253;
/// Hex digits of the hash suffix.
const HASH_LEN: usize = 6;

/// True if `s` is a DNS-1123 label: 1 to 63 of `[a-z0-9-]`, starting and ending alphanumeric.
pub fn is_dns1123_label(s: &str) -> bool {
    let bytes = s.as_bytes();
    !bytes.is_empty()
        && bytes.len() <= MAX_LABEL
        && bytes
            .iter()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || *b == b'-')
        && bytes.first().is_some_and(u8::is_ascii_alphanumeric)
        && bytes.last().is_some_and(u8::is_ascii_alphanumeric)
}

/// The first [`HASH_LEN`] hex digits of SHA-256 over the parts (NUL-separated, so `("ab","c")`
/// and `("a","bc")` differ).
pub(crate) fn short_hash(parts: &[&str]) -> String {
    let mut hasher = Sha256::new();
    for part in parts {
        hasher.update(part.as_bytes());
        hasher.update([0u8]);
    }
    let digest = hasher.finalize();
    let mut out = String::with_capacity(HASH_LEN);
    for byte in digest.iter().take(HASH_LEN.div_ceil(2)) {
        out.push_str(&format!("{byte:02x}"));
    }
    out.truncate(HASH_LEN);
    out
}

/// `s` made into the start of a DNS-1123 label of at most `max` characters: lower-cased, any
/// other character (a `.` of a subdomain, say) turned into `-`, truncated, no `-` at either end.
fn label_prefix(s: &str, max: usize) -> String {
    let mapped: String = s
        .chars()
        .map(|c| {
            let c = c.to_ascii_lowercase();
            if c.is_ascii_lowercase() || c.is_ascii_digit() {
                c
            } else {
                '-'
            }
        })
        .take(max)
        .collect();
    let trimmed = mapped.trim_matches('-');
    if trimmed.is_empty() {
        "smr".to_string()
    } else {
        trimmed.to_string()
    }
}

/// `<base>-<tag>-<hash>` within 63 characters; `base` is truncated to fit.
fn hashed_label(base: &str, tag: &str, hash_inputs: &[&str]) -> String {
    let hash = short_hash(hash_inputs);
    let room = MAX_LABEL - tag.len() - hash.len() - 2;
    format!("{}-{tag}-{hash}", label_prefix(base, room))
}

/// Name of the temporary claim of member claim `claim`: `<claim>-smr-<hash6>`.
///
/// Why: the new volume is provisioned for this claim, then the claim is deleted and the volume
/// re-bound under the original name; until then both claims coexist in the namespace, so the
/// temporary one needs its own name, recognisable by a human (`-smr-`) and stable across
/// restarts.
pub fn temp_claim_name(req_name: &str, claim: &str) -> String {
    hashed_label(claim, "smr", &["temp-claim", req_name, claim])
}

/// Name of the Job of `kind` for member pod `pod` (for a member's further claim, `pod` is
/// `<pod>-<template>`: see `PlannedMember::helper_subject`): `<pod>-<kind>-<hash6>`.
///
/// Why ≤63: the Job controller copies the Job's name into the `job-name` label of its pods, a
/// label value (≤63), and refuses longer names.
pub fn job_name(req_name: &str, pod: &str, kind: JobKind) -> String {
    hashed_label(pod, kind.as_str(), &["job", req_name, pod, kind.as_str()])
}

/// Name of the WaitForFirstConsumer mounter pod for member pod `pod` (or `<pod>-<template>`, as
/// for [`job_name`]): `<pod>-mount-<hash6>`.
pub fn mounter_name(req_name: &str, pod: &str) -> String {
    hashed_label(pod, "mount", &["mounter", req_name, pod])
}

/// Name of the request's stash ConfigMap: `<req>-stash` (a subdomain like the request's own
/// name; hashed only if it would exceed 253).
///
/// Why a name derived from the request's name (and not generated): the operator finds it again
/// by name after a restart, a `kubectl replace` of the request or a lost status, and so does a
/// human reading the docs.
pub fn stash_config_map_name(req_name: &str) -> String {
    let plain = format!("{req_name}-stash");
    if plain.len() <= MAX_SUBDOMAIN {
        return plain;
    }
    let hash = short_hash(&["stash", req_name]);
    let room = MAX_SUBDOMAIN - hash.len() - "-stash-".len();
    let base: String = req_name.chars().take(room).collect();
    format!("{}-stash-{hash}", base.trim_end_matches(['-', '.']))
}

/// Key in the stash ConfigMap of the manifest `name` of a kind (`prefix`: `pod-`, `claim-`):
/// `<prefix><name>`.
///
/// Why the hash fallback: a ConfigMap key is at most 253 characters (`[-._a-zA-Z0-9]+`), and a
/// claim name may itself be 253 long. Long names become `<prefix><start>-<hash6>`.
pub fn stash_key(prefix: &str, name: &str) -> String {
    if prefix.len() + name.len() <= MAX_SUBDOMAIN {
        return format!("{prefix}{name}");
    }
    let hash = short_hash(&["stash-key", prefix, name]);
    let room = MAX_SUBDOMAIN - prefix.len() - hash.len() - 1;
    let base: String = name.chars().take(room).collect();
    format!("{prefix}{}-{hash}", base.trim_end_matches(['-', '.']))
}

/// Name of the request `kubectl smr fleet` writes for one workload: `<kind>-<name>-to-<class>`
/// (`kind`: `sts`, `deploy` or `pvc`) when that is a DNS-1123 label, else `<start>-fleet-<hash6>`.
///
/// Why deterministic: running the command again names the same requests, so `--apply` finds
/// the ones it created before (409) instead of creating a second request per workload. Why a
/// label: the request's name is the value of [`crate::labels::REQUEST_LABEL`] on what it
/// creates.
pub fn fleet_request_name(kind: &str, name: &str, to_class: &str) -> String {
    let plain = format!("{kind}-{name}-to-{to_class}");
    if is_dns1123_label(&plain) {
        return plain;
    }
    hashed_label(&plain, "fleet", &["fleet-request", kind, name, to_class])
}

/// Value of [`crate::labels::FLEET_LABEL`] on the requests of one `kubectl smr fleet` run:
/// `<from>-to-<to>`, hashed like [`fleet_request_name`] when it is no label value.
pub fn fleet_label_value(from_class: &str, to_class: &str) -> String {
    let plain = format!("{from_class}-to-{to_class}");
    if is_dns1123_label(&plain) {
        return plain;
    }
    hashed_label(&plain, "fleet", &["fleet-label", from_class, to_class])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fleet_names_are_plain_when_they_fit_and_hashed_labels_when_not() {
        assert_eq!(
            fleet_request_name("sts", "etcd", "fast"),
            "sts-etcd-to-fast"
        );
        assert_eq!(fleet_label_value("gp2", "gp3"), "gp2-to-gp3");
        let long = "a".repeat(70);
        for name in [
            fleet_request_name("sts", &long, "fast"),
            fleet_request_name("deploy", "web.v2", "fast"),
            fleet_label_value(&long, "gp3"),
            fleet_label_value("Fast.SSD", "gp3"),
        ] {
            assert!(is_dns1123_label(&name), "{name}");
            assert!(name.contains("-fleet-"), "{name}");
        }
        assert_ne!(
            fleet_request_name("sts", &long, "fast"),
            fleet_request_name("sts", &format!("{long}b"), "fast")
        );
    }

    const KINDS: [JobKind; 4] = [
        JobKind::Measure,
        JobKind::PreCopy,
        JobKind::Copy,
        JobKind::Verify,
    ];

    #[test]
    fn names_of_the_three_member_fixture() {
        let req = "etcd-to-fast";
        let mut all = Vec::new();
        for i in 0..3 {
            let pod = format!("etcd-{i}");
            let claim = format!("data-etcd-{i}");
            all.push(temp_claim_name(req, &claim));
            all.push(mounter_name(req, &pod));
            for kind in KINDS {
                all.push(job_name(req, &pod, kind));
            }
        }
        insta::assert_yaml_snapshot!(all);
        for name in &all {
            assert!(is_dns1123_label(name), "{name}");
        }
        let mut dedup = all.clone();
        dedup.sort();
        dedup.dedup();
        assert_eq!(dedup.len(), all.len(), "names must be distinct: {all:?}");
    }

    #[test]
    fn deterministic() {
        assert_eq!(
            temp_claim_name("r", "data-etcd-0"),
            temp_claim_name("r", "data-etcd-0")
        );
        assert_eq!(
            job_name("r", "etcd-0", JobKind::Copy),
            job_name("r", "etcd-0", JobKind::Copy)
        );
        assert_eq!(mounter_name("r", "etcd-0"), mounter_name("r", "etcd-0"));
    }

    #[test]
    fn distinct_per_request() {
        assert_ne!(
            temp_claim_name("a", "data-etcd-0"),
            temp_claim_name("b", "data-etcd-0")
        );
        assert_ne!(
            job_name("a", "etcd-0", JobKind::Copy),
            job_name("b", "etcd-0", JobKind::Copy)
        );
        assert_ne!(mounter_name("a", "etcd-0"), mounter_name("b", "etcd-0"));
    }

    #[test]
    fn long_and_odd_inputs_stay_valid_and_distinct() {
        let long_req = "r".repeat(253);
        // 63-character pod names that differ only at the end: truncation alone would collide.
        let pod_a = format!("{}-0", "p".repeat(61));
        let pod_b = format!("{}-1", "p".repeat(61));
        let claim_a = format!("data-{pod_a}.with.dots");
        let claim_b = format!("data-{pod_b}.with.dots");
        let mut all = vec![
            temp_claim_name(&long_req, &claim_a),
            temp_claim_name(&long_req, &claim_b),
            temp_claim_name("r", "-.-"),
            temp_claim_name("r", "UPPER.Case_claim"),
            mounter_name(&long_req, &pod_a),
            mounter_name(&long_req, &pod_b),
        ];
        for kind in KINDS {
            all.push(job_name(&long_req, &pod_a, kind));
            all.push(job_name(&long_req, &pod_b, kind));
        }
        for name in &all {
            assert!(is_dns1123_label(name), "{name:?} ({} chars)", name.len());
        }
        let mut dedup = all.clone();
        dedup.sort();
        dedup.dedup();
        assert_eq!(dedup.len(), all.len(), "names must be distinct: {all:?}");
    }

    #[test]
    fn dns1123_label_check() {
        assert!(is_dns1123_label("etcd-0"));
        assert!(is_dns1123_label(&"a".repeat(63)));
        assert!(!is_dns1123_label(&"a".repeat(64)));
        assert!(!is_dns1123_label(""));
        assert!(!is_dns1123_label("-a"));
        assert!(!is_dns1123_label("a-"));
        assert!(!is_dns1123_label("a.b"));
        assert!(!is_dns1123_label("A"));
    }

    #[test]
    fn stash_names() {
        assert_eq!(stash_key("pod-", "etcd-0"), "pod-etcd-0");
        assert_eq!(stash_key("claim-", "data-etcd-0"), "claim-data-etcd-0");
        // A 253-character claim name still gives a valid key, distinct per name.
        let long = stash_key("claim-", &"c".repeat(253));
        assert!(long.len() <= 253 && long.starts_with("claim-ccc"), "{long}");
        assert!(
            long.chars()
                .all(|c| c.is_ascii_alphanumeric() || "-._".contains(c)),
            "{long}"
        );
        assert_ne!(
            stash_key("claim-", &format!("{}-0", "c".repeat(251))),
            stash_key("claim-", &format!("{}-1", "c".repeat(251)))
        );
        assert_eq!(stash_config_map_name("etcd-to-fast"), "etcd-to-fast-stash");
        assert!(stash_config_map_name(&"r".repeat(253)).len() <= 253);
    }
}
