"""The LM head in a file of its own (docs/dump-from-pytorch.md, "A shared
weights file"): `save_weights` writes it and returns the keys a dump names
it by; the dump is judged as one holding the weights; a changed file, and
tensors in memory naming a file, are bad input."""

from __future__ import annotations

import numpy as np
import pytest

import logprobe


def fused(rng, n=6, h=32, v=300):
    hidden = rng.standard_normal((n, h)).astype(np.float32)
    weight = (rng.standard_normal((v, h)) / np.sqrt(h)).astype(np.float32)
    tokens = rng.integers(0, v, n)
    logits = hidden.astype(np.float64) @ weight.astype(np.float64).T
    lse = logits.max(1) + np.log(np.exp(logits - logits.max(1, keepdims=True)).sum(1))
    log_probs = (logits[np.arange(n), tokens] - lse).astype(np.float32)
    return hidden, weight, tokens, log_probs


def test_a_dump_naming_its_weights_file_is_judged_as_one_holding_them(tmp_path):
    hidden, weight, tokens, log_probs = fused(np.random.default_rng(3))
    keys = logprobe.save_weights(tmp_path / "head.safetensors", weight)
    assert set(keys) == {"lm_head_weight_file", "lm_head_weight_sha256"}
    keys["lm_head_weight_file"] = "head.safetensors"  # from the dump's folder
    path = logprobe.save_dump(tmp_path / "d.safetensors", None, tokens, hidden=hidden,
                              log_probs=log_probs, **keys)
    by_file = logprobe.verify_file(path)
    whole = logprobe.verify(None, tokens, hidden=hidden, lm_head_weight=weight, log_probs=log_probs)
    assert by_file.verdict == whole.verdict == "pass"
    assert by_file.outputs["log_probs"].max_abs_error == whole.outputs["log_probs"].max_abs_error
    # Other weights under the same name: refused before anything is judged.
    logprobe.save_weights(tmp_path / "head.safetensors", weight * 2)
    with pytest.raises(logprobe.BadInputError, match="not the weights the dump was made with"):
        logprobe.verify_file(path)
    # Tensors in memory have no folder to find a file from.
    with pytest.raises(logprobe.BadInputError, match="read only for a dump file"):
        logprobe.verify(None, tokens, hidden=hidden, log_probs=log_probs, **keys)
