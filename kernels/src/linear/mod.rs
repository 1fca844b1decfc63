//! A fused linear + cross-entropy kernel on the CPU (issue 45): the
//! algorithm of Liger's fused linear cross-entropy and Cut Cross-Entropy,
//! which fold the LM head's matmul into the loss and never hold the `[N,
//! V]` logits. Rows are taken `row_chunk` at a time and the vocabulary
//! `vocab_chunk` columns at a time; a `[row_chunk, vocab_chunk]` block of
//! logits is computed, used and dropped, so the extra memory is
//! `O(row_chunk * vocab_chunk + N)` whatever `V` (outputs aside).
//!
//! Forward (two passes over the vocabulary, no rescaling): the row's max
//! of `z = softcap(x) / T`, then `S = sum exp(z - m)` and `B = sum exp(z -
//! m) (z - m)` in one sequential f32 accumulator each; `lse = m + ln S`,
//! `log_prob = z_t - lse`, `entropy = ln S - B / S`. Backward for a
//! log-prob cotangent `c`: a third pass forms `g_j = c ([j = t] - p_j)
//! f_j / T` (`f` the softcap's factor `1 - tanh^2`), keeps it in the
//! logits' dtype, and accumulates `grad_hidden += g W`, `grad_weight += g^T
//! h`, `grad_bias += sum g` in f32, rounding to the inputs' dtype once at
//! the end. Logits: `x = fl32(h . W_j)` in order over `H`, then (under
//! [`LinearLogits::Input`] with bf16 inputs) rounded to bf16, `+ b` and
//! rounded again, as PyTorch's bf16 `hidden @ W.T + b` does; under
//! [`LinearLogits::Accumulation`] kept in f32. Judged by TOLERANCE.md
//! (T29), (T30) under the `sequential` model.

use half::bf16;
use ndarray::{Array2, ArrayView1, ArrayView2};

use logprobe_reference::spec::{Dtype, SpecError};

use crate::kernel::KernelError;

mod sharded;

pub use sharded::{ShardFault, ShardedLinear};

/// Where the kernel keeps its logits, and their gradient, between the
/// matmul and the loss (the dump's `lm_head_logits_dtype`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum LinearLogits {
    /// Rounded to the inputs' dtype (Liger's bf16 chunks).
    #[default]
    Input,
    /// Kept in f32 (Cut Cross-Entropy).
    Accumulation,
}

/// A fault planted in [`FusedLinear`] (the test kit's mutants of the
/// LM head's gradients; `None` in every real use).
#[doc(hidden)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum LinearFault {
    /// The correct kernel.
    #[default]
    None,
    /// `grad_weight` / `grad_bias` accumulated in bf16 across row chunks.
    Bf16GradAccumulation,
    /// The last row chunk, when partial, never reaches `grad_weight` /
    /// `grad_bias`.
    DroppedRemainder,
    /// The bias in the forward only: `grad_bias` stays 0.
    BiasForwardOnly,
    /// The backward omits the softcap's factor.
    SoftcapBackwardMissing,
}

/// The fused kernel's configuration.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FusedLinear {
    /// Rows per block (`>= 1`).
    pub row_chunk: usize,
    /// Vocabulary columns per block (`>= 1`).
    pub vocab_chunk: usize,
    /// Where the logits are kept.
    pub logits: LinearLogits,
    /// A planted fault (mutation testing only).
    #[doc(hidden)]
    pub fault: LinearFault,
}

