//! Can a kernel's writes be merged after a split? What the source shows,
//! without a compiler (GPU-SPARC splits kernels whose buffers it replicates
//! and merges; Mekong proves writes injective with isl; this is a lexical
//! check that refuses what it sees cannot merge and says why).
//!
//! A split runs disjoint block ranges on different GPUs, each on its own copy
//! of every buffer; the merge then takes each word from the GPU that wrote it.
//! That is correct when each word of global memory is written by the blocks of
//! one GPU only. What breaks it, and is refused here with its line:
//!
//! * **atomics on global memory** (`atomicAdd(&hist[b], ..)`): every GPU adds
//!   into its own copy, and a merge that takes one copy's word loses the
//!   others' additions. Atomics on `__shared__` memory are block-private: fine.
//! * **a store whose index does not depend on the block index** (`out[0] = s`,
//!   `hist[threadIdx.x] = ..`): every block writes the same words, so blocks on
//!   two GPUs write the same word.
//! * **a store whose index is read from memory** (`level[cols[k]] = ..`): which
//!   words a block writes depends on data, so two GPUs' blocks may write the
//!   same word.
//! * **a store through a pointer that is not a kernel parameter** (one loaded
//!   from memory, a `__device__` variable, a pointer of unknown origin): its
//!   target cannot be followed.
//! * **a file-scope `__device__` variable written**, **inline PTX that stores or
//!   does atomics**, **an output handed to a helper function that writes
//!   through it** (helpers' stores are not followed), **an atomic in a helper
//!   on memory not known to be shared**.
//!
//! What passes is not proven disjoint (`out[blockIdx.x / 2]` passes and
//! overlaps): the check finds the usual ways to break the merge, and the
//! caller may declare a kernel splittable where it knows better
//! ([`super::Splittable::Declared`]). The GPU check compares every split
//! bitwise with a one-GPU run.

use crate::lex::{lex, Kind, Token};
use crate::source_check::param_size;

/// One reason a kernel's writes cannot be merged.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Refusal {
    /// The source line (1-based).
    pub line: usize,
    /// What was found and why it cannot merge.
    pub reason: String,
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "line {}: {}", self.line, self.reason)
    }
}

/// What the kernel does with one parameter.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ParamUse {
    /// Its name.
    pub name: String,
    /// A pointer (or array) parameter: a buffer.
    pub pointer: bool,
    /// The kernel stores through it (directly or through a pointer made from it).
    pub written: bool,
    /// The kernel may read what it points to: every use of it but a plain
    /// store `p[i] = ..` counts (a compound `p[i] += ..`, a pointer made
    /// from it, a call it is handed to), so `false` means a buffer the
    /// kernel only writes, whose prior contents its results cannot depend on.
    pub read: bool,
    /// Bytes of the element it points to, where the type fixes it (`float*`: 4).
    pub element_bytes: Option<u32>,
}

/// The analysis of one kernel.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WriteAnalysis {
    /// The kernel's name.
    pub kernel: String,
    /// Its parameters, in order.
    pub params: Vec<ParamUse>,
    /// Why its writes cannot be merged (empty: nothing found).
    pub refusals: Vec<Refusal>,
}

impl WriteAnalysis {
    /// Nothing found that would break the merge.
    pub fn splittable(&self) -> bool {
        self.refusals.is_empty()
    }
}

/// A function definition found in the source.
struct Func {
    name: String,
    kernel: bool,
    params: Vec<(String, String)>,
    /// Indices into the significant tokens: the body's `{` and `}`.
    body: (usize, usize),
}

/// The source as significant tokens, with helpers to read it.
struct Src<'a> {
    src: &'a str,
    toks: Vec<Token>,
}

impl<'a> Src<'a> {
    fn text(&self, k: usize) -> &'a str {
        self.toks.get(k).map_or("", |t| t.text(self.src))
    }
    fn is_ident(&self, k: usize) -> bool {
        self.toks.get(k).is_some_and(|t| t.kind == Kind::Ident)
    }
    fn line(&self, k: usize) -> usize {
        let at = self.toks.get(k).map_or(self.src.len(), |t| t.start);
        self.src[..at].bytes().filter(|&b| b == b'\n').count() + 1
    }
    /// The index of the bracket closing the one at `k` (`(`, `[`, `{`).
    fn close(&self, k: usize) -> Option<usize> {
        let (open, close) = match self.text(k) {
            "(" => ("(", ")"),
            "[" => ("[", "]"),
            "{" => ("{", "}"),
            _ => return None,
        };
        let mut depth = 0i32;
        for j in k..self.toks.len() {
            let t = self.text(j);
            if t == open {
                depth += 1;
            } else if t == close {
                depth -= 1;
                if depth == 0 {
                    return Some(j);
                }
            }
        }
        None
    }
    /// The index of the bracket opening the one at `k` (`)`, `]`, `}`).
    fn open(&self, k: usize) -> Option<usize> {
        let (open, close) = match self.text(k) {
            ")" => ("(", ")"),
            "]" => ("[", "]"),
            "}" => ("{", "}"),
            _ => return None,
        };
        let mut depth = 0i32;
        for j in (0..=k).rev() {
            let t = self.text(j);
            if t == close {
                depth += 1;
            } else if t == open {
                depth -= 1;
                if depth == 0 {
                    return Some(j);
                }
            }
        }
        None
    }
    /// The end (exclusive) of the expression starting at `k`: the first `;`
    /// or `,` at its own depth, or the bracket that closes an enclosing one.
    fn expr_end(&self, k: usize, limit: usize) -> usize {
        let mut depth = 0i32;
        let mut j = k;
        while j < limit {
            match self.text(j) {
                "(" | "[" | "{" => depth += 1,
                ")" | "]" | "}" => {
                    if depth == 0 {
                        return j;
                    }
                    depth -= 1;
                }
                ";" | "," if depth == 0 => return j,
                _ => {}
            }
            j += 1;
        }
        limit
    }
    /// Identifiers in `[from, to)`, with whether each is directly followed by `[`.
    fn idents(&self, from: usize, to: usize) -> Vec<(&'a str, bool)> {
        (from..to).filter(|&j| self.is_ident(j)).map(|j| (self.text(j), self.text(j + 1) == "[")).collect()
    }
    fn joined(&self, from: usize, to: usize) -> String {
        (from..to).map(|j| self.text(j)).collect::<Vec<_>>().join(" ")
    }
}

