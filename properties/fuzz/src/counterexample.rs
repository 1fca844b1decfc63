//! A finding as a dump in the verify format (`docs/dump-from-pytorch.md`):
//! the case's inputs, the failing call's outputs as candidates, and the
//! recipe in metadata (`fuzz_recipe`, `fuzz_kernel`, `fuzz_property`,
//! `fuzz_seed`), so that `logprobe verify FILE` judges the outputs and
//! `logprobe fuzz --replay FILE` reruns the case.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use logprobe_kernels::kernel::Kernel;
use logprobe_reference::spec::{
    Columns, Cotangents, Dtype, Output, PolicyTerm, Problem, Reduction, TopkKl,
};
use logprobe_testkit::checks::{asked, loss_problem};
use logprobe_testkit::strategies::{CotangentData, ProblemData};
use logprobe_verify::dump::{write_dump, Dump, DumpError, DumpTensor, Metadata};
use logprobe_verify::keys;
use logprobe_verify::names::tensor;
use logprobe_verify::verify::{verify_dump, VerifyConfig};

use super::case::{Expanded, FuzzCase};
use super::judge::{Call, Finding};
use super::target::Target;

/// The tensors of a dump being built.
type Tensors = Vec<(&'static str, DumpTensor)>;

/// The bytes of the dump of `finding` on `case` (see the module docs),
/// written by the one dump writer ([`write_dump`]).
///
/// # Errors
/// [`DumpError`] when a tensor cannot be serialised (a bug).
pub fn dump_bytes(
    target: &Target,
    case: &FuzzCase,
    finding: &Finding,
    seed: u64,
) -> Result<Vec<u8>, DumpError> {
    let e: Expanded = case.expand();
    let kernel = target.kernel(case.chunk, &e.layout.widths);
    let k: &dyn Kernel = kernel.as_ref();
    let data = &e.data;
    // A loss finding's dump holds the loss problem (no other outputs asked).
    let full = if matches!(finding.call, Call::Loss(_)) {
        loss_problem(data)
    } else {
        data.problem()
    };
    let p = asked(&full, &k.capabilities()).problem;
    let mut t = input_tensors(data, &p);
    let kl = match finding.call {
        Call::Backward(_) | Call::InPlace => backward_tensors(&e, k, &p, finding.call, &mut t),
        Call::Loss(out) => {
            loss_tensors(&e, k, &p, out, &mut t);
            None
        }
        Call::Forward(_) | Call::Invariance | Call::Memory | Call::Exec | Call::Linear => {
            let out = match finding.call {
                Call::Forward(d) => d,
                _ => case.out(),
            };
            forward_tensors(k, &p, out, &mut t)
        }
    };
    let meta = metadata(target, case, finding, seed, &e, &p, kl);
    write_dump(&t, &meta)
}

/// `logits`, `tokens`, `sampling_mask` and the asked `topk_ids`.
fn input_tensors(data: &ProblemData, p: &Problem<'_>) -> Tensors {
    let (n, vt) = data.logits.view().dim();
    let mut t: Tensors = vec![(
        tensor::LOGITS,
        DumpTensor::floats(
            data.logits.dtype(),
            &[n, vt],
            &data.logits.to_f64().into_raw_vec_and_offset().0,
        ),
    )];
    if let Some(tok) = &data.tokens {
        t.push((
            tensor::TOKENS,
            DumpTensor::i64s(&[tok.len()], &tok.to_vec()),
        ));
    }
    if let Some(m) = &data.sampling_mask {
        let (r, c) = m.dim();
        t.push((
            tensor::SAMPLING_MASK,
            DumpTensor::bools(&[r, c], &m.iter().copied().collect::<Vec<_>>()),
        ));
    }
    if let Some(ids) = p.topk_ids {
        let (r, c) = ids.dim();
        t.push((
            tensor::TOPK_IDS,
            DumpTensor::i64s(&[r, c], &ids.iter().copied().collect::<Vec<_>>()),
        ));
    }
    t
}

/// A per-row f32 tensor `[N]`.
fn f32s1(a: &ndarray::Array1<f64>) -> DumpTensor {
    DumpTensor::floats(Dtype::F32, &[a.len()], &a.to_vec())
}

/// The cotangent tensor name of `o` (every output asked here has one).
fn grad(o: Output) -> &'static str {
    o.cotangent_name().expect("an output with a cotangent")
}

