//! CUDA C source → persistent, preemptible workers (pure text → text).
//!
//! Each `__global__ void K(params) { body }` becomes
//!
//! * `__device__ __forceinline__ void K__gmx_body(params, uint3 gmx_blockIdx, uint3 gmx_gridDim) { body }`:
//!   the user's block body, where every `blockIdx`/`gridDim` of the whole file
//!   was renamed `gmx_blockIdx`/`gmx_gridDim`. Inside the body the parameters
//!   shadow the names (registers, no cost); a helper `__device__` function that
//!   reads them sees file-scope `__shared__` copies, which the worker keeps up
//!   to date only when such a helper exists (it costs one more barrier per
//!   block). An early `return` leaves the body, not the worker.
//! * `K(params, gmx_ctl_t* gmx_ctl, gmx_launch_t gmx_launch)`, same name, linkage,
//!   template header and `__launch_bounds__`: a worker that leaves at once on
//!   an SM outside the launch's mask (or over its per-SM cap), then claims chunks of linearised block
//!   indices with one atomic, runs the body for each, and stops when the record
//!   says retreat or no block is left.
//!
//! What cannot be preempted block by block is refused with the line and the
//! reason: grid-wide synchronisation, cooperative launch, dynamic parallelism,
//! thread-block clusters, inline PTX that reads the block index.

use crate::lex::{lex, Kind, Token};
use std::fmt::Write as _;

/// The worker machinery put in front of every transformed source.
pub const PRELUDE: &str = include_str!("../cuda/prelude.cuh");

/// Suffix of the device function that holds a kernel's original body.
pub const BODY_SUFFIX: &str = "__gmx_body";

/// Why a source cannot be turned into preemptible workers, with its line.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum TransformError {
    /// A construct that needs blocks to run side by side or the whole grid at once.
    #[error("line {line}: `{what}` cannot be preempted block by block: {why}")]
    Unsupported {
        /// 1-based line of the source.
        line: usize,
        /// The construct (`this_grid`).
        what: String,
        /// Why workers cannot run it.
        why: &'static str,
    },
    /// A name the transformation itself uses.
    #[error("line {line}: the name `{ident}` is reserved for gpumux's transformation (prefix gmx_)")]
    Reserved {
        /// 1-based line of the source.
        line: usize,
        /// The name.
        ident: String,
    },
    /// A `__global__` declaration the transformation cannot read.
    #[error("line {line}: cannot parse the kernel declaration: {msg}")]
    Parse {
        /// 1-based line of the source.
        line: usize,
        /// What is wrong with it.
        msg: String,
    },
}

impl TransformError {
    /// The 1-based source line it names.
    pub fn line(&self) -> usize {
        match self {
            TransformError::Unsupported { line, .. }
            | TransformError::Reserved { line, .. }
            | TransformError::Parse { line, .. } => *line,
        }
    }
}

/// What the transformation learnt about one kernel.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KernelInfo {
    /// The kernel's name as written.
    pub name: String,
    /// Parameter names, in order (generated for unnamed parameters).
    pub params: Vec<String>,
    /// Parameter types, in order, as written less the name: significant
    /// tokens joined by one space (`const float *`, `unsigned int`,
    /// `float [ 4 ]`). [`crate::source_check::param_size`] sizes the
    /// built-in ones.
    pub param_types: Vec<String>,
    /// `extern "C"` (directly or in an `extern "C" { }` block): the module
    /// exports it under its plain name.
    pub extern_c: bool,
    /// A template kernel: launchable only through an instantiation's name expression.
    pub template: bool,
    /// The text inside `__launch_bounds__(...)`, if any.
    pub launch_bounds: Option<String>,
    /// False for a declaration without a body.
    pub defined: bool,
}

/// A transformed source and what the transformation found in it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Transformed {
    /// The worker source: prelude, body functions and workers.
    pub source: String,
    /// Every `__global__` function, in source order.
    pub kernels: Vec<KernelInfo>,
    /// Some function other than a kernel reads `blockIdx`/`gridDim`, so the
    /// workers maintain the file-scope shared copies.
    pub helpers_read_index: bool,
    /// The source synchronises blocks or shares memory somewhere, so workers
    /// put a block barrier between consecutive blocks; without, a `__syncwarp`
    /// (warps run ahead into the next block as natively blocks overlap).
    pub needs_block_barrier: bool,
}

impl Transformed {
    /// The kernel named `name`, if the source has one.
    pub fn kernel(&self, name: &str) -> Option<&KernelInfo> {
        self.kernels.iter().find(|k| k.name == name)
    }
}

