"""Calibrates the relative rule's R (TOLERANCE.md, "The relative rule").

Writes dumps of correct implementations and of the defects the rule must
catch into OUTDIR, verifies each with `logprobe verify --json` (the
declared options as given), and prints each dump's largest relative-rule
ratio (`err/care`) per output, then the largest over each class.

Correct implementations come in two sets drawn from different seeds and
written apart:
  tune      the forms TOLERANCE.md models, PyTorch CPU: log_softmax of
            x.float() / T (scale first), the raw x_t - logsumexp(x), the
            subtract-first (x - max) / T, entropy -(p * lp).sum();
            logits at offsets 0 to 1e3, V 256 to 152064, bf16 / fp16 / fp32
  heldout   code written apart from them and not looked at while choosing
            R: torch.distributions.Categorical's entropy, torch.special.entr,
            numpy float32 (pairwise sums, the entropy as ln S - B / S),
            Liger's multiply by fl(1/T), outputs rounded to the logits'
            dtype, and a sequential float32 sum (np.cumsum) verified with
            --model sequential as it declares
  tune/heldout (loss side)   torch.logsumexp and coef * lse**2;
            F.cross_entropy(reduction="none", label_smoothing 0 and 0.1); the policy
            terms from log_softmax's log-prob against references 1e-6 to 1
            away (kl_k3 as expm1(-d) + d); verl's top-k KLs against a
            nearby teacher's top-32; torchtune's ForwardKLLoss (the soft
            cross-entropy) against a nearby teacher
  tune/heldout (reduced loss, R5)   F.cross_entropy mean and sum (tune);
            torchtune's chunked sum / count, a per-row weighted mean,
            numpy float32 np.mean, np.cumsum declared sequential (held
            out); 16 and 512 rows, 10% ignored, smoothing 0 and 0.1
  long      8192-row dumps (V = 4096) of the tune forms and entr, the
            issue's batch size (LONG=0 skips them)
Defects (each must exceed R):
  unshifted entropy   logsumexp(x) - sum(softmax(x) x) at offsets 30 and 100
  sequential, undeclared   the np.cumsum code verified under the default model
  ce_bf16_terms, ce_bf16_total   a mean whose per-token losses are rounded
                      to bf16, or whose chunks' running total is bf16
  k3_low_var_kl       verl's exp(kl) - kl - 1 (reported: it is a defect by
                      (R3) only where it cancels)

Run: [SEED=k] [SETS=forward,loss,reduced,long] python scripts/calibrate_relative.py [OUTDIR] [LOGPROBE]
(torch, numpy, safetensors; LOGPROBE defaults to target/release/logprobe).
"""
import itertools
import json
import os
import subprocess
import sys

import numpy as np
import torch
from safetensors.torch import save_file

out = sys.argv[1] if len(sys.argv) > 1 else "/tmp/relative_calibration"
exe = sys.argv[2] if len(sys.argv) > 2 else "target/release/logprobe"
# Another SEED draws another independent set (the grids' seeds shift by it).
SEED = int(os.environ.get("SEED", "0"))
# The sets to run (SETS=reduced runs the reduced loss's alone).
SETS = os.environ.get("SETS", "forward,loss,reduced,long").split(",")
os.makedirs(out, exist_ok=True)
DT = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def logits(g, n, v, offset, dtype, shape):
    if shape == "flat":
        x = 0.02 * torch.randn(n, v, generator=g)
    else:
        # LLM-like: a Gaussian body and a few dominant tokens.
        x = 2.5 * torch.randn(n, v, generator=g)
        top = torch.randint(0, v, (n, 4), generator=g)
        x.scatter_(1, top, 12 + 2 * torch.rand(n, 4, generator=g))
    x = x + offset
    if dtype == "fp16":
        x = x.clamp(-65000, 65000)
    return x.to(DT[dtype])


def save(name, tensors, meta):
    path = f"{out}/{name}.safetensors"
    save_file({k: t.contiguous() for k, t in tensors.items()}, path, metadata=meta)
    return path


