"""pytest helpers: ``assert_verified``, ``assert_fuzz_clean``.

``assert_verified(...)`` takes the arguments of ``logprobe.verify`` and
raises ``AssertionError`` unless the report is ``ok``: every output given
was checked and is within its bound (``suspect`` fails too with
``strict=True``). The message is a one-line summary, then the CLI's table
with the worst rows (candidate, exact value, error, ulps, bound); with a
findings store (below) the tensors are saved there as a dump and the
message gives the ``logprobe verify`` line that replays it.

``assert_fuzz_clean(fn, ...)`` takes the arguments of ``logprobe.fuzz`` and
raises ``FuzzFailure`` (an ``AssertionError``) when the fuzzer finds a
counterexample: the message is the finding (property, detail, recipe, seed),
the replay lines and the CLI's report; the exception's ``report`` holds the
dumps (``e.report.save(path)``), and ``save_to=DIR`` writes them there first.

**The findings store** (docs/python.md, "pytest"): set by the pytest plugin
this package registers (``--logprobe-findings DIR``, default
``fuzz-findings``, the CLI's ``--out``) or by ``configure(store=DIR)``.
A finding of ``assert_fuzz_clean`` is saved under
``DIR/pytest/<test id>/<kernel>-seed<S>.safetensors`` and replayed first on
the next run of that test, before any new search, as hypothesis replays its
examples; a stored finding that no longer fails is deleted. The plugin's
``--logprobe-budget`` and ``--logprobe-seed`` set the budget and seed of
every ``assert_fuzz_clean`` search of the run (they override the tests' own:
the command line is the last word, as for scaling depth in a nightly job).
"""

from __future__ import annotations

import os
import re
import shlex
import warnings
from pathlib import Path
from typing import Any, Dict, List, Optional, Union

from . import FuzzFinding, FuzzReport, Report, _native, fuzz, fuzz_replay, save_dump, verify
from ._fuzz import _duration, _name

__all__ = ["assert_verified", "assert_fuzz_clean", "FuzzFailure", "configure", "settings"]

_SETTINGS: Dict[str, Any] = {"budget": None, "seed": None, "store": None}

#: The keywords of ``fuzz`` that ``fuzz_replay`` takes too.
_REPLAY_KEYWORDS = ("outputs", "require", "tensors", "bitwise", "accumulation", "strict")
#: The keywords of ``verify`` that are not dump names, as ``logprobe verify`` flags.
_VERIFY_FLAGS = {"model": "--model", "accumulation": "--accumulation", "rows": "--rows",
                 "form": "--form", "k3_form": "--k3-form"}


def configure(*, budget: Optional[str] = None, seed: Optional[int] = None,
              store: Optional[Union[str, "os.PathLike[str]"]] = None) -> None:
    """Sets the run's fuzz budget and seed (they override each
    ``assert_fuzz_clean`` call's) and the findings store (None: findings are
    neither stored nor replayed). The pytest plugin calls it from
    ``--logprobe-budget``, ``--logprobe-seed`` and ``--logprobe-findings``;
    ``configure()`` resets all three. Raises ``ValueError`` for a bad
    budget, ``TypeError`` for a seed that is not an int >= 0."""
    if budget is not None:
        budget = _duration(budget, "budget")
        if not re.fullmatch(r"\s*\d+(\.\d+)?\s*(ms|s|m|h)\s*", budget):
            raise ValueError(f"budget={budget!r}: a duration such as \"500ms\", \"30s\", \"10m\", \"1h\"")
    if seed is not None and (not isinstance(seed, int) or isinstance(seed, bool) or seed < 0):
        raise TypeError(f"configure(): seed={seed!r}: an int >= 0, or None")
    _SETTINGS.update(budget=budget, seed=seed, store=None if store is None else Path(store))


def settings() -> Dict[str, Any]:
    """The run's settings: ``{"budget", "seed", "store"}`` (None where unset)."""
    return dict(_SETTINGS)


def _test_slot(kernel: str) -> Optional[Path]:
    """``<store>/pytest/<test id>``: the running test's folder of findings
    (the test id from pytest's ``PYTEST_CURRENT_TEST``; ``<no test>`` outside
    pytest), or None without a store."""
    store = _SETTINGS["store"]
    if store is None:
        return None
    current = os.environ.get("PYTEST_CURRENT_TEST", "no-test").rsplit(" (", 1)[0]
    return store / "pytest" / _safe(current) / _safe(kernel)


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", name).strip("_")[:120] or "_"


def _stored(slot: Path) -> List[Path]:
    """The findings stored in ``slot`` (not the invariances' ``-variant`` files)."""
    if not slot.is_dir():
        return []
    return sorted(p for p in slot.glob("*.safetensors") if not p.stem.endswith("-variant"))


def _forget(path: Path) -> None:
    stem = path.with_suffix("")
    for p in [path, *path.parent.glob(f"{stem.name}-variant.safetensors")]:
        p.unlink(missing_ok=True)


