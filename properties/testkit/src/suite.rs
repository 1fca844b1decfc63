//! The properties of the `cargo test` gate (docs/design.md, "The properties"), as
//! [`Property`] values: each a generator of cases and a check of a kernel
//! list, run by [`crate::checks::gate`] in `tests/` and by
//! [`crate::checks::survey`] for the mutant kill table and the tightness
//! figures. The kernel lists: [`cpu_kernels`], [`cpu_families`] and
//! [`sharded_families`], all read from the [`crate::registry`]; with the
//! `cuda-host` feature (on by default) they hold the host build of the
//! CUDA kernels (the `.cu` sources compiled as C++, run on the CPU), and
//! with the `cuda` feature and a usable device the CUDA twins on the GPU
//! ([`cuda_kernels`]), so every property runs on them unchanged.
//!
//! Default case counts keep the whole suite within its budget (the oracle
//! costs about 1 us per vocabulary entry; real vocabulary sizes come at low
//! weight with `N <= 2`); `PROPTEST_CASES` replaces every count.

use std::panic::{catch_unwind, AssertUnwindSafe};

use proptest::prelude::*;

use logprobe_kernels::kernel::Kernel;
use logprobe_reference::spec::{Dtype, Output};

use crate::cache::oracle_case;
use crate::checks::{
    check_chunk_sizes, check_loss_chunk_sizes, check_row_slicing, judge_backward, judge_forward,
    judge_loss, Failure, KernelOutcome, LossOracle, Property, Ratios,
};
use crate::registry::{self, Backend, Entry};
use crate::strategies::{
    bad_input, chunk_sizes, cotangent_recipe, edge_recipe, loss_recipe, problem_recipe, BadInput,
    CotangentData, CotangentRecipe, LossRecipe, ProblemRecipe, RecipeSpace,
};

/// A kernel constructor by chunk size: chunked kernels use it, the others
/// ignore it (then chunk-size invariance is trivial and only row slicing is
/// checked).
pub struct KernelFamily {
    /// Name in reports.
    pub name: String,
    /// The kernel with `chunk_size` rows per chunk.
    pub make: Box<dyn Fn(usize) -> Box<dyn Kernel> + Send + Sync>,
}

/// The gate's kernel list, from the [`crate::registry`]: every available
/// entry at its [`Entry::gate_chunk_sizes`] (CPU fused, chunked at chunk
/// sizes 1, 3 and 64; the host-built CUDA fused, chunked at 1 and 64;
/// plus [`cuda_kernels`]).
pub fn cpu_kernels() -> Vec<Box<dyn Kernel>> {
    let mut k: Vec<Box<dyn Kernel>> = gate_entries()
        .iter()
        .filter(|e| e.backend != Backend::Cuda)
        .flat_map(Entry::gate_kernels)
        .collect();
    k.extend(cuda_kernels());
    k
}

/// The CUDA kernels of the gate's list (fused, chunked at 1 and 64), when
/// the `cuda` feature is on and a device is usable; otherwise none, after
/// one line on stderr saying why (the CPU properties still run).
pub fn cuda_kernels() -> Vec<Box<dyn Kernel>> {
    let cuda: Vec<Entry> = registry::entries()
        .into_iter()
        .filter(|e| e.backend == Backend::Cuda)
        .collect();
    if cuda.is_empty() {
        return Vec::new();
    }
    if let Some(why) = Backend::Cuda.unavailable() {
        eprintln!("skipping CUDA kernels in the properties: {why}");
        return Vec::new();
    }
    cuda.iter().flat_map(Entry::gate_kernels).collect()
}

/// The available registry entries, in registry order.
fn gate_entries() -> Vec<Entry> {
    registry::available()
}

/// The kernels as families over chunk sizes: every available registry
/// entry with [`Entry::invariance`] that is not sharded (CPU fused and
/// chunked, the host-built CUDA chunked, and the CUDA twins where a device
/// is usable).
pub fn cpu_families() -> Vec<KernelFamily> {
    gate_entries()
        .into_iter()
        .filter(|e| e.invariance && !e.is_sharded())
        .map(|e| KernelFamily {
            name: e.family.into(),
            make: Box::new(move |c| e.kernel(c, &[])),
        })
        .collect()
}

