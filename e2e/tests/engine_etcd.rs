//! The operator's etcd engine (the client `storage_migrator::cluster::database::Engine` and the
//! pure gates of `storage_migrator::engine`) against real etcd members.
//!
//! Needs a cluster in `KUBECONFIG` whose pod IPs the test process can reach (the local cluster
//! from `localcluster up`). Each test creates its own namespace, applies the etcd fixture where
//! it needs one, waits for 3/3 Ready and deletes the namespace at the end.
//! `etcd_engine_with_tls_and_auth` also starts a single etcd on the host (`/usr/bin/etcd`, on
//! 127.0.0.1) and makes certificates with `openssl`: both come with `e2e/scripts/install-deps.sh`.
//!
//! Run: `KUBECONFIG=DIR/kubeconfig cargo test -p e2e --all-features --test engine_etcd --
//! --test-threads=2`
//!
//! Checks: every member observed through its own endpoint, 3 voting members, one leader; the
//! gates and the order (followers first, leader last); a leadership transfer to a follower that
//! every member confirms and that raises the term by exactly one; `hash_kv` agreement; a stopped
//! member named in the report and closing the gates; an unanswering endpoint costing a bounded
//! time; TLS client certificates and password auth read from Secrets, a wrong password reported
//! on the member, a missing Secret as `EngineError::Secret`.

use std::collections::BTreeSet;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use e2e::testing::{ETCD_READY, TestCluster, TestNamespace, scenario};
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use storage_migrator::api::{DatabaseEngine, DatabaseSpec, EtcdSpec};
use storage_migrator::cluster::database::{Engine, EngineError};
use storage_migrator::engine::etcd::EtcdRules;
use storage_migrator::engine::{Gate, HealthReport, Rules};

const NAMESPACE_GONE: Duration = Duration::from_secs(120);

/// The set's member pods (not terminating).
async fn pods(ns: &TestNamespace) -> Vec<Pod> {
    ns.api::<Pod>()
        .list(&ListParams::default().labels("app=etcd"))
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .collect()
}

fn term(report: &HealthReport) -> u64 {
    report.members.iter().filter_map(|m| m.term).max().unwrap()
}

