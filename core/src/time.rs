//! Time as the core sees it: milliseconds since the Unix epoch, given with every input.
//! Formatting to RFC 3339 and parsing of duration strings (`30m`, `1h`, `90s`, `3600`).
//!
//! Durations from requests are bounded by [`MAX_DURATION_SECS`] (100 years): anything a
//! client sends is refused above it, so every later `secs * 1000` and `now + ms` on a
//! parsed duration stays far from `u64::MAX`.

/// Milliseconds since the Unix epoch.
pub type Millis = u64;

/// Longest duration a request may give, in seconds: 100 years of 365 days.
pub const MAX_DURATION_SECS: u64 = 100 * 365 * 86_400;

/// Formats `ms` as an RFC 3339 UTC timestamp, e.g. `2026-11-23T10:00:00.123Z`.
pub fn rfc3339(ms: Millis) -> String {
    let secs = ms / 1000;
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    let (y, m, d) = civil_from_days(days);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}.{:03}Z",
        rem / 3600,
        (rem / 60) % 60,
        rem % 60,
        ms % 1000
    )
}

/// [`rfc3339`] with nine fractional digits, as the reference shows KV v2 times, e.g.
/// `2026-11-23T10:00:00.123000000Z`.
pub fn rfc3339_nanos(ms: Millis) -> String {
    let s = rfc3339(ms);
    match s.strip_suffix('Z') {
        Some(head) => format!("{head}000000Z"),
        None => s,
    }
}

/// Formats seconds as a Go duration string (`0s`, `45s`, `30m0s`, `1h0m0s`), the form the
/// reference answers durations such as `delete_version_after` in.
pub fn go_duration(secs: u64) -> String {
    let (h, m, s) = (secs / 3600, (secs / 60) % 60, secs % 60);
    if h > 0 {
        format!("{h}h{m}m{s}s")
    } else if m > 0 {
        format!("{m}m{s}s")
    } else {
        format!("{s}s")
    }
}

/// Formats seconds with only the units that are not zero (`2h`, `1h2m3s`, `2m`, `0s`), the
/// form the reference's CLI and its warnings print durations in.
pub fn short_duration(secs: u64) -> String {
    let (h, m, s) = (secs / 3600, secs / 60 % 60, secs % 60);
    let mut out = String::new();
    if h > 0 {
        out.push_str(&format!("{h}h"));
    }
    if m > 0 {
        out.push_str(&format!("{m}m"));
    }
    if s > 0 || out.is_empty() {
        out.push_str(&format!("{s}s"));
    }
    out
}

/// Days since 1970-01-01 to (year, month, day) in the proleptic Gregorian calendar.
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (if m <= 2 { y + 1 } else { y }, m, d)
}

/// Refuses a duration of more than [`MAX_DURATION_SECS`]; `shown` is how the client wrote it.
fn bounded(secs: u64, shown: &str) -> Result<u64, String> {
    if secs > MAX_DURATION_SECS {
        return Err(format!(
            "invalid duration {shown}: longer than 100 years ({MAX_DURATION_SECS} seconds)"
        ));
    }
    Ok(secs)
}

/// Parses a duration: a bare number of seconds or a sequence like `1h30m`, `90s`, `500ms`,
/// `7d`. Returns seconds (milliseconds are rounded down); more than
/// [`MAX_DURATION_SECS`] is refused.
pub fn parse_duration(s: &str) -> Result<u64, String> {
    let s = s.trim();
    if s.is_empty() {
        return Err("empty duration".into());
    }
    if let Ok(n) = s.parse::<u64>() {
        return bounded(n, &format!("{s:?}"));
    }
    if s.bytes().all(|b| b.is_ascii_digit()) {
        // Too many digits for a u64 is too long as well.
        return bounded(u64::MAX, &format!("{s:?}"));
    }
    let mut total_ms: u128 = 0;
    let mut num = String::new();
    let mut chars = s.chars().peekable();
    let mut saw_unit = false;
    while let Some(c) = chars.next() {
        if c.is_ascii_digit() {
            num.push(c);
            continue;
        }
        let mut unit = c.to_string();
        if c == 'm' && chars.peek() == Some(&'s') {
            unit.push('s');
            chars.next();
        }
        let n: u128 = num.parse().map_err(|_| format!("invalid duration {s:?}"))?;
        num.clear();
        let mult: u128 = match unit.as_str() {
            "ms" => 1,
            "s" => 1000,
            "m" => 60_000,
            "h" => 3_600_000,
            "d" => 86_400_000,
            _ => return Err(format!("invalid duration {s:?}: unknown unit {unit:?}")),
        };
        total_ms = total_ms.saturating_add(n.saturating_mul(mult));
        saw_unit = true;
    }
    if !num.is_empty() || !saw_unit {
        return Err(format!("invalid duration {s:?}: missing unit"));
    }
    bounded(
        u64::try_from(total_ms / 1000).unwrap_or(u64::MAX),
        &format!("{s:?}"),
    )
}

/// Reads a duration from a JSON value: a number of seconds or a duration string; more than
/// [`MAX_DURATION_SECS`] is refused.
pub fn duration_value(v: &serde_json::Value) -> Result<u64, String> {
    match v {
        serde_json::Value::Number(n) => match n.as_u64() {
            Some(secs) => bounded(secs, &n.to_string()),
            None => Err(format!(
                "invalid duration {n}: must be a non-negative integer"
            )),
        },
        serde_json::Value::String(s) => parse_duration(s),
        other => Err(format!("invalid duration {other}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_nanos_and_go_durations() {
        assert_eq!(rfc3339_nanos(1_234), "1970-01-01T00:00:01.234000000Z");
        assert_eq!(go_duration(0), "0s");
        assert_eq!(go_duration(45), "45s");
        assert_eq!(go_duration(1800), "30m0s");
        assert_eq!(go_duration(3600), "1h0m0s");
        assert_eq!(go_duration(90_061), "25h1m1s");
    }

    #[test]
    fn formats_known_instants() {
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(rfc3339(1_795_435_200_123), "2026-11-23T12:00:00.123Z");
        assert_eq!(rfc3339(951_782_400_000), "2000-02-29T00:00:00.000Z");
    }

    #[test]
    fn parses_durations() {
        assert_eq!(parse_duration("30m"), Ok(1800));
        assert_eq!(parse_duration("1h30m"), Ok(5400));
        assert_eq!(parse_duration("45"), Ok(45));
        assert_eq!(parse_duration("1500ms"), Ok(1));
        assert!(parse_duration("10x").is_err());
        assert!(parse_duration("").is_err());
        assert!(parse_duration("5m3").is_err());
    }

    #[test]
    fn durations_over_a_hundred_years_are_refused() {
        assert_eq!(parse_duration("876000h"), Ok(MAX_DURATION_SECS));
        assert_eq!(parse_duration("3153600000"), Ok(MAX_DURATION_SECS));
        for s in [
            "9999999999999999s",
            "3153600001",
            "876001h",
            "18446744073709551615",
            "99999999999999999999999999",
            "99999999999999999999999999h",
        ] {
            let e = parse_duration(s).unwrap_err();
            assert!(e.contains("100 years") || e.contains("invalid"), "{s}: {e}");
        }
        assert!(parse_duration("9999999999999999s")
            .unwrap_err()
            .contains("longer than 100 years"));
        let e = duration_value(&serde_json::json!(u64::MAX)).unwrap_err();
        assert!(e.contains("longer than 100 years"), "{e}");
        assert_eq!(duration_value(&serde_json::json!(60)), Ok(60));
        assert!(duration_value(&serde_json::json!(-1)).is_err());
    }
}
