//! Planted mutant kernels: one per bug kind that chunked / fused log-prob
//! code has shipped (DESIGN: "Why it matters", property 8).
//!
//! Each mutant wraps a correct kernel of this workspace and differs from it
//! only where its bug is triggered: it calls the correct kernel and then
//! replaces exactly the outputs the bug changes, recomputed the buggy way
//! (or calls it with the options the bug gets wrong). So a mutant that
//! survives the default property run proves that the generators never reach
//! its trigger; a killed one proves they do.
//!
//! | kind | wraps | trigger |
//! | --- | --- | --- |
//! | [`MutantKind::NanOnNegInf`] | fused | entropy rows with a `-inf` (or masked, for masked entropy) entry: `p log p = 0 * -inf` |
//! | [`MutantKind::Bf16Accumulation`] | fused | bf16 / f16 logits: every sum accumulated in the input dtype |
//! | [`MutantKind::DroppedChunkRemainder`] | chunked | rows past the last full chunk are left 0 |
//! | [`MutantKind::IgnoredChunkSize`] | chunked | always one chunk of all `N` rows (same values, `N x V` memory) |
//! | [`MutantKind::TpVocabOffset`] | [`CpuKernel::vocab_parallel`] (two even shards, or [`Mutant::tp_vocab_offset`]'s layout) | a target owned by a shard that does not start at column 0 is gathered at its local index (the shard's vocab offset not added back) |
//! | [`MutantKind::PaddedVocabNotTruncated`] | fused | `vocab_size < V_total`: the padding is treated as vocabulary |
//! | [`MutantKind::TemperatureIgnored`] | fused | `T != 1` |
//! | [`MutantKind::TemperatureTwice`] | fused | `T != 1`: logits divided by `T` twice |
//! | [`MutantKind::EntropyWrongLogits`] | fused | a sampling mask: entropy over the other set of logits |
//! | [`MutantKind::GradOutput0Broadcast`] | fused | backward with `N >= 2`: row 0's cotangents used for every row |
//! | [`MutantKind::MissingMaxShift`] | fused | rows whose unshifted `sum exp(z)` overflows or underflows f32 |
//! | [`MutantKind::InPlaceCorruption`] | fused | in-place backward over input with a bad row after a good one: earlier rows already overwritten |
//! | [`MutantKind::RawEntropyFormula`] | fused | every entropy computed as `lse - sum p z` on raw logits in f32 (exact enough at small offsets, digits lost at large ones) |
//! | [`MutantKind::ChunkDependentOrder`] | chunked | rows in odd-numbered chunks reduced in reverse column order |

use ndarray::{s, Array1, Array2, ArrayView1, ArrayView2};

use logprobe_kernels::kernel::{
    Algorithm, Capabilities, EntropyForm, ForwardOutput, Kernel, KernelError,
};
use logprobe_kernels::CpuKernel;
use logprobe_reference::spec::{
    Cotangents, Dtype, EntropyLogits, Logits, LogitsMut, Options, Output, Problem, ProblemMut,
    Shape, SpecError, TemperatureDtype,
};

use crate::strategies::{even_shards, OwnedLogits};
use logprobe_verify::tolerance::{naive_entropy, naive_log_softmax};

/// The bug kinds of the catalog (see the module table).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum MutantKind {
    /// Entropy is NaN on rows with `-inf` entries (`p * log p` at `p = 0`).
    NanOnNegInf,
    /// Sums accumulated in bf16 / f16 for bf16 / f16 logits.
    Bf16Accumulation,
    /// Rows past the last full chunk are never written (left 0).
    DroppedChunkRemainder,
    /// `chunk_size` ignored: one chunk of all rows.
    IgnoredChunkSize,
    /// Tensor-parallel vocabulary offset not subtracted for the target.
    TpVocabOffset,
    /// Padded vocabulary columns not truncated.
    PaddedVocabNotTruncated,
    /// Temperature ignored.
    TemperatureIgnored,
    /// Temperature applied twice.
    TemperatureTwice,
    /// Entropy over the wrong logits (masked vs unmasked swapped).
    EntropyWrongLogits,
    /// Backward uses `grad_output[0]` for every row.
    GradOutput0Broadcast,
    /// No max shift: `exp(z)` overflows or underflows.
    MissingMaxShift,
    /// In-place backward that leaves the logits half overwritten on error.
    InPlaceCorruption,
    /// Entropy as `lse - sum(p * z)` on raw logits.
    RawEntropyFormula,
    /// Reduction order depends on the row's chunk.
    ChunkDependentOrder,
}

impl MutantKind {
    /// Every kind, in the module table's order.
    pub const ALL: [MutantKind; 14] = [
        MutantKind::NanOnNegInf,
        MutantKind::Bf16Accumulation,
        MutantKind::DroppedChunkRemainder,
        MutantKind::IgnoredChunkSize,
        MutantKind::TpVocabOffset,
        MutantKind::PaddedVocabNotTruncated,
        MutantKind::TemperatureIgnored,
        MutantKind::TemperatureTwice,
        MutantKind::EntropyWrongLogits,
        MutantKind::GradOutput0Broadcast,
        MutantKind::MissingMaxShift,
        MutantKind::InPlaceCorruption,
        MutantKind::RawEntropyFormula,
        MutantKind::ChunkDependentOrder,
    ];

