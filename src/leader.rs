//! Leader election: only the replica holding the Lease reconciles and writes.
//!
//! The Lease is managed by `kube-lease-manager` (server-side apply on a `coordination.k8s.io/v1`
//! Lease; a holder renews `grace` seconds before `duration` runs out; a candidate takes over
//! only once the lease has expired by its own clock). That crate reports gaining and losing the
//! lease, but a holder that cannot renew (API server unreachable, partitioned node) keeps
//! believing it leads. So the controller also runs under a **fence**: this replica reads the
//! Lease itself every [`FENCE_PERIOD`] and stops acting at `renewTime + duration - grace / 2`
//! unless a later renewal of its own is on record. The holder renews at `renewTime + duration -
//! grace`, so a working holder is never fenced; stopping `grace / 2` before the lease expires
//! leaves room for clock skew and for calls already sent, so a replica that loses the lease has
//! stopped before another can start (defaults: renewal every 10 s, fence at 12.5 s, takeover
//! after 15 s). After losing the lease the process exits (as Kubernetes' own controllers do), and
//! its restart waits as a follower.
//!
//! Each candidate applies the Lease under a field manager of its own (the crate's default,
//! derived from the identity): server-side apply then refuses a second holder as a conflict.

use std::future::Future;
use std::time::{Duration, SystemTime};

use k8s_openapi::api::coordination::v1::Lease;
use kube::{Api, Client};
use kube_lease_manager::{LeaseManager, LeaseManagerBuilder, LeaseManagerError};
use thiserror::Error;
use tracing::{info, warn};

/// How often the fence reads the Lease.
pub const FENCE_PERIOD: Duration = Duration::from_secs(1);

/// Where the Lease is and who this replica is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseConfig {
    pub name: String,
    pub namespace: String,
    pub identity: String,
    /// How long a renewal is valid.
    pub duration: Duration,
    /// How long before the end the holder renews; the fence stops acting half of it before
    /// the end.
    pub grace: Duration,
}

#[derive(Debug, Error)]
pub enum LeaderError {
    #[error("leader election on Lease {namespace}/{name}: {source}")]
    Lease {
        namespace: String,
        name: String,
        source: LeaseManagerError,
    },
    #[error(
        "invalid leader election timing: --lease-grace ({grace:?}) must be at least 2 s and shorter than --lease-duration ({duration:?})"
    )]
    Timing { duration: Duration, grace: Duration },
}

/// How a term as leader ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Term {
    /// The work ended on its own (a shutdown signal); the lease was released.
    Finished,
    /// Another replica holds the lease now.
    Lost,
    /// No renewal of ours is on record in time (API server unreachable, or the lease changed
    /// hands without us noticing): stopped acting before the lease can expire for others.
    Fenced(String),
}

/// What the fence concludes from one reading of the Lease.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FenceVerdict {
    /// Still ours: act until this time at the latest.
    Valid(SystemTime),
    Stop(String),
}

impl LeaseConfig {
    pub fn validate(&self) -> Result<(), LeaderError> {
        if self.grace < Duration::from_secs(2) || self.grace >= self.duration {
            return Err(LeaderError::Timing {
                duration: self.duration,
                grace: self.grace,
            });
        }
        Ok(())
    }

    /// When this replica must stop acting, judged from the Lease as read (pure).
    pub fn fence(&self, lease: Option<&Lease>) -> FenceVerdict {
        let Some(spec) = lease.and_then(|l| l.spec.as_ref()) else {
            return FenceVerdict::Stop(format!("Lease {}/{} is gone", self.namespace, self.name));
        };
        if spec.holder_identity.as_deref() != Some(self.identity.as_str()) {
            return FenceVerdict::Stop(format!(
                "Lease {}/{} is held by {}",
                self.namespace,
                self.name,
                spec.holder_identity.as_deref().unwrap_or("nobody")
            ));
        }
        let Some(renewed) = spec.renew_time.as_ref() else {
            return FenceVerdict::Stop("the Lease has no renewTime".into());
        };
        let renewed = SystemTime::from(renewed.0);
        FenceVerdict::Valid(renewed + self.margin())
    }

    fn lease_error(&self, source: LeaseManagerError) -> LeaderError {
        LeaderError::Lease {
            namespace: self.namespace.clone(),
            name: self.name.clone(),
            source,
        }
    }

    /// How long after a renewal this replica may act: `duration - grace / 2`.
    pub fn margin(&self) -> Duration {
        self.duration.saturating_sub(self.grace / 2)
    }
}

/// Builds the lease manager (reads or creates the Lease: the first API calls of leader
/// election).
pub async fn connect(client: Client, cfg: &LeaseConfig) -> Result<LeaseManager, LeaderError> {
    cfg.validate()?;
    LeaseManagerBuilder::new(client, &cfg.name)
        .with_namespace(&cfg.namespace)
        .with_identity(&cfg.identity)
        .with_duration(cfg.duration.as_secs())
        .with_grace(cfg.grace.as_secs())
        .build()
        .await
        .map_err(|source| cfg.lease_error(source))
}

