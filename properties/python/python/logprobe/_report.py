"""The report of one verification: ``Report``, ``Output``, ``Element``.

Built from the JSON of ``logprobe verify --json`` for one file (the same
serialisation of the same Rust report), with the CLI's table as ``str()``.
Non-finite figures, which JSON writes as ``"inf"`` / ``"-inf"`` / ``"NaN"``,
are floats again here.
"""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

_NONFINITE = {"inf": float("inf"), "-inf": float("-inf"), "NaN": float("nan")}

#: The engine's verdicts (serde names) in the ``--expect`` vocabulary.
_VERDICT = {
    "pass": "pass",
    "suspect": "suspect",
    "unchecked": "unchecked",
    "no_bound": "no bound",
    "fail": "fail",
}


def _floats(x: Any) -> Any:
    if isinstance(x, str) and x in _NONFINITE:
        return _NONFINITE[x]
    if isinstance(x, list):
        return [_floats(v) for v in x]
    if isinstance(x, dict):
        return {k: _floats(v) for k, v in x.items()}
    return x


@dataclass(frozen=True)
class Element:
    """One judged element: the candidate, the exact value and the error.

    ``row`` is the flat row of ``[N, V]`` (``b * T + t`` of ``[B, T, V]``),
    ``position`` its ``(b, t)`` for ``[B, T, V]`` logits; ``col`` the top-k
    slot ``k`` or the vocabulary index of ``grad_logits`` (``None`` for
    ``[N]`` outputs). Errors are in nats (nats per logit for gradients);
    ``ulps`` in ulps of the candidate's dtype at the exact value; ``bound``
    ``None`` where the model certifies nothing.
    """

    row: int
    position: Optional[Tuple[int, int]]
    col: Optional[int]
    candidate: float
    exact: float
    exact_rounded: float
    error: float
    ulps: float
    bound: Optional[float]
    ratio: float

    @classmethod
    def _from(cls, d: Dict[str, Any]) -> "Element":
        pos = d.get("position")
        return cls(
            row=d["row"],
            position=tuple(pos) if pos is not None else None,
            col=d.get("col"),
            candidate=d["candidate"],
            exact=d["exact"],
            exact_rounded=d["exact_rounded"],
            error=d["error"],
            ulps=d["ulps"],
            bound=d.get("bound"),
            ratio=d["ratio"],
        )


@dataclass(frozen=True)
class Output:
    """The judgement of one output (``log_probs``, ``entropy``,
    ``topk_log_probs`` or ``grad_logits``).

    ``verdict``: ``"pass"``, ``"suspect"``, ``"no bound"``, ``"fail"``, or
    ``"unchecked"`` when no element was checked (``nothing_checked`` says
    why). ``max_abs_error`` (nats) and ``max_ulps`` are the largest errors;
    ``max_ratio`` the largest error / bound under the chosen model;
    ``tightest_model`` the tightest of ``tree``, ``lanes=8``, ``sequential``
    every element satisfies (``None``: none); ``reference_ratios`` the
    largest error / bound under each of them; ``worst`` the worst elements,
    worst first. ``suspect_rules`` names the rules that find the output
    SUSPECT (``"statistical"``, ``"relative"``); ``relative_ratio`` is the
    relative rule's max error / max(careful code's max error, half an ulp),
    which fires above R (``relative_fires``; ``None`` for outputs the rule
    does not cover). Report schema 2 (docs/verify.md): ``vs_fused``,
    ``fused_max_abs_error`` and ``flash_rule_ratio`` are gone.
    """

    name: str
    dtype: str
    count: int
    verdict: str
    max_abs_error: float
    max_ulps: float
    max_ratio: Optional[float]
    tightest_model: Optional[str]
    reference_ratios: Dict[str, Optional[float]]
    worst: List[Element]
    nothing_checked: Optional[str]
    suspect_elements: int = 0
    statistical_max_ratio: Optional[float] = None
    relative_ratio: Optional[float] = None
    relative_careful_max_abs_error: Optional[float] = None
    relative_fires: bool = False
    suspect_rules: List[str] = field(default_factory=list)
    no_bound_reason: Optional[str] = None

    @classmethod
    def _from(cls, d: Dict[str, Any]) -> "Output":
        unchecked = d.get("nothing_checked")
        rel = d.get("relative_rule")
        return cls(
            name=d["output"],
            dtype=d["dtype"],
            count=d["count"],
            verdict="unchecked" if unchecked is not None else _VERDICT[d["verdict"]],
            max_abs_error=d["max_abs_error"],
            max_ulps=d["max_ulps"],
            max_ratio=d.get("max_ratio"),
            tightest_model=d.get("tightest_model"),
            reference_ratios={r["model"]: r.get("max_ratio") for r in d.get("reference_ratios", [])},
            worst=[Element._from(e) for e in d.get("worst", [])],
            nothing_checked=unchecked,
            suspect_elements=d.get("suspect_elements", 0),
            statistical_max_ratio=d.get("statistical_max_ratio"),
            relative_ratio=rel["ratio"] if rel else None,
            relative_careful_max_abs_error=rel["careful_max_abs_error"] if rel else None,
            relative_fires=bool(rel and rel["fires"]),
            suspect_rules=list(d.get("suspect_rules", [])),
            no_bound_reason=d.get("no_bound_reason"),
        )


