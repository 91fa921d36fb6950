//! Everything `kubectl smr` prints, as pure functions of what it read (unit-tested).

use std::collections::BTreeMap;
use std::fmt::Write as _;

use k8s_openapi::jiff::Timestamp;

use crate::api::{
    CopyPass, CopyProgress, LeaderChange, LeaderChangeKind, MemberStatus, MemberStep, Phase, Plan,
    PlannedMember, PlannedWork, Role, StorageMigrationRequestStatus,
};
use crate::plan::claims::{member_claims, plan_claims};
use crate::plan::preflight::{self, Denial};

/// `1536` → `1.5 KiB`.
pub fn bytes(n: i64) -> String {
    const UNITS: [&str; 6] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
    let mut v = n.max(0) as f64;
    let mut unit = 0;
    while v >= 1024.0 && unit < UNITS.len() - 1 {
        v /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{n} B")
    } else {
        format!("{v:.1} {}", UNITS[unit])
    }
}

/// `125` → `2m05s`.
pub fn duration(secs: i64) -> String {
    let s = secs.max(0);
    match (s / 3600, (s % 3600) / 60, s % 60) {
        (0, 0, s) => format!("{s}s"),
        (0, m, s) => format!("{m}m{s:02}s"),
        (h, m, s) => format!("{h}h{m:02}m{s:02}s"),
    }
}

/// `[#####-----]` of `width` cells for `percent`.
pub fn bar(percent: i32, width: usize) -> String {
    let filled = (percent.clamp(0, 100) as usize * width) / 100;
    format!("[{}{}]", "#".repeat(filled), "-".repeat(width - filled))
}

/// The copy part of a member's line: bar, percent, bytes, rate, ETA and files.
pub fn copy_progress(p: &CopyProgress) -> String {
    let pass = match p.pass {
        CopyPass::PreCopy => "pre-copy",
        CopyPass::Copy => "final copy",
    };
    let mut s = format!("{pass} {} {:>3}%", bar(p.percent, 20), p.percent);
    let total = p.bytes_total.map(bytes).unwrap_or_else(|| "?".into());
    let _ = write!(s, "  {} / {total}", bytes(p.bytes_done));
    if let Some(r) = p.bytes_per_second {
        let _ = write!(s, "  {}/s", bytes(r));
    }
    if let Some(eta) = p.eta_seconds {
        let _ = write!(s, "  ETA {}", duration(eta));
    }
    match (p.files_done, p.files_total) {
        (Some(d), Some(t)) => {
            let _ = write!(s, "  files {d}/{t}");
        }
        (Some(d), None) => {
            let _ = write!(s, "  files {d}");
        }
        _ => {}
    }
    s
}

/// One member's line in `watch`: pod, step, and the copy's progress while it copies (the
/// reading of the pass the step runs), its downtime once done, else the member's message.
pub fn member_line(m: &MemberStatus) -> String {
    let mut s = format!("  {:<12} {:<19} ", m.pod, format!("{:?}", m.step));
    let pass = match m.step {
        MemberStep::PreCopying => Some(CopyPass::PreCopy),
        MemberStep::Copying => Some(CopyPass::Copy),
        _ => None,
    };
    let reading = (m.copy_progress.as_ref()).filter(|p| pass == Some(p.pass));
    if let Some(p) = reading {
        s.push_str(&copy_progress(p));
    } else if m.step == MemberStep::Done {
        if let Some(d) = m.downtime_seconds {
            let _ = write!(s, "downtime {d:.1}s");
        }
        if let Some(b) = m.first_claim.bytes_copied {
            let _ = write!(s, "  copied {}", bytes(b));
        }
        if let Some(c) = &m.leader_change {
            let _ = write!(s, "  {}", leader_change(c));
        }
    } else if let Some(msg) = &m.message {
        s.push_str(msg);
    }
    s.trim_end().to_string()
}

/// The header line of `watch`: name, phase, stage, percent and the member in flight.
pub fn header_line(name: &str, s: &StorageMigrationRequestStatus) -> String {
    let mut line = format!("{name}: {:?}, {:?}", s.phase, s.stage);
    if let Some(p) = s.percent {
        let _ = write!(line, ", {p}%");
    }
    if let Some(m) = &s.progress {
        let _ = write!(line, ", members {m}");
    }
    if let Some(c) = &s.current_member {
        let _ = write!(line, ", member {c}");
    }
    line
}

