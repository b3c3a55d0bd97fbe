"""A store of the verifier's hidden states, one file per training sequence.

Training a drafter that reads the verifier's hidden states (the DFlash family)
spends most of a step in the frozen verifier's forward over the sequence (~5 of 6.7 s a step for
SmolLM2 on 2 CPU cores). The first read of a sequence writes what the drafter needs (the hidden
states at its feature layers and the verifier's greedy next tokens) to the store; every later epoch
and every later run over the same corpus, in this session or another, reads them back: the data
module's loader attaches them to the batch (``batch["features"]``), and the verifier is not run.

Layout: ``<root>/store.json`` (which verifier, which layers, the dtype, ...) and one
``<sha1 of the token ids>.safetensors`` per sequence (``features[L, F]`` in bfloat16, ``greedy[L]``),
each written atomically, so an interrupted run leaves whole files only. A store written for other
layers or another verifier is refused by name, never read as if it fitted.

It sits beside ``paths`` below the layers: the training modules write it and the data modules read
it, and neither imports the other.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import torch

from .paths import atomic_write

__all__ = ["FeatureStore", "FeatureStoreError", "STORE_FILE", "sequence_key"]

#: the store's description, next to its files
STORE_FILE = "store.json"
#: features are kept in bfloat16 (half float32's bytes; the in-memory cache keeps the same)
STORE_DTYPE = torch.bfloat16


class FeatureStoreError(ValueError):
    """A store that does not fit the run (another verifier or layers) or cannot be read."""


def sequence_key(ids: list[int] | torch.Tensor) -> str:
    """The file name of a sequence's features: the SHA-1 of its token ids (as 32-bit integers)."""
    ids = torch.as_tensor(ids, dtype=torch.int32).cpu()
    return hashlib.sha1(ids.numpy().tobytes()).hexdigest()


class FeatureStore:
    """The features of one verifier read one way, under ``root``.

    Args:
        root: the store's directory (created when writing).
        identity: what the stored tensors depend on: the verifier (its spec, a fingerprint of its
            weights and the dtype it was read in), the feature layers, where the greedy tokens come
            from. A store written under another identity is refused, naming the keys that differ.
            None: only reading (the data module, which leaves that check to the training module
            that writes).
    """

    def __init__(self, root: str | os.PathLike, identity: dict | None = None) -> None:
        self.root = Path(root)
        self.identity = identity
        described = self._description()
        if described is not None and identity is not None:
            differ = [k for k in identity if described.get(k) != identity[k]]
            if differ:
                have = ", ".join(f"{k}={described.get(k)!r}" for k in differ)
                want = ", ".join(f"{k}={identity[k]!r}" for k in differ)
                # the same weights read in another dtype also change the fingerprint
                written_dtype = described.get("verifier_dtype")
                hint = (
                    f"; or read the verifier as the store was written: --model.init_args.verifier_dtype "
                    f"{written_dtype}"
                    if written_dtype
                    and "verifier_dtype" in differ
                    and set(differ) <= {"verifier_dtype", "fingerprint"}
                    else ""
                )
                raise FeatureStoreError(
                    f"the feature store {os.fspath(self.root)} holds {have}, and this run reads {want}; "
                    f"give this run another feature_store directory (or delete that one){hint}"
                )

    def _description(self) -> dict | None:
        path = self.root / STORE_FILE
        if not path.is_file():
            return None
        try:
            return json.loads(path.read_text())
        except (OSError, json.JSONDecodeError) as err:
            raise FeatureStoreError(
                f"{path} is unreadable ({err}); delete the feature store {os.fspath(self.root)} to rebuild it"
            ) from err

    def get(self, ids: list[int] | torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
        """``(features[L, F], greedy[L])`` of the sequence ``ids``, or None when not stored."""
        from safetensors import SafetensorError
        from safetensors.torch import load_file

        path = self.root / f"{sequence_key(ids)}.safetensors"
        if not path.is_file():
            return None
        try:
            tensors = load_file(path)
        except (OSError, SafetensorError):  # a damaged file: the verifier reads it again
            path.unlink(missing_ok=True)
            return None
        return tensors["features"], tensors["greedy"]

    def put(self, ids: list[int] | torch.Tensor, features: torch.Tensor, greedy: torch.Tensor) -> None:
        """Store a sequence's ``features[L, F]`` and ``greedy[L]`` (atomically: a temporary file
        renamed into place)."""
        from safetensors.torch import save_file

        if self.identity is None:
            raise FeatureStoreError("a FeatureStore opened without an identity only reads")
        self.root.mkdir(parents=True, exist_ok=True)
        if not (self.root / STORE_FILE).is_file():
            description = {**self.identity, "dtype": "bfloat16"}
            atomic_write(
                self.root / STORE_FILE, lambda tmp: Path(tmp).write_text(json.dumps(description, indent=2))
            )
        tensors = {
            "features": features.detach().to("cpu", STORE_DTYPE).contiguous(),
            "greedy": greedy.detach().to("cpu", torch.long).contiguous(),
        }
        atomic_write(self.root / f"{sequence_key(ids)}.safetensors", lambda tmp: save_file(tensors, tmp))

    def __len__(self) -> int:
        return sum(1 for _ in self.root.glob("*.safetensors")) if self.root.is_dir() else 0
