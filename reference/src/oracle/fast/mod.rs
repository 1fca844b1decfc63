//! The certified f64 tier of the oracle: one pass per row, one correctly
//! rounded f64 `exp` per entry, error-free sums and a-priori bounds
//! evaluated with upward rounding, giving f64 enclosures of everything the
//! MPFR path computes. An output whose enclosure rounds to one value of the
//! target dtype is decided here (that value is the correctly rounded one);
//! the others fall back, one by one, to the MPFR path and its Ziv loop.
//!
//! The public [`crate::oracle::Oracle`] uses this tier by default
//! ([`Tier::Fast`]); [`Tier::Mpfr`] forces the MPFR path. [`FastRow`] is
//! the prepared pass itself: one set of exps per row serves the forward
//! values, the row statistics ([`RowStats`](super::RowStats)) and the VJP ([`FastVjp`]).
//!
//! # Derivation
//!
//! Notation: `u = 2^-53`, `eta = 2^-1075`, `RN` round to nearest even (Rust
//! never changes the rounding mode). For a real `y` and `y^ = RN(y)`:
//!
//! - (E0) `|y^ - y| <= u |y^|` when `|y| >= 2^-1022`, `<= eta` otherwise,
//!   so `|y^ - y| <= u |y^| + eta` and `y` lies in `[pred y^, succ y^]`
//!   (IEEE 754-2019 4.3.1; N. Higham, "Accuracy and Stability of Numerical
//!   Algorithms", 2nd ed., SIAM 2002, Thm 2.2 and 2.1.1 on gradual
//!   underflow). Sums are rounded in the exact direction with Knuth's
//!   TwoSum (exact with gradual underflow; TAOCP vol. 2, 4.2.2); products
//!   and quotients are moved one ulp outward.
//! - CORE-MATH's binary64 `exp` and `log1p` are correctly rounded (RN) for
//!   every input (A. Sibidanov, P. Zimmermann, S. Glondu, "The CORE-MATH
//!   Project", ARITH 2022; the `core-math` crate binds that C code).
//!
//! Per family (the masked logits `z'` for `p`, the entropy's `w` for `q`),
//! with max `v_max` at index `m` and `N` other members:
//!
//! - (F1) Shift. `a_j = (v_max - v_j) / ts >= 0`, `a^_j =
//!   RN(RN(v_max - v_j) / ts)`. TwoSum gives the subtraction's exact error
//!   (not always 0: f32 logits `1e30` apart from tiny ones, or from
//!   `100.5` and `1e-30`, need more than 53 bits). A quotient by a power of
//!   two is exact iff `a^ ts == RN(v_max - v_j)` (scaling by a power of two
//!   is exact); other divisors are taken as inexact. When inexact, `a^ =
//!   a (1+e1)(1+e2) + e3` (`|e1|, |e2| <= u`, `|e3| <= eta`; a subtraction
//!   landing in the subnormal range is exact, J. Hauser, ACM TOPLAS 18(2),
//!   1996), so `|a^ - a| <= Delta_j = c1 a^ + 2^-1074`, `c1 = 2u (1 + 4u) >=
//!   (2u + u^2) / (1 - u)^2`. The statistics `d_j`, `e_j` and the
//!   log-probs use the tighter enclosure: the subtraction rounded down and
//!   up exactly (TwoSum), each end divided and moved one ulp outward unless
//!   exact.
//! - (F2) Exp. `r_j = RN(exp(-a^_j))` (CORE-MATH). By (E0) `exp(-a^) in
//!   [pred r, succ r]` and `|r - exp(-a^)| <= u r + eta`. `r > 0` implies
//!   `exp(-a^) > eta`, so `a^ < 745.14` and `Delta_j <= kappa = 2^-42`;
//!   then `E_j = exp(-a_j) in exp(-a^) [1 - Delta, 1 + Delta (1 + kappa)]`.
//!   `r = 0` implies `a >= a^ - Delta >= 745.13`: `E_j < 2^-1074`,
//!   `E_j a_j < 2^-1064`, `E_j a_j^2 < 2^-1050` (the absolute underflow
//!   terms below; at `a = 1e30` MPFR's exponent range cannot hold `E_j`
//!   either).
//! - (F3) Sums. Nonnegative terms are added by TwoSum into `(H, LO)`
//!   (`H_i = RN(H_{i-1} + x_i)`, `LO += e_i` in plain f64), so `sum x = H +
//!   sum e_i` exactly, `|e_i| <= u H_i <= u H` (partial sums only grow), and
//!   the plain sum of the `e_i` is off by at most `gamma_{N-1} sum |e_i|`
//!   (Higham (4.4)): `|H + LO - sum x| <= eps = gamma_N N u H`, `gamma_n =
//!   n u / (1 - n u)` (the Sum2 analysis of T. Ogita, S. Rump, S. Oishi,
//!   "Accurate sum and dot product", SIAM J. Sci. Comput. 26(6), 2005,
//!   Prop. 4.5, without its last rounding). Plain sums of nonnegative
//!   terms are off by at most `gamma_{N-1}` relative.
//! - (F4) `s = S - 1 = sum_{j != m} E_j` is summed without the argmax term
//!   (exactly `e^0 = 1`), so a tiny `s` keeps its relative accuracy; forming
//!   `S` first and taking `S - 1` would lose it. With `R0 = H0 + LO0 + eps0 >=
//!   sum r_j` and `X >= sum_{inexact, r > 0} r_j a^_j` (`X = (1 + u)
//!   X^ / (1 - gamma_N) + N 2^-1074` from the rounded products, (E0)):
//!   `s <= H0 + LO0 + eps0 + u R0 + (1 + kappa)(1 + u)(c1 X + 2^-1074 R0) +
//!   N 2^-1074` and `s >= H0 + LO0 - eps0 - u R0 - (c1 X + 2^-1074 R0) -
//!   N 2^-1074`, from `E_j <= (r_j (1 + u) + eta)(1 + Delta_j (1 +
//!   kappa))`, `E_j >= (r_j (1 - u) - eta)(1 - Delta_j)`, `sum r_j Delta_j
//!   <= c1 sum r_j a^_j + 2^-1074 sum r_j`. Then `S = 1 + s`, `ln S =
//!   ln_1p(s)` (CORE-MATH `log1p`, one ulp outward), `lse = v_max / ts +
//!   ln S`, `log_prob = -(a_t + ln S)`, `topk_k = -(a_{id_k} + ln S)`.
//! - (F5) `B = sum E_j a_j` (so `R = B / S_w`, `entropy = ln S_w + R`):
//!   with the rounded products `r_j a^_j in (1 +- u) P^_j +- eta`, the
//!   shift error `(a^ +- Delta)` and `amax = max a^_j` over inexact
//!   entries: `B <= (1 + u)^2 (H1 + LO1 + eps1) + (1 + u)(1 + kappa)(c1
//!   (amax + 1 + kappa) X + 748 2^-1074 R0) + N 2^-1064`, `B >= (1 - u)^2
//!   (H1 + LO1 - eps1) - (c1 (amax + 1) X + 747 2^-1074 R0) - N 2^-1064`.
//! - (F6) `T2 = sum E_j a_j^2` (so `M2 = T2 / S_w`), with `Q = (amax +
//!   kappa)^2 + 2 amax + kappa`: `T2 <= (1 + u)^3 (H2 + LO2 + eps2) + (1 +
//!   u)(1 + kappa) Q (c1 X + 2^-1074 R0) + N 2^-1050`, and the lower end
//!   with `(1 - u)^3`, `-Q (...)`, `-N 2^-1050`.
//! - (F7) Per entry: `E_j in [pred r_j, succ r_j] [1 - Delta_j, 1 +
//!   Delta_j (1 + kappa)]` (`[1, 1]` at the argmax, `[0, 2^-1074]` when
//!   `r_j = 0`), `p_j = E_j / S`, `q_j = E^w_j / S_w`, `d_j = -a_j`. VJP:
//!   `dx_j T = A_j sigma_j / S - (C - A_j) E_j / S - h E^w_j (R - a^w_j) /
//!   S_w` with `sigma_j = s` at the argmax and `1 + s - E_j >= max(1, s)`
//!   elsewhere (no cancellation), in interval arithmetic ([`FastVjp`]).
//! - (F8) Decision ([`decide`]). An output is decided when both ends of
//!   its enclosure round to the same bits in the target dtype and the
//!   enclosure does not contain 0 (an exact zero's sign is left to MPFR).
//!   Rounding is monotone, so that common value is the correctly rounded
//!   exact value: the one the MPFR path returns. For f64 targets this
//!   almost never happens (the enclosures are a few f64 ulps wide): those
//!   outputs fall back to MPFR.
//!
//! - (F9) Exact softcap (`softcap_dtype = accumulation`, docs/design.md, "The
//!   loss side": `x'_j = c tanh(x_j / c)`, then `z = x' / T` exactly). The pass
//!   runs (F1)-(F8) on `y_j = RN(c RN(tanh(RN(x_j / c))))` (`-c` for a
//!   `-inf` logit, exact: PyTorch's value) as if exact, then widens each
//!   result for `|x'_j - y_j| <= e = 3 u c + c 2^-1074 + 2^-1074`: (a) the
//!   quotient `q = RN(x / c)`, `|q - x / c| <= u |q| + eta`, moves `tanh`
//!   by at most that times `sech^2` between them, `<= 2 u |xi| sech^2(xi) +
//!   eta <= 0.9 u + eta` (`|xi| >= |q| / 2` for `|q| >= 2^-1000`, and
//!   `max xi sech^2 xi < 0.449`; below, `u |q| <= u 2^-1000`; `q = inf`
//!   moves `tanh` by `< 2 e^{-2 MAX}`); (b) CORE-MATH's `tanh` is
//!   correctly rounded, `<= u |t| + eta <= u + eta`; (c) the product, `<=
//!   u |y| + eta <= u c + eta` (`|c t| <= c`). All three rounding steps are
//!   monotone, so the argmax of `x` maximises `y` and `x'` alike and the
//!   top-k ids (taken on `x`) are those of `x'`. With `eta_z = e / ts`
//!   (rounded up) bounding `|z'_j - y_j / ts|`, and `k = 2 eta_z` (0 for
//!   a family with one member: then `s = 0` and `ln S = 0` exactly):
//!   `lse` moves by `<= eta_z`; every `d_j`, `e_j`, `ln S`, `ln S_w`,
//!   log-prob, top-k log-prob and `-log p_j` (the loss) by `<= k` (each is
//!   a difference of two `z'` or of `z'` and `lse`); `s`, `S`, `E_j`, `p_j`
//!   (through `E_j` and `S`), `q_j` by a factor in `[e^-k, e^k]`, enclosed
//!   in `[1 - k, 1 + k + k^2]` (`k <= 1`); `R = sum q_j |e_j|` lies in
//!   `[e^-k (R^ - k)^+, e^k (R^ + k)]` and `M2 = sum q_j e_j^2` in `[e^-k
//!   (M2^ - 2 k R^)^+, e^k (M2^ + 2 k R^ + k^2)]`, so `entropy = ln S_w +
//!   R` and `B = R S_w` follow. The row is left to MPFR when `4 eta_z >
//!   1/2` (a huge `c / T`). The VJP (its `sech^2` factor) stays on MPFR
//!   for every softcapped row ([`FastRow::vjp_applicable`]).
//!
//! - (F10) Loss side of the VJP ([`LossSide`]). `lse`'s cotangent `a` and
//!   `z_loss`'s `b` add `kappa p_j`, `kappa = a + 2 coef b lse`, enclosed
//!   from `lse`'s enclosure (F9's `eta_z` included) by interval products
//!   (`2 coef b` exact); the cross-entropy's row coefficient `ell = g w`
//!   (`/ W` under `mean`: `g w` enclosed by one outward product, `W` by
//!   outward sums of its exact f64 parts, one outward quotient) adds
//!   `ell (p_j - [j = t])`. In (F7)'s form `A_j - C p_j` both are exact
//!   regroupings: the target's `A_t` gains `-ell` (a source in `C`), and
//!   `C` loses `kappa`, so (F7)'s interval evaluation and (F7')'s point
//!   bound hold unchanged with `C` an enclosure. Label smoothing `eps > 0`
//!   adds `-ell eps / |A|` on every allowed entry, which cancels against
//!   `eps ell p_j` on near-uniform rows: those elements go to MPFR. The
//!   policy terms' log-prob cotangent `sum c k'(d)` is one more source at
//!   the target ([`FastRow::policy_weight`]: `d` from the tier's log-prob,
//!   CORE-MATH `exp` / `expm1` one ulp outward, a clamp's edge inside the
//!   enclosure giving the hull with 0, as on MPFR). The soft cross-entropy's cotangent `c` is one more
//!   source at every entry: `C` loses `c sum_j p_j` (the teacher's, summed
//!   outward), and entry `j` gains `-c p_j / T`; where the teacher is close
//!   to the student the two cancel and the element goes to MPFR.
//!
//! Every bound is a function of computed f64 values only, evaluated with
//! upward rounding. The property test `reference/tests/fast_tier.rs` checks
//! every enclosure against a 320-bit MPFR evaluation over offsets up to
//! `1e30`, subnormals, near-uniform rows at real `V`, one-hot rows, masks,
//! ties, `-inf` and temperatures, and kills planted mutants of the tier.
//!
//! # Planted mutants
//!
//! [`Mutant`] (hidden from the docs) switches off one widening of this tier
//! at run time: the exp result not widened, `d_j` not widened, `S - 1` used
//! in place of `s`, the softcap's f64 `tanh` taken as exact. A run-time switch, not a `cfg`: the default
//! `cargo test` then tests the very code that ships (integration tests link
//! the library built without `cfg(test)`, and a custom `cfg` would rebuild
//! the dependency graph), and the switch is read outside the inner loop
//! (in the row-level bounds and the per-entry enclosure helpers), so it
//! costs nothing measurable.
//!
//! # Files
//!
//! - `pass.rs`: the exp pass over a family and its sums' bounds (F1)-(F6);
//! - `row.rs`: [`FastRow`], its row-level enclosures and forward decisions;
//! - `entries.rs`: the per-entry enclosures (`d_j`, `e_j`, `p_j`, `q_j`)
//!   and the row statistics;
//! - `grad.rs`: the VJP enclosures (F7) ([`FastVjp`]);
//! - `loss.rs`: the cross-entropy row term ([`FastRow::loss_term`]);
//! - `lanes.rs`: (F7') and (F8) of four plain VJP elements in one AVX2
//!   vector (the same bits as the scalar code);
//! - `decide.rs`: the decision (F8).
//!
//! The directed-rounding primitives sit at the bottom of the crate, in
//! `crate::interval`.

