//! `kubectl-smr`: the kubectl plugin (`kubectl smr ...`); see `storage_migrator::plugin`.

#[tokio::main]
async fn main() -> std::process::ExitCode {
    std::process::ExitCode::from(storage_migrator::plugin::main().await)
}