/// Every line `watch` shows for the request now.
pub fn watch_lines(name: &str, s: &StorageMigrationRequestStatus) -> Vec<String> {
    let mut lines = vec![header_line(name, s)];
    lines.extend(s.members.iter().map(member_line));
    lines
}

/// The lines `watch` ends with: the final phase, how long it took, why it failed, and each
/// member's downtime.
pub fn final_lines(name: &str, s: &StorageMigrationRequestStatus) -> Vec<String> {
    let took = match (&s.start_time, &s.completion_time) {
        (Some(a), Some(b)) => format!(" in {}", duration(b.0.as_second() - a.0.as_second())),
        _ => String::new(),
    };
    let mut lines = vec![format!("{name}: {:?}{took}", s.phase)];
    if let Some(m) = s.failure.as_ref().or(s.message.as_ref()) {
        lines.push(format!("  {m}"));
    }
    for m in &s.members {
        let downtime = m.downtime_seconds.map_or_else(
            || "no downtime recorded".into(),
            |d| format!("downtime {d:.1}s"),
        );
        lines.push(format!(
            "  {:<12} {:<12} {downtime}",
            m.pod,
            format!("{:?}", m.step)
        ));
    }
    lines
}

/// The exit status that follows a final phase: 0 Successful, 2 Denied, 3 Failed.
pub fn exit_code(phase: Phase) -> Option<u8> {
    match phase {
        Phase::Successful => Some(0),
        Phase::Denied => Some(2),
        Phase::Failed => Some(3),
        Phase::Pending | Phase::Progressing => None,
    }
}

/// `watch --all`: a line per request (as `watch`'s first line; an unfinished one's message
/// under it), then how many requests are in each phase.
pub fn all_lines(requests: &BTreeMap<String, StorageMigrationRequestStatus>) -> Vec<String> {
    let mut lines = Vec::new();
    let mut phases: BTreeMap<String, usize> = BTreeMap::new();
    for (name, s) in requests {
        lines.push(header_line(name, s));
        if exit_code(s.phase).is_none()
            && let Some(m) = &s.message
        {
            lines.push(format!("  {m}"));
        }
        *phases.entry(format!("{:?}", s.phase)).or_default() += 1;
    }
    let counts: Vec<String> = (phases.iter()).map(|(p, n)| format!("{n} {p}")).collect();
    lines.push(format!(
        "{} requests: {}",
        requests.len(),
        counts.join(", ")
    ));
    lines
}

/// `watch --all`'s exit status once every request has ended: 3 when one Failed, else 2 when
/// one was Denied, else 0; `None` while one has not ended.
pub fn all_exit_code(phases: impl IntoIterator<Item = Phase>) -> Option<u8> {
    let codes = (phases.into_iter())
        .map(exit_code)
        .collect::<Option<Vec<u8>>>()?;
    Some(
        codes
            .into_iter()
            .max_by_key(|c| match c {
                3 => 2,
                2 => 1,
                _ => 0,
            })
            .unwrap_or(0),
    )
}

fn role(r: Option<Role>) -> &'static str {
    match r {
        Some(Role::Leader) => "leader",
        Some(Role::Follower) => "follower",
        None => "-",
    }
}

