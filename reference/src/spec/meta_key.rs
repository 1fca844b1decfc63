//! The names of a dump's `__metadata__` keys (docs/dump-from-pytorch.md):
//! the one spelling of each. logprobe-verify's key table (`keys.rs`, typed
//! parse and write, version, doc line) is built from these; the spec's own
//! errors and Debug output, the kernels' refusals and the fuzz grammar name
//! keys through them too.

/// `temperature` (default 1): `z = logits / T`.
pub const TEMPERATURE: &str = "temperature";
/// `vocab_size` (default `V_total`): the real columns.
pub const VOCAB_SIZE: &str = "vocab_size";
/// `entropy_logits` (default `unmasked`).
pub const ENTROPY_LOGITS: &str = "entropy_logits";
/// `ignore_index` (default -100).
pub const IGNORE_INDEX: &str = "ignore_index";
/// `temperature_dtype` (default `accumulation`).
pub const TEMPERATURE_DTYPE: &str = "temperature_dtype";
/// `format_version` (default 1).
pub const FORMAT_VERSION: &str = "format_version";
/// `cotangent_reduction` (default `none`).
pub const COTANGENT_REDUCTION: &str = "cotangent_reduction";
/// `topk_ids_source` (default `given`).
pub const TOPK_IDS_SOURCE: &str = "topk_ids_source";
/// `topk_sorted` (default false; only with `topk_ids_source=kernel`).
pub const TOPK_SORTED: &str = "topk_sorted";
/// `chunk_size` (informational, >= 1).
pub const CHUNK_SIZE: &str = "chunk_size";
/// `fuzz_recipe`: a fuzz finding's recipe.
pub const FUZZ_RECIPE: &str = "fuzz_recipe";
/// `fuzz_kernel`: a fuzz finding's `--kernel`.
pub const FUZZ_KERNEL: &str = "fuzz_kernel";
/// `fuzz_property`: the property a fuzz finding fails.
pub const FUZZ_PROPERTY: &str = "fuzz_property";
/// `fuzz_seed`: the fuzz run's `--seed`.
pub const FUZZ_SEED: &str = "fuzz_seed";
/// `outputs`: a fuzz protocol request's outputs wanted.
pub const OUTPUTS: &str = "outputs";
/// `fuzz_protocol`: the fuzz protocol version.
pub const FUZZ_PROTOCOL: &str = "fuzz_protocol";
/// `fuzz_exec`: the command of an `--exec` finding.
pub const FUZZ_EXEC: &str = "fuzz_exec";
/// `z_loss_coef` (required with `z_loss`).
pub const Z_LOSS_COEF: &str = "z_loss_coef";
/// `reduction` of `loss` (default `none`).
pub const REDUCTION: &str = "reduction";
/// `label_smoothing` (default 0).
pub const LABEL_SMOOTHING: &str = "label_smoothing";
/// `mean_all_ignored` (default `nan`).
pub const MEAN_ALL_IGNORED: &str = "mean_all_ignored";
/// `softcap` (a float > 0).
pub const SOFTCAP: &str = "softcap";
/// `softcap_dtype` (default `accumulation`; only with `softcap`).
pub const SOFTCAP_DTYPE: &str = "softcap_dtype";
/// `kl_input_clamp` of `kl_k3`.
pub const KL_INPUT_CLAMP: &str = "kl_input_clamp";
/// `kl_output_clamp` of `kl_k3`.
pub const KL_OUTPUT_CLAMP: &str = "kl_output_clamp";
/// `ratio_log_clamp` of `ratio`.
pub const RATIO_LOG_CLAMP: &str = "ratio_log_clamp";
/// `z_loss_rows`: reserved, not built.
pub const Z_LOSS_ROWS: &str = "z_loss_rows";
/// `loss_normalizer`: reserved, not built.
pub const LOSS_NORMALIZER: &str = "loss_normalizer";
/// `kl_renormalized` (default false).
pub const KL_RENORMALIZED: &str = "kl_renormalized";
/// `masked_log_probs` (default `neg_inf`): how a masked id's top-k
/// log-prob is stored (`finfo_min`: clamped to `-finfo(dtype).max`).
pub const MASKED_LOG_PROBS: &str = "masked_log_probs";
/// `k3_form` (default `any`): how the kernel evaluates `kl_k3` (`expm1`:
/// `expm1(-d) + d`; `any`: the naive `exp(-d) + d - 1` too), as
/// `verify --k3-form` declares it.
pub const K3_FORM: &str = "k3_form";
/// `lm_head_logits_dtype` (default `input`): where a fused linear + loss
/// kernel keeps its logits (`input`: rounded to the matmul's dtype;
/// `accumulation`: kept in f32).
pub const LM_HEAD_LOGITS_DTYPE: &str = "lm_head_logits_dtype";
/// `tp_rank` (with `tp_size` and `tp_vocab_start`): the dump is this
/// tensor-parallel rank's part of a set, verified together with the others.
pub const TP_RANK: &str = "tp_rank";
/// `tp_size`: the ranks of a tensor-parallel set.
pub const TP_SIZE: &str = "tp_size";
/// `tp_vocab_start`: the first global vocabulary column of the rank's shard.
pub const TP_VOCAB_START: &str = "tp_vocab_start";
/// `lm_head_weight_file`: the safetensors file holding the LM head (a
/// path; relative ones from the dump's folder).
pub const LM_HEAD_WEIGHT_FILE: &str = "lm_head_weight_file";
/// `lm_head_weight_sha256`: the SHA-256 of that file's bytes, or of the
/// generated tensor's bytes.
pub const LM_HEAD_WEIGHT_SHA256: &str = "lm_head_weight_sha256";
/// `lm_head_weight_generator`: the LM head is generated, not carried
/// (`splitmix64-normal-v1` or `splitmix64-uniform-v1`).
pub const LM_HEAD_WEIGHT_GENERATOR: &str = "lm_head_weight_generator";
/// `lm_head_weight_seed`: the generator's seed (an integer `>= 0`).
pub const LM_HEAD_WEIGHT_SEED: &str = "lm_head_weight_seed";
/// `lm_head_weight_scale`: the generated weights' standard deviation
/// (normal) or half-width (uniform).
pub const LM_HEAD_WEIGHT_SCALE: &str = "lm_head_weight_scale";
/// `lm_head_weight_shape`: the generated `[V, H]`, written `V,H`.
pub const LM_HEAD_WEIGHT_SHAPE: &str = "lm_head_weight_shape";
/// `lm_head_weight_dtype`: the generated weights' dtype (`bf16`, `f16`,
/// `f32`).
pub const LM_HEAD_WEIGHT_DTYPE: &str = "lm_head_weight_dtype";
