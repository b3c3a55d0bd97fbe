"""Training: drafter objectives (pure functions) and the Lightning glue."""

from .losses import (
    IGNORE_INDEX,
    LOSSES,
    ar_distillation_loss,
    expected_streak_loss,
    forward_kl_loss,
    masked_ce_loss,
    mdm_corrupt,
    mdm_loss,
    streak_loss,
    tv_loss,
    uses_verifier_logprobs,
)
from .module import DrafterDistillation
from .pretraining import CausalLMPretraining, MaskedDiffusionPretraining

__all__ = [
    "CausalLMPretraining",
    "MaskedDiffusionPretraining",
    "DrafterDistillation",
    "IGNORE_INDEX",
    "LOSSES",
    "ar_distillation_loss",
    "expected_streak_loss",
    "forward_kl_loss",
    "masked_ce_loss",
    "mdm_corrupt",
    "mdm_loss",
    "streak_loss",
    "tv_loss",
    "uses_verifier_logprobs",
]
