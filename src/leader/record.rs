//! The Lease record, pure: what a candidate does with the record it saw, and the records this
//! replica writes (taking, renewing, releasing). No I/O here; `leader` sends them.

use std::time::{Duration, SystemTime};

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};

use super::LeaseConfig;

/// What a candidate does next, given the record it last saw.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Move {
    /// There is no Lease: create it, held by this replica.
    Create,
    /// Take the record seen (a replace carrying its `resourceVersion`): it has no holder (it was
    /// released), its holder is this replica's own identity (a process restarted in its pod), or
    /// it has not changed for as long as a renewal is valid.
    Take,
    /// Held by another replica whose renewal may still be valid: look again after this long,
    /// or as soon as the record changes.
    Wait(Duration),
}

/// The holder named by a record (an empty name is none).
pub fn holder(lease: &Lease) -> Option<&str> {
    lease
        .spec
        .as_ref()
        .and_then(|s| s.holder_identity.as_deref())
        .filter(|h| !h.is_empty())
}

/// What a candidate does with `seen`, unchanged (same `resourceVersion`) for `unchanged_for` by
/// its own monotonic clock. Another holder's record is taken only after the longer of our
/// duration and the one it declares (`leaseDurationSeconds`): a holder configured with a longer
/// lease (a rolling update that changes it) keeps its term. The wall-clock `renewTime` is never
/// compared with our clock, so clock skew between machines does not matter.
pub fn candidate_move(cfg: &LeaseConfig, seen: Option<&Lease>, unchanged_for: Duration) -> Move {
    let Some(lease) = seen else {
        return Move::Create;
    };
    match holder(lease) {
        None => Move::Take,
        Some(h) if h == cfg.identity => Move::Take,
        Some(_) => {
            let declared = lease
                .spec
                .as_ref()
                .and_then(|s| s.lease_duration_seconds)
                .and_then(|s| u64::try_from(s).ok())
                .map(Duration::from_secs)
                .unwrap_or_default();
            match cfg.duration.max(declared).checked_sub(unchanged_for) {
                Some(left) if !left.is_zero() => Move::Wait(left),
                _ => Move::Take,
            }
        }
    }
}

fn micro(t: SystemTime) -> Option<MicroTime> {
    t.try_into().ok().map(MicroTime)
}

fn seconds(d: Duration) -> i32 {
    i32::try_from(d.as_secs()).unwrap_or(i32::MAX)
}

/// The record as it goes back to the API server: `seen`'s metadata (its `resourceVersion` is
/// the replace's precondition) without the server's bookkeeping.
fn based_on(cfg: &LeaseConfig, seen: Option<&Lease>) -> Lease {
    let mut lease = seen.cloned().unwrap_or_else(|| Lease {
        metadata: ObjectMeta {
            name: Some(cfg.name.clone()),
            namespace: Some(cfg.namespace.clone()),
            ..ObjectMeta::default()
        },
        spec: None,
    });
    lease.metadata.managed_fields = None;
    lease
}

/// The record this replica writes to take `seen` (or to create the Lease when `None`) at `now`:
/// held by us, renewed now, our duration; a change of hands is counted in `leaseTransitions`
/// and sets `acquireTime`.
pub fn taken(cfg: &LeaseConfig, seen: Option<&Lease>, now: SystemTime) -> Lease {
    let mut lease = based_on(cfg, seen);
    let before = lease.spec.take().unwrap_or_default();
    let ours = before.holder_identity.as_deref() == Some(cfg.identity.as_str());
    let transitions = before.lease_transitions.unwrap_or(0);
    lease.spec = Some(LeaseSpec {
        holder_identity: Some(cfg.identity.clone()),
        lease_duration_seconds: Some(seconds(cfg.duration)),
        acquire_time: match ours {
            true => before.acquire_time.or_else(|| micro(now)),
            false => micro(now),
        },
        renew_time: micro(now),
        lease_transitions: Some(match (seen.is_some(), ours) {
            (true, false) => transitions.saturating_add(1),
            _ => transitions,
        }),
        ..before
    });
    lease
}

/// Our own record `held`, renewed at `now`.
pub fn renewed(cfg: &LeaseConfig, held: &Lease, now: SystemTime) -> Lease {
    let mut lease = based_on(cfg, Some(held));
    let spec = lease.spec.get_or_insert_with(LeaseSpec::default);
    spec.renew_time = micro(now);
    lease
}

