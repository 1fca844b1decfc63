"""A chunked log-prob / entropy / top-k kernel with its VJP, in PyTorch (CPU
or CUDA), with the planted bugs of kernel_numpy.py (its numpy twin, which CI
runs). Same contract and math (see kernel_numpy.py); here every operation is
PyTorch's own in the accumulation dtype (f32 for f32/bf16/f16 logits, f64
for f64), as a framework kernel computes it: torch.exp, torch.log, sums.

    python3 adapter.py --kernel torch [--bug NAME] --in IN --out OUT
    LOGPROBE_TORCH_DEVICE=cuda python3 adapter.py --kernel torch --persistent
"""
import os

import numpy as np
import torch

BUGS = ("none", "entropy-no-max-shift", "padded-vocab-not-truncated",
        "dropped-chunk-remainder", "batch-dependent")
DEVICE = os.environ.get("LOGPROBE_TORCH_DEVICE", "cpu")
DTYPES = {"f64": torch.float64, "f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16}


def make_kernel(bug="none"):
    if bug not in BUGS:
        raise SystemExit(f"unknown bug {bug!r}; one of {', '.join(BUGS)}")

    def kernel(inputs, meta):
        out = run(inputs, meta, bug)
        return {k: v.cpu().numpy() for k, v in out.items()}

    return kernel


def tensor(a):
    """A torch tensor on DEVICE: from the adapter's numpy arrays, or as
    `logprobe.fuzz(fn)` passes them (torch tensors, bf16 included)."""
    if isinstance(a, torch.Tensor):
        return a.to(DEVICE)
    return torch.from_numpy(np.ascontiguousarray(a)).to(DEVICE)


@torch.no_grad()
def run(inputs, meta, bug):
    dtype = meta["logits_dtype"]
    # From the adapter, bf16 arrives as exact f32 values: back to the kernel's
    # own dtype (in-process torch tensors already have it).
    x = tensor(inputs["logits"]).to(DTYPES[dtype])
    acc = torch.float64 if dtype == "f64" else torch.float32
    n, vt = x.shape
    vocab = vt if bug == "padded-vocab-not-truncated" else int(meta["vocab_size"])
    T = float(meta["temperature"])
    chunk = int(meta["chunk_size"])
    wanted = [o for o in meta["outputs"].split(",") if o]
    ii = int(meta["ignore_index"])
    get = lambda k: tensor(inputs[k]) if k in inputs else None
    tokens, mask, ids = get("tokens"), get("sampling_mask"), get("topk_ids")
    g_lp, g_h, g_tk = get("grad_log_probs"), get("grad_entropy"), get("grad_topk_log_probs")
    k = 0 if ids is None else ids.shape[1]
    splits = max(1, 8 // max(n, 1)) if bug == "batch-dependent" else 1
    ninf = float("-inf")

    def rowsum(a):
        if splits == 1 or a.shape[1] < splits:
            return a.sum(dim=1)
        total = None
        for p in torch.tensor_split(a, splits, dim=1):
            total = p.sum(dim=1) if total is None else total + p.sum(dim=1)
        return total

    def shifted(xc, allowed):
        if meta["temperature_dtype"] == "input":
            z = (xc.to(acc) / T).to(xc.dtype).to(acc)  # PyTorch's logits.div_(T): two roundings
            m = torch.where(allowed, z, ninf).amax(dim=1, keepdim=True)
            d = z - m
        else:
            xa = xc.to(acc)
            m = torch.where(allowed, xa, ninf).amax(dim=1, keepdim=True)
            d = (xa - m) / T
        return torch.where(allowed, d, ninf)

    out = {"log_probs": torch.zeros(n, dtype=acc, device=DEVICE),
           "entropy": torch.zeros(n, dtype=acc, device=DEVICE),
           "topk_log_probs": torch.zeros(n, k, dtype=acc, device=DEVICE),
           "grad_logits": torch.zeros(n, vt, dtype=acc, device=DEVICE)}
    end = n - n % chunk if bug == "dropped-chunk-remainder" else n
    for s in range(0, end, chunk):
        e_ = min(s + chunk, end)
        xc = x[s:e_, :vocab]
        rows = torch.arange(e_ - s, device=DEVICE)
        finite = xc > ninf
        allowed = finite if mask is None else finite & mask[s:e_, :vocab]
        d = shifted(xc, allowed)
        ed = torch.exp(d)
        S = rowsum(ed)
        lnS = torch.log(S)
        p = ed / S[:, None]
        dx = torch.zeros_like(d)
        if tokens is not None:
            t = tokens[s:e_]
            keep = t != ii
            tt = torch.where(keep, t, 0)
            out["log_probs"][s:e_] = torch.where(keep, d[rows, tt] - lnS, 0.0)
            if g_lp is not None:
                g = torch.where(keep, g_lp[s:e_].to(acc), 0.0)
                dx -= g[:, None] * p
                dx[rows, tt] += g
        if ids is not None:
            idc = ids[s:e_]
            tk = torch.gather(d, 1, idc) - lnS[:, None]
            out["topk_log_probs"][s:e_] = tk
            if g_tk is not None:
                # A masked id is a constant (no gradient); a -inf logit is not masked.
                live = torch.ones_like(idc, dtype=torch.bool) if mask is None else torch.gather(mask[s:e_], 1, idc)
                G = torch.where(live, g_tk[s:e_].to(acc), 0.0)
                dx -= G.sum(dim=1)[:, None] * p
                for j in range(k):
                    dx[rows, idc[:, j]] += G[:, j]
        if "entropy" in wanted or g_h is not None:
            w_allowed = allowed if meta["entropy_logits"] == "masked" else finite
            if bug == "entropy-no-max-shift":
                zw = torch.where(w_allowed, xc.to(acc) / T, ninf)
                ew = torch.exp(zw)
                Sw = rowsum(ew)
                q = ew / Sw[:, None]
                H = torch.log(Sw) - rowsum(torch.where(q > 0, q * zw, 0.0))
                e, R = zw, H - torch.log(Sw)  # R = -sum q z, unshifted as well
            else:
                e = shifted(xc, w_allowed)
                ew = torch.exp(e)
                Sw = rowsum(ew)
                q = ew / Sw[:, None]
                R = rowsum(torch.where(q > 0, -q * e, 0.0))
                H = torch.log(Sw) + R
            out["entropy"][s:e_] = H
            if g_h is not None:
                h = g_h[s:e_].to(acc)
                dx -= torch.where(q > 0, h[:, None] * q * (e + R[:, None]), 0.0)
        out["grad_logits"][s:e_, :vocab] = dx / T
    return {name: out[name] for name in wanted}
