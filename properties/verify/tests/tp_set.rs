//! Tensor-parallel sets (`dump::tp_set`): a shipped dump split into rank
//! dumps over uneven vocabulary shards is judged exactly as the whole dump,
//! ranks whose all-reduced outputs differ are each judged, and every way a
//! set can be wrong is a typed error naming the file.

use std::path::{Path, PathBuf};

use logprobe_verify::dump::tp_set::{name_without_rank, plan, Planned};
use logprobe_verify::dump::DumpError;
use logprobe_verify::tensors::{to_dump_bytes, TensorBytes};
use logprobe_verify::verify::{
    verify_file, verify_files, FileOutcome, FileReport, ReportVerdict, VerifyConfig,
};
use safetensors::SafeTensors;

fn shipped(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../fixtures/torch")
        .join(format!("{name}.safetensors"))
}

/// The report as JSON without timing, file identity and the set's files.
fn comparable(r: &FileReport) -> serde_json::Value {
    let mut v = serde_json::to_value(r).expect("serialisable");
    let o = v.as_object_mut().expect("an object");
    for k in ["seconds", "path", "name", "tp_set"] {
        o.remove(k);
    }
    v
}

/// The vocabulary axis of a tensor of the shipped dumps (as the reader's
/// table has it): the last of `[.., V]` tensors, the first of the LM head's.
fn axis(name: &str, ndim: usize) -> Option<usize> {
    match name {
        "logits" | "sampling_mask" | "teacher_probs" | "teacher_log_probs" | "grad_logits" => {
            Some(ndim - 1)
        }
        "lm_head_weight" | "lm_head_bias" | "grad_lm_head_weight" | "grad_lm_head_bias" => Some(0),
        _ => None,
    }
}

/// One rank's tensors: name, dtype, shape, bytes.
type RankTensors = Vec<(String, safetensors::Dtype, Vec<usize>, Vec<u8>)>;

/// Splits the dump at `path` over `widths` (contiguous columns in rank
/// order): each rank's tensors and metadata.
fn split(path: &Path, widths: &[usize]) -> Vec<(RankTensors, Vec<(String, String)>)> {
    let bytes = std::fs::read(path).expect("a shipped dump");
    let st = SafeTensors::deserialize(&bytes).expect("valid");
    let (_, header) = SafeTensors::read_metadata(&bytes).expect("header");
    let meta = header.metadata().clone().unwrap_or_default();
    let mut start = 0;
    let mut out = Vec::new();
    for (rank, &w) in widths.iter().enumerate() {
        let mut tensors = Vec::new();
        for (name, t) in st.tensors() {
            let mut shape = t.shape().to_vec();
            let data = match axis(&name, shape.len()) {
                None => t.data().to_vec(),
                Some(a) => {
                    let elem = t.dtype().bitsize() / 8;
                    let inner: usize = shape[a + 1..].iter().product::<usize>() * elem;
                    let outer: usize = shape[..a].iter().product();
                    let v = shape[a];
                    let mut d = Vec::new();
                    for o in 0..outer {
                        let row = &t.data()[o * v * inner..(o + 1) * v * inner];
                        d.extend_from_slice(&row[start * inner..(start + w) * inner]);
                    }
                    shape[a] = w;
                    d
                }
            };
            tensors.push((name, t.dtype(), shape, data));
        }
        let mut m: Vec<(String, String)> = meta.clone().into_iter().collect();
        m.retain(|(k, _)| k != "format_version");
        m.push(("format_version".into(), "2".into()));
        m.push(("tp_rank".into(), rank.to_string()));
        m.push(("tp_size".into(), widths.len().to_string()));
        m.push(("tp_vocab_start".into(), start.to_string()));
        out.push((tensors, m));
        start += w;
    }
    out
}