/// Runs `f`, turning a panic into an error (bad input never panics; a
/// panicking kernel fails the property instead of aborting a survey).
fn guarded<T>(f: impl FnOnce() -> Result<T, String>) -> Result<T, String> {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(r) => r,
        Err(e) => {
            let msg = e
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| e.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_default();
            Err(format!("panicked: {msg}"))
        }
    }
}

fn verdict(
    property: &'static str,
    kernel: &dyn Kernel,
    case: &dyn std::fmt::Debug,
    r: Result<Ratios, String>,
) -> KernelOutcome {
    KernelOutcome {
        kernel: kernel.name(),
        outcome: r.map_err(|detail| Failure {
            property,
            kernel: kernel.name(),
            detail: format!("{detail}\n  case: {case:?}"),
        }),
    }
}

/// The output dtype of the f32-accumulating properties: f64 for f64
/// logits, else f32.
fn acc_out(d: Dtype) -> Dtype {
    if d == Dtype::F64 {
        Dtype::F64
    } else {
        Dtype::F32
    }
}

/// Property 1: log-probs, entropy and top-k log-probs agree with the oracle
/// within the bound of each kernel's declared algorithm (f32 and f64 logits;
/// f32 outputs feed the tightness figures).
pub fn agreement() -> Property<ProblemRecipe, [Box<dyn Kernel>]> {
    Property {
        name: "log_probs_agree_with_oracle_within_bound",
        cases: 192,
        strategy: agreement_cases,
        check: check_agreement,
    }
}

fn agreement_cases() -> BoxedStrategy<ProblemRecipe> {
    problem_recipe(RecipeSpace {
        dtypes: vec![Dtype::F32, Dtype::F32, Dtype::F32, Dtype::F64],
        ..RecipeSpace::default()
    })
}

fn check_agreement(r: &ProblemRecipe, kernels: &[Box<dyn Kernel>]) -> Vec<KernelOutcome> {
    let data = r.expand();
    let oc = oracle_case(&format!("{r:?}"), &data);
    let out = acc_out(r.dtype);
    let record = r.dtype == Dtype::F32;
    kernels
        .iter()
        .map(|k| {
            verdict(
                "log_probs_agree_with_oracle_within_bound",
                k.as_ref(),
                r,
                guarded(|| judge_forward(k.as_ref(), &data, &oc, out, record)),
            )
        })
        .collect()
}

/// Property 2: chunk-size invariance, bit for bit, forward and backward
/// (chunk sizes 1, random, non-divisors of N, N, > N), the cross-entropy
/// `loss` too (its recipe derived from the case's seed,
/// [`LossRecipe::from_seed`], so the case stream is unchanged), and
/// row-slicing invariance of every kernel.
pub fn chunk_invariance() -> Property<(ProblemRecipe, CotangentRecipe, u64), [KernelFamily]> {
    Property {
        name: "chunk_size_is_bit_invariant",
        cases: 96,
        strategy: chunk_cases,
        check: check_chunks,
    }
}

fn chunk_cases() -> BoxedStrategy<(ProblemRecipe, CotangentRecipe, u64)> {
    let space = RecipeSpace {
        dtypes: vec![Dtype::F32, Dtype::Bf16, Dtype::F16, Dtype::F64],
        real_vocab_weight: 0,
        max_small_vocab: 2048,
        max_rows: 24,
        ..RecipeSpace::default()
    };
    (problem_recipe(space), cotangent_recipe(), any::<u64>()).boxed()
}

