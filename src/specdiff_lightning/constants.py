"""Constants shared across layers (imports nothing)."""

__all__ = ["IGNORE_INDEX"]

#: target id of a position that carries no token (a window that ended early, padding); the
#: ``ignore_index`` of ``torch.nn.functional.cross_entropy``
IGNORE_INDEX = -100
