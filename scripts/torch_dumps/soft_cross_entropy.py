"""Writes three soft-target cross-entropy dumps into fixtures/torch
(`soft_cross_entropy = -sum_j p_j log q_j` against a teacher's
probabilities, per token: torchtune's `ForwardKLLoss` before its mean over
tokens, NeMo-RL's `DistributedCrossEntropy` on one rank):

- `soft_ce_torchtune_bf16`: bf16 student and teacher logits (V=32000),
  `teacher_prob = softmax(teacher.float())`, `student_logprob =
  log_softmax(student.float())`, `-(teacher_prob * student_logprob).sum(-1)`
  with torchtune's `inf_mask` fill, in fp32. Correct: pass.
- `soft_ce_nan_on_masked`: the same formula without the `inf_mask` fill
  on rows whose student logits hold `-inf` entries the teacher gives 0:
  `0 * -inf = NaN`. Fail.
- `soft_ce_log_of_bf16_softmax`: the student's log-probs taken as
  `log(softmax(student))` in bf16 (the probabilities rounded, tiny ones
  flushed): far off in the tail. Fail.

Run: PYTHONPATH=<torch> python scripts/torch_dumps/soft_cross_entropy.py [OUT_DIR]
(torch, safetensors).
"""
import sys

import torch
from safetensors.torch import save_file

N, V = 8, 32000
g = torch.Generator().manual_seed(20261207)
student = (2.5 * torch.randn(N, V, generator=g)).to(torch.bfloat16)
top = torch.randint(0, V, (N, 4), generator=g)
student.scatter_(1, top, (10 + 2 * torch.rand(N, 4, generator=g)).to(torch.bfloat16))
teacher = (student.float() + 0.7 * torch.randn(N, V, generator=g)).to(torch.bfloat16)


def soft_ce(student_logits, teacher_logits, mask_inf=True):
    teacher_prob = torch.softmax(teacher_logits.float(), dim=-1)
    student_logprob = torch.log_softmax(student_logits.float(), dim=-1)
    prod = teacher_prob * student_logprob
    if mask_inf:
        prod = torch.masked_fill(prod, torch.isinf(student_logits), 0)
    return teacher_prob, -prod.sum(dim=-1)


out_dir = sys.argv[1] if len(sys.argv) > 1 else "fixtures/torch"
meta = {"format_version": "2"}
p, h = soft_ce(student, teacher)
save_file({"logits": student.contiguous(), "teacher_probs": p, "soft_cross_entropy": h},
          f"{out_dir}/soft_ce_torchtune_bf16.safetensors", metadata=meta)

# Rows 0-3 get -inf student logits (a banned-token mask folded into the
# logits) where the teacher has no mass either.
s2, t2 = student.clone(), teacher.clone()
banned = torch.randint(0, V, (4, 16), generator=g)
s2[:4].scatter_(1, banned, float("-inf"))
t2[:4].scatter_(1, banned, float("-inf"))
p2, h2 = soft_ce(s2, t2, mask_inf=False)
save_file({"logits": s2.contiguous(), "teacher_probs": p2, "soft_cross_entropy": h2},
          f"{out_dir}/soft_ce_nan_on_masked.safetensors", metadata=meta)

lq = torch.log(torch.softmax(student, dim=-1)).float()
lq = torch.where(torch.isinf(lq), torch.zeros_like(lq), lq)  # the flushed ones dropped
h3 = -(p * lq).sum(dim=-1)
save_file({"logits": student.contiguous(), "teacher_probs": p, "soft_cross_entropy": h3},
          f"{out_dir}/soft_ce_log_of_bf16_softmax.safetensors", metadata=meta)
print("H:", h.tolist())
print("NaN rows:", torch.isnan(h2).tolist())
print("bf16-softmax H:", h3.tolist())
