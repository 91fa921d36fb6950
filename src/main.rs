use std::num::NonZeroU32;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use clap::{Args, Parser, Subcommand, ValueEnum};
use kube::ResourceExt;

use storage_migrator::api::{CopySpec, StorageMigrationRequest};
use storage_migrator::cluster::Cluster;
use storage_migrator::image::{DEFAULT_IMAGE, ImageRef};
use storage_migrator::leader::{self, LeaseConfig, Term};
use storage_migrator::metrics::Metrics;
use storage_migrator::permissions::CheckScope;
use storage_migrator::plan::slots::CopyCaps;
use storage_migrator::plan::{Settings, preflight};
use storage_migrator::scope::WatchScope;
use storage_migrator::serve::{self, Health};

#[derive(Parser)]
#[command(name = "storage-migrator", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Clone, Copy, ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

/// The operator's own image, also the image of the Jobs and pods it creates, and how those
/// helper pods are run (`plan::Settings`).
#[derive(Args)]
struct ImageArg {
    /// The operator's own image (the Helm chart sets it from its image values). Its copy,
    /// verify and measure Jobs and its mounter pods run it.
    #[arg(long = "image", env = "STORAGE_MIGRATOR_IMAGE", value_name = "REF", default_value = DEFAULT_IMAGE)]
    image: String,
    /// Let a request's spec.copy.moverImage replace --image for its Jobs and mounter pods.
    /// Off: such a request is Denied (MoverImageNotAllowed). Whoever may create a request
    /// then picks code that runs as root with the data volumes mounted.
    #[arg(long, env = "ALLOW_REQUEST_MOVER_IMAGE", default_value_t = false, action = clap::ArgAction::Set, num_args = 0..=1, default_missing_value = "true")]
    allow_request_mover_image: bool,
    /// Seconds a copy, verify, measure or mounter pod may stay unstarted (image not pulled,
    /// not scheduled, refused by admission) before its member fails with the pod's reason.
    #[arg(long, env = "HELPER_START_TIMEOUT", default_value_t = 180, value_parser = clap::value_parser!(u64).range(10..=3600))]
    helper_start_timeout: u64,
    /// Times a helper pod evicted from its node is replaced before its member fails.
    #[arg(long, env = "MAX_EVICTIONS", default_value_t = storage_migrator::plan::DEFAULT_MAX_EVICTIONS, value_parser = clap::value_parser!(u32).range(0..=10))]
    max_evictions: u32,
    /// Seconds every member pod must have been running and Ready, with no restart, before the
    /// next member stops (a member in a crash loop answers healthy between two crashes).
    #[arg(long, env = "STABLE_WINDOW", default_value_t = storage_migrator::plan::stability::DEFAULT_STABLE_WINDOW.as_secs(), value_parser = clap::value_parser!(u64).range(0..=3600))]
    stable_window: u64,
    /// Seconds RecreatingStatefulSet, the cleanup of Finalizing and RollingBack may each wait
    /// (spec.timeout bounds orphaning and migrating): a recreation past it rolls back, a
    /// rollback past it ends Failed saying what it still waited for.
    #[arg(long, env = "STAGE_TIMEOUT", default_value_t = 600, value_parser = clap::value_parser!(u64).range(10..=86400))]
    stage_timeout: u64,
    /// Members copying at once in the whole cluster, across every request (unset: no cap). A
    /// member waits for a slot before its first copy, still serving (condition CopySlot), and
    /// keeps it until its final copy is done.
    #[arg(long, env = "MAX_COPIES", value_name = "N")]
    max_copies: Option<NonZeroU32>,
    /// Members copying at once on one node (their pods' nodes), across every request (unset:
    /// no cap).
    #[arg(long, env = "MAX_COPIES_PER_NODE", value_name = "N")]
    max_copies_per_node: Option<NonZeroU32>,
}

impl ImageArg {
    /// The checked reference; the error names the flag and its variable.
    fn image_ref(&self) -> anyhow::Result<ImageRef> {
        ImageRef::parse(&self.image).context("invalid --image (env STORAGE_MIGRATOR_IMAGE)")
    }

