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
    let io = |source| BenchError::Audit {
        path: path.to_path_buf(),
        source,
    };
    let file = std::fs::File::open(path).map_err(io)?;
    let mut seen = BTreeSet::new();
    let mut requests = Requests::default();
    for line in BufReader::new(file).lines() {
        let line = line.map_err(io)?;
        if let Some((id, verb)) = request_of(&line, user)
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
    let event: Value = serde_json::from_str(line).ok()?;
    if event["user"]["username"].as_str()? != user {
        return None;
    }
    Some((
        event["auditID"].as_str()?.to_string(),
        event["verb"].as_str()?.to_string(),
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
            serde_json::json!({
                "kind": "Event", "auditID": id, "stage": stage, "verb": verb,
                "user": {"username": user},
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
    }
}
