//! Every RBAC rule the operator has is used, and none it needs is missing: read from the local
//! cluster's audit log after the whole e2e suite ran its operators under the chart's RBAC.
//!
//! Ignored by default: it proves something only after every other e2e scenario ran against the
//! same cluster. `e2e/scripts/test-all.sh` runs it last (`--ignored`).
//!
//! - **Missing**: any request of the operator's ServiceAccount the API server refused (403), and
//!   any successful request whose verb and resource no rule of `permissions::RULES` names (other
//!   than the SelfSubjectAccessReviews every user may create).
//! - **Unused**: a verb of a rule in `RULES` that no operator request used, unless
//!   [`NOT_EXERCISED`] says why no scenario on the local cluster can use it (and then it must
//!   indeed be unused: an entry that a scenario uses fails the test, so the list only shrinks),
//!   or [`SOMETIMES_USED`] says why its use depends on timing (used or not, both pass).
//!
//! A refusal counts as a missing rule unless
//! - the same ServiceAccount was allowed that verb at another time (a rule withdrawn from its
//!   Role for a while, as `lifecycle.rs` does);
//! - it came once the account's namespace or a RoleBinding in it was deleted: `helm uninstall`
//!   removes the Roles while the operator's pods still stop (and release their Lease), and a
//!   test deletes its namespace while its operator still runs, to see the requests' finalizers
//!   go (the audit policy logs those deletions, see `controlplane::args::AUDIT_POLICY`);
//! - it came while the API server was starting (between its spawn and its first `/readyz`, as
//!   the local cluster records each start): it serves before its authorizer has read the
//!   bindings, and refuses what the rules allow (the test that restarts it sees the operator's
//!   watches and Lease renewal refused then, and allowed a second later).
//!
//! The last two must still name a verb some rule grants.

use std::collections::{BTreeMap, BTreeSet};

use e2e::testing::rbac::{SERVICE_ACCOUNT_SUFFIX, apiserver_starts, audit_log};
use serde_json::Value;
use storage_migrator::permissions::RULES;

type Triple = (String, String, String);

/// Rule verbs no e2e scenario can use on the local cluster, and why. (The retention-policy patch
/// of the StatefulSet and the claims read to remove their ownerReferences are used since the
/// cluster runs 1.37: `retention.rs`; the Secrets' `get` since the ZooKeeper handover by
/// reconfiguration reads its super user's Secret: `engine_zookeeper.rs`.)
const NOT_EXERCISED: &[(&str, &str, &str, &str)] = &[(
    "storagemigrator.io",
    "storagemigrationrequests/finalizers",
    "update",
    "checked by the OwnerReferencesPermissionEnforcement admission plugin (blockOwnerDeletion), never a request",
)];

/// Rule verbs that scenarios use or not depending on timing, so that no run can be made to
/// need them, nor to avoid them: neither unused nor used fails the test. Each is printed with
/// whether this run used it.
const SOMETIMES_USED: &[(&str, &str, &str, &str)] = &[(
    "events.k8s.io",
    "events",
    "patch",
    "kube-runtime's Recorder patches an Event's series only when the same event repeats within its cache window",
)];

/// (group, resource[/subresource], verb) of one audit event of the operator, and its code.
fn operator_request(event: &Value) -> Option<(Triple, i64)> {
    let user = event["user"]["username"].as_str()?;
    let sa = user.strip_prefix("system:serviceaccount:")?;
    let (_, name) = sa.split_once(':')?;
    if !name.ends_with(SERVICE_ACCOUNT_SUFFIX) {
        return None;
    }
    let obj = &event["objectRef"];
    let resource = obj["resource"].as_str()?;
    let resource = match obj["subresource"].as_str() {
        Some(sub) => format!("{resource}/{sub}"),
        None => resource.to_string(),
    };
    let group = obj["apiGroup"].as_str().unwrap_or("").to_string();
    let verb = event["verb"].as_str()?.to_string();
    let code = event["responseStatus"]["code"].as_i64().unwrap_or(0);
    Some(((group, resource, verb), code))
}

/// When the event was received (`None` without a readable time).
fn received(event: &Value) -> Option<jiff::Timestamp> {
    event["requestReceivedTimestamp"].as_str()?.parse().ok()
}

/// Whether `at` is while the API server was starting: after a recorded spawn and before its
/// first `/readyz` (plus a second: the two times are taken by different processes).
fn starting(at: jiff::Timestamp, starts: &[(jiff::Timestamp, jiff::Timestamp)]) -> bool {
    let slack = jiff::SignedDuration::from_secs(1);
    starts
        .iter()
        .any(|(spawned, ready)| *spawned <= at && at <= *ready + slack)
}

/// The namespace of a ServiceAccount's username (`system:serviceaccount:NS:NAME`).
fn account_namespace(user: &str) -> Option<&str> {
    user.strip_prefix("system:serviceaccount:")?
        .split_once(':')
        .map(|(ns, _)| ns)
}

