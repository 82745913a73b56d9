//! Memory sizes as people type them (`6GiB`, `512MiB`, `40GB`) and as the scheduler counts
//! them (whole MiB).

/// The largest memory size ladle accepts anywhere, MiB: 16 TiB. Far above any GPU's memory
/// (80–141 GiB today) and far below the point where sums of sizes could overflow `u64`, so a
/// size that passes this bound is a plausible one. [`parse_mib`], the scheduler's socket
/// ([`crate::Request::validate`]) and trace files (`ladle_scheduler_core::sim::trace`) all
/// refuse larger sizes.
pub const MAX_MIB: u64 = 16 << 20;

/// A size that could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SizeError {
    /// The text is not a number followed by an optional unit.
    #[error("cannot read {text:?} as a memory size (examples: 6GiB, 512MiB, 40GB, 1.5GiB)")]
    Malformed {
        /// What was given.
        text: String,
    },
    /// The unit is not one of B, KiB, MiB, GiB, TiB, KB, MB, GB, TB (or K, M, G, T).
    #[error(
        "unknown unit {unit:?} in memory size {text:?} (use B, KiB, MiB, GiB, TiB, KB, MB, GB or TB)"
    )]
    UnknownUnit {
        /// The unit as given.
        unit: String,
        /// The whole text.
        text: String,
    },
    /// The size is negative, not finite, or above [`MAX_MIB`].
    #[error("memory size {text:?} is out of range (at most 16TiB)")]
    OutOfRange {
        /// What was given.
        text: String,
    },
}

/// Parses a memory size into MiB, rounding up to a whole MiB, at most [`MAX_MIB`]. A bare
/// number is MiB.
/// Binary units (`KiB`, `MiB`, `GiB`, `TiB`, and the short `K`, `M`, `G`, `T`) are powers of
/// 1024; decimal units (`KB`, `MB`, `GB`, `TB`) powers of 1000.
///
/// ```
/// use ladle_scheduler_protocol::units::parse_mib;
/// assert_eq!(parse_mib("6GiB").unwrap(), 6144);
/// assert_eq!(parse_mib("1.5G").unwrap(), 1536);
/// assert_eq!(parse_mib("512").unwrap(), 512);
/// ```
pub fn parse_mib(text: &str) -> Result<u64, SizeError> {
    let trimmed = text.trim();
    let split = trimmed
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(trimmed.len());
    let (number, unit) = trimmed.split_at(split);
    let value: f64 = number.parse().map_err(|_| SizeError::Malformed {
        text: text.to_owned(),
    })?;
    let bytes_per_unit: f64 = match unit.trim() {
        "" => (1u64 << 20) as f64,
        "B" => 1.0,
        "K" | "KiB" | "k" => 1024.0,
        "M" | "MiB" => (1u64 << 20) as f64,
        "G" | "GiB" => (1u64 << 30) as f64,
        "T" | "TiB" => (1u64 << 40) as f64,
        "KB" | "kB" => 1e3,
        "MB" => 1e6,
        "GB" => 1e9,
        "TB" => 1e12,
        other => {
            return Err(SizeError::UnknownUnit {
                unit: other.to_owned(),
                text: text.to_owned(),
            });
        }
    };
    let mib = (value * bytes_per_unit / (1u64 << 20) as f64).ceil();
    if !mib.is_finite() || !(0.0..=MAX_MIB as f64).contains(&mib) {
        return Err(SizeError::OutOfRange {
            text: text.to_owned(),
        });
    }
    Ok(mib as u64)
}

/// Formats MiB for people: whole GiB as `6GiB`, anything else as `1536MiB`.
pub fn format_mib(mib: u64) -> String {
    if mib > 0 && mib % 1024 == 0 {
        format!("{}GiB", mib / 1024)
    } else {
        format!("{mib}MiB")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn binary_and_decimal_units_parse_to_mib() {
        assert_eq!(parse_mib("40GiB"), Ok(40 * 1024));
        assert_eq!(parse_mib("40GB"), Ok(38147));
        assert_eq!(parse_mib(" 256MiB "), Ok(256));
        assert_eq!(parse_mib("1K"), Ok(1));
        assert_eq!(parse_mib("0"), Ok(0));
        assert_eq!(parse_mib("2T"), Ok(2 << 20));
    }

    #[test]
    fn garbage_sizes_are_errors_not_panics() {
        assert!(matches!(parse_mib(""), Err(SizeError::Malformed { .. })));
        assert!(matches!(parse_mib("GiB"), Err(SizeError::Malformed { .. })));
        assert!(matches!(
            parse_mib("1.2.3G"),
            Err(SizeError::Malformed { .. })
        ));
        assert!(matches!(
            parse_mib("6 parsecs"),
            Err(SizeError::UnknownUnit { .. })
        ));
        assert!(matches!(
            parse_mib("99999999999999999T"),
            Err(SizeError::OutOfRange { .. })
        ));
    }

    #[test]
    fn sizes_up_to_16_tebibytes_parse_and_larger_ones_are_out_of_range() {
        assert_eq!(parse_mib("16TiB"), Ok(MAX_MIB));
        assert!(matches!(
            parse_mib("16385GiB"),
            Err(SizeError::OutOfRange { .. })
        ));
        assert!(matches!(
            parse_mib("18446744073709551615"),
            Err(SizeError::OutOfRange { .. })
        ));
    }

    #[test]
    fn whole_gibibytes_format_as_gib() {
        assert_eq!(format_mib(6144), "6GiB");
        assert_eq!(format_mib(1536), "1536MiB");
        assert_eq!(format_mib(0), "0MiB");
    }
}
