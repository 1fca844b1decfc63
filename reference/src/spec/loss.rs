//! Cross-entropy `loss` (docs/design.md, "The loss side"): its reduction, label
//! smoothing, the all-ignored mean and per-row weights, with their
//! validation. Shared by the oracle and every kernel (plain Rust).
//!
//! Row loss over the real vocabulary (`j < vocab_size`, allowed by
//! `sampling_mask`), `A` those entries, `t` the target:
//! `l = (1 - eps) * (-log p_t) + eps * mean_{j in A} (-log p_j)`; a `-inf`
//! logit in `A` makes `l = +inf` when `eps > 0` (PyTorch's value), while
//! its gradient stays finite: `dl/dz_j = (1 - eps)(p_j - [j = t]) + eps
//! (p_j - 1 / |A|)` with `p_j = 0` there, `-eps / |A|` at the `-inf` entry
//! (what PyTorch's autograd gives; `fixtures/torch/
//! cross_entropy_neg_inf_smoothing_grad`). `r` =
//! rows whose token is not `ignore_index`; `w` the optional `loss_weights`:
//! - `none`: `[N]`, `w_r * l_r` on `r`, exactly 0 elsewhere;
//! - `sum`: `sum_{r} w_r * l_r` (a scalar);
//! - `mean`: that sum divided by `sum_{r} w_r` (by `|r|` without weights);
//!   a zero divisor (every row ignored) gives `mean_all_ignored`.
//!
//! A row of weight 0 contributes exactly 0 (also when its `l` is `+inf`).

use std::str::FromStr;

use ndarray::ArrayView1;

use super::{Dtype, SpecError};

/// How `loss` reduces over rows (dump meta `reduction`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Reduction {
    /// `[N]`: one value per row, ignored rows 0.
    #[default]
    None,
    /// A scalar: the sum over non-ignored rows.
    Sum,
    /// A scalar: the (weighted) mean over non-ignored rows.
    Mean,
}

impl Reduction {
    /// The name in the dump format: `none`, `sum`, `mean`.
    pub fn name(self) -> &'static str {
        match self {
            Reduction::None => "none",
            Reduction::Sum => "sum",
            Reduction::Mean => "mean",
        }
    }

    /// How many values `loss` holds for `n` rows: `n` under `none`, 1
    /// otherwise.
    pub fn len(self, n: usize) -> usize {
        match self {
            Reduction::None => n,
            Reduction::Sum | Reduction::Mean => 1,
        }
    }

    /// Checks the shape of a candidate `loss` tensor for `n` rows: `[N]`
    /// under `none`, `[]` or `[1]` under `sum` / `mean`.
    ///
    /// # Errors
    /// [`SpecError::ShapeMismatch`] on tensor `loss`.
    pub fn check_shape(self, shape: &[usize], n: usize) -> Result<(), SpecError> {
        let ok = match self {
            Reduction::None => shape == [n],
            Reduction::Sum | Reduction::Mean => shape.is_empty() || shape == [1],
        };
        if ok {
            Ok(())
        } else {
            Err(SpecError::ShapeMismatch {
                tensor: "loss",
                expected: match self {
                    Reduction::None => vec![n],
                    Reduction::Sum | Reduction::Mean => vec![],
                },
                found: shape.to_vec(),
            })
        }
    }
}

impl FromStr for Reduction {
    type Err = SpecError;

    /// Parses `none`, `sum`, `mean`.
    ///
    /// # Errors
    /// [`SpecError::UnknownReduction`] for anything else.
    fn from_str(s: &str) -> Result<Self, SpecError> {
        match s {
            "none" => Ok(Reduction::None),
            "sum" => Ok(Reduction::Sum),
            "mean" => Ok(Reduction::Mean),
            other => Err(SpecError::UnknownReduction {
                found: other.to_string(),
            }),
        }
    }
}