/// A backward finding's cotangents (as asked of this kernel, with the
/// inputs they need) and the kernel's `grad_logits`; returns the top-k KL's
/// `kl_renormalized` when its teacher is written.
fn backward_tensors(
    e: &Expanded,
    k: &dyn Kernel,
    p: &Problem<'_>,
    call: Call,
    t: &mut Tensors,
) -> Option<bool> {
    let (cot, data) = (&e.cot, &e.data);
    let mut meta_kl = None;
    if let Some(g) = &cot.grad_log_probs {
        t.push((grad(Output::LogProbs), f32s1(g)));
    }
    if let (Some(h), Some(_)) = (&cot.grad_entropy, p.options.entropy) {
        t.push((grad(Output::Entropy), f32s1(h)));
    }
    if let (Some(g), Some(_)) = (&cot.grad_topk_log_probs, p.topk_ids) {
        let (r, c) = g.dim();
        t.push((
            grad(Output::TopkLogProbs),
            DumpTensor::floats(Dtype::F32, &[r, c], &g.iter().copied().collect::<Vec<_>>()),
        ));
    }
    // The loss side's, as asked of this kernel (a reduced loss's
    // cotangent stored `[]`), with the loss's weights.
    if let (Some(g), true) = (&cot.grad_lse, p.options.lse) {
        t.push((grad(Output::Lse), f32s1(g)));
    }
    if let (Some(g), Some(_)) = (&cot.grad_z_loss, p.options.z_loss_coef) {
        t.push((grad(Output::ZLoss), f32s1(g)));
    }
    if let (Some(g), Some(l)) = (&cot.grad_loss, p.options.loss) {
        let shape: Vec<usize> = match l.reduction {
            Reduction::None => vec![g.len()],
            Reduction::Sum | Reduction::Mean => vec![],
        };
        t.push((
            grad(Output::Loss),
            DumpTensor::floats(Dtype::F32, &shape, &g.to_vec()),
        ));
        if let Some(w) = p.loss_weights {
            t.push((
                tensor::LOSS_WEIGHTS,
                DumpTensor::floats(Dtype::F64, &[w.len()], &w.to_vec()),
            ));
        }
    }
    // The policy terms', with their inputs (exact f32 values).
    let mut policy_inputs = [false; 2];
    for term in PolicyTerm::ALL {
        let input = if term.uses_old() {
            p.policy.old_log_probs
        } else {
            p.policy.ref_log_probs
        };
        if let (Some(g), Some(_), Some(name)) =
            (cot.policy(term), input, term.output().cotangent_name())
        {
            t.push((name, f32s1(&g.to_owned())));
            policy_inputs[usize::from(term.uses_old())] = true;
        }
    }
    for (slot, (name, a)) in [
        (tensor::REF_LOG_PROBS, p.policy.ref_log_probs),
        (tensor::OLD_LOG_PROBS, p.policy.old_log_probs),
    ]
    .into_iter()
    .enumerate()
    {
        if let (Some(a), true) = (a, policy_inputs[slot]) {
            t.push((
                name,
                DumpTensor::floats(Dtype::F32, &[a.len()], &a.to_vec()),
            ));
        }
    }
    // The top-k KL's, with its teacher (in the dtype it was drawn in).
    if let (Some(kl), Some(a)) = (p.options.topk_kl, p.teacher_topk_log_probs) {
        let given = [
            (grad(Output::ForwardKl), &cot.grad_forward_kl),
            (grad(Output::ReverseKl), &cot.grad_reverse_kl),
        ];
        for (name, g) in given {
            if let Some(g) = g {
                t.push((name, f32s1(g)));
            }
        }
        if given.iter().any(|(_, g)| g.is_some()) {
            t.push((tensor::TEACHER_TOPK_LOG_PROBS, teacher_tensor(&kl, &a)));
            meta_kl = Some(kl.renormalized);
        }
    }
    // The soft cross-entropy's, with its teacher (drawn exact in f32).
    if let (Some(g), Some(tp)) = (&cot.grad_soft_cross_entropy, p.teacher_probs) {
        t.push((grad(Output::SoftCrossEntropy), f32s1(g)));
        let values: Vec<f64> = tp.iter().copied().collect();
        t.push((
            p.options.teacher_form.tensor(),
            DumpTensor::floats(Dtype::F32, &[tp.nrows(), tp.ncols()], &values),
        ));
    }
    let cv = asked_cotangents(cot, p);
    let (grad_logits, out) = if call == Call::InPlace {
        let mut copy = data.logits.clone();
        let r = k.backward_in_place(p.with_logits(copy.view_mut()), &cv);
        (r.ok().map(|_| copy.to_f64()), data.logits.dtype())
    } else {
        let out = match call {
            Call::Backward(d) => d,
            _ => Dtype::F32,
        };
        (k.backward(p, &cv, out).ok(), out)
    };
    if let Some(g) = grad_logits {
        let (r, c) = g.dim();
        t.push((
            Output::GradLogits.name(),
            DumpTensor::floats(out, &[r, c], &g.iter().copied().collect::<Vec<_>>()),
        ));
    }
    meta_kl
}