fn check_chunks(
    c: &(ProblemRecipe, CotangentRecipe, u64),
    families: &[KernelFamily],
) -> Vec<KernelOutcome> {
    let (r, cr, seed) = c;
    let mut data = r.expand();
    let sizes = chunk_sizes(r.n, *seed);
    let loss = LossRecipe::from_seed(*seed).expand(r.n);
    cr.ask(&mut data, &loss);
    let cot = cr.expand(&data);
    let cut = (*seed as usize) % (r.n + 1);
    families
        .iter()
        .map(|f| {
            let k = (f.make)(sizes[0]);
            let res = guarded(|| {
                check_chunk_sizes(f.make.as_ref(), &data, &cot, &sizes)?;
                check_loss_chunk_sizes(f.make.as_ref(), &data, &loss, &sizes)?;
                check_row_slicing((f.make)(sizes[sizes.len() / 2]).as_ref(), &data, &cot, cut)?;
                Ok(Ratios::default())
            });
            verdict("chunk_size_is_bit_invariant", k.as_ref(), c, res)
        })
        .collect()
}

/// A case of the loss property: a problem recipe (its `ignore_rate`
/// overridden when drawn: every row ignored at weight 1) and a loss recipe.
pub type LossCase = (ProblemRecipe, LossRecipe);

/// Property 1 for the cross-entropy `loss` (issue 17): every reduction,
/// label smoothing (0, the edges, uniform in `[0, 1]`), `ignore_index`
/// rows (every row ignored too), optional `loss_weights` (zeros, all zero)
/// and `mean_all_ignored`, on f32, bf16 and f16 logits at small, medium and
/// real vocabulary sizes, output in f32 and in the logits' dtype: each
/// value within its (T17) bound ([`judge_loss`]).
pub fn loss() -> Property<LossCase, [Box<dyn Kernel>]> {
    Property {
        name: "loss_agrees_with_oracle_within_bound",
        cases: 64,
        strategy: loss_cases,
        check: check_loss,
    }
}

fn loss_cases() -> BoxedStrategy<LossCase> {
    let space = RecipeSpace {
        dtypes: vec![Dtype::F32, Dtype::Bf16, Dtype::F16],
        max_small_vocab: 2048,
        ..RecipeSpace::default()
    };
    (
        problem_recipe(space),
        loss_recipe(),
        prop_oneof![3 => Just(None), 1 => Just(Some(1.0)), 1 => Just(Some(0.5))],
    )
        .prop_map(|(mut r, l, ignore)| {
            if let Some(rate) = ignore {
                r.ignore_rate = rate;
            }
            (r, l)
        })
        .boxed()
}

fn check_loss(c: &LossCase, kernels: &[Box<dyn Kernel>]) -> Vec<KernelOutcome> {
    let (r, lr) = c;
    let mut data = r.expand();
    let loss = lr.expand(r.n);
    // Asked of the forward too: its per-row terms judged in the shared walk.
    loss.ask(&mut data);
    let oc = oracle_case(&format!("{r:?} {lr:?}"), &data);
    let oracle = LossOracle::compute(&data, &loss, oc.clone());
    kernels
        .iter()
        .map(|k| {
            let res = guarded(|| {
                let mut q = Ratios::default();
                for out in [Dtype::F32, r.dtype] {
                    let record = out == Dtype::F32 && r.dtype == Dtype::F32;
                    q.merge(
                        &judge_forward(k.as_ref(), &data, &oc, out, record)
                            .map_err(|e| format!("forward out {out}: {e}"))?,
                    );
                    let w = judge_loss(k.as_ref(), &data, &loss, &oracle, out)
                        .map_err(|e| format!("out {out}: {e}"))?;
                    if record {
                        q.record(Output::Loss, w);
                    }
                }
                Ok(q)
            });
            verdict("loss_agrees_with_oracle_within_bound", k.as_ref(), c, res)
        })
        .collect()
}

/// Property 3: gradients (log-prob, entropy and top-k cotangents, and half
/// the time the loss side's: `grad_lse`, `grad_z_loss`, `grad_loss` under
/// a [`LossRecipe::from_seed`] loss, [`CotangentRecipe::ask`]) against the
/// oracle's VJP with the per-element bound (T14, T19); backward into a new
/// buffer and in place.
pub fn gradients() -> Property<(ProblemRecipe, CotangentRecipe), [Box<dyn Kernel>]> {
    Property {
        name: "gradients_match_oracle_vjp",
        cases: 96,
        strategy: gradient_cases,
        check: check_gradients,
    }
}