mod decide;
mod entries;
mod grad;
mod lanes;
mod loss;
mod pass;
mod row;

pub use decide::decide;
pub(crate) use decide::decide_signed;
pub use grad::{FastVjp, LossSide, RowCotangents};
pub use row::{FastForward, FastOptions, FastRow};

/// Which tier of the oracle computes results.
///
/// The values are the same correctly rounded values on every tier; only the
/// enclosures differ (the f64 tier's are a few f64 ulps wide, MPFR's about
/// one). Judges measure a candidate's absolute error against the far end of
/// the enclosure, so figures printed to four digits of the error of a
/// gradient that is almost exact move with that width: this is why the
/// default keeps the VJP's enclosures on MPFR.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Tier {
    /// Forward values and row statistics on the certified f64 tier where it
    /// decides, MPFR (Ziv's loop) for each output it leaves undecided; the
    /// VJP on MPFR.
    #[default]
    Fast,
    /// As [`Tier::Fast`], and the VJP elements too (f64 enclosures).
    FastVjp,
    /// The MPFR path only (for the property tests and benchmarks).
    Mpfr,
    /// The f64 tier (VJP included) with one planted bug (test-only).
    #[doc(hidden)]
    FastMutant(Mutant),
}

impl Tier {
    /// `None` for the MPFR path, `Some(mutant)` for the f64 tier.
    pub(crate) fn fast(self) -> Option<Option<Mutant>> {
        match self {
            Tier::Fast | Tier::FastVjp => Some(None),
            Tier::Mpfr => None,
            Tier::FastMutant(m) => Some(Some(m)),
        }
    }

