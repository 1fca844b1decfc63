//! Forward launch sequences (log-probs, entropy, top-k log-probs) of the
//! three layouts. Each row's statistics come from `lp_row_stats_*`
//! (`cuda/row_stats.cu`); outputs are rounded on the host to the requested
//! dtype from the device's f32 values.

use std::ops::Range;

use ndarray::{Array1, Array2, Axis};

use logprobe_reference::spec::{Dtype, Output, Problem, Shape};

use super::backend::{Arg, DeviceBuffer, LaunchConfig, Launcher};
use super::error::CudaError;
use super::inputs::{dtype_suffix, host_logits, host_mask, round_outputs, DeviceLogits, RowParams};
use super::launch::{
    block_size, chunks, elementwise_grid, grid_stride_blocks, ELEMENTWISE_BLOCK, STATE_WORDS,
};
use super::memory::{AllocKind, MemoryTracker};
use super::plan::{real_columns, Layout, Shards};
use super::slots::gather_indices;
use crate::kernel::ForwardOutput;

/// One-block-per-row launch over `rows` rows of `cols` real columns.
pub(crate) fn row_config(rows: usize, cols: usize, shared_bytes: u32) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (rows as u32, 1, 1),
        block_dim: (block_size(cols), 1, 1),
        shared_mem_bytes: shared_bytes,
    }
}

/// One-thread-per-item launch.
pub(crate) fn item_config(items: usize) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (elementwise_grid(items), 1, 1),
        block_dim: (ELEMENTWISE_BLOCK, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// A sampling mask on the device (`[rows, stride]` bytes), or none.
pub(crate) struct DeviceMask {
    buf: Option<DeviceBuffer<u8>>,
    stride: usize,
}

impl DeviceMask {
    /// No mask.
    #[cfg(feature = "cuda")]
    pub(crate) fn none() -> Self {
        DeviceMask {
            buf: None,
            stride: 0,
        }
    }

    /// Uploads columns `cols` of the problem's mask, if it has one.
    pub(crate) fn upload(
        rt: &dyn Launcher,
        tracker: &MemoryTracker,
        problem: &Problem<'_>,
        cols: std::ops::Range<usize>,
    ) -> Result<Self, CudaError> {
        let stride = cols.len();
        let buf = match &problem.sampling_mask {
            Some(m) => Some(rt.upload(tracker, AllocKind::Input, &host_mask(m, cols))?),
            None => None,
        };
        Ok(DeviceMask { buf, stride })
    }

    /// Device address of row `row` (0: no mask).
    pub(crate) fn row_ptr(&self, row: usize) -> u64 {
        self.buf.as_ref().map_or(0, |b| b.ptr_at(row * self.stride))
    }

    /// Row stride in bytes.
    pub(crate) fn stride(&self) -> i64 {
        self.stride as i64
    }
}

/// `lp_row_stats_*` over rows `[row0, row0 + rows)` of `x`, whose real
/// columns are `cols` starting at global column `col_off`; states go to
/// `state` from element `state_off`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn launch_row_stats(
    rt: &dyn Launcher,
    x: &DeviceLogits,
    row0: usize,
    rows: usize,
    cols: usize,
    col_off: usize,
    mask: &DeviceMask,
    mask_row0: usize,
    params: &RowParams,
    state: &DeviceBuffer<f32>,
    state_row0: usize,
) -> Result<(), CudaError> {
    if rows == 0 {
        return Ok(());
    }
    let name = format!("lp_row_stats_{}", dtype_suffix(x.dtype));
    let [zmode, temp_z, temp, t_one] = params.z_args();
    let args = [
        Arg::Ptr(x.row_ptr(row0)),
        Arg::I64(x.stride as i64),
        Arg::I32(cols as i32),
        Arg::I32(col_off as i32),
        Arg::Ptr(mask.row_ptr(mask_row0)),
        Arg::I64(mask.stride()),
        zmode,
        temp_z,
        temp,
        t_one,
        Arg::I32(params.two_sets),
        Arg::Ptr(state.ptr_at(state_row0 * STATE_WORDS)),
    ];
    // SAFETY: arguments match lp_row_stats_* in cuda/row_stats.cu; every
    // buffer outlives the call's final synchronisation.
    unsafe { rt.launch(&name, row_config(rows, cols, 0), &args) }
}

