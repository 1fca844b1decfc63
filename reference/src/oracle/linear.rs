//! The logits of a fused linear + loss kernel (Liger's fused linear
//! cross-entropy, Cut Cross-Entropy, unsloth; issue 45): `x_j = sum_k h_k
//! W_jk + b_j` from `hidden [N, H]`, `lm_head_weight [V, H]` and an
//! optional `lm_head_bias [V]`, enclosed to within a certified error
//! (TOLERANCE.md (T29)) so everything downstream runs on them as on given
//! logits.
//!
//! The sum is Dot2 (Ogita, Rump and Oishi, "Accurate sum and dot product",
//! SIAM J. Sci. Comput. 26(6), 2005) over [`LANES`] interleaved lanes
//! (compiled for AVX2 and AVX-512 too, chosen at run time, same bits): the
//! products are exact in f64 whenever the two operands' precisions add up
//! to at most 53 bits (bf16, f16 and f32 operands, whatever their
//! exponents: the products stay inside f64's normal range), and split by an
//! FMA (TwoProd) otherwise; the running sums lose nothing (TwoSum), and
//! only the sum of their errors is rounded. The error is bounded a
//! posteriori from that sum's magnitude, so it holds for the lanes' order.

use crate::spec::Dtype;

/// Interleaved accumulators per dot product: independent chains the
/// compiler keeps in vector registers. 16 hides TwoSum's latency on one
/// core (Zen 5, AVX-512, one thread: 0.17 ns a product at 16 lanes, 0.70
/// at 8, 0.19 at 32; the scalar path 0.62).
pub const LANES: usize = 16;

/// One logit of a linear layer, enclosed.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct DotEnclosure {
    /// The dot product plus bias, within `err` of the exact real.
    pub value: f64,
    /// Upper bound of `|value - (h . w + b)|`.
    pub err: f64,
    /// Upper bound of `sum_k |h_k w_k| + |b|`: the magnitude a float dot
    /// product's rounding error scales with (T29's `A_j`).
    pub abs_sum: f64,
}

/// The row-wide quantities the matmul stage's bound needs (T29).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct LinearRowStats {
    /// `H`, the dot products' length.
    pub hidden_size: usize,
    /// Upper bound of `max_j A_j` over the real vocabulary (`A_j = sum_k
    /// |h_k W_jk| + |b_j|`).
    pub abs_sum_max: f64,
    /// Upper bound of `max_j |x_j|` over the real vocabulary.
    pub logit_abs_max: f64,
    /// `max_j |b_j|` over the real vocabulary (0 without a bias).
    pub bias_abs_max: f64,
    /// Upper bound of the enclosures' error `max_j |x^o_j - x_j|` (the
    /// f64 logits the oracle takes against the exact reals).
    pub oracle_err: f64,
}

/// Whether the products of `a` and `b` operands are exact in f64: their
/// significands multiply into at most 53 bits, and (for operands of at
/// most f32's exponent range) no product leaves f64's normal range.
pub const fn products_exact(a: Dtype, b: Dtype) -> bool {
    a.precision() + b.precision() <= 53 && !matches!(a, Dtype::F64) && !matches!(b, Dtype::F64)
}

/// `(s, e)` with `s = fl(a + b)` and `s + e = a + b` exactly (Knuth's TwoSum).
#[inline(always)]
fn two_sum(a: f64, b: f64) -> (f64, f64) {
    let s = a + b;
    let bb = s - a;
    (s, (a - (s - bb)) + (b - bb))
}

/// `gamma_n` in f64, rounded up (valid for `n u < 1/2`).
fn gamma64(n: usize) -> f64 {
    let nu = n as f64 * (f64::EPSILON / 2.0);
    nu / (1.0 - nu) * (1.0 + 4.0 * f64::EPSILON)
}

