"""Writes fused linear + loss dumps into fixtures/torch (issue 45): the
dump gives `hidden [N, H]`, `lm_head_weight [V, H]` and `lm_head_bias [V]`
instead of logits, as a fused kernel (Liger's fused linear cross-entropy,
Cut Cross-Entropy, unsloth) sees them; the outputs are the target
log-probs, the entropy and the mean cross-entropy loss.

- `fused_linear_liger_bf16`: Liger's chunking in plain PyTorch: per chunk
  of 4 rows, `logits = hidden @ W.T` in bf16 (fp32 accumulation, rounded
  to bf16), `+ bias` in bf16, then `log_softmax(logits.float())`. Pass.
- `fused_linear_cce_fp32_logits`: Cut Cross-Entropy keeps the dot products
  in fp32 (`hidden.float() @ W.float().T + bias`), declared with
  `lm_head_logits_dtype=accumulation`. Pass.
- `fused_linear_bf16_logits_declared_fp32`: the Liger computation under
  the CCE declaration: its bf16 logits are far outside the fp32 matmul's
  bound. Fail (the declaration is wrong).
- `fused_linear_wrong_vocab_shard`: two vocabulary shards, the second
  reading W one row late (the off-by-one chunk of W). Fail.
- `fused_linear_bias_dropped`: the bias applied to nothing (forgotten on
  the chunked path). Fail.
- `fused_linear_softcap_missing`: Gemma 2's final softcap 30 declared
  (the weight doubled, exactly, so the logits reach the cap), the chunked
  path skips it. Fail.
- `fused_linear_softcap_gemma`: the same with the softcap applied. Pass.
- `fused_linear_liger_with_logits`: the Liger computation with its bf16
  logits given beside `hidden` (a candidate judged entry by entry). Pass.
- `fused_linear_logits_bf16_accumulated`: logits whose dot products were
  accumulated in bf16 (partial sums of 16 products rounded to bf16), given
  beside `hidden` with the outputs computed from them. Fail.

Run: PYTHONPATH=<torch> python scripts/torch_dumps/fused_linear.py [OUT_DIR]
(torch, safetensors).
"""
import sys

import torch
from safetensors.torch import save_file

N, H, V = 12, 128, 2048
g = torch.Generator().manual_seed(45)
hidden = torch.randn(N, H, generator=g).to(torch.bfloat16)
weight = (torch.randn(V, H, generator=g) / H ** 0.5 * 3.0).to(torch.bfloat16)
bias = (0.5 * torch.randn(V, generator=g)).to(torch.bfloat16)
tokens = torch.randint(0, V, (N,), generator=g)
tokens[5] = -100


def liger_logits(h, w, b, chunk=4, softcap=None):
    out = []
    for i in range(0, h.shape[0], chunk):
        x = h[i:i + chunk] @ w.t()  # bf16 in, bf16 out (fp32 accumulation)
        if b is not None:
            x = x + b
        x = x.float()
        if softcap is not None:
            x = softcap * torch.tanh(x / softcap)
        out.append(x)
    return torch.cat(out)


def outputs(x):
    lp = torch.log_softmax(x, dim=-1)
    safe = tokens.clamp(min=0)
    log_probs = lp.gather(1, safe[:, None])[:, 0]
    entropy = -(lp.exp() * lp).sum(-1)
    loss = torch.nn.functional.cross_entropy(x, tokens, ignore_index=-100, reduction="mean")
    return {"log_probs": log_probs, "entropy": entropy, "loss": loss.reshape(())}


def save(name, x, extra_meta=None, w=None, logits=None):
    meta = {"format_version": "2", "reduction": "mean"}
    meta.update(extra_meta or {})
    w = weight if w is None else w
    t = {"hidden": hidden.contiguous(), "lm_head_weight": w.contiguous(),
         "lm_head_bias": bias.contiguous(), "tokens": tokens}
    t.update(outputs(x))
    if logits is not None:
        t["logits"] = logits.contiguous()
    save_file(t, f"{out_dir}/{name}.safetensors", metadata=meta)


out_dir = sys.argv[1] if len(sys.argv) > 1 else "fixtures/torch"
save("fused_linear_liger_bf16", liger_logits(hidden, weight, bias))
cce = hidden.float() @ weight.float().t() + bias.float()
save("fused_linear_cce_fp32_logits", cce, {"lm_head_logits_dtype": "accumulation"})
save("fused_linear_bf16_logits_declared_fp32", liger_logits(hidden, weight, bias),
     {"lm_head_logits_dtype": "accumulation"})
# Two shards of V / 2 columns; the second reads W[V/2 + 1 :] (one row late,
# its last row repeated).
half = V // 2
w2 = torch.cat([weight[half + 1:], weight[-1:]])
shard = torch.cat([liger_logits(hidden, weight[:half], bias[:half]),
                   liger_logits(hidden, w2, bias[half:])], dim=1)
save("fused_linear_wrong_vocab_shard", shard)
save("fused_linear_bias_dropped", liger_logits(hidden, weight, None))
w2x = weight * 2  # exact in bf16
save("fused_linear_softcap_missing", liger_logits(hidden, w2x, bias),
     {"softcap": "30.0"}, w=w2x)
save("fused_linear_softcap_gemma", liger_logits(hidden, w2x, bias, softcap=30.0),
     {"softcap": "30.0"}, w=w2x)
lig = torch.cat([(hidden[i:i + 4] @ weight.t() + bias) for i in range(0, N, 4)])  # bf16
save("fused_linear_liger_with_logits", lig.float(), logits=lig)
acc = torch.zeros(N, V, dtype=torch.bfloat16)
for k in range(0, H, 16):
    acc = (acc.float() + hidden[:, k:k + 16].float() @ weight[:, k:k + 16].float().t()).to(torch.bfloat16)
bad = (acc + bias).to(torch.bfloat16)
save("fused_linear_logits_bf16_accumulated", bad.float(), logits=bad)