    /// As [`Tier::fast`], for the VJP.
    pub(crate) fn fast_vjp(self) -> Option<Option<Mutant>> {
        match self {
            Tier::Fast => None,
            t => t.fast(),
        }
    }
}

/// A planted bug of the f64 tier (test-only; see the module docs).
#[doc(hidden)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mutant {
    /// `r_j` taken as the exact `exp(d_j)`.
    ExpNotWidened,
    /// `a^_j` taken as the exact shift.
    ShiftNotWidened,
    /// `s` taken as `fl(1 + s) - 1`.
    SMinusOne,
    /// The exact softcap's f64 `c tanh(x / c)` taken as exact (`eta = 0`, (F9)).
    TanhNotWidened,
}

/// Fallback counters: how many outputs (and rows) were computed, and how
/// many of them the MPFR path had to decide. Summed over calls with `+=`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Fallback {
    /// Outputs computed (forward values; grad elements; statistic rows).
    pub outputs: u64,
    /// Of those, decided by MPFR.
    pub outputs_mpfr: u64,
    /// Rows computed.
    pub rows: u64,
    /// Rows in which MPFR ran at all.
    pub rows_mpfr: u64,
}

impl Fallback {
    /// `outputs_mpfr / outputs` (0 when nothing was computed).
    pub fn output_rate(&self) -> f64 {
        ratio(self.outputs_mpfr, self.outputs)
    }

    /// `rows_mpfr / rows` (0 when nothing was computed).
    pub fn row_rate(&self) -> f64 {
        ratio(self.rows_mpfr, self.rows)
    }
}

fn ratio(a: u64, b: u64) -> f64 {
    if b == 0 {
        0.0
    } else {
        a as f64 / b as f64
    }
}

impl std::ops::AddAssign for Fallback {
    fn add_assign(&mut self, o: Fallback) {
        self.outputs += o.outputs;
        self.outputs_mpfr += o.outputs_mpfr;
        self.rows += o.rows;
        self.rows_mpfr += o.rows_mpfr;
    }
}
