//! Errors a person can act on: each names the file (or spec), where in it,
//! the field and the reason.

use std::fmt;

/// Why a workload file or spec was refused.
#[derive(Debug, thiserror::Error)]
pub enum WorkloadError {
    /// The file could not be read (missing, a directory, no permission, not UTF-8).
    #[error("{path}: cannot read workload file: {reason}")]
    Io {
        /// The file as the user named it.
        path: String,
        /// What reading it reported.
        reason: String,
    },

    /// TOML that does not parse, or a table with a field the format does not
    /// have (typos), or a value of the wrong type. Line and column are 1-based.
    #[error("{origin}:{line}:{column}: {message}")]
    Toml {
        /// The file name (or `inline.toml` for text), as messages show it.
        origin: String,
        /// 1-based line of the problem.
        line: usize,
        /// 1-based column of the problem.
        column: usize,
        /// The TOML parser's message, cut to a bounded length.
        message: String,
    },

    /// Well-formed TOML that is not a valid workload.
    #[error("{}", Invalid { origin, at, field, reason })]
    Invalid {
        /// The file name, as messages show it.
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
    Spec {
        /// The spec as given.
        spec: String,
        /// What is wrong with it, and the grammar.
        reason: String,
    },
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
    /// A TOML error as line, column and a bounded message (never the
    /// offending line, which can be very long).
    pub(crate) fn toml(origin: &str, text: &str, err: &toml::de::Error) -> Self {
        let (line, column, message) = gpumux_files::text::toml_error(text, err);
        WorkloadError::Toml { origin: origin.to_string(), line, column, message }
    }
}
