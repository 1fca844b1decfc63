//! The statistical tier of grad logits (TOLERANCE.md (S6)): a gradient
//! whose probabilities come from a normaliser summed by one f32
//! accumulator (an undeclared sequential order) stays within the sound
//! bound of the default lanes=8 model but is SUSPECT, while the same
//! gradient from the exact probabilities is not; declared `sequential`,
//! the same candidate is not SUSPECT.

use std::path::Path;

use logprobe_reference::spec::Dtype;
use logprobe_reference::splitmix::SplitMix64;
use logprobe_verify::dump::{serialize_dump, Dump, DumpTensor};
use logprobe_verify::verify::{verify_dump, OutputReport, ReportVerdict, VerifyConfig};

const N: usize = 2;
const V: usize = 65_536;

/// f32 logits `[N, V]` (the first entry of each row dominant, then a
/// Gaussian body), the tokens, and the grad logits of `-sum_r lp_t`:
/// `p_j - [j = t]`, with `p` exact and rounded once (`sequential =
/// false`), or from f32 exps summed by one f32 accumulator in index order.
fn dump(sequential: bool) -> Vec<u8> {
    let mut rng = SplitMix64::new(7);
    let (mut x, mut tokens, mut lp, mut grad) = (vec![], vec![], vec![], vec![]);
    for r in 0..N {
        let row: Vec<f64> = (0..V)
            .map(|j| {
                let v = if j == 0 { 14.0 } else { 2.5 * rng.normal() };
                f64::from(v as f32)
            })
            .collect();
        let t = if r == 0 {
            0
        } else {
            1 + (rng.next_u64() % (V as u64 - 1)) as usize
        };
        let m = row.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let s: f64 = row.iter().map(|&v| (v - m).exp()).sum();
        let s32 = row.iter().fold(0f32, |acc, &v| acc + (v - m).exp() as f32);
        for (j, &v) in row.iter().enumerate() {
            let p = if sequential {
                f64::from((v - m).exp() as f32 / s32)
            } else {
                (v - m).exp() / s
            };
            let one = if j == t { 1.0 } else { 0.0 };
            grad.push(f64::from((p - one) as f32));
        }
        lp.push(f64::from((row[t] - m - s.ln()) as f32));
        tokens.push(t as i64);
        x.extend(row);
    }
    serialize_dump(
        &[
            ("logits", DumpTensor::floats(Dtype::F32, &[N, V], &x)),
            ("tokens", DumpTensor::i64s(&[N], &tokens)),
            ("log_probs", DumpTensor::floats(Dtype::F32, &[N], &lp)),
            (
                "grad_log_probs",
                DumpTensor::floats(Dtype::F32, &[N], &[-1.0; N]),
            ),
            (
                "grad_logits",
                DumpTensor::floats(Dtype::F32, &[N, V], &grad),
            ),
        ],
        &[],
    )
    .unwrap()
}

fn grad_report(bytes: &[u8], config: &VerifyConfig) -> OutputReport {
    let dump = Dump::parse(bytes).unwrap();
    let r = verify_dump(&dump, Path::new("g.safetensors"), config).unwrap();
    r.outputs
        .into_iter()
        .find(|o| o.output == "grad_logits")
        .unwrap()
}

#[test]
fn an_undeclared_sequential_normaliser_is_suspect_in_the_gradient() {
    let config = VerifyConfig::default();
    let good = grad_report(&dump(false), &config);
    let stat = good.statistical_max_ratio.expect("grad logits have a tier");
    assert_eq!(good.verdict, ReportVerdict::Pass, "{stat}");
    assert!(stat < 0.5, "{stat}");
    let seq = dump(true);
    let bad = grad_report(&seq, &config);
    let stat = bad.statistical_max_ratio.unwrap();
    let sound = bad.max_ratio.unwrap();
    assert!(sound <= 1.0, "within the sound bound: {sound}");
    assert_eq!(bad.verdict, ReportVerdict::Suspect, "{stat}");
    assert!(bad.suspect_rules.contains(&"statistical") && bad.suspect_elements > 0);
    assert!(stat > 1.0, "{stat}");
    // Declared, the same order is held to its own (wider) threshold.
    let declared = VerifyConfig {
        model: logprobe_verify::tolerance::Order::Sequential,
        ..VerifyConfig::default()
    };
    let ok = grad_report(&seq, &declared);
    assert_ne!(
        ok.verdict,
        ReportVerdict::Suspect,
        "{:?}",
        ok.statistical_max_ratio
    );
}
