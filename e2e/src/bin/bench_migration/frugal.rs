//! What the operator cost during a scenario: its peak resident memory (read by the harness from
//! `/proc`) and its API requests, counted from the API server's own audit log (every request
//! of a ServiceAccount, once per audit ID: a watch is logged when it starts and again when it
//! ends). The access reviews the operator makes once at its start (each permission it needs,
//! `permissions::refused`) are counted among them, and apart: they are no member's cost.

use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead, BufReader};
use std::path::Path;

use serde_json::Value;

use crate::BenchError;

/// The operator's API requests, by verb (`get`, `list`, `watch`, `create`, `patch`, ...).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Requests {
    pub by_verb: BTreeMap<String, u64>,
    /// Of them, the SelfSubjectAccessReviews (the checks of the operator's start).
    pub access_reviews: u64,
}

impl Requests {
    pub fn total(&self) -> u64 {
        self.by_verb.values().sum()
    }
}

/// The resource of the access reviews, in an audit event's `objectRef`.
const ACCESS_REVIEWS: &str = "selfsubjectaccessreviews";

/// One request, as its audit events tell it.
struct Seen {
    id: String,
    verb: String,
    resource: String,
    received: jiff::Timestamp,
}

/// The requests `user` made, from the audit log at `path` (JSON lines).
pub fn count_requests(path: &Path, user: &str) -> Result<Requests, BenchError> {
    count(path, |line| request_at(line, user))
}

/// The requests `user` made that the API server received from `from` (inclusive) to `to`
/// (exclusive), from the audit log at `path`: a watch that began before `from` is not counted.
pub fn count_requests_between(
    path: &Path,
    user: &str,
    from: jiff::Timestamp,
    to: jiff::Timestamp,
) -> Result<Requests, BenchError> {
    count(path, |line| {
        request_at(line, user).filter(|seen| from <= seen.received && seen.received < to)
    })
}

/// Every request a line of the log at `path` is, once per audit ID, by verb.
fn count(path: &Path, request: impl Fn(&str) -> Option<Seen>) -> Result<Requests, BenchError> {
    let io = |source| BenchError::Audit {
        path: path.to_path_buf(),
        source,
    };
    let file = std::fs::File::open(path).map_err(io)?;
    let mut seen = BTreeSet::new();
    let mut requests = Requests::default();
    for line in BufReader::new(file).lines() {
        let line = line.map_err(io)?;
        if let Some(request) = request(&line)
            && seen.insert(request.id)
        {
            *requests.by_verb.entry(request.verb).or_default() += 1;
            requests.access_reviews += u64::from(request.resource == ACCESS_REVIEWS);
        }
    }
    Ok(requests)
}

/// The request one audit event by `user` is; `None` for another user's or a line that is no
/// audit event.
fn request_at(line: &str, user: &str) -> Option<Seen> {
    let event: Value = serde_json::from_str(line).ok()?;
    if event["user"]["username"].as_str()? != user {
        return None;
    }
    Some(Seen {
        id: event["auditID"].as_str()?.to_string(),
        verb: event["verb"].as_str()?.to_string(),
        resource: (event["objectRef"]["resource"].as_str())
            .unwrap_or_default()
            .to_string(),
        received: event["requestReceivedTimestamp"].as_str()?.parse().ok()?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_are_counted_once_per_audit_id_for_the_user_only() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("audit.log");
        let event = |id: &str, user: &str, verb: &str, stage: &str| {
            let at = format!("2026-12-05T09:00:0{}Z", id.len() + usize::from(id == "d"));
            let resource = if verb == "create" {
                ACCESS_REVIEWS
            } else {
                "pods"
            };
            serde_json::json!({
                "kind": "Event", "auditID": id, "stage": stage, "verb": verb,
                "user": {"username": user}, "requestReceivedTimestamp": at,
                "objectRef": {"resource": resource},
            })
            .to_string()
        };
        let me = "system:serviceaccount:ns:ns-storage-migrator";
        let lines = [
            event("a", me, "get", "ResponseComplete"),
            event("b", me, "watch", "ResponseStarted"),
            event("b", me, "watch", "ResponseComplete"),
            event(
                "c",
                "system:serviceaccount:other:x",
                "get",
                "ResponseComplete",
            ),
            event("d", me, "patch", "ResponseComplete"),
            event("e", me, "create", "ResponseComplete"),
            "not json".to_string(),
        ];
        std::fs::write(&path, lines.join("\n")).unwrap();
        let r = count_requests(&path, me).unwrap();
        assert_eq!(r.total(), 4);
        assert_eq!(r.access_reviews, 1);
        assert_eq!(r.by_verb["watch"], 1);
        assert_eq!(r.by_verb["get"], 1);
        assert_eq!(r.by_verb["patch"], 1);
        assert!(count_requests(&dir.path().join("missing"), me).is_err());
        // "a", "b" received at :01, "d" at :02: a window from :02 holds only "d".
        let at = |s: &str| s.parse::<jiff::Timestamp>().unwrap();
        let late = count_requests_between(
            &path,
            me,
            at("2026-12-05T09:00:02Z"),
            at("2026-12-05T09:01:00Z"),
        )
        .unwrap();
        assert_eq!(late.by_verb.keys().collect::<Vec<_>>(), ["patch"]);
        assert_eq!(late.total(), 1);
    }
}
