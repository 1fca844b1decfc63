"""Shared helpers of the pytest suite: a numpy reference kernel (exact in
f64, rounded once), planted bugs, and a minimal safetensors reader for the
shipped dumps (so the suite needs neither torch nor safetensors)."""

from __future__ import annotations

import json
import os
import struct
from pathlib import Path

import numpy as np
import pytest

if os.environ.get("LOGPROBE_REQUIRE_TORCH") == "1":
    # CI installs torch (scripts/install-torch.sh): the torch tests and the
    # docs' torch examples must run, not skip.
    import torch  # noqa: F401

REPO = Path(__file__).resolve().parents[3]
TORCH_DUMPS = REPO / "fixtures" / "torch"


def log_softmax64(x: np.ndarray) -> np.ndarray:
    """log_softmax over the last axis in f64 (inputs widened exactly)."""
    x = x.astype(np.float64)
    m = x.max(axis=-1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(axis=-1, keepdims=True))


def reference(logits: np.ndarray, tokens: np.ndarray, out_dtype=np.float32):
    """A correct kernel: f64 math, each output rounded once to ``out_dtype``
    (bf16 outputs: f64 -> f32 -> bf16, as an f32 kernel does)."""
    lp = log_softmax64(logits)
    log_probs = np.take_along_axis(lp, tokens[..., None], axis=-1)[..., 0]
    p = np.exp(lp)
    with np.errstate(invalid="ignore"):  # p = 0 where lp = -inf: no term
        entropy = -(np.where(p > 0, p * lp, 0.0)).sum(axis=-1)
    cast = lambda a: a.astype(np.float32).astype(out_dtype)  # noqa: E731
    return cast(log_probs), cast(entropy)


@pytest.fixture
def rng():
    return np.random.default_rng(1234)


def read_safetensors(path: Path):
    """(tensors, metadata) of a safetensors file as numpy arrays; BF16 as its
    uint16 bits (with the names in ``bf16``)."""
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8 : 8 + n])
    meta = header.pop("__metadata__", {}) or {}
    data = raw[8 + n :]
    kinds = {
        "F64": "<f8", "F32": "<f4", "F16": "<f2", "BF16": "<u2", "I64": "<i8", "I32": "<i4",
        "I16": "<i2", "I8": "i1", "U64": "<u8", "U32": "<u4", "U16": "<u2", "U8": "u1", "BOOL": "?",
    }
    tensors, bf16 = {}, set()
    for name, info in header.items():
        a, b = info["data_offsets"]
        arr = np.frombuffer(data[a:b], dtype=kinds[info["dtype"]]).reshape(info["shape"])
        tensors[name] = arr
        if info["dtype"] == "BF16":
            bf16.add(name)
    return tensors, meta, bf16


def figures(report) -> str:
    """A report (or its dict) without wall time and file identity, as
    canonical JSON: equal strings mean equal verdicts and figures (NaN too)."""
    d = report if isinstance(report, dict) else report.to_dict()
    keep = {k: v for k, v in d.items() if k not in ("seconds", "path", "name", "ok", "unchecked")}
    return json.dumps(keep, sort_keys=True)
