#!/usr/bin/env python3
"""A fused linear + cross-entropy kernel in numpy behind fuzz protocol v2
(docs/fuzz-protocol.md, "Version 2"), with planted bugs: the example that
`logprobe fuzz --exec ... --fused-linear` runs in CI (numpy only).

One-shot:    logprobe fuzz --fused-linear --exec 'python3 fused_linear_kernel.py --in {in} --out {out}'
Persistent:  logprobe fuzz --fused-linear --exec-persistent 'python3 fused_linear_kernel.py --persistent'

The request holds hidden [N, H], lm_head_weight [V, H], optionally
lm_head_bias [V], tokens [N] and grad_log_probs [N] (bf16 or f32); the
answer holds every name of meta["outputs"]. The kernel (Liger's algorithm):
rows chunk_size at a time (each row's products on their own, so the per-row
outputs do not depend on the chunking); logits x = hidden @ W.T in f32, kept in the
inputs' dtype under lm_head_logits_dtype=input (then + bias, rounded
again), in f32 under accumulation; z = softcap(x) / T; log_probs, entropy
and lse from log_softmax(z) in f32; the logit gradient
g = c (onehot - p) f / T (f the softcap's 1 - tanh^2), kept like the
logits; grad_hidden = g W, grad_lm_head_weight += g^T hidden and
grad_lm_head_bias += sum g in f32 across chunks, rounded to the inputs'
dtype once at the end.

Planted bugs (--bug):
  bf16-grad-weight-accumulation  grad_lm_head_weight / bias kept in bf16 between chunks
  dropped-remainder              the last partial chunk never reaches the weight gradients
  bias-forward-only              grad_lm_head_bias left at 0
  softcap-backward-missing       the backward omits 1 - tanh^2
  chunk-dependent                the vocabulary sum is split in chunk_size parts
                                 (right, but its bits depend on the chunking:
                                 found under --require chunk-invariant)
"""
import argparse, json, struct, sys

import numpy as np

BUGS = ("none", "bf16-grad-weight-accumulation", "dropped-remainder",
        "bias-forward-only", "softcap-backward-missing", "chunk-dependent")
READ = {"F64": "<f8", "F32": "<f4", "BF16": "<u2", "F16": "<f2", "I64": "<i8"}


def to_bf16(a):
    """f32 values rounded to bf16 (nearest, ties to even), as f32."""
    u = np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)
    u = (u + (((u >> 16) & 1) + 0x7FFF)) & 0xFFFF0000
    return u.astype(np.uint32).view(np.float32)


def read_dump(b):
    (n,) = struct.unpack("<Q", b[:8])
    header = json.loads(b[8:8 + n])
    meta = dict(header.pop("__metadata__", None) or {})
    tensors, dtypes = {}, {}
    for name, t in header.items():
        s, e = t["data_offsets"]
        a = np.frombuffer(b[8 + n + s:8 + n + e], dtype=READ[t["dtype"]]).reshape(t["shape"])
        if t["dtype"] == "BF16":  # exact: the high half of the f32 bits
            a = (a.astype(np.uint32) << 16).view(np.float32)
        tensors[name], dtypes[name] = a, t["dtype"]
    return tensors, dtypes, meta


def write_dump(tensors):
    """tensors: name -> (f32 array, "F32" or "BF16")."""
    header, blobs, off = {}, [], 0
    for name, (a, dt) in tensors.items():
        a = np.ascontiguousarray(a, dtype=np.float32)
        data = (a.view(np.uint32) >> 16).astype("<u2").tobytes() if dt == "BF16" else a.astype("<f4").tobytes()
        header[name] = {"dtype": dt, "shape": list(a.shape), "data_offsets": [off, off + len(data)]}
        blobs.append(data)
        off += len(data)
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    return struct.pack("<Q", len(h)) + h + b"".join(blobs)


