//! The operator's HTTP endpoints: `/healthz` (the process serves), `/readyz` (it reaches the API
//! server with every permission it needs), `/metrics` (Prometheus text format).
//!
//! Readiness is the result of [`Health::check`], run at start and every [`CHECK_PERIOD`] while
//! not ready: the API server answers, and a SelfSubjectAccessReview for each rule of
//! [`crate::permissions`] is allowed (about 46 requests: a rule per namespace). Once ready, the
//! periodic check every [`CHECK_PERIOD_READY`] only asks the API server's version (one request):
//! every permission is asked again only after the API server refused one of the operator's calls
//! (403 Forbidden, seen by [`Health::note_response`] on every response of the operator's client),
//! at most once a [`CHECK_PERIOD`]. (Asked every 30 s, then every 300 s, the reviews were most of
//! an idle operator's API requests.) A refused permission or an unreachable API server makes
//! `/readyz` answer 503 with the reason (which call, which rule) and is logged once per change,
//! so a misconfigured install is visible as not-ready, never as a silent crash loop. Followers
//! are ready too: they can take over.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::http::{Response, StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;
use kube::Client;
use tracing::{error, info};

use crate::metrics::Metrics;
use crate::permissions::{self, CheckScope};

/// How often readiness is checked again while it does not hold; also the shortest time between
/// two checks of every permission.
pub const CHECK_PERIOD: Duration = Duration::from_secs(30);
/// How often the API server is asked again once ready.
pub const CHECK_PERIOD_READY: Duration = Duration::from_secs(300);

#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error("cannot listen on {addr} (--http-address): {source}")]
    Bind {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error("the HTTP server failed: {0}")]
    Serve(std::io::Error),
}

/// What `/readyz` answers.
pub struct Health {
    /// `None` when ready, else why not.
    not_ready: Mutex<Option<String>>,
    /// The API server refused a call (403) since the last check of every permission.
    refused: AtomicBool,
    /// Wakes the checks when a call is refused.
    wake: tokio::sync::Notify,
}

impl Default for Health {
    fn default() -> Self {
        Self {
            not_ready: Mutex::new(Some(
                "starting: the API server has not been checked yet".into(),
            )),
            refused: AtomicBool::new(false),
            wake: tokio::sync::Notify::new(),
        }
    }
}

/// What the next check asks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CheckKind {
    /// The API server's version and every permission.
    Full,
    /// Only whether the API server answers (`GET /version`).
    Reachable,
}

/// The check after one that left readiness `ready`, when a call was (`refused`) or was not
/// refused since (pure).
pub fn next_check(ready: bool, refused: bool) -> CheckKind {
    match ready && !refused {
        true => CheckKind::Reachable,
        false => CheckKind::Full,
    }
}

