//! `bench-copy`: how fast the pre-copy copies, against `cp -a` on the same volumes (issue 10,
//! target 6): [`e2e::copy_speed`] run alone, with no cluster. `bench-migration --workloads
//! copy` runs the same measurement beside the migrations.
//!
//! Prints Markdown tables on stdout, each run's time on stderr.
//!
//! ```sh
//! bench-copy --dir /var/tmp/bench-copy --runs 5
//! ```

use std::path::PathBuf;

use clap::Parser;
use e2e::copy_speed::{Options, bench};

#[derive(Parser, Debug)]
#[command(name = "bench-copy", about = "The pre-copy's speed against cp -a")]
struct Cli {
    /// Where the volume images and their mount points go (created; removed at the end).
    #[arg(long, default_value = "/var/tmp/bench-copy")]
    dir: PathBuf,
    /// Copies of each set by each tool; the table shows the median.
    #[arg(long, default_value_t = 5)]
    runs: usize,
    /// Size of each volume image, GiB.
    #[arg(long, default_value_t = 3)]
    volume_gib: u64,
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    let tables = bench(&Options {
        dir: cli.dir,
        runs: cli.runs,
        volume_gib: cli.volume_gib,
    })?;
    print!("{tables}");
    Ok(())
}
