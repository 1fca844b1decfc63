"""Writes the softcap dumps (Gemma 2's final-logit softcapping, c = 30):

- fixtures/torch/softcap_fp32_math_bf16.safetensors: bf16 logits, then in
  fp32 `x' = 30 * tanh(x / 30)`, log_softmax, gather and entropy, outputs in
  f32 (softcap_dtype=accumulation). Correct code: must pass.
- fixtures/torch/softcap_tanh_x_times_c.safetensors: the same with the
  unsloth-zoo PR #593 kind of formula bug, `tanh(x) * 30`: must fail.

Logits are LLM-like and reach past the cap (|x| up to about 60), where the
softcap bends them. Before writing, it measures torch's fp32 tanh against
f64 on these inputs: the verify default takes tanh within 1 ulp.

Run: python scripts/torch_dumps/softcap.py [OUT_DIR] (torch, safetensors).
"""
import sys

import torch
from safetensors.torch import save_file

N, V, C = 4, 8192, 30.0
g = torch.Generator().manual_seed(20261202)
logits = (6.0 * torch.randn(N, V, generator=g)).to(torch.bfloat16)
top = torch.randint(0, V, (N, 4), generator=g)
logits.scatter_(1, top, (35 + 20 * torch.rand(N, 4, generator=g)).to(torch.bfloat16))
tokens = torch.cat([top[:, 0][: N // 2], torch.randint(0, V, (N - N // 2,), generator=g)])

x = logits.float()
y = x / C
t32 = torch.tanh(y)
t64 = torch.tanh(y.double())
ulp = (t32.double() - t64).abs() / torch.finfo(torch.float32).eps / t64.abs().clamp_min(2.0**-126) * 2
print(f"torch fp32 tanh on these inputs: max error {ulp.max().item():.3f} ulp (vs f64)")
assert ulp.max().item() <= 1.0, "torch's fp32 tanh exceeds 1 ulp: the default model would not cover it"


def outputs(xs):
    lp_all = torch.log_softmax(xs, dim=-1)
    log_probs = lp_all.gather(-1, tokens[:, None]).squeeze(-1)
    entropy = -(lp_all.exp() * lp_all).sum(-1)
    return log_probs, entropy


out_dir = sys.argv[1] if len(sys.argv) > 1 else "fixtures/torch"
meta = {"format_version": "2", "softcap": "30"}
for name, xs in [
    ("softcap_fp32_math_bf16", C * torch.tanh(x / C)),
    ("softcap_tanh_x_times_c", torch.tanh(x) * C),
]:
    log_probs, entropy = outputs(xs)
    path = f"{out_dir}/{name}.safetensors"
    save_file(
        {"logits": logits.contiguous(), "tokens": tokens, "log_probs": log_probs, "entropy": entropy},
        path,
        metadata=meta,
    )
    print(f"wrote {path}")