impl std::fmt::Display for Reduction {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// The `mean` of zero rows (every row ignored; dump meta `mean_all_ignored`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum MeanAllIgnored {
    /// NaN, as PyTorch's `F.cross_entropy` gives.
    #[default]
    Nan,
    /// 0 (Liger, most fused kernels after their fix).
    Zero,
}

impl MeanAllIgnored {
    /// The value: `NaN` or `0`.
    pub fn value(self) -> f64 {
        match self {
            MeanAllIgnored::Nan => f64::NAN,
            MeanAllIgnored::Zero => 0.0,
        }
    }

    /// The name in the dump format: `nan`, `zero`.
    pub fn name(self) -> &'static str {
        match self {
            MeanAllIgnored::Nan => "nan",
            MeanAllIgnored::Zero => "zero",
        }
    }
}

impl FromStr for MeanAllIgnored {
    type Err = SpecError;

    /// Parses `nan`, `zero` (and `0`).
    ///
    /// # Errors
    /// [`SpecError::UnknownMeanAllIgnored`] for anything else.
    fn from_str(s: &str) -> Result<Self, SpecError> {
        match s {
            "nan" => Ok(MeanAllIgnored::Nan),
            "zero" | "0" => Ok(MeanAllIgnored::Zero),
            other => Err(SpecError::UnknownMeanAllIgnored {
                found: other.to_string(),
            }),
        }
    }
}

/// The options of the cross-entropy `loss` held in
/// [`Options::loss`](super::Options::loss) (`Some` = the loss is an output
/// of the problem); the per-row weights are
/// [`Problem::loss_weights`](super::Problem::loss_weights), and the two
/// together are [`Problem::cross_entropy`](super::Problem::cross_entropy).
/// Fields as in [`CrossEntropy`].
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct LossOptions {
    /// The reduction over rows.
    pub reduction: Reduction,
    /// Label smoothing `eps` in `[0, 1]` (rounded to the accumulation dtype
    /// before use). Default 0.
    pub label_smoothing: f64,
    /// The `mean` of zero rows.
    pub mean_all_ignored: MeanAllIgnored,
}

impl LossOptions {
    /// These options with per-row weights `[N]` (`None`: every weight 1).
    pub fn with_weights<'a>(self, loss_weights: Option<ArrayView1<'a, f64>>) -> CrossEntropy<'a> {
        CrossEntropy {
            reduction: self.reduction,
            label_smoothing: self.label_smoothing,
            mean_all_ignored: self.mean_all_ignored,
            loss_weights,
        }
    }
}

/// The cross-entropy `loss` of a problem (its logits, tokens, sampling
/// mask, temperature, vocabulary and `ignore_index` are the
/// [`Problem`](super::Problem)'s).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct CrossEntropy<'a> {
    /// The reduction over rows.
    pub reduction: Reduction,
    /// Label smoothing `eps` in `[0, 1]`; rounded to the accumulation dtype
    /// (as the temperature is) before use. Default 0.
    pub label_smoothing: f64,
    /// The `mean` of zero rows.
    pub mean_all_ignored: MeanAllIgnored,
    /// Per-row weights `[N]` (finite, `>= 0`), exact f64 inputs.
    pub loss_weights: Option<ArrayView1<'a, f64>>,
}

