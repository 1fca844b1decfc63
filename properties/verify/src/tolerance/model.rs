//! Error models: a kernel's declared [`Algorithm`] plus what the bounds
//! need besides it (the entropy's evaluation form), the presets `verify`
//! uses for foreign kernels, and the per-row context ([`RowContext`]).

use logprobe_reference::oracle::RowStats;
use logprobe_reference::spec::{
    Algorithm, Dtype, Element, Problem, Shift, SoftcapDtype, SpecError, Summation, TemperatureDtype,
};
use logprobe_reference::with_logits;

use super::bounds::RowBounds;

/// How a kernel evaluates the entropy: part of the spec's algorithm
/// vocabulary (a kernel declares it), re-exported here.
pub use logprobe_reference::spec::EntropyForm;

/// The summation order of a model: a preset for foreign kernels
/// (docs/design.md, "Declared algorithms"; `verify` cannot know a foreign kernel's order),
/// or a kernel's own declaration.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Order {
    /// Pairwise (tree) summation with leaf 1: `h = 1`, `L = ceil(log2 V)`.
    Tree,
    /// `k` lanes each summed in order, then merged pairwise:
    /// `h = ceil(V / k)`, `L = ceil(log2 k)` (PyTorch's CPU reductions: `k = 8`).
    Lanes(usize),
    /// One accumulator in order: `h = V`, `L = 0`; sound for any order.
    Sequential,
    /// A kernel's declared summation for this call's `V` (used as is).
    Declared(Summation),
}

impl Order {
    /// `verify`'s default for a foreign kernel: 8 lanes.
    pub const DEFAULT: Order = Order::Lanes(8);

    /// The reference orders whose tightest satisfied one `verify` reports,
    /// tightest first.
    pub const REFERENCE: [Order; 3] = [Order::Tree, Order::Lanes(8), Order::Sequential];

    /// The summation model over `n` terms.
    pub fn summation(self, n: usize) -> Summation {
        match self {
            Order::Tree => Summation::tree(n, 1),
            Order::Lanes(k) => Summation::lanes(n, k),
            Order::Sequential => Summation::sequential(n),
            Order::Declared(s) => s,
        }
    }
}

impl std::fmt::Display for Order {
    /// `tree`, `lanes=K`, `sequential`, `declared(h=.., L=..)`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Order::Tree => f.write_str("tree"),
            Order::Lanes(k) => write!(f, "lanes={k}"),
            Order::Sequential => f.write_str("sequential"),
            Order::Declared(s) => write!(f, "declared(h={}, L={})", s.leaf, s.merges),
        }
    }
}

impl std::str::FromStr for Order {
    type Err = String;
    /// Parses a foreign-kernel preset: `tree`, `sequential`, `lanes` (= 8)
    /// or `lanes=K` (`K >= 1`). A declared order is not parsed.
    fn from_str(s: &str) -> Result<Self, String> {
        match s.trim() {
            "tree" => Ok(Order::Tree),
            "sequential" => Ok(Order::Sequential),
            "lanes" => Ok(Order::Lanes(8)),
            other => match other.strip_prefix("lanes=").map(|k| k.parse::<usize>()) {
                Some(Ok(k)) if k >= 1 => Ok(Order::Lanes(k)),
                _ => Err(format!(
                    "unknown model `{other}`: expected tree, sequential, lanes or lanes=K (K >= 1)"
                )),
            },
        }
    }
}

/// An error model: everything the bounds depend on besides the row.
///
/// Fields mirror [`Algorithm`] (accumulation dtype with unit roundoff `u`,
/// `exp` / `ln` errors in ulps of the accumulation dtype, rescaling exps,
/// shift) with the summation given as an [`Order`] resolved per row, plus
/// the entropy's [`EntropyForm`].
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Model {
    /// Summation order (resolved against the row's `V`).
    pub order: Order,
    /// Accumulation dtype (unit roundoff `u`).
    pub accumulation: Dtype,
    /// Max error of `exp` in ulps of the accumulation dtype at the exact value.
    pub exp_ulps: f64,
    /// Max error of `ln` / `ln_1p` in ulps of the accumulation dtype.
    pub log_ulps: f64,
    /// Rescaling exps (and their multiplications) on any term's path to the
    /// root: 0 for two-pass kernels.
    pub rescaling_exps: usize,
    /// How the logits are shifted and scaled.
    pub shift: Shift,
    /// How the entropy is evaluated.
    pub entropy_form: EntropyForm,
    /// Max error of `tanh` in ulps of the accumulation dtype at its result
    /// (the softcap, T18; used only under `softcap_dtype = accumulation`).
    pub tanh_ulps: f64,
    /// How `kl_k3` is evaluated (T20).
    pub k3_form: K3Form,
    /// Summation order of the loss's plain sums (T17): a row's smoothing
    /// sum of log-probs over its `V` terms, the reduction of `sum` /
    /// `mean` over the `N` row terms and the `mean`'s weighted divisor.
    /// A preset sums them as it sums the row ([`Model::order`]); a kernel
    /// declares its own (`logprobe_kernels::Kernel::loss_summation`).
    pub loss_order: Order,
}

