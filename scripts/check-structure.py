#!/usr/bin/env python3
"""The structure checks of CI's layout step (docs/design.md, "Layout").

    python3 scripts/check-structure.py [--report]

Over every non-test Rust source file of the workspace and the Python crate
(not `tests/`, `benches/`, `examples/`, `tests.rs`, `*_tests.rs`; lines of an
inline `#[cfg(test)] mod ... { }` block do not count):

  1. no file over MAX_FILE_LINES (700) lines (KNOWN: the excess left when
     the check was wired in, which may only shrink);
  2. no function over MAX_FN_LINES (150) lines, signature to closing brace;
  3. no import circle between modules of different output families: the
     `use` graph (`crate::`, `super::`, `self::` and child-module paths)
     between module files of one crate, a module's arrows into its own
     submodules not counted (containment: re-exports and dispatch),
     whose strongly connected components must each hold modules of at most
     one family (FAMILIES below; modules of no family are shared and may sit
     in circles with anything of one family).

Files are read as rustfmt writes them (a block closes on a line holding only
`}` at the opening line's indentation); CI runs `cargo fmt --check` first.
Exits 1 listing every violation; `--report` also prints the largest files
and functions.
"""

import os
import re
import sys

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
MAX_FILE_LINES = 700
MAX_FN_LINES = 150
CRATES = {
    "reference": "reference/src",
    "kernels": "kernels/src",
    "verify": "properties/verify/src",
    "testkit": "properties/testkit/src",
    "fuzz": "properties/fuzz/src",
    "cli": "properties/src",
    "python": "properties/python/src",
}
# Output families (issue 47): a module path (crate-relative, `::`-joined)
# belongs to the family of the longest listed prefix of its last-but-any
# component name. Modules matching none are shared (dispatch, primitives).
FAMILIES = {
    "logprob": ("logprob", "log_softmax", "entropy"),
    "topk": ("topk",),
    "cross_entropy": ("cross_entropy", "loss", "lse", "z_loss", "softcap"),
    "kl": ("topk_kl", "kl"),
    "policy": ("policy",),
}
SKIP_DIRS = {"tests", "benches", "examples", "target"}
# Known excess, a ratchet: each may shrink, none may grow, and nothing else
# may go over (issue 47 lists what is left). Key: a file's path, or
# `path:fn` for a function; value: its size when the check was wired in.
KNOWN = {
    "kernels/src/cuda/forward.rs:forward": 162,
    "properties/fuzz/src/case/recipe_text.rs:set": 152,
    "properties/src/bench/paths.rs:run_in_pool": 246,
}
FN_RE = re.compile(r"^(\s*)(?:pub(?:\([^)]*\))?\s+)?(?:const\s+)?(?:async\s+)?(?:unsafe\s+)?"
                   r"(?:extern\s+\"[^\"]*\"\s+)?fn\s+([A-Za-z_][A-Za-z0-9_]*)")
USE_RE = re.compile(r"^\s*(?:pub(?:\([^)]*\))?\s+)?use\s+([^;]+);?", re.M)


def source_files():
    for crate, src in CRATES.items():
        base = os.path.join(ROOT, src)
        if not os.path.isdir(base):
            continue
        for dirpath, dirnames, filenames in os.walk(base):
            dirnames[:] = sorted(d for d in dirnames if d not in SKIP_DIRS)
            for name in sorted(filenames):
                if not name.endswith(".rs") or name == "tests.rs" or name.endswith("_tests.rs"):
                    continue
                yield crate, base, os.path.join(dirpath, name)


def block_end(lines, start, indent):
    """Index of the line closing the block opened at or after `start`."""
    close = indent + "}"
    for i in range(start, len(lines)):
        line = lines[i].rstrip("\n")
        if i > start and (line == close or line.startswith(close + " ") or line == close + ";"):
            return i
        # A one-line item: `fn f() {}` or `fn f();` (trait declaration).
        if i == start and (line.rstrip().endswith("{}") or line.rstrip().endswith(";")):
            return i
    return len(lines) - 1


def non_test_lines(lines):
    """The lines outside `#[cfg(test)]` items."""
    keep = [True] * len(lines)
    i = 0
    while i < len(lines):
        if lines[i].strip() == "#[cfg(test)]":
            j = i + 1
            while j < len(lines) and lines[j].strip().startswith("#["):
                j += 1
            if j < len(lines):
                indent = re.match(r"\s*", lines[j]).group(0)
                end = block_end(lines, j, indent)
                for k in range(i, end + 1):
                    keep[k] = False
                i = end + 1
                continue
        i += 1
    return keep


def module_path(base, path):
    rel = os.path.relpath(path, base)[:-3].split(os.sep)
    if rel[-1] in ("mod", "lib", "main"):
        rel = rel[:-1]
    return rel


def family_of(parts):
    best = None
    for part in parts:
        for fam, names in FAMILIES.items():
            for n in names:
                if part == n or part.startswith(n + "_") or part.endswith("_" + n):
                    if best is None or len(n) > best[1]:
                        best = (fam, len(n))
    return best[0] if best else None


