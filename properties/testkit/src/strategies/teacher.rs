//! The teacher of the top-k KL (`teacher_topk_log_probs`, docs/design.md, "The
//! loss side"): drawn beside a recipe's top-k ids from the recipe's seed on a
//! stream of its own, so every other value of the case is unchanged.
//!
//! Per problem: renormalised or not (even odds). Per row: the teacher's
//! mass `M` (just below 1, or uniform in `[0.05, 1)`), its logits at the
//! ids (the student's own, so the KL is tiny and cancels; the student's
//! plus small noise; or independent Gaussians), a log-softmax over the ids
//! plus `ln M`, rounded to the logits' dtype, with now and then a `-inf`
//! entry (a zero-probability teacher token). Every value is exact in its
//! dtype and the row passes the spec's mass check (the exact masses are
//! at most `1 - 2^-40` before rounding).

use ndarray::Array2;

use logprobe_reference::spec::{first_duplicate, Dtype, TeacherForm, TopkKl};

use super::rng_for;

/// The stream of the teacher's draws (far from the rows' `1 + i`).
const TEACHER_STREAM: u64 = 1 << 40;

/// The teacher of a problem, or `None` when its ids cannot carry a KL
/// (a repeated id, a masked one, an id of `-inf` logit in every position
/// of a renormalised row, no ids): `x [N, V_total]` the exact logits,
/// `allowed(i, j)` the sampling mask, `ids [N, K]`.
pub fn draw_teacher(
    seed: u64,
    x: &Array2<f64>,
    allowed: impl Fn(usize, usize) -> bool,
    ids: &Array2<i64>,
    dtype: Dtype,
) -> Option<(Array2<f64>, TopkKl)> {
    let (n, k) = ids.dim();
    if k == 0 {
        return None;
    }
    let mut rng = rng_for(seed, TEACHER_STREAM);
    let renormalized = rng.chance(0.5);
    for i in 0..n {
        let row = ids.row(i);
        if first_duplicate(row.iter().copied()).is_some()
            || row.iter().any(|&id| !allowed(i, id as usize))
            || (renormalized
                && row
                    .iter()
                    .all(|&id| x[[i, id as usize]] == f64::NEG_INFINITY))
        {
            return None;
        }
    }
    let mut a = Array2::<f64>::zeros((n, k));
    for i in 0..n {
        let mut rng = rng_for(seed, TEACHER_STREAM + 1 + i as u64);
        let student: Vec<f64> = row_log_softmax_at(x, i, &allowed, ids);
        let mass = if rng.chance(0.25) {
            1.0 - 2f64.powi(-40)
        } else {
            rng.uniform_in(0.05, 1.0)
        };
        let style = rng.below(3);
        let logits: Vec<f64> = student
            .iter()
            .map(|&s| {
                let s = if s.is_finite() { s } else { -30.0 };
                match style {
                    0 => s,
                    1 => s + 1e-3 * rng.normal(),
                    _ => 2.0 * rng.normal(),
                }
            })
            .collect();
        let m = logits.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let lse = m + logits.iter().map(|&l| (l - m).exp()).sum::<f64>().ln();
        for (c, &l) in logits.iter().enumerate() {
            let v = if rng.chance(0.05) {
                f64::NEG_INFINITY
            } else {
                l - lse + mass.ln()
            };
            // The rounding of a log-prob <= 0 stays <= 0 (0 is exact).
            a[[i, c]] = dtype.round_f64(v.min(0.0));
        }
    }
    Some((
        a,
        TopkKl {
            forward: true,
            reverse: true,
            renormalized,
            teacher_dtype: dtype,
        },
    ))
}

