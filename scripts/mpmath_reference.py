#!/usr/bin/env python3
"""Independent reference values for logprobe's exact oracle.

Computes, with mpmath at 150 significant digits (printed to 50: log-probs near 0
are differences that cancel up to ~100 digits), the lse,
log-prob, entropy, top-k log-probs and the VJP of a few dozen rows, straight
from docs/design.md's definitions (softmax, -sum q log q, the gradient formula),
without the oracle's cancellation-free forms, directed rounding or Ziv loop.
Inputs are exact binary values of their dtype; the temperature is rounded to
the accumulation dtype (f32 for f32/bf16/f16 logits) as the spec does.

Output: reference/tests/data/mpmath_reference.txt (read by
reference/tests/mpmath_reference.rs). Deterministic: same output every run.

Usage: python3 scripts/mpmath_reference.py [OUT]
"""

import random
import struct
import sys
from fractions import Fraction

import mpmath
from mpmath import mp, mpf

mp.dps = 150

DTYPES = {  # name: (precision, min normal exponent, max exponent)
    "f64": (53, -1022, 1023),
    "f32": (24, -126, 127),
    "bf16": (8, -126, 127),
    "f16": (11, -14, 15),
}


def round_dtype(q, dtype):
    """Correct rounding (nearest, ties to even) of the exact rational q."""
    p, emin, emax = DTYPES[dtype]
    if q == 0:
        return 0.0
    s = -1 if q < 0 else 1
    a = abs(q)
    e = a.numerator.bit_length() - a.denominator.bit_length()
    if Fraction(2) ** e > a:
        e -= 1
    quantum_exp = max(e, emin) - (p - 1)
    scaled = a / Fraction(2) ** quantum_exp
    n = scaled.numerator // scaled.denominator
    rem = scaled - n
    if rem > Fraction(1, 2) or (rem == Fraction(1, 2) and n % 2 == 1):
        n += 1
    r = Fraction(n) * Fraction(2) ** quantum_exp
    if r > (2 - Fraction(2) ** (1 - p)) * Fraction(2) ** emax:
        return s * float("inf")
    return s * float(r)


def value(rng, dtype, scale, offset):
    """An exact value of dtype near offset + N(0, scale)."""
    return round_dtype(Fraction(offset) + Fraction(rng.gauss(0.0, scale)), dtype)


def s50(x):
    if x == mpmath.inf:
        return "inf"
    if x == -mpmath.inf:
        return "-inf"
    if x != 0 and abs(x) < mpf("1e-100000"):
        # Below any exponent range: the sign is all that matters.
        return "tiny+" if x > 0 else "tiny-"
    return mpmath.nstr(x, 50, min_fixed=1, max_fixed=0)


def rf(x):
    return repr(float(x))


def make_cases():
    rng = random.Random(20240611)
    cases = []
    n = 0
    for dtype in ["f64", "f32", "bf16", "f16"]:
        for variant in range(9):
            n += 1
            v = [1, 2, 5, 17, 64, 9, 33, 3, 12][variant]
            pad = 2 if variant in (2, 6) else 0
            scale = [3.0, 1.0, 10.0, 0.5, 4.0, 2.0, 8.0, 1.5, 6.0][variant]
            offset = 0.0
            if variant == 7:
                offset = {"f64": 1e30, "f32": 1e30, "bf16": 1e30, "f16": 60000.0}[dtype]
                scale = {"f64": 1e16, "f32": 1e23, "bf16": 1e28, "f16": 200.0}[dtype]
            if dtype == "f16":
                scale = min(scale, 6.0) if variant != 7 else scale
            t_raw = [1.0, 0.7, 2.0, 0.5, 1.3, 1.0, 0.9, 1.0, 3.0][variant]
            acc = "f64" if dtype == "f64" else "f32"
            t = round_dtype(Fraction(t_raw), acc)
            tmode = "input" if (variant in (1, 4) and dtype != "f64") else "acc"
            ent = ["unmasked", "masked", "unmasked", "none", "unmasked", "masked", "unmasked", "unmasked", "unmasked"][variant]
            x = [value(rng, dtype, scale, offset) for _ in range(v)]
            if variant in (4, 6):
                x[rng.randrange(v)] = float("-inf")
            mask = None
            if variant in (2, 4, 5, 6):
                mask = [rng.random() < 0.7 for _ in range(v)]
            # Make sure one allowed finite entry exists.
            allowed = [j for j in range(v) if (mask is None or mask[j]) and x[j] != float("-inf")]
            if not allowed:
                j0 = [j for j in range(v) if x[j] != float("-inf")][0]
                mask[j0] = True
                allowed = [j0]
            token = rng.choice(allowed)
            if variant == 8:
                token = -100
            k = min(3, v)
            topk = [rng.randrange(v) for _ in range(k)]
            g = round(rng.uniform(-2, 2), 3)
            h = round(rng.uniform(-2, 2), 3) if ent != "none" else 0.0
            gk = [round(rng.uniform(-1, 1), 3) for _ in range(k)]
            cases.append(dict(name=f"{dtype}_{variant}", dtype=dtype, t=t, tmode=tmode, ent=ent, x=x, pad=pad,
                              mask=mask, token=token, topk=topk, g=g, h=h, gk=gk))
    return cases