/// How a kernel evaluates `kl_k3 = e^{-d} + d - 1` (T20).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum K3Form {
    /// `fl(expm1(-d) + d)`, no cancellation near 0 (this workspace's
    /// kernels: `logprobe_kernels::policy`).
    Expm1,
    /// Unknown: also the naive `fl(fl(fl(exp(-d)) + d) - 1)` (verl's
    /// `exp(kl) - kl - 1`), which cancels near 0; the bound is the larger
    /// of the two (foreign-kernel presets).
    Any,
}

impl K3Form {
    /// `expm1` or `any` (`verify --k3-form`).
    pub const fn name(self) -> &'static str {
        match self {
            K3Form::Expm1 => "expm1",
            K3Form::Any => "any",
        }
    }
}

impl std::str::FromStr for K3Form {
    type Err = String;
    /// Parses [`K3Form::name`].
    fn from_str(s: &str) -> Result<K3Form, String> {
        [K3Form::Expm1, K3Form::Any]
            .into_iter()
            .find(|f| f.name() == s.trim())
            .ok_or_else(|| format!("unknown k3 form `{s}`: expected expm1 or any"))
    }
}

impl Model {
    /// Foreign-kernel preset: `k` lanes summed in order (`h = ceil(V / k)`,
    /// `L = ceil(log2 k)`), f32 accumulation, `exp`, `ln` and `tanh` within 1 ulp,
    /// two-pass (`rescaling_exps = 0`), any correct form of the shift
    /// ([`Shift::Any`], T2a: raw and scale-first kernels pass at any
    /// `|z|`), entropy form unknown. `verify`'s default is `lanes(8)`.
    pub fn lanes(k: usize) -> Model {
        Model {
            order: Order::Lanes(k.max(1)),
            accumulation: Dtype::F32,
            exp_ulps: 1.0,
            log_ulps: 1.0,
            rescaling_exps: 0,
            shift: Shift::Any,
            entropy_form: EntropyForm::Any,
            tanh_ulps: 1.0,
            k3_form: K3Form::Any,
            loss_order: Order::Lanes(k.max(1)),
        }
    }

    /// Foreign-kernel preset: pairwise summation with leaf 1, otherwise as
    /// [`Model::lanes`].
    pub fn tree() -> Model {
        Model::preset(Order::Tree)
    }

    /// Foreign-kernel preset: one accumulator (`h = V`), sound for any
    /// summation order; otherwise as [`Model::lanes`].
    pub fn sequential() -> Model {
        Model::preset(Order::Sequential)
    }

    /// A kernel's own declaration for one call (its summation is used as
    /// declared; the entropy form defaults to [`EntropyForm::Any`], the
    /// loss's sums to [`Order::Sequential`], sound for any order: see
    /// [`Model::with_loss_order`]).
    pub fn declared(algorithm: &Algorithm) -> Model {
        Model {
            order: Order::Declared(algorithm.summation),
            accumulation: algorithm.accumulation,
            exp_ulps: algorithm.exp_ulps,
            log_ulps: algorithm.log_ulps,
            rescaling_exps: algorithm.rescaling_exps,
            shift: algorithm.shift,
            entropy_form: EntropyForm::Any,
            tanh_ulps: algorithm.tanh_ulps,
            k3_form: K3Form::Expm1,
            loss_order: Order::Sequential,
        }
    }

    /// The same model with the loss's sums in `loss_order` (T17).
    pub fn with_loss_order(self, loss_order: Order) -> Model {
        Model { loss_order, ..self }
    }

    /// The same model with another accumulation dtype (the `exp` / `ln`
    /// ulps stay counted in ulps of the new dtype).
    pub fn with_accumulation(self, accumulation: Dtype) -> Model {
        Model {
            accumulation,
            ..self
        }
    }