/// Attributes written `name(args)` between `__global__`/`__device__` and the name.
const ATTRIBUTES: &[&str] =
    &["__launch_bounds__", "__maxnreg__", "__attribute__", "__declspec", "alignas", "__align__", "__noinline__"];

/// Finds every `__global__` and `__device__` function with a body.
fn functions(s: &Src) -> Vec<Func> {
    let mut out = Vec::new();
    let n = s.toks.len();
    let mut k = 0;
    while k < n {
        let w = s.text(k);
        if !(s.is_ident(k) && (w == "__global__" || w == "__device__")) {
            k += 1;
            continue;
        }
        let kernel = w == "__global__";
        // The name: the identifier before the first `(` that opens no attribute.
        let mut j = k + 1;
        let mut name_at = None;
        while j < n {
            match s.text(j) {
                "(" if ATTRIBUTES.contains(&s.text(j - 1)) => j = s.close(j).unwrap_or(n),
                "(" => {
                    if s.is_ident(j - 1) && j - 1 > k {
                        name_at = Some(j - 1);
                    }
                    break;
                }
                ";" | "{" | "=" => break,
                _ => {}
            }
            j += 1;
        }
        let Some(name_at) = name_at else {
            k += 1;
            continue;
        };
        let Some(pclose) = s.close(name_at + 1) else { break };
        // Qualifiers (`const`, `noexcept`) may sit before the body.
        let mut b = pclose + 1;
        while b < n && s.is_ident(b) {
            b += 1;
        }
        if s.text(b) != "{" {
            k = pclose + 1;
            continue;
        }
        let Some(bclose) = s.close(b) else { break };
        let mut params = Vec::new();
        let mut p = name_at + 2;
        while p < pclose {
            let e = s.expr_end(p, pclose);
            let words: Vec<&str> = (p..e).map(|q| s.text(q)).collect();
            if let Some(at) = (p..e).rev().find(|&q| s.is_ident(q)) {
                let ty: Vec<&str> = (p..e).filter(|&q| q != at).map(|q| s.text(q)).collect();
                if words != ["void"] {
                    params.push((s.text(at).to_string(), ty.join(" ")));
                }
            }
            p = e + 1;
        }
        out.push(Func { name: s.text(name_at).to_string(), kernel, params, body: (b, bclose) });
        k = bclose + 1;
    }
    out
}

/// Is the `=` at `k` an assignment (`=`, `+=`, `<<=`, ...), not `==`, `<=`, `!=`?
/// Returns the index of the assignment operator's first token.
fn assignment_at(s: &Src, k: usize) -> Option<usize> {
    if s.text(k) != "=" || s.text(k + 1) == "=" {
        return None;
    }
    let prev = s.text(k.wrapping_sub(1));
    match prev {
        "=" | "!" => None,
        "<" | ">" => {
            // `<<=` and `>>=` assign; `<=` and `>=` compare.
            (s.text(k.wrapping_sub(2)) == prev).then(|| k - 2)
        }
        "+" | "-" | "*" | "/" | "%" | "&" | "|" | "^" => Some(k - 1),
        _ => Some(k),
    }
}

/// The names a `#define` of the source gives to text that reads `blockIdx`.
fn block_macros(src: &str) -> Vec<String> {
    let mut out = Vec::new();
    for t in lex(src).iter().filter(|t| t.kind == Kind::Preproc) {
        let body = t.text(src).trim_start_matches('#');
        let toks: Vec<Token> = lex(body).into_iter().filter(|t| t.significant()).collect();
        let words: Vec<&str> = toks.iter().map(|t| t.text(body)).collect();
        if words.first() == Some(&"define") && words.len() > 2 && words[2..].contains(&"blockIdx") {
            out.push(words[1].to_string());
        }
    }
    out
}

