#!/usr/bin/env python3
"""Checks that a second lock file resolves every package it shares with the
workspace's lock to the same version, so both builds share one set of
compiled crates in target/ (docs/build.md).

Usage: check-locks.py WORKSPACE_LOCK OTHER_LOCK   (exit 1 on a mismatch)
"""
import sys
import tomllib


def versions(path):
    out = {}
    with open(path, "rb") as f:
        for p in tomllib.load(f).get("package", []):
            out.setdefault(p["name"], set()).add(p["version"])
    return out


def main():
    if len(sys.argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    ws, other = versions(sys.argv[1]), versions(sys.argv[2])
    bad = [
        f"{name} {sorted(v)} (workspace: {sorted(ws[name])})"
        for name, v in sorted(other.items())
        if name in ws and not v <= ws[name]
    ]
    if bad:
        print(f"{sys.argv[2]} resolves shared packages to other versions than {sys.argv[1]}:", file=sys.stderr)
        for line in bad:
            print("  " + line, file=sys.stderr)
        print("align them with `cargo update --manifest-path properties/python/Cargo.toml -p NAME --precise VERSION`", file=sys.stderr)
        return 1
    shared = sum(1 for name in other if name in ws)
    print(f"locks agree: {shared} shared packages at the workspace's versions")
    return 0


if __name__ == "__main__":
    sys.exit(main())
