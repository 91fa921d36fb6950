//! Reading a copy Job's live progress from the tail of its log.
//!
//! The copy scripts (see [`super::job`]) run rsync with `--info=progress2 --no-inc-recursive`
//! and turn its carriage returns into newlines, so every update is one log line:
//!
//! ```text
//!      50,000,017  99%  671.16MB/s    0:00:00 (xfr#6, to-chk=45/52)
//! ```
//!
//! bytes so far, rsync's percentage of the whole tree, the current rate (`kB`, `MB`, `GB`, `TB`
//! of 1024), a time, and, on the lines that end a file, the files transferred and the entries
//! still to check out of all entries. [`parse_progress`] takes the last such line of a log tail.

use crate::api::{CopyPass, CopyProgress};

/// The progress in the last progress line of `log`, or `None` when it has none.
/// `measured_total` (bytes in use measured at preflight, if any) stands for the total until
/// rsync reports a percentage above zero.
pub fn parse_progress(
    log: &str,
    pass: CopyPass,
    measured_total: Option<i64>,
) -> Option<CopyProgress> {
    let line = log
        .lines()
        .rev()
        .find_map(|l| l.rsplit('\r').find_map(ProgressLine::parse))?;
    Some(line.into_progress(pass, measured_total))
}

/// One `--info=progress2` line, as numbers.
#[derive(Debug, PartialEq)]
struct ProgressLine {
    bytes: i64,
    percent: i32,
    rate: Option<i64>,
    /// Files transferred (`xfr#N`).
    transferred: Option<i64>,
    /// Entries still to check, out of all entries (`to-chk=N/M` or `ir-chk=N/M`).
    to_check: Option<(i64, i64)>,
}

impl ProgressLine {
    fn parse(line: &str) -> Option<Self> {
        let mut tokens = line.split_whitespace();
        let bytes = parse_grouped(tokens.next()?)?;
        let percent: i32 = tokens.next()?.strip_suffix('%')?.parse().ok()?;
        if !(0..=100).contains(&percent) {
            return None;
        }
        let rate = parse_rate(tokens.next()?)?;
        let rest: Vec<&str> = tokens.skip(1).collect();
        let rest = rest.join(" ");
        Some(ProgressLine {
            bytes,
            percent,
            rate: Some(rate),
            transferred: between(&rest, "xfr#", ",").and_then(|n| n.parse().ok()),
            to_check: between(&rest, "chk=", ")").and_then(parse_fraction),
        })
    }

    fn into_progress(self, pass: CopyPass, measured_total: Option<i64>) -> CopyProgress {
        let total = if self.percent > 0 {
            Some((self.bytes.saturating_mul(100) / i64::from(self.percent)).max(self.bytes))
        } else {
            measured_total.filter(|t| *t >= self.bytes)
        };
        let eta = match (total, self.rate) {
            (Some(t), Some(r)) if r > 0 => Some((t - self.bytes).max(0) / r),
            _ => None,
        };
        let (files_done, files_total) = match self.to_check {
            Some((left, all)) => (Some(all - left), Some(all)),
            None => (self.transferred, None),
        };
        // Before rsync's first percent, and all through a pre-copy by `cp` (whose lines say
        // 0 %), the share of the measured total.
        let percent = match total {
            Some(t) if self.percent == 0 && t > 0 => {
                i32::try_from((self.bytes.saturating_mul(100) / t).min(99)).unwrap_or(0)
            }
            _ => self.percent,
        };
        CopyProgress {
            pass,
            bytes_done: self.bytes,
            bytes_total: total,
            percent,
            bytes_per_second: self.rate,
            eta_seconds: eta,
            files_done,
            files_total,
        }
    }
}

/// `50,000,017` (rsync groups digits with `,` or `.`, depending on the locale).
fn parse_grouped(token: &str) -> Option<i64> {
    let digits: String = token.chars().filter(|c| !matches!(c, ',' | '.')).collect();
    if digits.is_empty() || !digits.chars().all(|c| c.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

/// `671.16MB/s` into bytes per second (units of 1024, as rsync prints them).
fn parse_rate(token: &str) -> Option<i64> {
    let value = token.strip_suffix("B/s")?;
    let (number, factor) = match value.char_indices().last()? {
        (i, 'k') => (&value[..i], 1024_f64),
        (i, 'M') => (&value[..i], 1024_f64.powi(2)),
        (i, 'G') => (&value[..i], 1024_f64.powi(3)),
        (i, 'T') => (&value[..i], 1024_f64.powi(4)),
        _ => (value, 1.0),
    };
    let n: f64 = number.replace(',', ".").parse().ok()?;
    (n.is_finite() && n >= 0.0).then(|| (n * factor).round() as i64)
}

/// The text between `start` and the next `end` in `s`.
fn between<'s>(s: &'s str, start: &str, end: &str) -> Option<&'s str> {
    let from = s.find(start)? + start.len();
    let len = s[from..].find(end)?;
    Some(&s[from..from + len])
}