/// For each namespace, when its rules were first revoked: the earliest accepted deletion of the
/// namespace itself or of a RoleBinding in it (the audit policy logs both, whoever asks).
fn revocations(text: &str) -> BTreeMap<String, jiff::Timestamp> {
    let mut first: BTreeMap<String, jiff::Timestamp> = BTreeMap::new();
    for event in text
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
    {
        let verb = event["verb"].as_str().unwrap_or_default();
        let code = event["responseStatus"]["code"].as_i64().unwrap_or(0);
        if !verb.starts_with("delete") || !(200..300).contains(&code) {
            continue;
        }
        let obj = &event["objectRef"];
        let ns = match obj["resource"].as_str() {
            Some("namespaces") => obj["name"].as_str(),
            Some("rolebindings") => obj["namespace"].as_str(),
            _ => None,
        };
        if let (Some(ns), Some(at)) = (ns, received(&event)) {
            let t = first.entry(ns.to_string()).or_insert(at);
            *t = (*t).min(at);
        }
    }
    first
}

/// The operator's requests in the audit log, sorted.
#[derive(Default)]
struct Audit {
    events: usize,
    used: BTreeSet<Triple>,
    allowed_to: BTreeSet<(String, Triple)>,
    refused: BTreeSet<(String, Triple)>,
    /// Refused while the API server was starting.
    while_starting: BTreeSet<Triple>,
    /// Refused after the account's namespace or a RoleBinding in it was deleted.
    revoked: BTreeSet<Triple>,
}

fn read_audit(text: &str, starts: &[(jiff::Timestamp, jiff::Timestamp)]) -> Audit {
    let revoked_at = revocations(text);
    let mut audit = Audit::default();
    for event in text
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
    {
        let Some((triple, code)) = operator_request(&event) else {
            continue;
        };
        let user = event["user"]["username"].as_str().unwrap_or_default();
        audit.events += 1;
        if code != 403 {
            audit.allowed_to.insert((user.to_string(), triple.clone()));
            audit.used.insert(triple);
            continue;
        }
        let at = received(&event);
        let revoked = account_namespace(user)
            .and_then(|ns| revoked_at.get(ns))
            .zip(at)
            .is_some_and(|(revoked, at)| at >= *revoked);
        if at.is_some_and(|at| starting(at, starts)) {
            audit.while_starting.insert(triple);
        } else if revoked {
            audit.revoked.insert(triple);
        } else {
            audit.refused.insert((user.to_string(), triple));
        }
    }
    audit
}

fn granted() -> BTreeSet<Triple> {
    RULES
        .iter()
        .flat_map(|r| {
            r.verbs
                .iter()
                .map(|v| (r.group.to_string(), r.resource.to_string(), v.to_string()))
        })
        .collect()
}

/// Allowed to every authenticated user (`system:basic-user`), so in no rule of ours.
fn everyone_may(t: &Triple) -> bool {
    t.0 == "authorization.k8s.io" && t.1 == "selfsubjectaccessreviews" && t.2 == "create"
}

#[test]
#[ignore = "meaningful only after the whole e2e suite: test-all.sh runs it last"]
fn every_rule_is_used_and_none_is_missing() {
    let path = audit_log().expect("KUBECONFIG names the local cluster");
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("read the audit log {}: {e}", path.display()));
    let starts = apiserver_starts().expect("the API server's recorded starts");
    let Audit {
        events,
        used,
        allowed_to,
        refused,
        while_starting,
        revoked,
    } = read_audit(&text, &starts);
    // Refused but allowed to the same account at another time (a rule withdrawn from its Role
    // for a while): revoked, not missing.
    let refused: BTreeSet<_> = refused
        .into_iter()
        .filter(|r| !allowed_to.contains(r))
        .map(|(_, t)| t)
        .collect();
    eprintln!(
        "NOTE audit: {events} operator requests, {} distinct; {} API server starts; refused \
         while it was starting: {while_starting:?}; refused once its namespace or RoleBinding \
         was deleted: {revoked:?}",
        used.len(),
        starts.len()
    );
    assert!(events > 0, "no operator request in {}", path.display());
    let granted = granted();
    assert!(refused.is_empty(), "refused (missing rules): {refused:?}");
    // Refused while starting or once revoked, but no rule grants it either: missing all the
    // same.
    let ungranted: Vec<_> = (while_starting.iter().chain(&revoked))
        .filter(|t| !granted.contains(*t) && !everyone_may(t))
        .collect();
    assert!(
        ungranted.is_empty(),
        "refused while the API server started or once revoked, and in no rule: {ungranted:?}"
    );
    let unlisted: Vec<_> = used
        .iter()
        .filter(|t| !granted.contains(*t) && !everyone_may(t))
        .collect();
    assert!(unlisted.is_empty(), "used but in no rule: {unlisted:?}");
    let exempt: BTreeSet<Triple> = NOT_EXERCISED
        .iter()
        .map(|(g, r, v, why)| {
            eprintln!("NOTE not exercised here: {v} {r} ({g:?}): {why}");
            (g.to_string(), r.to_string(), v.to_string())
        })
        .collect();
    let sometimes: BTreeSet<Triple> = SOMETIMES_USED
        .iter()
        .map(|(g, r, v, why)| {
            let t = (g.to_string(), r.to_string(), v.to_string());
            let this_run = if used.contains(&t) { "used" } else { "unused" };
            eprintln!("NOTE timing-dependent ({this_run} in this run): {v} {r} ({g:?}): {why}");
            t
        })
        .collect();
    let now_used: Vec<_> = exempt.intersection(&used).collect();
    assert!(
        now_used.is_empty(),
        "used now, drop from NOT_EXERCISED: {now_used:?}"
    );
    let stale: Vec<_> = exempt
        .union(&sometimes)
        .filter(|t| !granted.contains(*t))
        .collect();
    assert!(
        stale.is_empty(),
        "NOT_EXERCISED names rules RULES lacks: {stale:?}"
    );
    let unused: Vec<_> = granted
        .difference(&used)
        .filter(|t| !exempt.contains(*t) && !sometimes.contains(*t))
        .collect();
    assert!(unused.is_empty(), "rules no e2e scenario used: {unused:?}");
}