def compute(c):
    dtype, t, x, mask = c["dtype"], c["t"], c["x"], c["mask"]
    v = len(x)
    T = mpf(t)
    if c["tmode"] == "input":
        zs = [round_dtype(Fraction(xi) / Fraction(t), dtype) if xi != float("-inf") else xi for xi in x]
        z = [mpf(zi) for zi in zs]
        scale = mpf(1)
    else:
        z = [mpf(xi) / T if xi != float("-inf") else -mpmath.inf for xi in x]
    allowed = [mask is None or mask[j] for j in range(v)]
    fin = [z[j] != -mpmath.inf for j in range(v)]
    zp = [z[j] if (allowed[j] and fin[j]) else -mpmath.inf for j in range(v)]
    m = max(zj for zj in zp if zj != -mpmath.inf)
    ex = [mpmath.exp(zj - m) if zj != -mpmath.inf else mpf(0) for zj in zp]
    S = mpmath.fsum(ex)
    lse = m + mpmath.log(S)
    p = [e / S for e in ex]
    out = {"lse": lse}
    out["log_prob"] = ((z[c["token"]] - m) - mpmath.log(S)) if c["token"] != -100 else None
    out["topk"] = [((zp[i] - m) - mpmath.log(S)) if zp[i] != -mpmath.inf else -mpmath.inf for i in c["topk"]]
    q = [mpf(0)] * v
    wdev = [mpf(0)] * v
    if c["ent"] != "none":
        if c["ent"] == "masked":
            w = zp
        else:
            w = [z[j] if fin[j] else -mpmath.inf for j in range(v)]
        mw = max(wj for wj in w if wj != -mpmath.inf)
        exw = [mpmath.exp(wj - mw) if wj != -mpmath.inf else mpf(0) for wj in w]
        Sw = mpmath.fsum(exw)
        q = [e / Sw for e in exw]
        # E_q[w] - mw, then w_j - E_q[w] (shift-invariant, no huge values)
        ew = mpmath.fsum(q[j] * (w[j] - mw) for j in range(v) if w[j] != -mpmath.inf)
        out["entropy"] = mpmath.log(Sw) - ew
        wdev = [(w[j] - mw - ew) if w[j] != -mpmath.inf else mpf(0) for j in range(v)]
    else:
        out["entropy"] = None
    # VJP, docs/design.md's formula; masked top-k ids are constants.
    g = mpf(c["g"]) if c["token"] != -100 else mpf(0)
    grad = []
    for j in range(v):
        acc = mpf(0)
        if c["token"] != -100:
            acc += g * ((1 if j == c["token"] else 0) - p[j])
        for i, gk in zip(c["topk"], c["gk"]):
            if allowed[i]:
                acc += mpf(gk) * ((1 if j == i else 0) - p[j])
        acc -= mpf(c["h"]) * q[j] * wdev[j]
        grad.append(acc / T)
    out["grad"] = grad + [mpf(0)] * c["pad"]
    return out


def main():
    path = sys.argv[1] if len(sys.argv) > 1 else "reference/tests/data/mpmath_reference.txt"
    lines = [f"# generated by scripts/mpmath_reference.py with mpmath {mpmath.__version__} at {mp.dps} digits; do not edit"]
    for c in make_cases():
        r = compute(c)
        lines.append(f"case {c['name']}")
        lines.append(f"dtype {c['dtype']}")
        lines.append(f"temperature {rf(c['t'])}")
        lines.append(f"temperature_dtype {c['tmode']}")
        lines.append(f"entropy_logits {c['ent']}")
        lines.append(f"vocab_size {len(c['x'])}")
        # Padding columns hold an arbitrary finite value (ignored).
        lines.append("x " + " ".join(rf(xi) for xi in c["x"] + [7.0] * c["pad"]))
        if c["mask"] is not None:
            lines.append("mask " + " ".join("1" if a else "0" for a in c["mask"] + [False] * c["pad"]))
        lines.append(f"token {c['token']}")
        lines.append("topk " + " ".join(str(i) for i in c["topk"]))
        lines.append("cot " + " ".join(rf(y) for y in [c["g"], c["h"]] + c["gk"]))
        lines.append("lse " + s50(r["lse"]))
        lines.append("log_prob " + (s50(r["log_prob"]) if r["log_prob"] is not None else "none"))
        lines.append("entropy " + (s50(r["entropy"]) if r["entropy"] is not None else "none"))
        lines.append("topk_log_probs " + " ".join(s50(y) for y in r["topk"]))
        lines.append("grad " + " ".join(s50(y) for y in r["grad"]))
        lines.append("end")
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
