//! The CPU VJP over a whole problem: call parameters, every row's
//! statistics first, then the rows' write passes (fused, chunked or in place).

use super::*;

fn params<A: Acc>(
    problem: &Problem<'_>,
    shape: &Shape,
    cot: &Cotangents<'_>,
    widths: &[usize],
) -> CallParams<A> {
    let mut p = CallParams::<A>::new(problem, shape);
    p.ranges = shard_ranges(widths, shape.vocab_size);
    if cot.column(Output::Entropy).is_none() {
        p.entropy = None;
    }
    if let (Some(_), Some(ce)) = (cot.column(Output::Loss), problem.cross_entropy()) {
        // Validated before (`Problem::validate`): eps in [0, 1].
        let eps = ce
            .effective_label_smoothing(shape.dtype.accumulation())
            .unwrap_or(0.0);
        let divisor = (ce.reduction == Reduction::Mean)
            .then(|| {
                let counted = |r: usize| problem.has_target(r);
                // The whole problem's `W` when these rows are a view of it.
                if let Some(d) = cot.loss_divisor {
                    let parts = d.parts();
                    return pairwise_sum(0..parts.len(), &|i| A::from_f64(parts[i]));
                }
                match ce.loss_weights {
                    Some(_) => pairwise_sum(0..shape.n, &|r| {
                        if counted(r) {
                            A::from_f64(ce.weight(r))
                        } else {
                            A::ZERO
                        }
                    }),
                    None => A::from_f64((0..shape.n).filter(|&r| counted(r)).count() as f64),
                }
            })
            .filter(|&d| d != A::ZERO);
        p.loss_grad = Some(LossGrad {
            eps: A::from_f64(eps),
            divisor,
        });
    }
    p
}

fn masked_entropy(problem: &Problem<'_>) -> bool {
    problem.options.entropy == Some(logprobe_reference::spec::EntropyLogits::Masked)
}

/// Stats of every row of `lv` (the first error in row order wins).
fn all_stats<T: Input>(
    problem: &Problem<'_>,
    shape: &Shape,
    lv: &ArrayView2<'_, T>,
    p: &CallParams<T::Acc>,
) -> Result<Vec<RowStats<T::Acc>>, SpecError> {
    let rows: Vec<Result<RowStats<T::Acc>, SpecError>> = (0..shape.n)
        .into_par_iter()
        .map(|r| {
            let src = typed_row(lv, r, p);
            if ids_suspect(problem, &src, r, p.v) {
                return Err(row_error(problem, shape, r));
            }
            row_stats(&src, mask_row(problem.sampling_mask, r), p)
                .map_err(|_| row_error(problem, shape, r))
        })
        .collect();
    rows.into_iter().collect()
}

