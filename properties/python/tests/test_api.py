"""The keywords come from the name table (properties/verify/src/names.rs),
and the type stubs list exactly those."""

from __future__ import annotations

import ast
from pathlib import Path

import logprobe
import logprobe.testing

PKG = Path(logprobe.__file__).parent
OPTIONS = ["model", "rows", "strict", "dtype", "accumulation", "form", "k3_form", "worst", "statistical_c", "name"]


def stub_kwonly(path: Path, fn: str):
    tree = ast.parse(path.read_text())
    f = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == fn)
    return [a.arg for a in f.args.args], [a.arg for a in f.args.kwonlyargs]


def test_keywords_are_the_table_names():
    assert logprobe.TENSOR_KEYWORDS[:2] == ("logits", "tokens")
    assert "log_probs" in logprobe.TENSOR_KEYWORDS and "temperature" in logprobe.METADATA_KEYWORDS
    assert "lse" in logprobe.TENSOR_KEYWORDS and "z_loss_coef" in logprobe.METADATA_KEYWORDS
    assert "loss" in logprobe.TENSOR_KEYWORDS and "reduction" in logprobe.METADATA_KEYWORDS
    assert "grad_loss" in logprobe.TENSOR_KEYWORDS and "grad_lse" in logprobe.TENSOR_KEYWORDS
    assert "loss_normalizer" not in logprobe.METADATA_KEYWORDS  # reserved, not built
    assert "format_version" not in logprobe.METADATA_KEYWORDS  # set by verify


def test_stubs_list_every_keyword():
    want = OPTIONS + list(logprobe.TENSOR_KEYWORDS[2:]) + list(logprobe.METADATA_KEYWORDS)
    for path, fn in [(PKG / "__init__.pyi", "verify"), (PKG / "testing.pyi", "assert_verified")]:
        positional, kwonly = stub_kwonly(path, fn)
        assert positional == ["logits", "tokens"], path
        assert kwonly == want, path


def test_docstrings():
    for f in (logprobe.verify, logprobe.verify_file, logprobe.testing.assert_verified, logprobe.Report,
              logprobe.FuzzReport, logprobe.testing.assert_fuzz_clean, logprobe.testing.FuzzFailure):
        assert f.__doc__ and len(f.__doc__) > 40
    assert issubclass(logprobe.BadInputError, ValueError)
    # Tracebacks name it as users import it, not the extension module.
    assert logprobe.BadInputError.__module__ == "logprobe"
    assert logprobe.BadInputError.__qualname__ == "BadInputError"


def test_fuzz_stubs_match_the_functions():
    import inspect

    sig = inspect.signature(logprobe.fuzz)
    kw = [p.name for p in sig.parameters.values() if p.kind is p.KEYWORD_ONLY]
    positional, kwonly = stub_kwonly(PKG / "__init__.pyi", "fuzz")
    assert positional == ["fn"] and kwonly == kw
    positional, kwonly = stub_kwonly(PKG / "testing.pyi", "assert_fuzz_clean")
    assert positional == ["fn"] and kwonly == ["save_to"] + kw
    positional, kwonly = stub_kwonly(PKG / "__init__.pyi", "fuzz_replay")
    assert positional == ["fn", "path"]
    assert kwonly == ["outputs", "require", "tensors", "bitwise", "accumulation", "strict"]
    assert kwonly == [p.name for p in inspect.signature(logprobe.fuzz_replay).parameters.values()
                      if p.kind is p.KEYWORD_ONLY]
    # The defaults the stubs show are the functions'.
    assert sig.parameters["require"].default == ("padding-invariant",)
    assert logprobe._native.DEFAULT_REQUIRE == "padding-invariant"
    assert sig.parameters["outputs"].default == logprobe.OUTPUTS


def test_fuzz_accumulation_names_a_dtype():
    import pytest

    with pytest.raises(ValueError, match="accumulation='f8'"):
        logprobe.fuzz(lambda inputs, meta: {}, cases=1, accumulation="f8")
    # torch's and numpy's names are the CLI's: a run with them starts.
    r = logprobe.fuzz(lambda inputs, meta: {}, cases=0, accumulation="torch.bfloat16")
    assert r.table
