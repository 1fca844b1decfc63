"""Writes two policy-term gradient dumps into fixtures/torch (issue 18: the
gradients of the KL estimator against a reference policy and of the PPO
importance ratio, with respect to the student's logits; TOLERANCE.md (T21)):

- `policy_grad_k3_ratio_bf16`: bf16 logits (V=32000, 2 of 8 rows at
  ignore_index), the student's log-probs from `log_softmax` in fp32, verl's
  `low_var_kl` k3 (`kl = clamp(ref - lp, -20, 20)`, `exp(kl) - kl - 1`,
  clamped to [-10, 10]) and the PPO ratio `exp(clamp(lp - old, -20, 20))`,
  and `grad_logits` of `sum(c3 * k3) + sum(cr * ratio)` by autograd (fp32),
  with `grad_kl_k3 = c3`, `grad_ratio = cr` (per-row weights, as a masked
  mean's `mask / count` and an advantage would give). `ref` / `old` at
  offsets from 1e-6 to 25 nats (the clamps bind on two rows). Correct
  code: pass.
- `policy_grad_k3_wrong_sign`: the same loss with a hand-written k3
  backward whose slope is `1 - e^{d}` instead of `1 - e^{-d}` (`d = lp -
  ref`: the sign of verl's `kl = ref - lp` confused); its forward is
  right. Real bug kind: grad_logits fails.

Run: /work/torchenv/bin/python scripts/torch_dumps/policy_grad.py [OUT_DIR]
(torch, safetensors).
"""
import sys

import torch
from safetensors.torch import save_file

N, V = 8, 32000
g = torch.Generator().manual_seed(20261202)
logits = (2.5 * torch.randn(N, V, generator=g)).to(torch.bfloat16)
top = torch.randint(0, V, (N, 4), generator=g)
logits.scatter_(1, top, (9 + 3 * torch.rand(N, 4, generator=g)).to(torch.bfloat16))
tokens = top[:, 0].clone()
tokens[torch.tensor([2, 5])] = -100
valid = tokens != -100

with torch.no_grad():
    lp0 = torch.log_softmax(logits.float(), dim=-1).gather(
        -1, tokens.clamp(min=0)[:, None]).squeeze(-1)
    lp0 = torch.where(valid, lp0, torch.zeros_like(lp0))
ref = (lp0 + torch.tensor([1e-6, -3e-4, 0.0, 0.05, -0.6, 0.0, 2.0, 25.0])).float()
old = (lp0 + torch.tensor([-2e-5, 0.01, 0.0, -0.3, 0.15, 0.0, -1.0, -22.0])).float()
# d(total)/d(k3_r), d(total)/d(ratio_r): a token mean's 1/count and an
# advantage per row.
count = valid.sum()
c3 = torch.where(valid, torch.full((N,), 1.0) / count, torch.zeros(N)).float()
cr = torch.tensor([0.5, -1.25, 0.0, 2.0, -0.75, 0.0, 1.5, -0.5]).float()


class K3WrongSign(torch.autograd.Function):
    """verl's low_var_kl forward; a hand-written backward with the wrong
    sign of d in the slope: d k3 / d lp = 1 - exp(lp - ref)."""

    @staticmethod
    def forward(ctx, lp, ref):
        kl = torch.clamp(ref - lp, min=-20, max=20)
        kld = torch.exp(kl) - kl - 1
        inside = (ref - lp).abs() <= 20
        out = torch.clamp(kld, min=-10, max=10)
        ctx.save_for_backward(lp, ref, inside & (kld <= 10))
        return out

    @staticmethod
    def backward(ctx, grad):
        lp, ref, live = ctx.saved_tensors
        d = torch.clamp(lp - ref, min=-20, max=20)
        return torch.where(live, grad * (1 - torch.exp(d)), torch.zeros_like(grad)), None


def low_var_kl(logprob, ref_logprob):
    # verl core_algos.kl_penalty(..., "low_var_kl"), as published.
    kl = ref_logprob - logprob
    kl = torch.clamp(kl, min=-20, max=20)
    ratio = torch.exp(kl)
    kld = (ratio - kl - 1).contiguous()
    return torch.clamp(kld, min=-10, max=10)


def run(k3_fn):
    x = logits.float().requires_grad_(True)
    lsm = torch.log_softmax(x, dim=-1)
    lp = lsm.gather(-1, tokens.clamp(min=0)[:, None]).squeeze(-1)
    lp = torch.where(valid, lp, torch.zeros_like(lp))
    k3 = k3_fn(lp, ref)
    ratio = torch.exp(torch.clamp(lp - old, min=-20.0, max=20.0))
    (c3 * k3 + cr * ratio).sum().backward()
    return lp.detach(), k3.detach(), ratio.detach(), x.grad


out_dir = sys.argv[1] if len(sys.argv) > 1 else "fixtures/torch"
meta = {"format_version": "2", "kl_input_clamp": "20", "kl_output_clamp": "10",
        "ratio_log_clamp": "20"}
for name, fn in [("policy_grad_k3_ratio_bf16", low_var_kl),
                 ("policy_grad_k3_wrong_sign", K3WrongSign.apply)]:
    lp, k3, ratio, grad = run(fn)
    save_file(
        {"logits": logits.contiguous(), "tokens": tokens, "log_probs": lp,
         "ref_log_probs": ref, "old_log_probs": old, "kl_k3": k3, "ratio": ratio,
         "grad_kl_k3": c3, "grad_ratio": cr, "grad_logits": grad.contiguous()},
        f"{out_dir}/{name}.safetensors",
        metadata=meta,
    )
    print(f"wrote {out_dir}/{name}.safetensors")