const FORBIDDEN: &[(&str, &str)] = &[
    ("this_grid", "grid-wide synchronisation needs every block resident at once, but workers run blocks in sequence"),
    ("grid_group", "grid-wide synchronisation needs every block resident at once, but workers run blocks in sequence"),
    ("this_multi_grid", "multi-grid synchronisation needs every block resident at once"),
    ("cudaLaunchCooperativeKernel", "a cooperative launch needs every block resident at once"),
    ("__cluster_dims__", "thread-block clusters are scheduled as a unit, not block by block"),
    ("this_cluster", "thread-block clusters are scheduled as a unit, not block by block"),
    ("cluster_group", "thread-block clusters are scheduled as a unit, not block by block"),
    ("clusterDim", "thread-block clusters are scheduled as a unit, not block by block"),
    ("clusterIdx", "thread-block clusters are scheduled as a unit, not block by block"),
    ("cudaDeviceSynchronize", "dynamic parallelism: child grids cannot be retreated with their parent"),
    ("cudaLaunchDevice", "dynamic parallelism: child grids cannot be retreated with their parent"),
    ("cudaGetParameterBuffer", "dynamic parallelism: child grids cannot be retreated with their parent"),
    ("cudaStreamTailLaunch", "dynamic parallelism: child grids cannot be retreated with their parent"),
    ("cudaStreamFireAndForget", "dynamic parallelism: child grids cannot be retreated with their parent"),
];

const RENAMES: &[(&str, &str)] = &[("blockIdx", "gmx_blockIdx"), ("gridDim", "gmx_gridDim")];

/// Attributes written `name(args)` that may sit between `__global__` and the kernel name.
const ATTRIBUTES: &[&str] =
    &["__launch_bounds__", "__maxnreg__", "__attribute__", "__declspec", "alignas", "__align__"];

/// Built-in type words: a parameter whose last word is one of these is unnamed.
const TYPE_WORDS: &[&str] = &[
    "void",
    "char",
    "short",
    "int",
    "long",
    "float",
    "double",
    "bool",
    "signed",
    "unsigned",
    "const",
    "volatile",
    "__restrict__",
    "restrict",
    "__half",
    "half",
    "size_t",
];

/// The tokens of a directive's text after its `#` (offsets relative to `d[1..]`).
fn directive_tokens(d: &str) -> (&str, Vec<Token>) {
    let body = d.get(1..).unwrap_or("");
    (body, lex(body))
}

fn line_of(src: &str, byte: usize) -> usize {
    src[..byte.min(src.len())].bytes().filter(|&b| b == b'\n').count() + 1
}

/// Rewrites `src`; see the module documentation.
pub fn transform(src: &str) -> Result<Transformed, TransformError> {
    let toks = lex(src);
    check_source(src, &toks)?;
    let sig: Vec<usize> = (0..toks.len()).filter(|&i| toks[i].significant()).collect();
    let kernels = find_kernels(src, &toks, &sig)?;

    // Which renamed words appear outside kernel bodies (helpers, macros)?
    let mut helpers_read_index = false;
    for (i, t) in toks.iter().enumerate() {
        let inside = kernels.iter().any(|k| k.body.is_some_and(|(a, b)| i > a && i < b));
        if inside {
            continue;
        }
        let hit = match t.kind {
            Kind::Ident => RENAMES.iter().any(|(from, _)| t.text(src) == *from),
            Kind::Preproc => {
                let (body, us) = directive_tokens(t.text(src));
                us.iter().any(|u| u.kind == Kind::Ident && RENAMES.iter().any(|(from, _)| u.text(body) == *from))
            }
            _ => false,
        };
        helpers_read_index |= hit;
    }

    let needs_block_barrier = uses_block_sync(src, &toks);

    let mut out = String::with_capacity(src.len() * 2 + PRELUDE.len());
    out.push_str(PRELUDE);
    if helpers_read_index {
        out.push_str(
            "static __shared__ __align__(16) uint3 gmx_blockIdx;\nstatic __shared__ __align__(16) uint3 gmx_gridDim;\n",
        );
    }
    out.push_str("#line 1\n");
    let mut pos = 0; // next token to copy
    for k in &kernels {
        copy_renamed(src, &toks, pos, k.start, &mut out);
        emit_kernel(src, &toks, k, helpers_read_index, needs_block_barrier, &mut out);
        pos = k.end;
    }
    copy_renamed(src, &toks, pos, toks.len(), &mut out);

    Ok(Transformed {
        source: out,
        kernels: kernels.into_iter().map(|k| k.info).collect(),
        helpers_read_index,
        needs_block_barrier,
    })
}

/// Words that synchronise the threads of a block or share memory between
/// them. Conservative: any of them anywhere (helpers, macros, inline PTX)
/// keeps the barrier between consecutive blocks of a worker.
const BLOCK_SYNC_WORDS: &[&str] = &[
    "__syncthreads",
    "__syncthreads_count",
    "__syncthreads_and",
    "__syncthreads_or",
    "__shared__",
    "__barrier_sync",
    "this_thread_block",
    "thread_block",
    "thread_block_tile",
    "tiled_partition",
    "barrier",
];

