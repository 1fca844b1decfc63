"""logprobe.fuzz(fn): the engine of `logprobe fuzz --exec`, in-process.

The numpy twin of the example kernel (properties/examples/exec/kernel_numpy.py)
passes in its correct mode and each planted bug is found, shrunk and saved
as a dump that `logprobe.verify_file` (the library call of `logprobe
verify`) and `logprobe.fuzz_replay` reproduce. An exception inside fn, an
answer that is not a dict, a missing output are findings of kind `command`;
Ctrl-C stops the search. Budgets are small: seed 1 finds each bug within a
few cases (no timing is asserted).
"""

from __future__ import annotations

import sys

import numpy as np
import pytest

import logprobe
import logprobe.testing
from conftest import REPO

sys.path.insert(0, str(REPO / "properties" / "examples" / "exec"))
import kernel_numpy  # noqa: E402

ALL = ("padding-invariant", "chunk-invariant", "batch-invariant")

# (bug, require, options, the property found): the cases of
# properties/tests/fuzz_exec.rs, on the same engine.
BUGS = [
    ("entropy-no-max-shift", (), "entropy=unmasked,offset=1e3|-1e4,vocab=1..64", "oracle agreement"),
    ("padded-vocab-not-truncated", (), "padding=1..8,vocab=1..64", "oracle agreement"),
    ("dropped-chunk-remainder", (), "rows=3..8,chunk=2,vocab=1..64", "oracle agreement"),
    ("batch-dependent", ("batch-invariant",), "rows=2..6,vocab=200..400", "batch invariance"),
]


def numpy_kernel(bug="none"):
    return kernel_numpy.make_kernel(bug)


def test_the_correct_numpy_kernel_is_clean_with_every_invariance_required():
    r = logprobe.testing.assert_fuzz_clean(
        numpy_kernel(), cases=20, seed=1, vocab="1..64", dtypes=None, require=ALL, tensors="numpy"
    )
    assert r.ok and r.finding is None and r.cases == 20
    assert r.checked > 0 and r.worst < 1.0
    held = {h["property"]: h for h in r.held}
    for inv in ALL:
        assert held[inv]["required"] and held[inv]["cases"] > 0 and not held[inv]["lacked"], r
    assert "has (required)" in str(r) and "clean" in r.summary()


@pytest.mark.parametrize("bug,require,options,prop", BUGS, ids=[b[0] for b in BUGS])
def test_each_planted_bug_is_found_shrunk_and_replayed(tmp_path, bug, require, options, prop):
    r = logprobe.fuzz(numpy_kernel(bug), budget="60s", shrink_budget="3s", seed=1, dtypes=None,
                      options=options, require=require, tensors="numpy")
    assert not r.ok, r
    f = r.finding
    assert f.property == prop, r
    assert f"FOUND in-process: {prop}" in str(r)
    assert f.recipe.startswith("seed=") and f.shrink_steps >= 0
    paths = r.save(tmp_path / "finding.safetensors")
    assert paths[0] == str(tmp_path / "finding.safetensors")
    v = logprobe.verify_file(paths[0])
    if prop == "oracle agreement":
        # The saved dump is the case joined with the answer: verify says FAIL.
        assert v.verdict == "fail" and f.verify == "FAIL", (v, f.verify)
    else:
        # Each file of an invariance passes on its own; together they differ.
        assert len(paths) == 2 and v.verdict == "pass", v
    again = logprobe.fuzz_replay(numpy_kernel(bug), paths[0], tensors="numpy")
    assert again is not None and again.property == prop and again.recipe == f.recipe
    assert logprobe.fuzz_replay(numpy_kernel(), paths[0], tensors="numpy") is None
    # The shrunk case pinned as options reproduces the finding on case 0.
    r2 = logprobe.fuzz(numpy_kernel(bug), cases=1, shrink_budget="0s", seed=1, options=f.recipe,
                       dtypes=None, vocab=None, require=require, tensors="numpy")
    assert r2.finding is not None and r2.finding.property == prop and r2.finding.case_index == 0


def test_a_lack_not_required_is_reported_not_a_finding():
    r = logprobe.fuzz(numpy_kernel("batch-dependent"), cases=12, seed=1, dtypes=None,
                      options="rows=2..6,vocab=200..400", tensors="numpy")
    assert r.ok, r
    assert [l.property for l in r.lacks] == ["batch-invariant"]
    assert r.lacks[0].files and all(name in r.files for name in r.lacks[0].files)
    assert "lacks (case" in str(r)