/// The plan's members in migration order, one line each.
pub fn plan_lines(plan: &Plan) -> Vec<String> {
    let from = plan.source_storage_class.as_deref().unwrap_or("(none)");
    let what = match (&plan.target_claim, &plan.deployment) {
        (Some(claim), Some(d)) => {
            format!("Claim {claim} (Deployment {d}: scaled to zero while it moves, then back)")
        }
        (Some(claim), None) if plan.pod.is_some() => format!(
            "Claim {claim} (pod {}: deleted while it moves, then recreated from its manifest)",
            plan.pod.as_deref().unwrap_or_default()
        ),
        (Some(claim), None) => format!(
            "Claim {claim} (StatefulSet {}, template {}; the set keeps its templates)",
            plan.stateful_set, plan.volume_claim_template
        ),
        (None, _) if !plan.further_templates.is_empty() => format!(
            "StatefulSet {} templates {}, {} (each member's claims in one stop)",
            plan.stateful_set,
            plan.volume_claim_template,
            (plan.further_templates.iter())
                .map(|t| format!("{} ({})", t.name, t.size.0))
                .collect::<Vec<_>>()
                .join(", ")
        ),
        (None, _) => format!(
            "StatefulSet {} template {}",
            plan.stateful_set, plan.volume_claim_template
        ),
    };
    let mut lines = vec![
        format!(
            "{what}: class {from} -> {}, size {}",
            plan.target_storage_class, plan.target_size.0
        ),
        format!(
            "  {:<3} {:<12} {:<9} {:<16} {:<22} {}",
            "#", "MEMBER", "ROLE", "NODE", "CLAIM", "SIZE"
        ),
    ];
    for (i, m) in plan.members.iter().enumerate() {
        lines.push(planned_member_line(i + 1, m));
        for c in &m.further_claims {
            lines.push(format!(
                "  {:<3} {:<12} {:<9} {:<16} {:<22} {} -> {}{}",
                "",
                "",
                "",
                "(same stop)",
                c.claim,
                c.old_size.0,
                c.new_size.0,
                c.used_bytes
                    .map(|u| format!(" (used {})", bytes(u)))
                    .unwrap_or_default()
            ));
        }
    }
    lines
}

fn planned_member_line(n: usize, m: &PlannedMember) -> String {
    let used = m
        .used_bytes
        .map(|u| format!(" (used {})", bytes(u)))
        .unwrap_or_default();
    let (size, left) = match m.work {
        PlannedWork::Migrate => (format!("{} -> {}", m.old_size.0, m.new_size.0), ""),
        PlannedWork::AlreadyThere => (m.old_size.0.clone(), " (already there, left running)"),
        PlannedWork::NotTargeted => (m.old_size.0.clone(), " (not targeted, left running)"),
    };
    format!(
        "  {:<3} {:<12} {:<9} {:<16} {:<22} {size}{used}{left}",
        n,
        m.pod,
        role(m.role),
        m.node,
        m.claim,
    )
}

/// The leader's handover, for `plan`: the member the plan moves last when it is the leader,
/// and how the engine hands over (`None` without a leader in the plan).
pub fn handover_line(plan: &Plan, handover: Option<&str>) -> Option<String> {
    let leader = (plan.members.iter())
        .filter(|m| m.work == PlannedWork::Migrate)
        .find(|m| m.role == Some(Role::Leader))?;
    Some(match handover {
        Some(how) => format!("Leader: {} goes last; before it stops, {how}.", leader.pod),
        None => format!(
            "Leader: {} goes last; this engine does not hand leadership over (it stops as it is).",
            leader.pod
        ),
    })
}

/// What a Shrink's preflight measures, for `plan` (the dry run does not measure).
pub fn shrink_measurement_lines(plan: &Plan) -> Vec<String> {
    let mut lines = vec![
        "Shrink measurement: when the request is applied, preflight runs one measure Job per member \
         on the member's node (`du -s -B1` of the old claim, mounted read-only) and denies the \
         request (InsufficientSize) unless each member's used bytes plus headroom (10%, at least \
         16 MiB) fit the new size:"
            .to_string(),
    ];
    for m in plan_claims(plan).into_iter().map(|c| c.planned) {
        let most = (crate::plan::quantity::bytes(&m.new_size))
            .and_then(|b| i64::try_from(b).ok())
            .map(preflight::max_used_bytes);
        let most = most.map_or_else(|| "?".to_string(), bytes);
        lines.push(format!(
            "  {}: claim {} ({} -> {}) may have at most {most} in use",
            m.pod, m.claim, m.old_size.0, m.new_size.0
        ));
    }
    lines
}

/// Every member downtime on record in `requests` that ended `Successful` (seconds from the
/// pod's deletion until it was Ready again), for [`downtime_lines`].
pub fn downtime_history(requests: &[crate::api::StorageMigrationRequest]) -> Vec<f64> {
    let done = requests
        .iter()
        .filter_map(|r| r.status.as_ref())
        .filter(|s| s.phase == Phase::Successful);
    done.flat_map(|s| s.members.iter().filter_map(|m| m.downtime_seconds))
        .collect()
}

