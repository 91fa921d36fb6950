//! The I/O of `kubectl smr fleet` and `kubectl smr watch --all`: list, judge each request with
//! the same preflight as `plan`, print or create; follow many requests. What they decide and
//! print is in [`fleet`] and [`render`].

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::Context as _;
use futures::StreamExt;
use k8s_openapi::api::apps::v1::{Deployment, StatefulSet};
use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use k8s_openapi::api::storage::v1::StorageClass;
use kube::api::{Api, ListParams, PostParams};
use kube::runtime::watcher;
use kube::{Client, ResourceExt};
use serde::de::DeserializeOwned;
use tokio::time::Instant;

use super::fleet::{self, Inventory, Verdict};
use super::{EXIT_DENIED, EXIT_ERROR, Namespaces, cluster, next_before, render, show};
use crate::api::{PlannedWork, StorageMigrationRequest};
use crate::image::ImageRef;
use crate::plan::{Settings, preflight};

/// What `fleet` was asked.
pub struct FleetArgs {
    pub from: String,
    pub to: String,
    pub timeout: String,
    pub apply: bool,
}

fn api<K>(client: &Client, scope: &Namespaces) -> Api<K>
where
    K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope>,
    K::DynamicType: Default,
{
    match scope {
        Namespaces::All => Api::all(client.clone()),
        Namespaces::One(ns) => Api::namespaced(client.clone(), ns),
    }
}

async fn list<K>(client: &Client, scope: &Namespaces, what: &str) -> anyhow::Result<Vec<K>>
where
    K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope>
        + Clone
        + DeserializeOwned
        + std::fmt::Debug,
    K::DynamicType: Default,
{
    Ok(api::<K>(client, scope)
        .list(&ListParams::default())
        .await
        .with_context(|| format!("cannot list {what} {scope}"))?
        .items)
}

/// Refuses what cannot be a fleet before reading anything else: the same class twice, or a
/// target class that does not exist.
async fn check_classes(client: &Client, args: &FleetArgs) -> anyhow::Result<()> {
    if args.from == args.to {
        anyhow::bail!(
            "--from-class and --to-class are both {}: nothing to move",
            args.from
        );
    }
    let classes = Api::<StorageClass>::all(client.clone());
    if classes
        .get_opt(&args.to)
        .await
        .with_context(|| format!("cannot read StorageClass {}", args.to))?
        .is_none()
    {
        anyhow::bail!("StorageClass {} (--to-class) does not exist", args.to);
    }
    Ok(())
}

/// `fleet`: the workloads on `--from-class`, each judged by preflight; their requests printed
/// (YAML on stdout, the plan on stderr) or, with `--apply`, created. Exit 2 when any would be
/// denied (no request is written for those).
pub async fn fleet(client: Client, scope: &Namespaces, args: &FleetArgs) -> anyhow::Result<u8> {
    check_classes(&client, args).await?;
    let sets: Vec<StatefulSet> = list(&client, scope, "StatefulSets").await?;
    let deployments: Vec<Deployment> = list(&client, scope, "Deployments").await?;
    let claims: Vec<PersistentVolumeClaim> = list(&client, scope, "PersistentVolumeClaims").await?;
    let existing: Vec<StorageMigrationRequest> =
        list(&client, scope, "StorageMigrationRequests").await?;
    let inv = Inventory {
        sets: &sets,
        deployments: &deployments,
        claims: &claims,
    };
    let found = fleet::discover(&args.from, &inv);
    if found.is_empty() {
        eprintln!(
            "No workload has a claim on StorageClass {} {scope}.",
            args.from
        );
        return Ok(0);
    }
    let mut verdicts = Vec::new();
    let mut accepted = Vec::new();
    for w in &found {
        let req = fleet::request(w, &args.from, &args.to, &args.timeout);
        let name = req.name_any();
        eprintln!("{}", fleet::workload_line(w, &name));
        if let Some(e) = existing.iter().find(|e| same(e, &req)) {
            let phase = e.status.as_ref().map(|s| s.phase).unwrap_or_default();
            eprintln!("  request {name} exists ({phase:?}); left as it is");
            verdicts.push(Verdict::Requested);
            continue;
        }
        let verdict = judge(&client, req.clone()).await?;
        if matches!(verdict, Verdict::Accepted { .. }) {
            accepted.push(req);
        }
        verdicts.push(verdict);
    }
    eprintln!("{}", fleet::total_line(&args.from, &args.to, &verdicts));
    if args.apply {
        create(&client, &accepted).await?;
        let label = crate::build::names::fleet_label_value(&args.from, &args.to);
        eprintln!(
            "Follow them with: kubectl smr watch --all -l {}={label}{}",
            crate::labels::FLEET_LABEL,
            scope.flag()
        );
    } else {
        for req in &accepted {
            println!("---\n{}", serde_norway::to_string(req)?);
        }
    }
    let denied = verdicts.contains(&Verdict::Denied);
    Ok(if denied { EXIT_DENIED } else { 0 })
}

fn same(a: &StorageMigrationRequest, b: &StorageMigrationRequest) -> bool {
    a.name_any() == b.name_any() && a.namespace() == b.namespace()
}

