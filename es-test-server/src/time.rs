//! Dates (ISO 8601 / epoch millis, a few named formats, simple custom patterns,
//! date math) and time values (`1s`, `500ms`, `-1`).

use std::time::{Duration, SystemTime, UNIX_EPOCH};

pub(crate) fn now_millis() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

pub(crate) fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = if y >= 0 { y } else { y - 399 } / 400;
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146097 + doe - 719468
}

pub(crate) fn civil_from_days(z: i64) -> (i64, i64, i64) {
    let z = z + 719468;
    let era = if z >= 0 { z } else { z - 146096 } / 146097;
    let doe = z - era * 146097;
    let yoe = (doe - doe / 1460 + doe / 36524 - doe / 146096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    (if m <= 2 { y + 1 } else { y }, m, d)
}

fn days_in_month(y: i64, m: i64) -> i64 {
    days_from_civil(
        if m == 12 { y + 1 } else { y },
        if m == 12 { 1 } else { m + 1 },
        1,
    ) - days_from_civil(y, m, 1)
}

/// ISO-8601 millis formatting: `2024-01-02T03:04:05.006Z`.
pub(crate) fn format_millis(ms: i64) -> String {
    let days = ms.div_euclid(86_400_000);
    let rem = ms.rem_euclid(86_400_000);
    let (y, m, d) = civil_from_days(days);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}.{:03}Z",
        rem / 3_600_000,
        rem / 60_000 % 60,
        rem / 1000 % 60,
        rem % 1000
    )
}

fn digits(s: &[u8], i: &mut usize, min: usize, max: usize) -> Option<i64> {
    let start = *i;
    while *i < s.len() && *i - start < max && s[*i].is_ascii_digit() {
        *i += 1;
    }
    if *i - start < min {
        return None;
    }
    std::str::from_utf8(&s[start..*i]).ok()?.parse().ok()
}

/// Parses `yyyy-MM-dd['T'HH:mm[:ss[.SSSSSSSSS]]][Z|±HH[:mm]]` into nanoseconds since the epoch.
pub(crate) fn parse_iso_nanos(text: &str) -> Option<i128> {
    let s = text.as_bytes();
    let mut i = 0;
    let neg = s.first() == Some(&b'-') || s.first() == Some(&b'+');
    let sign = if s.first() == Some(&b'-') { -1 } else { 1 };
    if neg {
        i += 1;
    }
    // Four digits, or more with a sign (Elasticsearch's ISO 8601 parser): an unsigned
    // 5-digit number is not a year, so `99999` falls through to `epoch_millis`.
    let y = sign * digits(s, &mut i, 4, if neg { 9 } else { 4 })?;
    let (mut mo, mut d, mut h, mut mi, mut sec, mut nanos) = (1, 1, 0, 0, 0, 0i64);
    if i < s.len() && s[i] == b'-' {
        i += 1;
        mo = digits(s, &mut i, 1, 2)?;
        if i < s.len() && s[i] == b'-' {
            i += 1;
            d = digits(s, &mut i, 1, 2)?;
        }
    }
    let mut offset_min = 0i64;
    if i < s.len() && (s[i] == b'T' || s[i] == b't' || s[i] == b' ') {
        i += 1;
        h = digits(s, &mut i, 2, 2)?;
        if i < s.len() && s[i] == b':' {
            i += 1;
            mi = digits(s, &mut i, 2, 2)?;
            if i < s.len() && s[i] == b':' {
                i += 1;
                sec = digits(s, &mut i, 2, 2)?;
                if i < s.len() && (s[i] == b'.' || s[i] == b',') {
                    i += 1;
                    let start = i;
                    while i < s.len() && s[i].is_ascii_digit() {
                        i += 1;
                    }
                    let frac = std::str::from_utf8(&s[start..i]).ok()?;
                    if frac.is_empty() || frac.len() > 9 {
                        return None;
                    }
                    nanos = format!("{frac:0<9}").parse().ok()?;
                }
            }
        }
    }
    if i < s.len() {
        match s[i] {
            b'Z' | b'z' => i += 1,
            b'+' | b'-' => {
                let sg = if s[i] == b'-' { -1 } else { 1 };
                i += 1;
                let oh = digits(s, &mut i, 2, 2)?;
                let mut om = 0;
                if i < s.len() && s[i] == b':' {
                    i += 1;
                }
                if i < s.len() {
                    om = digits(s, &mut i, 2, 2)?;
                }
                offset_min = sg * (oh * 60 + om);
            }
            _ => return None,
        }
    }
    if i != s.len()
        || !(1..=12).contains(&mo)
        || d < 1
        || d > days_in_month(y, mo)
        || h > 23
        || mi > 59
        || sec > 59
    {
        return None;
    }
    let days = days_from_civil(y, mo, d) as i128;
    let secs = days * 86400 + (h * 3600 + mi * 60 + sec) as i128 - (offset_min * 60) as i128;
    Some(secs * 1_000_000_000 + nanos as i128)
}

