//! The Markdown tables printed on stdout: the operator's numbers per scenario, and what a client
//! watching the pods saw.

use crate::etcd::EtcdRow;
use crate::scenario::{MemberRow, Row};

/// A scenario's result: its size label, its `copy.preCopy`, its row or its error.
pub type ScenarioResult = (String, bool, Result<Row, String>);

const MAIN_HEADER: [&str; 9] = [
    "size",
    "preCopy",
    "members",
    "downtime per member (s)",
    "mean downtime",
    "total (s)",
    "final pass: size of files changed",
    "final pass: bytes written",
    "files verified by content",
];

const COST_HEADER: [&str; 8] = [
    "size",
    "preCopy",
    "members",
    "operator peak RSS",
    "operator API requests (per member)",
    "at its start (access reviews)",
    "the migration's, after its start (per member)",
    "by verb",
];

const PHASES_HEADER: [&str; 6] = [
    "size",
    "preCopy",
    "pod stopped → copied and verified (s)",
    "→ claim swapped (s)",
    "→ member back, Ready and gated (s)",
    "claim swap: worst (s)",
];

const CLIENT_HEADER: [&str; 10] = [
    "size",
    "preCopy",
    "migration order",
    "observed unavailability per member (s)",
    "mean",
    "plain restart (s)",
    "worst − plain restart (s)",
    "mean / plain restart",
    "request created → Successful seen (s)",
    "namespace",
];

fn human_bytes(n: i64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = n as f64;
    let mut unit = 0;
    while v.abs() >= 1024.0 && unit + 1 < UNITS.len() {
        v /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{n} B")
    } else {
        format!("{v:.1} {}", UNITS[unit])
    }
}

fn opt_secs(v: Option<f64>) -> String {
    v.map_or_else(|| "?".into(), |s| format!("{s:.1}"))
}

fn mean(values: impl Iterator<Item = Option<f64>>) -> Option<f64> {
    let all: Option<Vec<f64>> = values.collect();
    let all = all?;
    (!all.is_empty()).then(|| all.iter().sum::<f64>() / all.len() as f64)
}

/// A Markdown table with padded columns.
fn markdown_table(header: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = header.iter().map(|h| h.chars().count()).collect();
    for row in rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let line = |cells: Vec<String>| {
        let padded: Vec<String> = cells
            .iter()
            .zip(&widths)
            .map(|(c, w)| format!("{c:<w$}"))
            .collect();
        format!("| {} |\n", padded.join(" | "))
    };
    let mut out = line(header.iter().map(|h| h.to_string()).collect());
    out.push_str(&line(widths.iter().map(|w| "-".repeat(*w)).collect()));
    for row in rows {
        out.push_str(&line(row.clone()));
    }
    out
}

fn observed_secs(m: &MemberRow) -> Option<f64> {
    m.observed.map(|d| d.as_secs_f64())
}

/// The operator's numbers of a successful scenario.
fn main_row(size: &str, mode: &str, row: &Row) -> Vec<String> {
    let downtimes: Vec<String> = row.members.iter().map(|m| opt_secs(m.downtime)).collect();
    let list = |f: fn(&MemberRow) -> Option<i64>| {
        let each: Vec<String> = row
            .members
            .iter()
            .map(|m| f(m).map_or_else(|| "?".into(), human_bytes))
            .collect();
        each.join(" / ")
    };
    vec![
        size.to_string(),
        mode.to_string(),
        row.members.len().to_string(),
        downtimes.join(" / "),
        opt_secs(mean(row.members.iter().map(|m| m.downtime))),
        row.total_seconds
            .map_or_else(|| "?".into(), |s| s.to_string()),
        list(|m| m.bytes_copied),
        list(|m| m.bytes_written),
        row.members
            .iter()
            .map(|m| {
                m.verified_files
                    .map_or_else(|| "?".into(), |n| n.to_string())
            })
            .collect::<Vec<_>>()
            .join(" / "),
    ]
}

