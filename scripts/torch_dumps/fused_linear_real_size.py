"""Writes a real-size fused linear + loss dump (issue 45: bf16, H = 4096,
V = 152064, N rows) of autograd's correct cross-entropy through the LM
head, with log-probs, entropy, the summed loss and the LM head's
gradients, and times PyTorch's CPU GEMM of the issue's comparison shape
`[256, 4096] x [4096, 152064]` (bf16 and f32, the given thread count) in
the same run, for BENCHMARKS.md. The dump is 2.5 GB at N = 8.

Run: PYTHONPATH=<torch> python scripts/torch_dumps/fused_linear_real_size.py OUT N [THREADS] [--generated] [--forward]
then `/usr/bin/time -v logprobe verify --no-progress OUT`.

`--generated` draws the LM head with `logprobe.generate_weights` and names
it in the metadata instead of carrying it (docs/dump-from-pytorch.md,
"Generated weights"): 1.25 GB less. `--forward` writes the forward outputs
only (log-probs, entropy, the summed loss), without gradients.
"""
import sys
import time

import torch
from safetensors.torch import save_file

flags = {a for a in sys.argv[1:] if a.startswith("--")}
args = [a for a in sys.argv[1:] if not a.startswith("--")]
out, n = args[0], int(args[1])
torch.set_num_threads(int(args[2]) if len(args) > 2 else 2)
H, V = 4096, 152064
g = torch.Generator().manual_seed(1)
for dt in (torch.bfloat16, torch.float32):
    a = torch.randn(256, H, generator=g).to(dt)
    b = torch.randn(V, H, generator=g).to(dt)
    a @ b[:1024].t()
    t = time.perf_counter()
    a @ b.t()
    el = time.perf_counter() - t
    print(f"GEMM [256,{H}]x[{H},{V}] {dt}: {el:.3f} s ({2 * 256 * H * V / el / 1e9:.0f} GFLOP/s)")
    del a, b
hidden = torch.randn(n, H, generator=g).to(torch.bfloat16)
meta = {"format_version": "2", "reduction": "sum"}
if "--generated" in flags:
    import logprobe

    t = time.perf_counter()
    weight, keys = logprobe.generate_weights((V, H), seed=1, scale=3 / H ** 0.5)
    print(f"generate_weights [{V}, {H}] bf16: {time.perf_counter() - t:.2f} s")
    meta.update(keys)
else:
    weight = (torch.randn(V, H, generator=g) / H ** 0.5 * 3).to(torch.bfloat16)
tokens = torch.randint(0, V, (n,), generator=g)
forward = "--forward" in flags
h, w = hidden.clone().requires_grad_(not forward), weight.clone().requires_grad_(not forward)
x = (h @ w.t()).float()
lp = torch.log_softmax(x, -1)
loss = torch.nn.functional.cross_entropy(x, tokens, reduction="sum")
tensors = {"hidden": hidden, "tokens": tokens,
           "log_probs": lp.gather(-1, tokens[:, None]).squeeze(-1).detach(),
           "entropy": -(lp.exp() * lp).sum(-1).detach(), "loss": loss.detach()}
if not forward:
    loss.backward()
    tensors.update({"grad_loss": torch.ones(()), "grad_hidden": h.grad, "grad_lm_head_weight": w.grad})
if "--generated" not in flags:
    tensors["lm_head_weight"] = weight
save_file(tensors, out, metadata=meta)
