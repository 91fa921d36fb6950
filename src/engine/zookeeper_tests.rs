//! The ZooKeeper rules and assessment on four-letter-word answers as ZooKeeper 3.8 writes them.

use super::*;

const LEADER_SRVR: &str = "Zookeeper version: 3.8.0-5a02a05eddb59aee6ac762f7ea82e92a68eb9c0f, \
built on 2022-02-25 08:49 UTC
Latency min/avg/max: 0/0.4/11
Received: 412
Sent: 411
Connections: 1
Outstanding: 0
Zxid: 0x300000042
Mode: leader
Node count: 105
Proposal sizes last/min/max: 48/48/118
";

fn srvr(mode: &str, zxid: u64, count: u64) -> String {
    format!(
        "Zookeeper version: 3.8.0\nLatency min/avg/max: 0/0.1/3\nReceived: 7\nSent: 6\n\
         Connections: 1\nOutstanding: 0\nZxid: 0x{zxid:x}\nMode: {mode}\nNode count: {count}\n"
    )
}

fn mntr(state: &str, peer: &str, synced: Option<u64>) -> String {
    let mut t = format!(
        "zk_version\t3.8.0\nzk_server_state\t{state}\nzk_znode_count\t105\n\
         zk_peer_state\t{peer}\nzk_outstanding_requests\t0\n"
    );
    if let Some(n) = synced {
        t.push_str(&format!(
            "zk_followers\t{n}\nzk_synced_followers\t{n}\nzk_synced_non_voting_followers\t0\n"
        ));
    }
    t
}

const ZXID: u64 = 0x3_0000_0042;

fn view(i: u32, srvr_text: &str, mntr_text: &str) -> MemberView {
    MemberView {
        pod: PodInfo {
            name: format!("zk-{i}"),
            terminating: false,
        },
        endpoint: Some(format!("198.18.0.{}:2181", 10 + i)),
        srvr: parse_srvr(srvr_text),
        mntr: parse_mntr(mntr_text),
    }
}

fn leader(i: u32, synced: u64) -> MemberView {
    view(
        i,
        &srvr("leader", ZXID, 105),
        &mntr("leader", "leading - broadcast", Some(synced)),
    )
}

fn follower(i: u32) -> MemberView {
    view(
        i,
        &srvr("follower", ZXID, 105),
        &mntr("follower", "following - broadcast", None),
    )
}

/// zk-0 and zk-2 follow, zk-1 leads and counts both synced.
fn ensemble() -> Vec<MemberView> {
    vec![follower(0), leader(1, 2), follower(2)]
}

fn down(i: u32) -> MemberView {
    let refused = Refusal::NoAnswer {
        word: "srvr".into(),
        endpoint: format!("198.18.0.{}:2181", 10 + i),
        message: "Connection refused (os error 111)".into(),
    };
    MemberView {
        pod: PodInfo {
            name: format!("zk-{i}"),
            terminating: false,
        },
        endpoint: Some(format!("198.18.0.{}:2181", 10 + i)),
        srvr: Err(refused.clone()),
        mntr: Err(refused),
    }
}

fn names(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| s.to_string()).collect()
}

fn wait(g: Gate) -> String {
    match g {
        Gate::Wait(w) => w,
        other => panic!("expected a wait, got {other:?}"),
    }
}

#[test]
fn srvr_of_a_leader_parses() {
    let s = parse_srvr(LEADER_SRVR).unwrap();
    assert_eq!(s.mode, Mode::Leader);
    assert_eq!(s.zxid, 0x3_0000_0042);
    assert_eq!(epoch(s.zxid), 3);
    assert_eq!(s.node_count, Some(105));
    assert_eq!(hex(s.zxid), "0x300000042");
}

#[test]
fn refusals_are_told_apart() {
    let whitelist = "mntr is not executed because it is not in the whitelist.\n";
    let e = parse_mntr(whitelist).unwrap_err();
    assert_eq!(
        e,
        Refusal::NotWhitelisted {
            word: "mntr".into()
        }
    );
    let text = e.to_string();
    assert!(
        text.contains("4lw.commands.whitelist=srvr,mntr,ruok"),
        "{text}"
    );
    assert!(text.contains("mntr"), "{text}");
    assert_eq!(
        parse_srvr("This ZooKeeper instance is not currently serving requests\n"),
        Err(Refusal::NotServing)
    );
    assert!(matches!(
        parse_srvr("imok"),
        Err(Refusal::Malformed { word, first_line }) if word == "srvr" && first_line == "imok"
    ));
    assert!(matches!(parse_mntr(""), Err(Refusal::Malformed { .. })));
}

