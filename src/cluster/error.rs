//! The cluster layer's errors, and whether retrying one can help ([`Retry`]).

use super::EngineError;
use crate::build::BuildError;

#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    #[error("{what}: {source}")]
    Kube {
        what: String,
        #[source]
        source: kube::Error,
    },
    #[error("database engine: {0}")]
    Engine(#[from] EngineError),
    #[error("{0}")]
    Build(#[from] BuildError),
    #[error("request {0} has no namespace")]
    NoNamespace(String),
    #[error("invalid value for {what}: {reason}")]
    Invalid { what: String, reason: String },
    /// A status write refused because the request changed since the snapshot its decision was
    /// made from (409 on the `resourceVersion` precondition): read again and decide again.
    #[error(
        "status of {request} not written: the request changed since resourceVersion {resource_version}"
    )]
    StaleStatus {
        request: String,
        resource_version: String,
    },
}

/// Whether an error can go away by itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Retry {
    /// The same call fails the same way until something changes (the request, RBAC, an
    /// object we cannot decode): retrying soon does not help.
    Permanent,
    /// Network, timeouts, conflicts, throttling, server errors: retrying soon may succeed.
    Transient,
}

impl ClusterError {
    /// Whether retrying can help (see [`Retry`]).
    pub fn retry(&self) -> Retry {
        match self {
            ClusterError::Kube { source, .. } => kube_retry(source),
            ClusterError::Engine(EngineError::Config(_)) => Retry::Permanent,
            ClusterError::Engine(_) | ClusterError::StaleStatus { .. } => Retry::Transient,
            ClusterError::Build(_)
            | ClusterError::NoNamespace(_)
            | ClusterError::Invalid { .. } => Retry::Permanent,
        }
    }

    /// The API call that was refused, for a Kubernetes error (`write status of demo/move`).
    pub fn refused_call(&self) -> Option<&str> {
        match self {
            ClusterError::Kube { what, .. } => Some(what),
            _ => None,
        }
    }
}

/// An API server's answer by status code; a transport error is transient, a request we cannot
/// build or a response we cannot decode is permanent.
fn kube_retry(e: &kube::Error) -> Retry {
    match e {
        kube::Error::Api(status) => status_retry(status.code),
        kube::Error::SerdeError(_)
        | kube::Error::BuildRequest(_)
        | kube::Error::HttpError(_)
        | kube::Error::TlsRequired => Retry::Permanent,
        _ => Retry::Transient,
    }
}

/// Client errors are permanent (400 Bad Request, 403 Forbidden, 404 Not Found, 422 Invalid,
/// ...), except those that say "try again": 401 (credentials are refreshed), 408 (timeout), 409
/// (conflict), 410 (expired), 429 (throttled). Server errors (5xx) are transient.
pub fn status_retry(code: u16) -> Retry {
    match code {
        401 | 408 | 409 | 410 | 429 => Retry::Transient,
        400..=499 => Retry::Permanent,
        _ => Retry::Transient,
    }
}

/// Wraps a kube error with the call it answered.
pub(crate) fn kube_err(what: impl Into<String>) -> impl FnOnce(kube::Error) -> ClusterError {
    let what = what.into();
    move |source| ClusterError::Kube { what, source }
}

/// Whether `e` is the API server's answer with this status code.
pub(crate) fn is_status(e: &kube::Error, code: u16) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == code)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn api(code: u16) -> ClusterError {
        let status = kube::core::Status::failure("refused", "Reason").with_code(code);
        kube_err("patch claimRef of pv-old-0")(kube::Error::Api(Box::new(status)))
    }

    #[test]
    fn forbidden_invalid_and_bad_requests_are_permanent() {
        for code in [400, 403, 404, 405, 422] {
            assert_eq!(api(code).retry(), Retry::Permanent, "{code}");
        }
        assert_eq!(api(403).refused_call(), Some("patch claimRef of pv-old-0"));
    }

    #[test]
    fn conflicts_throttling_timeouts_and_server_errors_are_transient() {
        for code in [401, 408, 409, 410, 429, 500, 502, 503, 504] {
            assert_eq!(api(code).retry(), Retry::Transient, "{code}");
        }
    }

    #[test]
    fn transport_errors_are_transient_and_decode_errors_permanent() {
        let io = std::io::Error::new(std::io::ErrorKind::ConnectionReset, "reset");
        let network = kube_err("list claims")(kube::Error::Service(Box::new(io)));
        assert_eq!(network.retry(), Retry::Transient);
        let decode = serde_json::from_str::<u8>("x").unwrap_err();
        let decode = kube_err("list claims")(kube::Error::SerdeError(decode));
        assert_eq!(decode.retry(), Retry::Permanent);
    }

    #[test]
    fn our_own_errors_are_permanent_and_the_engines_transient() {
        let invalid = ClusterError::Invalid {
            what: "retention policy".into(),
            reason: "not JSON".into(),
        };
        assert_eq!(invalid.retry(), Retry::Permanent);
        assert_eq!(invalid.refused_call(), None);
        assert_eq!(
            ClusterError::NoNamespace("x".into()).retry(),
            Retry::Permanent
        );
        let config = ClusterError::Engine(EngineError::Config(crate::engine::InvalidSettings(
            "bad label".into(),
        )));
        assert_eq!(config.retry(), Retry::Permanent);
        let unreachable = ClusterError::Engine(EngineError::Unreachable {
            pod: "etcd-0".into(),
            endpoint: "http://etcd-0:2379".into(),
            message: "refused".into(),
        });
        assert_eq!(unreachable.retry(), Retry::Transient);
    }
}
