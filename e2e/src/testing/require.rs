//! Tests never pass without running. A test that needs something this run lacks (the local
//! cluster, root, a program) calls one of these: under CI (`CI=true`) or when the suite runs
//! through the README's command (`test-all.sh` sets `E2E_REQUIRE_ALL=1`) the test fails, naming
//! what is missing; a developer running one test by hand gets a `NOT RUN` line and the test
//! returns early.

use crate::state::ClusterState;
use crate::testing::TestCluster;

/// Whether a missing precondition fails the test instead of letting it return early.
pub fn must_run() -> bool {
    let set = |var: &str, value: &str| std::env::var(var).is_ok_and(|v| v == value);
    set("CI", "true") || set("E2E_REQUIRE_ALL", "1")
}

/// `true` when `ok`. Otherwise panics under [`must_run`], naming `missing`, or prints why
/// `test` does not run and returns `false`.
pub fn precondition(ok: bool, test: &str, missing: &str) -> bool {
    if ok {
        return true;
    }
    assert!(
        !must_run(),
        "{test} cannot run: {missing} (CI=true or E2E_REQUIRE_ALL=1 refuses to skip it)"
    );
    eprintln!("NOT RUN {test}: {missing}");
    false
}

/// The local cluster's state (`KUBECONFIG` of `localcluster up`), for tests that act on the
/// host (processes, nodes, the API server); see [`precondition`] when there is none.
pub fn local_cluster(test: &str) -> Option<ClusterState> {
    let state = TestCluster::local_state();
    let missing = "it needs the local cluster: KUBECONFIG must be a `localcluster up` kubeconfig";
    precondition(state.is_some(), test, missing)
        .then_some(state)
        .flatten()
}

/// `true` when `E2E_LOCALCLUSTER=1` (the tests that start their own pods from host programs);
/// see [`precondition`] otherwise.
pub fn local_cluster_flag(test: &str) -> bool {
    let set = std::env::var("E2E_LOCALCLUSTER").is_ok_and(|v| v == "1");
    precondition(
        set,
        test,
        "it needs the local cluster: set E2E_LOCALCLUSTER=1",
    )
}

/// `true` when this process runs as root; see [`precondition`] otherwise.
pub fn root(test: &str) -> bool {
    let root = nix::unistd::geteuid().is_root();
    precondition(root, test, "it needs root (namespaces, mounts, links)")
}

/// `true` when `path` exists; see [`precondition`] otherwise.
pub fn program(test: &str, path: &str) -> bool {
    let found = std::path::Path::new(path).exists();
    precondition(found, test, &format!("{path} is not installed"))
}
