//! `bench-fleet`: many requests at once under the operator's copy caps (issue 30, item 3). N
//! single-member `Generic` StatefulSets, each in a namespace of its own, one
//! `StorageClassChange` each, all created together, moved by one operator (debug or release
//! binary, `STORAGE_MIGRATOR_BIN`) watching every namespace with `--max-copies` (and
//! `--max-copies-per-node` when given).
//!
//! Prints one Markdown table: the requests Successful; the wall time (from the first sample,
//! right after the requests were created, until every request is final), sampled every 200 ms
//! from one list of each kind; the ideal the caps allow: the time before the first slot was taken
//! (preflight, orphaning, the temporary claims), plus each member's time holding a slot summed
//! and divided by the cluster cap (never less than the longest), plus the time after the last slot
//! was given back (the last swap and restart); their ratio (the handovers between slots are what
//! it adds); the most copy Jobs and slot holders seen at once (sampled every
//! 200 ms), the requests that waited for a slot, and the operator's peak RSS.
//!
//! ```sh
//! KUBECONFIG=DIR/kubeconfig E2E_LOCALCLUSTER=1 bench-fleet --sets 30 --max-copies 2
//! ```

use std::time::{Duration, Instant};

use clap::Parser;
use e2e::testing::fleet::{ONE_MEMBER_SCRIPT, Seen, sample_until_final};
use e2e::testing::operator::{Operator, create_request, install_crd};
use e2e::testing::{TestNamespace, one_member_set, scenario};
use futures::future::try_join_all;
use serde_json::json;
use storage_migrator::api::{Phase, StorageMigrationRequest};

#[derive(Parser, Debug)]
#[command(
    name = "bench-fleet",
    about = "Many requests at once under the copy caps"
)]
struct Cli {
    /// Single-member sets, one namespace each.
    #[arg(long, default_value_t = 30)]
    sets: usize,
    /// The operator's `--max-copies`.
    #[arg(long, default_value_t = 2)]
    max_copies: u32,
    /// The operator's `--max-copies-per-node` (unset: none).
    #[arg(long)]
    max_copies_per_node: Option<u32>,
    /// Give up after this many seconds.
    #[arg(long, default_value_t = 1800)]
    timeout: u64,
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    // Progress to stderr: stdout holds only the table (the harness's own subscriber, which
    // `scenario` installs for tests, writes to stdout and stays unused once this one is set).
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info,kube=warn"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    anyhow::ensure!(
        cli.sets > 0 && cli.max_copies > 0,
        "--sets and --max-copies must be > 0"
    );
    let mut spaces = Vec::new();
    let mut cluster = None;
    for i in 0..cli.sets {
        let (c, ns) = scenario(&format!("bench-fleet-{i}")).await;
        cluster.get_or_insert(c);
        spaces.push(ns);
    }
    let cluster = cluster.ok_or_else(|| anyhow::anyhow!("no namespace"))?;
    install_crd(&spaces[0]).await?;
    let started = Instant::now();
    try_join_all(spaces.iter().map(|ns| {
        let set = one_member_set(
            "app",
            &cluster.mover_image,
            &cluster.storage_class,
            "64Mi",
            ONE_MEMBER_SCRIPT,
        );
        async move { ns.create_statefulset_ready(&set).await }
    }))
    .await?;
    eprintln!("{} sets Ready in {:?}", cli.sets, started.elapsed());
    let mut flags = vec!["--max-copies".to_string(), cli.max_copies.to_string()];
    if let Some(n) = cli.max_copies_per_node {
        flags.extend(["--max-copies-per-node".to_string(), n.to_string()]);
    }
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    let others: Vec<&TestNamespace> = spaces[1..].iter().collect();
    let operator = Operator::start_watching(&spaces[0], &others, 0, &flags).await?;
    for ns in &spaces {
        let spec = json!({
            "type": "StorageClassChange",
            "target": {"kind": "StatefulSet", "name": "app"},
            "storageClassChange": {"storageClassName": cluster.wffc_storage_class},
            "timeout": "60m",
            "database": {"engine": "Generic"},
        });
        create_request(ns, "move", spec).await?;
    }
    let refs: Vec<&TestNamespace> = spaces.iter().collect();
    let deadline = Instant::now() + Duration::from_secs(cli.timeout);
    let (seen, requests) = sample_until_final(&refs, cli.sets, deadline)
        .await
        .map_err(anyhow::Error::msg)?;
    let rss = operator.peak_rss_bytes().unwrap_or_default();
    print!("{}", table(&cli, &seen, &requests, rss));
    Ok(())
}

fn table(cli: &Cli, seen: &Seen, requests: &[StorageMigrationRequest], rss: u64) -> String {
    let ok = (requests.iter())
        .filter(|r| {
            r.status
                .as_ref()
                .is_some_and(|s| s.phase == Phase::Successful)
        })
        .count();
    let held: Vec<f64> = seen.held.values().copied().collect();
    let longest = held.iter().copied().fold(0.0, f64::max);
    let copies = (held.iter().sum::<f64>() / f64::from(cli.max_copies)).max(longest);
    let (lead, tail) = (seen.lead_in.as_secs_f64(), seen.tail.as_secs_f64());
    let wall = seen.sampled.as_secs_f64();
    let ideal = lead + copies + tail;
    let ratio = if ideal > 0.0 { wall / ideal } else { 0.0 };
    let per_node = cli
        .max_copies_per_node
        .map_or("none".into(), |n| n.to_string());
    format!(
        "| sets | caps (cluster, node) | Successful | wall time | before the first slot | \
         slot time / cap | after the last slot | ideal | ratio | most copy Jobs at once | \
         most slots held at once | waited for a slot | operator peak RSS |\n\
         |---|---|---|---|---|---|---|---|---|---|---|---|---|\n\
         | {} | {}, {per_node} | {ok} | {wall:.1} s | {lead:.1} s | {copies:.1} s | {tail:.1} s \
         | {ideal:.1} s | {ratio:.2} | {} | {} | {} | {:.1} MiB |\n",
        cli.sets,
        cli.max_copies,
        seen.most_jobs,
        seen.most_holders,
        seen.waited.len(),
        rss as f64 / (1024.0 * 1024.0),
    )
}
