//! The etcd engine against a real etcd StatefulSet (ignored by default: needs a cluster).
//!
//! ```sh
//! export KUBECONFIG=/tmp/dir/kubeconfig      # e.g. from `localcluster up`
//! kubectl create ns engine-live
//! kubectl apply -n engine-live --server-side -f e2e/fixtures/etcd.yaml   # wait for 3/3 Ready
//! SM_ENGINE_NAMESPACE=engine-live cargo test -p storage-migrator --test engine_etcd_live \
//!     -- --ignored --nocapture
//! ```
//!
//! Checks: every member observed through its own endpoint, 3 voting members, one leader; the
//! gates and the order (followers first, leader last); a leadership transfer to a follower that
//! every member confirms and that raises the term by exactly one; `hash_kv` agreement.

use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::api::ListParams;
use kube::{Api, Client};
use storage_migrator::api::{DatabaseEngine, DatabaseSpec, EtcdSpec};
use storage_migrator::engine::{
    self, DEFAULT_MAX_LAG, Engine, Gate, HealthReport, LEADER_TRANSFER_FIRST,
};

async fn pods(client: &Client, ns: &str) -> Vec<Pod> {
    let api: Api<Pod> = Api::namespaced(client.clone(), ns);
    api.list(&ListParams::default().labels("app=etcd"))
        .await
        .unwrap()
        .items
}

fn term(report: &HealthReport) -> u64 {
    report
        .members
        .iter()
        .filter_map(|m| m.raft_term)
        .max()
        .unwrap()
}

#[tokio::test]
#[ignore = "needs a cluster with the etcd fixture (see the file's doc)"]
async fn etcd_engine_against_a_real_cluster() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "storage_migrator=info".into()),
        )
        .with_test_writer()
        .try_init();
    let ns = std::env::var("SM_ENGINE_NAMESPACE").unwrap_or_else(|_| "default".to_string());
    let client = Client::try_default().await.unwrap();
    let spec = DatabaseSpec {
        engine: DatabaseEngine::Etcd,
        generic: None,
        etcd: Some(EtcdSpec::default()),
    };
    let engine = Engine::from_spec(&client, &ns, &spec).await.unwrap();
    let pods = pods(&client, &ns).await;
    assert_eq!(pods.len(), 3, "the fixture has 3 members");

    let started = std::time::Instant::now();
    let report = engine.observe(&pods).await.unwrap();
    println!("observe took {:?}:\n{report:#?}", started.elapsed());
    assert_eq!(report.problems, Vec::<String>::new());
    assert_eq!(report.voting_members, Some(3));
    assert!(report.members.iter().all(|m| m.healthy));
    assert_eq!(engine::is_healthy_for_start(&report), Ok(()));
    let leader = report.leader.clone().expect("a leader");
    let names: Vec<String> = report.members.iter().map(|m| m.pod.clone()).collect();
    assert_eq!(names, ["etcd-0", "etcd-1", "etcd-2"]);

    // Order: followers first, leader last.
    let first = engine::next_member(&report, &names).unwrap();
    assert_ne!(first, leader);
    assert_eq!(
        engine::next_member(&report, std::slice::from_ref(&leader)).as_deref(),
        Some(leader.as_str())
    );
    // Gates: a follower may stop, the leader must hand over first.
    assert_eq!(
        engine::gate_before_stop(&report, &first, DEFAULT_MAX_LAG),
        Gate::Open
    );
    assert_eq!(
        engine::gate_before_stop(&report, &leader, DEFAULT_MAX_LAG),
        Gate::Wait(LEADER_TRANSFER_FIRST.to_string())
    );
    assert_eq!(
        engine::gate_after_return(&report, &first, DEFAULT_MAX_LAG),
        Gate::Open
    );

    // Transfer to a follower, preferring one "already migrated".
    let migrated = vec![first.clone()];
    let to = engine::transfer_target(&report, &leader, &migrated).unwrap();
    assert_eq!(to, first);
    let term_before = term(&report);
    let started = std::time::Instant::now();
    engine
        .transfer_leadership(&report, &leader, &to)
        .await
        .unwrap();
    println!(
        "transfer {leader} -> {to} took {:?} (confirmed by every member)",
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
        engine::gate_before_stop(&after, &leader, DEFAULT_MAX_LAG),
        Gate::Open
    );
    // Idempotent: repeating the transfer with the stale report is Ok at once.
    let stale = engine.transfer_leadership(&report, &leader, &to).await;
    assert!(stale.is_ok(), "to already leads: Ok ({stale:?})");

    // hash_kv agrees.
    let hash = engine.final_hash(&pods).await.unwrap().unwrap();
    println!("final hash {hash}");
    assert!(hash.contains('@'));

    // Transfer back, so the test can be run again from the same state.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let back = engine.transfer_leadership(&after, &to, &leader).await;
    println!("transfer back: {back:?}");
}