    /// The same model with a declared form of the shift (T2, T2a).
    pub fn with_shift(self, shift: Shift) -> Model {
        Model { shift, ..self }
    }

    /// The same model with a declared `kl_k3` form (T20).
    pub fn with_k3_form(self, k3_form: K3Form) -> Model {
        Model { k3_form, ..self }
    }

    /// The same model with a known entropy form.
    pub fn with_entropy_form(self, entropy_form: EntropyForm) -> Model {
        Model {
            entropy_form,
            ..self
        }
    }

    /// The [`Algorithm`] this model stands for over `vocab_size` terms.
    pub fn algorithm(&self, vocab_size: usize) -> Algorithm {
        Algorithm {
            accumulation: self.accumulation,
            exp_ulps: self.exp_ulps,
            log_ulps: self.log_ulps,
            summation: self.order.summation(vocab_size),
            rescaling_exps: self.rescaling_exps,
            shift: self.shift,
            tanh_ulps: self.tanh_ulps,
        }
    }

    /// A short name for reports: `tree`, `lanes=8`, `sequential`,
    /// `declared(h=.., L=..)` (the order's [`Display`](std::fmt::Display)).
    pub fn name(&self) -> String {
        self.order.to_string()
    }

    /// The foreign-kernel preset of `order` (as [`Model::lanes`] otherwise;
    /// `Lanes(0)` is taken as `Lanes(1)`, a declared order as declared):
    /// the loss's sums in the same order.
    pub fn preset(order: Order) -> Model {
        match order {
            Order::Lanes(k) => Model::lanes(k),
            order => Model {
                order,
                loss_order: order,
                ..Model::lanes(8)
            },
        }
    }

    /// The bounds of one row under this model (see [`RowBounds::new`]).
    pub fn row_bounds<'a>(&self, stats: &'a RowStats, ctx: &RowContext) -> RowBounds<'a> {
        RowBounds::new(self, stats, ctx)
    }
}

/// `verify`'s presets for a foreign kernel, tightest first: `tree`,
/// `lanes=8`, `sequential`, all accumulating in `accumulation`, any
/// correct form of the shift ([`Shift::Any`]).
pub fn foreign_presets(accumulation: Dtype) -> [Model; 3] {
    Order::REFERENCE.map(|o| Model::preset(o).with_accumulation(accumulation))
}

/// [`foreign_presets`] under a declared form of the shift (T2, T2a).
pub fn foreign_presets_with(accumulation: Dtype, shift: Shift) -> [Model; 3] {
    foreign_presets(accumulation).map(|m| m.with_shift(shift))
}

/// The first model of `models` (given tightest first, as
/// [`foreign_presets`]) that `satisfied` accepts: the tightest summation
/// model a candidate satisfies, or `None` when it satisfies none.
pub fn tightest(models: &[Model], mut satisfied: impl FnMut(&Model) -> bool) -> Option<&Model> {
    models.iter().find(|m| satisfied(m))
}

/// What a row's bounds need besides its statistics.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RowContext {
    /// The temperature `T` the kernel divides by, as it uses it (rounded to
    /// the accumulation dtype). Scales the gradient (`/ T`); when `T` is not
    /// a power of two its division costs `gamma_2` relative.
    pub temperature: f64,
    /// An upper bound of `|max z|` over the row (`z = x / T`, the larger of
    /// the unmasked and the allowed maximum): the magnitude that
    /// scale-then-subtract and raw kernels lose digits to. Unused by
    /// subtract-then-scale bounds (they are offset-invariant).
    pub z_max_abs: f64,
    /// The softcap, when the problem has one (T18).
    pub softcap: Option<SoftcapContext>,
    /// The matmul stage of a fused linear + loss kernel, when the logits
    /// are `hidden . lm_head_weight^T` (T29).
    pub linear: Option<LinearContext>,
}

/// A fused linear + loss kernel's matmul stage as the bounds see it (T29).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LinearContext {
    /// The row's statistics of the exact logits (`H`, `max_j A_j`,
    /// `max_j |x_j|`, the oracle's enclosure error).
    pub stats: logprobe_reference::oracle::linear::LinearRowStats,
    /// `Some(d)`: the kernel rounds its logits to `d` (PyTorch's bf16
    /// matmul returns bf16) before the loss; `None`: it keeps them in the
    /// accumulation dtype (Cut Cross-Entropy).
    pub logits_dtype: Option<Dtype>,
}