/// Does the source synchronise a block or share memory anywhere?
fn uses_block_sync(src: &str, toks: &[Token]) -> bool {
    toks.iter().any(|t| match t.kind {
        Kind::Ident => BLOCK_SYNC_WORDS.contains(&t.text(src)),
        Kind::Preproc => {
            let (d, us) = directive_tokens(t.text(src));
            us.iter().any(|u| u.kind == Kind::Ident && BLOCK_SYNC_WORDS.contains(&u.text(d)))
        }
        // Inline PTX: bar.sync / barrier.sync / bar.red.
        Kind::Str => {
            let s = t.text(src);
            s.contains("bar.") || s.contains("barrier")
        }
        _ => false,
    })
}

/// Refuses what cannot be preempted and names reserved for the transformation.
fn check_source(src: &str, toks: &[Token]) -> Result<(), TransformError> {
    let check_ident = |text: &str, at: usize| -> Result<(), TransformError> {
        if let Some((what, why)) = FORBIDDEN.iter().find(|(w, _)| *w == text) {
            return Err(TransformError::Unsupported { line: line_of(src, at), what: what.to_string(), why });
        }
        if text.starts_with("gmx_") {
            return Err(TransformError::Reserved { line: line_of(src, at), ident: text.to_string() });
        }
        Ok(())
    };
    for (i, t) in toks.iter().enumerate() {
        match t.kind {
            Kind::Ident => check_ident(t.text(src), t.start)?,
            Kind::Preproc => {
                let (d, us) = directive_tokens(t.text(src));
                for u in us.iter().filter(|u| u.kind == Kind::Ident) {
                    check_ident(u.text(d), t.start)?;
                    if u.text(d) == "__global__" {
                        return Err(TransformError::Parse {
                            line: line_of(src, t.start),
                            msg: "a macro that expands to `__global__` hides the kernel from the transformation; write the kernel out".into(),
                        });
                    }
                }
            }
            Kind::Str => {
                let s = t.text(src);
                if s.contains("%ctaid") || s.contains("%nctaid") {
                    return Err(TransformError::Unsupported {
                        line: line_of(src, t.start),
                        what: "inline PTX reading %ctaid/%nctaid".into(),
                        why: "the block index is replaced in C++, which inline assembly bypasses",
                    });
                }
            }
            Kind::Punct if t.text(src) == "<" => {
                let next = |k: usize| toks.get(i + k).map(|u| u.text(src));
                if next(1) == Some("<") && next(2) == Some("<") {
                    return Err(TransformError::Unsupported {
                        line: line_of(src, t.start),
                        what: "<<<...>>> launch in device code".into(),
                        why: "dynamic parallelism: child grids cannot be retreated with their parent",
                    });
                }
            }
            _ => {}
        }
    }
    Ok(())
}

struct Found {
    info: KernelInfo,
    /// Token range of the whole declaration [start, end).
    start: usize,
    end: usize,
    /// Token index where the name is.
    name_tok: usize,
    /// Tokens of the parameter list, parentheses excluded.
    params: (usize, usize),
    /// Brace tokens `{` and `}` of the body, if defined.
    body: Option<(usize, usize)>,
    /// Template parameter names, for calling the body.
    targs: Vec<String>,
    /// Unnamed parameters: (index in params, generated name).
    unnamed: Vec<(usize, String)>,
    /// An explicit instantiation; `name_tok` is then its `(`.
    explicit: bool,
}

/// Index into `sig` of the token matching the opener at `sig[k]`.
fn matching(src: &str, toks: &[Token], sig: &[usize], k: usize) -> Option<usize> {
    let open = toks[sig[k]].text(src);
    let close = match open {
        "(" => ")",
        "{" => "}",
        "[" => "]",
        "<" => ">",
        _ => return None,
    };
    let mut depth = 0i32;
    for (j, &ti) in sig.iter().enumerate().skip(k) {
        let t = toks[ti].text(src);
        if t == open {
            depth += 1;
        } else if t == close {
            depth -= 1;
            if depth == 0 {
                return Some(j);
            }
        } else if open == "<" && (t == ";" || t == "{") {
            return None;
        }
    }
    None
}

