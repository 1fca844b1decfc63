"""Writes fused linear + loss gradient dumps into fixtures/torch (issue 45,
TOLERANCE.md (T30)): the mean cross-entropy of `hidden @ W.T + b` and its
gradients with respect to the hidden states, the LM head's weight and its
bias, computed as Liger's fused linear cross-entropy does in plain
PyTorch: per chunk of rows, bf16 logits, the fp32 softmax gradient stored
back in bf16, `grad_hidden = g @ W` in bf16, and `grad_weight`,
`grad_bias` accumulated over the chunks.

- `fused_linear_grad_liger_fp32_acc`: `grad_weight` / `grad_bias`
  accumulated in fp32 across chunks, rounded to bf16 once. Pass.
- `fused_linear_grad_cce_fp32`: Cut Cross-Entropy's form: the logits and
  their gradient kept in fp32 (`lm_head_logits_dtype=accumulation`),
  chunks of 2 rows, `grad_weight` accumulated in fp32. Pass.
- `fused_linear_grad_bf16_acc`: the same with `grad_weight` / `grad_bias`
  accumulated in a bf16 buffer (each chunk's update rounds the running sum
  to bf16, as when the buffer has the weight's dtype). Fail. (Under
  Liger's bf16 gradient the same accumulation stays within the sound
  bound at these sizes: the gradient's own bf16 rounding, which the bound
  must allow on every term, is as large.)
- `fused_linear_grad_dropped_remainder`: chunks of 5 rows over 32; the
  last, partial chunk's weight gradient is never added. Fail.
- `fused_linear_grad_bias_forward_only`: the bias in the forward, its
  gradient left at zero. Fail.
- `fused_linear_grad_softcap_backward_missing`: softcap 30 in the forward
  (the weight doubled, exactly), the backward omits its factor
  `1 - tanh^2`. Fail.

Run: PYTHONPATH=<torch> python scripts/torch_dumps/fused_linear_grad.py [OUT_DIR]
(torch, safetensors).
"""
import sys

import torch
from safetensors.torch import save_file

N, H, V = 32, 64, 1024
g = torch.Generator().manual_seed(4530)
hidden = torch.randn(N, H, generator=g).to(torch.bfloat16)
weight = (torch.randn(V, H, generator=g) / H ** 0.5 * 3.0).to(torch.bfloat16)
bias = (0.5 * torch.randn(V, generator=g)).to(torch.bfloat16)
tokens = torch.randint(0, V, (N,), generator=g)
tokens[5] = -100
n_valid = int((tokens != -100).sum())


def fused(w, chunk=4, acc=torch.float32, drop_remainder=False, bias_grad=True,
          softcap=None, softcap_backward=True, cce=False):
    grad_w = torch.zeros(V, H, dtype=acc)
    grad_b = torch.zeros(V, dtype=acc)
    grad_h = torch.empty(N, H, dtype=torch.bfloat16)
    loss = torch.zeros((), dtype=torch.float32)
    for i in range(0, N, chunk):
        h = hidden[i:i + chunk]
        t = tokens[i:i + chunk]
        if cce:
            x = h.float() @ w.float().t() + bias.float()   # fp32 dot products
        else:
            x = (h @ w.t() + bias).float()          # bf16 logits, upcast
        if softcap is not None:
            th = torch.tanh(x / softcap)
            x = softcap * th
        lp = torch.log_softmax(x, -1)
        ok = t != -100
        safe = t.clamp(min=0)
        loss += -(lp.gather(-1, safe[:, None])[:, 0] * ok).sum() / n_valid
        gx = lp.exp()
        gx[torch.arange(len(t)), safe] -= 1.0
        gx = gx * ok[:, None] / n_valid
        if softcap is not None and softcap_backward:
            gx = gx * (1 - th * th)
        if cce:
            grad_h[i:i + chunk] = (gx @ w.float()).to(torch.bfloat16)
            upd_w, upd_b = gx.t() @ h.float(), gx.sum(0)
        else:
            gb = gx.to(torch.bfloat16)           # Liger: the gradient in the logits' buffer
            grad_h[i:i + chunk] = gb @ w
            upd_w, upd_b = gb.t().float() @ h.float(), gb.float().sum(0)
        if drop_remainder and i + chunk > N:
            continue
        # fp32 products; the running sums kept in `acc`.
        grad_w = (grad_w.float() + upd_w).to(acc)
        if bias_grad:
            grad_b = (grad_b.float() + upd_b).to(acc)
    return loss, grad_h, grad_w.to(torch.bfloat16), grad_b.to(torch.bfloat16)


def save(name, w, res, meta=None):
    loss, gh, gw, gb = res
    m = {"format_version": "2", "reduction": "mean"}
    m.update(meta or {})
    save_file({"hidden": hidden.contiguous(), "lm_head_weight": w.contiguous(),
               "lm_head_bias": bias.contiguous(), "tokens": tokens, "loss": loss,
               "grad_loss": torch.ones(()), "grad_hidden": gh, "grad_lm_head_weight": gw,
               "grad_lm_head_bias": gb}, f"{out_dir}/{name}.safetensors", metadata=m)


out_dir = sys.argv[1] if len(sys.argv) > 1 else "fixtures/torch"
save("fused_linear_grad_liger_fp32_acc", weight, fused(weight))
cce = {"lm_head_logits_dtype": "accumulation"}
save("fused_linear_grad_cce_fp32", weight, fused(weight, chunk=2, cce=True), cce)
save("fused_linear_grad_bf16_acc", weight, fused(weight, chunk=2, acc=torch.bfloat16, cce=True), cce)
save("fused_linear_grad_dropped_remainder", weight, fused(weight, chunk=5, drop_remainder=True))
save("fused_linear_grad_bias_forward_only", weight, fused(weight, bias_grad=False))
w2 = weight * 2
save("fused_linear_grad_softcap_backward_missing", w2,
     fused(w2, softcap=30.0, softcap_backward=False), {"softcap": "30.0"})
save("fused_linear_grad_softcap", w2, fused(w2, softcap=30.0), {"softcap": "30.0"})
