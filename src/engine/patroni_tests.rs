//! The Patroni rules and assessment on hand-built answers.

use super::*;

fn pod(i: u32) -> PodInfo {
    PodInfo {
        name: format!("pg-{i}"),
        ip: Some(format!("198.18.0.{}", 10 + i)),
        terminating: false,
    }
}

fn listed(i: u32, role: &str) -> ClusterMember {
    ClusterMember {
        name: format!("pg-{i}"),
        role: role.to_string(),
        state: if role == "leader" {
            "running"
        } else {
            "streaming"
        }
        .to_string(),
        host: Some(format!("198.18.0.{}", 10 + i)),
        timeline: Some(3),
    }
}

fn leader_status(replicas: &[(u32, &str)]) -> MemberStatus {
    MemberStatus {
        state: "running".into(),
        role: "master".into(),
        timeline: Some(3),
        xlog: Xlog {
            location: Some(50_000_000),
            ..Xlog::default()
        },
        replication: replicas
            .iter()
            .map(|(i, sync)| Replication {
                application_name: format!("pg-{i}"),
                state: "streaming".into(),
                sync_state: sync.to_string(),
            })
            .collect(),
        pause: false,
    }
}

fn replica_status(replayed: u64) -> MemberStatus {
    MemberStatus {
        state: "running".into(),
        role: "replica".into(),
        timeline: Some(3),
        xlog: Xlog {
            replayed_location: Some(replayed),
            received_location: Some(replayed),
            ..Xlog::default()
        },
        ..MemberStatus::default()
    }
}

fn view(i: u32, status: MemberStatus) -> MemberView {
    MemberView {
        pod: format!("pg-{i}"),
        endpoint: Some(format!("http://198.18.0.{}:8008", 10 + i)),
        status: Ok(status),
    }
}

/// pg-0 leads; pg-1 and pg-2 stream asynchronously, fully caught up.
fn healthy() -> (Vec<PodInfo>, Observed) {
    let pods = (0..3).map(pod).collect();
    let observed = Observed {
        cluster: Ok(ClusterView {
            members: vec![
                listed(0, "leader"),
                listed(1, "replica"),
                listed(2, "replica"),
            ],
            pause: false,
        }),
        config: Some(DynamicConfig::default()),
        views: vec![
            view(0, leader_status(&[(1, "async"), (2, "async")])),
            view(1, replica_status(50_000_000)),
            view(2, replica_status(50_000_000)),
        ],
    };
    (pods, observed)
}

fn names(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| s.to_string()).collect()
}

fn rules() -> PatroniRules {
    PatroniRules::default()
}

#[test]
fn a_healthy_cluster_maps_roles_positions_and_timelines() {
    let (pods, o) = healthy();
    let r = assess(&pods, &o);
    assert_eq!(r.problems, Vec::<String>::new());
    assert_eq!(r.leader.as_deref(), Some("pg-0"));
    assert!(r.members.iter().all(|m| m.healthy), "{:?}", r.members);
    assert_eq!(r.members[0].position, Some(50_000_000));
    assert_eq!(r.members[1].term, Some(3));
    assert_eq!(r.members[2].member_id.as_deref(), Some("pg-2"));
    assert_eq!(r.replicas_for_writes, 0);
    assert_eq!(rules().gate_before_stop(&r, "pg-1"), Gate::Open);
    assert_eq!(
        rules().gate_before_stop(&r, "pg-0"),
        Gate::TransferLeadershipFirst
    );
    assert_eq!(rules().gate_after_return(&r, "pg-2"), Gate::Open);
    assert_eq!(rules().healthy_for_start(&r), Ok(()));
    assert_eq!(rules().preflight(&Ok(r)), Ok(()));
}

