"""Every ```python example of the README, the package's README and docs/
runs as written (issue 46): a document's blocks run in order as one program
(later blocks use what earlier ones made), under pytest when they define
``test_*`` functions, in a fresh interpreter and an empty folder. Every dump
an example writes is then judged by ``logprobe.verify_file``, with the
verdict this table expects: a new example that writes a dump adds it here.

Examples that import torch are skipped without it, unless
``LOGPROBE_REQUIRE_TORCH=1`` (CI installs torch and sets it)."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import logprobe
from conftest import REPO

DOCS = sorted([REPO / "README.md", REPO / "properties" / "python" / "README.md",
               *(REPO / "docs").glob("*.md")])

# document -> {dump the example writes: the verdict it must get}
DUMPS = {
    "docs/verify.md": {"my_kernel.safetensors": "pass"},
    "docs/dump-from-pytorch.md": {
        "my_kernel.safetensors": "pass",
        "kl.safetensors": "pass",
        "ce.safetensors": "pass",
        "ce_grad.safetensors": "pass",
        "kl_grad.safetensors": "pass",
        "dump.safetensors": "pass",
        "ranks.safetensors": "pass",
        "soft_ce.safetensors": "pass",
        "soft_ce_grad.safetensors": "pass",
        "soft_ce_topk.safetensors": "pass",
        "fused.safetensors": "pass",
        "fused_grad.safetensors": "pass",
        # The LM head in a file of its own, and a dump naming it.
        "lm_head.safetensors": "weights",
        "fused_shared.safetensors": "pass",
        # The LM head generated from a seed.
        "fused_generated.safetensors": "pass",
        # A tensor-parallel set: judged as one dump, under rank 0's file.
        "tp_ce_rank0.safetensors": "pass",
        "tp_ce_rank1.safetensors": "in rank 0's set",
    },
    # The example's kernel keeps the padded columns on purpose.
    "docs/fuzz-protocol.md": {"finding.safetensors": "fail"},
}


def blocks(doc: Path) -> list:
    return re.findall(r"^```python\n(.*?)^```", doc.read_text(), flags=re.S | re.M)


EXAMPLES = [d for d in DOCS if blocks(d)]


def test_the_examples_are_found():
    names = {str(d.relative_to(REPO)) for d in EXAMPLES}
    assert {"docs/python.md", "properties/python/README.md", "docs/dump-from-pytorch.md"} <= names, names
    assert set(DUMPS) <= names


@pytest.mark.parametrize("doc", EXAMPLES, ids=[str(d.relative_to(REPO)) for d in EXAMPLES])
def test_the_example_runs_as_written(doc, tmp_path):
    code = "\n\n".join(blocks(doc))
    if re.search(r"^\s*(import|from) torch\b", code, flags=re.M) and importlib.util.find_spec("torch") is None:
        if os.environ.get("LOGPROBE_REQUIRE_TORCH") == "1":
            pytest.fail("torch is required (LOGPROBE_REQUIRE_TORCH=1) and does not import")
        pytest.skip("the example needs torch")
    if "def test_" in code:
        (tmp_path / "test_example.py").write_text(code)
        cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--logprobe-no-store",
               "test_example.py"]
    else:
        (tmp_path / "example.py").write_text(code)
        cmd = [sys.executable, "example.py"]
    run = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, f"{doc}:\n{run.stdout[-4000:]}\n{run.stderr[-4000:]}"
    written = {p.name for p in tmp_path.glob("*.safetensors")}
    expected = DUMPS.get(str(doc.relative_to(REPO)), {})
    assert written == set(expected), f"{doc}: wrote {sorted(written)}, the table lists {sorted(expected)}"
    # As `logprobe verify *.safetensors` judges them: a tensor-parallel
    # set's files as one dump, reported under rank 0's file.
    dumps = sorted(tmp_path / n for n, v in expected.items() if v != "weights")
    reports = {Path(r.to_dict()["path"]).name: r for r in logprobe.verify_files(dumps)}
    for name, verdict in expected.items():
        if verdict in ("in rank 0's set", "weights"):
            assert name not in reports, f"{doc}: {name}"
            continue
        r = reports[name]
        assert r.verdict == verdict, f"{doc}: {name}\n{r}"
