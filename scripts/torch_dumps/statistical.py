"""Dumps for the statistical tier (issue 13), made with PyTorch / numpy CPU.

Defects (small; written to fixtures/torch, expected "suspect": within the
sound lanes=8 bound, beyond the statistical threshold):
  unshifted_entropy_offset30    logsumexp(x) - sum(softmax(x) x), no max shift, logits N(30, 2^2), V=152064
  unshifted_entropy_realistic   the same on LLM-like rows (Gaussian body at +8, dominant tokens at ~20-22), V=152064
  untruncated_padding           log_softmax over V+128 columns (128 zero-logit pads) on near-uniform rows, V=152064
  bf16_log_softmax_zero         torch.log_softmax on bf16 logits (CPU), bf16 output 0.0 where exact is ~-1.4e-4, V=32000
Held-out correct code (large; written to OUTDIR, not shipped):
  heldout_{torch,numpy}_{gauss,uniform,uniformbf16}_V.safetensors

Run: python scripts/torch_dumps/statistical.py FIXTURE_DIR OUTDIR
"""
import sys

import numpy as np
import torch
from safetensors.torch import save_file

fix = sys.argv[1] if len(sys.argv) > 1 else "fixtures/torch"
out = sys.argv[2] if len(sys.argv) > 2 else "/tmp/statdumps"
g = torch.Generator().manual_seed(20261313)


def realistic(n, v):
    x = 2.5 * torch.randn(n, v, generator=g)
    top = torch.randint(0, v, (n, 4), generator=g)
    x.scatter_(1, top, 12 + 2 * torch.rand(n, 4, generator=g))
    return x


def unshifted_entropy(x):
    # logsumexp(x) - sum(softmax(x) * x): the second term is not taken
    # over the shifted logits, so it cancels against lse at |x| ~ 30.
    return torch.logsumexp(x, -1) - (torch.softmax(x, -1) * x).sum(-1)


# 1. Unshifted entropy.
for name, x in [
    ("unshifted_entropy_offset30", 30 + 2 * torch.randn(2, 152064, generator=g)),
    ("unshifted_entropy_realistic", realistic(2, 152064) + 8),
]:
    x = x.float()
    save_file({"logits": x.contiguous(), "entropy": unshifted_entropy(x)}, f"{fix}/{name}.safetensors")

# 2. Untruncated padding: 128 zero-logit columns left in the softmax.
V, PAD, N = 152064, 128, 2
x = torch.cat([0.02 * torch.randn(N, V, generator=g), torch.zeros(N, PAD)], -1).float()
tokens = torch.randint(0, V, (N,), generator=g)
lp = torch.log_softmax(x, -1)  # over V + PAD: the defect
save_file(
    {"logits": x.contiguous(), "tokens": tokens, "log_probs": lp.gather(-1, tokens[:, None]).squeeze(-1)},
    f"{fix}/untruncated_padding.safetensors",
    metadata={"vocab_size": str(V)},
)

# 3. PyTorch CPU bf16 log_softmax: the dominant token's log-prob rounds to 0.
V, N = 32000, 4
x = torch.randn(N, V, generator=g)
tokens = torch.randint(0, V, (N,), generator=g)
x[torch.arange(N), tokens] = 19.75
xb = x.bfloat16()
lpb = torch.log_softmax(xb, -1).gather(-1, tokens[:, None]).squeeze(-1)
exact = torch.log_softmax(xb.double(), -1).gather(-1, tokens[:, None]).squeeze(-1)
print("bf16 log_softmax:", lpb.tolist(), "exact:", exact.tolist())
save_file({"logits": xb.contiguous(), "tokens": tokens, "log_probs": lpb}, f"{fix}/bf16_log_softmax_zero.safetensors")

# Held-out correct code.
for v in [32000, 152064]:
    n = 16 if v < 100000 else 8
    for dist in ["gauss", "uniform", "uniformbf16"]:
        if dist == "gauss":
            x = realistic(n, v)
        else:
            x = 0.02 * torch.randn(n, v, generator=g)
        if dist == "uniformbf16":
            x = x.bfloat16()
        xf = x.float()
        tokens = torch.randint(0, v, (n,), generator=g)
        # torch: log_softmax, gather, entropy in log-softmax form.
        lp = torch.log_softmax(xf, -1)
        save_file(
            {"logits": x.contiguous(), "tokens": tokens,
             "log_probs": lp.gather(-1, tokens[:, None]).squeeze(-1),
             "entropy": -(lp.exp() * lp).sum(-1)},
            f"{out}/heldout_torch_{dist}_{v}.safetensors",
        )
        # numpy float32: shifted logsumexp (pairwise sums), entropy fused form.
        a = xf.numpy().astype(np.float32)
        m = a.max(-1, keepdims=True)
        d = a - m
        e = np.exp(d)
        s = e.sum(-1, dtype=np.float32)
        ls = np.log(s)
        lpn = d[np.arange(n), tokens.numpy()] - ls
        ent = ls + (e * -d).sum(-1, dtype=np.float32) / s
        save_file(
            {"logits": x.contiguous(), "tokens": tokens,
             "log_probs": torch.from_numpy(lpn.astype(np.float32)),
             "entropy": torch.from_numpy(ent.astype(np.float32))},
            f"{out}/heldout_numpy_{dist}_{v}.safetensors",
        )
print("done")