/// A custom pattern like `yyyy/MM/dd HH:mm:ss` (letters y M d H m s S; other characters literal).
fn parse_pattern(pattern: &str, text: &str) -> Option<i128> {
    let p: Vec<char> = pattern.chars().collect();
    let t = text.as_bytes();
    let (mut y, mut mo, mut d, mut h, mut mi, mut s, mut ns) = (1970, 1, 1, 0, 0, 0, 0i64);
    let (mut i, mut j) = (0, 0);
    while i < p.len() {
        let c = p[i];
        let mut n = 1;
        while i + n < p.len() && p[i + n] == c {
            n += 1;
        }
        if c.is_ascii_alphabetic() {
            let v = if c == 'y' || c == 'u' {
                digits(t, &mut j, n.min(4), 9)?
            } else {
                digits(t, &mut j, n, n.max(2))?
            };
            match c {
                'y' | 'u' => y = v,
                'M' => mo = v,
                'd' => d = v,
                'H' => h = v,
                'm' => mi = v,
                's' => s = v,
                'S' => ns = v * 10i64.pow(9u32.saturating_sub(n as u32)),
                _ => return None,
            }
        } else if c == '\'' {
            // quoted literal
            i += 1;
            while i < p.len() && p[i] != '\'' {
                if j >= t.len() || t[j] as char != p[i] {
                    return None;
                }
                j += 1;
                i += 1;
            }
            i += 1;
            continue;
        } else {
            for _ in 0..n {
                if j >= t.len() || t[j] as char != c {
                    return None;
                }
                j += 1;
            }
        }
        i += n;
    }
    if j != t.len() || !(1..=12).contains(&mo) || d < 1 || d > days_in_month(y, mo) {
        return None;
    }
    let days = days_from_civil(y, mo, d) as i128;
    Some((days * 86400 + (h * 3600 + mi * 60 + s) as i128) * 1_000_000_000 + ns as i128)
}

fn parse_epoch(text: &str, unit_nanos: i128) -> Option<i128> {
    let (int, frac) = match text.split_once('.') {
        Some((a, b)) => (a, b),
        None => (text, ""),
    };
    if int.is_empty()
        || !int
            .trim_start_matches('-')
            .chars()
            .all(|c| c.is_ascii_digit())
    {
        return None;
    }
    if !frac.chars().all(|c| c.is_ascii_digit()) || frac.len() > 9 {
        return None;
    }
    let v: i128 = int.parse().ok()?;
    let mut f: i128 = 0;
    if !frac.is_empty() {
        f = format!("{frac:0<9}").parse::<i128>().ok()? * unit_nanos / 1_000_000_000;
    }
    Some(if v < 0 || int.starts_with('-') {
        v * unit_nanos - f
    } else {
        v * unit_nanos + f
    })
}

/// Parses a date string with an Elasticsearch `format` (`a||b||c`) into nanoseconds.
pub(crate) fn parse_date_nanos(text: &str, format: &str) -> Option<i128> {
    for f in format.split("||") {
        let r = match f.trim() {
            "strict_date_optional_time"
            | "date_optional_time"
            | "strict_date_optional_time_nanos"
            | "strict_date_time"
            | "date_time"
            | "strict_date"
            | "date"
            | "iso8601"
            | "strict_date_hour_minute_second"
            | "strict_date_hour_minute_second_millis"
            | "strict_date_hour_minute_second_fraction" => parse_iso_nanos(text),
            "epoch_millis" => parse_epoch(text, 1_000_000),
            "epoch_second" => parse_epoch(text, 1_000_000_000),
            "basic_date" => parse_pattern("yyyyMMdd", text),
            other => parse_pattern(other, text),
        };
        if r.is_some() {
            return r;
        }
    }
    None
}

