//! [`Capabilities`]: what a kernel computes (an [`OutputSet`]) and which
//! input features and call forms it accepts (a [`FeatureSet`]).

use logprobe_reference::spec::{Family, KlDirection, Output, OutputSet, PolicyTerm, Problem};

use crate::kernel::KernelError;

/// What a kernel can compute; anything else it refuses with
/// [`KernelError::Unsupported`](crate::kernel::KernelError::Unsupported).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Capabilities {
    /// The outputs it computes: `grad_logits` is the backward (VJP) into a
    /// new buffer; `lse` and `z_loss` with their options
    /// ([`Options::lse`](logprobe_reference::spec::Options::lse),
    /// [`Options::z_loss_coef`](logprobe_reference::spec::Options::z_loss_coef));
    /// `loss` ([`Kernel::cross_entropy`](crate::kernel::Kernel::cross_entropy)):
    /// every reduction, label smoothing, `loss_weights`, `mean_all_ignored`;
    /// the policy terms with `ref_log_probs`, `old_log_probs`, their clamps
    /// and cotangents; the top-k KL with
    /// [`Options::topk_kl`](logprobe_reference::spec::Options::topk_kl).
    /// `log_probs` is always computed.
    pub outputs: OutputSet,
    /// The input features and call forms it accepts beyond the plain ones.
    pub features: FeatureSet,
}

impl Capabilities {
    /// Everything: every output, every feature.
    pub const ALL: Capabilities = Capabilities {
        outputs: OutputSet::ALL,
        features: FeatureSet::ALL,
    };

    /// Whether the kernel computes `output`.
    pub const fn computes(&self, output: Output) -> bool {
        self.outputs.contains(output)
    }

    /// Whether the kernel computes every output of `family`'s kind (all
    /// policy terms, both top-k KLs, ...; [`OutputSet::family`]).
    pub const fn computes_family(&self, family: Family) -> bool {
        self.outputs.contains_all(OutputSet::family(family))
    }

    /// Whether the kernel computes every policy term.
    pub const fn computes_policy(&self) -> bool {
        self.computes_family(Family::Policy(PolicyTerm::K1))
    }

    /// Whether the kernel computes both top-k KLs.
    pub const fn computes_topk_kl(&self) -> bool {
        self.computes_family(Family::TopkKl(KlDirection::Forward))
    }

    /// `Ok` when the kernel computes every output `problem` requests
    /// ([`Output::requested`]); else [`KernelError::Unsupported`] naming the
    /// first it lacks. Kernels call it after their own, more specific
    /// refusals, so an output added to the table is refused by every kernel
    /// that does not list it, with no code of its own.
    ///
    /// # Errors
    /// [`KernelError::Unsupported`] with the output's name.
    pub fn check_requested(&self, problem: &Problem<'_>, kernel: &str) -> Result<(), KernelError> {
        match Output::FORWARD
            .into_iter()
            .find(|&o| o.requested(problem) && !self.computes(o))
        {
            Some(o) => Err(KernelError::Unsupported {
                kernel: kernel.to_string(),
                what: o.name(),
            }),
            None => Ok(()),
        }
    }

    /// Whether the kernel accepts `feature`.
    pub const fn supports(&self, feature: Feature) -> bool {
        self.features.contains(feature)
    }
}

/// An input feature or call form a kernel may accept (beyond the outputs).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Feature {
    /// Entropy over masked logits (`EntropyLogits::Masked`).
    MaskedEntropy,
    /// Backward in place over the logits.
    InPlaceBackward,
    /// Sampling masks.
    SamplingMask,
    /// Temperatures other than 1 and `TemperatureDtype::Input`.
    Temperature,
    /// `vocab_size` smaller than the column count (padded vocabulary).
    PaddedVocab,
    /// f64 logits (f32, bf16 and f16 are always accepted).
    F64Input,
    /// The softcap ([`Options::softcap`](logprobe_reference::spec::Options::softcap),
    /// both `softcap_dtype`s).
    Softcap,
}

impl Feature {
    /// Every feature.
    pub const ALL: [Feature; 7] = [
        Feature::MaskedEntropy,
        Feature::InPlaceBackward,
        Feature::SamplingMask,
        Feature::Temperature,
        Feature::PaddedVocab,
        Feature::F64Input,
        Feature::Softcap,
    ];
}

/// A set of [`Feature`]s (a bitset, built in `const`).
#[derive(Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct FeatureSet(u8);

impl FeatureSet {
    /// No feature.
    pub const EMPTY: FeatureSet = FeatureSet(0);

    /// Every feature.
    pub const ALL: FeatureSet = FeatureSet::of(&Feature::ALL);

    /// The features in `features`.
    pub const fn of(features: &[Feature]) -> FeatureSet {
        let mut set = FeatureSet::EMPTY;
        let mut i = 0;
        while i < features.len() {
            set = set.with(features[i]);
            i += 1;
        }
        set
    }

    /// This set with `feature`.
    pub const fn with(self, feature: Feature) -> FeatureSet {
        FeatureSet(self.0 | 1 << feature as u8)
    }

    /// Whether `feature` is in the set.
    pub const fn contains(self, feature: Feature) -> bool {
        self.0 & 1 << feature as u8 != 0
    }

    /// The features in the set, in [`Feature::ALL`] order.
    pub fn iter(self) -> impl Iterator<Item = Feature> {
        Feature::ALL.into_iter().filter(move |&f| self.contains(f))
    }
}

impl std::fmt::Debug for FeatureSet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_set().entries(self.iter()).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sets_hold_what_they_are_built_from() {
        let f = FeatureSet::of(&[Feature::Softcap, Feature::PaddedVocab]);
        assert!(f.contains(Feature::Softcap) && f.contains(Feature::PaddedVocab));
        assert!(!f.contains(Feature::F64Input));
        assert_eq!(f.iter().count(), 2);
        assert!(Feature::ALL.iter().all(|&x| FeatureSet::ALL.contains(x)));
        let c = Capabilities {
            outputs: OutputSet::of(&[Output::LogProbs, Output::KlK1]),
            features: f,
        };
        assert!(c.computes(Output::KlK1) && !c.computes_policy());
        assert!(Capabilities::ALL.computes_policy() && Capabilities::ALL.computes_topk_kl());
        assert!(c.supports(Feature::Softcap) && !c.supports(Feature::Temperature));
    }
}
