"""Writes one real-size batch for `BENCHMARKS.md` (not a fixture): bf16
logits `[N, 152064]` (default N = 8192; a Gaussian body and a few dominant
tokens, as an LLM's), the target tokens, and PyTorch CPU's
`log_softmax(x.float())` gathered at the targets and its entropy (f32).
With `--grad`, instead: `F.cross_entropy(x.float(), reduction="none")`
with the cotangent `1/N` on every row (the token mean, exact in f32) and
its autograd `grad_logits` (f32). Computed 256 rows at a time.

Run: PYTHONPATH=<torch> python scripts/torch_dumps/real_batch.py OUT.safetensors [N] [--grad]
(torch, safetensors; about 2.5 GB, 7.5 GB with --grad, at N = 8192).
"""
import sys

import torch
import torch.nn.functional as F
from safetensors.torch import save_file

args = [a for a in sys.argv[1:] if not a.startswith("--")]
grad = "--grad" in sys.argv
out = args[0]
N = int(args[1]) if len(args) > 1 else 8192
V, CHUNK = 152064, 256
g = torch.Generator().manual_seed(20261207)
logits = torch.empty(N, V, dtype=torch.bfloat16)
tokens = torch.empty(N, dtype=torch.int64)
lp = torch.empty(N)
ent = torch.empty(N)
loss = torch.empty(N)
gl = torch.empty(N, V) if grad else None
cot = torch.full((N,), 1.0 / N)
for r in range(0, N, CHUNK):
    n = min(CHUNK, N - r)
    x = (2.5 * torch.randn(n, V, generator=g)).to(torch.bfloat16)
    top = torch.randint(0, V, (n, 4), generator=g)
    x.scatter_(1, top, (12 + 2 * torch.rand(n, 4, generator=g)).to(torch.bfloat16))
    t = top[:, 0].clone()
    t[1::3] = torch.randint(0, V, (t[1::3].numel(),), generator=g)
    logits[r:r + n], tokens[r:r + n] = x, t
    xf = x.float().requires_grad_(grad)
    if grad:
        l = F.cross_entropy(xf, t, reduction="none")
        (gx,) = torch.autograd.grad((l * cot[r:r + n]).sum(), xf)
        loss[r:r + n], gl[r:r + n] = l.detach(), gx
    else:
        ls = torch.log_softmax(xf, -1)
        lp[r:r + n] = ls.gather(-1, t[:, None]).squeeze(-1)
        ent[r:r + n] = -(ls.exp() * ls).sum(-1)
if grad:
    tensors = {"logits": logits, "tokens": tokens, "loss": loss, "grad_loss": cot, "grad_logits": gl}
    meta = {"format_version": "2", "reduction": "none"}
else:
    tensors = {"logits": logits, "tokens": tokens, "log_probs": lp, "entropy": ent}
    meta = {"format_version": "2"}
save_file(tensors, out, metadata=meta)
print("wrote", out)
