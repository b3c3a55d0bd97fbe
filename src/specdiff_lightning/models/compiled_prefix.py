"""A drafter's prefix cache held in a static KV cache and run by a compiled forward: the conditioned
drafter's (:class:`StaticPrefixCache`) and a DFlash drafter's context cache (:class:`StaticContextCache`).

Eager, a conditioned drafter's round (SmolLM2's 2-layer drafter, bf16, 2-core Xeon) costs ~4 ms,
most of it the framework around two small layers; through the compiled decoder over a static cache
it costs ~3 ms (measured with ``decoding/compiled.py``'s plan: inductor's GEMMs, module guards off).
:class:`StaticPrefixCache` keeps :class:`~.conditioned.ConditionedDrafter`'s prefix cache that way,
with the same visibility as the dynamic cache it replaces:

- a round writes its rows (the committed tokens' fused features, then the block) at the next free
  *slots*; their keys carry their RoPE *positions*, so a slot's place in the cache never matters,
  only the mask, which lets every row see the cached slots of its window and the rows of its own
  call as :func:`~.diffusion.block_causal_allowed` says;
- the block's keys are never kept: the next round writes over them (the dynamic cache crops them);
- with a ``window`` (the drafter's ``cache_window``), slots older than the window are never read
  again; when a call would not fit, the window's slots move to the front (a copy of ``window``
  positions, every few hundred tokens), so the cache never grows and its graph never recompiles;
  without one it grows to the next power of two, as the verifier's static cache does;
- a call of more than :data:`MAX_ROWS` rows (the catch-up after rounds the drafter sat out) runs as
  several, the context rows first: one shape-dynamic graph serves them all.

The first call (the prompt's features, of any length) runs eagerly over a dynamic cache; the static
cache then takes the window's keys from it, so its size does not depend on the prompt. Drafts only:
losslessness never depends on the drafter (METHOD.md §4), and in float32 the logits equal the eager
drafter's to rounding (tests).
"""

from __future__ import annotations

import torch
from torch import nn

from ..decoding.attention import MAX_GROUPED_QUERIES_COMPILED, to_model_mask
from ..decoding.compiled import (
    cache_capacity,
    compiled_forward,
    copy_positions,
    inductor_options,
    mark_dynamic,
)
from ..decoding.kernels import choose_compiled_kernels
from .diffusion import block_causal_allowed

__all__ = ["StaticPrefixCache", "StaticContextCache", "MAX_ROWS"]

#: the most rows one compiled call runs: the range the compiled graph is shape-dynamic over
#: (grouped SDPA up to this many queries, decoding/attention.py)
MAX_ROWS = MAX_GROUPED_QUERIES_COMPILED