/// The gradient of every row into `grad` (`[N, V_total]`, row-major)
/// through `sink`. Fused staging: per row its stats, then its write pass
/// (the row is read twice while it is still in cache); rows in parallel.
#[allow(clippy::too_many_arguments)]
fn backward_rows<T: Input, K: GradSink<T::Acc>>(
    problem: &Problem<'_>,
    shape: &Shape,
    lv: ArrayView2<'_, T>,
    cot: &Cotangents<'_>,
    sink: &K,
    staging: Staging,
    widths: &[usize],
    grad: &mut [K::Elem],
) -> Result<(), SpecError> {
    let p = params::<T::Acc>(problem, shape, cot, widths);
    let me = masked_entropy(problem);
    let (n, vt) = (shape.n, shape.v_total);
    if n == 0 || vt == 0 {
        if n > 0 {
            return Err(row_error(problem, shape, 0));
        }
        return Ok(());
    }
    match staging {
        Staging::Fused => {
            let res: Vec<Result<(), SpecError>> = grad
                .par_chunks_mut(vt)
                .enumerate()
                .map(|(r, dst)| {
                    let src = typed_row(&lv, r, &p);
                    if ids_suspect(problem, &src, r, p.v) {
                        return Err(row_error(problem, shape, r));
                    }
                    let inputs = RowInputs::of(problem.sampling_mask, problem.teacher_probs, r);
                    let st = row_stats(&src, inputs.mask, &p)
                        .map_err(|_| row_error(problem, shape, r))?;
                    let rc = RowCot::new(problem, cot, r, &p);
                    let mut io = ToSink {
                        src: &src,
                        dst,
                        sink,
                    };
                    grad_row(&mut io, inputs, &st, &p, &rc, vt, me);
                    Ok(())
                })
                .collect();
            res.into_iter().collect()
        }
        Staging::Chunked { chunk_size: cs } => {
            let v = p.v;
            let c = cs.min(n);
            let mut zbuf = vec![<T::Acc as Acc>::ZERO; c * v];
            let mut gbuf = vec![<T::Acc as Acc>::ZERO; c * v];
            for (ci, out_chunk) in grad.chunks_mut(cs * vt).enumerate() {
                let r0 = ci * cs;
                let rows = out_chunk.len() / vt;
                chunked_grad_chunk(
                    problem, shape, &lv, &p, cot, me, r0, rows, &mut zbuf, &mut gbuf,
                )?;
                out_chunk
                    .par_chunks_mut(vt)
                    .zip(gbuf.par_chunks(v.max(1)))
                    .for_each(|(dst, g)| {
                        sink.write(g, &mut dst[..v]);
                        dst[v..].fill(sink.zero());
                    });
            }
            Ok(())
        }
    }
}

fn backward_typed<T: Input>(
    problem: &Problem<'_>,
    shape: &Shape,
    lv: ArrayView2<'_, T>,
    cot: &Cotangents<'_>,
    out: Dtype,
    staging: Staging,
    widths: &[usize],
) -> Result<Array2<f64>, SpecError> {
    let mut grad = Array2::<f64>::zeros((shape.n, shape.v_total));
    let gs = grad.as_slice_mut().expect("fresh array is contiguous");
    backward_rows(
        problem,
        shape,
        lv,
        cot,
        &F64Rounded(out),
        staging,
        widths,
        gs,
    )?;
    Ok(grad)
}

/// One chunk of the chunked backward: widen rows `r0 .. r0 + rows` into
/// `zbuf`, their stats, gradients into `gbuf` (accumulation dtype).
#[allow(clippy::too_many_arguments)]
fn chunked_grad_chunk<T: Input>(
    problem: &Problem<'_>,
    shape: &Shape,
    lv: &ArrayView2<'_, T>,
    p: &CallParams<T::Acc>,
    cot: &Cotangents<'_>,
    me: bool,
    r0: usize,
    rows: usize,
    zbuf: &mut [T::Acc],
    gbuf: &mut [T::Acc],
) -> Result<(), SpecError> {
    let v = p.v;
    if v == 0 {
        return Err(row_error(problem, shape, r0));
    }
    zbuf[..rows * v]
        .par_chunks_mut(v)
        .enumerate()
        .for_each(|(i, z)| typed_row(lv, r0 + i, p).load(0, z));
    let res: Vec<Result<(), SpecError>> = zbuf[..rows * v]
        .par_chunks(v)
        .zip(gbuf[..rows * v].par_chunks_mut(v))
        .enumerate()
        .map(|(i, (z, g))| {
            let r = r0 + i;
            if ids_suspect(problem, z, r, v) {
                return Err(row_error(problem, shape, r));
            }
            let inputs = RowInputs::of(problem.sampling_mask, problem.teacher_probs, r);
            let st = row_stats(z, inputs.mask, p).map_err(|_| row_error(problem, shape, r))?;
            let rc = RowCot::new(problem, cot, r, p);
            grad_row(&mut ToBuffer { src: z, dst: g }, inputs, &st, p, &rc, v, me);
            apply_softcap_factors(p.softcap, lv.row(r), g);
            Ok(())
        })
        .collect();
    res.into_iter().collect()
}

