# Type stubs of `logprobe`. The keywords of `verify` after `name` are the
# dump format's names (properties/verify/src/names.rs via
# logprobe._native.TENSOR_KEYWORDS / METADATA_KEYWORDS); tests/test_api.py
# checks that this list equals the table's.
from os import PathLike
from typing import Any, Dict, Optional, Tuple, Union

from ._compare import CompareReport as CompareReport
from ._report import Element as Element, Output as Output, Report as Report

# A torch tensor, a numpy array (ml_dtypes bfloat16 included) or any object
# with __dlpack__ on the CPU (torch CUDA tensors are copied to the host).
TensorLike = Any
MetaValue = Union[str, int, float, bool]

class BadInputError(ValueError):
    """Input that cannot be verified; the message names tensor, row and column."""

TENSOR_KEYWORDS: Tuple[str, ...]
METADATA_KEYWORDS: Tuple[str, ...]
DEFAULT_STATISTICAL_C: float
__version__: str

def verify(
    logits: TensorLike,
    tokens: Optional[TensorLike] = None,
    *,
    model: str = "lanes=8",
    rows: Union[None, str, range] = None,
    strict: bool = False,
    dtype: Union[None, str, Dict[str, str]] = None,
    accumulation: Optional[str] = None,
    worst: int = 3,
    statistical_c: Optional[float] = ...,
    name: str = "<tensors>",
    # tensors: [N] / [N, K] / [N, V], or [B, T] / [B, T, K] / [B, T, V]
    sampling_mask: Optional[TensorLike] = None,
    log_probs: Optional[TensorLike] = None,
    entropy: Optional[TensorLike] = None,
    topk_ids: Optional[TensorLike] = None,
    topk_log_probs: Optional[TensorLike] = None,
    grad_log_probs: Optional[TensorLike] = None,
    grad_entropy: Optional[TensorLike] = None,
    grad_topk_log_probs: Optional[TensorLike] = None,
    grad_logits: Optional[TensorLike] = None,
    row_mask: Optional[TensorLike] = None,
    lse: Optional[TensorLike] = None,
    z_loss: Optional[TensorLike] = None,
    # metadata
    temperature: Optional[MetaValue] = None,
    vocab_size: Optional[MetaValue] = None,
    entropy_logits: Optional[MetaValue] = None,
    ignore_index: Optional[MetaValue] = None,
    temperature_dtype: Optional[MetaValue] = None,
    cotangent_reduction: Optional[MetaValue] = None,
    topk_ids_source: Optional[MetaValue] = None,
    topk_sorted: Optional[MetaValue] = None,
    chunk_size: Optional[MetaValue] = None,
    z_loss_coef: Optional[MetaValue] = None,
) -> Report:
    """Judges a kernel's outputs against the exact oracle and derived error
    bounds, as `logprobe verify` judges a dump holding the same tensors.

    - `logits`: `[N, V]` or `[B, T, V]`, f64 / f32 / bf16 / f16.
    - `model`: summation model of the bound: `lanes=8`, `lanes=K`, `tree`, `sequential`.
    - `rows`: `None` (all), `"a..b"`, `"a.."`, `"sample:K"` or a `range`.
    - `strict`: a `suspect` verdict is not `ok`.
    - `dtype`: `"bfloat16"` / `"float16"` for uint16 arrays holding those bits
      (every float tensor), or `{name: dtype}`.
    - `accumulation`: accumulation dtype of the kernel (`f32` default, `f64` for f64 logits).
    - `worst`: worst elements kept per output.
    - `statistical_c`: the SUSPECT tier's constant (`None`: no tier).
    - `name`: what the report's table calls these tensors.

    Raises `BadInputError` (a `ValueError`) naming tensor, row and column;
    `TypeError` for an unknown keyword or a value of the wrong kind.
    """

def verify_file(
    path: Union[str, "PathLike[str]"],
    *,
    model: str = "lanes=8",
    rows: Union[None, str, range] = None,
    strict: bool = False,
    accumulation: Optional[str] = None,
    worst: int = 3,
    statistical_c: Optional[float] = ...,
) -> Report:
    """Judges a dump file as `logprobe verify FILE` does."""

def compare(
    a: Dict[str, Any],
    b: Dict[str, Any],
    *,
    clip: float = 0.2,
    kl: bool = True,
    model: str = "lanes=8",
    accumulation: Optional[str] = None,
    rows: Union[None, str, range] = None,
    worst: int = 5,
    dtype_a: Union[None, str, Dict[str, str]] = None,
    dtype_b: Union[None, str, Dict[str, str]] = None,
    name_a: str = "<A>",
    name_b: str = "<B>",
) -> CompareReport: ...
