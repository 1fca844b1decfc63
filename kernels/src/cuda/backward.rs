//! Backward launch sequences (VJP into a new f32 buffer, or in place over
//! the logits) of the three layouts: a stats pass (`lp_row_stats_*`), then
//! the write pass `lp_backward_*` (`cuda/backward.cu`).

use ndarray::Array2;

use logprobe_reference::spec::{Cotangents, Dtype, Problem, Shape};

use super::backend::{Arg, DeviceBuffer, Launcher};
use super::error::CudaError;
use super::forward::{
    check_sizes, launch_chunk_stats, launch_merge_shards, launch_row_stats, row_config,
    shard_ranges, shard_row_stats, upload_columns, DeviceMask,
};
use super::inputs::{dtype_suffix, host_logits, DeviceLogits, HostLogits, RowParams};
use super::launch::{chunks, STATE_WORDS};
use super::memory::{AllocKind, MemoryTracker};
use super::plan::{real_columns, Layout};
use super::slots::grad_slots;

/// Largest `K + 1` the write pass keeps in shared memory (48 KiB of f32).
pub const MAX_SLOTS: usize = 12 * 1024;

/// Where the gradients go.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Dest {
    /// A new `[N, V_total]` buffer, rounded on the host to this dtype.
    New(Dtype),
    /// Over the logits, rounded on the device to the logits' dtype.
    InPlace,
}

/// The result of [`backward`].
pub(crate) enum Grads {
    /// Rounded gradients `[N, V_total]`.
    New(Array2<f64>),
    /// The logits' new contents (gradients in the logits' dtype), row-major.
    InPlace(HostLogits),
}

/// The cotangent slots on the device.
struct DeviceSlots {
    k1: usize,
    index: DeviceBuffer<i32>,
    a: DeviceBuffer<f32>,
    other: DeviceBuffer<f32>,
    g_all: DeviceBuffer<f32>,
    h: DeviceBuffer<f32>,
}

/// Arguments shared by every write-pass launch of one call.
struct WritePass<'a> {
    rt: &'a dyn Launcher,
    params: RowParams,
    slots: &'a DeviceSlots,
}

impl WritePass<'_> {
    /// `lp_backward_<src>_to_<dst>` over rows `[row0, row0 + rows)` of `x`
    /// (real columns `cols_real`, global offset `col_off`), writing
    /// `cols_total` columns per row to `out` from row `out_row0`.
    #[allow(clippy::too_many_arguments)]
    fn launch(
        &self,
        x: &DeviceLogits,
        rows: usize,
        cols_real: usize,
        cols_total: usize,
        col_off: usize,
        mask: &DeviceMask,
        mask_row0: usize,
        state: &DeviceBuffer<f32>,
        state_row0: usize,
        slot_row0: usize,
        out: (u64, Dtype, usize),
    ) -> Result<(), CudaError> {
        if rows == 0 {
            return Ok(());
        }
        let (out_ptr, out_dtype, out_stride) = out;
        let p = &self.params;
        let s = self.slots;
        let args = [
            Arg::Ptr(x.row_ptr(0)),
            Arg::I64(x.stride as i64),
            Arg::I32(cols_real as i32),
            Arg::I32(cols_total as i32),
            Arg::I32(col_off as i32),
            Arg::Ptr(mask.row_ptr(mask_row0)),
            Arg::I64(mask.stride()),
            Arg::I32(p.zmode),
            Arg::F32(p.temp_z),
            Arg::F32(p.temp),
            Arg::I32(p.t_one),
            Arg::F32(p.grad_temp),
            Arg::I32(p.grad_t_one),
            Arg::Ptr(state.ptr_at(state_row0 * STATE_WORDS)),
            Arg::I32(1 - p.two_sets),
            Arg::Ptr(s.index.ptr_at(slot_row0 * s.k1)),
            Arg::Ptr(s.a.ptr_at(slot_row0 * s.k1)),
            Arg::Ptr(s.other.ptr_at(slot_row0 * s.k1)),
            Arg::I32(s.k1 as i32),
            Arg::Ptr(s.g_all.ptr_at(slot_row0)),
            Arg::Ptr(s.h.ptr_at(slot_row0)),
            Arg::Ptr(out_ptr),
            Arg::I64(out_stride as i64),
        ];
        let name = format!(
            "lp_backward_{}_to_{}",
            dtype_suffix(x.dtype),
            dtype_suffix(out_dtype)
        );
        let cfg = row_config(rows, cols_real, (s.k1 * 4) as u32);
        // SAFETY: matches lp_backward_* in cuda/backward.cu; `x` starts at
        // the launch's first row; buffers outlive the synchronisation.
        unsafe { self.rt.launch(&name, cfg, &args) }
    }
}

