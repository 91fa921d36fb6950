//! The API server restarted in the middle of a request, with a client writing to etcd (issue
//! 13's fault-injection suite; `docs/faults.md`). A test binary of its own: while the API server
//! is down every other test's requests would fail, and test binaries run one after another.
//!
//! The request must end `Successful` with every acknowledged write on every member and nothing
//! of the request left; the operator's watches and its Lease ride out the outage (its process is
//! supervised as a Deployment's pod would be: if it exits, it is started again, and the test
//! prints how often that happened).
//!
//! Only on the local cluster (`localcluster` restarts the API server); on another cluster the
//! test says so and passes without running.

use std::time::{Duration, Instant};

use e2e::controlplane::restart_apiserver;
use e2e::testing::faults::EtcdUnderLoad;
use e2e::testing::operator::{self, Operator, summary};
use storage_migrator::api::{MemberStep, Phase, StorageMigrationRequest};

const MIGRATION: Duration = Duration::from_secs(900);

/// Waits until some member of request `name` is at `step` (the API server must be up).
async fn wait_for_step(ns: &e2e::testing::TestNamespace, name: &str, step: MemberStep) {
    let api: kube::Api<StorageMigrationRequest> = ns.api();
    let deadline = Instant::now() + Duration::from_secs(300);
    loop {
        if let Ok(req) = api.get(name).await
            && req
                .status
                .as_ref()
                .is_some_and(|s| s.members.iter().any(|m| m.step == step))
        {
            return;
        }
        assert!(Instant::now() < deadline, "no member reached {step:?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The API server is restarted twice: while the first member pre-copies, and while a later
/// member's data is copied with the member down.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_api_server_restarted_mid_request_loses_nothing() {
    // It restarts the API server.
    let Some(state) = e2e::testing::require::local_cluster("faults apiserver") else {
        return;
    };
    let run = EtcdUnderLoad::start("fault-apiserver")
        .await
        .expect("setup");
    let ns = &run.ns;
    let op = Operator::start(ns, 0, None).await.expect("operator");
    run.create_request("apiserver").await.expect("request");
    let mut outages = Vec::new();
    for step in [MemberStep::PreCopying, MemberStep::Copying] {
        wait_for_step(ns, "apiserver", step).await;
        let down = restart_apiserver(&state)
            .await
            .expect("restart the API server");
        outages.push(format!("{step:?}: {down:?}"));
    }
    let req = operator::wait_final(ns, "apiserver", MIGRATION)
        .await
        .expect("final");
    let restarts = op.restarts();
    let (_cluster, _ns, written) = run.finish().await;
    println!(
        "NOTE faults apiserver: restarted during [{}]; operator restarts {restarts}; {}; writes \
         acknowledged {} failed {}",
        outages.join(", "),
        summary(&req),
        written.acked.len(),
        written.failures
    );
    assert_eq!(
        req.status.as_ref().map(|s| s.phase),
        Some(Phase::Successful),
        "{}",
        summary(&req)
    );
}