def kernel(t, dtypes, meta, bug="none"):
    bf16 = dtypes["hidden"] == "BF16"
    keep = meta.get("lm_head_logits_dtype", "input") == "input"
    rnd = to_bf16 if bf16 else (lambda a: np.asarray(a, dtype=np.float32))
    hidden, w = t["hidden"].astype(np.float32), t["lm_head_weight"].astype(np.float32)
    bias = t.get("lm_head_bias")
    tokens = t["tokens"]
    temperature = np.float32(float(meta["temperature"]))
    cap = np.float32(float(meta["softcap"])) if "softcap" in meta else None
    ignore = int(meta["ignore_index"])
    chunk = max(1, int(meta.get("chunk_size", "1")))
    cot = t.get("grad_log_probs")
    n, h = hidden.shape
    v = w.shape[0]
    lp, ent, lse = (np.zeros(n, np.float32) for _ in range(3))
    gh = np.zeros((n, h), np.float32)
    gw = np.zeros((v, h), np.float32)
    gb = np.zeros(v, np.float32)
    for r0 in range(0, n, chunk):
        rows = slice(r0, min(n, r0 + chunk))
        # Row by row: a row's bits do not depend on the chunk it is in
        # (a matrix product's kernel, and its sums, may change with the rows).
        x = np.stack([hidden[i] @ w.T for i in range(rows.start, rows.stop)])
        if keep:
            x = rnd(x)
        if bias is not None:
            x = x + bias.astype(np.float32)
            if keep:
                x = rnd(x)
        f = None
        if cap is not None:
            th = np.tanh(x / cap)
            x, f = cap * th, (1 - th * th).astype(np.float32)
        z = (x / temperature).astype(np.float32)
        m = z.max(axis=1, keepdims=True)
        e = np.exp(z - m)
        if bug == "chunk-dependent":
            s = sum(p.sum(axis=1, keepdims=True) for p in np.array_split(e, chunk, axis=1))
        else:
            s = e.sum(axis=1, keepdims=True)
        p = e / s
        lse[rows] = (m + np.log(s))[:, 0]
        ent[rows] = (np.log(s)[:, 0] - (p * (z - m)).sum(axis=1))
        tok = tokens[rows]
        valid = tok != ignore
        idx = np.where(valid, tok, 0)
        lp[rows] = np.where(valid, z[np.arange(len(tok)), idx] - lse[rows], 0.0)
        if cot is None:
            continue
        c = np.where(valid, cot[rows], 0.0).astype(np.float32)[:, None]
        onehot = np.zeros_like(p)
        onehot[np.arange(len(tok))[valid], tok[valid]] = 1.0
        g = c * (onehot - p) / temperature
        if f is not None and bug != "softcap-backward-missing":
            g = g * f
        if keep:
            g = rnd(g)
        gh[rows] = np.stack([gi @ w for gi in g])
        if bug == "dropped-remainder" and rows.stop - rows.start < chunk:
            continue
        gw += g.T @ hidden[rows]
        if bug != "bias-forward-only":
            gb += g.sum(axis=0)
        if bug == "bf16-grad-weight-accumulation":
            gw, gb = to_bf16(gw), to_bf16(gb)
    dt = "BF16" if bf16 else "F32"
    out = {"log_probs": (lp, "F32"), "entropy": (ent, "F32"), "lse": (lse, "F32"),
           "grad_hidden": (rnd(gh), dt), "grad_lm_head_weight": (rnd(gw), dt),
           "grad_lm_head_bias": (rnd(gb), dt)}
    return {k: out[k] for k in meta["outputs"].split(",") if k}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--in", dest="inp")
    ap.add_argument("--out")
    ap.add_argument("--persistent", action="store_true")
    ap.add_argument("--bug", default="none", choices=BUGS)
    args = ap.parse_args()
    call = lambda b: write_dump(kernel(*read_dump(b), bug=args.bug))
    if not args.persistent:
        with open(args.inp, "rb") as f:
            out = call(f.read())
        with open(args.out, "wb") as f:
            f.write(out)
        return
    stdin, stdout = sys.stdin.buffer, sys.stdout.buffer
    sys.stdout = sys.stderr  # stdout carries frames only
    while True:
        head = stdin.read(8)
        if len(head) < 8:
            return
        (n,) = struct.unpack("<Q", head)
        out = call(stdin.read(n))
        stdout.write(struct.pack("<Q", len(out)) + out)
        stdout.flush()


if __name__ == "__main__":
    main()