    /// Short name (kebab case) for reports.
    pub fn name(self) -> &'static str {
        match self {
            MutantKind::NanOnNegInf => "nan-on-neg-inf",
            MutantKind::Bf16Accumulation => "bf16-accumulation",
            MutantKind::DroppedChunkRemainder => "dropped-chunk-remainder",
            MutantKind::IgnoredChunkSize => "ignored-chunk-size",
            MutantKind::TpVocabOffset => "tp-vocab-offset",
            MutantKind::PaddedVocabNotTruncated => "padded-vocab-not-truncated",
            MutantKind::TemperatureIgnored => "temperature-ignored",
            MutantKind::TemperatureTwice => "temperature-twice",
            MutantKind::EntropyWrongLogits => "entropy-wrong-logits",
            MutantKind::GradOutput0Broadcast => "grad-output-0-broadcast",
            MutantKind::MissingMaxShift => "missing-max-shift",
            MutantKind::InPlaceCorruption => "in-place-corruption",
            MutantKind::RawEntropyFormula => "raw-entropy-formula",
            MutantKind::ChunkDependentOrder => "chunk-dependent-order",
        }
    }

    /// Whether the kind wraps a chunked kernel (and so takes a chunk size).
    pub fn is_chunked(self) -> bool {
        matches!(
            self,
            MutantKind::DroppedChunkRemainder
                | MutantKind::IgnoredChunkSize
                | MutantKind::ChunkDependentOrder
        )
    }
}

/// A planted mutant: a correct kernel plus one bug (see the module docs).
pub struct Mutant {
    kind: MutantKind,
    inner: Box<dyn Kernel>,
    chunk_size: usize,
    /// The TP mutant's shard widths (`None`: two even shards of `V_total`).
    shards: Option<Vec<usize>>,
}

impl Mutant {
    /// The mutant of `kind` around this workspace's kernel for it (chunked
    /// ones with `chunk_size` rows per chunk; the TP one around
    /// [`CpuKernel::vocab_parallel`] over two even shards of each call's `V_total`).
    pub fn new(kind: MutantKind, chunk_size: usize) -> Mutant {
        let inner: Box<dyn Kernel> = match kind {
            k if k.is_chunked() => Box::new(CpuKernel::chunked(chunk_size)),
            MutantKind::TpVocabOffset => Box::new(CpuKernel::vocab_parallel(Vec::new())),
            _ => Box::new(CpuKernel::fused()),
        };
        Mutant {
            kind,
            inner,
            chunk_size,
            shards: None,
        }
    }

    /// The TP-vocab-offset mutant around [`CpuKernel::vocab_parallel`] over shards of
    /// these widths (summing to `V_total`, else the kernel's
    /// [`SpecError::ShapeMismatch`]): bit for bit the correct kernel except
    /// on rows whose target lies in a shard starting past column 0.
    pub fn tp_vocab_offset(shard_widths: Vec<usize>) -> Mutant {
        Mutant {
            shards: Some(shard_widths),
            ..Mutant::new(MutantKind::TpVocabOffset, 1)
        }
    }

    /// The correct vocab-parallel kernel the TP mutant wraps, for `v_total`
    /// columns.
    fn tp_kernel(&self, v_total: usize) -> CpuKernel {
        CpuKernel::vocab_parallel(
            self.shards
                .clone()
                .unwrap_or_else(|| even_shards(v_total, 2)),
        )
    }

    /// The bug kind.
    pub fn kind(&self) -> MutantKind {
        self.kind
    }
}

/// Every mutant of the catalog, chunked ones with `chunk_size`.
pub fn catalog(chunk_size: usize) -> Vec<Mutant> {
    MutantKind::ALL
        .iter()
        .map(|&k| Mutant::new(k, chunk_size))
        .collect()
}

// ---------------------------------------------------------------------------
// Row helpers (the buggy recomputations run in f32, as the shipped bugs did).

/// The logits of row `row` divided by the temperature as the kernels take
/// it (`x / T` rounded to the accumulation dtype, or
/// `round_input(round_acc(x / T))` for `TemperatureDtype::Input`), `[V]`, `-inf` kept. Values are exact in
/// the accumulation dtype; the buggy recomputations below round every
/// operation to it (f64 arithmetic rounded once to f32 is f32 arithmetic).
fn row_z(p: &Problem<'_>, shape: &Shape, row: usize) -> Vec<f64> {
    let x = p.logits.row_f64(row);
    let t = shape.temperature;
    let acc = shape.dtype.accumulation();
    x[..shape.vocab_size]
        .iter()
        .map(|&v| match p.options.temperature_dtype {
            TemperatureDtype::Accumulation => acc.round_f64(v / t),
            TemperatureDtype::Input => shape.dtype.scaled_input(v, t),
        })
        .collect()
}

/// Which entries of row `row` the entropy is over.
fn entropy_set(p: &Problem<'_>, row: usize, j: usize) -> bool {
    match p.options.entropy {
        Some(EntropyLogits::Masked) => p.allowed(row, j),
        _ => true,
    }
}