    /// The planner's settings from these flags.
    fn settings(&self) -> anyhow::Result<Settings> {
        Ok(Settings {
            image: self.image_ref()?,
            allow_request_mover_image: self.allow_request_mover_image,
            helper_start_timeout: Duration::from_secs(self.helper_start_timeout),
            max_evictions: self.max_evictions,
            stable_window: Duration::from_secs(self.stable_window),
            stage_timeout: Duration::from_secs(self.stage_timeout),
            copy_caps: CopyCaps {
                cluster: self.max_copies,
                per_node: self.max_copies_per_node,
            },
        })
    }
}

#[derive(Subcommand)]
enum Command {
    /// Print the CustomResourceDefinition YAML.
    Crd,
    /// Run the controller (KUBECONFIG or in-cluster config).
    Run {
        /// Watch only these namespaces (repeat the flag or separate with commas; default, or an
        /// empty value: all namespaces). The chart's `watchNamespaces` grants Roles in exactly
        /// these.
        #[arg(long = "namespace", env = "WATCH_NAMESPACE", value_delimiter = ',')]
        namespaces: Vec<String>,
        /// Log format.
        #[arg(long, value_enum, default_value = "text")]
        log_format: LogFormat,
        /// Address of the HTTP endpoints /healthz, /readyz and /metrics (port 0: any free port).
        #[arg(long, env = "HTTP_ADDRESS", default_value = "0.0.0.0:8080")]
        http_address: std::net::SocketAddr,
        #[command(flatten)]
        lease: LeaseArgs,
        #[command(flatten)]
        image: ImageArg,
    },
    /// Dry run: print the plan a request YAML would get on the current cluster (no writes).
    Plan {
        /// The StorageMigrationRequest manifest.
        #[arg(short = 'f', long)]
        file: PathBuf,
        /// Namespace, when the manifest has none (default: the kubeconfig's).
        #[arg(short = 'n', long)]
        namespace: Option<String>,
        #[command(flatten)]
        image: ImageArg,
    },
    /// In a copy Job: list, NUL-separated, what differs between two trees (the final pass's
    /// list, see `tree_diff`); prints `entries=N listed=L files=F linked=K`.
    TreeDiff {
        /// The old volume's root.
        source: PathBuf,
        /// The new volume's root.
        target: PathBuf,
        /// Also list the old volume's entries whose inode changed after this time (seconds
        /// since the epoch).
        #[arg(long)]
        since: i64,
        /// Where to write the list.
        #[arg(long)]
        output: PathBuf,
    },
}

/// Leader election: only the replica holding the Lease acts.
#[derive(clap::Args)]
struct LeaseArgs {
    /// Elect a leader among replicas on a Lease (`false`: act at once; only for a single
    /// replica that nothing else can duplicate).
    #[arg(long, env = "LEADER_ELECTION", default_value_t = true, action = clap::ArgAction::Set)]
    leader_election: bool,
    /// Name of the Lease.
    #[arg(long, default_value = storage_migrator::labels::LEASE_NAME)]
    lease_name: String,
    /// Namespace of the Lease (default: the watched namespace when there is one, else the
    /// client's default).
    #[arg(long, env = "POD_NAMESPACE")]
    lease_namespace: Option<String>,
    /// This replica's identity in the Lease; unique per replica (default: host name and pid).
    #[arg(long, env = "POD_NAME")]
    lease_identity: Option<String>,
    /// Seconds a renewal of the Lease is valid: a leader that dies without releasing it is
    /// replaced this long after its last renewal.
    #[arg(long, default_value_t = 30, value_parser = clap::value_parser!(u64).range(2..=600))]
    lease_duration: u64,
    /// Seconds before expiry that the leader renews; it stops acting half of that before expiry
    /// when no renewal landed.
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u64).range(2..=300))]
    lease_grace: u64,
}

impl LeaseArgs {
    fn config(&self, client: &kube::Client, watched: Option<&str>) -> LeaseConfig {
        let identity = self.lease_identity.clone().unwrap_or_else(|| {
            let host = std::env::var("HOSTNAME").unwrap_or_else(|_| "storage-migrator".into());
            format!("{host}-{}", std::process::id())
        });
        LeaseConfig {
            name: self.lease_name.clone(),
            namespace: (self.lease_namespace.as_deref().or(watched))
                .unwrap_or(client.default_namespace())
                .to_string(),
            identity,
            duration: Duration::from_secs(self.lease_duration),
            grace: Duration::from_secs(self.lease_grace),
        }
    }
}

