"""Writes three mean cross-entropy dumps into fixtures/torch, for the
statistical tier of a reduced loss (TOLERANCE.md (S4)):

- `loss_chunked_mean_fp32`: torchtune's `CEWithChunkedOutputLoss` (per
  chunk of rows `F.cross_entropy(chunk.float(), labels, reduction="sum")`,
  the chunks' sums added in fp32, divided by the counted rows); bf16
  logits (V=16384), 64 rows in 8 chunks, 4 at ignore_index. Correct:
  pass, not SUSPECT.
- `loss_chunked_mean_bf16_total`: the same with the running total kept in
  bf16 (the accumulator a bf16 tensor, as under bf16 autocast): beyond the
  sound bound. Fail.
- `loss_mean_bf16_terms`: V=152064, 8 rows: the per-token losses rounded
  to bf16 (an autocast region's output), then summed in fp32 and divided:
  within the sound bound, far beyond careful code: SUSPECT (a fail under
  --strict).

Run: PYTHONPATH=<torch> python scripts/torch_dumps/loss_bf16_accumulation.py [OUT_DIR]
(torch, safetensors).
"""
import sys

import torch
import torch.nn.functional as F
from safetensors.torch import save_file

out_dir = sys.argv[1] if len(sys.argv) > 1 else "fixtures/torch"
meta = {"format_version": "2", "reduction": "mean"}
g = torch.Generator().manual_seed(20261211)


def case(n, v, ignored):
    logits = (2.0 * torch.randn(n, v, generator=g)).to(torch.bfloat16)
    labels = torch.randint(0, v, (n,), generator=g)
    labels[torch.randperm(n, generator=g)[:ignored]] = -100
    return logits, labels, (labels != -100).sum()


def chunked(logits, labels, counted, total, chunks=8):
    for x, t in zip(logits.chunk(chunks), labels.chunk(chunks)):
        total = total + F.cross_entropy(x.float(), t, reduction="sum", ignore_index=-100).to(total.dtype)
    return (total.float() / counted).reshape(())


def save(name, logits, labels, loss):
    save_file({"logits": logits.contiguous(), "tokens": labels, "loss": loss},
              f"{out_dir}/{name}.safetensors", metadata=meta)
    print(name, loss.item())


logits, labels, counted = case(64, 16384, 4)
save("loss_chunked_mean_fp32", logits, labels,
     chunked(logits, labels, counted, torch.zeros((), dtype=torch.float32)))
save("loss_chunked_mean_bf16_total", logits, labels,
     chunked(logits, labels, counted, torch.zeros((), dtype=torch.bfloat16)))
logits, labels, counted = case(8, 152064, 0)
per_token = F.cross_entropy(logits.float(), labels, reduction="none", ignore_index=-100)
save("loss_mean_bf16_terms", logits, labels,
     (per_token.to(torch.bfloat16).float().sum() / counted).reshape(()))
