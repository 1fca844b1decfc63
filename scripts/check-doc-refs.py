#!/usr/bin/env python3
"""Fails on any reference to a document outside the repository.

A clone holds the repository and nothing else, so every document the docs
and the code point at must be one of its files. Scans the tracked *.md and
*.rs files (or the files given) for
  - markdown links `[text](target)` whose target is a path (not a URL, an
    anchor or a rustdoc intra-doc link),
  - path mentions ending in `.md` and `docs/...` paths,
and fails on one that names no file or folder of the repository, resolved
from the mentioning file's folder or any folder above it up to the root (a
bare file name, `TOLERANCE.md`, resolves to a tracked file of that name
anywhere). Also fails on the names of the design notes that lived outside
the repository (their upper-case name, and paths into the folder beside
the checkout that held them; OUTSIDE below): docs/design.md replaced them.

Usage: check-doc-refs.py [FILE...]   (default: the *.md and *.rs files git
tracks or would add; exit 1 with one line per bad reference)
"""
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# `[text](target)`; the target ends at whitespace or `)`.
LINK = re.compile(r"\[[^\]\n]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
# A path ending in `.md`, or a path under docs/ (a mention in prose or code).
MENTION = re.compile(r"(?<![\w./-])((?:\.\.?/)*[\w.-]+(?:/[\w.-]+)*\.md|(?:\.\./)*docs/[\w./-]*[\w/])(?![\w])")
URL = re.compile(r"\b[a-z][a-z0-9+.-]*://\S+")
# Documents a clone does not contain: the external design notes (their
# upper-case name, with or without the .md suffix) and any path into the
# folder beside the checkout that held them (relative or not; a folder of
# that name inside the repository would resolve).
OUTSIDE = re.compile(r"\bDESIGN(?:\.md)?\b|(?<![\w/-])(?:\.\./)*shared/[\w./-]*[\w/]")
# Placeholders and globs, not names of files.
PATTERN = re.compile(r"[*?{}<>$]|HASH|\bNAME\b|\bFILE\b")


def tracked(*patterns):
    out = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard", "--", *patterns],
        cwd=ROOT, check=True, capture_output=True, text=True,
    ).stdout
    return [ROOT / p for p in out.split("\0") if p]


NAMES = {p.name for p in tracked()}


def resolves(ref, src, link=False):
    """Whether `ref`, mentioned in `src`, names a file or folder of the repo;
    a markdown link of a .md file only from the file's folder (as GitHub
    renders it) or, starting with `/`, from the root."""
    path = ref.split("#", 1)[0].rstrip("/")
    if not path:
        return True
    if path.startswith("/"):
        return (ROOT / path.lstrip("/")).exists()
    if link and src.suffix == ".md":
        p = (src.parent / path).resolve()
        return p.exists() and (p == ROOT or ROOT in p.parents)
    if "/" not in path and path in NAMES:
        return True
    d = src.parent
    while True:
        p = (d / path).resolve()
        if p.exists() and (p == ROOT or ROOT in p.parents):
            return True
        if d == ROOT:
            return False
        d = d.parent


def is_path_link(target):
    """Whether a markdown link's target is a path (rustdoc's `mod@x`,
    `crate::x`, URLs, anchors and bare names are not)."""
    if URL.match(target) or target.startswith(("#", "mailto:")):
        return False
    if "@" in target or "::" in target:
        return False
    return "/" in target or "." in target.split("#", 1)[0]


def check(src, seen):
    bad = []
    rel = src.relative_to(ROOT)
    for n, line in enumerate(src.read_text(encoding="utf-8").splitlines(), 1):
        # (A `shared/` path that is a folder of the repository is not theirs.)
        outside = [m.group(0) for m in OUTSIDE.finditer(line)
                   if m.group(0).startswith("DESIGN") or not resolves(m.group(0), src)]
        for o in outside:
            bad.append(f"{rel}:{n}: `{o}` names a document outside the repository (docs/design.md replaced it)")
        text = URL.sub(" ", line)
        links = [m.group(1) for m in LINK.finditer(line) if is_path_link(m.group(1))]
        refs = [(r, True) for r in links] + [(m.group(1), False) for m in MENTION.finditer(text)]
        done = set(outside)
        for ref, link in refs:
            if ref in done or PATTERN.search(ref):
                continue
            done.add(ref)
            seen.append(ref)
            if not resolves(ref, src, link):
                what = "links to no file" if link and src.suffix == ".md" else "is no file"
                bad.append(f"{rel}:{n}: `{ref}` {what} of the repository")
    return bad


def main(argv):
    files = [Path(a).resolve() for a in argv] if argv else tracked("*.md", "*.rs")
    seen = []
    bad = [b for f in files for b in check(f, seen)]
    for b in bad:
        print(b, file=sys.stderr)
    if bad:
        print(f"{len(bad)} reference(s) to documents outside the repository", file=sys.stderr)
        return 1
    print(f"doc references resolve: {len(seen)} in {len(files)} files, none outside the repository")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
