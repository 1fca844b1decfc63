//! Property 8, the suite's power: every planted mutant of the catalog
//! (`logprobe_testkit::mutants`) is killed by the default property checks
//! (the same check functions and case counts as `tests/properties.rs`, plus
//! the memory check), and the correct kernels survive them all. One test in
//! this binary, with the counting allocator, so the memory check is exact.

use logprobe_kernels::kernel::Kernel;
use logprobe_kernels::CpuKernel;
use logprobe_reference::spec::Dtype;
use logprobe_testkit::checks::{survey, KernelSummary};
use logprobe_testkit::memory::{check_memory, CountingAllocator};
use logprobe_testkit::mutants::{self, CATALOG};
use logprobe_testkit::registry::{self, Backend};
use logprobe_testkit::strategies::{CotangentRecipe, ProblemRecipe};
use logprobe_testkit::suite::{self, cpu_families, KernelFamily, ShardedFamily};

#[global_allocator]
static ALLOC: CountingAllocator = CountingAllocator;

/// Chunk size of the chunked mutants (and of their correct twin).
const CHUNK: usize = 3;

#[test]
fn planted_mutants_are_killed_and_correct_kernels_survive() {
    // The correct kernels: the gate's, less the host-built CUDA kernels
    // (`tests/properties.rs` runs them on these same cases; their planted
    // mutants are `logprobe-kernels`' `tests/cuda_host.rs`).
    let mut kernels: Vec<Box<dyn Kernel>> = registry::available()
        .iter()
        .filter(|e| !matches!(e.backend, Backend::CudaHost | Backend::Cuda))
        .flat_map(registry::Entry::gate_kernels)
        .collect();
    kernels.extend(suite::cuda_kernels());
    let correct = kernels.len();
    kernels.extend(
        CATALOG
            .iter()
            .map(|e| Box::new((e.build)(CHUNK)) as Box<dyn Kernel>),
    );
    let names: Vec<String> = kernels.iter().map(|k| k.name()).collect();
    let mut kills: Vec<Vec<(String, String)>> = vec![Vec::new(); kernels.len()];
    let record =
        |property: &str, summaries: Vec<KernelSummary>, kills: &mut Vec<Vec<(String, String)>>| {
            for (i, s) in summaries.into_iter().enumerate() {
                if let Some(f) = s.first_failure {
                    let first_line = f.detail.lines().next().unwrap_or_default().to_string();
                    kills[i].push((format!("{property} ({} cases)", s.failures), first_line));
                }
            }
        };
    let t = std::time::Instant::now();
    record(
        "agreement",
        survey(&suite::agreement(), &kernels[..], None, correct),
        &mut kills,
    );
    record(
        "gradients",
        survey(&suite::gradients(), &kernels[..], None, correct),
        &mut kills,
    );
    record(
        "bf16/f16",
        survey(&suite::half_precision(), &kernels[..], None, correct),
        &mut kills,
    );
    record(
        "loss",
        survey(&suite::loss(), &kernels[..], None, correct),
        &mut kills,
    );
    record(
        "edges",
        survey(&suite::edges(), &kernels[..], None, correct),
        &mut kills,
    );
    record(
        "inputs unchanged",
        survey(&suite::inputs_unchanged(), &kernels[..], None, correct),
        &mut kills,
    );
    // Chunk-size invariance over families: the correct ones, then one per mutant.
    let mut families: Vec<KernelFamily> = cpu_families()
        .into_iter()
        .filter(|f| !host_built_family(&f.name))
        .collect();
    let n_fam = families.len();
    for e in CATALOG {
        families.push(KernelFamily {
            name: e.name.into(),
            make: Box::new(move |c| {
                Box::new((e.build)(if e.is_chunked() { c } else { CHUNK })) as Box<dyn Kernel>
            }),
        });
    }
    let fam = survey(&suite::chunk_invariance(), &families[..], None, n_fam);
    for (i, s) in fam.into_iter().enumerate() {
        if let Some(f) = s.first_failure {
            let idx = if i < n_fam {
                if i == 0 {
                    0
                } else {
                    1
                }
            } else {
                correct + (i - n_fam)
            };
            kills[idx].push((
                format!("chunk invariance ({} cases)", s.failures),
                f.detail.lines().next().unwrap_or_default().to_string(),
            ));
        }
    }
    // Vocab-parallel shardings (property 6): the correct VocabParallel, then
    // the TP mutant over the same layouts.
    let mut sharded: Vec<ShardedFamily> = suite::sharded_families()
        .into_iter()
        .filter(|f| !host_built_family(&f.name))
        .collect();
    let n_sharded = sharded.len();
    let tp = CATALOG
        .iter()
        .position(|e| e.build_sharded.is_some())
        .expect("TP mutant in the catalog");
    let build_sharded = CATALOG[tp].build_sharded.expect("a sharded builder");
    sharded.push(ShardedFamily {
        name: CATALOG[tp].name.into(),
        make: Box::new(move |w| Box::new(build_sharded(w)) as Box<dyn Kernel>),
    });
    let tp = correct + tp;
    let mut sharded_failures = Vec::new();
    for (i, s) in survey(&suite::vocab_parallel(), &sharded[..], None, n_sharded)
        .into_iter()
        .enumerate()
    {
        if let Some(f) = s.first_failure {
            let what = (
                format!("vocab-parallel shardings ({} cases)", s.failures),
                f.detail.lines().next().unwrap_or_default().to_string(),
            );
            if i < n_sharded {
                sharded_failures.push((s.kernel, what));
            } else {
                kills[tp].push(what);
            }
        }
    }
    // Memory: the correct kernels and the memory bug (the other wrappers
    // allocate V-sized rows for their recomputation, outside the bug model).
    let data = ProblemRecipe::plain(5, 24, 32000).expand();
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
    CpuKernel::fused()
        .forward(&data.problem(), Dtype::F32)
        .unwrap();
    for (i, k) in kernels.iter().enumerate() {
        if i >= correct && !k.name().contains(mutants::IgnoredChunkSize::NAME) {
            continue;
        }
        let chunk = if k.name().contains("chunk") {
            Some(if i < correct {
                chunk_of(&k.name())
            } else {
                CHUNK
            })
        } else {
            None
        };
        if let Err(e) = check_memory(
            k.as_ref(),
            &data.problem(),
            Some(&cot.view()),
            Dtype::F32,
            chunk,
        ) {
            kills[i].push(("memory".into(), e));
        }
    }
    // The table.
    let mut table = String::from("\nkernel | killed by (first failure)\n--- | ---\n");
    for (i, name) in names.iter().enumerate() {
        let by = if kills[i].is_empty() {
            "SURVIVED".to_string()
        } else {
            kills[i]
                .iter()
                .map(|(p, d)| format!("{p}: {d}"))
                .collect::<Vec<_>>()
                .join(" / ")
        };
        table.push_str(&format!("{name} | {by}\n"));
    }
    eprintln!("{table}\nsurvey time {:.1} s", t.elapsed().as_secs_f64());
    assert!(
        sharded_failures.is_empty(),
        "correct vocab-parallel kernel failed: {sharded_failures:?}"
    );
    for i in 0..correct {
        assert!(
            kills[i].is_empty(),
            "correct kernel {} failed: {:?}",
            names[i],
            kills[i]
        );
    }
    let survivors: Vec<&String> = (correct..names.len())
        .filter(|&i| kills[i].is_empty())
        .map(|i| &names[i])
        .collect();
    assert!(
        survivors.is_empty(),
        "mutants survived the default run: {survivors:?}"
    );
}

/// Whether a registry family is a host-built CUDA kernel's.
fn host_built_family(family: &str) -> bool {
    registry::entries()
        .iter()
        .any(|e| e.family == family && e.backend == Backend::CudaHost)
}

/// The chunk size in a kernel name `chunked(chunk_size=C)`.
fn chunk_of(name: &str) -> usize {
    name.split("chunk_size=")
        .nth(1)
        .and_then(|s| s.trim_end_matches(')').parse().ok())
        .unwrap_or(1)
}