fn gradient_cases() -> BoxedStrategy<(ProblemRecipe, CotangentRecipe)> {
    let space = RecipeSpace {
        dtypes: vec![Dtype::F32, Dtype::F32, Dtype::F64],
        max_small_vocab: 1024,
        ..RecipeSpace::default()
    };
    (problem_recipe(space), cotangent_recipe()).boxed()
}

fn check_gradients(
    c: &(ProblemRecipe, CotangentRecipe),
    kernels: &[Box<dyn Kernel>],
) -> Vec<KernelOutcome> {
    let (r, cr) = c;
    let mut data = r.expand();
    cr.ask(&mut data, &LossRecipe::from_seed(cr.seed).expand(r.n));
    let cot = cr.expand(&data);
    let key = format!("{r:?}{}", cr.ask_key());
    let oc = oracle_case(&key, &data);
    let vkey = format!("{r:?}{cr:?}");
    let out = acc_out(r.dtype);
    let record = r.dtype == Dtype::F32;
    kernels
        .iter()
        .map(|k| {
            let res = guarded(|| {
                let mut q =
                    judge_backward(k.as_ref(), &data, &cot, &oc, &vkey, out, false, record)?;
                q.merge(&judge_backward(
                    k.as_ref(),
                    &data,
                    &cot,
                    &oc,
                    &vkey,
                    out,
                    true,
                    false,
                )?);
                Ok(q)
            });
            verdict("gradients_match_oracle_vjp", k.as_ref(), c, res)
        })
        .collect()
}

/// Property 4: bf16 and f16 logits, outputs in f32, bf16 and f16, forward
/// and backward, within the bound.
pub fn half_precision() -> Property<(ProblemRecipe, CotangentRecipe), [Box<dyn Kernel>]> {
    Property {
        name: "bf16_f16_inputs_and_outputs_within_bound",
        cases: 96,
        strategy: half_cases,
        check: check_half,
    }
}

fn half_cases() -> BoxedStrategy<(ProblemRecipe, CotangentRecipe)> {
    let space = RecipeSpace {
        dtypes: vec![Dtype::Bf16, Dtype::F16],
        max_small_vocab: 2048,
        ..RecipeSpace::default()
    };
    (problem_recipe(space), cotangent_recipe()).boxed()
}

fn check_half(
    c: &(ProblemRecipe, CotangentRecipe),
    kernels: &[Box<dyn Kernel>],
) -> Vec<KernelOutcome> {
    let (r, cr) = c;
    let mut data = r.expand();
    cr.ask(&mut data, &LossRecipe::from_seed(cr.seed).expand(r.n));
    let cot = cr.expand(&data);
    let oc = oracle_case(&format!("{r:?}{}", cr.ask_key()), &data);
    let vkey = format!("{r:?}{cr:?}");
    kernels
        .iter()
        .map(|k| {
            let res = guarded(|| {
                for out in [Dtype::F32, Dtype::Bf16, Dtype::F16] {
                    judge_forward(k.as_ref(), &data, &oc, out, false)
                        .map_err(|e| format!("out {out}: {e}"))?;
                }
                for out in [r.dtype, Dtype::F32] {
                    judge_backward(k.as_ref(), &data, &cot, &oc, &vkey, out, false, false)
                        .map_err(|e| format!("grad out {out}: {e}"))?;
                }
                judge_backward(k.as_ref(), &data, &cot, &oc, &vkey, r.dtype, true, false)
                    .map_err(|e| format!("in-place grad: {e}"))?;
                Ok(Ratios::default())
            });
            verdict(
                "bf16_f16_inputs_and_outputs_within_bound",
                k.as_ref(),
                c,
                res,
            )
        })
        .collect()
}

/// A case of property 7: a valid edge problem, or a problem with one bad
/// input planted at `(row, col)`.
pub type EdgeCase = (
    ProblemRecipe,
    CotangentRecipe,
    Option<BadInput>,
    usize,
    usize,
);

