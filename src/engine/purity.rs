//! The pure layers stay pure: a scan of the source of `src/engine` and `src/plan` for the
//! API server's client, the etcd client, the async runtime and the cluster layer. Comments are
//! skipped; a hit fails naming the file and line.

use std::path::{Path, PathBuf};

/// Identifiers that mean I/O (kube's `Api`/`Client`, the etcd client, the async runtime).
const FORBIDDEN_IDENTS: &[&str] = &["Api", "Client", "etcd_client", "tokio"];
/// Paths that mean I/O or a dependency on the cluster layer.
const FORBIDDEN_PATHS: &[&str] = &["crate::cluster", "kube::runtime", "kube::client"];
/// The modules that must not do I/O, relative to the crate root.
const PURE_MODULES: &[&str] = &["src/engine", "src/plan"];

/// The code of one line without its `//` comment (naive about `//` inside strings, which only
/// hides more of the line).
fn code(line: &str) -> &str {
    line.split_once("//").map_or(line, |(c, _)| c)
}

/// Every forbidden identifier or path in `source`, as `line N: what`.
fn violations(source: &str) -> Vec<String> {
    let mut found = Vec::new();
    for (n, line) in source.lines().enumerate() {
        let code = code(line);
        let idents = code.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'));
        for ident in idents.filter(|i| FORBIDDEN_IDENTS.contains(i)) {
            found.push(format!("line {}: {ident}", n + 1));
        }
        for path in FORBIDDEN_PATHS.iter().filter(|p| code.contains(*p)) {
            found.push(format!("line {}: {path}", n + 1));
        }
    }
    found
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let entries = std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    for entry in entries {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

#[test]
fn engine_and_plan_do_no_io() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = Vec::new();
    for module in PURE_MODULES {
        rust_files(&root.join(module), &mut files);
    }
    assert!(files.len() > 5, "found only {files:?}");
    let this = Path::new(file!());
    let mut failures = Vec::new();
    for file in files.iter().filter(|f| !f.ends_with(this)) {
        let source = std::fs::read_to_string(file).unwrap();
        for v in violations(&source) {
            failures.push(format!("{}: {v}", file.display()));
        }
    }
    assert!(
        failures.is_empty(),
        "pure modules use I/O or the cluster layer:\n{}",
        failures.join("\n")
    );
}

#[test]
fn the_scan_finds_what_it_looks_for() {
    let source = "use kube::{Api, ResourceExt};\n\
                  // kube::Client in a comment is fine\n\
                  let c: kube::Client = todo!(); // Client\n\
                  use crate::cluster::database;\n\
                  etcd_client::Client::connect(x);\n\
                  tokio::time::sleep(d);\n\
                  let n = client_port; // ApiVersion, Clients are not Client\n";
    assert_eq!(
        violations(source),
        vec![
            "line 1: Api",
            "line 3: Client",
            "line 4: crate::cluster",
            "line 5: etcd_client",
            "line 5: Client",
            "line 6: tokio",
        ]
    );
}
