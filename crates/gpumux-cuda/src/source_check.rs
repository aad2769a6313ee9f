//! What can be known of a CUDA C source without a compiler, for the
//! simulated device, which compiles nothing (issue 36, case 9: it accepted
//! wrong argument counts and sizes and sources that cannot compile, so such
//! mistakes showed up only on a GPU):
//!
//! * [`param_size`]: the size of a kernel parameter of a built-in type
//!   (pointers, arrays, the scalar types, `<stdint.h>` names, CUDA's vector
//!   types), under the ABI of 64-bit Linux that NVRTC compiles for. Any
//!   other type (a struct, a typedef, a template parameter, an enum) is
//!   `None`: its size would need the compiler.
//! * [`syntax_errors`]: what a lexer sees that no compiler accepts:
//!   brackets that do not match, a string, character literal or comment
//!   left open, a character C++ has no use for outside literals, a
//!   `__global__` function that does not return `void`. Each with its line.
//!   A source that passes may still not compile on a GPU (an undeclared
//!   name, a type error): those need the compiler.

use crate::lex::{lex, Kind};

/// The size in bytes of a kernel parameter of type `ty` (as in
/// [`crate::transform::KernelInfo::param_types`]: words separated by one
/// space), if it is a built-in type whose size the ABI fixes (module doc).
pub fn param_size(ty: &str) -> Option<u32> {
    let words: Vec<&str> = ty.split_whitespace().collect();
    // A pointer, or an array (which a parameter's type decays to a pointer).
    if words.iter().any(|w| *w == "*" || *w == "[") {
        return Some(8);
    }
    // A reference, a qualified name (`std::`), a template: not sized here.
    if words.iter().any(|w| matches!(*w, "&" | "&&" | ":" | "::" | "<")) {
        return None;
    }
    let core: Vec<&str> = words
        .iter()
        .copied()
        .filter(|w| !matches!(*w, "const" | "volatile" | "__restrict__" | "__restrict" | "restrict" | "signed"))
        .collect();
    let unsigned = core.contains(&"unsigned");
    let rest: Vec<&str> = core.iter().copied().filter(|w| *w != "unsigned" && *w != "int").collect();
    let had_int = core.contains(&"int");
    match rest.as_slice() {
        // `unsigned`, `signed`, `int`, `unsigned int`.
        [] if unsigned || had_int || words.contains(&"signed") => Some(4),
        ["char"] => Some(1),
        ["short"] => Some(2),
        // LP64: `long` is 8 bytes, as `long long`.
        ["long"] | ["long", "long"] => Some(8),
        [one] if !unsigned && !had_int => named_size(one),
        _ => None,
    }
}

/// The size of a one-word type name: scalars, `<stdint.h>`, CUDA's half
/// types and vector types.
fn named_size(word: &str) -> Option<u32> {
    let fixed = match word {
        "bool" | "int8_t" | "uint8_t" => 1,
        "int16_t" | "uint16_t" | "__half" | "half" | "__nv_bfloat16" => 2,
        "float" | "int32_t" | "uint32_t" | "__half2" | "half2" | "__nv_bfloat162" => 4,
        "double" | "int64_t" | "uint64_t" | "size_t" | "ptrdiff_t" | "intptr_t" | "uintptr_t" | "ssize_t" => 8,
        _ => 0,
    };
    if fixed > 0 {
        return Some(fixed);
    }
    // CUDA's vector types: a base and a count of 1 to 4 (`float4`, `uchar2`).
    let n = word.chars().last()?.to_digit(10)?;
    if !(1..=4).contains(&n) {
        return None;
    }
    let element = match &word[..word.len() - 1] {
        "char" | "uchar" => 1,
        "short" | "ushort" => 2,
        "int" | "uint" | "float" => 4,
        "long" | "ulong" | "longlong" | "ulonglong" | "double" => 8,
        _ => return None,
    };
    Some(element * n)
}

