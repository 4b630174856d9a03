//! Reading a record's event time ([`TimeExtractor`]): epoch milliseconds, epoch seconds or
//! RFC 3339 text in a field, as a source's `event_time` declares it. Sources stamp watermarks
//! with it (`connectors::event_time`) and event-time windows read their records' times with
//! it, so both agree on what a record's time is.

use rhai::Dynamic;
use weir_schema::{EventTimeSpec, TimeFormat, TimeUnit};

use crate::record::FieldPath;

/// How a record's event time is read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum TimeKind {
    Millis,
    Seconds,
    Rfc3339,
}

/// Reads the event time (epoch milliseconds) of a record.
#[derive(Clone, Debug)]
pub struct TimeExtractor {
    path: FieldPath,
    kind: TimeKind,
}

impl TimeExtractor {
    /// The extractor `spec` describes.
    pub fn new(spec: &EventTimeSpec) -> Self {
        let kind = match (spec.format, spec.unit) {
            (Some(TimeFormat::Rfc3339), _) => TimeKind::Rfc3339,
            (None, Some(TimeUnit::S)) => TimeKind::Seconds,
            (None, _) => TimeKind::Millis,
        };
        Self {
            path: FieldPath::new(&spec.field),
            kind,
        }
    }

    /// The record's event time in epoch milliseconds.
    ///
    /// # Errors
    /// Why there is none: the field is missing, or not a time of the declared kind.
    pub fn extract(&self, record: &Dynamic) -> std::result::Result<i64, String> {
        let found = self.path.with(record, |v| self.read(v));
        match found {
            Some(r) => r,
            None => Err(format!(
                "the record has no event-time field `{}`",
                self.path.as_str()
            )),
        }
    }

    fn read(&self, v: &Dynamic) -> std::result::Result<i64, String> {
        let field = self.path.as_str();
        match self.kind {
            TimeKind::Millis | TimeKind::Seconds => {
                let scale = if self.kind == TimeKind::Seconds {
                    1000
                } else {
                    1
                };
                if let Ok(i) = v.as_int() {
                    return i
                        .checked_mul(scale)
                        .ok_or_else(|| format!("event time `{field}` = {i} is out of range"));
                }
                if let Ok(x) = v.as_float() {
                    let ms = (x * scale as f64).floor();
                    if ms.is_finite() && ms >= i64::MIN as f64 && ms < i64::MAX as f64 {
                        return Ok(ms as i64);
                    }
                    return Err(format!("event time `{field}` = {x} is out of range"));
                }
                let unit = if self.kind == TimeKind::Seconds {
                    "s"
                } else {
                    "ms"
                };
                Err(format!(
                    "event time `{field}` is a {}, not a number of epoch {} (`unit: {unit}`)",
                    v.type_name(),
                    if unit == "s" {
                        "seconds"
                    } else {
                        "milliseconds"
                    }
                ))
            }
            TimeKind::Rfc3339 => {
                let Ok(s) = v.as_immutable_string_ref() else {
                    return Err(format!(
                        "event time `{field}` is a {}, not an RFC 3339 string (`format: rfc3339`)",
                        v.type_name()
                    ));
                };
                parse_rfc3339(&s).ok_or_else(|| {
                    format!(
                        "event time `{field}` = `{}` is not an RFC 3339 time such as \
                         `2026-12-02T05:00:00.250Z`",
                        s.as_str()
                    )
                })
            }
        }
    }
}

/// Epoch milliseconds of an RFC 3339 time (`2026-12-02T05:00:00Z`, `...T06:00:00.5+01:00`);
/// fractions below a millisecond are dropped. `None` when the text is not one.
pub fn parse_rfc3339(s: &str) -> Option<i64> {
    let b = s.as_bytes();
    let num = |from: usize, to: usize| -> Option<i64> {
        let part = b.get(from..to)?;
        part.iter().try_fold(0i64, |n, &c| {
            c.is_ascii_digit().then(|| n * 10 + i64::from(c - b'0'))
        })
    };
    let sep = |i: usize, c: &[u8]| b.get(i).is_some_and(|x| c.contains(x));
    let (year, month, day) = (num(0, 4)?, num(5, 7)?, num(8, 10)?);
    let (hour, minute, second) = (num(11, 13)?, num(14, 16)?, num(17, 19)?);
    if !(sep(4, b"-") && sep(7, b"-") && sep(10, b"Tt ") && sep(13, b":") && sep(16, b":")) {
        return None;
    }
    let mut i = 19;
    let mut millis = 0;
    if sep(i, b".") {
        i += 1;
        let start = i;
        while b.get(i).is_some_and(u8::is_ascii_digit) {
            if i - start < 3 {
                millis = millis * 10 + i64::from(b[i] - b'0');
            }
            i += 1;
        }
        let digits = i - start;
        if digits == 0 {
            return None;
        }
        for _ in digits..3 {
            millis *= 10;
        }
    }
    let offset_min = match b.get(i)? {
        b'Z' | b'z' if i + 1 == b.len() => 0,
        c @ (b'+' | b'-') if i + 6 == b.len() && sep(i + 3, b":") => {
            let (h, m) = (num(i + 1, i + 3)?, num(i + 4, i + 6)?);
            if h > 23 || m > 59 {
                return None;
            }
            if *c == b'+' { h * 60 + m } else { -(h * 60 + m) }
        }
        _ => return None,
    };
    let leap = year % 4 == 0 && (year % 100 != 0 || year % 400 == 0);
    let days_in_month = match month {
        1 | 3 | 5 | 7 | 8 | 10 | 12 => 31,
        4 | 6 | 9 | 11 => 30,
        2 if leap => 29,
        2 => 28,
        _ => return None,
    };
    if day < 1 || day > days_in_month || hour > 23 || minute > 59 || second > 60 {
        return None;
    }
    // A leap second counts as the last millisecond of its minute's 59th second.
    let second = second.min(59);
    let days = days_from_civil(year, month, day);
    let secs = ((days * 24 + hour) * 60 + minute) * 60 + second - offset_min * 60;
    Some(secs * 1000 + millis)
}

/// Days from 1970-01-01 to a proleptic Gregorian date (Howard Hinnant's algorithm).
fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}