class StaticPrefixCache:
    """One sequence's prefix cache for a drafter whose ``decoder`` (a stock HF decoder, e.g.
    ``LlamaModel``) runs block-causally over embedded rows.

    Args:
        decoder: the drafter's decoder (what ``get_decoder()`` returns); called with ``inputs_embeds``.
        window: keep only the last ``window`` committed positions visible (None: all of them).
        compile: run every call after the first through :func:`~..decoding.compiled.compiled_forward`
            (False: the same static-cache calls eagerly, for tests).
    """

    def __init__(self, decoder: nn.Module, window: int | None = None, compile: bool = True) -> None:
        self.decoder = decoder
        self.window = window
        self.compile = bool(compile)
        self.dtype = next(decoder.parameters()).dtype
        if self.compile and not hasattr(decoder, "compiled_kernels"):
            # the verifier's plan is measured when it loads (calibration.prepare_kernels); a
            # drafter's decoder takes the same choice here (instant where inductor's GEMMs serve)
            decoder.compiled_kernels = choose_compiled_kernels(decoder)
        self._frozen = self.compile and bool(inductor_options(decoder).get("freezing"))
        self._forward = compiled_forward(decoder) if self.compile else decoder
        self.cache = None
        self.capacity = 0
        #: committed positions written so far (the next row's RoPE position)
        self.past = 0
        #: position of slot 0 (slots move to the front when the window is compacted)
        self._offset = 0

    def run(self, context: torch.Tensor | None, block: torch.Tensor) -> torch.Tensor:
        """Commit ``context[1, n, H]`` (embedded rows of the tokens committed since the last call,
        or None) and run ``block[1, g, H]`` after it; returns the block's hidden states ``[1, g, H]``."""
        gamma = block.shape[1]
        # the window is the dynamic cache's: the positions cached when the round began, cropped to
        # the last `window`, plus every row of the round (a split round sees what one call would)
        low = 0 if self.window is None else max(0, self.past - self.window)
        if context is not None and self.cache is not None:
            # catch-up: context rows alone until the rest fits one call with the block
            while context.shape[1] + gamma > max(MAX_ROWS, gamma + 1):
                # sliced from the sequence's row, not the batch: a [1, n, H] view of a longer row
                # keeps its batch stride, which the compiled graph guards (it would recompile)
                chunk = context[0, :MAX_ROWS][None]
                self._call(chunk, chunk.shape[1], 0, low)
                context = context[0, chunk.shape[1] :][None]
        num_new = 0 if context is None else context.shape[1]
        rows = block if context is None else torch.cat([context, block], dim=1)
        return self._call(rows, num_new, gamma, low)[:, num_new:]

    def _call(self, rows: torch.Tensor, num_new: int, gamma: int, low: int) -> torch.Tensor:
        """Run ``rows[1, num_new + gamma, H]`` (``num_new`` committed, then ``gamma`` block rows)
        seeing the committed positions from ``low`` on; the committed rows stay in the cache.
        Returns their hidden states."""
        total = num_new + gamma
        if self.cache is None:
            return self._first(rows, num_new, gamma)
        self._make_room(total, low)
        cached = self.past - self._offset  # slots holding committed positions
        first = low - self._offset
        device = rows.device
        allowed = torch.zeros(1, total, self.capacity, dtype=torch.bool, device=device)
        allowed[0, :, first : cached + total] = block_causal_allowed(cached - first, num_new, gamma, device)
        for layer in self.cache.layers:
            layer.cumulative_length.fill_(cached)  # a StaticLayer writes there (decoding/compiled.py)
        positions = torch.arange(self.past, self.past + total, device=device)
        inputs = dict(
            inputs_embeds=rows,
            attention_mask=to_model_mask(allowed, self.decoder, self.dtype),
            position_ids=positions[None],
            cache_position=positions - self._offset,
        )
        if self.compile:
            mark_dynamic(
                inputs, {"inputs_embeds": 1, "attention_mask": 2, "position_ids": 1, "cache_position": 0}
            )
        hidden = self._forward(**inputs, cache=self.cache, use_cache=True).last_hidden_state
        self.past += num_new
        return hidden

    def _first(self, rows: torch.Tensor, num_new: int, gamma: int) -> torch.Tensor:
        """The first call (the prompt's rows, any number), eager over a dynamic cache; then the
        static cache is allocated (as plain inputs where weights are frozen) and takes the committed
        keys the window keeps, so its size, and so the compiled graph, does not depend on the prompt."""
        from transformers import DynamicCache

        total = num_new + gamma
        device = rows.device
        dynamic = DynamicCache()
        hidden = self.decoder(
            inputs_embeds=rows,
            attention_mask=to_model_mask(
                block_causal_allowed(0, num_new, gamma, device)[None], self.decoder, self.dtype
            ),
            position_ids=torch.arange(total, device=device)[None],
            cache=dynamic,
            use_cache=True,
        ).last_hidden_state
        keep = num_new if self.window is None else min(num_new, self.window)
        self.capacity = cache_capacity(2 * max(keep, self.window or 0, MAX_ROWS))
        self.cache = self._new_cache()
        copy_positions(dynamic.layers, self.cache, num_new - keep, num_new, self._frozen)
        self.past, self._offset = num_new, num_new - keep
        return hidden

    def _new_cache(self):
        from transformers import StaticCache

        return StaticCache(config=self.decoder.config, max_cache_len=self.capacity)

    def _make_room(self, total: int, low: int) -> None:
        """Make ``total`` free slots after the committed ones: move the slots of positions ``low``
        on (the window) to the front, or, where that does not free enough, grow the cache."""
        cached = self.past - self._offset
        if cached + total <= self.capacity:
            return
        keep = cached - (low - self._offset)
        if self.window is not None and keep + total <= self.capacity:
            for layer in self.cache.layers:
                # the RHS is a copy: the ranges may overlap
                layer.keys[..., :keep, :] = layer.keys[..., cached - keep : cached, :].clone()
                layer.values[..., :keep, :] = layer.values[..., cached - keep : cached, :].clone()
            self._offset = low
            return
        self._grow(cached + total)

    def _grow(self, needed: int) -> None:
        old = self.cache
        self.capacity = cache_capacity(needed)
        self.cache = self._new_cache()
        copy_positions(old.layers, self.cache, 0, self.past - self._offset, self._frozen)


#: context rows every compiled DFlash call carries at least (earlier rows re-sent): dynamo gives a
#: dimension of size 1 a graph of its own, so a round that commits one token would compile another
_MIN_CONTEXT = 2