/// Where a source fails to compile by what a lexer can see (module doc):
/// one message per problem, each starting `line N: `, in source order.
/// Empty: nothing found (which does not mean it compiles).
pub fn syntax_errors(src: &str) -> Vec<String> {
    let line = |at: usize| src[..at.min(src.len())].bytes().filter(|&b| b == b'\n').count() + 1;
    let mut errors = Vec::new();
    let mut open: Vec<(char, usize)> = Vec::new();
    let toks = lex(src);
    for t in &toks {
        let text = t.text(src);
        match t.kind {
            Kind::Comment if text.starts_with("/*") && (text.len() < 4 || !text.ends_with("*/")) => {
                errors.push(format!("line {}: a comment opened here is never closed", line(t.start)));
            }
            Kind::Str if !literal_closed(text, b'"') => {
                errors.push(format!("line {}: a string literal is not closed on its line", line(t.start)));
            }
            Kind::Char if !literal_closed(text, b'\'') => {
                errors.push(format!("line {}: a character literal is not closed (or empty)", line(t.start)));
            }
            Kind::Punct => match text {
                "(" | "[" | "{" => open.push((text.chars().next().unwrap_or('('), t.start)),
                ")" | "]" | "}" => {
                    let want = match text {
                        ")" => '(',
                        "]" => '[',
                        _ => '{',
                    };
                    // The innermost opener it closes; those inside it were left open.
                    match open.iter().rposition(|&(o, _)| o == want) {
                        Some(at) => {
                            for (o, start) in open.drain(at..).skip(1) {
                                errors.push(format!("line {}: `{o}` opened here is never closed", line(start)));
                            }
                        }
                        None => errors.push(format!("line {}: `{text}` closes nothing", line(t.start))),
                    }
                }
                // A backslash ending a line splices it to the next, anywhere.
                "\\" if src[t.end..].starts_with('\n') || src[t.end..].starts_with("\r\n") => {}
                "@" | "`" | "\\" => {
                    errors.push(format!("line {}: `{text}` has no meaning in C++ outside a literal", line(t.start)));
                }
                _ => {}
            },
            _ => {}
        }
    }
    for (o, at) in open {
        errors.push(format!("line {}: `{o}` opened here is never closed", line(at)));
    }
    errors.extend(non_void_kernels(src, &toks, &line));
    errors.sort_by_key(|e| e.split(':').next().and_then(|l| l.trim_start_matches("line ").parse::<usize>().ok()));
    errors
}

/// Whether a string or character literal token (as the lexer cut it) ends
/// with its closing quote: a raw string with its `)delim"`, any other with
/// an unescaped `quote` after at least one character (a character literal)
/// or none (a string).
fn literal_closed(text: &str, quote: u8) -> bool {
    let b = text.as_bytes();
    let Some(open) = b.iter().position(|&c| c == quote) else { return false };
    if quote == b'"' && open > 0 && b[open - 1] == b'R' {
        let delim_end = b[open + 1..].iter().position(|&c| c == b'(').map(|p| open + 1 + p);
        let Some(delim_end) = delim_end else { return false };
        let mut close = vec![b')'];
        close.extend_from_slice(&b[open + 1..delim_end]);
        close.push(b'"');
        return b.len() >= delim_end + close.len() && b.ends_with(&close);
    }
    let mut i = open + 1;
    while i < b.len() {
        match b[i] {
            b'\\' => i += 2,
            c if c == quote => return i == b.len() - 1 && (quote == b'"' || i > open + 1),
            _ => i += 1,
        }
    }
    false
}

