"""pytest helpers: ``assert_verified``, ``assert_fuzz_clean``.

``assert_verified(...)`` takes the arguments of ``logprobe.verify`` and
raises ``AssertionError`` unless the report is ``ok``: every output given
was checked and is within its bound (``suspect`` fails too with
``strict=True``). The message is a one-line summary, then the CLI's table
with the worst rows (candidate, exact value, error, ulps, bound).

``assert_fuzz_clean(fn, ...)`` takes the arguments of ``logprobe.fuzz`` and
raises ``FuzzFailure`` (an ``AssertionError``) when the fuzzer finds a
counterexample: the message is the finding (property, detail, recipe, seed)
and the CLI's report; the exception's ``report`` holds the dumps
(``e.report.save(path)``), and ``save_to=DIR`` writes them there first.
"""

from __future__ import annotations

from typing import Any

import os
from typing import Optional, Union

from . import FuzzReport, Report, fuzz, verify

__all__ = ["assert_verified", "assert_fuzz_clean", "FuzzFailure"]


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


class FuzzFailure(AssertionError):
    """``assert_fuzz_clean`` found a counterexample: ``report`` is the
    ``FuzzReport`` (``report.save(path)`` writes the dump)."""

    def __init__(self, message: str, report: FuzzReport) -> None:
        super().__init__(message)
        self.report = report


def assert_fuzz_clean(fn: Any, *, save_to: Optional[Union[str, "os.PathLike[str]"]] = None,
                      **kwargs: Any) -> FuzzReport:
    """``logprobe.fuzz(fn, **kwargs)``, raising ``FuzzFailure`` (an
    ``AssertionError``: summary, detail, recipe and the CLI's report) when it
    finds a counterexample. ``save_to``: a directory the finding's dumps are
    written to (``<dir>/fuzz-in-process-seed<S>.safetensors``). Returns the
    report. Bad arguments raise ``ValueError`` / ``TypeError``; Ctrl-C inside
    ``fn`` raises ``KeyboardInterrupt``."""
    __tracebackhide__ = True  # pytest: show the caller's line
    report = fuzz(fn, **kwargs)
    if not report.ok:
        saved = ""
        if save_to is not None:
            os.makedirs(save_to, exist_ok=True)
            first = report.finding.files[0] if report.finding is not None else "finding.safetensors"
            paths = report.save(os.path.join(os.fspath(save_to), first))
            saved = "\nsaved: " + ", ".join(paths)
        raise FuzzFailure(f"{report.summary()}{saved}\n{report}", report)
    return report
