//! The API server's answers to one round's reads, kept so that the next round can be decided
//! on them again without reading the cluster anew.
//!
//! A round whose decision only wrote the request's status (a step done, a condition) is
//! followed at once by another round: the new status decides the next step. The objects that
//! round would read are those just read, a few milliseconds before: so the controller replays
//! them ([`Mode::Replay`]), and every reading that the new status asks for and the last round
//! did not make is made now. What is replayed goes through the same gather as a read does, so
//! the snapshot is what a gather would have built had the API server answered the same.
//!
//! Never replayed: anything but a plain GET (writes, watches, followed logs, exec and
//! port-forward upgrades, the API server's proxy to a pod, another representation such as
//! metadata only), and the volumes, which have their own cache fed by a watch
//! ([`super::VolumeCache`]). The database's own view is not read through the API server and is
//! read anew in every round. A decision made on replayed answers that does more than what kept
//! reads suffice for is made again before anything of it is done (`controller::decided`).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::header::{ACCEPT, CONTENT_ENCODING, CONTENT_LENGTH, UPGRADE};
use http::{HeaderMap, Method, Request, Response, StatusCode};
use kube::Client;
use kube::client::Body;

/// How old the answers may be and still be replayed: a round that follows a status write is
/// decided within a few tens of milliseconds; answers older than this are read again.
pub const REPLAY_MAX_AGE: Duration = Duration::from_secs(1);

/// Whether a client records the answers or replays those it has.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Every read goes to the API server; its answer is kept.
    Record,
    /// A read answered before is answered from the kept answer; any other goes to the API
    /// server, and its answer is kept too.
    Replay,
}

/// One kept answer: its status, headers and body, and when the API server gave it.
#[derive(Debug, Clone)]
pub(super) struct Answer {
    pub(super) status: StatusCode,
    pub(super) headers: HeaderMap,
    pub(super) body: Bytes,
    pub(super) read: Instant,
}

/// The extension of a response answered from a kept answer: when the API server gave it (a
/// response without one was read now).
#[derive(Debug, Clone, Copy)]
struct ReadAt(Instant);

/// The answers of one round's reads, by the URI read. See the module doc.
#[derive(Debug)]
pub struct Answers {
    taken: Instant,
    kept: Mutex<HashMap<String, Answer>>,
}

impl Answers {
    pub fn new() -> Arc<Self> {
        Arc::new(Self {
            taken: Instant::now(),
            kept: Mutex::new(HashMap::new()),
        })
    }

    /// The answers of these the API server gave at `since` or later (those read in the
    /// decision that began then), to replay to the same decision made again.
    pub fn read_since(&self, since: Instant) -> Arc<Self> {
        let kept = (self.answers().iter())
            .filter(|(_, a)| a.read >= since)
            .map(|(k, a)| (k.clone(), a.clone()))
            .collect();
        Arc::new(Self {
            taken: self.taken,
            kept: Mutex::new(kept),
        })
    }

    /// Whether these answers are young enough to be replayed ([`REPLAY_MAX_AGE`]).
    pub fn replayable(&self) -> bool {
        self.taken.elapsed() <= REPLAY_MAX_AGE
    }

    /// How many answers are kept.
    pub fn len(&self) -> usize {
        self.answers().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn answers(&self) -> std::sync::MutexGuard<'_, HashMap<String, Answer>> {
        self.kept.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A client that sends its requests through `inner`, recording the answers to the reads
    /// that may be replayed, and in [`Mode::Replay`] answering those it has from them.
    pub fn client(self: &Arc<Self>, inner: Client, mode: Mode) -> Client {
        let default_namespace = inner.default_namespace().to_string();
        let answers = self.clone();
        let service = tower::service_fn(move |request: Request<Body>| {
            let (answers, inner) = (answers.clone(), inner.clone());
            async move { answers.answer(&inner, mode, request).await }
        });
        Client::new(service, default_namespace)
    }

    async fn answer(
        &self,
        inner: &Client,
        mode: Mode,
        request: Request<Body>,
    ) -> Result<Response<Body>, kube::Error> {
        let Some(key) = replayable_read(&request) else {
            return inner.send(request).await;
        };
        if mode == Mode::Replay
            && let Some(answer) = self.answers().get(&key).cloned()
        {
            return Ok(answer.response());
        }
        let response = inner.send(request).await?;
        if !matches!(response.status(), StatusCode::OK | StatusCode::NOT_FOUND) {
            return Ok(response);
        }
        let (answer, response) = Answer::collect(response).await?;
        self.answers().insert(key, answer);
        Ok(response)
    }
}

impl Answer {
    /// The answer of `response`, read in full, and the response to pass on.
    pub(super) async fn collect(
        response: Response<Body>,
    ) -> Result<(Self, Response<Body>), kube::Error> {
        let (parts, body) = response.into_parts();
        let body = body.collect_bytes().await?;
        let mut headers = parts.headers.clone();
        headers.remove(CONTENT_LENGTH);
        headers.remove(CONTENT_ENCODING);
        let read = parts
            .extensions
            .get::<ReadAt>()
            .map_or_else(Instant::now, |r| r.0);
        let answer = Self {
            status: parts.status,
            headers,
            body: body.clone(),
            read,
        };
        Ok((answer, Response::from_parts(parts, Body::from(body))))
    }

