//! Many requests at once under the operator's copy caps: sampling what runs while they do (the
//! e2e test `fleet` and the benchmark `bench-fleet`).

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use k8s_openapi::api::batch::v1::Job;
use kube::Api;
use kube::api::ListParams;
use storage_migrator::api::{StorageMigrationRequest, conditions};
use storage_migrator::labels::JOB_KIND_LABEL;
use storage_migrator::plan::slots::holding_member;

use super::TestNamespace;

/// How often [`sample_until_final`] looks.
pub const SAMPLE: Duration = Duration::from_millis(200);

/// What the sampling saw.
#[derive(Debug, Default)]
pub struct Seen {
    pub samples: usize,
    /// Most copy Jobs (pre-copy, final copy, verify) not finished at once.
    pub most_jobs: usize,
    /// Most members holding a copy slot at once, by their requests' statuses.
    pub most_holders: usize,
    /// The first `CopySlot` `False` message of each request that waited (`namespace/name`).
    pub waited: Vec<(String, String)>,
    /// Each request's time holding a slot, as sampled (`namespace/name`, seconds).
    pub held: BTreeMap<String, f64>,
    /// From the first sample to the first in which a slot was held, and from the last in which
    /// one was held to the last sample (all final): the parts before and after the copies.
    pub lead_in: Duration,
    pub tail: Duration,
    /// From the first sample to the last.
    pub sampled: Duration,
}

/// One single-member set's script: 8 MiB of random data written once, then idle (a TERM ends
/// it at once).
pub const ONE_MEMBER_SCRIPT: &str = "trap 'exit 0' TERM; [ -f /data/random ] || \
                                     head -c 8388608 /dev/urandom > /data/random; sync; \
                                     while true; do sleep 1; done";

/// Samples the copy Jobs and the requests' slots in `spaces` every [`SAMPLE`] until `expected`
/// requests exist and every one is final; `Err` with each request's summary past `deadline`.
/// Each sample is one list of each kind across the cluster (one resourceVersion: a consistent
/// snapshot), kept to `spaces`.
pub async fn sample_until_final(
    spaces: &[&TestNamespace],
    expected: usize,
    deadline: Instant,
) -> Result<(Seen, Vec<StorageMigrationRequest>), String> {
    let Some(first) = spaces.first() else {
        return Err("no namespace to sample".into());
    };
    let names: BTreeSet<&str> = spaces.iter().map(|ns| ns.name.as_str()).collect();
    let ours = |ns: Option<&String>| ns.is_some_and(|n| names.contains(n.as_str()));
    let requests_api: Api<StorageMigrationRequest> = Api::all(first.client());
    let jobs_api: Api<Job> = Api::all(first.client());
    let copies = ListParams::default().labels(JOB_KIND_LABEL);
    let mut seen = Seen::default();
    let start = Instant::now();
    let mut last = start;
    let (mut first_held, mut last_held) = (None, None);
    loop {
        let listed = requests_api.list(&ListParams::default()).await;
        let requests: Vec<StorageMigrationRequest> = (listed.map_err(|e| e.to_string())?.items)
            .into_iter()
            .filter(|r| ours(r.metadata.namespace.as_ref()))
            .collect();
        let listed = jobs_api.list(&copies).await.map_err(|e| e.to_string())?;
        let jobs = (listed.items.iter())
            .filter(|j| ours(j.metadata.namespace.as_ref()) && copying(j))
            .count();
        let now = Instant::now();
        seen.samples += 1;
        seen.most_jobs = seen.most_jobs.max(jobs);
        let holders: Vec<String> = (requests.iter())
            .filter(|r| r.status.as_ref().and_then(holding_member).is_some())
            .map(request_name)
            .collect();
        seen.most_holders = seen.most_holders.max(holders.len());
        if !holders.is_empty() {
            first_held.get_or_insert(now);
            last_held = Some(now);
        }
        for h in holders {
            *seen.held.entry(h).or_default() += (now - last).as_secs_f64();
        }
        last = now;
        note_waits(&requests, &mut seen);
        let done = requests.iter().filter(|r| final_phase(r)).count();
        if requests.len() == expected && done == expected {
            seen.sampled = now - start;
            seen.lead_in = first_held.map_or(Duration::ZERO, |t| t - start);
            seen.tail = last_held.map_or(Duration::ZERO, |t| now - t);
            return Ok((seen, requests));
        }
        if Instant::now() > deadline {
            let states: Vec<String> = requests.iter().map(super::operator::summary).collect();
            return Err(format!("not all final: {states:#?}"));
        }
        tokio::time::sleep(SAMPLE).await;
    }
}

/// A pre-copy, final copy or verify Job that has not finished.
pub fn copying(job: &Job) -> bool {
    let kind = (job.metadata.labels.as_ref()).and_then(|l| l.get(JOB_KIND_LABEL));
    let finished = (job.status.as_ref())
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| {
            cs.iter()
                .any(|c| matches!(c.type_.as_str(), "Complete" | "Failed") && c.status == "True")
        });
    kind.is_some_and(|k| matches!(k.as_str(), "precopy" | "copy" | "verify")) && !finished
}

fn final_phase(r: &StorageMigrationRequest) -> bool {
    r.status.as_ref().is_some_and(|s| s.phase.is_final())
}

/// `namespace/name` of a request.
pub fn request_name(r: &StorageMigrationRequest) -> String {
    format!(
        "{}/{}",
        r.metadata.namespace.as_deref().unwrap_or_default(),
        r.metadata.name.as_deref().unwrap_or_default()
    )
}

fn note_waits(requests: &[StorageMigrationRequest], seen: &mut Seen) {
    for r in requests {
        let name = request_name(r);
        let waiting = (r.status.as_ref())
            .and_then(|s| conditions::get(&s.conditions, conditions::COPY_SLOT))
            .filter(|c| c.status == "False");
        if let Some(c) = waiting
            && !seen.waited.iter().any(|(n, _)| *n == name)
        {
            seen.waited.push((name, c.message.clone()));
        }
    }
}
