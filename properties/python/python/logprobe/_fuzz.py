"""``logprobe.fuzz(fn)``: property-test a kernel in-process under the fuzz
protocol, version 1 (docs/fuzz-protocol.md), with the engine of
``logprobe fuzz --exec``.

The engine (Rust, GIL released) draws each case, judges the answer with the
verify engine, runs the metamorphic variants, shrinks a finding by calling
``fn`` again and keeps its dumps. This file is the in-process transport's
Python half: ``Caller`` turns the engine's request (safetensors bytes) into
tensors and ``meta``, calls ``fn`` and writes its answer back as
safetensors bytes; an exception raised inside ``fn`` becomes a finding of
kind ``command`` with its traceback.
"""

from __future__ import annotations

import json
import os
import struct
import traceback
from datetime import timedelta
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple, Union

from . import _native

#: Every output of protocol v1, in request order.
OUTPUTS = ("log_probs", "entropy", "topk_log_probs", "grad_logits")

# safetensors dtype -> numpy dtype string (little-endian).
_READ = {
    "F64": "<f8", "F32": "<f4", "F16": "<f2", "BF16": "<u2",
    "I64": "<i8", "I32": "<i4", "I16": "<i2", "I8": "i1",
    "U64": "<u8", "U32": "<u4", "U16": "<u2", "U8": "u1", "BOOL": "?",
}
# numpy dtype kind + itemsize -> safetensors dtype.
_WRITE = {
    ("f", 8): "F64", ("f", 4): "F32", ("f", 2): "F16",
    ("i", 8): "I64", ("i", 4): "I32", ("i", 2): "I16", ("i", 1): "I8",
    ("u", 8): "U64", ("u", 4): "U32", ("u", 2): "U16", ("u", 1): "U8", ("b", 1): "BOOL",
}
# Names of the dtypes= keyword -> the grammar's.
_DTYPES = {
    "float64": "f64", "f64": "f64", "double": "f64",
    "float32": "f32", "f32": "f32", "float": "f32",
    "bfloat16": "bf16", "bf16": "bf16",
    "float16": "f16", "f16": "f16", "half": "f16",
}


def _numpy():
    try:
        import numpy
    except ImportError as e:  # pragma: no cover - numpy is a test dependency
        raise ImportError("logprobe.fuzz needs numpy (pip install numpy)") from e
    return numpy


def _torch_or_none():
    try:
        import torch
    except ImportError:
        return None
    return torch


def decode(request: bytes, torch: Any = None) -> Tuple[Dict[str, Any], Dict[str, str]]:
    """The tensors and metadata of a request (a safetensors file).

    numpy (``torch=None``): bf16 logits arrive as float32 arrays holding the
    exact values, f16 as float16. torch: tensors of the request's own dtype
    (bf16 included). Every array is a fresh, writable copy. ``meta`` gains
    ``logits_dtype`` (``f64``, ``f32``, ``bf16``, ``f16``), as the adapter's.
    """
    np = _numpy()
    (n,) = struct.unpack_from("<Q", request, 0)
    header = json.loads(request[8:8 + n])
    meta = dict(header.pop("__metadata__", None) or {})
    base = 8 + n
    tensors: Dict[str, Any] = {}
    for name, t in header.items():
        dt = t["dtype"]
        start, end = t["data_offsets"]
        a = np.frombuffer(request, dtype=_READ[dt], count=(end - start) // np.dtype(_READ[dt]).itemsize,
                          offset=base + start).reshape(t["shape"])
        if name == "logits":
            meta["logits_dtype"] = dt.lower()
        if torch is None:
            if dt == "BF16":  # bf16 -> f32 is exact: the bits are the high half
                a = (a.astype(np.uint32) << 16).view(np.float32)
            else:
                a = a.copy()
        elif dt == "BF16":
            a = torch.from_numpy(a.view(np.int16).copy()).view(torch.bfloat16)
        else:
            a = torch.from_numpy(a.copy())
        tensors[name] = a
    return tensors, meta