def assert_verified(logits: Any = None, tokens: Any = None, **kwargs: Any) -> Report:
    """``logprobe.verify(logits, tokens, **kwargs)``, raising ``AssertionError``
    (summary + table + worst rows, and with a findings store the
    ``logprobe verify`` line of the saved dump) unless the report is ``ok``.
    Returns the report. Bad input raises ``BadInputError`` (a
    ``ValueError``), not an ``AssertionError``."""
    __tracebackhide__ = True  # pytest: show the caller's line
    report = verify(logits, tokens, **kwargs)
    if not report.ok:
        replay = ""
        slot = _test_slot("verify")
        if slot is not None:
            slot.mkdir(parents=True, exist_ok=True)
            path = slot / "verify.safetensors"
            names = {k: v for k, v in kwargs.items() if k == "dtype" or _native.name_kind(k) is not None}
            save_dump(path, logits, tokens, **names)
            flags = [f"{flag} {shlex.quote(str(kwargs[k]))}" for k, flag in _VERIFY_FLAGS.items()
                     if kwargs.get(k) is not None]
            flags += ["--strict"] if kwargs.get("strict") else []
            replay = f"\nreplay: logprobe verify {shlex.quote(str(path))}{''.join(' ' + f for f in flags)}"
        raise AssertionError(f"{report.summary()}{replay}\n{report}")
    return report


class FuzzFailure(AssertionError):
    """``assert_fuzz_clean`` found a counterexample: ``report`` is the
    ``FuzzReport`` (``report.save(path)`` writes the dump), or None when a
    stored finding failed again on replay; ``finding`` is the
    ``FuzzFinding``; ``path`` the stored dump, if any."""

    def __init__(self, message: str, report: Optional[FuzzReport],
                 finding: Optional[FuzzFinding] = None, path: Optional[str] = None) -> None:
        super().__init__(message)
        self.report = report
        self.finding = finding if finding is not None else (report.finding if report else None)
        self.path = path


def _replay_lines(kernel: str, path: str, kwargs: Dict[str, Any]) -> str:
    q = shlex.quote(path)
    rerun = os.environ.get("PYTEST_CURRENT_TEST", "").rsplit(" (", 1)[0]
    lines = f"\nreplay: logprobe.fuzz_replay({kernel}, {path!r})"
    if rerun:
        lines += f"\nrerun:  pytest {shlex.quote(rerun)}  (replays the stored finding first)"
    lines += f"\ndump:   logprobe verify {q}  (the inputs and the kernel's outputs)"
    return lines


def assert_fuzz_clean(fn: Any, *, save_to: Optional[Union[str, "os.PathLike[str]"]] = None,
                      **kwargs: Any) -> FuzzReport:
    """``logprobe.fuzz(fn, **kwargs)``, raising ``FuzzFailure`` (an
    ``AssertionError``: summary, detail, recipe, replay lines and the CLI's
    report) when it finds a counterexample. With a findings store, the
    test's stored findings are replayed first (``fuzz_replay`` with the
    call's ``outputs``, ``require``, ``tensors``, ``bitwise``,
    ``accumulation``, ``strict``) and a new finding is stored. ``save_to``:
    a directory the finding's dumps are also written to
    (``<dir>/fuzz-in-process-seed<S>.safetensors``). Returns the report.
    Bad arguments raise ``ValueError`` / ``TypeError``; Ctrl-C inside
    ``fn`` raises ``KeyboardInterrupt``."""
    __tracebackhide__ = True  # pytest: show the caller's line
    for key in ("budget", "seed"):
        if _SETTINGS[key] is not None:
            kwargs[key] = _SETTINGS[key]
    kernel = _name(fn)
    slot = _test_slot(kernel)
    if slot is not None:
        replay_kwargs = {k: kwargs[k] for k in _REPLAY_KEYWORDS if k in kwargs}
        for path in _stored(slot):
            try:
                again = fuzz_replay(fn, path, **replay_kwargs)
            except ValueError as e:  # not a fuzz dump of this version: dropped
                warnings.warn(f"logprobe: dropping the stored finding {path}: {e}", stacklevel=2)
                _forget(path)
                continue
            if again is None:
                _forget(path)  # fixed: it passes now
                continue
            raise FuzzFailure(
                f"logprobe.fuzz({kernel}): the stored finding {path} FAILS again: {again.property}\n"
                f"detail: {again.detail}\nrecipe: {again.recipe}"
                f"{_replay_lines(kernel, str(path), kwargs)}",
                None, finding=again, path=str(path))
    report = fuzz(fn, **kwargs)
    if not report.ok:
        saved: List[str] = []
        if slot is not None:
            slot.mkdir(parents=True, exist_ok=True)
            saved = report.save(slot / f"{_safe(kernel)}-seed{report.seed}.safetensors")
        if save_to is not None:
            os.makedirs(save_to, exist_ok=True)
            first = report.finding.files[0] if report.finding is not None else "finding.safetensors"
            saved += report.save(os.path.join(os.fspath(save_to), first))
        lines = ("\nsaved: " + ", ".join(saved) + _replay_lines(kernel, saved[0], kwargs)) if saved else ""
        raise FuzzFailure(f"{report.summary()}{lines}\n{report}", report,
                          path=saved[0] if saved else None)
    return report