/// The student's log-probs at row `i`'s ids in f64 (generator only, not an
/// oracle): `x - max - ln sum e^{x - max}` over the allowed entries.
fn row_log_softmax_at(
    x: &Array2<f64>,
    i: usize,
    allowed: &impl Fn(usize, usize) -> bool,
    ids: &Array2<i64>,
) -> Vec<f64> {
    let v = x.ncols();
    let r = x.row(i);
    let m = (0..v)
        .filter(|&j| allowed(i, j) && r[j].is_finite())
        .map(|j| r[j])
        .fold(f64::NEG_INFINITY, f64::max);
    let s: f64 = (0..v)
        .filter(|&j| allowed(i, j) && r[j].is_finite())
        .map(|j| (r[j] - m).exp())
        .sum();
    ids.row(i)
        .iter()
        .map(|&id| r[id as usize] - m - s.ln())
        .collect()
}

/// The stream of the soft teacher's draws (beside [`TEACHER_STREAM`]).
const SOFT_TEACHER_STREAM: u64 = (1 << 40) + (1 << 39);

/// The teacher `[N, V_total]` of `soft_cross_entropy` and its form, for
/// one case in four (one in three of those as log-probabilities, `ln p_j`
/// rounded to f32, `-inf` where `p_j = 0`): per row `p = softmax(x / tau + noise)` over the real
/// vocabulary (`tau` in `[0.5, 2]`, Gaussian noise of scale 0, 0.5 or 3),
/// one row in four scaled to a mass in `[0.5, 1)` (a truncated teacher),
/// each entry rounded to f32 (a teacher's stored dtype), `0` on padded
/// columns and, on seven problems in eight, on the entries the student
/// cannot reach (masked, or a `-inf` logit); on the eighth the teacher
/// keeps mass there and the row's `H = +inf`. Now and then an entry is
/// exactly 0. `x [N, V_total]` the exact logits, `v` the real vocabulary,
/// `allowed(i, j)` the sampling mask. From its own stream of the recipe's
/// seed: every other value of the case is unchanged.
pub fn draw_teacher_probs(
    seed: u64,
    x: &Array2<f64>,
    v: usize,
    allowed: impl Fn(usize, usize) -> bool,
) -> Option<(Array2<f64>, TeacherForm)> {
    let mut rng = rng_for(seed, SOFT_TEACHER_STREAM);
    if !rng.chance(0.25) {
        return None;
    }
    let reachable_only = !rng.chance(0.125);
    let (n, vt) = x.dim();
    let mut p = Array2::zeros((n, vt));
    for i in 0..n {
        let tau = 0.5 + 1.5 * rng.uniform();
        let noise = [0.0, 0.5, 3.0][rng.below(3)];
        let reach = |j: usize| allowed(i, j) && x[[i, j]] > f64::NEG_INFINITY;
        let y: Vec<f64> = (0..v)
            .map(|j| {
                let xj = if x[[i, j]].is_finite() {
                    x[[i, j]]
                } else {
                    -30.0
                };
                xj / tau + noise * rng.normal()
            })
            .collect();
        let m = y.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let w: Vec<f64> = (0..v)
            .map(|j| {
                let keep = (!reachable_only || reach(j)) && !rng.chance(0.02);
                if keep {
                    (y[j] - m).exp()
                } else {
                    0.0
                }
            })
            .collect();
        let s: f64 = w.iter().sum();
        // One row in four is a truncated teacher (a top-k teacher's mass
        // without renormalisation): mass in [0.5, 1).
        let mass = if rng.chance(0.25) {
            0.5 + 0.5 * rng.uniform()
        } else {
            1.0
        };
        if s > 0.0 {
            for j in 0..v {
                p[[i, j]] = f64::from((w[j] / s * mass) as f32);
            }
        }
    }
    // One teacher in three is given as its log-probabilities (a kernel
    // that takes them computes `exp` itself): `ln p_j` rounded to f32,
    // `-inf` where `p_j = 0`.
    if rng.chance(1.0 / 3.0) {
        p.mapv_inplace(|x| f64::from(x.ln() as f32));
        return Some((p, TeacherForm::LogProbs));
    }
    Some((p, TeacherForm::Probs))
}