/// Date math: `now-1d/d`, `2024-01-01||+1M`. `round_up` chooses the end of the rounding
/// unit (for `gt` and `lte`).
pub(crate) fn parse_date_math_nanos(text: &str, format: &str, round_up: bool) -> Option<i128> {
    let (base, ops) = if let Some(rest) = text.strip_prefix("now") {
        (now_millis() as i128 * 1_000_000, rest)
    } else if let Some((d, ops)) = text.split_once("||") {
        (parse_date_nanos(d, format)?, ops)
    } else {
        return parse_date_nanos(text, format);
    };
    let mut t = base;
    let ops: Vec<char> = ops.chars().collect();
    let mut i = 0;
    while i < ops.len() {
        let op = ops[i];
        i += 1;
        let mut n: i64 = 1;
        if op != '/' {
            let start = i;
            while i < ops.len() && ops[i].is_ascii_digit() {
                i += 1;
            }
            if i > start {
                n = ops[start..i].iter().collect::<String>().parse().ok()?;
            }
        }
        let unit = *ops.get(i)?;
        i += 1;
        match op {
            '+' => t = add_unit(t, unit, n)?,
            '-' => t = add_unit(t, unit, -n)?,
            '/' => {
                let floor = floor_unit(t, unit)?;
                t = if round_up {
                    add_unit(floor, unit, 1)? - 1_000_000
                } else {
                    floor
                };
            }
            _ => return None,
        }
    }
    Some(t)
}

fn add_unit(t: i128, unit: char, n: i64) -> Option<i128> {
    const S: i128 = 1_000_000_000;
    Some(match unit {
        's' => t + n as i128 * S,
        'm' => t + n as i128 * 60 * S,
        'h' | 'H' => t + n as i128 * 3600 * S,
        'd' => t + n as i128 * 86400 * S,
        'w' => t + n as i128 * 7 * 86400 * S,
        'M' | 'y' => {
            let months = if unit == 'y' { n * 12 } else { n };
            let day_ns = 86400 * S;
            let days = t.div_euclid(day_ns) as i64;
            let rem = t.rem_euclid(day_ns);
            let (y, m, d) = civil_from_days(days);
            let total = y * 12 + (m - 1) + months;
            let (ny, nm) = (total.div_euclid(12), total.rem_euclid(12) + 1);
            let nd = d.min(days_in_month(ny, nm));
            days_from_civil(ny, nm, nd) as i128 * day_ns + rem
        }
        _ => return None,
    })
}

fn floor_unit(t: i128, unit: char) -> Option<i128> {
    const S: i128 = 1_000_000_000;
    let day_ns = 86400 * S;
    Some(match unit {
        's' => t - t.rem_euclid(S),
        'm' => t - t.rem_euclid(60 * S),
        'h' | 'H' => t - t.rem_euclid(3600 * S),
        'd' => t - t.rem_euclid(day_ns),
        'w' => {
            let days = t.div_euclid(day_ns) as i64;
            let dow = (days + 3).rem_euclid(7); // Monday = 0
            (days - dow) as i128 * day_ns
        }
        'M' | 'y' => {
            let (y, m, _) = civil_from_days(t.div_euclid(day_ns) as i64);
            days_from_civil(y, if unit == 'y' { 1 } else { m }, 1) as i128 * day_ns
        }
        _ => return None,
    })
}

/// Parses an Elasticsearch time value (`1s`, `500ms`, `2m`, `1h`, `1d`, `100micros`, `10nanos`).
/// `-1` (and `0` without unit for some settings) are handled by the caller.
pub(crate) fn parse_time_value(s: &str) -> Option<Duration> {
    let s = s.trim();
    let split = s.find(|c: char| !c.is_ascii_digit() && c != '.')?;
    let (num, unit) = s.split_at(split);
    let v: f64 = num.parse().ok()?;
    let nanos = match unit.trim() {
        "nanos" => v,
        "micros" => v * 1e3,
        "ms" => v * 1e6,
        "s" => v * 1e9,
        "m" => v * 60e9,
        "h" => v * 3600e9,
        "d" => v * 86400e9,
        _ => return None,
    };
    Some(Duration::from_nanos(nanos as u64))
}

/// The ISO-like named formats: those printed as `yyyy-MM-dd'T'HH:mm:ss.SSSZ`.
const ISO_NAMES: &[&str] = &[
    "strict_date_optional_time",
    "date_optional_time",
    "strict_date_time",
    "date_time",
    "iso8601",
];

/// Named formats besides the ISO ones, with the pattern they print as.
const NAMED: &[(&str, &str)] = &[
    ("strict_date", "yyyy-MM-dd"),
    ("date", "yyyy-MM-dd"),
    ("basic_date", "yyyyMMdd"),
    ("strict_date_hour_minute_second", "yyyy-MM-dd'T'HH:mm:ss"),
    (
        "strict_date_hour_minute_second_millis",
        "yyyy-MM-dd'T'HH:mm:ss.SSS",
    ),
    (
        "strict_date_hour_minute_second_fraction",
        "yyyy-MM-dd'T'HH:mm:ss.SSS",
    ),
];

