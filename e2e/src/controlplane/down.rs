//! `down`: stop every component, sweep the host, check for leftovers.

use std::io;
use std::path::Path;
use std::time::{Duration, Instant};

use tracing::warn;

use crate::controlplane::identity::release_net;
use crate::controlplane::leftovers::leftovers;
use crate::controlplane::process::stop;
use crate::controlplane::{
    AGENT, AGENT_GRACE, APISERVER, COMPONENT_GRACE, CONTROLLER_MANAGER, ETCD, Result, SCHEDULER,
    io_err,
};
use crate::state::{ClusterState, StateError};

/// What `down` found after stopping everything.
#[derive(Debug, Clone, Default)]
pub struct DownReport {
    /// What is still present (empty: nothing left).
    pub leftovers: Vec<String>,
    pub elapsed: Duration,
}

/// Stops everything `up` started in `dir` and reports what is left. Idempotent.
pub fn down(dir: &Path) -> Result<DownReport> {
    let t0 = Instant::now();
    if !dir.exists() {
        return Ok(DownReport::default());
    }
    let dir = std::fs::canonicalize(dir).map_err(io_err("resolve", dir))?;
    let state = match ClusterState::load(&dir) {
        Ok(s) => Some(s),
        Err(StateError::Read { source, .. }) if source.kind() == io::ErrorKind::NotFound => None,
        Err(e) => {
            warn!("{e}; stopping recorded processes only");
            None
        }
    };

    stop(&dir, AGENT, AGENT_GRACE);
    if let Some(state) = &state {
        if let Err(e) = crate::agent::cleanup_host(state) {
            warn!("agent::cleanup_host: {e}");
        }
        if let Err(e) = crate::provisioner::cleanup_volumes(state) {
            warn!("provisioner::cleanup_volumes: {e}");
        }
    }
    for name in [SCHEDULER, CONTROLLER_MANAGER, APISERVER, ETCD] {
        stop(&dir, name, COMPONENT_GRACE);
    }
    // Anything else recorded (e.g. by a newer version).
    if let Ok(entries) = std::fs::read_dir(dir.join("pids")) {
        for e in entries.flatten() {
            if let Some(name) = e.file_name().to_str().and_then(|n| n.strip_suffix(".pid")) {
                stop(&dir, name, COMPONENT_GRACE);
            }
        }
    }
    if let Some(state) = &state {
        release_net(state);
    }
    let leftovers = leftovers(&dir, state.as_ref());
    Ok(DownReport {
        leftovers,
        elapsed: t0.elapsed(),
    })
}