impl CrossEntropy<'_> {
    /// `eps` as the computation uses it: rounded to `acc`, as an exact f64.
    ///
    /// # Errors
    /// [`SpecError::BadLabelSmoothing`] unless the given value is in `[0, 1]`.
    pub fn effective_label_smoothing(&self, acc: Dtype) -> Result<f64, SpecError> {
        let e = self.label_smoothing;
        if (0.0..=1.0).contains(&e) {
            Ok(acc.round_f64(e))
        } else {
            Err(SpecError::BadLabelSmoothing { label_smoothing: e })
        }
    }

    /// The weight of row `row` (1 without `loss_weights`).
    pub fn weight(&self, row: usize) -> f64 {
        self.loss_weights.map_or(1.0, |w| w[row])
    }

    /// Validates these options for a problem of `n` rows.
    ///
    /// # Errors
    /// [`SpecError::BadLabelSmoothing`]; [`SpecError::ShapeMismatch`] on
    /// `loss_weights` not `[N]`; [`SpecError::BadLossWeight`] for a weight
    /// that is negative or not finite (first in row order).
    pub fn validate(&self, n: usize) -> Result<(), SpecError> {
        self.effective_label_smoothing(Dtype::F64)?;
        if let Some(w) = self.loss_weights {
            if w.len() != n {
                return Err(SpecError::ShapeMismatch {
                    tensor: "loss_weights",
                    expected: vec![n],
                    found: w.shape().to_vec(),
                });
            }
            if let Some((row, &value)) = w
                .iter()
                .enumerate()
                .find(|(_, v)| !(v.is_finite() && **v >= 0.0))
            {
                return Err(SpecError::BadLossWeight { row, value });
            }
        }
        Ok(())
    }
}

/// The divisor `W` of a `mean` loss, summed once over a whole problem's
/// rows so that a view of some of them (verify's one-row views,
/// [`Cotangents::loss_divisor`](super::Cotangents::loss_divisor)) divides
/// by the whole problem's `W`, not its own rows' (docs/design.md, "The loss side":
/// `W = sum_{r} w_r`, `|r|` without weights).
///
/// `W` is held exactly: f64 parts whose exact sum it is (a nonoverlapping
/// expansion, smallest magnitude first; Shewchuk 1997, "Adaptive precision
/// floating-point arithmetic", Grow-Expansion), so the oracle's value is
/// still the correctly rounded one. Usually one part (every sum of weights
/// that fits in 53 bits).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct MeanDivisor {
    parts: Vec<f64>,
    rows: usize,
}

/// `a + b = s + e` exactly (Knuth's TwoSum), `s = fl(a + b)`.
fn two_sum(a: f64, b: f64) -> (f64, f64) {
    let s = a + b;
    let bb = s - a;
    (s, (a - (s - bb)) + (b - bb))
}

impl MeanDivisor {
    /// `W` of the terms `[N]` (`w_r` on counted rows, 0 elsewhere:
    /// [`Problem::loss_divisor_terms`](super::Problem::loss_divisor_terms)),
    /// exact; `rows` = `N`, the number of terms a kernel sums (its
    /// rounding of `W` is bounded over them, TOLERANCE.md (T19)). O(N)
    /// (times the parts, at most ~40).
    ///
    /// # Errors
    /// [`SpecError::BadLossWeight`] for a term that is negative or not
    /// finite (its index as the row); [`SpecError::LossDivisorOverflow`]
    /// when `W` exceeds the largest f64.
    pub fn new(terms: impl IntoIterator<Item = f64>) -> Result<MeanDivisor, SpecError> {
        let mut parts: Vec<f64> = Vec::new();
        let mut rows = 0;
        for (row, b) in terms.into_iter().enumerate() {
            rows += 1;
            if !(b.is_finite() && b >= 0.0) {
                return Err(SpecError::BadLossWeight { row, value: b });
            }
            if b == 0.0 {
                continue;
            }
            // Grow-Expansion: add b to every part, keep the nonzero errors.
            let mut q = b;
            let mut next = Vec::with_capacity(parts.len() + 1);
            for &e in &parts {
                let (s, h) = two_sum(q, e);
                q = s;
                if h != 0.0 {
                    next.push(h);
                }
            }
            if !q.is_finite() {
                return Err(SpecError::LossDivisorOverflow { rows: row + 1 });
            }
            next.push(q);
            parts = next;
        }
        Ok(MeanDivisor { parts, rows })
    }

    /// The parts (f64, smallest magnitude first) whose exact sum is `W`;
    /// empty when `W = 0`.
    pub fn parts(&self) -> &[f64] {
        &self.parts
    }

    /// `N`: how many rows' terms `W` sums.
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Whether `W = 0` (every row ignored or of weight 0).
    pub fn is_zero(&self) -> bool {
        self.parts.is_empty()
    }

