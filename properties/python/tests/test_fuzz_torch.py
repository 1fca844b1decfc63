"""logprobe.fuzz on the PyTorch example kernel (properties/examples/exec/
kernel_torch.py), in-process with torch tensors in and out (bf16 logits as
torch.bfloat16); skipped without torch. The correct kernel agrees with the
oracle and is padding-invariant; each planted bug is found and shrunk."""

from __future__ import annotations

import sys

import pytest

torch = pytest.importorskip("torch")

import logprobe  # noqa: E402
import logprobe.testing  # noqa: E402
from conftest import REPO  # noqa: E402
from test_fuzz import BUGS  # noqa: E402

sys.path.insert(0, str(REPO / "properties" / "examples" / "exec"))
import kernel_torch  # noqa: E402


def torch_kernel(bug="none"):
    """kernel_torch.run: torch tensors in, torch tensors out."""
    def kernel(inputs, meta):
        return kernel_torch.run(inputs, meta, bug)
    return kernel


def test_requests_arrive_as_torch_tensors_of_their_dtype():
    seen = []

    def spy(inputs, meta):
        seen.append((meta["logits_dtype"], inputs["logits"].dtype, type(inputs["logits"])))
        # Answers in bf16 too: judged in their own dtype (bits kept exactly).
        return {k: v.to(torch.bfloat16) for k, v in torch_kernel()(inputs, meta).items()}

    r = logprobe.fuzz(spy, cases=6, seed=4, vocab="1..32", dtypes="bfloat16", tensors="torch")
    assert r.ok and seen, r
    assert all(d == "bf16" and t == torch.bfloat16 and c is torch.Tensor for d, t, c in seen)


def test_the_correct_torch_kernel_agrees_and_is_padding_invariant():
    r = logprobe.testing.assert_fuzz_clean(torch_kernel(), cases=12, seed=1, vocab="1..64",
                                           dtypes=None, tensors="torch")
    assert r.checked > 0
    held = {h["property"]: h for h in r.held}
    assert held["padding-invariant"]["cases"] > 0 and not held["padding-invariant"]["lacked"]


@pytest.mark.parametrize("bug,require,options,prop", BUGS, ids=[b[0] for b in BUGS])
def test_each_planted_bug_is_found_in_the_torch_kernel(tmp_path, bug, require, options, prop):
    r = logprobe.fuzz(torch_kernel(bug), budget="60s", shrink_budget="3s", seed=1, dtypes=None,
                      options=options, require=require, tensors="torch")
    assert r.finding is not None and r.finding.property == prop, r
    (path, *_) = r.save(tmp_path / "finding.safetensors")
    if prop == "oracle agreement":
        assert logprobe.verify_file(path).verdict == "fail"
    assert logprobe.fuzz_replay(torch_kernel(bug), path, tensors="torch") is not None
