//! Image references: the store's normal form and the kubelet's default pull policy.

/// Registry of references without a host (`busybox`, `library/busybox`), as containerd assumes.
const DEFAULT_DOMAIN: &str = "docker.io";

#[derive(Debug, thiserror::Error, PartialEq)]
pub enum ReferenceError {
    #[error("invalid image reference {0:?}: empty")]
    Empty(String),
    #[error("invalid image reference {0:?}: {1}")]
    Invalid(String, &'static str),
}

/// A reference split into repository (with its registry host) and tag and/or digest.
#[derive(Debug, Clone, PartialEq)]
pub struct Reference {
    /// `docker.io/library/busybox`, `ghcr.io/storage-migrator/storage-migrator`.
    pub repository: String,
    pub tag: Option<String>,
    pub digest: Option<String>,
}

impl Reference {
    /// Parses `[host[:port]/]path[:tag][@digest]`; a reference without a registry host gets
    /// `docker.io` (and `library/` for a one-component path), as a node's container runtime does.
    pub fn parse(input: &str) -> Result<Self, ReferenceError> {
        let s = input.trim();
        if s.is_empty() {
            return Err(ReferenceError::Empty(input.to_string()));
        }
        if s.chars().any(|c| c.is_whitespace() || c.is_control()) {
            return Err(ReferenceError::Invalid(
                input.to_string(),
                "contains whitespace",
            ));
        }
        let (name_tag, digest) = match s.split_once('@') {
            Some((n, d)) if d.contains(':') && !d.contains('@') => (n, Some(d.to_string())),
            Some(_) => return Err(ReferenceError::Invalid(input.to_string(), "bad digest")),
            None => (s, None),
        };
        let last_slash = name_tag.rfind('/').map_or(0, |i| i + 1);
        let (repo, tag) = match name_tag[last_slash..].find(':') {
            Some(colon) => (
                &name_tag[..last_slash + colon],
                Some(name_tag[last_slash + colon + 1..].to_string()),
            ),
            None => (name_tag, None),
        };
        if repo.is_empty() || repo.starts_with('/') || repo.ends_with('/') || repo.contains("//") {
            return Err(ReferenceError::Invalid(input.to_string(), "bad repository"));
        }
        if tag.as_deref() == Some("") {
            return Err(ReferenceError::Invalid(input.to_string(), "empty tag"));
        }
        Ok(Self {
            repository: with_domain(repo),
            tag,
            digest,
        })
    }

    /// The store's key: `repository:tag` (tag `latest` when there is neither tag nor digest),
    /// `@digest` appended when given.
    pub fn normalized(&self) -> String {
        let mut out = self.repository.clone();
        match (&self.tag, &self.digest) {
            (Some(t), _) => {
                out.push(':');
                out.push_str(t);
            }
            (None, None) => out.push_str(":latest"),
            (None, Some(_)) => {}
        }
        if let Some(d) = &self.digest {
            out.push('@');
            out.push_str(d);
        }
        out
    }
}

/// `busybox` → `docker.io/library/busybox`; `quay.io/x/y` and `localhost:5000/y` are kept.
fn with_domain(repo: &str) -> String {
    match repo.split_once('/') {
        Some((first, _)) if first.contains('.') || first.contains(':') || first == "localhost" => {
            repo.to_string()
        }
        Some(_) => format!("{DEFAULT_DOMAIN}/{repo}"),
        None => format!("{DEFAULT_DOMAIN}/library/{repo}"),
    }
}

/// The store key of `image` (see [`Reference::normalized`]).
pub fn normalize(image: &str) -> Result<String, ReferenceError> {
    Reference::parse(image).map(|r| r.normalized())
}

/// `imagePullPolicy` of a container.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PullPolicy {
    Always,
    IfNotPresent,
    Never,
}

impl PullPolicy {
    /// The container's policy; when unset (the API server normally defaults it), Kubernetes'
    /// default: `Always` for `:latest` or an untagged reference without digest, else
    /// `IfNotPresent`. An unknown value is treated like the default.
    pub fn of(policy: Option<&str>, image: &str) -> Self {
        match policy {
            Some("Always") => Self::Always,
            Some("IfNotPresent") => Self::IfNotPresent,
            Some("Never") => Self::Never,
            _ => Self::default_for(image),
        }
    }

    fn default_for(image: &str) -> Self {
        match Reference::parse(image) {
            Ok(r) if r.digest.is_some() => Self::IfNotPresent,
            Ok(r) if r.tag.as_deref().is_some_and(|t| t != "latest") => Self::IfNotPresent,
            _ => Self::Always,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn references_normalize_like_a_container_runtime() {
        let n = |s: &str| normalize(s).unwrap();
        assert_eq!(n("busybox"), "docker.io/library/busybox:latest");
        assert_eq!(n("busybox:1.36"), "docker.io/library/busybox:1.36");
        assert_eq!(n("bitnami/etcd"), "docker.io/bitnami/etcd:latest");
        assert_eq!(
            n("ghcr.io/storage-migrator/storage-migrator:0.1.0"),
            "ghcr.io/storage-migrator/storage-migrator:0.1.0"
        );
        assert_eq!(n("localhost:5000/x"), "localhost:5000/x:latest");
        assert_eq!(n("localhost/x:1"), "localhost/x:1");
        assert_eq!(n("quay.io/a/b@sha256:00"), "quay.io/a/b@sha256:00");
        assert_eq!(n("quay.io/a/b:1@sha256:00"), "quay.io/a/b:1@sha256:00");
        assert_eq!(n(" busybox "), n("docker.io/library/busybox:latest"));
        for bad in [
            "",
            " ",
            "a b",
            "x:",
            "/x",
            "x/",
            "a//b",
            "x@nodigest",
            "x@a:b@c:d",
        ] {
            assert!(normalize(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn pull_policy_defaults_follow_kubernetes() {
        use PullPolicy::*;
        assert_eq!(PullPolicy::of(None, "busybox"), Always);
        assert_eq!(PullPolicy::of(None, "busybox:latest"), Always);
        assert_eq!(PullPolicy::of(None, "busybox:1.36"), IfNotPresent);
        assert_eq!(PullPolicy::of(None, "busybox@sha256:00"), IfNotPresent);
        assert_eq!(PullPolicy::of(None, "localhost:5000/x"), Always);
        assert_eq!(PullPolicy::of(Some("Never"), "busybox"), Never);
        assert_eq!(PullPolicy::of(Some("IfNotPresent"), "x"), IfNotPresent);
        assert_eq!(PullPolicy::of(Some("Always"), "x:1"), Always);
        assert_eq!(PullPolicy::of(Some("bogus"), "x:1"), IfNotPresent);
    }
}
