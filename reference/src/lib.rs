//! `logprobe-reference`: the problem definition ([`spec`]) and the exact
//! oracle ([`oracle`], behind the default `oracle` feature) for per-token
//! log-probs, entropy, top-k log-probs and their gradients over logits `[N, V]`.
#![warn(missing_docs)]

pub mod spec;

#[cfg(feature = "oracle")]
pub mod oracle;
