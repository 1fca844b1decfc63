"""Writes the worked example of `logprobe compare` (docs/compare.md) to
fixtures/torch/compare/: the same rows as a trainer and a bf16 rollout
engine see them.

- trainer_f32.safetensors: f32 logits [B, T, V] of a causal LM's response,
  log-probs from PyTorch's fp32 log_softmax (the trainer's careful path),
  a row_mask (response tokens 1, prompt tokens 0).
- rollout_bf16.safetensors: the same logits rounded to bf16 (as a bf16
  rollout engine holds them), log-probs from PyTorch's bf16 log_softmax
  (output bf16); the same tokens and row_mask.
- rollout_bf16_log_probs_only.safetensors: the rollout's tokens, row_mask
  and log-probs only (what vLLM / SGLang return: no logits).

Tokens are sampled from softmax(z) of the f32 logits (a rollout samples its
own tokens), so the log-probs are those RL code sees (-0.1 to -8 nats).

Run: /work/torchenv/bin/python scripts/torch_dumps/compare_bf16_rollout.py [OUT_DIR]
(torch, safetensors).
"""
import os
import sys

import torch
from safetensors.torch import save_file

B, T, V = 2, 12, 32000
g = torch.Generator().manual_seed(20261222)
# LLM-like rows: a Gaussian body and a few dominant tokens per position,
# with a spread of peakedness (confident and uncertain positions).
logits = 2.0 * torch.randn(B, T, V, generator=g)
top = torch.randint(0, V, (B, T, 6), generator=g)
peak = 6.0 + 8.0 * torch.rand(B, T, 1, generator=g)
logits.scatter_(2, top, peak + 1.5 * torch.randn(B, T, 6, generator=g))
logits = logits.float().contiguous()
probs = torch.softmax(logits.double(), dim=-1).reshape(B * T, V)
tokens = torch.multinomial(probs, 1, generator=g).reshape(B, T)
# The first 4 positions of each sequence are prompt: excluded (verl's response_mask).
row_mask = torch.ones(B, T, dtype=torch.bool)
row_mask[:, :4] = False

# Trainer: fp32 log_softmax over f32 logits.
lp_a_all = torch.log_softmax(logits, dim=-1)
lp_a = lp_a_all.gather(-1, tokens[..., None]).squeeze(-1)

# Rollout: logits held in bf16, PyTorch's bf16 log_softmax.
logits_b = logits.to(torch.bfloat16)
lp_b_all = torch.log_softmax(logits_b, dim=-1)
assert lp_b_all.dtype == torch.bfloat16
lp_b = lp_b_all.gather(-1, tokens[..., None]).squeeze(-1)

out = sys.argv[1] if len(sys.argv) > 1 else "fixtures/torch/compare"
os.makedirs(out, exist_ok=True)
meta = {"format_version": "2"}
save_file(
    {"logits": logits, "tokens": tokens, "row_mask": row_mask,
     "log_probs": lp_a.contiguous()},
    f"{out}/trainer_f32.safetensors", metadata=meta)
save_file(
    {"logits": logits_b.contiguous(), "tokens": tokens, "row_mask": row_mask,
     "log_probs": lp_b.contiguous()},
    f"{out}/rollout_bf16.safetensors", metadata=meta)
save_file(
    {"tokens": tokens, "row_mask": row_mask, "log_probs": lp_b.contiguous()},
    f"{out}/rollout_bf16_log_probs_only.safetensors", metadata=meta)
d = (lp_a.double() - lp_b.double())[row_mask]
print(f"wrote {out}: {int(row_mask.sum())} response rows, "
      f"mean |lp_a - lp_b| = {d.abs().mean():.3e}, max = {d.abs().max():.3e}")
