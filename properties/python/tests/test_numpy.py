"""logprobe.verify on numpy arrays (and ml_dtypes bfloat16): correct kernels
pass, planted bugs fail with the right rows, bad input raises naming
tensor / row / column, nothing unchecked passes."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

import logprobe
import logprobe.testing
from conftest import figures, log_softmax64, reference



def f32_case(rng, n=8, v=1000):
    logits = (3 * rng.standard_normal((n, v))).astype(np.float32)
    tokens = rng.integers(0, v, n)
    return logits, tokens


def test_correct_f32_kernel_passes(rng):
    logits, tokens = f32_case(rng)
    lp, ent = reference(logits, tokens)
    r = logprobe.testing.assert_verified(logits, tokens, log_probs=lp, entropy=ent)
    assert r.ok and r.verdict == "pass"
    assert list(r.outputs) == ["log_probs", "entropy"]
    assert r["log_probs"].count == 8 and r["entropy"].count == 8
    assert r["log_probs"].max_ratio <= 1.0
    assert r["log_probs"].tightest_model in ("tree", "lanes=8", "sequential")
    assert r.rows == 8 and r.columns == 1000 and r.logits_dtype == "f32"
    assert str(r).startswith("<tensors>: pass")


def test_raw_form_at_a_large_offset_passes_the_default_and_forms_are_named(rng):
    # x.gather(t) - logsumexp(x) on f32 logits near 300 (TRL / verl's form):
    # correct, so it passes the default form "any" (TOLERANCE.md (T2a)).
    x = (rng.standard_normal((8, 1024)) + 300.0).astype(np.float32)
    t = rng.integers(0, 1024, 8)
    m = x.max(axis=1, keepdims=True)
    lse = (m + np.log(np.exp(x - m).sum(axis=1, keepdims=True, dtype=np.float32))).astype(np.float32)
    lp = (x[np.arange(8), t] - lse[:, 0]).astype(np.float32)
    r = logprobe.verify(x, t, log_probs=lp)
    assert r.verdict == "pass", str(r)
    declared = logprobe.verify(x, t, log_probs=lp, form="raw", k3_form="expm1")
    assert declared.verdict == "pass" and "form=raw k3_form=expm1" in str(declared)
    with pytest.raises(ValueError, match='form="sideways"'):
        logprobe.verify(x, t, log_probs=lp, form="sideways")


def test_naive_entropy_on_neg_inf_logits_fails_on_that_row(rng):
    logits, tokens = f32_case(rng)
    logits[5, :10] = -np.inf
    tokens[5] = 20
    lp, _ = reference(logits, tokens)
    with np.errstate(all="ignore"):
        q = log_softmax64(logits)
        naive = (-(np.exp(q) * q).sum(-1)).astype(np.float32)  # 0 * -inf = NaN
    r = logprobe.verify(logits, tokens, log_probs=lp, entropy=naive)
    assert not r.ok and r.verdict == "fail"
    assert r["log_probs"].verdict == "pass" and r["entropy"].verdict == "fail"
    assert r["entropy"].worst[0].row == 5 and np.isnan(r["entropy"].worst[0].candidate)
    with pytest.raises(AssertionError) as e:
        logprobe.testing.assert_verified(logits, tokens, log_probs=lp, entropy=naive)
    msg = str(e.value)
    assert msg.startswith("logprobe: fail") and "worst entropy:" in msg and "[5]" in msg


def test_dropped_chunk_remainder_fails(rng):
    logits, tokens = f32_case(rng, v=1000)
    tokens[:] = rng.integers(0, 900, 8)
    x = logits.astype(np.float64)
    # A chunked kernel that forgets the last 1000 % 128 = 104 columns of its normaliser.
    lse = np.log(np.exp(x[:, :896]).sum(-1))
    lp = (x[np.arange(8), tokens] - lse).astype(np.float32)
    r = logprobe.verify(logits, tokens, log_probs=lp)
    assert r.verdict == "fail" and r["log_probs"].max_ratio > 1


def test_ml_dtypes_bfloat16_and_uint16_bits_agree():
    ml_dtypes = pytest.importorskip("ml_dtypes")
    rng = np.random.default_rng(7)
    logits = (3 * rng.standard_normal((6, 4096))).astype(ml_dtypes.bfloat16)
    tokens = rng.integers(0, 4096, 6)
    lp, ent = reference(logits, tokens, out_dtype=ml_dtypes.bfloat16)
    a = logprobe.verify(logits, tokens, log_probs=lp, entropy=ent)
    assert a.ok and a.logits_dtype == "bf16" and a["log_probs"].dtype == "bf16"
    b = logprobe.verify(
        logits.view(np.uint16), tokens, log_probs=lp.view(np.uint16), entropy=ent.view(np.uint16), dtype="bfloat16"
    )
    c = logprobe.verify(
        logits.view(np.uint16), tokens, log_probs=lp, entropy=ent.view(np.uint16),
        dtype={"logits": "bfloat16", "entropy": "bf16"},
    )
    assert figures(a) == figures(b) == figures(c)


def test_float16_and_uint16_float16_bits_agree(rng):
    logits = (3 * rng.standard_normal((6, 2048))).astype(np.float16)
    tokens = rng.integers(0, 2048, 6)
    lp, ent = reference(logits, tokens, out_dtype=np.float16)  # f32 -> f16: one RNE rounding
    a = logprobe.verify(logits, tokens, log_probs=lp, entropy=ent)
    assert a.ok and a.logits_dtype == "f16" and a["entropy"].dtype == "f16"
    b = logprobe.verify(logits.view(np.uint16), tokens, log_probs=lp.view(np.uint16), entropy=ent, dtype="float16")
    assert figures(a) == figures(b)
    # Truncating instead of rounding to f16 is caught (a shipped dump's bug kind).
    trunc = (np.abs(reference(logits, tokens)[0]).view(np.uint32) & ~np.uint32(0x1FFF)).view(np.float32)
    trunc = (-trunc).astype(np.float16)  # now exact in f16: the truncated value
    r = logprobe.verify(logits, tokens, log_probs=trunc, worst=6)
    assert r.verdict == "fail" and r["log_probs"].max_ulps > 0.5


def test_one_bf16_ulp_is_counted_in_bf16_ulps():
    ml_dtypes = pytest.importorskip("ml_dtypes")
    rng = np.random.default_rng(8)
    logits = (3 * rng.standard_normal((6, 512))).astype(ml_dtypes.bfloat16)
    tokens = rng.integers(0, 512, 6)
    lp, _ = reference(logits, tokens, out_dtype=ml_dtypes.bfloat16)
    bits = lp.view(np.uint16).copy()
    bits[3] += 1  # one bf16 ulp away from the correctly rounded value (in magnitude)
    r = logprobe.verify(logits, tokens, log_probs=bits, dtype="bfloat16", worst=6)
    w = r["log_probs"].worst[0]
    assert w.row == 3 and 0.5 <= w.ulps <= 1.5
    assert w.exact_rounded == float(lp[3].astype(np.float64))
    assert w.candidate != w.exact_rounded


def test_uint16_without_dtype_is_bad_input(rng):
    logits = rng.standard_normal((2, 8)).astype(np.float32).view(np.uint16)
    with pytest.raises(logprobe.BadInputError, match=r'tensor `logits` is uint16: pass dtype="bfloat16"'):
        logprobe.verify(logits, np.array([0, 1]), log_probs=np.zeros(2, np.float32))
    # uint16 token ids stay ids under dtype="bfloat16".
    ml_dtypes = pytest.importorskip("ml_dtypes")
    x = rng.standard_normal((2, 8)).astype(ml_dtypes.bfloat16)
    t = np.array([3, 4], np.uint16)
    lp, _ = reference(x, t.astype(np.int64))
    assert logprobe.verify(x.view(np.uint16), t, log_probs=lp, dtype="bfloat16").ok


def test_btv_shapes_report_positions(rng):
    logits, tokens = f32_case(rng, n=8, v=300)
    lp, ent = reference(logits, tokens)
    lp[5] = lp[5] + np.float32(0.25)  # row 5 = (b, t) = (1, 1) of [2, 4]
    flat = logprobe.verify(logits, tokens, log_probs=lp, entropy=ent)
    btv = logprobe.verify(
        logits.reshape(2, 4, 300), tokens.reshape(2, 4), log_probs=lp.reshape(2, 4), entropy=ent.reshape(2, 4)
    )
    assert btv.verdict == flat.verdict == "fail"
    w = btv["log_probs"].worst[0]
    assert (w.row, w.position) == (5, (1, 1)) and flat["log_probs"].worst[0].position is None
    for name in ("log_probs", "entropy"):
        assert btv[name].max_abs_error == flat[name].max_abs_error
    assert "(1, 1)" in str(btv)


def test_bad_input_names_tensor_row_and_column(rng):
    logits, tokens = f32_case(rng)
    lp, _ = reference(logits, tokens)
    bad = logits.copy()
    bad[2, 7] = np.nan
    with pytest.raises(ValueError, match=r"logits\[2, 7\] is NaN"):
        logprobe.verify(bad, tokens, log_probs=lp)
    t = tokens.copy()
    t[1] = 1000
    with pytest.raises(logprobe.BadInputError, match=r"tokens\[1\] = 1000 is outside \[0, 1000\)"):
        logprobe.verify(logits, t, log_probs=lp)
    with pytest.raises(logprobe.BadInputError, match=r"tensor `log_probs` has shape \[9\]"):
        logprobe.verify(logits, tokens, log_probs=np.zeros(9, np.float32))
    with pytest.raises(logprobe.BadInputError, match="no candidate to verify"):
        logprobe.verify(logits, tokens)
    with pytest.raises(logprobe.BadInputError, match=r"metadata `temperature`"):
        logprobe.verify(logits, tokens, log_probs=lp, temperature=-1.0)
    b3 = logits.reshape(2, 4, 1000).copy()
    b3[1, 2, 9] = np.inf
    with pytest.raises(logprobe.BadInputError, match=r"at \(b, t\) = \(1, 2\)"):
        logprobe.verify(b3, tokens.reshape(2, 4), log_probs=lp.reshape(2, 4))


def test_nothing_checked_is_never_a_pass(rng):
    logits, tokens = f32_case(rng)
    lp, ent = reference(logits, tokens)
    ignored = np.full(8, -100)
    r = logprobe.verify(logits, ignored, log_probs=np.zeros(8, np.float32))
    assert r.verdict == "unchecked" and not r.ok and not r
    assert "ignore_index" in r.unchecked["log_probs"] and r["log_probs"].verdict == "unchecked"
    with pytest.raises(AssertionError, match="nothing checked for log_probs"):
        logprobe.testing.assert_verified(logits, ignored, log_probs=np.zeros(8, np.float32))
    # Entropy checked, log_probs not: still not ok.
    r = logprobe.verify(logits, ignored, log_probs=np.zeros(8, np.float32), entropy=ent)
    assert r["entropy"].verdict == "pass" and r.verdict == "unchecked" and not r.ok
    # Every row excluded by row_mask (a format-version-2 name: set by verify).
    r = logprobe.verify(logits, tokens, log_probs=lp, row_mask=np.zeros(8, bool))
    assert r.verdict == "unchecked" and r.rows_checked == 0


def test_keywords_metadata_rows_and_options(rng):
    logits, tokens = f32_case(rng)
    with pytest.raises(TypeError, match="did you mean 'log_probs'"):
        logprobe.verify(logits, tokens, log_prob=np.zeros(8, np.float32))
    # The top-k KL's cotangent (built since issue 18) needs the teacher it differentiates.
    with pytest.raises(logprobe.BadInputError, match="teacher_topk_log_probs"):
        logprobe.verify(logits, tokens, grad_reverse_kl=np.zeros(8, np.float32))
    with pytest.raises(ValueError, match="model="):
        logprobe.verify(logits, tokens, log_probs=np.zeros(8, np.float32), model="lanes=0")
    T = 0.7
    lp, ent = reference(logits / np.float64(T), tokens)
    r = logprobe.verify(logits, tokens, log_probs=lp, entropy=ent, temperature=T, rows="sample:3")
    assert r.ok and r.rows_checked == 3
    r = logprobe.verify(logits, tokens, log_probs=lp, entropy=ent, temperature=np.float64(T), rows=range(2, 6))
    assert r.ok and r.rows_checked == 4
    # The wrong temperature is caught.
    assert not logprobe.verify(logits, tokens, log_probs=lp, temperature=0.75).ok
    # A broken row excluded by row_mask is not judged; vocab_size truncates padding.
    lp, ent = reference(logits, tokens)
    bad = lp.copy()
    bad[0] += 1
    mask = np.ones(8, bool)
    mask[0] = False
    assert logprobe.verify(logits, tokens, log_probs=bad, row_mask=mask).ok
    r = logprobe.verify(logits, tokens, log_probs=lp, model="sequential", worst=1, statistical_c=None)
    assert r.ok and r.model == "sequential" and len(r["log_probs"].worst) == 1
    assert r["log_probs"].statistical_max_ratio is None


def test_strided_and_dlpack_producers(rng):
    logits, tokens = f32_case(rng, v=600)
    lp, ent = reference(logits, tokens)
    wide = np.zeros((8, 1200), np.float32)
    wide[:, ::2] = logits
    strided = wide[:, ::2]
    assert not strided.flags.c_contiguous

    class Producer:
        """Only the DLPack protocol (a strided view): read by Rust's gather."""

        def __init__(self, a):
            self.a = a

        def __dlpack__(self, **kw):
            return self.a.__dlpack__(**kw)

        def __dlpack_device__(self):
            return self.a.__dlpack_device__()

    class Legacy:
        """A pre-DLPack-1.0 producer (numpy < 2.1): no `max_version` keyword."""

        def __init__(self, a):
            self.a = a

        def __dlpack__(self, stream=None):
            return self.a.__dlpack__()

        def __dlpack_device__(self):
            return self.a.__dlpack_device__()

    a = logprobe.verify(logits, tokens, log_probs=lp, entropy=ent)
    b = logprobe.verify(strided, tokens, log_probs=lp, entropy=ent)
    c = logprobe.verify(Producer(strided), Producer(tokens), log_probs=Producer(lp), entropy=ent)
    d = logprobe.verify(Legacy(logits), Legacy(tokens), log_probs=Legacy(lp.copy()), entropy=ent)
    assert figures(a) == figures(b) == figures(c) == figures(d)
    with pytest.raises(TypeError, match="tensor `entropy`: expected a torch tensor"):
        logprobe.verify(logits, tokens, log_probs=lp, entropy=object())
    # Python lists are arrays too (floats as f64: judged in f64 ulps, so an
    # f32-rounded log-prob passed as a float list fails).
    lp64 = np.take_along_axis(log_softmax64(logits), tokens[:, None], -1)[:, 0]
    assert logprobe.verify(logits.tolist(), tokens.tolist(), log_probs=lp64.tolist()).ok
    assert not logprobe.verify(logits.tolist(), tokens.tolist(), log_probs=lp.astype(np.float64).tolist()).ok


