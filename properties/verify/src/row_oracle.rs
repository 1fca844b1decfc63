//! One oracle pass per row for `verify`: the row statistics, the forward
//! values and the VJP elements of a row all come from one
//! [`FastRow`] (the certified f64 tier: one CORE-MATH `exp` per entry and
//! family, `docs/fast-oracle.md`); MPFR runs only for the statistics,
//! outputs and elements that tier leaves undecided, reusing the prepared
//! row. The [`Fallback`] counts say how many it had to decide.
//!
//! The VJP comes from the same pass under [`Tier::Fast`] too (as under
//! `Tier::FastVjp`): one pass per row is the point (issue 12). Its values
//! are the same correctly rounded ones; only the enclosures are a few f64
//! ulps wide instead of about one, so a reported gradient error, measured
//! to the far end, can differ from the MPFR path's in its last digits.
//! With [`Tier::Mpfr`] every value comes from the MPFR path (the public
//! [`Oracle`] calls), for comparisons.
//!
//! Memory: the prepared row keeps `16` bytes per entry and family, the
//! statistics `32` bytes per entry (`d`, `e`), the VJP `[V_total]` results:
//! `O(V)` per worker. MPFR, for the few elements the tier leaves undecided,
//! keeps state for those elements only ([`Oracle::vjp_pending`]).

use ndarray::Array2;

use logprobe_reference::oracle::fast::{FastOptions, FastRow, LossSide, RowCotangents};
use logprobe_reference::oracle::{Exact, Fallback, Oracle, OracleForward, RowStats, Tier};
use logprobe_reference::spec::{Cotangents, Dtype, EntropyLogits, Output, Problem, SpecError};

/// The oracle values of one row of a one-row problem, from one pass.
pub(crate) struct RowOracle<'p, 'a> {
    oracle: Oracle,
    problem: &'p Problem<'a>,
    /// The prepared pass (`None` under [`Tier::Mpfr`]).
    fast: Option<FastRow<'a>>,
    /// Forward outputs, VJP elements and statistics rows computed, and how
    /// many MPFR decided.
    pub fallback: Fallback,
    /// Whether MPFR ran for anything in this row.
    pub mpfr_ran: bool,
}

impl<'p, 'a> RowOracle<'p, 'a> {
    /// Prepares row 0 of `problem` (a one-row problem) and its statistics
    /// (entropy family per `options.entropy`, unmasked when `None`, as
    /// [`Oracle::row_stats`]), returned beside it (`p`, `q` empty on the
    /// f64 tier: the tolerance model reads `d` and `e`). `vjp`: whether
    /// [`RowOracle::vjp`] will be called (the pass then keeps each entry's
    /// shift and exp for it, `17` bytes per entry and family; without, a
    /// forward-only row writes nothing per entry). The row must have been
    /// validated already ([`Problem::validate_row`]: `verify_dump` does so
    /// for every selected row before any oracle work), so the f64 tier
    /// does not check it again.
    ///
    /// # Errors
    /// The spec's validation errors for the row (those of [`FastRow::new`]).
    pub fn new(
        oracle: &Oracle,
        problem: &'p Problem<'a>,
        vjp: bool,
    ) -> Result<(Self, RowStats), SpecError> {
        if oracle.tier == Tier::Mpfr {
            let (stats, fallback) = oracle.row_stats_counted(problem, 0)?;
            let ro = RowOracle {
                oracle: *oracle,
                problem,
                fast: None,
                fallback,
                mpfr_ran: true,
            };
            return Ok((ro, stats));
        }
        let fast = FastRow::new(
            problem,
            0,
            FastOptions {
                entropy: Some(problem.options.entropy.unwrap_or(EntropyLogits::Unmasked)),
                per_entry: vjp,
                m2: true,
                row_validated: true,
                ..Default::default()
            },
        )?;
        let decided = fast.stats_decided();
        let stats = if decided {
            fast.row_stats_shifts_in(crate::scratch::take(), crate::scratch::take())
        } else {
            oracle.row_stats_mpfr(&fast)
        };
        let ro = RowOracle {
            oracle: *oracle,
            problem,
            fast: Some(fast),
            fallback: Fallback {
                outputs: 1,
                outputs_mpfr: u64::from(!decided),
                rows: 0,
                rows_mpfr: 0,
            },
            mpfr_ran: !decided,
        };
        Ok((ro, stats))
    }