    /// A lower bound of `W` in f64: `W` itself when it is one part (0
    /// when none), else the parts summed largest first (each partial sum
    /// of a nonoverlapping expansion is within a factor 2 of `W`, so the
    /// `m - 1` roundings err by at most `2 (m - 1) u W`) lowered by
    /// `4 m u` relative.
    pub fn lower(&self) -> f64 {
        match self.parts.as_slice() {
            [] => 0.0,
            [w] => *w,
            p => {
                let s: f64 = p.iter().rev().sum();
                let m = p.len() as f64;
                (s * (1.0 - 4.0 * m * f64::EPSILON)).next_down().max(0.0)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ndarray::array;

    #[test]
    fn names_parse_and_bad_ones_are_typed() {
        for r in [Reduction::None, Reduction::Sum, Reduction::Mean] {
            assert_eq!(r.name().parse::<Reduction>(), Ok(r));
        }
        assert_eq!(
            "avg".parse::<Reduction>(),
            Err(SpecError::UnknownReduction {
                found: "avg".into()
            })
        );
        assert_eq!("nan".parse::<MeanAllIgnored>(), Ok(MeanAllIgnored::Nan));
        assert_eq!("zero".parse::<MeanAllIgnored>(), Ok(MeanAllIgnored::Zero));
        assert!("inf".parse::<MeanAllIgnored>().is_err());
    }

    #[test]
    fn shapes_follow_the_reduction() {
        assert!(Reduction::None.check_shape(&[3], 3).is_ok());
        assert!(Reduction::None.check_shape(&[], 3).is_err());
        assert!(Reduction::Mean.check_shape(&[], 3).is_ok());
        assert!(Reduction::Sum.check_shape(&[1], 3).is_ok());
        assert!(matches!(
            Reduction::Sum.check_shape(&[3], 3),
            Err(SpecError::ShapeMismatch { tensor: "loss", .. })
        ));
    }

    #[test]
    fn mean_divisor_is_exact_and_checked() {
        let d = MeanDivisor::new([1.0, 0.0, 3.0]).unwrap();
        assert_eq!((d.parts(), d.rows(), d.lower()), (&[4.0][..], 3, 4.0));
        // 2^60 + 1 + 2^-60 needs three parts; their exact sum is kept.
        let (a, b, c) = (2f64.powi(60), 1.0, 2f64.powi(-60));
        let d = MeanDivisor::new([a, b, c]).unwrap();
        assert_eq!(d.parts(), &[c, b, a][..]);
        assert!(d.lower() <= a && d.lower() > a * (1.0 - 1e-14));
        assert!(MeanDivisor::new([0.0, 0.0]).unwrap().is_zero());
        assert_eq!(
            MeanDivisor::new([1.0, -1.0]),
            Err(SpecError::BadLossWeight {
                row: 1,
                value: -1.0
            })
        );
        assert_eq!(
            MeanDivisor::new([f64::MAX, f64::MAX]),
            Err(SpecError::LossDivisorOverflow { rows: 2 })
        );
    }

    #[test]
    fn eps_and_weights_are_checked() {
        for eps in [-0.1, 1.5, f64::NAN] {
            let ce = CrossEntropy {
                label_smoothing: eps,
                ..Default::default()
            };
            assert!(matches!(
                ce.validate(2),
                Err(SpecError::BadLabelSmoothing { .. })
            ));
        }
        let w = array![1.0, -2.0];
        let ce = CrossEntropy {
            loss_weights: Some(w.view()),
            ..Default::default()
        };
        assert_eq!(
            ce.validate(2),
            Err(SpecError::BadLossWeight {
                row: 1,
                value: -2.0
            })
        );
        assert!(matches!(
            ce.validate(3),
            Err(SpecError::ShapeMismatch { .. })
        ));
        let ce = CrossEntropy {
            label_smoothing: 0.1,
            ..Default::default()
        };
        assert_eq!(ce.effective_label_smoothing(Dtype::F32), Ok(0.1f32 as f64));
    }
}
