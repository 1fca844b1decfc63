"""Writes the cross-entropy `loss` dumps into fixtures/torch (format
version 2: `loss`, `reduction`, `label_smoothing`, `mean_all_ignored`,
`loss_weights`; docs/dump-format.md):

- `cross_entropy_{none,sum,mean}_smoothing_bf16`: bf16 logits (V=8192,
  N=16, 4 rows at ignore_index=-100), `F.cross_entropy(logits.float(),
  tokens, reduction=..., label_smoothing=0.1, ignore_index=-100)` in fp32,
  stored f32 (`[N]` under none, `[]` under sum / mean). Correct: pass.
- `cross_entropy_all_ignored_mean`: every token at ignore_index, `mean`:
  PyTorch's NaN (`mean_all_ignored=nan`, the default). Correct: pass.
- `cross_entropy_weighted_mean`: per-token weights (`loss_weights`, one of
  them 0), `(F.cross_entropy(..., reduction="none") * w).sum() /
  w[counted].sum()` in fp32, as RL / SFT trainers weight tokens. Correct:
  pass.
- `cross_entropy_smoothing_counts_ignored_rows`: the bug of
  pytorch/pytorch #73205 (torch 1.10-1.11): the label-smoothing term
  `eps * mean_j(-log p_j)` summed over every row, ignored ones included,
  then divided by the count of non-ignored rows. Must fail.

Run: /work/torchenv/bin/python scripts/torch_dumps/cross_entropy.py [OUT_DIR]
(torch, safetensors).
"""
import sys

import torch
import torch.nn.functional as F
from safetensors.torch import save_file

N, V, EPS, IGNORE = 16, 8192, 0.1, -100
g = torch.Generator().manual_seed(20261218)
# LLM-like rows: a Gaussian body, a few dominant tokens.
logits = (2.5 * torch.randn(N, V, generator=g)).to(torch.bfloat16)
top = torch.randint(0, V, (N, 4), generator=g)
logits.scatter_(1, top, (12 + 2 * torch.rand(N, 4, generator=g)).to(torch.bfloat16))
# Targets: mostly the dominant token, some from the body, 4 rows ignored.
tokens = top[:, 0].clone()
tokens[1::5] = torch.randint(0, V, (tokens[1::5].numel(),), generator=g)
tokens[3::4] = IGNORE
x = logits.float()

out_dir = sys.argv[1] if len(sys.argv) > 1 else "fixtures/torch"
written = []


def save(name, tensors, **meta):
    meta = {"format_version": "2", **{k: str(v) for k, v in meta.items()}}
    path = f"{out_dir}/{name}.safetensors"
    save_file({k: v.contiguous() for k, v in tensors.items()}, path, metadata=meta)
    written.append(path)


for reduction in ("none", "sum", "mean"):
    loss = F.cross_entropy(x, tokens, reduction=reduction, label_smoothing=EPS, ignore_index=IGNORE)
    save(
        f"cross_entropy_{reduction}_smoothing_bf16",
        {"logits": logits, "tokens": tokens, "loss": loss},
        reduction=reduction,
        label_smoothing=EPS,
    )

all_ignored = torch.full((N,), IGNORE, dtype=torch.int64)
loss = F.cross_entropy(x, all_ignored, reduction="mean", label_smoothing=EPS, ignore_index=IGNORE)
assert loss.isnan(), loss
save(
    "cross_entropy_all_ignored_mean",
    {"logits": logits, "tokens": all_ignored, "loss": loss},
    reduction="mean",
    label_smoothing=EPS,
    mean_all_ignored="nan",
)

w = (0.25 + torch.rand(N, generator=g)).to(torch.float32)
w[5] = 0.0
per_token = F.cross_entropy(x, tokens, reduction="none", ignore_index=IGNORE)
counted = tokens != IGNORE
loss = (per_token * w).sum() / w[counted].sum()
save(
    "cross_entropy_weighted_mean",
    {"logits": logits, "tokens": tokens, "loss_weights": w, "loss": loss},
    reduction="mean",
)

# pytorch/pytorch #73205: the smoothing term of ignored rows left in.
lsm = F.log_softmax(x, dim=-1)
safe = tokens.clamp(min=0)
nll = -lsm.gather(-1, safe[:, None]).squeeze(-1) * counted
smooth = -lsm.mean(dim=-1)  # not masked: ignored rows counted
loss = ((1 - EPS) * nll.sum() + EPS * smooth.sum()) / counted.sum()
save(
    "cross_entropy_smoothing_counts_ignored_rows",
    {"logits": logits, "tokens": tokens, "loss": loss},
    reduction="mean",
    label_smoothing=EPS,
)
print("wrote " + ", ".join(written))