    /// The forward values in `target` (one row: `[1]`, `[1, K]`), as
    /// [`Oracle::forward`] returns them; the entropy only when the
    /// problem's options ask for it.
    ///
    /// # Errors
    /// Those of [`Oracle::forward`] (MPFR path only; the row was validated).
    pub fn forward(&mut self, target: Dtype) -> Result<OracleForward, SpecError> {
        let Some(fast) = &self.fast else {
            let f = self.oracle.forward(self.problem, target)?;
            self.fallback.outputs += f.fallback.outputs;
            self.fallback.outputs_mpfr += f.fallback.outputs_mpfr;
            return Ok(f);
        };
        let mut ff = fast.forward(target);
        if self.problem.options.entropy.is_none() {
            ff.entropy = None;
        }
        let (rf, fb) = self.oracle.complete_forward(self.problem, fast, target, ff);
        self.fallback.outputs += fb.outputs;
        self.fallback.outputs_mpfr += fb.outputs_mpfr;
        self.mpfr_ran |= fb.rows_mpfr > 0;
        Ok(OracleForward {
            dtype: target,
            lse: vec![rf.lse],
            values: rf.values.map(|_, v| {
                let w = v.len();
                Array2::from_shape_vec((1, w), v).expect("one row of results")
            }),
            fallback: fb,
        })
    }

    /// Grad logits `[1, V_total]` in `target` for `cotangents` (padded
    /// columns exactly 0), as [`Oracle::vjp`] returns them: the f64 tier's
    /// decided elements, MPFR for the others.
    ///
    /// # Errors
    /// Those of [`Oracle::vjp`] (cotangent validation).
    pub fn vjp(
        &mut self,
        cotangents: &Cotangents<'_>,
        target: Dtype,
    ) -> Result<Array2<Exact>, SpecError> {
        // The f64 tier has the loss side's `grad_lse`, `grad_z_loss` and
        // `grad_loss` ((F10), [`LossSide`]) and the policy terms' weight at
        // the target ([`FastRow::policy_weight`]). The top-k KL's (`grad_forward_kl`, `grad_reverse_kl`)
        // it has, as slopes on the top-k log-probs
        // ([`FastRow::kl_slopes`]), unless they are not finite there.
        // Validated first: the cotangents are read below.
        let shape = self.problem.validate_shapes()?;
        self.problem.validate_cotangents(&shape, cotangents)?;
        let loss_side = self.loss_side(cotangents, shape.dtype.accumulation())?;
        // (F10) The policy terms' weight at the target, on the tier too.
        let policy = self.problem.policy_cotangents(cotangents, 0);
        let kl = match self.problem.kl_cotangents(cotangents, 0) {
            (0.0, 0.0) => None,
            (gf, gr) => self.problem.options.topk_kl.map(|kl| (gf, gr, kl)),
        };
        let kl_w = match (&self.fast, kl) {
            (Some(fast), Some((gf, gr, k))) => fast.kl_slopes(gf, gr, &k),
            _ => Some((Vec::new(), false)),
        };
        let fast = match (&self.fast, &kl_w) {
            (Some(fast), Some(_)) if loss_side.is_some() => fast,
            _ => {
                let (g, fb) = self.oracle.vjp_counted(self.problem, cotangents, target)?;
                self.fallback.outputs += fb.outputs;
                self.fallback.outputs_mpfr += fb.outputs_mpfr;
                self.mpfr_ran |= fb.rows_mpfr > 0;
                return Ok(g);
            }
        };
        let gk: Vec<f64> = cotangents
            .get(Output::TopkLogProbs)
            .map_or(Vec::new(), |a| a.row(0).to_vec());
        let rc = RowCotangents {
            g: match cotangents.column(Output::LogProbs) {
                Some(g) if self.problem.has_target(0) => g[0],
                _ => 0.0,
            },
            h: cotangents.column(Output::Entropy).map_or(0.0, |h| h[0]),
            topk: &gk,
            kl,
            kl_w: kl_w.as_ref().map_or(&[], |w| &w.0),
            kl_sum_zero: kl_w.as_ref().is_some_and(|w| w.1),
            loss_side: loss_side.as_ref().and_then(Option::as_ref),
            policy: &policy,
            policy_w: (!policy.is_empty())
                .then(|| fast.policy_weight(&policy))
                .flatten(),
        };
        let v = fast.vocab_size();
        let (mut out, mut pending) = (Vec::with_capacity(shape.v_total), Vec::new());
        if fast.vjp_applicable() {
            fast.vjp(&rc).decide_into(target, &mut out, &mut pending);
        } else {
            out = vec![Exact::point(0.0); v];
            pending = (0..v).collect();
        }
        self.fallback.outputs += v as u64;
        self.fallback.outputs_mpfr += pending.len() as u64;
        if !pending.is_empty() {
            self.mpfr_ran = true;
            for (j, e) in self.oracle.vjp_pending(fast, &rc, target, pending) {
                out[j] = e;
            }
        }
        out.resize(shape.v_total, Exact::point(0.0));
        Ok(Array2::from_shape_vec((1, shape.v_total), out).expect("V_total gradients"))
    }

