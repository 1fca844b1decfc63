//! The certified f64 tier (`oracle::fast`) against a 320-bit MPFR
//! evaluation written here from docs/design.md's formulas (no code shared with
//! the oracle): every enclosure of the tier (`s`, `ln S`, `S_w`, `B`, `R`,
//! `M2`, `lse`, log-prob, entropy, top-k, `d_j`, `e_j`, `p_j`, `q_j` and
//! the VJP elements) must contain the exact value, over offsets up to
//! `1e30`, subnormals, near-uniform rows at real V, one-hot rows, masks,
//! ties, `-inf`, temperatures and exact softcaps (`x' = c tanh(x / c)`,
//! taken here at 700 bits; module docs of `oracle::fast`, (F9)). Planted mutants of the tier must break
//! that property on small-V rows, and the public oracle must return the
//! same correctly rounded values on both tiers.

use half::{bf16, f16};
use logprobe_reference::oracle::fast::{FastOptions, FastRow, Mutant, RowCotangents};
use logprobe_reference::oracle::{Interval, Oracle, Tier};
use logprobe_reference::spec::{
    pow2, Cotangents, Dtype, EntropyLogits, Logits, Output, Problem, TemperatureDtype,
};
use ndarray::{Array1, Array2};
use rug::Float;

/// Working precision of the reference.
const P: u32 = 320;
/// Shifts beyond this give `E_j < 2^-1.4e6`: the reference bounds them.
const HUGE: f64 = 1e6;

/// xorshift64*.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 * pow2(-53)
    }
    fn normal(&mut self) -> f64 {
        let u = self.unit().max(1e-300);
        (-2.0 * u.ln()).sqrt() * (std::f64::consts::TAU * self.unit()).cos()
    }
}

/// One generated row (logits exactly representable in `dtype`).
#[derive(Clone, Debug)]
struct Case {
    kind: &'static str,
    dtype: Dtype,
    x: Vec<f64>,
    mask: Option<Vec<bool>>,
    temperature: f64,
    t_input: bool,
    entropy: Option<EntropyLogits>,
    token: i64,
    topk: Vec<i64>,
    g: f64,
    h: f64,
    gk: Vec<f64>,
    /// An exact softcap `c` (`softcap_dtype = accumulation`; never with
    /// `t_input`, which the spec refuses with it).
    softcap: Option<f64>,
}

fn clamp_round(d: Dtype, x: f64) -> f64 {
    if x == f64::NEG_INFINITY {
        return x;
    }
    let m = d.max_finite();
    d.round_f64(x.clamp(-m, m))
}

/// Draws a row of one of the generator kinds at vocabulary size `v`.
fn gen(rng: &mut Rng, v: usize) -> Case {
    let dtype = [Dtype::F32, Dtype::F32, Dtype::F64, Dtype::Bf16, Dtype::F16][rng.below(5)];
    let kinds = [
        "llm",
        "offset",
        "subnormal",
        "one_hot",
        "ties",
        "uniform",
        "neg_inf",
    ];
    let kind = kinds[rng.below(kinds.len())];
    let mut x: Vec<f64> = match kind {
        "llm" => (0..v).map(|_| 2.5 * rng.normal() - 2.0).collect(),
        "offset" => {
            // Values near +-1e30 (or the dtype's range) mixed with tiny and moderate ones.
            let big = [1e30, 1e20, 3e4, 1e8][rng.below(4)];
            (0..v)
                .map(|_| match rng.below(4) {
                    0 => big * (1.0 + 1e-3 * rng.normal()),
                    1 => -big * (1.0 + rng.unit()),
                    2 => 1e-30 * rng.normal(),
                    _ => 100.5 + rng.normal(),
                })
                .collect()
        }
        "subnormal" => (0..v)
            .map(|_| match rng.below(3) {
                0 => {
                    f64::from_bits(rng.next() % (1 << 40))
                        * if rng.below(2) == 0 { 1.0 } else { -1.0 }
                }
                1 => 1e-40 * rng.normal(),
                _ => 1e-6 * rng.normal(),
            })
            .collect(),
        "one_hot" => {
            let gap = [5.0, 20.0, 45.0, 100.0, 700.0, 760.0, 1e5][rng.below(7)];
            let hot = rng.below(v);
            (0..v)
                .map(|j| {
                    if j == hot {
                        3.0
                    } else if rng.below(4) == 0 {
                        f64::NEG_INFINITY
                    } else {
                        3.0 - gap * (1.0 + 0.1 * rng.unit())
                    }
                })
                .collect()
        }
        "ties" => {
            let vals = [1.0, 1.0, 0.5, -2.0];
            (0..v).map(|_| vals[rng.below(vals.len())]).collect()
        }
        "uniform" => (0..v).map(|_| 7.0 + 1e-3 * rng.normal()).collect(),
        _ => (0..v)
            .map(|_| {
                if rng.below(2) == 0 {
                    f64::NEG_INFINITY
                } else {
                    rng.normal() * 4.0
                }
            })
            .collect(),
    };
    for xi in x.iter_mut() {
        *xi = clamp_round(dtype, *xi);
    }
    // At least one finite entry.
    if x.iter().all(|&xi| xi == f64::NEG_INFINITY) {
        x[0] = 0.0;
    }
    let mask = (rng.below(3) == 0).then(|| {
        let mut m: Vec<bool> = (0..v).map(|_| rng.below(3) != 0).collect();
        let fin = x.iter().position(|&xi| xi > f64::NEG_INFINITY).unwrap();
        m[fin] = true;
        m
    });
    let allowed_finite: Vec<usize> = (0..v)
        .filter(|&j| x[j] > f64::NEG_INFINITY && mask.as_ref().is_none_or(|m| m[j]))
        .collect();
    let token = if rng.below(8) == 0 {
        -100
    } else {
        allowed_finite[rng.below(allowed_finite.len())] as i64
    };
    let temperature = [1.0, 1.0, 0.5, 2.0, 0.7, 1.3, 0.25, 1e-3][rng.below(8)];
    let t_input = dtype != Dtype::F64 && rng.below(6) == 0;
    let entropy = [
        Some(EntropyLogits::Unmasked),
        Some(EntropyLogits::Unmasked),
        Some(EntropyLogits::Masked),
        None,
    ][rng.below(4)];
    let k = rng.below(3);
    let topk: Vec<i64> = (0..k).map(|_| rng.below(v) as i64).collect();
    let gk: Vec<f64> = (0..k).map(|_| rng.normal()).collect();
    let g = if rng.below(4) == 0 { 0.0 } else { rng.normal() };
    let h = if entropy.is_some() && rng.below(3) != 0 {
        rng.normal()
    } else {
        0.0
    };
    // Drawn last: the other knobs keep their draws.
    let softcap = (!t_input && rng.below(3) == 0).then(|| {
        let c = [30.0, 50.0, 2.5, 1000.0, 0.01, 1e6][rng.below(6)];
        dtype.accumulation().round_f64(c)
    });
    Case {
        kind,
        dtype,
        x,
        mask,
        temperature,
        t_input,
        entropy,
        token,
        topk,
        g,
        h,
        gk,
        softcap,
    }
}