def test_an_exception_in_fn_is_a_command_finding_with_its_traceback(tmp_path):
    def broken_kernel(inputs, meta):
        out = numpy_kernel()(inputs, meta)
        if inputs["logits"].shape[1] >= 5:
            raise ZeroDivisionError("planted")
        return out

    r = logprobe.fuzz(broken_kernel, cases=30, seed=1, vocab="1..16", shrink_budget="5s", tensors="numpy")
    f = r.finding
    assert f is not None and f.property == "command", r
    assert "broken_kernel raised ZeroDivisionError: planted" in f.detail
    assert "traceback:" in f.detail and 'raise ZeroDivisionError("planted")' in f.detail
    assert "test_fuzz.py" in f.detail
    # Shrunk through fn to the narrowest logits that raise: V_total = 5.
    knobs = dict(kv.split("=", 1) for kv in f.recipe.split(","))
    assert int(knobs["vocab"]) + int(knobs["padding"]) == 5, f.recipe
    assert f.shrink_steps > 0
    (path,) = r.save(tmp_path / "command.safetensors")
    assert (tmp_path / "command.safetensors").stat().st_size > 0
    with pytest.raises(logprobe.testing.FuzzFailure) as e:
        logprobe.testing.assert_fuzz_clean(broken_kernel, cases=30, seed=1, vocab="1..16",
                                           shrink_budget="0s", tensors="numpy", save_to=tmp_path / "out")
    assert isinstance(e.value, AssertionError) and e.value.report.finding.property == "command"
    assert "saved: " in str(e.value) and (tmp_path / "out").is_dir()


@pytest.mark.parametrize(
    "answer,message",
    [
        (lambda i, m: [1, 2], "returned list, not a dict"),
        (lambda i, m: {"log_probs": np.zeros(i["logits"].shape[0], np.float32)}, "is missing"),
        (lambda i, m: {o: np.zeros((1, 1, 1)) for o in m["outputs"].split(",")}, "has shape"),
        (lambda i, m: {o: np.zeros(1, np.complex64) for o in m["outputs"].split(",")}, "cannot"),
    ],
    ids=["not-a-dict", "missing-output", "wrong-shape", "complex-dtype"],
)
def test_a_malformed_answer_is_a_command_finding(answer, message):
    r = logprobe.fuzz(answer, cases=10, seed=2, vocab="1..16", shrink_budget="0s", tensors="numpy")
    assert r.finding is not None and r.finding.property == "command", r
    assert message in r.finding.detail, r.finding.detail


def test_keyboard_interrupt_stops_the_search():
    calls = []

    def interrupted(inputs, meta):
        calls.append(1)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return numpy_kernel()(inputs, meta)

    with pytest.raises(KeyboardInterrupt):
        logprobe.fuzz(interrupted, cases=50, seed=1, vocab="1..16", tensors="numpy")
    assert len(calls) == 3


def test_requests_follow_outputs_dtypes_and_tensors():
    seen = []

    def spy(inputs, meta):
        seen.append((meta["outputs"], meta["logits_dtype"], inputs["logits"].dtype,
                     sorted(inputs)))
        return numpy_kernel()(inputs, meta)

    r = logprobe.fuzz(spy, cases=15, seed=3, vocab=range(1, 33), dtypes="bfloat16",
                      outputs=("log_probs",), tensors="numpy")
    assert r.ok and seen, r
    for outputs, ldt, npdt, names in seen:
        assert outputs == "log_probs" and ldt == "bf16" and npdt == np.float32
        assert "topk_ids" not in names and "grad_log_probs" not in names


def test_bad_arguments_raise_before_any_call():
    never = lambda i, m: pytest.fail("called")  # noqa: E731
    for kw, err in [
        (dict(options="colour=red"), ValueError),
        (dict(options="bad=nan-logit"), ValueError),
        (dict(require="fast"), ValueError),
        (dict(outputs=("grad_logits",)), ValueError),
        (dict(outputs=("loss",)), ValueError),  # not in protocol v1 yet (lse is)
        (dict(outputs=("log_probs",), options="topk=3"), ValueError),
        (dict(budget="soon"), ValueError),
        (dict(dtypes=("int8",)), ValueError),
        (dict(tensors="jax"), ValueError),
        (dict(cases=-1), TypeError),
    ]:
        with pytest.raises(err):
            logprobe.fuzz(never, **kw)
    with pytest.raises(TypeError):
        logprobe.fuzz(42)
    with pytest.raises(ValueError):
        logprobe.FuzzReport('{"kernel":"k","seed":0,"cases":0,"checked":0,"suspect":0,'
                            '"bad_input_not_sent":0,"nothing_to_check":0,"seconds":0,"worst":0,'
                            '"calls":0,"shrink_calls":0,"held":[],"lacks":[],"finding":null}',
                            "", []).save("x.safetensors")


def test_bf16_answers_of_ml_dtypes_are_read_bit_exactly_and_pass():
    ml_dtypes = pytest.importorskip("ml_dtypes")

    def bf16_kernel(inputs, meta):
        return {k: v.astype(ml_dtypes.bfloat16) for k, v in numpy_kernel()(inputs, meta).items()}

    r = logprobe.testing.assert_fuzz_clean(bf16_kernel, cases=8, seed=5, vocab="1..64",
                                           dtypes="bfloat16", tensors="numpy")
    assert r.checked > 0