/// Runs `work` only while this replica holds the lease of `manager` (from [`connect`]);
/// `on_role(true/false)` reports the role. Returns when `work` finishes (the lease is then
/// released) or when leadership ends.
pub async fn lead<W, F>(
    manager: LeaseManager,
    client: Client,
    cfg: &LeaseConfig,
    on_role: impl Fn(bool),
    work: W,
) -> Result<Term, LeaderError>
where
    W: FnOnce() -> F,
    F: Future<Output = ()>,
{
    let lease_err = |source| cfg.lease_error(source);
    let (mut leading, task) = manager.watch().await;
    on_role(false);
    info!(lease = %format!("{}/{}", cfg.namespace, cfg.name), identity = %cfg.identity,
        "waiting to become the leader");
    while !*leading.borrow_and_update() {
        if leading.changed().await.is_err() {
            return finish(task, Term::Lost).await.map_err(lease_err);
        }
    }
    info!(identity = %cfg.identity, "became the leader");
    on_role(true);
    let leases: Api<Lease> = Api::namespaced(client, &cfg.namespace);
    let term = tokio::select! {
        () = work() => Term::Finished,
        () = lost(&mut leading) => Term::Lost,
        reason = fenced(&leases, cfg) => Term::Fenced(reason),
    };
    on_role(false);
    drop(leading);
    finish(task, term).await.map_err(lease_err)
}

/// Resolves once the lease manager reports the lease lost (or stops reporting).
async fn lost(leading: &mut tokio::sync::watch::Receiver<bool>) {
    loop {
        if leading.changed().await.is_err() || !*leading.borrow_and_update() {
            return;
        }
    }
}

/// Resolves, with the reason, once no renewal of ours is valid any more.
async fn fenced(leases: &Api<Lease>, cfg: &LeaseConfig) -> String {
    // Before the first reading, the acquisition itself is the renewal on record.
    let mut valid_until = SystemTime::now() + cfg.margin();
    loop {
        let now = SystemTime::now();
        if now >= valid_until {
            return format!(
                "no renewal of Lease {}/{} on record since {:?} ago",
                cfg.namespace,
                cfg.name,
                cfg.margin()
            );
        }
        match leases.get_opt(&cfg.name).await {
            Ok(lease) => match cfg.fence(lease.as_ref()) {
                FenceVerdict::Valid(until) => valid_until = until,
                FenceVerdict::Stop(reason) => return reason,
            },
            Err(e) => {
                warn!(error = %e, "cannot read the Lease; acting until the last renewal expires")
            }
        }
        let left = valid_until.duration_since(now).unwrap_or_default();
        tokio::time::sleep(left.min(FENCE_PERIOD)).await;
    }
}

/// Stops the lease manager (it releases the lease when it still holds it) and reports `term`.
async fn finish(
    task: tokio::task::JoinHandle<Result<LeaseManager, LeaseManagerError>>,
    term: Term,
) -> Result<Term, LeaseManagerError> {
    match tokio::time::timeout(Duration::from_secs(5), task).await {
        Ok(Ok(Ok(_))) => {}
        Ok(Ok(Err(e))) => warn!(error = %e, "releasing the lease failed; it expires on its own"),
        Ok(Err(e)) => warn!(error = %e, "the lease manager task failed"),
        Err(_) => warn!("releasing the lease timed out; it expires on its own"),
    }
    Ok(term)
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::coordination::v1::LeaseSpec;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;

    fn cfg() -> LeaseConfig {
        LeaseConfig {
            name: "storage-migrator".into(),
            namespace: "ops".into(),
            identity: "op-0".into(),
            duration: Duration::from_secs(15),
            grace: Duration::from_secs(5),
        }
    }

    fn lease(holder: Option<&str>, renewed: Option<SystemTime>) -> Lease {
        Lease {
            spec: Some(LeaseSpec {
                holder_identity: holder.map(String::from),
                renew_time: renewed.map(|t| MicroTime(t.try_into().unwrap_or_default())),
                ..LeaseSpec::default()
            }),
            ..Lease::default()
        }
    }

    #[test]
    fn a_renewal_of_ours_is_valid_until_half_the_grace_before_expiry() {
        let t = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000);
        assert_eq!(
            cfg().fence(Some(&lease(Some("op-0"), Some(t)))),
            FenceVerdict::Valid(t + Duration::from_millis(12_500))
        );
    }

    #[test]
    fn another_holder_a_missing_lease_or_renewal_stops_at_once() {
        let t = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000);
        let stop = |v: FenceVerdict| match v {
            FenceVerdict::Stop(reason) => reason,
            FenceVerdict::Valid(_) => panic!("expected Stop"),
        };
        assert!(stop(cfg().fence(Some(&lease(Some("op-1"), Some(t))))).contains("held by op-1"));
        assert!(stop(cfg().fence(Some(&lease(None, Some(t))))).contains("held by nobody"));
        assert!(stop(cfg().fence(None)).contains("is gone"));
        assert!(stop(cfg().fence(Some(&lease(Some("op-0"), None)))).contains("renewTime"));
    }

    #[test]
    fn the_grace_must_fit_inside_the_duration() {
        assert!(cfg().validate().is_ok());
        for (d, g) in [(15, 15), (15, 20), (15, 1)] {
            let c = LeaseConfig {
                duration: Duration::from_secs(d),
                grace: Duration::from_secs(g),
                ..cfg()
            };
            assert!(matches!(c.validate(), Err(LeaderError::Timing { .. })));
        }
    }
}