/// Owned logits of one dtype.
enum Owned {
    F64(Array2<f64>),
    F32(Array2<f32>),
    Bf16(Array2<bf16>),
    F16(Array2<f16>),
}

struct Data {
    logits: Owned,
    mask: Option<Array2<bool>>,
    tokens: Array1<i64>,
    topk: Option<Array2<i64>>,
    g: Array1<f64>,
    h: Array1<f64>,
    gk: Option<Array2<f64>>,
}

impl Case {
    fn data(&self) -> Data {
        let v = self.x.len();
        let logits = match self.dtype {
            Dtype::F64 => Owned::F64(Array2::from_shape_vec((1, v), self.x.clone()).unwrap()),
            Dtype::F32 => Owned::F32(
                Array2::from_shape_vec((1, v), self.x.iter().map(|&x| x as f32).collect()).unwrap(),
            ),
            Dtype::Bf16 => Owned::Bf16(
                Array2::from_shape_vec((1, v), self.x.iter().map(|&x| bf16::from_f64(x)).collect())
                    .unwrap(),
            ),
            Dtype::F16 => Owned::F16(
                Array2::from_shape_vec((1, v), self.x.iter().map(|&x| f16::from_f64(x)).collect())
                    .unwrap(),
            ),
        };
        let k = self.topk.len();
        Data {
            logits,
            mask: self
                .mask
                .as_ref()
                .map(|m| Array2::from_shape_vec((1, v), m.clone()).unwrap()),
            tokens: Array1::from_elem(1, self.token),
            topk: (k > 0).then(|| Array2::from_shape_vec((1, k), self.topk.clone()).unwrap()),
            g: Array1::from_elem(1, self.g),
            h: Array1::from_elem(1, self.h),
            gk: (k > 0).then(|| Array2::from_shape_vec((1, k), self.gk.clone()).unwrap()),
        }
    }
}

impl Data {
    fn problem(&self, c: &Case) -> Problem<'_> {
        let logits = match &self.logits {
            Owned::F64(a) => Logits::F64(a.view()),
            Owned::F32(a) => Logits::F32(a.view()),
            Owned::Bf16(a) => Logits::Bf16(a.view()),
            Owned::F16(a) => Logits::F16(a.view()),
        };
        let mut p = Problem::new(logits);
        p.tokens = Some(self.tokens.view());
        p.sampling_mask = self.mask.as_ref().map(|m| m.view());
        p.topk_ids = self.topk.as_ref().map(|t| t.view());
        p.options.temperature = c.temperature;
        p.options.softcap = c.softcap;
        p.options.entropy = c.entropy;
        if c.t_input {
            p.options.temperature_dtype = TemperatureDtype::Input;
        }
        p
    }

    fn cotangents(&self, c: &Case) -> Cotangents<'_> {
        Cotangents::default()
            .with_column(Output::LogProbs, self.g.view())
            .with_column(Output::Entropy, c.entropy.map(|_| self.h.view()))
            .with(Output::TopkLogProbs, self.gk.as_ref().map(|g| g.view()))
    }
}

/// A reference value with its absolute error margin.
#[derive(Clone, Debug)]
struct Ref {
    v: Float,
    margin: Float,
}

impl Ref {
    fn exact(v: Float) -> Ref {
        Ref {
            v,
            margin: Float::new(P),
        }
    }
    fn rel(v: Float) -> Ref {
        let m = Float::with_val(P, v.clone().abs() >> 290u32);
        Ref { v, margin: m }
    }
}

/// One softmax family evaluated at 320 bits.
struct RefFamily {
    members: Vec<bool>,
    a: Vec<Float>,
    e: Vec<Float>,
    /// Upper bound of the entries left out (`a > HUGE`), each `<= 2^-1.4e6`.
    n_huge: usize,
    s: Ref,
    b: Ref,
    t2: Ref,
}

fn ref_family(v: &[Float], members: Vec<bool>, ts: f64) -> RefFamily {
    let vmax = max_of(v, &members);
    let argmax = (0..v.len()).find(|&j| members[j] && v[j] == vmax).unwrap();
    let (mut s, mut b, mut t2) = (Float::new(P), Float::new(P), Float::new(P));
    let mut a_all = Vec::with_capacity(v.len());
    let mut e_all = Vec::with_capacity(v.len());
    let mut n_huge = 0;
    for j in 0..v.len() {
        if !members[j] {
            a_all.push(Float::with_val(P, f64::INFINITY));
            e_all.push(Float::new(P));
            continue;
        }
        let diff = Float::with_val(2200, &vmax - &v[j]);
        let a = Float::with_val(P, diff / ts);
        let e = if a > HUGE {
            n_huge += 1;
            Float::new(P)
        } else {
            Float::with_val(P, -a.clone()).exp()
        };
        if j != argmax {
            s += &e;
            b += Float::with_val(P, &e * &a);
            t2 += Float::with_val(P, &e * Float::with_val(P, a.clone().square()));
        }
        a_all.push(a);
        e_all.push(e);
    }
    // Entries with a > 1e6: E < 2^-1.44e6, E a < 2^-1.44e6 * 1e30... bound the
    // products by 2^-1e6 each (E a^k <= e^{-a} a^2 < 2^-1e6 for a > 1e6).
    let huge = Float::with_val(P, n_huge) >> 1_000_000u32;
    let widen = |x: Float| {
        let mut r = Ref::rel(x);
        r.margin += &huge;
        r
    };
    RefFamily {
        members,
        a: a_all,
        e: e_all,
        n_huge,
        s: widen(s),
        b: widen(b),
        t2: widen(t2),
    }
}

