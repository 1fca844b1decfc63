"""Writes three top-k distillation KL gradient dumps into fixtures/torch
(issue 18: the gradients of `forward_kl` / `reverse_kl` over a teacher's
top-k with respect to the student's logits; TOLERANCE.md (T25)):

- `topk_kl_grad_verl_bf16`: bf16 student and teacher logits (V=32000,
  N=12), the teacher's top-32 log-probs (fp32 log_softmax, then topk,
  stored f32), the student's fp32 log_softmax gathered at those ids (verl's
  `compute_forward_kl_topk` shape of computation), `forward_kl` and
  `reverse_kl` in fp32, and `grad_logits` of `sum(cf * forward_kl) +
  sum(cr * reverse_kl)` by autograd (fp32, stored f32), with
  `grad_forward_kl = cf` (a token mean's 1/N) and `grad_reverse_kl = cr`
  (per-row weights). Correct code: pass.
- `topk_kl_grad_renormalized_bf16`: the same rows with the student
  renormalised over the K ids (`log_softmax` of the gathered log-probs,
  `kl_renormalized = true`), forward KL only. Correct code: pass.
- `topk_kl_grad_normalizer_detached`: the first dump's loss with the
  student's log-probs formed as `x[ids] - logsumexp(x).detach()` (same
  values; the normaliser's gradient lost, a memory-saving rewrite's bug):
  its forward is right, grad_logits must fail.

Run: /work/torchenv/bin/python scripts/torch_dumps/topk_kl_grad.py [OUT_DIR]
(torch, safetensors).
"""
import sys

import torch
from safetensors.torch import save_file

N, V, K = 12, 32000, 32
g = torch.Generator().manual_seed(20261203)
# LLM-like rows: a Gaussian body, a few dominant tokens; the teacher is the
# student perturbed (distillation late in training: close distributions).
body = 2.5 * torch.randn(N, V, generator=g)
top = torch.randint(0, V, (N, 4), generator=g)
body.scatter_(1, top, 12 + 2 * torch.rand(N, 4, generator=g))
student = body.to(torch.bfloat16)
teacher = (body + 0.3 * torch.randn(N, V, generator=g)).to(torch.bfloat16)

with torch.no_grad():
    a, ids = torch.log_softmax(teacher.float(), dim=-1).topk(K, dim=-1)
# d(total)/d(forward_kl_r): a token mean's 1/N; d(total)/d(reverse_kl_r):
# per-row weights of both signs, a zero among them.
cf = torch.full((N,), 1.0 / N)
cr = torch.tensor([0.5, -1.25, 0.0, 2.0, -0.75, 0.25, 1.5, -0.5, 1.0, -2.0, 0.125, 0.75])


def gathered(x, detach_normalizer):
    if detach_normalizer:
        return x.gather(-1, ids) - torch.logsumexp(x, dim=-1, keepdim=True).detach()
    return torch.log_softmax(x, dim=-1).gather(-1, ids)


def run(renormalized, detach_normalizer, reverse):
    x = student.float().requires_grad_(True)
    lp = gathered(x, detach_normalizer)
    if renormalized:
        lp = torch.log_softmax(lp, dim=-1)
    forward_kl = (a.exp() * (a - lp)).sum(-1)
    reverse_kl = (lp.exp() * (lp - a)).sum(-1)
    total = (cf * forward_kl).sum()
    if reverse:
        total = total + (cr * reverse_kl).sum()
    total.backward()
    return forward_kl.detach(), reverse_kl.detach(), x.grad


out_dir = sys.argv[1] if len(sys.argv) > 1 else "fixtures/torch"
common = {"logits": student.contiguous(), "topk_ids": ids, "teacher_topk_log_probs": a.contiguous()}
for name, renormalized, detach in [
    ("topk_kl_grad_verl_bf16", False, False),
    ("topk_kl_grad_renormalized_bf16", True, False),
    ("topk_kl_grad_normalizer_detached", False, True),
]:
    fk, rk, grad = run(renormalized, detach, reverse=not renormalized)
    tensors = {**common, "forward_kl": fk, "grad_forward_kl": cf, "grad_logits": grad.contiguous()}
    if not renormalized:
        tensors.update({"reverse_kl": rk, "grad_reverse_kl": cr})
    meta = {"format_version": "2", "kl_renormalized": "true" if renormalized else "false"}
    save_file(tensors, f"{out_dir}/{name}.safetensors", metadata=meta)
    print(f"wrote {out_dir}/{name}.safetensors")
