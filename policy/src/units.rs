//! The value syntax every bufscope program shares: durations (`500ms`, `30s`, `5m`, `1h`) and
//! byte sizes (`65536`, `64K`, `64KiB`, `4M`). One parser each, used by the exporter's flags
//! and config file and by the tunnel's flags and INI file, so the same text means the same
//! thing everywhere.

use std::time::Duration;

/// The longest duration accepted (a year): a longer one is a typo, and close to `u64::MAX`
/// seconds clock arithmetic would overflow.
pub const MAX_DURATION: Duration = Duration::from_secs(365 * 24 * 3600);

/// Parses a duration with its unit: `500ms`, `30s`, `1.5s`, `5m`, `1h` (also `us`), at most
/// [`MAX_DURATION`]. A bare number is refused with a message that asks which unit was meant
/// (the exporter once read `30` as seconds and the tunnel as milliseconds).
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let t = s.trim();
    let split = t
        .find(|c: char| !c.is_ascii_digit() && c != '.')
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let n: f64 = num
        .parse()
        .ok()
        .filter(|v: &f64| v.is_finite() && *v >= 0.0)
        .ok_or_else(|| format!("invalid duration {s:?}: expected e.g. 500ms, 30s, 5m, 1h"))?;
    let secs = match unit.trim() {
        "us" | "µs" => n / 1e6,
        "ms" => n / 1e3,
        "s" => n,
        "m" => n * 60.0,
        "h" => n * 3600.0,
        "" => {
            return Err(format!(
                "duration {s:?} has no unit: {num}s or {num}ms? (units: ms, s, m, h)"
            ));
        }
        _ => {
            return Err(format!(
                "invalid duration unit in {s:?}: use us, ms, s, m or h"
            ));
        }
    };
    match Duration::try_from_secs_f64(secs) {
        Ok(d) if d <= MAX_DURATION => Ok(d),
        _ => Err(format!(
            "duration {s:?} is too long: at most {}h (a year)",
            MAX_DURATION.as_secs() / 3600
        )),
    }
}

/// Parses a byte size: `65536`, `64K`/`64KiB`, `4M`/`4MiB`, `1G`/`1GiB` (binary multiples;
/// case-insensitive; an optional `B`).
pub fn parse_bytes(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let lower = t.to_ascii_lowercase();
    let body = lower.strip_suffix('b').unwrap_or(&lower);
    let (num, mult): (&str, u64) =
        if let Some(n) = body.strip_suffix("ki").or(body.strip_suffix('k')) {
            (n, 1 << 10)
        } else if let Some(n) = body.strip_suffix("mi").or(body.strip_suffix('m')) {
            (n, 1 << 20)
        } else if let Some(n) = body.strip_suffix("gi").or(body.strip_suffix('g')) {
            (n, 1 << 30)
        } else {
            (body, 1)
        };
    num.trim()
        .parse::<u64>()
        .ok()
        .and_then(|n| n.checked_mul(mult))
        .ok_or_else(|| format!("{s:?} is not a byte size (e.g. 65536, 64K, 4M, 1G)"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_need_their_unit() {
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("190ms"), Ok(Duration::from_millis(190)));
        assert_eq!(parse_duration("1.5s"), Ok(Duration::from_millis(1500)));
        assert_eq!(parse_duration("5m"), Ok(Duration::from_secs(300)));
        assert_eq!(parse_duration("1h"), Ok(Duration::from_secs(3600)));
        assert_eq!(parse_duration("250us"), Ok(Duration::from_micros(250)));
        assert_eq!(parse_duration("8760h"), Ok(MAX_DURATION));
        let bare = parse_duration("30");
        assert!(
            matches!(&bare, Err(e) if e.contains("30s or 30ms?")),
            "{bare:?}"
        );
        for bad in [
            "",
            "s",
            "5 parsecs",
            "-1s",
            "8761h",
            "1e400s",
            "NaNs",
            "inf s",
        ] {
            assert!(parse_duration(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn byte_sizes() {
        assert_eq!(parse_bytes("65536"), Ok(65536));
        assert_eq!(parse_bytes("64K"), Ok(65536));
        assert_eq!(parse_bytes("64KiB"), Ok(65536));
        assert_eq!(parse_bytes("4M"), Ok(4 << 20));
        assert_eq!(parse_bytes("4mib"), Ok(4 << 20));
        assert_eq!(parse_bytes("1G"), Ok(1 << 30));
        assert_eq!(parse_bytes("7340032B"), Ok(7_340_032));
        for bad in ["", "K", "-1", "4T", "99999999999999999999G"] {
            assert!(parse_bytes(bad).is_err(), "{bad:?}");
        }
    }
}