#[test]
fn mntr_parses_tab_separated_values() {
    let m = parse_mntr(&mntr("leader", "leading - broadcast", Some(2))).unwrap();
    assert_eq!(m.synced_followers(), Some(2));
    assert_eq!(m.znode_count(), Some(105));
    assert_eq!(m.peer_state(), Some("leading - broadcast"));
}

#[test]
fn a_synced_ensemble_is_healthy() {
    let r = assess(&ensemble());
    assert_eq!(r.leader.as_deref(), Some("zk-1"));
    assert!(r.problems.is_empty(), "{:?}", r.problems);
    assert_eq!(r.voting_members, Some(3));
    assert!(r.members.iter().all(|m| m.healthy), "{r:?}");
    assert_eq!(r.members[1].position, Some(ZXID));
    assert_eq!(r.members[1].term, Some(3));
    assert_eq!(r.members[0].member_id.as_deref(), Some("zk-0"));
    assert_eq!(ZooKeeperRules::default().healthy_for_start(&r), Ok(()));
    assert_eq!(ZooKeeperRules::default().preflight(&Ok(r)), Ok(()));
}

#[test]
fn followers_first_leader_last() {
    let r = assess(&ensemble());
    let all = names(&["zk-2", "zk-1", "zk-0"]);
    assert_eq!(
        ZooKeeperRules::default().next_member(&r, &all).as_deref(),
        Some("zk-0")
    );
    let rest = names(&["zk-1", "zk-2"]);
    assert_eq!(
        ZooKeeperRules::default().next_member(&r, &rest).as_deref(),
        Some("zk-2")
    );
    let last = names(&["zk-1"]);
    assert_eq!(
        ZooKeeperRules::default().next_member(&r, &last).as_deref(),
        Some("zk-1")
    );
}

#[test]
fn gate_opens_for_followers_and_then_the_leader_without_handover() {
    let r = assess(&ensemble());
    assert_eq!(
        ZooKeeperRules::default().gate_before_stop(&r, "zk-0"),
        Gate::Open
    );
    assert_eq!(
        ZooKeeperRules::default().gate_before_stop(&r, "zk-2"),
        Gate::Open
    );
    // No transfer: the leader stops last and the ensemble elects another.
    assert_eq!(
        ZooKeeperRules::default().gate_before_stop(&r, "zk-1"),
        Gate::Open
    );
    assert_eq!(
        ZooKeeperRules::default().handover_target(&r, "zk-1", &[]),
        None
    );
    assert!(
        ZooKeeperRules::default()
            .handover()
            .is_some_and(|h| h.starts_with("no handover") && h.contains("elect a new leader"))
    );
}

#[test]
fn a_stopped_follower_holds_the_gate_of_the_others() {
    let r = assess(&[down(0), leader(1, 1), follower(2)]);
    let why = wait(ZooKeeperRules::default().gate_before_stop(&r, "zk-2"));
    assert!(why.contains("zk-1 counts 1 synced follower(s)"), "{why}");
    assert!(why.contains("need 2"), "{why}");
    let r_member = &r.members[0];
    assert!(!r_member.healthy);
    assert!(
        r_member
            .problem
            .as_deref()
            .unwrap()
            .contains("does not answer srvr at 198.18.0.10:2181"),
        "{r_member:?}"
    );
    // The leader may not go either: it would leave one voter of three.
    assert!(matches!(
        ZooKeeperRules::default().gate_before_stop(&r, "zk-1"),
        Gate::Wait(_)
    ));
}

#[test]
fn a_syncing_follower_is_not_healthy_and_names_its_state() {
    let syncing = view(
        0,
        &srvr("follower", 0x2_0000_0010, 90),
        &mntr("follower", "following - synchronization", None),
    );
    let r = assess(&[syncing, leader(1, 1), follower(2)]);
    let p = r.members[0].problem.as_deref().unwrap();
    assert!(p.contains("peer state following - synchronization"), "{p}");
    let why = wait(ZooKeeperRules::default().gate_before_stop(&r, "zk-2"));
    assert!(why.contains("zk-0"), "{why}");
    // The member just back waits until it is synced and counted.
    let why = wait(ZooKeeperRules::default().gate_after_return(&r, "zk-0"));
    assert!(why.contains("zk-0 is not healthy yet"), "{why}");
}