def _tensor_bytes(name: str, t: Any) -> Tuple[str, List[int], bytes]:
    """(safetensors dtype, shape, little-endian bytes) of one answer tensor:
    a torch tensor (any device; bf16 kept bit-exact), a numpy array
    (ml_dtypes bfloat16 included) or anything ``numpy.asarray`` takes."""
    np = _numpy()
    mod = type(t).__module__
    if mod.startswith("torch"):
        t = t.detach()
        if t.device.type != "cpu":
            t = t.cpu()
        t = t.contiguous()
        if str(t.dtype) == "torch.bfloat16":
            return "BF16", list(t.shape), t.view(dtype=_torch_or_none().int16).numpy().astype("<i2").tobytes()
        t = t.numpy()
    a = np.ascontiguousarray(np.asarray(t))
    if a.dtype.name == "bfloat16":  # ml_dtypes
        return "BF16", list(a.shape), a.view(np.uint16).astype("<u2").tobytes()
    st = _WRITE.get((a.dtype.kind, a.dtype.itemsize))
    if st is None:
        raise TypeError(f"output `{name}` has numpy dtype {a.dtype}, which a safetensors answer cannot hold")
    return st, list(a.shape), a.astype(a.dtype.newbyteorder("<")).tobytes()


def encode(outputs: Any) -> bytes:
    """The answer ``outputs`` (a dict of names to tensors) as safetensors bytes.

    Every entry is written in its own dtype (the engine judges each output
    in its dtype and reports a missing one, a wrong dtype or shape).
    """
    if not isinstance(outputs, Mapping):
        raise TypeError(f"returned {type(outputs).__name__}, not a dict of output names to tensors")
    header: Dict[str, Any] = {}
    blobs: List[bytes] = []
    off = 0
    for name, t in outputs.items():
        if not isinstance(name, str):
            raise TypeError(f"returned a dict with key {name!r}: keys are output names (str)")
        dt, shape, data = _tensor_bytes(name, t)
        header[name] = {"dtype": dt, "shape": shape, "data_offsets": [off, off + len(data)]}
        blobs.append(data)
        off += len(data)
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    return struct.pack("<Q", len(h)) + h + b"".join(blobs)


def _name(fn: Callable[..., Any]) -> str:
    mod = getattr(fn, "__module__", None)
    qual = getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None)
    if qual is None:
        return repr(fn)
    return f"{mod}.{qual}" if mod else qual


class Caller:
    """The in-process transport's call: request bytes -> answer bytes, or
    ``(what, traceback)`` when ``fn`` raised (a finding of kind ``command``)
    or answered something that is not a dict of tensors. BaseExceptions that
    are not Exceptions (KeyboardInterrupt, SystemExit) propagate: the
    engine stops and ``logprobe.fuzz`` raises them again."""

    def __init__(self, fn: Callable[..., Any], tensors: str) -> None:
        if not callable(fn):
            raise TypeError(f"fuzz(fn): fn must be callable, got {type(fn).__name__}")
        if tensors not in ("auto", "torch", "numpy"):
            raise ValueError(f"tensors={tensors!r}: expected \"auto\", \"torch\" or \"numpy\"")
        torch = None
        if tensors in ("auto", "torch"):
            torch = _torch_or_none()
            if torch is None and tensors == "torch":
                raise ImportError("tensors=\"torch\" needs torch installed")
        _numpy()
        self.fn = fn
        self.torch = torch
        self.name = _name(fn)

    def __call__(self, request: bytes) -> Union[bytes, Tuple[str, str]]:
        inputs, meta = decode(request, self.torch)
        try:
            out = self.fn(inputs, meta)
        except Exception as e:
            # The traceback from fn's frame down (this frame left out).
            tb = traceback.format_exception(type(e), e, e.__traceback__.tb_next if e.__traceback__ else None)
            return (f"{self.name} raised {type(e).__name__}: {e}", "".join(tb))
        try:
            return encode(out)
        except Exception as e:
            return (f"{self.name} {e}" if str(e).startswith("returned") else
                    f"{self.name} returned an answer logprobe cannot write: {e}", "")