fn find_kernels(src: &str, toks: &[Token], sig: &[usize]) -> Result<Vec<Found>, TransformError> {
    let mut found = Vec::new();
    // Braces opened by `extern "C" {` give C linkage to what they hold.
    let mut brace_c: Vec<bool> = Vec::new();
    let mut k = 0;
    while k < sig.len() {
        let t = &toks[sig[k]];
        let text = t.text(src);
        if text == "{" {
            let is_c = k >= 2 && toks[sig[k - 1]].text(src) == "\"C\"" && toks[sig[k - 2]].text(src) == "extern";
            brace_c.push(is_c);
        } else if text == "}" {
            brace_c.pop();
        }
        if !(t.kind == Kind::Ident && text == "__global__") {
            k += 1;
            continue;
        }
        let perr = |msg: &str| TransformError::Parse { line: line_of(src, t.start), msg: msg.to_string() };
        // Start of the declaration: after the previous `;`, `{`, `}` or directive.
        let mut s = k;
        while s > 0 {
            let p = &toks[sig[s - 1]];
            if p.kind == Kind::Preproc || matches!(p.text(src), ";" | "{" | "}") {
                break;
            }
            s -= 1;
        }
        // Explicit instantiation `template __global__ void k<float>(float*);`:
        // only the worker's two extra parameters need adding.
        let explicit =
            toks[sig[s]].text(src) == "template" && sig.get(s + 1).is_some_and(|&q| toks[q].text(src) != "<");
        if explicit {
            let mut j = k + 1;
            while sig.get(j).is_some_and(|&q| toks[q].text(src) != "(") {
                j += 1;
            }
            if j >= sig.len() {
                return Err(perr("no parameter list in the explicit instantiation"));
            }
            let close = matching(src, toks, sig, j).ok_or_else(|| perr("unbalanced parentheses"))?;
            let name = (k + 1..j)
                .map(|q| toks[sig[q]].text(src))
                .find(|w| w.chars().next().is_some_and(|c| c == '_' || c.is_ascii_alphabetic()) && *w != "void");
            found.push(Found {
                info: KernelInfo {
                    name: name.unwrap_or("").to_string(),
                    params: Vec::new(),
                    param_types: Vec::new(),
                    extern_c: false,
                    template: true,
                    launch_bounds: None,
                    defined: false,
                },
                start: sig[s],
                end: sig[close] + 1,
                name_tok: sig[j],
                params: (sig[j] + 1, sig[close]),
                body: None,
                targs: Vec::new(),
                unnamed: Vec::new(),
                explicit: true,
            });
            k = close + 1;
            continue;
        }
        // Name: the identifier before the first `(` that opens no attribute.
        let mut j = k + 1;
        let name_k = loop {
            let Some(&ti) = sig.get(j) else {
                return Err(perr("no parameter list after __global__"));
            };
            let tt = toks[ti].text(src);
            if tt == "(" {
                let prev = toks[sig[j - 1]].text(src);
                if ATTRIBUTES.contains(&prev) {
                    j = matching(src, toks, sig, j).ok_or_else(|| perr("unbalanced parentheses"))? + 1;
                    continue;
                }
                if toks[sig[j - 1]].kind != Kind::Ident || j - 1 == k {
                    return Err(perr("expected the kernel's name before its parameter list"));
                }
                break j - 1;
            }
            if tt == ";" || tt == "{" {
                return Err(perr("no parameter list after __global__"));
            }
            j += 1;
        };
        let name = toks[sig[name_k]].text(src).to_string();
        let popen = name_k + 1;
        let pclose =
            matching(src, toks, sig, popen).ok_or_else(|| perr("unbalanced parentheses in the parameter list"))?;
        let after = sig.get(pclose + 1).map(|&ti| toks[ti].text(src));
        let (body, end_k) = match after {
            Some("{") => {
                let close =
                    matching(src, toks, sig, pclose + 1).ok_or_else(|| perr("the kernel's body is not closed"))?;
                (Some((sig[pclose + 1], sig[close])), close)
            }
            Some(";") => (None, pclose + 1),
            _ => return Err(perr("expected `{` or `;` after the parameter list")),
        };

        // Prefix facts.
        let prefix: Vec<&str> = (s..name_k).map(|q| toks[sig[q]].text(src)).collect();
        let extern_c = brace_c.iter().any(|&c| c) || prefix.windows(2).any(|w| w == ["extern", "\"C\""]);
        let template = prefix.first() == Some(&"template");
        let mut targs = Vec::new();
        if template {
            let close = matching(src, toks, sig, s + 1).ok_or_else(|| perr("unbalanced template header"))?;
            for piece in split_commas(src, toks, sig, s + 2, close) {
                let words: Vec<&str> = piece.iter().map(|&q| toks[sig[q]].text(src)).collect();
                if words.contains(&"...") || words.windows(3).any(|w| w == [".", ".", "."]) {
                    return Err(perr("template parameter packs are not supported"));
                }
                let cut = words.iter().position(|w| *w == "=").unwrap_or(words.len());
                let name = words[..cut]
                    .iter()
                    .rev()
                    .find(|w| w.chars().next().is_some_and(|c| c == '_' || c.is_ascii_alphabetic()))
                    .ok_or_else(|| perr("unnamed template parameter"))?;
                targs.push(name.to_string());
            }
        }
        let launch_bounds = (s..name_k).find(|&q| toks[sig[q]].text(src) == "__launch_bounds__").and_then(|q| {
            let c = matching(src, toks, sig, q + 1)?;
            Some(src[toks[sig[q + 1]].end..toks[sig[c]].start].trim().to_string())
        });
        let mut params = Vec::new();
        let mut param_types = Vec::new();
        let mut unnamed = Vec::new();
        let pieces = split_commas(src, toks, sig, popen + 1, pclose);
        let only_void = pieces.len() == 1 && pieces[0].len() == 1 && toks[sig[pieces[0][0]]].text(src) == "void";
        if !only_void {
            for (pi, piece) in pieces.iter().enumerate() {
                let named = param_name(src, toks, sig, piece);
                // The type: the piece's words less the name (the last identifier named so).
                let name_at = named.as_ref().and_then(|n| piece.iter().rposition(|&q| toks[sig[q]].text(src) == n));
                let words: Vec<&str> = piece
                    .iter()
                    .enumerate()
                    .filter(|&(i, _)| Some(i) != name_at)
                    .map(|(_, &q)| toks[sig[q]].text(src))
                    .collect();
                param_types.push(words.join(" "));
                match named {
                    Some(n) => params.push(n),
                    None => {
                        let g = format!("gmx_arg{pi}");
                        unnamed.push((pi, g.clone()));
                        params.push(g);
                    }
                }
            }
        }
        found.push(Found {
            info: KernelInfo { name, params, param_types, extern_c, template, launch_bounds, defined: body.is_some() },
            start: sig[s],
            end: sig[end_k] + 1,
            name_tok: sig[name_k],
            params: (sig[popen] + 1, sig[pclose]),
            body,
            targs,
            unnamed,
            explicit: false,
        });
        k = end_k + 1;
    }
    Ok(found)
}

