//! The operator's HTTP endpoints: `/healthz` (the process serves), `/readyz` (it reaches the API
//! server with every permission it needs), `/metrics` (Prometheus text format).
//!
//! Readiness is the result of [`Health::check`], run at start, then every [`CHECK_PERIOD`] while
//! not ready and every [`CHECK_PERIOD_READY`] once ready (one check costs a SelfSubjectAccessReview
//! per rule and namespace, about 46 requests: every 30 s, that was most of an idle operator's
//! API requests; a permission withdrawn later also shows as the 403 of the call that needs it): the
//! API server answers, and a SelfSubjectAccessReview for each rule of [`crate::permissions`] is
//! allowed. A refused permission or an unreachable API server makes `/readyz` answer 503 with the
//! reason (which call, which rule) and is logged once per change, so a misconfigured install is
//! visible as not-ready, never as a silent crash loop. Followers are ready too: they can take over.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;
use kube::Client;
use tracing::{error, info};

use crate::metrics::Metrics;
use crate::permissions::{self, CheckScope};

/// How often readiness is checked again.
pub const CHECK_PERIOD: Duration = Duration::from_secs(30);
/// How often readiness is checked again once it holds.
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
}

impl Default for Health {
    fn default() -> Self {
        Self {
            not_ready: Mutex::new(Some(
                "starting: the API server has not been checked yet".into(),
            )),
        }
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

    /// Checks the API server and the operator's permissions once.
    pub async fn check(&self, client: &Client, scope: &CheckScope) {
        let verdict = match client.apiserver_version().await {
            Err(e) => Some(format!("cannot reach the API server (GET /version): {e}")),
            Ok(_) => permissions::refused(client, scope)
                .await
                .err()
                .map(|e| e.to_string()),
        };
        self.set(verdict);
    }

    /// Checks now, then every [`CHECK_PERIOD`] while not ready and every [`CHECK_PERIOD_READY`]
    /// while ready, forever.
    pub async fn keep_checking(self: Arc<Self>, client: Client, scope: CheckScope) {
        loop {
            self.check(&client, &scope).await;
            let ready = self.get().is_none();
            tokio::time::sleep(if ready {
                CHECK_PERIOD_READY
            } else {
                CHECK_PERIOD
            })
            .await;
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
