"""Writes a real-vocabulary policy-gradient dump for `BENCHMARKS.md` (not a
fixture): bf16 logits `[8, 152064]`, verl's `low_var_kl` k3 penalty with
its clamps (input 20, output 10) against reference log-probs 0.3 nats off,
and autograd's `grad_logits` (f32) of `sum(c k3)` with `grad_kl_k3 = c`.

Run: PYTHONPATH=<torch> python scripts/torch_dumps/k3_grad_real_vocab.py OUT.safetensors
(torch, safetensors).
"""
import sys

import torch
from safetensors.torch import save_file
N, V = 8, 152064
g = torch.Generator().manual_seed(7)
logits = (3 * torch.randn(N, V, generator=g)).to(torch.bfloat16)
labels = torch.randint(0, V, (N,), generator=g)
x = logits.float().requires_grad_()
lp = torch.log_softmax(x, -1).gather(-1, labels[:, None]).squeeze(-1)
ref = (lp.detach() + 0.3 * torch.randn(N, generator=g))
kl = (ref - lp).clamp(-20, 20)
k3 = (torch.exp(kl) - kl - 1).clamp(-10, 10)
c3 = torch.randn(N, generator=g)
(k3 * c3).sum().backward()
save_file({"logits": logits, "tokens": labels, "ref_log_probs": ref, "kl_k3": k3.detach(), "grad_kl_k3": c3,
           "grad_logits": x.grad}, sys.argv[1],
          metadata={"format_version": "2", "kl_input_clamp": "20", "kl_output_clamp": "10"})
