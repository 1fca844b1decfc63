"""A chunked log-prob / entropy / top-k kernel with its VJP, in numpy: the
twin of kernel_torch.py that CI runs (no PyTorch needed), with planted bugs.

Contract (docs/fuzz-protocol.md, in-process form):
    kernel(inputs: dict[str, np.ndarray], meta: dict[str, str]) -> dict[str, np.ndarray]

Math: docs/design.md, "The math". Per row, z = x / T (T in the
accumulation dtype, f32 for f32/bf16/f16 logits, f64 for f64); shifted
d = (x - max) / T (subtract, then scale), or with temperature_dtype=input
d = z - max z where z = round_input(round_acc(x / T)); masked entries -inf;
log_probs = d_t - ln S, S = sum exp(d); entropy over w (unmasked logits, or
masked with entropy_logits=masked) = ln S_w + sum q |e| (e = w - max w);
gradients dx_j = (g (1[j=t] - p_j) + sum_k G_k (1[j=id_k] - p_j)
- h q_j (e_j + R)) / T. Rows are processed chunk_size at a time.
Sums are numpy's (pairwise, in the accumulation dtype); exp and ln are
evaluated in f64 and rounded to the accumulation dtype (within 1 ulp).

Planted bugs (make_kernel(bug)):
  entropy-no-max-shift        entropy as ln S - sum q z on unshifted z (overflows at large offsets)
  padded-vocab-not-truncated  uses every column, ignoring vocab_size
  dropped-chunk-remainder     rows past the last whole chunk are never computed
  batch-dependent             the vocabulary sum is split in 8 // N parts (bits depend on the batch)
"""
import numpy as np

BUGS = ("none", "entropy-no-max-shift", "padded-vocab-not-truncated",
        "dropped-chunk-remainder", "batch-dependent", "lse-missing-max")


def round_bf16(x):
    """f32 -> nearest bf16 (ties to even), as f32."""
    b = x.astype(np.float32).view(np.uint32).astype(np.uint64)
    b = ((b + 0x7FFF + ((b >> 16) & 1)) >> 16) << 16
    return b.astype(np.uint32).view(np.float32)


def make_kernel(bug="none"):
    if bug not in BUGS:
        raise SystemExit(f"unknown bug {bug!r}; one of {', '.join(BUGS)}")

    def kernel(inputs, meta):
        with np.errstate(all="ignore"):
            return run(inputs, meta, bug)

    return kernel


