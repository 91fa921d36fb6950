//! What the operator cost during a scenario: its peak resident memory (read by the harness from
//! `/proc`) and its API requests, counted from the API server's own audit log (every request
//! of a ServiceAccount, once per audit ID: a watch is logged when it starts and again when it
//! ends).
//!
//! What the operator does once at its start is no member's cost: the access reviews of every
//! permission it needs (`permissions::refused`) and the first lists of its watches, page by
//! page (100 objects a page: 102 pages beside 10,000 unrelated pods and claims). A scenario
//! waits until the operator's requests are quiet ([`wait_quiet`]) before it creates its request,
//! and the requests from then on are the migration's; every request is counted too.

use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead, BufReader, Seek, SeekFrom};
use std::path::Path;
use std::time::{Duration, Instant};

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
    count(path, user, |_| true)
}

/// The requests `user` made that the API server received from `from` (inclusive) to `to`
/// (exclusive), from the audit log at `path`: a watch that began before `from` is not counted.
pub fn count_requests_between(
    path: &Path,
    user: &str,
    from: jiff::Timestamp,
    to: jiff::Timestamp,
) -> Result<Requests, BenchError> {
    count(path, user, |seen| {
        from <= seen.received && seen.received < to
    })
}

/// Waits until `user` has made no request for `quiet` (the audit log at `path` read as it
/// grows), at most `limit`; returns that moment. `None` when the requests never went quiet.
pub async fn wait_quiet(
    path: &Path,
    user: &str,
    quiet: Duration,
    limit: Duration,
) -> Result<Option<jiff::Timestamp>, BenchError> {
    let deadline = Instant::now() + limit;
    let quiet_ms = i64::try_from(quiet.as_millis()).unwrap_or(i64::MAX);
    let (mut offset, mut last) = (0, None);
    loop {
        let latest;
        (offset, latest) = latest_request(path, user, offset)?;
        last = last.max(latest);
        let now = jiff::Timestamp::now();
        if let Some(last) = last
            && now.as_millisecond() - last.as_millisecond() >= quiet_ms
        {
            return Ok(Some(now));
        }
        if Instant::now() >= deadline {
            return Ok(None);
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// From byte `offset` of the log at `path` on: where its last whole line ends, and when the
/// API server received the last request of `user` in it.
fn latest_request(
    path: &Path,
    user: &str,
    offset: u64,
) -> Result<(u64, Option<jiff::Timestamp>), BenchError> {
    let mut latest = None;
    let read_to = each_request(path, user, offset, |seen| {
        latest = latest.max(Some(seen.received))
    })?;
    Ok((read_to, latest))
}

/// Every request of `user` that `counts`, once per audit ID, by verb, in the log at `path`.
fn count(path: &Path, user: &str, counts: impl Fn(&Seen) -> bool) -> Result<Requests, BenchError> {
    let mut ids = BTreeSet::new();
    let mut requests = Requests::default();
    each_request(path, user, 0, |request| {
        if counts(&request) && ids.insert(request.id) {
            *requests.by_verb.entry(request.verb).or_default() += 1;
            requests.access_reviews += u64::from(request.resource == ACCESS_REVIEWS);
        }
    })?;
    Ok(requests)
}

/// Each request of `user` in the whole lines of the log at `path` from byte `offset` on; where
/// the last whole line ends (a line the API server is still writing is left for the next read).
fn each_request(
    path: &Path,
    user: &str,
    offset: u64,
    mut each: impl FnMut(Seen),
) -> Result<u64, BenchError> {
    let io = |source| BenchError::Audit {
        path: path.to_path_buf(),
        source,
    };
    let mut file = std::fs::File::open(path).map_err(io)?;
    file.seek(SeekFrom::Start(offset)).map_err(io)?;
    let (mut reader, mut line) = (BufReader::new(file), String::new());
    let mut read_to = offset;
    loop {
        line.clear();
        let n = reader.read_line(&mut line).map_err(io)?;
        if n == 0 || !line.ends_with('\n') {
            return Ok(read_to);
        }
        read_to += n as u64;
        if let Some(seen) = request_at(&line, user) {
            each(seen);
        }
    }
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
    fn the_last_request_is_read_from_whole_lines_only() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("audit.log");
        let me = "system:serviceaccount:ns:ns-storage-migrator";
        let line = |id: &str, user: &str, at: &str| {
            serde_json::json!({
                "kind": "Event", "auditID": id, "stage": "ResponseComplete", "verb": "get",
                "user": {"username": user}, "requestReceivedTimestamp": at,
            })
            .to_string()
        };
        let first = format!("{}\n", line("a", me, "2026-12-05T09:00:01Z"));
        let other = format!("{}\n", line("b", "someone", "2026-12-05T09:00:05Z"));
        let partial = line("c", me, "2026-12-05T09:00:09Z");
        std::fs::write(&path, format!("{first}{other}{partial}")).unwrap();
        let (to, latest) = latest_request(&path, me, 0).unwrap();
        assert_eq!(to, (first.len() + other.len()) as u64);
        assert_eq!(latest, Some("2026-12-05T09:00:01Z".parse().unwrap()));
        // The line finished: read from where the last whole line ended.
        std::fs::write(&path, format!("{first}{other}{partial}\n")).unwrap();
        let (_, latest) = latest_request(&path, me, to).unwrap();
        assert_eq!(latest, Some("2026-12-05T09:00:09Z".parse().unwrap()));
    }

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