/// Pattern letters this module reads and prints.
const OUR_LETTERS: &str = "yuMdHmsS";
/// Letters `java.time.format.DateTimeFormatter` knows: Elasticsearch accepts them, this
/// double does not implement them. Any other letter is an error in Elasticsearch too.
const JAVA_LETTERS: &str = "GuyDMLdQqYwWEecFahKkHmsSAnNVvzOXxZpgB";

/// Why a date format cannot be used.
pub(crate) enum FormatError {
    /// Elasticsearch refuses it too (`Unknown pattern letter: b`).
    UnknownLetter(char),
    /// Elasticsearch accepts it; this double does not implement it.
    Unsupported(String),
}

/// Checks a `format` (`a||b`) the way printing and parsing will read it.
pub(crate) fn check_format(format: &str) -> Result<(), FormatError> {
    for f in format.split("||").map(str::trim) {
        if ISO_NAMES.contains(&f)
            || NAMED.iter().any(|(n, _)| *n == f)
            || [
                "strict_date_optional_time_nanos",
                "epoch_millis",
                "epoch_second",
            ]
            .contains(&f)
        {
            continue;
        }
        let mut quoted = false;
        for c in f.chars() {
            match c {
                '\'' => quoted = !quoted,
                _ if quoted || !c.is_ascii_alphabetic() && !"[]#{}".contains(c) => {}
                _ if OUR_LETTERS.contains(c) => {}
                _ if JAVA_LETTERS.contains(c) || "[]#{}".contains(c) => {
                    return Err(FormatError::Unsupported(format!(
                        "the date format [{f}] (pattern letter [{c}])"
                    )));
                }
                _ => return Err(FormatError::UnknownLetter(c)),
            }
        }
    }
    Ok(())
}

/// Prints nanoseconds since the epoch with the first format of `format`, as Elasticsearch
/// prints sort values and stored dates: ISO formats to the millisecond,
/// `strict_date_optional_time_nanos` with 3 to 9 fraction digits, `epoch_millis` and
/// `epoch_second` with a fraction only when there is one.
pub(crate) fn format_nanos(nanos: i128, format: &str) -> String {
    let f = format.split("||").next().unwrap_or_default().trim();
    match f {
        "epoch_millis" => decimal(nanos, 1_000_000),
        "epoch_second" => decimal(nanos, 1_000_000_000),
        "strict_date_optional_time_nanos" => {
            let frac = format!("{:09}", nanos.rem_euclid(1_000_000_000));
            let trimmed = frac.trim_end_matches('0');
            let digits = &frac[..trimmed.len().max(3)];
            format!(
                "{}.{digits}Z",
                print_pattern(nanos, "yyyy-MM-dd'T'HH:mm:ss")
            )
        }
        f if ISO_NAMES.contains(&f) => print_pattern(nanos, "yyyy-MM-dd'T'HH:mm:ss.SSS'Z'"),
        f => {
            let pattern = NAMED.iter().find(|(n, _)| *n == f).map_or(f, |(_, p)| *p);
            print_pattern(nanos, pattern)
        }
    }
}

/// `nanos / unit` as a decimal number without trailing zeros (`1623385804000.456`).
fn decimal(nanos: i128, unit: i128) -> String {
    let sign = if nanos < 0 { "-" } else { "" };
    let (int, rem) = (nanos.abs() / unit, nanos.abs() % unit);
    if rem == 0 {
        return format!("{sign}{int}");
    }
    let width = unit.ilog10() as usize;
    let frac = format!("{rem:0width$}");
    format!("{sign}{int}.{}", frac.trim_end_matches('0'))
}