/// Grad logits `[N, V_total]` rounded to `out` (the module's formula),
/// stored as f64, for a `problem` whose shapes gave `shape` and whose
/// cotangents the caller validated. `widths`: vocabulary shard widths
/// whose statistics are reduced per shard and merged in shard order
/// (empty: one row-wide reduction); callers check that they sum to
/// `V_total`, and that a chunk size is at least 1.
///
/// # Errors
/// The spec's row errors (first bad row in row order).
pub(crate) fn backward(
    problem: &Problem<'_>,
    shape: &Shape,
    cot: &Cotangents<'_>,
    out: Dtype,
    staging: Staging,
    widths: &[usize],
) -> Result<Array2<f64>, SpecError> {
    logprobe_reference::with_logits!(problem.logits, lv => backward_typed(problem, shape, lv, cot, out, staging, widths))
}

/// Grad logits `[N, V_total]` (the module's formula) written into `grad`,
/// each value rounded once to nearest in `G` (f64, f32, bf16 or f16);
/// padded columns get `+0`. `shape`, `staging` and `widths` as in
/// [`backward`]. Every entry of `grad` is written; on error its contents
/// are unspecified.
///
/// # Errors
/// [`SpecError::ShapeMismatch`] (tensor `grad_logits`) when `grad` is not
/// `[N, V_total]`; otherwise as [`backward`].
pub(crate) fn backward_into<G: GradElement>(
    problem: &Problem<'_>,
    shape: &Shape,
    cot: &Cotangents<'_>,
    staging: Staging,
    widths: &[usize],
    mut grad: ArrayViewMut2<'_, G>,
) -> Result<(), SpecError> {
    if grad.dim() != (shape.n, shape.v_total) {
        return Err(SpecError::ShapeMismatch {
            tensor: "grad_logits",
            expected: vec![shape.n, shape.v_total],
            found: grad.shape().to_vec(),
        });
    }
    let sink = Typed::<G>(std::marker::PhantomData);
    macro_rules! go {
        ($lv:expr, $gs:expr) => {
            logprobe_reference::with_logits!(problem.logits, lv => backward_rows(problem, shape, lv, cot, &sink, staging, widths, $gs))
        };
    }
    match grad.as_slice_mut() {
        Some(gs) => go!(lv, gs),
        None => {
            let mut tmp = Array2::from_elem(grad.dim(), G::from_f32(0.0));
            go!(lv, tmp.as_slice_mut().expect("fresh array is contiguous"))?;
            grad.assign(&tmp);
            Ok(())
        }
    }
}

/// Grad logits written over `problem.logits`, rounded to the logits'
/// dtype. Shapes and cotangents are validated here, then every row (a
/// stats pass over all rows) before anything is written: on error the
/// logits are unchanged. `staging` and `widths` as in [`backward`].
///
/// # Errors
/// The spec's validation errors (shapes, cotangents, first bad row).
pub(crate) fn backward_in_place(
    problem: ProblemMut<'_>,
    cot: &Cotangents<'_>,
    staging: Staging,
    widths: &[usize],
) -> Result<(), SpecError> {
    // Every input but the logits, borrowed apart from them (nothing of
    // `problem` is borrowed by `with_logits`).
    let inputs = problem.with_logits(());
    let (logits, options) = (problem.logits, problem.options);
    let per_entry = (problem.sampling_mask, problem.teacher_probs);
    macro_rules! go {
        ($lv:expr, $wrap:path) => {{
            let mut lv = $lv;
            let write = {
                let problem = inputs.with_logits($wrap(lv.view()));
                let shape = problem.validate_shapes()?;
                problem.validate_cotangents(&shape, cot)?;
                plan_in_place(&problem, &shape, lv.view(), cot, widths)?
            };
            apply_in_place(&mut lv, per_entry, &options, write, staging);
            Ok(())
        }};
    }
    match logits {
        LogitsMut::F64(lv) => go!(lv, Logits::F64),
        LogitsMut::F32(lv) => go!(lv, Logits::F32),
        LogitsMut::Bf16(lv) => go!(lv, Logits::Bf16),
        LogitsMut::F16(lv) => go!(lv, Logits::F16),
    }
}