def gather(a, tokens):
    return a.gather(-1, tokens[:, None]).squeeze(-1)


def tune_forms(g, x, t, tokens):
    xf = x.float()
    z = xf / t
    lp = torch.log_softmax(z, -1)
    yield "scale_first", gather(lp, tokens), -(lp.exp() * lp).sum(-1)
    yield "raw", gather(z, tokens) - torch.logsumexp(z, -1), None
    d = (xf - xf.max(-1, keepdim=True).values) / t
    lps = torch.log_softmax(d, -1)
    yield "subtract_first", gather(lps, tokens), -(lps.exp() * lps).sum(-1)


def heldout_forms(g, x, t, tokens):
    xf = x.float()
    z = xf * (1.0 / t)  # Liger: multiply by fl(1/T)
    lp = torch.log_softmax(z, -1)
    cat = torch.distributions.Categorical(logits=z)
    yield "liger_categorical", gather(lp, tokens), cat.entropy()
    p = torch.softmax(z, -1)
    yield "entr", gather(lp, tokens), torch.special.entr(p).sum(-1)
    a = (xf / t).numpy().astype(np.float32)
    m = a.max(-1, keepdims=True)
    dd = a - m
    e = np.exp(dd)
    s = e.sum(-1, dtype=np.float32)
    ls = np.log(s)
    lpn = dd[np.arange(len(a)), tokens.numpy()] - ls
    ent = ls + (e * -dd).sum(-1, dtype=np.float32) / s
    yield "numpy", torch.from_numpy(lpn.astype(np.float32)), torch.from_numpy(ent.astype(np.float32))
    if x.dtype != torch.float32:
        yield "rounded_out", gather(lp, tokens).to(x.dtype), cat.entropy().to(x.dtype)


def sequential(x, t, tokens):
    a = (x.float() / t).numpy().astype(np.float32)
    m = a.max(-1, keepdims=True)
    dd = a - m
    s = np.cumsum(np.exp(dd), -1, dtype=np.float32)[:, -1]
    ls = np.log(s)
    lpr = dd - ls[:, None]
    lp = lpr[np.arange(len(a)), tokens.numpy()]
    ent = -np.cumsum(np.exp(lpr) * lpr, -1, dtype=np.float32)[:, -1]
    return torch.from_numpy(lp.astype(np.float32)), torch.from_numpy(ent.astype(np.float32))


def unshifted_entropy(x, t):
    z = x.float() / t
    return torch.logsumexp(z, -1) - (torch.softmax(z, -1) * z).sum(-1)


def grid(seed):
    if "forward" not in SETS:
        return
    g = torch.Generator().manual_seed(seed)
    for v, dtype, offset, t, shape in itertools.product(
        [256, 4096, 32000, 152064], ["bf16", "fp16", "fp32"], [0, 30, 300, 1000], [1.0, 0.7], ["flat", "llm"]
    ):
        if v == 152064 and (shape == "flat" or t != 1.0):
            continue  # keep the run short at the largest V
        n = 4 if v >= 32000 else 16
        x = logits(g, n, v, offset, dtype, shape)
        tokens = torch.randint(0, v, (n,), generator=g)
        yield f"v{v}_{dtype}_o{offset}_t{t}_{shape}", x, t, tokens


jobs = []  # (class, path, extra args)
for name, x, t, tokens in grid(20261207 + SEED):
    meta = {"temperature": repr(t)}
    for form, lp, ent in tune_forms(None, x, t, tokens):
        ts = {"logits": x, "tokens": tokens, "log_probs": lp}
        if ent is not None:
            ts["entropy"] = ent
        jobs.append(("tune:" + form, save(f"tune_{form}_{name}", ts, meta), []))
