"""Writes two z-loss dumps into fixtures/torch (the loss side: `lse` and
`z_loss = z_loss_coef * lse^2`, PaLM's auxiliary loss as Liger's and
Cut Cross-Entropy's kernels return it):

- `z_loss_fp32_math_bf16`: bf16 logits (V=32000), `torch.logsumexp` in fp32,
  `z_loss = coef * lse**2` in fp32, both stored as f32. Correct code: pass.
- `z_loss_from_bf16_lse`: the same, but `lse` materialised in bf16 (the
  logits' dtype) before it is squared, a real bug kind of kernels that store
  the logsumexp in the activation dtype for the backward. `lse` itself is
  correctly rounded (it passes); `z_loss` is off by
  `2 coef lse * 1/2 ulp_bf16(lse)`, far beyond f32 rounding: fail.

Run: /work/torchenv/bin/python scripts/torch_dumps/z_loss.py [OUT_DIR]
(torch, safetensors).
"""
import sys

import torch
from safetensors.torch import save_file

N, V, COEF = 8, 32000, 1e-4
g = torch.Generator().manual_seed(20261217)
# LLM-like rows: a Gaussian body, a few dominant tokens.
logits = (2.5 * torch.randn(N, V, generator=g)).to(torch.bfloat16)
top = torch.randint(0, V, (N, 4), generator=g)
logits.scatter_(1, top, (12 + 2 * torch.rand(N, 4, generator=g)).to(torch.bfloat16))
tokens = top[:, 0].clone()

x = logits.float()
lse = torch.logsumexp(x, dim=-1)
log_probs = x.gather(-1, tokens[:, None]).squeeze(-1) - lse
z_loss = COEF * lse**2

out_dir = sys.argv[1] if len(sys.argv) > 1 else "fixtures/torch"
meta = {"format_version": "2", "z_loss_coef": str(COEF)}
save_file(
    {"logits": logits.contiguous(), "tokens": tokens, "log_probs": log_probs,
     "lse": lse, "z_loss": z_loss},
    f"{out_dir}/z_loss_fp32_math_bf16.safetensors",
    metadata=meta,
)
lse_bf16 = lse.to(torch.bfloat16)
z_bad = COEF * lse_bf16.float() ** 2
save_file(
    {"logits": logits.contiguous(), "lse": lse_bf16, "z_loss": z_bad},
    f"{out_dir}/z_loss_from_bf16_lse.safetensors",
    metadata=meta,
)
print(f"wrote {out_dir}/z_loss_fp32_math_bf16.safetensors, {out_dir}/z_loss_from_bf16_lse.safetensors")
