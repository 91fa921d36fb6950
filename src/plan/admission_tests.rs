//! The CRD's patterns (what the API server refuses at admission) against the operator's parsers
//! (what preflight denies): they must agree, or a request is admitted only to be denied later,
//! or refused although the operator would run it.

use regex::Regex;

use super::quantity;
use super::timeout_seconds;
use crate::api::schema::{SIZE_PATTERN, TIMEOUT_MAX_LENGTH, TIMEOUT_PATTERN};

/// What the API server admits: the pattern and `maxLength`.
struct Admission(Regex);

impl Admission {
    fn new() -> Self {
        Self(Regex::new(TIMEOUT_PATTERN).unwrap())
    }
    fn is_match(&self, s: &str) -> bool {
        self.0.is_match(s) && s.chars().count() <= TIMEOUT_MAX_LENGTH
    }
}

/// Every string of up to 5 characters over digits, the units, a space and other letters, and a
/// table of longer ones: the pattern admits exactly what the parser accepts.
#[test]
fn timeout_pattern_and_parser_agree_on_every_short_string() {
    let re = Admission::new();
    let alphabet = ['0', '1', '9', 'h', 'm', 's', ' ', 'd', 'H', '.'];
    let mut strings = vec![String::new()];
    let mut last = vec![String::new()];
    for _ in 0..5 {
        let next: Vec<String> = last
            .iter()
            .flat_map(|s| alphabet.iter().map(move |c| format!("{s}{c}")))
            .collect();
        strings.extend(next.iter().cloned());
        last = next;
    }
    let mut accepted = 0;
    for s in &strings {
        let parsed = timeout_seconds(s);
        assert_eq!(
            re.is_match(s),
            parsed.is_ok(),
            "pattern and parser disagree on {s:?}: parser says {parsed:?}"
        );
        accepted += usize::from(parsed.is_ok());
    }
    assert!(accepted > 100, "only {accepted} strings accepted");
}

#[test]
fn timeout_pattern_and_parser_agree_on_a_table() {
    let re = Admission::new();
    let good = [
        ("30m", 1800),
        ("1h30m", 5400),
        ("90s", 90),
        ("2h15s", 7215),
        ("1h1m1s", 3661),
        ("10m30s", 630),
        ("1h0m", 3600),
        ("0h30m", 1800),
        ("0h0m1s", 1),
        ("030m", 1800),
        ("1000000000h", 3_600_000_000_000),
        ("999999999h999999999m999999999s", 999_999_999 * 3661),
        ("0000000000000000000000000000001s", 1),
        ("9999999999999999999999999999999h", i64::MAX),
    ];
    for (s, secs) in good {
        assert!(re.is_match(s), "pattern refuses {s:?}");
        assert_eq!(timeout_seconds(s).unwrap(), secs, "{s}");
    }
    let bad = [
        "",
        "0s",
        "0h0m0s",
        "00m",
        "30",
        "m",
        "h30m",
        "1d",
        "1H",
        "30min",
        "1h 30m",
        " 30m",
        "30m ",
        "30m\n",
        "-30m",
        "+30m",
        "1.5h",
        "PT1H",
        "30m1h",
        "1s1m",
        "1h1h",
        "1ms",
        "1m1m",
        "30\u{ff4d}",
        "\u{663}0m",
        "00000000000000000000000000000001s",
        "99999999999999999999999999999999h",
    ];
    for s in bad {
        assert!(!re.is_match(s), "pattern admits {s:?}");
        assert!(timeout_seconds(s).is_err(), "parser accepts {s:?}");
    }
}

fn positive_quantity(s: &str) -> bool {
    quantity::parse(s).is_some_and(|b| b > 0)
}

/// The size pattern admits a positive quantity and refuses the rest, as preflight's parser
/// judges them, on the quantities users write.
#[test]
fn size_pattern_agrees_with_the_quantity_parser() {
    let re = Regex::new(SIZE_PATTERN).unwrap();
    let good = [
        "256Mi", "1Gi", "1.5Gi", "0.5Gi", ".5Gi", "5.Gi", "1e9", "1E9", "1e+9", "10e-1", "1000",
        "+1Gi", "1k", "1M", "1G", "1T", "1P", "1E", "1Ki", "1Ti", "1Pi", "1Ei", "1m", "1n", "1u",
        "0.001", "007Mi", "1.",
    ];
    for s in good {
        assert!(re.is_match(s), "pattern refuses {s:?}");
        assert!(positive_quantity(s), "parser refuses {s:?}");
    }
    let bad = [
        "", "0", "0Gi", "0.0Mi", "-1Gi", "-0", "Gi", "1GiB", "1gi", "1 Gi", "1..5Gi", "1.5.5Gi",
        "1e", "1e1.5", "1Ki1", "1K", ".", "+", "1x", "1e9Gi",
    ];
    for s in bad {
        assert!(!re.is_match(s), "pattern admits {s:?}");
        assert!(!positive_quantity(s), "parser accepts {s:?}");
    }
    // Kubernetes' own quantity parser takes no spaces; the operator's trims them. The pattern
    // follows Kubernetes.
    for s in [" 1Gi", "1Gi ", "1G\n"] {
        assert!(!re.is_match(s), "pattern admits {s:?}");
    }
}

/// Well-formed quantities beyond the operator's range: admitted by the pattern (a regular
/// expression cannot bound them sensibly), denied at preflight (`InvalidSpec`).
#[test]
fn out_of_range_sizes_pass_the_pattern_and_are_denied_at_preflight() {
    let re = Regex::new(SIZE_PATTERN).unwrap();
    for s in [
        "1e19",
        "1e-19",
        "0.0000000000000000001",
        "999999999999999999999999999999999999999Ei",
    ] {
        assert!(re.is_match(s), "{s}");
        assert!(!positive_quantity(s), "{s}");
    }
}
