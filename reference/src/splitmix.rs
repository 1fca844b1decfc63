//! SplitMix64 (G. Steele, D. Lea, C. Flood, "Fast splittable pseudorandom
//! number generators", OOPSLA 2014): the workspace's one small
//! deterministic stream for test rows, examples and benchmarks, so they
//! need no `rand` dependency. Not cryptographic; neither the oracle nor the
//! kernels draw from it.
//!
//! # Example
//! ```
//! use logprobe_reference::splitmix::SplitMix64;
//! let mut rng = SplitMix64::new(7);
//! let x: Vec<f64> = (0..4).map(|_| rng.normal()).collect();
//! assert_eq!(x, {
//!     let mut again = SplitMix64::new(7);
//!     (0..4).map(|_| again.normal()).collect::<Vec<_>>()
//! });
//! assert!((0.0..1.0).contains(&rng.uniform()));
//! ```

/// A SplitMix64 stream: 64-bit state advanced by the golden-ratio gamma,
/// each output the state mixed by two xor-shift-multiply rounds.
#[derive(Clone, Debug)]
pub struct SplitMix64 {
    state: u64,
}

impl SplitMix64 {
    /// The state increment `floor(2^64 / phi)`, odd.
    pub const GAMMA: u64 = 0x9E37_79B9_7F4A_7C15;

    /// A stream starting from `seed` (any value).
    pub fn new(seed: u64) -> Self {
        SplitMix64 { state: seed }
    }

    /// The next 64 uniformly distributed bits.
    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(Self::GAMMA);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `[0, 1)`: the top 53 bits as a multiple of `2^-53`.
    pub fn uniform(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// An index in `[0, n)` (`n >= 1`; the modulo bias is below `n / 2^64`).
    /// `n = 0` gives 0.
    pub fn below(&mut self, n: usize) -> usize {
        if n == 0 {
            0
        } else {
            (self.next_u64() % n as u64) as usize
        }
    }

    /// A standard normal draw (Box-Muller, first of the pair):
    /// `sqrt(-2 ln a) cos(2 pi b)` with `a, b` uniform (`a` kept `>= 1e-300`
    /// so the logarithm is finite).
    pub fn normal(&mut self) -> f64 {
        let (a, b) = (self.uniform().max(1e-300), self.uniform());
        (-2.0 * a.ln()).sqrt() * (std::f64::consts::TAU * b).cos()
    }
}
