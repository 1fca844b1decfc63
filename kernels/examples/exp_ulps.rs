//! Exhaustive error of `exp_f32` over every f32 in `[-104, 0]` (and of
//! `ln_1p_f32` over `[0, 2^20]`) against f64 libm, in ulps of f32 at the
//! exact value. Run: `cargo run --release -p logprobe-kernels --example exp_ulps`.

use logprobe_kernels::exp::{exp_f32, ln_1p_f32};
use logprobe_reference::spec::Dtype;

fn main() {
    let lo = (-104.0f32).to_bits();
    let start = (-0.0f32).to_bits();
    let mut worst = (0.0f64, 0.0f32);
    let mut xs = [0f32; 4096];
    let mut ys = [0f32; 4096];
    let mut b = start;
    let mut count = 0u64;
    while b <= lo {
        let n = ((lo - b + 1) as usize).min(xs.len());
        for (i, x) in xs[..n].iter_mut().enumerate() {
            *x = f32::from_bits(b + i as u32);
        }
        // The vectorised loop, as the kernels run it.
        for (y, &x) in ys[..n].iter_mut().zip(&xs[..n]) {
            *y = exp_f32(x);
        }
        for i in 0..n {
            let exact = (xs[i] as f64).exp();
            let err = (ys[i] as f64 - exact).abs() / Dtype::F32.ulp(exact);
            if err > worst.0 {
                worst = (err, xs[i]);
            }
        }
        count += n as u64;
        b += n as u32;
    }
    println!(
        "exp_f32: {count} inputs in [-104, 0], max error {:.6} ulps at x = {:e}",
        worst.0, worst.1
    );

    let mut worst = (0.0f64, 0.0f32);
    let top = (1u32 << 20) as f32;
    let mut b = 0u32;
    let mut count = 0u64;
    loop {
        let s = f32::from_bits(b);
        if s > top {
            break;
        }
        let exact = (s as f64).ln_1p();
        let err = (ln_1p_f32(s) as f64 - exact).abs() / Dtype::F32.ulp(exact);
        if err > worst.0 {
            worst = (err, s);
        }
        count += 1;
        b += 1;
    }
    println!(
        "ln_1p_f32: {count} inputs in [0, 2^20], max error {:.6} ulps at s = {:e}",
        worst.0, worst.1
    );
}
