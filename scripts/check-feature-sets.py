#!/usr/bin/env python3
"""Checks that `cargo run -p logprobe-cli --bin logprobe` builds every
crate with the features `cargo test --workspace` gives it, so the main job
after the test gate (or the reverse) compiles nothing (docs/build.md).
Compares `cargo tree ... -f '{p} [{f}]'` of the two builds; exit 1 on a
crate whose features differ, with the difference.
"""
import subprocess
import sys


def features(args):
    out = subprocess.run(
        ["cargo", "tree", *args, "--prefix", "none", "-f", "{p} [{f}]"],
        check=True, capture_output=True, text=True,
    ).stdout
    d = {}
    for line in out.splitlines():
        line = line.replace(" (*)", "").strip()
        i = line.find(" [")
        if i < 0:
            continue
        d.setdefault(line[:i], set()).update(f for f in line[i + 2:].rstrip("]").split(",") if f)
    return d


def main():
    tests = features(["--workspace", "-e", "normal,build,dev"])
    binary = features(["-p", "logprobe-cli", "-e", "normal,build"])
    bad = [
        f"{p}: test build only {sorted(tests[p] - f)}, binary only {sorted(f - tests[p])}"
        for p, f in sorted(binary.items())
        if p in tests and tests[p] != f
    ]
    if bad:
        print("the binary's feature set differs from the test build's (each build recompiles these and all above them):", file=sys.stderr)
        for line in bad:
            print("  " + line, file=sys.stderr)
        return 1
    print(f"feature sets agree: {len(binary)} crates of the binary as the test build has them")
    return 0


if __name__ == "__main__":
    sys.exit(main())