fn init_tracing(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| {
        tracing_subscriber::EnvFilter::new("info,kube=warn,zookeeper_client=warn")
    });
    // Colours only on a terminal: a log file or a container log gets plain text.
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stdout()));
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
}

/// The client of `KUBECONFIG` or the pod's ServiceAccount, which shows `health` every response
/// (a refused call makes the readiness checks ask every permission again).
async fn client_noting_refusals(health: Arc<Health>) -> Result<kube::Client, kube::Error> {
    let config = kube::Config::infer()
        .await
        .map_err(kube::Error::InferConfig)?;
    let note = tower::util::MapResponseLayer::new(move |response: axum::http::Response<_>| {
        health.note_response(&response);
        response
    });
    Ok(kube::client::ClientBuilder::try_from(config)?
        .with_layer(&note)
        .build())
}

/// The controller under leader election, with the HTTP endpoints and the readiness checks.
async fn run(
    client: kube::Client,
    health: Arc<Health>,
    scope: WatchScope,
    settings: Settings,
    http_address: std::net::SocketAddr,
    lease: &LeaseArgs,
) -> anyhow::Result<()> {
    let metrics = Arc::new(Metrics::new());
    let (bound, server) = serve::bind(http_address, health.clone(), metrics.clone()).await?;
    tracing::info!(address = %bound, "serving /healthz, /readyz and /metrics");
    let server = tokio::spawn(server);
    let cfg = lease.config(&client, scope.single());
    let checks = CheckScope {
        watch: scope.clone(),
        lease_namespace: lease.leader_election.then(|| cfg.namespace.clone()),
    };
    tokio::spawn(health.keep_checking(client.clone(), checks));
    let work = {
        let (client, metrics) = (client.clone(), metrics.clone());
        move || storage_migrator::controller::run(client, scope, settings, metrics)
    };
    if !lease.leader_election {
        tracing::warn!("leader election is off: this replica acts at once");
        metrics.set_leader(true);
        work().await;
        server.abort();
        return Ok(());
    }
    let role = |leading| metrics.set_leader(leading);
    // The signal goes to the election, not around it: dropping a leader's election here would
    // exit without releasing the lease (a full lease duration of failover).
    let term = elect_and_lead(client, &cfg, role, work, shutdown_signal()).await?;
    server.abort();
    match term {
        Term::Finished => Ok(()),
        Term::Lost => anyhow::bail!(
            "lost the lease {}/{}; exiting so that a fresh process waits as a follower",
            cfg.namespace,
            cfg.name
        ),
        Term::Fenced(reason) => anyhow::bail!(
            "stopped acting: {reason}; exiting so that a fresh process waits as a follower"
        ),
    }
}

/// Connects to the Lease, retrying (1 s doubling to 30 s) while the API server cannot be reached
/// or refuses: the process stays up and not ready (`/readyz` says why) instead of crash-looping.
/// `shutdown` ends it: at once before the Lease is read, else through [`leader::lead`], which
/// releases the lease when it holds it.
async fn elect_and_lead<W, F>(
    client: kube::Client,
    cfg: &LeaseConfig,
    role: impl Fn(bool),
    work: W,
    shutdown: impl std::future::Future<Output = ()>,
) -> Result<Term, leader::LeaderError>
where
    W: FnOnce() -> F,
    F: std::future::Future<Output = ()>,
{
    tokio::pin!(shutdown);
    let mut delay = Duration::from_secs(1);
    let elector = loop {
        let connected = tokio::select! {
            c = leader::connect(client.clone(), cfg) => c,
            () = &mut shutdown => return Ok(Term::Finished),
        };
        match connected {
            Ok(m) => break m,
            Err(e @ leader::LeaderError::Timing { .. }) => return Err(e),
            Err(e) => {
                tracing::error!(error = %e, retry_in = ?delay, "cannot start leader election");
                tokio::select! {
                    () = tokio::time::sleep(delay) => {}
                    () = &mut shutdown => return Ok(Term::Finished),
                }
                delay = (delay * 2).min(Duration::from_secs(30));
            }
        }
    };
    Ok(leader::lead(elector, role, work, shutdown).await)
}