/// Polls `f` every 500 ms until it is true, at most `secs` seconds.
async fn eventually<F, Fut>(secs: u64, what: &str, mut f: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = std::time::Instant::now() + Duration::from_secs(secs);
    while !f().await {
        assert!(std::time::Instant::now() < deadline, "timed out: {what}");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// A stopped member (StatefulSet orphan-deleted, one pod deleted) is named by `IfReady` and
/// closes the gates; an endpoint that does not answer costs a bounded time; after the member
/// returns, the after-gate opens.
#[tokio::test]
#[ignore = "needs a cluster with the etcd fixture (see the file's doc)"]
async fn etcd_engine_with_a_stopped_member() {
    use k8s_openapi::api::apps::v1::StatefulSet;
    use kube::api::{DeleteParams, PostParams};

    let ns = std::env::var("SM_ENGINE_NAMESPACE").unwrap_or_else(|_| "default".to_string());
    let client = Client::try_default().await.unwrap();
    let spec = DatabaseSpec {
        engine: DatabaseEngine::Etcd,
        generic: None,
        etcd: None,
    };
    let engine = Engine::from_spec(&client, &ns, &spec).await.unwrap();
    let sets: Api<StatefulSet> = Api::namespaced(client.clone(), &ns);
    let pod_api: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let stash = sets.get("etcd").await.unwrap();
    sets.delete("etcd", &DeleteParams::orphan()).await.unwrap();
    eventually(60, "StatefulSet gone", || async {
        sets.get_opt("etcd").await.unwrap().is_none()
    })
    .await;
    pod_api
        .delete("etcd-2", &DeleteParams::default())
        .await
        .unwrap();
    eventually(60, "etcd-2 gone", || async {
        pod_api.get_opt("etcd-2").await.unwrap().is_none()
    })
    .await;

    let two = pods(&client, &ns).await;
    assert_eq!(two.len(), 2);
    let report = engine.observe(&two).await.unwrap();
    println!("with etcd-2 stopped: {:?}", report.problems);
    assert_eq!(report.voting_members, Some(3));
    let err = engine::is_healthy_for_start(&report).unwrap_err();
    assert!(err.contains("etcd-2"), "{err}");
    let follower = report
        .members
        .iter()
        .find(|m| !m.leader)
        .unwrap()
        .pod
        .clone();
    assert!(matches!(
        engine::gate_before_stop(&report, &follower, DEFAULT_MAX_LAG),
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
    let unused = format!("{}.250", ip.rsplit_once('.').unwrap().0);
    ghost.status.as_mut().unwrap().pod_ip = Some(unused);
    let mut with_ghost = two.clone();
    with_ghost.push(ghost);
    let started = std::time::Instant::now();
    let report = engine.observe(&with_ghost).await.unwrap();
    let took = started.elapsed();
    let g = report.members.iter().find(|m| m.pod == "etcd-2").unwrap();
    println!("unanswering endpoint: {:?} after {took:?}", g.problem);
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
    eventually(120, "etcd-2 back and caught up", || async {
        let all = pods(&client, &ns).await;
        if all.len() != 3 {
            return false;
        }
        let r = engine.observe(&all).await.unwrap();
        engine::gate_after_return(&r, "etcd-2", DEFAULT_MAX_LAG) == Gate::Open
            && engine::is_healthy_for_start(&r).is_ok()
    })
    .await;
}

/// Runs `openssl` with the given arguments in `dir`.
fn openssl(dir: &std::path::Path, args: &[&str]) {
    let out = std::process::Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .output()
        .unwrap();
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

/// TLS (client certificates, server certificate naming the pod's DNS name only) and password
/// auth, read from Secrets by `Engine::from_spec`, against a single etcd started by the test on
/// 127.0.0.1 and presented as a pod `etcd-0` (subdomain `etcd`) with that IP.
#[tokio::test]
#[ignore = "needs a cluster (for the Secrets), /usr/bin/etcd and openssl"]
async fn etcd_engine_with_tls_and_auth() {
    use k8s_openapi::ByteString;
    use k8s_openapi::api::core::v1::{PodCondition, PodSpec, PodStatus, Secret};
    use kube::api::{ObjectMeta, PostParams};

    let ns = std::env::var("SM_ENGINE_NAMESPACE").unwrap_or_else(|_| "default".to_string());
    let client = Client::try_default().await.unwrap();
    let dir = std::env::temp_dir().join(format!("sm-engine-tls-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let dns = format!("etcd-0.etcd.{ns}.svc.cluster.local");
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
    let _etcd = Child(
        std::process::Command::new("etcd")
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
    let mut admin = admin.expect("etcd with TLS answers");
    admin.put("k", "v", None).await.unwrap();
    admin.user_add("root", "s3cret", None).await.unwrap();
    admin.user_grant_role("root", "root").await.unwrap();
    admin.auth_enable().await.unwrap();

    let secrets: Api<Secret> = Api::namespaced(client.clone(), &ns);
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
    let suffix = std::process::id();
    let (tls_name, auth_name, bad_name) = (
        format!("etcd-tls-{suffix}"),
        format!("etcd-auth-{suffix}"),
        format!("etcd-bad-{suffix}"),
    );
    let pp = PostParams::default();
    secrets
        .create(
            &pp,
            &secret(
                &tls_name,
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
                &auth_name,
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
                &bad_name,
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
            namespace: Some(ns.clone()),
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
            tls_secret_name: Some(tls_name.clone()),
            auth_secret_name: Some(auth.to_string()),
        }),
    };
    let engine = Engine::from_spec(&client, &ns, &spec(&auth_name))
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
        engine::gate_before_stop(&report, "etcd-0", DEFAULT_MAX_LAG),
        Gate::Wait(w) if w.contains("quorum")
    ));
    let hash = engine.final_hash(std::slice::from_ref(&pod)).await.unwrap();
    println!("hash {hash:?}");
    assert!(hash.is_some());

    // A wrong password: the member is reported unhealthy, with the reason.
    let wrong = Engine::from_spec(&client, &ns, &spec(&bad_name))
        .await
        .unwrap();
    let report = wrong.observe(std::slice::from_ref(&pod)).await.unwrap();
    let problem = report.members[0].problem.clone().unwrap_or_default();
    println!("wrong password: {problem}");
    assert!(!report.members[0].healthy);
    assert!(problem.contains("authentication failed"), "{problem}");
    // A missing Secret is a clear error.
    let missing = Engine::from_spec(&client, &ns, &spec("no-such-secret")).await;
    assert!(
        matches!(&missing, Err(engine::EngineError::Secret { name, .. }) if name == "no-such-secret"),
        "{missing:?}"
    );

    for name in [&tls_name, &auth_name, &bad_name] {
        let _ = secrets.delete(name, &Default::default()).await;
    }
    drop(_etcd);
    let _ = std::fs::remove_dir_all(&dir);
}
