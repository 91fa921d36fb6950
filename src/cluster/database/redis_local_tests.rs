//! The client against real Redis and Sentinel processes on loopback addresses (127.0.0.11-13,
//! each with Redis on 6379 and a Sentinel on 26379, as three member pods would have them). Needs
//! `redis-server` and `redis-sentinel` on PATH (Debian's `redis-server`, `redis-sentinel`):
//! `cargo test --lib -- --ignored redis_local`.

use std::process::{Child, Command, Stdio};

use k8s_openapi::api::core::v1::{Pod, PodStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use super::*;

const IPS: [&str; 3] = ["127.0.0.11", "127.0.0.12", "127.0.0.13"];

/// The processes, killed on drop (then their directory removed).
struct Group {
    children: Vec<Child>,
    _dir: tempfile::TempDir,
}

impl Drop for Group {
    fn drop(&mut self) {
        for c in &mut self.children {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

fn start() -> Group {
    let dir = tempfile::tempdir().unwrap();
    let mut children = Vec::new();
    for (i, ip) in IPS.iter().enumerate() {
        let data = dir.path().join(format!("r{i}"));
        std::fs::create_dir_all(&data).unwrap();
        let mut args = vec![
            "--bind".to_string(),
            ip.to_string(),
            "--port".into(),
            "6379".into(),
            "--dir".into(),
            data.display().to_string(),
            "--save".into(),
            "".into(),
            // Loopback connections come from 127.0.0.1: say who we are.
            "--replica-announce-ip".into(),
            ip.to_string(),
        ];
        if i > 0 {
            args.extend(["--replicaof".into(), IPS[0].into(), "6379".into()]);
        }
        children.push(spawn("redis-server", &args));
    }
    for (i, ip) in IPS.iter().enumerate() {
        let conf = dir.path().join(format!("s{i}.conf"));
        std::fs::write(
            &conf,
            format!(
                "bind {ip}\nport 26379\nsentinel announce-ip {ip}\nsentinel monitor mymaster {} 6379 2\n\
                 sentinel down-after-milliseconds mymaster 5000\n\
                 sentinel failover-timeout mymaster 20000\n",
                IPS[0]
            ),
        )
        .unwrap();
        children.push(spawn("redis-sentinel", &[conf.display().to_string()]));
    }
    Group {
        children,
        _dir: dir,
    }
}

fn spawn(bin: &str, args: &[String]) -> Child {
    Command::new(bin)
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap_or_else(|e| panic!("{bin}: {e}"))
}

fn pods() -> Vec<Pod> {
    IPS.iter()
        .enumerate()
        .map(|(i, ip)| Pod {
            metadata: ObjectMeta {
                name: Some(format!("redis-{i}")),
                ..ObjectMeta::default()
            },
            status: Some(PodStatus {
                pod_ip: Some(ip.to_string()),
                ..PodStatus::default()
            }),
            ..Pod::default()
        })
        .collect()
}

fn client() -> RedisClient {
    RedisClient {
        sentinels: Sentinels::InMemberPods,
        master_name: "mymaster".into(),
        redis_port: 6379,
        sentinel_port: 26379,
        password: None,
        sentinel_password: None,
        handover_timeout: Duration::from_secs(20),
    }
}

/// Observes until every member is healthy (Sentinels discover each other in a few seconds).
async fn healthy(c: &RedisClient) -> HealthReport {
    let deadline = Instant::now() + Duration::from_secs(40);
    loop {
        let r = c.observe(&pods()).await.unwrap();
        if r.problems.is_empty() && r.members.iter().all(|m| m.healthy) && r.leader.is_some() {
            return r;
        }
        assert!(Instant::now() < deadline, "never healthy: {r:#?}");
        sleep(Duration::from_millis(500)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs redis-server and redis-sentinel on PATH"]
async fn redis_local_observe_hand_over_and_final_check() {
    let _group = start();
    let c = client();
    let before = healthy(&c).await;
    assert_eq!(before.leader.as_deref(), Some("redis-0"));
    // Writes every 5 ms on whoever Sentinel names, each acknowledged one recorded.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let writer = tokio::spawn(write(stop.clone()));
    sleep(Duration::from_millis(500)).await;
    let rules = crate::engine::redis::RedisRules::default();
    use crate::engine::Rules;
    assert_eq!(
        rules.gate_before_stop(&before, "redis-0"),
        crate::engine::Gate::TransferLeadershipFirst
    );
    let target = rules
        .handover_target(&before, "redis-0", &["redis-2".to_string()])
        .unwrap();
    assert_eq!(target, "redis-2");
    c.hand_over(&before, "redis-0", "redis-2").await.unwrap();
    let after = healthy(&c).await;
    assert_eq!(after.leader.as_deref(), Some("redis-2"), "{after:#?}");
    sleep(Duration::from_millis(500)).await;
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    let (acked, refused, gap) = writer.await.unwrap();
    assert!(acked.len() > 50, "{} acknowledged", acked.len());
    // Every acknowledged write is on every member.
    for ip in IPS {
        let mut con = c.redis(ip).await.unwrap();
        let keys: Vec<String> = run(&mut con, ::redis::cmd("KEYS").arg("w:*"))
            .await
            .unwrap();
        let missing: Vec<&u64> = acked
            .iter()
            .filter(|n| !keys.contains(&format!("w:{n}")))
            .collect();
        assert!(missing.is_empty(), "{ip} lost {missing:?}");
    }
    // The other replicas' priority is back.
    let mut con = c.redis(IPS[1]).await.unwrap();
    let p: Vec<String> = run(
        &mut con,
        ::redis::cmd("CONFIG").arg("GET").arg("replica-priority"),
    )
    .await
    .unwrap();
    assert_eq!(p[1], "100");
    // A quiet moment: the final check agrees.
    let h = c.final_hash(&pods()).await.unwrap();
    assert!(h.hash.starts_with("offset "), "{h:?}");
    assert_eq!(h.members.len(), 3);
    println!(
        "NOTE redis-local: {} acknowledged, {refused} refused, longest gap between \
         acknowledged writes {} ms; final {}",
        acked.len(),
        gap.as_millis(),
        h.hash
    );
    // A handover Sentinel refuses (a group it does not monitor): an error, and the master
    // takes writes again at once (its pause lifted).
    let report = healthy(&c).await;
    let wrong = RedisClient {
        master_name: "nosuch".into(),
        ..client()
    };
    let e = wrong.hand_over(&report, "redis-2", "redis-0").await;
    assert!(
        matches!(&e, Err(EngineError::LeaderTransfer { message, .. }) if message.contains("does not monitor nosuch")),
        "{e:?}"
    );
    let mut m = c.redis(IPS[2]).await.unwrap();
    run::<()>(&mut m, ::redis::cmd("SET").arg("after").arg("1"))
        .await
        .unwrap();
    assert_eq!(healthy(&c).await.leader.as_deref(), Some("redis-2"));
}

async fn write(stop: std::sync::Arc<std::sync::atomic::AtomicBool>) -> (Vec<u64>, u64, Duration) {
    let c = client();
    let mut acked = Vec::new();
    let mut refused = 0;
    let mut n = 0u64;
    let (mut last, mut gap) = (Instant::now(), Duration::ZERO);
    while !stop.load(std::sync::atomic::Ordering::SeqCst) {
        sleep(Duration::from_millis(5)).await;
        let Ok(mut s) = c.sentinel(IPS[1], 26379).await else {
            continue;
        };
        let Ok(Some((host, _))) = c.master_addr(&mut s).await else {
            continue;
        };
        let Ok(mut con) = c.redis(&host).await else {
            continue;
        };
        n += 1;
        match run::<()>(&mut con, ::redis::cmd("SET").arg(format!("w:{n}")).arg(n)).await {
            Ok(()) => {
                acked.push(n);
                gap = gap.max(last.elapsed());
                last = Instant::now();
            }
            Err(_) => refused += 1,
        }
    }
    (acked, refused, gap)
}
