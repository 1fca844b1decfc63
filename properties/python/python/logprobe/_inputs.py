"""Turns Python inputs into what ``logprobe._native`` reads.

Tensors become DLPack producers on the CPU (torch tensors are detached and
copied to the host; numpy arrays are passed as they are, ml_dtypes bfloat16
as its uint16 bits); metadata values become the strings a dump's
``__metadata__`` holds. Nothing here converts a float: bf16 / f16 bits reach
Rust unchanged.
"""

from __future__ import annotations

import math
import sys
from typing import Any, Dict, List, Optional, Tuple, Union

from . import _native

#: Tensors that hold ids or flags; every other tensor of the format holds floats.
ID_OR_FLAG_TENSORS = frozenset({"tokens", "topk_ids", "sampling_mask", "row_mask"})

_DTYPE16 = {"bfloat16": "bfloat16", "bf16": "bfloat16", "float16": "float16", "f16": "float16", "half": "float16"}


def _is_torch(x: Any) -> bool:
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(x, torch.Tensor)


def _numpy():
    return sys.modules.get("numpy")


def _dtype16(name: str, value: str) -> str:
    try:
        return _DTYPE16[value]
    except (KeyError, TypeError):
        raise ValueError(
            f"dtype for `{name}` = {value!r}: expected \"bfloat16\" or \"float16\" "
            "(the dtype whose bits a uint16 array holds)"
        ) from None


def producer(name: str, value: Any) -> Tuple[Any, Optional[str]]:
    """A DLPack producer on the CPU for tensor ``name``, and the 16-bit float
    dtype its uint16 bits stand for (ml_dtypes bfloat16), if any."""
    if _is_torch(value):
        t = value.detach()
        if t.layout is not sys.modules["torch"].strided:
            raise TypeError(f"tensor `{name}` is a {t.layout} torch tensor: pass a dense tensor")
        if t.device.type != "cpu":
            t = t.cpu()  # copied to the host, bit for bit
        if t.is_conj() or t.is_neg():
            t = t.resolve_conj().resolve_neg()
        return t, None
    np = _numpy()
    if np is not None and isinstance(value, np.ndarray):
        a = value
        if a.dtype.fields is not None:
            raise _native.BadInputError(f"tensor `{name}` is a structured array ({a.dtype}): a dump cannot hold it")
        d16 = None
        if a.dtype.kind == "V" and a.dtype.itemsize == 2 and a.dtype.name == "bfloat16":
            # ml_dtypes.bfloat16: its bits, as uint16.
            a, d16 = a.view(np.uint16), "bfloat16"
        elif a.dtype.kind == "V":
            raise _native.BadInputError(
                f"tensor `{name}` has dtype {a.dtype}, which a dump cannot hold: "
                "expected float64/32/16, bfloat16, an integer or bool"
            )
        if a.dtype.byteorder == ">":
            a = a.astype(a.dtype.newbyteorder("<"))  # exact: bytes swapped
        if not a.flags.c_contiguous:
            a = np.ascontiguousarray(a)
        return a, d16
    if hasattr(value, "__dlpack__"):
        return value, None
    if isinstance(value, (list, tuple, int, float)) and not isinstance(value, bool):
        if np is None:
            raise TypeError(f"tensor `{name}`: a {type(value).__name__} needs numpy; pass a tensor or array")
        return producer(name, np.asarray(value))
    raise TypeError(
        f"tensor `{name}`: expected a torch tensor, a numpy array or an object with __dlpack__, "
        f"got {type(value).__name__}"
    )


def metadata_value(key: str, value: Any) -> str:
    """The ``__metadata__`` string of a metadata keyword's value."""
    if hasattr(value, "item") and callable(value.item) and getattr(value, "ndim", 0) == 0:
        value = value.item()  # numpy / torch scalars
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            return str(value)
        return repr(value)  # shortest string that reads back as the same double
    if isinstance(value, str):
        return value
    raise TypeError(f"metadata `{key}`: expected a str, int, float or bool, got {type(value).__name__}")


def rows_arg(rows: Any) -> Optional[str]:
    """``rows=``: None (all), ``"a..b"``, ``"a.."``, ``"sample:K"`` or a ``range`` with step 1."""
    if rows is None or isinstance(rows, str):
        return rows
    if isinstance(rows, range):
        if rows.step != 1:
            raise ValueError(f"rows={rows!r}: a range with step 1 (or \"sample:K\")")
        return f"{rows.start}..{rows.stop}"
    raise TypeError(f"rows: expected None, a str (\"a..b\", \"sample:K\") or a range, got {type(rows).__name__}")


def split(
    fn: str,
    named: Dict[str, Any],
    dtype: Union[None, str, Dict[str, str]],
) -> Tuple[List[Tuple[str, Any, Optional[str], bool]], List[Tuple[str, str]]]:
    """Sorts keyword values into tensors (``(name, producer, dtype16,
    explicit)``) and metadata (``(key, string)``) by the name table; names
    with value ``None`` are left out."""
    tensors: List[Tuple[str, Any, Optional[str], bool]] = []
    metadata: List[Tuple[str, str]] = []
    per_name: Dict[str, str] = {}
    global16: Optional[str] = None
    if isinstance(dtype, str):
        global16 = _dtype16("every float tensor", dtype)
    elif isinstance(dtype, dict):
        for k, v in dtype.items():
            if k not in named or named[k] is None:
                raise TypeError(f"{fn}(): dtype names `{k}`, which is not a tensor given here")
            per_name[k] = _dtype16(k, v)
    elif dtype is not None:
        raise TypeError(f"{fn}(): dtype: expected None, \"bfloat16\", \"float16\" or a dict name -> dtype")
    for name, value in named.items():
        if value is None:
            continue
        kind = _native.name_kind(name)
        if kind is None:
            hint = _native.closest_name(name)
            raise TypeError(
                f"{fn}() got an unexpected keyword argument {name!r}"
                + (f": did you mean {hint!r}?" if hint else "")
            )
        if kind[0] == "tensor":
            obj, d16 = producer(name, value)
            if name in per_name:
                tensors.append((name, obj, per_name[name], True))
            elif d16 is not None:
                tensors.append((name, obj, d16, True))
            elif global16 is not None and name not in ID_OR_FLAG_TENSORS:
                tensors.append((name, obj, global16, False))
            else:
                tensors.append((name, obj, None, False))
        else:
            metadata.append((name, metadata_value(name, value)))
    return tensors, metadata