/// A fused linear + cross-entropy problem. Values are f32 holding values
/// of `dtype` exactly.
#[derive(Clone, Copy, Debug)]
pub struct LinearProblem<'a> {
    /// `hidden [N, H]`.
    pub hidden: ArrayView2<'a, f32>,
    /// `lm_head_weight [V, H]`.
    pub weight: ArrayView2<'a, f32>,
    /// `lm_head_bias [V]`.
    pub bias: Option<ArrayView1<'a, f32>>,
    /// The inputs' dtype (bf16 or f32): the matmul's, and the gradients'.
    pub dtype: Dtype,
    /// Target ids `[N]` (`ignore_index`: no log-prob, zero gradient).
    pub tokens: ArrayView1<'a, i64>,
    /// Temperature `T > 0` (rounded to f32).
    pub temperature: f64,
    /// Gemma 2's softcap `c` of the raw logits (rounded to f32).
    pub softcap: Option<f64>,
    /// Rows with this token are skipped.
    pub ignore_index: i64,
}

/// Forward outputs `[N]` each (f32; 0 on ignored rows' log-probs).
#[derive(Clone, Debug, PartialEq)]
pub struct LinearForward {
    /// `log_softmax(z)[t]` (nats).
    pub log_probs: Vec<f32>,
    /// Entropy of `softmax(z)` (nats).
    pub entropy: Vec<f32>,
    /// `logsumexp(z)` (nats).
    pub lse: Vec<f32>,
}

/// The LM head's gradients, in the inputs' dtype (as f32 values).
#[derive(Clone, Debug, PartialEq)]
pub struct LinearGrads {
    /// `grad_hidden [N, H]`.
    pub grad_hidden: Array2<f32>,
    /// `grad_lm_head_weight [V, H]`.
    pub grad_weight: Array2<f32>,
    /// `grad_lm_head_bias [V]`.
    pub grad_bias: Vec<f32>,
}

/// A row's statistics from the first two passes (`z_t` is 0 where the
/// target is not in the block of the vocabulary summed).
#[derive(Clone, Copy, Debug)]
pub(crate) struct RowStat {
    pub(crate) m: f32,
    pub(crate) s: f32,
    pub(crate) b: f32,
    pub(crate) z_t: f32,
}

impl RowStat {
    /// `lse = m + ln S` (f32).
    pub(crate) fn lse(&self) -> f32 {
        self.m + (self.s as f64).ln() as f32
    }

    /// Row `r`'s outputs: `lse`, `entropy = ln S - B / S` and (where the
    /// row has a target) `log_prob = (z_t - m) - ln S`.
    pub(crate) fn write(&self, r: usize, has_target: bool, out: &mut LinearForward) {
        let ell = (self.s as f64).ln() as f32;
        out.lse[r] = self.m + ell;
        out.entropy[r] = ell - self.b / self.s;
        if has_target {
            out.log_probs[r] = (self.z_t - self.m) - ell;
        }
    }
}

/// Each row's target column (`None` on an `ignore_index` row).
pub(crate) fn targets(p: &LinearProblem<'_>) -> Vec<Option<usize>> {
    p.tokens
        .iter()
        .map(|&t| (t != p.ignore_index).then_some(t as usize))
        .collect()
}

/// Each row's log-prob cotangent in f32 (0 on an `ignore_index` row).
pub(crate) fn cotangents(p: &LinearProblem<'_>, grad_log_probs: &[f64]) -> Vec<f32> {
    p.tokens
        .iter()
        .zip(grad_log_probs)
        .map(|(&t, &c)| if t == p.ignore_index { 0.0 } else { c as f32 })
        .collect()
}

/// `grad_log_probs` has one entry per row.
pub(crate) fn check_cotangents(
    p: &LinearProblem<'_>,
    grad_log_probs: &[f64],
) -> Result<(), KernelError> {
    let n = p.hidden.nrows();
    if grad_log_probs.len() != n {
        return Err(SpecError::ShapeMismatch {
            tensor: "grad_log_probs",
            expected: vec![n],
            found: vec![grad_log_probs.len()],
        }
        .into());
    }
    Ok(())
}

