use super::*;

const MASTER: &str = include_str!("testdata/redis/master-replication.txt");
const REPLICA: &str = include_str!("testdata/redis/replica-replication.txt");
const LINK_DOWN: &str = include_str!("testdata/redis/replica-link-down.txt");
const KEYSPACE: &str = include_str!("testdata/redis/keyspace.txt");
const CKQUORUM_OK: &str = include_str!("testdata/redis/ckquorum-ok.txt");

fn pod(i: u32) -> PodInfo {
    PodInfo {
        name: format!("redis-{i}"),
        ip: Some(format!("198.18.4.{}", 10 + i)),
        terminating: false,
    }
}

fn replica_of(master: u32, offset: u64) -> Replication {
    Replication {
        role: RedisRole::Replica,
        master_host: Some(format!("198.18.4.{}", 10 + master)),
        master_port: Some(6379),
        link_up: true,
        sync_in_progress: false,
        master_repl_offset: Some(offset),
        slave_repl_offset: Some(offset),
        replicas: vec![],
    }
}

fn master_at(offset: u64) -> Replication {
    Replication {
        role: RedisRole::Master,
        master_repl_offset: Some(offset),
        ..Replication::default()
    }
}

/// A member pod's Redis and the Sentinel beside it (the sidecar layout).
#[derive(Debug, Clone)]
struct Sidecar {
    pod: PodInfo,
    endpoint: Option<String>,
    replication: Result<Replication, String>,
    sentinel_master: Result<Option<(String, u16)>, String>,
    quorum: Quorum,
}

/// [`super::assess`] of member pods each with its Sentinel.
fn assess(views: &[Sidecar]) -> HealthReport {
    let members: Vec<MemberView> = (views.iter())
        .map(|v| MemberView {
            pod: v.pod.clone(),
            endpoint: v.endpoint.clone(),
            replication: v.replication.clone(),
        })
        .collect();
    let sentinels: Vec<SentinelView> = (views.iter())
        .map(|v| SentinelView {
            at: format!("{}:26379", v.pod.ip.as_deref().unwrap_or("?")),
            member: Some(v.pod.name.clone()),
            master: v.sentinel_master.clone(),
            quorum: v.quorum.clone(),
        })
        .collect();
    super::assess(&members, &sentinels)
}

fn view(i: u32, replication: Replication, sentinel_master: u32) -> Sidecar {
    Sidecar {
        pod: pod(i),
        endpoint: Some(format!("198.18.4.{}:6379", 10 + i)),
        replication: Ok(replication),
        sentinel_master: Ok(Some((format!("198.18.4.{}", 10 + sentinel_master), 6379))),
        quorum: Ok(CKQUORUM_OK.trim().to_string()),
    }
}

/// redis-0 the master at 1000, the others replicas at 1000.
fn healthy() -> Vec<Sidecar> {
    vec![
        view(0, master_at(1000), 0),
        view(1, replica_of(0, 1000), 0),
        view(2, replica_of(0, 1000), 0),
    ]
}

fn rules() -> RedisRules {
    RedisRules::default()
}

fn names(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| s.to_string()).collect()
}

#[test]
fn parses_redis_own_info_replication() {
    let m = parse_replication(MASTER).unwrap();
    assert_eq!(m.role, RedisRole::Master);
    assert_eq!(m.offset(), Some(948));
    assert_eq!(m.replicas.len(), 2);
    assert_eq!(
        m.replicas[1],
        ConnectedReplica {
            ip: "127.0.0.1".into(),
            port: 7002,
            state: "online".into(),
            offset: 948
        }
    );
    let r = parse_replication(REPLICA).unwrap();
    assert_eq!(r.role, RedisRole::Replica);
    assert!(r.link_up && !r.sync_in_progress);
    assert_eq!(
        (r.master_host.as_deref(), r.master_port),
        (Some("127.0.0.1"), Some(7000))
    );
    assert_eq!(r.offset(), Some(948));
    let down = parse_replication(LINK_DOWN).unwrap();
    assert!(!down.link_up);
    assert_eq!(down.offset(), Some(1370));
    assert!(parse_replication("# Replication\r\n").is_err());
    assert!(parse_replication("role:sentinel\r\n").is_err());
}

