//! Text from the model, a skill or a command on its way to an operator's
//! terminal.
//!
//! A terminal obeys control sequences in what it prints: an escape can
//! retitle the window, rewrite lines already shown, set the clipboard or,
//! on some terminals, answer back into the input. Model output and skill
//! descriptions are untrusted, so what reaches a terminal keeps newlines
//! and tabs and shows every other control character (C0, DEL, C1) as
//! U+FFFD instead of sending it.

use std::borrow::Cow;

/// What is shown in place of a control character.
pub const REPLACEMENT: char = '\u{fffd}';

/// `text` with every control character but `\n` and `\t` replaced.
pub fn printable(text: &str) -> Cow<'_, str> {
    let unsafe_char = |c: char| c.is_control() && c != '\n' && c != '\t';
    if !text.chars().any(unsafe_char) {
        return Cow::Borrowed(text);
    }
    Cow::Owned(text.chars().map(|c| if unsafe_char(c) { REPLACEMENT } else { c }).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn control_sequences_never_reach_the_terminal() {
        for (hostile, shown) in [
            ("\x1b]0;owned\x07title", "\u{fffd}]0;owned\u{fffd}title"),
            ("\x1b[2J\x1b[Hcleared", "\u{fffd}[2J\u{fffd}[Hcleared"),
            ("ok\rfake", "ok\u{fffd}fake"),
            ("\u{9b}31mC1 CSI", "\u{fffd}31mC1 CSI"),
            ("del\x7f", "del\u{fffd}"),
            ("\x1b]52;c;cGFzdGU=\x07", "\u{fffd}]52;c;cGFzdGU=\u{fffd}"),
        ] {
            assert_eq!(printable(hostile), shown, "{hostile:?}");
        }
        assert!(matches!(printable("lines\n\tand tabs, r\u{e9}sum\u{e9} ✓"), Cow::Borrowed(_)));
    }
}