/// A loss finding's `loss` in `out` and its exact f64 weights.
fn loss_tensors(e: &Expanded, k: &dyn Kernel, p: &Problem<'_>, out: Dtype, t: &mut Tensors) {
    let ce = e.loss.ce();
    if let Ok(lo) = k.cross_entropy(p, &ce, out) {
        let shape: Vec<usize> = match ce.reduction {
            Reduction::None => vec![lo.values.len()],
            Reduction::Sum | Reduction::Mean => vec![],
        };
        t.push((
            Output::Loss.name(),
            DumpTensor::floats(out, &shape, &lo.values),
        ));
        // Exact f64 weights (drawn in f64).
        if let Some(w) = &e.loss.loss_weights {
            t.push((
                tensor::LOSS_WEIGHTS,
                DumpTensor::floats(Dtype::F64, &[w.len()], &w.to_vec()),
            ));
        }
    }
}

/// The cotangents of `cot` the problem `p` (as asked of the kernel) has
/// outputs for: each other one left out.
fn asked_cotangents<'c>(cot: &'c CotangentData, p: &Problem<'_>) -> Cotangents<'c> {
    let mut cv = cot.view();
    if p.teacher_probs.is_none() {
        cv.per_output.take(Output::SoftCrossEntropy);
    }
    if p.options.topk_kl.is_none() || p.teacher_topk_log_probs.is_none() {
        cv.per_output.take(Output::ForwardKl);
        cv.per_output.take(Output::ReverseKl);
    }
    if p.policy.ref_log_probs.is_none() {
        cv.per_output.take(Output::KlK1);
        cv.per_output.take(Output::KlK2);
        cv.per_output.take(Output::KlK3);
        cv.per_output.take(Output::KlAbs);
    }
    if p.policy.old_log_probs.is_none() {
        cv.per_output.take(Output::Ratio);
    }
    if p.options.entropy.is_none() {
        cv.per_output.take(Output::Entropy);
    }
    if p.topk_ids.is_none() {
        cv.per_output.take(Output::TopkLogProbs);
    }
    if !p.options.lse {
        cv.per_output.take(Output::Lse);
    }
    if p.options.z_loss_coef.is_none() {
        cv.per_output.take(Output::ZLoss);
    }
    if p.options.loss.is_none() {
        cv.per_output.take(Output::Loss);
    }
    cv
}