#[test]
fn parses_the_keyspace() {
    let k = parse_keyspace(KEYSPACE);
    assert_eq!(k.get("db0"), Some(&2));
    assert_eq!(k.get("db3"), Some(&1));
    assert_eq!(keyspace(&k), "db0=2 db3=1");
    assert!(parse_keyspace("# Keyspace\r\n").is_empty());
    assert_eq!(keyspace(&BTreeMap::new()), "none");
}

#[test]
fn a_healthy_group_has_the_sentinels_master_as_leader() {
    let r = assess(&healthy());
    assert_eq!(r.leader.as_deref(), Some("redis-0"), "{r:?}");
    assert!(r.problems.is_empty(), "{r:?}");
    assert!(r.members.iter().all(|m| m.healthy), "{r:?}");
    assert_eq!(r.members[1].position, Some(1000));
    assert_eq!(r.members[0].member_id.as_deref(), Some("198.18.4.10:6379"));
    assert_eq!(rules().gate_before_stop(&r, "redis-1"), Gate::Open);
    assert_eq!(
        rules().gate_before_stop(&r, "redis-0"),
        Gate::TransferLeadershipFirst
    );
    assert_eq!(rules().healthy_for_start(&r), Ok(()));
    assert_eq!(rules().preflight(&Ok(r)), Ok(()));
}

#[test]
fn a_master_named_by_hostname_is_matched_to_its_pod() {
    let mut views = healthy();
    for v in &mut views {
        v.sentinel_master = Ok(Some((
            "redis-0.redis.ns.svc.cluster.local".to_string(),
            6379,
        )));
    }
    views[1].replication = Ok(Replication {
        master_host: Some("redis-0.redis.ns.svc.cluster.local".into()),
        ..replica_of(0, 1000)
    });
    let r = assess(&views);
    assert_eq!(r.leader.as_deref(), Some("redis-0"));
    assert!(r.members.iter().all(|m| m.healthy), "{r:?}");
    assert!(!pod(1).is("redis-10.redis.ns.svc.cluster.local"));
    assert!(!pod(1).is("198.18.4.10"));
}

#[test]
fn replicas_go_first_and_the_master_last() {
    let mut views = healthy();
    views[0] = view(0, replica_of(1, 1000), 1);
    views[1] = view(1, master_at(1000), 1);
    views[2] = view(2, replica_of(1, 1000), 1);
    let r = assess(&views);
    assert_eq!(r.leader.as_deref(), Some("redis-1"));
    let all = names(&["redis-0", "redis-1", "redis-2"]);
    assert_eq!(rules().next_member(&r, &all).as_deref(), Some("redis-0"));
    assert_eq!(
        rules()
            .next_member(&r, &names(&["redis-1", "redis-2"]))
            .as_deref(),
        Some("redis-2")
    );
    assert_eq!(
        rules().next_member(&r, &names(&["redis-1"])).as_deref(),
        Some("redis-1")
    );
}

#[test]
fn a_replica_with_its_link_down_holds_the_gate_naming_it() {
    let mut views = healthy();
    views[2].replication = Ok(Replication {
        link_up: false,
        ..replica_of(0, 1000)
    });
    let r = assess(&views);
    let Gate::Wait(why) = rules().gate_before_stop(&r, "redis-1") else {
        panic!("{r:?}")
    };
    assert!(why.contains("redis-2: master_link_status is down"), "{why}");
    // refused by `apply: IfReady` only: with `apply: Always` the gate waits for it
    assert!(rules().healthy_for_start(&r).is_err());
    assert_eq!(rules().preflight(&Ok(r.clone())), Ok(()));
    // the recorded answer of a replica whose master went away
    let mut views = healthy();
    let mut down = parse_replication(LINK_DOWN).unwrap();
    down.master_host = Some("198.18.4.10".into());
    views[1].replication = Ok(down);
    let r = assess(&views);
    assert!(!r.members[1].healthy);
}