/// Whether `iv` holds the exact value, known to lie in `[v - margin, v +
/// margin]` (`margin` is `2^-290` relative, far below an f64 ulp): the two
/// intervals must meet. A miss of the f64 tier by a fraction of an ulp is
/// seen; one of less than `2^-290` relative next to an f64 end is not.
fn holds(iv: Interval, r: &Ref) -> bool {
    let lo = Float::with_val(P, &r.v - &r.margin);
    let hi = Float::with_val(P, &r.v + &r.margin);
    iv.lo <= hi && lo <= iv.hi
}

fn holds_f(iv: Interval, x: &Float, margin: &Float) -> bool {
    holds(
        iv,
        &Ref {
            v: x.clone(),
            margin: margin.clone(),
        },
    )
}

/// The largest member of `v` (`-inf` without members).
fn max_of(v: &[Float], members: &[bool]) -> Float {
    let mut m = Float::with_val(53, f64::NEG_INFINITY);
    for (x, _) in v.iter().zip(members).filter(|(_, &b)| b) {
        if *x > m {
            m = x.clone();
        }
    }
    m
}

/// The exact inputs `v_j` (f64 values exactly; under an exact softcap
/// `x'_j = c tanh(x_j / c)` at 700 bits, `-c` for a `-inf` logit), the
/// divisor `ts`, the temperature.
fn exact_inputs(c: &Case) -> (Vec<Float>, f64, f64) {
    let acc = c.dtype.accumulation();
    let t = acc.round_f64(c.temperature);
    let f = |x: f64| Float::with_val(53, x);
    if c.t_input {
        // The spec's z = round_input(round_acc(x / T)), as the oracle's.
        let v = c.x.iter().map(|&x| f(c.dtype.scaled_input(x, t))).collect();
        (v, 1.0, t)
    } else if let Some(cap) = c.softcap {
        let v =
            c.x.iter()
                .map(|&x| {
                    if x == f64::NEG_INFINITY {
                        f(-cap)
                    } else {
                        let y = Float::with_val(700, Float::with_val(700, x) / cap).tanh();
                        Float::with_val(700, y * cap)
                    }
                })
                .collect();
        (v, t, t)
    } else {
        (c.x.iter().map(|&x| f(x)).collect(), t, t)
    }
}