/// Columns `cols` of `problem`'s logits (as `dtype`) and of its sampling
/// mask on the device, `[N, cols.len()]` each.
///
/// # Errors
/// [`CudaError`] from the device.
pub(crate) fn upload_columns(
    rt: &dyn Launcher,
    tracker: &MemoryTracker,
    problem: &Problem<'_>,
    dtype: Dtype,
    cols: Range<usize>,
) -> Result<(DeviceLogits, DeviceMask), CudaError> {
    let x = DeviceLogits::upload(
        rt,
        tracker,
        dtype,
        cols.len(),
        &host_logits(&problem.logits, cols.clone()),
    )?;
    let mask = DeviceMask::upload(rt, tracker, problem, cols)?;
    Ok((x, mask))
}

/// The column ranges of `shards` over `shape.v_total` columns.
///
/// # Errors
/// [`CudaError::Driver`] when the widths do not split `V_total`.
pub(crate) fn shard_ranges(shards: &Shards, shape: &Shape) -> Result<Vec<Range<usize>>, CudaError> {
    shards.ranges(shape.v_total).map_err(|e| CudaError::Driver {
        context: "splitting the vocabulary",
        message: e.to_string(),
    })
}

/// One vocabulary shard's stats pass: columns `range` uploaded
/// ([`upload_columns`]) and every row's partial statistics over the shard's
/// real columns written to `state` from row `state_row0` (`lp_row_stats_*`).
/// Returns the shard's device logits and mask.
///
/// # Errors
/// [`CudaError`] from the device.
#[allow(clippy::too_many_arguments)]
pub(crate) fn shard_row_stats(
    rt: &dyn Launcher,
    tracker: &MemoryTracker,
    problem: &Problem<'_>,
    shape: &Shape,
    range: &Range<usize>,
    params: &RowParams,
    state: &DeviceBuffer<f32>,
    state_row0: usize,
) -> Result<(DeviceLogits, DeviceMask), CudaError> {
    let (x, mask) = upload_columns(rt, tracker, problem, shape.dtype, range.clone())?;
    launch_row_stats(
        rt,
        &x,
        0,
        shape.n,
        real_columns(range, shape.vocab_size),
        range.start,
        &mask,
        0,
        params,
        state,
        state_row0,
    )?;
    Ok((x, mask))
}

/// `lp_merge_shards`: the `shards` partials `[shards, N, STATE_WORDS]` in
/// `parts` merged in shard order into `state` `[N, STATE_WORDS]`.
///
/// # Errors
/// [`CudaError`] from the device.
pub(crate) fn launch_merge_shards(
    rt: &dyn Launcher,
    parts: &DeviceBuffer<f32>,
    shards: usize,
    n: usize,
    params: &RowParams,
    state: &DeviceBuffer<f32>,
) -> Result<(), CudaError> {
    let args = [
        Arg::Ptr(parts.ptr()),
        Arg::I32(shards as i32),
        Arg::I32(n as i32),
        Arg::F32(params.temp),
        Arg::I32(params.t_one),
        Arg::Ptr(state.ptr()),
    ];
    // SAFETY: matches lp_merge_shards in cuda/vocab_parallel.cu.
    unsafe { rt.launch("lp_merge_shards", item_config(n), &args) }
}

/// Checks the sizes the kernels index with 32-bit integers.
pub(crate) fn check_sizes(shape: &Shape) -> Result<(), CudaError> {
    let limit = i32::MAX as usize;
    if shape.n > limit
        || shape.v_total > limit
        || (shape.k + 1).saturating_mul(shape.n) > i64::MAX as usize
    {
        return Err(CudaError::Driver {
            context: "sizing a launch",
            message: format!("shape {shape:?} exceeds 2^31 - 1 rows or columns"),
        });
    }
    Ok(())
}

