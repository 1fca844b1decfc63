"""logprobe.compare on the worked example (fixtures/torch/compare, docs/compare.md):
the same report as the library call of `logprobe compare` on the files
(figures equal), the decomposition on the enclosures, B without logits, bad input."""

from __future__ import annotations

from fractions import Fraction

import pytest

import logprobe
from conftest import REPO, read_safetensors

COMPARE = REPO / "fixtures" / "torch" / "compare"


def side(stem: str):
    tensors, meta, bf16 = read_safetensors(COMPARE / f"{stem}.safetensors")
    return {**tensors, **meta}, {n: "bfloat16" for n in bf16} or None


def run(a: str, b: str, **kw) -> logprobe.CompareReport:
    (da, ta), (db, tb) = side(a), side(b)
    return logprobe.compare(da, db, dtype_a=ta, dtype_b=tb, **kw)


def test_worked_example_attributes_both_parts():
    r = run("trainer_f32", "rollout_bf16")
    assert r.schema_version == 1 and r.summary["rows"] == 16 and r.ok
    assert r.verdict.startswith("the mismatch is ") and "kernel numerics (A 0.0%, B " in r.verdict
    for row in r.rows:
        obs = Fraction(row["log_prob_a"]) - Fraction(row["log_prob_b"])
        ka, kb, le = row["kernel_error_a"], row["kernel_error_b"], row["logits_effect"]
        lo = Fraction(ka["lo"]) - Fraction(kb["hi"]) + Fraction(le["lo"])
        hi = Fraction(ka["hi"]) - Fraction(kb["lo"]) + Fraction(le["hi"])
        assert lo <= obs <= hi
        assert row["kl"]["value"] > 0
    assert "logits_effect = exact(A) - exact(B)" in str(r)


def test_a_dump_against_itself_and_b_without_logits():
    same = run("trainer_f32", "trainer_f32", kl=False)
    assert same.summary["bitwise_equal_rows"] == 16 and same.verdict.startswith("no mismatch")
    lp_only = run("trainer_f32", "rollout_bf16_log_probs_only", kl=False)
    assert all(row["kernel_error_b"] is None and row["b_minus_exact_a"] for row in lp_only.rows)
    assert "B has no logits" in lp_only.verdict


def test_bad_input_names_the_side():
    (da, ta), (db, tb) = side("trainer_f32"), side("rollout_bf16")
    tokens = db["tokens"].copy()
    tokens[0, 5] = (tokens[0, 5] + 1) % 32000
    with pytest.raises(logprobe.BadInputError, match=r"tokens differ at \(b, t\) = \(0, 5\)"):
        logprobe.compare(da, {**db, "tokens": tokens}, dtype_a=ta, dtype_b=tb)
    with pytest.raises(logprobe.BadInputError, match="neither `logits` nor `log_probs`"):
        logprobe.compare(da, {"tokens": db["tokens"], "row_mask": db["row_mask"], "format_version": "2"})
    with pytest.raises(TypeError, match="logit"):
        logprobe.compare(da, {"logit": db["logits"]})