/// Checks every enclosure of the fast tier on `c` against the reference;
/// returns the names of the enclosures that miss it (empty: all hold).
fn violations(c: &Case, mutant: Option<Mutant>) -> Vec<String> {
    let data = c.data();
    let p = data.problem(c);
    let stats_entropy = Some(c.entropy.unwrap_or(EntropyLogits::Unmasked));
    let opts = FastOptions {
        entropy: stats_entropy,
        per_entry: true,
        m2: true,
        mutant,
        row_validated: false,
    };
    let Ok(fr) = FastRow::new(&p, 0, opts) else {
        return Vec::new(); // a spec error (e.g. z overflowing): not the tier's business
    };
    let mut bad = Vec::new();
    if !fr.applicable() {
        return bad;
    }
    let (v, ts, temperature) = exact_inputs(c);
    let n = v.len();
    let allowed = |j: usize| c.mask.as_ref().is_none_or(|m| m[j]);
    let pm: Vec<bool> = (0..n)
        .map(|j| v[j] > f64::NEG_INFINITY && allowed(j))
        .collect();
    let qm: Vec<bool> = match stats_entropy {
        Some(EntropyLogits::Masked) => pm.clone(),
        _ => (0..n).map(|j| v[j] > f64::NEG_INFINITY).collect(),
    };
    let pf = ref_family(&v, pm, ts);
    let qf = ref_family(&v, qm, ts);
    let one = Float::with_val(P, 1);
    fn check(bad: &mut Vec<String>, name: String, iv: Interval, r: &Ref) {
        if !holds(iv, r) {
            bad.push(format!(
                "{name}: [{:e}, {:e}] vs {}",
                iv.lo,
                iv.hi,
                r.v.to_f64()
            ));
        }
    }
    check(&mut bad, "s".into(), fr.s(), &pf.s);
    let big_s = Ref::rel(Float::with_val(P, &pf.s.v + &one));
    check(&mut bad, "S".into(), fr.sum(), &big_s);
    let ln_s = Ref::rel(Float::with_val(P, pf.s.v.ln_1p_ref()));
    check(&mut bad, "ln S".into(), fr.ln_s(), &ln_s);
    check(&mut bad, "s_w".into(), fr.s_w().unwrap(), &qf.s);
    check(&mut bad, "B".into(), fr.b().unwrap(), &qf.b);
    let s_w = Float::with_val(P, &qf.s.v + &one);
    let r = Ref::rel(Float::with_val(P, &qf.b.v / &s_w));
    check(&mut bad, "R".into(), fr.r().unwrap(), &r);
    check(
        &mut bad,
        "M2".into(),
        fr.m2().unwrap(),
        &Ref::rel(Float::with_val(P, &qf.t2.v / &s_w)),
    );
    let ln_sw = Float::with_val(P, qf.s.v.ln_1p_ref());
    check(
        &mut bad,
        "entropy".into(),
        fr.entropy().unwrap(),
        &Ref::rel(Float::with_val(P, &ln_sw + &r.v)),
    );
    let vmax = max_of(&v, &pf.members);
    let lse = Float::with_val(P, Float::with_val(P, &vmax / ts) + &ln_s.v);
    check(&mut bad, "lse".into(), fr.lse(), &Ref::rel(lse));
    let lp_of = |j: usize| -> Ref {
        if !pf.members[j] {
            Ref::exact(Float::with_val(P, f64::NEG_INFINITY))
        } else {
            Ref::rel(Float::with_val(P, -Float::with_val(P, &pf.a[j] + &ln_s.v)))
        }
    };
    if c.token >= 0 {
        check(
            &mut bad,
            "log_prob".into(),
            fr.log_prob().unwrap(),
            &lp_of(c.token as usize),
        );
    }
    for (k, (&id, iv)) in c.topk.iter().zip(fr.topk()).enumerate() {
        let r = if allowed(id as usize) {
            lp_of(id as usize)
        } else {
            Ref::exact(Float::with_val(P, f64::NEG_INFINITY))
        };
        if r.v.is_infinite() {
            if iv.lo != f64::NEG_INFINITY || iv.hi != f64::NEG_INFINITY {
                bad.push(format!("topk {k}: not -inf"));
            }
        } else {
            check(&mut bad, format!("topk {k}"), iv, &r);
        }
    }
    let s_p = Float::with_val(P, &pf.s.v + &one);
    let st = fr.row_stats();
    for j in 0..n {
        for (name, fam, iv_d, iv_p, s) in [
            ("d/p", &pf, st.d[j], st.p[j], &s_p),
            ("e/q", &qf, st.e[j], st.q[j], &s_w),
        ] {
            if !fam.members[j] {
                if iv_d.hi != f64::NEG_INFINITY || iv_p.lo != 0.0 || iv_p.hi != 0.0 {
                    bad.push(format!("{name} {j}: non-member not -inf / 0"));
                }
                continue;
            }
            let huge = fam.a[j] > HUGE;
            if !huge {
                check(
                    &mut bad,
                    format!("{name} {j} (shift)"),
                    iv_d,
                    &Ref::rel(Float::with_val(P, -&fam.a[j])),
                );
                let pj = Float::with_val(P, &fam.e[j] / s);
                check(&mut bad, format!("{name} {j} (prob)"), iv_p, &Ref::rel(pj));
            } else if !(iv_d.lo <= -HUGE && iv_p.lo <= 0.0) {
                bad.push(format!("{name} {j}: huge shift"));
            }
        }
    }
    let _ = pf.n_huge + qf.n_huge;
    // VJP (the entropy family is the problem's own, as the VJP uses).
    let vjp_opts = FastOptions {
        entropy: if c.h != 0.0 { c.entropy } else { None },
        per_entry: true,
        m2: false,
        mutant,
        row_validated: false,
    };
    let fv_row = FastRow::new(&p, 0, vjp_opts).unwrap();
    if !fv_row.vjp_applicable() {
        // The softcap's VJP is MPFR's (F9).
        assert!(c.softcap.is_some(), "VJP not applicable without a softcap");
        return bad;
    }
    let gt = if c.token >= 0 { c.g } else { 0.0 };
    let rc = RowCotangents {
        g: gt,
        h: c.h,
        topk: &c.gk,
        ..Default::default()
    };
    let fv = fv_row.vjp(&rc);
    let qv = (c.h != 0.0).then_some(&qf);
    let mut coeff = vec![Float::new(2300); n];
    let mut special = vec![false; n];
    let mut csum = Float::new(2300);
    if c.token >= 0 && gt != 0.0 {
        coeff[c.token as usize] += gt;
        special[c.token as usize] = true;
        csum += gt;
    }
    for (&id, &gk) in c.topk.iter().zip(&c.gk) {
        if allowed(id as usize) && gk != 0.0 {
            coeff[id as usize] += gk;
            special[id as usize] = true;
            csum += gk;
        }
    }
    let rq = qv.map(|q| Float::with_val(P, &q.b.v / Float::with_val(P, &q.s.v + &one)));
    for j in 0..n {
        let in_p = pf.members[j];
        let in_q = qv.is_some_and(|q| q.members[j]);
        let iv = fv.element(j);
        if !(special[j] || in_p && csum != 0 || in_q) {
            if iv.is_some() {
                bad.push(format!("grad {j}: term where none"));
            }
            continue;
        }
        let Some(iv) = iv else {
            bad.push(format!("grad {j}: no term"));
            continue;
        };
        if (in_p && pf.a[j] > HUGE) || (in_q && qv.unwrap().a[j] > HUGE) {
            continue; // the reference has no value there; the tier's bound is checked elsewhere
        }
        // dx_j T = A_j - C p_j - h q_j (R - a_j).
        let pj = if in_p {
            Float::with_val(P, &pf.e[j] / &s_p)
        } else {
            Float::new(P)
        };
        let t1 = Float::with_val(P, &coeff[j]);
        let t2 = Float::with_val(P, &csum * &pj);
        let (mut t3, mut mag3) = (Float::new(P), Float::new(P));
        if let (true, Some(q), Some(r)) = (in_q, qv, rq.as_ref()) {
            let qj = Float::with_val(P, &q.e[j] / Float::with_val(P, &q.s.v + &one));
            let cj = Float::with_val(P, r - &q.a[j]);
            t3 = Float::with_val(P, Float::with_val(P, &qj * &cj) * c.h);
            mag3 = Float::with_val(P, &qj * Float::with_val(P, r + &q.a[j])) * c.h.abs();
        }
        let dx = Float::with_val(P, Float::with_val(P, &t1 - &t2) - &t3) / temperature;
        let mag = Float::with_val(P, Float::with_val(P, t1.abs() + t2.abs()) + mag3) / temperature;
        let margin = Float::with_val(P, mag >> 280u32);
        if !holds_f(iv, &dx, &margin) {
            bad.push(format!(
                "grad {j}: [{:e}, {:e}] vs {}",
                iv.lo,
                iv.hi,
                dx.to_f64()
            ));
        }
    }
    bad
}

