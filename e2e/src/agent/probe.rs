//! Probes: the threshold state machine (pure), probe targets (named ports resolved), and the
//! httpGet / tcpSocket checkers. Exec probes are run by the pod worker through the runtime.

use std::net::SocketAddr;
use std::time::Duration;

use http_body_util::Empty;
use hyper::body::Bytes;
use hyper_util::rt::TokioIo;
use k8s_openapi::api::core::v1::{Container, Probe};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

#[derive(Debug, thiserror::Error, PartialEq)]
pub enum ProbeError {
    #[error("probe has no handler (exec, httpGet or tcpSocket)")]
    NoHandler,
    #[error("port {0:?} is not a port number or a named port of the container")]
    Port(String),
    #[error("probe host {0:?} is not an IP address")]
    Host(String),
}

/// Timing of a probe, with Kubernetes' defaults.
#[derive(Debug, Clone, PartialEq)]
pub struct ProbeTiming {
    pub initial_delay: Duration,
    pub period: Duration,
    pub timeout: Duration,
    pub success_threshold: u32,
    pub failure_threshold: u32,
}

impl ProbeTiming {
    pub fn of(p: &Probe) -> Self {
        let secs = |v: Option<i32>, default: i32, min: i32| {
            Duration::from_secs(v.unwrap_or(default).max(min) as u64)
        };
        ProbeTiming {
            initial_delay: secs(p.initial_delay_seconds, 0, 0),
            period: secs(p.period_seconds, 10, 1),
            timeout: secs(p.timeout_seconds, 1, 1),
            success_threshold: p.success_threshold.unwrap_or(1).max(1) as u32,
            failure_threshold: p.failure_threshold.unwrap_or(3).max(1) as u32,
        }
    }
}

/// Consecutive-result thresholds: the result flips to success after `success_threshold`
/// consecutive successes and to failure after `failure_threshold` consecutive failures.
#[derive(Debug, Clone, PartialEq)]
pub struct ProbeMachine {
    success_threshold: u32,
    failure_threshold: u32,
    successes: u32,
    failures: u32,
    result: bool,
}

impl ProbeMachine {
    /// `initial` is the result before any probe ran: false for readiness and startup probes,
    /// true for liveness probes.
    pub fn new(timing: &ProbeTiming, initial: bool) -> Self {
        ProbeMachine {
            success_threshold: timing.success_threshold,
            failure_threshold: timing.failure_threshold,
            successes: 0,
            failures: 0,
            result: initial,
        }
    }

    pub fn result(&self) -> bool {
        self.result
    }

    /// Whether the last `failure_threshold` outcomes all failed.
    pub fn failed(&self) -> bool {
        self.failures >= self.failure_threshold
    }

    /// Records one probe outcome; returns the (possibly new) result.
    pub fn record(&mut self, ok: bool) -> bool {
        if ok {
            self.failures = 0;
            self.successes = self.successes.saturating_add(1);
            if self.successes >= self.success_threshold {
                self.result = true;
            }
        } else {
            self.successes = 0;
            self.failures = self.failures.saturating_add(1);
            if self.failures >= self.failure_threshold {
                self.result = false;
            }
        }
        self.result
    }
}

/// What a probe checks.
#[derive(Debug, Clone, PartialEq)]
pub enum ProbeTarget {
    Exec(Vec<String>),
    Http {
        https: bool,
        addr: SocketAddr,
        host_header: String,
        path: String,
        headers: Vec<(String, String)>,
    },
    Tcp(SocketAddr),
}

fn resolve_port(port: &IntOrString, container: &Container) -> Result<u16, ProbeError> {
    match port {
        IntOrString::Int(n) => u16::try_from(*n).map_err(|_| ProbeError::Port(n.to_string())),
        IntOrString::String(s) => {
            if let Ok(n) = s.parse::<u16>() {
                return Ok(n);
            }
            container
                .ports
                .iter()
                .flatten()
                .find(|p| p.name.as_deref() == Some(s.as_str()))
                .and_then(|p| u16::try_from(p.container_port).ok())
                .ok_or_else(|| ProbeError::Port(s.clone()))
        }
    }
}

fn resolve_host(host: Option<&String>, pod_ip: &str) -> Result<std::net::IpAddr, ProbeError> {
    let h = host
        .filter(|h| !h.is_empty())
        .map_or(pod_ip, |h| h.as_str());
    h.parse().map_err(|_| ProbeError::Host(h.to_string()))
}