def _duration(x: Any, what: str) -> str:
    if isinstance(x, timedelta):
        return f"{x.total_seconds()}s"
    if isinstance(x, (int, float)) and not isinstance(x, bool):
        return f"{float(x)}s"
    if isinstance(x, str):
        return x
    raise TypeError(f"fuzz(): {what}={x!r}: a duration such as \"30s\", \"2m\", a number of seconds or a timedelta")


def _alternatives(x: Any, what: str, conv: Callable[[Any], str]) -> Optional[str]:
    """A keyword given as one value or a sequence, as the grammar's `a|b`."""
    if x is None:
        return None
    items = [x] if isinstance(x, (str, int)) else list(x)
    if not items:
        raise ValueError(f"fuzz(): {what}=(): give at least one value, or None for the default")
    return "|".join(conv(i) for i in items)


def _accumulation(d: Any) -> Optional[str]:
    """The accumulation= keyword (a dtype name, torch's included) as the CLI's."""
    if d is None:
        return None
    name = str(d).replace("torch.", "").strip()
    if name not in _DTYPES:
        raise ValueError(f"fuzz(): accumulation={d!r}: expected float64, float32, bfloat16 or float16")
    return _DTYPES[name]


def _dtype(d: Any) -> str:
    name = str(d).replace("torch.", "").strip()
    if name not in _DTYPES:
        raise ValueError(f"fuzz(): dtype {d!r}: expected float64, float32, bfloat16 or float16")
    return _DTYPES[name]


def _vocab(v: Any) -> str:
    if isinstance(v, bool):
        raise TypeError(f"fuzz(): vocab {v!r}: an int, \"lo..hi\" or \"real\"")
    if isinstance(v, int):
        return str(v)
    if isinstance(v, range):
        return f"{v.start}..{v.stop - 1}"
    return str(v)


def _option_value(key: str, a: Any) -> str:
    if isinstance(a, bool):
        return "on" if a else "off"
    return _vocab(a) if key == "vocab" else str(a)


def options_string(options: Any, dtypes: Any, vocab: Any) -> str:
    """``options`` (the CLI's ``--options`` grammar: a string, or a dict of
    key -> value or list of alternatives) with ``dtype=`` and ``vocab=``."""
    if isinstance(options, Mapping):
        parts = []
        for k, v in options.items():
            alts = v if isinstance(v, (list, tuple)) else [v]
            parts.append(f"{k}=" + "|".join(_option_value(k, a) for a in alts))
        options = ",".join(parts)
    elif not isinstance(options, str):
        raise TypeError(f"fuzz(): options={options!r}: a string in the --options grammar (docs/fuzz.md) or a dict")
    parts = [options] if options else []
    d = _alternatives(dtypes, "dtypes", _dtype)
    if d is not None:
        parts.append(f"dtype={d}")
    v = _alternatives(vocab, "vocab", _vocab)
    if v is not None:
        parts.append(f"vocab={v}")
    return ",".join(parts)


def require_string(require: Any) -> str:
    """``require`` as ``--require``'s comma list (``none`` for nothing)."""
    if isinstance(require, str):
        return require or "none"
    items = list(require)
    return ",".join(str(i) for i in items) if items else "none"


class FuzzFinding:
    """A finding, shrunk: ``property`` (``oracle agreement``, ``gradient``,
    ``command``, ``padding invariance``, ``chunk-size invariance``, ``batch
    invariance``), ``detail`` (output, row, column, values, bound; for
    ``command`` the exception and its traceback), ``recipe`` (the case in
    the options grammar: ``options=recipe`` pins it), ``case_index``,
    ``shrink_steps``, ``verify`` (what ``logprobe verify`` says of the
    dump), ``files`` (dump names)."""

    def __init__(self, d: Dict[str, Any]) -> None:
        self.property: str = d["property"]
        self.detail: str = d["detail"]
        self.recipe: str = d["recipe"]
        self.case_index: int = d["case_index"]
        self.time_to_find: float = d.get("time_to_find", 0.0)
        self.shrink_steps: int = d.get("shrink_steps", 0)
        self.shrink_seconds: float = d.get("shrink_seconds", 0.0)
        self.verify: Optional[str] = d.get("verify")
        self.files: List[str] = list(d.get("files", []))

    def __repr__(self) -> str:
        return f"FuzzFinding(property={self.property!r}, recipe={self.recipe!r})"