/// Unshifted log-sum-exp over `set` in the accumulation dtype `acc`:
/// `ln(sum exp(z_j))`, and whether the sum overflowed or fell below the
/// normal range (the bug's trigger).
fn unshifted_lse(acc: Dtype, z: &[f64], set: impl Fn(usize) -> bool) -> (f64, bool) {
    let r = |x: f64| acc.round_f64(x);
    let mut s = 0.0f64;
    for (j, &v) in z.iter().enumerate() {
        if set(j) && v > f64::NEG_INFINITY {
            s = r(s + r(v.exp()));
        }
    }
    let min_normal = logprobe_reference::spec::pow2(acc.min_normal_exp());
    (r(s.ln()), !s.is_finite() || s < min_normal)
}

impl Mutant {
    fn corrupt_forward(&self, p: &Problem<'_>, shape: &Shape, out: Dtype, fo: &mut ForwardOutput) {
        let n = shape.n;
        match self.kind {
            MutantKind::NanOnNegInf => {
                if let Some(h) = fo.values.get_mut(Output::Entropy) {
                    for row in 0..n {
                        let x = p.logits.row_f64(row);
                        // w_j = -inf: a -inf logit, or a masked entry under masked entropy.
                        if (0..shape.vocab_size)
                            .any(|j| x[j] == f64::NEG_INFINITY || !entropy_set(p, row, j))
                        {
                            h[[row, 0]] = f64::NAN;
                        }
                    }
                }
            }
            MutantKind::Bf16Accumulation => {
                if !matches!(shape.dtype, Dtype::Bf16 | Dtype::F16) {
                    return;
                }
                for row in 0..n {
                    let x = p.logits.row_f64(row);
                    let v = shape.vocab_size;
                    let allowed = p.allowed_row_f64(row);
                    let t = match p.options.temperature_dtype {
                        TemperatureDtype::Accumulation => shape.temperature,
                        TemperatureDtype::Input => 1.0,
                    };
                    let lp_row = naive_log_softmax(&allowed, t, shape.dtype);
                    if let (Some(lp), true) =
                        (fo.values.get_mut(Output::LogProbs), p.has_target(row))
                    {
                        lp[[row, 0]] = out.round_f64(lp_row[p.tokens.unwrap()[row] as usize]);
                    }
                    if let Some(tk) = fo.values.get_mut(Output::TopkLogProbs) {
                        for (k, &id) in p.topk_ids.unwrap().row(row).iter().enumerate() {
                            tk[[row, k]] = out.round_f64(lp_row[id as usize]);
                        }
                    }
                    if let Some(h) = fo.values.get_mut(Output::Entropy) {
                        let w: Vec<f64> = (0..v)
                            .map(|j| {
                                if entropy_set(p, row, j) {
                                    x[j]
                                } else {
                                    f64::NEG_INFINITY
                                }
                            })
                            .collect();
                        h[[row, 0]] = out.round_f64(naive_entropy(&w, t, shape.dtype));
                    }
                }
            }
            MutantKind::DroppedChunkRemainder => {
                let full = n / self.chunk_size.max(1) * self.chunk_size.max(1);
                for row in full..n {
                    for (_, a) in fo.values.iter_mut() {
                        a.row_mut(row).fill(0.0);
                    }
                }
            }
            MutantKind::MissingMaxShift => {
                let acc = shape.dtype.accumulation();
                let r = |x: f64| acc.round_f64(x);
                for row in 0..n {
                    let z = row_z(p, shape, row);
                    let (lse, hit) = unshifted_lse(acc, &z, |j| p.allowed(row, j));
                    if hit {
                        if let (Some(lp), true) =
                            (fo.values.get_mut(Output::LogProbs), p.has_target(row))
                        {
                            lp[[row, 0]] =
                                out.round_f64(r(z[p.tokens.unwrap()[row] as usize] - lse));
                        }
                        if let Some(tk) = fo.values.get_mut(Output::TopkLogProbs) {
                            for (k, &id) in p.topk_ids.unwrap().row(row).iter().enumerate() {
                                let zi = if p.allowed(row, id as usize) {
                                    z[id as usize]
                                } else {
                                    f64::NEG_INFINITY
                                };
                                tk[[row, k]] = out.round_f64(r(zi - lse));
                            }
                        }
                    }
                    let (lse_w, hit_w) = unshifted_lse(acc, &z, |j| entropy_set(p, row, j));
                    if let (Some(h), true) = (fo.values.get_mut(Output::Entropy), hit_w) {
                        let s = r(lse_w.exp());
                        let mut spz = 0.0f64;
                        for (j, &v) in z.iter().enumerate() {
                            if entropy_set(p, row, j) && v > f64::NEG_INFINITY {
                                spz = r(spz + r(r(v.exp()) * v));
                            }
                        }
                        h[[row, 0]] = out.round_f64(r(lse_w - r(spz / s)));
                    }
                }
            }
            MutantKind::RawEntropyFormula => {
                let Some(h) = fo.values.get_mut(Output::Entropy) else {
                    return;
                };
                let acc = shape.dtype.accumulation();
                let r = |x: f64| acc.round_f64(x);
                for row in 0..n {
                    let z = row_z(p, shape, row);
                    let set = |j: usize| entropy_set(p, row, j) && z[j] > f64::NEG_INFINITY;
                    let m = (0..z.len())
                        .filter(|&j| set(j))
                        .map(|j| z[j])
                        .fold(f64::NEG_INFINITY, f64::max);
                    let s = (0..z.len())
                        .filter(|&j| set(j))
                        .fold(0.0, |s, j| r(s + r(r(z[j] - m).exp())));
                    let lse = r(m + r(s.ln()));
                    let spz = (0..z.len())
                        .filter(|&j| set(j))
                        .fold(0.0, |a, j| r(a + r(r(r(r(z[j] - m).exp()) / s) * z[j])));
                    h[[row, 0]] = out.round_f64(r(lse - spz));
                }
            }
            _ => {}
        }
    }

