//! `bench-files`: millions of files (issue 30, item 4). For each file count, the operator's
//! pre-copy and final-pass scripts on two loop-mounted ext4 volumes of this machine, the final
//! pass against one bare metadata walk of both trees, and each script's memory
//! ([`e2e::many_files`]). No cluster; root.
//!
//! Prints a Markdown table on stdout, progress on stderr.
//!
//! ```sh
//! bench-files --dir /var/tmp/bench-files --counts 10000,300000,1000000
//! ```

use std::path::PathBuf;

use clap::Parser;
use e2e::many_files::{Options, bench, table};

#[derive(Parser, Debug)]
#[command(
    name = "bench-files",
    about = "The final pass against a bare walk of both trees, and the copy's memory, by file count"
)]
struct Cli {
    /// Where the volume images and their mount points go (created; removed at the end).
    #[arg(long, default_value = "/var/tmp/bench-files")]
    dir: PathBuf,
    /// File counts of 4 KiB files, comma-separated; one measurement each.
    #[arg(long, value_delimiter = ',', default_value = "10000,300000,1000000")]
    counts: Vec<u64>,
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    let all = bench(&Options {
        dir: cli.dir,
        counts: cli.counts,
    })?;
    println!(
        "bench-files: ext4 on loop devices, files of 4 KiB in directories of 1,000, 1% rewritten between the pre-copy and the final pass"
    );
    print!("{}", table(&all));
    for m in &all {
        println!(
            "\n{} files, the final pass's result (warm): {}",
            m.files,
            m.final_result.trim()
        );
        println!("{} files, filled in {:.1}s", m.files, m.fill.as_secs_f64());
    }
    Ok(())
}
