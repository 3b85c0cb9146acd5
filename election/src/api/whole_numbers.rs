//! Whole numbers written as decimals (`5000.0`, `9007199254740992.0`,
//! `1e3`) read as the integers they are, exactly.
//!
//! JSON Schema counts `1.0` as an integer, so a client (or a fuzzer) that
//! writes a whole number with a fraction or an exponent sends a valid body.
//! serde reads such a number as an `f64`, which cannot hold every integer
//! above 2^53 (`9007199254740993.0` would become `...992`). So the rewrite
//! works on the text: each number outside a string whose value is whole is
//! written again as its digits. A number with a real fraction (`1.5`) is
//! left alone, for the typed parse to refuse.

/// `body` with every whole number written as an integer; `None` when no
/// number needed it. Strings are never touched.
pub(super) fn rewrite(body: &[u8]) -> Option<Vec<u8>> {
    let mut out = Vec::with_capacity(body.len());
    let mut changed = false;
    let mut i = 0;
    while i < body.len() {
        let byte = body[i];
        if byte == b'"' {
            let end = string_end(body, i);
            out.extend_from_slice(&body[i..end]);
            i = end;
        } else if byte == b'-' || byte.is_ascii_digit() {
            let end = body[i..]
                .iter()
                .position(|b| !matches!(b, b'0'..=b'9' | b'.' | b'e' | b'E' | b'+' | b'-'))
                .map_or(body.len(), |n| i + n);
            match integer_text(&body[i..end]) {
                Some(digits) => {
                    out.extend_from_slice(digits.as_bytes());
                    changed = true;
                }
                None => out.extend_from_slice(&body[i..end]),
            }
            i = end;
        } else {
            out.push(byte);
            i += 1;
        }
    }
    changed.then_some(out)
}

/// Where the string that opens at `start` ends (one past its closing
/// quote; the body's end if it never closes).
fn string_end(body: &[u8], start: usize) -> usize {
    let mut i = start + 1;
    while i < body.len() {
        match body[i] {
            b'\\' => i += 2,
            b'"' => return i + 1,
            _ => i += 1,
        }
    }
    body.len()
}

/// Digits longer than this are no integer any field takes (u64 has 20).
const MAX_DIGITS: usize = 21;

/// The integer a JSON number's text denotes, if it has a fraction or an
/// exponent and its value is whole; `None` for a plain integer (nothing to
/// do), a real fraction, or text that is no number.
fn integer_text(number: &[u8]) -> Option<String> {
    let text = std::str::from_utf8(number).ok()?;
    let (negative, text) = match text.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, text),
    };
    let (mantissa, exponent) = match text.find(['e', 'E']) {
        Some(at) => (&text[..at], text[at + 1..].parse::<i64>().ok()?),
        None => (text, 0),
    };
    let (whole, fraction) = match mantissa.split_once('.') {
        Some((_, "")) => return None, // `1.` is no JSON number
        Some(parts) => parts,
        None => (mantissa, ""),
    };
    let leading_zero = whole.len() > 1 && whole.starts_with('0'); // no JSON number either
    if whole.is_empty()
        || leading_zero
        || !whole
            .bytes()
            .chain(fraction.bytes())
            .all(|b| b.is_ascii_digit())
    {
        return None;
    }
    if fraction.is_empty() && exponent == 0 && !text.contains(['e', 'E']) {
        return None;
    }
    // value = digits × 10^shift
    let mut digits = format!("{whole}{fraction}");
    let mut shift = exponent.checked_sub(i64::try_from(fraction.len()).ok()?)?;
    while shift < 0 && digits.ends_with('0') {
        digits.pop();
        shift += 1;
    }
    let digits = digits.trim_start_matches('0');
    if digits.is_empty() {
        return Some("0".to_owned());
    }
    if shift < 0 {
        return None;
    }
    let zeros = usize::try_from(shift).ok()?;
    if digits.len() + zeros > MAX_DIGITS {
        return None;
    }
    let sign = if negative { "-" } else { "" };
    Some(format!("{sign}{digits}{}", "0".repeat(zeros)))
}

#[cfg(test)]
mod tests {
    use crate::api::whole_numbers::rewrite;

    fn read(body: &str) -> String {
        rewrite(body.as_bytes()).map_or_else(
            || body.to_owned(),
            |b| String::from_utf8(b).expect("utf-8 in, utf-8 out"),
        )
    }

    #[test]
    fn whole_decimals_become_their_exact_integers() {
        assert_eq!(read(r#"{"a":5000.0}"#), r#"{"a":5000}"#);
        assert_eq!(
            read(r#"{"t":9007199254740992.0}"#),
            r#"{"t":9007199254740992}"#
        );
        assert_eq!(
            read(r#"{"t":9007199254740993.0}"#),
            r#"{"t":9007199254740993}"#
        );
        assert_eq!(
            read(r#"{"t":18446744073709551615.000}"#),
            r#"{"t":18446744073709551615}"#
        );
        assert_eq!(
            read(r#"[1e3, 1.5e1, 2E+2, 12300e-2, -4.0, 0.0, -0.0]"#),
            "[1000, 15, 200, 123, -4, 0, 0]"
        );
    }

    #[test]
    fn real_fractions_strings_and_plain_integers_are_left_alone() {
        for body in [
            r#"{"a":1.5}"#,
            r#"{"a":1e-1}"#,
            r#"{"a":42}"#,
            r#"{"s":"1.0"}"#,
            r#"{"s":"a\"1.0"}"#,
        ] {
            assert!(rewrite(body.as_bytes()).is_none(), "{body}");
        }
        // Too long for any integer field: left for the typed parse to refuse.
        assert_eq!(read(r#"{"a":1e300}"#), r#"{"a":1e300}"#);
        // Not numbers at all: left as they are.
        assert_eq!(read(r#"{"a":-.e}"#), r#"{"a":-.e}"#);
        assert_eq!(read(r#"[1.e5, 01.0]"#), r#"[1.e5, 01.0]"#);
    }
}
