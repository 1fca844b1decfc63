"""Writes the loss side's gradient dumps into fixtures/torch (format
version 2: `grad_lse`, `grad_z_loss`, `grad_loss` with `grad_logits`;
docs/dump-from-pytorch.md), each gradient from PyTorch's autograd:

- `z_loss_grad_fp32_math_bf16`: bf16 logits (V=32000, N=8), `lse =
  torch.logsumexp` and `z_loss = coef * lse**2` in fp32 from an fp32 leaf,
  `grad_logits` of `(a * lse + b * z_loss).sum()` (random cotangents `a`,
  `b`), all stored f32. Correct: pass.
- `cross_entropy_mean_smoothing_grad_bf16`: bf16 logits (V=8192, N=16, 4
  rows at ignore_index), `F.cross_entropy(x, reduction="mean",
  label_smoothing=0.1, ignore_index=-100)` in fp32 and its autograd
  `grad_logits` (`grad_loss = 1`, stored `[]`). Correct: pass.
- `cross_entropy_mean_grad_over_n`: the same loss (correct) with the
  gradient of `F.cross_entropy(..., reduction="sum") / N`: the mean's
  gradient divided by all `N` rows instead of the 12 counted ones, the
  bug kind of a hand-written backward that forgets `ignore_index` in its
  divisor. Must fail (the loss passes; `grad_logits` fails).
- `cross_entropy_neg_inf_smoothing_grad`: f32 logits (V=64, N=4), one
  `-inf` logit in each of two counted rows, `label_smoothing=0.1`,
  `reduction="none"`: the loss of those rows is `+inf` (PyTorch's value)
  and autograd's gradient stays finite (`-eps / V` at the `-inf` entry,
  scaled by the row's cotangent), which is logprobe's definition too.
  Correct: pass.

Run: /work/torchenv/bin/python scripts/torch_dumps/loss_grad.py [OUT_DIR]
(torch, safetensors).
"""
import sys

import torch
import torch.nn.functional as F
from safetensors.torch import save_file

out_dir = sys.argv[1] if len(sys.argv) > 1 else "fixtures/torch"
written = []


def save(name, tensors, **meta):
    meta = {"format_version": "2", **{k: str(v) for k, v in meta.items()}}
    path = f"{out_dir}/{name}.safetensors"
    save_file({k: v.contiguous() for k, v in tensors.items()}, path, metadata=meta)
    written.append(path)


def llm_logits(n, v, seed):
    """bf16 rows: a Gaussian body, a few dominant tokens; their ids."""
    g = torch.Generator().manual_seed(seed)
    logits = (2.5 * torch.randn(n, v, generator=g)).to(torch.bfloat16)
    top = torch.randint(0, v, (n, 4), generator=g)
    logits.scatter_(1, top, (12 + 2 * torch.rand(n, 4, generator=g)).to(torch.bfloat16))
    return logits, top, g


# z-loss (and lse) with their gradient.
COEF = 1e-4
logits, top, g = llm_logits(8, 32000, 20261219)
x = logits.float().requires_grad_(True)
lse = torch.logsumexp(x, dim=-1)
z_loss = COEF * lse**2
a = torch.randn(8, generator=g)
b = torch.randn(8, generator=g)
(grad,) = torch.autograd.grad((a * lse + b * z_loss).sum(), x)
save(
    "z_loss_grad_fp32_math_bf16",
    {"logits": logits, "lse": lse.detach(), "z_loss": z_loss.detach(),
     "grad_lse": a, "grad_z_loss": b, "grad_logits": grad},
    z_loss_coef=COEF,
)

# F.cross_entropy mean with label smoothing and ignore_index, and a bug.
N, V, EPS, IGNORE = 16, 8192, 0.1, -100
logits, top, g = llm_logits(N, V, 20261220)
tokens = top[:, 0].clone()
tokens[1::5] = torch.randint(0, V, (tokens[1::5].numel(),), generator=g)
tokens[3::4] = IGNORE
x = logits.float().requires_grad_(True)
loss = F.cross_entropy(x, tokens, reduction="mean", label_smoothing=EPS, ignore_index=IGNORE)
(grad,) = torch.autograd.grad(loss, x)
one = torch.ones(())
save(
    "cross_entropy_mean_smoothing_grad_bf16",
    {"logits": logits, "tokens": tokens, "loss": loss.detach(), "grad_loss": one,
     "grad_logits": grad},
    reduction="mean",
    label_smoothing=EPS,
)
wrong = F.cross_entropy(x, tokens, reduction="sum", label_smoothing=EPS, ignore_index=IGNORE) / N
(grad_bad,) = torch.autograd.grad(wrong, x)
save(
    "cross_entropy_mean_grad_over_n",
    {"logits": logits, "tokens": tokens, "loss": loss.detach(), "grad_loss": one,
     "grad_logits": grad_bad},
    reduction="mean",
    label_smoothing=EPS,
)

# A -inf logit among the allowed entries under label smoothing.
g = torch.Generator().manual_seed(20261221)
x = 2 * torch.randn(4, 64, generator=g)
tokens = torch.tensor([3, 17, IGNORE, 40])
x[0, 9] = float("-inf")
x[3, 0] = float("-inf")
x = x.requires_grad_(True)
loss = F.cross_entropy(x, tokens, reduction="none", label_smoothing=EPS, ignore_index=IGNORE)
cot = torch.randn(4, generator=g)
(grad,) = torch.autograd.grad((loss * cot).sum(), x)
assert torch.isinf(loss[0]) and torch.isinf(loss[3]) and torch.isfinite(grad).all()
save(
    "cross_entropy_neg_inf_smoothing_grad",
    {"logits": x.detach(), "tokens": tokens, "loss": loss.detach(), "grad_loss": cot,
     "grad_logits": grad},
    reduction="none",
    label_smoothing=EPS,
)
print("wrote " + ", ".join(written))
