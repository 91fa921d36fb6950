//! Kubernetes quantities (`256Mi`, `1Gi`, `1.5G`, `1e9`) as whole bytes, for size comparisons.

use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

/// Parses a quantity to a whole number of bytes (rounded up, as Kubernetes rounds storage).
/// `None` when it is not a valid quantity or does not fit.
pub fn bytes(q: &Quantity) -> Option<i128> {
    parse(&q.0)
}

/// See [`bytes`].
pub fn parse(s: &str) -> Option<i128> {
    let s = s.trim();
    if s.is_empty() {
        return None;
    }
    let (number, suffix) = split_number(s);
    let (num, den) = decimal(number)?;
    let (mul_num, mul_den): (i128, i128) = match suffix {
        "" => (1, 1),
        "Ki" => (1 << 10, 1),
        "Mi" => (1 << 20, 1),
        "Gi" => (1 << 30, 1),
        "Ti" => (1 << 40, 1),
        "Pi" => (1 << 50, 1),
        "Ei" => (1 << 60, 1),
        "n" => (1, 1_000_000_000),
        "u" => (1, 1_000_000),
        "m" => (1, 1_000),
        "k" => (1_000, 1),
        "M" => (1_000_000, 1),
        "G" => (1_000_000_000, 1),
        "T" => (1_000_000_000_000, 1),
        "P" => (1_000_000_000_000_000, 1),
        "E" => (1_000_000_000_000_000_000, 1),
        exp if exp.starts_with(['e', 'E']) => {
            let e: i32 = exp[1..].parse().ok()?;
            if !(-18..=18).contains(&e) {
                return None;
            }
            if e >= 0 {
                (10i128.checked_pow(e.unsigned_abs())?, 1)
            } else {
                (1, 10i128.checked_pow(e.unsigned_abs())?)
            }
        }
        _ => return None,
    };
    let n = num.checked_mul(mul_num)?;
    let d = den.checked_mul(mul_den)?;
    // Round up (towards +infinity) to whole bytes.
    Some(if n >= 0 { (n + d - 1) / d } else { n / d })
}

/// Splits `1.5Gi` into (`1.5`, `Gi`).
fn split_number(s: &str) -> (&str, &str) {
    let end = s
        .char_indices()
        .find(|&(i, c)| !(c.is_ascii_digit() || c == '.' || ((c == '+' || c == '-') && i == 0)))
        .map(|(i, _)| i)
        .unwrap_or(s.len());
    s.split_at(end)
}

/// `1.25` as (125, 100).
fn decimal(s: &str) -> Option<(i128, i128)> {
    let (neg, digits) = match s.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, s.strip_prefix('+').unwrap_or(s)),
    };
    if digits.is_empty() || digits == "." {
        return None;
    }
    let (int, frac) = digits.split_once('.').unwrap_or((digits, ""));
    if frac.len() > 18 || frac.contains('.') {
        return None;
    }
    let all: String = format!("{int}{frac}");
    let value: i128 = if all.is_empty() { 0 } else { all.parse().ok()? };
    let den = 10i128.checked_pow(u32::try_from(frac.len()).ok()?)?;
    Some((if neg { -value } else { value }, den))
}

/// Human-readable binary size (`1.5Gi`, `300Mi`, `512`), for messages.
pub fn human(bytes: i128) -> String {
    const UNITS: [(&str, i128); 4] = [
        ("Ti", 1 << 40),
        ("Gi", 1 << 30),
        ("Mi", 1 << 20),
        ("Ki", 1 << 10),
    ];
    for (unit, size) in UNITS {
        if bytes.abs() >= size {
            let whole = bytes / size;
            let tenth = (bytes % size) * 10 / size;
            return if tenth == 0 {
                format!("{whole}{unit}")
            } else {
                format!("{whole}.{tenth}{unit}")
            };
        }
    }
    format!("{bytes}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_usual_forms() {
        assert_eq!(parse("1Gi"), Some(1 << 30));
        assert_eq!(parse("256Mi"), Some(256 << 20));
        assert_eq!(parse("1G"), Some(1_000_000_000));
        assert_eq!(parse("1.5Gi"), Some(3 << 29));
        assert_eq!(parse("100"), Some(100));
        assert_eq!(parse("1e3"), Some(1000));
        assert_eq!(parse("1E6"), Some(1_000_000));
        assert_eq!(parse("500m"), Some(1), "rounded up to a whole byte");
        assert_eq!(parse("0"), Some(0));
        assert_eq!(parse("+2Ki"), Some(2048));
    }

    #[test]
    fn refuses_garbage() {
        for bad in ["", "Gi", "1Gb", "1..5", "abc", "1 Gi", "1e99", "."] {
            assert_eq!(parse(bad), None, "{bad}");
        }
    }

    #[test]
    fn human_sizes() {
        assert_eq!(human(1 << 30), "1Gi");
        assert_eq!(human(3 << 29), "1.5Gi");
        assert_eq!(human(512), "512");
        assert_eq!(human(16 << 20), "16Mi");
    }
}
