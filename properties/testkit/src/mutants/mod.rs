//! Planted mutant kernels: one per bug kind that chunked / fused log-prob
//! code has shipped (docs/design.md, "Why"; property 8).
//!
//! Each mutant is one type implementing [`PlantedBug`]: it wraps a correct
//! kernel of this workspace and differs from it only where its bug is
//! triggered. The trait's default methods forward to the wrapped kernel
//! (then apply the bug's [`PlantedBug::corrupt_forward`] /
//! [`PlantedBug::corrupt_backward`], or run it with the bug's
//! [`PlantedBug::wrong_options`]), so a mutant writes only its bug. A mutant
//! that survives the default property run proves that the generators never
//! reach its trigger; a killed one proves they do. [`Mutant`] makes any of
//! them a [`Kernel`] named `mutant:NAME`; [`CATALOG`] lists them all, once.
//!
//! | name | type | wraps | trigger |
//! | --- | --- | --- | --- |
//! | `nan-on-neg-inf` | [`NanOnNegInf`] | fused | entropy rows with a `-inf` (or masked, for masked entropy) entry: `p log p = 0 * -inf` |
//! | `bf16-accumulation` | [`Bf16Accumulation`] | fused | bf16 / f16 logits: every sum accumulated in the input dtype |
//! | `dropped-chunk-remainder` | [`DroppedChunkRemainder`] | chunked | rows past the last full chunk are left 0 |
//! | `ignored-chunk-size` | [`IgnoredChunkSize`] | chunked | always one chunk of all `N` rows (same values, `N x V` memory) |
//! | `tp-vocab-offset` | [`TpVocabOffset`] | [`CpuKernel::vocab_parallel`] (two even shards, or [`Mutant::tp_vocab_offset`]'s layout) | a target owned by a shard that does not start at column 0 is gathered at its local index (the shard's vocab offset not added back) |
//! | `padded-vocab-not-truncated` | [`PaddedVocabNotTruncated`] | fused | `vocab_size < V_total`: the padding is treated as vocabulary |
//! | `temperature-ignored` | [`TemperatureIgnored`] | fused | `T != 1` |
//! | `temperature-twice` | [`TemperatureTwice`] | fused | `T != 1`: logits divided by `T` twice |
//! | `entropy-wrong-logits` | [`EntropyWrongLogits`] | fused | a sampling mask: entropy over the other set of logits |
//! | `grad-output-0-broadcast` | [`GradOutput0Broadcast`] | fused | backward with `N >= 2`: row 0's cotangents used for every row |
//! | `missing-max-shift` | [`MissingMaxShift`] | fused | rows whose unshifted `sum exp(z)` overflows or underflows f32 |
//! | `in-place-corruption` | [`InPlaceCorruption`] | fused | in-place backward over input with a bad row after a good one: earlier rows already overwritten |
//! | `raw-entropy-formula` | [`RawEntropyFormula`] | fused | every entropy computed as `lse - sum p z` on raw logits in f32 (exact enough at small offsets, digits lost at large ones) |
//! | `chunk-dependent-order` | [`ChunkDependentOrder`] | chunked | rows in odd-numbered chunks reduced in reverse column order |
//! | `label-smoothing-counts-ignored` | [`LabelSmoothingCountsIgnored`] | fused | `loss` with `label_smoothing > 0` and an ignored row: the uniform (smoothing) term summed and averaged over every row, ignored ones included (pytorch/pytorch #73205) |
//! | `chunked-mean-times-chunks` | [`ChunkedMeanTimesChunks`] | chunked | `loss` under `mean` with more than one chunk: multiplied by the chunk count (NVIDIA-NeMo/Automodel #3803) |
//! | `all-ignored-mean-nan` | [`AllIgnoredMeanNan`] | fused | `loss` under `mean` with every row ignored (or of weight 0) and `mean_all_ignored = zero`: `0 / 0 = NaN` (linkedin/Liger-Kernel #177) |
//! | `softcap-grad-missing-tanh` | [`SoftcapGradMissingTanh`] | fused | backward with a softcap: the gradient with respect to `x' = c tanh(x / c)`, without `1 - tanh^2` (unsloth-zoo PR #593's kind) |
//! | `kl-teacher-prob-as-log-prob` | [`TeacherProbAsLogProb`] | fused | `forward_kl`: the teacher's `a_k` taken as its probability instead of `e^{a_k}` (issue 18) |
//! | `kl-renormalization-skipped` | [`KlRenormalizationSkipped`] | fused | `kl_renormalized = true`: the student not renormalised over the K ids |
//! | `kl-ids-shard-local` | [`KlIdsShardLocal`] | fused | `forward_kl` / `reverse_kl` rows with an id in the vocabulary's second half: the student's log-prob gathered at the shard-local id (TP offset not added) |
//! | `kl-grad-normalizer-detached` | [`KlGradNormalizerDetached`] | fused | backward with a nonzero `grad_forward_kl` / `grad_reverse_kl` of a KL not renormalised: the KL's slopes `w_k` added at the ids only, log_softmax's `- p_j sum_k w_k` lost (the normaliser detached) |
//! | `z-loss-grad-missing-2` | [`ZLossGradMissingTwo`] | fused | backward with a nonzero `grad_z_loss` and `z_loss_coef > 0`: `d(coef lse^2)` taken as `coef lse p_j` (the factor 2 lost) |
//! | `mean-grad-over-n` | [`MeanGradOverN`] | fused | backward with `grad_loss` under `mean` and `W != N`: the gradient divided by `N` rows instead of the counted weight `W` |
//! | `smoothing-grad-on-ignored` | [`SmoothingGradOnIgnored`] | fused | backward with `grad_loss`, `label_smoothing > 0` and an ignored row: the row's smoothing term differentiated (pytorch/pytorch #73205's gradient side) |
//! | `k3-naive` | [`K3Naive`] | fused | `kl_k3` as `exp(-d) + d - 1` in the accumulation dtype: cancels near `d = 0` |
//! | `ratio-inverted` | [`RatioInverted`] | fused | `ratio = exp(old - lp)` where `lp != old` |
//! | `clamp-missing` | [`ClampMissing`] | fused | `kl_k3` / `ratio` without their declared clamps, where one binds |
//! | `k3-grad-wrong-sign` | [`K3GradWrongSign`] | fused | backward with a nonzero `grad_kl_k3`: `k3'(d)` taken as `1 - e^{d}` instead of `1 - e^{-d}` where `d` is inside the clamps and not tiny |
//! | `rank-ties-for-token` | [`RankTiesForToken`] | fused | `token_ranks` rows where another allowed entry's log-prob equals the token's: `>` instead of `>=`, the ties not counted against the token |
//! | `soft-ce-nan-on-zero-prob` | [`SoftCeNanOnZeroProb`] | fused | `soft_cross_entropy` rows with a zero teacher probability at an entry the student cannot reach (masked, or a `-inf` logit without a softcap): `0 * -inf = NaN`, unmasked |
//! | `soft-ce-grad-unit-mass` | [`SoftCeGradUnitMass`] | fused | backward with a nonzero `grad_soft_cross_entropy` on a row whose teacher's mass is not 1 (a truncated teacher): `c (q_j - p_j)`, the mass taken as 1 |
//!
//! A new mutant: one type implementing [`PlantedBug`] (overriding only
//! what its bug changes) and one [`Entry`] in [`CATALOG`].