#[test]
fn rejoin_waits_until_the_leader_counts_the_member_synced() {
    // The member is back as follower in broadcast, but the leader has not counted it yet.
    let r = assess(&[follower(0), leader(1, 1), follower(2)]);
    let why = wait(ZooKeeperRules::default().gate_after_return(&r, "zk-0"));
    assert!(why.contains("counts 1 synced follower(s)"), "{why}");
    let r = assess(&ensemble());
    assert_eq!(
        ZooKeeperRules::default().gate_after_return(&r, "zk-0"),
        Gate::Open
    );
    // Not back at all.
    let r = assess(&[down(0), leader(1, 1), follower(2)]);
    let why = wait(ZooKeeperRules::default().gate_after_return(&r, "zk-0"));
    assert!(why.contains("zk-0 is not healthy yet"), "{why}");
}

#[test]
fn after_the_leader_stops_the_gate_waits_for_the_election() {
    let r = assess(&[
        view(
            0,
            "This ZooKeeper instance is not currently serving requests\n",
            "",
        ),
        down(1),
        view(
            2,
            "This ZooKeeper instance is not currently serving requests\n",
            "",
        ),
    ]);
    assert_eq!(r.leader, None);
    assert!(r.problems[0].contains("no member answers as leader"));
    let why = wait(ZooKeeperRules::default().gate_after_return(&r, "zk-1"));
    assert!(why.contains("zk-1 is not healthy yet"), "{why}");
    // Not ready (IfReady refuses), but no reason to deny whatever `apply` says.
    assert!(ZooKeeperRules::default().healthy_for_start(&r).is_err());
    assert_eq!(ZooKeeperRules::default().preflight(&Ok(r)), Ok(()));
    let unread = Err(HealthUnavailable::Engine("boom".into()));
    assert!(
        ZooKeeperRules::default()
            .preflight(&unread)
            .unwrap_err()
            .contains("cannot be read: boom")
    );
    // A new leader (zk-2, epoch 4) with zk-0 synced and the old leader back as follower.
    let z = 0x4_0000_0001;
    let r = assess(&[
        view(
            0,
            &srvr("follower", z, 105),
            &mntr("follower", "following - broadcast", None),
        ),
        view(
            1,
            &srvr("follower", z, 105),
            &mntr("follower", "following - broadcast", None),
        ),
        view(
            2,
            &srvr("leader", z, 105),
            &mntr("leader", "leading - broadcast", Some(2)),
        ),
    ]);
    assert_eq!(r.leader.as_deref(), Some("zk-2"));
    assert_eq!(
        ZooKeeperRules::default().gate_after_return(&r, "zk-1"),
        Gate::Open
    );
}

#[test]
fn a_word_missing_from_the_whitelist_is_named_with_the_setting() {
    let refused = view(
        0,
        &srvr("follower", ZXID, 105),
        "mntr is not executed because it is not in the whitelist.\n",
    );
    let r = assess(&[refused, leader(1, 2), follower(2)]);
    let p = r.members[0].problem.as_deref().unwrap();
    assert!(p.contains("refuses the four-letter word mntr"), "{p}");
    assert!(p.contains("4lw.commands.whitelist=srvr,mntr,ruok"), "{p}");
    let denied = ZooKeeperRules::default().preflight(&Ok(r)).unwrap_err();
    assert!(
        denied.contains("zk-0: its sync state is unknown: it refuses the four-letter word mntr"),
        "{denied}"
    );
    assert!(denied.contains("4lw.commands.whitelist"), "{denied}");
}

#[test]
fn observers_do_not_vote() {
    let observer = view(
        3,
        &srvr("observer", ZXID, 105),
        &mntr("observer", "observing - broadcast", None),
    );
    let mut views = ensemble();
    views.push(observer);
    let r = assess(&views);
    assert_eq!(r.voting_members, Some(3));
    assert!(r.members[3].healthy, "{:?}", r.members[3]);
    assert_eq!(r.members[3].member_id, None);
    assert!(r.problems.is_empty(), "{:?}", r.problems);
    assert_eq!(
        ZooKeeperRules::default().gate_before_stop(&r, "zk-3"),
        Gate::Open
    );
}

