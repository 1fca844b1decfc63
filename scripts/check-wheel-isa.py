#!/usr/bin/env python3
"""Scans a wheel's native module for instructions beyond the x86-64 baseline.

    python3 scripts/check-wheel-isa.py WHEEL_OR_SO [--list]

The wheel is built for plain x86-64 (docs/build.md, "CPU baseline"): an
AVX2, AVX-512, FMA or BMI instruction may appear only in code chosen at run
time after a CPU check. The script disassembles the module (`objdump -d`),
groups instructions by the function symbol they fall in, and fails on any
function that uses such an instruction and is not one of the dispatched
paths below. What counts: any use of a ymm / zmm / opmask register, any
VEX- or EVEX-encoded instruction (mnemonics `v...`), and the BMI1/BMI2/
LZCNT/MOVBE/ADX instructions of x86-64-v3.

Dispatched paths (each entered only after `is_x86_feature_detected!` or
GMP's fat-binary CPU check):
  - our `#[target_feature(enable = "avx2")]` / AVX-512 functions and what the
    compiler inlined into them: every `mod x86` of ours, and the kernels'
    `row::block`, `row::elem`, `grad_block`, `gradient` and `exp` twins;
  - GMP built with `--enable-fat` (gmp-mpfr-sys): its per-CPU `__gmpn_*`
    variants, selected by `__gmpn_cpuvec_init`;
  - crates with their own run-time detection (memchr, aho-corasick,
    chacha20, half's F16C conversions, compiler-builtins' fma): ALLOWED.
Exits 1 naming each offending function with one sample instruction.
"""

import os
import re
import subprocess
import sys
import tempfile
import zipfile

# Substrings of a demangled function symbol that mark a dispatched path.
ALLOWED = (
    # Ours: `#[target_feature]` functions behind `is_x86_feature_detected!`
    # (besides every `mod x86` of ours: OURS below).
    "logprobe_kernels::row::block::",
    "logprobe_kernels::row::elem::",
    "logprobe_kernels::grad_block::",
    "logprobe_kernels::gradient::",
    "logprobe_kernels::exp::exp_f32_nonpos_n_avx",
    "logprobe_verify::tolerance::bounds::lanes::x86::",
    # Libraries that detect the CPU at run time themselves.
    "memchr::arch::x86_64::",
    "aho_corasick::packed::",
    "chacha20::backends::avx2::",
    "compiler_builtins::math::libm_math::arch::x86::fma::fma",
    "half::binary16::arch::x86::",
)
# Our convention: the AVX2 / AVX-512 twins of a scalar path live in a `mod x86`.
OURS = re.compile(r"logprobe_\w+::(?:\w+::)*x86::")
# GMP's fat-binary variants: __gmpn_<op>_<cpu>.
GMP_FAT = re.compile(r"^__gmpn_\w+_(?:k8|k10|bd1|bd2|bd4|bobcat|jaguar|zen|zen2|zen3|core2|coreinhm|"
                     r"coreisbr|coreihwl|coreibwl|skylake|atom|silvermont|goldmont|nano|pentium4|"
                     r"haswell|broadwell|sandybridge|nehalem|x86_64|fat)\w*$")
WIDE_REG = re.compile(r"%(?:ymm|zmm)\d+|%k[0-7]\b")
# (`tzcnt` is not here: rustc emits it only as `rep bsf`, which CPUs without
# BMI1 execute as `bsf`, for inputs known to be non-zero, where both agree.)
BEYOND_BASELINE = {
    "andn", "bextr", "blsi", "blsmsk", "blsr", "bzhi", "pdep", "pext", "rorx", "sarx", "shlx",
    "shrx", "mulx", "lzcnt", "movbe", "adcx", "adox",
}
FUNC = re.compile(r"^[0-9a-f]+ <(.+)>:$")
INSN = re.compile(r"^\s+[0-9a-f]+:\s+(.*)$")


def native_module(path, tmp):
    if not path.endswith(".whl"):
        return path
    with zipfile.ZipFile(path) as z:
        names = [n for n in z.namelist() if n.endswith(".so")]
        if len(names) != 1:
            sys.exit(f"{path}: expected one native module, found {names}")
        return z.extract(names[0], tmp)


def beyond(insn):
    mnemonic = insn.split()[0] if insn.split() else ""
    if mnemonic in ("rep", "lock", "notrack", "bnd", "data16", "cs", "ds") and len(insn.split()) > 1:
        mnemonic = insn.split()[1]
    if WIDE_REG.search(insn):
        return True
    if mnemonic.startswith("v") and mnemonic not in ("verr", "verw"):
        return True
    return mnemonic in BEYOND_BASELINE


def main():
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    listing = "--list" in sys.argv[1:]
    if len(args) != 1:
        sys.exit(__doc__)
    with tempfile.TemporaryDirectory() as tmp:
        so = native_module(args[0], tmp)
        dis = subprocess.run(["objdump", "-d", "-C", "--no-show-raw-insn", so], check=True,
                             capture_output=True, text=True).stdout
    func, funcs, bad, allowed_hits, total = None, 0, {}, {}, 0
    for line in dis.splitlines():
        m = FUNC.match(line)
        if m:
            func, funcs = m.group(1), funcs + 1
            continue
        m = INSN.match(line)
        if not m or func is None:
            continue
        insn = m.group(1).split("#")[0].strip()
        total += 1
        if not beyond(insn):
            continue
        plain = func.split("@")[0]
        if any(a in plain for a in ALLOWED) or OURS.search(plain) or GMP_FAT.match(plain):
            allowed_hits[plain] = allowed_hits.get(plain, 0) + 1
        else:
            bad.setdefault(plain, insn)
    if funcs < 100:
        print(f"{args[0]}: only {funcs} function symbols: is the module stripped? "
              "(properties/python/pyproject.toml keeps them)", file=sys.stderr)
        return 1
    if listing:
        for f, n in sorted(allowed_hits.items()):
            print(f"  dispatched: {n:6} {f[:140]}")
    if bad:
        print(f"{args[0]}: {len(bad)} function(s) outside the dispatched paths use instructions "
              "beyond x86-64:", file=sys.stderr)
        for f, insn in sorted(bad.items()):
            print(f"  {f[:160]}: {insn}", file=sys.stderr)
        return 1
    n_hits = sum(allowed_hits.values())
    print(f"check-wheel-isa: {total} instructions in {funcs} functions; {n_hits} beyond x86-64, "
          f"all in {len(allowed_hits)} run-time dispatched functions")
    return 0


if __name__ == "__main__":
    sys.exit(main())