/// `h . w + bias`, enclosed (see the module docs). `exact` says the
/// products `h_k w_k` are exact in f64 ([`products_exact`]).
///
/// Returns `None` when a product or the sum overflows f64 (only possible
/// for f64 operands): the logit is not finite.
///
/// # Panics
/// If `h` and `w` differ in length.
///
/// # Examples
/// ```
/// use logprobe_reference::oracle::linear::dot_enclosed;
/// // 2^60 + 1 - 2^60 cancels in f32 and in naive f64; Dot2 keeps the 1.
/// let h = [1.0, 1.0, -1.0];
/// let w = [2f64.powi(60), 1.0, 2f64.powi(60)];
/// let d = dot_enclosed(&h, &w, 0.0, true).unwrap();
/// assert_eq!(d.value, 1.0);
/// assert!(d.err < 1e-14); // a posteriori: u |value| + gamma_n sum |e|
/// ```
pub fn dot_enclosed(h: &[f64], w: &[f64], bias: f64, exact: bool) -> Option<DotEnclosure> {
    assert_eq!(h.len(), w.len(), "dot_enclosed: lengths differ");
    #[cfg(target_arch = "x86_64")]
    if crate::simd::available() {
        if std::arch::is_x86_feature_detected!("avx512f") {
            // SAFETY: AVX-512F was detected on this CPU.
            return unsafe { x86::dot_avx512(h, w, bias, exact) };
        }
        // SAFETY: `available` checked AVX2 on this CPU.
        return unsafe { x86::dot_avx2(h, w, bias, exact) };
    }
    dot_body(h, w, bias, exact)
}

/// [`dot_body`] compiled for AVX2 and for AVX-512F (the lanes become
/// vector registers; the same IEEE operations per lane, an FMA being as
/// correctly rounded as the libm call it replaces, so the same bits as the
/// scalar path: test `the_lanes_give_the_scalar_bits`).
#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::{dot_body, DotEnclosure};

    /// # Safety
    /// Call only where AVX2 is available ([`crate::simd::available`]).
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn dot_avx2(
        h: &[f64],
        w: &[f64],
        b: f64,
        exact: bool,
    ) -> Option<DotEnclosure> {
        dot_body(h, w, b, exact)
    }

    /// # Safety
    /// Call only where AVX-512F is available.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn dot_avx512(
        h: &[f64],
        w: &[f64],
        b: f64,
        exact: bool,
    ) -> Option<DotEnclosure> {
        dot_body(h, w, b, exact)
    }
}

/// The lanes' state: running sums, their error sums and the magnitudes.
#[derive(Clone, Copy)]
struct Lanes {
    s: [f64; LANES],
    c: [f64; LANES],
    m: [f64; LANES],
    a: [f64; LANES],
}

impl Lanes {
    /// Adds `p + q` (`p` a product, `q` its rounding error) to lane `l`.
    #[inline(always)]
    fn add(&mut self, l: usize, p: f64, q: f64) {
        let (t, e) = two_sum(self.s[l], p);
        self.s[l] = t;
        let eq = e + q;
        self.c[l] += eq;
        self.m[l] += eq.abs();
        self.a[l] += p.abs() + q.abs();
    }
}

/// Whether a product lost bits to underflow (TwoProd only).
#[inline(always)]
fn tiny(p: f64) -> bool {
    p.abs() < f64::MIN_POSITIVE * 2f64.powi(53)
}

#[inline(always)]
fn dot_body(h: &[f64], w: &[f64], bias: f64, exact: bool) -> Option<DotEnclosure> {
    let mut st = Lanes {
        s: [0.0; LANES],
        c: [0.0; LANES],
        m: [0.0; LANES],
        a: [0.0; LANES],
    };
    // Products that may have lost bits to underflow (TwoProd only).
    let mut n_tiny = 0usize;
    let chunks = h.len() / LANES;
    let (hc, wc) = (&h[..chunks * LANES], &w[..chunks * LANES]);
    if exact {
        for (hb, wb) in hc.chunks_exact(LANES).zip(wc.chunks_exact(LANES)) {
            for l in 0..LANES {
                st.add(l, hb[l] * wb[l], 0.0);
            }
        }
    } else {
        for (hb, wb) in hc.chunks_exact(LANES).zip(wc.chunks_exact(LANES)) {
            for l in 0..LANES {
                let p = hb[l] * wb[l];
                st.add(l, p, hb[l].mul_add(wb[l], -p));
                n_tiny += usize::from(tiny(p));
            }
        }
    }
    // The tail, then the bias, as one more term each in lane 0.
    let tail = h[chunks * LANES..]
        .iter()
        .zip(&w[chunks * LANES..])
        .map(|(&x, &y)| (x, y))
        .chain(std::iter::once((bias, 1.0)));
    for (x, y) in tail {
        let p = x * y;
        let q = if exact { 0.0 } else { x.mul_add(y, -p) };
        st.add(0, p, q);
        n_tiny += usize::from(!exact && tiny(p));
    }
    // Merge the lanes: the sums by TwoSum, their errors into `c`.
    let Lanes { s, c, m, a } = st;
    let (mut s0, mut ct, mut mt, mut at) = (s[0], c[0], m[0], a[0]);
    for l in 1..LANES {
        let (t, e) = two_sum(s0, s[l]);
        s0 = t;
        ct += c[l] + e;
        mt += m[l] + e.abs() + c[l].abs();
        at += a[l];
    }
    let value = s0 + ct;
    // Terms of the error sum: every product and merge, and a rounding of
    // `e + q` each (`gamma_{n+1}` covers both).
    let n = h.len() + 1 + 3 * LANES;
    let g = gamma64(n + 1);
    let mt_up = mt * (1.0 + g);
    let err = ((f64::EPSILON / 2.0) * value.abs() + g * mt_up + n_tiny as f64 * f64::from_bits(1))
        * (1.0 + 4.0 * f64::EPSILON);
    let abs_sum = at * (1.0 + g);
    (value.is_finite() && err.is_finite() && abs_sum.is_finite()).then_some(DotEnclosure {
        value,
        err,
        abs_sum,
    })
}