/// `__global__` functions whose declaration names no `void` (NVRTC: "a
/// __global__ function must have a void return type"). A trailing return
/// type (`auto`) is left to the compiler.
fn non_void_kernels(src: &str, toks: &[crate::lex::Token], line: &dyn Fn(usize) -> usize) -> Vec<String> {
    let sig: Vec<&crate::lex::Token> = toks.iter().filter(|t| t.significant()).collect();
    let mut errors = Vec::new();
    for (k, t) in sig.iter().enumerate() {
        if !(t.kind == Kind::Ident && t.text(src) == "__global__") {
            continue;
        }
        // From the declaration's start to the first `(` that opens no attribute.
        let mut start = k;
        while start > 0 {
            let p = sig[start - 1];
            if p.kind == Kind::Preproc || matches!(p.text(src), ";" | "{" | "}") {
                break;
            }
            start -= 1;
        }
        let mut words = Vec::new();
        let mut j = start;
        let mut skip = 0usize;
        while let Some(u) = sig.get(j) {
            let w = u.text(src);
            if skip > 0 {
                match w {
                    "(" => skip += 1,
                    ")" => skip -= 1,
                    _ => {}
                }
            } else if w == "(" {
                if words.last().is_some_and(|p| {
                    matches!(
                        *p,
                        "__launch_bounds__" | "__maxnreg__" | "__attribute__" | "__declspec" | "alignas" | "__align__"
                    )
                }) {
                    skip = 1;
                } else {
                    break;
                }
            } else if matches!(w, ";" | "{") {
                break;
            }
            words.push(w);
            j += 1;
        }
        if !words.iter().any(|w| matches!(*w, "void" | "auto")) {
            errors.push(format!("line {}: a __global__ function must return void", line(t.start)));
        }
    }
    errors
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transform::transform;

    #[test]
    fn built_in_parameter_types_have_their_abi_sizes() {
        let src = "extern \"C\" __global__ void k(const float* __restrict__ a, unsigned n, int i, long l, \
                   unsigned long long u, double d, char c, unsigned char uc, short s, bool b, float x[4], \
                   float4 f4, uchar2 u2, double2 d2, size_t z, int64_t i64, uint8_t u8, __half h, \
                   signed int si, long int li, unsigned short int usi, const int* const* pp, int3 i3) {}";
        let t = transform(src).unwrap();
        let sizes: Vec<Option<u32>> = t.kernels[0].param_types.iter().map(|ty| param_size(ty)).collect();
        let want = [8, 4, 4, 8, 8, 8, 1, 1, 2, 1, 8, 16, 2, 16, 8, 8, 1, 2, 4, 8, 2, 8, 12];
        assert_eq!(sizes, want.iter().map(|&w| Some(w)).collect::<Vec<_>>(), "{:?}", t.kernels[0].param_types);
    }

    #[test]
    fn other_parameter_types_are_not_sized() {
        let src = "struct P { int a; };\ntypedef int myint;\ntemplate <typename T> __global__ void t(T v) {}\n\
                   __global__ void k(P p, myint m, struct P q, float5 f, long double ld, std::size_t s) {}";
        let t = transform(src).unwrap();
        let k = t.kernel("k").unwrap();
        for ty in &k.param_types {
            assert_eq!(param_size(ty), None, "{ty}");
        }
        assert_eq!(param_size(&t.kernel("t").unwrap().param_types[0]), None);
    }

    #[test]
    fn what_a_lexer_sees_is_reported_with_its_line() {
        assert!(syntax_errors("__global__ void k(int* p) { p[0] = 1; }\n").is_empty());
        let e = syntax_errors("__global__ void k(int* p) {\n  p[0] = (1;\n}\n");
        assert_eq!(e, ["line 2: `(` opened here is never closed"]);
        assert_eq!(syntax_errors("__global__ void k() {\n"), ["line 1: `{` opened here is never closed"]);
        assert_eq!(syntax_errors("__global__ void k() {}\n}"), ["line 2: `}` closes nothing"]);
        assert_eq!(
            syntax_errors("__global__ void k() {\n const char* s = \"open;\n}"),
            ["line 2: a string literal is not closed on its line"]
        );
        assert_eq!(syntax_errors("/* never\n closed"), ["line 1: a comment opened here is never closed"]);
        assert_eq!(syntax_errors("__global__ void k() { @ }"), ["line 1: `@` has no meaning in C++ outside a literal"]);
        assert_eq!(syntax_errors("\n__global__ int k() { }"), ["line 2: a __global__ function must return void"]);
        assert_eq!(syntax_errors("char c = '';"), ["line 1: a character literal is not closed (or empty)"]);
        assert_eq!(syntax_errors("const char* s = \"a\\\";"), ["line 1: a string literal is not closed on its line"]);
        assert_eq!(syntax_errors("const char* s = R\"x(a)\";"), ["line 1: a string literal is not closed on its line"]);
    }

    #[test]
    fn valid_sources_pass() {
        for ok in [
            "extern \"C\" __global__ void __launch_bounds__(256, 2) k(float* x) { x[0] = '\\''; }",
            "template <typename T> __global__ void t(T* p) { p[0] = T(); }\ntemplate __global__ void t<float>(float*);",
            "#define F(x) ((x) + 1\n__global__ void k(int* p) { const char* s = \"a\\\"b\"; p[0] = '\\\\'; }",
            "void __global__ k() {}\n__device__ int helper(int a) { return a; }",
            "__global__ auto k() -> void {}",
            "__global__ void k(const char* s) { const char* r = R\"(a \" ) b)\"; }",
            "__global__ void k(int* p) { p[0] = 1 + \\\n 2; }",
            "const char* s = u8\"x\"; const wchar_t* w = L\"\";",
        ] {
            assert_eq!(syntax_errors(ok), Vec::<String>::new(), "{ok}");
        }
    }
}
