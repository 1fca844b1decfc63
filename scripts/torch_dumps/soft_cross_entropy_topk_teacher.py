"""Writes two soft-target cross-entropy dumps whose teacher is its top-k
log-probabilities (`teacher_topk_log_probs` at `topk_ids`, not
renormalised: NeMo-RL's top-k distillation keeps the teacher's top-k as
they are) into fixtures/torch:

- `soft_ce_topk_teacher`: bf16 student logits (V=16384), the teacher's
  top-64 log-probs of `log_softmax(teacher.float())` in fp32;
  `-(a.exp() * log_softmax(student.float()).gather(-1, ids)).sum(-1)`.
  Correct: pass.
- `soft_ce_topk_student_renormalized`: the student's log-probs taken over
  the 64 ids only (`log_softmax(student.float().gather(-1, ids))`): the
  full vocabulary's normaliser lost. Fail.

Run: PYTHONPATH=<torch> python scripts/torch_dumps/soft_cross_entropy_topk_teacher.py [OUT_DIR]
(torch, safetensors).
"""
import sys

import torch
from safetensors.torch import save_file

N, V, K = 8, 16384, 64
g = torch.Generator().manual_seed(20261210)
student = (2.5 * torch.randn(N, V, generator=g)).to(torch.bfloat16)
teacher = (student.float() + 0.7 * torch.randn(N, V, generator=g)).to(torch.bfloat16)
a, ids = torch.log_softmax(teacher.float(), dim=-1).topk(K, dim=-1)

out_dir = sys.argv[1] if len(sys.argv) > 1 else "fixtures/torch"
meta = {"format_version": "2"}
s_lp = torch.log_softmax(student.float(), dim=-1).gather(-1, ids)
h = -(a.exp() * s_lp).sum(dim=-1)
base = {"logits": student.contiguous(), "topk_ids": ids.contiguous(),
        "teacher_topk_log_probs": a.contiguous()}
save_file({**base, "soft_cross_entropy": h},
          f"{out_dir}/soft_ce_topk_teacher.safetensors", metadata=meta)
s_lp_k = torch.log_softmax(student.float().gather(-1, ids), dim=-1)
h_bad = -(a.exp() * s_lp_k).sum(dim=-1)
save_file({**base, "soft_cross_entropy": h_bad},
          f"{out_dir}/soft_ce_topk_student_renormalized.safetensors", metadata=meta)
print("H:", h.tolist())
print("renormalised student:", h_bad.tolist())
