//! The cluster layer against a mocked API server: an [`ApiServerVerifier`] checks each request
//! the executor sends (method, path, query, content type, body), in order, and answers it; a
//! request more or fewer than expected fails the test.

use std::future::Future;
use std::time::Duration;

use http::{Method, Request, Response};
use kube::client::Body;
use kube::runtime::events::{Recorder, Reporter};
use serde_json::{Value, json};

use super::Engine;
use super::{Cluster, ClusterError};
use crate::plan::{Action, Observed};

type Handle = tower_test::mock::Handle<Request<Body>, Response<Body>>;

/// One request the executor must send, and the answer it gets.
#[derive(Debug, Clone)]
pub struct Exchange {
    pub method: Method,
    pub path: String,
    /// The query string, exactly (empty for none).
    pub query: String,
    /// The content type, when the request has a body that matters.
    pub content_type: Option<&'static str>,
    /// The body (JSON), when it matters.
    pub body: Option<Value>,
    pub status: u16,
    pub response: Value,
    /// Answer with `response`'s string as plain text (a pod's log), not as JSON.
    pub text: bool,
}

impl Exchange {
    pub fn new(method: Method, path: &str) -> Self {
        Self {
            method,
            path: path.to_string(),
            query: String::new(),
            content_type: None,
            body: None,
            status: 200,
            response: json!({}),
            text: false,
        }
    }

    pub fn query(mut self, query: &str) -> Self {
        self.query = query.to_string();
        self
    }

    /// Expects this body as a JSON merge patch.
    pub fn merge_patch(mut self, body: Value) -> Self {
        self.content_type = Some("application/merge-patch+json");
        self.body = Some(body);
        self
    }

    /// Expects this body as a server-side apply patch.
    pub fn apply_patch(mut self, body: Value) -> Self {
        self.content_type = Some("application/apply-patch+yaml");
        self.body = Some(body);
        self
    }

    /// Expects this JSON body.
    pub fn json(mut self, body: Value) -> Self {
        self.content_type = Some("application/json");
        self.body = Some(body);
        self
    }

    /// Answers with this object.
    pub fn returns(mut self, response: Value) -> Self {
        self.status = 200;
        self.response = response;
        self
    }

    /// Answers with this plain text (a pod's log).
    pub fn returns_text(mut self, text: &str) -> Self {
        self.status = 200;
        self.response = Value::String(text.to_string());
        self.text = true;
        self
    }

    /// Answers with an API error (a `Status` of this code and reason).
    pub fn fails(mut self, code: u16, reason: &str) -> Self {
        self.status = code;
        self.response = json!({
            "apiVersion": "v1",
            "kind": "Status",
            "status": "Failure",
            "message": format!("{reason} (mocked)"),
            "reason": reason,
            "code": code,
        });
        self
    }
}

/// The mocked API server's side: checks each request against the next [`Exchange`].
pub struct ApiServerVerifier(Handle);

type Pending = (
    Request<Body>,
    tower_test::mock::SendResponse<Response<Body>>,
);

impl ApiServerVerifier {
    /// The next request the client sends; `None` when none comes within 5 s.
    async fn next(&mut self) -> Option<Pending> {
        let next = tokio::time::timeout(Duration::from_secs(5), self.0.next_request()).await;
        next.ok().flatten()
    }

    async fn exchange(&mut self, e: Exchange) {
        let Some((request, send)) = self.next().await else {
            panic!("expected {} {}, but no request came", e.method, e.path);
        };
        answer(request, send, e).await;
    }

    /// Answers each request with the first of `left` it matches (method, path and query),
    /// whatever their order, until none is left.
    async fn exchange_unordered(&mut self, mut left: Vec<Exchange>) {
        while !left.is_empty() {
            let Some((request, send)) = self.next().await else {
                let expected: Vec<String> = left
                    .iter()
                    .map(|e| format!("{} {}", e.method, e.path))
                    .collect();
                panic!("expected {expected:?}, but no request came");
            };
            let e = take_match(&mut left, &request);
            answer(request, send, e).await;
        }
    }
}

impl ApiServerVerifier {
    /// Waits until every one of `exchanges` has been asked for (in any order), then answers
    /// them in the reverse order of their arrival: the first request sent gets the last answer.
    async fn exchange_last_first(&mut self, mut left: Vec<Exchange>) {
        let mut pending = Vec::new();
        while pending.len() < left.len() {
            let Some(p) = self.next().await else {
                panic!("{} of {} requests came", pending.len(), left.len());
            };
            pending.push(p);
        }
        while let Some((request, send)) = pending.pop() {
            let e = take_match(&mut left, &request);
            answer(request, send, e).await;
        }
    }
}