/// File-scope `__device__` variables (a `__device__` declaration with no
/// parameter list) and `__shared__` ones.
fn file_scope_vars(s: &Src, funcs: &[Func]) -> (Vec<String>, Vec<String>) {
    let inside = |k: usize| funcs.iter().any(|f| f.body.0 <= k && k <= f.body.1);
    let (mut device, mut shared) = (Vec::new(), Vec::new());
    for k in 0..s.toks.len() {
        let w = s.text(k);
        if inside(k) || !(w == "__device__" || w == "__shared__" || w == "__constant__") {
            continue;
        }
        let end = (k..s.toks.len()).find(|&j| matches!(s.text(j), ";" | "(" | "{")).unwrap_or(s.toks.len());
        if s.text(end) == "(" {
            continue;
        }
        let name = (k..end).take_while(|&j| !matches!(s.text(j), "=" | "[")).filter(|&j| s.is_ident(j)).last();
        if let Some(name) = name {
            match w {
                "__shared__" => shared.push(s.text(name).to_string()),
                "__device__" => device.push(s.text(name).to_string()),
                _ => {}
            }
        }
    }
    (device, shared)
}

/// Analyses kernel `kernel` of `src` (module doc). `None` when the source
/// defines no kernel of that name.
pub fn analyse(src: &str, kernel: &str) -> Option<WriteAnalysis> {
    let s = Src { src, toks: lex(src).into_iter().filter(Token::significant).collect() };
    let funcs = functions(&s);
    let k = funcs.iter().find(|f| f.kernel && f.name == kernel)?;
    let (device_vars, mut shared) = file_scope_vars(&s, &funcs);

    // Functions and macros whose value depends on the block index, transitively.
    let mut block_names: Vec<String> = block_macros(src);
    block_names.push("blockIdx".into());
    loop {
        let before = block_names.len();
        for f in funcs.iter().filter(|f| !f.kernel) {
            if !block_names.contains(&f.name)
                && s.idents(f.body.0, f.body.1).iter().any(|(w, _)| block_names.iter().any(|b| b == w))
            {
                block_names.push(f.name.clone());
            }
        }
        if block_names.len() == before {
            break;
        }
    }

    let (b0, b1) = k.body;
    let pointers: Vec<&str> = k
        .params
        .iter()
        .filter(|(_, ty)| ty.split_whitespace().any(|w| w == "*" || w == "["))
        .map(|(n, _)| n.as_str())
        .collect();
    // Locals: __shared__ and plain arrays (block- or thread-private memory).
    let mut private: Vec<&str> = Vec::new();
    for j in b0..b1 {
        if s.text(j) == "__shared__" {
            let end = s.expr_end(j, b1);
            if let Some(n) = (j..end).take_while(|&q| !matches!(s.text(q), "=" | "[")).filter(|&q| s.is_ident(q)).last()
            {
                shared.push(s.text(n).to_string());
            }
        } else if s.is_ident(j)
            && s.text(j + 1) == "["
            && s.is_ident(j - 1)
            && !matches!(s.text(j - 1), "return" | "case" | "else" | "do" | "sizeof")
        {
            private.push(s.text(j));
            // More arrays declared in the same statement: `float a[4], b[4];`.
            let mut depth = 0i32;
            for q in j + 1..b1 {
                match s.text(q) {
                    "(" | "[" | "{" => depth += 1,
                    ")" | "]" | "}" => depth -= 1,
                    ";" if depth == 0 => break,
                    "," if depth == 0 && s.is_ident(q + 1) && s.text(q + 2) == "[" => private.push(s.text(q + 1)),
                    _ => {}
                }
                if depth < 0 {
                    break;
                }
            }
        }
    }
    let shared: Vec<&str> = shared.iter().map(String::as_str).collect();

    // Assignments to plain names: which carry the block index (B), a value read
    // from global memory (D), or a pointer into a parameter's buffer (A).
    let mut assigns: Vec<(&str, usize, usize)> = Vec::new();
    for j in b0..b1 {
        if let Some(op) = assignment_at(&s, j) {
            if s.is_ident(op.wrapping_sub(1)) {
                assigns.push((s.text(op - 1), j + 1, s.expr_end(j + 1, b1)));
            }
        }
    }
    // `for (T i = a; ...)` is covered: the lexer's `=` is the same.
    let mut block_vars: Vec<&str> = Vec::new();
    let mut data_vars: Vec<&str> = Vec::new();
    let mut aliases: Vec<(&str, &str)> = Vec::new();
    loop {
        let sizes = (block_vars.len(), data_vars.len(), aliases.len());
        for &(lhs, from, to) in &assigns {
            let ids = s.idents(from, to);
            let global = |w: &str| pointers.contains(&w) || aliases.iter().any(|(a, _)| *a == w);
            if !block_vars.contains(&lhs)
                && ids.iter().any(|(w, _)| block_names.iter().any(|b| b == w) || block_vars.contains(w))
            {
                block_vars.push(lhs);
            }
            if !data_vars.contains(&lhs)
                && ids.iter().any(|&(w, indexed)| (indexed && global(w)) || data_vars.contains(&w))
                && !shared.contains(&lhs)
            {
                data_vars.push(lhs);
            }
            if !aliases.iter().any(|(a, _)| *a == lhs) && !pointers.contains(&lhs) {
                if let Some(&(w, _)) = ids.iter().find(|&&(w, indexed)| !indexed && global(w)) {
                    let root = aliases.iter().find(|(a, _)| *a == w).map_or(w, |(_, r)| *r);
                    aliases.push((lhs, root));
                }
            }
        }
        if (block_vars.len(), data_vars.len(), aliases.len()) == sizes {
            break;
        }
    }
    let root_of = |w: &str| -> Option<&str> {
        if pointers.contains(&w) {
            Some(pointers[pointers.iter().position(|p| *p == w)?])
        } else {
            aliases.iter().find(|(a, _)| *a == w).map(|(_, r)| *r)
        }
    };
    let is_block = |w: &str| block_names.iter().any(|b| b == w) || block_vars.contains(&w);

    let mut refusals = Vec::new();
    let mut written: Vec<&str> = Vec::new();
    let mut refuse = |at: usize, reason: String| {
        let r = Refusal { line: s.line(at), reason };
        if !refusals.contains(&r) {
            refusals.push(r);
        }
    };

    let cx = StoreCtx {
        private: &private,
        shared: &shared,
        device_vars: &device_vars,
        data_vars: &data_vars,
        root_of: &root_of,
        is_block: &is_block,
    };
    // Stores: an assignment (or ++/--) whose left side is `X[...]...`, `(cast)(X)[...]`,
    // `*X`, `*(expr)`, or a plain name that is a file-scope __device__ variable.
    for j in b0..b1 {
        let (lhs_end, op_at) = if let Some(op) = assignment_at(&s, j) {
            (op, op)
        } else if (s.text(j) == "+" && s.text(j + 1) == "+") || (s.text(j) == "-" && s.text(j + 1) == "-") {
            // Postfix on an indexed lvalue: `X[i]++`.
            if s.text(j.wrapping_sub(1)) != "]" {
                continue;
            }
            (j, j)
        } else {
            continue;
        };
        // Walk back over `.member` selections.
        let mut end = lhs_end;
        while end >= 2 && s.is_ident(end - 1) && s.text(end - 2) == "." {
            end -= 2;
        }
        let last = end.wrapping_sub(1);
        if s.text(last) == "]" {
            // Every bracket group of the store: `t[a][b]`.
            let mut first = s.open(last).unwrap_or(last);
            while s.text(first.wrapping_sub(1)) == "]" {
                first = s.open(first - 1).unwrap_or(first - 1);
            }
            let index = (first, last);
            let base_end = first.wrapping_sub(1);
            let bases: Vec<&str> = if s.text(base_end) == ")" {
                // `reinterpret_cast<float4*>(acc)[i]`, `((float*)p)[i]`
                let o = s.open(base_end).unwrap_or(base_end);
                s.idents(o, base_end).into_iter().map(|(w, _)| w).collect()
            } else if s.is_ident(base_end) {
                vec![s.text(base_end)]
            } else {
                Vec::new()
            };
            classify_store(&s, op_at, &bases, index, &cx, &mut written, &mut refuse);
        } else if s.is_ident(last) && s.text(last.wrapping_sub(1)) == "*" && unary(&s, last - 1) {
            let w = s.text(last);
            store_through_pointer(op_at, &[(w, false)], w, &cx, &mut written, &mut refuse);
        } else if s.text(last) == ")" {
            let o = s.open(last).unwrap_or(last);
            if s.text(o.wrapping_sub(1)) == "*" && unary(&s, o - 1) {
                let ids = s.idents(o, last);
                let text = s.joined(o, last + 1);
                store_through_pointer(op_at, &ids, &text, &cx, &mut written, &mut refuse);
            }
        } else if s.is_ident(last) && device_vars.iter().any(|v| v == s.text(last)) {
            refuse(
                op_at,
                format!("writes the file-scope __device__ variable `{}`: every GPU writes its own copy", s.text(last)),
            );
        }
    }

    // Atomics: on shared memory they are block-private; anywhere else they are refused.
    let helpers_called = called_helpers(&s, &funcs, k);
    for j in b0..b1 {
        let w = s.text(j);
        if s.is_ident(j) && (w.starts_with("atomic") || w.starts_with("__atomic")) && s.text(j + 1) == "(" {
            let arg_end = s.expr_end(j + 2, s.close(j + 1).unwrap_or(b1));
            let ids: Vec<&str> = s.idents(j + 2, arg_end).into_iter().map(|(w, _)| w).collect();
            if let Some(g) =
                ids.iter().find_map(|w| root_of(w).or_else(|| device_vars.iter().find(|v| v == w).map(String::as_str)))
            {
                refuse(
                    j,
                    format!(
                        "{w} on global memory (`{g}`): each GPU would apply it to its own copy, and a merge that takes one copy's word loses the other GPUs' updates"
                    ),
                );
            } else if !ids.iter().any(|w| shared.contains(w)) {
                refuse(j, format!("{w} on memory not known to be __shared__ (`{}`)", s.joined(j + 2, arg_end)));
            }
        } else if s.is_ident(j) && matches!(w, "atomic_ref" | "atomic") {
            refuse(j, format!("`{w}`: atomics on memory the source does not show to be shared"));
        } else if s.is_ident(j) && matches!(w, "asm" | "__asm__" | "__asm") {
            let open = (j + 1..b1).find(|&q| s.text(q) == "(");
            if let Some(o) = open {
                let c = s.close(o).unwrap_or(b1);
                let ptx: String = (o..c).filter(|&q| s.toks[q].kind == Kind::Str).map(|q| s.text(q)).collect();
                if ["st.", "atom.", "red.", "st.global", "cp."].iter().any(|p| ptx.contains(p)) {
                    refuse(j, "inline PTX that stores or does atomics: its targets cannot be followed".into());
                }
            }
        } else if s.is_ident(j) && s.text(j + 1) == "(" {
            // An output handed to a helper that stores through that parameter.
            if let Some(f) = funcs.iter().find(|f| !f.kernel && f.name == w) {
                let c = s.close(j + 1).unwrap_or(b1);
                let mut p = j + 2;
                let mut i = 0;
                while p < c {
                    let e = s.expr_end(p, c);
                    let ids: Vec<&str> = s.idents(p, e).into_iter().map(|(w, _)| w).collect();
                    if let Some(g) = ids.iter().find_map(|w| root_of(w)) {
                        if f.params.get(i).is_some_and(|(pn, _)| helper_stores_through(&s, f, pn)) {
                            refuse(
                                j,
                                format!(
                                    "passes `{g}` to `{w}`, which stores through that parameter (stores in helper functions are not followed)"
                                ),
                            );
                            written.push(g);
                        }
                    }
                    p = e + 1;
                    i += 1;
                }
            }
        }
    }
    // Helpers the kernel calls: atomics on non-shared memory and writes to
    // __device__ variables there are refused too.
    for f in helpers_called {
        for j in f.body.0..f.body.1 {
            let w = s.text(j);
            if s.is_ident(j) && (w.starts_with("atomic") || w.starts_with("__atomic")) && s.text(j + 1) == "(" {
                let arg_end = s.expr_end(j + 2, s.close(j + 1).unwrap_or(f.body.1));
                let ids = s.idents(j + 2, arg_end);
                if !ids.iter().any(|(w, _)| shared.contains(w)) {
                    refuse(j, format!("{w} in helper `{}` on memory not known to be __shared__", f.name));
                }
            }
            if let Some(op) = assignment_at(&s, j) {
                if s.is_ident(op.wrapping_sub(1)) && device_vars.iter().any(|v| v == s.text(op - 1)) {
                    refuse(
                        j,
                        format!("helper `{}` writes the file-scope __device__ variable `{}`", f.name, s.text(op - 1)),
                    );
                }
            }
        }
    }

    let params = k
        .params
        .iter()
        .map(|(name, ty)| {
            let pointer = pointers.contains(&name.as_str());
            ParamUse {
                name: name.clone(),
                pointer,
                written: written.contains(&name.as_str()),
                read: !pointer || may_read(&s, k.body, name),
                element_bytes: if pointer { pointee_size(ty) } else { None },
            }
        })
        .collect();
    refusals.sort_by_key(|r| r.line);
    Some(WriteAnalysis { kernel: kernel.to_string(), params, refusals })
}

