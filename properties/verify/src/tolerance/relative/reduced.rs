//! The relative rule on a reduced cross-entropy (`sum` / `mean`,
//! TOLERANCE.md (R5)): careful code's per-row terms `w l`
//! ([`super::CarefulRow::loss_term`]) summed over the rows in the declared
//! loss order, in the accumulation dtype, then divided by the count or the
//! weights' sum for `mean`.

use logprobe_reference::spec::{Dtype, Reduction};

use super::careful::OrderedSum;

/// Careful code's part of a reduced loss from one row.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct CarefulLossRow {
    /// The row's term `w l` (nats) in the accumulation dtype, in each form
    /// the declaration allows (both the same for one form); 0 on a row
    /// that is not counted.
    pub terms: [f64; 2],
    /// The row's floor (R2): what one rounding of its normaliser implies
    /// in its loss (nats, unweighted; 0 on a row that is not counted),
    /// raised to careful code's own error on the row by
    /// [`CarefulLossRow::against`].
    pub floor: f64,
}

impl CarefulLossRow {
    /// The row with its floor raised to careful code's error on its term
    /// (the larger over the forms, against the far end of `exact`, the
    /// exact term's enclosure `[lo, hi]`, nats): (R5) takes the rows'
    /// careful errors as if they did not cancel in the reduction.
    pub fn against(self, (lo, hi): (f64, f64)) -> CarefulLossRow {
        let error = self
            .terms
            .iter()
            .map(|&t| (t - lo).abs().max((t - hi).abs()))
            .fold(0.0, f64::max);
        CarefulLossRow {
            floor: if error.is_finite() {
                self.floor.max(error)
            } else {
                self.floor
            },
            ..self
        }
    }
}

/// How careful code reduces the rows' terms.
#[derive(Clone, Copy, Debug)]
pub struct ReducedPlan<'a> {
    /// `sum` or `mean` (`none` is judged row by row).
    pub reduction: Reduction,
    /// Rows per block of the declared loss order (`Summation::leaf`): the
    /// blocks are summed in row order, their sums merged pairwise.
    pub leaf: usize,
    /// Each row's `loss_weights` entry (`None`: 1 everywhere).
    pub weights: Option<&'a [f64]>,
    /// Whether each row's token is counted (not `ignore_index`).
    pub counted: &'a [bool],
    /// The accumulation dtype every operation rounds to.
    pub acc: Dtype,
}