/// Removes from `left` and returns the first exchange `request` matches (method, path and
/// query); panics when none does.
fn take_match(left: &mut Vec<Exchange>, request: &Request<Body>) -> Exchange {
    let matches = |e: &Exchange| {
        e.method == request.method()
            && e.path == request.uri().path()
            && e.query == request.uri().query().unwrap_or("")
    };
    let Some(i) = left.iter().position(matches) else {
        panic!("unexpected request {} {}", request.method(), request.uri());
    };
    left.remove(i)
}

/// Checks `request` against `e` and sends `e`'s answer.
async fn answer(
    request: Request<Body>,
    send: tower_test::mock::SendResponse<Response<Body>>,
    e: Exchange,
) {
    let what = format!("{} {}", request.method(), request.uri());
    assert_eq!(request.method(), e.method, "{what}");
    assert_eq!(request.uri().path(), e.path, "{what}");
    assert_eq!(request.uri().query().unwrap_or(""), e.query, "{what}");
    if let Some(content_type) = e.content_type {
        let header = request.headers().get(http::header::CONTENT_TYPE);
        assert_eq!(
            header.and_then(|h| h.to_str().ok()),
            Some(content_type),
            "{what}"
        );
    }
    if let Some(expected) = &e.body {
        let bytes = request.into_body().collect_bytes().await.unwrap();
        let body: Value = serde_json::from_slice(&bytes).unwrap();
        assert_eq!(&body, expected, "body of {what}");
    }
    let response = Response::builder()
        .status(e.status)
        .body(Body::from(match (&e.response, e.text) {
            (Value::String(text), true) => text.clone().into_bytes(),
            _ => serde_json::to_vec(&e.response).unwrap(),
        }))
        .unwrap();
    send.send_response(response);
}

/// A [`Cluster`] whose client talks to a mocked API server.
pub fn mocked() -> (Cluster, ApiServerVerifier) {
    let (service, handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    let client = kube::Client::new(service, "default");
    let reporter = Reporter {
        controller: "storage-migrator-test".into(),
        instance: None,
    };
    let recorder = Recorder::new(client.clone(), reporter);
    (Cluster::new(client, recorder), ApiServerVerifier(handle))
}

/// Runs `call` on a mocked cluster that expects exactly `exchanges`, in order; returns what
/// `call` returned.
pub async fn verify<T, F>(exchanges: Vec<Exchange>, call: impl FnOnce(Cluster) -> F) -> T
where
    F: Future<Output = T> + Send + 'static,
    T: Send + 'static,
{
    verify_in(Order::AsSent, exchanges, call).await
}

/// [`verify`] with `exchanges` in any order: for calls that send requests concurrently.
pub async fn verify_unordered<T, F>(exchanges: Vec<Exchange>, call: impl FnOnce(Cluster) -> F) -> T
where
    F: Future<Output = T> + Send + 'static,
    T: Send + 'static,
{
    verify_in(Order::Any, exchanges, call).await
}

/// In which order the mocked API server expects the requests and answers them.
pub enum Order {
    /// Each request as the next of the exchanges, answered at once.
    AsSent,
    /// The requests in any order, each answered at once.
    Any,
    /// Every request first, in any order; then the answers in the reverse order of the
    /// requests: what a concurrent call reports must not depend on which answer came first.
    LastFirst,
}

/// Runs `call` on a mocked cluster that expects exactly `exchanges`, in `order`; returns what
/// `call` returned.
pub async fn verify_in<T, F>(
    order: Order,
    exchanges: Vec<Exchange>,
    call: impl FnOnce(Cluster) -> F,
) -> T
where
    F: Future<Output = T> + Send + 'static,
    T: Send + 'static,
{
    let (cluster, mut server) = mocked();
    let task = tokio::spawn(call(cluster));
    match order {
        Order::AsSent => {
            for e in exchanges {
                server.exchange(e).await;
            }
        }
        Order::Any => server.exchange_unordered(exchanges).await,
        Order::LastFirst => server.exchange_last_first(exchanges).await,
    }
    finish(task, server).await
}

/// The call's result, once it returns without sending another request.
async fn finish<T>(task: tokio::task::JoinHandle<T>, mut server: ApiServerVerifier) -> T {
    tokio::select! {
        biased;
        out = task => out.expect("the call panicked"),
        extra = server.0.next_request() => match extra {
            Some((r, _)) => panic!("unexpected request {} {}", r.method(), r.uri()),
            None => panic!("the client went away before the call returned"),
        },
    }
}

/// Runs one action of `o` against a mocked cluster (no database engine).
pub async fn execute(
    o: Observed,
    action: Action,
    exchanges: Vec<Exchange>,
) -> Result<(), ClusterError> {
    verify(exchanges, move |cluster| async move {
        let engine: Result<Engine, String> = Err("no engine in this test".into());
        cluster.execute(&o, &engine, &action).await.map(drop)
    })
    .await
}
