//! What the operator cost during a scenario: its peak resident memory (read by the harness from
//! `/proc`) and its API requests, counted from the API server's own audit log (every request
//! of a ServiceAccount, once per audit ID: a watch is logged when it starts and again when it
//! ends).

use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead, BufReader};
use std::path::Path;

use serde_json::Value;

use crate::BenchError;

/// The operator's API requests, by verb (`get`, `list`, `watch`, `create`, `patch`, ...).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Requests {
    pub by_verb: BTreeMap<String, u64>,
}

impl Requests {
    pub fn total(&self) -> u64 {
        self.by_verb.values().sum()
    }
}

/// The requests `user` made, from the audit log at `path` (JSON lines).
pub fn count_requests(path: &Path, user: &str) -> Result<Requests, BenchError> {
    count(path, |line| request_of(line, user))
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
        let (id, verb, received) = request_at(line, user)?;
        (from <= received && received < to).then_some((id, verb))
    })
}

/// Every request a line of the log at `path` is, once per audit ID, by verb.
fn count(
    path: &Path,
    request: impl Fn(&str) -> Option<(String, String)>,
) -> Result<Requests, BenchError> {
    let io = |source| BenchError::Audit {
        path: path.to_path_buf(),
        source,
    };
    let file = std::fs::File::open(path).map_err(io)?;
    let mut seen = BTreeSet::new();
    let mut requests = Requests::default();
    for line in BufReader::new(file).lines() {
        let line = line.map_err(io)?;
        if let Some((id, verb)) = request(&line)
            && seen.insert(id)
        {
            *requests.by_verb.entry(verb).or_default() += 1;
        }
    }
    Ok(requests)
}

/// The audit ID and verb of one audit event by `user`; `None` for another user's or a line
/// that is no audit event.
fn request_of(line: &str, user: &str) -> Option<(String, String)> {
    request_at(line, user).map(|(id, verb, _)| (id, verb))
}

/// [`request_of`], with when the API server received the request.
fn request_at(line: &str, user: &str) -> Option<(String, String, jiff::Timestamp)> {
    let event: Value = serde_json::from_str(line).ok()?;
    if event["user"]["username"].as_str()? != user {
        return None;
    }
    Some((
        event["auditID"].as_str()?.to_string(),
        event["verb"].as_str()?.to_string(),
        event["requestReceivedTimestamp"].as_str()?.parse().ok()?,
    ))
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
            serde_json::json!({
                "kind": "Event", "auditID": id, "stage": stage, "verb": verb,
                "user": {"username": user}, "requestReceivedTimestamp": at,
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
            "not json".to_string(),
        ];
        std::fs::write(&path, lines.join("\n")).unwrap();
        let r = count_requests(&path, me).unwrap();
        assert_eq!(r.total(), 3);
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