/// The target of `probe` for `container` of a pod at `pod_ip`.
pub fn target_of(
    probe: &Probe,
    container: &Container,
    pod_ip: &str,
) -> Result<ProbeTarget, ProbeError> {
    if let Some(e) = &probe.exec {
        return Ok(ProbeTarget::Exec(e.command.clone().unwrap_or_default()));
    }
    if let Some(h) = &probe.http_get {
        let ip = resolve_host(h.host.as_ref(), pod_ip)?;
        let port = resolve_port(&h.port, container)?;
        let mut path = h.path.clone().unwrap_or_default();
        if !path.starts_with('/') {
            path.insert(0, '/');
        }
        return Ok(ProbeTarget::Http {
            https: h
                .scheme
                .as_deref()
                .is_some_and(|s| s.eq_ignore_ascii_case("https")),
            addr: SocketAddr::new(ip, port),
            host_header: format!("{ip}:{port}"),
            path,
            headers: h
                .http_headers
                .iter()
                .flatten()
                .map(|h| (h.name.clone(), h.value.clone()))
                .collect(),
        });
    }
    if let Some(t) = &probe.tcp_socket {
        let ip = resolve_host(t.host.as_ref(), pod_ip)?;
        let port = resolve_port(&t.port, container)?;
        return Ok(ProbeTarget::Tcp(SocketAddr::new(ip, port)));
    }
    Err(ProbeError::NoHandler)
}

/// A tcpSocket probe: the connection is opened within `timeout`.
pub async fn check_tcp(addr: SocketAddr, timeout: Duration) -> bool {
    matches!(
        tokio::time::timeout(timeout, tokio::net::TcpStream::connect(addr)).await,
        Ok(Ok(_))
    )
}

/// An httpGet probe: a GET answered with a status in 200..400 within `timeout`.
/// HTTPS is not verified (as the kubelet does not verify probe certificates).
pub async fn check_http(
    https: bool,
    addr: SocketAddr,
    host_header: &str,
    path: &str,
    headers: &[(String, String)],
    timeout: Duration,
) -> bool {
    let fut = http_status(https, addr, host_header, path, headers);
    match tokio::time::timeout(timeout, fut).await {
        Ok(Ok(code)) => (200..400).contains(&code),
        Ok(Err(e)) => {
            tracing::debug!(%addr, path, error = %e, "http probe failed");
            false
        }
        Err(_) => false,
    }
}

type BoxError = Box<dyn std::error::Error + Send + Sync>;