    /// The row's loss-side cotangents on the f64 tier: `Some(None)` when
    /// it has none, `Some(Some(_))` when the tier has them all ((F10): `lse`,
    /// `z_loss`, the cross-entropy), `None` when the row must take the MPFR
    /// path (a `mean` divisor of 0).
    ///
    /// # Errors
    /// The spec's errors of the effective `z_loss_coef` and label smoothing.
    fn loss_side(
        &self,
        cotangents: &Cotangents<'_>,
        acc: Dtype,
    ) -> Result<Option<Option<LossSide>>, SpecError> {
        let p = self.problem;
        let lse = cotangents.column(Output::Lse).map_or(0.0, |a| a[0]);
        let z_loss = cotangents.column(Output::ZLoss).map_or(0.0, |b| b[0]);
        let z_loss_coef = p.options.effective_z_loss_coef(acc)?.unwrap_or(0.0);
        let loss = p.loss_cotangent(cotangents, 0);
        let soft = p.soft_cross_entropy_cotangent(cotangents, 0);
        if lse == 0.0 && (z_loss == 0.0 || z_loss_coef == 0.0) && loss.is_none() && soft == 0.0 {
            return Ok(Some(None));
        }
        let (eps, mean) = match p.cross_entropy() {
            Some(ce) => (
                ce.effective_label_smoothing(acc)?,
                ce.reduction == logprobe_reference::spec::Reduction::Mean,
            ),
            None => (0.0, false),
        };
        let divisor = match (loss, mean) {
            (Some(_), true) => Some(match cotangents.loss_divisor {
                Some(d) => d.parts().to_vec(),
                None => p.loss_divisor_terms().map_or(Vec::new(), |t| t.collect()),
            }),
            _ => None,
        };
        if divisor
            .as_ref()
            .is_some_and(|d| d.iter().sum::<f64>() <= 0.0)
        {
            return Ok(None);
        }
        let v = p.validate_shapes()?.vocab_size;
        Ok(Some(Some(LossSide {
            lse,
            z_loss,
            z_loss_coef,
            loss,
            divisor,
            eps,
            count: (0..v).filter(|&j| p.allowed(0, j)).count() as u64,
            soft,
        })))
    }

    /// The row's counts, the row itself included (`rows = 1`,
    /// `rows_mpfr = 1` when MPFR ran for anything).
    pub fn finish(&self) -> Fallback {
        Fallback {
            rows: 1,
            rows_mpfr: u64::from(self.mpfr_ran),
            ..self.fallback
        }
    }
}