#[test]
fn operator_requests_are_recognised_by_service_account() {
    let event = serde_json::json!({
        "user": {"username": "system:serviceaccount:db:smr-storage-migrator"},
        "verb": "patch",
        "objectRef": {"resource": "storagemigrationrequests", "subresource": "status",
                      "apiGroup": "storagemigrator.io", "namespace": "db"},
        "responseStatus": {"code": 200}
    });
    assert_eq!(
        operator_request(&event),
        Some((
            (
                "storagemigrator.io".into(),
                "storagemigrationrequests/status".into(),
                "patch".into()
            ),
            200
        ))
    );
    let other = serde_json::json!({
        "user": {"username": "system:serviceaccount:db:default"},
        "verb": "get", "objectRef": {"resource": "pods"}
    });
    assert_eq!(operator_request(&other), None);
}

/// One audit line: `user` asked `verb` on `resource` (`ns`/`name`) at second `at` of the day.
fn line(
    user: &str,
    verb: &str,
    resource: &str,
    ns: &str,
    name: &str,
    at: u32,
    code: i64,
) -> String {
    let obj = match resource {
        "namespaces" => serde_json::json!({"resource": resource, "name": name}),
        "leases" => serde_json::json!({"resource": resource, "namespace": ns, "name": name,
                                       "apiGroup": "coordination.k8s.io"}),
        _ => serde_json::json!({"resource": resource, "namespace": ns, "name": name,
                                "apiGroup": "rbac.authorization.k8s.io"}),
    };
    let event = serde_json::json!({
        "user": {"username": user}, "verb": verb, "objectRef": obj,
        "requestReceivedTimestamp": format!("2026-12-06T10:00:{at:02}Z"),
        "responseStatus": {"code": code}
    });
    event.to_string()
}

#[test]
fn refusals_while_starting_or_once_revoked_are_told_from_missing_rules() {
    let sa = |ns: &str| format!("system:serviceaccount:{ns}:{ns}-storage-migrator");
    let (a, b, c) = (sa("a"), sa("b"), sa("c"));
    let text = [
        // a: refused after its namespace's deletion (revoked); b: after a RoleBinding's in
        // it; c: before anything was deleted in c, and once while the API server started.
        line("admin", "delete", "namespaces", "", "a", 10, 200),
        line(&a, "update", "leases", "a", "storage-migrator", 11, 403),
        line(&b, "update", "leases", "b", "storage-migrator", 9, 403),
        line("admin", "delete", "rolebindings", "b", "x", 8, 200),
        line(&c, "update", "leases", "c", "storage-migrator", 5, 403),
        line(&c, "get", "leases", "c", "storage-migrator", 31, 403),
        line("admin", "delete", "rolebindings", "c", "x", 40, 200),
        // A refused deletion revokes nothing.
        line("admin", "delete", "namespaces", "", "c", 1, 403),
    ]
    .join("\n");
    let t = |s: &str| s.parse::<jiff::Timestamp>().unwrap();
    let starts = [(t("2026-12-06T10:00:30Z"), t("2026-12-06T10:00:32Z"))];
    let audit = read_audit(&text, &starts);
    let lease = |verb: &str| ("coordination.k8s.io".into(), "leases".into(), verb.into());
    assert_eq!(audit.events, 4);
    assert_eq!(audit.revoked, BTreeSet::from([lease("update")]));
    assert_eq!(
        audit.refused,
        BTreeSet::from([(c.clone(), lease("update"))])
    );
    assert_eq!(audit.while_starting, BTreeSet::from([lease("get")]));
}
