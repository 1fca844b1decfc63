//! `logprobe-testkit`: what the property gate is built from. Generators of
//! problems ([`strategies`]), the property checks ([`checks`]) and the
//! suite of properties over the kernel lists ([`suite`]), planted mutants
//! ([`mutants`]), allocation accounting ([`memory`]) and the oracle cache
//! ([`cache`]). Judges with the tolerance model of `logprobe-verify`.
#![warn(missing_docs)]

pub mod cache;
pub mod checks;
pub mod linear;
pub mod memory;
pub mod mutants;
pub mod registry;
pub mod strategies;
pub mod suite;
