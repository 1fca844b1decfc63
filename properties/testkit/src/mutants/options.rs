//! Bugs in the options a kernel honours: padded vocabulary, temperature
//! dropped or applied twice, entropy over the other logits. Each runs
//! [`CpuKernel::fused`](logprobe_kernels::CpuKernel::fused) with the options the bug gets wrong ([`PlantedBug::wrong_options`]),
//! after validating the real ones; the trait's defaults do the rest.

use logprobe_kernels::kernel::Kernel;
use logprobe_reference::spec::{EntropyLogits, Options, Problem, TemperatureDtype};

use super::PlantedBug;

unit_bug!(
    /// Padded vocabulary columns not truncated (`vocab_size` dropped).
    PaddedVocabNotTruncated,
    "padded-vocab-not-truncated"
);
unit_bug!(
    /// Temperature ignored (`T = 1`).
    TemperatureIgnored,
    "temperature-ignored"
);
unit_bug!(
    /// Temperature applied twice (`T^2`).
    TemperatureTwice,
    "temperature-twice"
);
unit_bug!(
    /// Entropy over the wrong logits (masked vs unmasked swapped) when a
    /// sampling mask is given.
    EntropyWrongLogits,
    "entropy-wrong-logits"
);

impl PlantedBug for PaddedVocabNotTruncated {
    fn inner(&self) -> &dyn Kernel {
        &super::FUSED
    }

    fn wrong_options(&self, p: &Problem<'_>) -> Option<Options> {
        Some(Options {
            vocab_size: None,
            ..p.options
        })
    }
}

impl PlantedBug for TemperatureIgnored {
    fn inner(&self) -> &dyn Kernel {
        &super::FUSED
    }

    fn wrong_options(&self, p: &Problem<'_>) -> Option<Options> {
        Some(Options {
            temperature: 1.0,
            temperature_dtype: TemperatureDtype::Accumulation,
            ..p.options
        })
    }
}

impl PlantedBug for TemperatureTwice {
    fn inner(&self) -> &dyn Kernel {
        &super::FUSED
    }

    fn wrong_options(&self, p: &Problem<'_>) -> Option<Options> {
        let t = p.options.temperature;
        Some(Options {
            temperature: t * t,
            ..p.options
        })
    }
}

impl PlantedBug for EntropyWrongLogits {
    fn inner(&self) -> &dyn Kernel {
        &super::FUSED
    }

    /// The swapped entropy set under a mask; without one the options are
    /// kept (still run through the same path).
    fn wrong_options(&self, p: &Problem<'_>) -> Option<Options> {
        let mut o = p.options;
        if p.sampling_mask.is_some() {
            o.entropy = o.entropy.map(|e| match e {
                EntropyLogits::Masked => EntropyLogits::Unmasked,
                EntropyLogits::Unmasked => EntropyLogits::Masked,
            });
        }
        Some(o)
    }
}