/// The f32 sums rounded once to the inputs' dtype.
pub(crate) fn finish(
    dtype: Dtype,
    mut gh: Array2<f32>,
    mut gw: Array2<f32>,
    gb: Vec<f32>,
) -> LinearGrads {
    gh.mapv_inplace(|x| round_to(dtype, x));
    gw.mapv_inplace(|x| round_to(dtype, x));
    LinearGrads {
        grad_hidden: gh,
        grad_weight: gw,
        grad_bias: gb.into_iter().map(|x| round_to(dtype, x)).collect(),
    }
}

fn round_to(dtype: Dtype, x: f32) -> f32 {
    match dtype {
        Dtype::Bf16 => bf16::from_f32(x).to_f32(),
        _ => x,
    }
}

impl FusedLinear {
    /// A correct kernel with these chunk sizes.
    pub fn new(row_chunk: usize, vocab_chunk: usize, logits: LinearLogits) -> Self {
        FusedLinear {
            row_chunk,
            vocab_chunk,
            logits,
            fault: LinearFault::None,
        }
    }

    fn check(&self, p: &LinearProblem<'_>) -> Result<(f32, Option<f32>), KernelError> {
        let unsupported = |what| {
            Err(KernelError::Unsupported {
                kernel: "fused-linear".into(),
                what,
            })
        };
        if self.row_chunk == 0 || self.vocab_chunk == 0 {
            return unsupported("a chunk size of 0");
        }
        if !matches!(p.dtype, Dtype::Bf16 | Dtype::F32) {
            return unsupported("inputs other than bf16 and f32");
        }
        let (n, h) = p.hidden.dim();
        let v = p.weight.nrows();
        if p.weight.ncols() != h || p.tokens.len() != n || p.bias.is_some_and(|b| b.len() != v) {
            return Err(SpecError::ShapeMismatch {
                tensor: "lm_head_weight",
                expected: vec![v, h],
                found: p.weight.shape().to_vec(),
            }
            .into());
        }
        for (r, &t) in p.tokens.iter().enumerate() {
            if t != p.ignore_index && !(0..v as i64).contains(&t) {
                return Err(SpecError::TokenOutOfRange {
                    row: r,
                    token: t,
                    vocab_size: v,
                }
                .into());
            }
        }
        let t = p.temperature as f32;
        if !(t > 0.0 && t.is_finite()) {
            return Err(SpecError::BadTemperature {
                temperature: p.temperature,
            }
            .into());
        }
        Ok((t, p.softcap.map(|c| c as f32)))
    }

    /// Logits block `[rows, cols]` into `out` (row-major), with the
    /// softcap's factor `1 - tanh^2` into `factor` when there is one.
    fn block(
        &self,
        p: &LinearProblem<'_>,
        rows: std::ops::Range<usize>,
        cols: std::ops::Range<usize>,
        (t, cap): (f32, Option<f32>),
        out: &mut Vec<f32>,
        factor: &mut Vec<f32>,
    ) {
        out.clear();
        factor.clear();
        let keep = self.logits == LinearLogits::Input;
        for r in rows {
            let h = p.hidden.row(r);
            for j in cols.clone() {
                let w = p.weight.row(j);
                let mut x = 0f32;
                for (a, b) in h.iter().zip(w.iter()) {
                    x += a * b;
                }
                if keep {
                    x = round_to(p.dtype, x);
                }
                if let Some(b) = p.bias {
                    x += b[j];
                    if keep {
                        x = round_to(p.dtype, x);
                    }
                }
                if let Some(c) = cap {
                    let th = (x / c).tanh();
                    x = c * th;
                    factor.push(1.0 - th * th);
                }
                out.push(x / t);
            }
        }
    }

    /// Pass 1: each row's max of `z` over this block of the vocabulary.
    pub(crate) fn max_pass(
        &self,
        p: &LinearProblem<'_>,
        rows: std::ops::Range<usize>,
        tc: (f32, Option<f32>),
    ) -> Vec<f32> {
        let v = p.weight.nrows();
        let (mut z, mut f) = (Vec::new(), Vec::new());
        let mut m = vec![f32::NEG_INFINITY; rows.len()];
        for c0 in (0..v).step_by(self.vocab_chunk) {
            let cols = c0..(c0 + self.vocab_chunk).min(v);
            self.block(p, rows.clone(), cols.clone(), tc, &mut z, &mut f);
            for (i, mi) in m.iter_mut().enumerate() {
                for &zj in &z[i * cols.len()..(i + 1) * cols.len()] {
                    *mi = mi.max(zj);
                }
            }
        }
        m
    }