/// Everything the in-place write pass needs, computed before any write.
struct InPlacePlan<A: Acc> {
    shape: Shape,
    p: CallParams<A>,
    stats: Vec<RowStats<A>>,
    cots: Vec<RowCot<A>>,
}

fn plan_in_place<T: Input>(
    problem: &Problem<'_>,
    shape: &Shape,
    lv: ArrayView2<'_, T>,
    cot: &Cotangents<'_>,
    widths: &[usize],
) -> Result<InPlacePlan<T::Acc>, SpecError> {
    let p = params::<T::Acc>(problem, shape, cot, widths);
    if shape.n > 0 && shape.vocab_size == 0 {
        return Err(row_error(problem, shape, 0));
    }
    let stats = all_stats(problem, shape, &lv, &p)?;
    let cots = (0..shape.n)
        .map(|r| RowCot::new(problem, cot, r, &p))
        .collect();
    Ok(InPlacePlan {
        shape: *shape,
        p,
        stats,
        cots,
    })
}

/// The in-place write pass of `plan` over `lv`; `per_entry`: the
/// problem's `(sampling_mask, teacher_probs)`.
fn apply_in_place<T: GradElement>(
    lv: &mut ArrayViewMut2<'_, T>,
    per_entry: (Option<ArrayView2<'_, bool>>, Option<ArrayView2<'_, f64>>),
    options: &Options,
    plan: InPlacePlan<T::Acc>,
    staging: Staging,
) {
    let me = options.entropy == Some(logprobe_reference::spec::EntropyLogits::Masked);
    let vt = plan.shape.v_total;
    let p = &plan.p;
    match staging {
        Staging::Fused => {
            let rows: Vec<ArrayViewMut1<'_, T>> = lv.outer_iter_mut().collect();
            rows.into_par_iter().enumerate().for_each(|(r, row)| {
                let mut io = InPlace {
                    row,
                    input_temperature: p.input_temperature,
                    softcap: p.softcap,
                };
                grad_row(
                    &mut io,
                    RowInputs::of(per_entry.0, per_entry.1, r),
                    &plan.stats[r],
                    p,
                    &plan.cots[r],
                    vt,
                    me,
                );
            });
        }
        Staging::Chunked { chunk_size: cs } => {
            let v = p.v;
            let c = cs.min(plan.shape.n);
            let mut zbuf = vec![<T::Acc as Acc>::ZERO; c * v];
            let mut gbuf = vec![<T::Acc as Acc>::ZERO; c * v];
            let mut r0 = 0;
            while r0 < plan.shape.n {
                let rows = cs.min(plan.shape.n - r0);
                let mut sl = lv.slice_mut(ndarray::s![r0..r0 + rows, ..]);
                let mut chunk: Vec<ArrayViewMut1<'_, T>> = sl.outer_iter_mut().collect();
                zbuf[..rows * v]
                    .par_chunks_mut(v)
                    .zip(chunk.par_iter())
                    .for_each(|(z, row)| {
                        TypedRow {
                            row: row.view(),
                            input_temperature: p.input_temperature,
                            softcap: p.softcap,
                        }
                        .load(0, z)
                    });
                zbuf[..rows * v]
                    .par_chunks(v)
                    .zip(gbuf[..rows * v].par_chunks_mut(v))
                    .zip(chunk.par_iter())
                    .enumerate()
                    .for_each(|(i, ((z, g), row))| {
                        let r = r0 + i;
                        grad_row(
                            &mut ToBuffer { src: z, dst: g },
                            RowInputs::of(per_entry.0, per_entry.1, r),
                            &plan.stats[r],
                            p,
                            &plan.cots[r],
                            v,
                            me,
                        );
                        apply_softcap_factors(p.softcap, row.view(), g);
                    });
                chunk
                    .par_iter_mut()
                    .zip(gbuf[..rows * v].par_chunks(v))
                    .for_each(|(row, g)| {
                        for (j, &x) in g.iter().enumerate() {
                            row[j] = T::narrow(x);
                        }
                        for j in v..vt {
                            row[j] = T::narrow(<T::Acc as Acc>::ZERO);
                        }
                    });
                r0 += rows;
            }
        }
    }
}