/// How long each stop lasts: what the downtime is made of, and the downtimes of the earlier
/// successful requests in namespace `ns` (`history`, seconds), the median and the longest.
pub fn downtime_lines(plan: &Plan, history: &[f64], ns: &str) -> Vec<String> {
    let stopped = plan
        .members
        .iter()
        .filter(|m| m.work == PlannedWork::Migrate);
    let (count, claims) = (
        stopped.clone().count(),
        stopped
            .map(|m| member_claims(m, &Default::default()).len())
            .max(),
    );
    let what = match (&plan.deployment, plan.pod.as_deref()) {
        (Some(d), _) => format!("Deployment {d} is scaled to zero once"),
        (None, Some(pod)) => format!("pod {pod} is stopped once"),
        (None, None) => format!("{count} member pod(s) are stopped once each, one at a time"),
    };
    let mut lines = vec![format!(
        "Downtime: {what}, from the stop until the pod is Ready again: the final copy of what \
         changed since the pre-copy (of the whole claim without one), its verification, the \
         swap of {} claim(s), and the start.",
        claims.unwrap_or(1)
    )];
    let mut sorted = history.to_vec();
    sorted.sort_by(f64::total_cmp);
    lines.push(match (sorted.get(sorted.len() / 2), sorted.last()) {
        (Some(median), Some(longest)) => format!(
            "  earlier successful requests in namespace {ns}: {} stops, median {median:.1}s, \
             longest {longest:.1}s",
            sorted.len()
        ),
        _ => format!("  no earlier successful request in namespace {ns} to estimate from"),
    });
    lines
}

/// The denials, one line each, with the count.
pub fn denial_lines(denials: &[Denial]) -> Vec<String> {
    let mut lines = vec![format!(
        "Would be DENIED for {} reason{}:",
        denials.len(),
        if denials.len() == 1 { "" } else { "s" }
    )];
    lines.extend(
        denials
            .iter()
            .map(|d| format!("  - {}: {}", d.reason, d.message)),
    );
    lines
}

/// Where a member's data is now, by its step.
pub fn data_location(m: &MemberStatus, planned: Option<&PlannedMember>) -> String {
    if let Some(held) = &m.held {
        return format!("held mid-swap: {held}");
    }
    let old = planned.map_or("?", |p| p.old_volume.as_str());
    let claim = planned.map_or("?", |p| p.claim.as_str());
    let new = m
        .first_claim
        .new_volume
        .as_deref()
        .unwrap_or("(not provisioned yet)");
    match m.step {
        MemberStep::Pending | MemberStep::CreatingClaim | MemberStep::RolledBack => {
            format!("on its old volume {old} (claim {claim})")
        }
        MemberStep::AlreadyThere => {
            format!(
                "already on the target before this request: {old} (claim {claim}), left running"
            )
        }
        MemberStep::NotTargeted => {
            format!("not the target claim's member: {old} (claim {claim}), left running")
        }
        MemberStep::PreCopying
        | MemberStep::GatingStop
        | MemberStep::StoppingPod
        | MemberStep::Copying => {
            format!("on its old volume {old} (claim {claim}); a copy is being made on {new}")
        }
        MemberStep::RetainingVolumes | MemberStep::DeletingOldClaim => {
            format!("verified copy on {new}; the original stays on {old} (kept)")
        }
        MemberStep::DeletingTempClaim
        | MemberStep::ReleasingNewVolume
        | MemberStep::RecreatingClaim => {
            format!("on {new}, being bound to claim {claim}; the original stays on {old} (kept)")
        }
        // The old volume is kept until the final check; then `oldPVReclaimPolicy` applies.
        MemberStep::RecreatingPod | MemberStep::Done => {
            format!("on {new} (claim {claim}); original volume {old}")
        }
    }
}