/// Forward of `problem` (validated into `shape`) in `layout`, outputs
/// rounded to `out`. `N == 0` allocates nothing.
///
/// # Errors
/// [`CudaError`] from the device.
pub(crate) fn forward(
    rt: &dyn Launcher,
    tracker: &MemoryTracker,
    layout: &Layout,
    problem: &Problem<'_>,
    shape: &Shape,
    out: Dtype,
) -> Result<ForwardOutput, CudaError> {
    let n = shape.n;
    let k = shape.k;
    let want_lp = problem.tokens.is_some();
    let want_ent = problem.options.entropy.is_some();
    let want_topk = problem.topk_ids.is_some();
    if n == 0 {
        return Ok(ForwardOutput::zeros(problem, shape, out));
    }
    check_sizes(shape)?;
    let _guard = rt.exclusive();
    let params = RowParams::new(problem, shape);
    let k1 = k + 1;
    let gidx = rt.upload(
        tracker,
        AllocKind::Workspace,
        &gather_indices(problem, shape),
    )?;
    let lp = rt.zeros::<f32>(tracker, AllocKind::Output, if want_lp { n } else { 0 })?;
    let ent = rt.zeros::<f32>(tracker, AllocKind::Output, if want_ent { n } else { 0 })?;
    let topk = rt.zeros::<f32>(tracker, AllocKind::Output, n * k)?;
    let finish_flags = [
        Arg::I32(want_lp as i32),
        Arg::I32(want_ent as i32),
        Arg::Ptr(lp.ptr()),
        Arg::Ptr(ent.ptr()),
        Arg::Ptr(topk.ptr()),
    ];
    match layout {
        Layout::Fused | Layout::VocabParallel(_) => {
            let ranges = match layout {
                Layout::VocabParallel(shards) => shard_ranges(shards, shape)?,
                _ => std::iter::once(0..shape.v_total).collect(),
            };
            let state = rt.zeros::<f32>(tracker, AllocKind::Workspace, n * STATE_WORDS)?;
            let gz = rt.zeros::<f32>(tracker, AllocKind::Workspace, n * k1)?;
            let parts = if ranges.len() > 1 {
                Some(rt.zeros::<f32>(
                    tracker,
                    AllocKind::Workspace,
                    ranges.len() * n * STATE_WORDS,
                )?)
            } else {
                None
            };
            let mut shard_inputs = Vec::with_capacity(ranges.len());
            for (i, range) in ranges.iter().enumerate() {
                let (dst, dst_row0) = match &parts {
                    Some(p) => (p, i * n),
                    None => (&state, 0),
                };
                let (x, mask) =
                    shard_row_stats(rt, tracker, problem, shape, range, &params, dst, dst_row0)?;
                let cols = real_columns(range, shape.vocab_size);
                launch_gather(rt, &x, n, cols, range.start, &gidx, k1, &params, &gz)?;
                shard_inputs.push((x, mask));
            }
            if let Some(p) = &parts {
                launch_merge_shards(rt, p, ranges.len(), n, &params, &state)?;
            }
            let mut args = vec![
                Arg::Ptr(state.ptr()),
                Arg::Ptr(gz.ptr()),
                Arg::Ptr(gidx.ptr()),
                Arg::I32(k1 as i32),
                Arg::I32(n as i32),
                Arg::F32(params.temp),
                Arg::I32(params.t_one),
            ];
            args.extend(finish_flags);
            // SAFETY: matches lp_finish_forward in cuda/forward.cu.
            unsafe { rt.launch("lp_finish_forward", item_config(n), &args)? };
            rt.synchronize()?;
            drop(shard_inputs);
        }
        Layout::Chunked { chunk_size } => {
            let v = shape.vocab_size;
            let c = (*chunk_size).clamp(1, n);
            let x = DeviceLogits::upload(
                rt,
                tracker,
                shape.dtype,
                shape.v_total,
                &host_logits(&problem.logits, 0..shape.v_total),
            )?;
            let mask = DeviceMask::upload(rt, tracker, problem, 0..shape.v_total)?;
            let state = rt.zeros::<f32>(tracker, AllocKind::Workspace, c * STATE_WORDS)?;
            let w =
                DeviceLogits::from_f32(rt.zeros::<f32>(tracker, AllocKind::Workspace, c * v)?, v);
            let ls = rt.zeros::<f32>(tracker, AllocKind::Workspace, c * v)?;
            for range in chunks(n, c) {
                let rows = range.len();
                launch_chunk_stats(rt, &x, range.clone(), v, &mask, &params, &w, &state)?;
                let args = [
                    Arg::Ptr(w.row_ptr(0)),
                    Arg::I32(v as i32),
                    Arg::Ptr(mask.row_ptr(range.start)),
                    Arg::I64(mask.stride()),
                    Arg::Ptr(state.ptr()),
                    Arg::F32(params.temp),
                    Arg::I32(params.t_one),
                    Arg::Ptr(ls.ptr()),
                ];
                // SAFETY: matches lp_log_softmax_rows in cuda/chunked.cu.
                unsafe { rt.launch("lp_log_softmax_rows", row_config(rows, v, 0), &args)? };
                let args = [
                    Arg::Ptr(ls.ptr()),
                    Arg::I32(v as i32),
                    Arg::Ptr(state.ptr()),
                    Arg::Ptr(gidx.ptr_at(range.start * k1)),
                    Arg::I32(k1 as i32),
                    Arg::I32(rows as i32),
                    Arg::I32(want_lp as i32),
                    Arg::I32(want_ent as i32),
                    Arg::Ptr(lp.ptr_at(range.start)),
                    Arg::Ptr(ent.ptr_at(range.start)),
                    Arg::Ptr(topk.ptr_at(range.start * k)),
                ];
                // SAFETY: matches lp_chunked_finish in cuda/chunked.cu.
                unsafe { rt.launch("lp_chunked_finish", item_config(rows), &args)? };
            }
            rt.synchronize()?;
        }
    }
    let lp_v = if want_lp {
        Some(Array1::from(round_outputs(&rt.download(&lp, n)?, out)))
    } else {
        None
    };
    let ent_v = if want_ent {
        Some(Array1::from(round_outputs(&rt.download(&ent, n)?, out)))
    } else {
        None
    };
    let topk_v = if want_topk {
        let v = round_outputs(&rt.download(&topk, n * k)?, out);
        Some(
            Array2::from_shape_vec((n, k), v).map_err(|e| CudaError::Driver {
                context: "shaping top-k",
                message: e.to_string(),
            })?,
        )
    } else {
        None
    };
    let per_row = |a: Option<Array1<f64>>| a.map(|a| a.insert_axis(Axis(1)));
    Ok(ForwardOutput::from_values(
        out,
        [
            (Output::LogProbs, per_row(lp_v)),
            (Output::Entropy, per_row(ent_v)),
            (Output::TopkLogProbs, topk_v),
        ],
    ))
}

