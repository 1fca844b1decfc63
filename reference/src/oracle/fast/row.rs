//! [`FastRow`]: one row prepared on the f64 tier (the exp pass of each
//! family and its bounds, module docs of [`super`], (F1)-(F6)), its
//! row-level enclosures and the forward values decided from them (F8).

use super::decide::{decide, decide_signed};
use super::pass::{a_tight, accumulate, family_bounds, Cache, Div, FamilyBounds, Sums};
use super::Mutant;
use crate::oracle::row::{self, Row, TopId};
use crate::oracle::{Exact, Interval};
use crate::spec::{Dtype, EntropyLogits, Problem, SpecError};

/// What a [`FastRow`] computes.
#[derive(Clone, Copy, Debug, Default)]
pub struct FastOptions {
    /// The entropy's logits (`None`: no entropy family, so no entropy, `R`
    /// or `q`).
    pub entropy: Option<EntropyLogits>,
    /// Keep each entry's shift and exp (`16` bytes per entry and family)
    /// for the statistics, probabilities and VJP; without it those
    /// recompute the exp of each entry they read.
    pub per_entry: bool,
    /// Also accumulate `sum E_j a_j^2` for `M2`.
    pub m2: bool,
    /// A planted bug (test-only).
    #[doc(hidden)]
    pub mutant: Option<Mutant>,
}

/// One family's pass and bounds.
#[derive(Debug)]
pub(super) struct Fam {
    pub(super) vmax: f64,
    pub(super) argmax: usize,
    pub(super) sums: Sums,
    pub(super) bounds: FamilyBounds,
    pub(super) cache: Option<Cache>,
}

/// One row prepared on the f64 tier: the exact inputs, one exp per entry
/// and family, and the enclosures of the row sums (module docs, (F1)-(F6)).
/// Every accessor returns an f64 [`Interval`] containing the exact value;
/// units are nats for `d`, `e`, log-probs, entropy, `lse`, `ln S`, `R`, and
/// nats squared for `M2`.
///
/// ```
/// use logprobe_reference::oracle::fast::{FastOptions, FastRow};
/// use logprobe_reference::spec::{Dtype, EntropyLogits, Logits, Problem};
/// use ndarray::array;
/// let x = array![[2.0f32, 1.0, 0.5, -3.0]];
/// let t = array![1i64];
/// let mut p = Problem::new(Logits::F32(x.view()));
/// p.tokens = Some(t.view());
/// let opts = FastOptions { entropy: Some(EntropyLogits::Unmasked), ..Default::default() };
/// let row = FastRow::new(&p, 0, opts).unwrap();
/// let lp = row.log_prob().unwrap();
/// // log_softmax(x)[1] = 1 - lse(x)
/// let exact = 1.0 - (2f64.exp() + 1f64.exp() + 0.5f64.exp() + (-3f64).exp()).ln();
/// assert!(lp.lo <= exact + 1e-15 && exact - 1e-15 <= lp.hi);
/// let fwd = row.forward(Dtype::F32);
/// assert!(fwd.lse.is_some() && fwd.entropy.unwrap().is_some());
/// ```
#[derive(Debug)]
pub struct FastRow<'a> {
    pub(super) row: Row<'a>,
    pub(super) div: Div,
    pub(super) mutant: Option<Mutant>,
    pub(super) applicable: bool,
    pub(super) p: Fam,
    /// The entropy family when it is not `p`'s (`q_is_p` false).
    pub(super) q: Option<Fam>,
    pub(super) q_is_p: bool,
    /// Whether `sum E_j a_j^2` was accumulated.
    pub(super) m2: bool,
}

/// Forward values of one row decided on the f64 tier: `Some(exact)` when
/// decided, `None` when the MPFR path must decide it.
#[derive(Clone, Debug)]
pub struct FastForward {
    /// `lse(z')` (nats).
    pub lse: Option<Exact>,
    /// Log-prob of the target (nats); outer `None` without a target.
    pub log_prob: Option<Option<Exact>>,
    /// Entropy (nats); outer `None` without an entropy family.
    pub entropy: Option<Option<Exact>>,
    /// Top-k log-probs `[K]` (nats).
    pub topk: Vec<Option<Exact>>,
}

impl FastForward {
    /// Whether every output is decided.
    pub fn decided(&self) -> bool {
        self.lse.is_some()
            && self.log_prob.as_ref().is_none_or(|e| e.is_some())
            && self.entropy.as_ref().is_none_or(|e| e.is_some())
            && self.topk.iter().all(|e| e.is_some())
    }

    /// `(outputs, undecided)`.
    pub fn counts(&self) -> (u64, u64) {
        let mut n = 1u64;
        let mut und = self.lse.is_none() as u64;
        for e in self.log_prob.iter().chain(self.entropy.iter()) {
            n += 1;
            und += e.is_none() as u64;
        }
        n += self.topk.len() as u64;
        und += self.topk.iter().filter(|e| e.is_none()).count() as u64;
        (n, und)
    }
}

