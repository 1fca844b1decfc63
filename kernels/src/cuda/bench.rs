//! Bandwidth of the fused forward on the device (issue 6: >= 80% of the
//! H200's HBM bandwidth at N = 8192, V = 152064). Logits are generated on
//! the device (`cuda/fill.cu`), so nothing multi-GB crosses PCIe; time is
//! measured with CUDA events around the fused forward's launches alone
//! (row statistics, target gather, finish: log-probs and entropy).

use cudarc::driver::sys::CUevent_flags;

use logprobe_reference::spec::Dtype;

use super::backend::{Arg, LaunchConfig, Launcher};
use super::error::CudaError;
use super::forward::{item_config, launch_gather, launch_row_stats, DeviceMask};
use super::inputs::{dtype_suffix, DeviceLogits, RowParams};
use super::launch::{grid_stride_blocks, ELEMENTWISE_BLOCK, STATE_WORDS};
use super::memory::{AllocKind, MemoryTracker};
use super::runtime::CudaRuntime;

/// The H200's specified HBM3e bandwidth, bytes per second (4.8 TB/s).
pub const H200_PEAK_BYTES_PER_S: f64 = 4.8e12;

/// One bandwidth measurement.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BandwidthReport {
    /// Rows.
    pub n: usize,
    /// Columns.
    pub v: usize,
    /// Logits dtype.
    pub dtype: Dtype,
    /// Median time of one fused forward, seconds (CUDA events).
    pub seconds: f64,
    /// Bytes that must move: the logits once, the target indices and the
    /// two f32 outputs.
    pub bytes: usize,
    /// `bytes / seconds`.
    pub bytes_per_s: f64,
    /// `bytes_per_s / peak`.
    pub fraction_of_peak: f64,
}

impl std::fmt::Display for BandwidthReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "fused forward {} N={} V={}: {:.3} ms, {:.2} GB moved, {:.0} GB/s = {:.1}% of 4.8 TB/s",
            self.dtype,
            self.n,
            self.v,
            self.seconds * 1e3,
            self.bytes as f64 / 1e9,
            self.bytes_per_s / 1e9,
            100.0 * self.fraction_of_peak
        )
    }
}

/// Times the fused forward (log-probs and entropy, temperature 1, no mask)
/// over device-generated `[n, v]` logits of `dtype` (f32, bf16 or f16):
/// one warm-up call, then the median of `reps` calls.
///
/// # Errors
/// [`CudaError`] from the device (out of memory...).
pub fn fused_forward_bandwidth(
    rt: &CudaRuntime,
    n: usize,
    v: usize,
    dtype: Dtype,
    reps: usize,
    peak_bytes_per_s: f64,
) -> Result<BandwidthReport, CudaError> {
    let ctx = rt.context().clone();
    let stream = rt.stream().clone();
    let rt: &dyn Launcher = rt;
    let _guard = rt.exclusive();
    let tracker = MemoryTracker::new();
    let len = n * v;
    let x = match dtype {
        Dtype::Bf16 | Dtype::F16 => {
            DeviceLogits::from_u16(rt.zeros::<u16>(&tracker, AllocKind::Input, len)?, dtype, v)
        }
        _ => DeviceLogits::from_f32(rt.zeros::<f32>(&tracker, AllocKind::Input, len)?, v),
    };
    let fill = LaunchConfig {
        grid_dim: (grid_stride_blocks(len), 1, 1),
        block_dim: (ELEMENTWISE_BLOCK, 1, 1),
        shared_mem_bytes: 0,
    };
    let name = format!("lp_fill_{}", dtype_suffix(x.dtype));
    // SAFETY: matches lp_fill_* in cuda/fill.cu.
    unsafe {
        rt.launch(
            &name,
            fill,
            &[
                Arg::Ptr(x.row_ptr(0)),
                Arg::I64(len as i64),
                Arg::U32(0x5eed),
            ],
        )?
    };
    let targets: Vec<i32> = (0..n).map(|r| ((r * 7919) % v.max(1)) as i32).collect();
    let gidx = rt.upload(&tracker, AllocKind::Input, &targets)?;
    let state = rt.zeros::<f32>(&tracker, AllocKind::Workspace, n * STATE_WORDS)?;
    let gz = rt.zeros::<f32>(&tracker, AllocKind::Workspace, n)?;
    let lp = rt.zeros::<f32>(&tracker, AllocKind::Output, n)?;
    let ent = rt.zeros::<f32>(&tracker, AllocKind::Output, n)?;
    let topk = rt.zeros::<f32>(&tracker, AllocKind::Output, 1)?;
    let mask = DeviceMask::none();
    let params = RowParams::PLAIN;
    let run = || -> Result<(), CudaError> {
        launch_row_stats(rt, &x, 0, n, v, 0, &mask, 0, &params, &state, 0)?;
        launch_gather(rt, &x, n, v, 0, &gidx, 1, &params, &gz)?;
        let args = [
            Arg::Ptr(state.ptr()),
            Arg::Ptr(gz.ptr()),
            Arg::Ptr(gidx.ptr()),
            Arg::I32(1),
            Arg::I32(n as i32),
            Arg::F32(1.0),
            Arg::I32(1),
            Arg::I32(1),
            Arg::I32(1),
            Arg::Ptr(lp.ptr()),
            Arg::Ptr(ent.ptr()),
            Arg::Ptr(topk.ptr()),
        ];
        // SAFETY: matches lp_finish_forward in cuda/forward.cu.
        unsafe { rt.launch("lp_finish_forward", item_config(n), &args) }
    };
    run()?;
    rt.synchronize()?;
    let ev = |what| move |e| CudaError::driver(what, e);
    let mut times = Vec::with_capacity(reps.max(1));
    for _ in 0..reps.max(1) {
        let start = ctx
            .new_event(Some(CUevent_flags::CU_EVENT_DEFAULT))
            .map_err(ev("creating an event"))?;
        let end = ctx
            .new_event(Some(CUevent_flags::CU_EVENT_DEFAULT))
            .map_err(ev("creating an event"))?;
        start.record(&stream).map_err(ev("recording an event"))?;
        run()?;
        end.record(&stream).map_err(ev("recording an event"))?;
        end.synchronize().map_err(ev("waiting for an event"))?;
        times.push(start.elapsed_ms(&end).map_err(ev("timing"))? as f64 * 1e-3);
    }
    times.sort_by(f64::total_cmp);
    let seconds = times[times.len() / 2];
    let bytes = len * dtype.size_bytes() + n * 4 + 2 * n * 4;
    let bytes_per_s = bytes as f64 / seconds;
    Ok(BandwidthReport {
        n,
        v,
        dtype,
        seconds,
        bytes,
        bytes_per_s,
        fraction_of_peak: bytes_per_s / peak_bytes_per_s,
    })
}
