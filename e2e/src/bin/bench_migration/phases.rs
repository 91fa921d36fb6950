//! Where a member's downtime goes, from the operator's Events on the request: its pod stopped
//! (`PodStopped`) → its copy verified (`Verified`, or `Copied` without verification) → its claim
//! swapped (`ClaimSwapped`) → the member back, Ready and through its health gate
//! (`MemberMigrated`). Event times are `eventTime` (microseconds; the operator publishes
//! `events.k8s.io/v1` Events), else the second-precision `lastTimestamp`.

use k8s_openapi::api::core::v1::Event;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, ListParams};

/// One Event of the request: its reason, message and time.
#[derive(Debug, Clone)]
pub struct Noted {
    pub reason: String,
    pub message: String,
    pub at: Timestamp,
}

/// The three parts of one member's downtime after its pod stopped, in seconds.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Phases {
    /// Pod stopped → copy done and verified (the final copy Job, which verifies in its pod).
    pub copy: Option<f64>,
    /// Verified → claim recreated and bound to the new volume.
    pub swap: Option<f64>,
    /// Claim swapped → member Ready and through its gate.
    pub back: Option<f64>,
}

/// The Events about the request `name`, with a time.
pub async fn request_events(api: &Api<Event>, name: &str) -> Result<Vec<Noted>, kube::Error> {
    let lp = ListParams::default().fields(&format!("involvedObject.name={name}"));
    let events = api.list(&lp).await?.items;
    Ok(events
        .into_iter()
        .filter_map(|e| {
            let at = e
                .event_time
                .map(|t| t.0)
                .or_else(|| e.last_timestamp.map(|t| t.0))?;
            Some(Noted {
                reason: e.reason?,
                message: e.message.unwrap_or_default(),
                at,
            })
        })
        .collect())
}

/// Whether `e` is the operator's Event of `reason` about member `pod`, by the wording of each.
fn about(e: &Noted, reason: &str, pod: &str) -> bool {
    if e.reason != reason {
        return false;
    }
    match reason {
        "PodStopped" => e.message.starts_with(&format!("member pod {pod} ")),
        "Copied" | "Verified" => e.message.starts_with(&format!("member {pod}: ")),
        "MemberMigrated" => e.message.starts_with(&format!("member {pod} migrated")),
        // "claim <template>-<pod> is bound to the new volume ..."
        "ClaimSwapped" => e
            .message
            .strip_prefix("claim ")
            .and_then(|rest| rest.split(' ').next())
            .is_some_and(|claim| claim.ends_with(&format!("-{pod}"))),
        _ => false,
    }
}

/// The member's phases: each the time between the first Events of two reasons about it.
pub fn phases(events: &[Noted], pod: &str) -> Phases {
    let first = |reason: &str| {
        events
            .iter()
            .filter(|e| about(e, reason, pod))
            .map(|e| e.at)
            .min()
    };
    let between = |a: Option<Timestamp>, b: Option<Timestamp>| match (a, b) {
        (Some(a), Some(b)) => Some((b.as_microsecond() - a.as_microsecond()) as f64 / 1e6),
        _ => None,
    };
    let stopped = first("PodStopped");
    let verified = first("Verified").or_else(|| first("Copied"));
    let swapped = first("ClaimSwapped");
    Phases {
        copy: between(stopped, verified),
        swap: between(verified, swapped),
        back: between(swapped, first("MemberMigrated")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn noted(reason: &str, message: &str, micros: i64) -> Noted {
        Noted {
            reason: reason.into(),
            message: message.into(),
            at: Timestamp::from_microsecond(1_800_000_000_000_000 + micros).unwrap(),
        }
    }

    #[test]
    fn phases_pair_each_members_events_by_their_wording() {
        let events = [
            noted(
                "PodStopped",
                "member pod bench-1 is stopped; copying its data",
                0,
            ),
            noted(
                "PodStopped",
                "member pod bench-10 is stopped; copying its data",
                5,
            ),
            noted("Copied", "member bench-1: copied 1Mi in 3 files", 900_000),
            noted(
                "Verified",
                "member bench-1: data-bench-1 and x match",
                900_000,
            ),
            noted(
                "ClaimSwapped",
                "claim data-bench-10 is bound to the new volume",
                1,
            ),
            noted(
                "ClaimSwapped",
                "claim data-bench-1 is bound to the new volume",
                1_300_000,
            ),
            noted(
                "MemberMigrated",
                "member bench-1 migrated (1/3); downtime 2.0s",
                1_750_000,
            ),
        ];
        let p = phases(&events, "bench-1");
        assert_eq!(p.copy, Some(0.9));
        assert_eq!(p.swap, Some(0.4));
        assert_eq!(p.back, Some(0.45));
        // A member without its Events has no phases, not another member's.
        let none = phases(&events, "bench-2");
        assert_eq!(none, Phases::default());
    }

    #[test]
    fn without_verification_the_copy_ends_at_copied() {
        let events = [
            noted(
                "PodStopped",
                "member pod b-0 is stopped; copying its data",
                0,
            ),
            noted("Copied", "member b-0: copied 1Mi in 3 files", 250_000),
        ];
        assert_eq!(phases(&events, "b-0").copy, Some(0.25));
    }
}