for name, x, t, tokens in grid(7_021_126 + SEED):
    meta = {"temperature": repr(t)}
    for form, lp, ent in heldout_forms(None, x, t, tokens):
        ts = {"logits": x, "tokens": tokens, "log_probs": lp, "entropy": ent}
        jobs.append(("heldout:" + form, save(f"heldout_{form}_{name}", ts, meta), []))
    lp, ent = sequential(x, t, tokens)
    path = save(f"seq_{name}", {"logits": x, "tokens": tokens, "log_probs": lp, "entropy": ent}, meta)
    jobs.append(("heldout:sequential_declared", path, ["--model", "sequential"]))
    jobs.append(("defect:sequential_undeclared", path, []))
    if x.dtype == torch.float32 and "o30_" in name or "o300_" in name and x.dtype == torch.float32:
        path = save(f"unshifted_{name}", {"logits": x, "entropy": unshifted_entropy(x, t)}, meta)
        jobs.append(("defect:unshifted_entropy", path, []))
g = torch.Generator().manual_seed(99 + SEED)
for v, off in [(32000, 30), (152064, 30), (32000, 100), (152064, 100)] if "forward" in SETS else []:
    x = 30 + 2 * torch.randn(4, v, generator=g) if off == 30 else logits(g, 4, v, off, "fp32", "llm")
    path = save(f"unshifted_entropy_{v}_{off}", {"logits": x, "entropy": unshifted_entropy(x, 1.0)}, {})
    jobs.append(("defect:unshifted_entropy", path, []))

# The loss side and the policy terms (correct code; verl's low_var_kl, the
# exp(kl) - kl - 1 form, reported as a class of its own).
def loss_side(seed):
    if "loss" not in SETS:
        return
    g = torch.Generator().manual_seed(seed)
    for v, dtype, offset, t in itertools.product([4096, 32000], ["bf16", "fp16", "fp32"], [0, 30, 300], [1.0, 0.7]):
        n = 8
        x = logits(g, n, v, offset, dtype, "llm")
        tokens = torch.randint(0, v, (n,), generator=g)
        yield f"v{v}_{dtype}_o{offset}_t{t}", x, t, tokens, g


for name, x, t, tokens, g in loss_side(31_337 + SEED):
    meta = {"temperature": repr(t), "z_loss_coef": "0.0001", "format_version": "2"}
    z = x.float() / t
    lse = torch.logsumexp(z, -1)
    ts = {"logits": x, "lse": lse, "z_loss": 1e-4 * lse**2}
    jobs.append(("tune:lse_z_loss", save(f"lse_{name}", ts, meta), []))
    for eps in (0.0, 0.1):
        ce = torch.nn.functional.cross_entropy(z, tokens, reduction="none", label_smoothing=eps)
        m = {"temperature": repr(t), "reduction": "none", "label_smoothing": repr(eps), "format_version": "2"}
        ts = {"logits": x, "tokens": tokens, "loss": ce}
        jobs.append(("heldout:cross_entropy_none", save(f"ce{eps}_{name}", ts, m), []))
    lp = gather(torch.log_softmax(z, -1), tokens)
    n = len(tokens)
    mag = 10.0 ** (-6 + 6 * torch.rand(n, generator=g))
    sign = torch.where(torch.rand(n, generator=g) < 0.5, -1.0, 1.0)
    ref = (lp + sign * mag).float()
    old = (lp + 0.05 * torch.randn(n, generator=g)).float()
    d = lp - ref
    meta = {"temperature": repr(t), "format_version": "2"}
    ts = {"logits": x, "tokens": tokens, "ref_log_probs": ref, "old_log_probs": old,
          "kl_k1": d, "kl_k2": 0.5 * d.square(), "kl_abs": d.abs(),
          "kl_k3": torch.expm1(-d) + d, "ratio": torch.exp(lp - old)}
    jobs.append(("heldout:policy_terms", save(f"policy_{name}", ts, meta), []))
    # verl's compute_forward_kl_topk: a nearby teacher's top-32.
    t_lp = torch.log_softmax(z + 0.3 * torch.randn(z.shape, generator=g), -1)
    a, ids = t_lp.topk(32, dim=-1)
    s_lp = torch.log_softmax(z, -1).gather(-1, ids)
    ts = {"logits": x, "topk_ids": ids, "teacher_topk_log_probs": a.contiguous(),
          "forward_kl": (a.exp() * (a - s_lp)).sum(-1), "reverse_kl": (s_lp.exp() * (s_lp - a)).sum(-1)}
    jobs.append(("heldout:topk_kl", save(f"topk_{name}", ts, meta), []))
    # torchtune's ForwardKLLoss: the soft cross-entropy against the teacher.
    tp = torch.softmax(z + 0.3 * torch.randn(z.shape, generator=g), -1)
    ts = {"logits": x, "teacher_probs": tp, "soft_cross_entropy": -(tp * torch.log_softmax(z, -1)).sum(-1)}
    jobs.append(("heldout:soft_cross_entropy", save(f"soft_{name}", ts, meta), []))
    kl = ref - lp
    ts = {"logits": x, "tokens": tokens, "ref_log_probs": ref, "kl_k3": torch.exp(kl) - kl - 1}
    jobs.append(("defect:k3_low_var_kl", save(f"lowvar_{name}", ts, meta), []))

