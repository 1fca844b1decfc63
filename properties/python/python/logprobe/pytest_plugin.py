"""The pytest plugin of the logprobe package (registered through the
``pytest11`` entry point, so installing the wheel enables it; ``-p
no:logprobe`` disables it).

Options:

- ``--logprobe-budget DURATION``: the wall-clock budget of every
  ``logprobe.testing.assert_fuzz_clean`` search of the run (``30s``,
  ``10m``), overriding the tests' own: depth is scaled from the command
  line, as ``PROPTEST_CASES`` scales the Rust gate.
- ``--logprobe-seed S``: the seed of every such search (a failure prints
  the seed it used; pass it here to rerun the same cases).
- ``--logprobe-findings DIR`` (default ``fuzz-findings``, the CLI's
  ``--out``, relative to pytest's rootdir): the findings store. A finding is
  saved there and replayed first when the test runs again; one that passes
  is deleted. ``--logprobe-no-store`` turns the store off.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from . import __version__, testing


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("logprobe", "logprobe: kernel verification and fuzzing")
    group.addoption("--logprobe-budget", metavar="DURATION", default=None,
                    help="budget of every assert_fuzz_clean search (e.g. 30s, 10m); overrides the tests' own")
    group.addoption("--logprobe-seed", metavar="S", type=int, default=None,
                    help="seed of every assert_fuzz_clean search; overrides the tests' own")
    group.addoption("--logprobe-findings", metavar="DIR", default="fuzz-findings",
                    help="the findings store, replayed first on the next run (default: fuzz-findings)")
    group.addoption("--logprobe-no-store", action="store_true", default=False,
                    help="neither store nor replay findings")


def pytest_configure(config: pytest.Config) -> None:
    store = None
    if not config.getoption("logprobe_no_store"):
        store = Path(config.getoption("logprobe_findings"))
        if not store.is_absolute():
            store = Path(config.rootpath) / store
    try:
        testing.configure(budget=config.getoption("logprobe_budget"),
                          seed=config.getoption("logprobe_seed"), store=store)
    except (TypeError, ValueError) as e:
        raise pytest.UsageError(f"logprobe: {e}") from None


def pytest_unconfigure(config: pytest.Config) -> None:
    testing.configure()


def pytest_report_header(config: pytest.Config) -> str:
    s = testing.settings()
    stored = 0
    if s["store"] is not None and (s["store"] / "pytest").is_dir():
        stored = sum(1 for p in (s["store"] / "pytest").rglob("*.safetensors") if not p.stem.endswith("-variant"))
    store = "off" if s["store"] is None else f"{s['store']} ({stored} stored)"
    return (f"logprobe {__version__}: findings store {store}; fuzz budget "
            f"{s['budget'] or 'per test'}; seed {s['seed'] if s['seed'] is not None else 'per test'}")