    /// Pass 2: `S = sum exp(z - m)`, `B = sum exp(z - m) (z - m)` in
    /// vocabulary order, and `z_t` where the row's `target` (a column of
    /// this block of the vocabulary) is `Some`.
    pub(crate) fn sum_pass(
        &self,
        p: &LinearProblem<'_>,
        rows: std::ops::Range<usize>,
        tc: (f32, Option<f32>),
        m: &[f32],
        target: &[Option<usize>],
    ) -> Vec<RowStat> {
        let v = p.weight.nrows();
        let (mut z, mut f) = (Vec::new(), Vec::new());
        let mut st: Vec<RowStat> = m
            .iter()
            .map(|&m| RowStat {
                m,
                s: 0.0,
                b: 0.0,
                z_t: 0.0,
            })
            .collect();
        for c0 in (0..v).step_by(self.vocab_chunk) {
            let cols = c0..(c0 + self.vocab_chunk).min(v);
            self.block(p, rows.clone(), cols.clone(), tc, &mut z, &mut f);
            for (i, r) in rows.clone().enumerate() {
                let zr = &z[i * cols.len()..(i + 1) * cols.len()];
                let s = &mut st[i];
                for (j, &zj) in cols.clone().zip(zr) {
                    let d = zj - s.m;
                    let e = crate::exp::exp_f32_nonpos(d);
                    s.s += e;
                    s.b += e * d;
                    if target[r] == Some(j) {
                        s.z_t = zj;
                    }
                }
            }
        }
        st
    }

    /// The rows' statistics (passes 1 and 2).
    fn stats(
        &self,
        p: &LinearProblem<'_>,
        rows: std::ops::Range<usize>,
        tc: (f32, Option<f32>),
        target: &[Option<usize>],
    ) -> Vec<RowStat> {
        let m = self.max_pass(p, rows.clone(), tc);
        self.sum_pass(p, rows, tc, &m, target)
    }