/// The softcap `x' = c tanh(x / c)` as the bounds see it (T18).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SoftcapContext {
    /// `c` as the computation takes it (rounded to the accumulation dtype).
    pub c: f64,
    /// `true` for `softcap_dtype = accumulation`: the kernel computes `x'`
    /// itself and its error (`x / c`, `tanh`, `* c`) perturbs every `z`;
    /// `false` for `input`: `x'` is an exact input and only the gradient
    /// factor `1 - t^2`'s roundings count.
    pub computed: bool,
}

impl RowContext {
    /// The context of row `row` of `problem`: its effective temperature and
    /// `|max z|` (over the real vocabulary, unmasked and allowed entries).
    ///
    /// # Errors
    /// [`Problem::validate_shapes`]'s errors; [`SpecError::NoFiniteLogit`]
    /// when the row has no finite logit.
    ///
    /// # Panics
    /// Never for `row < N` (an out-of-range row is the caller's bug and
    /// panics as an index would).
    pub fn from_problem(problem: &Problem<'_>, row: usize) -> Result<RowContext, SpecError> {
        let shape = problem.validate_shapes()?;
        let t = shape.temperature;
        let (mut max_all, mut max_allowed) = (f64::NEG_INFINITY, f64::NEG_INFINITY);
        let masked = problem.sampling_mask.is_some();
        with_logits!(problem.logits, lv => {
            let r = lv.row(row);
            match (masked, r.as_slice()) {
                // Unmasked and contiguous: a branch-free max that vectorises.
                (false, Some(xs)) => {
                    for x in &xs[..shape.vocab_size.min(xs.len())] {
                        let x = x.to_f64();
                        max_all = if x.is_finite() { max_all.max(x) } else { max_all };
                    }
                }
                _ => {
                    for (j, x) in r.iter().take(shape.vocab_size).enumerate() {
                        let x = x.to_f64();
                        if x.is_finite() {
                            max_all = max_all.max(x);
                            if masked && problem.allowed(row, j) {
                                max_allowed = max_allowed.max(x);
                            }
                        }
                    }
                }
            }
        });
        if !masked {
            // Every entry is allowed.
            max_allowed = max_all;
        }
        if max_all == f64::NEG_INFINITY && problem.options.softcap.is_none() {
            return Err(SpecError::NoFiniteLogit {
                tensor: "logits",
                row,
                which: "any",
            });
        }
        let x_abs = max_all.abs().max(if max_allowed.is_finite() {
            max_allowed.abs()
        } else {
            0.0
        });
        let acc = shape.dtype.accumulation();
        let softcap = problem
            .options
            .effective_softcap(acc)?
            .map(|c| SoftcapContext {
                c,
                computed: problem.options.softcap_dtype == SoftcapDtype::Accumulation,
            });
        // |x'| <= min(|x|, c): the computed x' within 16 u of c (T18's
        // error is below 4 c u for tanh within a few ulps), the materialised
        // one within a rounding of the input dtype.
        let x_abs = match softcap {
            Some(s) => {
                x_abs.min(s.c)
                    * (1.0 + 16.0 * acc.unit_roundoff() + 2.0 * shape.dtype.unit_roundoff())
            }
            None => x_abs,
        };
        // |x / T| rounded up; materialised z adds one rounding of the input dtype.
        let mut z = x_abs / t * (1.0 + 4.0 * f64::EPSILON);
        if problem.options.temperature_dtype == TemperatureDtype::Input {
            z *= 1.0 + 2.0 * shape.dtype.unit_roundoff();
        }
        Ok(RowContext {
            temperature: t,
            z_max_abs: z,
            softcap,
            linear: None,
        })
    }

    /// This context for logits made by a fused linear kernel's matmul
    /// (T29): `linear` set, and `Z` widened by the sound `delta_x / T` of
    /// a kernel accumulating in `acc` (its `x^` may exceed the exact
    /// logits' magnitude by that much).
    pub fn with_linear(mut self, linear: LinearContext, acc: Dtype) -> RowContext {
        let model = Model::sequential().with_accumulation(acc);
        let dx = super::bounds::linear::linear_x(&model, &linear, None).0;
        self.z_max_abs += dx / self.temperature * (1.0 + 4.0 * f64::EPSILON);
        self.linear = Some(linear);
        self
    }
}
