"""On the shipped PyTorch dumps (fixtures/torch), the package's verdicts and
figures equal the CLI's: tensors read from each file and passed to
logprobe.verify give the report that the file gives to the library call of
`logprobe verify` and, where the binary is found, to the binary itself
(`--json`); verdicts match fixtures/torch/expected.json."""

from __future__ import annotations

import functools
import json
import os
import subprocess
from pathlib import Path

import pytest

import logprobe
from conftest import REPO, TORCH_DUMPS, figures, read_safetensors

ALL = sorted(TORCH_DUMPS.glob("*.safetensors"))
# One rank's dump of a tensor-parallel set is judged with its set.
RANKS = [p for p in ALL if "tp_rank" in read_safetensors(p)[1]]
DUMPS = [p for p in ALL if p not in RANKS]
EXPECTED = json.loads((TORCH_DUMPS / "expected.json").read_text())


@functools.lru_cache(maxsize=None)
def in_memory(path: Path) -> logprobe.Report:
    """The dump's tensors read into numpy (BF16 as uint16 bits: the
    `dtype=` path) and verified in memory."""
    tensors, meta, bf16 = read_safetensors(path)
    return logprobe.verify(**tensors, **meta, dtype={n: "bfloat16" for n in bf16}, name=str(path))


def cli_binary():
    """`LOGPROBE_CLI`, else target/release/logprobe of the repository."""
    p = os.environ.get("LOGPROBE_CLI") or str(REPO / "target" / "release" / "logprobe")
    return Path(p) if Path(p).is_file() else None


def test_every_shipped_dump_is_listed():
    sets = {p.stem for p in RANKS if p.stem.endswith("_rank0")}
    assert len(DUMPS) >= 9 and len(sets) >= 3
    assert {p.stem for p in DUMPS} | sets == set(EXPECTED)


def test_tensor_parallel_sets_are_judged_as_one_dump():
    """`verify_files` judges each set's rank dumps as the one dump they
    split, as `logprobe verify` does; one rank's file alone is refused."""
    reports = logprobe.verify_files(RANKS)
    assert len(reports) == len(RANKS) // 4
    for r in reports:
        d = r.to_dict()
        assert len(d["tp_set"]["files"]) == 4 and d["tp_set"]["ranks"] == [0, 1, 2, 3]
        assert r.verdict == EXPECTED[Path(d["path"]).stem]["expect"], d["path"]
    with pytest.raises(logprobe.BadInputError, match="rank 1 of a tensor-parallel set of 4"):
        logprobe.verify_file(TORCH_DUMPS / "megatron_tp_ce_rank1.safetensors")
    exe = cli_binary()
    if exe is not None:
        out = subprocess.run([str(exe), "verify", "--json", "--no-progress", *map(str, RANKS)],
                             capture_output=True, text=True)
        cli = json.loads(out.stdout)["files"]
        assert [figures(logprobe._report._floats(f)) for f in cli] == [figures(r) for r in reports]


@pytest.mark.parametrize("path", DUMPS, ids=lambda p: p.stem)
def test_in_memory_equals_the_file(path):
    mem = in_memory(path)
    file = logprobe.verify_file(path)
    assert figures(mem) == figures(file)
    # The table below its first line (which names the file and the time).
    assert str(mem).split("\n", 1)[1] == str(file).split("\n", 1)[1]
    assert mem.verdict == EXPECTED[path.stem]["expect"]


def test_the_cli_binary_agrees():
    exe = cli_binary()
    if exe is None:
        if os.environ.get("LOGPROBE_CLI"):
            pytest.fail(f"LOGPROBE_CLI={os.environ['LOGPROBE_CLI']} is not a file")
        pytest.skip("no logprobe binary (set LOGPROBE_CLI or build target/release/logprobe)")
    out = subprocess.run([str(exe), "verify", "--json", "--no-progress", *map(str, DUMPS)],
                         capture_output=True, text=True)
    assert out.returncode in (0, 1), out.stderr
    cli = {Path(f["path"]).stem: f for f in json.loads(out.stdout)["files"]}
    for path in DUMPS:
        mem = in_memory(path)
        want = logprobe._report._floats(cli[path.stem])
        assert figures(mem) == figures(want), path.stem


def test_suspect_outputs_name_their_rules():
    """Report schema 2: each output names the rules that find it SUSPECT,
    and the relative rule's figure where it covers the output."""
    r = logprobe.verify_file(TORCH_DUMPS / "bf16_log_softmax_zero.safetensors")
    lp = r.outputs["log_probs"]
    assert lp.verdict == "suspect" and lp.suspect_rules == ["statistical", "relative"]
    assert lp.relative_fires and lp.relative_ratio > 4
    assert 0 < lp.relative_careful_max_abs_error < lp.max_abs_error
    ok = logprobe.verify_file(TORCH_DUMPS / "qwen_vocab_bf16_fp32_math.safetensors")
    for o in ok.outputs.values():
        assert o.suspect_rules == [] and not o.relative_fires and o.relative_ratio < 4
    # A reduced loss has the relative rule too (TOLERANCE.md (R5)): a mean
    # of per-token losses rounded to bf16 is far from careful code's.
    loss = logprobe.verify_file(TORCH_DUMPS / "loss_mean_bf16_terms.safetensors")
    o = loss.outputs["loss"]
    assert o.suspect_rules == ["statistical", "relative"]
    assert o.relative_fires and o.relative_ratio > 100
