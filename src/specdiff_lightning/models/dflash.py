"""A DFlash drafter (Chen et al., arXiv 2602.06036) over transformers' stock class.

DFlash is a block-diffusion drafter conditioned on the verifier's hidden states; transformers ships
it as ``MuseGlimmerAssistantModel`` and z-lab publishes checkpoints of it. :class:`DFlashDrafter` runs that stock model in our loop.

One round, prefix ``x_0..x_{n-1}`` (``x_{n-1}`` pending in the verifier):

- context: the verifier's hidden states of ``x_0..x_{n-2}`` at ``target_layer_ids``, concatenated.
  The stock model projects them (``encoder``) and every layer turns them into keys/values only, so
  they are cached exactly (``DFlashCache``): a round feeds just the tokens committed since the last
  one (:meth:`DFlashDrafter.observe`);
- the block, positions ``n-1..n+block_size-2``: the pending token then ``block_size - 1`` masks,
  embedded by the verifier's embeddings, attending to all context and to each other;
- block row ``j >= 1`` (a mask at position ``n-1+j``) predicts the token there, ``x_{n-1+j}``,
  through the verifier's LM head: one forward drafts ``block_size - 1`` marginals.

Hidden-state indices: DFlash's ``target_layer_ids`` count decoder layers from 0 (id i: the output
of layer i), while HF ``hidden_states[0]`` is the embeddings, so the loop's ``feature_layers`` are
``i + 1`` (as transformers' own DFlash candidate generator reads them).
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path

import torch
from torch import nn

from ..decoding.drafting import (
    Drafter,
    DraftVocabulary,
    Proposal,
    derived_generator,
    head_logits,
    sample_from_marginals,
)
from .compiled_prefix import StaticContextCache

__all__ = ["DFlashDrafter", "DFLASH_KIND"]

#: ``load_drafter(kind=...)`` of a DFlash checkpoint
DFLASH_KIND = "dflash"


def _check_pairing(config, verifier: nn.Module, where: str) -> None:
    """One-line errors for a drafter that cannot read this verifier (``where``: the checkpoint, or
    "the drafter")."""
    v = verifier.config
    depth = int(v.num_hidden_layers)
    ids = [int(i) for i in config.target_layer_ids]
    if not ids:
        raise ValueError(f"{where}: target_layer_ids is empty; name the verifier layers the drafter reads")
    if not all(0 <= i < depth for i in ids):
        raise ValueError(
            f"{where}: target_layer_ids={ids} exceed the verifier's depth ({depth} layers: ids 0..{depth - 1}); "
            f"pair the drafter with the verifier it was trained for"
        )
    if int(config.hidden_size) != int(v.hidden_size):
        raise ValueError(
            f"{where}: hidden_size={config.hidden_size} differs from the verifier's {v.hidden_size} (DFlash drafts "
            f"in the verifier's width, with its embeddings and head); pair it with the verifier it was trained for"
        )
    vocab = int(verifier.get_output_embeddings().weight.shape[0])
    own = getattr(config, "vocab_size", None)
    if own is not None and int(own) != vocab:
        raise ValueError(
            f"{where}: vocab_size={own} differs from the verifier's {vocab} (the drafter drafts through the "
            f"verifier's head); pair it with the verifier it was trained for"
        )
    if not 0 <= int(config.mask_token_id) < vocab:
        raise ValueError(
            f"{where}: mask_token_id={config.mask_token_id} is outside the verifier's vocabulary [0, {vocab}); "
            f"set the mask id the drafter was trained with"
        )
    if int(config.block_size) < 2:
        raise ValueError(
            f"{where}: block_size={config.block_size} must be >= 2 (the pending token plus at least one mask)"
        )


class DFlashDrafter(Drafter):
    """A stock DFlash model drafting from the verifier's hidden states, embeddings and head.

    Args:
        model: a ``MuseGlimmerAssistantModel`` (its config's ``block_size``, ``mask_token_id``,
            ``target_layer_ids``).
        verifier: the HF causal LM it drafts for; its input embeddings and output head are used
            (references, never copied or saved), so they stay in the verifier's dtype and device.
        head_vocab: when decoding, compute the head for ``head_vocab`` ids only
            (:class:`~specdiff_lightning.decoding.drafting.DraftVocabulary`): the first ids of
            ``vocab_ranking`` where there is one, else ids ``[0, head_vocab)``; the drafter never
            proposes the others. None: the whole vocabulary. Training forwards always use the
            whole head.
        vocab_ranking: token ids, most frequent first, in the drafter's training answers (a
            checkpoint's ``draft_vocab.json``); saved with the drafter.
    """

    def __init__(
        self,
        model: nn.Module,
        verifier: nn.Module,
        head_vocab: int | None = None,
        vocab_ranking: list[int] | None = None,
    ) -> None:
        from transformers import MuseGlimmerAssistantModel

        if not isinstance(model, MuseGlimmerAssistantModel):
            raise ValueError(
                f"DFlashDrafter wraps the stock MuseGlimmerAssistantModel, got {type(model).__name__}; load a "
                f"checkpoint with DFlashDrafter.from_pretrained(path, verifier=...)"
            )
        _check_pairing(model.config, verifier, "the drafter")
        self.model = model.eval()
        self.embeddings = verifier.get_input_embeddings()
        self.head = verifier.get_output_embeddings()
        self.num_target_layers = int(verifier.config.num_hidden_layers)
        config = model.config
        self.target_layer_ids = tuple(int(i) for i in config.target_layer_ids)
        self.feature_layers = tuple(i + 1 for i in self.target_layer_ids)  # hidden_states[0]: embeddings
        self.block_size = int(config.block_size)
        self.mask_token_id = int(config.mask_token_id)
        self.vocab_size = int(self.head.weight.shape[0])
        self.head_vocab = None if head_vocab is None else int(head_vocab)
        self.vocab_ranking = None if vocab_ranking is None else [int(i) for i in vocab_ranking]
        self.draft_vocab: DraftVocabulary | None = None
        if self.head_vocab is not None:  # DraftVocabulary checks the size against the vocabulary
            vocab = (
                DraftVocabulary.first(self.head_vocab, self.vocab_size)
                if self.vocab_ranking is None
                else DraftVocabulary.top(self.vocab_ranking, self.head_vocab, self.vocab_size)
            )
            self.draft_vocab = vocab if len(vocab) < self.vocab_size else None  # all ids: the plain head
        self.compiled = False
        self.reset()

    # ------------------------------------------------------------------ building / loading / saving
    @classmethod
    def build(
        cls,
        verifier: nn.Module,
        num_layers: int,
        target_layer_ids: tuple[int, ...],
        mask_token_id: int,
        block_size: int = 16,
        dtype: torch.dtype | None = None,
    ) -> DFlashDrafter:
        """A fresh (randomly initialised) drafter sized like ``verifier``; ``dtype``: the verifier's."""
        from transformers import MuseGlimmerAssistantModel

        from .dflash_format import dflash_config_for

        config = dflash_config_for(verifier, num_layers, target_layer_ids, mask_token_id, block_size)
        _check_pairing(config, verifier, "the drafter")
        dtype = dtype or next(verifier.parameters()).dtype
        model = MuseGlimmerAssistantModel._from_config(config, dtype=dtype)
        return cls(model.to(verifier.get_input_embeddings().weight.device), verifier)

    @classmethod
    def from_pretrained(
        cls,
        path: str | os.PathLike,
        *,
        verifier: nn.Module,
        dtype: torch.dtype | str | None = None,
        head_vocab: int | None = None,
        ranked_vocab: bool = True,
    ) -> DFlashDrafter:
        """A DFlash checkpoint (a directory, or a hub id in the local hub cache) in transformers' or
        z-lab's layout, around ``verifier``.

        Never runs checkpoint code: an ``auto_map`` is ignored (a warning says so) and the weights
        go into the stock class. Args: ``dtype``: None / ``"auto"``: the verifier's; the drafter
        lives on the verifier's embedding device. ``head_vocab``: see the class; it takes the most
        frequent ids of the directory's ``draft_vocab.json`` where there is one (``ranked_vocab``
        False: ids ``[0, head_vocab)`` regardless).
        """
        from transformers import MuseGlimmerAssistantModel
        from transformers.initialization import no_init_weights

        from .dflash_format import read_dflash_config, read_dflash_tensors, read_vocab_ranking
        from .loading import resolve_dtype
        from .specs import resolve_pretrained

        if verifier is None:
            raise ValueError(
                "a DFlash drafter drafts with its verifier's embeddings, head and hidden states: pass "
                "verifier= (load_verifier(...))"
            )
        resolved = resolve_pretrained(path, "DFlash drafter")  # a local directory or cached hub snapshot
        if not os.path.isdir(resolved):
            raise ValueError(
                f"{path} is a hub id that is not downloaded: DFlash drafters load from a directory; download it "
                f"(e.g. hf download {path} --local-dir DIR) and pass DIR"
            )
        path = Path(resolved)
        config, layout = read_dflash_config(path)
        _check_pairing(config, verifier, str(path))  # before reading any tensor
        dtype = resolve_dtype(dtype)
        if dtype in (None, "auto"):
            dtype = next(verifier.parameters()).dtype
        with no_init_weights():  # every tensor is loaded below
            model = MuseGlimmerAssistantModel._from_config(config, dtype=dtype)
        tensors = read_dflash_tensors(path, layout)
        expected = model.state_dict()
        missing = sorted(set(expected) - set(tensors))
        unexpected = sorted(set(tensors) - set(expected))
        if missing or unexpected:
            raise ValueError(
                f"{path} ({layout} layout) does not match its config: missing tensors {missing[:4]}, "
                f"unexpected {unexpected[:4]}; is it a DFlash drafter of this config?"
            )
        for name, tensor in tensors.items():
            if tuple(tensor.shape) != tuple(expected[name].shape):
                raise ValueError(
                    f"{path}: tensor {name} is {tuple(tensor.shape)}, the config needs "
                    f"{tuple(expected[name].shape)}; the config and weights disagree"
                )
        model.load_state_dict({k: v.to(dtype) for k, v in tensors.items()}, strict=True)
        vocab = int(verifier.get_output_embeddings().weight.shape[0])
        ranking = read_vocab_ranking(path, vocab) if ranked_vocab else None
        return cls(model.to(verifier.get_input_embeddings().weight.device), verifier, head_vocab, ranking)

    def save_pretrained(self, path: str | os.PathLike, layout: str = "hf") -> None:
        """Write the drafter (never the verifier's embeddings or head) in ``layout``: ``"hf"``
        (transformers', the stock ``save_pretrained``) or ``"zlab"`` (z-lab's, read by vLLM / SGLang
        and the ``dflash`` package)."""
        from .dflash_format import write_dflash, write_vocab_ranking

        write_dflash(self.model, path, layout, self.num_target_layers)
        if self.vocab_ranking is not None:
            write_vocab_ranking(path, self.vocab_ranking, "the drafter's training answers")

    # ------------------------------------------------------------------ decoding
    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def reset(self) -> None:
        from transformers.cache_utils import DFlashCache

        self._cache = DFlashCache(config=self.model.config)
        # sliding-window layers may be cropped after they are full only when they record their past
        self._cache.activate_past_recording()
        self._static = None
        self._past = 0
        self._inbox: list[torch.Tensor] = []

    def set_compiled(self, enabled: bool) -> None:
        """Draft through the model's compiled forward over a static context cache
        (:class:`~.compiled_prefix.StaticContextCache`) from the next sequence on. Full-attention
        drafters only: one with sliding-window layers keeps drafting eagerly (a warning says so)."""
        full = all(t == "full_attention" for t in getattr(self.model.config, "layer_types", None) or ())
        if enabled and not full:
            warnings.warn(
                f"{self!r} has sliding-window layers ({self.model.config.layer_types}); its compiled drafting "
                f"path holds full-attention caches only, so it drafts eagerly (the verifier still compiles)",
                stacklevel=2,
            )
        self.compiled = bool(enabled) and full

    def observe(self, features: torch.Tensor) -> None:
        self._inbox.append(features)

    def _take_features(self, committed: int) -> torch.Tensor:
        """``[1, n, F]``: the features of the n tokens committed since the last round."""
        width = len(self.target_layer_ids) * int(self.model.config.hidden_size)
        new = torch.cat(self._inbox) if self._inbox else torch.zeros(0, width)
        if self._past + new.shape[0] != committed:
            raise ValueError(
                f"the DFlash drafter holds the verifier's features of {self._past + new.shape[0]} tokens, but the "
                f"prefix has {committed} committed tokens before the pending one. It drafts only inside "
                f"speculative_generate (which feeds it the verifier's hidden states through observe()); call "
                f"reset() before a new sequence."
            )
        if new.shape[-1] != width:
            raise ValueError(
                f"the verifier's features are {new.shape[-1]} wide, but this drafter reads {width} "
                f"({len(self.target_layer_ids)} layers of its verifier's width); pair it with that verifier"
            )
        return new.to(self.device, next(self.model.parameters()).dtype)[None]

    def block_logits(self, input_ids: torch.Tensor, rows: int | None = None) -> torch.Tensor:
        """One round: ``logits[1, rows, V]`` of ``x_n .. x_{n+rows-1}`` after the prefix
        ``input_ids[1, n]``, from the features observed so far (the cache keeps the context).
        ``rows``: at most and by default ``block_size - 1``; the block is always whole (its
        marginals depend on its length), the head reads only the rows asked for."""
        return head_logits(self.head, self._block_rows(input_ids, rows), self.draft_vocab)[None]

    def _block_rows(self, input_ids: torch.Tensor, rows: int | None = None) -> torch.Tensor:
        """One round's drafted hidden rows ``[rows, H]`` before the head (:meth:`block_logits`),
        in the head's dtype and on its device."""
        rows = self.block_size - 1 if rows is None else min(int(rows), self.block_size - 1)
        dtype = next(self.model.parameters()).dtype
        context = self._take_features(input_ids.shape[1] - 1)
        new = context.shape[1]
        masks = torch.full((self.block_size - 1,), self.mask_token_id, dtype=torch.long)
        block = torch.cat([input_ids[0, -1:].cpu(), masks]).to(self.embeddings.weight.device)
        noise = self.embeddings(block[None]).to(self.device, dtype)
        if self.compiled:
            if self._static is None:
                self._static = StaticContextCache(self.model)
            hidden = self._static.run(context if new else None, noise)
        else:
            hidden = self._dynamic_round(context, noise)
        self._past += new
        self._inbox = []
        # a fresh 2-D tensor: the bf16 CPU head on an offset view is ~18x slower (head_logits)
        return hidden[0, 1 : 1 + rows].to(self.head.weight.device, self.head.weight.dtype).clone()

    def _dynamic_round(self, context: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
        """The block's hidden states ``[1, block_size, H]`` through the eager model over the
        ``DFlashCache``, which keeps the context only."""
        new = context.shape[1]
        positions = torch.arange(self._past, self._past + new + self.block_size, device=self.device)
        self._cache.set_previous_accepted_tokens(new)
        hidden = self.model(
            noise_embeds=noise,
            context_hidden_states=context,
            position_ids=positions[None],
            cache=self._cache,
            use_cache=True,
        ).last_hidden_state
        self._cache.crop(-self.block_size)  # keep the context only: the block is redrawn every round
        return hidden

    def blocks_logits(
        self, features: torch.Tensor, input_ids: torch.Tensor, starts: torch.Tensor, gamma: int | None = None
    ) -> torch.Tensor:
        """Training forward: many blocks of each sequence in one pass, as DFlash trains.
        ``logits[B, M, gamma, V]`` through the verifier's head of :meth:`blocks_hidden`."""
        rows = self.blocks_hidden(features, input_ids, starts, gamma)
        batch, m, gamma = rows.shape[:3]
        return head_logits(self.head, rows).view(batch, m, gamma, -1)

    def blocks_hidden(
        self, features: torch.Tensor, input_ids: torch.Tensor, starts: torch.Tensor, gamma: int | None = None
    ) -> torch.Tensor:
        """The hidden rows of many blocks of each sequence in one pass, before the head.

        Args:
            features: ``[B, L, F]`` the verifier's hidden states at :attr:`feature_layers`,
                concatenated, of the clean ``input_ids[B, L]`` (teacher-forced: what decoding
                feeds through :meth:`observe`).
            starts: ``[B, M]`` block starts t (``1 <= t < L``): the block's anchor is the pending
                token ``x_{t-1}``, it sees the features of ``x_0..x_{t-2}``, and it drafts
                ``x_t..x_{t+gamma-1}``: exactly a decoding round with prefix ``x_0..x_{t-1}``.
            gamma: drafted positions returned (default and at most ``block_size - 1``); the
                block itself is always ``block_size`` long (its marginals depend on its length).
        Returns:
            ``rows[B, M, gamma, H]``, in the head's dtype and on its device.
        """
        from ..decoding.attention import to_model_mask
        from .diffusion import blocks_allowed

        size = self.block_size
        gamma = size - 1 if gamma is None else int(gamma)
        if not 1 <= gamma < size:
            raise ValueError(f"gamma={gamma}: a DFlash block of {size} drafts 1..{size - 1} tokens")
        dtype = next(self.model.parameters()).dtype
        batch, length = input_ids.shape
        m = starts.shape[1]
        anchor = starts - 1
        masks = torch.full(
            (batch, m, size - 1), self.mask_token_id, dtype=input_ids.dtype, device=input_ids.device
        )
        block = torch.cat([input_ids.gather(1, anchor)[..., None], masks], dim=-1)  # [B, M, size]
        noise = self.embeddings(block.flatten(1)).to(self.device, dtype)
        positions = torch.cat(
            [
                torch.arange(length, device=starts.device)[None].expand(batch, -1),
                (anchor[:, :, None] + torch.arange(size, device=starts.device)).flatten(1),
            ],
            dim=1,
        )
        # Queries are the blocks only; keys are [context ; blocks]: block m sees the features of
        # its first anchor_m positions and itself (the rows of blocks_allowed past the sequence).
        allowed = blocks_allowed(length, anchor, size)[:, length:]
        mask = to_model_mask(allowed, self.model, dtype).to(self.device)
        hidden = self.model(
            noise_embeds=noise,
            context_hidden_states=features.to(self.device, dtype),
            attention_mask={"full_attention": mask, "sliding_attention": mask},
            position_ids=positions.to(self.device),
            use_cache=False,
        ).last_hidden_state
        rows = hidden.view(batch, m, size, -1)[:, :, 1 : 1 + gamma]
        return rows.to(self.head.weight.device, self.head.weight.dtype)

    @torch.no_grad()
    def propose(
        self,
        input_ids: torch.Tensor,
        gamma: int,
        num_drafts: int = 1,
        temperature: float = 1.0,
        generator: torch.Generator | None = None,
    ) -> Proposal:
        """Drafts of ``min(gamma, block_size - 1)`` tokens (the block it was trained with; its
        marginals change with the block's size), padded to ``gamma`` (the proposal's ``lengths``)."""
        if input_ids.shape[0] != 1:
            raise ValueError("the DFlash drafter drafts one sequence at a time (batch size 1)")
        home = input_ids.device
        window = min(gamma, self.block_size - 1)
        generator = derived_generator(generator, self.device)
        if self.draft_vocab is None:
            logits = self._restrict_logits(self.block_logits(input_ids, window)).to(self.device)
            proposal = sample_from_marginals(logits, num_drafts, temperature, generator)
        else:
            # the head's logits at the draft vocabulary only (compact, Proposal.support): nothing
            # else is proposed, and no full-vocabulary row is reduced
            compact = self.draft_vocab.compact_logits(self.head, self._block_rows(input_ids, window))[None]
            support = self.draft_vocab.ids.to(compact.device)
            if self.vocab_limit is not None:  # ids past the shared vocabulary are never proposed
                kept = int(torch.searchsorted(support, self.vocab_limit))
                compact, support = compact[..., :kept], support[:kept]
            proposal = sample_from_marginals(
                compact.to(self.device), num_drafts, temperature, generator, support, self.proposal_vocab_size
            )
        return proposal.pad_to(gamma).to(home)

    def __repr__(self) -> str:
        return (
            f"DFlashDrafter(layers={self.model.config.num_hidden_layers}, block_size={self.block_size}, "
            f"target_layer_ids={self.target_layer_ids}, mask_token_id={self.mask_token_id})"
        )