#[test]
fn quorum_counts_voters_only() {
    // Only the pods observed count (the planner adds missing pods as problems).
    let r = assess(&[leader(1, 1), follower(2)]);
    assert_eq!(r.voting_members, Some(2));
    // Two pods, both voters: stopping one leaves 1 of 2, no majority.
    let why = wait(ZooKeeperRules::default().gate_before_stop(&r, "zk-2"));
    assert!(
        why.contains("1 of 2 voting members up; quorum needs 2"),
        "{why}"
    );
}

#[test]
fn standalone_two_leaders_and_no_leader_are_problems() {
    let r = assess(&[view(
        0,
        &srvr("standalone", 5, 4),
        &mntr("standalone", "", None),
    )]);
    assert!(
        r.members[0]
            .problem
            .as_deref()
            .unwrap()
            .contains("standalone")
    );
    assert!(ZooKeeperRules::default().healthy_for_start(&r).is_err());
    let r = assess(&[leader(0, 1), leader(1, 1), follower(2)]);
    assert_eq!(r.leader, None);
    assert!(r.problems[0].contains("more than one member answers as leader: zk-0, zk-1"));
    assert!(wait(ZooKeeperRules::default().gate_before_stop(&r, "zk-2")).contains("no leader"));
}

#[test]
fn a_terminating_pod_is_not_healthy() {
    let mut views = ensemble();
    views[0].pod.terminating = true;
    let r = assess(&views);
    assert!(
        r.members[0]
            .problem
            .as_deref()
            .unwrap()
            .contains("being deleted")
    );
}

fn served(zxid: u64, znodes: u64) -> Result<ServedState, String> {
    Ok(ServedState { zxid, znodes })
}

#[test]
fn agreement_needs_the_same_zxid_and_znode_count_everywhere() {
    let h = agreed_state(&[
        ("zk-0".into(), served(ZXID, 105)),
        ("zk-1".into(), served(ZXID, 105)),
        ("zk-2".into(), served(ZXID, 105)),
    ])
    .unwrap();
    assert_eq!(h.hash, "zxid 0x300000042, 105 znodes");
    assert_eq!(h.members, ["zk-0", "zk-1", "zk-2"]);
    let e = agreed_state(&[
        ("zk-0".into(), served(ZXID, 105)),
        ("zk-1".into(), served(ZXID + 1, 106)),
        ("zk-2".into(), served(ZXID, 105)),
    ])
    .unwrap_err();
    assert!(e.contains("zk-0 at zxid 0x300000042, 105 znodes"), "{e}");
    assert!(e.contains("zk-1 at zxid 0x300000043, 106 znodes"), "{e}");
    // Same zxid, different znode counts: not agreed either.
    assert!(
        agreed_state(&[
            ("zk-0".into(), served(ZXID, 104)),
            ("zk-1".into(), served(ZXID, 105)),
        ])
        .is_err()
    );
    let e = agreed_state(&[
        ("zk-0".into(), served(ZXID, 105)),
        ("zk-1".into(), Err("refused".into())),
    ])
    .unwrap_err();
    assert!(e.contains("zk-1: refused"), "{e}");
    assert!(agreed_state(&[]).is_err());
    assert_eq!(
        ZooKeeperRules::default().final_check(),
        FinalCheckKind::Agreement {
            what: "last zxid and znode count"
        }
    );
}

#[test]
fn members_at_the_start_of_a_later_epoch_agree_by_znode_count() {
    // After an election and before the next write, the leader (and a follower that synced
    // with it) show epoch << 32; another follower the last transaction of the previous epoch.
    let h = agreed_state(&[
        ("zk-0".into(), served(0x2_0000_01f4, 600)),
        ("zk-1".into(), served(0x3_0000_0000, 600)),
        ("zk-2".into(), served(0x3_0000_0000, 600)),
    ])
    .unwrap();
    assert_eq!(h.hash, "zxid 0x2000001f4, 600 znodes");
    // Seen on the local cluster: nothing ever written, members at epochs 1 and 2.
    let h = agreed_state(&[
        ("zk-0".into(), served(0x1_0000_0000, 5)),
        ("zk-1".into(), served(0x2_0000_0000, 5)),
        ("zk-2".into(), served(0x2_0000_0000, 5)),
    ])
    .unwrap();
    assert_eq!(h.hash, "epoch 2, 5 znodes");
    // A follower behind the last transaction still differs.
    assert!(
        agreed_state(&[
            ("zk-0".into(), served(0x2_0000_01f3, 599)),
            ("zk-1".into(), served(0x2_0000_01f4, 600)),
            ("zk-2".into(), served(0x3_0000_0000, 600)),
        ])
        .is_err()
    );
    // A member at the start of the transaction's own (or an older) epoch has not applied it.
    assert!(
        agreed_state(&[
            ("zk-0".into(), served(0x2_0000_0000, 600)),
            ("zk-1".into(), served(0x2_0000_01f4, 600)),
        ])
        .is_err()
    );
}