impl<'a> FastRow<'a> {
    /// Prepares row `row` of `problem` on the f64 tier: validation, one
    /// exp per entry and family, the row sums' enclosures.
    ///
    /// # Errors
    /// The spec's validation errors for that row
    /// ([`Problem::validate_shapes`], [`Problem::validate_row`], and those
    /// of `round_input(x / T)` with `TemperatureDtype::Input`); a row index
    /// past `N` is [`SpecError::ShapeMismatch`] on tensor `row`.
    pub fn new(
        problem: &Problem<'a>,
        row: usize,
        options: FastOptions,
    ) -> Result<FastRow<'a>, SpecError> {
        let shape = problem.validate_shapes()?;
        crate::oracle::check_row(&shape, row)?;
        problem.validate_row(&shape, row)?;
        let prepared = row::prepare(problem, &shape, row, options.entropy)?;
        Ok(FastRow::from_row(prepared, options))
    }

    pub(crate) fn from_row(row: Row<'a>, options: FastOptions) -> FastRow<'a> {
        let div = Div::new(row.ts);
        let v = &row.v[..];
        let mask_buf: Option<Vec<bool>>;
        let mask: Option<&[bool]> = match row.mask {
            None => None,
            Some(m) => match m.to_slice() {
                Some(s) => Some(&s[..v.len()]),
                None => {
                    mask_buf = Some(m.iter().take(v.len()).copied().collect());
                    mask_buf.as_deref()
                }
            },
        };
        let q_is_p = row.q.is_some() && (row.q_masked || row.mask.is_none());
        let want_b = q_is_p;
        let m2 = options.m2;
        let per = options.per_entry;
        let run = |vmax: f64, argmax: usize, masked: bool, b: bool| -> Fam {
            let mut cache = per.then(Cache::default);
            let c = cache.as_mut();
            let sums = match (masked.then_some(mask).flatten(), b, m2) {
                (None, false, _) => accumulate::<false, false>(v, |_| true, vmax, argmax, div, c),
                (None, true, false) => accumulate::<true, false>(v, |_| true, vmax, argmax, div, c),
                (None, true, true) => accumulate::<true, true>(v, |_| true, vmax, argmax, div, c),
                (Some(m), false, _) => {
                    accumulate::<false, false>(v, |j| m[j], vmax, argmax, div, c)
                }
                (Some(m), true, false) => {
                    accumulate::<true, false>(v, |j| m[j], vmax, argmax, div, c)
                }
                (Some(m), true, true) => {
                    accumulate::<true, true>(v, |j| m[j], vmax, argmax, div, c)
                }
            };
            Fam {
                vmax,
                argmax,
                bounds: family_bounds(&sums, options.mutant),
                sums,
                cache,
            }
        };
        let p = run(row.p.vmax, row.p.argmax, true, want_b);
        let q = match row.q {
            Some(qf) if !q_is_p => Some(run(qf.vmax, qf.argmax, row.q_masked, true)),
            _ => None,
        };
        let ok = |f: &Fam| {
            !f.sums.bad
                && f.sums.n < (1 << 32)
                && f.bounds.s.is_finite()
                && f.bounds.b.is_finite()
                && f.bounds.t2.is_finite()
        };
        // Under an exact softcap (`SoftcapDtype::Accumulation`) `v` holds
        // the raw logits, not exact inputs: this tier has no proven tanh
        // enclosure here, so MPFR decides every such row (correctness first).
        let applicable = ok(&p)
            && q.as_ref().is_none_or(ok)
            && row.temperature.is_finite()
            && row.cap().is_none();
        FastRow {
            row,
            div,
            mutant: options.mutant,
            applicable,
            p,
            q,
            q_is_p,
            m2,
        }
    }

    pub(crate) fn prepared(&self) -> &Row<'a> {
        &self.row
    }

    pub(super) fn qfam(&self) -> Option<&Fam> {
        if self.q_is_p {
            Some(&self.p)
        } else {
            self.q.as_ref()
        }
    }

    /// Whether the f64 tier handles this row: `false` when a shift
    /// overflows f64 (f64 logits more than `1.8e308` apart), a bound is
    /// not finite, or the row has an exact softcap (`softcap` with
    /// `softcap_dtype = accumulation`: MPFR takes `tanh` exactly). Then nothing is decided here (every enclosure is still
    /// sound but may be infinite).
    pub fn applicable(&self) -> bool {
        self.applicable
    }

    /// Real vocabulary size `V`.
    pub fn vocab_size(&self) -> usize {
        self.row.v.len()
    }

    /// `s = S - 1 = sum_{j != argmax} exp(d'_j)` (dimensionless).
    pub fn s(&self) -> Interval {
        self.p.bounds.s
    }

    /// `S = sum_j exp(d'_j)` (dimensionless, `>= 1`).
    pub fn sum(&self) -> Interval {
        self.p.bounds.big_s
    }

    /// `ln S` (nats).
    pub fn ln_s(&self) -> Interval {
        self.p.bounds.ln_s
    }

    /// `s_w = S_w - 1` of the entropy's logits (`None` without entropy family).
    pub fn s_w(&self) -> Option<Interval> {
        self.qfam().map(|q| q.bounds.s)
    }

    /// `S_w` (`None` without entropy family).
    pub fn sum_w(&self) -> Option<Interval> {
        self.qfam().map(|q| q.bounds.big_s)
    }

    /// `ln S_w` (nats; `None` without entropy family).
    pub fn ln_s_w(&self) -> Option<Interval> {
        self.qfam().map(|q| q.bounds.ln_s)
    }

    /// `B = sum_j exp(e_j) |e_j|` (nats; `None` without entropy family).
    pub fn b(&self) -> Option<Interval> {
        self.qfam().map(|q| q.bounds.b)
    }

    /// `R = B / S_w = sum_j q_j |e_j|` (nats; `None` without entropy family).
    pub fn r(&self) -> Option<Interval> {
        self.qfam().map(|q| q.bounds.b.div_nonneg(q.bounds.big_s))
    }

    /// `M2 = sum_j q_j e_j^2` (nats squared; `None` without entropy family
    /// or without [`FastOptions::m2`]).
    pub fn m2(&self) -> Option<Interval> {
        if !self.m2 {
            return None;
        }
        self.qfam().map(|q| q.bounds.t2.div_nonneg(q.bounds.big_s))
    }

    /// `lse(z') = v_max / ts + ln S` (nats).
    pub fn lse(&self) -> Interval {
        let vmax = self.p.vmax;
        let m = match self.div {
            Div::One => Interval::point(vmax),
            Div::Pow2(t) | Div::Other(t) => {
                let q = vmax / t;
                if vmax == 0.0 || matches!(self.div, Div::Pow2(_)) && q * t == vmax {
                    Interval::point(q)
                } else {
                    Interval {
                        lo: q.next_down(),
                        hi: q.next_up(),
                    }
                }
            }
        };
        m.add(self.p.bounds.ln_s)
    }

    /// `-(a_c + ln S)` for a live column `c`, `-inf` for a `-inf` logit.
    fn log_prob_of(&self, c: usize) -> Interval {
        let x = self.row.v[c];
        if x == f64::NEG_INFINITY {
            return Interval::point(f64::NEG_INFINITY);
        }
        a_tight(self.p.vmax, x, self.div, self.mutant)
            .add(self.p.bounds.ln_s)
            .neg()
    }

    /// Log-prob of the target (nats; `None` without tokens or on
    /// `ignore_index` rows).
    pub fn log_prob(&self) -> Option<Interval> {
        self.row.target.map(|t| self.log_prob_of(t))
    }

    /// Top-k log-probs `[K]` (nats; `-inf` for masked or `-inf` ids).
    pub fn topk(&self) -> Vec<Interval> {
        self.row
            .topk
            .iter()
            .map(|id| match id {
                TopId::Masked => Interval::point(f64::NEG_INFINITY),
                TopId::Live(c) => self.log_prob_of(*c),
            })
            .collect()
    }

    /// Entropy `ln S_w + R` (nats; `None` without entropy family).
    pub fn entropy(&self) -> Option<Interval> {
        self.qfam()
            .map(|q| q.bounds.ln_s.add(q.bounds.b.div_nonneg(q.bounds.big_s)))
    }

    /// The forward values decided in `target` ([`decide`]); all `None`
    /// when the row is not [`FastRow::applicable`].
    ///
    /// An exact zero (a point enclosure `[0, 0]`: a family with one member)
    /// is decided with the sign MPFR's directed operations give it: `-0`
    /// for log-probs (`-(0 + ln_1p(0))`), `+0` for `lse` and entropy.
    ///
    /// Where the exact value's sign is known (log-probs `< 0` and entropy
    /// `> 0` once the family has a second member, since every `exp` is
    /// positive) an enclosure touching 0 is decided by that sign: e.g.
    /// `[0, 1e-76]` is the entropy of a row whose other terms underflow, and
    /// rounds to `+0` in every dtype.
    pub fn forward(&self, target: Dtype) -> FastForward {
        let ok = self.applicable;
        let n_p = self.p.sums.n;
        let n_q = self.qfam().map_or(0, |q| q.sums.n);
        let d = |zero: f64, strict: bool| {
            move |iv: Interval| {
                if !ok {
                    None
                } else if iv.lo == 0.0 && iv.hi == 0.0 {
                    Some(Exact::point(zero))
                } else if strict {
                    decide_signed(iv, target, zero.is_sign_negative())
                } else {
                    decide(iv, target)
                }
            }
        };
        FastForward {
            lse: d(0.0, false)(self.lse()),
            log_prob: self.log_prob().map(d(-0.0, n_p > 0)),
            entropy: self.entropy().map(d(0.0, n_q > 0)),
            topk: self.topk().into_iter().map(d(-0.0, n_p > 0)).collect(),
        }
    }
}
