//! The kubelet's log endpoint: one HTTPS server per node on `127.0.0.1:kubelet_ports[i]` (cert
//! `pki/kubelet.crt`), serving `GET /containerLogs/{ns}/{pod}/{container}` (`tailLines`,
//! `limitBytes`, `previous`, `follow`) from the container's log files, so `kubectl logs` works
//! through the apiserver.

use std::io::{Read, Seek, SeekFrom};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::{Path as UrlPath, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use serde::Deserialize;

use super::pod::PodShared;

#[derive(Debug, thiserror::Error)]
pub enum LogsError {
    #[error("cannot load the kubelet certificate {path}: {reason}")]
    Cert { path: PathBuf, reason: String },
    #[error("TLS configuration: {0}")]
    Tls(#[from] rustls::Error),
    #[error("log server on {addr}: {source}")]
    Serve {
        addr: SocketAddr,
        source: std::io::Error,
    },
}

/// Finds a running (or finished, not yet deleted) pod by namespace and name.
pub trait PodLookup: Send + Sync + 'static {
    fn find(&self, namespace: &str, name: &str) -> Option<Arc<PodShared>>;
}

/// Log files of one container: `<pod dir>/logs/<container>/<restart>.log`.
pub fn log_dir(pod_dir: &Path, container: &str) -> PathBuf {
    pod_dir.join("logs").join(container)
}

pub fn log_file(pod_dir: &Path, container: &str, restart: i32) -> PathBuf {
    log_dir(pod_dir, container).join(format!("{restart}.log"))
}

/// The log file numbers of a container, ascending.
pub fn log_numbers(pod_dir: &Path, container: &str) -> Vec<i32> {
    let mut n: Vec<i32> = std::fs::read_dir(log_dir(pod_dir, container))
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            e.file_name()
                .to_str()
                .and_then(|s| s.strip_suffix(".log"))
                .and_then(|s| s.parse().ok())
        })
        .collect();
    n.sort_unstable();
    n
}

/// The last `lines` lines of `data` (all when `None`).
pub fn tail_lines(data: &[u8], lines: Option<usize>) -> &[u8] {
    let Some(n) = lines else { return data };
    if n == 0 {
        return &data[data.len()..];
    }
    let body = data.strip_suffix(b"\n").unwrap_or(data);
    let mut seen = 0;
    for (i, b) in body.iter().enumerate().rev() {
        if *b == b'\n' {
            seen += 1;
            if seen == n {
                return &data[i + 1..];
            }
        }
    }
    data
}

/// At most this much of a log file is read for one answer.
const MAX_READ: u64 = 16 << 20;

fn read_tail(path: &Path) -> std::io::Result<Vec<u8>> {
    let mut f = std::fs::File::open(path)?;
    let len = f.metadata()?.len();
    if len > MAX_READ {
        f.seek(SeekFrom::Start(len - MAX_READ))?;
    }
    let mut buf = Vec::new();
    f.read_to_end(&mut buf)?;
    Ok(buf)
}

#[derive(Debug, Deserialize, Default)]
#[serde(rename_all = "camelCase")]
struct LogQuery {
    tail_lines: Option<i64>,
    limit_bytes: Option<i64>,
    follow: Option<String>,
    previous: Option<String>,
}

fn truthy(v: &Option<String>) -> bool {
    matches!(v.as_deref(), Some("true" | "1" | "True" | ""))
}

struct Served<L> {
    node: String,
    pods: Arc<L>,
}

fn text(code: StatusCode, msg: String) -> Response {
    (code, msg).into_response()
}