/// Splits sig[from..to] at top-level commas into lists of sig indices.
fn split_commas(src: &str, toks: &[Token], sig: &[usize], from: usize, to: usize) -> Vec<Vec<usize>> {
    let mut out = vec![Vec::new()];
    let mut depth = 0i32;
    for q in from..to {
        let t = toks[sig[q]].text(src);
        match t {
            "(" | "[" | "{" | "<" => depth += 1,
            ")" | "]" | "}" | ">" => depth -= 1,
            "," if depth == 0 => {
                out.push(Vec::new());
                continue;
            }
            _ => {}
        }
        if let Some(last) = out.last_mut() {
            last.push(q);
        }
    }
    if out.len() == 1 && out[0].is_empty() {
        out.clear();
    }
    out
}

fn param_name(src: &str, toks: &[Token], sig: &[usize], piece: &[usize]) -> Option<String> {
    // Drop trailing array bounds: `float a[4]`.
    let mut end = piece.len();
    while end > 0 && toks[sig[piece[end - 1]]].text(src) == "]" {
        let mut depth = 0;
        while end > 0 {
            end -= 1;
            match toks[sig[piece[end]]].text(src) {
                "]" => depth += 1,
                "[" => {
                    depth -= 1;
                    if depth == 0 {
                        break;
                    }
                }
                _ => {}
            }
        }
    }
    if end < 2 {
        return None;
    }
    let last = &toks[sig[piece[end - 1]]];
    let word = last.text(src);
    (last.kind == Kind::Ident && !TYPE_WORDS.contains(&word)).then(|| word.to_string())
}

/// Copies tokens [from, to) with the block-index names renamed.
fn copy_renamed(src: &str, toks: &[Token], from: usize, to: usize, out: &mut String) {
    for t in &toks[from..to] {
        push_renamed(src, t, out);
    }
}

fn push_renamed(src: &str, t: &Token, out: &mut String) {
    let text = t.text(src);
    match t.kind {
        Kind::Ident => out.push_str(RENAMES.iter().find(|(f, _)| *f == text).map_or(text, |(_, to)| to)),
        Kind::Preproc => {
            let (body, us) = directive_tokens(text);
            out.push('#');
            for u in us {
                let ut = u.text(body);
                if u.kind == Kind::Ident {
                    out.push_str(RENAMES.iter().find(|(f, _)| *f == ut).map_or(ut, |(_, to)| to));
                } else {
                    out.push_str(ut);
                }
            }
        }
        _ => out.push_str(text),
    }
}

/// The parameter list's text with generated names for unnamed parameters.
fn params_text(src: &str, toks: &[Token], k: &Found) -> String {
    let (a, b) = k.params;
    let mut out = String::new();
    let mut piece = 0;
    let mut depth = 0i32;
    for t in &toks[a..b] {
        let text = t.text(src);
        match text {
            "(" | "[" | "{" | "<" => depth += 1,
            ")" | "]" | "}" | ">" => depth -= 1,
            "," if depth == 0 && t.kind == Kind::Punct => {
                if let Some((_, g)) = k.unnamed.iter().find(|(p, _)| *p == piece) {
                    let _ = write!(out, " {g}");
                }
                piece += 1;
            }
            _ => {}
        }
        push_renamed(src, t, &mut out);
    }
    if let Some((_, g)) = k.unnamed.iter().find(|(p, _)| *p == piece) {
        let _ = write!(out, " {g}");
    }
    let trimmed = out.trim();
    if trimmed.is_empty() || trimmed == "void" {
        String::new()
    } else {
        out
    }
}

