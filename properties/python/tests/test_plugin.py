"""The pytest plugin (``logprobe.pytest_plugin``, the ``pytest11`` entry
point): options, the findings store replayed first, and the failure
messages' replay lines, run in pytester's own folder and interpreter."""

from __future__ import annotations

import pytest

pytest_plugins = ["pytester"]

# A numpy kernel with the planted padded-vocabulary bug when BUG is true
# (kernel_numpy's bug, found within a few cases by seed 1).
TEST_FILE = '''
import sys
sys.path.insert(0, {examples!r})
import kernel_numpy
import logprobe.testing

BUG = {bug!r}

def test_kernel():
    fn = kernel_numpy.make_kernel("padded-vocab-not-truncated" if BUG else "none")
    logprobe.testing.assert_fuzz_clean(fn, budget="60s", shrink_budget="3s", seed=1, dtypes=None,
                                       options="padding=1..8,vocab=1..64", require=(),
                                       tensors="numpy", cases=40)
'''


@pytest.fixture
def examples():
    from conftest import REPO
    return str(REPO / "properties" / "examples" / "exec")


def test_a_finding_is_stored_replayed_first_and_dropped_once_fixed(pytester, examples):
    pytester.makepyfile(test_k=TEST_FILE.format(examples=examples, bug=True))
    r = pytester.runpytest_subprocess("-q")
    r.assert_outcomes(failed=1)
    out = r.stdout.str()
    assert "FOUND oracle agreement" in out and "replay: logprobe.fuzz_replay(" in out, out
    assert "logprobe verify " in out and "rerun:  pytest test_k.py::test_kernel" in out, out
    stored = sorted(pytester.path.glob("fuzz-findings/pytest/*/*/*.safetensors"))
    assert len(stored) == 1 and "seed1" in stored[0].name, stored

    # Next run: the stored finding fails again before any search.
    r = pytester.runpytest_subprocess("-q")
    r.assert_outcomes(failed=1)
    assert "the stored finding" in r.stdout.str() and "FAILS again" in r.stdout.str()

    # Fixed: the replay passes, the finding is dropped, the search is clean.
    pytester.makepyfile(test_k=TEST_FILE.format(examples=examples, bug=False))
    r = pytester.runpytest_subprocess("-q")
    r.assert_outcomes(passed=1)
    assert not list(pytester.path.glob("fuzz-findings/pytest/*/*/*.safetensors"))


def test_the_header_names_the_store_and_the_options_override(pytester, examples):
    pytester.makepyfile(test_k=TEST_FILE.format(examples=examples, bug=True))
    r = pytester.runpytest_subprocess("--logprobe-budget", "2s", "--logprobe-seed", "9",
                                      "--logprobe-findings", "store")
    out = r.stdout.str()
    assert "fuzz budget 2s; seed 9" in out and "store" in out, out
    # The seed given on the command line is the one the search used.
    assert "of seed 9" in out or "(seed 9)" in out, out
    r = pytester.runpytest_subprocess("--logprobe-no-store")
    assert "findings store off" in r.stdout.str()
    r = pytester.runpytest_subprocess("--logprobe-budget", "soon", "-q")
    assert r.ret == pytest.ExitCode.USAGE_ERROR and "logprobe: budget='soon'" in r.stderr.str()


def test_assert_verified_saves_the_tensors_and_prints_the_verify_line(pytester):
    pytester.makepyfile(test_v='''
import numpy as np
import logprobe.testing

def test_wrong_log_probs():
    logits = np.array([[0.0, 1.0, 2.0]], dtype=np.float32)
    logprobe.testing.assert_verified(logits, np.array([2]), log_probs=np.array([-0.5], dtype=np.float32),
                                     temperature=1.0, model="tree")
''')
    r = pytester.runpytest_subprocess("-q")
    r.assert_outcomes(failed=1)
    out = r.stdout.str()
    (dump,) = pytester.path.glob("fuzz-findings/pytest/*/verify/verify.safetensors")
    assert f"replay: logprobe verify {dump}" in out and "--model tree" in out, out
    import logprobe
    assert logprobe.verify_file(dump).verdict == "fail"
