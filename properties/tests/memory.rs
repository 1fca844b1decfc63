//! Property 5, memory: peak extra allocation (outputs excluded, workspaces
//! included) of chunked `<= 2 * chunk_size * V * 4` bytes `+ O(N)` and of
//! fused `O(N)`, counted by a global allocator. This binary runs ONE test,
//! so nothing else allocates while a call is measured.

use logprobe_kernels::kernel::Kernel;
use logprobe_kernels::CpuKernel;
use logprobe_reference::spec::Dtype;
use logprobe_testkit::memory::{check_memory, CountingAllocator};
use logprobe_testkit::mutants::{IgnoredChunkSize, Mutant};
use logprobe_testkit::registry::{self, MemoryBudget};
use logprobe_testkit::strategies::{CotangentRecipe, ProblemRecipe};

#[global_allocator]
static ALLOC: CountingAllocator = CountingAllocator;

/// Every registered kernel with a memory budget: an `O(N)` one once, a
/// chunked one at each of `chunk_sizes` (with the chunk size its budget
/// counts).
fn budgeted(chunk_sizes: &[usize]) -> Vec<(Box<dyn Kernel>, Option<usize>)> {
    let mut out = Vec::new();
    for e in registry::available() {
        match e.memory {
            Some(MemoryBudget::Rows) => out.push((e.kernel(1, &[]), None)),
            Some(MemoryBudget::Chunks) => {
                out.extend(chunk_sizes.iter().map(|&c| (e.kernel(c, &[]), Some(c))))
            }
            None => {}
        }
    }
    out
}

#[test]
fn peak_extra_memory_within_chunk_and_row_budgets() {
    // V large enough that anything V-proportional beyond the chunk budget shows.
    let (n, v) = (48, 32000);
    let mut report = Vec::new();
    for dtype in [Dtype::F32, Dtype::Bf16] {
        let mut r = ProblemRecipe::plain(5, n, v);
        r.dtype = dtype;
        r.topk = 4;
        let data = r.expand();
        let cot = CotangentRecipe {
            seed: 1,
            log_probs: true,
            entropy: true,
            topk: true,
            loss: false,
            policy: false,
            kl: false,
        }
        .expand(&data);
        let (p, c) = (data.problem(), cot.view());
        // Warm up rayon's pool and lazily initialised state outside the measurement.
        CpuKernel::fused().forward(&p, Dtype::F32).unwrap();
        let kernels = budgeted(&[1, 4, 7]);
        for (k, chunk) in &kernels {
            let (f, b) = check_memory(k.as_ref(), &p, Some(&c), Dtype::F32, *chunk)
                .unwrap_or_else(|e| panic!("{dtype}: {e}"));
            report.push(format!(
                "{dtype} {}: forward {f} B, backward {b} B",
                k.name()
            ));
        }
        // A kernel that ignores chunk_size (one chunk of all rows) fails.
        let m = Mutant::new(IgnoredChunkSize::NAME, IgnoredChunkSize::new(4));
        let err = check_memory(&m, &p, Some(&c), Dtype::F32, Some(4))
            .expect_err("ignoring chunk_size must exceed the budget");
        report.push(format!("{dtype} {}: killed ({err})", m.name()));
    }
    // N = 0 never allocates anything V-sized.
    let data = ProblemRecipe::plain(1, 0, 256000).expand();
    let cot = CotangentRecipe {
        seed: 1,
        log_probs: true,
        entropy: true,
        topk: false,
        loss: false,
        policy: false,
        kl: false,
    }
    .expand(&data);
    for (k, chunk) in budgeted(&[8]) {
        let (f, b) = check_memory(
            k.as_ref(),
            &data.problem(),
            Some(&cot.view()),
            Dtype::F32,
            chunk,
        )
        .unwrap();
        assert!(
            f < 4096 && b < 4096,
            "{}: N = 0 allocated {f} / {b} B",
            k.name()
        );
        report.push(format!(
            "N=0 V=256000 {}: forward {f} B, backward {b} B",
            k.name()
        ));
    }
    eprintln!("{}", report.join("\n"));
}
