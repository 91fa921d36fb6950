//! Availability as a client watching the pods sees it: each pod's outages, from the first event
//! showing it deleted or not Ready to the first showing it Ready again.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use kube::api::Api;
use kube::runtime::{WatchStreamExt, watcher};
use tracing::warn;

use crate::workload::SET;

#[derive(Debug, Default)]
pub struct PodAvailability {
    down_since: Option<Instant>,
    down_total: Duration,
    outages: u32,
}

#[derive(Debug, Default)]
pub struct Availability {
    pods: BTreeMap<String, PodAvailability>,
}

impl Availability {
    pub fn observe(&mut self, pod: &str, serving: bool, at: Instant) {
        let p = self.pods.entry(pod.to_string()).or_default();
        match (serving, p.down_since) {
            (false, None) => {
                p.down_since = Some(at);
                p.outages += 1;
            }
            (true, Some(since)) => {
                p.down_total += at.saturating_duration_since(since);
                p.down_since = None;
            }
            _ => {}
        }
    }

    /// The unavailability of `pod` once it has had an outage and is serving again.
    pub fn recovered(&self, pod: &str) -> Option<Duration> {
        let p = self.pods.get(pod)?;
        (p.outages > 0 && p.down_since.is_none()).then_some(p.down_total)
    }

    /// Total unavailability of `pod`; an outage still open counts until `now`.
    pub fn down(&self, pod: &str, now: Instant) -> Option<Duration> {
        let p = self.pods.get(pod)?;
        let open = p
            .down_since
            .map(|s| now.saturating_duration_since(s))
            .unwrap_or_default();
        Some(p.down_total + open)
    }
}

fn serving(pod: &Pod) -> bool {
    pod.metadata.deletion_timestamp.is_none()
        && pod
            .status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// Watches the set's pods and records each one's outages until aborted.
pub fn watch_availability(
    api: Api<Pod>,
) -> (tokio::task::JoinHandle<()>, Arc<Mutex<Availability>>) {
    let state = Arc::new(Mutex::new(Availability::default()));
    let shared = state.clone();
    let task = tokio::spawn(async move {
        let config = watcher::Config::default().labels(&format!("app={SET}"));
        let mut stream = watcher::watcher(api, config).default_backoff().boxed();
        while let Some(event) = stream.next().await {
            let now = Instant::now();
            let (pod, up) = match event {
                Ok(watcher::Event::Apply(p) | watcher::Event::InitApply(p)) => {
                    let up = serving(&p);
                    (p.name_any(), up)
                }
                Ok(watcher::Event::Delete(p)) => (p.name_any(), false),
                Ok(_) => continue,
                Err(e) => {
                    warn!(error = %e, "pod watch error (retrying)");
                    continue;
                }
            };
            if let Ok(mut a) = shared.lock() {
                a.observe(&pod, up, now);
            }
        }
    });
    (task, state)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn availability_counts_outages_until_ready_again() {
        let t0 = Instant::now();
        let mut a = Availability::default();
        a.observe("p", true, t0);
        a.observe("p", false, t0 + Duration::from_secs(1));
        a.observe("p", false, t0 + Duration::from_secs(2)); // still down: no new outage
        a.observe("p", true, t0 + Duration::from_millis(4500));
        assert_eq!(a.down("p", t0), Some(Duration::from_millis(3500)));
        a.observe("p", false, t0 + Duration::from_secs(10));
        assert_eq!(
            a.down("p", t0 + Duration::from_secs(11)),
            Some(Duration::from_millis(4500))
        );
        assert_eq!(a.pods["p"].outages, 2);
        assert_eq!(a.down("q", t0), None);
        assert_eq!(a.recovered("p"), None, "down again");
        a.observe("p", true, t0 + Duration::from_secs(12));
        assert_eq!(a.recovered("p"), Some(Duration::from_millis(5500)));
        a.observe("q", true, t0);
        assert_eq!(a.recovered("q"), None, "never down");
    }
}
