"""Writes three tensor-parallel sets of dumps into fixtures/torch: Megatron's
vocabulary-parallel cross-entropy (`megatron.core.tensor_parallel.
cross_entropy._VocabParallelCrossEntropy`) on 4 simulated ranks, each rank's
dump holding its shard of the logits and of `grad_logits`, and the
all-reduced `loss` every rank holds (docs/dump-from-pytorch.md,
"Tensor-parallel ranks"). `logprobe verify` reads the four files of a set as
one dump.

- `megatron_tp_ce_rank{0..3}`: bf16 logits `[16, 8192]` upcast to fp32,
  four shards of 2048 columns. Per rank: the local max, all-reduced (max);
  the target logit gathered at `target - vocab_start` on the owning rank, 0
  elsewhere, all-reduced (sum, rank order); `exp(z - max)` summed locally
  and all-reduced (sum, rank order); `loss = log(S) - target_logit`.
  Backward: `(softmax - onehot) * grad_loss` on each shard. Correct: pass.
- `megatron_tp_ce_target_not_shifted_rank{0..3}`: the target gathered at
  the global id on every rank (no `- vocab_start`): a shard past rank 0
  reads another column for the targets it owns. Fail.
- `megatron_tp_ce_local_max_rank{0..3}`: each rank shifts its exps by its
  own max and the sums are all-reduced as they are (the max all-reduce
  forgotten). Fail.

Run: PYTHONPATH=<torch> python scripts/torch_dumps/megatron_tp_cross_entropy.py [OUT_DIR]
(torch, safetensors).
"""
import sys

import torch
from safetensors.torch import save_file

N, V, TP = 16, 8192, 4
W = V // TP
g = torch.Generator().manual_seed(20261207)
logits = (3.0 * torch.randn(N, V, generator=g) + 20.0).to(torch.bfloat16)
# Targets on every rank: row i's target in shard i % TP.
tokens = torch.tensor([(i % TP) * W + int(torch.randint(0, W, (1,), generator=g)) for i in range(N)])
grad_loss = torch.rand(N, generator=g) + 0.5
shards = [logits[:, r * W:(r + 1) * W].float() for r in range(TP)]


def all_reduce_sum(parts):
    """NCCL's sum as the ranks would see it: one order, the same bits on every rank."""
    total = torch.zeros_like(parts[0])
    for p in parts:
        total = total + p
    return total


def megatron(bug=None):
    local_max = [s.max(dim=-1).values for s in shards]
    global_max = torch.stack(local_max).max(dim=0).values
    maxes = local_max if bug == "local_max" else [global_max] * TP
    shifted = [s - m[:, None] for s, m in zip(shards, maxes)]
    predicted = []
    for r, z in enumerate(shifted):
        start = r * W
        outside = (tokens < start) | (tokens >= start + W)
        local = tokens if bug == "target_not_shifted" else tokens - start
        local = local.clamp(0, W - 1).masked_fill(outside, 0)
        p = z.gather(1, local[:, None]).squeeze(1).masked_fill(outside, 0.0)
        predicted.append(p)
    predicted = all_reduce_sum(predicted)
    exps = [z.exp() for z in shifted]
    sum_exp = all_reduce_sum([e.sum(dim=-1) for e in exps])
    loss = sum_exp.log() - predicted
    grads = []
    for r, e in enumerate(exps):
        start = r * W
        grad = e / sum_exp[:, None]
        outside = (tokens < start) | (tokens >= start + W)
        local = (tokens if bug == "target_not_shifted" else tokens - start).clamp(0, W - 1)
        grad[torch.arange(N), local] -= (~outside).float()
        grads.append(grad * grad_loss[:, None])
    return loss, grads


out_dir = sys.argv[1] if len(sys.argv) > 1 else "fixtures/torch"
for name, bug in [("megatron_tp_ce", None), ("megatron_tp_ce_target_not_shifted", "target_not_shifted"),
                  ("megatron_tp_ce_local_max", "local_max")]:
    loss, grads = megatron(bug)
    for r in range(TP):
        meta = {"format_version": "2", "tp_rank": str(r), "tp_size": str(TP), "tp_vocab_start": str(r * W)}
        save_file({"logits": logits[:, r * W:(r + 1) * W].contiguous(), "tokens": tokens, "loss": loss,
                   "grad_loss": grad_loss, "grad_logits": grads[r].contiguous()},
                  f"{out_dir}/{name}_rank{r}.safetensors", metadata=meta)
    print(f"wrote {out_dir}/{name}_rank0..{TP - 1}.safetensors")
