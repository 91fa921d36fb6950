//! `kubectl smr`, the kubectl plugin (binary `kubectl-smr`): plan, watch, describe, abort,
//! orphans and fleet against the cluster the user's KUBECONFIG names.
//!
//! The commands read with the user's own credentials and write only on request: `abort` adds
//! the annotation [`labels::ABORT_ANNOTATION`], `orphans --delete` deletes volumes after
//! confirmation, `fleet --apply` creates requests. What they print is built by pure functions in [`render`] and [`orphans`].

use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::time::Duration;

use futures::StreamExt;
use kube::runtime::watcher;
use tokio::time::Instant;

use anyhow::Context as _;
use clap::{CommandFactory, Parser, Subcommand};
use k8s_openapi::api::core::v1::{Event, PersistentVolume, PersistentVolumeClaim};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, Preconditions};
use kube::{Client, ResourceExt};

use crate::api::{MigrationType, StorageMigrationRequest};
use crate::cluster::Cluster;
use crate::image::ImageRef;
use crate::labels;
use crate::plan::{Settings, claims, preflight};

pub mod fleet;
mod fleet_cmd;
pub mod orphans;
pub mod render;

/// Exit status of a command that failed to run (no cluster, no such request, refused).
pub const EXIT_ERROR: u8 = 1;
/// Exit status of `plan` when the request would be denied (and of `watch` on `Denied`).
pub const EXIT_DENIED: u8 = 2;

/// See a StorageMigrationRequest through: plan it, watch it, describe it, abort it, and find
/// the volumes left behind.
#[derive(Parser)]
#[command(name = "kubectl-smr", bin_name = "kubectl smr", version)]
pub struct Cli {
    /// Namespace (default: the kubeconfig's).
    #[arg(short = 'n', long, global = true)]
    namespace: Option<String>,
    /// Every namespace (`fleet`, `watch --all`).
    #[arg(short = 'A', long, global = true, conflicts_with = "namespace")]
    all_namespaces: bool,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Dry run against the live cluster: the member order with roles, nodes and sizes, what a
    /// Shrink measures, and every reason the request would be denied (exit 2). Writes nothing.
    Plan {
        /// The StorageMigrationRequest manifest.
        #[arg(short = 'f', long)]
        file: PathBuf,
        /// Judge `spec.copy.moverImage` as an operator started with
        /// `--allow-request-mover-image` would (default: as the chart's default, which denies it).
        #[arg(long)]
        allow_request_mover_image: bool,
    },
    /// Follow a request to its end: per-member progress (bytes, rate, ETA, step), then the final
    /// phase and each member's downtime. Exit 0 Successful, 3 Failed, 2 Denied.
    ///
    /// With `--all` (and `-A` for every namespace), every request in scope, one line each, until
    /// all have ended: exit 3 when one Failed, else 2 when one was Denied, else 0.
    Watch {
        #[arg(required_unless_present = "all")]
        name: Option<String>,
        /// Every request in the namespace (`-A`: in every namespace) instead of one.
        #[arg(long, conflicts_with = "name")]
        all: bool,
        /// With --all: only the requests with these labels (e.g. storagemigrator.io/fleet=a-to-b).
        #[arg(short = 'l', long, requires = "all")]
        selector: Option<String>,
        /// Give up after this many seconds (exit 1); 0 waits for the end.
        #[arg(long, default_value_t = 0)]
        timeout: u64,
    },
    /// The plan, each member's steps with times and where its data is now, and the events.
    Describe { name: String },
    /// Ask the operator to roll the request back (annotation storagemigrator.io/abort).
    Abort { name: String },
    /// PersistentVolumes no claim refers to and no request keeps (any namespace), with the
    /// command to delete each; a failed request's volumes under their own heading.
    Orphans {
        /// Only these volumes (with --delete: each must be an orphan, or nothing is deleted).
        volumes: Vec<String>,
        /// Only volumes with these labels (a label selector, as `kubectl get pv -l`).
        #[arg(short = 'l', long)]
        selector: Option<String>,
        /// Only volumes of this StorageClass.
        #[arg(long)]
        storage_class: Option<String>,
        /// Delete the orphans in scope (after confirmation); never a volume a request keeps.
        #[arg(long)]
        delete: bool,
        /// Confirm the deletion without asking (for scripts).
        #[arg(long, requires = "delete")]
        yes: bool,
    },
    /// Retire a StorageClass: every StatefulSet, Deployment and claim with a claim on
    /// --from-class (in the namespace, or with -A in every one), each with the request that moves
    /// it to --to-class, judged by the same preflight as `plan`. The plan goes to stderr, the
    /// requests that would be accepted to stdout as YAML (for `kubectl apply -f`); with --apply
    /// they are created. Exit 2 when any would be denied (no request is written for it).
    Fleet {
        /// The StorageClass to move off.
        #[arg(long)]
        from_class: String,
        /// The StorageClass to move to.
        #[arg(long)]
        to_class: String,
        /// spec.timeout of every request; it counts while a request waits for a copy slot under
        /// the operator's --max-copies, so cover the whole fleet.
        #[arg(long, default_value = "24h")]
        timeout: String,
        /// Create the requests instead of printing them (engine Generic: to move a database
        /// quorum-aware, print them, set spec.database, then apply).
        #[arg(long)]
        apply: bool,
    },
    /// Print a shell completion script.
    Completion { shell: clap_complete::Shell },
}