use ndarray::Array2;

use logprobe_kernels::CpuKernel;

use logprobe_kernels::kernel::{
    Algorithm, Capabilities, CrossEntropyOutput, EntropyForm, ForwardOutput, Kernel, KernelError,
    Summation,
};
use logprobe_reference::spec::{
    Cotangents, CrossEntropy, Dtype, LogitsMut, Options, Problem, ProblemMut, Shape,
};

/// Declares a unit bug type around [`CpuKernel::fused`](logprobe_kernels::CpuKernel::fused) with its catalog name.
macro_rules! unit_bug {
    ($(#[$doc:meta])* $ty:ident, $name:literal) => {
        $(#[$doc])*
        pub struct $ty;

        impl $ty {
            /// Catalog name.
            pub const NAME: &'static str = $name;

            /// The bug around [`CpuKernel::fused`](logprobe_kernels::CpuKernel::fused) (`chunk_size` ignored).
            pub fn new(_chunk_size: usize) -> $ty {
                $ty
            }
        }
    };
}

mod backward;
mod chunks;
mod loss;
mod loss_grad;
mod options;
mod policy;
mod rank;
mod rewired;
mod soft;
mod softcap;
#[cfg(test)]
mod tests;
mod topk_kl;
mod tp;
mod values;

pub use backward::{GradOutput0Broadcast, InPlaceCorruption};
pub use chunks::{ChunkDependentOrder, DroppedChunkRemainder, IgnoredChunkSize};
pub use loss::{AllIgnoredMeanNan, ChunkedMeanTimesChunks, LabelSmoothingCountsIgnored};
pub use loss_grad::{MeanGradOverN, SmoothingGradOnIgnored, ZLossGradMissingTwo};
pub use options::{
    EntropyWrongLogits, PaddedVocabNotTruncated, TemperatureIgnored, TemperatureTwice,
};
pub use policy::{ClampMissing, K3GradWrongSign, K3Naive, RatioInverted};
pub use rank::RankTiesForToken;
pub use soft::{SoftCeGradUnitMass, SoftCeNanOnZeroProb};
pub use softcap::SoftcapGradMissingTanh;
pub use topk_kl::{
    KlGradNormalizerDetached, KlIdsShardLocal, KlRenormalizationSkipped, TeacherProbAsLogProb,
};
pub use tp::TpVocabOffset;
pub use values::{Bf16Accumulation, MissingMaxShift, NanOnNegInf, RawEntropyFormula};

/// The fused CPU kernel most bugs wrap ([`PlantedBug::inner`]).
pub(crate) static FUSED: CpuKernel = CpuKernel::fused();

/// One planted bug around a correct kernel ([`PlantedBug::inner`]). Every
/// method but `inner` defaults to the wrapped kernel's behaviour, with the
/// hooks [`PlantedBug::wrong_options`], [`PlantedBug::corrupt_forward`] and
/// [`PlantedBug::corrupt_backward`] applied; a bug overrides only what it
/// changes. Shapes, dtypes and errors as in [`Kernel`].
pub trait PlantedBug: Send + Sync {
    /// The correct kernel this bug wraps.
    fn inner(&self) -> &dyn Kernel;

    /// The rows per chunk, for bugs around a chunked kernel (appended to the
    /// kernel name as `(chunk_size=C)`).
    fn chunk_size(&self) -> Option<usize> {
        None
    }

    /// The options the bug runs the wrapped kernel with (`None`: the call's
    /// own); the real ones are validated first.
    fn wrong_options(&self, problem: &Problem<'_>) -> Option<Options> {
        let _ = problem;
        None
    }

    /// Replaces, in the correct kernel's outputs, the values the bug
    /// changes (called after a successful forward on validated shapes).
    fn corrupt_forward(
        &self,
        problem: &Problem<'_>,
        shape: &Shape,
        out: Dtype,
        fo: &mut ForwardOutput,
    ) {
        let _ = (problem, shape, out, fo);
    }

    /// Replaces, in the correct kernel's grad logits `[N, V_total]`, the
    /// entries the bug changes (called after a successful backward).
    fn corrupt_backward(
        &self,
        problem: &Problem<'_>,
        shape: &Shape,
        cotangents: &Cotangents<'_>,
        grad: &mut Array2<f64>,
    ) {
        let _ = (problem, shape, cotangents, grad);
    }

    /// Replaces, in the correct kernel's cross-entropy `loss` (`[N]` or
    /// `[1]`), the values the bug changes (called after a successful
    /// [`Kernel::cross_entropy`] on valid input).
    fn corrupt_loss(
        &self,
        problem: &Problem<'_>,
        ce: &CrossEntropy<'_>,
        lo: &mut CrossEntropyOutput,
    ) {
        let _ = (problem, ce, lo);
    }

    /// As [`Kernel::capabilities`]: the wrapped kernel's.
    fn capabilities(&self) -> Capabilities {
        self.inner().capabilities()
    }

    /// As [`Kernel::algorithm`]: the wrapped kernel's.
    fn algorithm(&self, shape: &Shape) -> Algorithm {
        self.inner().algorithm(shape)
    }

    /// As [`Kernel::entropy_form`]: the wrapped kernel's (a mutant is
    /// judged by its correct twin's model).
    fn entropy_form(&self) -> Option<EntropyForm> {
        self.inner().entropy_form()
    }

    /// As [`Kernel::workspace_bytes`]: the wrapped kernel's declaration.
    fn workspace_bytes(&self, shape: &Shape) -> usize {
        self.inner().workspace_bytes(shape)
    }

    /// As [`Kernel::loss_summation`]: the wrapped kernel's.
    fn loss_summation(&self, n: usize) -> Summation {
        self.inner().loss_summation(n)
    }

    /// As [`Kernel::forward`]: the wrapped kernel with
    /// [`PlantedBug::wrong_options`] when given, else the wrapped kernel's
    /// outputs through [`PlantedBug::corrupt_forward`].
    ///
    /// # Errors
    /// The wrapped kernel's.
    fn forward(&self, problem: &Problem<'_>, out: Dtype) -> Result<ForwardOutput, KernelError> {
        planted(
            self,
            problem,
            |k, p| k.forward(p, out),
            |fo| {
                let shape = problem.validate_shapes()?;
                self.corrupt_forward(problem, &shape, out, fo);
                Ok(())
            },
        )
    }

    /// As [`Kernel::cross_entropy`]: the wrapped kernel with
    /// [`PlantedBug::wrong_options`] when given, else the wrapped kernel's
    /// loss through [`PlantedBug::corrupt_loss`].
    ///
    /// # Errors
    /// The wrapped kernel's.
    fn cross_entropy(
        &self,
        problem: &Problem<'_>,
        ce: &CrossEntropy<'_>,
        out: Dtype,
    ) -> Result<CrossEntropyOutput, KernelError> {
        planted(
            self,
            problem,
            |k, p| k.cross_entropy(p, ce, out),
            |lo| {
                self.corrupt_loss(problem, ce, lo);
                Ok(())
            },
        )
    }

    /// As [`Kernel::backward`]: the wrapped kernel with
    /// [`PlantedBug::wrong_options`] when given, else the wrapped kernel's
    /// grad logits through [`PlantedBug::corrupt_backward`].
    ///
    /// # Errors
    /// The wrapped kernel's.
    fn backward(
        &self,
        problem: &Problem<'_>,
        cotangents: &Cotangents<'_>,
        out: Dtype,
    ) -> Result<Array2<f64>, KernelError> {
        planted(
            self,
            problem,
            |k, p| k.backward(p, cotangents, out),
            |grad| {
                let shape = problem.validate_shapes()?;
                self.corrupt_backward(problem, &shape, cotangents, grad);
                Ok(())
            },
        )
    }

    /// As [`Kernel::backward_in_place`]: the wrapped kernel's in-place
    /// backward with [`PlantedBug::wrong_options`] when given, else the
    /// bug's [`PlantedBug::backward`] written over the logits.
    ///
    /// # Errors
    /// The wrapped kernel's (the logits unchanged).
    fn backward_in_place(
        &self,
        mut problem: ProblemMut<'_>,
        cotangents: &Cotangents<'_>,
    ) -> Result<(), KernelError> {
        let wrong = with_wrong_options(self, &problem.view())?.map(|q| q.options);
        if let Some(o) = wrong {
            problem.options = o;
            return self.inner().backward_in_place(problem, cotangents);
        }
        let grad = {
            let p = problem.view();
            self.backward(&p, cotangents, p.logits.dtype())?
        };
        write_over(problem.logits, &grad);
        Ok(())
    }
}

/// The pass-through of [`PlantedBug`]'s defaults: `call` on the wrapped
/// kernel with the bug's wrong options when it has them, else `call` on the
/// call's own problem with its result through `corrupt` (the bug's hook).
fn planted<B: PlantedBug + ?Sized, R>(
    bug: &B,
    problem: &Problem<'_>,
    call: impl Fn(&dyn Kernel, &Problem<'_>) -> Result<R, KernelError>,
    corrupt: impl FnOnce(&mut R) -> Result<(), KernelError>,
) -> Result<R, KernelError> {
    if let Some(q) = with_wrong_options(bug, problem)? {
        return call(bug.inner(), &q);
    }
    let mut r = call(bug.inner(), problem)?;
    corrupt(&mut r)?;
    Ok(r)
}

/// `problem` with the bug's wrong options, validated as the correct kernel
/// would validate the real ones (`None`: the bug keeps the options).
fn with_wrong_options<'a, B: PlantedBug + ?Sized>(
    bug: &B,
    problem: &Problem<'a>,
) -> Result<Option<Problem<'a>>, KernelError> {
    let Some(o) = bug.wrong_options(problem) else {
        return Ok(None);
    };
    problem.validate_shapes()?;
    if o.temperature != problem.options.temperature {
        // The doubled or dropped temperature must not turn valid input into an error.
        o.effective_temperature(problem.logits.dtype().accumulation())?;
    }
    let mut q = *problem;
    q.options = o;
    Ok(Some(q))
}

/// Writes `grad` (exact in the logits' dtype) over `logits`.
pub(crate) fn write_over(logits: LogitsMut<'_>, grad: &Array2<f64>) {
    use logprobe_reference::spec::Element;
    match logits {
        LogitsMut::F64(mut a) => a.zip_mut_with(grad, |x, &g| *x = g),
        LogitsMut::F32(mut a) => a.zip_mut_with(grad, |x, &g| *x = f32::from_f64(g)),
        LogitsMut::Bf16(mut a) => a.zip_mut_with(grad, |x, &g| *x = half::bf16::from_f64(g)),
        LogitsMut::F16(mut a) => a.zip_mut_with(grad, |x, &g| *x = half::f16::from_f64(g)),
    }
}

/// A planted mutant as a [`Kernel`] named `mutant:NAME` (chunked ones
/// `mutant:NAME(chunk_size=C)`).
pub struct Mutant {
    name: &'static str,
    bug: Box<dyn PlantedBug>,
}

impl Mutant {
    /// The mutant `name` around its bug.
    pub fn new(name: &'static str, bug: impl PlantedBug + 'static) -> Mutant {
        Mutant {
            name,
            bug: Box::new(bug),
        }
    }

    /// The TP-vocab-offset mutant around [`CpuKernel::vocab_parallel`] over shards of
    /// these widths (summing to `V_total`, else the kernel's
    /// `SpecError::ShapeMismatch`): bit for bit the correct kernel except
    /// on rows whose target lies in a shard starting past column 0.
    pub fn tp_vocab_offset(shard_widths: Vec<usize>) -> Mutant {
        Mutant::new(TpVocabOffset::NAME, TpVocabOffset::new(Some(shard_widths)))
    }

    /// The bug's catalog name (kebab case).
    pub fn bug_name(&self) -> &'static str {
        self.name
    }
}

