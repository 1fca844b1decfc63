//! Property 5, memory: a counting global allocator and the check of a
//! kernel's peak extra allocation (docs/design.md: chunked `<= 2 * chunk_size * V *
//! 4` bytes `+ O(N)`, fused `O(N)`, outputs excluded, workspaces included).
//!
//! A test binary installs [`CountingAllocator`] as its `#[global_allocator]`
//! and runs ONE test, so nothing else allocates while a call is measured
//! (rayon's worker threads allocate on the kernel's behalf and are counted,
//! as they should be). Without the allocator installed, [`measure`] sees no
//! allocations and [`check_memory`] says so instead of passing.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use logprobe_kernels::kernel::{Kernel, KernelError};
use logprobe_reference::spec::{Cotangents, Dtype, Problem};

/// The system allocator, counting live bytes and their peak.
pub struct CountingAllocator;

static LIVE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);
static INSTALLED: AtomicBool = AtomicBool::new(false);

fn grow(by: usize) {
    let now = LIVE.fetch_add(by, Ordering::Relaxed) + by;
    PEAK.fetch_max(now, Ordering::Relaxed);
}

// SAFETY: every call is forwarded to `System` with the same layout; the
// counters are plain atomics.
unsafe impl GlobalAlloc for CountingAllocator {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        INSTALLED.store(true, Ordering::Relaxed);
        let p = System.alloc(layout);
        if !p.is_null() {
            grow(layout.size());
        }
        p
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        INSTALLED.store(true, Ordering::Relaxed);
        let p = System.alloc_zeroed(layout);
        if !p.is_null() {
            grow(layout.size());
        }
        p
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        System.dealloc(ptr, layout);
        LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let p = System.realloc(ptr, layout, new_size);
        if !p.is_null() {
            // Counted as a fresh block while the old one is live (realloc may copy).
            grow(new_size);
            LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
        }
        p
    }
}

/// Runs `f` and returns its result with the peak of live heap bytes above
/// the level at the start (bytes), as counted by [`CountingAllocator`].
pub fn measure<T>(f: impl FnOnce() -> T) -> (T, usize) {
    let start = LIVE.load(Ordering::SeqCst);
    PEAK.store(start, Ordering::SeqCst);
    let r = f();
    let peak = PEAK.load(Ordering::SeqCst);
    (r, peak.saturating_sub(start))
}

/// Whether [`CountingAllocator`] is this binary's global allocator (it has
/// seen an allocation).
pub fn allocator_installed() -> bool {
    let v: Vec<u8> = Vec::with_capacity(16);
    drop(std::hint::black_box(v));
    INSTALLED.load(Ordering::SeqCst)
}

/// Per-row allowance of the `O(N)` term (bytes): row records, top-k
/// buffers and rayon's per-row bookkeeping.
pub const PER_ROW_BYTES: usize = 1024;
/// Constant allowance (bytes): rayon job bookkeeping, small vectors.
pub const CONSTANT_BYTES: usize = 256 * 1024;

/// The memory budget of a call (bytes, outputs excluded): `2 * chunk_size *
/// V * 4` for a chunked kernel (`None` for an O(N) kernel), plus
/// [`PER_ROW_BYTES`] and 8 bytes per top-k entry per row, plus
/// [`CONSTANT_BYTES`].
pub fn budget(chunk_size: Option<usize>, n: usize, vocab_size: usize, k: usize) -> usize {
    let chunk = chunk_size.map_or(0, |c| 2 * c.min(n) * vocab_size * 4);
    chunk + n * (PER_ROW_BYTES + 8 * k) + CONSTANT_BYTES
}

/// Measured peak extra bytes of one forward (outputs excluded) and one
/// backward (the `[N, V_total]` f64 gradient excluded) call of `kernel`.
///
/// # Errors
/// The kernel's error, or a message when the allocator is not installed.
pub fn peak_extra(
    kernel: &dyn Kernel,
    problem: &Problem<'_>,
    cot: Option<&Cotangents<'_>>,
    out: Dtype,
) -> Result<(usize, usize), String> {
    if !allocator_installed() {
        return Err("CountingAllocator is not the global allocator of this binary".into());
    }
    let shape = problem.validate_shapes().map_err(|e| e.to_string())?;
    let (n, vt) = (shape.n, shape.v_total);
    let (fo, f_peak) = measure(|| kernel.forward(problem, out));
    let fo = fo.map_err(|e: KernelError| e.to_string())?;
    let outputs = 8 * fo.values.iter().map(|(_, a)| a.len()).sum::<usize>();
    drop(fo);
    let f_extra = f_peak.saturating_sub(outputs);
    let b_extra = match cot {
        Some(c) => {
            let (g, b_peak) = measure(|| kernel.backward(problem, c, out));
            g.map_err(|e| e.to_string())?;
            b_peak.saturating_sub(8 * n * vt)
        }
        None => 0,
    };
    Ok((f_extra, b_extra))
}

/// Checks property 5 for one call: forward and backward peak extra memory
/// within [`budget`] (`chunk_size` as the kernel claims it; `None` for an
/// O(N) kernel) and within the kernel's own [`Kernel::workspace_bytes`]
/// plus [`CONSTANT_BYTES`]. Returns the two measured figures.
///
/// # Errors
/// A message naming the call and the figures when over budget.
pub fn check_memory(
    kernel: &dyn Kernel,
    problem: &Problem<'_>,
    cot: Option<&Cotangents<'_>>,
    out: Dtype,
    chunk_size: Option<usize>,
) -> Result<(usize, usize), String> {
    let shape = problem.validate_shapes().map_err(|e| e.to_string())?;
    let (f, b) = peak_extra(kernel, problem, cot, out)?;
    let limit = budget(chunk_size, shape.n, shape.vocab_size, shape.k);
    let declared = kernel.workspace_bytes(&shape) + CONSTANT_BYTES;
    for (what, m) in [("forward", f), ("backward", b)] {
        if m > limit {
            return Err(format!(
                "{}: {what} peak extra memory {m} B > budget {limit} B (N = {}, V = {}, chunk_size = {chunk_size:?})",
                kernel.name(),
                shape.n,
                shape.vocab_size
            ));
        }
        if m > declared {
            return Err(format!(
                "{}: {what} peak extra memory {m} B > declared workspace {declared} B",
                kernel.name()
            ));
        }
    }
    Ok((f, b))
}