/// Runs the command line; the process's exit status.
pub async fn main() -> u8 {
    let cli = Cli::parse();
    match run(cli).await {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            EXIT_ERROR
        }
    }
}

async fn run(cli: Cli) -> anyhow::Result<u8> {
    if let Command::Completion { shell } = cli.command {
        let mut cmd = Cli::command();
        clap_complete::generate(shell, &mut cmd, "kubectl-smr", &mut std::io::stdout());
        return Ok(0);
    }
    let client = Client::try_default()
        .await
        .context("cannot build a Kubernetes client (KUBECONFIG?)")?;
    let ns = cli
        .namespace
        .unwrap_or_else(|| client.default_namespace().to_string());
    let scope = if cli.all_namespaces {
        Namespaces::All
    } else {
        Namespaces::One(ns.clone())
    };
    match cli.command {
        Command::Plan {
            file,
            allow_request_mover_image,
        } => plan(client, &file, ns, allow_request_mover_image).await,
        Command::Watch {
            name: Some(name),
            timeout,
            ..
        } => watch(client, &ns, &name, timeout).await,
        Command::Watch {
            selector, timeout, ..
        } => fleet_cmd::watch_all(client, &scope, selector.as_deref(), timeout).await,
        Command::Fleet {
            from_class,
            to_class,
            timeout,
            apply,
        } => {
            let args = fleet_cmd::FleetArgs {
                from: from_class,
                to: to_class,
                timeout,
                apply,
            };
            fleet_cmd::fleet(client, &scope, &args).await
        }
        Command::Describe { name } => describe(client, &ns, &name).await,
        Command::Abort { name } => abort(client, &ns, &name).await,
        Command::Orphans {
            volumes,
            selector,
            storage_class,
            delete,
            yes,
        } => {
            let scope = orphans::Scope {
                selector,
                storage_class,
                names: volumes,
            };
            orphans_cmd(client, &scope, delete, yes).await
        }
        Command::Completion { .. } => Ok(0),
    }
}

/// The namespaces a command covers: the one of `-n` (or the kubeconfig's), or all (`-A`).
pub enum Namespaces {
    One(String),
    All,
}

impl Namespaces {
    /// The flag that names this scope again on a command line: ` -n <ns>` or ` -A`.
    fn flag(&self) -> String {
        match self {
            Namespaces::One(ns) => format!(" -n {ns}"),
            Namespaces::All => " -A".to_string(),
        }
    }
}

impl std::fmt::Display for Namespaces {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Namespaces::One(ns) => write!(f, "in namespace {ns}"),
            Namespaces::All => write!(f, "in any namespace"),
        }
    }
}

fn print_lines(lines: &[String]) {
    for l in lines {
        println!("{l}");
    }
}

