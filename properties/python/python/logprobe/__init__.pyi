# Type stubs of `logprobe`. The keywords of `verify` after `name` are the
# dump format's names (properties/verify/src/names.rs via
# logprobe._native.TENSOR_KEYWORDS / METADATA_KEYWORDS); tests/test_api.py
# checks that this list equals the table's.
from datetime import timedelta
from os import PathLike
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple, Union

from ._compare import CompareReport as CompareReport
from ._fuzz import FuzzFinding as FuzzFinding, FuzzReport as FuzzReport
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
    """Judges a kernel's outputs against the exact oracle and derived error
    bounds, as `logprobe verify` judges a dump holding the same tensors.

    - `logits`: `[N, V]` or `[B, T, V]`, f64 / f32 / bf16 / f16.
    - or, for a fused linear + loss kernel (Liger, Cut Cross-Entropy), no
      `logits` but `hidden` `[N, H]`, `lm_head_weight` `[V, H]` and
      `lm_head_bias` `[V]`: the logits are their exact dot products, and
      `lm_head_logits_dtype` says whether the kernel rounds them to the
      matmul's dtype (`"input"`, default) or keeps them in f32
      (`"accumulation"`); docs/dump-from-pytorch.md, "Fused linear + loss".
      `grad_hidden`, `grad_lm_head_weight`, `grad_lm_head_bias` (with a
      cotangent such as `grad_loss`) are the LM head's gradients.
    - `model`: summation model of the bound: `lanes=8`, `lanes=K`, `tree`, `sequential`.
    - `rows`: `None` (all), `"a..b"`, `"a.."`, `"sample:K"` or a `range`.
    - `strict`: a `suspect` verdict is not `ok`.
    - `dtype`: `"bfloat16"` / `"float16"` for uint16 arrays holding those bits
      (every float tensor), or `{name: dtype}`.
    - `accumulation`: accumulation dtype of the kernel (`f32` default, `f64` for f64 logits).
    - `form`: how the kernel forms the shifted logits (`verify --form`):
      `"any"` (default: every form correct for the output, raw
      `x.gather(t) - logsumexp(x)` and `log_softmax(x.float() / T)`
      included), `"subtract-then-scale"`, `"scale-then-subtract"`, `"raw"`.
    - `k3_form`: how it evaluates `kl_k3` (`verify --k3-form`): `"any"`
      (default, also the naive `exp(-d) + d - 1`) or `"expm1"`.
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
    form: str = "any",
    k3_form: str = "any",
    worst: int = 3,
    statistical_c: Optional[float] = ...,
) -> Report:
    """Judges a dump file as `logprobe verify FILE` does."""

def verify_files(
    paths: Sequence[Union[str, "PathLike[str]"]],
    *,
    model: str = "lanes=8",
    rows: Union[None, str, range] = None,
    strict: bool = False,
    accumulation: Optional[str] = None,
    form: str = "any",
    k3_form: str = "any",
    worst: int = 3,
    statistical_c: Optional[float] = ...,
) -> List[Report]:
    """Judges dump files as `logprobe verify FILE...` does: one report per
    file, the files of one tensor-parallel set (`tp_rank`, `tp_size`,
    `tp_vocab_start`) judged as the one dump they split."""

def save_weights(
    path: Union[str, "PathLike[str]"],
    lm_head_weight: Any,
    lm_head_bias: Any = None,
    *,
    dtype: Union[None, str, Dict[str, str]] = None,
) -> Dict[str, str]:
    """Writes the LM head as a weights file that fused linear + loss dumps
    name (`lm_head_weight_file`); returns that key and
    `lm_head_weight_sha256` for their metadata."""

def generate_weights(
    shape: Any,
    *,
    seed: int,
    scale: float,
    distribution: str = "normal",
    dtype: str = "bfloat16",
    tensors: str = "torch",
) -> Tuple[Any, Dict[str, str]]:
    """Generates `lm_head_weight [V, H]` from a seed, the same bytes on
    every machine; returns it and the metadata a dump gives instead of the
    tensor (docs/dump-from-pytorch.md, "Generated weights")."""

def save_dump(
    path: Union[str, "PathLike[str]"],
    logits: Any,
    tokens: Any = None,
    *,
    dtype: Union[None, str, Dict[str, str]] = None,
    **names: Any,
) -> str:
    """Writes `verify`'s tensors and metadata as a dump file that
    `logprobe verify PATH` judges as `verify` judged them; returns the path."""

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

# A kernel under protocol v1, in-process: fn(inputs, meta) -> outputs.
# inputs: tensor name -> torch tensor (numpy array with tensors="numpy" or
# without torch): logits [N, V_total], tokens [N], sampling_mask [N, V_total],
# topk_ids [N, K], grad_log_probs [N], grad_entropy [N], grad_topk_log_probs
# [N, K] (those the case uses). meta: metadata key -> str (outputs,
# temperature, temperature_dtype, vocab_size, ignore_index, entropy_logits,
# chunk_size, logits_dtype). outputs: every name of meta["outputs"] ->
# a float tensor: log_probs [N], entropy [N], topk_log_probs [N, K],
# grad_logits [N, V_total] (docs/fuzz-protocol.md).
Kernel = Callable[[Dict[str, Any], Dict[str, str]], Mapping[str, Any]]
Duration = Union[str, float, int, timedelta]

#: Every output of the fuzz protocol, in request order.
OUTPUTS: Tuple[str, ...]

def fuzz(
    fn: Kernel,
    *,
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
    """Property-tests `fn` in this process with the engine of `logprobe fuzz
    --exec` (docs/fuzz-protocol.md): the gate's recipes, judged against the
    exact oracle by the verify engine (foreign-kernel model), then the
    metamorphic variants (padding, chunk size, batch), each by calling `fn`
    again. A finding is shrunk by calling `fn` again and returned with its
    dump (`report.save(path)`; `logprobe verify` replays it).

    - `budget`: wall-clock limit of the search ("30s", "2m", seconds, a
      timedelta): no call of `fn` starts after it (one under way runs to
      its end: in-process calls cannot be cut); `cases`: case limit
      (whichever comes first).
    - `dtypes`: logit dtypes drawn (float64, float32, bfloat16, float16;
      None: all). `vocab`: vocabulary sizes `V` (an int, "lo..hi", a range,
      "real" for the real models' sizes, or a list of them; None: 1..8192
      and the real sizes).
    - `outputs`: what `fn` computes; the others are never asked for.
    - `options`: pins of the search space in `logprobe fuzz --options`'
      grammar (docs/fuzz.md: "key=alt|alt,key=..."), or a dict key -> value
      or list of alternatives; a finding's `recipe` pins its whole case.
    - `seed`: seed of the case stream (None: from the clock; in the report).
    - `require`: invariances whose lack is a finding (`--require`'s names:
      padding-invariant, chunk-invariant, batch-invariant; "none" or ()
      for nothing). A lack not required is reported in `report.lacks`.
    - `shrink_budget`: wall-clock limit of the shrink (as `budget`).
    - `tensors`: "auto" (torch tensors when torch imports, else numpy),
      "torch" or "numpy" (bf16 logits then arrive as exact float32 values;
      meta["logits_dtype"] says "bf16").
    - `progress`: a progress bar on stderr.
    - `bitwise`: the invariances compare every bit (`--bitwise`); by
      default `0` and `-0` are the same value. NaNs compare by bits.
    - `accumulation`: the dtype `fn` accumulates in (float64, float32,
      bfloat16, float16, or the short names; `--accumulation`): its bound
      is that of a kernel computing in it, as `logprobe verify
      --accumulation` judges; None: float64 for float64 logits, float32
      otherwise. A bf16 kernel that computes in bf16 says "bfloat16".
    - `strict`: a SUSPECT verdict (within the sound bound, beyond the
      statistical threshold) is a finding of property `statistical`, as
      `logprobe verify --strict` fails it (`--strict`); by default it is
      counted in the report, not a finding.

    An exception raised inside `fn` is a finding of property `command`,
    with its traceback in `finding.detail`. KeyboardInterrupt stops the
    search and propagates. Calls have no timeout (a call cannot be
    preempted in-process). Raises `ValueError` for a bad option, require,
    output or duration; `TypeError` for a value of the wrong kind.
    """

#: The outputs `fuzz_linear` asks of `fn` by default (docs/fuzz-protocol.md,
#: "Version 2"): log_probs and the three gradients of the LM head.
LINEAR_OUTPUTS: Tuple[str, ...]

def fuzz_linear(
    fn: Callable[..., Any],
    *,
    budget: Duration = "30s",
    cases: Optional[int] = None,
    dtypes: Union[str, Sequence[str], None] = ("float32", "bfloat16"),
    outputs: Union[str, Sequence[str]] = LINEAR_OUTPUTS,
    options: Union[str, Mapping[str, Any]] = "",
    seed: Optional[int] = None,
    shrink_budget: Duration = "30s",
    lm_head_logits_dtype: str = "input",
    progress: bool = False,
) -> FuzzReport:
    """Property-tests a fused linear + cross-entropy kernel in this process
    with the engine of `logprobe fuzz --fused-linear --exec` (fuzz protocol
    version 2): cases of the fused linear space (docs/fuzz.md, "Fused linear
    + cross-entropy kernels": N, H, V, bf16 / f32, bias, weight scale,
    temperature, softcap, ignored rows), judged by the verify engine against
    the exact oracle (TOLERANCE.md (T29), (T30), foreign-kernel model).

    `fn(hidden, lm_head_weight, targets, *, lm_head_bias, temperature,
    softcap, ignore_index)` takes torch tensors (`hidden [N, H]` and
    `lm_head_weight [V, H]` in bf16 or f32, `targets [N]` int64,
    `lm_head_bias [V]` or None; `softcap` None or a float applied as
    `softcap * tanh(x / softcap)` to the raw logits before the temperature)
    and returns the per-row log-probs `[N]` (nats; any value on ignored
    rows), or a dict with `log_probs` and optionally `entropy` and `lse`.
    The gradients asked for (`grad_hidden`, `grad_lm_head_weight`,
    `grad_lm_head_bias`) are taken by torch's autograd of
    `sum(grad_log_probs * log_probs)` over the rows not ignored, so `fn`
    must be differentiable (a custom `torch.autograd.Function` such as
    Liger's is what is tested). A kernel returning a per-token loss is
    wrapped as `lambda *a, **k: -fn(*a, **k)`.

    - `outputs`: what is asked of `fn` (a subset of `log_probs`, `entropy`,
      `lse`, `grad_hidden`, `grad_lm_head_weight`, `grad_lm_head_bias`).
    - `dtypes`: float32, bfloat16 (None: both).
    - `options`: pins of the fused linear space (`hidden=256..512`,
      `softcap=30`, ...; a finding's `recipe` pins its whole case).
    - `lm_head_logits_dtype`: "input" (logits and their gradient kept in
      the inputs' dtype, as Liger does; the looser bound) or "accumulation"
      (f32, as Cut Cross-Entropy does).
    - `budget`, `cases`, `seed`, `shrink_budget`, `progress`: as `fuzz`.

    Returns a `FuzzReport` (`finding`, `save(path)`, `summary()`); cases
    verify cannot bound are counted in `nothing_to_check`. An exception in
    `fn` is a finding of property `command`. Raises `ImportError` without
    torch, `ValueError` for a bad option or output, `TypeError` for a value
    of the wrong kind.
    """

def fuzz_replay(
    fn: Kernel,
    path: Union[str, "PathLike[str]"],
    *,
    outputs: Union[str, Sequence[str]] = OUTPUTS,
    require: Union[str, Sequence[str]] = ("padding-invariant",),
    tensors: str = "auto",
    bitwise: bool = False,
    accumulation: Optional[str] = None,
    strict: bool = False,
) -> Optional[FuzzFinding]:
    """Reruns the case of a fuzz dump (`report.save(path)`, or a dump of
    `logprobe fuzz --exec`) on `fn`, with the dump's property required when
    it is an invariance, as `logprobe fuzz --replay`: None when it passes
    now, else the finding. `outputs`, `require`, `tensors`, `bitwise`,
    `accumulation`, `strict`: as `fuzz` (give the run's `outputs`,
    `accumulation` and `strict`: a `statistical` finding replays only under
    `strict=True`). Raises `ValueError` for a file that is not a fuzz
    dump."""