/// Whether the kernel body `body` may read through parameter `name`: any
/// occurrence of it other than the base of a plain store `name[i] = ..`
/// (one bracket group, then `=` that is not `==`) counts as a read, a
/// pointer made from it (`float* row = name + ..`) included. A member of
/// the same name (`blockIdx.x` beside a parameter `x`) is not the parameter.
fn may_read(s: &Src, body: (usize, usize), name: &str) -> bool {
    (body.0..body.1).any(|j| {
        if !s.is_ident(j) || s.text(j) != name {
            return false;
        }
        let before = s.text(j.wrapping_sub(1));
        if before == "." || (before == ">" && s.text(j.wrapping_sub(2)) == "-") {
            return false;
        }
        let plain_store = s.text(j + 1) == "["
            && s.close(j + 1).is_some_and(|c| s.text(c + 1) == "=" && s.text(c + 2) != "=")
            && !matches!(before, "*" | "&");
        !plain_store
    })
}

/// What a store is judged against.
struct StoreCtx<'c, 'a> {
    private: &'c [&'a str],
    shared: &'c [&'a str],
    device_vars: &'c [String],
    data_vars: &'c [&'a str],
    root_of: &'c dyn Fn(&str) -> Option<&'a str>,
    is_block: &'c dyn Fn(&str) -> bool,
}

