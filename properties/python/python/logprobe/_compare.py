"""The report of ``logprobe.compare``: ``CompareReport``.

Built from the JSON of ``logprobe compare --json`` (the same serialisation
of the same Rust report, ``schema_version`` 1), with the CLI's table as
``str()``. Non-finite figures (JSON ``"inf"`` / ``"-inf"`` / ``"NaN"``) are
floats again here.
"""

from __future__ import annotations

import copy
import json
from typing import Any, Dict, List

from ._report import _floats


class CompareReport:
    """Where a log-prob mismatch between A and B comes from (docs/compare.md).

    - ``rows``: one dict per compared row with ``kernel_error_a``,
      ``kernel_error_b``, ``logits_effect``, ``observed``,
      ``b_minus_exact_a``, ``kl`` (each ``{"value", "lo", "hi"}``, an
      enclosure of the exact real in nats, or ``None``), the candidates
      ``log_prob_a`` / ``log_prob_b``, bitwise equality, and ``entropy``.
    - ``summary``: the magnitudes, ``bitwise_equal_rows``,
      ``importance_ratio``, ``pearson_log_probs``, ``pearson_probs``, the
      shares, ``kernel_bounds`` and ``verdict``.
    - ``verdict``: the one-line verdict ("the mismatch is X% kernel
      numerics, Y% logits; ...").
    - ``ok`` / ``bool(report)``: every kernel within its bound (exit status 0).
    - ``str(report)``: the CLI's table; ``to_dict()``: the JSON document.
    """

    def __init__(self, report_json: str, table: str) -> None:
        self._dict: Dict[str, Any] = _floats(json.loads(report_json))
        self._table = table
        d = self._dict
        self.schema_version: int = d["schema_version"]
        self.summary: Dict[str, Any] = d["summary"]
        self.rows: List[Dict[str, Any]] = d["rows"]
        self.verdict: str = d["summary"]["verdict"]
        self.exit_status: int = d["exit_status"]
        self.ok: bool = self.exit_status == 0

    def __bool__(self) -> bool:
        return self.ok

    def __str__(self) -> str:
        return self._table

    def __repr__(self) -> str:
        return f"<logprobe.CompareReport rows {self.summary['rows']} ok={self.ok}: {self.verdict}>"

    def to_dict(self) -> Dict[str, Any]:
        """The ``logprobe compare --json`` document, non-finite figures as floats."""
        return copy.deepcopy(self._dict)
