//! Leader election between two operator processes on the local cluster's API server, each
//! under the chart's RBAC for the namespace, with identities of their own (`op-a`, `op-b`):
//! - the first to start holds the Lease and says `storage_migrator_leader 1` on `/metrics`;
//!   the other says 0 and only watches;
//! - on SIGTERM the holder releases the Lease and the other takes it over at once (well within
//!   a second of the exit, not after the 30 s lease);
//! - a holder killed with SIGKILL (nothing released) is replaced only once its last renewal is
//!   a whole lease duration old: never sooner (a holder that cannot renew stops acting 5 s
//!   before that), and not much later.
//!
//! The holder's renewals, one replace each, and the fence are tested against a mocked API
//! server too (`leader::tests`); here the real API server's optimistic concurrency does it.
//!
//! Run: `KUBECONFIG=DIR/kubeconfig cargo test -p e2e --test leader_election`.

use std::time::{Duration, SystemTime};

use e2e::testing::helm::http_get;
use e2e::testing::operator::{Operator, install_crd, log_path, operator_bin};
use e2e::testing::{TestNamespace, scenario};
use k8s_openapi::api::coordination::v1::Lease;
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use tokio::time::Instant;
use tracing::info;

const LEASE: &str = "storage-migrator";
const LEASE_DURATION: Duration = Duration::from_secs(30);

async fn lease(ns: &TestNamespace) -> Lease {
    ns.api::<Lease>().get(LEASE).await.expect("the Lease")
}

fn holder(l: &Lease) -> Option<String> {
    l.spec.as_ref()?.holder_identity.clone()
}

fn renewed(l: &Lease) -> SystemTime {
    let t = l.spec.as_ref().and_then(|s| s.renew_time.as_ref());
    SystemTime::from(t.expect("a renewTime").0)
}

/// Polls the Lease (every 100 ms, up to `timeout`) until `who` holds it (the first operator
/// creates it).
async fn held_by(ns: &TestNamespace, who: &str, timeout: Duration) -> Lease {
    let t0 = Instant::now();
    loop {
        let l = ns
            .api::<Lease>()
            .get_opt(LEASE)
            .await
            .expect("the Lease read");
        match l {
            Some(l) if holder(&l).as_deref() == Some(who) => return l,
            _ => {}
        }
        assert!(
            t0.elapsed() < timeout,
            "{who} does not hold the Lease after {timeout:?}: {:?}",
            l.and_then(|l| l.spec)
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn start(ns: &TestNamespace, run: usize, who: &str) -> Operator {
    let flags = ["--lease-identity", who];
    let log = log_path(ns, run);
    Operator::spawn_unsupervised(&operator_bin(), ns, log, &flags)
        .await
        .expect("operator started")
}

/// `storage_migrator_leader` as the operator's `/metrics` says it.
async fn says_leader(op: &Operator) -> String {
    let address = op.http_address(Duration::from_secs(20)).await.unwrap();
    let host = address.ip().to_string();
    let (code, metrics) = http_get(&host, address.port(), "/metrics").await.unwrap();
    assert_eq!(code, 200);
    let line = metrics
        .lines()
        .find(|l| l.starts_with("storage_migrator_leader "));
    line.unwrap_or("no storage_migrator_leader line")
        .to_string()
}

/// Until `who` says `storage_migrator_leader want` (up to 10 s).
async fn says_leader_eventually(op: &Operator, who: &str, want: u8) {
    let t0 = Instant::now();
    loop {
        let line = says_leader(op).await;
        if line == format!("storage_migrator_leader {want}") {
            return;
        }
        assert!(t0.elapsed() < Duration::from_secs(10), "{who}: {line}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_replica_leads_hands_over_at_once_on_sigterm_and_after_a_crash_only_when_the_lease_ends()
 {
    let (_cluster, ns) = scenario("smr-lease").await;
    install_crd(&ns).await.unwrap();

    let a = start(&ns, 0, "op-a").await;
    let first = held_by(&ns, "op-a", Duration::from_secs(30)).await;
    let mut b = start(&ns, 1, "op-b").await;
    says_leader_eventually(&a, "op-a", 1).await;
    says_leader_eventually(&b, "op-b", 0).await;
    let transitions = |l: &Lease| l.spec.as_ref().and_then(|s| s.lease_transitions);

    // SIGTERM: op-a releases, op-b takes over at once.
    a.stop(Duration::from_secs(15)).await;
    let exited = Instant::now();
    let second = held_by(&ns, "op-b", Duration::from_secs(5)).await;
    let handover = exited.elapsed();
    info!(?handover, "handed over on SIGTERM");
    assert!(
        handover < Duration::from_secs(2),
        "handover took {handover:?}"
    );
    assert_eq!(
        transitions(&second),
        transitions(&first).map(|t| t + 1),
        "one change of hands"
    );
    says_leader_eventually(&b, "op-b", 1).await;

    // SIGKILL: nothing released; op-a, a follower again, waits out op-b's last renewal.
    let a = start(&ns, 2, "op-a").await;
    says_leader_eventually(&a, "op-a", 0).await;
    let before = lease(&ns).await;
    let pid = b
        .pid()
        .and_then(|p| i32::try_from(p).ok())
        .expect("op-b's pid");
    kill(Pid::from_raw(pid), Signal::SIGKILL).unwrap();
    let killed = SystemTime::now();
    b.wait_exit(Duration::from_secs(10)).await.unwrap();
    let last = lease(&ns).await;
    assert_eq!(holder(&last).as_deref(), Some("op-b"));
    let third = held_by(&ns, "op-a", LEASE_DURATION + Duration::from_secs(10)).await;
    let taken = renewed(&third);
    let after_renewal = taken.duration_since(renewed(&last)).unwrap_or_default();
    let after_kill = taken.duration_since(killed).unwrap_or_default();
    info!(?after_renewal, ?after_kill, renewals_seen = ?(renewed(&before), renewed(&last)),
        "taken over after a crash");
    // The record's times are the replicas' clocks, here the same machine's.
    assert!(
        after_renewal >= LEASE_DURATION - Duration::from_millis(200),
        "taken {after_renewal:?} after op-b's last renewal: sooner than the lease"
    );
    assert!(
        after_renewal <= LEASE_DURATION + Duration::from_secs(3),
        "taken {after_renewal:?} after op-b's last renewal"
    );
    assert!(after_kill <= LEASE_DURATION + Duration::from_secs(3));
    says_leader_eventually(&a, "op-a", 1).await;
    a.stop(Duration::from_secs(15)).await;
}