class FuzzReport:
    """The outcome of ``logprobe.fuzz``: ``ok`` (no finding), ``finding``
    (a ``FuzzFinding`` or None), the counts (``cases``, ``checked``,
    ``suspect``, ``bad_input_not_sent``, ``nothing_to_check``), ``worst``
    (worst error / bound over the checked cases), ``seed``, ``held`` (per
    invariance: ``{"property", "cases", "required", "lacked"}``), ``lacks``
    (invariances lacked but not required), ``files`` (dump name -> bytes)
    and ``table`` (the CLI's report; ``str(report)``).

    ``save(path)`` writes the finding's dump, which ``logprobe verify``
    (and ``logprobe.verify_file``) judges as the fuzzer did."""

    def __init__(self, report_json: str, table: str, files: Sequence[Tuple[str, bytes]]) -> None:
        d = json.loads(report_json)
        self._d = d
        self.table: str = table
        self.files: Dict[str, bytes] = dict(files)
        self.kernel: str = d["kernel"]
        self.seed: int = d["seed"]
        self.cases: int = d["cases"]
        self.checked: int = d["checked"]
        self.suspect: int = d["suspect"]
        self.bad_input_not_sent: int = d["bad_input_not_sent"]
        self.nothing_to_check: int = d["nothing_to_check"]
        self.seconds: float = d["seconds"]
        self.worst: float = d["worst"]
        self.calls: int = d["calls"]
        self.shrink_calls: int = d["shrink_calls"]
        self.held: List[Dict[str, Any]] = d["held"]
        self.lacks: List[FuzzFinding] = [FuzzFinding(x) for x in d["lacks"]]
        self.finding: Optional[FuzzFinding] = FuzzFinding(d["finding"]) if d["finding"] else None

    @property
    def ok(self) -> bool:
        """No finding (lacked invariances that are not required do not count)."""
        return self.finding is None

    def summary(self) -> str:
        """One line: what was found (and where), or how much passed."""
        if self.finding is not None:
            f = self.finding
            return (f"logprobe.fuzz({self.kernel}): FOUND {f.property} on case {f.case_index} of seed "
                    f"{self.seed} (shrunk in {f.shrink_steps} steps); recipe: {f.recipe}")
        return (f"logprobe.fuzz({self.kernel}): clean: {self.cases} cases (seed {self.seed}), "
                f"{self.checked} checked against the oracle, worst err/bound {self.worst:.3f}")

    def save(self, path: Union[str, "os.PathLike[str]"]) -> List[str]:
        """Writes the finding's dump to ``path`` (an invariance's variant
        next to it, ``<stem>-variant.safetensors``); returns the paths.
        ``logprobe verify PATH`` gives the fuzzer's verdict (``FAIL`` for
        ``oracle agreement`` and ``gradient``; a ``command`` finding holds
        the inputs only). Raises ``ValueError`` when there is no finding."""
        if self.finding is None:
            raise ValueError("FuzzReport.save: no finding to save (the report is ok)")
        path = os.fspath(path)
        stem = path[:-len(".safetensors")] if path.endswith(".safetensors") else path
        written = []
        for i, name in enumerate(self.finding.files):
            p = path if i == 0 else f"{stem}-{name.rsplit('-', 1)[-1]}"
            with open(p, "wb") as f:
                f.write(self.files[name])
            written.append(p)
        return written

    def __str__(self) -> str:
        return self.table

    def __repr__(self) -> str:
        return f"<FuzzReport {self.summary()}>"