    /// The response this answer gives again, with when it was read.
    pub(super) fn response(self) -> Response<Body> {
        let mut response = Response::new(Body::from(self.body));
        *response.status_mut() = self.status;
        *response.headers_mut() = self.headers;
        response.extensions_mut().insert(ReadAt(self.read));
        response
    }
}

/// The key of a request whose answer may be kept and replayed (its path and query), or `None`:
/// see the module doc for what is never replayed.
pub fn replayable_read<B>(request: &Request<B>) -> Option<String> {
    let uri = request.uri();
    let path = uri.path();
    let query = uri.query().unwrap_or_default();
    let streams = query
        .split('&')
        .any(|p| matches!(p, "watch=true" | "watch=1" | "follow=true" | "follow=1"));
    // Another representation of the same path (`as=PartialObjectMetadataList`, a Table) is
    // another answer: never kept under the path's key.
    let transformed = (request.headers().get(ACCEPT))
        .and_then(|a| a.to_str().ok())
        .is_some_and(|a| a.contains(";as="));
    let refused = request.method() != Method::GET
        || transformed
        || request.headers().contains_key(UPGRADE)
        || streams
        || path.starts_with("/api/v1/persistentvolumes")
        || path.split('/').any(|segment| segment == "proxy")
        || path.ends_with("/exec")
        || path.ends_with("/attach")
        || path.ends_with("/portforward");
    (!refused).then(|| uri.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn get(uri: &str) -> Request<()> {
        Request::get(uri).body(()).unwrap()
    }

    #[test]
    fn plain_reads_are_kept_by_their_path_and_query() {
        for uri in [
            "/api/v1/namespaces/demo/persistentvolumeclaims?",
            "/api/v1/namespaces/demo/pods?&labelSelector=app%3Detcd",
            "/apis/apps/v1/namespaces/demo/statefulsets/etcd",
            "/api/v1/namespaces/demo/pods/move-etcd-0/log?&container=copy&tailLines=40",
        ] {
            assert_eq!(replayable_read(&get(uri)).as_deref(), Some(uri));
        }
        let a = replayable_read(&get("/api/v1/namespaces/demo/pods?&labelSelector=a%3Db"));
        let b = replayable_read(&get("/api/v1/namespaces/demo/pods?&labelSelector=a%3Dc"));
        assert_ne!(a, b, "another query is another read");
    }

    #[test]
    fn writes_streams_volumes_and_the_pods_own_endpoints_are_never_replayed() {
        let never = [
            "/api/v1/namespaces/demo/pods?&watch=true&resourceVersion=1",
            "/api/v1/namespaces/demo/pods/etcd-0/log?&follow=true",
            "/api/v1/persistentvolumes/pv-old-0",
            "/api/v1/persistentvolumes?",
            "/api/v1/namespaces/demo/pods/etcd-0:8008/proxy/cluster",
            "/api/v1/namespaces/demo/services/patroni/proxy/cluster",
            "/api/v1/namespaces/demo/pods/etcd-0/exec?&command=true",
            "/api/v1/namespaces/demo/pods/etcd-0/attach",
            "/api/v1/namespaces/demo/pods/etcd-0/portforward?&ports=2379",
        ];
        for uri in never {
            assert_eq!(replayable_read(&get(uri)), None, "{uri}");
        }
        let post = Request::post("/api/v1/namespaces/demo/pods")
            .body(())
            .unwrap();
        assert_eq!(replayable_read(&post), None);
        let patch = Request::patch("/apis/apps/v1/namespaces/demo/statefulsets/etcd")
            .body(())
            .unwrap();
        assert_eq!(replayable_read(&patch), None);
        let metadata = Request::get("/api/v1/namespaces/demo/pods")
            .header(
                ACCEPT,
                "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1",
            )
            .body(())
            .unwrap();
        assert_eq!(replayable_read(&metadata), None, "another representation");
        let upgrade = Request::get("/api/v1/namespaces/demo/pods/etcd-0/exec2")
            .header(UPGRADE, "websocket")
            .body(())
            .unwrap();
        assert_eq!(replayable_read(&upgrade), None);
    }

    /// A decision made again on fresher reads replays only what the API server answered since
    /// it began: not the round before's answers, nor those kept from earlier rounds.
    #[tokio::test]
    async fn only_the_answers_read_since_a_moment_are_taken_again() {
        let began = Instant::now();
        let answer = |read: Instant| Answer {
            status: StatusCode::OK,
            headers: HeaderMap::new(),
            body: Bytes::from_static(b"{}"),
            read,
        };
        let answers = Answers::new();
        let earlier = began - Duration::from_millis(5);
        answers.answers().insert("/kept".into(), answer(earlier));
        answers
            .answers()
            .insert("/now".into(), answer(Instant::now()));
        // A response given again carries when it was read, and is recorded so.
        let (again, _) = Answer::collect(answer(earlier).response()).await.unwrap();
        assert_eq!(again.read, earlier);
        answers.answers().insert("/again".into(), again);
        let since = answers.read_since(began);
        let mut kept: Vec<String> = since.answers().keys().cloned().collect();
        kept.sort();
        assert_eq!(kept, ["/now"]);
    }

    #[test]
    fn answers_are_replayed_only_while_young() {
        let answers = Answers::new();
        assert!(answers.replayable());
        let old = Answers {
            taken: Instant::now() - REPLAY_MAX_AGE - Duration::from_millis(1),
            kept: Mutex::new(HashMap::new()),
        };
        assert!(!old.replayable());
    }
}