def test_report_to_dict_and_str(rng):
    logits, tokens = f32_case(rng)
    lp, ent = reference(logits, tokens)
    r = logprobe.verify(logits, tokens, log_probs=lp, entropy=ent, name="my_kernel")
    d = r.to_dict()
    assert d["verdict"] == "pass" and d["ok"] is True and d["unchecked"] == {}
    assert d["rows"] == 8 and [o["output"] for o in d["outputs"]] == ["log_probs", "entropy"]
    assert set(d["outputs"][0]) >= {"max_abs_error", "max_ulps", "max_ratio", "tightest_model", "worst"}
    w = d["outputs"][0]["worst"][0]
    assert set(w) >= {"row", "candidate", "exact", "error", "ulps", "bound", "ratio"}
    s = str(r)
    assert s.startswith("my_kernel: pass") and "err/bound" in s and "worst log_probs:" in s
    assert "log_probs pass" in r.summary() and "ok=True" in repr(r)


def test_work_runs_with_the_gil_released(rng):
    logits = (3 * rng.standard_normal((64, 20000))).astype(np.float32)
    tokens = rng.integers(0, 20000, 64)
    lp, ent = reference(logits, tokens)
    done = threading.Event()
    out = {}

    def run():
        t0 = time.perf_counter()
        out["r"] = logprobe.verify(logits, tokens, log_probs=lp, entropy=ent)
        out["s"] = time.perf_counter() - t0
        done.set()

    th = threading.Thread(target=run)
    ticks = 0
    th.start()
    while not done.is_set():
        ticks += 1
        time.sleep(0.001)
    th.join()
    assert out["r"].ok
    # Holding the GIL for the whole call would leave this thread a few ticks
    # at most (before and after the call); released, it ticks throughout.
    assert out["s"] < 0.2 or ticks >= 10, (ticks, out["s"])
