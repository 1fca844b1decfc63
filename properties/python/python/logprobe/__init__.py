"""logprobe: exact verification of log-prob / entropy / top-k kernels and
their gradients over LLM logits, from Python.

``logprobe.verify(logits, tokens, log_probs=..., entropy=..., ...)`` judges
a kernel's outputs against an exact (MPFR) oracle and error bounds derived
for the summation model (``model=``), exactly as ``logprobe verify`` judges a
dump file, without writing one: the keywords are the dump format's tensor
and metadata names (``logprobe.TENSOR_KEYWORDS``, ``logprobe.METADATA_KEYWORDS``).
``logprobe.testing.assert_verified`` is the pytest form.
``logprobe.compare(a, b)`` splits a trainer-vs-rollout log-prob mismatch
into each kernel's error and the logits' effect, as ``logprobe compare``
does for two dumps (docs/compare.md).
``logprobe.fuzz(fn)`` property-tests a kernel function in-process under the
fuzz protocol (docs/fuzz-protocol.md) with the engine of ``logprobe fuzz
--exec``: a shrunk counterexample that ``report.save(path)`` writes as a
dump ``logprobe verify`` replays; ``logprobe.testing.assert_fuzz_clean`` is
its pytest form.

Inputs: torch tensors (CPU, or CUDA copied to the host), numpy arrays, and
any object with ``__dlpack__``. bf16 and f16 are read bit-exactly: torch
bfloat16 / float16, ml_dtypes bfloat16, or a uint16 array with
``dtype="bfloat16"`` (or ``"float16"``). ``logits`` is ``[N, V]`` or
``[B, T, V]``; per-row tensors follow it (``[N]`` or ``[B, T]``). The work
runs in Rust with the GIL released.
"""

from __future__ import annotations

import hashlib
import os
from typing import Any, Dict, List, Optional, Union

from . import _native
from ._compare import CompareReport
from ._fuzz import LINEAR_OUTPUTS, OUTPUTS, FuzzFinding, FuzzReport, fuzz, fuzz_linear, fuzz_replay
from ._inputs import rows_arg, split
from ._report import Element, Output, Report

BadInputError = _native.BadInputError
#: Tensor keywords of ``verify``, in the name table's order.
TENSOR_KEYWORDS = tuple(_native.TENSOR_KEYWORDS)
#: Metadata keywords of ``verify`` (values: str, int, float or bool).
METADATA_KEYWORDS = tuple(_native.METADATA_KEYWORDS)
#: The statistical threshold's calibrated constant ``c`` (SUSPECT tier).
DEFAULT_STATISTICAL_C = _native.DEFAULT_STATISTICAL_C
__version__ = _native.__version__

__all__ = [
    "verify",
    "verify_file",
    "verify_files",
    "save_weights",
    "generate_weights",
    "save_dump",
    "compare",
    "CompareReport",
    "fuzz",
    "fuzz_linear",
    "fuzz_replay",
    "FuzzReport",
    "FuzzFinding",
    "OUTPUTS",
    "LINEAR_OUTPUTS",
    "Report",
    "Output",
    "Element",
    "BadInputError",
    "TENSOR_KEYWORDS",
    "METADATA_KEYWORDS",
    "DEFAULT_STATISTICAL_C",
]

_DEFAULT: Any = object()


def verify(
    logits: Any = None,
    tokens: Any = None,
    *,
    model: str = "lanes=8",
    rows: Union[None, str, range] = None,
    strict: bool = False,
    dtype: Union[None, str, Dict[str, str]] = None,
    accumulation: Optional[str] = None,
    form: str = "any",
    k3_form: str = "any",
    worst: int = 3,
    statistical_c: Optional[float] = _DEFAULT,
    name: str = "<tensors>",
    **names: Any,
) -> Report:
    """Judges a kernel's outputs exactly; see the module docstring and
    ``logprobe/__init__.pyi`` for every keyword.

    Raises ``BadInputError`` (a ``ValueError``) for input that cannot be
    verified, naming tensor, row and column; ``TypeError`` for an unknown
    keyword (with the closest name) or a value of the wrong kind.

    CPU tensors and C-contiguous numpy arrays are read in place (DLPack; no
    copy: verifying a [4096, 152064] batch adds a few MiB per thread, not the
    batch's size); CUDA tensors are copied once to the host, strided or
    big-endian arrays once into row-major little-endian order. Nothing is
    written to disk. The exact oracle is far slower than a kernel (its cost grows
    with N x V): for large tensors pass ``rows="sample:K"``. Ctrl-C takes effect when the call
    returns (the GIL is released while Rust works).
    """
    named: Dict[str, Any] = {"logits": logits, "tokens": tokens}
    named.update(names)
    tensors, metadata = split("verify", named, dtype)
    if not isinstance(worst, int) or isinstance(worst, bool) or worst < 0:
        raise TypeError(f"verify(): worst={worst!r}: expected an int >= 0")
    c = DEFAULT_STATISTICAL_C if statistical_c is _DEFAULT else statistical_c
    report_json, table = _native.verify(
        tensors,
        metadata,
        name=name,
        model=model,
        accumulation=accumulation,
        rows=rows_arg(rows),
        worst=worst,
        statistical_c=None if c is None else float(c),
        form=form,
        k3_form=k3_form,
    )
    return Report(report_json, table, strict=strict)