/// SIGTERM or SIGINT (a follower has no controller to stop: it just exits).
async fn shutdown_signal() {
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        () = term => {}
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    match Cli::parse().command {
        Command::Crd => {
            print!(
                "{}",
                serde_norway::to_string(&storage_migrator::api::schema::crd())?
            );
        }
        Command::Run {
            namespaces,
            log_format,
            http_address,
            lease,
            image,
        } => {
            // Checked before anything else: a bad reference would fail every Job much later.
            let settings = image.settings()?;
            let scope = WatchScope::parse(&namespaces)?;
            init_tracing(log_format);
            let _failpoints = storage_migrator::failpoints::setup();
            let health = Arc::new(Health::default());
            let client = client_noting_refusals(health.clone())
                .await
                .context("cannot build a Kubernetes client (KUBECONFIG?)")?;
            run(client, health, scope, settings, http_address, &lease).await?;
        }
        Command::Plan {
            file,
            namespace,
            image,
        } => plan(&file, namespace, image.settings()?).await?,
        Command::TreeDiff {
            source,
            target,
            since,
            output,
        } => {
            let listed = storage_migrator::tree_diff::list(&source, &target, since)?;
            storage_migrator::tree_diff::write(&listed, &output)?;
            println!(
                "entries={} listed={} files={} linked={}",
                listed.source_entries,
                listed.paths.len(),
                listed.regular_files,
                listed.target_linked
            );
        }
    }
    Ok(())
}

/// The `plan` line that names the image of the request's Jobs, and where it comes from.
fn jobs_image_line(copy: &CopySpec, settings: &Settings) -> String {
    let from = match copy.mover_image {
        Some(_) if settings.allow_request_mover_image => "spec.copy.moverImage",
        _ => "the operator's --image",
    };
    format!(
        "# copy Jobs would run image {} ({from})",
        settings.mover_image_of(copy)
    )
}

