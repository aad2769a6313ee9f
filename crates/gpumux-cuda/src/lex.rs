//! A small lexer for CUDA C++ source: just enough structure for the kernel
//! transformation to find functions and identifiers without being fooled by
//! comments, string literals or preprocessor lines. It never fails: text it
//! does not recognise becomes one-character punctuation, and every byte of the
//! input belongs to exactly one token, so concatenating the tokens' text gives
//! the input back.

/// What a token is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// An identifier or keyword.
    Ident,
    /// A numeric literal, suffixes included.
    Number,
    /// String literal, raw strings included (`R"(...)"`).
    Str,
    /// Character literal.
    Char,
    /// One punctuation character.
    Punct,
    /// `//` or `/* */` comment.
    Comment,
    /// A whole preprocessor directive, continuation lines included.
    Preproc,
    /// Whitespace, newlines included.
    Space,
}

/// A token: its kind and where it lies in the source (byte offsets).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Token {
    /// What it is.
    pub kind: Kind,
    /// First byte.
    pub start: usize,
    /// One past the last byte.
    pub end: usize,
}

impl Token {
    /// The token's text in `src` (the source it was lexed from).
    pub fn text<'a>(&self, src: &'a str) -> &'a str {
        &src[self.start..self.end]
    }

    /// Tokens that carry program structure (not spaces or comments).
    pub fn significant(&self) -> bool {
        !matches!(self.kind, Kind::Space | Kind::Comment)
    }
}

fn is_ident_start(c: u8) -> bool {
    c == b'_' || c.is_ascii_alphabetic() || c >= 0x80
}

fn is_ident_char(c: u8) -> bool {
    is_ident_start(c) || c.is_ascii_digit()
}

/// Splits `src` into tokens covering every byte.
pub fn lex(src: &str) -> Vec<Token> {
    let b = src.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    // True while only spaces have been seen since the last newline: a `#`
    // there starts a directive.
    let mut line_start = true;
    while i < b.len() {
        let start = i;
        let c = b[i];
        let kind = if c == b'\n' || c.is_ascii_whitespace() {
            while i < b.len() && b[i].is_ascii_whitespace() {
                if b[i] == b'\n' {
                    line_start = true;
                }
                i += 1;
            }
            out.push(Token { kind: Kind::Space, start, end: i });
            continue;
        } else if c == b'#' && line_start {
            // Up to an unescaped newline; comments inside stay part of it.
            while i < b.len() && b[i] != b'\n' {
                if b[i] == b'\\' && i + 1 < b.len() && b[i + 1] == b'\n' {
                    i += 2;
                } else if b[i] == b'\\' && i + 2 < b.len() && b[i + 1] == b'\r' && b[i + 2] == b'\n' {
                    i += 3;
                } else if b[i] == b'/' && i + 1 < b.len() && b[i + 1] == b'*' {
                    i = skip_block_comment(b, i);
                } else {
                    i += 1;
                }
            }
            Kind::Preproc
        } else if c == b'/' && i + 1 < b.len() && b[i + 1] == b'/' {
            while i < b.len() && b[i] != b'\n' {
                // A backslash-newline continues a line comment too.
                if b[i] == b'\\' && i + 1 < b.len() && b[i + 1] == b'\n' {
                    i += 1;
                }
                i += 1;
            }
            Kind::Comment
        } else if c == b'/' && i + 1 < b.len() && b[i + 1] == b'*' {
            i = skip_block_comment(b, i);
            Kind::Comment
        } else if c == b'R' && i + 2 < b.len() && b[i + 1] == b'"' {
            i = skip_raw_string(b, i + 1);
            Kind::Str
        } else if c == b'"' {
            i = skip_quoted(b, i, b'"');
            Kind::Str
        } else if c == b'\'' {
            i = skip_quoted(b, i, b'\'');
            Kind::Char
        } else if c.is_ascii_digit() || (c == b'.' && i + 1 < b.len() && b[i + 1].is_ascii_digit()) {
            i += 1;
            while i < b.len() {
                let d = b[i];
                let exp_sign = (d == b'+' || d == b'-') && matches!(b[i - 1], b'e' | b'E' | b'p' | b'P');
                if d.is_ascii_alphanumeric() || d == b'.' || d == b'_' || d == b'\'' || exp_sign {
                    i += 1;
                } else {
                    break;
                }
            }
            Kind::Number
        } else if is_ident_start(c) {
            while i < b.len() && is_ident_char(b[i]) {
                i += 1;
            }
            // Prefixed string literals (u8"..", L"..") stay one token.
            if i < b.len() && b[i] == b'"' && matches!(&src[start..i], "u8" | "u" | "U" | "L") {
                i = skip_quoted(b, i, b'"');
                Kind::Str
            } else {
                Kind::Ident
            }
        } else {
            // One character; a multi-byte UTF-8 character stays whole.
            i += 1;
            while i < b.len() && (b[i] & 0xC0) == 0x80 {
                i += 1;
            }
            Kind::Punct
        };
        line_start = false;
        out.push(Token { kind, start, end: i });
    }
    out
}

