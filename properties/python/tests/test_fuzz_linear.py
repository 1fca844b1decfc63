"""logprobe.fuzz_linear on fused linear + cross-entropy kernels written with
torch autograd (fuzz protocol v2, in-process): the correct F.linear +
log_softmax path passes; planted bugs (the bias's gradient dropped, the
softcap missing, grad_weight rounded to bf16 per chunk) are found, shrunk,
and their dumps fail `logprobe.verify_file`. Skipped without torch."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

import logprobe  # noqa: E402


def log_probs(hidden, lm_head_weight, targets, *, lm_head_bias, temperature, softcap, ignore_index,
              bug="none"):
    """Liger's form: logits in the inputs' dtype, then f32."""
    bias = lm_head_bias
    if bias is not None and bug == "bias-gradient-dropped":
        bias = bias.detach()
    x = torch.nn.functional.linear(hidden, lm_head_weight, bias).float()
    if softcap is not None and bug != "softcap-missing":
        x = softcap * torch.tanh(x / softcap)
    lp = torch.log_softmax(x / temperature, dim=-1)
    safe = torch.where(targets == ignore_index, torch.zeros_like(targets), targets)
    return lp.gather(-1, safe[:, None]).squeeze(-1)


def chunked_bf16_grad_weight(hidden, lm_head_weight, targets, **kw):
    """A chunked kernel whose weight gradient is summed in bf16 across chunks
    (a custom autograd.Function)."""
    class F(torch.autograd.Function):
        @staticmethod
        def forward(ctx, h, w):
            ctx.save_for_backward(h, w)
            return log_probs(h, w, targets, **kw)

        @staticmethod
        def backward(ctx, g):
            h, w = ctx.saved_tensors
            gw = torch.zeros_like(w, dtype=torch.bfloat16)
            gh = torch.zeros_like(h, dtype=torch.float32)
            for r in range(0, h.shape[0], 2):
                with torch.enable_grad():
                    hh, ww = h[r:r + 2].detach().requires_grad_(), w.detach().requires_grad_()
                    lp = log_probs(hh, ww, targets[r:r + 2], **kw)
                    a, b = torch.autograd.grad(lp, (hh, ww), g[r:r + 2])
                gh[r:r + 2] = a.float()
                gw = (gw.float() + b.float()).to(torch.bfloat16)
            return gh.to(h.dtype), gw.to(w.dtype)
    kw = dict(kw)
    kw["lm_head_bias"] = None
    return F.apply(hidden, lm_head_weight)


def test_the_correct_autograd_kernel_is_clean():
    r = logprobe.fuzz_linear(log_probs, cases=40, seed=1, budget="120s")
    assert r.ok, r.table
    assert r.cases == 40 and r.checked > 20, r.table
    assert 0.0 < r.worst <= 1.0


@pytest.mark.parametrize("bug,options", [
    ("bias-gradient-dropped", "bias=on"),
    ("softcap-missing", "softcap=30,weight_scale=40..64"),
])
def test_planted_bugs_are_found_and_their_dumps_fail_verify(tmp_path, bug, options):
    def fn(*a, **k):
        return log_probs(*a, bug=bug, **k)
    r = logprobe.fuzz_linear(fn, cases=60, seed=2, options=options, shrink_budget="5s", budget="120s")
    assert r.finding is not None, r.table
    assert r.finding.property == "oracle agreement", r.table
    (path,) = r.save(tmp_path / "finding.safetensors")
    assert logprobe.verify_file(path).verdict == "fail"


def test_bf16_weight_gradient_accumulation_is_found():
    r = logprobe.fuzz_linear(chunked_bf16_grad_weight, cases=60, seed=3, dtypes="float32",
                             options="bias=off,rows=6..12", outputs=("log_probs", "grad_lm_head_weight"),
                             lm_head_logits_dtype="accumulation", budget="120s")
    assert r.finding is not None, r.table
    assert "grad_lm_head_weight" in r.finding.detail, r.table


def test_an_exception_and_bad_arguments():
    def boom(*a, **k):
        raise RuntimeError("kernel exploded")
    r = logprobe.fuzz_linear(boom, cases=3, seed=1)
    assert r.finding is not None and r.finding.property == "command"
    assert "kernel exploded" in r.finding.detail
    with pytest.raises(ValueError):
        logprobe.fuzz_linear(log_probs, cases=1, outputs=("topk_log_probs",))
    with pytest.raises(ValueError):
        logprobe.fuzz_linear(log_probs, cases=1, options="weight=3")
    with pytest.raises(ValueError):
        logprobe.fuzz_linear(log_probs, cases=1, lm_head_logits_dtype="f16")
    with pytest.raises(TypeError):
        logprobe.fuzz_linear(log_probs, cases=-1)
