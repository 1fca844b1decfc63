"""A generated LM head (docs/dump-from-pytorch.md, "Generated weights"):
`generate_weights` gives the tensor the documented algorithm defines (an
independent numpy transcription of the docs' text agrees bit for bit) and
the metadata a dump names it by; such a dump is judged as one holding the
tensor, in memory and from a file; other weights under the same keys are
bad input."""

from __future__ import annotations

import numpy as np
import pytest

import logprobe

MASK = (1 << 64) - 1
GAMMA = 0x9E3779B97F4A7C15


def draws(seed, ks):
    """SplitMix64's k-th outputs (the docs' `draw(k)`), as Python ints."""
    out = []
    for k in ks:
        z = (seed + k * GAMMA) & MASK
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK
        out.append(z ^ (z >> 31))
    return out


def to_bf16_bits(x):
    """Round-to-nearest-even f64 -> bf16 bits (normal range)."""
    b = np.asarray(x, dtype=np.float64).view(np.uint64)
    drop = np.uint64(45)
    half = (np.uint64(1) << (drop - np.uint64(1))) - np.uint64(1) + ((b >> drop) & np.uint64(1))
    r = ((b + half) >> drop) << drop
    return (r.view(np.float64).astype(np.float32).view(np.uint32) >> np.uint32(16)).astype(np.uint16)


def reference(distribution, seed, scale, n):
    """The docs' algorithm, transcribed with numpy (not correctly rounded,
    which moves a bf16 value with probability about 2^-40)."""
    unit = 2.0**-53
    if distribution == "uniform":
        u = np.array([d >> 11 for d in draws(seed, range(1, n + 1))], dtype=np.float64) * unit
        return scale * (2.0 * u - 1.0)
    pairs = (n + 1) // 2
    d = draws(seed, range(1, 2 * pairs + 1))
    u1 = (np.array([x >> 11 for x in d[0::2]], dtype=np.float64) + 1.0) * unit
    u2 = np.array([x >> 11 for x in d[1::2]], dtype=np.float64) * unit
    r, t = np.sqrt(-2.0 * np.log(u1)), np.pi * (2.0 * u2)
    out = np.empty(2 * pairs)
    out[0::2], out[1::2] = scale * (r * np.cos(t)), scale * (r * np.sin(t))
    return out[:n]


@pytest.mark.parametrize("distribution", ["normal", "uniform"])
def test_the_bytes_are_the_documented_algorithms(distribution):
    v, h = 16, 64
    w, meta = logprobe.generate_weights((v, h), seed=2026, scale=0.02, distribution=distribution,
                                        dtype="bfloat16", tensors="numpy")
    bits = np.asarray(w).view(np.uint16).reshape(-1)
    assert (bits == to_bf16_bits(reference(distribution, 2026, 0.02, v * h))).all()
    w32, _ = logprobe.generate_weights((v, h), seed=2026, scale=0.02, distribution=distribution,
                                       dtype="float32", tensors="numpy")
    assert (w32.reshape(-1) == reference(distribution, 2026, 0.02, v * h).astype(np.float32)).all()
    assert meta["lm_head_weight_generator"] == f"splitmix64-{distribution}-v1"
    assert meta["lm_head_weight_shape"] == "16,64" and meta["lm_head_weight_dtype"] == "bf16"
    import hashlib

    assert meta["lm_head_weight_sha256"] == hashlib.sha256(bits.astype("<u2").tobytes()).hexdigest()


def fused(rng, weight, n=6):
    h = weight.shape[1]
    hidden = rng.standard_normal((n, h)).astype(np.float32)
    tokens = rng.integers(0, weight.shape[0], n)
    logits = hidden.astype(np.float64) @ weight.astype(np.float64).T
    lse = logits.max(1) + np.log(np.exp(logits - logits.max(1, keepdims=True)).sum(1))
    return hidden, tokens, (logits[np.arange(n), tokens] - lse).astype(np.float32)


def test_a_dump_naming_generated_weights_is_judged_as_one_holding_them(tmp_path):
    weight, meta = logprobe.generate_weights((300, 32), seed=7, scale=32**-0.5, dtype="float32",
                                             tensors="numpy")
    hidden, tokens, log_probs = fused(np.random.default_rng(3), weight)
    whole = logprobe.verify(None, tokens, hidden=hidden, lm_head_weight=weight, log_probs=log_probs)
    in_memory = logprobe.verify(None, tokens, hidden=hidden, log_probs=log_probs, **meta)
    path = logprobe.save_dump(tmp_path / "d.safetensors", None, tokens, hidden=hidden,
                              log_probs=log_probs, **meta)
    by_file = logprobe.verify_file(path)
    assert whole.verdict == in_memory.verdict == by_file.verdict == "pass"
    errors = {r.outputs["log_probs"].max_abs_error for r in (whole, in_memory, by_file)}
    assert len(errors) == 1
    # Other weights under the same keys: refused before anything is judged.
    other = dict(meta, lm_head_weight_seed="8")
    with pytest.raises(logprobe.BadInputError, match="not the weights the dump was made with"):
        logprobe.verify(None, tokens, hidden=hidden, log_probs=log_probs, **other)
    with pytest.raises(logprobe.BadInputError, match="give the LM head once"):
        logprobe.verify(None, tokens, hidden=hidden, lm_head_weight=weight, log_probs=log_probs, **meta)


def test_bad_arguments_are_value_errors():
    with pytest.raises(ValueError, match="distribution"):
        logprobe.generate_weights((2, 2), seed=1, scale=1.0, distribution="cauchy")
    with pytest.raises(ValueError, match="lm_head_weight_scale"):
        logprobe.generate_weights((2, 2), seed=1, scale=float("nan"), tensors="numpy")
    with pytest.raises(ValueError, match="memory"):
        logprobe.generate_weights((1 << 40, 1 << 20), seed=1, scale=1.0, tensors="numpy")
    with pytest.raises(ValueError, match="seed"):
        logprobe.generate_weights((2, 2), seed=-1, scale=1.0, tensors="numpy")
