#!/usr/bin/env python3
"""Checks that the tree's references resolve, so a reader who follows one finds what it names.

    scripts/check-doc-links.py [ROOT]
    scripts/check-doc-links.py --self-test   # finds what it must in a small planted tree

ROOT defaults to the repository this script is in. Needs only python3 (git, when there, lists
the files: tracked and untracked-but-not-ignored; without it the tree is walked, skipping
target/ and hidden folders). Reads the Markdown files, Rust comments, scripts and CI files and
checks four kinds of reference:

  link     a Markdown link `[text](path#anchor)` (in inline code or a code block it is
           not a link): the path exists, relative to the file; the anchor is a heading of
           the target, as GitHub spells it (lower case, punctuation dropped, spaces to -).
  file     a path in prose or comments, `docs/split.md`, `core/split.rs`, `measure.rs`: one
           ending in .md, .rs, .sh or .py names a file of the tree, from the root, the
           file's folder or its crate (crates/NAME/, crates/NAME/src/), or as the tail of
           one. Rust string literals are not read (a test may name a file that must not
           exist); `REV:path` (git show's), paths with * or { and the few files outside
           the tree in NOT_IN_TREE are not checked.
  section  `FILE, "Name"` (also `FILE "Name"`, `FILE ("Name")`, `FILE's "Name"`), FILE a
           .md or .rs file as above: Name starts one of FILE's headings, bold terms
           (`**Name.**`) or run-in names (a paragraph's first words before a colon,
           `Requirements: ...`), or one of them starts Name (a reference may add a clause),
           with whitespace and line breaks in Name counting as one space.
  here     `"Name", below` / `"Name" above`: Name is a heading or bold term of this file.

docs/history/ records past runs against the tree of their time, so its file mentions are
not checked; its links and section references are. This script is not read (its self-test
plants broken references).

Prints one line per broken reference, `FILE:LINE: KIND: what (why)`, and exits 1 if there
is any; else prints a one-line summary and exits 0. Takes about a second.
"""

import os
import re
import subprocess
import sys

TEXT_EXT = (".md", ".rs", ".sh", ".py", ".toml", ".c", ".h", ".cu", ".cuh", ".yml", ".yaml")
MENTION_EXT = ("md", "rs", "sh", "py")
SKIP_DIRS = {"target", "node_modules", "__pycache__"}
# This file plants broken references for its self-test, so it does not read itself.
SELF = "scripts/check-doc-links.py"
# Files named in the tree that are not in it: the Rust standard library's (callgrind-lines.py).
NOT_IN_TREE = {"vec/mod.rs", "iter/macros.rs"}


def list_files(root):
    """Tracked and untracked-but-not-ignored files, relative to root, or a walk without git."""
    try:
        out = subprocess.run(
            ["git", "ls-files", "-co", "--exclude-standard", "-z"],
            cwd=root, capture_output=True, check=True,
        ).stdout.decode("utf-8", "replace")
        files = [f for f in out.split("\0") if f]
        # A file deleted in the work tree but not yet in the index is not there to read.
        return sorted(f for f in files if os.path.isfile(os.path.join(root, f)))
    except (OSError, subprocess.CalledProcessError):
        files = []
        for d, dirs, names in os.walk(root):
            dirs[:] = [x for x in dirs if x not in SKIP_DIRS and (not x.startswith(".") or x == ".ci")]
            files += [os.path.relpath(os.path.join(d, n), root) for n in names]
        return sorted(files)


def is_text(path):
    return path.endswith(TEXT_EXT) or path.startswith(".ci/") or os.path.basename(path) == "Makefile"


def blank(m):
    """The match's text with everything but line breaks made spaces: positions and line numbers stay."""
    return re.sub(r"[^\n]", " ", m.group(0))


def strip_fences(text):
    return re.sub(r"^ {0,3}(```|~~~).*?^ {0,3}\1[^\n]*$", blank, text, flags=re.M | re.S)


def rust_comments(text):
    """Only the comments of a Rust file (`//`, `///`, `//!` lines), the rest blanked line by line."""
    lines = []
    for line in text.split("\n"):
        m = re.match(r"\s*//[/!]?", line)
        lines.append(" " * m.end() + line[m.end():] if m else "")
    return "\n".join(lines)


def c_comments(text):
    """A C or CUDA file's text with its comments' `//`, `/*` and leading `*` made spaces."""
    return re.sub(r"^(\s*)(//+|/\*+|\*+(?!/))", lambda m: m.group(1) + " " * len(m.group(2)), text, flags=re.M)


def script_prose(text):
    """A script's text with each comment's `#` made a space, so a reference may wrap lines."""
    return re.sub(r"^(\s*)#+", lambda m: m.group(1) + " " * (len(m.group(0)) - len(m.group(1))), text, flags=re.M)


def slug(heading):
    """GitHub's anchor for a heading."""
    h = re.sub(r"[`*_]|\[([^\]]*)\]\([^)]*\)", lambda m: m.group(1) or "", heading.strip()).lower()
    h = re.sub(r"[^\w\- ]", "", h)
    return h.replace(" ", "-")


