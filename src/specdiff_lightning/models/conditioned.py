"""A block-diffusion drafter conditioned on the verifier's own hidden states.

The sliced drafter (``models/slicing.py``) sees only tokens: two layers must rebuild what thirty
computed, and on SmolLM2 a round emitted ~1.25 tokens (positional acceptance 0.21 / 0.18 / 0.10),
too few to pay for itself. The verifier has already read every committed token, and its hidden
states say what it will write next; this drafter reads them instead of the tokens (as block-diffusion
drafters conditioned on target features do, e.g. DFlash; EAGLE does the same for AR drafters).

Layout of one round (prefix ``x_0..x_{n-1}``, the last token still pending in the verifier):

- context rows ``0..n-2``: ``fusion(h_t)``, the verifier's selected hidden states of token t
  (``feature_layers``, concatenated and projected to the drafter's width), attending causally;
- the block, rows ``n-1..n+gamma-2``: the pending token's embedding then ``gamma - 1`` masks,
  attending to every context row and bidirectionally within the block; block row j gives
  ``q_{j+1}``, the marginal of ``x_{n+j}``: one forward drafts the whole window.

Context rows are causal, so their keys/values are cached exactly across rounds: a round runs only
the tokens the verifier committed since the last one (their features arrive through
:meth:`ConditionedDrafter.observe`) plus the block. Training (:meth:`ConditionedDrafter.blocks_logits`)
runs many blocks over one sequence with the same visibility. Losslessness never depends on the
drafter (METHOD.md §4), only acceptance does.
"""

from __future__ import annotations

import os

import torch
from torch import nn

from ..decoding.drafting import Drafter, Proposal, derived_generator, head_logits, sample_from_marginals
from .compiled_prefix import StaticPrefixCache
from .diffusion import _is_stock_transformers_model, block_causal_allowed, blocks_allowed

__all__ = ["FeatureFusion", "ConditionedDrafter", "CONDITIONED_KIND"]

#: ``kind`` of a saved conditioned slice (``slice.json``)
CONDITIONED_KIND = "conditioned"


