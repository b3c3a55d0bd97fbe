"""The verifier's KV cache across rounds: tree scoring and compaction to the accepted path."""

from __future__ import annotations

import torch
from torch import nn
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer, DynamicSlidingWindowLayer

from .attention import check_custom_mask_support, to_model_mask
from .tree import DraftTree, tree_attention_allowed

__all__ = ["TreeVerifier", "decoding_mode"]


def decoding_mode(compile: bool):
    """The autograd mode a decode runs in. Eager: ``torch.inference_mode``, which skips the version
    counters and view tracking ``no_grad`` keeps; a SmolLM2 forward of 4 new tokens took 49.8 ms
    against 53.5 under ``no_grad`` (one thread, AMD EPYC Zen 4), about 1,500 small ops a forward.
    Compiled: ``no_grad``, the mode its graphs were traced and warmed in (a mode change is a guard
    failure: the graphs would compile again). State kept across calls (packed weights, a draft
    vocabulary's head rows) is made outside inference mode, so either mode can use it."""
    return torch.no_grad() if compile else torch.inference_mode()


class TreeVerifier:
    """One sequence's verifier state.

    Invariant between rounds: the cache holds every committed token but the last one, the *pending*
    token, which becomes the root of the next draft tree. So one forward per round both processes
    the newly committed token and scores all drafts, and plain decoding is the root-only tree.

    This class runs the model eagerly over a ``DynamicCache``;
    :class:`~specdiff_lightning.decoding.compiled.StaticTreeVerifier` holds the same state in a
    static cache for a compiled forward.

    Args:
        model: a stock HF causal LM (SDPA or eager attention).
        input_ids: ``LongTensor[1, L]`` the prompt, ``L >= 1``.
        feature_layers: indices into the model's ``hidden_states`` to keep for a drafter that reads
            the verifier's features; after the prefill and after each :meth:`commit`,
            :attr:`new_features` holds them (concatenated, ``[n, F]``) for the n tokens just committed
            to the cache. The forwards compute them anyway; only the selected layers are kept.
    """

    def __init__(
        self, model: nn.Module, input_ids: torch.Tensor, feature_layers: tuple[int, ...] | None = None
    ) -> None:
        check_custom_mask_support(model, "verifier")
        self.model = model
        self.dtype = next(model.parameters()).dtype
        self.forward_calls = 0
        self.feature_layers = None if feature_layers is None else tuple(int(i) for i in feature_layers)
        if self.feature_layers is not None:
            depth = int(getattr(model.config, "num_hidden_layers", 0))
            if not all(0 <= i <= depth for i in self.feature_layers):
                raise ValueError(
                    f"the drafter reads the verifier's hidden states {self.feature_layers}, but this verifier "
                    f"has {depth} layers (hidden states 0..{depth}); was the drafter trained for another verifier?"
                )
        self.cache = self._new_cache(int(input_ids.shape[1]))
        self._tree_features: torch.Tensor | None = None
        self.new_features: torch.Tensor | None = None
        self.pending = int(input_ids[0, -1])
        if input_ids.shape[1] > 1:
            out = self._prefill(input_ids[:, :-1])
            self.forward_calls += 1
            self.new_features = self._features(out)

    def _new_cache(self, prompt_length: int):
        cache = DynamicCache(config=self.model.config)
        for layer in cache.layers:
            # Exactly DynamicLayer: compaction (commit) is proven for its keys/values only. Subclasses
            # (sliding-window, hybrid linear/full attention, indexed layers) carry more state that
            # would keep rejected tree nodes, so they are refused even though isinstance() passes.
            if type(layer) is not DynamicLayer:
                hint = (
                    " (disable sliding-window attention, e.g. config.use_sliding_window=False)"
                    if isinstance(layer, DynamicSlidingWindowLayer)
                    else ""
                )
                raise ValueError(
                    f"the verifier's cache uses {type(layer).__name__} layers; tree verification compacts "
                    f"plain full-attention DynamicLayer caches only{hint}"
                )
        return cache

    def _prefill(self, ids: torch.Tensor):
        """The prompt but its last token into the cache; the model's output (features, if asked)."""
        return self.model(
            input_ids=ids, cache=self.cache, use_cache=True, logits_to_keep=1, **self._feature_kwargs()
        )

    def _feature_kwargs(self) -> dict:
        return {} if self.feature_layers is None else {"output_hidden_states": list(self.feature_layers)}

    def _features(self, out) -> torch.Tensor | None:
        """``[n, F]``: the selected hidden states of the forward's n positions, concatenated."""
        if self.feature_layers is None:
            return None
        states = out.hidden_states
        return torch.cat([states[i][0] for i in self.feature_layers], dim=-1)

    @property
    def past_length(self) -> int:
        return self.cache.get_seq_length()

    def score(self, tree: DraftTree) -> torch.Tensor:
        """Run the tree through the verifier; ``FloatTensor[n, V]`` logits, row i = next-token
        logits after the path to node i. The tree's keys/values are appended to the cache."""
        past = self.past_length
        allowed = tree_attention_allowed(tree, past)
        out = self.model(
            input_ids=tree.tokens[None],
            attention_mask=to_model_mask(allowed, self.model, self.dtype),
            position_ids=(past + tree.depth)[None],
            cache=self.cache,
            use_cache=True,
            **self._feature_kwargs(),
        )
        return self._scored(out, tree)

    def _scored(self, out, tree: DraftTree) -> torch.Tensor:
        self.forward_calls += 1
        self._tree_features = self._features(out)
        # A verifier split across devices (device_map) returns logits on its last device.
        return out.logits[0].to(tree.tokens.device)

    def commit(self, tree: DraftTree, kept_nodes: torch.Tensor, next_token: int) -> None:
        """Keep only ``kept_nodes`` (root first, then the accepted path, increasing) of the tree just
        scored, and make ``next_token`` the new pending token."""
        start = self.past_length - tree.size
        kept = kept_nodes.shape[0]
        contiguous = int(kept_nodes[-1]) == kept - 1
        for layer in self.cache.layers:
            if not contiguous:
                # Gather the accepted path right after the prefix; the RHS is a copy, so overlap is safe.
                index = (start + kept_nodes).to(layer.keys.device)
                layer.keys[..., start : start + kept, :] = layer.keys[..., index, :]
                layer.values[..., start : start + kept, :] = layer.values[..., index, :]
            layer.keys = layer.keys[..., : start + kept, :]
            layer.values = layer.values[..., : start + kept, :]
        self._committed(tree, kept_nodes, next_token)

    def _committed(self, tree: DraftTree, kept_nodes: torch.Tensor, next_token: int) -> None:
        if self._tree_features is not None:
            self.new_features = self._tree_features[kept_nodes.to(self._tree_features.device)]
        self.pending = int(next_token)

    def discard(self, tree: DraftTree) -> None:
        """Drop the tree just scored, root included: the cache is as before :meth:`score` (for
        timing forwards, :mod:`~specdiff_lightning.decoding.calibration`)."""
        self.cache.crop(-tree.size)
        self._tree_features = None