fn emit_kernel(src: &str, toks: &[Token], k: &Found, shared_index: bool, block_sync: bool, out: &mut String) {
    if k.explicit {
        let (a, b) = k.params;
        copy_renamed(src, toks, k.start, b, out);
        let empty = toks[a..b].iter().all(|t| !t.significant() || t.text(src) == "void");
        out.push_str(if empty { "gmx_ctl_t*, const gmx_launch_t" } else { ", gmx_ctl_t*, const gmx_launch_t" });
        copy_renamed(src, toks, b, k.end, out);
        return;
    }
    let params = params_text(src, toks, k);
    let comma = if params.trim().is_empty() { "" } else { ", " };
    let name = &k.info.name;
    // Prefix tokens before the name (template header, linkage, attributes, return type).
    let prefix = &toks[k.start..k.name_tok];

    if let Some((open, close)) = k.body {
        // 1. The body as a device function: no __global__, linkage or launch bounds.
        let mut skip_parens_after = false;
        let mut depth = 0i32;
        let mut drop_string_after_extern = false;
        for t in prefix {
            let text = t.text(src);
            if depth > 0 {
                match text {
                    "(" => depth += 1,
                    ")" => depth -= 1,
                    _ => {}
                }
                continue;
            }
            if skip_parens_after && t.significant() {
                skip_parens_after = false;
                if text == "(" {
                    depth = 1;
                    continue;
                }
            }
            if drop_string_after_extern && t.significant() {
                drop_string_after_extern = false;
                if t.kind == Kind::Str {
                    continue;
                }
            }
            match text {
                "__global__" => out.push_str("__device__ __forceinline__"),
                "extern" => drop_string_after_extern = true,
                "__launch_bounds__" | "__maxnreg__" => skip_parens_after = true,
                _ => push_renamed(src, t, out),
            }
        }
        let _ = write!(out, "{name}{BODY_SUFFIX}({params}{comma}const uint3 gmx_blockIdx, const uint3 gmx_gridDim)");
        copy_renamed(src, toks, open, close + 1, out);
        out.push('\n');
    }

    // 2. The worker, under the kernel's own name and attributes.
    copy_renamed(src, toks, k.start, k.name_tok, out);
    let _ = write!(out, "{name}({params}{comma}gmx_ctl_t* __restrict__ gmx_ctl, const gmx_launch_t gmx_launch)");
    if k.body.is_none() {
        out.push(';');
        return;
    }
    let targs = if k.targs.is_empty() { String::new() } else { format!("<{}>", k.targs.join(", ")) };
    let args: String = k.info.params.iter().map(|p| format!("{p}, ")).collect();
    let call = format!("{name}{BODY_SUFFIX}{targs}({args}gmx_b, gmx_launch.grid);");
    let (set_grid, per_block) = if shared_index {
        (
            "gmx_gridDim = gmx_launch.grid;",
            format!("__syncthreads();\n                if (gmx_leader) gmx_blockIdx = gmx_b;\n                __syncthreads();\n                {call}"),
        )
    } else if block_sync {
        ("", format!("if (gmx_i != 0u) __syncthreads();\n                {call}"))
    } else {
        // No block barrier and no shared memory anywhere in the source: the
        // warps of a worker may run ahead into the next block of the chunk, as
        // natively blocks run concurrently. Re-converging the warp keeps
        // warp-synchronous intrinsics (shuffles, votes) within one block.
        ("", format!("if (gmx_i != 0u) __syncwarp();\n                {call}"))
    };
    let _ = write!(
        out,
        r#" {{
    // gpumux worker: see gpumux-cuda/src/transform.rs
    // 16-byte aligned and a multiple of 16 bytes: the body's shared arrays keep
    // the alignment they have natively (else ptxas cannot use LDS.128).
    __shared__ __align__(16) unsigned int gmx_slot[2][2];
    __shared__ __align__(16) unsigned int gmx_go[4];
    const bool gmx_leader = (threadIdx.x | threadIdx.y | threadIdx.z) == 0u;
    if (gmx_leader) {{
        gmx_go[0] = gmx_enter(gmx_ctl, gmx_launch, gmx_go);
        {set_grid}
    }}
    __syncthreads();
    if (gmx_go[0] != 0u) {{
        // Two claim slots alternate, so one barrier per chunk is enough: the
        // leader writes slot p^1 only after everyone passed the barrier that
        // followed their last read of it. Keep this loop as it is: small
        // changes around the body change how ptxas schedules it (moving the
        // claim to the bottom, or breaking out after a claim that reached the
        // end, cost nbody's inner loop 5%: docs/benchmarks.md).
        for (unsigned int gmx_p = 0u;; gmx_p ^= 1u) {{
            if (gmx_leader) gmx_claim(gmx_ctl, gmx_launch, gmx_slot[gmx_p], gmx_go);
            __syncthreads();
            const unsigned int gmx_first = gmx_slot[gmx_p][0];
            const unsigned int gmx_count = gmx_slot[gmx_p][1];
            if (gmx_count == 0u) break;
            for (unsigned int gmx_i = 0u; gmx_i < gmx_count; ++gmx_i) {{
                const uint3 gmx_b = gmx_unlinear(gmx_first + gmx_i, gmx_launch.grid);
                {per_block}
            }}

        }}
    }}
    if (gmx_leader) gmx_leave(gmx_ctl, gmx_launch, gridDim.x * gridDim.y * gridDim.z, gmx_go);
}}"#
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn barrier_between_blocks_only_where_the_source_synchronises() {
        let free = transform("__global__ void f(float* y, int n) { int i = blockIdx.x * blockDim.x + threadIdx.x; if (i < n) y[i] = __shfl_sync(0xffffffffu, y[i], 0); }").expect("transforms");
        assert!(!free.needs_block_barrier);
        assert!(free.source.contains("if (gmx_i != 0u) __syncwarp();"));
        assert!(!free.source.contains("if (gmx_i != 0u) __syncthreads();"));
        for src in [
            "__global__ void f(float* y) { __shared__ float s[32]; s[threadIdx.x] = 1; y[0] = s[0]; }",
            "__device__ void h() { __syncthreads(); }\n__global__ void f(float* y) { h(); }",
            "#define SYNC __syncthreads()\n__global__ void f(float* y) { SYNC; }",
            "__global__ void f(float* y) { asm volatile(\"bar.sync 0;\"); }",
            "__global__ void f(float* y) { extern __shared__ float d[]; d[0] = 1; }",
        ] {
            let t = transform(src).expect("transforms");
            assert!(t.needs_block_barrier, "{src}");
            assert!(t.source.contains("if (gmx_i != 0u) __syncthreads();"), "{src}");
        }
        // A comment or a string naming the barrier does not count.
        let c = transform(
            "// __syncthreads()\n__global__ void f(float* y) { const char* s = \"__shared__\"; y[0] = s[0]; }",
        )
        .expect("transforms");
        assert!(!c.needs_block_barrier);
    }

    const SIMPLE: &str = r#"