/// Writes rank dumps as `dir/{stem}_rank{r}.safetensors`.
fn write(dir: &Path, stem: &str, ranks: &[(RankTensors, Vec<(String, String)>)]) -> Vec<PathBuf> {
    ranks
        .iter()
        .enumerate()
        .map(|(r, (tensors, meta))| {
            let views: Vec<(&str, TensorBytes<'_>)> = tensors
                .iter()
                .map(|(n, d, s, b)| {
                    (
                        n.as_str(),
                        TensorBytes {
                            dtype: *d,
                            shape: s,
                            data: b,
                        },
                    )
                })
                .collect();
            let meta: Vec<(&str, &str)> =
                meta.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
            let path = dir.join(format!("{stem}_rank{r}.safetensors"));
            std::fs::write(&path, to_dump_bytes(&views, &meta).expect("writable")).expect("write");
            path
        })
        .collect()
}

fn reports(paths: &[PathBuf]) -> Vec<FileReport> {
    verify_files(paths, &VerifyConfig::default())
        .into_iter()
        .map(|o| match o {
            FileOutcome::Report(r) => r,
            FileOutcome::BadInput { path, error } => panic!("{}: {error}", path.display()),
        })
        .collect()
}

fn bad_input(paths: &[PathBuf]) -> String {
    match verify_files(paths, &VerifyConfig::default()).remove(0) {
        FileOutcome::BadInput { error, .. } => error.to_string(),
        FileOutcome::Report(r) => panic!("{}: {:?}, expected bad input", r.name, r.verdict),
    }
}

fn tempdir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("logprobe-tp-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("temp dir");
    dir
}

#[test]
fn a_split_dump_is_judged_as_the_whole_one() {
    let dir = tempdir("split");
    // Logits and grad_logits (a mean loss with label smoothing); the fused
    // LM head with its gradients (rows of W sharded, hidden global); a
    // failing dump stays failing, at the same global positions.
    for (name, widths) in [
        (
            "cross_entropy_mean_smoothing_grad_bf16",
            vec![3000, 0, 5192],
        ),
        ("fused_linear_grad_cce_fp32", vec![256, 700, 68]),
        ("fused_linear_grad_bf16_acc", vec![512, 512]),
        ("token_ranks_vllm_bf16", vec![50000, 50000, 51936]),
    ] {
        let whole = verify_file(&shipped(name), &VerifyConfig::default()).expect(name);
        let ranks = split(&shipped(name), &widths);
        let paths = write(&dir, name, &ranks);
        // Any order of the files.
        let mut shuffled = paths.clone();
        shuffled.reverse();
        let got = reports(&shuffled);
        assert_eq!(got.len(), 1, "{name}: one report");
        let set = got[0].tp_set.as_ref().expect("a set");
        assert_eq!(set.files, paths, "{name}: the files in rank order");
        assert_eq!(set.ranks, (0..widths.len() as u64).collect::<Vec<_>>());
        assert_eq!(got[0].path, paths[0]);
        assert_eq!(comparable(&got[0]), comparable(&whole), "{name}");
    }
    // One rank's file alone is refused: its outputs need every column.
    let one = dir.join("cross_entropy_mean_smoothing_grad_bf16_rank1.safetensors");
    let e = verify_file(&one, &VerifyConfig::default()).unwrap_err();
    assert!(
        matches!(e, DumpError::TpSet(_))
            && e.to_string()
                .contains("rank 1 of a tensor-parallel set of 3"),
        "{e}"
    );
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn ranks_holding_other_bits_of_an_all_reduced_output_are_judged_too() {
    let dir = tempdir("copies");
    let name = "cross_entropy_mean_smoothing_grad_bf16";
    let mut ranks = split(&shipped(name), &[4096, 4096]);
    // Rank 1's copy of the (f32, reduced) loss is 1000 ulps off.
    let loss = ranks[1].0.iter_mut().find(|t| t.0 == "loss").expect("loss");
    let x = f32::from_le_bytes(loss.3[..4].try_into().unwrap());
    loss.3[..4].copy_from_slice(&f32::from_bits(x.to_bits() + 1000).to_le_bytes());
    let paths = write(&dir, name, &ranks);
    let got = reports(&paths);
    assert_eq!(got.len(), 2);
    let sets: Vec<_> = got
        .iter()
        .map(|r| r.tp_set.as_ref().unwrap().ranks.clone())
        .collect();
    assert_eq!(sets, vec![vec![0], vec![1]]);
    assert_eq!(
        (got[0].path.clone(), got[1].path.clone()),
        (paths[0].clone(), paths[1].clone())
    );
    let loss_verdict = |r: &FileReport| {
        r.outputs
            .iter()
            .find(|o| o.output == "loss")
            .unwrap()
            .verdict
    };
    assert_eq!(loss_verdict(&got[0]), ReportVerdict::Pass);
    assert_eq!(loss_verdict(&got[1]), ReportVerdict::Fail);
    std::fs::remove_dir_all(&dir).ok();
}

/// An edit of one rank's tensors and metadata.
type Edit = Box<dyn Fn(&mut RankTensors, &mut Vec<(String, String)>)>;

/// Rank dumps of `cross_entropy_mean_smoothing_grad_bf16` over two shards,
/// with `edit` applied to rank 1's tensors and metadata, written to `dir`.
fn edited(dir: &Path, edit: impl Fn(&mut RankTensors, &mut Vec<(String, String)>)) -> Vec<PathBuf> {
    let mut ranks = split(
        &shipped("cross_entropy_mean_smoothing_grad_bf16"),
        &[4000, 4192],
    );
    let (t, m) = &mut ranks[1];
    edit(t, m);
    write(dir, "ce", &ranks)
}

fn set_meta(m: &mut [(String, String)], key: &str, value: &str) {
    m.iter_mut().find(|(k, _)| k == key).expect("a key").1 = value.into();
}

#[test]
fn sets_that_do_not_fit_are_typed_errors_naming_the_file() {
    let dir = tempdir("errors");
    let cases: Vec<(&str, Edit, &str)> = vec![
        (
            "start",
            Box::new(|_, m| set_meta(m, "tp_vocab_start", "4001")),
            "ce_rank1.safetensors: metadata `tp_vocab_start` = 4001, but ranks 0..1 hold the first 4000 columns",
        ),
        (
            "tokens",
            Box::new(|t, _| {
                let tok = t.iter_mut().find(|x| x.0 == "tokens").unwrap();
                tok.3[8 * 5] ^= 1;
            }),
            "ce_rank1.safetensors: tensor `tokens` differs from rank 0's at element 5",
        ),
        (
            "meta",
            Box::new(|_, m| set_meta(m, "label_smoothing", "0.2")),
            "ce_rank1.safetensors: metadata `label_smoothing` is \"0.2\", rank 0's is \"0.1\"",
        ),
        (
            "layout",
            Box::new(|t, _| {
                let g = t.iter_mut().find(|x| x.0 == "grad_logits").unwrap();
                g.2 = vec![g.2[0] / 2, 2 * g.2[1]];
            }),
            "ce_rank1.safetensors: tensor `grad_logits` is F32 [8, 8384], expected F32 [16, 4192]",
        ),
        (
            "range",
            Box::new(|_, m| set_meta(m, "tp_rank", "2")),
            "metadata `tp_rank` = 2 is not below `tp_size` = 2",
        ),
        (
            "keys",
            Box::new(|_, m| m.retain(|(k, _)| k != "tp_vocab_start")),
            "needs all three of `tp_rank`, `tp_size` and `tp_vocab_start`",
        ),
    ];
    for (what, edit, want) in cases {
        let sub = dir.join(what);
        std::fs::create_dir_all(&sub).unwrap();
        let paths = edited(&sub, edit);
        let got = match plan(&paths).as_slice() {
            // A rank whose keys do not read is verified alone.
            [Planned::Set(_), Planned::One(_)] => {
                match verify_files(&paths, &VerifyConfig::default()).remove(1) {
                    FileOutcome::BadInput { error, .. } => error.to_string(),
                    FileOutcome::Report(r) => panic!("{what}: {:?}", r.verdict),
                }
            }
            _ => bad_input(&paths),
        };
        assert!(got.contains(want), "{what}: {got}");
    }
    // A huge tp_size: the first missing ranks are listed, never all.
    let sub = dir.join("huge");
    std::fs::create_dir_all(&sub).unwrap();
    let mut ranks = split(
        &shipped("cross_entropy_mean_smoothing_grad_bf16"),
        &[4000, 4192],
    );
    for (_, m) in &mut ranks {
        set_meta(m, "tp_size", &u64::MAX.to_string());
    }
    let got = bad_input(&write(&sub, "ce", &ranks));
    assert!(
        got.contains("ranks [2, 3, 4, 5, 6, 7, 8, 9] and more of 18446744073709551615 are missing"),
        "{got}"
    );
    // A missing rank; a rank given twice.
    let sub = dir.join("missing");
    std::fs::create_dir_all(&sub).unwrap();
    let paths = edited(&sub, |_, _| {});
    let got = bad_input(&paths[..1]);
    assert!(got.contains("ranks [1] of 2 are missing"), "{got}");
    let twice = sub.join("ce_rank01.safetensors");
    std::fs::copy(&paths[1], &twice).unwrap();
    let got = bad_input(&[paths[0].clone(), paths[1].clone(), twice]);
    assert!(got.contains("rank 1 is given twice"), "{got}");
    // One folder spelt two ways is one folder; a rank dump that does not
    // join the set is named beside the missing rank.
    let spelt = sub.join(".").join(paths[1].file_name().unwrap());
    assert_eq!(reports(&[paths[0].clone(), spelt]).len(), 1);
    let other = dir.join("huge").join("ce_rank1.safetensors");
    let got = bad_input(&[paths[0].clone(), other.clone()]);
    assert!(
        got.contains("ranks [1] of 2 are missing")
            && got.contains(&format!("not in this set: {}", other.display())),
        "{got}"
    );
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn ranks_of_one_set_share_their_name_but_for_the_rank() {
    assert_eq!(
        name_without_rank("ce_rank3.safetensors", 3),
        "ce_rank.safetensors"
    );
    assert_eq!(name_without_rank("step13_rank3.st", 3), "step13_rank.st");
    assert_eq!(name_without_rank("rank3_step13.st", 3), "rank_step13.st");
    assert_eq!(name_without_rank("tp07.st", 7), "tp.st");
    assert_eq!(name_without_rank("tp00.st", 0), "tp.st");
    assert_eq!(name_without_rank("dump.st", 2), "dump.st");
    assert_eq!(name_without_rank("r12.st", 1), "r12.st");
}
