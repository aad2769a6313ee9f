//! User text in messages and tables: names checked once, quoted short, numbers
//! printed so that a huge one cannot break a line.

/// Longest name (of a process, kernel, task...) in characters: names go into
/// table columns and messages.
pub const MAX_NAME_CHARS: usize = 256;

/// Most characters of user text a message quotes.
pub const QUOTE_CHARS: usize = 40;

/// Most characters of a parser's own message we pass on (the TOML parser's
/// messages can repeat the offending key or value).
pub const MESSAGE_CHARS: usize = 200;

/// Characters that reorder the text around them when printed (the "Trojan
/// Source" characters): a name holding one can display as another name.
fn is_bidi_control(c: char) -> bool {
    matches!(c, '\u{061C}' | '\u{200E}' | '\u{200F}' | '\u{202A}'..='\u{202E}' | '\u{2066}'..='\u{2069}')
}

/// Checks a name a person gave: not empty or blank, no control characters
/// (terminal escapes, newlines), no bidirectional-override characters, at most
/// [`MAX_NAME_CHARS`]. The error is the reason, to follow the field's name.
pub fn check_name(v: &str) -> Result<(), String> {
    if v.trim().is_empty() {
        return Err("must not be empty".into());
    }
    if let Some(c) = v.chars().find(|c| c.is_control()) {
        return Err(format!("must not contain control characters ({}), got {}", code_point(c), quote(v)));
    }
    if let Some(c) = v.chars().find(|c| is_bidi_control(*c)) {
        return Err(format!(
            "must not contain bidirectional-text controls ({}: they make a name display as another), got {}",
            code_point(c),
            quote(v)
        ));
    }
    let n = v.chars().count();
    if n > MAX_NAME_CHARS {
        return Err(format!("must have at most {MAX_NAME_CHARS} characters, got {n}: {}", quote(v)));
    }
    Ok(())
}

fn code_point(c: char) -> String {
    format!("U+{:04X}", c as u32)
}

/// `v` quoted for a message: escaped like a Rust string literal (so control
/// and bidirectional characters show as `\u{..}`), cut to [`QUOTE_CHARS`]
/// characters with the full length said.
pub fn quote(v: &str) -> String {
    let n = v.chars().count();
    if n <= QUOTE_CHARS {
        format!("{v:?}")
    } else {
        let head: String = v.chars().take(QUOTE_CHARS).collect();
        format!("{head:?}… ({n} characters)")
    }
}

/// `s` cut to `max` characters, with "…" where it was cut.
pub fn truncate(s: &str, max: usize) -> String {
    if s.chars().count() <= max {
        s.to_string()
    } else {
        let head: String = s.chars().take(max.saturating_sub(1)).collect();
        head + "…"
    }
}

/// A number for a message or a table: as written for ordinary magnitudes,
/// in scientific notation past 1e15 or below 1e-6, so that `1e300` is not
/// printed as 301 digits.
pub fn number(v: f64) -> String {
    let a = v.abs();
    if v == 0.0 || !v.is_finite() || (1e-6..1e15).contains(&a) {
        format!("{v}")
    } else {
        format!("{v:e}")
    }
}

/// A TOML syntax error as (line, column, message): line and column 1-based
/// (the column in characters), the message on one line and at most
/// [`MESSAGE_CHARS`] characters. Never the offending line itself: it can be
/// 100,000 characters long.
pub fn toml_error(text: &str, err: &toml::de::Error) -> (usize, usize, String) {
    let (line, column) = match err.span() {
        Some(span) => line_col(text, span.start),
        None => (1, 1),
    };
    let message = err.message().trim_end().replace('\n', "; ");
    (line, column, truncate(&message, MESSAGE_CHARS))
}

/// 1-based line and column (in characters) of a byte offset.
pub fn line_col(text: &str, offset: usize) -> (usize, usize) {
    let mut off = offset.min(text.len());
    while !text.is_char_boundary(off) {
        off -= 1;
    }
    let before = &text[..off];
    let line = before.matches('\n').count() + 1;
    let line_start = before.rfind('\n').map_or(0, |i| i + 1);
    let column = before[line_start..].chars().count() + 1;
    (line, column)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn line_col_counts_from_one() {
        assert_eq!(line_col("abc", 0), (1, 1));
        assert_eq!(line_col("a\nbc", 3), (2, 2));
        assert_eq!(line_col("é\nx", 100), (2, 2));
    }

    #[test]
    fn names_are_checked() {
        assert_eq!(check_name("lbm#2"), Ok(()));
        assert_eq!(check_name("  "), Err("must not be empty".to_string()));
        let e = check_name("red\u{1b}[31m").expect_err("escape");
        assert!(e.contains("U+001B") && e.contains("\\u{1b}"), "{e}");
        let e = check_name("abc\u{202E}fed").expect_err("override");
        assert!(e.contains("U+202E") && !e.contains('\u{202E}'), "{e}");
        let e = check_name(&"x".repeat(1000)).expect_err("long");
        assert!(e.contains("got 1000") && e.len() < 200, "{e}");
    }

    #[test]
    fn quotes_and_numbers_stay_short() {
        assert_eq!(quote("ab"), "\"ab\"");
        let q = quote(&"y".repeat(100_000));
        assert!(q.ends_with("(100000 characters)") && q.len() < 80, "{q}");
        assert_eq!(number(1e300), "1e300");
        assert_eq!(number(2.5), "2.5");
        assert_eq!(number(1e-9), "1e-9");
        assert_eq!(number(0.0), "0");
        assert_eq!(truncate("abcdef", 4), "abc…");
    }

    #[test]
    fn a_syntax_error_on_a_long_line_is_short() {
        let text = format!("x = {}?\n", "1".repeat(100_000));
        let err = text.parse::<toml::Table>().expect_err("bad TOML");
        let (line, _col, msg) = toml_error(&text, &err);
        assert_eq!(line, 1);
        assert!(msg.chars().count() <= MESSAGE_CHARS, "{msg}");
    }
}