/// Property 7: edges give their defined values (within the bound) and every
/// bad input gives its typed error, forward, backward and in place; inputs
/// are unchanged after every non-in-place call and after a failed in-place
/// one.
pub fn edges() -> Property<EdgeCase, [Box<dyn Kernel>]> {
    Property {
        name: "edges_give_defined_values_or_typed_errors",
        cases: 256,
        strategy: edge_cases,
        check: check_edges,
    }
}

fn edge_cases() -> BoxedStrategy<EdgeCase> {
    (
        edge_recipe(),
        cotangent_recipe(),
        prop_oneof![1 => Just(None), 1 => bad_input().prop_map(Some)],
        any::<usize>(),
        any::<usize>(),
    )
        .boxed()
}

fn check_edges(c: &EdgeCase, kernels: &[Box<dyn Kernel>]) -> Vec<KernelOutcome> {
    let (r, cr, bad, row, col) = c;
    let mut data = r.expand();
    let mut cot = cr.expand(&data);
    if let Some(b) = bad {
        b.apply(&mut data, &mut cot, *row, *col);
    }
    let key = format!("{r:?} bad={bad:?} at ({row}, {col})");
    let oc = oracle_case(&key, &data);
    let vkey = format!("{key} {cr:?}");
    let out = acc_out(r.dtype);
    kernels
        .iter()
        .map(|k| {
            let res = guarded(|| {
                judge_forward(k.as_ref(), &data, &oc, out, false)
                    .map_err(|e| format!("forward: {e}"))?;
                if cot.is_empty() && bad.is_none() {
                    return Ok(Ratios::default());
                }
                judge_backward(k.as_ref(), &data, &cot, &oc, &vkey, out, false, false)
                    .map_err(|e| format!("backward: {e}"))?;
                judge_backward(k.as_ref(), &data, &cot, &oc, &vkey, out, true, false)
                    .map_err(|e| format!("in-place backward: {e}"))?;
                Ok(Ratios::default())
            });
            verdict(
                "edges_give_defined_values_or_typed_errors",
                k.as_ref(),
                c,
                res,
            )
        })
        .collect()
}

/// Property 7 (inputs): every non-in-place call (forward into each output
/// dtype, backward) leaves logits, tokens, mask, ids and cotangents bit for
/// bit unchanged, valid input or not.
pub fn inputs_unchanged() -> Property<EdgeCase, [Box<dyn Kernel>]> {
    Property {
        name: "inputs_unchanged_after_non_in_place_calls",
        cases: 128,
        strategy: edge_cases,
        check: check_unchanged,
    }
}

fn check_unchanged(c: &EdgeCase, kernels: &[Box<dyn Kernel>]) -> Vec<KernelOutcome> {
    let (r, cr, bad, row, col) = c;
    let mut data = r.expand();
    let mut cot = cr.expand(&data);
    if let Some(b) = bad {
        b.apply(&mut data, &mut cot, *row, *col);
    }
    let (data0, cot0) = (data.clone(), cot.clone());
    kernels
        .iter()
        .map(|k| {
            let res = guarded(|| {
                for out in [Dtype::F32, Dtype::Bf16, Dtype::F64] {
                    let _ = k.forward(&data.problem(), out);
                    let same = data.logits.bits_eq(&data0.logits)
                        && data.tokens == data0.tokens
                        && data.sampling_mask == data0.sampling_mask
                        && data.topk_ids == data0.topk_ids;
                    if !same {
                        return Err(format!("forward (out {out}) changed its inputs"));
                    }
                    let _ = k.backward(&data.problem(), &cot.view(), out);
                    let same_cot =
                        |a: &CotangentData, b: &CotangentData| format!("{a:?}") == format!("{b:?}");
                    if !data.logits.bits_eq(&data0.logits) || !same_cot(&cot, &cot0) {
                        return Err(format!("backward (out {out}) changed its inputs"));
                    }
                }
                Ok(Ratios::default())
            });
            verdict(
                "inputs_unchanged_after_non_in_place_calls",
                k.as_ref(),
                c,
                res,
            )
        })
        .collect()
}