# A reduced cross-entropy (R5): PyTorch's mean and sum (tune), and code
# written apart (held out): torchtune's chunked sum, a per-row weighted
# mean, numpy's pairwise mean and a sequential np.cumsum (declared).
def reduced_side(seed):
    if "reduced" not in SETS:
        return
    g = torch.Generator().manual_seed(seed)
    for n, v, dtype, offset, t in itertools.product([16, 512], [4096, 32000], ["bf16", "fp32"], [0, 30], [1.0, 0.7]):
        x = logits(g, n, v, offset, dtype, "llm")
        tokens = torch.randint(0, v, (n,), generator=g)
        tokens[torch.rand(n, generator=g) < 0.1] = -100
        yield f"n{n}_v{v}_{dtype}_o{offset}_t{t}", x, t, tokens, g


F = torch.nn.functional
for i, (name, x, t, tokens, g) in enumerate(reduced_side(4_242 + SEED)):
    z = x.float() / t
    eps = 0.1 * (i % 2)
    valid = tokens != -100
    counted = valid.sum()
    base = {"temperature": repr(t), "label_smoothing": repr(eps), "format_version": "2"}
    for red in ("mean", "sum"):
        loss = F.cross_entropy(z, tokens, reduction=red, label_smoothing=eps)
        ts = {"logits": x, "tokens": tokens, "loss": loss.reshape(())}
        jobs.append((f"tune:ce_{red}", save(f"red_{red}_{name}", ts, {**base, "reduction": red}), []))
    mean = {**base, "reduction": "mean"}
    total = torch.zeros(())
    for xc, tc in zip(z.chunk(8), tokens.chunk(8)):
        total = total + F.cross_entropy(xc, tc, reduction="sum", label_smoothing=eps)
    ts = {"logits": x, "tokens": tokens, "loss": (total / counted).reshape(())}
    jobs.append(("heldout:ce_chunked_mean", save(f"red_chunked_{name}", ts, mean), []))
    per_row = F.cross_entropy(z, tokens, reduction="none", label_smoothing=eps)
    w = 0.5 + 1.5 * torch.rand(len(tokens), generator=g)
    wl = (w * per_row).sum() / w[valid].sum()
    ts = {"logits": x, "tokens": tokens, "loss_weights": w, "loss": wl.reshape(())}
    jobs.append(("heldout:ce_weighted_mean", save(f"red_weighted_{name}", ts, mean), []))
    kept = per_row[valid].numpy().astype(np.float32)
    ts = {"logits": x, "tokens": tokens, "loss": torch.tensor(np.mean(kept, dtype=np.float32))}
    jobs.append(("heldout:ce_numpy_mean", save(f"red_numpy_{name}", ts, mean), []))
    seq = np.cumsum(per_row.numpy().astype(np.float32), dtype=np.float32)[-1]
    ts = {"logits": x, "tokens": tokens, "loss": torch.tensor(seq / np.float32(counted.item()))}
    jobs.append(("heldout:ce_sequential_mean", save(f"red_seq_{name}", ts, mean), ["--model", "sequential"]))
    # Defects: per-token losses rounded to bf16 (autocast), and a bf16
    # running total across the chunks.
    ts = {"logits": x, "tokens": tokens, "loss": (per_row.bfloat16().float().sum() / counted).reshape(())}
    jobs.append(("defect:ce_bf16_terms", save(f"red_bf16_terms_{name}", ts, mean), []))
    total = torch.zeros((), dtype=torch.bfloat16)
    for xc, tc in zip(z.chunk(8), tokens.chunk(8)):
        total = total + F.cross_entropy(xc, tc, reduction="sum", label_smoothing=eps).bfloat16()
    ts = {"logits": x, "tokens": tokens, "loss": (total.float() / counted).reshape(())}
    jobs.append(("defect:ce_bf16_total", save(f"red_bf16_total_{name}", ts, mean), []))