/// Our own record `held`, released: no holder, so a candidate takes it at once.
pub fn released(cfg: &LeaseConfig, held: &Lease) -> Lease {
    let mut lease = based_on(cfg, Some(held));
    let spec = lease.spec.get_or_insert_with(LeaseSpec::default);
    spec.holder_identity = None;
    lease
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::leader::tests::cfg;

    fn lease(holder: Option<&str>, declared: Option<i32>) -> Lease {
        Lease {
            metadata: ObjectMeta {
                name: Some("storage-migrator".into()),
                namespace: Some("ops".into()),
                resource_version: Some("41".into()),
                ..ObjectMeta::default()
            },
            spec: Some(LeaseSpec {
                holder_identity: holder.map(String::from),
                lease_duration_seconds: declared,
                lease_transitions: Some(3),
                acquire_time: micro(SystemTime::UNIX_EPOCH + Duration::from_secs(7)),
                ..LeaseSpec::default()
            }),
        }
    }

    const S: fn(u64) -> Duration = Duration::from_secs;

    #[test]
    fn another_holders_record_is_taken_only_once_unchanged_for_a_whole_duration() {
        let held = lease(Some("op-1"), Some(30));
        assert_eq!(candidate_move(&cfg(), Some(&held), S(0)), Move::Wait(S(30)));
        assert_eq!(candidate_move(&cfg(), Some(&held), S(29)), Move::Wait(S(1)));
        assert_eq!(candidate_move(&cfg(), Some(&held), S(30)), Move::Take);
        // A holder that declares a longer lease keeps it; a shorter one gets ours.
        let longer = lease(Some("op-1"), Some(60));
        assert_eq!(
            candidate_move(&cfg(), Some(&longer), S(30)),
            Move::Wait(S(30))
        );
        let shorter = lease(Some("op-1"), Some(5));
        assert_eq!(
            candidate_move(&cfg(), Some(&shorter), S(10)),
            Move::Wait(S(20))
        );
    }

    #[test]
    fn a_missing_released_or_own_record_is_taken_at_once() {
        assert_eq!(candidate_move(&cfg(), None, S(0)), Move::Create);
        for holder in [None, Some(""), Some("op-0")] {
            let l = lease(holder, Some(30));
            assert_eq!(
                candidate_move(&cfg(), Some(&l), S(0)),
                Move::Take,
                "{holder:?}"
            );
        }
    }

    #[test]
    fn taking_anothers_record_counts_a_transition_and_keeps_the_version() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000);
        let t = taken(&cfg(), Some(&lease(Some("op-1"), Some(15))), now);
        assert_eq!(t.metadata.resource_version.as_deref(), Some("41"));
        let spec = t.spec.unwrap_or_default();
        assert_eq!(spec.holder_identity.as_deref(), Some("op-0"));
        assert_eq!(spec.lease_duration_seconds, Some(30));
        assert_eq!(spec.lease_transitions, Some(4));
        assert_eq!(spec.acquire_time, micro(now));
        assert_eq!(spec.renew_time, micro(now));
    }

    #[test]
    fn taking_our_own_record_back_is_no_transition() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000);
        let spec = taken(&cfg(), Some(&lease(Some("op-0"), Some(30))), now)
            .spec
            .unwrap_or_default();
        assert_eq!(spec.lease_transitions, Some(3));
        assert_eq!(
            spec.acquire_time,
            micro(SystemTime::UNIX_EPOCH + Duration::from_secs(7))
        );
        assert_eq!(spec.renew_time, micro(now));
    }

    #[test]
    fn a_created_record_is_ours_with_no_version_and_no_transition() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000);
        let t = taken(&cfg(), None, now);
        assert_eq!(t.metadata.name.as_deref(), Some("storage-migrator"));
        assert_eq!(t.metadata.namespace.as_deref(), Some("ops"));
        assert_eq!(t.metadata.resource_version, None);
        let spec = t.spec.unwrap_or_default();
        assert_eq!(spec.holder_identity.as_deref(), Some("op-0"));
        assert_eq!(spec.lease_transitions, Some(0));
    }

    #[test]
    fn renewing_moves_only_the_renew_time_and_releasing_only_clears_the_holder() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000);
        let held = lease(Some("op-0"), Some(30));
        let r = renewed(&cfg(), &held, now);
        let mut expected = held.clone();
        if let Some(s) = expected.spec.as_mut() {
            s.renew_time = micro(now);
        }
        assert_eq!(r, expected);
        let gone = released(&cfg(), &held);
        assert_eq!(holder(&gone), None);
        assert_eq!(gone.metadata.resource_version.as_deref(), Some("41"));
        assert_eq!(
            gone.spec.and_then(|s| s.lease_transitions),
            Some(3),
            "the count of transitions stays"
        );
    }
}