#[test]
fn a_lagging_replica_holds_the_gate_until_it_catches_up() {
    let mut views = healthy();
    views[0].replication = Ok(master_at(5_000_000));
    views[1].replication = Ok(replica_of(0, 4_999_000));
    views[2].replication = Ok(replica_of(0, 1_000_000));
    let r = assess(&views);
    let Gate::Wait(why) = rules().gate_before_stop(&r, "redis-1") else {
        panic!("{r:?}")
    };
    assert!(
        why.contains("redis-2 is 4000000 bytes of replication offset behind"),
        "{why}"
    );
    assert!(
        matches!(rules().gate_after_return(&r, "redis-2"), Gate::Wait(w) if w.contains("redis-2 is"))
    );
    views[2].replication = Ok(replica_of(0, 4_500_000));
    let r = assess(&views);
    assert_eq!(rules().gate_before_stop(&r, "redis-1"), Gate::Open);
    assert_eq!(rules().gate_after_return(&r, "redis-2"), Gate::Open);
    let strict = RedisRules { max_lag: 1000 };
    assert!(matches!(
        strict.gate_before_stop(&r, "redis-1"),
        Gate::Wait(_)
    ));
}

#[test]
fn without_quorum_nothing_stops() {
    let mut views = healthy();
    for v in &mut views {
        v.quorum = Err(
            "NOQUORUM 1 usable Sentinels. Not enough available Sentinels to reach \
                        the specified quorum for this master"
                .to_string(),
        );
    }
    let r = assess(&views);
    let Gate::Wait(why) = rules().gate_before_stop(&r, "redis-1") else {
        panic!("{r:?}")
    };
    assert!(why.contains("no Sentinel reaches its quorum"), "{why}");
    assert!(why.contains("NOQUORUM"), "{why}");
    assert!(rules().preflight(&Ok(r)).is_err());
    // one Sentinel OK is enough for the group's quorum
    views[1].quorum = Ok("OK 3 usable Sentinels".into());
    assert_eq!(
        rules().gate_before_stop(&assess(&views), "redis-1"),
        Gate::Open
    );
}

#[test]
fn a_member_whose_sentinel_is_silent_is_unhealthy_and_counts_against_the_majority() {
    let mut views = healthy();
    views[2].sentinel_master = Err("connection refused".into());
    let r = assess(&views);
    assert!(!r.members[2].healthy);
    assert!(
        r.members[2]
            .problem
            .as_deref()
            .is_some_and(|p| p.contains("its Sentinel does not answer")),
        "{r:?}"
    );
    assert!(matches!(
        rules().gate_before_stop(&r, "redis-1"),
        Gate::Wait(_)
    ));
    // with only two members observed, stopping one leaves one of two Sentinels
    let mut views = healthy();
    views.truncate(2);
    let r = assess(&views);
    assert!(
        matches!(rules().gate_before_stop(&r, "redis-1"), Gate::Wait(w) if w.contains("quorum needs 2")),
    );
}

#[test]
fn sentinels_that_disagree_or_do_not_know_the_group_are_problems() {
    let mut views = healthy();
    views[2].sentinel_master = Ok(Some(("198.18.4.11".into(), 6379)));
    let r = assess(&views);
    assert!(r.problems.iter().any(|p| p.contains("disagree")), "{r:?}");
    let mut views = healthy();
    for v in &mut views {
        v.sentinel_master = Ok(None);
    }
    let r = assess(&views);
    assert_eq!(r.leader, None);
    assert!(
        r.problems
            .iter()
            .any(|p| p.contains("do not monitor the master group")),
        "{r:?}"
    );
    let mut views = healthy();
    for v in &mut views {
        v.sentinel_master = Ok(Some(("198.18.9.9".into(), 6379)));
    }
    let r = assess(&views);
    assert!(
        r.problems.iter().any(|p| p.contains("no member pod")),
        "{r:?}"
    );
    assert!(rules().healthy_for_start(&r).is_err());
}

#[test]
fn sentinel_and_info_must_agree_on_the_master() {
    // Sentinel still names redis-0, which already says role:slave (a FAILOVER behind
    // Sentinel's back): no leader, nothing stops.
    let mut views = healthy();
    views[0].replication = Ok(replica_of(1, 1000));
    views[1].replication = Ok(master_at(1000));
    let r = assess(&views);
    assert_eq!(r.leader, None, "{r:?}");
    assert!(
        r.problems.iter().any(|p| p.contains("reports role:slave")),
        "{r:?}"
    );
    assert!(matches!(
        rules().gate_before_stop(&r, "redis-2"),
        Gate::Wait(_)
    ));
    // two members saying master: split brain
    let mut views = healthy();
    views[2].replication = Ok(master_at(900));
    let r = assess(&views);
    assert!(
        r.problems
            .iter()
            .any(|p| p.contains("more than one member reports role:master")),
        "{r:?}"
    );
    assert!(!r.members[2].healthy);
}