/// Whether the f64 tier takes `c`'s row (its enclosures are then checked).
fn applicable(c: &Case) -> bool {
    let data = c.data();
    let p = data.problem(c);
    FastRow::new(&p, 0, FastOptions::default()).is_ok_and(|r| r.applicable())
}

fn cases(seed: u64, count: usize, v_choices: &[usize]) -> Vec<Case> {
    let mut rng = Rng(seed);
    (0..count)
        .map(|_| {
            let v = v_choices[rng.below(v_choices.len())];
            gen(&mut rng, v)
        })
        .collect()
}

#[test]
fn every_enclosure_contains_the_exact_value() {
    let mut failed = Vec::new();
    let all = cases(0xFA57_0001, 1500, &[1, 2, 3, 5, 8, 17, 64]);
    // Exact softcaps are on the tier (F9), not left to MPFR.
    let capped = all
        .iter()
        .filter(|c| c.softcap.is_some() && applicable(c))
        .count();
    assert!(capped >= 300, "{capped} softcapped rows on the f64 tier");
    for (i, c) in all.iter().enumerate() {
        let bad = violations(c, None);
        if !bad.is_empty() {
            failed.push(format!(
                "case {i} {} {:?}: {:?}",
                c.kind,
                c.dtype,
                &bad[..bad.len().min(4)]
            ));
        }
    }
    assert!(
        failed.is_empty(),
        "{} cases:\n{}",
        failed.len(),
        failed.join("\n")
    );
}

#[test]
fn every_enclosure_contains_the_exact_value_at_real_vocabulary_sizes() {
    let mut rng = Rng(0xFA57_0002);
    let v = 152_064;
    for kind in ["uniform", "llm", "llm_softcap"] {
        let mut c = gen(&mut rng, 8);
        c.kind = kind;
        c.dtype = Dtype::F32;
        c.x = (0..v)
            .map(|_| {
                if kind == "uniform" {
                    7.0 + 1e-4 * rng.normal()
                } else if kind == "llm_softcap" {
                    // Gemma 2's c = 30 over logits reaching its saturation.
                    12.0 * rng.normal() - 2.0
                } else {
                    2.5 * rng.normal() - 2.0
                }
            })
            .map(|x| x as f32 as f64)
            .collect();
        c.mask = None;
        c.token = 1234;
        c.topk = vec![5, 77];
        c.gk = vec![0.5, -0.25];
        c.entropy = Some(EntropyLogits::Unmasked);
        c.h = 0.3;
        c.temperature = if kind == "uniform" { 1.0 } else { 0.7 };
        c.t_input = false;
        c.softcap = (kind == "llm_softcap").then_some(30.0);
        let bad = violations(&c, None);
        assert!(bad.is_empty(), "{kind}: {:?}", &bad[..bad.len().min(4)]);
    }
}

/// Each planted mutant breaks the property on small-V rows (where the
/// bounds are tight: `s` is summed exactly, the exps are 1 ulp wide).
#[test]
fn planted_mutants_are_killed() {
    let small = cases(0xFA57_0003, 400, &[2, 3, 4, 8]);
    for m in [
        Mutant::ExpNotWidened,
        Mutant::ShiftNotWidened,
        Mutant::SMinusOne,
        Mutant::TanhNotWidened,
    ] {
        // The softcap's mutant can only show on softcapped rows.
        let killed = small
            .iter()
            .filter(|c| m != Mutant::TanhNotWidened || c.softcap.is_some())
            .filter(|c| !violations(c, Some(m)).is_empty())
            .count();
        eprintln!("{m:?}: killed on {killed} rows");
        assert!(
            killed >= 5,
            "{m:?} survived: killed on {killed} of {} rows",
            small.len()
        );
    }
}

/// `fast` and `mpfr` hold the same correctly rounded value: the same bits,
/// except for the sign of a zero when MPFR's own enclosure contains 0 (then
/// MPFR's zero takes the sign of its midpoint, while the f64 tier, which
/// decided a zero only from an enclosure on one side of 0, has the sign of
/// the exact value).
fn same_value(
    fast: &logprobe_reference::oracle::Exact,
    mpfr: &logprobe_reference::oracle::Exact,
    what: &str,
) {
    if fast.rounded.to_bits() == mpfr.rounded.to_bits() {
        return;
    }
    let straddles = mpfr.enclosure.lo <= 0.0 && mpfr.enclosure.hi >= 0.0;
    let one_side = fast.enclosure.lo > 0.0 || fast.enclosure.hi < 0.0;
    assert!(
        straddles && one_side && fast.rounded == 0.0 && mpfr.rounded == 0.0,
        "{what}: {fast:?} vs {mpfr:?}"
    );
}

