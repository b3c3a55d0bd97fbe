"""Model adapters: diffusion, autoregressive and DFlash drafters, their loader, tiny configs of the
real classes."""

from .autoregressive import AutoregressiveDrafter
from .dflash import DFlashDrafter
from .diffusion import DRAFTER_FAMILIES, DiffusionDrafter, DrafterFamily
from .loading import DRAFTER_KINDS, NAMED_VERIFIERS, load_drafter, load_tokenizer, load_verifier
from .tiny import tiny_llama, tiny_model, tiny_qwen2

__all__ = [
    "DRAFTER_FAMILIES",
    "DRAFTER_KINDS",
    "NAMED_VERIFIERS",
    "AutoregressiveDrafter",
    "DFlashDrafter",
    "DiffusionDrafter",
    "DrafterFamily",
    "load_drafter",
    "load_tokenizer",
    "load_verifier",
    "tiny_llama",
    "tiny_model",
    "tiny_qwen2",
]
