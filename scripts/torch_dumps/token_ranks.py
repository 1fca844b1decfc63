"""Writes three token-rank dumps into fixtures/torch (vLLM's `token_ranks`:
the sampled or prompt token's rank among the row's log-probs, ties counted
against it, as `vllm.v1.sample.sampler.Sampler.gather_logprobs` computes it
with `batched_count_greater_than`):

- `token_ranks_vllm_bf16`: bf16 logits (V=151936, Qwen's vocabulary),
  `log_softmax(logits.float())` in fp32, `(lp >= lp[t]).sum(-1)` as int64;
  half the tokens sampled from the row's distribution, half uniform (prompt
  tokens, deep in the body, where bf16 logits repeat). Correct: pass.
- `token_ranks_strict_greater`: the same with `(lp > lp[t]).sum(-1) + 1`,
  ties not counted against the token: too high a rank on every row whose
  token's logit repeats. Fail.
- `token_ranks_from_bf16_log_probs`: ranks counted on the log-probs rounded
  to bf16 (`log_softmax(logits)` in the logits' dtype): entries within a
  bf16 ulp of the token's log-prob tie with it and inflate the rank. Fail.

Run: PYTHONPATH=<torch> python scripts/torch_dumps/token_ranks.py [OUT_DIR]
(torch, safetensors).
"""
import sys

import torch
from safetensors.torch import save_file

N, V = 8, 151936
g = torch.Generator().manual_seed(20261206)
# LLM-like rows: a Gaussian body, a few dominant tokens.
logits = (2.5 * torch.randn(N, V, generator=g)).to(torch.bfloat16)
top = torch.randint(0, V, (N, 4), generator=g)
logits.scatter_(1, top, (10 + 2 * torch.rand(N, 4, generator=g)).to(torch.bfloat16))

lp = torch.log_softmax(logits.float(), dim=-1)
sampled = torch.multinomial(lp.exp(), 1, generator=g).squeeze(-1)
prompt = torch.randint(0, V, (N,), generator=g)
tokens = torch.where(torch.arange(N) % 2 == 0, sampled, prompt)
lp_t = lp.gather(-1, tokens[:, None])
ranks = (lp >= lp_t).sum(-1)
strict = (lp > lp_t).sum(-1) + 1
lp16 = torch.log_softmax(logits, dim=-1)
ranks16 = (lp16 >= lp16.gather(-1, tokens[:, None])).sum(-1)

out_dir = sys.argv[1] if len(sys.argv) > 1 else "fixtures/torch"
meta = {"format_version": "2"}
base = {"logits": logits.contiguous(), "tokens": tokens, "log_probs": lp_t.squeeze(-1)}
for name, r in [("token_ranks_vllm_bf16", ranks), ("token_ranks_strict_greater", strict),
                ("token_ranks_from_bf16_log_probs", ranks16)]:
    save_file({**base, "token_ranks": r}, f"{out_dir}/{name}.safetensors", metadata=meta)
    print(f"wrote {out_dir}/{name}.safetensors: ranks {r.tolist()}")
print("rows with a tie at the token:", int((ranks != strict).sum()), "of", N)