class FeatureFusion(nn.Module):
    """The verifier's concatenated hidden states ``[..., len(layers) * H_v]`` -> the drafter's width
    ``[..., H]``: a linear projection and an RMSNorm (the scales of different layers differ widely)."""

    def __init__(self, in_features: int, hidden_size: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.proj = nn.Linear(in_features, hidden_size, bias=False)
        self.norm = nn.RMSNorm(hidden_size, eps=eps)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        return self.norm(self.proj(features))


class ConditionedDrafter(Drafter):
    """A stock decoder run block-causally over the verifier's features and a mask block.

    Args:
        model: a stock HF causal LM (e.g. a slice of the verifier, :func:`slice_causal_lm`); its
            embeddings embed the block, its decoder, norm and head draft.
        fusion: a :class:`FeatureFusion` from the verifier's features to ``model``'s width.
        feature_layers: indices into the verifier's ``hidden_states`` (0: embeddings, i: after layer i).
        mask_token_id: the block's [MASK] id (an id the verifier never emits).
        head_vocab: when decoding, compute the LM head for token ids ``[0, head_vocab)`` only; the
            drafter never proposes the others (their logits are -inf). BPE ids follow merge order,
            so the first ids are the frequent tokens; the head reads a sixth of its weights at 8,192
            of SmolLM2's 49,152 ids (2.9 -> 0.3 ms a round on 2 CPU cores). Drafts stay drafts:
            acceptance, not exactness, depends on it. None: the whole vocabulary. Training forwards
            always use the whole head.
        block: the most tokens it drafts a round: the block it was trained with (its marginals
            change with the block's size, and were measured worse beyond it). When a round's gamma is
            larger, its drafts stop at ``block`` (the proposal's ``lengths``), while other draft
            sources in the same tree (context copies) may run to gamma. None: gamma.
        cache_window: when decoding, keep only the last ``cache_window`` context positions in its
            prefix cache, so a round costs the same at any context length (its attention over the
            cache is what grows: ~0.5 ms of a ~3 ms round from 200 to 1,000 tokens on 2 CPU cores).
            The context before the window still reaches it through the verifier's features, which
            the verifier computed attending to everything. None: the whole context.
    """

    def __init__(
        self,
        model: nn.Module,
        fusion: FeatureFusion,
        feature_layers: tuple[int, ...],
        mask_token_id: int,
        head_vocab: int | None = None,
        block: int | None = None,
        cache_window: int | None = None,
    ) -> None:
        self.model = model
        self.fusion = fusion
        self.feature_layers = tuple(int(i) for i in feature_layers)
        if not self.feature_layers:
            raise ValueError("feature_layers must name at least one of the verifier's hidden states")
        self.vocab_size = int(model.config.vocab_size)
        if not 0 <= int(mask_token_id) < self.vocab_size:
            raise ValueError(
                f"mask_token_id={mask_token_id} is outside the vocabulary [0, {self.vocab_size})"
            )
        if not _is_stock_transformers_model(model):
            raise ValueError(
                "ConditionedDrafter needs a stock transformers model (it passes a 4D mask and a cache)"
            )
        self.mask_token_id = int(mask_token_id)
        if head_vocab is not None and not 1 <= int(head_vocab) <= self.vocab_size:
            raise ValueError(f"head_vocab={head_vocab} must lie in [1, {self.vocab_size}] (the vocabulary)")
        self.head_vocab = None if head_vocab is None else int(head_vocab)
        if block is not None and int(block) < 1:
            raise ValueError(f"block={block} must be >= 1 (the most tokens drafted a round)")
        self.block = None if block is None else int(block)
        if cache_window is not None and int(cache_window) < 1:
            raise ValueError(
                f"cache_window={cache_window} must be >= 1 (context positions kept in the prefix cache)"
            )
        self.cache_window = None if cache_window is None else int(cache_window)
        self.compiled = False
        self.reset()

    # ------------------------------------------------------------------ loading / saving
    @classmethod
    def build(
        cls, verifier: nn.Module, num_layers: int, feature_layers: tuple[int, ...], mask_token_id: int
    ) -> ConditionedDrafter:
        """A fresh drafter around ``verifier``: its first ``num_layers`` layers (copies) and a new fusion."""
        from .slicing import slice_causal_lm

        model = slice_causal_lm(verifier, num_layers)
        return cls(model, _new_fusion(verifier, model, feature_layers), feature_layers, mask_token_id)

    @classmethod
    def from_pretrained(
        cls,
        path: str | os.PathLike,
        *,
        verifier: nn.Module | None = None,
        dtype: torch.dtype | str | None = None,
        **options,
    ) -> ConditionedDrafter:
        """A drafter saved by :meth:`save` (``slice.json`` kind ``conditioned``) around ``verifier``,
        the verifier it was trained against; ``options``: those of :meth:`from_slice`."""
        from .kinds import load_slice_drafter

        return load_slice_drafter(path, verifier, CONDITIONED_KIND, dtype, **options)

    @classmethod
    def from_slice(
        cls,
        verifier: nn.Module,
        path: str | os.PathLike,
        head_vocab: int | None = None,
        block: int | None = None,
        cache_window: int | None = None,
    ) -> ConditionedDrafter:
        """Load a drafter saved by :meth:`save` around ``verifier``'s embeddings (in its dtype);
        ``block`` defaults to the gamma it was trained with (``slice.json``)."""
        from .slicing import load_slice, slice_info

        info = slice_info(path)
        if info.get("kind") != CONDITIONED_KIND:
            raise ValueError(
                f"{path} holds a {info.get('kind', 'diffusion')!r} drafter, not a {CONDITIONED_KIND!r} one: "
                f"load it with load_drafter(path, verifier=...)"
            )
        layers = tuple(info["feature_layers"])
        fusion = FeatureFusion(
            len(layers) * int(verifier.config.hidden_size), int(verifier.config.hidden_size)
        )
        model, info = load_slice(verifier, path, extra=fusion)
        block = block if block is not None else info.get("gamma")
        return cls(model, fusion.eval(), layers, int(info["mask_token_id"]), head_vocab, block, cache_window)

    def save(
        self, path: str | os.PathLike, settings: dict | None = None, dtype: torch.dtype | None = None
    ) -> None:
        """Write the slice and the fusion (never the shared embeddings) plus the settings to reload it."""
        from .slicing import save_slice

        info = {"kind": CONDITIONED_KIND, "feature_layers": list(self.feature_layers)}
        info["mask_token_id"] = self.mask_token_id
        save_slice(self.model, path, {**(settings or {}), **info}, dtype, extra=self.fusion)

    # ------------------------------------------------------------------ forward
    def _base(self) -> nn.Module:
        return self.model.get_base_model() if hasattr(self.model, "get_base_model") else self.model

    def _embed(self, tokens: torch.Tensor) -> torch.Tensor:
        return self._base().get_input_embeddings()(tokens)

    def _block_tokens(self, last: torch.Tensor, gamma: int) -> torch.Tensor:
        """``[..., gamma]``: the pending token then ``gamma - 1`` masks."""
        masks = torch.full((*last.shape, gamma - 1), self.mask_token_id, dtype=last.dtype, device=last.device)
        return torch.cat([last[..., None], masks], dim=-1)

    def _mask(self, allowed: torch.Tensor) -> torch.Tensor:
        from ..decoding.attention import to_model_mask

        return to_model_mask(allowed, self.model, next(self.model.parameters()).dtype)

    def _head(self, hidden: torch.Tensor, vocab: int | None = None) -> torch.Tensor:
        """Logits over the whole vocabulary; with ``vocab``, computed for ids ``[0, vocab)`` only
        and -inf above."""
        logits = head_logits(self._base().get_output_embeddings(), hidden, vocab)
        return logits.view(*hidden.shape[:-1], -1)

    def blocks_logits(
        self, features: torch.Tensor, input_ids: torch.Tensor, starts: torch.Tensor, gamma: int
    ) -> torch.Tensor:
        """Training forward: many windows of one sequence in one pass.

        Args:
            features: ``[B, L, F]`` the verifier's features of ``input_ids[B, L]`` (clean text).
            starts: ``[B, M]`` window starts t (``1 <= t <= L``): the window drafts ``x_t..x_{t+gamma-1}``
                from the features of ``x_0..x_{t-2}`` and the pending token ``x_{t-1}``, exactly as a
                decoding round with prefix ``x_0..x_{t-1}`` does.
        Returns:
            ``logits[B, M, gamma, V]`` (the LM head runs on those rows only).
        """
        batch, length = input_ids.shape
        m = starts.shape[1]
        anchor = starts - 1  # the pending token's position
        block = self._block_tokens(input_ids.gather(1, anchor), gamma)  # [B, M, g]
        positions = anchor[:, :, None] + torch.arange(gamma, device=starts.device)
        embeds = torch.cat([self.fusion(features), self._embed(block.flatten(1))], dim=1)
        all_positions = torch.cat(
            [torch.arange(length, device=starts.device)[None].expand(batch, -1), positions.flatten(1)], dim=1
        )
        hidden = (
            self._base()
            .get_decoder()(
                inputs_embeds=embeds,
                attention_mask=self._mask(blocks_allowed(length, anchor, gamma)),
                position_ids=all_positions,
                use_cache=False,
            )
            .last_hidden_state
        )
        return self._head(hidden[:, length:]).view(batch, m, gamma, -1)

    # ------------------------------------------------------------------ decoding
    def reset(self) -> None:
        self._cache = None
        self._past = 0
        self._inbox: list[torch.Tensor] = []

    def set_compiled(self, enabled: bool) -> None:
        """Draft through the decoder's compiled forward over a static prefix cache
        (:class:`~.compiled_prefix.StaticPrefixCache`) from the next sequence on."""
        self.compiled = bool(enabled)

    def observe(self, features: torch.Tensor) -> None:
        self._inbox.append(features)

    def _cached_logits(self, input_ids: torch.Tensor, gamma: int) -> torch.Tensor:
        new = torch.cat(self._inbox) if self._inbox else None
        num_new = 0 if new is None else new.shape[0]
        committed = input_ids.shape[1] - 1
        if self._past + num_new != committed:
            raise ValueError(
                f"the conditioned drafter holds the verifier's features of {self._past + num_new} tokens, "
                f"but the prefix has {committed} committed tokens before the pending one. It drafts only "
                f"inside speculative_generate (which feeds it the verifier's hidden states through observe()); "
                f"call reset() before a new sequence."
            )
        if new is not None and new.shape[-1] != self.fusion.proj.in_features:
            raise ValueError(
                f"the verifier's features are {new.shape[-1]} wide, but this drafter's fusion reads "
                f"{self.fusion.proj.in_features} ({len(self.feature_layers)} layers of the verifier it was "
                f"trained for); pair it with that verifier"
            )
        dtype = next(self.model.parameters()).dtype
        block = self._embed(self._block_tokens(input_ids[0, -1:], gamma))  # [1, g, H]
        context = None if new is None else self.fusion(new.to(self.device, dtype))[None]
        hidden = self._static_round(context, block) if self.compiled else self._dynamic_round(context, block)
        self._past += num_new
        self._inbox = []
        return self._head(hidden, self.head_vocab)

    def _static_round(self, context: torch.Tensor | None, block: torch.Tensor) -> torch.Tensor:
        """The block's hidden states ``[1, g, H]`` through the compiled static prefix cache."""
        if self._cache is None:
            self._cache = StaticPrefixCache(self._base().get_decoder(), self.cache_window)
        return self._cache.run(context, block)

    def _dynamic_round(self, context: torch.Tensor | None, block: torch.Tensor) -> torch.Tensor:
        """The block's hidden states ``[1, g, H]`` through the eager decoder over a dynamic cache,
        cropped to the committed rows (and the window) afterwards."""
        from transformers import DynamicCache

        if self._cache is None:
            self._cache = DynamicCache()
        num_new, gamma = (0 if context is None else context.shape[1]), block.shape[1]
        rows = block if context is None else torch.cat([context, block], dim=1)
        # keys carry their positions (RoPE), so a window of the cache needs only the mask's width
        allowed = block_causal_allowed(self._cache.get_seq_length(), num_new, gamma, self.device)
        hidden = (
            self._base()
            .get_decoder()(
                inputs_embeds=rows,
                attention_mask=self._mask(allowed[None]),
                position_ids=torch.arange(self._past, self._past + num_new + gamma, device=self.device)[None],
                cache=self._cache,
                use_cache=True,
            )
            .last_hidden_state
        )
        self._cache.crop(-gamma)
        if self.cache_window is not None and self._cache.get_seq_length() > self.cache_window:
            for layer in self._cache.layers:
                layer.keys = layer.keys[..., -self.cache_window :, :]
                layer.values = layer.values[..., -self.cache_window :, :]
        return hidden[:, -gamma:]

    @torch.no_grad()
    def propose(
        self,
        input_ids: torch.Tensor,
        gamma: int,
        num_drafts: int = 1,
        temperature: float = 1.0,
        generator: torch.Generator | None = None,
    ) -> Proposal:
        if input_ids.shape[0] != 1:
            raise ValueError("the conditioned drafter drafts one sequence at a time (batch size 1)")
        home = input_ids.device
        input_ids = input_ids.to(self.device)
        window = gamma if self.block is None else min(gamma, self.block)
        logits = self._restrict_logits(self._cached_logits(input_ids, window))
        proposal = sample_from_marginals(
            logits, num_drafts, temperature, derived_generator(generator, self.device)
        )
        return proposal.pad_to(gamma).to(home)

    def __repr__(self) -> str:
        return (
            f"ConditionedDrafter({type(self.model).__name__}, layers={len(self._base().get_decoder().layers)}, "
            f"feature_layers={self.feature_layers}, mask_token_id={self.mask_token_id})"
        )


def _new_fusion(verifier: nn.Module, model: nn.Module, feature_layers: tuple[int, ...]) -> FeatureFusion:
    hidden = int(model.config.hidden_size)
    fusion = FeatureFusion(len(feature_layers) * int(verifier.config.hidden_size), hidden)
    # Start the fused rows at the scale of token embeddings, which the sliced layers were trained on.
    with torch.no_grad():
        weight = verifier.get_input_embeddings().weight.float()
        fusion.norm.weight.fill_(float(weight.pow(2).mean().sqrt()))
    return fusion.to(next(model.parameters()).dtype)
