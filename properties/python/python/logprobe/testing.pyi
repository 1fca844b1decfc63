from typing import Any, Dict, Optional, Union

from . import MetaValue, Report, TensorLike

def assert_verified(
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
    """`logprobe.verify(...)`, raising `AssertionError` (summary, the CLI's
    table and the worst rows) unless the report is `ok`."""