/// The request in `file`, in its namespace or `ns`, as a new request (no status).
fn read_request(file: &Path, ns: String) -> anyhow::Result<StorageMigrationRequest> {
    let text =
        std::fs::read_to_string(file).with_context(|| format!("cannot read {}", file.display()))?;
    let mut req: StorageMigrationRequest = serde_norway::from_str(&text)
        .with_context(|| format!("{} is not a StorageMigrationRequest", file.display()))?;
    if req.metadata.namespace.is_none() {
        req.metadata.namespace = Some(ns);
    }
    req.status = None;
    Ok(req)
}

fn cluster(client: Client) -> Cluster {
    let recorder = kube::runtime::events::Recorder::new(
        client.clone(),
        kube::runtime::events::Reporter {
            controller: "kubectl-smr".into(),
            instance: None,
        },
    );
    Cluster::new(client, recorder)
}

/// `plan`: gathers what the operator would see (reads only), then every denial or the plan.
async fn plan(
    client: Client,
    file: &Path,
    ns: String,
    allow_mover_image: bool,
) -> anyhow::Result<u8> {
    let req = read_request(file, ns)?;
    let cluster_client = client.clone();
    let cluster = cluster(client);
    let engine = cluster.engine(&req).await.map_err(|e| e.to_string());
    let observed = cluster.gather(req, &engine).await?;
    let name = observed.request.name_any();
    let created =
        (observed.request.metadata.creation_timestamp.as_ref()).map_or(observed.now, |t| t.0);
    if let Some(ahead) = preflight::waiting_for(&name, Some(created), &observed.other_requests) {
        println!(
            "Would wait for request {} ({:?}) on the same workload first; then:",
            ahead.name, ahead.phase
        );
    }
    // The image only names the Jobs; nothing is created. The operator's own flags are not
    // known here: `--allow-request-mover-image` says it runs with that flag.
    let mut settings = Settings::new(ImageRef::default_image());
    settings.allow_request_mover_image = allow_mover_image;
    let denials = preflight::all_denials(&observed, &settings);
    if !denials.is_empty() {
        print_lines(&render::denial_lines(&denials));
        return Ok(EXIT_DENIED);
    }
    let plan = preflight::dry_run(&observed, &settings).map_err(|d| anyhow::anyhow!("{d}"))?;
    println!("Would be accepted. Members in migration order:");
    print_lines(&render::plan_lines(&plan));
    let rules = crate::engine::rules(&observed.request.spec.database);
    print_lines(
        &render::handover_line(&plan, rules.handover())
            .into_iter()
            .collect::<Vec<_>>(),
    );
    if observed.request.spec.type_ == MigrationType::Shrink {
        print_lines(&render::shrink_measurement_lines(&plan));
    }
    let ns = observed.request.namespace().unwrap_or_default();
    let earlier = Api::<StorageMigrationRequest>::namespaced(cluster_client, &ns)
        .list(&ListParams::default())
        .await
        .with_context(|| format!("listing the requests of namespace {ns}"))?;
    let history = render::downtime_history(&earlier.items);
    print_lines(&render::downtime_lines(&plan, &history, &ns));
    Ok(0)
}

async fn get_request(
    client: &Client,
    ns: &str,
    name: &str,
) -> anyhow::Result<StorageMigrationRequest> {
    Api::<StorageMigrationRequest>::namespaced(client.clone(), ns)
        .get(name)
        .await
        .with_context(|| format!("cannot read StorageMigrationRequest {ns}/{name}"))
}

/// `watch`: follows the request through a watch on it (every status write shows at once);
/// redraws in place on a terminal, elsewhere prints a line whenever one changed.
async fn watch(client: Client, ns: &str, name: &str, timeout: u64) -> anyhow::Result<u8> {
    // A clear error when there is no such request, before waiting on a watch.
    get_request(&client, ns, name).await?;
    let api = Api::<StorageMigrationRequest>::namespaced(client, ns);
    let fields = watcher::Config::default().fields(&format!("metadata.name={name}"));
    let mut events = crate::cluster::watch_retry::retried(watcher(api, fields)).boxed();
    let deadline = (timeout > 0).then(|| Instant::now() + Duration::from_secs(timeout));
    let tty = std::io::stdout().is_terminal();
    let mut shown: Vec<String> = Vec::new();
    loop {
        let Some(next) = next_before(&mut events, deadline).await else {
            eprintln!("gave up after {timeout}s; the request goes on");
            return Ok(EXIT_ERROR);
        };
        let req = match next {
            Some(Ok(watcher::Event::Apply(req) | watcher::Event::InitApply(req))) => req,
            Some(Ok(watcher::Event::Delete(_))) => {
                anyhow::bail!("StorageMigrationRequest {ns}/{name} was deleted")
            }
            Some(Ok(watcher::Event::Init | watcher::Event::InitDone)) => continue,
            // The watcher retries with a backoff; say why it had to.
            Some(Err(e)) => {
                eprintln!("watching {ns}/{name}: {e}; retrying");
                continue;
            }
            None => anyhow::bail!("the watch of StorageMigrationRequest {ns}/{name} ended"),
        };
        let status = req.status.clone().unwrap_or_default();
        show(&render::watch_lines(name, &status), &mut shown, tty);
        if let Some(code) = render::exit_code(status.phase) {
            print_lines(&render::final_lines(name, &status));
            return Ok(code);
        }
    }
}