/// An indexed store `base[index] = ..` (module doc).
#[allow(clippy::too_many_arguments)]
fn classify_store<'a>(
    s: &Src<'a>,
    at: usize,
    bases: &[&'a str],
    (first, last): (usize, usize),
    cx: &StoreCtx<'_, 'a>,
    written: &mut Vec<&'a str>,
    refuse: &mut impl FnMut(usize, String),
) {
    if let Some(g) = bases.iter().find_map(|w| (cx.root_of)(w)) {
        written.push(g);
        let ids = s.idents(first, last + 1);
        let target = format!("into `{g}` at {}", s.joined(first, last + 1));
        judge_global_store(at, &target, &ids, bases, cx, refuse);
    } else if bases.iter().any(|w| cx.private.contains(w) || cx.shared.contains(w)) {
        // Thread- or block-private memory.
    } else if let Some(w) = bases.iter().find(|w| cx.device_vars.iter().any(|v| v == *w)) {
        refuse(at, format!("writes the file-scope __device__ variable `{w}`: every GPU writes its own copy"));
    } else if let Some(w) = bases.iter().find(|w| cx.data_vars.contains(w)) {
        refuse(at, format!("stores through `{w}`, a pointer read from memory: its target cannot be followed"));
    } else {
        let b = bases.first().copied().unwrap_or("?");
        refuse(
            at,
            format!("stores through `{b}`, which is neither a kernel parameter nor __shared__ or local memory: its target cannot be followed"),
        );
    }
}

