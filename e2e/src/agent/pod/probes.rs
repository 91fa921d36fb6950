//! Readiness, liveness and startup probes of a running container.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Container, Probe};
use tokio_util::sync::CancellationToken;
use tracing::{debug, warn};

use crate::agent::pod::{RunCtx, Slot, sleep_or_stop};
use crate::agent::probe::{self, ProbeMachine, ProbeTarget, ProbeTiming};
use crate::agent::runtime::{self, ContainerSpec};

/// One probe: true when it passed.
async fn probe_once(
    ctx: &RunCtx,
    spec: &ContainerSpec,
    target: &ProbeTarget,
    timeout: Duration,
) -> bool {
    match target {
        ProbeTarget::Exec(argv) => {
            if argv.is_empty() {
                return false;
            }
            match runtime::exec_in_container(&ctx.sandbox, spec, argv, timeout).await {
                Ok(out) => out.exit_code == 0,
                Err(e) => {
                    debug!(error = %e, "exec probe failed");
                    false
                }
            }
        }
        ProbeTarget::Http {
            https,
            addr,
            host_header,
            path,
            headers,
        } => probe::check_http(*https, *addr, host_header, path, headers, timeout).await,
        ProbeTarget::Tcp(addr) => probe::check_tcp(*addr, timeout).await,
    }
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum ProbeKind {
    Startup,
    Readiness,
    Liveness,
}

/// Runs one probe of a container until `stop`; returns the final result (startup probes
/// return at their first success or failure verdict).
async fn probe_loop(
    ctx: &Arc<RunCtx>,
    slot: Slot,
    c: &Container,
    spec: &ContainerSpec,
    p: &Probe,
    kind: ProbeKind,
    stop: &CancellationToken,
) -> bool {
    let timing = ProbeTiming::of(p);
    let ip = ctx.sandbox.ip.to_string();
    let target = match probe::target_of(p, c, &ip) {
        Ok(t) => t,
        Err(e) => {
            warn!(pod = %ctx.shared.name, container = %c.name, error = %e, ?kind, "invalid probe");
            return kind == ProbeKind::Liveness;
        }
    };
    let mut machine = ProbeMachine::new(&timing, kind == ProbeKind::Liveness);
    if sleep_or_stop(stop, timing.initial_delay).await {
        return machine.result();
    }
    loop {
        let ok = probe_once(ctx, spec, &target, timing.timeout).await;
        let before = machine.result();
        let result = machine.record(ok);
        match kind {
            ProbeKind::Startup => {
                if result {
                    return true;
                }
                if machine.failed() {
                    return false;
                }
            }
            ProbeKind::Liveness => {
                if !result {
                    return false;
                }
            }
            ProbeKind::Readiness => {
                if result != before || !ok {
                    ctx.shared.update_container(slot, |r| {
                        if r.state.is_running() {
                            r.ready = result;
                        }
                    });
                }
            }
        }
        if sleep_or_stop(stop, timing.period).await {
            return machine.result();
        }
    }
}

/// Startup probe first; then readiness and liveness side by side. A failed startup or
/// liveness probe fires `live_kill`.
pub(super) async fn run_probes(
    ctx: Arc<RunCtx>,
    slot: Slot,
    c: Container,
    spec: ContainerSpec,
    stop: CancellationToken,
    live_kill: CancellationToken,
) {
    if let Some(p) = &c.startup_probe {
        if !probe_loop(&ctx, slot, &c, &spec, p, ProbeKind::Startup, &stop).await {
            if !stop.is_cancelled() {
                live_kill.cancel();
            }
            return;
        }
        let ready_now = c.readiness_probe.is_none();
        ctx.shared.update_container(slot, |r| {
            if r.state.is_running() {
                r.started = true;
                r.ready = ready_now;
            }
        });
    }
    let readiness = async {
        if let Some(p) = &c.readiness_probe {
            probe_loop(&ctx, slot, &c, &spec, p, ProbeKind::Readiness, &stop).await;
        }
    };
    let liveness = async {
        if let Some(p) = &c.liveness_probe
            && !probe_loop(&ctx, slot, &c, &spec, p, ProbeKind::Liveness, &stop).await
            && !stop.is_cancelled()
        {
            live_kill.cancel();
        }
    };
    tokio::join!(readiness, liveness);
}