/// `storage-migrator plan`: what preflight would decide for the request in `file`, and the
/// image its Jobs would run.
async fn plan(file: &Path, namespace: Option<String>, settings: Settings) -> anyhow::Result<()> {
    init_tracing(LogFormat::Text);
    let text =
        std::fs::read_to_string(file).with_context(|| format!("cannot read {}", file.display()))?;
    let mut req: StorageMigrationRequest = serde_norway::from_str(&text)
        .with_context(|| format!("{} is not a StorageMigrationRequest", file.display()))?;
    let client = kube::Client::try_default()
        .await
        .context("cannot build a Kubernetes client (KUBECONFIG?)")?;
    let ns = req
        .namespace()
        .or(namespace)
        .unwrap_or_else(|| client.default_namespace().to_string());
    req.metadata.namespace = Some(ns);
    req.status = None;
    let cluster = Cluster::new(
        client.clone(),
        kube::runtime::events::Recorder::new(
            client,
            kube::runtime::events::Reporter {
                controller: "storage-migrator-plan".into(),
                instance: None,
            },
        ),
    );
    let engine = cluster.engine(&req).await.map_err(|e| e.to_string());
    let observed = cluster.gather(req, &engine).await?;
    let created =
        (observed.request.metadata.creation_timestamp.as_ref()).map_or(observed.now, |t| t.0);
    let name = observed.request.name_any();
    if let Some(ahead) = preflight::waiting_for(&name, Some(created), &observed.other_requests) {
        println!(
            "# would wait for request {} ({:?}) on the same StatefulSet; then:",
            ahead.name, ahead.phase
        );
    }
    match preflight::dry_run(&observed, &settings) {
        Ok(plan) => {
            println!(
                "# would be accepted; the plan (members in migration order; `work: AlreadyThere` \
                 members are already on the target, `work: NotTargeted` ones are not the \
                 target claim's: both are left running):"
            );
            print!("{}", serde_norway::to_string(&plan)?);
            println!(
                "{}",
                jobs_image_line(&observed.request.spec.copy, &settings)
            );
            if observed.request.spec.type_ == storage_migrator::api::MigrationType::Shrink {
                println!(
                    "# used bytes are measured by a Job on each member's node when the request runs"
                );
            }
        }
        Err(d) => {
            println!("# would be denied: {}: {}", d.reason, d.message);
            std::process::exit(2);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plan_names_the_jobs_image_and_its_source() {
        let image = ImageRef::parse("registry.test/storage-migrator:9").unwrap();
        let mut settings = Settings::new(image);
        let mut copy = CopySpec::default();
        let own =
            "# copy Jobs would run image registry.test/storage-migrator:9 (the operator's --image)";
        assert_eq!(jobs_image_line(&copy, &settings), own);
        copy.mover_image = Some("registry.test/mine:1".into());
        assert_eq!(jobs_image_line(&copy, &settings), own, "not allowed");
        settings.allow_request_mover_image = true;
        assert_eq!(
            jobs_image_line(&copy, &settings),
            "# copy Jobs would run image registry.test/mine:1 (spec.copy.moverImage)"
        );
    }

    #[test]
    fn image_flag_defaults_to_the_operator_image_and_refuses_a_bad_one() {
        let parse = |args: &[&str]| {
            let cli = Cli::try_parse_from(args).unwrap();
            match cli.command {
                Command::Run { image, .. } => image.image_ref().map_err(|e| format!("{e:#}")),
                _ => unreachable!(),
            }
        };
        // The variable is not set in the test process, so the default applies.
        if std::env::var_os("STORAGE_MIGRATOR_IMAGE").is_none() {
            assert_eq!(parse(&["sm", "run"]), Ok(ImageRef::default_image()));
        }
        let ok = parse(&["sm", "run", "--image", "localhost:5000/sm:dev"]);
        assert_eq!(ok.unwrap().as_str(), "localhost:5000/sm:dev");
        let err = parse(&["sm", "run", "--image", ""]).unwrap_err();
        assert!(
            err.starts_with("invalid --image (env STORAGE_MIGRATOR_IMAGE): "),
            "{err}"
        );
        assert!(err.contains("empty"), "{err}");
    }

    #[test]
    fn mover_flags_default_to_the_safe_values() {
        let settings = |args: &[&str]| match Cli::try_parse_from(args).unwrap().command {
            Command::Run { image, .. } => image.settings().unwrap(),
            _ => unreachable!(),
        };
        for var in [
            "ALLOW_REQUEST_MOVER_IMAGE",
            "HELPER_START_TIMEOUT",
            "MAX_EVICTIONS",
            "STAGE_TIMEOUT",
            "MAX_COPIES",
            "MAX_COPIES_PER_NODE",
        ] {
            if std::env::var_os(var).is_some() {
                return;
            }
        }
        let d = settings(&["sm", "run"]);
        assert!(!d.allow_request_mover_image);
        assert_eq!(d.helper_start_timeout, Duration::from_secs(180));
        assert_eq!(d.max_evictions, 2);
        assert_eq!(d.stage_timeout, Duration::from_secs(600));
        let st = settings(&["sm", "run", "--stage-timeout", "60"]);
        assert_eq!(st.stage_timeout, Duration::from_secs(60));
        assert!(Cli::try_parse_from(["sm", "run", "--stage-timeout", "1"]).is_err());
        let on = settings(&["sm", "run", "--allow-request-mover-image"]);
        assert!(on.allow_request_mover_image);
        let off = settings(&["sm", "run", "--allow-request-mover-image=false"]);
        assert!(!off.allow_request_mover_image);
        assert_eq!(d.copy_caps, CopyCaps::default());
        let caps = settings(&["sm", "run", "--max-copies", "2", "--max-copies-per-node=1"]);
        assert_eq!(caps.copy_caps.cluster.map(NonZeroU32::get), Some(2));
        assert_eq!(caps.copy_caps.per_node.map(NonZeroU32::get), Some(1));
        assert!(Cli::try_parse_from(["sm", "run", "--max-copies", "0"]).is_err());
        let t = settings(&["sm", "run", "--helper-start-timeout", "30"]);
        assert_eq!(t.helper_start_timeout, Duration::from_secs(30));
        assert!(Cli::try_parse_from(["sm", "run", "--helper-start-timeout", "0"]).is_err());
    }
}