/// The public oracle returns the same correctly rounded values on both
/// tiers (forward in every dtype, VJP, and decided flags), and counts its
/// fallbacks.
#[test]
fn both_tiers_return_the_same_values() {
    let fast = Oracle {
        tier: Tier::FastVjp,
        ..Oracle::default()
    };
    let mpfr = Oracle {
        tier: Tier::Mpfr,
        ..Oracle::default()
    };
    let mut fb_f32 = logprobe_reference::oracle::Fallback::default();
    for c in cases(0xFA57_0004, 300, &[1, 3, 8, 40]) {
        let data = c.data();
        let p = data.problem(&c);
        for target in Dtype::ALL {
            let (a, b) = match (fast.forward(&p, target), mpfr.forward(&p, target)) {
                (Ok(a), Ok(b)) => (a, b),
                (Err(a), Err(b)) => {
                    assert_eq!(a, b);
                    continue;
                }
                (a, b) => panic!("{c:?}: {:?} vs {:?}", a.err(), b.err()),
            };
            if target == Dtype::F32 {
                fb_f32 += a.fallback;
            }
            let mut pairs = vec![(a.lse[0], b.lse[0])];
            for o in Output::FORWARD {
                assert_eq!(a.values.contains(o), b.values.contains(o), "{o}");
                if let (Some(x), Some(y)) = (a.values.get(o), b.values.get(o)) {
                    pairs.extend(x.iter().copied().zip(y.iter().copied()));
                }
            }
            for (x, y) in pairs {
                same_value(&x, &y, &format!("{target} {c:?}"));
                assert_eq!(x.decided, y.decided, "{target} {c:?}");
                assert!(x.enclosure.lo <= y.enclosure.hi && y.enclosure.lo <= x.enclosure.hi);
            }
        }
        let cot = data.cotangents(&c);
        for target in [Dtype::F32, Dtype::Bf16] {
            let (a, b) = match (fast.vjp(&p, &cot, target), mpfr.vjp(&p, &cot, target)) {
                (Ok(a), Ok(b)) => (a, b),
                (Err(a), Err(b)) => {
                    assert_eq!(a, b);
                    continue;
                }
                (a, b) => panic!("{c:?}: {:?} vs {:?}", a.err(), b.err()),
            };
            for (x, y) in a.iter().zip(b.iter()) {
                same_value(x, y, &format!("{target} {c:?}"));
                assert_eq!(x.decided, y.decided);
            }
        }
        if let (Ok(a), Ok(b)) = (fast.row_stats(&p, 0), mpfr.row_stats(&p, 0)) {
            for (x, y) in [
                (a.s, b.s),
                (a.ln_s, b.ln_s),
                (a.r, b.r),
                (a.ln_s_w, b.ln_s_w),
            ] {
                assert!(x.lo <= y.hi && y.lo <= x.hi, "{c:?}: {x:?} vs {y:?}");
            }
        }
    }
    // Small rows of every kind in f32: most outputs are decided on the f64 tier.
    assert!(fb_f32.outputs > 300, "{fb_f32:?}");
    assert!(fb_f32.output_rate() < 0.2, "{fb_f32:?}");
}

/// On LLM-like f32 rows the tier decides every f32 output and its `s` is a
/// few ulps wide (a sound but loose tier would fall back to MPFR).
#[test]
fn llm_rows_are_decided_on_the_f64_tier() {
    let mut rng = Rng(0xFA57_0005);
    let (n, v) = (16usize, 4096usize);
    let x: Vec<f32> = (0..n * v)
        .map(|_| (2.5 * rng.normal() - 2.0) as f32)
        .collect();
    let x = Array2::from_shape_vec((n, v), x).unwrap();
    let t = Array1::from_iter((0..n).map(|r| (r * 37 % v) as i64));
    let mut p = Problem::new(Logits::F32(x.view()));
    p.tokens = Some(t.view());
    let f = Oracle::default().forward(&p, Dtype::F32).unwrap();
    assert_eq!(f.fallback.rows_mpfr, 0, "{:?}", f.fallback);
    assert_eq!(f.fallback.outputs, 3 * n as u64);
    for r in 0..n {
        let fr = FastRow::new(&p, r, FastOptions::default()).unwrap();
        let s = fr.s();
        assert!(s.hi - s.lo <= 8.0 * f64::EPSILON * s.hi, "{s:?}");
    }
}

/// Softcapped (exact, c = 30) bf16 rows at V = 152064 are decided on the
/// f64 tier (F9): every forward output in bf16 and f32.
#[test]
fn softcapped_real_vocab_rows_are_decided_on_the_f64_tier() {
    let mut rng = Rng(0xFA57_0006);
    let (n, v) = (2usize, 152_064usize);
    let x: Vec<bf16> = (0..n * v)
        .map(|_| bf16::from_f64(3.0 * rng.normal() + if rng.unit() < 1e-4 { 12.0 } else { 0.0 }))
        .collect();
    let x = Array2::from_shape_vec((n, v), x).unwrap();
    let t = Array1::from_iter((0..n).map(|r| (r * 37 % v) as i64));
    let mut p = Problem::new(Logits::Bf16(x.view()));
    p.tokens = Some(t.view());
    p.options.softcap = Some(30.0);
    p.options.entropy = Some(EntropyLogits::Unmasked);
    for r in 0..n {
        let fr = FastRow::new(
            &p,
            r,
            FastOptions {
                entropy: Some(EntropyLogits::Unmasked),
                m2: true,
                ..Default::default()
            },
        )
        .unwrap();
        assert!(fr.applicable(), "row {r} not applicable");
        assert!(
            fr.stats_decided(),
            "row {r}: stats {:?} {:?} {:?}",
            fr.sum(),
            fr.ln_s(),
            fr.m2()
        );
        for target in [Dtype::Bf16, Dtype::F32] {
            let f = fr.forward(target);
            assert!(
                f.decided(),
                "row {r} {target}: {f:?}; lse {:?} lp {:?} H {:?}",
                fr.lse(),
                fr.log_prob(),
                fr.entropy()
            );
        }
    }
    let f = Oracle::default().forward(&p, Dtype::Bf16).unwrap();
    assert_eq!(f.fallback.outputs_mpfr, 0, "{:?}", f.fallback);
}

