//! The oracle's VJP entry points ([`Oracle::vjp`] and its counted and
//! pending forms): per row the f64 tier first, then the MPFR elements of
//! the parent module for what it left undecided.

use ndarray::Array2;
use rayon::prelude::*;

use super::super::{fast, first_error, row, Exact, Fallback, Oracle};
use crate::spec::{Cotangents, Dtype, Output, Problem, SpecError};

impl Oracle {
    /// Exact VJP: grad logits `[N, V_total]` for `cotangents` (padded
    /// columns exactly 0), correctly rounded to `target`. Units: nats per
    /// logit unit. The log-prob cotangent of an `ignore_index` row is taken
    /// as 0; a masked top-k id's cotangent is ignored (its log-prob is the
    /// constant `-inf`); a live id whose logit is `-inf` gets `G_k / T` from
    /// the formula (PyTorch's `log_softmax` backward does the same).
    /// With `TemperatureDtype::Input` the rounding of `z = x / T` is taken
    /// as the identity in the derivative (`dz/dx = 1/T`).
    ///
    /// # Errors
    /// The spec's validation errors ([`Problem::validate_cotangents`],
    /// [`Problem::validate`]) and those of [`Oracle::forward`].
    pub fn vjp(
        &self,
        problem: &Problem<'_>,
        cotangents: &Cotangents<'_>,
        target: Dtype,
    ) -> Result<Array2<Exact>, SpecError> {
        self.vjp_counted(problem, cotangents, target).map(|r| r.0)
    }

    /// [`Oracle::vjp`] with its [`Fallback`] counts (one output per
    /// element of the real vocabulary).
    ///
    /// # Errors
    /// As [`Oracle::vjp`].
    pub fn vjp_counted(
        &self,
        problem: &Problem<'_>,
        cotangents: &Cotangents<'_>,
        target: Dtype,
    ) -> Result<(Array2<Exact>, Fallback), SpecError> {
        let shape = problem.validate_shapes()?;
        problem.validate_cotangents(&shape, cotangents)?;
        let shape = problem.validate()?;
        let (n, vt, v) = (shape.n, shape.v_total, shape.vocab_size);
        let precs = self.precisions(target);
        let acc = shape.accumulation;
        let z_loss_coef = problem.options.effective_z_loss_coef(acc)?.unwrap_or(0.0);
        let eps = match problem.cross_entropy() {
            Some(ce) => ce.effective_label_smoothing(acc)?,
            None => 0.0,
        };
        // The mean's divisor `W`, summed exactly (every f64 term fits):
        // the whole problem's when the cotangents carry it (a view of some
        // of its rows), else this problem's rows'.
        let den = match (cotangents.get(Output::Loss), problem.loss_divisor_terms()) {
            (Some(_), Some(terms)) => {
                let mut w = rug::Float::new(super::EXACT_SUM_PREC);
                match cotangents.loss_divisor {
                    Some(d) => d.parts().iter().for_each(|&x| w += x),
                    None => terms.for_each(|x| w += x),
                }
                Some(std::sync::Arc::new(w))
            }
            _ => None,
        };
        // Each row writes its `[V]` elements straight into the `[N, V_total]`
        // result (padded columns stay 0): no per-row buffer, no copy.
        let mut flat = vec![Exact::point(0.0); n * vt];
        let row_vjp = |r: usize, out: &mut [Exact]| -> Result<Fallback, SpecError> {
            let loss = problem
                .loss_cotangent(cotangents, r)
                .map(|(g, w)| super::RowLoss {
                    g,
                    w,
                    den: den.clone(),
                    eps,
                    count: (0..v).filter(|&j| problem.allowed(r, j)).count() as u64,
                });
            let cot = super::RowCot {
                g: match (cotangents.column(Output::LogProbs), problem.has_target(r)) {
                    (Some(g), true) => g[r],
                    _ => 0.0,
                },
                h: cotangents.column(Output::Entropy).map_or(0.0, |h| h[r]),
                gk: cotangents
                    .get(Output::TopkLogProbs)
                    .map_or(Vec::new(), |gk| gk.row(r).to_vec()),
                lse: cotangents.column(Output::Lse).map_or(0.0, |a| a[r]),
                z_loss: cotangents.column(Output::ZLoss).map_or(0.0, |b| b[r]),
                z_loss_coef,
                loss,
                policy: problem.policy_cotangents(cotangents, r),
                kl: match problem.kl_cotangents(cotangents, r) {
                    (0.0, 0.0) => None,
                    (gf, gr) => problem.options.topk_kl.map(|kl| (gf, gr, kl)),
                },
                soft: problem.soft_cross_entropy_cotangent(cotangents, r),
            };
            let entropy = if cot.h != 0.0 {
                problem.options.entropy
            } else {
                None
            };
            let row = row::prepare(problem, &shape, r, entropy)?;
            Ok(self.vjp_row(row, &cot, target, &precs, &mut out[..v]))
        };
        let rows: Vec<Result<Fallback, SpecError>> = if vt == 0 {
            // No columns to write: still one preparation (and its errors) per row.
            let mut none: [Exact; 0] = [];
            (0..n).map(|r| row_vjp(r, &mut none)).collect()
        } else {
            flat.par_chunks_mut(vt)
                .enumerate()
                .map(|(r, out)| row_vjp(r, out))
                .collect()
        };
        let mut fallback = Fallback::default();
        for fb in first_error(rows)? {
            fallback += fb;
        }
        let grad = Array2::from_shape_vec((n, vt), flat).expect("N*V_total gradients");
        Ok((grad, fallback))
    }