/// What the client saw in a successful scenario.
fn client_row(size: &str, mode: &str, row: &Row) -> Vec<String> {
    let observed: Vec<String> = row
        .members
        .iter()
        .map(|m| opt_secs(observed_secs(m)))
        .collect();
    let order: Vec<&str> = row.members.iter().map(|m| m.pod.as_str()).collect();
    let plain = row.plain_restart.as_secs_f64();
    let mean_observed = mean(row.members.iter().map(observed_secs));
    let worst = row
        .members
        .iter()
        .filter_map(observed_secs)
        .fold(None, |w: Option<f64>, s| Some(w.map_or(s, |w| w.max(s))));
    vec![
        size.to_string(),
        mode.to_string(),
        order.join(", "),
        observed.join(" / "),
        opt_secs(mean_observed),
        format!("{plain:.1}"),
        opt_secs(worst.map(|w| w - plain)),
        mean_observed
            .filter(|_| plain > 0.0)
            .map_or_else(|| "?".into(), |m| format!("{:.2}×", m / plain)),
        format!("{:.1}", row.wall.as_secs_f64()),
        row.namespace.clone(),
    ]
}

/// Where the members' downtime went in a successful scenario, each part per member.
fn phases_row(size: &str, mode: &str, row: &Row) -> Vec<String> {
    let each = |f: fn(&MemberRow) -> Option<f64>| {
        let parts: Vec<String> = row.members.iter().map(|m| opt_hundredths(f(m))).collect();
        parts.join(" / ")
    };
    let worst_swap = row
        .members
        .iter()
        .filter_map(|m| m.phases.swap)
        .fold(None, |w: Option<f64>, s| Some(w.map_or(s, |w| w.max(s))));
    vec![
        size.to_string(),
        mode.to_string(),
        each(|m| m.phases.copy),
        each(|m| m.phases.swap),
        each(|m| m.phases.back),
        opt_hundredths(worst_swap),
    ]
}

fn opt_hundredths(v: Option<f64>) -> String {
    v.map_or_else(|| "?".into(), |s| format!("{s:.2}"))
}

/// The main table's row of a failed scenario.
fn failed_row(size: &str, mode: &str, error: &str) -> Vec<String> {
    vec![
        size.to_string(),
        mode.to_string(),
        "-".into(),
        format!("FAILED: {error}"),
        "-".into(),
        "-".into(),
        "-".into(),
        "-".into(),
    ]
}

/// What the operator cost in a successful scenario: peak memory, API requests.
fn cost_row(size: &str, mode: &str, row: &Row) -> Vec<String> {
    let members = row.members.len();
    let requests = row.requests.as_ref();
    let per_member = |total: u64| {
        let n = u64::try_from(members).unwrap_or(1).max(1);
        format!("{total} ({})", total.div_ceil(n))
    };
    let migration = row.migration_requests.as_ref();
    let start = requests.zip(migration).map(|(all, migration)| {
        let at_start = all.total().saturating_sub(migration.total());
        let reviews = all.access_reviews.saturating_sub(migration.access_reviews);
        format!("{at_start} ({reviews})")
    });
    let by_verb = requests.map(|r| {
        let each: Vec<String> = r.by_verb.iter().map(|(v, n)| format!("{v} {n}")).collect();
        each.join(", ")
    });
    vec![
        size.to_string(),
        mode.to_string(),
        members.to_string(),
        row.peak_rss.map_or_else(
            || "?".into(),
            |b| human_bytes(i64::try_from(b).unwrap_or(i64::MAX)),
        ),
        requests.map_or_else(|| "?".into(), |r| per_member(r.total())),
        start.unwrap_or_else(|| "?".into()),
        migration.map_or_else(|| "?".into(), |r| per_member(r.total())),
        by_verb.unwrap_or_else(|| "?".into()),
    ]
}

