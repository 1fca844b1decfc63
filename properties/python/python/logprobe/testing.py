"""pytest helpers: ``assert_verified``.

``assert_verified(...)`` takes the arguments of ``logprobe.verify`` and
raises ``AssertionError`` unless the report is ``ok``: every output given
was checked and is within its bound (``suspect`` fails too with
``strict=True``). The message is a one-line summary, then the CLI's table
with the worst rows (candidate, exact value, error, ulps, bound).
"""

from __future__ import annotations

from typing import Any

from . import Report, verify

__all__ = ["assert_verified"]


def assert_verified(logits: Any, tokens: Any = None, **kwargs: Any) -> Report:
    """``logprobe.verify(logits, tokens, **kwargs)``, raising ``AssertionError``
    (summary + table + worst rows) unless the report is ``ok``. Returns the
    report. Bad input raises ``BadInputError`` (a ``ValueError``), not an
    ``AssertionError``."""
    __tracebackhide__ = True  # pytest: show the caller's line
    report = verify(logits, tokens, **kwargs)
    if not report.ok:
        raise AssertionError(f"{report.summary()}\n{report}")
    return report
