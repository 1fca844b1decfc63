"""Writes three policy-term dumps into fixtures/torch (issue 18: the KL
estimators against a reference policy and the PPO importance ratio):

- `kl_k3_low_var_kl_bf16`: bf16 logits (V=32000, 4 of 16 rows at
  ignore_index), the student's log-probs from `log_softmax` in fp32, and
  verl's `kl_penalty(logprob, ref_logprob, "low_var_kl")` in fp32 (`kl =
  clamp(ref - lp, -20, 20)`, `kld = exp(kl) - kl - 1`, `clamp(kld, -10,
  10)`), with `k1 = lp - ref`, `abs`, `mse` (k2); `ref_log_probs` at offsets
  from 1e-7 to 40 nats (the clamps bind on some rows). Correct code: pass.
- `ppo_ratio_fp32`: the same logits, `old_log_probs` near the log-probs,
  verl's `compute_policy_loss` ratio `exp(clamp(lp - old, -20, 20))` in
  fp32. Correct code: pass.
- `kl_k3_naive_in_bf16`: k3 computed by the same formula with the log-probs
  and the reference log-probs in bf16 (a model run under bf16 autocast):
  `exp(kl) - kl - 1` cancels near 0 at bf16's 8 bits, so small KLs come out
  as 0 or as bf16 rounding noise. Real bug kind: fail.

Run: /work/torchenv/bin/python scripts/torch_dumps/policy_terms.py [OUT_DIR]
(torch, safetensors).
"""
import sys

import torch
from safetensors.torch import save_file

N, V = 16, 32000
g = torch.Generator().manual_seed(20261218)
logits = (2.5 * torch.randn(N, V, generator=g)).to(torch.bfloat16)
top = torch.randint(0, V, (N, 4), generator=g)
logits.scatter_(1, top, (10 + 3 * torch.rand(N, 4, generator=g)).to(torch.bfloat16))
tokens = top[:, 0].clone()
tokens[torch.tensor([3, 7, 11, 15])] = -100

x = logits.float()
lsm = torch.log_softmax(x, dim=-1)
lp = lsm.gather(-1, tokens.clamp(min=0)[:, None]).squeeze(-1)
lp = torch.where(tokens == -100, torch.zeros_like(lp), lp)

# Reference log-probs at offsets of every scale, both signs: tiny (where
# naive k3 cancels), moderate, and beyond the clamps (|d| > 20, k3 > 10).
offsets = torch.tensor(
    [1e-7, -3e-7, 2e-5, -1e-4, 3e-3, -0.02, 0.1, -0.4,
     1.0, -2.5, 5.0, -8.0, 25.0, -30.0, 0.7, -40.0],
    dtype=torch.float32,
)
ref = (lp + offsets).float()


def low_var_kl(logprob, ref_logprob):
    # verl core_algos.kl_penalty(..., "low_var_kl"), as published.
    kl = ref_logprob - logprob
    kl = torch.clamp(kl, min=-20, max=20)
    ratio = torch.exp(kl)
    kld = (ratio - kl - 1).contiguous()
    return torch.clamp(kld, min=-10, max=10)


k1 = lp - ref
k2 = 0.5 * (lp - ref).square()
kabs = (lp - ref).abs()
k3 = low_var_kl(lp, ref)

out_dir = sys.argv[1] if len(sys.argv) > 1 else "fixtures/torch"
meta = {"format_version": "2", "kl_input_clamp": "20", "kl_output_clamp": "10"}
save_file(
    {"logits": logits.contiguous(), "tokens": tokens, "log_probs": lp,
     "ref_log_probs": ref, "kl_k1": k1, "kl_k2": k2, "kl_k3": k3, "kl_abs": kabs},
    f"{out_dir}/kl_k3_low_var_kl_bf16.safetensors",
    metadata=meta,
)

# PPO: the behaviour policy close to the current one (a few steps off policy).
old = (lp + torch.tensor(
    [2e-6, -1e-5, 1e-3, -0.01, 0.05, -0.2, 0.5, -1.0,
     3e-4, -3e-4, 0.02, -0.05, 25.0, -22.0, 0.3, -0.7],
    dtype=torch.float32,
)).float()
neg_approx_kl = torch.clamp(lp - old, min=-20.0, max=20.0)
ratio = torch.exp(neg_approx_kl)
save_file(
    {"logits": logits.contiguous(), "tokens": tokens, "old_log_probs": old, "ratio": ratio},
    f"{out_dir}/ppo_ratio_fp32.safetensors",
    metadata={"format_version": "2", "ratio_log_clamp": "20"},
)

# The bug: the same formula evaluated in bf16.
k3_bf16 = low_var_kl(lp.to(torch.bfloat16), ref.to(torch.bfloat16))
# The dump's ref_log_probs are the bf16 values the buggy code saw (exact
# inputs), so only the k3 arithmetic is wrong.
ref_b = ref.to(torch.bfloat16)
save_file(
    {"logits": logits.contiguous(), "tokens": tokens, "ref_log_probs": ref_b,
     "kl_k3": k3_bf16},
    f"{out_dir}/kl_k3_naive_in_bf16.safetensors",
    metadata=meta,
)
print(f"wrote {out_dir}/kl_k3_low_var_kl_bf16.safetensors, ppo_ratio_fp32.safetensors, kl_k3_naive_in_bf16.safetensors")
