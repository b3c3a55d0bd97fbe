"""Model adapters: diffusion and autoregressive drafters, tiny configs of the real classes."""

from .autoregressive import AutoregressiveDrafter
from .diffusion import DRAFTER_FAMILIES, DiffusionDrafter, DrafterFamily
from .tiny import tiny_llama, tiny_model, tiny_qwen2

__all__ = [
    "DRAFTER_FAMILIES",
    "AutoregressiveDrafter",
    "DiffusionDrafter",
    "DrafterFamily",
    "tiny_llama",
    "tiny_model",
    "tiny_qwen2",
]
