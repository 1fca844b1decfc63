//! `logprobe-reference`: the problem definition ([`spec`]) and the exact
//! oracle ([`oracle`], behind the default `oracle` feature) for per-token
//! log-probs, entropy, top-k log-probs and their gradients over logits `[N, V]`;
//! and [`splitmix`], the workspace's deterministic stream for test data.
#![warn(missing_docs)]

pub mod spec;
pub mod splitmix;

#[cfg(feature = "oracle")]
pub mod oracle;
