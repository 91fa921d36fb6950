//! The operator's image: one image holds the operator and everything its copy, verify and
//! measure Jobs (and the mounter pods) run, so the Jobs' default image is the operator's own
//! image at the same version. Depends on nothing of ours.
//!
//! `storage-migrator run --image REF` (env `STORAGE_MIGRATOR_IMAGE`, which the Helm chart sets
//! from its `image` values) configures it; the default is [`DEFAULT_IMAGE`]. A request's
//! `spec.copy.moverImage` still overrides it for that request's Jobs. The reference is checked
//! once, at startup ([`ImageRef::parse`]), against the grammar of container image references
//! (`[domain[:port]/]path[:tag][@digest]`), so that a typo in a flag or a chart value stops the
//! operator with a clear error instead of failing every copy Job with `InvalidImageName`.

use std::fmt;
use std::str::FromStr;

/// The repository the project publishes its image to.
pub const IMAGE_REPOSITORY: &str = "ghcr.io/storage-migrator/storage-migrator";

/// The operator's image at this version: the default of `--image` and of the Jobs' image.
pub const DEFAULT_IMAGE: &str = concat!(
    "ghcr.io/storage-migrator/storage-migrator:",
    env!("CARGO_PKG_VERSION")
);

/// Longest repository name (domain and path), as in the reference grammar.
const MAX_NAME_LEN: usize = 255;
/// Longest tag.
const MAX_TAG_LEN: usize = 128;
/// Shortest digest hex part (the grammar's minimum; sha256 has 64).
const MIN_DIGEST_LEN: usize = 32;

/// A syntactically valid image reference. Only [`ImageRef::parse`] makes one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImageRef(String);

/// Why a string is not an image reference.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ImageRefError {
    #[error("the image reference is empty")]
    Empty,
    #[error("{0:?}: an image reference has no whitespace or control characters")]
    Whitespace(String),
    #[error("{reference:?}: repository name {name:?} is invalid: {reason}")]
    Name {
        reference: String,
        name: String,
        reason: &'static str,
    },
    #[error(
        "{reference:?}: tag {tag:?} is invalid (1 to 128 of A-Z a-z 0-9 _ . -, not starting with . or -)"
    )]
    Tag { reference: String, tag: String },
    #[error(
        "{reference:?}: digest {digest:?} is invalid (expected ALGORITHM:HEX, e.g. sha256:...)"
    )]
    Digest { reference: String, digest: String },
}

impl ImageRef {
    /// Checks `s` against the reference grammar: an optional domain (`host[:port]`, recognised
    /// as the first `/`-separated component when it contains `.` or `:` or is `localhost`), one
    /// or more lowercase path components (`a-z0-9` separated by `.`, `_`, `__` or dashes), an
    /// optional `:tag`, an optional `@algorithm:hex` digest.
    pub fn parse(s: &str) -> Result<Self, ImageRefError> {
        if s.is_empty() {
            return Err(ImageRefError::Empty);
        }
        if s.chars().any(|c| c.is_whitespace() || c.is_control()) {
            return Err(ImageRefError::Whitespace(s.to_string()));
        }
        let (rest, digest) = match s.split_once('@') {
            Some((r, d)) => (r, Some(d)),
            None => (s, None),
        };
        if let Some(d) = digest.filter(|d| !valid_digest(d)) {
            return Err(ImageRefError::Digest {
                reference: s.to_string(),
                digest: d.to_string(),
            });
        }
        // A tag follows the last ':' after the last '/' (a ':' before it is a port).
        let last_slash = rest.rfind('/').map_or(0, |i| i + 1);
        let (name, tag) = match rest[last_slash..].rfind(':') {
            Some(i) => (&rest[..last_slash + i], Some(&rest[last_slash + i + 1..])),
            None => (rest, None),
        };
        if let Some(t) = tag.filter(|t| !valid_tag(t)) {
            return Err(ImageRefError::Tag {
                reference: s.to_string(),
                tag: t.to_string(),
            });
        }
        check_name(name).map_err(|reason| ImageRefError::Name {
            reference: s.to_string(),
            name: name.to_string(),
            reason,
        })?;
        Ok(Self(s.to_string()))
    }

    /// The operator's image at this version ([`DEFAULT_IMAGE`]).
    pub fn default_image() -> Self {
        Self(DEFAULT_IMAGE.to_string())
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl FromStr for ImageRef {
    type Err = ImageRefError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::parse(s)
    }
}

impl fmt::Display for ImageRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// The repository name: `[domain/]component(/component)*`.
fn check_name(name: &str) -> Result<(), &'static str> {
    if name.is_empty() {
        return Err("it is empty");
    }
    if name.len() > MAX_NAME_LEN {
        return Err("it is longer than 255 characters");
    }
    let mut parts: Vec<&str> = name.split('/').collect();
    if parts.len() > 1 && is_domain_like(parts[0]) {
        if !valid_domain(parts[0]) {
            return Err("the registry must be HOST or HOST:PORT (letters, digits, '.', '-')");
        }
        parts.remove(0);
    }
    if parts.iter().all(|p| valid_path_component(p)) {
        Ok(())
    } else {
        Err("path components are lowercase letters and digits, separated by '.', '_', '__' or '-'")
    }
}