#[test]
fn a_replica_of_another_member_or_resyncing_is_not_in_sync() {
    let mut views = healthy();
    views[2].replication = Ok(replica_of(1, 1000));
    views[1].replication = Ok(Replication {
        sync_in_progress: true,
        ..replica_of(0, 1000)
    });
    let r = assess(&views);
    let p2 = r.members[2].problem.clone().unwrap_or_default();
    assert!(
        p2.contains("replicates from 198.18.4.11, not from the master redis-0"),
        "{p2}"
    );
    let p1 = r.members[1].problem.clone().unwrap_or_default();
    assert!(p1.contains("full resynchronisation"), "{p1}");
}

#[test]
fn an_unreachable_or_terminating_member_is_unhealthy() {
    let mut views = healthy();
    views[1].replication = Err("connection refused".into());
    views[2].pod.terminating = true;
    let r = assess(&views);
    assert!(
        (r.members[1].problem.as_deref())
            .is_some_and(|p| p.contains("Redis does not answer at 198.18.4.11:6379")),
        "{r:?}"
    );
    assert_eq!(r.members[1].member_id, None);
    assert!(
        (r.members[2].problem.as_deref()).is_some_and(|p| p.contains("being deleted")),
        "{r:?}"
    );
    assert!(matches!(
        rules().gate_after_return(&r, "redis-1"),
        Gate::Wait(w) if w.contains("not healthy yet")
    ));
}

#[test]
fn the_handover_goes_to_a_migrated_caught_up_replica() {
    let mut views = healthy();
    views[0].replication = Ok(master_at(10_000_000));
    views[1].replication = Ok(replica_of(0, 9_999_000));
    views[2].replication = Ok(replica_of(0, 9_999_500));
    let r = assess(&views);
    assert_eq!(
        rules()
            .handover_target(&r, "redis-0", &names(&["redis-1", "redis-2"]))
            .as_deref(),
        Some("redis-2")
    );
    assert_eq!(
        rules()
            .handover_target(&r, "redis-0", &names(&["redis-1"]))
            .as_deref(),
        Some("redis-1")
    );
    // a migrated replica too far behind is passed over
    views[1].replication = Ok(replica_of(0, 1));
    let r = assess(&views);
    assert_eq!(
        rules()
            .handover_target(&r, "redis-0", &names(&["redis-1"]))
            .as_deref(),
        Some("redis-2")
    );
    assert!(
        rules()
            .handover()
            .is_some_and(|h| h.contains("Sentinel failover"))
    );
}

fn snap(pod: &str, offset: u64, keys: &[(&str, u64)]) -> Snapshot {
    Snapshot {
        pod: pod.into(),
        offset: Some(offset),
        keys: Some(keys.iter().map(|(d, n)| (d.to_string(), *n)).collect()),
    }
}

#[test]
fn the_final_check_wants_every_offset_and_key_count_at_a_quiet_moment() {
    let m = snap("redis-1", 500, &[("db0", 12)]);
    let ok = agreed_offsets(
        &m,
        &m,
        &[
            snap("redis-0", 500, &[("db0", 12)]),
            snap("redis-2", 500, &[("db0", 12)]),
        ],
    )
    .unwrap();
    assert_eq!(ok.hash, "offset 500, keys db0=12");
    assert_eq!(ok.members, ["redis-1", "redis-0", "redis-2"]);
    // written to during the check
    let moved = snap("redis-1", 520, &[("db0", 13)]);
    let e = agreed_offsets(&m, &moved, &[]).unwrap_err();
    assert!(e.contains("written to during the check"), "{e}");
    // a replica behind, another with other key counts, one that did not answer
    let e = agreed_offsets(
        &m,
        &m,
        &[
            snap("redis-0", 480, &[("db0", 11)]),
            snap("redis-2", 500, &[("db0", 11)]),
            Snapshot {
                pod: "redis-3".into(),
                offset: None,
                keys: None,
            },
        ],
    )
    .unwrap_err();
    assert!(
        e.contains("redis-0 is at offset 480, the master at 500"),
        "{e}"
    );
    assert!(
        e.contains("redis-2 has keys db0=11, the master db0=12"),
        "{e}"
    );
    assert!(e.contains("redis-3 reports no offset"), "{e}");
    let blind = Snapshot {
        pod: "redis-1".into(),
        offset: None,
        keys: None,
    };
    assert!(agreed_offsets(&blind, &blind, &[]).is_err());
}

