from os import PathLike
from typing import Any, Dict, Mapping, Optional, Sequence, Union

from . import OUTPUTS, Duration, FuzzFinding, FuzzReport, Kernel, MetaValue, Report, TensorLike

def assert_verified(
    logits: Optional[TensorLike] = None,
    tokens: Optional[TensorLike] = None,
    *,
    model: str = "lanes=8",
    rows: Union[None, str, range] = None,
    strict: bool = False,
    dtype: Union[None, str, Dict[str, str]] = None,
    accumulation: Optional[str] = None,
    form: str = "any",
    k3_form: str = "any",
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
    loss: Optional[TensorLike] = None,
    loss_weights: Optional[TensorLike] = None,
    grad_lse: Optional[TensorLike] = None,
    grad_z_loss: Optional[TensorLike] = None,
    grad_loss: Optional[TensorLike] = None,
    ref_log_probs: Optional[TensorLike] = None,
    old_log_probs: Optional[TensorLike] = None,
    kl_k1: Optional[TensorLike] = None,
    kl_k2: Optional[TensorLike] = None,
    kl_k3: Optional[TensorLike] = None,
    kl_abs: Optional[TensorLike] = None,
    ratio: Optional[TensorLike] = None,
    grad_kl_k1: Optional[TensorLike] = None,
    grad_kl_k2: Optional[TensorLike] = None,
    grad_kl_k3: Optional[TensorLike] = None,
    grad_kl_abs: Optional[TensorLike] = None,
    grad_ratio: Optional[TensorLike] = None,
    teacher_topk_log_probs: Optional[TensorLike] = None,
    forward_kl: Optional[TensorLike] = None,
    reverse_kl: Optional[TensorLike] = None,
    grad_forward_kl: Optional[TensorLike] = None,
    grad_reverse_kl: Optional[TensorLike] = None,
    token_ranks: Optional[TensorLike] = None,
    teacher_probs: Optional[TensorLike] = None,
    teacher_log_probs: Optional[TensorLike] = None,
    soft_cross_entropy: Optional[TensorLike] = None,
    grad_soft_cross_entropy: Optional[TensorLike] = None,
    hidden: Optional[TensorLike] = None,
    lm_head_weight: Optional[TensorLike] = None,
    lm_head_bias: Optional[TensorLike] = None,
    grad_hidden: Optional[TensorLike] = None,
    grad_lm_head_weight: Optional[TensorLike] = None,
    grad_lm_head_bias: Optional[TensorLike] = None,
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
    reduction: Optional[MetaValue] = None,
    label_smoothing: Optional[MetaValue] = None,
    mean_all_ignored: Optional[MetaValue] = None,
    softcap: Optional[MetaValue] = None,
    softcap_dtype: Optional[MetaValue] = None,
    kl_input_clamp: Optional[MetaValue] = None,
    kl_output_clamp: Optional[MetaValue] = None,
    ratio_log_clamp: Optional[MetaValue] = None,
    kl_renormalized: Optional[MetaValue] = None,
    masked_log_probs: Optional[MetaValue] = None,
    lm_head_logits_dtype: Optional[MetaValue] = None,
    tp_rank: Optional[MetaValue] = None,
    tp_size: Optional[MetaValue] = None,
    tp_vocab_start: Optional[MetaValue] = None,
    lm_head_weight_file: Optional[MetaValue] = None,
    lm_head_weight_sha256: Optional[MetaValue] = None,
    lm_head_weight_generator: Optional[MetaValue] = None,
    lm_head_weight_seed: Optional[MetaValue] = None,
    lm_head_weight_scale: Optional[MetaValue] = None,
    lm_head_weight_shape: Optional[MetaValue] = None,
    lm_head_weight_dtype: Optional[MetaValue] = None,
) -> Report:
    """`logprobe.verify(...)`, raising `AssertionError` (summary, the CLI's
    table and the worst rows) unless the report is `ok`."""

class FuzzFailure(AssertionError):
    """`assert_fuzz_clean` found a counterexample (`report` None when a
    stored finding failed again on replay)."""

    report: Optional[FuzzReport]
    finding: Optional[FuzzFinding]
    path: Optional[str]
    def __init__(
        self,
        message: str,
        report: Optional[FuzzReport],
        finding: Optional[FuzzFinding] = None,
        path: Optional[str] = None,
    ) -> None: ...

def configure(
    *,
    budget: Optional[Duration] = None,
    seed: Optional[int] = None,
    store: Union[None, str, "PathLike[str]"] = None,
) -> None:
    """The run's fuzz budget and seed (overriding each `assert_fuzz_clean`
    call's) and the findings store; `configure()` resets them."""

def settings() -> Dict[str, Any]:
    """`{"budget", "seed", "store"}` of the run (None where unset)."""

def assert_fuzz_clean(
    fn: Kernel,
    *,
    save_to: Union[None, str, "PathLike[str]"] = None,
    budget: Duration = "30s",
    cases: Optional[int] = None,
    dtypes: Union[str, Sequence[str], None] = ("float32", "bfloat16"),
    vocab: Union[int, str, range, Sequence[Union[int, str, range]], None] = None,
    outputs: Union[str, Sequence[str]] = OUTPUTS,
    options: Union[str, Mapping[str, Any]] = "",
    seed: Optional[int] = None,
    require: Union[str, Sequence[str]] = ("padding-invariant",),
    shrink_budget: Duration = "30s",
    tensors: str = "auto",
    progress: bool = False,
    bitwise: bool = False,
    accumulation: Optional[str] = None,
    strict: bool = False,
) -> FuzzReport:
    """`logprobe.fuzz(fn, ...)`, raising `FuzzFailure` (an `AssertionError`:
    the finding, its recipe and seed, the CLI's report) on a counterexample;
    `save_to`: a directory its dumps are written to first."""