/// Whether the first component names a registry rather than a path (Docker's rule).
fn is_domain_like(first: &str) -> bool {
    first.contains('.') || first.contains(':') || first == "localhost"
}

/// `host[:port]`: dot-separated labels of letters, digits and inner dashes; a decimal port.
fn valid_domain(domain: &str) -> bool {
    let (host, port) = match domain.rsplit_once(':') {
        Some((h, p)) => (h, Some(p)),
        None => (domain, None),
    };
    let port_ok = port.is_none_or(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()));
    let label_ok = |l: &str| {
        !l.is_empty()
            && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
            && !l.starts_with('-')
            && !l.ends_with('-')
    };
    port_ok && host.split('.').all(label_ok)
}

/// `[a-z0-9]+` runs separated by exactly one of `.`, `_`, `__` or one or more `-`.
fn valid_path_component(p: &str) -> bool {
    let alnum = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit();
    let mut rest = p;
    loop {
        let run = rest.find(|c: char| !alnum(c)).unwrap_or(rest.len());
        if run == 0 {
            return false;
        }
        rest = &rest[run..];
        if rest.is_empty() {
            return true;
        }
        let sep = rest.find(alnum).unwrap_or(rest.len());
        let separator = &rest[..sep];
        let sep_ok = matches!(separator, "." | "_" | "__") || separator.bytes().all(|b| b == b'-');
        if !sep_ok {
            return false;
        }
        rest = &rest[sep..];
    }
}

/// `[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}`.
fn valid_tag(t: &str) -> bool {
    let word = |b: u8| b.is_ascii_alphanumeric() || b == b'_';
    t.len() <= MAX_TAG_LEN
        && t.bytes().next().is_some_and(word)
        && t.bytes().all(|b| word(b) || b == b'.' || b == b'-')
}

