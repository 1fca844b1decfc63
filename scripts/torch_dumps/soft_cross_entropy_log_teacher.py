"""Writes three soft-target cross-entropy dumps whose teacher is given as
log-probabilities (`teacher_log_probs`: the kernel takes the teacher's
log-probs and computes `exp` itself) into fixtures/torch:

- `soft_ce_log_teacher_bf16`: bf16 student logits (V=16384), the
  teacher's log-probs `log_softmax(teacher.float())` stored in bf16;
  `-(t_lp.float().exp() * log_softmax(student.float())).sum(-1)` in fp32.
  Correct: pass.
- `soft_ce_log_teacher_exp_in_bf16`: the same with `t_lp.exp()` taken on
  the bf16 tensor (bf16 autocast), then upcast: every teacher
  probability off by up to 2^-9 relative. Fail.
- `soft_ce_grad_log_teacher`: autograd's grad_logits of the correct
  form's per-token values, summed (grad_soft_cross_entropy 1). Pass.

Run: PYTHONPATH=<torch> python scripts/torch_dumps/soft_cross_entropy_log_teacher.py [OUT_DIR]
(torch, safetensors).
"""
import sys

import torch
from safetensors.torch import save_file

N, V = 8, 16384
g = torch.Generator().manual_seed(20261209)
student = (2.5 * torch.randn(N, V, generator=g)).to(torch.bfloat16)
teacher = (student.float() + 0.7 * torch.randn(N, V, generator=g)).to(torch.bfloat16)
t_lp = torch.log_softmax(teacher.float(), dim=-1).to(torch.bfloat16)

out_dir = sys.argv[1] if len(sys.argv) > 1 else "fixtures/torch"
meta = {"format_version": "2"}
s_lp = torch.log_softmax(student.float(), dim=-1)
h = -(t_lp.float().exp() * s_lp).sum(dim=-1)
save_file({"logits": student.contiguous(), "teacher_log_probs": t_lp.contiguous(),
           "soft_cross_entropy": h},
          f"{out_dir}/soft_ce_log_teacher_bf16.safetensors", metadata=meta)
h_bad = -(t_lp.exp().float() * s_lp).sum(dim=-1)
save_file({"logits": student.contiguous(), "teacher_log_probs": t_lp.contiguous(),
           "soft_cross_entropy": h_bad},
          f"{out_dir}/soft_ce_log_teacher_exp_in_bf16.safetensors", metadata=meta)
x = student.float().requires_grad_()
(-(t_lp.float().exp() * torch.log_softmax(x, dim=-1)).sum(dim=-1)).sum().backward()
save_file({"logits": student.contiguous(), "teacher_log_probs": t_lp.contiguous(),
           "grad_soft_cross_entropy": torch.ones(N), "grad_logits": x.grad.contiguous()},
          f"{out_dir}/soft_ce_grad_log_teacher.safetensors", metadata=meta)
print("H:", h.tolist())
print("bf16 exp - fp32 exp:", (h_bad - h).tolist())