#[test]
fn replicas_first_asynchronous_before_synchronous_the_leader_last() {
    let (pods, mut o) = healthy();
    if let Ok(c) = o.cluster.as_mut() {
        c.members[1].role = "sync_standby".into();
    }
    o.views[0] = view(0, leader_status(&[(1, "sync"), (2, "async")]));
    let r = assess(&pods, &o);
    assert!(r.members[1].synchronous && !r.members[2].synchronous);
    let all = names(&["pg-0", "pg-1", "pg-2"]);
    assert_eq!(rules().next_member(&r, &all).as_deref(), Some("pg-2"));
    assert_eq!(
        rules()
            .next_member(&r, &names(&["pg-0", "pg-1"]))
            .as_deref(),
        Some("pg-1")
    );
    assert_eq!(
        rules().next_member(&r, &names(&["pg-0"])).as_deref(),
        Some("pg-0")
    );
    // In synchronous mode the switchover goes to the synchronous standby, even unmigrated.
    assert_eq!(
        rules()
            .handover_target(&r, "pg-0", &names(&["pg-2"]))
            .as_deref(),
        Some("pg-1")
    );
}

#[test]
fn a_lagging_replica_closes_the_gate_and_names_itself() {
    let (pods, mut o) = healthy();
    o.views[2] = view(2, replica_status(40_000_000));
    let r = assess(&pods, &o);
    let Gate::Wait(why) = rules().gate_before_stop(&r, "pg-1") else {
        panic!("a replica 10 MB behind must close the gate");
    };
    assert!(
        why.contains("pg-2 is 10000000 bytes of WAL behind the leader pg-0"),
        "{why}"
    );
    assert!(matches!(rules().gate_after_return(&r, "pg-2"), Gate::Wait(w) if w.contains("pg-2")));
    // within maxLagBytes
    let lenient = PatroniRules {
        max_lag: 20_000_000,
    };
    assert_eq!(lenient.gate_before_stop(&r, "pg-1"), Gate::Open);
    // the lagging one is not a switchover candidate
    assert_eq!(
        rules().handover_target(&r, "pg-0", &[]).as_deref(),
        Some("pg-1")
    );
}

#[test]
fn a_replica_that_does_not_stream_is_unhealthy() {
    let (pods, mut o) = healthy();
    o.views[0] = view(0, leader_status(&[(1, "async")]));
    let r = assess(&pods, &o);
    assert!(!r.members[2].healthy);
    let Gate::Wait(why) = rules().gate_before_stop(&r, "pg-1") else {
        panic!("a replica not streaming must close the gate");
    };
    assert!(
        why.contains("pg-2: does not stream from the leader"),
        "{why}"
    );
    let denied = rules().preflight(&Ok(r)).unwrap_err();
    assert!(denied.contains("pg-2"), "{denied}");
}

#[test]
fn a_replica_on_another_timeline_is_unhealthy() {
    let (pods, mut o) = healthy();
    let mut s = replica_status(50_000_000);
    s.timeline = Some(2);
    o.views[1] = view(1, s);
    let r = assess(&pods, &o);
    assert_eq!(
        r.members[1].problem.as_deref(),
        Some("is on timeline 2, the leader on 3")
    );
}

#[test]
fn strict_synchronous_mode_keeps_a_replica_for_writes() {
    let (mut pods, mut o) = healthy();
    o.config = Some(DynamicConfig {
        synchronous_mode: true,
        synchronous_mode_strict: true,
        ..DynamicConfig::default()
    });
    // Two members: stopping the only replica would stop the writes.
    pods.truncate(2);
    o.views.truncate(2);
    if let Ok(c) = o.cluster.as_mut() {
        c.members.truncate(2);
        c.members[1].role = "sync_standby".into();
    }
    o.views[0] = view(0, leader_status(&[(1, "sync")]));
    let r = assess(&pods, &o);
    assert_eq!(r.replicas_for_writes, 1);
    let Gate::Wait(why) = rules().gate_before_stop(&r, "pg-1") else {
        panic!("the only synchronous standby in strict mode must not stop");
    };
    assert!(why.contains("synchronous_mode_strict needs 1"), "{why}");
    // With a third member streaming, the standby may stop.
    let (pods, mut o) = healthy();
    o.config = Some(DynamicConfig {
        synchronous_mode: true,
        synchronous_mode_strict: true,
        ..DynamicConfig::default()
    });
    let r = assess(&pods, &o);
    assert_eq!(rules().gate_before_stop(&r, "pg-1"), Gate::Open);
}

