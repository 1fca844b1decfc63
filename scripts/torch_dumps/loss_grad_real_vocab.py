"""Writes real-vocabulary loss-gradient dumps for `BENCHMARKS.md` (not
fixtures): bf16 logits `[N, 152064]` (a Gaussian body, a few dominant
tokens, as an LLM's), `F.cross_entropy` in fp32 from an fp32 leaf and its
autograd `grad_logits` (f32), one dump per case:

- `ce_mean`: `reduction="mean"`, `ignore_index=-100` on every 8th row.
- `ce_sum_smoothing`: `reduction="sum"`, `label_smoothing=0.1`.
- `ce_none`: `reduction="none"` with a random cotangent per row.
- `lse_z_loss`: `torch.logsumexp` and `1e-4 * lse**2` with random
  cotangents `grad_lse`, `grad_z_loss`.

Run: PYTHONPATH=<torch> python scripts/torch_dumps/loss_grad_real_vocab.py OUT_DIR [N]
(torch, safetensors).
"""
import sys

import torch
import torch.nn.functional as F
from safetensors.torch import save_file

out = sys.argv[1]
N = int(sys.argv[2]) if len(sys.argv) > 2 else 16
V = 152064
g = torch.Generator().manual_seed(20261207)
logits = (2.5 * torch.randn(N, V, generator=g)).to(torch.bfloat16)
top = torch.randint(0, V, (N, 4), generator=g)
logits.scatter_(1, top, (12 + 2 * torch.rand(N, 4, generator=g)).to(torch.bfloat16))
tokens = top[:, 0].clone()
tokens[1::3] = torch.randint(0, V, (tokens[1::3].numel(),), generator=g)


def save(name, tensors, **meta):
    meta = {"format_version": "2", **{k: str(v) for k, v in meta.items()}}
    save_file({k: v.contiguous() for k, v in tensors.items()}, f"{out}/{name}.safetensors", metadata=meta)


one = torch.ones(())
t = tokens.clone()
t[::8] = -100
x = logits.float().requires_grad_(True)
loss = F.cross_entropy(x, t, reduction="mean", ignore_index=-100)
(grad,) = torch.autograd.grad(loss, x)
save("ce_mean", {"logits": logits, "tokens": t, "loss": loss.detach(), "grad_loss": one, "grad_logits": grad},
     reduction="mean")

loss = F.cross_entropy(x, tokens, reduction="sum", label_smoothing=0.1)
(grad,) = torch.autograd.grad(loss, x)
save("ce_sum_smoothing", {"logits": logits, "tokens": tokens, "loss": loss.detach(), "grad_loss": one,
                          "grad_logits": grad}, reduction="sum", label_smoothing=0.1)

loss = F.cross_entropy(x, tokens, reduction="none")
cot = torch.randn(N, generator=g)
(grad,) = torch.autograd.grad((loss * cot).sum(), x)
save("ce_none", {"logits": logits, "tokens": tokens, "loss": loss.detach(), "grad_loss": cot, "grad_logits": grad},
     reduction="none")

lse = torch.logsumexp(x, dim=-1)
z = 1e-4 * lse**2
a, b = torch.randn(N, generator=g), torch.randn(N, generator=g)
(grad,) = torch.autograd.grad((a * lse + b * z).sum(), x)
save("lse_z_loss", {"logits": logits, "lse": lse.detach(), "z_loss": z.detach(), "grad_lse": a, "grad_z_loss": b,
                    "grad_logits": grad}, z_loss_coef=1e-4)
print("wrote", out)
