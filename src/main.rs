use std::path::PathBuf;

use anyhow::Context as _;
use clap::{Parser, Subcommand, ValueEnum};
use kube::{CustomResourceExt, ResourceExt};

use storage_migrator::api::StorageMigrationRequest;
use storage_migrator::cluster::Cluster;
use storage_migrator::plan::preflight;

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

#[derive(Subcommand)]
enum Command {
    /// Print the CustomResourceDefinition YAML.
    Crd,
    /// Run the controller (KUBECONFIG or in-cluster config).
    Run {
        /// Watch only this namespace (default: all namespaces).
        #[arg(long, env = "WATCH_NAMESPACE")]
        namespace: Option<String>,
        /// Log format.
        #[arg(long, value_enum, default_value = "text")]
        log_format: LogFormat,
    },
    /// Dry run: print the plan a request YAML would get on the current cluster (no writes).
    Plan {
        /// The StorageMigrationRequest manifest.
        #[arg(short = 'f', long)]
        file: PathBuf,
        /// Namespace, when the manifest has none (default: the kubeconfig's).
        #[arg(short = 'n', long)]
        namespace: Option<String>,
    },
}

fn init_tracing(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info,kube=warn"));
    // Colours only on a terminal: a log file or a container log gets plain text.
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stdout()));
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    match Cli::parse().command {
        Command::Crd => {
            print!(
                "{}",
                serde_norway::to_string(&StorageMigrationRequest::crd())?
            );
        }
        Command::Run {
            namespace,
            log_format,
        } => {
            init_tracing(log_format);
            let _failpoints = storage_migrator::failpoints::setup();
            let client = kube::Client::try_default()
                .await
                .context("cannot build a Kubernetes client (KUBECONFIG?)")?;
            storage_migrator::controller::run(client, namespace).await;
        }
        Command::Plan { file, namespace } => {
            init_tracing(LogFormat::Text);
            let text = std::fs::read_to_string(&file)
                .with_context(|| format!("cannot read {}", file.display()))?;
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
            let created = (observed.request.metadata.creation_timestamp.as_ref())
                .map_or(observed.now, |t| t.0);
            let name = observed.request.name_any();
            if let Some(ahead) =
                preflight::waiting_for(&name, Some(created), &observed.other_requests)
            {
                println!(
                    "# would wait for request {} ({:?}) on the same StatefulSet; then:",
                    ahead.name, ahead.phase
                );
            }
            match preflight::dry_run(&observed) {
                Ok(plan) => {
                    println!("# would be accepted; the plan (members in migration order):");
                    print!("{}", serde_norway::to_string(&plan)?);
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
        }
    }
    Ok(())
}
