//! Kubernetes resource quantities (`1Gi`, `512Mi`, `1.5G`, `100k`, `500m`, `1e9`, `42`), parsed
//! exactly: the value is kept as a fraction of integers, so `1.5Gi` is exactly `3 << 29` bytes.

/// A quantity string that is not a valid quantity.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid quantity {quantity:?}: {reason}")]
pub struct QuantityError {
    pub quantity: String,
    pub reason: &'static str,
}

/// A parsed quantity: `(-1)^negative * numerator / denominator`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ParsedQuantity {
    negative: bool,
    numerator: u128,
    denominator: u128,
}

impl ParsedQuantity {
    /// The value rounded up to whole units (bytes for sizes); negative values are refused.
    pub fn ceil_u64(&self) -> Result<u64, &'static str> {
        if self.negative {
            return Err("negative sizes are not allowed");
        }
        u64::try_from(self.numerator.div_ceil(self.denominator)).map_err(|_| "too large")
    }

    /// The value as a float (for ratios such as a resource divided by its divisor).
    pub fn as_f64(&self) -> f64 {
        let v = self.numerator as f64 / self.denominator as f64;
        if self.negative { -v } else { v }
    }
}

/// Multiplier of a suffix as `(numerator, denominator)`.
fn suffix_scale(suffix: &str) -> Result<(u128, u128), &'static str> {
    Ok(match suffix {
        "" => (1, 1),
        "Ki" => (1 << 10, 1),
        "Mi" => (1 << 20, 1),
        "Gi" => (1 << 30, 1),
        "Ti" => (1 << 40, 1),
        "Pi" => (1 << 50, 1),
        "Ei" => (1 << 60, 1),
        "m" => (1, 1000),
        "k" | "K" => (10u128.pow(3), 1),
        "M" => (10u128.pow(6), 1),
        "G" => (10u128.pow(9), 1),
        "T" => (10u128.pow(12), 1),
        "P" => (10u128.pow(15), 1),
        "E" => (10u128.pow(18), 1),
        _ => {
            let exp = suffix
                .strip_prefix('e')
                .or_else(|| suffix.strip_prefix('E'))
                .ok_or("unknown suffix")?;
            let exp: i32 = exp.parse().map_err(|_| "unknown suffix")?;
            if !(-18..=18).contains(&exp) {
                return Err("exponent out of range");
            }
            if exp >= 0 {
                (10u128.pow(exp.unsigned_abs()), 1)
            } else {
                (1, 10u128.pow(exp.unsigned_abs()))
            }
        }
    })
}

/// The digits of `int.frac` as one integer, and the number of fraction digits.
fn mantissa(number: &str) -> Result<(u128, u32), &'static str> {
    if number.is_empty() || number == "." {
        return Err("no number");
    }
    let (int_part, frac_part) = number.split_once('.').unwrap_or((number, ""));
    if frac_part.contains('.') {
        return Err("more than one decimal point");
    }
    if int_part.len() + frac_part.len() > 30 {
        return Err("too many digits");
    }
    let mut mantissa: u128 = 0;
    for c in int_part.chars().chain(frac_part.chars()) {
        let digit = u128::from(c.to_digit(10).ok_or("not a number")?);
        mantissa = mantissa * 10 + digit;
    }
    let frac_digits = u32::try_from(frac_part.len()).map_err(|_| "too many digits")?;
    Ok((mantissa, frac_digits))
}

fn parse_inner(quantity: &str) -> Result<ParsedQuantity, &'static str> {
    let s = quantity.trim();
    let (negative, s) = match s.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, s.strip_prefix('+').unwrap_or(s)),
    };
    let number_len = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(s.len());
    let (number, suffix) = s.split_at(number_len);
    let (mantissa, frac_digits) = mantissa(number)?;
    let (num, den) = suffix_scale(suffix)?;
    let numerator = mantissa.checked_mul(num).ok_or("too large")?;
    let denominator = 10u128
        .checked_pow(frac_digits)
        .and_then(|p| p.checked_mul(den))
        .ok_or("too many digits")?;
    Ok(ParsedQuantity {
        negative,
        numerator,
        denominator,
    })
}

/// Parses a quantity (a sign is allowed; surrounding whitespace is ignored).
pub fn parse(quantity: &str) -> Result<ParsedQuantity, QuantityError> {
    parse_inner(quantity).map_err(|reason| QuantityError {
        quantity: quantity.to_string(),
        reason,
    })
}

/// Parses a size into a number of bytes, rounding fractions of a byte up; negative sizes are
/// refused.
pub fn parse_bytes(quantity: &str) -> Result<u64, QuantityError> {
    let negative = quantity.trim().starts_with('-');
    let parsed = if negative {
        Err("negative sizes are not allowed")
    } else {
        parse_inner(quantity)
    };
    parsed
        .and_then(|q| q.ceil_u64())
        .map_err(|reason| QuantityError {
            quantity: quantity.to_string(),
            reason,
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_sizes_in_bytes() {
        let cases = [
            ("0", 0),
            ("42", 42),
            ("1Ki", 1024),
            ("32Mi", 32 << 20),
            ("1Gi", 1 << 30),
            ("2Ti", 2 << 40),
            ("1Pi", 1 << 50),
            ("1Ei", 1 << 60),
            ("1k", 1000),
            ("1K", 1000),
            ("5M", 5_000_000),
            ("500M", 500_000_000),
            ("1G", 1_000_000_000),
            ("1T", 1_000_000_000_000),
            ("1.5Gi", 3 << 29),
            ("0.5Ki", 512),
            ("1500m", 2),
            ("1e3", 1000),
            ("1E3", 1000),
            ("12e-1", 2),
            ("+7", 7),
            (" 1Mi ", 1 << 20),
            ("1.", 1),
        ];
        for (q, want) in cases {
            assert_eq!(parse_bytes(q).unwrap(), want, "{q}");
        }
    }

    #[test]
    fn rejects_bad_sizes() {
        for q in [
            "", "Gi", "-1Gi", "1Xi", "1.2.3", "1e99", "100Ei", "abc", ".", "-",
        ] {
            assert!(parse_bytes(q).is_err(), "{q} should be rejected");
        }
        assert_eq!(
            parse_bytes("-1Gi").unwrap_err().to_string(),
            "invalid quantity \"-1Gi\": negative sizes are not allowed"
        );
    }

    #[test]
    fn values_as_floats() {
        let f = |q: &str| parse(q).ok().map(|q| q.as_f64());
        assert_eq!(f("500m"), Some(0.5));
        assert_eq!(f("2Gi"), Some(2.0 * 1024.0 * 1024.0 * 1024.0));
        assert_eq!(f("1e3"), Some(1000.0));
        assert_eq!(f("-2"), Some(-2.0));
        assert_eq!(f("1.5"), Some(1.5));
        assert_eq!(f("x"), None);
    }

    #[test]
    fn any_minus_sign_is_refused_for_sizes() {
        for q in ["-0", "-", "-abc"] {
            assert_eq!(
                parse_bytes(q).unwrap_err().reason,
                "negative sizes are not allowed",
                "{q}"
            );
        }
    }
}