def run(inputs, meta, bug):
    x = inputs["logits"]
    dtype = meta["logits_dtype"]
    acc = np.float64 if dtype == "f64" else np.float32
    n, vt = x.shape
    vocab = vt if bug == "padded-vocab-not-truncated" else int(meta["vocab_size"])
    T = acc(float(meta["temperature"]))
    chunk = int(meta["chunk_size"])
    wanted = [o for o in meta["outputs"].split(",") if o]
    ii = int(meta["ignore_index"])
    tokens = inputs.get("tokens")
    mask = inputs.get("sampling_mask")
    ids = inputs.get("topk_ids")
    k = 0 if ids is None else ids.shape[1]
    g_lp, g_h, g_tk = (inputs.get(c) for c in ("grad_log_probs", "grad_entropy", "grad_topk_log_probs"))
    splits = max(1, 8 // max(n, 1)) if bug == "batch-dependent" else 1

    def exp(a):
        return np.exp(a.astype(np.float64)).astype(acc)

    def log(a):
        return np.log(a.astype(np.float64)).astype(acc)

    def rowsum(a):
        if splits == 1 or a.shape[1] < splits:
            return a.sum(axis=1, dtype=acc)
        parts = [p.sum(axis=1, dtype=acc) for p in np.array_split(a, splits, axis=1)]
        total = parts[0]
        for p in parts[1:]:
            total = total + p
        return total

    def shifted(xc, allowed):
        """d = shifted scaled logits (max allowed entry 0), -inf where not allowed."""
        if meta["temperature_dtype"] == "input":
            z = xc / T
            if dtype == "bf16":
                z = round_bf16(z)
            elif dtype == "f16":
                z = z.astype(np.float16).astype(np.float32)
            m = np.where(allowed, z, -np.inf).max(axis=1, keepdims=True)
            d = z - m
        else:
            m = np.where(allowed, xc, -np.inf).max(axis=1, keepdims=True)
            d = (xc - m) / T
        return np.where(allowed, d, -np.inf)

    def top(xc, allowed):
        """The max allowed scaled logit (what shifted() subtracted), so lse = top + ln S."""
        if meta["temperature_dtype"] == "input":
            z = xc / T
            if dtype == "bf16":
                z = round_bf16(z)
            elif dtype == "f16":
                z = z.astype(np.float16).astype(np.float32)
            return np.where(allowed, z, -np.inf).max(axis=1)
        return np.where(allowed, xc, -np.inf).max(axis=1) / T

    out = {"log_probs": np.zeros(n, acc), "entropy": np.zeros(n, acc),
           "topk_log_probs": np.zeros((n, k), acc), "grad_logits": np.zeros((n, vt), acc),
           "lse": np.zeros(n, acc), "z_loss": np.zeros(n, acc)}
    end = n - n % chunk if bug == "dropped-chunk-remainder" else n
    for s in range(0, end, chunk):
        r = slice(s, min(s + chunk, end))
        xc = x[r, :vocab].astype(acc)
        rows = np.arange(xc.shape[0])
        finite = xc > -np.inf
        allowed = finite if mask is None else finite & mask[r, :vocab]
        d = shifted(xc, allowed)
        ed = exp(d)
        S = rowsum(ed)
        lnS = log(S)
        p = ed / S[:, None]
        dx = np.zeros_like(xc)
        if "lse" in wanted or "z_loss" in wanted:
            # The bug: the max subtracted for the shift never added back.
            lse = lnS if bug == "lse-missing-max" else top(xc, allowed) + lnS
            out["lse"][r] = lse
            if "z_loss" in wanted:
                out["z_loss"][r] = acc(float(meta["z_loss_coef"])) * lse * lse
        if tokens is not None:
            t = tokens[r]
            keep = t != ii
            tt = np.where(keep, t, 0)
            lp = d[rows, tt] - lnS
            out["log_probs"][r] = np.where(keep, lp, 0)
            if g_lp is not None:
                g = np.where(keep, g_lp[r], 0).astype(acc)
                dx -= g[:, None] * p
                dx[rows, tt] += g
        if ids is not None:
            idc = ids[r]
            tk = np.take_along_axis(d, idc, axis=1) - lnS[:, None]
            out["topk_log_probs"][r] = tk
            if g_tk is not None:
                # A masked id is a constant (no gradient); a -inf logit is not masked.
                live = np.ones_like(idc, bool) if mask is None else np.take_along_axis(mask[r], idc, axis=1)
                G = np.where(live, g_tk[r], 0).astype(acc)
                dx -= G.sum(axis=1, dtype=acc)[:, None] * p
                for j in range(k):
                    dx[rows, idc[:, j]] += G[:, j]
        if "entropy" in wanted or g_h is not None:
            w_allowed = allowed if meta["entropy_logits"] == "masked" else finite
            if bug == "entropy-no-max-shift":
                zw = np.where(w_allowed, xc / T, -np.inf)
                ew = np.exp(zw)
                Sw = rowsum(ew)
                q = ew / Sw[:, None]
                H = np.log(Sw) - rowsum(np.where(q > 0, q * zw, 0))
                e, R = zw, H - np.log(Sw)  # R = -sum q z, unshifted as well
            else:
                e = shifted(xc, w_allowed)
                ew = exp(e)
                Sw = rowsum(ew)
                q = ew / Sw[:, None]
                R = rowsum(np.where(q > 0, -q * e, 0))
                H = log(Sw) + R
            out["entropy"][r] = H
            if g_h is not None:
                h = g_h[r].astype(acc)
                dx -= np.where(q > 0, h[:, None] * q * (e + R[:, None]), 0)
        out["grad_logits"][r, :vocab] = dx / T
    return {name: out[name] for name in wanted}
