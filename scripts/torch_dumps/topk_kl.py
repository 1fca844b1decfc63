"""Writes two top-k distillation KL dumps into fixtures/torch (issue 18:
`forward_kl = sum_k e^{a_k} (a_k - log p(id_k))` over the teacher's top-k,
verl's `compute_forward_kl_topk` shape of computation):

- `topk_forward_kl_verl_bf16`: bf16 student and teacher logits (V=32000,
  N=16), the teacher's top-32 log-probs (fp32 log_softmax, then topk,
  stored f32), the student's fp32 log_softmax gathered at those ids,
  `forward_kl = (exp(a) * (a - lp)).sum(-1)` and `reverse_kl =
  (exp(lp) * (lp - a)).sum(-1)` in fp32, stored f32. Correct code: pass.
- `topk_forward_kl_teacher_prob_as_log_prob`: the same, but the teacher's
  probabilities taken as `a_k` instead of `e^{a_k}` (`a * (a - lp)`): the
  bug kind of issue 18. Must fail.

Run: /work/torchenv/bin/python scripts/torch_dumps/topk_kl.py [OUT_DIR]
(torch, safetensors).
"""
import sys

import torch
from safetensors.torch import save_file

N, V, K = 16, 32000, 32
g = torch.Generator().manual_seed(20261218)
# LLM-like rows: a Gaussian body, a few dominant tokens; the teacher is the
# student perturbed (distillation late in training: close distributions).
body = 2.5 * torch.randn(N, V, generator=g)
top = torch.randint(0, V, (N, 4), generator=g)
body.scatter_(1, top, 12 + 2 * torch.rand(N, 4, generator=g))
student = body.to(torch.bfloat16)
teacher = (body + 0.3 * torch.randn(N, V, generator=g)).to(torch.bfloat16)

t_lp = torch.log_softmax(teacher.float(), dim=-1)
a, ids = t_lp.topk(K, dim=-1)
s_lp = torch.log_softmax(student.float(), dim=-1).gather(-1, ids)
forward_kl = (a.exp() * (a - s_lp)).sum(-1)
reverse_kl = (s_lp.exp() * (s_lp - a)).sum(-1)

out_dir = sys.argv[1] if len(sys.argv) > 1 else "fixtures/torch"
meta = {"format_version": "2"}
common = {"logits": student.contiguous(), "topk_ids": ids, "teacher_topk_log_probs": a.contiguous()}
save_file(
    {**common, "forward_kl": forward_kl, "reverse_kl": reverse_kl},
    f"{out_dir}/topk_forward_kl_verl_bf16.safetensors",
    metadata=meta,
)
bad = (a * (a - s_lp)).sum(-1)
save_file(
    {**common, "forward_kl": bad},
    f"{out_dir}/topk_forward_kl_teacher_prob_as_log_prob.safetensors",
    metadata=meta,
)
print(f"wrote {out_dir}/topk_forward_kl_verl_bf16.safetensors, "
      f"{out_dir}/topk_forward_kl_teacher_prob_as_log_prob.safetensors")
