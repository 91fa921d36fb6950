use clap::{Parser, Subcommand};
use kube::CustomResourceExt;

use storage_migrator::api::StorageMigrationRequest;

#[derive(Parser)]
#[command(name = "storage-migrator", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Print the CustomResourceDefinition YAML.
    Crd,
}

fn main() -> anyhow::Result<()> {
    match Cli::parse().command {
        Command::Crd => {
            print!(
                "{}",
                serde_norway::to_string(&StorageMigrationRequest::crd())?
            );
        }
    }
    Ok(())
}