    fn corrupt_backward(
        &self,
        p: &Problem<'_>,
        shape: &Shape,
        cot: &Cotangents<'_>,
        grad: &mut Array2<f64>,
    ) {
        match self.kind {
            MutantKind::NanOnNegInf => {
                let Some(h) = cot.grad_entropy else { return };
                for row in 0..shape.n {
                    if h[row] == 0.0 {
                        continue;
                    }
                    let x = p.logits.row_f64(row);
                    for j in 0..shape.vocab_size {
                        if entropy_set(p, row, j) && x[j] == f64::NEG_INFINITY {
                            grad[[row, j]] = f64::NAN;
                        }
                    }
                }
            }
            MutantKind::DroppedChunkRemainder => {
                let full = shape.n / self.chunk_size.max(1) * self.chunk_size.max(1);
                grad.slice_mut(s![full.., ..]).fill(0.0);
            }
            MutantKind::MissingMaxShift => {
                for row in 0..shape.n {
                    let z = row_z(p, shape, row);
                    if unshifted_lse(shape.dtype.accumulation(), &z, |j| p.allowed(row, j)).1 {
                        grad.row_mut(row)
                            .slice_mut(s![..shape.vocab_size])
                            .fill(f64::NAN);
                    }
                }
            }
            _ => {}
        }
    }

    /// The options / cotangents the bug gets wrong, for the option-level kinds.
    fn wrong_options(&self, p: &Problem<'_>) -> Options {
        let mut o = p.options;
        match self.kind {
            MutantKind::PaddedVocabNotTruncated => o.vocab_size = None,
            MutantKind::TemperatureIgnored => {
                o.temperature = 1.0;
                o.temperature_dtype = TemperatureDtype::Accumulation;
            }
            MutantKind::TemperatureTwice => o.temperature = o.temperature * o.temperature,
            MutantKind::EntropyWrongLogits if p.sampling_mask.is_some() => {
                o.entropy = o.entropy.map(|e| match e {
                    EntropyLogits::Masked => EntropyLogits::Unmasked,
                    EntropyLogits::Unmasked => EntropyLogits::Masked,
                })
            }
            _ => {}
        }
        o
    }

    /// Rows in odd-numbered chunks (`(row / chunk_size) % 2 == 1`).
    fn odd_chunk_rows(&self, n: usize) -> Vec<usize> {
        (0..n)
            .filter(|r| (r / self.chunk_size.max(1)) % 2 == 1)
            .collect()
    }
}

/// The TP bug's trigger: for each row whose target `t` lies in a shard
/// starting at `offset > 0`, `(row, t, t - offset)` (the local index read
/// as a global column). `ignore_index` rows have no target.
fn tp_triggers(p: &Problem<'_>, widths: &[usize]) -> Vec<(usize, usize, usize)> {
    let Some(tokens) = p.tokens else {
        return Vec::new();
    };
    (0..tokens.len())
        .filter(|&row| p.has_target(row))
        .filter_map(|row| {
            let t = tokens[row] as usize;
            let mut offset = 0;
            for &w in widths {
                if t < offset + w {
                    return (offset > 0).then_some((row, t, t - offset));
                }
                offset += w;
            }
            None
        })
        .collect()
}

/// The same logits as views of a shorter lifetime (`Logits` is invariant in
/// its lifetime), so a problem can be rebuilt with locally owned tokens.
fn reborrow<'b>(l: &'b Logits<'_>) -> Logits<'b> {
    match l {
        Logits::F64(a) => Logits::F64(a.view()),
        Logits::F32(a) => Logits::F32(a.view()),
        Logits::Bf16(a) => Logits::Bf16(a.view()),
        Logits::F16(a) => Logits::F16(a.view()),
    }
}

/// Whether column `j` of row `row` can be a target (allowed, finite logit).
fn gatherable(p: &Problem<'_>, row: usize, j: usize) -> bool {
    p.allowed(row, j) && p.logits.row_f64(row)[j].is_finite()
}

/// `tokens` with each triggered row's target moved to the shard-local
/// (wrong) column `w`, where that column can be gathered.
fn wrong_targets(
    p: &Problem<'_>,
    tokens: ArrayView1<'_, i64>,
    trig: &[(usize, usize, usize)],
) -> Array1<i64> {
    let mut wrong = tokens.to_owned();
    for &(row, _, w) in trig {
        if gatherable(p, row, w) {
            wrong[row] = w as i64;
        }
    }
    wrong
}