# Dumps of 8192 rows (the batch), V = 4096: the rule is a ratio of
# two maxima over the dump, so its false-alarm rate per dump is measured at
# that size too (LONG=0 skips them).
if "long" in SETS and os.environ.get("LONG", "1") != "0":
    g = torch.Generator().manual_seed(8192 + SEED)
    for dtype, offset in itertools.product(["bf16", "fp32"], [0, 30]):
        x = logits(g, 8192, 4096, offset, dtype, "llm")
        tokens = torch.randint(0, 4096, (8192,), generator=g)
        name = f"long_{dtype}_o{offset}"
        for form, lp, ent in tune_forms(None, x, 1.0, tokens):
            ts = {"logits": x, "tokens": tokens, "log_probs": lp}
            if ent is not None:
                ts["entropy"] = ent
            jobs.append(("long:" + form, save(f"{name}_{form}", ts, {}), []))
        z = x.float()
        p = torch.softmax(z, -1)
        ts = {"logits": x, "tokens": tokens, "log_probs": gather(torch.log_softmax(z, -1), tokens),
              "entropy": torch.special.entr(p).sum(-1)}
        jobs.append(("long:entr", save(f"{name}_entr", ts, {}), []))
        t8 = tokens.clone()
        t8[torch.rand(8192, generator=g) < 0.1] = -100
        ts = {"logits": x, "tokens": t8, "loss": torch.nn.functional.cross_entropy(z, t8).reshape(())}
        jobs.append(("long:ce_mean", save(f"{name}_ce_mean", ts, {"reduction": "mean", "format_version": "2"}), []))

worst = {}
worst_stat = {}  # the statistical tier's largest err/stat per class
for cls, path, extra in jobs:
    r = subprocess.run([exe, "verify", "--json", "--no-progress", *extra, path], capture_output=True, text=True)
    doc = json.loads(r.stdout)
    for f in doc["files"]:
        if "outputs" not in f:
            sys.exit(f"{path}: {r.stderr.strip() or f}")
        for o in f["outputs"]:
            st = o.get("statistical_max_ratio")
            if isinstance(st, (int, float)) and not cls.startswith("defect"):
                k = (cls, o["output"])
                worst_stat[k] = max(worst_stat.get(k, (0.0, ""))[0], st), f["name"]
            rr = o.get("relative_rule")
            if rr is None:
                continue
            ratio = float(rr["ratio"]) if not isinstance(rr["ratio"], str) else float("inf")
            key = (cls, o["output"])
            print(f"{cls:32} {o['output']:10} {f['name']:60} {o['verdict']:8} err/care {ratio:.3g}")
            if key not in worst or ratio > worst[key][0]:
                worst[key] = (ratio, f["name"], o["verdict"])
            if cls.startswith("defect"):
                worst[key] = min(worst[key], (ratio, f["name"], o["verdict"]))
print("\nper class: largest err/care of correct code, smallest of each defect")
for (cls, output), (ratio, name, verdict) in sorted(worst.items()):
    print(f"{cls:32} {output:10} {ratio:9.3g}  {verdict:8} {name}")
print("\nper class of correct code: largest err/stat (the statistical tier)")
for (cls, output), (ratio, name) in sorted(worst_stat.items()):
    print(f"{cls:32} {output:10} {ratio:9.3g}  {name}")