def anchors(heads):
    """GitHub's anchors for a file's headings: a repeated one gets -1, -2, ... after the first."""
    out, count = set(), {}
    for h in heads:
        s = slug(h)
        out.add(s if s not in count else "%s-%d" % (s, count[s]))
        count[s] = count.get(s, 0) + 1
    return out


def norm(name):
    return re.sub(r"\s+", " ", name).strip().rstrip(".:")


class Tree:
    def __init__(self, root):
        self.root = root
        self.files = list_files(root)
        self.fileset = set(self.files)
        self.dirs = {os.path.dirname(f) for f in self.files}
        for f in self.files:
            d = os.path.dirname(f)
            while d:
                self.dirs.add(d)
                d = os.path.dirname(d)
        self._text = {}
        self._names = {}

    def text(self, f):
        if f not in self._text:
            with open(os.path.join(self.root, f), encoding="utf-8", errors="replace") as fh:
                self._text[f] = fh.read()
        return self._text[f]

    def exists(self, rel):
        rel = os.path.normpath(rel)
        return rel in self.fileset or rel in self.dirs or rel == "."

    def resolve(self, f, path):
        """The tree file a mention `path` in file f names, None if none, "" if it is not one file."""
        path = path.rstrip("/")
        here = os.path.dirname(f)
        bases = [here, ""]
        m = re.match(r"crates/[^/]+", f)
        if m:
            bases += [m.group(0), m.group(0) + "/src"]
        for b in bases:
            cand = os.path.normpath(os.path.join(b, path))
            if not cand.startswith("..") and self.exists(cand):
                return cand if cand in self.fileset else ""
        tails = [x for x in self.files if x.endswith("/" + path)]
        if len(tails) == 1:
            return tails[0]
        return "" if tails else None

    def names(self, f):
        """Headings and bold terms of a Markdown file, or of a Rust file's comments."""
        if f not in self._names:
            t = self.text(f)
            if f.endswith(".rs"):
                t = re.sub(r"^ *", "", rust_comments(t), flags=re.M)
            t = strip_fences(t)
            heads = [h for h in re.findall(r"^#+ +(.*?)#*$", t, flags=re.M)]
            bold = re.findall(r"\*\*([^*]+?)\*\*", t)
            run_in = re.findall(r"(?:\A|\n\s*\n)([A-Z][\w ,'-]{0,60}?):\s", t)
            self._names[f] = (
                {norm(h) for h in heads + bold + run_in},
                anchors(heads) | set(re.findall(r'<a (?:name|id)="([^"]+)"', t)),
            )
        return self._names[f]

    def has_name(self, f, name):
        name = norm(name)
        return any(n.startswith(name) or name.startswith(n) for n in self.names(f)[0] if n)


def line_of(text, pos):
    return text.count("\n", 0, pos) + 1


FILE_RE = r"((?:[\w.-]+/)*[\w-]+(?:\.[\w-]+)*\.(?:md|rs))"
LINK_RE = re.compile(r"\]\(([^()\s]*(?:\([^()\s]*\)[^()\s]*)*)(?:\s+\"[^\"]*\")?\)")
MENTION_RE = re.compile(
    r"(?<![\w./:$~@{}*<-])((?:[\w.-]+/)*[\w-]+(?:\.[\w-]+)*\.(?:%s))(?![\w/*{-])" % "|".join(MENTION_EXT)
)
SECTION_RE = re.compile(FILE_RE + r"`?\]?(?:\([^)]*\))?(?:'s)?,?:?\s+\(?\"([^\"]+)\"")
HERE_RE = re.compile(r"\"([^\"]+)\",?\s+(?:below|above)\b")