class Report:
    """The verdict on one set of tensors, as ``logprobe verify`` gives it for a dump.

    - ``ok``: every output checked and within its bound (a ``suspect``
      verdict is ok unless ``strict``). Never true when nothing was checked.
    - ``verdict``: ``"pass"``, ``"suspect"`` (within the sound bound, beyond
      the statistical threshold), ``"no bound"`` (the model certifies
      nothing), ``"fail"``, or ``"unchecked"`` (no failure, but some output
      given had no element checked: see ``unchecked``).
    - ``outputs``: ``{name: Output}`` in the table's order; ``report[name]``.
    - ``unchecked``: ``{name: reason}`` of outputs with no element checked.
    - ``str(report)``: the CLI's table, worst elements included.
    - ``to_dict()``: the ``verify --json`` object of the file (non-finite
      figures as floats), plus ``ok`` and ``unchecked``.
    - ``bool(report)`` is ``ok``.
    """

    def __init__(self, report_json: str, table: str, *, strict: bool = False) -> None:
        self._dict: Dict[str, Any] = _floats(json.loads(report_json))
        self._table = table
        self.strict = strict
        d = self._dict
        self.outputs: Dict[str, Output] = {o["output"]: Output._from(o) for o in d["outputs"]}
        self.topk_ids: Optional[Dict[str, Any]] = d.get("topk_ids")
        self.unchecked: Dict[str, str] = {
            n: o.nothing_checked for n, o in self.outputs.items() if o.nothing_checked is not None
        }
        if self.topk_ids is not None and self.topk_ids.get("nothing_checked") is not None:
            self.unchecked["topk_ids"] = self.topk_ids["nothing_checked"]
        engine = _VERDICT[d["verdict"]]
        self.verdict: str = "unchecked" if engine == "pass" and self.unchecked else engine
        self.ok: bool = self.verdict == "pass" or (self.verdict == "suspect" and not strict)
        self.rows: int = d["rows"]
        self.rows_checked: int = d["rows_checked"]
        self.columns: int = d["columns"]
        self.vocab_size: int = d["vocab_size"]
        self.logits_dtype: str = d["logits_dtype"]
        self.model: str = d["model"]
        self.accumulation: str = d["accumulation"]
        self.seconds: float = d["seconds"]

    def __getitem__(self, output: str) -> Output:
        return self.outputs[output]

    def __bool__(self) -> bool:
        return self.ok

    def to_dict(self) -> Dict[str, Any]:
        """The ``logprobe verify --json`` object of this report (one file),
        non-finite figures as floats, plus ``ok`` and ``unchecked``."""
        d = copy.deepcopy(self._dict)
        d["ok"] = self.ok
        d["unchecked"] = dict(self.unchecked)
        return d

    def summary(self) -> str:
        """One line: the verdict, and each output's verdict and worst error / bound."""
        parts = []
        for o in self.outputs.values():
            r = "-" if o.max_ratio is None else f"{o.max_ratio:.3g}"
            parts.append(f"{o.name} {o.verdict} (err/bound {r}, {o.max_ulps:.3g} ulps)")
        if self.topk_ids is not None:
            parts.append(f"topk_ids {self.unchecked.get('topk_ids') and 'unchecked' or _VERDICT[self.topk_ids['verdict']]}")
        why = ""
        if self.verdict == "unchecked":
            why = "; nothing checked for " + ", ".join(f"{k} ({v})" for k, v in self.unchecked.items())
        elif self.verdict == "suspect" and self.strict:
            why = "; strict: a suspect verdict fails"
        return f"logprobe: {self.verdict}: " + ", ".join(parts) + why

    def __str__(self) -> str:
        return self._table

    def __repr__(self) -> str:
        outs = ", ".join(f"{n}={o.verdict}" for n, o in self.outputs.items())
        return f"<logprobe.Report {self.verdict} ok={self.ok} [{outs}] rows {self.rows_checked}/{self.rows}>"