def fuzz(
    fn: Callable[[Dict[str, Any], Dict[str, str]], Dict[str, Any]],
    *,
    budget: Any = "30s",
    cases: Optional[int] = None,
    dtypes: Any = ("float32", "bfloat16"),
    vocab: Any = None,
    outputs: Sequence[str] = OUTPUTS,
    options: Any = "",
    seed: Optional[int] = None,
    require: Any = ("padding-invariant",),
    shrink_budget: Any = "30s",
    tensors: str = "auto",
    progress: bool = False,
    bitwise: bool = False,
    accumulation: Optional[Any] = None,
    strict: bool = False,
) -> FuzzReport:
    """See ``logprobe.fuzz`` (``logprobe/__init__.pyi``)."""
    if cases is not None and (not isinstance(cases, int) or isinstance(cases, bool) or cases < 0):
        raise TypeError(f"fuzz(): cases={cases!r}: an int >= 0, or None")
    if seed is not None and (not isinstance(seed, int) or isinstance(seed, bool) or seed < 0):
        raise TypeError(f"fuzz(): seed={seed!r}: an int >= 0, or None (from the clock)")
    if isinstance(outputs, str):
        outputs = [o for o in outputs.split(",") if o]
    caller = Caller(fn, tensors)
    report_json, table, files = _native.fuzz(
        caller,
        name=caller.name,
        budget=_duration(budget, "budget"),
        cases=cases,
        shrink_budget=_duration(shrink_budget, "shrink_budget"),
        options=options_string(options, dtypes, vocab),
        outputs=list(outputs),
        require=require_string(require),
        seed=seed,
        progress=bool(progress),
        bitwise=bool(bitwise),
        accumulation=_accumulation(accumulation),
        strict=bool(strict),
    )
    return FuzzReport(report_json, table, files)


def fuzz_replay(
    fn: Callable[[Dict[str, Any], Dict[str, str]], Dict[str, Any]],
    path: Union[str, "os.PathLike[str]"],
    *,
    outputs: Sequence[str] = OUTPUTS,
    require: Any = ("padding-invariant",),
    tensors: str = "auto",
    bitwise: bool = False,
    accumulation: Optional[Any] = None,
    strict: bool = False,
) -> Optional[FuzzFinding]:
    """See ``logprobe.fuzz_replay`` (``logprobe/__init__.pyi``)."""
    if isinstance(outputs, str):
        outputs = [o for o in outputs.split(",") if o]
    caller = Caller(fn, tensors)
    r = _native.fuzz_replay(caller, os.fspath(path), name=caller.name, outputs=list(outputs),
                            require=require_string(require), bitwise=bool(bitwise),
                            accumulation=_accumulation(accumulation), strict=bool(strict))
    if r is None:
        return None
    prop, detail, recipe = r
    return FuzzFinding({"property": prop, "detail": detail, "recipe": recipe, "case_index": 0})


LINEAR_OUTPUTS = ("log_probs", "grad_hidden", "grad_lm_head_weight", "grad_lm_head_bias")