/// The tables; the client and cost tables only when a scenario succeeded.
pub fn tables(results: &[ScenarioResult]) -> String {
    let mut main_rows = Vec::new();
    let mut client_rows = Vec::new();
    let mut cost_rows = Vec::new();
    let mut phase_rows = Vec::new();
    for (size, pre_copy, result) in results {
        let mode = pre_copy.to_string();
        match result {
            Ok(row) => {
                main_rows.push(main_row(size, &mode, row));
                client_rows.push(client_row(size, &mode, row));
                phase_rows.push(phases_row(size, &mode, row));
                cost_rows.push(cost_row(size, &mode, row));
            }
            Err(e) => main_rows.push(failed_row(size, &mode, e)),
        }
    }
    let mut out = markdown_table(&MAIN_HEADER, &main_rows);
    if !client_rows.is_empty() {
        out.push('\n');
        out.push_str(&markdown_table(&CLIENT_HEADER, &client_rows));
        out.push('\n');
        out.push_str(&markdown_table(&PHASES_HEADER, &phase_rows));
        out.push('\n');
        out.push_str(&markdown_table(&COST_HEADER, &cost_rows));
    }
    out
}

const ETCD_HEADER: [&str; 8] = [
    "members",
    "longest gap between acknowledged writes (ms)",
    "its end, after the request's creation (s)",
    "writes acknowledged / attempted",
    "retried",
    "failed",
    "downtime per member (s)",
    "request created → Successful seen (s)",
];