fn recorded(name: &str) -> String {
    let path = format!(
        "{}/src/engine/testdata/zookeeper/{name}",
        env!("CARGO_MANIFEST_DIR")
    );
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
}

#[test]
fn recorded_answers_of_a_new_ensemble_assess_healthy() {
    let follower = |i| {
        view(
            i,
            &recorded("srvr-follower.txt"),
            &recorded("mntr-follower.txt"),
        )
    };
    let leader = view(
        2,
        &recorded("srvr-leader.txt"),
        &recorded("mntr-leader.txt"),
    );
    assert_eq!(leader.srvr.as_ref().unwrap().zxid, 0x1_0000_0000);
    assert_eq!(leader.srvr.as_ref().unwrap().node_count, Some(5));
    let r = assess(&[follower(0), follower(1), leader]);
    assert!(r.problems.is_empty(), "{:?}", r.problems);
    assert!(r.members.iter().all(|m| m.healthy), "{r:?}");
    assert_eq!(r.leader.as_deref(), Some("zk-2"));
    assert_eq!(r.voting_members, Some(3));
    assert_eq!(r.members[2].term, Some(1));
    assert_eq!(r.members[0].position, Some(0));
    // zk_quorum_size counts a voter whose pod is missing: stopping another would leave 1 of 3.
    let r = assess(&[
        follower(0),
        view(
            2,
            &recorded("srvr-leader.txt"),
            &recorded("mntr-leader.txt"),
        ),
    ]);
    assert_eq!(r.voting_members, Some(3));
    let why = wait(ZooKeeperRules::default().gate_before_stop(&r, "zk-0"));
    assert!(
        why.contains("1 of 3 voting members up; quorum needs 2"),
        "{why}"
    );
    let refused = parse_srvr(&recorded("stat-not-whitelisted.txt")).unwrap_err();
    assert!(
        matches!(refused, Refusal::NotWhitelisted { .. }),
        "{refused:?}"
    );
}

const RECONFIG: ZooKeeperRules = ZooKeeperRules {
    handover: ZooKeeperHandover::Reconfig,
};

#[test]
fn with_reconfig_the_leader_hands_over_to_a_migrated_voter_first() {
    let r = assess(&ensemble());
    // The followers stop as without a handover.
    assert_eq!(RECONFIG.gate_before_stop(&r, "zk-0"), Gate::Open);
    assert_eq!(
        RECONFIG.gate_before_stop(&r, "zk-1"),
        Gate::TransferLeadershipFirst
    );
    assert_eq!(
        RECONFIG
            .handover_target(&r, "zk-1", &names(&["zk-2"]))
            .as_deref(),
        Some("zk-2")
    );
    assert_eq!(
        RECONFIG.handover_target(&r, "zk-1", &[]).as_deref(),
        Some("zk-0")
    );
    assert!(
        RECONFIG
            .handover()
            .is_some_and(|h| h.starts_with("a reconfiguration"))
    );
    // An unhealthy ensemble waits before any handover.
    let sick = assess(&[down(0), leader(1, 1), follower(2)]);
    assert!(matches!(
        RECONFIG.gate_before_stop(&sick, "zk-1"),
        Gate::Wait(_)
    ));
    // An observer takes no leadership.
    let observer = view(
        0,
        &srvr("observer", ZXID, 105),
        &mntr("observer", "observing - broadcast", None),
    );
    let r = assess(&[observer, leader(1, 1), follower(2)]);
    assert_eq!(
        RECONFIG.handover_target(&r, "zk-1", &[]).as_deref(),
        Some("zk-2")
    );
}

#[test]
fn with_reconfig_a_leader_left_an_observer_is_not_handed_over_yet() {
    let observer = view(
        1,
        &srvr("observer", ZXID, 105),
        &mntr("observer", "observing - broadcast", None),
    );
    let cut_short = assess(&[follower(0), observer, leader(2, 1)]);
    assert!(!RECONFIG.handed_over(&cut_short, "zk-1"));
    // As a follower again it is, and an Election request never asks.
    let done = assess(&[follower(0), follower(1), leader(2, 2)]);
    assert!(RECONFIG.handed_over(&done, "zk-1"));
    assert!(ZooKeeperRules::default().handed_over(&cut_short, "zk-1"));
}