/// `p` with its tokens replaced by `tokens`.
fn with_tokens<'b>(p: &'b Problem<'_>, tokens: &'b Array1<i64>) -> Problem<'b> {
    Problem {
        logits: reborrow(&p.logits),
        tokens: Some(tokens.view()),
        sampling_mask: p.sampling_mask,
        topk_ids: p.topk_ids,
        options: p.options,
    }
}

/// Rows `rows` of `p` with the real vocabulary reversed (padding stays at
/// the end): tokens and ids mapped to `V - 1 - j`. Owned parts returned.
struct Reversed {
    logits: OwnedLogits,
    tokens: Option<Array1<i64>>,
    mask: Option<Array2<bool>>,
    ids: Option<Array2<i64>>,
}

impl Reversed {
    fn new(p: &Problem<'_>, shape: &Shape, rows: &[usize]) -> Reversed {
        let (v, vt) = (shape.vocab_size, shape.v_total);
        let rev = |j: usize| if j < v { v - 1 - j } else { j };
        let mut x = Array2::<f64>::zeros((rows.len(), vt));
        for (i, &r) in rows.iter().enumerate() {
            let xr = p.logits.row_f64(r);
            for j in 0..vt {
                x[[i, rev(j)]] = xr[j];
            }
        }
        let ii = p.options.ignore_index;
        let map_id = |t: i64| {
            if t == ii || t < 0 || t as usize >= v {
                t
            } else {
                (v - 1 - t as usize) as i64
            }
        };
        Reversed {
            logits: OwnedLogits::from_f64(shape.dtype, &x),
            tokens: p
                .tokens
                .map(|t| rows.iter().map(|&r| map_id(t[r])).collect()),
            mask: p
                .sampling_mask
                .map(|m| Array2::from_shape_fn((rows.len(), vt), |(i, j)| m[[rows[i], rev(j)]])),
            ids: p.topk_ids.map(|k| {
                Array2::from_shape_fn((rows.len(), shape.k), |(i, kk)| map_id(k[[rows[i], kk]]))
            }),
        }
    }

    fn problem<'a>(&'a self, options: Options) -> Problem<'a> {
        Problem {
            logits: self.logits.view(),
            tokens: self.tokens.as_ref().map(|t| t.view()),
            sampling_mask: self.mask.as_ref().map(|m| m.view()),
            topk_ids: self.ids.as_ref().map(|k| k.view()),
            options,
        }
    }
}

fn pick_rows1(a: Option<ArrayView1<'_, f64>>, rows: &[usize]) -> Option<Array1<f64>> {
    a.map(|a| rows.iter().map(|&r| a[r]).collect())
}

fn pick_rows2(a: Option<ArrayView2<'_, f64>>, rows: &[usize]) -> Option<Array2<f64>> {
    a.map(|a| Array2::from_shape_fn((rows.len(), a.ncols()), |(i, k)| a[[rows[i], k]]))
}

/// Cotangents with row 0's values for every row.
/// Owned cotangents `(log-probs [N], entropy [N], top-k [N, K])`.
type OwnedCotangents = (
    Option<Array1<f64>>,
    Option<Array1<f64>>,
    Option<Array2<f64>>,
);

fn broadcast_row0(cot: &Cotangents<'_>) -> OwnedCotangents {
    let b1 = |a: Option<ArrayView1<'_, f64>>| {
        a.map(|a| Array1::from_elem(a.len(), if a.is_empty() { 0.0 } else { a[0] }))
    };
    let b2 = cot.grad_topk_log_probs.map(|a| {
        let mut o = a.to_owned();
        if a.nrows() > 0 {
            let r0 = a.row(0).to_owned();
            for mut r in o.rows_mut() {
                r.assign(&r0);
            }
        }
        o
    });
    (b1(cot.grad_log_probs), b1(cot.grad_entropy), b2)
}