def expand(tree):
    """The paths of a use tree: `a::{b, c::{d, e}}` -> a::b, a::c::d, a::c::e."""
    if "{" not in tree:
        return [tree]
    i = tree.index("{")
    head, inner = tree[:i], tree[i + 1:tree.rindex("}")]
    parts, depth, cur = [], 0, ""
    for ch in inner:
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
            continue
        depth += (ch == "{") - (ch == "}")
        cur += ch
    parts.append(cur)
    return [head + p for part in parts if part for p in expand(part)]


def uses(text, mod):
    """Module paths (crate-relative) that `use` lines of module `mod` name."""
    out = set()
    for m in USE_RE.finditer(text):
        for path in expand(re.sub(r"\s+", "", m.group(1))):
            if path.startswith("crate::"):
                here, rest = [], path[len("crate::"):]
            elif path.startswith("super::") or path.startswith("self::"):
                here, rest = list(mod), path
                if rest.startswith("self::"):
                    rest = rest[len("self::"):]
                while rest.startswith("super::"):
                    here, rest = here[:-1], rest[len("super::"):]
            else:
                # A uniform path: a child module (`use child::X`), or an
                # external crate, which resolves to no module file here.
                here, rest = list(mod), path
            names = [n for n in rest.split("::") if n and n != "self" and n != "*"]
            # Module components are lower case; the item (type, fn) ends it.
            comps = []
            for n in names:
                if not n[0].islower():
                    break
                comps.append(n.split(" as ")[0])
            out.add(tuple(here + comps))
    return out


def sccs(graph):
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def strong(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            out.append(comp)

    sys.setrecursionlimit(10000)
    for v in list(graph):
        if v not in index:
            strong(v)
    return out


def over(problems, known, key, size, message):
    """Records an excess: a problem unless KNOWN allows it at this size."""
    allowed = KNOWN.get(key)
    if allowed is not None and size <= allowed:
        known.append(f"{message} [known, at most {allowed}]")
    elif allowed is not None:
        problems.append(f"{message}: grew past its known {allowed}")
    else:
        problems.append(message)


def main():
    report = "--report" in sys.argv[1:]
    problems, sizes, fns, known = [], [], [], []
    graphs = {}
    for crate, base, path in source_files():
        with open(path, encoding="utf-8") as f:
            lines = f.readlines()
        keep = non_test_lines(lines)
        rel = os.path.relpath(path, ROOT)
        count = sum(keep)
        sizes.append((count, rel))
        if count > MAX_FILE_LINES:
            over(problems, known, rel, count, f"{rel}: {count} non-test lines (limit {MAX_FILE_LINES})")
        for i, line in enumerate(lines):
            if not keep[i]:
                continue
            m = FN_RE.match(line)
            if not m:
                continue
            end = block_end(lines, i, m.group(1))
            n = end - i + 1
            fns.append((n, f"{rel}:{i + 1} {m.group(2)}"))
            if n > MAX_FN_LINES:
                over(problems, known, f"{rel}:{m.group(2)}", n,
                     f"{rel}:{i + 1}: fn {m.group(2)} is {n} lines (limit {MAX_FN_LINES})")
        mod = tuple(module_path(base, path))
        text = "".join(l for l, k in zip(lines, keep) if k)
        graphs.setdefault(crate, {})[mod] = uses(text, mod)
    for crate, graph in graphs.items():
        mods = set(graph)
        edges = {}
        for mod, targets in graph.items():
            resolved = set()
            for t in targets:
                # The longest prefix of the named path that is a module file.
                for k in range(len(t), -1, -1):
                    if t[:k] in mods:
                        # A module's own submodules (its re-exports and
                        # dispatch into them) are containment, not an arrow.
                        if t[:k][:len(mod)] != mod:
                            resolved.add(t[:k])
                        break
            edges[mod] = resolved
        for comp in sccs(edges):
            if len(comp) < 2:
                continue
            fams = {family_of(m) for m in comp} - {None}
            if len(fams) > 1:
                names = ", ".join("::".join(m) or "<root>" for m in sorted(comp))
                problems.append(f"{crate}: import circle across families {sorted(fams)}: {names}")
    if report:
        print("largest files:")
        for n, rel in sorted(sizes, reverse=True)[:10]:
            print(f"  {n:5} {rel}")
        print("longest functions:")
        for n, where in sorted(fns, reverse=True)[:10]:
            print(f"  {n:5} {where}")
    for k in known:
        print("structure: " + k)
    if problems:
        print("structure checks failed (scripts/check-structure.py):", file=sys.stderr)
        for p in problems:
            print("  " + p, file=sys.stderr)
        return 1
    print(f"structure: {len(sizes)} files, {len(fns)} functions: none over {MAX_FILE_LINES} / "
          f"{MAX_FN_LINES} lines but the {len(known)} known above, no import circle across families")
    return 0


if __name__ == "__main__":
    sys.exit(main())