/// A forward finding's outputs in `out`, with the top-k KL's teacher and
/// the policy terms' inputs; returns `kl_renormalized` when the teacher is
/// written.
fn forward_tensors(k: &dyn Kernel, p: &Problem<'_>, out: Dtype, t: &mut Tensors) -> Option<bool> {
    let fo = k.forward(p, out).ok()?;
    let mut meta_kl = None;
    for (o, a) in fo.values.iter() {
        let values: Vec<f64> = a.iter().copied().collect();
        let shape = match o.columns() {
            Columns::One => vec![a.nrows()],
            Columns::TopK | Columns::Vocabulary => vec![a.nrows(), a.ncols()],
        };
        // Counts (`Output::is_count`) are stored exactly, whatever `out`.
        let dtype = if o.is_count() { Dtype::F64 } else { out };
        t.push((o.name(), DumpTensor::floats(dtype, &shape, &values)));
    }
    // The soft cross-entropy's teacher (drawn exact in f32).
    if let (Some(tp), true) = (
        p.teacher_probs,
        fo.values.contains(Output::SoftCrossEntropy),
    ) {
        let values: Vec<f64> = tp.iter().copied().collect();
        t.push((
            p.options.teacher_form.tensor(),
            DumpTensor::floats(Dtype::F32, &[tp.nrows(), tp.ncols()], &values),
        ));
    }
    // The top-k KL's teacher, in the dtype it was drawn in.
    if let (Some(kl), Some(a)) = (p.options.topk_kl, p.teacher_topk_log_probs) {
        if fo.values.contains(Output::ForwardKl) || fo.values.contains(Output::ReverseKl) {
            t.push((tensor::TEACHER_TOPK_LOG_PROBS, teacher_tensor(&kl, &a)));
            meta_kl = Some(kl.renormalized);
        }
    }
    // The policy terms' inputs (exact f32 values), with their terms.
    for (name, a, term) in [
        (tensor::REF_LOG_PROBS, p.policy.ref_log_probs, Output::KlK1),
        (tensor::OLD_LOG_PROBS, p.policy.old_log_probs, Output::Ratio),
    ] {
        if let (Some(a), true) = (a, fo.values.contains(term)) {
            t.push((
                name,
                DumpTensor::floats(Dtype::F32, &[a.len()], &a.to_vec()),
            ));
        }
    }
    meta_kl
}

/// The dump's metadata: the options as asked, the provenance keys, and
/// the options of what the dump holds (clamps, loss, `kl_renormalized`).
fn metadata(
    target: &Target,
    case: &FuzzCase,
    finding: &Finding,
    seed: u64,
    e: &Expanded,
    p: &Problem<'_>,
    meta_kl: Option<bool>,
) -> Metadata {
    let o = &p.options;
    let mut meta = Metadata::new();
    meta.set(keys::FORMAT_VERSION, &keys::FormatVersion::V2)
        .set(keys::TEMPERATURE, &o.temperature)
        .set(keys::TEMPERATURE_DTYPE, &o.temperature_dtype)
        .set(keys::IGNORE_INDEX, &o.ignore_index)
        .set(keys::CHUNK_SIZE, &(case.chunk as u64))
        .set(keys::FUZZ_RECIPE, &case.recipe())
        .set(keys::FUZZ_KERNEL, &target.name)
        .set(keys::FUZZ_PROPERTY, &finding.property.to_string())
        .set(keys::FUZZ_SEED, &seed.to_string());
    if let Some(v) = o.vocab_size {
        meta.set(keys::VOCAB_SIZE, &v);
    }
    if let Some(c) = o.z_loss_coef {
        meta.set(keys::Z_LOSS_COEF, &c);
    }
    if let Some(r) = meta_kl {
        meta.set(keys::KL_RENORMALIZED, &r);
    }
    if let Some(c) = o.softcap {
        meta.set(keys::SOFTCAP, &c)
            .set(keys::SOFTCAP_DTYPE, &o.softcap_dtype);
    }
    let backward = matches!(finding.call, Call::Backward(_) | Call::InPlace);
    let loss_grad = backward && o.loss.is_some() && e.cot.grad_loss.is_some();
    let forward_like = matches!(
        finding.call,
        Call::Forward(_) | Call::Invariance | Call::Memory | Call::Exec
    );
    let policy_grad = backward && PolicyTerm::ALL.iter().any(|&t| e.cot.policy(t).is_some());
    if (forward_like || policy_grad) && !p.policy.is_empty() {
        let c = &o.policy_clamps;
        for (key, v) in [
            (keys::KL_INPUT_CLAMP, c.kl_input),
            (keys::KL_OUTPUT_CLAMP, c.kl_output),
            (keys::RATIO_LOG_CLAMP, c.ratio_log),
        ] {
            if let Some(v) = v {
                meta.set(key, &v);
            }
        }
    }
    if matches!(finding.call, Call::Loss(_)) || loss_grad {
        let l = &e.loss;
        meta.set(keys::REDUCTION, &l.reduction)
            .set(keys::LABEL_SMOOTHING, &l.label_smoothing)
            .set(keys::MEAN_ALL_IGNORED, &l.mean_all_ignored);
    }
    if let Some(en) = o.entropy {
        meta.set(keys::ENTROPY_LOGITS, &en);
    }
    meta
}