/// Careful code's reduced loss over `rows` (one per dump row, in order),
/// rounded to `out`, in each form, and the floor of (R5): the rows'
/// floors weighted by `|w|` and summed, plus half an ulp of the total in
/// the accumulation dtype (the last addition's rounding), divided by the
/// divisor for `mean`. `None` for `reduction = none`, or a `mean` whose
/// divisor is not positive (every row ignored: the declared value is
/// judged as is).
pub fn careful_reduced_loss(
    rows: &[CarefulLossRow],
    plan: &ReducedPlan<'_>,
    out: Dtype,
) -> Option<([f64; 2], f64)> {
    let acc = plan.acc;
    let r = |x: f64| acc.round_f64(x);
    let weight = |i: usize| plan.weights.map_or(1.0, |w| w[i]);
    let leaf = plan.leaf.clamp(1, rows.len().max(1));
    let sum = |value: &dyn Fn(usize) -> f64| {
        let mut total = OrderedSum::new(acc);
        for start in (0..rows.len()).step_by(leaf) {
            let end = (start + leaf).min(rows.len());
            total.push((start..end).fold(0.0, |s, i| r(s + value(i))));
        }
        total.finish()
    };
    let terms = [0, 1].map(|f| sum(&|i| rows[i].terms[f]));
    let rows_floor: f64 = rows
        .iter()
        .enumerate()
        .filter(|&(i, _)| plan.counted[i])
        .map(|(i, row)| weight(i).abs() * row.floor)
        .sum();
    let last = terms
        .iter()
        .filter(|t| t.is_finite())
        .map(|&t| 0.5 * acc.ulp(t))
        .fold(0.0, f64::max);
    let floor = rows_floor + last;
    match plan.reduction {
        Reduction::None => None,
        Reduction::Sum => Some((terms.map(|t| out.round_f64(t)), floor)),
        Reduction::Mean => {
            // The divisor: the counted rows, or their weights summed in the
            // same order.
            let divisor = match plan.weights {
                None => r(plan.counted.iter().filter(|&&c| c).count() as f64),
                Some(_) => sum(&|i| if plan.counted[i] { r(weight(i)) } else { 0.0 }),
            };
            (divisor > 0.0).then(|| {
                (
                    terms.map(|t| out.round_f64(r(t / divisor))),
                    floor / divisor,
                )
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A row floor with exact sums and products below.
    const F: f64 = 1.0 / 1_048_576.0;

    fn rows(terms: &[f64]) -> Vec<CarefulLossRow> {
        terms
            .iter()
            .map(|&t| CarefulLossRow {
                terms: [t, t],
                floor: F,
            })
            .collect()
    }

    #[test]
    fn reduces_in_the_declared_order_and_dtype() {
        // 2^24 + 1 + 1 + 1 in f32: one accumulator loses every one, pairs
        // keep two of them.
        let t = rows(&[16_777_216.0, 1.0, 1.0, 1.0]);
        let counted = [true; 4];
        let plan = |leaf| ReducedPlan {
            reduction: Reduction::Sum,
            leaf,
            weights: None,
            counted: &counted,
            acc: Dtype::F32,
        };
        let seq = careful_reduced_loss(&t, &plan(4), Dtype::F32).unwrap();
        let pairs = careful_reduced_loss(&t, &plan(1), Dtype::F32).unwrap();
        assert_eq!(seq.0, [16_777_216.0; 2]);
        assert_eq!(pairs.0, [16_777_218.0; 2]);
        // Four rows' floors and half an f32 ulp of 2^24.
        assert_eq!(seq.1, 4.0 * F + 1.0);
    }

    #[test]
    fn a_rows_floor_rises_to_careful_codes_error_there() {
        let row = CarefulLossRow {
            terms: [2.0, 2.5],
            floor: 0.125,
        };
        assert_eq!(row.against((1.75, 2.25)).floor, 0.75);
        assert_eq!(row.against((2.0, 2.0)).floor, 0.5);
        let exact = CarefulLossRow {
            terms: [2.0, 2.0],
            floor: 0.125,
        };
        assert_eq!(exact.against((2.0, 2.0)).floor, 0.125);
        assert_eq!(exact.against((2.0, f64::INFINITY)).floor, 0.125);
    }

    #[test]
    fn a_mean_divides_by_the_counted_rows_or_their_weights() {
        let t = rows(&[2.0, 0.0, 4.0]);
        let counted = [true, false, true];
        let mut plan = ReducedPlan {
            reduction: Reduction::Mean,
            leaf: 8,
            weights: None,
            counted: &counted,
            acc: Dtype::F32,
        };
        let (v, floor) = careful_reduced_loss(&t, &plan, Dtype::F32).unwrap();
        assert_eq!(v, [3.0, 3.0]);
        let half_ulp_6 = 0.5 * Dtype::F32.ulp(6.0);
        assert_eq!(floor, (2.0 * F + half_ulp_6) / 2.0);
        let w = [0.5, 3.0, 1.5];
        plan.weights = Some(&w);
        let (v, floor) = careful_reduced_loss(&t, &plan, Dtype::F32).unwrap();
        assert_eq!(v, [3.0, 3.0]);
        assert_eq!(floor, (2.0 * F + half_ulp_6) / 2.0);
        let none = [false; 3];
        plan.counted = &none;
        assert!(careful_reduced_loss(&t, &plan, Dtype::F32).is_none());
    }
}