/// `algorithm:hex` with a lowercase alphanumeric algorithm (components joined by `+ . _ -`) and
/// at least 32 hex characters (exactly 64 for sha256).
fn valid_digest(d: &str) -> bool {
    let Some((alg, hex)) = d.split_once(':') else {
        return false;
    };
    let alg_ok = !alg.is_empty()
        && alg.split(['+', '.', '_', '-']).all(|c| {
            !c.is_empty()
                && c.bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
        });
    let hex_ok = hex.len() >= MIN_DIGEST_LEN && hex.bytes().all(|b| b.is_ascii_hexdigit());
    alg_ok && hex_ok && (alg != "sha256" || hex.len() == 64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_image_is_the_published_repository_at_this_version() {
        let image = ImageRef::parse(DEFAULT_IMAGE).unwrap();
        assert_eq!(image, ImageRef::default_image());
        assert_eq!(
            image.as_str(),
            format!("{IMAGE_REPOSITORY}:{}", env!("CARGO_PKG_VERSION"))
        );
    }

    #[test]
    fn accepts_the_references_people_write() {
        let digest = format!("sha256:{}", "0123456789abcdef".repeat(4));
        for ok in [
            "busybox",
            "busybox:1.36",
            "library/busybox:latest",
            "ghcr.io/storage-migrator/storage-migrator:0.1.0",
            "localhost/storage-migrator:dev",
            "localhost:5000/team/mover:v1.2.3-rc.1",
            "registry.example.com:443/a/b/c",
            "my-registry.local/name_with__double.and-dash:TAG_1",
            "10.0.0.1:5000/mover",
            &format!("ghcr.io/storage-migrator/storage-migrator@{digest}"),
            &format!("ghcr.io/storage-migrator/storage-migrator:0.1.0@{digest}"),
        ] {
            let parsed = ImageRef::parse(ok);
            assert_eq!(parsed.as_ref().map(ImageRef::as_str), Ok(ok), "{ok}");
        }
    }

    #[test]
    fn refuses_malformed_references_with_the_reason() {
        use ImageRefError as E;
        let name = |r: &str| matches!(ImageRef::parse(r), Err(E::Name { .. }));
        let tag = |r: &str| matches!(ImageRef::parse(r), Err(E::Tag { .. }));
        let digest = |r: &str| matches!(ImageRef::parse(r), Err(E::Digest { .. }));
        assert_eq!(ImageRef::parse(""), Err(E::Empty));
        assert!(matches!(ImageRef::parse("a b"), Err(E::Whitespace(_))));
        assert!(matches!(ImageRef::parse("mover\n"), Err(E::Whitespace(_))));
        assert!(name("ghcr.io/Storage-Migrator/x:1"), "uppercase path");
        assert!(name("ghcr.io//x"), "empty component");
        assert!(name("ghcr.io/x/"), "trailing slash");
        assert!(name("/x"), "leading slash");
        assert!(name(":1.0"), "no name");
        assert!(name("x..y"), "double dot");
        assert!(name("-x"), "leading separator");
        assert!(name("bad_host-.io/x"), "domain label ends with a dash");
        assert!(name("host:port/x"), "non-numeric port");
        assert!(name(&"a".repeat(256)), "too long");
        assert!(tag("x:"), "empty tag");
        assert!(tag("x:-1"), "tag starts with a dash");
        assert!(tag("x:a+b"), "tag with +");
        assert!(tag(&format!("x:{}", "t".repeat(129))), "tag too long");
        assert!(digest("x@sha256:abc"), "short digest");
        assert!(digest("x@"), "empty digest");
        assert!(digest(&format!("x@sha256:{}", "g".repeat(64))), "not hex");
        assert!(
            digest(&format!("x@sha256:{}", "a".repeat(40))),
            "sha256 of 40"
        );
    }

    /// The Dockerfile and e2e/scripts/build-image.sh build one image two ways; what they must
    /// agree on is checked here, so that one cannot drift from the other or from this crate.
    mod dockerfile {
        use super::*;

        const DOCKERFILE: &str = include_str!("../Dockerfile");
        const BUILD_SCRIPT: &str = include_str!("../e2e/scripts/build-image.sh");

        /// Instructions (continuation lines joined, comments dropped) of the last stage.
        fn final_stage() -> Vec<String> {
            let joined = DOCKERFILE
                .lines()
                .filter(|l| !l.trim_start().starts_with('#'))
                .collect::<Vec<_>>()
                .join("\n")
                .replace("\\\n", " ");
            let lines: Vec<String> = joined.lines().map(str::trim).map(String::from).collect();
            let last_from = lines.iter().rposition(|l| l.starts_with("FROM ")).unwrap();
            lines[last_from..]
                .iter()
                .filter(|l| !l.is_empty())
                .cloned()
                .collect()
        }

        /// The word list after `prefix` on the line that contains it.
        fn words_after<'a>(text: &'a str, prefix: &str) -> Vec<&'a str> {
            let line = text.lines().find(|l| l.contains(prefix)).unwrap();
            let rest = &line[line.find(prefix).unwrap() + prefix.len()..];
            rest.split(|c: char| c.is_whitespace() || c == ')')
                .take_while(|w| !w.is_empty() && *w != "&&" && *w != "\\")
                .collect()
        }

        #[test]
        fn version_label_is_the_crate_version() {
            let line = format!("ARG VERSION={}", env!("CARGO_PKG_VERSION"));
            assert!(final_stage().contains(&line), "{line} in the final stage");
            let repo = format!("IMAGE_REPO=\"{IMAGE_REPOSITORY}\"");
            assert!(BUILD_SCRIPT.contains(&repo), "{repo} in build-image.sh");
        }

        #[test]
        fn final_stage_runs_nothing_and_has_the_contract_config() {
            let stage = final_stage();
            assert_eq!(stage[0], "FROM ${RUNTIME_BASE}");
            assert!(!stage.iter().any(|l| l.starts_with("RUN ")), "{stage:#?}");
            for line in [
                "COPY --from=binary /out/storage-migrator /usr/local/bin/storage-migrator",
                "USER 65532:65532",
                "WORKDIR /",
                "ENTRYPOINT [\"/usr/local/bin/storage-migrator\"]",
                "CMD [\"run\"]",
            ] {
                assert!(stage.iter().any(|l| l == line), "{line:?} in {stage:#?}");
            }
        }

        #[test]
        fn both_runtime_roots_have_the_same_packages_and_user() {
            let stage = &DOCKERFILE[DOCKERFILE.find("AS runtime-debian").unwrap()..];
            let mut docker = words_after(stage, "apt-get install -y --no-install-recommends ");
            let mut local = words_after(BUILD_SCRIPT, "RUNTIME_PKGS=(");
            docker.sort_unstable();
            local.sort_unstable();
            assert_eq!(docker, local);
            assert!(local.contains(&"rsync") && local.contains(&"ca-certificates"));
            for line in [
                "nonroot:x:65532:65532:nonroot:/home/nonroot:/usr/sbin/nologin",
                "nonroot:x:65532:",
            ] {
                let quoted = format!("echo '{line}' >>");
                assert!(DOCKERFILE.contains(&quoted), "{quoted} in the Dockerfile");
                assert!(BUILD_SCRIPT.contains(&quoted), "{quoted} in build-image.sh");
            }
        }
    }

    #[test]
    fn errors_name_the_reference() {
        let e = ImageRef::parse("ghcr.io/Bad:1").unwrap_err().to_string();
        assert!(
            e.contains("\"ghcr.io/Bad:1\"") && e.contains("\"ghcr.io/Bad\""),
            "{e}"
        );
        let e = ImageRef::parse("x:+").unwrap_err().to_string();
        assert!(e.contains("tag \"+\""), "{e}");
    }
}
