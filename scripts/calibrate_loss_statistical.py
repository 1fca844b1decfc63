"""Calibration of the reduced loss's statistical threshold (TOLERANCE.md
(S4)): the reduction's accumulation term `c sqrt(n) u sum|l_r|`.

Correct fp32 reductions of `n` per-row loss terms, in the orders real code
uses: one sequential accumulator (a Python/C loop), numpy's pairwise sum,
8 lanes then a tree (SIMD), chunked (sums of 8 or 64 chunks, torchtune's
chunked loss), and PyTorch's CPU `sum` (cascade) when torch imports. Terms
drawn as cross-entropy values: log-normal around 2 to 12 nats, uniform
0..20, near-constant (10 +- 1e-3: correlated roundings), and a few huge
rows among small ones. Each trial's need is `|fl(sum) - sum| / (sqrt(n) u
sum|l|)` (the exact sum by `math.fsum` over the f32 terms); the table is
the largest need per order, and the false alarms at the chosen `c` (8 for
orders with merges, 32 for one accumulator) with a one-sided 95%
Clopper-Pearson upper bound per trial.

Run: python scripts/calibrate_loss_statistical.py [TRIALS_PER_CELL]
(numpy; torch optional).
"""
import math
import sys

import numpy as np

try:
    import torch
except ImportError:  # the torch order is skipped
    torch = None

U = 2.0 ** -24
C, SEQ = 8.0, 32.0
rng = np.random.default_rng(20261206)


def sequential(x):
    s = np.float32(0)
    for v in x:
        s = np.float32(s + v)
    return s


def lanes8(x):
    k = len(x) - len(x) % 8
    acc = np.zeros(8, np.float32)
    for i in range(0, k, 8):
        acc = (acc + x[i:i + 8]).astype(np.float32)
    while len(acc) > 1:
        acc = (acc[0::2] + acc[1::2]).astype(np.float32)
    s = acc[0]
    for v in x[k:]:
        s = np.float32(s + v)
    return s


def chunked(chunks):
    def f(x):
        total = np.float32(0)
        for part in np.array_split(x, chunks):
            total = np.float32(total + np.sum(part, dtype=np.float32))
        return total
    return f


ORDERS = {
    "sequential": (sequential, SEQ),
    "numpy pairwise": (lambda x: np.sum(x, dtype=np.float32), C),
    "8 lanes + tree": (lanes8, C),
    "8 chunks": (chunked(8), C),
    "64 chunks": (chunked(64), C),
}
if torch is not None:
    ORDERS["torch.sum (CPU)"] = (lambda x: np.float32(torch.from_numpy(x).sum().item()), C)


def draw(kind, n):
    if kind == "lognormal":
        x = np.exp(rng.normal(np.log(rng.uniform(2, 12)), 0.5, n))
    elif kind == "uniform":
        x = rng.uniform(0, 20, n)
    elif kind == "near-constant":
        x = 10 + rng.normal(0, 1e-3, n)
    else:  # a few huge rows among small ones
        x = rng.uniform(0, 0.1, n)
        x[rng.integers(0, n, max(1, n // 100))] = rng.uniform(20, 60)
    return x.astype(np.float32)


def clopper_pearson_upper(k, n, conf=0.95):
    if k >= n:
        return 1.0
    lo, hi = k / n, 1.0
    for _ in range(100):
        mid = (lo + hi) / 2
        cdf = sum(math.comb(n, i) * mid ** i * (1 - mid) ** (n - i) for i in range(k + 1))
        lo, hi = (mid, hi) if cdf > 1 - conf else (lo, mid)
    return hi


def main():
    trials = int(sys.argv[1]) if len(sys.argv) > 1 else 4
    sizes = [8, 64, 512, 4096, 8192]
    kinds = ["lognormal", "uniform", "near-constant", "spiky"]
    need = {o: 0.0 for o in ORDERS}
    alarms = {o: 0 for o in ORDERS}
    count = 0
    for n in sizes:
        for kind in kinds:
            for _ in range(trials):
                x = draw(kind, n)
                exact = math.fsum(float(v) for v in x)
                scale = math.sqrt(n) * U * math.fsum(abs(float(v)) for v in x)
                count += 1
                for name, (f, c) in ORDERS.items():
                    r = abs(float(f(x)) - exact) / scale
                    need[name] = max(need[name], r)
                    alarms[name] += r > c
    print(f"{count} trials per order (n in {sizes}, {kinds}, {trials} each)")
    print("| order | max c needed | false alarms at its c | 95% upper bound per trial |")
    print("| --- | --- | --- | --- |")
    for name, (f, c) in ORDERS.items():
        print(f"| {name} | {need[name]:.3f} | {alarms[name]} of {count} (c = {c:g}) | "
              f"{clopper_pearson_upper(alarms[name], count):.2e} |")


if __name__ == "__main__":
    main()