/// The vocab-parallel kernels as families over shard layouts: every
/// available sharded registry entry with [`Entry::invariance`] (the
/// workspace's [`logprobe_kernels::CpuKernel::vocab_parallel`]: each shard
/// reduced on its own, partials merged in shard order; its host-built CUDA
/// twin, and the GPU's where a device is usable).
pub fn sharded_families() -> Vec<ShardedFamily> {
    gate_entries()
        .into_iter()
        .filter(|e| e.invariance && e.is_sharded())
        .map(|e| ShardedFamily {
            name: e.family.into(),
            make: Box::new(move |w| e.kernel(0, w)),
        })
        .collect()
}

/// Builds a kernel over shards of the given widths.
pub type ShardedMaker = Box<dyn Fn(&[usize]) -> Box<dyn Kernel> + Send + Sync>;

/// A vocab-parallel kernel constructor by shard widths (summing to `V_total`).
pub struct ShardedFamily {
    /// Name in reports.
    pub name: String,
    /// The kernel over shards of these widths.
    pub make: ShardedMaker,
}

/// A case of property 6: a problem, cotangents, a shard count, the
/// layout's seed, and optionally one bad input planted at `(row, col)`.
pub type ShardCase = (
    ProblemRecipe,
    CotangentRecipe,
    usize,
    u64,
    Option<(BadInput, usize, usize)>,
);

/// Property 6: every sharding (any shard count, uneven widths, empty
/// shards, an all-masked shard, padded vocabulary in the last shards) is
/// checked against the oracle, never against the unsharded kernel: forward
/// and backward within the bound; a bad input planted in any shard (NaN or
/// `+inf` next to finite shards, bad ids) gives its typed error.
pub fn vocab_parallel() -> Property<ShardCase, [ShardedFamily]> {
    Property {
        name: "vocab_parallel_shardings_match_oracle",
        cases: 96,
        strategy: shard_cases,
        check: check_shards,
    }
}

fn shard_cases() -> BoxedStrategy<ShardCase> {
    let space = RecipeSpace {
        dtypes: vec![Dtype::F32, Dtype::F32, Dtype::Bf16, Dtype::F16],
        max_small_vocab: 2048,
        ..RecipeSpace::default()
    };
    (
        problem_recipe(space),
        cotangent_recipe(),
        // Any shard count: a few (TP degrees), and more shards than
        // columns (many empty shards).
        prop_oneof![6 => 1usize..=8, 1 => 9usize..=64],
        any::<u64>(),
        prop_oneof![
            3 => Just(None),
            1 => (bad_input(), any::<usize>(), any::<usize>()).prop_map(Some),
        ],
    )
        .boxed()
}

fn check_shards(c: &ShardCase, families: &[ShardedFamily]) -> Vec<KernelOutcome> {
    let (r, cr, count, seed, bad) = c;
    let v_total = r.vocab_size.max(1) + r.padding;
    let layout =
        crate::strategies::ShardLayout::generate(*seed, *count, v_total, r.mask_rate.is_some());
    let masked = layout.masked_shard.map(|k| layout.range(k));
    let mut data = r.expand_with_masked_cols(masked.clone());
    let mut cot = cr.expand(&data);
    if let Some((b, row, col)) = bad {
        b.apply(&mut data, &mut cot, *row, *col);
    }
    let key = format!("{r:?} masked={masked:?} bad={bad:?}");
    let oc = oracle_case(&key, &data);
    let vkey = format!("{key} {cr:?}");
    let out = acc_out(r.dtype);
    families
        .iter()
        .map(|f| {
            let k = (f.make)(&layout.widths);
            let res = guarded(|| {
                let mut q = judge_forward(k.as_ref(), &data, &oc, out, false)
                    .map_err(|e| format!("forward: {e}"))?;
                q.merge(
                    &judge_backward(k.as_ref(), &data, &cot, &oc, &vkey, out, false, false)
                        .map_err(|e| format!("backward: {e}"))?,
                );
                Ok(q)
            });
            let detail_case = (c, &layout);
            verdict(
                "vocab_parallel_shardings_match_oracle",
                k.as_ref(),
                &detail_case,
                res,
            )
        })
        .collect()
}
