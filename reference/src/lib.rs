//! `logprobe-reference`: the problem definition ([`spec`]) and the exact
//! oracle ([`oracle`], behind the default `oracle` feature) for per-token
//! log-probs, entropy, top-k log-probs and their gradients over logits `[N, V]`;
//! [`splitmix`], the workspace's deterministic stream for test data; and
//! [`simd`], the four-lane f64 primitives of the oracle's f64 tier and of
//! verify's bounds.
#![warn(missing_docs)]

pub mod simd;
pub mod spec;
pub mod splitmix;

#[cfg(feature = "oracle")]
mod interval;
#[cfg(feature = "oracle")]
pub mod oracle;