/// Prints a pattern of the letters `y u M d H m s S` (other characters literal, `'...'`
/// quoted); a run of `S` prints that many fraction digits.
fn print_pattern(nanos: i128, pattern: &str) -> String {
    let secs = nanos.div_euclid(1_000_000_000);
    let frac = nanos.rem_euclid(1_000_000_000);
    let (y, mo, d) = civil_from_days(secs.div_euclid(86_400) as i64);
    let sod = secs.rem_euclid(86_400) as i64;
    let p: Vec<char> = pattern.chars().collect();
    let mut out = String::new();
    let mut i = 0;
    while i < p.len() {
        let c = p[i];
        let mut n = 1;
        while i + n < p.len() && p[i + n] == c {
            n += 1;
        }
        match c {
            '\'' => {
                let end = p[i + 1..]
                    .iter()
                    .position(|&x| x == '\'')
                    .map_or(p.len(), |e| i + 1 + e);
                out.extend(&p[i + 1..end]);
                i = end + 1;
                continue;
            }
            'y' | 'u' if n == 2 => out.push_str(&format!("{:02}", y.rem_euclid(100))),
            'y' | 'u' => out.push_str(&format!("{y:0n$}")),
            'M' => out.push_str(&format!("{mo:0n$}")),
            'd' => out.push_str(&format!("{d:0n$}")),
            'H' => out.push_str(&format!("{:0n$}", sod / 3600)),
            'm' => out.push_str(&format!("{:0n$}", sod / 60 % 60)),
            's' => out.push_str(&format!("{:0n$}", sod % 60)),
            'S' => out.push_str(&format!("{frac:09}")[..n.min(9)]),
            other => out.extend(std::iter::repeat_n(other, n)),
        }
        i += n;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn iso() {
        assert_eq!(parse_iso_nanos("1970-01-01"), Some(0));
        assert_eq!(parse_iso_nanos("1970-01-01T00:00:01Z"), Some(1_000_000_000));
        assert_eq!(parse_iso_nanos("1970-01-01T01:00:00+01:00"), Some(0));
        assert_eq!(parse_iso_nanos("2024-02-30"), None);
        assert_eq!(parse_iso_nanos("1970-01-01T00:00:00.000000001Z"), Some(1));
        assert_eq!(format_millis(0), "1970-01-01T00:00:00.000Z");
        // A 4-digit string is a year for strict_date_optional_time (as in Elasticsearch).
        assert_eq!(
            parse_date_nanos("1500000000000", "strict_date_optional_time||epoch_millis"),
            Some(1_500_000_000_000_000_000)
        );
        assert_eq!(
            parse_date_nanos("1970", "strict_date_optional_time||epoch_millis"),
            Some(0)
        );
        assert_eq!(
            parse_date_nanos("2024/01/02 03:04:05", "yyyy/MM/dd HH:mm:ss").map(|n| n / 1_000_000),
            Some(1704164645000)
        );
    }

    #[test]
    fn printing() {
        let t = parse_iso_nanos("2021-06-11T04:30:04.000456Z").unwrap();
        assert_eq!(
            format_nanos(t, "strict_date_optional_time_nanos"),
            "2021-06-11T04:30:04.000456Z"
        );
        assert_eq!(
            format_nanos(t, "strict_date_optional_time"),
            "2021-06-11T04:30:04.000Z"
        );
        assert_eq!(format_nanos(t, "epoch_millis"), "1623385804000.456");
        assert_eq!(
            format_nanos(t, "yyyy-MM-dd | HH:mm:ss.SSS"),
            "2021-06-11 | 04:30:04.000"
        );
        assert_eq!(format_nanos(t, "dd/MM/yyyy'T'HH"), "11/06/2021T04");
        let ms = parse_iso_nanos("2021-02-11T08:30:04.828Z").unwrap();
        assert_eq!(
            format_nanos(ms, "strict_date_optional_time_nanos||epoch_millis"),
            "2021-02-11T08:30:04.828Z"
        );
        assert_eq!(format_nanos(ms, "epoch_millis"), "1613032204828");
        assert_eq!(format_nanos(ms, "epoch_second"), "1613032204.828");
        assert_eq!(format_nanos(0, "strict_date"), "1970-01-01");
        assert!(matches!(
            check_format("bogus_format_name"),
            Err(FormatError::UnknownLetter('b'))
        ));
        assert!(matches!(
            check_format("EEE yyyy"),
            Err(FormatError::Unsupported(_))
        ));
        assert!(check_format("yyyy-MM-dd'T'HH:mm||epoch_millis").is_ok());
    }

    #[test]
    fn math() {
        let d = parse_date_math_nanos(
            "2024-01-15T10:00:00Z||/d",
            "strict_date_optional_time",
            false,
        )
        .unwrap();
        assert_eq!(d, parse_iso_nanos("2024-01-15").unwrap());
        let u = parse_date_math_nanos(
            "2024-01-15T10:00:00Z||/d",
            "strict_date_optional_time",
            true,
        )
        .unwrap();
        assert_eq!(u, parse_iso_nanos("2024-01-15T23:59:59.999Z").unwrap());
        let m =
            parse_date_math_nanos("2024-01-31||+1M", "strict_date_optional_time", false).unwrap();
        assert_eq!(m, parse_iso_nanos("2024-02-29").unwrap());
        assert_eq!(parse_time_value("1s"), Some(Duration::from_secs(1)));
        assert_eq!(parse_time_value("250ms"), Some(Duration::from_millis(250)));
        assert_eq!(parse_time_value("5"), None);
    }
}