/// Polls `f` every 500 ms until it is true, at most `secs` seconds.
async fn eventually<F, Fut>(secs: u64, what: &str, mut f: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + Duration::from_secs(secs);
    while !f().await {
        assert!(Instant::now() < deadline, "timed out: {what}");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// Observes until the report is clean (3 healthy members agreeing on one leader): a cluster
/// that has just reached 3/3 Ready may still be settling its first election.
async fn settled(engine: &Engine, pods: &[Pod]) -> HealthReport {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let report = engine.observe(pods).await.unwrap();
        if report.problems.is_empty()
            && report.leader.is_some()
            && report.members.iter().all(|m| m.healthy)
        {
            return report;
        }
        assert!(
            Instant::now() < deadline,
            "the fresh etcd cluster does not settle within 60 s: {report:#?}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_engine_against_a_real_cluster() {
    let (cluster, ns) = scenario("engine-etcd").await;
    ns.apply_etcd().await.unwrap();
    let spec = DatabaseSpec {
        engine: DatabaseEngine::Etcd,
        generic: None,
        etcd: Some(EtcdSpec::default()),
        ..DatabaseSpec::default()
    };
    let engine = Engine::from_spec(&cluster.client, &ns.name, &spec)
        .await
        .unwrap();
    let pods = pods(&ns).await;
    assert_eq!(pods.len(), 3, "the fixture has 3 members");
    settled(&engine, &pods).await;

    let started = Instant::now();
    let report = engine.observe(&pods).await.unwrap();
    println!("observe took {:?}:\n{report:#?}", started.elapsed());
    assert_eq!(report.problems, Vec::<String>::new());
    assert_eq!(report.voting_members, Some(3));
    assert!(report.members.iter().all(|m| m.healthy));
    assert_eq!(EtcdRules::default().healthy_for_start(&report), Ok(()));
    // Each member was asked at its own endpoint (its pod IP) and answered as itself.
    for m in &report.members {
        let pod = pods.iter().find(|p| p.name_any() == m.pod).unwrap();
        let ip = pod.status.as_ref().unwrap().pod_ip.clone().unwrap();
        assert_eq!(
            m.endpoint.as_deref(),
            Some(format!("http://{ip}:2379").as_str()),
            "{m:?}"
        );
    }
    let ids: BTreeSet<_> = report.members.iter().map(|m| &m.member_id).collect();
    assert_eq!(ids.len(), 3, "three distinct members: {report:#?}");
    let leader = report.leader.clone().expect("a leader");
    let names: Vec<String> = report.members.iter().map(|m| m.pod.clone()).collect();
    assert_eq!(names, ["etcd-0", "etcd-1", "etcd-2"]);

    // Order: followers first, leader last.
    let first = EtcdRules::default().next_member(&report, &names).unwrap();
    assert_ne!(first, leader);
    assert_eq!(
        EtcdRules::default()
            .next_member(&report, std::slice::from_ref(&leader))
            .as_deref(),
        Some(leader.as_str())
    );
    // Gates: a follower may stop, the leader must hand over first.
    assert_eq!(
        EtcdRules::default().gate_before_stop(&report, &first),
        Gate::Open
    );
    assert_eq!(
        EtcdRules::default().gate_before_stop(&report, &leader),
        Gate::TransferLeadershipFirst
    );
    assert_eq!(
        EtcdRules::default().gate_after_return(&report, &first),
        Gate::Open
    );

    // Transfer to a follower, preferring one "already migrated".
    let migrated = vec![first.clone()];
    let to = EtcdRules::default()
        .handover_target(&report, &leader, &migrated)
        .unwrap();
    assert_eq!(to, first);
    let term_before = term(&report);
    let started = Instant::now();
    engine
        .transfer_leadership(&report, &leader, &to)
        .await
        .unwrap();
    println!(
        "NOTE transfer {leader} -> {to} took {:?} (confirmed by every member)",
        started.elapsed()
    );
    let after = engine.observe(&pods).await.unwrap();
    assert_eq!(after.leader.as_deref(), Some(to.as_str()));
    assert_eq!(after.problems, Vec::<String>::new());
    assert_eq!(
        term(&after),
        term_before + 1,
        "one handover, one term: no election timeout"
    );
    // The old leader is now a follower and may stop.
    assert_eq!(
        EtcdRules::default().gate_before_stop(&after, &leader),
        Gate::Open
    );
    // Idempotent: repeating the transfer with the stale report is Ok at once.
    let stale = engine.transfer_leadership(&report, &leader, &to).await;
    assert!(stale.is_ok(), "to already leads: Ok ({stale:?})");

    // hash_kv agrees.
    let hash = engine.final_hash(&pods).await.unwrap().unwrap();
    println!("final hash {} over {:?}", hash.hash, hash.members);
    assert!(hash.hash.contains('@'));
    // It covers every member pod: the final check passes only when each planned member agrees.
    let names: Vec<String> = pods.iter().map(kube::ResourceExt::name_any).collect();
    let planned: Vec<&str> = names.iter().map(String::as_str).collect();
    assert!(
        hash.missing(planned).is_empty(),
        "{:?} of {names:?}",
        hash.members
    );

    ns.delete_and_wait(NAMESPACE_GONE).await.unwrap();
}

/// An address of `ip`'s /24 that no pod of the cluster has, to stand for a member whose
/// endpoint does not answer. The local cluster hands pod IPs out round-robin (.2 to .254), so
/// the free address just below the newest pod's is the one reused last.
async fn unused_pod_address(cluster: &TestCluster, ip: &str) -> String {
    let ip: Ipv4Addr = ip.parse().unwrap();
    let net = |a: Ipv4Addr| [a.octets()[0], a.octets()[1], a.octets()[2]];
    let all = Api::<Pod>::all(cluster.client.clone())
        .list(&ListParams::default())
        .await
        .unwrap()
        .items;
    let mut used = BTreeSet::new();
    let mut newest: Option<(String, u8)> = None;
    for p in &all {
        let Some(a) = p
            .status
            .as_ref()
            .and_then(|s| s.pod_ip.as_deref())
            .and_then(|s| s.parse::<Ipv4Addr>().ok())
        else {
            continue;
        };
        if net(a) != net(ip) {
            continue;
        }
        let host = a.octets()[3];
        used.insert(host);
        let created = p
            .metadata
            .creation_timestamp
            .as_ref()
            .map(|t| t.0.to_string())
            .unwrap_or_default();
        if newest.as_ref().is_none_or(|(c, _)| created > *c) {
            newest = Some((created, host));
        }
    }
    let start = i32::from(newest.map_or(254, |(_, h)| h));
    let host = (1..=253)
        .filter_map(|i| u8::try_from(2 + (start - 2 - i).rem_euclid(253)).ok())
        .find(|h| !used.contains(h))
        .expect("a free address in the pod's /24");
    let [a, b, c] = net(ip);
    Ipv4Addr::new(a, b, c, host).to_string()
}

/// A stopped member (StatefulSet orphan-deleted, one pod deleted) is named by `IfReady` and
/// closes the gates; an endpoint that does not answer costs a bounded time; after the member
/// returns, the after-gate opens.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_engine_with_a_stopped_member() {
    let (cluster, ns) = scenario("engine-etcd-stopped").await;
    ns.apply_etcd().await.unwrap();
    let spec = DatabaseSpec {
        engine: DatabaseEngine::Etcd,
        generic: None,
        etcd: None,
        ..DatabaseSpec::default()
    };
    let engine = Engine::from_spec(&cluster.client, &ns.name, &spec)
        .await
        .unwrap();
    settled(&engine, &pods(&ns).await).await;
    let sets: Api<StatefulSet> = ns.api();
    let pod_api: Api<Pod> = ns.api();
    let stash = sets.get("etcd").await.unwrap();
    sets.delete("etcd", &DeleteParams::orphan()).await.unwrap();
    ns.wait_deleted(sets.clone(), "etcd", &stash.uid().unwrap(), ETCD_READY)
        .await
        .unwrap();
    let gone = pod_api.get("etcd-2").await.unwrap();
    pod_api
        .delete("etcd-2", &DeleteParams::default())
        .await
        .unwrap();
    ns.wait_deleted(pod_api.clone(), "etcd-2", &gone.uid().unwrap(), ETCD_READY)
        .await
        .unwrap();

    let two = pods(&ns).await;
    assert_eq!(two.len(), 2);
    let report = engine.observe(&two).await.unwrap();
    println!("with etcd-2 stopped: {:?}", report.problems);
    assert_eq!(report.voting_members, Some(3));
    let err = EtcdRules::default().healthy_for_start(&report).unwrap_err();
    assert!(err.contains("etcd-2"), "{err}");
    let follower = report
        .members
        .iter()
        .find(|m| !m.leader)
        .unwrap()
        .pod
        .clone();
    assert!(matches!(
        EtcdRules::default().gate_before_stop(&report, &follower),
        Gate::Wait(w) if w.contains("etcd-2")
    ));

    // A member pod whose endpoint does not answer (an unused address of the pod range).
    let mut ghost = two[0].clone();
    ghost.metadata.name = Some("etcd-2".to_string());
    let ip = ghost
        .status
        .as_ref()
        .and_then(|s| s.pod_ip.clone())
        .unwrap();
    let unused = unused_pod_address(&cluster, &ip).await;
    println!("unanswering endpoint at {unused}");
    ghost.status.as_mut().unwrap().pod_ip = Some(unused);
    let mut with_ghost = two.clone();
    with_ghost.push(ghost);
    let started = Instant::now();
    let report = engine.observe(&with_ghost).await.unwrap();
    let took = started.elapsed();
    let g = report.members.iter().find(|m| m.pod == "etcd-2").unwrap();
    println!("NOTE unanswering endpoint: {:?} after {took:?}", g.problem);
    assert!(!g.healthy);
    assert!(took < Duration::from_secs(8), "bounded: {took:?}");

    // Bring the member back: recreate the set from the stash (it recreates etcd-2 on its claim).
    let mut again = stash.clone();
    again.metadata = kube::api::ObjectMeta {
        name: stash.metadata.name.clone(),
        labels: stash.metadata.labels.clone(),
        ..Default::default()
    };
    again.status = None;
    sets.create(&PostParams::default(), &again).await.unwrap();
    let started = Instant::now();
    eventually(120, "etcd-2 back and caught up", || async {
        let all = pods(&ns).await;
        if all.len() != 3 {
            return false;
        }
        let r = engine.observe(&all).await.unwrap();
        EtcdRules::default().gate_after_return(&r, "etcd-2") == Gate::Open
            && EtcdRules::default().healthy_for_start(&r).is_ok()
    })
    .await;
    println!(
        "NOTE etcd-2 back and caught up {:?} after the set was recreated",
        started.elapsed()
    );

    ns.delete_and_wait(NAMESPACE_GONE).await.unwrap();
}

/// Runs `openssl` with the given arguments in `dir`.
fn openssl(dir: &Path, args: &[&str]) {
    let out = std::process::Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .output()
        .unwrap_or_else(|e| {
            panic!("cannot run openssl ({e}): install it with e2e/scripts/install-deps.sh")
        });
    assert!(
        out.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Kills the etcd this test started (by PID) when dropped.
struct Child(std::process::Child);

impl Drop for Child {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A scratch directory of the test, removed when dropped (also when the test panics).
struct ScratchDir(PathBuf);

impl Drop for ScratchDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// TLS (client certificates, server certificate naming the pod's DNS name only) and password
/// auth, read from Secrets by `Engine::from_spec`, against a single etcd started by the test on
/// 127.0.0.1 and presented as a pod `etcd-0` (subdomain `etcd`) with that IP. The cluster only
/// holds the Secrets (in the test's namespace).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_engine_with_tls_and_auth() {
    use k8s_openapi::ByteString;
    use k8s_openapi::api::core::v1::{PodCondition, PodSpec, PodStatus, Secret};
    use kube::api::ObjectMeta;

    const ETCD: &str = "/usr/bin/etcd";
    assert!(
        Path::new(ETCD).exists(),
        "{ETCD} missing: install it with e2e/scripts/install-deps.sh"
    );
    let (cluster, ns) = scenario("engine-etcd-tls").await;
    let client = cluster.client.clone();
    let scratch = ScratchDir(std::env::temp_dir().join(format!("sm-engine-tls-{}", ns.name)));
    let dir = scratch.0.clone();
    std::fs::create_dir_all(&dir).unwrap();
    let dns = format!("etcd-0.etcd.{}.svc.cluster.local", ns.name);
    openssl(
        &dir,
        &[
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            "ca.key",
            "-out",
            "ca.crt",
            "-days",
            "1",
            "-subj",
            "/CN=test-ca",
        ],
    );
    std::fs::write(
        dir.join("server.ext"),
        format!("subjectAltName=DNS:{dns}\n"),
    )
    .unwrap();
    std::fs::write(dir.join("client.ext"), "extendedKeyUsage=clientAuth\n").unwrap();
    for (name, cn) in [("server", "etcd-0"), ("client", "storage-migrator")] {
        openssl(
            &dir,
            &[
                "req",
                "-newkey",
                "rsa:2048",
                "-nodes",
                "-keyout",
                &format!("{name}.key"),
                "-out",
                &format!("{name}.csr"),
                "-subj",
                &format!("/CN={cn}"),
            ],
        );
        openssl(
            &dir,
            &[
                "x509",
                "-req",
                "-in",
                &format!("{name}.csr"),
                "-CA",
                "ca.crt",
                "-CAkey",
                "ca.key",
                "-CAcreateserial",
                "-out",
                &format!("{name}.crt"),
                "-days",
                "1",
                "-extfile",
                &format!("{name}.ext"),
            ],
        );
    }
    let (client_port, peer_port) = (free_port(), free_port());
    let path = |f: &str| dir.join(f).to_string_lossy().into_owned();
    let etcd = Child(
        std::process::Command::new(ETCD)
            // etcd reads every ETCD_* variable as a flag: start it with a clean environment.
            .env_clear()
            .env("PATH", "/usr/bin:/bin")
            .args([
                "--name=etcd-0".to_string(),
                format!("--data-dir={}", path("data")),
                format!("--listen-client-urls=https://127.0.0.1:{client_port}"),
                format!("--advertise-client-urls=https://127.0.0.1:{client_port}"),
                format!("--listen-peer-urls=http://127.0.0.1:{peer_port}"),
                format!("--initial-advertise-peer-urls=http://127.0.0.1:{peer_port}"),
                format!("--initial-cluster=etcd-0=http://127.0.0.1:{peer_port}"),
                format!("--cert-file={}", path("server.crt")),
                format!("--key-file={}", path("server.key")),
                format!("--trusted-ca-file={}", path("ca.crt")),
                "--client-cert-auth".to_string(),
            ])
            .stdout(std::fs::File::create(dir.join("etcd.log")).unwrap())
            .stderr(std::fs::File::create(dir.join("etcd.err")).unwrap())
            .spawn()
            .unwrap(),
    );
    let read = |f: &str| std::fs::read(dir.join(f)).unwrap();
    // Enable auth with a root user, through a direct client.
    let tls = etcd_client::TlsOptions::new()
        .ca_certificate(etcd_client::Certificate::from_pem(read("ca.crt")))
        .identity(etcd_client::Identity::from_pem(
            read("client.crt"),
            read("client.key"),
        ))
        .domain_name(dns.clone());
    let opts = etcd_client::ConnectOptions::new().with_tls(tls);
    let url = format!("https://127.0.0.1:{client_port}");
    let mut admin = None;
    for _ in 0..50 {
        if let Ok(mut c) = etcd_client::Client::connect([url.as_str()], Some(opts.clone())).await
            && c.status().await.is_ok()
        {
            admin = Some(c);
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let mut admin = admin.unwrap_or_else(|| {
        panic!(
            "etcd with TLS does not answer at {url}: {}",
            std::fs::read_to_string(dir.join("etcd.err")).unwrap_or_default()
        )
    });
    admin.put("k", "v", None).await.unwrap();
    admin.user_add("root", "s3cret", None).await.unwrap();
    admin.user_grant_role("root", "root").await.unwrap();
    admin.auth_enable().await.unwrap();

    let secrets: Api<Secret> = ns.api();
    let secret = |name: &str, data: Vec<(&str, Vec<u8>)>| Secret {
        metadata: ObjectMeta {
            name: Some(name.to_string()),
            ..Default::default()
        },
        data: Some(
            data.into_iter()
                .map(|(k, v)| (k.to_string(), ByteString(v)))
                .collect(),
        ),
        ..Default::default()
    };
    let (tls_name, auth_name, bad_name) = ("etcd-tls", "etcd-auth", "etcd-bad");
    let pp = PostParams::default();
    secrets
        .create(
            &pp,
            &secret(
                tls_name,
                vec![
                    ("ca.crt", read("ca.crt")),
                    ("tls.crt", read("client.crt")),
                    ("tls.key", read("client.key")),
                ],
            ),
        )
        .await
        .unwrap();
    secrets
        .create(
            &pp,
            &secret(
                auth_name,
                vec![
                    ("username", b"root".to_vec()),
                    ("password", b"s3cret".to_vec()),
                ],
            ),
        )
        .await
        .unwrap();
    secrets
        .create(
            &pp,
            &secret(
                bad_name,
                vec![
                    ("username", b"root".to_vec()),
                    ("password", b"wrong".to_vec()),
                ],
            ),
        )
        .await
        .unwrap();

    let pod = Pod {
        metadata: ObjectMeta {
            name: Some("etcd-0".to_string()),
            namespace: Some(ns.name.clone()),
            ..Default::default()
        },
        spec: Some(PodSpec {
            hostname: Some("etcd-0".to_string()),
            subdomain: Some("etcd".to_string()),
            ..Default::default()
        }),
        status: Some(PodStatus {
            pod_ip: Some("127.0.0.1".to_string()),
            conditions: Some(vec![PodCondition {
                type_: "Ready".to_string(),
                status: "True".to_string(),
                ..Default::default()
            }]),
            ..Default::default()
        }),
    };
    let spec = |auth: &str| DatabaseSpec {
        engine: DatabaseEngine::Etcd,
        generic: None,
        etcd: Some(EtcdSpec {
            client_port,
            tls_secret_name: Some(tls_name.to_string()),
            auth_secret_name: Some(auth.to_string()),
        }),
        ..DatabaseSpec::default()
    };
    let engine = Engine::from_spec(&client, &ns.name, &spec(auth_name))
        .await
        .unwrap();
    println!("{engine:?}");
    let report = engine.observe(std::slice::from_ref(&pod)).await.unwrap();
    println!("{report:#?}");
    assert_eq!(report.problems, Vec::<String>::new());
    assert_eq!(report.leader.as_deref(), Some("etcd-0"));
    assert_eq!(report.voting_members, Some(1));
    assert_eq!(report.members[0].endpoint.as_deref(), Some(url.as_str()));
    // A single member can never keep quorum while it stops.
    assert!(matches!(
        EtcdRules::default().gate_before_stop(&report, "etcd-0"),
        Gate::Wait(w) if w.contains("quorum")
    ));
    let hash = engine.final_hash(std::slice::from_ref(&pod)).await.unwrap();
    println!("hash {hash:?}");
    assert!(hash.is_some());

    // A wrong password: the member is reported unhealthy, with the reason.
    let wrong = Engine::from_spec(&client, &ns.name, &spec(bad_name))
        .await
        .unwrap();
    let report = wrong.observe(std::slice::from_ref(&pod)).await.unwrap();
    let problem = report.members[0].problem.clone().unwrap_or_default();
    println!("wrong password: {problem}");
    assert!(!report.members[0].healthy);
    assert!(problem.contains("authentication failed"), "{problem}");
    // A missing Secret is a clear error.
    let missing = Engine::from_spec(&client, &ns.name, &spec("no-such-secret")).await;
    assert!(
        matches!(&missing, Err(EngineError::Secret { name, .. }) if name == "no-such-secret"),
        "{missing:?}"
    );

    drop(etcd);
    ns.delete_and_wait(NAMESPACE_GONE).await.unwrap();
    drop(scratch);
}
