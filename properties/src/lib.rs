//! `logprobe-cli`: the `logprobe` binary (`verify` and `compare` from
//! `logprobe-verify`, `fuzz` from `logprobe-fuzz`, `bench` here), the golden-fixture generator
//! (`examples/gen_fixtures.rs`) and the `cargo test` gate (`tests/`, built
//! on `logprobe-testkit`).
#![warn(missing_docs)]

pub mod bench;
pub mod cli;
pub mod fuzz_cli;

/// The README's code, compiled and run as a doctest so it cannot rot.
#[doc = include_str!("../../README.md")]
#[cfg(doctest)]
pub struct ReadmeDoctests;