#[test]
fn paused_standby_and_leaderless_clusters_are_denied() {
    let (pods, mut o) = healthy();
    if let Ok(c) = o.cluster.as_mut() {
        c.pause = true;
    }
    let denied = rules().preflight(&Ok(assess(&pods, &o))).unwrap_err();
    assert!(denied.contains("paused (maintenance mode)"), "{denied}");

    let (pods, mut o) = healthy();
    if let Ok(c) = o.cluster.as_mut() {
        c.members[0].role = "standby_leader".into();
    }
    let denied = rules().preflight(&Ok(assess(&pods, &o))).unwrap_err();
    assert!(denied.contains("standby cluster"), "{denied}");

    let (pods, mut o) = healthy();
    if let Ok(c) = o.cluster.as_mut() {
        c.members[0].role = "replica".into();
    }
    let r = assess(&pods, &o);
    assert_eq!(r.leader, None);
    let denied = rules().preflight(&Ok(r.clone())).unwrap_err();
    assert!(denied.contains("no leader"), "{denied}");
    assert!(
        matches!(rules().gate_before_stop(&r, "pg-1"), Gate::Wait(w) if w.contains("no leader"))
    );

    let unreadable = Err(HealthUnavailable::Engine("connection refused".into()));
    assert_eq!(
        rules().preflight(&unreadable).unwrap_err(),
        "Patroni's REST API cannot be read: connection refused"
    );
}

#[test]
fn a_member_whose_api_does_not_answer_is_named() {
    let (pods, mut o) = healthy();
    o.views[2].status = Err("connection refused".into());
    let r = assess(&pods, &o);
    assert_eq!(
        r.members[2].problem.as_deref(),
        Some("Patroni's API does not answer at http://198.18.0.12:8008: connection refused")
    );
    // No member answered /cluster at all.
    let (pods, mut o) = healthy();
    o.cluster = Err("no member's API answered".into());
    let r = assess(&pods, &o);
    assert!(
        r.problems[0].contains("/cluster cannot be read"),
        "{:?}",
        r.problems
    );
    assert!(r.members.iter().all(|m| !m.healthy));
}

#[test]
fn members_map_by_name_else_by_host() {
    let (mut pods, o) = healthy();
    pods[1].name = "other-name".into();
    let r = assess(&pods, &o);
    // pg-1 is found by its IP
    let m = r.members.iter().find(|m| m.pod == "other-name").unwrap();
    assert_eq!(m.member_id.as_deref(), Some("pg-1"));
    assert!(r.problems.is_empty(), "{:?}", r.problems);
}

#[test]
fn the_final_check_needs_every_replica_at_the_leaders_position() {
    let ok = agreed_replay(
        ("pg-0", 3, 0x3000060),
        &[
            ("pg-1".into(), Some(3), Some(0x3000060)),
            ("pg-2".into(), Some(3), Some(0x3000100)),
        ],
    )
    .unwrap();
    assert_eq!(ok.hash, "timeline 3, WAL 0/3000060");
    assert_eq!(ok.members, names(&["pg-0", "pg-1", "pg-2"]));
    let behind = agreed_replay(
        ("pg-0", 3, 0x3000060),
        &[
            ("pg-1".into(), Some(3), Some(0x3000000)),
            ("pg-2".into(), Some(2), Some(0x3000100)),
        ],
    )
    .unwrap_err();
    assert!(
        behind.contains("pg-1 has replayed 0/3000000 of 0/3000060"),
        "{behind}"
    );
    assert!(
        behind.contains("pg-2 is on timeline 2, the leader on 3"),
        "{behind}"
    );
    assert_eq!(lsn(0x1_0000_0010), "1/10");
}

#[test]
fn the_port_comes_from_the_pod_when_the_request_names_none() {
    use k8s_openapi::api::core::v1::{Container, ContainerPort, EnvVar, PodSpec};
    let mut p = Pod {
        spec: Some(PodSpec {
            containers: vec![Container {
                name: "patroni".into(),
                ..Container::default()
            }],
            ..PodSpec::default()
        }),
        ..Pod::default()
    };
    assert_eq!(api_port(&p), 8008);
    let c = &mut p.spec.as_mut().unwrap().containers[0];
    c.env = Some(vec![EnvVar {
        name: "PATRONI_RESTAPI_LISTEN".into(),
        value: Some("0.0.0.0:8009".into()),
        ..EnvVar::default()
    }]);
    assert_eq!(api_port(&p), 8009);
    let c = &mut p.spec.as_mut().unwrap().containers[0];
    c.ports = Some(vec![ContainerPort {
        name: Some("restapi".into()),
        container_port: 8010,
        ..ContainerPort::default()
    }]);
    assert_eq!(api_port(&p), 8010);
}