/// A row of logits from a linear layer: `x_j = h . W_j + b_j` for `j <
/// v_total`, each enclosed by [`dot_enclosed`], with the row's (T29)
/// statistics over the first `vocab_size` columns, and with `entries`
/// every column's [`DotEnclosure`] (for judging given logits against the
/// matmul entry by entry). `weight_row(j, buf)` writes row `j` of
/// `lm_head_weight` (`H` values, exact f64) into `buf`.
///
/// # Errors
/// `Err(j)`: the first column whose logit is not finite (an f64 product
/// or sum overflowed).
pub fn linear_logits(
    hidden: &[f64],
    v_total: usize,
    vocab_size: usize,
    weight_row: impl FnMut(usize, &mut [f64]),
    bias: Option<&[f64]>,
    (exact, entries): (bool, bool),
) -> Result<LinearRow, usize> {
    linear_logits_block(
        &[hidden],
        0..v_total,
        vocab_size,
        weight_row,
        bias,
        (exact, entries),
    )
    .pop()
    .expect("one row")
}

/// [`linear_logits`] for several rows of `hidden` at once, over the
/// columns `cols` only: each weight row is decoded once for all of them
/// (the weight is read once a block of rows, not once a row), and every
/// logit is the same [`dot_enclosed`] call, so the same bits. Parts over
/// consecutive column ranges join with [`LinearRow::append`].
///
/// Returns one result per row of `hiddens` (all of length `H`): `Err(j)`
/// for the first column in `cols` whose logit is not finite.
///
/// # Panics
/// If the rows differ in length.
pub fn linear_logits_block(
    hiddens: &[&[f64]],
    cols: std::ops::Range<usize>,
    vocab_size: usize,
    mut weight_row: impl FnMut(usize, &mut [f64]),
    bias: Option<&[f64]>,
    (exact, entries): (bool, bool),
) -> Vec<Result<LinearRow, usize>> {
    let h_len = hiddens.first().map_or(0, |h| h.len());
    assert!(
        hiddens.iter().all(|h| h.len() == h_len),
        "rows differ in length"
    );
    let mut buf = vec![0.0; h_len];
    let width = cols.len();
    let mut out: Vec<Result<LinearRow, usize>> = hiddens
        .iter()
        .map(|_| {
            Ok(LinearRow {
                logits: Vec::with_capacity(width),
                stats: LinearRowStats {
                    hidden_size: h_len,
                    ..LinearRowStats::default()
                },
                entries: entries.then(|| Vec::with_capacity(width)),
            })
        })
        .collect();
    for j in cols {
        weight_row(j, &mut buf);
        let b = bias.map_or(0.0, |b| b[j]);
        for (h, slot) in hiddens.iter().zip(out.iter_mut()) {
            let Ok(row) = slot else { continue };
            let Some(d) = dot_enclosed(h, &buf, b, exact) else {
                *slot = Err(j);
                continue;
            };
            let stats = &mut row.stats;
            if j < vocab_size {
                stats.abs_sum_max = stats.abs_sum_max.max(d.abs_sum);
                stats.logit_abs_max = stats.logit_abs_max.max(d.value.abs() + d.err);
                stats.oracle_err = stats.oracle_err.max(d.err);
                stats.bias_abs_max = stats.bias_abs_max.max(b.abs());
            }
            row.logits.push(d.value);
            if let Some(e) = row.entries.as_mut() {
                e.push(d);
            }
        }
    }
    out
}