/// The etcd scenarios' table: one row per member count, or its error.
pub fn etcd_table(results: &[(usize, Result<EtcdRow, String>)]) -> String {
    let rows: Vec<Vec<String>> = results
        .iter()
        .map(|(n, result)| match result {
            Ok(row) => {
                let w = &row.writes;
                let downtime: Vec<String> = row
                    .downtime
                    .iter()
                    .map(|(pod, d)| format!("{pod} {}", opt_secs(*d)))
                    .collect();
                vec![
                    n.to_string(),
                    w.longest_gap.as_millis().to_string(),
                    format!("{:.1}", row.gap_ended_at),
                    format!("{} / {}", w.acked.len(), w.attempted),
                    w.retried.to_string(),
                    w.failed.to_string(),
                    downtime.join(", "),
                    format!("{:.1}", row.wall.as_secs_f64()),
                ]
            }
            Err(e) => {
                let mut cells = vec![n.to_string(), format!("FAILED: {e}")];
                cells.resize(ETCD_HEADER.len(), String::new());
                cells
            }
        })
        .collect();
    markdown_table(&ETCD_HEADER, &rows)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn table_lists_members_and_failures() {
        let row = Row {
            namespace: "ns".into(),
            members: vec![
                MemberRow {
                    pod: "bench-2".into(),
                    downtime: Some(6.0),
                    bytes_copied: Some(2048),
                    bytes_written: Some(512),
                    verified_files: Some(3),
                    observed: Some(Duration::from_millis(5800)),
                    phases: crate::phases::Phases {
                        copy: Some(0.904),
                        swap: Some(0.41),
                        back: Some(0.5),
                    },
                },
                MemberRow {
                    pod: "bench-1".into(),
                    downtime: Some(8.0),
                    bytes_copied: Some(100),
                    bytes_written: None,
                    verified_files: None,
                    observed: Some(Duration::from_millis(7200)),
                    phases: crate::phases::Phases {
                        copy: Some(1.0),
                        swap: Some(0.62),
                        back: None,
                    },
                },
            ],
            total_seconds: Some(61),
            wall: Duration::from_millis(62_300),
            plain_restart: Duration::from_millis(4000),
            peak_rss: Some(23 << 20),
            requests: Some(crate::frugal::Requests {
                by_verb: [("get".to_string(), 900), ("create".to_string(), 101)].into(),
                access_reviews: 57,
            }),
            started: None,
            migration_requests: Some(crate::frugal::Requests {
                by_verb: [("get".to_string(), 800), ("create".to_string(), 40)].into(),
                access_reviews: 0,
            }),
        };
        let out = tables(&[
            ("64Mi".into(), true, Ok(row)),
            ("1Gi".into(), false, Err("timed out".into())),
        ]);
        assert!(out.contains("| 64Mi "), "{out}");
        assert!(out.contains("6.0 / 8.0"), "{out}");
        assert!(out.contains("| 7.0 "), "{out}");
        assert!(out.contains("2.0 KiB / 100 B"), "{out}");
        assert!(out.contains("| 512 B / ? "), "{out}");
        assert!(out.contains("| 3 / ? "), "{out}");
        assert!(out.contains("FAILED: timed out"), "{out}");
        assert!(out.contains("bench-2, bench-1"), "{out}");
        assert!(out.contains("62.3"), "{out}");
        // Plain restart 4.0 s; worst observed 7.2 s; mean 6.5 s.
        let cells: Vec<&str> = out
            .lines()
            .find(|l| l.contains("bench-2, bench-1"))
            .unwrap()
            .split('|')
            .map(str::trim)
            .collect();
        assert_eq!(cells[6..9], ["4.0", "3.2", "1.62×"], "{out}");
        // The operator's cost: 1001 requests over 2 members.
        assert!(out.contains("| 23.0 MiB "), "{out}");
        // 161 of them at the operator's start (57 access reviews), 840 the migration's.
        assert!(out.contains("| 1001 (501) "), "{out}");
        assert!(out.contains("| 161 (57) "), "{out}");
        assert!(out.contains("| 840 (420) "), "{out}");
        assert!(out.contains("| create 101, get 900 |"), "{out}");
        // Where the downtime went, per member, and the worst claim swap.
        let phases: Vec<&str> = out
            .lines()
            .find(|l| l.contains("0.90 / 1.00"))
            .unwrap_or_else(|| panic!("no phases row: {out}"))
            .split('|')
            .map(str::trim)
            .collect();
        assert_eq!(
            phases[3..7],
            ["0.90 / 1.00", "0.41 / 0.62", "0.50 / ?", "0.62"]
        );
    }

    #[test]
    fn only_failures_print_one_table() {
        let out = tables(&[("64Mi".into(), false, Err("boom".into()))]);
        assert_eq!(out.lines().count(), 3, "{out}");
        assert!(out.starts_with("| size "), "{out}");
        assert!(out.contains("| false "), "{out}");
    }

    #[test]
    fn the_etcd_table_gives_the_longest_gap_and_every_write() {
        let writes = e2e::testing::etcd_writer::Writes {
            attempted: 1950,
            retried: 3,
            failed: 1,
            acked: (0..1949).collect(),
            longest_gap: Duration::from_millis(104),
            longest_gap_ended: Duration::from_secs(14),
            failures: vec![],
            retries: vec![],
        };
        let row = EtcdRow {
            writes,
            downtime: vec![("etcd-1".into(), Some(3.0)), ("etcd-0".into(), None)],
            wall: Duration::from_millis(41_250),
            gap_ended_at: 12.34,
        };
        let out = etcd_table(&[(3, Ok(row)), (5, Err("no leader".into()))]);
        let cells: Vec<&str> = out
            .lines()
            .nth(2)
            .unwrap()
            .split('|')
            .map(str::trim)
            .collect();
        assert_eq!(
            cells[1..9],
            [
                "3",
                "104",
                "12.3",
                "1949 / 1950",
                "3",
                "1",
                "etcd-1 3.0, etcd-0 ?",
                "41.2"
            ],
            "{out}"
        );
        let failed: Vec<&str> = out
            .lines()
            .nth(3)
            .unwrap()
            .split('|')
            .map(str::trim)
            .collect();
        assert_eq!(failed[1..3], ["5", "FAILED: no leader"], "{out}");
    }

    #[test]
    fn bytes_are_human_readable() {
        assert_eq!(human_bytes(0), "0 B");
        assert_eq!(human_bytes(1023), "1023 B");
        assert_eq!(human_bytes(1536), "1.5 KiB");
        assert_eq!(human_bytes(3 << 30), "3.0 GiB");
        assert_eq!(mean([Some(1.0), None].into_iter()), None);
        assert_eq!(mean(std::iter::empty()), None);
    }
}