class StaticContextCache(StaticPrefixCache):
    """A DFlash drafter's context cache (:class:`~.dflash.DFlashDrafter`) held the same way.

    DFlash differs from the conditioned drafter in what a call runs: its queries are the block only,
    and the committed tokens' features enter as keys and values (every layer projects them with the
    block), which ``DFlashCache`` keeps. Here the stock model's forward writes them into a
    ``StaticCache`` at the committed slots, the block's keys after them (overwritten next call); the
    block sees every committed slot and itself, as the dynamic cache's bidirectional mask says.

    A round that commits fewer than :data:`_MIN_CONTEXT` tokens re-sends the last committed
    features: their keys are written again at their own slots and positions (the same values), so one
    shape-dynamic graph serves every round. Full-attention layers only (no window).

    Args:
        model: the stock ``MuseGlimmerAssistantModel``.
        compile: as :class:`StaticPrefixCache`.
    """

    def __init__(self, model: nn.Module, compile: bool = True) -> None:
        super().__init__(model, window=None, compile=compile)
        #: the width of the verifier's features the model reads (an empty context is this wide)
        self._width = len(model.config.target_layer_ids) * int(model.config.hidden_size)
        #: the last committed features ``[1, <=_MIN_CONTEXT, F]`` (re-sent by short rounds)
        self._tail: torch.Tensor | None = None

    def run(self, context: torch.Tensor | None, block: torch.Tensor) -> torch.Tensor:
        """Commit ``context[1, n, F]`` (the verifier's features of the tokens committed since the last
        call, or None) and run the embedded ``block[1, B, H]`` after it; returns its hidden states
        ``[1, B, H]``."""
        if self.cache is None:
            return self._first(context, block)
        if context is not None:
            while context.shape[1] > MAX_ROWS:  # catch-up: earlier rows first, their block dropped
                self._call(context[0, :MAX_ROWS][None], block)
                context = context[0, MAX_ROWS:][None]
        return self._call(context, block)

    def _call(self, context: torch.Tensor | None, block: torch.Tensor) -> torch.Tensor:
        num_new = 0 if context is None else context.shape[1]
        resent = 0 if self._tail is None else min(self._tail.shape[1], max(0, _MIN_CONTEXT - num_new))
        if resent:
            tail = self._tail[:, self._tail.shape[1] - resent :]
            context = tail if context is None else torch.cat([tail, context], dim=1)
        gamma = block.shape[1]
        self._make_room(num_new + gamma, 0)
        cached = self.past - self._offset
        device = block.device
        allowed = torch.zeros(1, gamma, self.capacity, dtype=torch.bool, device=device)
        allowed[..., : cached + num_new + gamma] = True
        mask = to_model_mask(allowed, self.decoder, self.dtype)
        for layer in self.cache.layers:
            layer.cumulative_length.fill_(cached - resent)
        positions = torch.arange(self.past - resent, self.past + num_new + gamma, device=device)
        inputs = dict(
            noise_embeds=block,
            context_hidden_states=context if context is not None else block.new_zeros(1, 0, self._width),
            position_ids=positions[None],
        )
        if self.compile:
            mark_dynamic(
                inputs, {"context_hidden_states": 1, "position_ids": 1}, span=(_MIN_CONTEXT, MAX_ROWS)
            )
        hidden = self._forward(
            **inputs,
            attention_mask={"full_attention": mask, "sliding_attention": mask},
            cache=self.cache,
            use_cache=True,
        ).last_hidden_state
        self._keep_tail(context)
        self.past += num_new
        return hidden

    def _first(self, context: torch.Tensor | None, block: torch.Tensor) -> torch.Tensor:
        """The first call (the prompt's features, any number), eager over a ``DFlashCache``; the
        static cache then takes its committed keys (sized for them, as :class:`StaticPrefixCache`)."""
        from transformers.cache_utils import DFlashCache

        num_new = 0 if context is None else context.shape[1]
        if context is None:
            context = block.new_zeros(1, 0, self._width)
        dynamic = DFlashCache(config=self.decoder.config)
        dynamic.set_previous_accepted_tokens(num_new)
        hidden = self.decoder(
            noise_embeds=block,
            context_hidden_states=context,
            position_ids=torch.arange(num_new + block.shape[1], device=block.device)[None],
            cache=dynamic,
            use_cache=True,
        ).last_hidden_state
        self.capacity = cache_capacity(2 * max(num_new, MAX_ROWS))
        self.cache = self._new_cache()
        copy_positions(dynamic.layers, self.cache, 0, num_new, self._frozen)
        self.past, self._offset = num_new, 0
        self._keep_tail(context)
        return hidden

    def _keep_tail(self, context: torch.Tensor) -> None:
        if context.shape[1]:
            # a copy: a view would keep the round's whole feature row alive
            self._tail = context[0, -_MIN_CONTEXT:][None].clone()