async fn container_logs<L: PodLookup>(
    State(s): State<Arc<Served<L>>>,
    UrlPath((ns, pod, container)): UrlPath<(String, String, String)>,
    Query(q): Query<LogQuery>,
) -> Response {
    let Some(shared) = s.pods.find(&ns, &pod).filter(|p| p.node == s.node) else {
        return text(
            StatusCode::NOT_FOUND,
            format!("pod {ns}/{pod} is not running on node {}", s.node),
        );
    };
    let numbers = log_numbers(&shared.dir, &container);
    let previous = truthy(&q.previous);
    let chosen = if previous {
        numbers.len().checked_sub(2).map(|i| numbers[i])
    } else {
        numbers.last().copied()
    };
    let Some(n) = chosen else {
        let what = if previous {
            "previous terminated container"
        } else {
            "container"
        };
        return text(
            StatusCode::BAD_REQUEST,
            format!("{what} {container:?} in pod {pod:?} has no logs (not started yet?)"),
        );
    };
    let path = log_file(&shared.dir, &container, n);
    let data = match tokio::task::spawn_blocking({
        let path = path.clone();
        move || read_tail(&path)
    })
    .await
    {
        Ok(Ok(d)) => d,
        Ok(Err(e)) => {
            return text(
                StatusCode::INTERNAL_SERVER_ERROR,
                format!("cannot read {}: {e}", path.display()),
            );
        }
        Err(e) => return text(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
    };
    let tail = q.tail_lines.and_then(|n| usize::try_from(n).ok());
    let mut out = tail_lines(&data, tail).to_vec();
    if let Some(limit) = q.limit_bytes.and_then(|n| usize::try_from(n).ok()) {
        out.truncate(limit);
    }
    if !truthy(&q.follow) || previous {
        return (StatusCode::OK, out).into_response();
    }
    let offset = std::fs::metadata(&path).map(|m| m.len()).unwrap_or(0);
    let stream = follow(shared, container, n, path, offset, out);
    Response::builder()
        .status(StatusCode::OK)
        .header("content-type", "text/plain")
        .body(Body::from_stream(stream))
        .unwrap_or_else(|e| text(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))
}

/// Streams `first`, then whatever is appended to `path`, until the container instance `n`
/// stops (or is replaced by a restart) and the file has been read to its end.
fn follow(
    shared: Arc<PodShared>,
    container: String,
    n: i32,
    path: PathBuf,
    offset: u64,
    first: Vec<u8>,
) -> impl futures::Stream<Item = Result<Vec<u8>, std::io::Error>> + Send {
    struct St {
        shared: Arc<PodShared>,
        container: String,
        n: i32,
        path: PathBuf,
        offset: u64,
        first: Option<Vec<u8>>,
    }
    let st = St {
        shared,
        container,
        n,
        path,
        offset,
        first: Some(first),
    };
    futures::stream::unfold(st, |mut st| async move {
        if let Some(first) = st.first.take() {
            return Some((Ok(first), st));
        }
        loop {
            let chunk = {
                let path = st.path.clone();
                let offset = st.offset;
                tokio::task::spawn_blocking(move || -> std::io::Result<Vec<u8>> {
                    let mut f = std::fs::File::open(&path)?;
                    f.seek(SeekFrom::Start(offset))?;
                    let mut buf = Vec::new();
                    f.take(1 << 20).read_to_end(&mut buf)?;
                    Ok(buf)
                })
                .await
            };
            match chunk {
                Ok(Ok(buf)) if !buf.is_empty() => {
                    st.offset += buf.len() as u64;
                    return Some((Ok(buf), st));
                }
                Ok(Ok(_)) => {}
                Ok(Err(e)) => return Some((Err(e), st)),
                Err(_) => return None,
            }
            if !st.shared.instance_running(&st.container, st.n) {
                return None;
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    })
}

async fn healthz() -> &'static str {
    "ok"
}

/// exec, attach, port-forward and the rest of the kubelet API are not provided.
async fn unsupported(uri: axum::http::Uri) -> Response {
    text(
        StatusCode::NOT_IMPLEMENTED,
        format!(
            "{} is not supported by the localcluster node agent (only containerLogs is)",
            uri.path()
        ),
    )
}

/// The server's TLS configuration from the kubelet certificate and key (PEM).
pub fn tls_config(cert: &Path, key: &Path) -> Result<rustls::ServerConfig, LogsError> {
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(cert)
        .and_then(|it| it.collect::<Result<Vec<_>, _>>())
        .map_err(|e| LogsError::Cert {
            path: cert.to_path_buf(),
            reason: e.to_string(),
        })?;
    let key_der = PrivateKeyDer::from_pem_file(key).map_err(|e| LogsError::Cert {
        path: key.to_path_buf(),
        reason: e.to_string(),
    })?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_no_client_auth()
        .with_single_cert(certs, key_der)?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(config)
}

/// Serves the log endpoint of `node` on `addr` until the future is dropped.
pub async fn serve<L: PodLookup>(
    node: String,
    addr: SocketAddr,
    config: Arc<rustls::ServerConfig>,
    pods: Arc<L>,
) -> Result<(), LogsError> {
    let app = Router::new()
        .route(
            "/containerLogs/{ns}/{pod}/{container}",
            get(container_logs::<L>),
        )
        .route("/healthz", get(healthz))
        .fallback(unsupported)
        .with_state(Arc::new(Served { node, pods }));
    let tls = axum_server::tls_rustls::RustlsConfig::from_config(config);
    axum_server::bind_rustls(addr, tls)
        .serve(app.into_make_service())
        .await
        .map_err(|source| LogsError::Serve { addr, source })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tails() {
        let d = b"a\nb\nc\n";
        assert_eq!(tail_lines(d, None), d);
        assert_eq!(tail_lines(d, Some(1)), b"c\n");
        assert_eq!(tail_lines(d, Some(2)), b"b\nc\n");
        assert_eq!(tail_lines(d, Some(5)), d);
        assert_eq!(tail_lines(d, Some(0)), b"");
        assert_eq!(tail_lines(b"a\nb", Some(1)), b"b");
        assert_eq!(tail_lines(b"", Some(1)), b"");
    }

    #[test]
    fn log_files_are_numbered() {
        let dir = std::env::temp_dir().join(format!("sm-logs-test-{}", std::process::id()));
        for n in [0, 2, 10] {
            let p = log_file(&dir, "c", n);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(&p, "x").unwrap();
        }
        std::fs::write(log_dir(&dir, "c").join("junk"), "x").unwrap();
        assert_eq!(log_numbers(&dir, "c"), vec![0, 2, 10]);
        assert!(log_numbers(&dir, "other").is_empty());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