/// `45/52` into `(45, 52)`, the first at most the second.
fn parse_fraction(s: &str) -> Option<(i64, i64)> {
    let (a, b) = s.split_once('/')?;
    let (a, b): (i64, i64) = (a.trim().parse().ok()?, b.trim().parse().ok()?);
    (0 <= a && a <= b).then_some((a, b))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_last_progress_line_wins() {
        let log = "\
              0   0%    0.00kB/s    0:00:00
     32,768,000  65%   31.25MB/s    0:00:01
     50,000,017  99%  671.16MB/s    0:00:00 (xfr#6, to-chk=45/52)
";
        let p = parse_progress(log, CopyPass::Copy, None).unwrap();
        assert_eq!(
            p,
            CopyProgress {
                pass: CopyPass::Copy,
                bytes_done: 50_000_017,
                bytes_total: Some(50_505_067),
                percent: 99,
                bytes_per_second: Some(703_762_268),
                eta_seconds: Some(0),
                files_done: Some(7),
                files_total: Some(52),
            }
        );
    }

    #[test]
    fn a_line_of_carriage_returns_is_read_from_its_end() {
        let log = "\r  1,024  10%  1.00kB/s  0:00:09\r  2,048  20%  1.00kB/s  0:00:08";
        let p = parse_progress(log, CopyPass::PreCopy, None).unwrap();
        assert_eq!((p.bytes_done, p.percent), (2048, 20));
        assert_eq!(p.bytes_total, Some(10_240));
        assert_eq!(p.eta_seconds, Some(8), "(10240 - 2048) / 1024");
        assert_eq!((p.files_done, p.files_total), (None, None));
    }

    #[test]
    fn before_the_first_percent_the_measured_size_is_the_total() {
        let log = "        512   0%    0.00kB/s    0:00:00 (xfr#1, ir-chk=1000/1002)\n";
        let p = parse_progress(log, CopyPass::Copy, Some(1 << 20)).unwrap();
        assert_eq!(p.bytes_total, Some(1 << 20));
        assert_eq!(p.percent, 0, "512 B of 1 MiB");
        assert_eq!(p.eta_seconds, None, "no rate yet");
        assert_eq!((p.files_done, p.files_total), (Some(2), Some(1002)));
        let none = parse_progress(log, CopyPass::Copy, None).unwrap();
        assert_eq!(none.bytes_total, None);
    }

    /// The pre-copy's `cp` reports bytes and a mean rate at 0 %: the measured size gives the
    /// percent, never 100 before the pass ends, and the time left.
    #[test]
    fn a_cp_progress_line_takes_its_percent_from_the_measured_size() {
        let log = "      268435456   0%  134217728B/s    0:00:00\n";
        let p = parse_progress(log, CopyPass::PreCopy, Some(1 << 30)).unwrap();
        assert_eq!((p.bytes_done, p.percent), (1 << 28, 25));
        assert_eq!(p.eta_seconds, Some(6), "768 MiB left at 128 MiB/s");
        assert_eq!(p.bytes_per_second, Some(1 << 27));
        let past = parse_progress(log, CopyPass::PreCopy, Some(1 << 28)).unwrap();
        assert_eq!(past.percent, 99, "all of the measured size, not yet done");
        let unknown = parse_progress(log, CopyPass::PreCopy, None).unwrap();
        assert_eq!((unknown.percent, unknown.bytes_total), (0, None));
    }

    #[test]
    fn other_lines_are_not_progress() {
        for log in [
            "",
            "sending incremental file list\n",
            "Number of files: 3 (reg: 2, dir: 1)\nTotal file size: 10 bytes\n",
            "{\"bytes\":10,\"files\":2,\"totalBytes\":10,\"exitCode\":0}\n",
            "rsync: [sender] change_dir \"/source\" failed: No such file or directory (2)\n",
            "  100  101%  1.00kB/s  0:00:00\n",
        ] {
            assert_eq!(parse_progress(log, CopyPass::Copy, None), None, "{log:?}");
        }
        // The summary after the last progress line does not hide it.
        let log = "  10 100%  1.00kB/s  0:00:00 (xfr#1, to-chk=0/2)\n\nNumber of files: 2\n";
        assert_eq!(
            parse_progress(log, CopyPass::Copy, None).map(|p| p.files_done),
            Some(Some(2))
        );
    }

    #[test]
    fn rates_in_every_unit() {
        assert_eq!(parse_rate("0.00kB/s"), Some(0));
        assert_eq!(parse_rate("512B/s"), Some(512));
        assert_eq!(parse_rate("1.50kB/s"), Some(1536));
        assert_eq!(parse_rate("2.00MB/s"), Some(2 << 20));
        assert_eq!(parse_rate("1,00GB/s"), Some(1 << 30));
        assert_eq!(parse_rate("1.00TB/s"), Some(1 << 40));
        assert_eq!(parse_rate("fast"), None);
        assert_eq!(parse_rate("-1kB/s"), None);
    }
}