async fn http_status(
    https: bool,
    addr: SocketAddr,
    host_header: &str,
    path: &str,
    headers: &[(String, String)],
) -> Result<u16, BoxError> {
    let stream = tokio::net::TcpStream::connect(addr).await?;
    let mut req = hyper::Request::get(path)
        .header(hyper::header::HOST, host_header)
        .header(hyper::header::USER_AGENT, "kube-probe/1.37")
        .header(hyper::header::ACCEPT, "*/*");
    for (k, v) in headers {
        req = req.header(k.as_str(), v.as_str());
    }
    let req = req.body(Empty::<Bytes>::new())?;
    if https {
        let config = rustls::ClientConfig::builder_with_provider(std::sync::Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()?
        .dangerous()
        .with_custom_certificate_verifier(std::sync::Arc::new(NoVerify))
        .with_no_client_auth();
        let connector = tokio_rustls::TlsConnector::from(std::sync::Arc::new(config));
        let name = rustls::pki_types::ServerName::IpAddress(addr.ip().into());
        let tls = connector.connect(name, stream).await?;
        send(TokioIo::new(tls), req).await
    } else {
        send(TokioIo::new(stream), req).await
    }
}

async fn send<T>(io: T, req: hyper::Request<Empty<Bytes>>) -> Result<u16, BoxError>
where
    T: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
{
    let (mut sender, conn) = hyper::client::conn::http1::handshake(io).await?;
    let conn_task = tokio::spawn(conn);
    let resp = sender.send_request(req).await?;
    conn_task.abort();
    Ok(resp.status().as_u16())
}

/// Accepts any server certificate (probes do not verify, as in the kubelet).
#[derive(Debug)]
struct NoVerify;

impl rustls::client::danger::ServerCertVerifier for NoVerify {
    fn verify_server_cert(
        &self,
        _end_entity: &rustls::pki_types::CertificateDer<'_>,
        _intermediates: &[rustls::pki_types::CertificateDer<'_>],
        _server_name: &rustls::pki_types::ServerName<'_>,
        _ocsp_response: &[u8],
        _now: rustls::pki_types::UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        Ok(rustls::client::danger::ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        _message: &[u8],
        _cert: &rustls::pki_types::CertificateDer<'_>,
        _dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        Ok(rustls::client::danger::HandshakeSignatureValid::assertion())
    }

    fn verify_tls13_signature(
        &self,
        _message: &[u8],
        _cert: &rustls::pki_types::CertificateDer<'_>,
        _dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        Ok(rustls::client::danger::HandshakeSignatureValid::assertion())
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        rustls::crypto::ring::default_provider()
            .signature_verification_algorithms
            .supported_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn probe(v: serde_json::Value) -> Probe {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn thresholds() {
        let t = ProbeTiming::of(&probe(serde_json::json!({
            "exec": {"command": ["true"]}, "successThreshold": 2, "failureThreshold": 3
        })));
        assert_eq!(t.period, Duration::from_secs(10));
        assert_eq!(t.timeout, Duration::from_secs(1));
        let mut m = ProbeMachine::new(&t, false);
        assert!(!m.record(true));
        assert!(m.record(true));
        assert!(m.record(false));
        assert!(m.record(false));
        assert!(m.record(true)); // a success resets the failure count
        assert!(m.record(false));
        assert!(m.record(false));
        assert!(!m.record(false));
        assert!(!m.record(true));
        assert!(m.record(true));

        let live = ProbeTiming::of(&probe(serde_json::json!({"tcpSocket": {"port": 1}})));
        let mut l = ProbeMachine::new(&live, true);
        assert!(l.result());
        assert!(l.record(false));
        assert!(l.record(false));
        assert!(!l.failed());
        assert!(!l.record(false));
        assert!(l.failed());
        assert!(l.record(true));
        assert!(!l.failed());
    }

    #[test]
    fn targets() {
        let c: Container = serde_json::from_value(serde_json::json!({
            "name": "etcd", "ports": [{"name": "client", "containerPort": 2379}]
        }))
        .unwrap();
        let http = probe(
            serde_json::json!({"httpGet": {"port": "client", "path": "health",
            "httpHeaders": [{"name": "X", "value": "y"}]}}),
        );
        assert_eq!(
            target_of(&http, &c, "198.18.3.4").unwrap(),
            ProbeTarget::Http {
                https: false,
                addr: "198.18.3.4:2379".parse().unwrap(),
                host_header: "198.18.3.4:2379".into(),
                path: "/health".into(),
                headers: vec![("X".into(), "y".into())],
            }
        );
        let tcp = probe(serde_json::json!({"tcpSocket": {"port": 2380}}));
        assert_eq!(
            target_of(&tcp, &c, "198.18.3.4").unwrap(),
            ProbeTarget::Tcp("198.18.3.4:2380".parse().unwrap())
        );
        let bad = probe(serde_json::json!({"tcpSocket": {"port": "nope"}}));
        assert_eq!(
            target_of(&bad, &c, "198.18.3.4"),
            Err(ProbeError::Port("nope".into()))
        );
        assert_eq!(
            target_of(&Probe::default(), &c, "1.2.3.4"),
            Err(ProbeError::NoHandler)
        );
        let exec = probe(serde_json::json!({"exec": {"command": ["sh", "-c", "true"]}}));
        assert_eq!(
            target_of(&exec, &c, "1.2.3.4").unwrap(),
            ProbeTarget::Exec(vec!["sh".into(), "-c".into(), "true".into()])
        );
    }

    #[tokio::test]
    async fn http_and_tcp_checks_against_loopback() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let server = tokio::spawn(async move {
            for code in [200u16, 503] {
                let (mut s, _) = listener.accept().await.unwrap();
                let mut buf = [0u8; 1024];
                let _ = s.read(&mut buf).await.unwrap();
                let resp = format!("HTTP/1.1 {code} X\r\ncontent-length: 0\r\n\r\n");
                s.write_all(resp.as_bytes()).await.unwrap();
            }
        });
        let t = Duration::from_secs(2);
        assert!(check_http(false, addr, "h", "/", &[], t).await);
        assert!(!check_http(false, addr, "h", "/", &[], t).await);
        server.await.unwrap();
        // Nothing listens any more.
        assert!(!check_tcp(addr, t).await);
        assert!(!check_http(false, addr, "h", "/", &[], t).await);
    }
}
