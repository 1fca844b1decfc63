"""Writes the softcapped cross-entropy dumps (Gemma 2's final-logit
softcapping, c = 30, as its trainers compute the loss):

- fixtures/torch/softcap_cross_entropy_gemma2_bf16.safetensors: bf16 logits
  at Gemma 2's vocabulary (V = 256000, N = 4, one row at ignore_index),
  then in fp32 `x' = 30 * tanh(x / 30)` and `F.cross_entropy(x', tokens,
  reduction="mean", label_smoothing=0.1, ignore_index=-100)`, stored f32
  (meta softcap=30, softcap_dtype=accumulation). Correct code: must pass.
- fixtures/torch/softcap_cross_entropy_cap_skipped.safetensors: the same
  recipe (V = 32768) with the softcap left out of the loss path (the loss
  taken from the raw logits while the model declares c = 30, as a fused
  loss that ignores `final_logit_softcapping`): must fail.

Logits are LLM-like with a few dominant tokens past the cap (35-55), where
the softcap bends them. Before writing, it checks torch's fp32 tanh against
f64 on these inputs: the verify default takes tanh within 1 ulp.

Run: /work/torchenv/bin/python scripts/torch_dumps/softcap_cross_entropy.py [OUT_DIR]
(torch, safetensors).
"""
import sys

import torch
import torch.nn.functional as F
from safetensors.torch import save_file

C, EPS, IGNORE = 30.0, 0.1, -100
out_dir = sys.argv[1] if len(sys.argv) > 1 else "fixtures/torch"
g = torch.Generator().manual_seed(20261203)


def rows(n, v):
    logits = (6.0 * torch.randn(n, v, generator=g)).to(torch.bfloat16)
    top = torch.randint(0, v, (n, 4), generator=g)
    logits.scatter_(1, top, (35 + 20 * torch.rand(n, 4, generator=g)).to(torch.bfloat16))
    tokens = top[:, 0].clone()
    tokens[1] = torch.randint(0, v, (1,), generator=g)
    tokens[2] = IGNORE
    return logits, tokens


def check_tanh(x):
    y = x / C
    t64 = torch.tanh(y.double())
    ulp = (torch.tanh(y).double() - t64).abs() / torch.finfo(torch.float32).eps
    ulp = ulp / t64.abs().clamp_min(2.0**-126) * 2
    print(f"torch fp32 tanh on these inputs: max error {ulp.max().item():.3f} ulp (vs f64)")
    assert ulp.max().item() <= 1.0, "torch's fp32 tanh exceeds 1 ulp: the default model would not cover it"


meta = {
    "format_version": "2",
    "softcap": "30",
    "reduction": "mean",
    "label_smoothing": str(EPS),
}
for name, (n, v), capped in [
    ("softcap_cross_entropy_gemma2_bf16", (4, 256000), True),
    ("softcap_cross_entropy_cap_skipped", (4, 32768), False),
]:
    logits, tokens = rows(n, v)
    x = logits.float()
    check_tanh(x)
    xs = C * torch.tanh(x / C) if capped else x
    loss = F.cross_entropy(xs, tokens, reduction="mean", label_smoothing=EPS, ignore_index=IGNORE)
    path = f"{out_dir}/{name}.safetensors"
    save_file(
        {"logits": logits.contiguous(), "tokens": tokens, "loss": loss.contiguous()},
        path,
        metadata=meta,
    )
    print(f"wrote {path}: loss {loss.item():.6f}")