def verify_file(
    path: Any,
    *,
    model: str = "lanes=8",
    rows: Union[None, str, range] = None,
    strict: bool = False,
    accumulation: Optional[str] = None,
    form: str = "any",
    k3_form: str = "any",
    worst: int = 3,
    statistical_c: Optional[float] = _DEFAULT,
) -> Report:
    """Judges a dump file (``.safetensors``) as ``logprobe verify FILE`` does
    (the same library call). Raises ``BadInputError`` for bad input."""
    c = DEFAULT_STATISTICAL_C if statistical_c is _DEFAULT else statistical_c
    report_json, table = _native.verify_file(
        str(path),
        model=model,
        accumulation=accumulation,
        rows=rows_arg(rows),
        worst=worst,
        statistical_c=None if c is None else float(c),
        form=form,
        k3_form=k3_form,
    )
    return Report(report_json, table, strict=strict)


def verify_files(
    paths: Any,
    *,
    model: str = "lanes=8",
    rows: Union[None, str, range] = None,
    strict: bool = False,
    accumulation: Optional[str] = None,
    form: str = "any",
    k3_form: str = "any",
    worst: int = 3,
    statistical_c: Optional[float] = _DEFAULT,
) -> List[Report]:
    """Judges dump files as ``logprobe verify FILE...`` does (the same
    library call): one ``Report`` per file, except that the files of one
    tensor-parallel set (metadata ``tp_rank``, ``tp_size``,
    ``tp_vocab_start``; docs/dump-from-pytorch.md) are judged as the one
    dump they split, in one report (one per distinct copy of the set's
    all-reduced outputs). Raises ``BadInputError`` for the first bad file
    or set."""
    c = DEFAULT_STATISTICAL_C if statistical_c is _DEFAULT else statistical_c
    out = _native.verify_files(
        [str(p) for p in paths],
        model=model,
        accumulation=accumulation,
        rows=rows_arg(rows),
        worst=worst,
        statistical_c=None if c is None else float(c),
        form=form,
        k3_form=k3_form,
    )
    return [Report(j, t, strict=strict) for j, t in out]


def save_dump(
    path: Any,
    logits: Any,
    tokens: Any = None,
    *,
    dtype: Union[None, str, Dict[str, str]] = None,
    **names: Any,
) -> str:
    """Writes the tensors and metadata ``verify`` takes (the same keywords)
    as a dump file (safetensors, docs/dump-from-pytorch.md) at ``path``:
    ``logprobe verify PATH`` and ``logprobe.verify_file(PATH)`` judge it as
    ``verify`` judges the tensors. Returns the path. Raises ``BadInputError``
    for a tensor that cannot be read or a name given twice, ``TypeError``
    for an unknown keyword."""
    named: Dict[str, Any] = {"logits": logits, "tokens": tokens}
    named.update(names)
    tensors, metadata = split("save_dump", named, dtype)
    data = _native.dump_bytes(tensors, metadata)
    path = os.fspath(path)
    with open(path, "wb") as f:
        f.write(data)
    return path


def save_weights(
    path: Any,
    lm_head_weight: Any,
    lm_head_bias: Any = None,
    *,
    dtype: Union[None, str, Dict[str, str]] = None,
) -> Dict[str, str]:
    """Writes the LM head (``lm_head_weight [V, H]``, optionally
    ``lm_head_bias [V]``) as a weights file that fused linear + loss dumps
    name instead of carrying it (docs/dump-from-pytorch.md, "A shared
    weights file"). Returns the two metadata keys to give those dumps:
    ``{"lm_head_weight_file": path, "lm_head_weight_sha256": hex}`` (a
    relative path is read from the dump's folder). Raises
    ``BadInputError`` for a tensor that cannot be read."""
    named = {"lm_head_weight": lm_head_weight, "lm_head_bias": lm_head_bias}
    tensors, metadata = split("save_weights", named, dtype)
    data = _native.dump_bytes(tensors, metadata)
    path = os.fspath(path)
    with open(path, "wb") as f:
        f.write(data)
    return {"lm_head_weight_file": path, "lm_head_weight_sha256": hashlib.sha256(data).hexdigest()}


_GENERATORS = {"normal": "splitmix64-normal-v1", "uniform": "splitmix64-uniform-v1"}
_GENERATED_DTYPES = {"bfloat16": "bf16", "bf16": "bf16", "float16": "f16", "f16": "f16",
                     "half": "f16", "float32": "f32", "f32": "f32", "float": "f32"}