    /// Pass 3 over a block of rows: `g_j = c ([j = t] - p_j) f_j / T` from
    /// the rows' `lse`, kept in the logits' dtype; `grad_hidden`'s rows
    /// (all of `gh`'s rows, indexed from `rows.start`) take `g W`, and
    /// `gw` / `gb` (this block of the vocabulary) take `g^T h` and `sum g`
    /// unless `to_weight` is false. All in f32, unrounded.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn grad_pass(
        &self,
        p: &LinearProblem<'_>,
        rows: std::ops::Range<usize>,
        tc: (f32, Option<f32>),
        lse: &[f32],
        (cot, target): (&[f32], &[Option<usize>]),
        to_weight: bool,
        (gh, gw, gb): (&mut Array2<f32>, &mut Array2<f32>, &mut [f32]),
    ) {
        let (v, h) = p.weight.dim();
        let keep = self.logits == LinearLogits::Input;
        let (mut z, mut f) = (Vec::new(), Vec::new());
        for c0 in (0..v).step_by(self.vocab_chunk) {
            let cols = c0..(c0 + self.vocab_chunk).min(v);
            self.block(p, rows.clone(), cols.clone(), tc, &mut z, &mut f);
            let mut upd_w = vec![0f32; cols.len() * h];
            let mut upd_b = vec![0f32; cols.len()];
            for (i, r) in rows.clone().enumerate() {
                let c = cot[r];
                for (jj, j) in cols.clone().enumerate() {
                    let k = i * cols.len() + jj;
                    let pj = crate::exp::exp_f32(z[k] - lse[i]);
                    let onehot = if target[r] == Some(j) { 1.0 } else { 0.0 };
                    let mut g = c * (onehot - pj) / tc.0;
                    if tc.1.is_some() && self.fault != LinearFault::SoftcapBackwardMissing {
                        g *= f[k];
                    }
                    if keep {
                        g = round_to(p.dtype, g);
                    }
                    let w = p.weight.row(j);
                    for (a, &b) in gh.row_mut(r).iter_mut().zip(w.iter()) {
                        *a += g * b;
                    }
                    for (a, &b) in upd_w[jj * h..(jj + 1) * h]
                        .iter_mut()
                        .zip(p.hidden.row(r).iter())
                    {
                        *a += g * b;
                    }
                    upd_b[jj] += g;
                }
            }
            if to_weight {
                let bf = self.fault == LinearFault::Bf16GradAccumulation;
                let add = |a: f32, u: f32| {
                    if bf {
                        round_to(Dtype::Bf16, a + u)
                    } else {
                        a + u
                    }
                };
                for (jj, j) in cols.clone().enumerate() {
                    for (a, &u) in gw.row_mut(j).iter_mut().zip(&upd_w[jj * h..(jj + 1) * h]) {
                        *a = add(*a, u);
                    }
                    if self.fault != LinearFault::BiasForwardOnly {
                        gb[j] = add(gb[j], upd_b[jj]);
                    }
                }
            }
        }
    }

    /// Log-probs, entropy and lse (f32).
    ///
    /// # Errors
    /// [`KernelError::Spec`] for bad shapes, tokens or temperature;
    /// [`KernelError::Unsupported`] for a chunk size of 0 or other dtypes.
    pub fn forward(&self, p: &LinearProblem<'_>) -> Result<LinearForward, KernelError> {
        let tc = self.check(p)?;
        let target = targets(p);
        let n = p.hidden.nrows();
        let mut out = LinearForward {
            log_probs: vec![0.0; n],
            entropy: vec![0.0; n],
            lse: vec![0.0; n],
        };
        for r0 in (0..n).step_by(self.row_chunk) {
            let rows = r0..(r0 + self.row_chunk).min(n);
            for (i, s) in self
                .stats(p, rows.clone(), tc, &target)
                .into_iter()
                .enumerate()
            {
                s.write(r0 + i, target[r0 + i].is_some(), &mut out);
            }
        }
        Ok(out)
    }

    /// The LM head's gradients for log-prob cotangents `grad_log_probs
    /// [N]` (0 on ignored rows), rounded to the inputs' dtype.
    ///
    /// # Errors
    /// As [`FusedLinear::forward`].
    pub fn backward(
        &self,
        p: &LinearProblem<'_>,
        grad_log_probs: &[f64],
    ) -> Result<LinearGrads, KernelError> {
        let tc = self.check(p)?;
        check_cotangents(p, grad_log_probs)?;
        let target = targets(p);
        let cot = cotangents(p, grad_log_probs);
        let ((n, h), v) = (p.hidden.dim(), p.weight.nrows());
        let mut gh = Array2::<f32>::zeros((n, h));
        let mut gw = Array2::<f32>::zeros((v, h));
        let mut gb = vec![0f32; v];
        for r0 in (0..n).step_by(self.row_chunk) {
            let rows = r0..(r0 + self.row_chunk).min(n);
            let lse: Vec<f32> = self
                .stats(p, rows.clone(), tc, &target)
                .iter()
                .map(RowStat::lse)
                .collect();
            let partial = rows.len() < self.row_chunk;
            let to_weight = !(self.fault == LinearFault::DroppedRemainder && partial);
            self.grad_pass(
                p,
                rows,
                tc,
                &lse,
                (&cot, &target),
                to_weight,
                (&mut gh, &mut gw, &mut gb),
            );
        }
        Ok(finish(p.dtype, gh, gw, gb))
    }
}