/// A row of logits from [`linear_logits`].
#[derive(Clone, Debug, PartialEq)]
pub struct LinearRow {
    /// The enclosures' values `[V_total]`.
    pub logits: Vec<f64>,
    /// The row's (T29) statistics.
    pub stats: LinearRowStats,
    /// Every column's enclosure, when asked for.
    pub entries: Option<Vec<DotEnclosure>>,
}

impl LinearRow {
    /// Joins the part of the next columns (from [`linear_logits_block`]):
    /// the logits and entries concatenated, the statistics' maxima taken
    /// (the same values in any order).
    pub fn append(&mut self, next: LinearRow) {
        self.logits.extend(next.logits);
        if let (Some(a), Some(b)) = (self.entries.as_mut(), next.entries) {
            a.extend(b);
        }
        let (s, t) = (&mut self.stats, next.stats);
        s.abs_sum_max = s.abs_sum_max.max(t.abs_sum_max);
        s.logit_abs_max = s.logit_abs_max.max(t.logit_abs_max);
        s.oracle_err = s.oracle_err.max(t.oracle_err);
        s.bias_abs_max = s.bias_abs_max.max(t.bias_abs_max);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rug::Float;

    fn exact_dot(h: &[f64], w: &[f64], b: f64) -> Float {
        let mut s = Float::with_val(4096, b);
        for (x, y) in h.iter().zip(w) {
            s += Float::with_val(4096, x) * Float::with_val(4096, y);
        }
        s
    }

    #[test]
    fn enclosures_hold_on_cancelling_sums() {
        let mut state = 0x1234_5678_9abc_def0u64;
        let mut next = || {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((state >> 11) as f64 / (1u64 << 53) as f64) * 2.0 - 1.0
        };
        for (len, exact) in [(1, true), (7, true), (64, true), (1000, true), (333, false)] {
            for trial in 0..20 {
                let scale = 2f64.powi(trial * 6 - 60);
                let h: Vec<f64> = (0..len)
                    .map(|_| (next() * 256.0).round() / 256.0 * scale)
                    .collect();
                let w: Vec<f64> = if exact {
                    (0..len)
                        .map(|_| f64::from(half::bf16::from_f64(next() * 3.0)))
                        .collect()
                } else {
                    (0..len).map(|_| next()).collect()
                };
                // Make the sum cancel: the last weight undoes most of it.
                let b = -h.iter().zip(&w).map(|(x, y)| x * y).sum::<f64>();
                let d = dot_enclosed(&h, &w, b, exact).unwrap();
                let e = exact_dot(&h, &w, b);
                let diff = (Float::with_val(4096, d.value) - &e).abs();
                assert!(diff <= d.err, "len {len} trial {trial}: {diff} > {}", d.err);
                let abs: f64 = h.iter().zip(&w).map(|(x, y)| (x * y).abs()).sum::<f64>() + b.abs();
                assert!(d.abs_sum >= abs, "abs_sum");
            }
        }
    }

    #[test]
    fn the_lanes_give_the_scalar_bits() {
        let h: Vec<f64> = (0..1003).map(|i| ((i * 37) as f64 * 0.1).sin()).collect();
        let w: Vec<f64> = (0..1003)
            .map(|i| f64::from(((i * 11) as f32 * 0.3).cos()))
            .collect();
        for exact in [true, false] {
            let fast = dot_enclosed(&h, &w, 0.25, exact);
            let slow = crate::simd::scalar(|| dot_enclosed(&h, &w, 0.25, exact));
            assert_eq!(fast, slow);
        }
    }

    #[test]
    fn overflow_is_not_finite() {
        assert!(dot_enclosed(&[1e300], &[1e300], 0.0, false).is_none());
    }

    #[test]
    fn linear_logits_report_the_first_bad_column() {
        let h = [1e300, 1.0];
        let r = linear_logits(
            &h,
            3,
            3,
            |j, b| {
                b[0] = if j == 2 { 1e300 } else { 0.0 };
                b[1] = 1.0;
            },
            None,
            (false, false),
        );
        assert_eq!(r.unwrap_err(), 2);
    }
}
