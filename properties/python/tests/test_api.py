"""The keywords come from the name table (properties/verify/src/names.rs),
and the type stubs list exactly those."""

from __future__ import annotations

import ast
from pathlib import Path

import logprobe
import logprobe.testing

PKG = Path(logprobe.__file__).parent
OPTIONS = ["model", "rows", "strict", "dtype", "accumulation", "worst", "statistical_c", "name"]


def stub_kwonly(path: Path, fn: str):
    tree = ast.parse(path.read_text())
    f = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == fn)
    return [a.arg for a in f.args.args], [a.arg for a in f.args.kwonlyargs]


def test_keywords_are_the_table_names():
    assert logprobe.TENSOR_KEYWORDS[:2] == ("logits", "tokens")
    assert "log_probs" in logprobe.TENSOR_KEYWORDS and "temperature" in logprobe.METADATA_KEYWORDS
    assert "lse" in logprobe.TENSOR_KEYWORDS and "z_loss_coef" in logprobe.METADATA_KEYWORDS
    assert "loss" not in logprobe.TENSOR_KEYWORDS  # reserved, not built
    assert "format_version" not in logprobe.METADATA_KEYWORDS  # set by verify


def test_stubs_list_every_keyword():
    want = OPTIONS + list(logprobe.TENSOR_KEYWORDS[2:]) + list(logprobe.METADATA_KEYWORDS)
    for path, fn in [(PKG / "__init__.pyi", "verify"), (PKG / "testing.pyi", "assert_verified")]:
        positional, kwonly = stub_kwonly(path, fn)
        assert positional == ["logits", "tokens"], path
        assert kwonly == want, path


def test_docstrings():
    for f in (logprobe.verify, logprobe.verify_file, logprobe.testing.assert_verified, logprobe.Report):
        assert f.__doc__ and len(f.__doc__) > 40
    assert issubclass(logprobe.BadInputError, ValueError)