/// A member's recorded times, for `describe`.
pub fn member_times(m: &MemberStatus) -> Vec<String> {
    let t = |label: &str, v: Option<Timestamp>| v.map(|v| format!("    {label:<12} {v}"));
    let mut lines: Vec<String> = [
        t("started", m.started.as_ref().map(|t| t.0)),
        t("pod stopped", m.pod_deleted_at.as_ref().map(|t| t.0)),
        t("verified", m.first_claim.verified.as_ref().map(|t| t.0)),
        t("finished", m.finished.as_ref().map(|t| t.0)),
    ]
    .into_iter()
    .flatten()
    .collect();
    if let Some(d) = m.downtime_seconds {
        lines.push(format!("    {:<12} {d:.1}s", "downtime"));
    }
    if let (Some(b), f) = (m.first_claim.bytes_copied, m.first_claim.files_copied) {
        let files = f.map(|f| format!(", {f} files")).unwrap_or_default();
        lines.push(format!("    {:<12} {}{files}", "copied", bytes(b)));
    }
    if let Some(w) = m.first_claim.bytes_written {
        lines.push(format!("    {:<12} {}", "written", bytes(w)));
    }
    if let Some(c) = &m.leader_change {
        lines.push(format!("    {:<12} {}", "leadership", leader_change(c)));
    }
    lines
}

/// How leadership left a member that led: `handed over to etcd-1 in 1.2s`, `elected zk-1 0.9s
/// after the stop`, or what is still awaited.
pub fn leader_change(c: &LeaderChange) -> String {
    let to = c.to.as_deref().unwrap_or("another member");
    match (c.how, c.seconds) {
        (LeaderChangeKind::Handover, Some(s)) => format!("handed over to {to} in {s:.1}s"),
        (LeaderChangeKind::Handover, None) => format!("handover from {} asked", c.from),
        (LeaderChangeKind::Election, Some(s)) => match c.election_seconds {
            Some(e) => format!(
                "elected {to} {e:.1}s after {} stopped leading ({s:.1}s after its pod was \
                 deleted)",
                c.from
            ),
            // The new leader was there at the first look without the old one.
            None => format!("{to} leading {s:.1}s after {}'s pod was deleted", c.from),
        },
        (LeaderChangeKind::Election, None) => {
            format!(
                "{} stopped while leading; no other member seen leading yet",
                c.from
            )
        }
    }
}

/// One event: time, type, reason, message.
pub fn event_line(e: &k8s_openapi::api::core::v1::Event) -> String {
    let when = (e.event_time.as_ref().map(|t| t.0.to_string()))
        .or(e.last_timestamp.as_ref().map(|t| t.0.to_string()))
        .unwrap_or_else(|| "-".into());
    format!(
        "  {when}  {:<8} {:<18} {}",
        e.type_.as_deref().unwrap_or("-"),
        e.reason.as_deref().unwrap_or("-"),
        e.message.as_deref().unwrap_or("")
    )
}

/// Why `abort` does nothing for a request in this state, if it does nothing.
pub fn abort_refusal(name: &str, s: &StorageMigrationRequestStatus) -> Option<String> {
    use crate::api::Stage;
    if s.phase.is_final() {
        return Some(format!(
            "{name} has ended ({:?}): nothing to abort",
            s.phase
        ));
    }
    match s.stage {
        Stage::Preflight => Some(format!(
            "{name} has not started (Pending): nothing was touched yet; delete it instead: \
             kubectl delete storagemigrationrequest {name}"
        )),
        Stage::OrphaningStatefulSet | Stage::Migrating => None,
        stage => Some(format!(
            "{name} is {stage:?}: past the point a rollback is taken (every member is moved, or \
             it is rolling back already); it finishes on its own"
        )),
    }
}