/// The stream's next item, or `None` once `deadline` (if any) has passed first.
async fn next_before<S: futures::Stream + Unpin>(
    events: &mut S,
    deadline: Option<Instant>,
) -> Option<Option<S::Item>> {
    match deadline {
        Some(at) => tokio::time::timeout_at(at, events.next()).await.ok(),
        None => Some(events.next().await),
    }
}

/// Prints `lines`: on a terminal, on a cleared screen (as `watch(1)` does: lines wider than the
/// terminal wrap, so redrawing over the previous lines would miscount); else only the lines that
/// changed.
fn show(lines: &[String], shown: &mut Vec<String>, tty: bool) {
    let mut out = std::io::stdout().lock();
    if tty {
        let _ = write!(out, "\x1b[H\x1b[2J");
        for l in lines {
            let _ = writeln!(out, "{l}");
        }
    } else {
        for (i, l) in lines.iter().enumerate() {
            if shown.get(i) != Some(l) {
                let _ = writeln!(out, "{l}");
            }
        }
    }
    let _ = out.flush();
    *shown = lines.to_vec();
}

/// `describe`: status, plan, members with times and data location, events.
async fn describe(client: Client, ns: &str, name: &str) -> anyhow::Result<u8> {
    let req = get_request(&client, ns, name).await?;
    let s = req.status.clone().unwrap_or_default();
    print_lines(&[render::header_line(name, &s)]);
    for (label, v) in [("Message", &s.message), ("Failure", &s.failure)] {
        if let Some(v) = v {
            println!("{label}: {v}");
        }
    }
    match &s.plan {
        Some(plan) => {
            println!("Plan:");
            print_lines(&render::plan_lines(plan));
        }
        None => println!("Plan: none yet"),
    }
    println!("Members:");
    for m in &s.members {
        let planned = (s.plan.as_ref()).and_then(|p| p.members.iter().find(|p| p.pod == m.pod));
        println!("  {} {:?}", m.pod, m.step);
        println!("    {:<12} {}", "data", render::data_location(m, planned));
        // A member's further claims (a further volumeClaimTemplate each) move in its stop.
        let claims = planned
            .map(|p| claims::member_claims(p, m))
            .unwrap_or_default();
        for c in claims.iter().skip(1) {
            let location = render::data_location(&c.status, Some(&c.planned));
            let template = c.template.as_deref().unwrap_or_default();
            println!("    {template:<12} {location}");
        }
        print_lines(&render::member_times(m));
    }
    println!("Events:");
    print_lines(&event_lines(&client, ns, &req).await?);
    Ok(0)
}

async fn event_lines(
    client: &Client,
    ns: &str,
    req: &StorageMigrationRequest,
) -> anyhow::Result<Vec<String>> {
    let selector = format!("involvedObject.name={}", req.name_any());
    let mut events: Vec<Event> = Api::<Event>::namespaced(client.clone(), ns)
        .list(&ListParams::default().fields(&selector))
        .await
        .context("cannot list events")?
        .items
        .into_iter()
        .filter(|e| e.involved_object.uid == req.uid())
        .collect();
    events.sort_by_key(|e| {
        (e.event_time.as_ref().map(|t| t.0))
            .or(e.last_timestamp.as_ref().map(|t| t.0))
            .or(e.metadata.creation_timestamp.as_ref().map(|t| t.0))
    });
    Ok(events.iter().map(render::event_line).collect())
}