/// Writes the dump into `dir` as `fuzz-<kernel>-seed<S>-<hash>.safetensors`
/// (atomically, never over an earlier finding: [`super::files::write_new`])
/// and returns its path with what `logprobe verify` says of it (`pass`,
/// `FAIL`, `no bound`, or `bad input: ...`).
///
/// # Errors
/// An I/O or serialisation error, as text.
pub fn write(
    dir: &Path,
    target: &Target,
    case: &FuzzCase,
    finding: &Finding,
    seed: u64,
) -> Result<(PathBuf, String), String> {
    let bytes = dump_bytes(target, case, finding, seed).map_err(|e| e.to_string())?;
    let stem = crate::files::name_stem(&target.name);
    let verdict = match Dump::parse(&bytes) {
        Ok(d) => match verify_dump(&d, Path::new("finding"), &VerifyConfig::default()) {
            Ok(r) => r.verdict.to_string(),
            Err(e) => format!("bad input: {e}"),
        },
        Err(e) => format!("bad input: {e}"),
    };
    let files = [(format!("fuzz-{stem}-seed{seed}.safetensors"), bytes)];
    let path = super::files::write_new(dir, &files)
        .map_err(|e| e.to_string())?
        .remove(0);
    Ok((path, verdict))
}

/// The fuzz metadata of a dump: `(kernel, recipe, property, seed)`.
///
/// # Errors
/// An unreadable file, a malformed header, or a dump without the fuzz keys.
pub fn read_meta(path: &Path) -> Result<(String, String, String, String), String> {
    let bytes = std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let (_, header) = safetensors::SafeTensors::read_metadata(&bytes)
        .map_err(|e| format!("{}: not a safetensors file: {e}", path.display()))?;
    let meta: HashMap<String, String> = header.metadata().clone().unwrap_or_default();
    let get = |k: &str| {
        meta.get(k)
            .cloned()
            .ok_or_else(|| format!("{}: no `{k}` metadata (not a fuzz dump)", path.display()))
    };
    Ok((
        get(keys::FUZZ_KERNEL.name)?,
        get(keys::FUZZ_RECIPE.name)?,
        get(keys::FUZZ_PROPERTY.name).unwrap_or_default(),
        get(keys::FUZZ_SEED.name).unwrap_or_default(),
    ))
}

/// The top-k KL's teacher `[N, K]` as a dump tensor, in the dtype it was
/// drawn in (its values are exact there).
fn teacher_tensor(kl: &TopkKl, a: &ndarray::ArrayView2<'_, f64>) -> DumpTensor {
    let (r, c) = a.dim();
    DumpTensor::floats(
        kl.teacher_dtype,
        &[r, c],
        &a.iter().copied().collect::<Vec<_>>(),
    )
}
