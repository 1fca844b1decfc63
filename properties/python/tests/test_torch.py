"""logprobe.verify on torch tensors (skipped without torch): bf16 read
bit-exactly (torch, ml_dtypes and uint16 paths agree), autograd gradients,
a bf16-summed normaliser caught, [B, T, V], tensors that require grad,
a fused linear + loss kernel judged from hidden states and the LM head."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import logprobe  # noqa: E402
import logprobe.testing  # noqa: E402
from conftest import figures  # noqa: E402


def kernel_f32(logits, tokens, out_dtype):
    """An fp32 kernel on bf16 logits, outputs rounded to ``out_dtype``."""
    lp_all = torch.log_softmax(logits.float(), dim=-1)
    lp = lp_all.gather(-1, tokens[..., None]).squeeze(-1)
    ent = -(lp_all.exp() * lp_all).sum(-1)
    return lp.to(out_dtype), ent.to(out_dtype)


def test_bf16_kernel_passes_and_all_bf16_paths_agree():
    g = torch.Generator().manual_seed(3)
    logits = (3 * torch.randn(8, 4096, generator=g)).to(torch.bfloat16)
    tokens = torch.randint(0, 4096, (8,), generator=g)
    lp, ent = kernel_f32(logits, tokens, torch.bfloat16)
    a = logprobe.testing.assert_verified(logits, tokens, log_probs=lp, entropy=ent)
    assert a.logits_dtype == "bf16" and a["entropy"].dtype == "bf16"
    # The same bits as int16 / uint16 with dtype="bfloat16".
    u16 = lambda t: t.view(torch.int16).numpy().view(np.uint16)  # noqa: E731
    b = logprobe.verify(u16(logits), tokens, log_probs=u16(lp), entropy=ent.view(torch.int16),
                        dtype="bfloat16")
    assert figures(a) == figures(b)
    ml_dtypes = pytest.importorskip("ml_dtypes")
    c = logprobe.verify(u16(logits).view(ml_dtypes.bfloat16), tokens.numpy(),
                        log_probs=u16(lp).view(ml_dtypes.bfloat16), entropy=u16(ent).view(ml_dtypes.bfloat16))
    assert figures(a) == figures(c)


def test_bf16_summed_normaliser_fails():
    g = torch.Generator().manual_seed(4)
    logits = (3 * torch.randn(8, 4096, generator=g)).to(torch.bfloat16)
    tokens = torch.randint(0, 4096, (8,), generator=g)
    # The normaliser summed in bf16 (one rounding per add).
    m = logits.max(-1, keepdim=True).values
    s = torch.zeros(8, 1, dtype=torch.bfloat16)
    for j in range(0, 4096, 256):
        s = s + (logits[:, j : j + 256] - m).exp().sum(-1, keepdim=True, dtype=torch.bfloat16)
    lp = (logits.float().gather(-1, tokens[:, None]) - m.float() - s.float().log()).squeeze(-1)
    r = logprobe.verify(logits, tokens, log_probs=lp)
    assert r.verdict == "fail" and r["log_probs"].max_ratio > 1
    with pytest.raises(AssertionError, match="worst log_probs"):
        logprobe.testing.assert_verified(logits, tokens, log_probs=lp)


def test_fused_linear_kernel_from_hidden_and_lm_head():
    g = torch.Generator().manual_seed(45)
    N, H, V = 6, 128, 2048
    hidden = torch.randn(N, H, generator=g).to(torch.bfloat16)
    weight = (torch.randn(V, H, generator=g) / H**0.5 * 3).to(torch.bfloat16)
    tokens = torch.randint(0, V, (N,), generator=g)

    def liger(w):
        # Liger's chunks: bf16 matmul (fp32 accumulation), fp32 log-softmax.
        chunks = [torch.log_softmax((hidden[i : i + 2] @ w.t()).float(), -1) for i in range(0, N, 2)]
        return torch.cat(chunks).gather(-1, tokens[:, None]).squeeze(-1)

    r = logprobe.testing.assert_verified(hidden=hidden, lm_head_weight=weight, tokens=tokens, log_probs=liger(weight))
    assert "lm_head_weight" in r.logits_dtype and r["log_probs"].count == N
    # The second vocabulary shard reading W one row late.
    half = V // 2
    late = torch.cat([weight[:half], weight[half + 1 :], weight[-1:]])
    bad = logprobe.verify(hidden=hidden, lm_head_weight=weight, tokens=tokens, log_probs=liger(late))
    assert bad.verdict == "fail"
    # Autograd's gradients of the LM head (bf16 matmuls, fp32 loss).
    h, w = hidden.clone().requires_grad_(), weight.clone().requires_grad_()
    loss = torch.nn.functional.cross_entropy((h @ w.t()).float(), tokens)
    loss.backward()
    g = logprobe.testing.assert_verified(hidden=hidden, lm_head_weight=weight, tokens=tokens, loss=loss.detach(),
                                         grad_loss=torch.ones(()), reduction="mean", grad_hidden=h.grad,
                                         grad_lm_head_weight=w.grad)
    assert g["grad_lm_head_weight"].count == V * H
    # The weight gradient of the first half of the rows only (a dropped chunk).
    h2, w2 = hidden.clone().requires_grad_(), weight.clone().requires_grad_()
    part = torch.nn.functional.cross_entropy((h2[: N // 2] @ w2.t()).float(), tokens[: N // 2], reduction="sum") / N
    part.backward()
    bad = logprobe.verify(hidden=hidden, lm_head_weight=weight, tokens=tokens, grad_loss=torch.ones(()),
                          reduction="mean", grad_lm_head_weight=w2.grad)
    assert bad["grad_lm_head_weight"].verdict == "fail"


def test_autograd_gradients_and_requires_grad_inputs():
    g = torch.Generator().manual_seed(5)
    N, V, T = 6, 1000, 0.7
    logits = (3 * torch.randn(N, V, generator=g)).requires_grad_(True)
    tokens = torch.randint(0, V, (N,), generator=g)
    lp_all = torch.log_softmax(logits / T, dim=-1)
    log_probs = lp_all.gather(-1, tokens[:, None]).squeeze(-1)
    entropy = -(lp_all.exp() * lp_all).sum(-1)
    gl, ge = torch.randn(N, generator=g), torch.randn(N, generator=g)
    (grad,) = torch.autograd.grad((log_probs * gl).sum() + (entropy * ge).sum(), logits, retain_graph=True)
    r = logprobe.testing.assert_verified(
        logits, tokens, log_probs=log_probs, entropy=entropy, grad_log_probs=gl, grad_entropy=ge,
        grad_logits=grad, temperature=T,
    )
    assert r["grad_logits"].count == N * V
    # Gradients that use grad_output[0] for every row.
    wrong = torch.autograd.grad((log_probs * gl[0]).sum() + (entropy * ge[0]).sum(), logits)[0]
    bad = logprobe.verify(logits, tokens, grad_log_probs=gl, grad_entropy=ge, grad_logits=wrong, temperature=T)
    assert bad["grad_logits"].verdict == "fail" and bad["grad_logits"].worst[0].row != 0


def test_btv_and_masks():
    g = torch.Generator().manual_seed(6)
    logits = torch.randn(2, 3, 500, generator=g)
    tokens = torch.randint(0, 500, (2, 3), generator=g)
    mask = torch.rand(2, 3, 500, generator=g) < 0.5
    mask.scatter_(-1, tokens[..., None], True)
    z = logits.masked_fill(~mask, float("-inf"))
    lp = torch.log_softmax(z.double(), -1).gather(-1, tokens[..., None]).squeeze(-1).float()
    r = logprobe.testing.assert_verified(logits, tokens, log_probs=lp, sampling_mask=mask)
    assert r.rows == 6
    # Ignoring the mask is caught.
    unmasked = torch.log_softmax(logits.double(), -1).gather(-1, tokens[..., None]).squeeze(-1).float()
    assert logprobe.verify(logits, tokens, log_probs=unmasked, sampling_mask=mask).verdict == "fail"


def test_non_contiguous_torch_tensor():
    g = torch.Generator().manual_seed(7)
    base = torch.randn(300, 4, generator=g)
    logits = base.t()  # [4, 300], strided
    tokens = torch.tensor([1, 2, 3, 4])
    lp = torch.log_softmax(logits.double(), -1).gather(-1, tokens[:, None]).squeeze(-1).float()
    a = logprobe.verify(logits, tokens, log_probs=lp)
    b = logprobe.verify(logits.contiguous(), tokens, log_probs=lp)
    assert a.ok and figures(a) == figures(b)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
def test_cuda_tensors_are_copied_to_the_host():
    logits = torch.randn(4, 1000, device="cuda").to(torch.bfloat16)
    tokens = torch.randint(0, 1000, (4,), device="cuda")
    lp, ent = kernel_f32(logits, tokens, torch.float32)
    a = logprobe.verify(logits, tokens, log_probs=lp, entropy=ent)
    b = logprobe.verify(logits.cpu(), tokens.cpu(), log_probs=lp.cpu(), entropy=ent.cpu())
    assert figures(a) == figures(b)