def check(root):
    tree = Tree(root)
    broken = []

    def bad(f, text, pos, kind, what):
        broken.append("%s:%d: %s: %s" % (f, line_of(text, pos), kind, what))

    checked = 0
    seen = {"link": 0, "file": 0, "section": 0, "here": 0}
    for f in tree.files:
        if not is_text(f) or f == SELF:
            continue
        raw = tree.text(f)
        if f.endswith(".md"):
            prose = strip_fences(raw)
            mention_text = raw
        elif f.endswith(".rs"):
            prose = mention_text = rust_comments(raw)
        elif f.endswith((".c", ".h", ".cu", ".cuh")):
            prose = mention_text = c_comments(raw)
        else:
            prose = mention_text = script_prose(raw)
        checked += 1

        # Links: Markdown files (and Rust doc comments, which rustdoc renders as Markdown).
        if f.endswith((".md", ".rs")):
            no_code = re.sub(r"(`+)[^`].*?\1", blank, prose, flags=re.S)
            for m in LINK_RE.finditer(no_code):
                target = m.group(1)
                path, _, anchor = target.partition("#")
                if re.match(r"[a-zA-Z][\w+.-]*:", path) or (not path and not anchor):
                    continue
                if f.endswith(".rs") and not path.endswith(".md"):
                    continue  # rustdoc's own links (`[x](crate::y)`), checked by cargo doc
                seen["link"] += 1
                dest = os.path.normpath(os.path.join(os.path.dirname(f), path)) if path else f
                if not tree.exists(dest):
                    bad(f, prose, m.start(), "link", "%s (no such file)" % target)
                elif anchor and dest.endswith(".md") and anchor not in tree.names(dest)[1]:
                    bad(f, prose, m.start(), "link", "%s (no such heading in %s)" % (target, dest))

        # Section names after a file.
        for m in SECTION_RE.finditer(prose):
            seen["section"] += 1
            dest = tree.resolve(f, m.group(1))
            # A FILE that is not in the tree is the file check's to report.
            if dest and not tree.has_name(dest, m.group(2)):
                bad(f, prose, m.start(), "section", '%s, "%s" (no such heading or bold term)' % (m.group(1), norm(m.group(2))))

        # Section names in this file ("X", below).
        if f.endswith(".md"):
            for m in HERE_RE.finditer(prose):
                seen["here"] += 1
                if not tree.has_name(f, m.group(1)):
                    bad(f, prose, m.start(), "here", '"%s" (no such heading or bold term in this file)' % norm(m.group(1)))

        # File mentions.
        if f.startswith("docs/history/"):
            continue
        for m in MENTION_RE.finditer(mention_text):
            if mention_text[max(0, m.start() - 2):m.start()] == "](":
                continue  # a link's target: the link check's
            seen["file"] += 1
            if m.group(1) not in NOT_IN_TREE and tree.resolve(f, m.group(1)) is None:
                bad(f, mention_text, m.start(), "file", "%s (no such file in the tree)" % m.group(1))

    return checked, seen, broken


# --self-test: a small tree with one reference of each kind that resolves and one that does
# not, so a change that blinds a check (finds nothing, so passes) fails instead.
SELF_TEST_TREE = {
    "docs/a.md": (
        "# A\n\n## Part one\n\n**Bold term.** Text.\n\nRequirements: Rust.\n\n"
        "See [b](b.md#part-two-amd), [bad](b.md#nope), [gone](gone.md), `x[1](args)`, [me](#part-one).\n"
        'As docs/b.md, "Part two" and docs/b.md, "Part three" say; "Part one", below; "Nothing", above.\n'
        "```\n[in a block](nowhere.md)\n```\n"
    ),
    "docs/b.md": "# B\n\n## Part two (`a.md`)\n",
    "crates/k/src/lib.rs": (
        '//! As docs/a.md, "Bold\n//! term" says; docs/a.md, "Missing\n//! one"; `core/none.rs`, `lib.rs`.\n'
        'fn f() -> &\'static str { "docs/not-checked.md" }\n'
    ),
    "scripts/s.sh": '#!/bin/sh\n# docs/a.md, "Requirements"; docs/missing.md\n',
}
SELF_TEST_BROKEN = [
    "crates/k/src/lib.rs:2: section: docs/a.md, \"Missing one\" (no such heading or bold term)",
    "crates/k/src/lib.rs:3: file: core/none.rs (no such file in the tree)",
    "docs/a.md:9: link: b.md#nope (no such heading in docs/b.md)",
    "docs/a.md:9: link: gone.md (no such file)",
    "docs/a.md:10: here: \"Nothing\" (no such heading or bold term in this file)",
    "docs/a.md:10: section: docs/b.md, \"Part three\" (no such heading or bold term)",
    "scripts/s.sh:2: file: docs/missing.md (no such file in the tree)",
]


def self_test():
    import tempfile

    with tempfile.TemporaryDirectory() as root:
        for rel, text in SELF_TEST_TREE.items():
            os.makedirs(os.path.join(root, os.path.dirname(rel)), exist_ok=True)
            with open(os.path.join(root, rel), "w", encoding="utf-8") as fh:
                fh.write(text)
        _, seen, broken = check(root)
    if sorted(broken) != sorted(SELF_TEST_BROKEN):
        print("check-doc-links --self-test: found\n  %s\nexpected\n  %s" % ("\n  ".join(sorted(broken)), "\n  ".join(sorted(SELF_TEST_BROKEN))))
        return 1
    print("check-doc-links --self-test: the %d broken references planted, and only those, found" % len(broken))
    return 0


def main():
    if sys.argv[1:] == ["--self-test"]:
        return self_test()
    root = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
    root = os.path.realpath(root)
    checked, seen, broken = check(root)
    counts = ", ".join("%d %s" % (n, k) for k, n in seen.items())
    for line in broken:
        print(line)
    if broken:
        print("check-doc-links: %d broken references (of %s) in %d files; scripts/check-doc-links.py says what each kind means" % (len(broken), counts, checked))
        return 1
    print("check-doc-links: every reference resolves (%s) in %d files" % (counts, checked))
    return 0


if __name__ == "__main__":
    sys.exit(main())