/// Preflight on `req` as `plan` runs it, its lines printed (on stderr) under the workload.
async fn judge(client: &Client, req: StorageMigrationRequest) -> anyhow::Result<Verdict> {
    let cluster = cluster(client.clone());
    let engine = cluster.engine(&req).await.map_err(|e| e.to_string());
    let observed = cluster.gather(req, &engine).await?;
    let name = observed.request.name_any();
    let created =
        (observed.request.metadata.creation_timestamp.as_ref()).map_or(observed.now, |t| t.0);
    if let Some(ahead) = preflight::waiting_for(&name, Some(created), &observed.other_requests) {
        eprintln!(
            "  would wait for request {} ({:?}) on the same workload first",
            ahead.name, ahead.phase
        );
    }
    let settings = Settings::new(ImageRef::default_image());
    let denials = preflight::all_denials(&observed, &settings);
    if !denials.is_empty() {
        indent(&render::denial_lines(&denials));
        return Ok(Verdict::Denied);
    }
    let plan = preflight::dry_run(&observed, &settings).map_err(|d| anyhow::anyhow!("{d}"))?;
    indent(&render::plan_lines(&plan));
    let rules = crate::engine::rules(&observed.request.spec.database);
    indent(
        &render::handover_line(&plan, rules.handover())
            .into_iter()
            .collect::<Vec<_>>(),
    );
    let moving = || (plan.members.iter()).filter(|m| m.work == PlannedWork::Migrate);
    let bytes = moving()
        .flat_map(|m| {
            std::iter::once(&m.old_size).chain(m.further_claims.iter().map(|c| &c.old_size))
        })
        .filter_map(crate::quantity::bytes)
        .sum();
    Ok(Verdict::Accepted {
        members: moving().count(),
        bytes,
    })
}

fn indent(lines: &[String]) {
    for l in lines {
        eprintln!("  {l}");
    }
}

/// Creates the requests; one that exists already (409) is left as it is and said so.
async fn create(client: &Client, requests: &[StorageMigrationRequest]) -> anyhow::Result<()> {
    for req in requests {
        let ns = req.namespace().unwrap_or_default();
        let api = Api::<StorageMigrationRequest>::namespaced(client.clone(), &ns);
        match api.create(&PostParams::default(), req).await {
            Ok(_) => println!("storagemigrationrequest/{} created in {ns}", req.name_any()),
            Err(kube::Error::Api(e)) if e.code == 409 => println!(
                "storagemigrationrequest/{} exists in {ns}; left as it is",
                req.name_any()
            ),
            Err(e) => {
                return Err(e).with_context(|| format!("cannot create {ns}/{}", req.name_any()));
            }
        }
    }
    Ok(())
}

/// `watch --all`: every request in scope (matching `selector`), one line each, until all have
/// ended; the exit status of the worst (3 a Failed, 2 a Denied, 0 all Successful).
pub async fn watch_all(
    client: Client,
    scope: &Namespaces,
    selector: Option<&str>,
    timeout: u64,
) -> anyhow::Result<u8> {
    let api = api::<StorageMigrationRequest>(&client, scope);
    let mut config = watcher::Config::default();
    if let Some(s) = selector {
        config = config.labels(s);
    }
    let mut events = crate::cluster::watch_retry::retried(watcher(api, config)).boxed();
    let deadline = (timeout > 0).then(|| Instant::now() + Duration::from_secs(timeout));
    let tty = std::io::IsTerminal::is_terminal(&std::io::stdout());
    let (mut seen, mut listed, mut shown) = (BTreeMap::new(), false, Vec::new());
    loop {
        let Some(next) = next_before(&mut events, deadline).await else {
            eprintln!("gave up after {timeout}s; the requests go on");
            return Ok(EXIT_ERROR);
        };
        match next {
            Some(Ok(watcher::Event::Apply(r) | watcher::Event::InitApply(r))) => {
                seen.insert(key(&r), r.status.unwrap_or_default());
            }
            Some(Ok(watcher::Event::Delete(r))) => {
                seen.remove(&key(&r));
            }
            Some(Ok(watcher::Event::Init)) => continue,
            Some(Ok(watcher::Event::InitDone)) => listed = true,
            Some(Err(e)) => {
                eprintln!("watching the requests {scope}: {e}; retrying");
                continue;
            }
            None => anyhow::bail!("the watch of the requests {scope} ended"),
        }
        if !listed {
            continue;
        }
        if seen.is_empty() {
            anyhow::bail!("no StorageMigrationRequest {scope}{}", matching(selector));
        }
        show(&render::all_lines(&seen), &mut shown, tty);
        if let Some(code) = render::all_exit_code(seen.values().map(|s| s.phase)) {
            return Ok(code);
        }
    }
}

fn key(r: &StorageMigrationRequest) -> String {
    format!("{}/{}", r.namespace().unwrap_or_default(), r.name_any())
}

fn matching(selector: Option<&str>) -> String {
    selector.map_or_else(String::new, |s| format!(" matches {s}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plugin::fleet::Workload;

    #[test]
    fn a_workload_is_judged_once_per_name_and_namespace() {
        let w = Workload {
            namespace: "a".into(),
            kind: crate::api::TargetKind::StatefulSet,
            name: "etcd".into(),
            templates: Vec::new(),
            claims: vec!["data-etcd-0".into()],
        };
        let r = fleet::request(&w, "old", "new", "1h");
        let mut other = r.clone();
        assert!(same(&r, &other));
        other.metadata.namespace = Some("b".into());
        assert!(!same(&r, &other));
    }
}