/// Backward of `problem` (validated into `shape`, cotangents validated) in
/// `layout`. `N == 0` allocates nothing. In place is not offered for
/// vocab-parallel layouts (the caller refuses it).
///
/// # Errors
/// [`CudaError`] from the device.
pub(crate) fn backward(
    rt: &dyn Launcher,
    tracker: &MemoryTracker,
    layout: &Layout,
    problem: &Problem<'_>,
    shape: &Shape,
    cot: &Cotangents<'_>,
    dest: Dest,
) -> Result<Grads, CudaError> {
    let (n, v, vt) = (shape.n, shape.vocab_size, shape.v_total);
    if n == 0 {
        return Ok(match dest {
            Dest::New(_) => Grads::New(Array2::zeros((0, vt))),
            Dest::InPlace => Grads::InPlace(host_logits(&problem.logits, 0..vt)),
        });
    }
    check_sizes(shape)?;
    let _guard = rt.exclusive();
    let params = RowParams::new(problem, shape);
    let hs = grad_slots(problem, shape, cot);
    let slots = DeviceSlots {
        k1: hs.k1,
        index: rt.upload(tracker, AllocKind::Workspace, &hs.index)?,
        a: rt.upload(tracker, AllocKind::Workspace, &hs.a)?,
        other: rt.upload(tracker, AllocKind::Workspace, &hs.other)?,
        g_all: rt.upload(tracker, AllocKind::Workspace, &hs.g_all)?,
        h: rt.upload(tracker, AllocKind::Workspace, &hs.h)?,
    };
    let pass = WritePass {
        rt,
        params,
        slots: &slots,
    };
    match layout {
        Layout::Fused | Layout::Chunked { .. } => {
            let (x, mask) = upload_columns(rt, tracker, problem, shape.dtype, 0..vt)?;
            let grads = match dest {
                Dest::New(_) => Some(rt.zeros::<f32>(tracker, AllocKind::Output, n * vt)?),
                Dest::InPlace => None,
            };
            let out_at = |row: usize| match &grads {
                Some(g) => (g.ptr_at(row * vt), Dtype::F32, vt),
                None => (x.row_ptr(row), shape.dtype, vt),
            };
            if let Layout::Chunked { chunk_size } = layout {
                let c = (*chunk_size).clamp(1, n);
                let state = rt.zeros::<f32>(tracker, AllocKind::Workspace, c * STATE_WORDS)?;
                let w = DeviceLogits::from_f32(
                    rt.zeros::<f32>(tracker, AllocKind::Workspace, c * v)?,
                    v,
                );
                let wparams = params.on_widened();
                let wpass = WritePass {
                    rt,
                    params: wparams,
                    slots: &slots,
                };
                for range in chunks(n, c) {
                    let rows = range.len();
                    launch_chunk_stats(rt, &x, range.clone(), v, &mask, &params, &w, &state)?;
                    wpass.launch(
                        &w,
                        rows,
                        v,
                        vt,
                        0,
                        &mask,
                        range.start,
                        &state,
                        0,
                        range.start,
                        out_at(range.start),
                    )?;
                }
                rt.synchronize()?;
            } else {
                let state = rt.zeros::<f32>(tracker, AllocKind::Workspace, n * STATE_WORDS)?;
                launch_row_stats(rt, &x, 0, n, v, 0, &mask, 0, &params, &state, 0)?;
                pass.launch(&x, n, v, vt, 0, &mask, 0, &state, 0, 0, out_at(0))?;
                rt.synchronize()?;
            }
            match (&grads, dest) {
                (Some(g), Dest::New(out)) => Ok(Grads::New(shape_grads(rt, g, n, vt, out)?)),
                _ => Ok(Grads::InPlace(x.download(rt, n * vt)?)),
            }
        }
        Layout::VocabParallel(shards) => {
            let out = match dest {
                Dest::New(out) => out,
                Dest::InPlace => {
                    return Err(CudaError::Driver {
                        context: "vocab-parallel backward",
                        message: "in place is not offered".into(),
                    })
                }
            };
            let ranges = shard_ranges(shards, shape)?;
            let parts = rt.zeros::<f32>(
                tracker,
                AllocKind::Workspace,
                ranges.len() * n * STATE_WORDS,
            )?;
            let state = rt.zeros::<f32>(tracker, AllocKind::Workspace, n * STATE_WORDS)?;
            let mut inputs = Vec::with_capacity(ranges.len());
            for (i, range) in ranges.iter().enumerate() {
                inputs.push(shard_row_stats(
                    rt,
                    tracker,
                    problem,
                    shape,
                    range,
                    &params,
                    &parts,
                    i * n,
                )?);
            }
            launch_merge_shards(rt, &parts, ranges.len(), n, &params, &state)?;
            let mut shard_grads = Vec::with_capacity(ranges.len());
            for (range, (x, mask)) in ranges.iter().zip(&inputs) {
                let g = rt.zeros::<f32>(tracker, AllocKind::Output, n * range.len())?;
                let cols = real_columns(range, v);
                pass.launch(
                    x,
                    n,
                    cols,
                    range.len(),
                    range.start,
                    mask,
                    0,
                    &state,
                    0,
                    0,
                    (g.ptr(), Dtype::F32, range.len()),
                )?;
                shard_grads.push(g);
            }
            rt.synchronize()?;
            let mut all = Array2::zeros((n, vt));
            for (range, g) in ranges.iter().zip(&shard_grads) {
                let vals = rt.download(g, n * range.len())?;
                for r in 0..n {
                    for (j, c) in range.clone().enumerate() {
                        all[[r, c]] = out.round_f64(vals[r * range.len() + j] as f64);
                    }
                }
            }
            Ok(Grads::New(all))
        }
    }
}

fn shape_grads(
    rt: &dyn Launcher,
    g: &DeviceBuffer<f32>,
    n: usize,
    vt: usize,
    out: Dtype,
) -> Result<Array2<f64>, CudaError> {
    let vals = rt.download(g, n * vt)?;
    Array2::from_shape_vec(
        (n, vt),
        vals.into_iter().map(|x| out.round_f64(x as f64)).collect(),
    )
    .map_err(|e| CudaError::Driver {
        context: "shaping grads",
        message: e.to_string(),
    })
}