def generate_weights(
    shape: Any,
    *,
    seed: int,
    scale: float,
    distribution: str = "normal",
    dtype: str = "bfloat16",
    tensors: str = "torch",
) -> Any:
    """Generates an LM head ``lm_head_weight [V, H]`` from a seed, the same
    bytes on every machine (docs/dump-from-pytorch.md, "Generated
    weights"), so that a fused linear + loss dump names it in five metadata
    keys instead of carrying it (1.25 GB at 152064 x 4096 bf16).

    ``distribution`` is ``"normal"`` (standard deviation ``scale``) or
    ``"uniform"`` (on ``[-scale, scale)``); ``dtype`` is ``"bfloat16"``,
    ``"float16"`` or ``"float32"``. Returns ``(lm_head_weight, metadata)``:
    a torch tensor (``tensors="numpy"``: a numpy array; bfloat16 as
    ml_dtypes.bfloat16 when installed, else its uint16 bits) and the
    metadata dict to give the dump (``lm_head_weight_generator``,
    ``_seed``, ``_scale``, ``_shape``, ``_dtype`` and ``_sha256``). Raises
    ``ValueError`` for a bad argument or a shape larger than memory."""
    if distribution not in _GENERATORS:
        raise ValueError(f"generate_weights(): distribution={distribution!r}: expected \"normal\" or \"uniform\"")
    dt = _GENERATED_DTYPES.get(str(dtype).replace("torch.", ""))
    if dt is None:
        raise ValueError(f"generate_weights(): dtype={dtype!r}: expected \"bfloat16\", \"float16\" or \"float32\"")
    if tensors not in ("torch", "numpy"):
        raise ValueError(f"generate_weights(): tensors={tensors!r}: expected \"torch\" or \"numpy\"")
    try:
        v, h = (int(d) for d in shape)
    except (TypeError, ValueError):
        raise ValueError(f"generate_weights(): shape={shape!r}: expected (V, H)") from None
    if v < 0 or h < 0 or not isinstance(seed, int) or not 0 <= seed < 2**64:
        raise ValueError(f"generate_weights(): shape {shape!r} and seed {seed!r}: expected sizes >= 0 and a seed in [0, 2^64)")
    data, metadata = _native.generate_weights(_GENERATORS[distribution], seed, float(scale), v, h, dt)
    if tensors == "torch":
        import torch

        tdt = {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32}[dt]
        weight = torch.frombuffer(data, dtype=tdt).reshape(v, h) if len(data) else torch.empty((v, h), dtype=tdt)
    else:
        import numpy as np

        ndt = {"bf16": np.uint16, "f16": np.float16, "f32": np.float32}[dt]
        weight = np.frombuffer(data, dtype=np.dtype(ndt).newbyteorder("<")).reshape(v, h)
        if dt == "bf16":
            try:
                import ml_dtypes

                weight = weight.view(ml_dtypes.bfloat16)
            except ImportError:
                pass
    return weight, dict(metadata)


def compare(
    a: Dict[str, Any],
    b: Dict[str, Any],
    *,
    clip: float = 0.2,
    kl: bool = True,
    model: str = "lanes=8",
    accumulation: Optional[str] = None,
    rows: Union[None, str, range] = None,
    worst: int = 5,
    dtype_a: Union[None, str, Dict[str, str]] = None,
    dtype_b: Union[None, str, Dict[str, str]] = None,
    name_a: str = "<A>",
    name_b: str = "<B>",
) -> CompareReport:
    """Where the log-prob mismatch between A (the trainer) and B (the
    rollout engine) comes from, as ``logprobe compare A B`` reports it for
    two dumps (docs/compare.md). ``a`` and ``b`` map the dump format's names
    to tensors and metadata values, as ``verify``'s keywords do: the same
    ``tokens`` (and ``row_mask``) on both sides, each its own ``logits`` and
    ``log_probs`` (optionally ``entropy``); B may hold only ``tokens``,
    ``log_probs`` and ``row_mask``. ``dtype_a`` / ``dtype_b``: as
    ``verify``'s ``dtype=`` for each side.

    Raises ``BadInputError`` naming the side, tensor and row (mismatched
    tokens, row counts or row_mask; a B with neither logits nor log_probs;
    every error ``verify`` gives); ``TypeError`` for an unknown name.
    """
    if not isinstance(a, dict) or not isinstance(b, dict):
        raise TypeError("compare(a, b): each side is a dict of names to tensors / metadata values")
    if not isinstance(worst, int) or isinstance(worst, bool) or worst < 0:
        raise TypeError(f"compare(): worst={worst!r}: expected an int >= 0")
    ta, ma = split("compare", dict(a), dtype_a)
    tb, mb = split("compare", dict(b), dtype_b)
    report_json, table = _native.compare(
        ta,
        ma,
        tb,
        mb,
        name_a=name_a,
        name_b=name_b,
        model=model,
        clip=float(clip),
        kl=bool(kl),
        accumulation=accumulation,
        rows=rows_arg(rows),
        worst=worst,
    )
    return CompareReport(report_json, table)