impl Kernel for Mutant {
    fn name(&self) -> String {
        match self.kind {
            k if k.is_chunked() => format!("mutant:{}(chunk_size={})", k.name(), self.chunk_size),
            k => format!("mutant:{}", k.name()),
        }
    }

    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities()
    }

    fn algorithm(&self, shape: &Shape) -> Algorithm {
        match self.kind {
            MutantKind::TpVocabOffset => self.tp_kernel(shape.v_total).algorithm(shape),
            _ => self.inner.algorithm(shape),
        }
    }

    /// The inner kernel's declaration (a mutant is judged by its correct
    /// twin's model).
    fn entropy_form(&self) -> Option<EntropyForm> {
        self.inner.entropy_form()
    }

    /// The inner kernel's declaration (the ignored-chunk-size mutant keeps
    /// declaring its nominal `chunk_size`: the memory property catches it).
    fn workspace_bytes(&self, shape: &Shape) -> usize {
        match self.kind {
            MutantKind::TpVocabOffset => self.tp_kernel(shape.v_total).workspace_bytes(shape),
            _ => self.inner.workspace_bytes(shape),
        }
    }

    fn forward(&self, problem: &Problem<'_>, out: Dtype) -> Result<ForwardOutput, KernelError> {
        match self.kind {
            MutantKind::TpVocabOffset => {
                let shape = problem.validate_shapes()?;
                let vp = self.tp_kernel(shape.v_total);
                let mut fo = vp.forward(problem, out)?;
                let trig = tp_triggers(problem, vp.shard_widths());
                let (Some(tokens), false) = (problem.tokens, trig.is_empty()) else {
                    return Ok(fo);
                };
                // The real kernel, run with the wrong column as the target.
                let wrong = wrong_targets(problem, tokens, &trig);
                let fw = vp.forward(&with_tokens(problem, &wrong), out)?;
                if let (Some(lp), Some(lw)) = (
                    fo.values.get_mut(Output::LogProbs),
                    fw.values.get(Output::LogProbs),
                ) {
                    for &(row, _, w) in &trig {
                        // A masked or -inf column gathers -inf.
                        lp[[row, 0]] = if gatherable(problem, row, w) {
                            lw[[row, 0]]
                        } else {
                            f64::NEG_INFINITY
                        };
                    }
                }
                Ok(fo)
            }
            MutantKind::PaddedVocabNotTruncated
            | MutantKind::TemperatureIgnored
            | MutantKind::TemperatureTwice
            | MutantKind::EntropyWrongLogits => {
                // Validate as the correct kernel would, then compute with the wrong options.
                let mut q = *problem;
                problem.validate_shapes()?;
                q.options = self.wrong_options(problem);
                if q.options.temperature != problem.options.temperature {
                    // The doubled or dropped temperature must not turn valid input into an error.
                    q.options
                        .effective_temperature(problem.logits.dtype().accumulation())?;
                }
                self.inner.forward(&q, out)
            }
            MutantKind::IgnoredChunkSize => {
                if self.chunk_size == 0 {
                    return Err(SpecError::ZeroChunkSize.into());
                }
                let n = problem.logits.dim().0;
                CpuKernel::chunked(n.max(1)).forward(problem, out)
            }
            MutantKind::ChunkDependentOrder => {
                let mut fo = self.inner.forward(problem, out)?;
                let shape = problem.validate_shapes()?;
                let rows = self.odd_chunk_rows(shape.n);
                if rows.is_empty() {
                    return Ok(fo);
                }
                let rv = Reversed::new(problem, &shape, &rows);
                let ro = self.inner.forward(&rv.problem(problem.options), out)?;
                for (i, &r) in rows.iter().enumerate() {
                    for (o, a) in fo.values.iter_mut() {
                        if let Some(b) = ro.values.get(o) {
                            a.row_mut(r).assign(&b.row(i));
                        }
                    }
                }
                Ok(fo)
            }
            _ => {
                let mut fo = self.inner.forward(problem, out)?;
                let shape = problem.validate_shapes()?;
                self.corrupt_forward(problem, &shape, out, &mut fo);
                Ok(fo)
            }
        }
    }

    fn backward(
        &self,
        problem: &Problem<'_>,
        cotangents: &Cotangents<'_>,
        out: Dtype,
    ) -> Result<Array2<f64>, KernelError> {
        match self.kind {
            MutantKind::TpVocabOffset => {
                let shape = problem.validate_shapes()?;
                let vp = self.tp_kernel(shape.v_total);
                let mut grad = vp.backward(problem, cotangents, out)?;
                let (Some(g), Some(tokens)) = (cotangents.grad_log_probs, problem.tokens) else {
                    return Ok(grad);
                };
                let trig: Vec<_> = tp_triggers(problem, vp.shard_widths())
                    .into_iter()
                    .filter(|&(row, _, _)| g[row] != 0.0)
                    .collect();
                if trig.is_empty() {
                    return Ok(grad);
                }
                let wrong = wrong_targets(problem, tokens, &trig);
                let gw = vp.backward(&with_tokens(problem, &wrong), cotangents, out)?;
                for &(row, t, w) in &trig {
                    if gatherable(problem, row, w) {
                        grad.row_mut(row).assign(&gw.row(row));
                    } else {
                        // A -inf gather is still differentiated: the one-hot
                        // term moves from the target to the wrong column.
                        let d = g[row] / shape.temperature;
                        grad[[row, t]] = out.round_f64(grad[[row, t]] - d);
                        grad[[row, w]] = out.round_f64(grad[[row, w]] + d);
                    }
                }
                Ok(grad)
            }
            MutantKind::PaddedVocabNotTruncated
            | MutantKind::TemperatureIgnored
            | MutantKind::TemperatureTwice
            | MutantKind::EntropyWrongLogits => {
                let mut q = *problem;
                problem.validate_shapes()?;
                q.options = self.wrong_options(problem);
                if q.options.temperature != problem.options.temperature {
                    q.options
                        .effective_temperature(problem.logits.dtype().accumulation())?;
                }
                self.inner.backward(&q, cotangents, out)
            }
            MutantKind::IgnoredChunkSize => {
                if self.chunk_size == 0 {
                    return Err(SpecError::ZeroChunkSize.into());
                }
                let n = problem.logits.dim().0;
                CpuKernel::chunked(n.max(1)).backward(problem, cotangents, out)
            }
            MutantKind::GradOutput0Broadcast => {
                let (g, h, gk) = broadcast_row0(cotangents);
                let shape = problem.validate_shapes()?;
                // Shapes and finiteness are checked on the real cotangents first.
                problem.validate_cotangents(&shape, cotangents)?;
                let c = Cotangents {
                    grad_log_probs: g.as_ref().map(|a| a.view()),
                    grad_entropy: h.as_ref().map(|a| a.view()),
                    grad_topk_log_probs: gk.as_ref().map(|a| a.view()),
                };
                self.inner.backward(problem, &c, out)
            }
            MutantKind::ChunkDependentOrder => {
                let mut grad = self.inner.backward(problem, cotangents, out)?;
                let shape = problem.validate_shapes()?;
                let rows = self.odd_chunk_rows(shape.n);
                if rows.is_empty() {
                    return Ok(grad);
                }
                let rv = Reversed::new(problem, &shape, &rows);
                let (g, h, gk) = (
                    pick_rows1(cotangents.grad_log_probs, &rows),
                    pick_rows1(cotangents.grad_entropy, &rows),
                    pick_rows2(cotangents.grad_topk_log_probs, &rows),
                );
                let c = Cotangents {
                    grad_log_probs: g.as_ref().map(|a| a.view()),
                    grad_entropy: h.as_ref().map(|a| a.view()),
                    grad_topk_log_probs: gk.as_ref().map(|a| a.view()),
                };
                let rg = self.inner.backward(&rv.problem(problem.options), &c, out)?;
                let v = shape.vocab_size;
                for (i, &r) in rows.iter().enumerate() {
                    for j in 0..shape.v_total {
                        let src = if j < v { v - 1 - j } else { j };
                        grad[[r, j]] = rg[[i, src]];
                    }
                }
                Ok(grad)
            }
            _ => {
                let mut grad = self.inner.backward(problem, cotangents, out)?;
                let shape = problem.validate_shapes()?;
                self.corrupt_backward(problem, &shape, cotangents, &mut grad);
                Ok(grad)
            }
        }
    }

    fn backward_in_place(
        &self,
        mut problem: ProblemMut<'_>,
        cotangents: &Cotangents<'_>,
    ) -> Result<(), KernelError> {
        match self.kind {
            MutantKind::TpVocabOffset => {
                let vp = self.tp_kernel(problem.logits.view().dim().1);
                let triggered = {
                    let p = problem.view();
                    p.validate_shapes().is_ok()
                        && cotangents.grad_log_probs.is_some_and(|g| {
                            tp_triggers(&p, vp.shard_widths())
                                .iter()
                                .any(|&(row, _, _)| g.get(row).is_some_and(|&x| x != 0.0))
                        })
                };
                if !triggered {
                    return vp.backward_in_place(problem, cotangents);
                }
                let grad = {
                    let p = problem.view();
                    self.backward(&p, cotangents, p.logits.dtype())?
                };
                write_over(problem.logits, &grad);
                Ok(())
            }
            MutantKind::InPlaceCorruption => {
                in_place_row_by_row(self.inner.as_ref(), problem, cotangents)
            }
            MutantKind::GradOutput0Broadcast => {
                let (g, h, gk) = broadcast_row0(cotangents);
                let c = Cotangents {
                    grad_log_probs: g.as_ref().map(|a| a.view()),
                    grad_entropy: h.as_ref().map(|a| a.view()),
                    grad_topk_log_probs: gk.as_ref().map(|a| a.view()),
                };
                self.inner.backward_in_place(problem, &c)
            }
            MutantKind::PaddedVocabNotTruncated
            | MutantKind::TemperatureIgnored
            | MutantKind::TemperatureTwice
            | MutantKind::EntropyWrongLogits => {
                let o = {
                    let p = problem.view();
                    p.validate_shapes()?;
                    let o = self.wrong_options(&p);
                    if o.temperature != p.options.temperature {
                        o.effective_temperature(p.logits.dtype().accumulation())?;
                    }
                    o
                };
                problem.options = o;
                self.inner.backward_in_place(problem, cotangents)
            }
            _ => {
                // The remaining kinds: the buggy backward, written over the logits.
                let grad = {
                    let p = problem.view();
                    let dtype = p.logits.dtype();
                    self.backward(&p, cotangents, dtype)?
                };
                write_over(problem.logits, &grad);
                Ok(())
            }
        }
    }
}