    /// One row's VJP into `out` (`[V]`): the f64 tier first (unless
    /// [`Tier::Mpfr`](crate::oracle::Tier::Mpfr)), then MPFR for the
    /// elements it left undecided.
    fn vjp_row(
        &self,
        row: row::Row<'_>,
        cot: &super::RowCot,
        target: Dtype,
        precs: &[u32],
        out: &mut [Exact],
    ) -> Fallback {
        let v = row.v.len() as u64;
        // The f64 tier encloses the log-prob, entropy, top-k and top-k KL
        // terms only: another loss-side cotangent takes the MPFR path for
        // the row.
        // (F10) `lse`, `z_loss` and the cross-entropy are on the f64 tier
        // too (the policy terms are not).
        let loss_side = cot.fast_loss_side();
        let fast_mutant = self.tier.fast_vjp().filter(|_| loss_side.is_some());
        let Some(mutant) = fast_mutant else {
            out.copy_from_slice(&super::vjp_row(&row, cot, target, precs));
            return Fallback {
                outputs: v,
                outputs_mpfr: v,
                rows: 1,
                rows_mpfr: 1,
            };
        };
        let fast = fast::FastRow::from_row(
            row,
            fast::FastOptions {
                per_entry: true,
                mutant,
                ..Default::default()
            },
        );
        let kl_w = match cot.kl {
            Some((gf, gr, kl)) => fast.kl_slopes(gf, gr, &kl),
            None => Some((Vec::new(), false)),
        };
        let (kl_w, kl_sum_zero) = kl_w.unwrap_or_default();
        let policy_w = (!cot.policy.is_empty())
            .then(|| fast.policy_weight(&cot.policy))
            .flatten();
        let rc = fast::RowCotangents {
            g: cot.g,
            h: cot.h,
            topk: &cot.gk,
            kl: cot.kl,
            kl_w: &kl_w,
            kl_sum_zero,
            loss_side: loss_side.as_ref().and_then(Option::as_ref),
            policy: &cot.policy,
            policy_w,
        };
        let mut pending = Vec::new();
        if fast.vjp_applicable() && (cot.kl.is_none() || !kl_w.is_empty()) {
            fast.vjp(&rc).decide_slice(target, out, &mut pending);
        } else {
            out.fill(Exact::point(0.0));
            pending = (0..v as usize).collect();
        }
        let mut fb = Fallback {
            outputs: v,
            outputs_mpfr: pending.len() as u64,
            rows: 1,
            rows_mpfr: 0,
        };
        if !pending.is_empty() {
            fb.rows_mpfr = 1;
            for (j, e) in super::vjp_entries(fast.prepared(), cot, target, precs, pending) {
                out[j] = e;
            }
        }
        fb
    }

    /// The MPFR VJP elements `pending` (indices `< V`) of the row prepared
    /// in `fast`, for `cotangents`, correctly rounded to `target` (Ziv's
    /// loop): `(index, element)` for each, in increasing index order.
    /// For the elements [`fast::FastVjp::decide_into`] left undecided; the
    /// row's entropy family must be prepared when `h != 0`. Units: nats
    /// per logit unit. Memory: `O(|pending|)` beside the prepared row when
    /// they are few (under `V / 8`), else `O(V)`.
    pub fn vjp_pending(
        &self,
        fast: &fast::FastRow<'_>,
        cotangents: &fast::RowCotangents<'_>,
        target: Dtype,
        pending: Vec<usize>,
    ) -> Vec<(usize, Exact)> {
        let ls = cotangents.loss_side;
        let cot = super::RowCot {
            g: cotangents.g,
            h: cotangents.h,
            gk: cotangents.topk.to_vec(),
            kl: cotangents.kl,
            lse: ls.map_or(0.0, |l| l.lse),
            z_loss: ls.map_or(0.0, |l| l.z_loss),
            z_loss_coef: ls.map_or(0.0, |l| l.z_loss_coef),
            loss: ls.and_then(|l| {
                let (g, w) = l.loss?;
                let den = l.divisor.as_ref().map(|parts| {
                    let mut d = rug::Float::new(super::EXACT_SUM_PREC);
                    parts.iter().for_each(|&x| d += x);
                    std::sync::Arc::new(d)
                });
                Some(super::RowLoss {
                    g,
                    w,
                    den,
                    eps: l.eps,
                    count: l.count,
                })
            }),
            soft: ls.map_or(0.0, |l| l.soft),
            policy: cotangents.policy.to_vec(),
        };
        super::vjp_entries(
            fast.prepared(),
            &cot,
            target,
            &self.precisions(target),
            pending,
        )
    }
}
