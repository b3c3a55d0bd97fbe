"""A DFlash drafter's context cache held in a static KV cache and run by a compiled forward
(:class:`StaticContextCache`).

Eager, a DFlash drafter's round (SmolLM2's 3-layer drafter, bf16, 2-core Xeon) costs ~7 ms, most
of it the framework around three small layers; through the compiled model over a static cache it
costs ~4.5 ms (measured with ``decoding/compiled.py``'s plan: inductor's GEMMs, module guards off).

- a round writes the committed tokens' keys and values at the next free slots, the block's after
  them; their keys carry their RoPE positions, and the block sees every committed slot and itself,
  as the dynamic ``DFlashCache``'s bidirectional mask says;
- the block's keys are never kept: the next round writes over them (the dynamic cache crops them);
- the cache is sized for what it holds plus :data:`_SLACK`, and grows (a copy) when a call would
  not fit; its length is a dynamic dimension of the compiled graph (no recompile per size);
- a call of more than :data:`MAX_ROWS` committed rows (the catch-up after rounds the drafter sat
  out) runs as several, the earlier rows first: one shape-dynamic graph serves them all.

The first call (the prompt's features, of any length) runs eagerly over a ``DFlashCache``; the
static cache then takes its keys. Drafts only: losslessness never depends on the drafter (METHOD.md
§4), and in float32 the logits equal the eager drafter's to rounding (tests).
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
    mark_capacity_dynamic,
    mark_dynamic,
)
from ..decoding.kernels import choose_compiled_kernels

__all__ = ["StaticContextCache", "MAX_ROWS"]

#: the most rows one compiled call runs: the range the compiled graph is shape-dynamic over
#: (grouped SDPA up to this many queries, decoding/attention.py)
MAX_ROWS = MAX_GROUPED_QUERIES_COMPILED

#: positions a context cache holds beyond what it needs when it is made or grows: a grow copies the
#: cache (3 small layers for SmolLM2's drafter: well under a millisecond), while every slot costs
#: attention in every round (the block attends over the whole cache)
_SLACK = 128
#: context rows every compiled DFlash call carries at least (earlier rows re-sent): dynamo gives a
#: dimension of size 1 a graph of its own, so a round that commits one token would compile another
_MIN_CONTEXT = 2


class StaticContextCache:
    """One sequence's context cache for a DFlash drafter (:class:`~.dflash.DFlashDrafter`).

    DFlash's queries are the block only, and the committed tokens' features enter as keys and
    values (every layer projects them with the block), which ``DFlashCache`` keeps. Here the stock
    model's forward writes them into a ``StaticCache`` at the committed slots, the block's keys
    after them (overwritten next call); the block sees every committed slot and itself, as the
    dynamic cache's bidirectional mask says.

    A round that commits fewer than :data:`_MIN_CONTEXT` tokens re-sends the last committed
    features: their keys are written again at their own slots and positions (the same values), so one
    shape-dynamic graph serves every round. Full-attention layers only (no window).

    Args:
        model: the stock ``MuseGlimmerAssistantModel``.
        compile: run every call after the first through
            :func:`~..decoding.compiled.compiled_forward` (False: the same static-cache calls
            eagerly, for tests).
    """

    def __init__(self, model: nn.Module, compile: bool = True) -> None:
        self.decoder = model
        self.compile = bool(compile)
        self.dtype = next(model.parameters()).dtype
        if self.compile and not hasattr(model, "compiled_kernels"):
            # the verifier's plan is measured when it loads (calibration.prepare_kernels); the
            # drafter takes the same choice here (instant where inductor's GEMMs serve)
            model.compiled_kernels = choose_compiled_kernels(model)
        self._frozen = self.compile and bool(inductor_options(model).get("freezing"))
        self._forward = compiled_forward(model) if self.compile else model
        self.cache = None
        self.capacity = 0
        #: committed positions written so far (the next row's RoPE position and slot)
        self.past = 0
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
        # slots are positions (the cache is never compacted): the call writes from past - resent on
        end = self.past + num_new + block.shape[1]
        if end > self.capacity:
            self._grow(end)
        device = block.device
        allowed = torch.zeros(1, block.shape[1], self.capacity, dtype=torch.bool, device=device)
        allowed[..., :end] = True
        mask = to_model_mask(allowed, self.decoder, self.dtype)
        for layer in self.cache.layers:
            layer.cumulative_length.fill_(self.past - resent)
        positions = torch.arange(self.past - resent, end, device=device)
        inputs = dict(
            noise_embeds=block,
            context_hidden_states=context if context is not None else block.new_zeros(1, 0, self._width),
            position_ids=positions[None],
        )
        if self.compile:
            mark_dynamic(
                inputs, {"context_hidden_states": 1, "position_ids": 1}, span=(_MIN_CONTEXT, MAX_ROWS)
            )
            mark_capacity_dynamic(mask, self.cache)
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
        static cache then takes its committed keys (sized for them and :data:`_SLACK` more)."""
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
        self.capacity = cache_capacity(num_new + _SLACK)
        self.cache = self._new_cache()
        copy_positions(dynamic.layers, self.cache, 0, num_new, self._frozen)
        self.past = num_new
        self._keep_tail(context)
        return hidden

    def _new_cache(self):
        from transformers import StaticCache

        return StaticCache(config=self.decoder.config, max_cache_len=self.capacity)

    def _grow(self, needed: int) -> None:
        old = self.cache
        self.capacity = cache_capacity(needed + _SLACK)
        self.cache = self._new_cache()
        copy_positions(old.layers, self.cache, 0, self.past, self._frozen)

    def _keep_tail(self, context: torch.Tensor) -> None:
        if context.shape[1]:
            # a copy: a view would keep the round's whole feature row alive
            self._tail = context[0, -_MIN_CONTEXT:][None].clone()