/// (F10) The loss side on the f64 tier: with `lse`, `z_loss` and
/// cross-entropy (`none`, `sum` and `mean`, weighted, label smoothing 0 and
/// 0.1) cotangents the public oracle's VJP returns the same correctly
/// rounded values on both tiers, the f64 tier's enclosures meet MPFR's,
/// and it decides about as many elements as without the loss side.
#[test]
fn loss_side_vjp_is_on_the_f64_tier() {
    use logprobe_reference::spec::{LossOptions, Reduction};
    let fast = Oracle {
        tier: Tier::FastVjp,
        ..Oracle::default()
    };
    let mpfr = Oracle {
        tier: Tier::Mpfr,
        ..Oracle::default()
    };
    let (mut decided, mut total, mut smoothed) = (0u64, 0u64, (0u64, 0u64));
    let mut base = (0u64, 0u64);
    for (i, c) in cases(0xFA57_0008, 240, &[1, 3, 8, 40, 300])
        .into_iter()
        .enumerate()
    {
        if c.softcap.is_some() && i % 2 == 0 {
            continue;
        }
        let data = c.data();
        let mut p = data.problem(&c);
        let reduction = [Reduction::None, Reduction::Sum, Reduction::Mean][i % 3];
        let eps = if i % 7 == 3 { 0.1 } else { 0.0 };
        p.options.loss = Some(LossOptions {
            reduction,
            label_smoothing: eps,
            ..LossOptions::default()
        });
        p.options.lse = i % 2 == 0;
        p.options.z_loss_coef = (i % 4 < 2).then_some(1e-4);
        let w = Array1::from_elem(1, [1.0, 0.5, 3.0][i % 3]);
        if i % 5 == 1 {
            p.loss_weights = Some(w.view());
        }
        let a = Array1::from_elem(1, [0.7, -1.3, 1e-3][i % 3]);
        let b = Array1::from_elem(1, [2.0, -0.25][i % 2]);
        let l = Array1::from_elem(1, [1.0, -0.5, 3.0e2][i % 3]);
        let mut cot = data
            .cotangents(&c)
            .with_column(Output::Loss, Some(l.view()));
        if p.options.lse {
            cot = cot.with_column(Output::Lse, Some(a.view()));
        }
        if p.options.z_loss_coef.is_some() {
            cot = cot.with_column(Output::ZLoss, Some(b.view()));
        }
        for target in [Dtype::F32, Dtype::Bf16] {
            let (x, y) = match (
                fast.vjp_counted(&p, &cot, target),
                mpfr.vjp(&p, &cot, target),
            ) {
                (Ok(x), Ok(y)) => (x, y),
                (Err(x), Err(y)) => {
                    assert_eq!(x, y);
                    continue;
                }
                (x, y) => panic!("{c:?}: {:?} vs {:?}", x.err(), y.err()),
            };
            let (g, fb) = x;
            for (x, y) in g.iter().zip(y.iter()) {
                same_value(x, y, &format!("{target} {reduction:?} eps {eps} {c:?}"));
                assert!(
                    x.enclosure.lo <= y.enclosure.hi && y.enclosure.lo <= x.enclosure.hi,
                    "{target} {c:?}: {x:?} vs {y:?}"
                );
            }
            let (_, fb0) = fast.vjp_counted(&p, &data.cotangents(&c), target).unwrap();
            if eps == 0.0 || p.loss_cotangent(&cot, 0).is_none() {
                decided += fb.outputs - fb.outputs_mpfr;
                total += fb.outputs;
                base.0 += fb0.outputs - fb0.outputs_mpfr;
                base.1 += fb0.outputs;
            } else {
                smoothed.0 += fb.outputs - fb.outputs_mpfr;
                smoothed.1 += fb0.outputs - fb0.outputs_mpfr;
            }
        }
    }
    eprintln!(
        "loss side: {decided} of {total} decided; without it: {} of {}",
        base.0, base.1
    );
    assert!(total > 2000, "{total}");
    // As many decided as with the log-prob / entropy / top-k cotangents
    // alone, to within 2% (these small rows of every kind leave about a
    // quarter of their elements to MPFR either way).
    assert!(
        decided as f64 >= 0.98 * base.0 as f64,
        "{decided} of {total}, without the loss side {} of {}",
        base.0,
        base.1
    );
    eprintln!(
        "label smoothing: {} decided, without the loss side {}",
        smoothed.0, smoothed.1
    );
    assert!(smoothed.1 > 0);
    assert!(smoothed.0 as f64 >= 0.9 * smoothed.1 as f64, "{smoothed:?}");
}

/// (F10) The soft cross-entropy's cotangent on the f64 tier: with a
/// teacher of mass 1 or 0.6 (zero where the student cannot reach; one in
/// three as log-probabilities), or the
/// student's own softmax (the cancellation `(sum p) q_j - p_j ~ 0`), the
/// public oracle's VJP returns the same correctly rounded values on both
/// tiers, the f64 tier's enclosures meet MPFR's, and away from the
/// cancellation it decides most elements.
#[test]
fn soft_cross_entropy_vjp_is_on_the_f64_tier() {
    let fast = Oracle {
        tier: Tier::FastVjp,
        ..Oracle::default()
    };
    let mpfr = Oracle {
        tier: Tier::Mpfr,
        ..Oracle::default()
    };
    let (mut decided, mut total) = (0u64, 0u64);
    for (i, c) in cases(0xFA57_0047, 160, &[1, 3, 8, 40, 300])
        .into_iter()
        .enumerate()
    {
        let data = c.data();
        let mut p = data.problem(&c);
        let (n, vt) = p.logits.dim();
        let v = p.options.vocab_size.unwrap_or(vt);
        let capped = p.options.softcap.is_some();
        let own = i % 4 == 3;
        let mass = [1.0, 0.6][i % 2];
        let mut tp = ndarray::Array2::<f64>::zeros((n, vt));
        for r in 0..n {
            let live = |j: usize| {
                p.allowed(r, j) && (capped || p.logits.get_f64(r, j) > f64::NEG_INFINITY)
            };
            let y = |j: usize| {
                let x = p.logits.get_f64(r, j).max(-1e300);
                if own {
                    x
                } else {
                    -(((j * 7 + i) % 11) as f64) * 0.4
                }
            };
            let m = (0..v).filter(|&j| live(j)).map(y).fold(f64::MIN, f64::max);
            let w: Vec<f64> = (0..v)
                .map(|j| if live(j) { (y(j) - m).exp() } else { 0.0 })
                .collect();
            let s: f64 = w.iter().sum();
            for j in 0..v {
                tp[[r, j]] = f64::from((w[j] / s * mass) as f32);
            }
        }
        // One teacher in three as its f32 log-probabilities (T27l, T28l).
        if i % 3 == 1 {
            tp.mapv_inplace(|x| f64::from(x.ln() as f32));
            p.options.teacher_form = logprobe_reference::spec::TeacherForm::LogProbs;
        }
        p.teacher_probs = Some(tp.view());
        // The forward on both tiers: the same correctly rounded values.
        for target in [Dtype::F32, Dtype::F64] {
            let fwd = |o: &Oracle| {
                o.forward(&p, target)
                    .map(|f| f.values[Output::SoftCrossEntropy].mapv(|e| e.rounded))
            };
            let (a, b) = (fwd(&fast), fwd(&mpfr));
            match (a, b) {
                (Ok(a), Ok(b)) => {
                    assert_eq!(a.mapv(f64::to_bits), b.mapv(f64::to_bits), "{c:?} {target}")
                }
                (a, b) => assert_eq!(a.err(), b.err(), "{c:?}"),
            }
        }
        let g = Array1::from_elem(n, [1.0, -0.5, 3.0e2][i % 3]);
        let cot = Cotangents::default().with_column(Output::SoftCrossEntropy, Some(g.view()));
        for target in [Dtype::F32, Dtype::Bf16] {
            let (x, y) = match (
                fast.vjp_counted(&p, &cot, target),
                mpfr.vjp(&p, &cot, target),
            ) {
                (Ok(x), Ok(y)) => (x, y),
                (Err(x), Err(y)) => {
                    assert_eq!(x, y);
                    continue;
                }
                (x, y) => panic!("{c:?}: {:?} vs {:?}", x.err(), y.err()),
            };
            let (g, fb) = x;
            for (x, y) in g.iter().zip(y.iter()) {
                same_value(x, y, &format!("{target} own {own} mass {mass} {c:?}"));
                assert!(
                    x.enclosure.lo <= y.enclosure.hi && y.enclosure.lo <= x.enclosure.hi,
                    "{target} {c:?}: {x:?} vs {y:?}"
                );
            }
            if !own {
                decided += fb.outputs - fb.outputs_mpfr;
                total += fb.outputs;
            }
        }
    }
    eprintln!("soft cross-entropy: {decided} of {total} decided on the f64 tier");
    assert!(total > 2000, "{total}");
    assert!(decided as f64 >= 0.5 * total as f64, "{decided} of {total}");
}