impl Kernel for Mutant {
    fn name(&self) -> String {
        match self.bug.chunk_size() {
            Some(c) => format!("mutant:{}(chunk_size={c})", self.name),
            None => format!("mutant:{}", self.name),
        }
    }

    fn capabilities(&self) -> Capabilities {
        self.bug.capabilities()
    }

    fn algorithm(&self, shape: &Shape) -> Algorithm {
        self.bug.algorithm(shape)
    }

    fn entropy_form(&self) -> Option<EntropyForm> {
        self.bug.entropy_form()
    }

    fn workspace_bytes(&self, shape: &Shape) -> usize {
        self.bug.workspace_bytes(shape)
    }

    fn forward(&self, problem: &Problem<'_>, out: Dtype) -> Result<ForwardOutput, KernelError> {
        self.bug.forward(problem, out)
    }

    fn backward(
        &self,
        problem: &Problem<'_>,
        cotangents: &Cotangents<'_>,
        out: Dtype,
    ) -> Result<Array2<f64>, KernelError> {
        self.bug.backward(problem, cotangents, out)
    }

    fn backward_in_place(
        &self,
        problem: ProblemMut<'_>,
        cotangents: &Cotangents<'_>,
    ) -> Result<(), KernelError> {
        self.bug.backward_in_place(problem, cotangents)
    }