fn skip_block_comment(b: &[u8], mut i: usize) -> usize {
    i += 2;
    while i + 1 < b.len() && !(b[i] == b'*' && b[i + 1] == b'/') {
        i += 1;
    }
    (i + 2).min(b.len())
}

fn skip_quoted(b: &[u8], mut i: usize, q: u8) -> usize {
    i += 1;
    while i < b.len() && b[i] != q && b[i] != b'\n' {
        if b[i] == b'\\' {
            i += 1;
        }
        i += 1;
    }
    (i + 1).min(b.len())
}

/// `i` points at the opening quote of `R"delim( ... )delim"`.
fn skip_raw_string(b: &[u8], i: usize) -> usize {
    let open = i + 1;
    let mut p = open;
    while p < b.len() && b[p] != b'(' && b[p] != b'\n' {
        p += 1;
    }
    let delim = &b[open..p.min(b.len())];
    let mut close = Vec::with_capacity(delim.len() + 2);
    close.push(b')');
    close.extend_from_slice(delim);
    close.push(b'"');
    let mut j = p;
    while j + close.len() <= b.len() {
        if b[j..j + close.len()] == close[..] {
            return j + close.len();
        }
        j += 1;
    }
    b.len()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kinds(src: &str) -> Vec<(Kind, &str)> {
        lex(src).into_iter().filter(|t| t.kind != Kind::Space).map(|t| (t.kind, t.text(src))).collect()
    }

    #[test]
    fn round_trips_every_byte() {
        let src = "#define X(a) \\\n  a+blockIdx.x // c\nint /*b*/ x = R\"q(bl\"ockIdx)q\" + 'c' + 1.5e-3f; é";
        let joined: String = lex(src).iter().map(|t| t.text(src)).collect();
        assert_eq!(joined, src);
    }

    #[test]
    fn comments_strings_and_directives_are_single_tokens() {
        let k = kinds("#include <x>\n/* blockIdx */ a \"blockIdx\" // gridDim\n'x'");
        assert_eq!(
            k,
            vec![
                (Kind::Preproc, "#include <x>"),
                (Kind::Comment, "/* blockIdx */"),
                (Kind::Ident, "a"),
                (Kind::Str, "\"blockIdx\""),
                (Kind::Comment, "// gridDim"),
                (Kind::Char, "'x'"),
            ]
        );
    }

    #[test]
    fn continued_directive_and_numbers() {
        let k = kinds("#define A \\\n b\nx=0x1Fu+1e+5;");
        assert_eq!(k[0], (Kind::Preproc, "#define A \\\n b"));
        assert!(k.contains(&(Kind::Number, "0x1Fu")));
        assert!(k.contains(&(Kind::Number, "1e+5")));
    }

    #[test]
    fn hash_inside_a_line_is_not_a_directive() {
        let k = kinds("a # b");
        assert_eq!(k[1], (Kind::Punct, "#"));
    }
}
