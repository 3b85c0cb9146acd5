//! Checks on free text that a server stores and shows to people: holder
//! names, principal names, object keys.
//!
//! Unicode's bidirectional controls reorder the text around them when it
//! is displayed: a holder named `"admin\u{202E}gpj.exe"` reads as
//! `adminexe.jpg`, and one control can flip the columns after it in a
//! table or a log line (the "Trojan Source" attack, CVE-2021-42574). Such
//! text is refused where it enters, so no page, audit or log shows it.

/// The bidirectional controls refused in stored text: the embeddings and
/// overrides U+202A..=U+202E, the isolates U+2066..=U+2069, and the marks
/// U+200E, U+200F and U+061C.
pub const BIDI_CONTROLS: [char; 12] = [
    '\u{202A}', '\u{202B}', '\u{202C}', '\u{202D}', '\u{202E}', '\u{2066}', '\u{2067}', '\u{2068}',
    '\u{2069}', '\u{200E}', '\u{200F}', '\u{061C}',
];

/// Whether `c` is one of [`BIDI_CONTROLS`].
pub fn is_bidi_control(c: char) -> bool {
    BIDI_CONTROLS.contains(&c)
}

/// The first bidirectional control in `text`, with its position in
/// characters, if there is one.
pub fn bidi_control(text: &str) -> Option<(usize, char)> {
    text.chars().enumerate().find(|(_, c)| is_bidi_control(*c))
}

/// Why `what` is refused, if it holds a bidirectional control: `holder
/// must not contain bidirectional-control characters (U+202E at character
/// 3)`.
pub fn refuse_bidi(what: &str, text: &str) -> Result<(), String> {
    match bidi_control(text) {
        None => Ok(()),
        Some((at, c)) => Err(format!(
            "{what} must not contain bidirectional-control characters (U+{:04X} at character {at})",
            u32::from(c)
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_bidi_control_is_found_and_plain_text_passes() {
        for c in BIDI_CONTROLS {
            let text = format!("ab{c}cd");
            assert_eq!(bidi_control(&text), Some((2, c)), "{:04X}", u32::from(c));
            assert!(refuse_bidi("holder", &text).is_err());
        }
        assert_eq!(bidi_control("worker-1 é 中文 עברית"), None);
        assert_eq!(
            refuse_bidi("holder", "x\u{202E}y").expect_err("refused"),
            "holder must not contain bidirectional-control characters (U+202E at character 1)"
        );
    }
}