#[test]
fn the_registry_gives_each_engine_its_rules() {
    let mut spec = DatabaseSpec::default();
    assert_eq!(
        super::super::rules(&spec).final_check(),
        FinalCheckKind::CopiesVerified
    );
    spec.engine = crate::api::DatabaseEngine::Patroni;
    spec.max_lag_bytes = Some(5);
    let r = super::super::rules(&spec);
    assert_eq!(
        r.final_check(),
        FinalCheckKind::Agreement {
            what: "replayed WAL position"
        }
    );
    assert!(format!("{r:?}").contains("max_lag: 5"), "{r:?}");
}

/// Patroni 3.0.2's own answers (`testdata/patroni/README.md`), assessed.
mod recorded {
    use super::*;

    fn json<T: serde::de::DeserializeOwned>(text: &str) -> T {
        serde_json::from_str(text).unwrap()
    }

    fn pods() -> Vec<PodInfo> {
        (0..3)
            .map(|i| PodInfo {
                name: format!("patroni-{i}"),
                ip: Some(format!("198.18.3.{}", 3 + i)),
                terminating: false,
            })
            .collect()
    }

    fn views(statuses: [&str; 3]) -> Vec<MemberView> {
        (0..3)
            .map(|i| MemberView {
                pod: format!("patroni-{i}"),
                endpoint: Some(format!("http://198.18.3.{}:8008", 3 + i)),
                status: Ok(json(statuses[i])),
            })
            .collect()
    }

    const LEADER: &str = include_str!("testdata/patroni/patroni-leader.json");
    const REPLICA: &str = include_str!("testdata/patroni/patroni-replica.json");

    #[test]
    fn a_healthy_asynchronous_cluster() {
        let o = Observed {
            cluster: Ok(json(include_str!("testdata/patroni/cluster-async.json"))),
            config: Some(json(include_str!("testdata/patroni/config.json"))),
            views: views([LEADER, REPLICA, REPLICA]),
        };
        let r = assess(&pods(), &o);
        assert_eq!(r.problems, Vec::<String>::new());
        assert_eq!(r.leader.as_deref(), Some("patroni-0"));
        assert!(r.members.iter().all(|m| m.healthy), "{:?}", r.members);
        assert_eq!(r.members[0].position, Some(67_108_960));
        assert_eq!(r.members[1].position, Some(67_108_960));
        assert!(r.members.iter().all(|m| !m.synchronous));
        assert_eq!(rules().gate_before_stop(&r, "patroni-1"), Gate::Open);
        assert_eq!(
            rules().gate_before_stop(&r, "patroni-0"),
            Gate::TransferLeadershipFirst
        );
    }

    #[test]
    fn a_synchronous_cluster_names_its_standby() {
        let o = Observed {
            cluster: Ok(json(include_str!("testdata/patroni/cluster-sync.json"))),
            config: Some(json(include_str!("testdata/patroni/config-sync.json"))),
            views: views([
                REPLICA,
                include_str!("testdata/patroni/patroni-leader-sync.json"),
                include_str!("testdata/patroni/patroni-sync-standby.json"),
            ]),
        };
        let r = assess(&pods(), &o);
        assert_eq!(r.leader.as_deref(), Some("patroni-1"));
        let sync: Vec<&str> = (r.members.iter())
            .filter(|m| m.synchronous)
            .map(|m| m.pod.as_str())
            .collect();
        assert_eq!(sync, ["patroni-2"]);
        let all = names(&["patroni-0", "patroni-1", "patroni-2"]);
        assert_eq!(rules().next_member(&r, &all).as_deref(), Some("patroni-0"));
    }

    #[test]
    fn a_paused_cluster_is_refused() {
        let o = Observed {
            cluster: Ok(json(include_str!("testdata/patroni/cluster-paused.json"))),
            config: None,
            views: views([
                include_str!("testdata/patroni/patroni-leader-paused.json"),
                REPLICA,
                REPLICA,
            ]),
        };
        let r = assess(&pods(), &o);
        let denied = rules().preflight(&Ok(r)).unwrap_err();
        assert!(denied.contains("paused"), "{denied}");
    }
}
