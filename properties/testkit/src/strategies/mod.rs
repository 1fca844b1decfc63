//! Generators: small *recipes* expanded deterministically into
//! problems (logits `[N, V_total]`, tokens `[N]`, sampling masks, top-k ids,
//! options), cotangents, chunk sizes and vocabulary-shard layouts.
//!
//! A recipe holds a seed and a handful of knobs (row distribution, `V`,
//! offset, mask rate, dtype, temperature, `ignore_index` rate); shrinking
//! steps through recipes, never a 152064-wide vector, so a failing
//! real-vocabulary row shrinks in seconds. Every logit is generated in f64
//! and rounded once with
//! [`Dtype::round_f64`](logprobe_reference::spec::Dtype::round_f64), so it
//! is exactly representable in the dtype under test (docs/design.md, "The
//! properties", generators).
//!
//! Sizes: `N` from 0, `V` from 1; small `V` at high case counts, the real
//! vocabulary sizes [`REAL_VOCAB_SIZES`] at low ones (with `N <= 2`, since the
//! oracle costs about 1 us per vocabulary entry).
//!
//! Every draw of a recipe, its expansion and its shrink steps is plain Rust
//! over the workspace's one RNG ([`logprobe_reference::splitmix::SplitMix64`]);
//! proptest's RNG only seeds a recipe's draw (`space`).
//!
//! Files: `recipe` (the problem recipe and its expansion), `rows` (row
//! values), `data` (owned data, cotangent recipe), `sampler` (the recipe
//! spaces: sampler and shrink steps), `space` (the proptest strategies, a
//! thin wrapper), `layouts` (chunk sizes, shard layouts), `loss` (the
//! cross-entropy loss recipe and its space), `bad_input`.

mod bad_input;
mod data;
mod layouts;
mod loss;
mod policy;
mod recipe;
mod rows;
mod sampler;
mod space;
mod teacher;
#[cfg(test)]
mod tests;

pub use bad_input::*;
pub use data::*;
pub use layouts::*;
pub use loss::*;
pub use recipe::*;
pub use rows::*;
pub use sampler::*;
pub use space::*;
pub use teacher::*;