/// (F10) The policy terms' cotangents on the f64 tier: `kl_k1`, `kl_k2`,
/// `kl_k3`, `kl_abs` and `ratio` (each with probability 1/2), their inputs
/// from 1e-6 to 30 nats off the log-prob, with and without clamps (some
/// binding): the public oracle's VJP gives the same correctly rounded
/// values on both tiers, the f64 tier's enclosures meet MPFR's, and it
/// decides most elements.
#[test]
fn policy_vjp_is_on_the_f64_tier() {
    use logprobe_reference::spec::{PolicyClamps, PolicyTerm};
    let fast = Oracle {
        tier: Tier::FastVjp,
        ..Oracle::default()
    };
    let mpfr = Oracle {
        tier: Tier::Mpfr,
        ..Oracle::default()
    };
    let (mut decided, mut total, mut base) = (0u64, 0u64, (0u64, 0u64));
    for (i, c) in cases(0xFA57_0018, 200, &[3, 8, 40, 300])
        .into_iter()
        .enumerate()
    {
        let data = c.data();
        let mut p = data.problem(&c);
        if p.tokens.is_none() || !p.has_target(0) {
            continue;
        }
        let exact = mpfr.forward(&p, Dtype::F64);
        let Ok(f) = exact else { continue };
        let lp = f.values[Output::LogProbs][[0, 0]].rounded;
        if !lp.is_finite() {
            continue;
        }
        let off = [1e-6, 0.3, -2.0, 30.0, -0.05][i % 5];
        let refs = Array1::from_elem(1, lp - off);
        let olds = Array1::from_elem(1, lp + off / 2.0);
        p.policy.ref_log_probs = Some(refs.view());
        p.policy.old_log_probs = Some(olds.view());
        p.options.policy_clamps = if i % 3 == 0 {
            PolicyClamps {
                kl_input: Some(20.0),
                kl_output: Some(10.0),
                ratio_log: Some(0.2),
            }
        } else {
            PolicyClamps::default()
        };
        let gs: Vec<Array1<f64>> = (0..5)
            .map(|k| Array1::from_elem(1, [0.7, -1.3, 2.5, 0.0, 1.0][(i + k) % 5]))
            .collect();
        let mut cot = data.cotangents(&c);
        for (k, t) in PolicyTerm::ALL.into_iter().enumerate() {
            if (i >> k) & 1 == 1 || k == i % 5 {
                cot = cot.with_column(t.output(), Some(gs[k].view()));
            }
        }
        for target in [Dtype::F32, Dtype::Bf16] {
            let (x, y) = match (
                fast.vjp_counted(&p, &cot, target),
                mpfr.vjp(&p, &cot, target),
            ) {
                (Ok(x), Ok(y)) => (x, y),
                (Err(x), Err(y)) => {
                    assert_eq!(x, y);
                    continue;
                }
                (x, y) => panic!("{c:?}: {:?} vs {:?}", x.err(), y.err()),
            };
            let (g, fb) = x;
            for (x, y) in g.iter().zip(y.iter()) {
                same_value(x, y, &format!("{target} policy off {off} {c:?}"));
                assert!(
                    x.enclosure.lo <= y.enclosure.hi && y.enclosure.lo <= x.enclosure.hi,
                    "{target} {c:?}: {x:?} vs {y:?}"
                );
            }
            decided += fb.outputs - fb.outputs_mpfr;
            total += fb.outputs;
            let (_, fb0) = fast.vjp_counted(&p, &data.cotangents(&c), target).unwrap();
            base.0 += fb0.outputs - fb0.outputs_mpfr;
            base.1 += fb0.outputs;
        }
    }
    eprintln!(
        "policy terms: {decided} of {total} decided on the f64 tier; without them {} of {}",
        base.0, base.1
    );
    assert!(total > 2000, "{total}");
    // About as many as with the log-prob / entropy / top-k cotangents alone
    // (these small rows leave many elements to MPFR either way).
    assert!(
        decided as f64 >= 0.9 * base.0 as f64,
        "{decided} vs {}",
        base.0
    );
}