    fn loss_summation(&self, n: usize) -> Summation {
        self.bug.loss_summation(n)
    }

    fn cross_entropy(
        &self,
        problem: &Problem<'_>,
        ce: &CrossEntropy<'_>,
        out: Dtype,
    ) -> Result<CrossEntropyOutput, KernelError> {
        self.bug.cross_entropy(problem, ce, out)
    }
}

/// The correct kernel a mutant wraps (its twin in reports and fuzz).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Twin {
    /// [`CpuKernel::fused`] (ignores `chunk_size`).
    Fused,
    /// [`CpuKernel::chunked`] with the mutant's `chunk_size`.
    Chunked,
    /// [`CpuKernel::vocab_parallel`] (over shard widths).
    VocabParallel,
}

impl Twin {
    /// The twin's kernel-registry name.
    pub fn name(self) -> &'static str {
        match self {
            Twin::Fused => "fused",
            Twin::Chunked => "chunked",
            Twin::VocabParallel => "vocab-parallel",
        }
    }
}

/// One mutant of the catalog: its name, twin and builders.
pub struct Entry {
    /// Kebab-case name (`--kernel mutant:NAME`).
    pub name: &'static str,
    /// The correct kernel it wraps.
    pub twin: Twin,
    /// Whether the wrapper allocates nothing `V`-sized beyond its inner
    /// kernel (it only changes options, cotangents or written rows), so the
    /// memory model holds for it.
    pub memory_model: bool,
    /// The mutant with `chunk_size` rows per chunk (ignored unless the twin
    /// is chunked; the TP mutant over two even shards of each call's
    /// `V_total`).
    pub build: fn(usize) -> Mutant,
    /// The mutant over these shard widths (vocab-parallel twins only).
    pub build_sharded: Option<fn(&[usize]) -> Mutant>,
}

