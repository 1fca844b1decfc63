"""Calibrates the statistical tier of a fused linear kernel's own logits
(TOLERANCE.md (S7)): `logits` given beside `hidden` and `lm_head_weight`,
judged entry by entry against the matmul's bound (T29).

Writes dumps into OUTDIR, verifies each with `logprobe verify --json`, and
prints each dump's logits error / statistical threshold (`err/stat`), then
the largest per class of correct code and the smallest per defect.

The grid: H in {1024, 4096}, V in {4096, 32000}, bf16 and fp32 inputs
(hidden `N(0, 1)`, weight `N(0, 1/H) * s`, s in {1, 4}), with and without
a bias; 8 rows. Logits kept in f32 (`lm_head_logits_dtype=accumulation`):
  tune      `F.linear` of the fp32-cast inputs (PyTorch's CPU GEMM)
  heldout   numpy float32 `@` (its BLAS); a 4-row chunked `torch.matmul`
            with the bias added after; one float32 accumulator over H in
            index order (every order is allowed: the model's matmul order
            is unknown)
Defects:
  bf16_acc  dot products accumulated in bf16 (partial sums of 16 products
            rounded to bf16)
  half_w    the weight rounded to float16 first (a wrong input dtype)

Run: [SEED=k] python scripts/calibrate_linear_statistical.py [OUTDIR] [LOGPROBE]
(torch, numpy, safetensors; LOGPROBE defaults to target/release/logprobe).
"""
import itertools
import json
import os
import subprocess
import sys

import numpy as np
import torch
import torch.nn.functional as F
from safetensors.torch import save_file

out = sys.argv[1] if len(sys.argv) > 1 else "/tmp/linear_statistical_calibration"
exe = sys.argv[2] if len(sys.argv) > 2 else "target/release/logprobe"
SEED = int(os.environ.get("SEED", "0"))
os.makedirs(out, exist_ok=True)
DT = {"bf16": torch.bfloat16, "fp32": torch.float32}
N = 8

jobs = []
g = torch.Generator().manual_seed(4545 + SEED)
for h, v, dtype, scale, with_bias in itertools.product([1024, 4096], [4096, 32000], ["bf16", "fp32"], [1.0, 4.0], [False, True]):
    hid = torch.randn(N, h, generator=g).to(DT[dtype])
    w = (torch.randn(v, h, generator=g) * scale / h ** 0.5).to(DT[dtype])
    b = (0.5 * torch.randn(v, generator=g)).to(DT[dtype]) if with_bias else None
    tokens = torch.randint(0, v, (N,), generator=g)
    name = f"h{h}_v{v}_{dtype}_s{scale}_b{int(with_bias)}"
    hf, wf = hid.float(), w.float()
    bf = b.float() if b is not None else None

    def save(cls, tag, logits):
        logits = logits.float()
        lp = torch.log_softmax(logits, -1).gather(-1, tokens[:, None])[:, 0]
        t = {"hidden": hid, "lm_head_weight": w, "tokens": tokens, "logits": logits, "log_probs": lp}
        if b is not None:
            t["lm_head_bias"] = b
        meta = {"format_version": "2", "lm_head_logits_dtype": "accumulation"}
        path = f"{out}/{tag}_{name}.safetensors"
        save_file({k: x.contiguous() for k, x in t.items()}, path, metadata=meta)
        jobs.append((cls, path))

    save("tune:f_linear", "lin", F.linear(hf, wf, bf))
    x = hf.numpy() @ wf.numpy().T
    if bf is not None:
        x = x + bf.numpy()
    save("heldout:numpy", "np", torch.from_numpy(x.astype(np.float32)))
    chunks = [torch.matmul(hf[i:i + 4], wf.t()) for i in range(0, N, 4)]
    x = torch.cat(chunks)
    save("heldout:chunked", "chunk", x + bf if bf is not None else x)
    seq = np.zeros((N, v), dtype=np.float32)
    hn, wn = hf.numpy(), wf.numpy()
    for k in range(h):
        seq += np.outer(hn[:, k], wn[:, k]).astype(np.float32)
    if bf is not None:
        seq += bf.numpy()
    save("heldout:sequential", "seq", torch.from_numpy(seq))
    acc = torch.zeros(N, v, dtype=torch.bfloat16)
    for k in range(0, h, 16):
        part = hf[:, k:k + 16] @ wf[:, k:k + 16].t()
        acc = (acc + part.bfloat16()).bfloat16()
    x = acc.float()
    save("defect:bf16_acc", "bf16acc", x + bf if bf is not None else x)
    save("defect:half_w", "halfw", F.linear(hf, w.half().float(), bf))

worst = {}
for cls, path in jobs:
    r = subprocess.run([exe, "verify", "--json", "--no-progress", path], capture_output=True, text=True)
    doc = json.loads(r.stdout)
    for f in doc["files"]:
        if "outputs" not in f:
            sys.exit(f"{path}: {r.stderr.strip() or f}")
        for o in f["outputs"]:
            if o["output"] != "logits":
                continue
            st = o.get("statistical_max_ratio")
            st = float("inf") if isinstance(st, str) else st
            print(f"{cls:20} {f['name']:36} {o['verdict']:8} err/bound {o['max_ratio']:.3g} err/stat {st:.3g}")
            pick = min if cls.startswith("defect") else max
            worst[cls] = pick(worst.get(cls, (st, f["name"], o["verdict"])), (st, f["name"], o["verdict"]))
print("\nper class: largest err/stat of correct code, smallest of each defect")
for cls, (ratio, name, verdict) in sorted(worst.items()):
    n = sum(1 for c, _ in jobs if c == cls)
    print(f"{cls:20} {n:4} dumps {ratio:9.3g}  {verdict:8} {name}")
