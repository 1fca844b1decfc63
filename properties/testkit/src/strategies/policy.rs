//! The policy terms' inputs every gate case carries (issue 18): per row a
//! `ref_log_probs` and an `old_log_probs` entry placed at a drawn distance
//! from the row's log-prob, so `d = log_prob - ref` spans every scale
//! (exactly 0 and `1e-9` where a naive `exp(-d) + d - 1` cancels, up to
//! beyond the clamps), and the clamps (none, verl's, or small ones that
//! bind often). Drawn from their own SplitMix64 stream of the recipe's seed:
//! the logits, tokens and ids of a recipe are unchanged by them.

use ndarray::{Array1, Array2};

use logprobe_reference::spec::{Dtype, Options, PolicyClamps, SoftcapDtype, TemperatureDtype};

use super::rng_for;

/// The stream of the policy draws (rows use streams `1..=N`).
const STREAM: u64 = u64::MAX - 18;

/// `(ref_log_probs, old_log_probs)` `[N]` (f32 values, exact f64) and the
/// clamps for logits `x` `[N, V_total]` (exact f64 values of `dtype`; the
/// first `v` columns real), `mask`, `tokens` (`ignore` rows get 0) and the
/// case's `options` (temperature, softcap and how each is materialised:
/// the log-prob the inputs are placed near is the one the spec defines,
/// so `|lp - old|` stays as drawn, and an f32 kernel's `ratio` stays in
/// range).
pub(crate) fn draw(
    seed: u64,
    x: &Array2<f64>,
    v: usize,
    mask: Option<&Array2<bool>>,
    tokens: &Array1<i64>,
    options: &Options,
    dtype: Dtype,
) -> ([Option<Array1<f64>>; 2], PolicyClamps) {
    let (ignore_index, t) = (options.ignore_index, options.temperature);
    // The logits as the spec takes them, where they differ from `x / T`
    // (a softcap, or z materialised in the input dtype).
    let plain =
        options.softcap.is_none() && options.temperature_dtype == TemperatureDtype::Accumulation;
    let z_of = |x: f64| -> f64 {
        let xc = match options.softcap {
            None => x,
            Some(c) => match options.softcap_dtype {
                SoftcapDtype::Input => dtype.softcapped_input(x, c),
                SoftcapDtype::Accumulation => c * (x / c).tanh(),
            },
        };
        match options.temperature_dtype {
            TemperatureDtype::Input => dtype.scaled_input(xc, t),
            TemperatureDtype::Accumulation => xc / t,
        }
    };
    let mut rng = rng_for(seed, STREAM);
    let n = x.nrows();
    let mut refs = Array1::zeros(n);
    let mut olds = Array1::zeros(n);
    for i in 0..n {
        let tok = tokens[i];
        if tok == ignore_index || tok < 0 {
            continue;
        }
        // The log-prob in f64 (an approximation is enough: it only places
        // the inputs near it).
        let lp = if plain {
            let allowed = |j: usize| mask.is_none_or(|m| m[[i, j]]) && x[[i, j]].is_finite();
            let m = (0..v)
                .filter(|&j| allowed(j))
                .map(|j| x[[i, j]])
                .fold(f64::NEG_INFINITY, f64::max);
            let s: f64 = (0..v)
                .filter(|&j| allowed(j))
                .map(|j| ((x[[i, j]] - m) / t).exp())
                .sum();
            (x[[i, tok as usize]] - m) / t - s.ln()
        } else {
            let z: Vec<f64> = (0..v).map(|j| z_of(x[[i, j]])).collect();
            let allowed = |j: usize| mask.is_none_or(|m| m[[i, j]]) && z[j].is_finite();
            let m = (0..v)
                .filter(|&j| allowed(j))
                .map(|j| z[j])
                .fold(f64::NEG_INFINITY, f64::max);
            let s: f64 = (0..v)
                .filter(|&j| allowed(j))
                .map(|j| (z[j] - m).exp())
                .sum();
            z[tok as usize] - m - s.ln()
        };
        let mut offset = |big: f64| -> f64 {
            if rng.chance(0.125) {
                return 0.0;
            }
            let mag = 10f64.powf(rng.uniform_in(-9.0, big));
            if rng.chance(0.5) {
                -mag
            } else {
                mag
            }
        };
        let (dr, dold) = (offset(1.7), offset(0.3));
        refs[i] = Dtype::F32.round_f64(lp - dr);
        olds[i] = Dtype::F32.round_f64(lp - dold);
        if !refs[i].is_finite() {
            refs[i] = 0.0;
        }
        if !olds[i].is_finite() {
            olds[i] = 0.0;
        }
    }
    let clamps = match rng.below(6) {
        0..=2 => PolicyClamps::default(),
        3 | 4 => PolicyClamps {
            kl_input: Some(20.0),
            kl_output: Some(10.0),
            ratio_log: Some(20.0),
        },
        _ => PolicyClamps {
            kl_input: Some(0.5),
            kl_output: Some(0.05),
            ratio_log: Some(0.2),
        },
    };
    ([Some(refs), Some(olds)], clamps)
}