impl Entry {
    /// Whether the mutant wraps a chunked kernel (and so takes a chunk size).
    pub fn is_chunked(&self) -> bool {
        self.twin == Twin::Chunked
    }
}

macro_rules! entry {
    ($ty:ident, $twin:ident, memory: $mem:expr) => {
        Entry {
            name: $ty::NAME,
            twin: Twin::$twin,
            memory_model: $mem,
            build: |c| Mutant::new($ty::NAME, $ty::new(c)),
            build_sharded: None,
        }
    };
}

/// Every planted mutant, in the module table's order: the one list the
/// kill test, the memory test, `logprobe fuzz --kernel mutant:NAME` and
/// `scripts/fuzz-mutants.sh` read.
pub static CATALOG: &[Entry] = &[
    entry!(NanOnNegInf, Fused, memory: false),
    entry!(Bf16Accumulation, Fused, memory: false),
    entry!(DroppedChunkRemainder, Chunked, memory: true),
    entry!(IgnoredChunkSize, Chunked, memory: true),
    Entry {
        name: TpVocabOffset::NAME,
        twin: Twin::VocabParallel,
        memory_model: false,
        build: |_| Mutant::new(TpVocabOffset::NAME, TpVocabOffset::new(None)),
        build_sharded: Some(|w| Mutant::tp_vocab_offset(w.to_vec())),
    },
    entry!(PaddedVocabNotTruncated, Fused, memory: true),
    entry!(TemperatureIgnored, Fused, memory: true),
    entry!(TemperatureTwice, Fused, memory: true),
    entry!(EntropyWrongLogits, Fused, memory: true),
    entry!(GradOutput0Broadcast, Fused, memory: true),
    entry!(MissingMaxShift, Fused, memory: false),
    entry!(InPlaceCorruption, Fused, memory: false),
    entry!(RawEntropyFormula, Fused, memory: false),
    entry!(ChunkDependentOrder, Chunked, memory: false),
    entry!(LabelSmoothingCountsIgnored, Fused, memory: true),
    entry!(ChunkedMeanTimesChunks, Chunked, memory: true),
    entry!(AllIgnoredMeanNan, Fused, memory: true),
    entry!(SoftcapGradMissingTanh, Fused, memory: false),
    entry!(TeacherProbAsLogProb, Fused, memory: false),
    entry!(KlRenormalizationSkipped, Fused, memory: true),
    entry!(KlIdsShardLocal, Fused, memory: false),
    entry!(KlGradNormalizerDetached, Fused, memory: false),
    entry!(ZLossGradMissingTwo, Fused, memory: false),
    entry!(MeanGradOverN, Fused, memory: false),
    entry!(SmoothingGradOnIgnored, Fused, memory: false),
    entry!(K3Naive, Fused, memory: false),
    entry!(RatioInverted, Fused, memory: false),
    entry!(ClampMissing, Fused, memory: false),
    entry!(K3GradWrongSign, Fused, memory: false),
    entry!(RankTiesForToken, Fused, memory: false),
    entry!(SoftCeNanOnZeroProb, Fused, memory: false),
    entry!(SoftCeGradUnitMass, Fused, memory: false),
];

/// The catalog entry named `name` (kebab case, without `mutant:`).
pub fn find(name: &str) -> Option<&'static Entry> {
    CATALOG.iter().find(|e| e.name == name)
}

/// The catalog's names, comma-separated (for error messages).
pub fn names() -> String {
    CATALOG
        .iter()
        .map(|e| e.name)
        .collect::<Vec<_>>()
        .join(", ")
}

/// Every mutant of the catalog, chunked ones with `chunk_size`.
pub fn catalog(chunk_size: usize) -> Vec<Mutant> {
    CATALOG.iter().map(|e| (e.build)(chunk_size)).collect()
}
