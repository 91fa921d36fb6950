//! One request at a time per StatefulSet, in order: a request waits (phase `Pending`,
//! condition `Queued`) while another request on the same target is `Progressing`, or is older
//! and still `Pending` (judged first). A final request never blocks another.

use k8s_openapi::jiff::Timestamp;

use crate::api::Phase;
use crate::plan::OtherRequest;

/// Why a request waits: the request it waits for.
#[derive(Debug, Clone, PartialEq)]
pub struct Ahead<'a> {
    pub name: &'a str,
    pub phase: Phase,
}

/// The request this one waits for, if any: the `Progressing` one, else the oldest of the older
/// `Pending` ones (by creation time, then name; by name alone when a creation time is missing).
/// Final requests do not count.
pub fn waiting_for<'a>(
    me_name: &str,
    me_created: Option<Timestamp>,
    others: &'a [OtherRequest],
) -> Option<Ahead<'a>> {
    let live = || others.iter().filter(|o| !o.phase.is_final());
    let chosen = live().find(|o| o.phase == Phase::Progressing).or_else(|| {
        live()
            .filter(|o| before(o.created, &o.name, me_created, me_name))
            .min_by(|a, b| {
                if before(a.created, &a.name, b.created, &b.name) {
                    std::cmp::Ordering::Less
                } else {
                    std::cmp::Ordering::Greater
                }
            })
    })?;
    Some(Ahead {
        name: &chosen.name,
        phase: chosen.phase,
    })
}

/// Whether request `a` comes before request `b` in the queue.
fn before(a_created: Option<Timestamp>, a: &str, b_created: Option<Timestamp>, b: &str) -> bool {
    match (a_created, b_created) {
        (Some(x), Some(y)) => (x, a) < (y, b),
        _ => a < b,
    }
}