/// `lp_gather_*`: z at the slots' columns inside `[col_off, col_off + cols)`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn launch_gather(
    rt: &dyn Launcher,
    x: &DeviceLogits,
    rows: usize,
    cols: usize,
    col_off: usize,
    gidx: &DeviceBuffer<i32>,
    k1: usize,
    params: &RowParams,
    gz: &DeviceBuffer<f32>,
) -> Result<(), CudaError> {
    let args = [
        Arg::Ptr(x.row_ptr(0)),
        Arg::I64(x.stride as i64),
        Arg::I32(cols as i32),
        Arg::I32(col_off as i32),
        Arg::Ptr(gidx.ptr()),
        Arg::I32(k1 as i32),
        Arg::I32(rows as i32),
        Arg::I32(params.zmode),
        Arg::F32(params.temp_z),
        Arg::Ptr(gz.ptr()),
    ];
    let name = format!("lp_gather_{}", dtype_suffix(x.dtype));
    // SAFETY: matches lp_gather_* in cuda/forward.cu.
    unsafe { rt.launch(&name, item_config(rows * k1), &args) }
}

/// `lp_widen_*`: rows `[row0, row0 + rows)` of `x`, real columns `cols`,
/// into the f32 chunk buffer `w` (`[rows, cols]`), z formed per `params`.
/// One chunk of the chunked staging: rows `range` of `x` widened into `w`
/// (`[chunk, V]`, from its row 0; [`launch_widen`]), then their row stats
/// over the widened values ([`RowParams::on_widened`]) into `state` from
/// its row 0; the mask's rows are the logits' (`range.start` on).
#[allow(clippy::too_many_arguments)]
pub(crate) fn launch_chunk_stats(
    rt: &dyn Launcher,
    x: &DeviceLogits,
    range: std::ops::Range<usize>,
    v: usize,
    mask: &DeviceMask,
    params: &RowParams,
    w: &DeviceLogits,
    state: &DeviceBuffer<f32>,
) -> Result<(), CudaError> {
    let rows = range.len();
    launch_widen(rt, x, range.start, rows, v, params, w)?;
    let wparams = params.on_widened();
    launch_row_stats(rt, w, 0, rows, v, 0, mask, range.start, &wparams, state, 0)
}

fn launch_widen(
    rt: &dyn Launcher,
    x: &DeviceLogits,
    row0: usize,
    rows: usize,
    cols: usize,
    params: &RowParams,
    w: &DeviceLogits,
) -> Result<(), CudaError> {
    let args = [
        Arg::Ptr(x.row_ptr(row0)),
        Arg::I64(x.stride as i64),
        Arg::I32(rows as i32),
        Arg::I32(cols as i32),
        Arg::I32(params.zmode),
        Arg::F32(params.temp_z),
        Arg::Ptr(w.row_ptr(0)),
    ];
    let name = format!("lp_widen_{}", dtype_suffix(x.dtype));
    let cfg = LaunchConfig {
        grid_dim: (grid_stride_blocks(rows * cols), 1, 1),
        block_dim: (ELEMENTWISE_BLOCK, 1, 1),
        shared_mem_bytes: 0,
    };
    // SAFETY: matches lp_widen_* in cuda/chunked.cu.
    unsafe { rt.launch(&name, cfg, &args) }
}