/// A store into a parameter's buffer at an index made of `ids` (each with
/// whether it is indexed itself), through `bases`: refused when the index is
/// read from memory or does not depend on the block index.
fn judge_global_store<'a>(
    at: usize,
    target: &str,
    ids: &[(&'a str, bool)],
    bases: &[&'a str],
    cx: &StoreCtx<'_, 'a>,
    refuse: &mut impl FnMut(usize, String),
) {
    let from_memory = ids
        .iter()
        .find(|&&(w, indexed)| cx.data_vars.contains(&w) || (indexed && (cx.root_of)(w).is_some()))
        .map(|(w, _)| *w)
        .or_else(|| bases.iter().copied().find(|w| cx.data_vars.contains(w)));
    if let Some(w) = from_memory {
        refuse(
            at,
            format!(
                "stores {target}, an index read from memory (`{w}`): which words a block writes depends on data, so blocks on two GPUs may write the same word"
            ),
        );
    } else if !ids.iter().any(|(w, _)| (cx.is_block)(w)) && !bases.iter().any(|w| (cx.is_block)(w)) {
        refuse(
            at,
            format!(
                "stores {target}, an index that does not depend on the block index: every block writes the same words, so blocks on two GPUs would too"
            ),
        );
    }
}

/// A store `*p = ..` or `*(expr) = ..`, the expression's identifiers `ids`.
fn store_through_pointer<'a>(
    at: usize,
    ids: &[(&'a str, bool)],
    text: &str,
    cx: &StoreCtx<'_, 'a>,
    written: &mut Vec<&'a str>,
    refuse: &mut impl FnMut(usize, String),
) {
    let names: Vec<&'a str> = ids.iter().map(|(w, _)| *w).collect();
    if let Some(g) = names.iter().find_map(|w| (cx.root_of)(w)) {
        written.push(g);
        judge_global_store(at, &format!("through `*{text}` into `{g}`"), ids, &names, cx, refuse);
    } else if names.iter().any(|w| cx.private.contains(w) || cx.shared.contains(w)) {
        // Thread- or block-private memory.
    } else if let Some(w) = names.iter().find(|w| cx.data_vars.contains(w)) {
        refuse(at, format!("stores through `{w}`, a pointer read from memory: its target cannot be followed"));
    } else {
        refuse(at, format!("stores through `*{text}`, which is not known to point into a kernel parameter's buffer"));
    }
}

/// Is the `*` at `k` a dereference (not a multiplication)?
fn unary(s: &Src, k: usize) -> bool {
    k == 0 || matches!(s.text(k - 1), ";" | "{" | "}" | "(" | "," | "=" | ":" | "?" | "&&" | "||" | "!" | "return")
}

/// Does helper `f` store through its parameter `p` (`p[..] = ..`, `*p = ..`)?
fn helper_stores_through(s: &Src, f: &Func, p: &str) -> bool {
    (f.body.0..f.body.1).any(|j| {
        let Some(op) = assignment_at(s, j) else { return false };
        let last = op.wrapping_sub(1);
        if s.text(last) == "]" {
            let mut first = s.open(last).unwrap_or(last);
            while s.text(first.wrapping_sub(1)) == "]" {
                first = s.open(first - 1).unwrap_or(first - 1);
            }
            s.text(first.wrapping_sub(1)) == p
        } else {
            s.text(last) == p && s.text(last.wrapping_sub(1)) == "*" && unary(s, last - 1)
        }
    })
}

/// The helper functions `k` calls, directly or through other helpers.
fn called_helpers<'f>(s: &Src, funcs: &'f [Func], k: &Func) -> Vec<&'f Func> {
    let mut out: Vec<&Func> = Vec::new();
    let mut todo = vec![k.body];
    while let Some((b0, b1)) = todo.pop() {
        for j in b0..b1 {
            if s.is_ident(j) && s.text(j + 1) == "(" {
                if let Some(f) = funcs.iter().find(|f| !f.kernel && f.name == s.text(j)) {
                    if !out.iter().any(|o| o.name == f.name) {
                        out.push(f);
                        todo.push(f.body);
                    }
                }
            }
        }
    }
    out
}

/// The size of what a pointer parameter of type `ty` points to, if the ABI fixes it.
fn pointee_size(ty: &str) -> Option<u32> {
    let words: Vec<&str> = ty.split_whitespace().collect();
    let cut = words.iter().position(|w| *w == "*" || *w == "[")?;
    param_size(&words[..cut].join(" "))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::suite::{all_sources, App};

    fn reasons(src: &str, kernel: &str) -> Vec<String> {
        analyse(src, kernel).expect("kernel found").refusals.iter().map(|r| r.to_string()).collect()
    }

    #[test]
    fn suite_kernels_with_block_indexed_stores_pass() {
        for (app, kernel, outputs) in [
            (App::Triad, "triad", vec!["a"]),
            (App::Transpose, "transpose", vec!["out"]),
            (App::Spmv, "spmv_csr", vec!["y"]),
            (App::Sgemm, "sgemm", vec!["C"]),
            (App::Nbody, "nbody", vec!["acc"]),
            (App::Stencil, "stencil5", vec!["out"]),
            (App::Reduction, "reduce_partial", vec!["partial"]),
            (App::Kmeans, "kmeans_assign", vec!["label"]),
            (App::Kmeans, "kmeans_update", vec!["cent"]),
        ] {
            let a = analyse(app.source(), kernel).expect("kernel found");
            assert!(a.splittable(), "{kernel}: {:?}", a.refusals);
            let written: Vec<&str> = a.params.iter().filter(|p| p.written).map(|p| p.name.as_str()).collect();
            assert_eq!(written, outputs, "{kernel}");
        }
    }

    #[test]
    fn suite_kernels_that_cannot_merge_are_refused_with_the_reason() {
        let h = reasons(App::Histogram.source(), "histogram");
        assert_eq!(h.len(), 1, "{h:?}");
        assert!(h[0].starts_with("line 20: atomicAdd on global memory (`hist`)"), "{h:?}");
        let r = reasons(App::Reduction.source(), "reduce_final");
        assert_eq!(r.len(), 1, "{r:?}");
        assert!(r[0].contains("stores into `out` at [ 0 ], an index that does not depend on the block index"), "{r:?}");
        let b = reasons(App::Bfs.source(), "bfs_step");
        assert!(b.iter().any(|x| x.contains("stores into `level` at [ u ], an index read from memory (`u`)")), "{b:?}");
        // spin counts its runs with a global atomic; probe writes fixed cells and a global counter.
        let spin = reasons(crate::suite::SYNTHETIC_SOURCE, "spin");
        assert!(spin.iter().any(|x| x.contains("atomicAdd on global memory (`runs`)")), "{spin:?}");
        let probe = reasons(crate::suite::SYNTHETIC_SOURCE, "probe");
        assert!(probe.iter().any(|x| x.contains("`host_flags` at [ 0 ]")), "{probe:?}");
        assert!(probe.iter().any(|x| x.contains("atomicAdd on global memory (`done_blocks`)")), "{probe:?}");
    }

    #[test]
    fn every_suite_kernel_is_found() {
        for (name, src) in all_sources() {
            let t = crate::transform::transform(src).expect("transforms");
            for k in t.kernels.iter().filter(|k| k.defined) {
                let a = analyse(src, &k.name).unwrap_or_else(|| panic!("{name}: {} not found", k.name));
                assert_eq!(a.params.len(), k.params.len(), "{name}.{}", k.name);
            }
        }
        assert!(analyse(App::Triad.source(), "nope").is_none());
    }

    #[test]
    fn bad_kernels_are_refused() {
        let cases: &[(&str, &str)] = &[
            (
                "__global__ void k(unsigned* count, const float* x) { if (x[blockIdx.x] > 0) atomicAdd(count, 1u); }",
                "atomicAdd on global memory (`count`)",
            ),
            (
                "__global__ void k(float* out, const float* in) { __shared__ float s[256]; s[threadIdx.x] = in[threadIdx.x]; __syncthreads(); if (threadIdx.x == 0) out[0] = s[0]; }",
                "stores into `out` at [ 0 ], an index that does not depend on the block index",
            ),
            (
                "__global__ void k(float** ptrs, float v) { float* p = ptrs[blockIdx.x]; p[threadIdx.x] = v; }",
                "stores through `p`, a pointer read from memory",
            ),
            (
                "__device__ int flag;\n__global__ void k(float* out) { out[blockIdx.x] = 1.f; flag = 1; }",
                "line 2: writes the file-scope __device__ variable `flag`",
            ),
            (
                "__global__ void k(float* out, const int* perm) { out[perm[blockIdx.x]] = 1.f; }",
                "an index read from memory (`perm`)",
            ),
            (
                "__global__ void k(float* out) { float* q = out + threadIdx.x; *q = 1.f; }",
                "stores through `*q` into `out`, an index that does not depend on the block index",
            ),
            (
                "__global__ void k(float* out, const int* idx) { float* q = out + idx[threadIdx.x]; q[blockIdx.x] = 1.f; }",
                "stores into `out` at [ blockIdx . x ], an index read from memory (`q`)",
            ),
            (
                "__device__ void put(float* p, float v) { p[threadIdx.x] = v; }\n__global__ void k(float* out) { put(out + blockIdx.x * 32, 1.f); }",
                "passes `out` to `put`, which stores through that parameter",
            ),
            (
                "__global__ void k(unsigned* out) { asm volatile(\"red.global.add.u32 [%0], 1;\" :: \"l\"(out)); }",
                "inline PTX that stores or does atomics",
            ),
            (
                "__device__ void bump(unsigned* c) { atomicAdd(c, 1u); }\n__global__ void k(unsigned* c) { bump(c); }",
                "atomicAdd in helper `bump` on memory not known to be __shared__",
            ),
            ("__global__ void k(float* out) { out[threadIdx.x] += 1.f; }", "an index that does not depend on the block index"),
        ];
        for (src, want) in cases {
            let r = reasons(src, "k");
            assert!(r.iter().any(|x| x.contains(want)), "{src}\nwant: {want}\ngot: {r:?}");
        }
    }

    #[test]
    fn block_private_and_block_indexed_stores_pass() {
        let ok: &[&str] = &[
            // shared atomics, a grid-stride loop, a helper and a macro that read blockIdx
            "#define BX (blockIdx.x)\n__device__ unsigned first() { return blockIdx.x * blockDim.x; }\n\
             __global__ void k(unsigned* out, const unsigned* in, unsigned n) {\n\
               __shared__ unsigned h[32]; atomicAdd(&h[threadIdx.x % 32], 1u);\n\
               for (unsigned i = first() + threadIdx.x; i < n; i += gridDim.x * blockDim.x) out[i] = in[i] + h[0];\n\
               out[n + BX] = 0u; }",
            // a pointer offset by the block index, stored through by index and by dereference
            "__global__ void k(float* out) { float* row = out + blockIdx.x * 256; row[threadIdx.x] = 1.f;\n\
               float* q = row + threadIdx.x; *q += 1.f; *(out + blockIdx.x) = 2.f; }",
            // a local array, a cast store, member stores, compound assignments
            "__global__ void k(float* out, float4* v, unsigned* u) { float acc[4] = {}, b2[2]; acc[threadIdx.x % 4] += 1.f; b2[1] = 0.f;\n\
               const unsigned i = blockIdx.x * 256 + threadIdx.x; reinterpret_cast<float2*>(out)[i] = make_float2(acc[0], 0.f);\n\
               v[i].x = 1.f; out[i] *= 2.f; u[i] <<= 1; if (out[i] <= 1.f) out[i]++; }",
        ];
        for src in ok {
            let a = analyse(src, "k").expect("found");
            assert!(a.splittable(), "{src}\n{:?}", a.refusals);
            assert!(a.params[0].written, "{src}");
        }
    }

    /// A buffer the kernel only stores into with `p[i] = ..` is not read;
    /// any other use of it may read it.
    #[test]
    fn a_buffer_only_stored_into_is_not_read_and_any_other_use_reads() {
        let a = analyse(App::Triad.source(), "triad").expect("triad");
        let reads: Vec<(&str, bool)> =
            a.params.iter().filter(|p| p.pointer).map(|p| (p.name.as_str(), p.read)).collect();
        assert_eq!(reads, vec![("a", false), ("b", true), ("c", true)]);
        for src in [
            "__global__ void k(float* out) { out[blockIdx.x] *= 2.f; }",
            "__global__ void k(float* out) { unsigned i = blockIdx.x; out[i] = out[i] + 1.f; }",
            "__global__ void k(float* out) { float* row = out + blockIdx.x * 4; row[0] = 1.f; }",
            "__global__ void k(float* out) { if (out[blockIdx.x] == 0.f) out[blockIdx.x + 1] = 1.f; }",
            "__global__ void k(float* x) { float* p = x; p[blockIdx.x] = 1.f; }",
            "__global__ void k(float4* out) { out[blockIdx.x].x = 1.f; }",
            "__device__ void h(float* p) { p[0] = 1.f; }\n__global__ void k(float* out) { h(out + blockIdx.x); }",
        ] {
            let a = analyse(src, "k").expect("found");
            assert!(a.params[0].read, "{src}");
        }
        let a = analyse(
            "__global__ void k(float* out, unsigned n) { unsigned i = blockIdx.x; if (i < n) out[i] = 2.f * i; }",
            "k",
        )
        .expect("found");
        assert!(!a.params[0].read && a.params[0].written);
        assert!(a.params[1].read, "a value parameter counts as read");
    }

    #[test]
    fn element_sizes_come_from_the_pointer_types() {
        let a =
            analyse("__global__ void k(char* c, const float4* f, double* d, unsigned n, void* v) { }", "k").unwrap();
        let sizes: Vec<Option<u32>> = a.params.iter().map(|p| p.element_bytes).collect();
        assert_eq!(sizes, vec![Some(1), Some(16), Some(8), None, None]);
        assert_eq!(a.params.iter().map(|p| p.pointer).collect::<Vec<_>>(), vec![true, true, true, false, true]);
    }
}