class LinearCall:
    """A fused linear kernel ``fn(hidden, lm_head_weight, targets, *,
    lm_head_bias, temperature, softcap, ignore_index) -> log_probs [N]`` (or a
    dict of ``log_probs`` / ``entropy`` / ``lse``) as the in-process
    transport's ``fn(inputs, meta)``: the gradients asked for are taken by
    torch's autograd of ``sum(grad_log_probs * log_probs)`` (ignored rows
    weigh 0), with respect to ``hidden``, ``lm_head_weight`` and the bias,
    in their own dtype."""

    def __init__(self, fn: Callable[..., Any]) -> None:
        if not callable(fn):
            raise TypeError(f"fuzz_linear(fn): fn must be callable, got {type(fn).__name__}")
        self.fn = fn
        self.__name__ = getattr(fn, "__name__", "fn")
        self.__qualname__ = getattr(fn, "__qualname__", self.__name__)
        self.__module__ = getattr(fn, "__module__", None)

    def __call__(self, inputs: Dict[str, Any], meta: Dict[str, str]) -> Dict[str, Any]:
        torch = _torch_or_none()
        asked = [o for o in meta.get("outputs", "").split(",") if o]
        grads = [o for o in asked if o.startswith("grad_")]
        hidden = inputs["hidden"].requires_grad_(bool(grads))
        weight = inputs["lm_head_weight"].requires_grad_(bool(grads))
        bias = inputs.get("lm_head_bias")
        if bias is not None:
            bias = bias.requires_grad_(bool(grads))
        softcap = float(meta["softcap"]) if "softcap" in meta else None
        ignore = int(meta["ignore_index"])
        tokens = inputs["tokens"]
        out = self.fn(hidden, weight, tokens, lm_head_bias=bias,
                      temperature=float(meta["temperature"]), softcap=softcap, ignore_index=ignore)
        if not isinstance(out, Mapping):
            out = {"log_probs": out}
        answer = {k: v.detach() for k, v in out.items() if k in asked and not k.startswith("grad_")}
        if grads:
            if "log_probs" not in out:
                raise TypeError("returned no log_probs: the gradients are those of the log-probs")
            lp = out["log_probs"]
            cot = inputs["grad_log_probs"].to(lp.dtype)
            cot = torch.where(tokens == ignore, torch.zeros_like(cot), cot)
            wrt = [hidden, weight] + ([bias] if bias is not None else [])
            g = torch.autograd.grad(lp, wrt, grad_outputs=cot, allow_unused=True)
            named = dict(zip(["grad_hidden", "grad_lm_head_weight", "grad_lm_head_bias"], g))
            src = {"grad_hidden": hidden, "grad_lm_head_weight": weight, "grad_lm_head_bias": bias}
            for o in grads:
                t = named.get(o)
                answer[o] = torch.zeros_like(src[o]) if t is None else t
        return answer


def fuzz_linear(
    fn: Callable[..., Any],
    *,
    budget: Any = "30s",
    cases: Optional[int] = None,
    dtypes: Any = ("float32", "bfloat16"),
    outputs: Sequence[str] = LINEAR_OUTPUTS,
    options: Any = "",
    seed: Optional[int] = None,
    shrink_budget: Any = "30s",
    lm_head_logits_dtype: str = "input",
    progress: bool = False,
) -> FuzzReport:
    """See ``logprobe.fuzz_linear`` (``logprobe/__init__.pyi``)."""
    if cases is not None and (not isinstance(cases, int) or isinstance(cases, bool) or cases < 0):
        raise TypeError(f"fuzz_linear(): cases={cases!r}: an int >= 0, or None")
    if seed is not None and (not isinstance(seed, int) or isinstance(seed, bool) or seed < 0):
        raise TypeError(f"fuzz_linear(): seed={seed!r}: an int >= 0, or None (from the clock)")
    if _torch_or_none() is None:
        raise ImportError("fuzz_linear() needs torch: the gradients are taken by autograd")
    if isinstance(outputs, str):
        outputs = [o for o in outputs.split(",") if o]
    dt = _alternatives(dtypes, "dtypes", lambda d: {"float32": "f32", "bfloat16": "bf16"}.get(
        str(d).replace("torch.", ""), str(d)))
    opts = options if isinstance(options, str) else ",".join(f"{k}={v}" for k, v in options.items())
    if dt is not None:
        opts = f"{opts},dtype={dt}" if opts else f"dtype={dt}"
    caller = Caller(LinearCall(fn), "torch")
    report_json, table, files = _native.fuzz_linear(
        caller,
        name=caller.name,
        budget=_duration(budget, "budget"),
        cases=cases,
        shrink_budget=_duration(shrink_budget, "shrink_budget"),
        options=opts,
        outputs=list(outputs),
        lm_head_logits_dtype=str(lm_head_logits_dtype),
        seed=seed,
        progress=bool(progress),
    )
    return FuzzReport(report_json, table, files)
