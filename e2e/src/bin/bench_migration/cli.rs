//! The command line: data sizes, copy modes, operator binary, log dir.

use std::path::PathBuf;

use clap::{Parser, ValueEnum};

#[derive(Parser)]
#[command(
    name = "bench-migration",
    about = "Per-member downtime of a StorageClassChange with and without pre-copy, against the cluster KUBECONFIG points at"
)]
pub struct Cli {
    /// Data sizes written to each member's volume, comma-separated (binary units: Mi, Gi).
    #[arg(long, value_delimiter = ',', default_value = "64Mi,1Gi", value_parser = parse_size)]
    pub sizes: Vec<DataSize>,
    /// Which copy modes to run: `copy.preCopy` true (on), false (off), or both.
    #[arg(long, value_enum, default_value = "both")]
    pub modes: Modes,
    /// Members of the benchmarked StatefulSet.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(i32).range(1..=9))]
    pub replicas: i32,
    /// Which workloads to run: `generic` (the filled writer set, per size and mode), `etcd`
    /// (issue 10's target 8: a client writing to etcd through a migration with pre-copy, per
    /// member count), `copy` (target 6: the pre-copy's script against `cp -a` on two
    /// loop-mounted volumes of this machine, no cluster needed; `e2e::copy_speed`, as
    /// `bench-copy`) and `idle` (issue 30: an operator with finished requests, its requests per
    /// minute), in any combination.
    #[arg(long, value_enum, value_delimiter = ',', default_value = "generic")]
    pub workloads: Vec<Workload>,
    /// Members of the etcd sets, comma-separated (one scenario each; `--workloads etcd`).
    #[arg(long, value_delimiter = ',', default_value = "3,5", value_parser = clap::value_parser!(u8).range(1..=9))]
    pub etcd_members: Vec<u8>,
    /// Copies of each data set by each tool (`--workloads copy`); the table shows the median.
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u16).range(1..=50))]
    pub copy_runs: u16,
    /// Where `--workloads copy` makes its volume images (created; removed at the end).
    #[arg(long, default_value = "/var/tmp/bench-copy")]
    pub copy_dir: PathBuf,
    /// `copy.firstPassTool` of every request: `Cp` (the default) or `Rsync`, to compare what the
    /// first pass's speed costs the member that still serves.
    #[arg(long, value_enum, default_value = "cp")]
    pub first_pass_tool: FirstPass,
    /// Finished requests the idle operator holds (`--workloads idle`).
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u16).range(1..=1000))]
    pub idle_requests: u16,
    /// How long the idle operator's requests are counted, in minutes (`--workloads idle`).
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u16).range(1..=120))]
    pub idle_minutes: u16,
    /// Pending pods, and as many Pending claims, created first in other namespaces that every
    /// scenario's operator watches too (0: none).
    #[arg(long, default_value_t = 0)]
    pub unrelated: usize,
    /// Every scenario's operator watches every namespace (the chart's default, cluster-wide
    /// RBAC) instead of its own (and `--unrelated`'s) by name.
    #[arg(long)]
    pub cluster_wide: bool,
    /// The namespaces `--unrelated` spreads its objects over.
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u16).range(1..=100))]
    pub unrelated_namespaces: u16,
    /// Keep the namespaces (and their workloads) instead of deleting them.
    #[arg(long)]
    pub keep: bool,
    /// The operator binary (default: `storage-migrator` next to this binary).
    #[arg(long, env = "STORAGE_MIGRATOR_BIN")]
    pub operator_bin: Option<PathBuf>,
    /// One more argument for every operator's `run` (repeatable), e.g.
    /// `--operator-arg=--lease-duration=60 --operator-arg=--lease-grace=20`.
    #[arg(long = "operator-arg", allow_hyphen_values = true)]
    pub operator_args: Vec<String>,
    /// Where the operator's logs go (default: `<temp dir>/bench-migration`).
    #[arg(long)]
    pub log_dir: Option<PathBuf>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Workload {
    Generic,
    Etcd,
    Copy,
    /// An operator holding `--idle-requests` finished requests, its requests counted over
    /// `--idle-minutes` (`idle.rs`).
    Idle,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum FirstPass {
    Cp,
    Rsync,
}

impl FirstPass {
    /// The value of `spec.copy.firstPassTool`.
    pub fn spec_value(self) -> &'static str {
        match self {
            FirstPass::Cp => "Cp",
            FirstPass::Rsync => "Rsync",
        }
    }
}

#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum Modes {
    Both,
    On,
    Off,
}

impl Modes {
    pub fn pre_copy_values(self) -> &'static [bool] {
        match self {
            Modes::Both => &[true, false],
            Modes::On => &[true],
            Modes::Off => &[false],
        }
    }
}

/// A data size per member, in MiB, with the label it was given as.
#[derive(Clone, Debug, PartialEq)]
pub struct DataSize {
    pub label: String,
    pub mib: u64,
}

impl DataSize {
    /// The claim size: data + 50%, at least 256Mi, in whole MiB.
    pub fn claim_size(&self) -> String {
        let mib = self.mib.saturating_mul(3).div_ceil(2).max(256);
        format!("{mib}Mi")
    }
}

fn parse_size(s: &str) -> Result<DataSize, String> {
    let s = s.trim();
    let (digits, factor) = if let Some(d) = s.strip_suffix("Mi") {
        (d, 1u64)
    } else if let Some(d) = s.strip_suffix("Gi") {
        (d, 1024)
    } else {
        return Err(format!("{s:?}: give a size in Mi or Gi, e.g. 64Mi or 1Gi"));
    };
    let n: u64 = digits
        .parse()
        .map_err(|_| format!("{s:?}: not a whole number of Mi or Gi"))?;
    let mib = n
        .checked_mul(factor)
        .filter(|m| *m > 0)
        .ok_or_else(|| format!("{s:?}: must be above 0 and fit in 64 bits"))?;
    Ok(DataSize {
        label: s.to_string(),
        mib,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse_and_claims_fit() {
        let s = parse_size("64Mi").unwrap();
        assert_eq!(s.mib, 64);
        assert_eq!(s.claim_size(), "256Mi");
        let g = parse_size("1Gi").unwrap();
        assert_eq!(g.mib, 1024);
        assert_eq!(g.claim_size(), "1536Mi");
        assert_eq!(parse_size("3Mi").unwrap().claim_size(), "256Mi");
        assert_eq!(parse_size("201Mi").unwrap().claim_size(), "302Mi");
        for bad in [
            "64",
            "1G",
            "0Mi",
            "-1Gi",
            "1.5Gi",
            "Gi",
            "99999999999999999999Gi",
        ] {
            assert!(parse_size(bad).is_err(), "{bad}");
        }
    }
}