impl Health {
    fn get(&self) -> Option<String> {
        self.not_ready
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    fn set(&self, not_ready: Option<String>) {
        let mut cur = self.not_ready.lock().unwrap_or_else(|p| p.into_inner());
        if *cur != not_ready {
            match &not_ready {
                None => info!("ready: the API server answers and every permission is granted"),
                Some(reason) => error!(%reason, "not ready"),
            }
            *cur = not_ready;
        }
    }

    /// Called with every response the operator's client receives: a 403 Forbidden makes the
    /// next check ask every permission, and wakes it.
    pub fn note_response<B>(&self, response: &Response<B>) {
        if response.status() == StatusCode::FORBIDDEN && !self.refused.swap(true, Ordering::SeqCst)
        {
            self.wake.notify_one();
        }
    }

    /// Checks the API server, and with [`CheckKind::Full`] the operator's permissions, once.
    pub async fn check(&self, client: &Client, scope: &CheckScope, kind: CheckKind) {
        let verdict = match client.apiserver_version().await {
            Err(e) => Some(format!("cannot reach the API server (GET /version): {e}")),
            Ok(_) if kind == CheckKind::Reachable => None,
            Ok(_) => permissions::refused(client, scope)
                .await
                .err()
                .map(|e| e.to_string()),
        };
        self.set(verdict);
    }

    /// Checks everything now, then as [`next_check`] says: every [`CHECK_PERIOD`] while not
    /// ready; every [`CHECK_PERIOD_READY`] the API server alone while ready, and everything
    /// again once a call was refused (at the earliest a [`CHECK_PERIOD`] after the last check),
    /// forever.
    pub async fn keep_checking(self: Arc<Self>, client: Client, scope: CheckScope) {
        let mut kind = CheckKind::Full;
        loop {
            if kind == CheckKind::Full {
                self.refused.store(false, Ordering::SeqCst);
            }
            self.check(&client, &scope, kind).await;
            let ready = self.get().is_none();
            tokio::time::sleep(CHECK_PERIOD).await;
            if ready && !self.refused.load(Ordering::SeqCst) {
                let rest = CHECK_PERIOD_READY.saturating_sub(CHECK_PERIOD);
                tokio::select! {
                    () = tokio::time::sleep(rest) => {}
                    () = self.wake.notified() => {}
                }
            }
            kind = next_check(ready, self.refused.load(Ordering::SeqCst));
        }
    }
}

#[derive(Clone)]
struct AppState {
    health: Arc<Health>,
    metrics: Arc<Metrics>,
}

/// Binds `addr` (so a bad address fails at start) and returns the server future and the bound
/// address (port 0 picks a free one).
pub async fn bind(
    addr: SocketAddr,
    health: Arc<Health>,
    metrics: Arc<Metrics>,
) -> Result<(SocketAddr, impl Future<Output = Result<(), ServeError>>), ServeError> {
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|source| ServeError::Bind { addr, source })?;
    let bound = listener
        .local_addr()
        .map_err(|source| ServeError::Bind { addr, source })?;
    let app = Router::new()
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics_text))
        .with_state(AppState { health, metrics });
    let server = async move { axum::serve(listener, app).await.map_err(ServeError::Serve) };
    Ok((bound, server))
}

async fn readyz(State(s): State<AppState>) -> impl IntoResponse {
    match s.health.get() {
        None => (StatusCode::OK, "ok\n".to_string()),
        Some(reason) => (StatusCode::SERVICE_UNAVAILABLE, format!("{reason}\n")),
    }
}

async fn metrics_text(State(s): State<AppState>) -> impl IntoResponse {
    match s.metrics.encode() {
        Ok(text) => (
            StatusCode::OK,
            [(
                header::CONTENT_TYPE,
                "application/openmetrics-text; version=1.0.0; charset=utf-8",
            )],
            text,
        ),
        Err(e) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
            format!("cannot encode metrics: {e}\n"),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn once_ready_only_the_api_server_is_asked_until_a_call_is_refused() {
        assert_eq!(next_check(true, false), CheckKind::Reachable);
        assert_eq!(next_check(true, true), CheckKind::Full);
        assert_eq!(next_check(false, false), CheckKind::Full);
        assert_eq!(next_check(false, true), CheckKind::Full);
    }

    #[tokio::test]
    async fn a_forbidden_response_wakes_the_checks_once() {
        let health = Health::default();
        let answer = |code: u16| {
            Response::builder()
                .status(code)
                .body(())
                .unwrap_or_default()
        };
        for code in [200, 201, 404, 409, 500] {
            health.note_response(&answer(code));
        }
        assert!(!health.refused.load(Ordering::SeqCst), "only a 403 counts");
        health.note_response(&answer(403));
        health.note_response(&answer(403));
        assert!(health.refused.load(Ordering::SeqCst));
        // Woken: the permit of the first 403 is there.
        tokio::time::timeout(Duration::from_secs(1), health.wake.notified())
            .await
            .unwrap_or_else(|_| panic!("a 403 did not wake the checks"));
    }
}
