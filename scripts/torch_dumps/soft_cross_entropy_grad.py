"""Writes three soft-target cross-entropy gradient dumps into fixtures/torch
(`grad_logits` of `c * soft_cross_entropy`, `soft_cross_entropy = -sum_j
p_j log q_j` per token, `c` the mean's `1 / N`), over a top-k teacher
that is not renormalised (NeMo-RL's top-k distillation keeps the
teacher's top-k probabilities as they are: mass < 1):

- `soft_ce_grad_autograd_topk_teacher`: torchtune's `ForwardKLLoss`
  formula in fp32 on bf16 student logits (V=16384), the per-token values'
  mean backpropagated by autograd. Correct: pass.
- `soft_ce_grad_unit_mass`: a hand-written backward `c (softmax(z) - p)`
  (the textbook gradient, right only when the teacher's mass is 1) over
  the same top-k teacher. Fail.
- `soft_ce_grad_unit_mass_full_teacher`: the same hand-written backward
  over a full teacher (`softmax(teacher)` in fp32, mass 1 to within fp32
  rounding): correct code for that teacher. Pass.

Run: PYTHONPATH=<torch> python scripts/torch_dumps/soft_cross_entropy_grad.py [OUT_DIR]
(torch, safetensors).
"""
import sys

import torch
from safetensors.torch import save_file

N, V, K = 8, 16384, 64
g = torch.Generator().manual_seed(20261208)
student = (2.5 * torch.randn(N, V, generator=g)).to(torch.bfloat16)
teacher = (student.float() + 0.7 * torch.randn(N, V, generator=g)).to(torch.bfloat16)
full = torch.softmax(teacher.float(), dim=-1)
vals, ids = full.topk(K, dim=-1)
topk = torch.zeros_like(full).scatter_(1, ids, vals)  # mass < 1, not renormalised
c = torch.full((N,), 1.0 / N)

out_dir = sys.argv[1] if len(sys.argv) > 1 else "fixtures/torch"
meta = {"format_version": "2"}


def autograd_grad(p):
    x = student.float().requires_grad_()
    h = -(p * torch.log_softmax(x, dim=-1)).sum(dim=-1)
    h.mean().backward()
    return x.grad


def unit_mass_grad(p):
    return c[:, None] * (torch.softmax(student.float(), dim=-1) - p)


for name, p, grad in [
    ("soft_ce_grad_autograd_topk_teacher", topk, autograd_grad(topk)),
    ("soft_ce_grad_unit_mass", topk, unit_mass_grad(topk)),
    ("soft_ce_grad_unit_mass_full_teacher", full, unit_mass_grad(full)),
]:
    save_file({"logits": student.contiguous(), "teacher_probs": p.contiguous(),
               "grad_soft_cross_entropy": c, "grad_logits": grad.contiguous()},
              f"{out_dir}/{name}.safetensors", metadata=meta)
print("top-k teacher mass:", topk.sum(-1).tolist())
print("full teacher mass - 1:", (full.double().sum(-1) - 1).tolist())