/// Writes `grad` (exact in the logits' dtype) over `logits`.
fn write_over(logits: LogitsMut<'_>, grad: &Array2<f64>) {
    use logprobe_reference::spec::Element;
    match logits {
        LogitsMut::F64(mut a) => a.zip_mut_with(grad, |x, &g| *x = g),
        LogitsMut::F32(mut a) => a.zip_mut_with(grad, |x, &g| *x = f32::from_f64(g)),
        LogitsMut::Bf16(mut a) => a.zip_mut_with(grad, |x, &g| *x = half::bf16::from_f64(g)),
        LogitsMut::F16(mut a) => a.zip_mut_with(grad, |x, &g| *x = half::f16::from_f64(g)),
    }
}

/// The in-place corruption bug: rows are validated and overwritten one at a
/// time, so an error on row `r` leaves rows `< r` already overwritten (the
/// trait promises unchanged logits on error).
fn in_place_row_by_row(
    inner: &dyn Kernel,
    mut problem: ProblemMut<'_>,
    cotangents: &Cotangents<'_>,
) -> Result<(), KernelError> {
    let shape = {
        let p = problem.view();
        let shape = p.validate_shapes()?;
        p.validate_cotangents(&shape, cotangents)?;
        shape
    };
    let (tokens, sampling_mask, topk_ids, options) = (
        problem.tokens,
        problem.sampling_mask,
        problem.topk_ids,
        problem.options,
    );
    for row in 0..shape.n {
        let r = row..row + 1;
        let c = Cotangents {
            grad_log_probs: cotangents
                .grad_log_probs
                .map(|g| g.slice_move(s![r.clone()])),
            grad_entropy: cotangents.grad_entropy.map(|g| g.slice_move(s![r.clone()])),
            grad_topk_log_probs: cotangents
                .grad_topk_log_probs
                .map(|g| g.slice_move(s![r.clone(), ..])),
        };
        let logits = match &mut problem.logits {
            LogitsMut::F64(a) => LogitsMut::F64(a.slice_mut(s![r.clone(), ..])),
            LogitsMut::F32(a) => LogitsMut::F32(a.slice_mut(s![r.clone(), ..])),
            LogitsMut::Bf16(a) => LogitsMut::Bf16(a.slice_mut(s![r.clone(), ..])),
            LogitsMut::F16(a) => LogitsMut::F16(a.slice_mut(s![r.clone(), ..])),
        };
        inner.backward_in_place(
            ProblemMut {
                logits,
                tokens: tokens.map(|t| t.slice_move(s![r.clone()])),
                sampling_mask: sampling_mask.map(|m| m.slice_move(s![r.clone(), ..])),
                topk_ids: topk_ids.map(|k| k.slice_move(s![r.clone(), ..])),
                options,
            },
            &c,
        )?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::strategies::{CotangentRecipe, ProblemRecipe};

    /// The TP mutant is the real [`CpuKernel::vocab_parallel`] bit for bit on rows whose
    /// target lies in the first shard, and differs on the others, forward
    /// and backward (new buffer and in place).
    #[test]
    fn tp_mutant_differs_from_vocab_parallel_only_where_triggered() {
        let mut r = ProblemRecipe::plain(11, 16, 40);
        r.topk = 3;
        let mut data = r.expand();
        // Targets on both sides of the cut at column 13, and one ignored row.
        let tokens: Vec<i64> = (0..16).map(|i| (i * 5 % 40) as i64).collect();
        data.tokens = Some(Array1::from_vec(tokens.clone()));
        data.tokens.as_mut().unwrap()[3] = data.options.ignore_index;
        let cot = CotangentRecipe {
            seed: 5,
            log_probs: true,
            entropy: true,
            topk: true,
        }
        .expand(&data);
        let widths = vec![13, 0, 20, 7];
        let (m, vp) = (
            Mutant::tp_vocab_offset(widths.clone()),
            CpuKernel::vocab_parallel(widths),
        );
        let p = data.problem();
        let (fm, fv) = (
            m.forward(&p, Dtype::F32).unwrap(),
            vp.forward(&p, Dtype::F32).unwrap(),
        );
        let g = cot.grad_log_probs.as_ref().unwrap();
        let (gm, gv) = (
            m.backward(&p, &cot.view(), Dtype::F32).unwrap(),
            vp.backward(&p, &cot.view(), Dtype::F32).unwrap(),
        );
        let mut triggered = 0;
        for row in 0..16 {
            let hit = row != 3 && tokens[row] >= 13;
            let lp = (
                fm.values[Output::LogProbs][[row, 0]],
                fv.values[Output::LogProbs][[row, 0]],
            );
            assert_eq!(
                lp.0.to_bits() != lp.1.to_bits(),
                hit,
                "row {row} log_prob {lp:?}"
            );
            let same_grad = gm
                .row(row)
                .iter()
                .zip(gv.row(row))
                .all(|(a, b)| a.to_bits() == b.to_bits());
            assert_eq!(!same_grad, hit && g[row] != 0.0, "row {row} grad");
            triggered += hit as usize;
        }
        assert!(triggered >= 8);
        assert!(forward_bits_eq_except_lp(&fm, &fv));
        // In place: the mutant's grads, written over the logits.
        let mut x = data.logits.clone();
        m.backward_in_place(
            ProblemMut {
                logits: x.view_mut(),
                tokens: p.tokens,
                sampling_mask: p.sampling_mask,
                topk_ids: p.topk_ids,
                options: p.options,
            },
            &cot.view(),
        )
        .unwrap();
        let xi = x.view();
        for row in 0..16 {
            for j in 0..40 {
                assert_eq!(xi.row_f64(row)[j].to_bits(), gm[[row, j]].to_bits());
            }
        }
    }

    /// Entropy and top-k outputs equal bit for bit (the bug is in the target gather).
    fn forward_bits_eq_except_lp(a: &ForwardOutput, b: &ForwardOutput) -> bool {
        let bits = |x: &Array2<f64>| x.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
        Output::ALL
            .into_iter()
            .filter(|&o| o != Output::LogProbs)
            .all(|o| a.values.get(o).map(bits) == b.values.get(o).map(bits))
    }
}
