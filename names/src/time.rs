//! Absolute times as the API shows them: RFC 3339 in UTC with
//! milliseconds (`2026-11-28T00:40:12.345Z`), from and to milliseconds
//! since the Unix epoch. Written here rather than taken from a date crate:
//! the one format needs a dozen lines of calendar arithmetic (Howard
//! Hinnant's `civil_from_days` and `days_from_civil`), and the election
//! cluster, the SDK and the CLI must agree on it to the character.

/// `ms` since the Unix epoch as `YYYY-MM-DDTHH:MM:SS.mmmZ` (UTC). Years
/// past 9999 keep their digits (never reached by a wall clock).
pub fn rfc3339_ms(ms: u64) -> String {
    let days = ms / 86_400_000;
    let in_day = ms % 86_400_000;
    let (year, month, day) = civil_from_days(days);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{:03}Z",
        in_day / 3_600_000,
        in_day / 60_000 % 60,
        in_day / 1000 % 60,
        in_day % 1000
    )
}

/// The milliseconds since the Unix epoch of a time [`rfc3339_ms`] wrote
/// (exactly that shape: UTC, `Z`, three fraction digits); `None` for
/// anything else.
pub fn parse_rfc3339_ms(text: &str) -> Option<u64> {
    let b = text.as_bytes();
    let shape_ok = b.len() == 24
        && b[4] == b'-'
        && b[7] == b'-'
        && b[10] == b'T'
        && b[13] == b':'
        && b[16] == b':'
        && b[19] == b'.'
        && b[23] == b'Z';
    if !shape_ok {
        return None;
    }
    let num = |from: usize, to: usize| -> Option<u64> {
        let part = text.get(from..to)?;
        part.bytes()
            .all(|c| c.is_ascii_digit())
            .then(|| part.parse().ok())?
    };
    let (year, month, day) = (num(0, 4)?, num(5, 7)?, num(8, 10)?);
    let (hour, minute, second, milli) = (num(11, 13)?, num(14, 16)?, num(17, 19)?, num(20, 23)?);
    let valid = (1970..=9999).contains(&year)
        && (1..=12).contains(&month)
        && (1..=31).contains(&day)
        && hour < 24
        && minute < 60
        && second < 60;
    if !valid {
        return None;
    }
    let days = days_from_civil(year, month, day);
    if civil_from_days(days) != (year, month, day) {
        return None; // 31 April and the like
    }
    Some(days * 86_400_000 + ((hour * 60 + minute) * 60 + second) * 1000 + milli)
}

/// (year, month, day) of the day `days` after 1970-01-01.
fn civil_from_days(days: u64) -> (u64, u64, u64) {
    // Shifted so the era starts on 0000-03-01 (leap days fall last).
    let z = days + 719_468;
    let era = z / 146_097;
    let doe = z % 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + u64::from(month <= 2);
    (year, month, day)
}

/// Days from 1970-01-01 to (year, month, day), for years from 1970.
fn days_from_civil(year: u64, month: u64, day: u64) -> u64 {
    let year = if month <= 2 { year - 1 } else { year };
    let era = year / 400;
    let yoe = year % 400;
    let mp = if month > 2 { month - 3 } else { month + 9 };
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_instants_format_to_the_character() {
        assert_eq!(rfc3339_ms(0), "1970-01-01T00:00:00.000Z");
        // date -u -d @1795826412.345 +%FT%T.%3NZ
        assert_eq!(rfc3339_ms(1_795_826_412_345), "2026-11-28T00:40:12.345Z");
        // A leap day, and the last millisecond of a leap year's last day.
        assert_eq!(rfc3339_ms(951_782_400_000), "2000-02-29T00:00:00.000Z");
        assert_eq!(rfc3339_ms(1_735_689_599_999), "2024-12-31T23:59:59.999Z");
        assert_eq!(rfc3339_ms(4_107_542_400_000), "2100-03-01T00:00:00.000Z");
    }

    #[test]
    fn every_day_for_four_centuries_round_trips() {
        for day in (0..146_097 + 365).step_by(7) {
            let ms = day * 86_400_000 + 45_296_789;
            let text = rfc3339_ms(ms);
            assert_eq!(parse_rfc3339_ms(&text), Some(ms), "{text}");
        }
    }

    #[test]
    fn anything_else_does_not_parse() {
        for text in [
            "",
            "2026-11-28T00:40:12Z",
            "2026-11-28T00:40:12.345+00:00",
            "2026-04-31T00:00:00.000Z",
            "2026-13-01T00:00:00.000Z",
            "2026-11-28T24:00:00.000Z",
            "2026-11-28 00:40:12.345Z",
            "+026-11-28T00:40:12.345Z",
        ] {
            assert_eq!(parse_rfc3339_ms(text), None, "{text:?}");
        }
    }
}