#[test]
fn preflight_denies_reconfig_on_an_ensemble_that_refuses_it() {
    let mut r = assess(&ensemble());
    r.problems.push(format!(
        "the ensemble refuses reconfiguration: set {RECONFIG_SETTING} in zoo.cfg"
    ));
    let e = RECONFIG.preflight(&Ok(r)).unwrap_err();
    assert!(e.contains("reconfigEnabled=true"), "{e}");
}

const CONFIG: &str = "server.1=zk-0.zk.db.svc.cluster.local:2888:3888:participant;0.0.0.0:2181
server.2=zk-1.zk.db.svc.cluster.local:2888:3888:participant;2181
server.3=10.244.0.7:2888:3888
server.4=[fd00::4]:2888:3888:observer;[::]:2181
version=100000004
";

#[test]
fn the_config_names_each_pod_and_its_role() {
    let c = EnsembleConfig::parse(CONFIG).unwrap();
    assert_eq!(c.version, 0x1_0000_0004);
    assert_eq!(c.servers.len(), 4);
    let zk1 = c.server_of("zk-1", Some("10.244.0.5")).unwrap();
    assert_eq!((zk1.id, zk1.role), (2, ServerRole::Participant));
    // By IP, with no role and no client port written.
    let zk2 = c.server_of("zk-2", Some("10.244.0.7")).unwrap();
    assert_eq!((zk2.id, zk2.role), (3, ServerRole::Participant));
    assert_eq!(
        zk2.with_role(ServerRole::Observer, 2181),
        "server.3=10.244.0.7:2888:3888:observer;2181"
    );
    let zk3 = c.server_of("zk-3", Some("fd00::4")).unwrap();
    assert_eq!(zk3.role, ServerRole::Observer);
    assert_eq!(
        zk3.with_role(ServerRole::Participant, 2181),
        "server.4=[fd00::4]:2888:3888:participant;[::]:2181"
    );
    assert_eq!(
        (c.server_of("zk-0", None).unwrap()).with_role(ServerRole::Observer, 1),
        "server.1=zk-0.zk.db.svc.cluster.local:2888:3888:observer;0.0.0.0:2181"
    );
    // `zk-1` is not `zk-10`, and a pod the config does not name is an error naming it.
    let e = c.server_of("zk-10", None).unwrap_err();
    assert!(e.contains("zk-10"), "{e}");
}

#[test]
fn a_config_that_cannot_be_read_is_an_error_naming_the_line() {
    for (text, says) in [
        ("server.1=a:1:2\n", "no version= line"),
        ("server.x=a:1:2\nversion=1\n", "server.x"),
        (
            "server.1=a:1:2:witness\nversion=1\n",
            "unknown role witness",
        ),
        ("server.1=a:1:2|b:1:2\nversion=1\n", "several addresses"),
        ("server.1=a\nversion=1\n", "no ports"),
        ("version=zz\n", "not hexadecimal"),
    ] {
        let e = EnsembleConfig::parse(text).unwrap_err();
        assert!(e.contains(says), "{text:?}: {e}");
    }
}

#[test]
fn a_handover_by_reconfig_goes_on_from_where_it_stands() {
    use ReconfigStep::*;
    let p = ServerRole::Participant;
    let o = ServerRole::Observer;
    assert_eq!(reconfig_step(p, Some(&Mode::Leader), None), MakeObserver);
    assert!(matches!(
        reconfig_step(o, Some(&Mode::Observer), None),
        Wait(_)
    ));
    assert_eq!(
        reconfig_step(o, Some(&Mode::Observer), Some("zk-0")),
        MakeParticipant
    );
    // The observer may not answer while it restarts: the config decides.
    assert_eq!(reconfig_step(o, None, Some("zk-0")), MakeParticipant);
    assert!(matches!(
        reconfig_step(p, Some(&Mode::Observer), Some("zk-0")),
        Wait(_)
    ));
    assert!(matches!(reconfig_step(p, None, None), Wait(_)));
    assert_eq!(reconfig_step(p, Some(&Mode::Follower), Some("zk-0")), Done);
}
