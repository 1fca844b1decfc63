//! SplitMix64 (G. Steele, D. Lea, C. Flood, "Fast splittable pseudorandom
//! number generators", OOPSLA 2014): the workspace's one small
//! deterministic stream for test rows, examples, benchmarks and the test
//! kit's recipes (their sampler and expansion), so they need
//! no `rand` dependency. Not cryptographic; neither the oracle nor the
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
//! assert!((2.0..3.0).contains(&rng.uniform_in(2.0, 3.0)));
//! assert!(rng.chance(1.0) && !rng.chance(0.0));
//! let (mut a, mut b) = (SplitMix64::for_stream(7, 1), SplitMix64::for_stream(7, 2));
//! assert_ne!(a.next_u64(), b.next_u64());
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

    /// Stream number `stream` of `seed`: the state is the first output of
    /// the stream seeded `seed` xor the first output of the stream seeded
    /// `stream`, so streams of one seed start at unrelated states (two
    /// plain seeds `s` and `s + GAMMA` would give the same stream shifted by
    /// one draw).
    pub fn for_stream(seed: u64, stream: u64) -> Self {
        let a = SplitMix64::new(seed).next_u64();
        let b = SplitMix64::new(stream ^ 0x5851_F42D_4C95_7F2D).next_u64();
        SplitMix64::new(a ^ b)
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

    /// Uniform in `[lo, hi)` (`lo + (hi - lo) u`; `lo` when `hi <= lo`).
    pub fn uniform_in(&mut self, lo: f64, hi: f64) -> f64 {
        let u = self.uniform();
        if hi > lo {
            lo + (hi - lo) * u
        } else {
            lo
        }
    }

    /// `true` with probability `p` (`p <= 0`: never, `p >= 1`: always;
    /// one draw either way).
    pub fn chance(&mut self, p: f64) -> bool {
        self.uniform() < p
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