extern "C" __global__ void __launch_bounds__(256) scale(float* __restrict__ y, const float* x, float a, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x; // blockIdx in a comment
    if (i >= n) return;
    y[i] = a * x[i];
}
"#;

    #[test]
    fn simple_kernel_gets_a_body_and_a_worker() {
        let t = transform(SIMPLE).expect("transform");
        assert_eq!(t.kernels.len(), 1);
        let k = &t.kernels[0];
        assert_eq!(k.name, "scale");
        assert_eq!(k.params, vec!["y", "x", "a", "n"]);
        assert!(k.extern_c && !k.template && k.defined);
        assert_eq!(k.launch_bounds.as_deref(), Some("256"));
        assert!(!t.helpers_read_index);
        let s = &t.source;
        assert!(s.contains("__device__ __forceinline__ void  scale__gmx_body(float* __restrict__ y, const float* x, float a, int n, const uint3 gmx_blockIdx, const uint3 gmx_gridDim)"));
        assert!(s.contains("int i = gmx_blockIdx.x * blockDim.x"));
        assert!(s.contains("// blockIdx in a comment"), "comments are left alone");
        assert!(s.contains("extern \"C\" __global__ void __launch_bounds__(256) scale(float* __restrict__ y, const float* x, float a, int n, gmx_ctl_t* __restrict__ gmx_ctl, const gmx_launch_t gmx_launch)"));
        assert!(s.contains("scale__gmx_body(y, x, a, n, gmx_b, gmx_launch.grid);"));
        // The body function keeps neither the linkage nor the launch bounds.
        let body_decl = s.lines().find(|l| l.contains("scale__gmx_body(float")).expect("body line");
        assert!(!body_decl.contains("extern") && !body_decl.contains("__launch_bounds__"));
    }

    #[test]
    fn helpers_reading_block_index_switch_on_shared_copies() {
        let src = "__device__ int row() { return blockIdx.y * 16; }\n#define COL (blockIdx.x)\nextern \"C\" __global__ void k(int* o) { o[row() + COL] = gridDim.x; }";
        let t = transform(src).expect("transform");
        assert!(t.helpers_read_index);
        assert!(t.source.contains("static __shared__ __align__(16) uint3 gmx_blockIdx;"));
        assert!(t.source.contains("return gmx_blockIdx.y * 16;"));
        assert!(t.source.contains("#define COL (gmx_blockIdx.x)"));
        assert!(t.source.contains("if (gmx_leader) gmx_blockIdx = gmx_b;"));
    }

    #[test]
    fn strings_and_identifiers_containing_the_names_are_untouched() {
        let src = "extern \"C\" __global__ void k(int* myblockIdx, int gridDims) { const char* s = \"blockIdx\"; myblockIdx[0] = gridDims + (s != 0); }";
        let t = transform(src).expect("transform");
        assert!(t.source.contains("\"blockIdx\""));
        assert!(t.source.contains("int* myblockIdx, int gridDims"));
    }

    #[test]
    fn templates_forward_their_parameters() {
        let src = "template <typename T, int N = 4>\n__global__ void fill(T* p, T v) { p[blockIdx.x * N] = v; }\nextern \"C\" __global__ void fill_f(float* p, float v) { p[blockIdx.x] = v; }";
        let t = transform(src).expect("transform");
        assert!(t.kernels[0].template && !t.kernels[0].extern_c);
        assert!(t
            .source
            .contains("template <typename T, int N = 4>\n__device__ __forceinline__ void fill__gmx_body(T* p, T v,"));
        assert!(t.source.contains("fill__gmx_body<T, N>(p, v, gmx_b, gmx_launch.grid);"));
        assert!(t.kernels[1].extern_c);
    }

    #[test]
    fn explicit_instantiations_get_the_extra_parameters() {
        let src = "template <typename T> __global__ void tk(T* p) { p[blockIdx.x] = T(); }\ntemplate __global__ void tk<float>(float*);";
        let t = transform(src).expect("transform");
        assert!(t.source.contains("template __global__ void tk<float>(float*, gmx_ctl_t*, const gmx_launch_t);"));
    }

    #[test]
    fn extern_c_block_gives_linkage_and_unnamed_params_get_names() {
        let src = "extern \"C\" {\n__global__ void k(float*, int n) { }\n}";
        let t = transform(src).expect("transform");
        assert!(t.kernels[0].extern_c);
        assert_eq!(t.kernels[0].params, vec!["gmx_arg0", "n"]);
        assert_eq!(t.kernels[0].param_types, vec!["float *", "int"]);
        assert!(t.source.contains("void k__gmx_body(float* gmx_arg0, int n,"));
    }

    #[test]
    fn void_and_empty_parameter_lists() {
        let t = transform("extern \"C\" __global__ void a(void) {}\nextern \"C\" __global__ void b() {}")
            .expect("transform");
        assert!(t.source.contains("void a__gmx_body(const uint3 gmx_blockIdx"));
        assert!(t.source.contains("a(gmx_ctl_t* __restrict__ gmx_ctl"));
        assert!(t.source.contains("a__gmx_body(gmx_b, gmx_launch.grid);"));
    }

    #[test]
    fn declarations_get_the_worker_signature() {
        let t =
            transform("extern \"C\" __global__ void k(int* p);\nextern \"C\" __global__ void k(int* p) { p[0] = 1; }")
                .expect("transform");
        assert!(!t.kernels[0].defined && t.kernels[1].defined);
        assert!(t.source.contains("k(int* p, gmx_ctl_t* __restrict__ gmx_ctl, const gmx_launch_t gmx_launch);"));
    }

    #[test]
    fn refuses_what_cannot_be_preempted() {
        let cases = [
            "#include <cooperative_groups.h>\n__global__ void k() { cooperative_groups::this_grid().sync(); }",
            "__global__ void c() {}\n__global__ void k() { c<<<1, 1>>>(); }",
            "__global__ void __cluster_dims__(2,1,1) k() {}",
            "__global__ void k(int* p) { asm(\"mov.u32 %0, %ctaid.x;\" : \"=r\"(p[0])); }",
        ];
        for c in cases {
            assert!(matches!(transform(c), Err(TransformError::Unsupported { .. })), "{c}");
        }
        assert!(matches!(transform("__global__ void k(int gmx_x) {}"), Err(TransformError::Reserved { .. })));
        assert!(matches!(transform("#define K __global__ void\nK k() {}"), Err(TransformError::Parse { .. })));
    }

    #[test]
    fn forbidden_words_in_comments_or_strings_are_fine() {
        let src =
            "// uses no this_grid()\nextern \"C\" __global__ void k(int* p) { const char* s = \"<<<\"; p[0] = s[0]; }";
        assert!(transform(src).is_ok());
    }

    #[test]
    fn errors_name_the_line() {
        let e = transform("\n\n__global__ void k() { grid_group g; }").expect_err("refused");
        assert!(e.to_string().starts_with("line 3:"), "{e}");
    }
}