#[test]
fn the_registry_gives_redis_sentinel_its_rules() {
    let spec = DatabaseSpec {
        engine: crate::api::DatabaseEngine::RedisSentinel,
        max_lag_bytes: Some(7),
        ..DatabaseSpec::default()
    };
    let r = super::super::rules(&spec);
    assert_eq!(
        r.final_check(),
        FinalCheckKind::Agreement {
            what: "replication offset and key counts"
        }
    );
    assert!(format!("{r:?}").contains("max_lag: 7"), "{r:?}");
    assert!(
        rules()
            .preflight(&Err(HealthUnavailable::Engine("no answer".into())))
            .is_err_and(|e| e.contains("cannot be read: no answer"))
    );
}

fn listed(ip: &str, priority: &str, flags: &str) -> BTreeMap<String, String> {
    [("ip", ip), ("slave-priority", priority), ("flags", flags)]
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

#[test]
fn the_handover_waits_until_the_sentinel_sees_the_steering() {
    let (target, other) = (pod(2), pod(1));
    let others = [other.clone()];
    let seen = [
        listed("198.18.4.11", "0", "slave"),
        listed("198.18.4.12", "100", "slave"),
    ];
    assert_eq!(steered(&seen, &target, &others), Ok(()));
    // the other replica's priority not read yet
    let stale = [
        listed("198.18.4.11", "100", "slave"),
        listed("198.18.4.12", "100", "slave"),
    ];
    let e = steered(&stale, &target, &others).unwrap_err();
    assert!(e.contains("replica-priority 0 on redis-1"), "{e}");
    // the target unknown, down, or itself at priority 0
    for bad in [
        vec![listed("198.18.4.11", "0", "slave")],
        vec![listed("198.18.4.12", "100", "s_down,slave,disconnected")],
        vec![listed("198.18.4.12", "0", "slave")],
    ] {
        let e = steered(&bad, &target, &others).unwrap_err();
        assert!(e.contains("redis-2 as a usable replica"), "{e}");
    }
    // a replica the Sentinel does not list cannot be chosen: no need to wait for it
    assert_eq!(
        steered(&[listed("198.18.4.12", "100", "slave")], &target, &others),
        Ok(())
    );
}

#[test]
fn sentinels_of_their_own_name_the_master_and_no_member_answers_for_them() {
    // Sentinels behind a Service, in pods of their own: a silent one is no member's problem.
    let members: Vec<MemberView> = (healthy().into_iter())
        .map(|v| MemberView {
            pod: v.pod,
            endpoint: v.endpoint,
            replication: v.replication,
        })
        .collect();
    let sentinel = |i: u32, master: Result<Option<(String, u16)>, String>| SentinelView {
        at: format!("198.18.7.{i}:26379"),
        member: None,
        master,
        quorum: Ok(CKQUORUM_OK.trim().to_string()),
    };
    let named = || Ok(Some(("198.18.4.10".to_string(), 6379)));
    let sentinels = vec![
        sentinel(1, named()),
        sentinel(2, named()),
        sentinel(3, Err("connection refused".into())),
    ];
    let r = super::assess(&members, &sentinels);
    assert_eq!(r.leader.as_deref(), Some("redis-0"), "{r:?}");
    assert!(r.members.iter().all(|m| m.healthy), "{r:?}");
    assert_eq!(rules().gate_before_stop(&r, "redis-1"), Gate::Open);
    let mut disagree = sentinels.clone();
    disagree[2].master = Ok(Some(("198.18.4.11".to_string(), 6379)));
    let r = super::assess(&members, &disagree);
    assert!(
        (r.problems.iter()).any(|p| p.contains("from the Sentinel at 198.18.7.3:26379")),
        "{r:?}"
    );
    let r = super::assess(&members, &[]);
    assert!(
        r.problems.iter().any(|p| p == "no Sentinel answers"),
        "{r:?}"
    );
}
