"""Writes fixtures/torch/temperature_input_bf16.safetensors: PyTorch's own
`bf16_logits / 0.6` (the temperature applied in the logits' dtype, two
roundings: the f32 quotient, then bf16), then fp32 log_softmax, gather and
entropy, outputs in f32. Correct code: `logprobe verify` must pass it with
`temperature_dtype=input` (expected.json). About 4% of bf16 quotients by 0.6
are double-rounding entries, where one rounding of the exact quotient would
give the neighbouring bf16 value.

Run: python scripts/torch_dumps/temperature_input_bf16.py (torch, safetensors).
"""
import sys

import torch
from safetensors.torch import save_file

N, V, T = 8, 32000, 0.6
g = torch.Generator().manual_seed(20261201)
# LLM-like rows: a Gaussian body, a few dominant tokens.
logits = (2.5 * torch.randn(N, V, generator=g)).to(torch.bfloat16)
top = torch.randint(0, V, (N, 4), generator=g)
logits.scatter_(1, top, (12 + 2 * torch.rand(N, 4, generator=g)).to(torch.bfloat16))
tokens = torch.cat([top[:, 0][: N // 2], torch.randint(0, V, (N - N // 2,), generator=g)])

z = logits / T  # bf16 tensor: PyTorch divides in f32 and rounds to bf16
assert z.dtype == torch.bfloat16
lp_all = torch.log_softmax(z.float(), dim=-1)
log_probs = lp_all.gather(-1, tokens[:, None]).squeeze(-1)
entropy = -(lp_all.exp() * lp_all).sum(-1)

out = sys.argv[1] if len(sys.argv) > 1 else "fixtures/torch/temperature_input_bf16.safetensors"
save_file(
    {"logits": logits.contiguous(), "tokens": tokens, "log_probs": log_probs, "entropy": entropy},
    out,
    metadata={"temperature": str(T), "temperature_dtype": "input"},
)
print(f"wrote {out}")