/// `abort`: the annotation the operator honours by rolling back.
async fn abort(client: Client, ns: &str, name: &str) -> anyhow::Result<u8> {
    let req = get_request(&client, ns, name).await?;
    let s = req.status.clone().unwrap_or_default();
    if let Some(line) = render::abort_refusal(name, &s) {
        eprintln!("{line}");
        return Ok(EXIT_ERROR);
    }
    let now = k8s_openapi::jiff::Timestamp::now().to_string();
    let patch = serde_json::json!({"metadata": {"annotations": {labels::ABORT_ANNOTATION: now}}});
    Api::<StorageMigrationRequest>::namespaced(client, ns)
        .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .with_context(|| format!("cannot annotate {ns}/{name}"))?;
    println!(
        "{name}: asked the operator to roll back ({}={now}); follow it with: kubectl smr watch {name} -n {ns}",
        labels::ABORT_ANNOTATION
    );
    Ok(0)
}

/// `orphans`: lists them; with `--delete`, deletes the orphans in `scope` after confirmation.
async fn orphans_cmd(
    client: Client,
    scope: &orphans::Scope,
    delete: bool,
    yes: bool,
) -> anyhow::Result<u8> {
    let mut list = ListParams::default();
    if let Some(selector) = &scope.selector {
        list = list.labels(selector);
    }
    let pvs = Api::<PersistentVolume>::all(client.clone())
        .list(&list)
        .await
        .context("cannot list PersistentVolumes")?
        .items;
    let claims = Api::<PersistentVolumeClaim>::all(client.clone())
        .list(&ListParams::default())
        .await
        .context("cannot list PersistentVolumeClaims")?
        .items;
    let named = orphans::namings(&requests(&client).await?);
    let now = k8s_openapi::jiff::Timestamp::now();
    let survey = orphans::survey(&pvs, &claims, &named, scope, now);
    print_lines(&orphans::report(&survey));
    if !delete {
        return Ok(0);
    }
    let found = match orphans::to_delete(&survey, scope) {
        Ok(found) => found,
        Err(refused) => {
            eprintln!("Nothing deleted:");
            refused.iter().for_each(|r| eprintln!("  {r}"));
            return Ok(EXIT_ERROR);
        }
    };
    if found.is_empty() {
        return Ok(0);
    }
    if !yes && !confirm(found.len())? {
        println!("Nothing deleted.");
        return Ok(EXIT_ERROR);
    }
    let api = Api::<PersistentVolume>::all(client);
    for o in &found {
        // The uid precondition: a volume replaced since it was listed is not deleted.
        let params = DeleteParams {
            preconditions: Some(Preconditions {
                uid: Some(o.uid.clone()),
                resource_version: None,
            }),
            ..Default::default()
        };
        api.delete(&o.name, &params)
            .await
            .with_context(|| format!("cannot delete PersistentVolume {}", o.name))?;
        println!("persistentvolume/{} deleted", o.name);
    }
    Ok(0)
}

/// Every request of the cluster, whatever its phase: each keeps the volumes it names (see
/// [`orphans`]). None where the CRD is not installed (the API server answers 404).
async fn requests(client: &Client) -> anyhow::Result<Vec<StorageMigrationRequest>> {
    let listed = Api::<StorageMigrationRequest>::all(client.clone())
        .list(&ListParams::default())
        .await;
    match listed {
        Err(kube::Error::Api(e)) if e.code == 404 => Ok(Vec::new()),
        other => Ok(other.context("cannot list StorageMigrationRequests")?.items),
    }
}

/// Asks on the terminal; refuses without one.
fn confirm(n: usize) -> anyhow::Result<bool> {
    if !std::io::stdin().is_terminal() {
        anyhow::bail!("--delete without --yes needs a terminal to confirm on; nothing deleted");
    }
    print!("Delete these {n} PersistentVolumes? Their data may be lost. [y/N] ");
    std::io::stdout().flush()?;
    let mut answer = String::new();
    std::io::stdin().read_line(&mut answer)?;
    Ok(render::confirmed(&answer))
}