/// `y` or `yes`, in any case.
pub fn confirmed(answer: &str) -> bool {
    matches!(answer.trim().to_ascii_lowercase().as_str(), "y" | "yes")
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, Time};

    fn progress() -> CopyProgress {
        CopyProgress {
            pass: CopyPass::Copy,
            bytes_done: 50 << 20,
            bytes_total: Some(100 << 20),
            percent: 50,
            bytes_per_second: Some(10 << 20),
            eta_seconds: Some(5),
            files_done: Some(7),
            files_total: Some(52),
        }
    }

    #[test]
    fn abort_only_while_a_rollback_is_taken() {
        use crate::api::Stage;
        let mut s = StorageMigrationRequestStatus::default();
        assert!(abort_refusal("m", &s).unwrap().contains("kubectl delete"));
        s.phase = Phase::Progressing;
        s.stage = Stage::Migrating;
        assert_eq!(abort_refusal("m", &s), None);
        s.stage = Stage::Finalizing;
        assert!(abort_refusal("m", &s).unwrap().contains("Finalizing"));
        s.phase = Phase::Failed;
        assert_eq!(
            abort_refusal("m", &s).unwrap(),
            "m has ended (Failed): nothing to abort"
        );
        assert!(confirmed(" Yes\n") && confirmed("y") && !confirmed("") && !confirmed("no"));
    }

    #[test]
    fn watch_all_shows_each_request_and_ends_with_the_worst_outcome() {
        let mut requests = BTreeMap::new();
        let mut waiting = StorageMigrationRequestStatus {
            phase: Phase::Progressing,
            message: Some("member app-0 waits for a copy slot".into()),
            ..Default::default()
        };
        requests.insert("a/one".to_string(), waiting.clone());
        let done = StorageMigrationRequestStatus {
            phase: Phase::Successful,
            message: Some("done".into()),
            ..Default::default()
        };
        requests.insert("b/two".to_string(), done);
        let lines = all_lines(&requests);
        assert!(lines[0].starts_with("a/one: Progressing"), "{lines:?}");
        assert_eq!(lines[1], "  member app-0 waits for a copy slot");
        assert!(lines[2].starts_with("b/two: Successful"), "{lines:?}");
        assert_eq!(lines[3], "2 requests: 1 Progressing, 1 Successful");
        let phases = |r: &BTreeMap<String, StorageMigrationRequestStatus>| {
            r.values().map(|s| s.phase).collect::<Vec<_>>()
        };
        assert_eq!(all_exit_code(phases(&requests)), None);
        waiting.phase = Phase::Denied;
        requests.insert("a/one".to_string(), waiting.clone());
        assert_eq!(all_exit_code(phases(&requests)), Some(2));
        requests.insert(
            "c/three".to_string(),
            StorageMigrationRequestStatus {
                phase: Phase::Failed,
                ..Default::default()
            },
        );
        assert_eq!(all_exit_code(phases(&requests)), Some(3));
        assert_eq!(
            all_exit_code([Phase::Successful, Phase::Successful]),
            Some(0)
        );
    }

    #[test]
    fn units() {
        assert_eq!(bytes(512), "512 B");
        assert_eq!(bytes(1536), "1.5 KiB");
        assert_eq!(bytes(3 << 30), "3.0 GiB");
        assert_eq!(duration(5), "5s");
        assert_eq!(duration(125), "2m05s");
        assert_eq!(duration(3725), "1h02m05s");
        assert_eq!(bar(50, 10), "[#####-----]");
        assert_eq!(bar(150, 4), "[####]");
        assert_eq!(bar(-3, 4), "[----]");
    }

    #[test]
    fn a_copying_member_shows_its_bar_and_a_done_one_its_downtime() {
        let mut m = MemberStatus {
            pod: "etcd-1".into(),
            step: MemberStep::Copying,
            copy_progress: Some(progress()),
            ..Default::default()
        };
        assert_eq!(
            member_line(&m),
            "  etcd-1       Copying             final copy [##########----------]  50%  \
             50.0 MiB / 100.0 MiB  10.0 MiB/s  ETA 5s  files 7/52"
        );
        // The pre-copy's last reading is not the final copy's.
        m.copy_progress.as_mut().unwrap().pass = CopyPass::PreCopy;
        m.message = Some("copying".into());
        assert_eq!(
            member_line(&m),
            "  etcd-1       Copying             copying"
        );
        m.step = MemberStep::Done;
        m.downtime_seconds = Some(4.25);
        m.first_claim.bytes_copied = Some(2048);
        assert_eq!(
            member_line(&m),
            "  etcd-1       Done                downtime 4.2s  copied 2.0 KiB"
        );
        let pending = MemberStatus {
            pod: "etcd-2".into(),
            ..Default::default()
        };
        assert_eq!(member_line(&pending), "  etcd-2       Pending");
        m.leader_change = Some(LeaderChange {
            from: "etcd-1".into(),
            to: Some("etcd-2".into()),
            how: LeaderChangeKind::Election,
            started: MicroTime(Timestamp::from_second(100).unwrap()),
            seconds: Some(3.67),
            leaderless: Some(MicroTime(Timestamp::from_second(103).unwrap())),
            election_seconds: Some(0.31),
        });
        assert_eq!(
            member_line(&m),
            "  etcd-1       Done                downtime 4.2s  copied 2.0 KiB  elected etcd-2 \
             0.3s after etcd-1 stopped leading (3.7s after its pod was deleted)"
        );
        m.leader_change.as_mut().unwrap().how = LeaderChangeKind::Handover;
        assert!(
            member_times(&m).contains(&"    leadership   handed over to etcd-2 in 3.7s".into())
        );
    }

    #[test]
    fn watch_shows_the_header_then_the_members_and_ends_with_the_phase() {
        let mut s = StorageMigrationRequestStatus {
            phase: Phase::Progressing,
            stage: crate::api::Stage::Migrating,
            percent: Some(45),
            progress: Some("1/3".into()),
            current_member: Some("etcd-1".into()),
            members: vec![MemberStatus {
                pod: "etcd-0".into(),
                step: MemberStep::Done,
                downtime_seconds: Some(3.0),
                ..Default::default()
            }],
            ..Default::default()
        };
        assert_eq!(
            watch_lines("move", &s)[0],
            "move: Progressing, Migrating, 45%, members 1/3, member etcd-1"
        );
        s.phase = Phase::Successful;
        s.start_time = Some(Time(Timestamp::from_second(100).unwrap()));
        s.completion_time = Some(Time(Timestamp::from_second(225).unwrap()));
        s.message = Some("all members migrated".into());
        assert_eq!(
            final_lines("move", &s),
            vec![
                "move: Successful in 2m05s",
                "  all members migrated",
                "  etcd-0       Done         downtime 3.0s",
            ]
        );
        assert_eq!(exit_code(Phase::Successful), Some(0));
        assert_eq!(exit_code(Phase::Failed), Some(3));
        assert_eq!(exit_code(Phase::Denied), Some(2));
        assert_eq!(exit_code(Phase::Progressing), None);
    }

    fn planned() -> PlannedMember {
        PlannedMember {
            ordinal: 0,
            pod: "etcd-0".into(),
            node: "node-a".into(),
            claim: "data-etcd-0".into(),
            old_volume: "pv-old".into(),
            temp_claim: "tmp".into(),
            old_size: Quantity("1Gi".into()),
            new_size: Quantity("512Mi".into()),
            used_bytes: None,
            role: Some(Role::Leader),
            work: crate::api::PlannedWork::Migrate,
            further_claims: Vec::new(),
        }
    }

    #[test]
    fn a_plan_of_two_templates_lists_each_members_claims_and_the_stop() {
        let mut member = planned();
        member.further_claims = vec![crate::api::PlannedClaim {
            template: "wal".into(),
            claim: "wal-etcd-0".into(),
            old_size: Quantity("256Mi".into()),
            new_size: Quantity("128Mi".into()),
            ..Default::default()
        }];
        let plan = Plan {
            stateful_set: "etcd".into(),
            volume_claim_template: "data".into(),
            target_storage_class: "standard".into(),
            target_size: Quantity("512Mi".into()),
            further_templates: vec![crate::api::TemplateSize {
                name: "wal".into(),
                size: Quantity("128Mi".into()),
            }],
            members: vec![member],
            ..Default::default()
        };
        let lines = plan_lines(&plan);
        assert_eq!(
            lines[0],
            "StatefulSet etcd templates data, wal (128Mi) (each member's claims in one stop): \
             class (none) -> standard, size 512Mi"
        );
        assert_eq!(
            lines[3],
            "                             (same stop)      wal-etcd-0             256Mi -> 128Mi"
        );
        let down = downtime_lines(&plan, &[2.0, 9.5, 3.0], "db");
        assert!(
            down[0].starts_with("Downtime: 1 member pod(s) are stopped once each, one at a time"),
            "{down:?}"
        );
        assert!(down[0].contains("the swap of 2 claim(s)"), "{down:?}");
        assert_eq!(
            down[1],
            "  earlier successful requests in namespace db: 3 stops, median 3.0s, longest 9.5s"
        );
        let none = downtime_lines(&plan, &[], "db");
        assert_eq!(
            none[1],
            "  no earlier successful request in namespace db to estimate from"
        );
    }

    #[test]
    fn plan_and_denials() {
        let plan = Plan {
            stateful_set: "etcd".into(),
            volume_claim_template: "data".into(),
            target_claim: None,
            deployment: None,
            pod: None,
            source_storage_class: Some("standard".into()),
            target_storage_class: "standard".into(),
            target_size: Quantity("512Mi".into()),
            members: vec![planned()],
            further_templates: Vec::new(),
        };
        let lines = plan_lines(&plan);
        assert_eq!(
            lines[0],
            "StatefulSet etcd template data: class standard -> standard, size 512Mi"
        );
        assert_eq!(
            lines[2],
            "  1   etcd-0       leader    node-a           data-etcd-0            1Gi -> 512Mi"
        );
        let shrink = shrink_measurement_lines(&plan);
        assert!(shrink[0].contains("du -s -B1"), "{shrink:?}");
        assert_eq!(
            shrink[1],
            "  etcd-0: claim data-etcd-0 (1Gi -> 512Mi) may have at most 465.5 MiB in use"
        );
        let d = [
            Denial::new(
                crate::plan::preflight::DenialReason::TargetNotFound,
                "no set",
            ),
            Denial::new(crate::plan::preflight::DenialReason::InvalidSpec, "bad"),
        ];
        assert_eq!(
            denial_lines(&d),
            vec![
                "Would be DENIED for 2 reasons:",
                "  - TargetNotFound: no set",
                "  - InvalidSpec: bad"
            ]
        );
    }

    #[test]
    fn where_the_data_is_follows_the_step() {
        let p = planned();
        let mut m = MemberStatus {
            pod: "etcd-0".into(),
            step: MemberStep::Pending,
            ..Default::default()
        };
        assert_eq!(
            data_location(&m, Some(&p)),
            "on its old volume pv-old (claim data-etcd-0)"
        );
        m.step = MemberStep::DeletingTempClaim;
        m.first_claim.new_volume = Some("pv-new".into());
        assert_eq!(
            data_location(&m, Some(&p)),
            "on pv-new, being bound to claim data-etcd-0; the original stays on pv-old (kept)"
        );
        m.step = MemberStep::Done;
        assert_eq!(
            data_location(&m, Some(&p)),
            "on pv-new (claim data-etcd-0); original volume pv-old"
        );
        m.held = Some("pod came back".into());
        assert_eq!(data_location(&m, None), "held mid-swap: pod came back");
        m.held = None;
        m.started = Some(Time(Timestamp::from_second(0).unwrap()));
        m.downtime_seconds = Some(2.0);
        assert_eq!(
            member_times(&m),
            vec![
                "    started      1970-01-01T00:00:00Z",
                "    downtime     2.0s"
            ]
        );
    }

    #[test]
    fn the_plan_says_how_the_leader_hands_over() {
        let mut plan = Plan {
            members: vec![planned()],
            ..Plan::default()
        };
        let patroni = crate::api::DatabaseSpec {
            engine: crate::api::DatabaseEngine::Patroni,
            ..Default::default()
        };
        let how = crate::engine::rules(&patroni).handover();
        let line = handover_line(&plan, how).unwrap();
        assert!(
            line.starts_with("Leader: etcd-0 goes last; before it stops, a Patroni switchover"),
            "{line}"
        );
        let redis = crate::api::DatabaseSpec {
            engine: crate::api::DatabaseEngine::RedisSentinel,
            ..Default::default()
        };
        let how = crate::engine::rules(&redis).handover();
        let line = handover_line(&plan, how).unwrap();
        assert!(
            line.starts_with("Leader: etcd-0 goes last; before it stops, a Sentinel failover")
                && line.contains("writes paused on the master"),
            "{line}"
        );
        let generic = crate::engine::rules(&crate::api::DatabaseSpec::default()).handover();
        assert!(
            handover_line(&plan, generic)
                .unwrap()
                .contains("does not hand leadership over")
        );
        plan.members[0].role = Some(Role::Follower);
        assert_eq!(handover_line(&plan, how), None);
    }
}
