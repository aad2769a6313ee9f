//! Errors a person can act on: each names the file (or spec), where in it,
//! the field and the reason.

use std::fmt;

#[derive(Debug, thiserror::Error)]
pub enum WorkloadError {
    /// The file could not be read (missing, a directory, no permission, not UTF-8).
    #[error("{path}: cannot read workload file: {reason}")]
    Io { path: String, reason: String },

    /// TOML that does not parse, or a table with a field the format does not
    /// have (typos), or a value of the wrong type. Line and column are 1-based.
    #[error("{origin}:{line}:{column}: {message}")]
    Toml { origin: String, line: usize, column: usize, message: String },

    /// Well-formed TOML that is not a valid workload.
    #[error("{}", Invalid { origin, at, field, reason })]
    Invalid {
        origin: String,
        /// Where: e.g. `process "lbm" op 3 (kernel "StreamCollide")`; empty at top level.
        at: String,
        /// The offending field, as spelled in the file.
        field: String,
        /// Why, with the value found: e.g. `must be > 0, got -2`.
        reason: String,
    },

    /// A built-in workload spec (`parboil-k20c:...`) that does not parse.
    #[error("bad workload spec `{spec}`: {reason}")]
    Spec { spec: String, reason: String },
}

struct Invalid<'a> {
    origin: &'a str,
    at: &'a str,
    field: &'a str,
    reason: &'a str,
}

impl fmt::Display for Invalid<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: ", self.origin)?;
        if !self.at.is_empty() {
            write!(f, "{}: ", self.at)?;
        }
        write!(f, "{} {}", self.field, self.reason)
    }
}

impl WorkloadError {
    pub(crate) fn toml(origin: &str, text: &str, err: &toml::de::Error) -> Self {
        let (line, column) = match err.span() {
            Some(span) => line_col(text, span.start),
            None => (1, 1),
        };
        WorkloadError::Toml {
            origin: origin.to_string(),
            line,
            column,
            message: err.message().trim_end().replace('\n', "; "),
        }
    }
}

/// 1-based line and column (in characters) of a byte offset.
fn line_col(text: &str, offset: usize) -> (usize, usize) {
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
}
