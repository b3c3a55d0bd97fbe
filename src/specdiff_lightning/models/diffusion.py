"""Masked-diffusion drafters: one bidirectional forward over ``[prefix, MASK*gamma]`` (METHOD.md §2)."""

from __future__ import annotations

import copy
import math
import os

import torch
from torch import nn

from ..decoding.attention import check_custom_mask_support, to_model_mask
from ..decoding.drafting import Drafter, Proposal, derived_generator, sample_from_marginals
from ..decoding.sampling import logits_to_probs
from .families import DRAFTER_FAMILIES, SIDECAR_FILE, DrafterFamily, family_for_model_type

# Re-exported: the family registry lives in .families.
_MODEL_TYPE_TO_FAMILY = {t: name for name, spec in DRAFTER_FAMILIES.items() for t in spec.model_types}

__all__ = [
    "ATTENTION_MODES",
    "DiffusionDrafter",
    "DrafterFamily",
    "DRAFTER_FAMILIES",
    "SIDECAR_FILE",
    "block_causal_allowed",
    "blocks_allowed",
]

ATTENTION_MODES = ("bidirectional", "block_causal")


def block_causal_allowed(past: int, num_new: int, gamma: int, device=None) -> torch.Tensor:
    """``BoolTensor[num_new + gamma, past + num_new + gamma]``: who may attend whom when ``num_new``
    prefix tokens and a block of ``gamma`` masks run after ``past`` cached prefix tokens. Prefix rows
    are causal; mask rows see the whole prefix and the whole block."""
    q = num_new + gamma
    allowed = torch.ones(q, past + q, dtype=torch.bool, device=device)
    allowed[:num_new, past:] = torch.ones(num_new, q, dtype=torch.bool, device=device).tril()
    return allowed


def blocks_allowed(length: int, visible: torch.Tensor, gamma: int) -> torch.Tensor:
    """``BoolTensor[B, L + M*gamma, L + M*gamma]``: the training mask of many blocks over one sequence.

    The first ``length`` rows (the clean sequence) are causal; block m (``gamma`` rows appended after
    the sequence) sees the sequence's first ``visible[b, m]`` positions and itself, exactly what one
    cached decoding round sees (:func:`block_causal_allowed`)."""
    batch, m = visible.shape
    device = visible.device
    total = length + m * gamma
    allowed = torch.zeros(batch, total, total, dtype=torch.bool, device=device)
    allowed[:, :length, :length] = torch.ones(length, length, dtype=torch.bool, device=device).tril()
    key = torch.arange(length, device=device)
    sees_prefix = key[None, None, :] < visible[:, :, None]  # [B, M, L]
    allowed[:, length:, :length] = sees_prefix.repeat_interleave(gamma, dim=1)
    block = torch.arange(m * gamma, device=device) // gamma
    allowed[:, length:, length:] = (block[:, None] == block[None, :])[None]
    return allowed


def _config_token_ids(config, name: str) -> set[int]:
    value = getattr(config, name, None)
    if value is None:
        return set()
    return set(value) if isinstance(value, (list, tuple)) else {int(value)}


def _is_stock_transformers_model(model: nn.Module) -> bool:
    # A PEFT wrapper (LoRA fine-tuning) forwards our kwargs to the model it wraps.
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return type(base).__module__.startswith("transformers.models.")


class DiffusionDrafter(Drafter):
    """Wrap a HF model that denoises ``[prefix, MASK*gamma]`` in one bidirectional forward.

    Stock decoders (``Qwen2ForCausalLM``, ``LlamaForCausalLM``, ...) are run non-causally: they get
    a full (bidirectional) 4D attention mask and ``is_causal=False``. Remote-code diffusion models
    (Dream, LLaDA) already attend bidirectionally and get their own inputs.

    Args:
        model: the denoiser; its output must have ``.logits[B, L, V]``.
        mask_token_id: the ``[MASK]`` id (151666 for Dream/DiffuCoder, 811 DiffuLLaMA, 126336 LLaDA).
        shift_logits: True for models adapted from AR LMs (Dream/DiffuCoder, DiffuLLaMA): the logit
            at position i-1 predicts token i. False for LLaDA/MDLM.
        steps: denoising steps; 1 is the method's single pass (per-position marginals). More steps
            unmask the window progressively (most confident first); drafts are then no longer drawn
            from a product of marginals, so only q-free (``greedy``) acceptance stays exact.
        max_prefix_tokens: read at most this many trailing prefix tokens when there is no prefix cache
            (the uncached cost grows with the prefix). None: as much as its context allows.
        attention: ``"bidirectional"`` (Dream/DiffuCoder, LLaDA, DiffuLLaMA: every position sees every
            other) or ``"block_causal"`` (block-diffusion drafters: prefix positions attend causally, the
            mask block attends to the prefix and bidirectionally within itself).
        prefix_cache: keep a KV cache of the committed prefix across rounds, so each round runs only the
            newly accepted tokens plus the mask block (cost flat in the context length). Exact for
            ``block_causal`` drafters (the default there); for ``bidirectional`` ones an opt-in
            approximation (prefix positions stop seeing later tokens). Losslessness never depends on
            it, only acceptance does. None: on for ``block_causal``, off for ``bidirectional``.
    """

    def __init__(
        self,
        model: nn.Module,
        mask_token_id: int,
        shift_logits: bool,
        steps: int = 1,
        max_prefix_tokens: int | None = None,
        attention: str = "bidirectional",
        prefix_cache: bool | None = None,
    ) -> None:
        self.model = model
        config = model.config
        self.vocab_size = int(config.vocab_size)
        if not 0 <= int(mask_token_id) < self.vocab_size:
            raise ValueError(
                f"mask_token_id={mask_token_id} is outside the drafter's vocabulary [0, {self.vocab_size}). "
                f"Pass the drafter's own [MASK] id (e.g. DRAFTER_FAMILIES['dream'].mask_token_id) or add a "
                f"mask token to the tokenizer and resize the embeddings."
            )
        for name in ("pad_token_id", "eos_token_id"):
            if int(mask_token_id) in _config_token_ids(config, name):
                raise ValueError(
                    f"mask_token_id={mask_token_id} equals the drafter's {name}; the mask token must be a "
                    f"dedicated id, or masked positions would be read as padding / end of sequence."
                )
        if steps < 1:
            raise ValueError(f"steps must be >= 1, got {steps}")
        if max_prefix_tokens is not None and max_prefix_tokens < 1:
            raise ValueError(f"max_prefix_tokens must be >= 1 or None, got {max_prefix_tokens}")
        self.mask_token_id = int(mask_token_id)
        self.shift_logits = bool(shift_logits)
        self.steps = int(steps)
        self.max_prefix_tokens = max_prefix_tokens
        self.max_positions = getattr(config, "max_position_embeddings", None)
        if attention not in ATTENTION_MODES:
            raise ValueError(f"attention must be one of {ATTENTION_MODES}, got {attention!r}")
        self.attention = attention
        self.prefix_cache = (attention == "block_causal") if prefix_cache is None else bool(prefix_cache)
        self._stock = _is_stock_transformers_model(model)
        if self._stock:
            check_custom_mask_support(model, "drafter")
        elif attention == "block_causal" or self.prefix_cache:
            raise ValueError(
                "block-causal attention and the prefix cache need a stock transformers model (they pass "
                "a 4D mask and a cache); load the drafter into its stock class (family= in from_pretrained)"
            )
        self._cache = None
        self._cached_ids: list[int] = []

    # ------------------------------------------------------------------ loading / saving
    @classmethod
    def from_pretrained(
        cls,
        path: str | os.PathLike,
        family: str = "auto",
        *,
        verifier: nn.Module | None = None,
        mask_token_id: int | None = None,
        shift_logits: bool | None = None,
        steps: int = 1,
        max_prefix_tokens: int | None = None,
        **model_kwargs,
    ) -> DiffusionDrafter:
        """Load a drafter: a Hugging Face checkpoint (local directory or hub id) into a stock
        transformers class, or a slice of ``verifier`` saved by this project (``slice.json``).

        Args:
            family: ``"dream"`` (DiffuCoder/Dream), ``"diffullama"``, ``"llada"``, or ``"auto"``: read
                the ``specdiff_drafter.json`` written by :meth:`save_pretrained`, else infer the
                family from the raw ``config.json``'s ``model_type`` (``"Dream"``, ``"llada"``,
                ``"llama"``). Dream loads as ``Qwen2ForCausalLM``, LLaDA as ``LlamaForCausalLM``
                (config translated, tensors renamed on load): no code from the checkpoint runs
                unless you pass ``trust_remote_code=True`` (see ``models/families.py``). A checkpoint
                of another ``model_type`` loads with both ``mask_token_id`` and ``shift_logits`` given.
                A slice reads its own ``slice.json`` (``"auto"`` only).
            verifier: the verifier a slice was cut from (its embeddings are shared; the drafter takes
                its dtype). Needed for slices (``assets/smollm2/drafter``), ignored otherwise.
            mask_token_id, shift_logits: override the checkpoint's / family's values.
            model_kwargs: passed to ``from_pretrained`` (``dtype``, ``device_map``, ``attn_implementation``...);
                for a slice only ``dtype`` (the verifier's), ``attention`` and ``prefix_cache``.
        """
        from .families import load_drafter_model
        from .slicing import is_slice
        from .specs import resolve_pretrained

        if is_slice(path):
            from .kinds import load_slice_drafter

            if family != "auto":
                raise ValueError(
                    f"family={family!r} applies to Hugging Face checkpoints; {os.fspath(path)} is a saved "
                    f"slice that names its own settings (slice.json): drop family"
                )
            options = {"mask_token_id": mask_token_id, "shift_logits": shift_logits, "steps": steps}
            options.update(max_prefix_tokens=max_prefix_tokens, **model_kwargs)
            dtype = options.pop("dtype", None)
            options = {k: v for k, v in options.items() if v is not None}
            return load_slice_drafter(path, verifier, "diffusion", dtype, **options)
        path = resolve_pretrained(path, "drafter", **model_kwargs)
        from .dflash_format import dflash_layout

        if os.path.isdir(path) and dflash_layout(path) is not None:
            raise ValueError(
                f"{path} is a DFlash drafter, which drafts from its verifier's hidden states: load it with "
                f"DFlashDrafter.from_pretrained(path, verifier=...) or load_drafter(path, verifier=...)"
            )
        if os.path.isdir(path) and not os.path.isfile(os.path.join(path, "config.json")):
            raise ValueError(
                f"{path} is neither a Hugging Face checkpoint (no config.json) nor a saved drafter slice "
                f"(no slice.json)"
            )
        trust_remote_code = model_kwargs.pop("trust_remote_code", None)
        # Drafter options (not model ones) that may ride along in model_kwargs or the sidecar.
        drafter_options = {k: model_kwargs.pop(k) for k in ("attention", "prefix_cache") if k in model_kwargs}
        model, family, settings, config_dict = load_drafter_model(
            path,
            family,
            trust_remote_code=trust_remote_code,
            mask_token_id=mask_token_id,
            shift_logits=shift_logits,
            **model_kwargs,
        )
        if settings.get("attention") is not None:
            drafter_options.setdefault("attention", settings["attention"])
        spec = DRAFTER_FAMILIES.get(family)
        drafter = cls(
            model,
            mask_token_id=_first_not_none(
                mask_token_id,
                settings.get("mask_token_id"),
                config_dict.get("mask_token_id"),
                spec and spec.mask_token_id,
            ),
            shift_logits=_first_not_none(
                shift_logits, settings.get("shift_logits"), spec and spec.shift_logits
            ),
            steps=steps,
            max_prefix_tokens=_first_not_none(max_prefix_tokens, settings.get("max_prefix_tokens")),
            **drafter_options,
        )
        drafter.family = family
        return drafter

    @classmethod
    def from_slice(
        cls,
        verifier: nn.Module,
        path: str | os.PathLike,
        *,
        mask_token_id: int | None = None,
        shift_logits: bool | None = None,
        steps: int = 1,
        max_prefix_tokens: int | None = None,
        attention: str | None = None,
        prefix_cache: bool | None = None,
    ) -> DiffusionDrafter:
        """A diffusion slice saved by ``SliceDrafterTraining.export`` (``slice.json`` kind
        ``diffusion``), rebuilt around ``verifier``'s embeddings in its dtype; its mask id, logit
        shift and attention come from ``slice.json`` unless given."""
        from .slicing import load_slice

        model, info = load_slice(verifier, path)
        mask_token_id = _first_not_none(mask_token_id, info.get("mask_token_id"))
        if mask_token_id is None:
            raise ValueError(f"{os.fspath(path)}/slice.json names no mask_token_id: pass mask_token_id=")
        drafter = cls(
            model,
            mask_token_id,
            _first_not_none(shift_logits, info.get("shift_logits"), True),
            steps=steps,
            max_prefix_tokens=max_prefix_tokens,
            attention=_first_not_none(attention, info.get("attention"), "block_causal"),
            prefix_cache=prefix_cache,
        )
        drafter.family = None
        return drafter

    def save_pretrained(self, path: str | os.PathLike, family: str | None = None, **kwargs) -> None:
        """Save the model in its stock format (``save_pretrained``) plus the drafter settings needed
        to reload it; plain ``AutoModelForCausalLM.from_pretrained`` reloads the model too."""
        from .families import save_drafter_model

        if family is None and "family" not in vars(self):
            # built by the constructor: the family of its model_type (None on a loaded drafter means
            # "no family": its mask id and logit shift, saved below, say everything)
            family = family_for_model_type(getattr(self.model.config, "model_type", "")) or "diffullama"
        elif family is None:
            family = self.family
        settings = {
            "family": family,
            "mask_token_id": self.mask_token_id,
            "shift_logits": self.shift_logits,
            "max_prefix_tokens": self.max_prefix_tokens,
            "attention": self.attention,
        }
        save_drafter_model(self.model, path, settings, **kwargs)

    # ------------------------------------------------------------------ forward
    def _prefix_budget(self, gamma: int) -> int | None:
        budget = self.max_prefix_tokens
        if self.max_positions is not None:
            room = int(self.max_positions) - gamma
            if room < 1:
                raise ValueError(
                    f"gamma={gamma} leaves no room for a prefix in the drafter's context of "
                    f"{self.max_positions} positions; use a smaller gamma"
                )
            budget = room if budget is None else min(budget, room)
        return budget

    def denoise_logits(
        self,
        tokens: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        *,
        gamma: int | None = None,
        logits_to_keep: int = 0,
    ) -> torch.Tensor:
        """One forward over ``tokens[B, L]`` (``[prefix, MASK*gamma]``) -> ``logits[B, L', V]`` for the
        last ``logits_to_keep`` positions (0: all), unshifted.

        Bidirectional drafters see everything (``attention_mask`` marks padding keys, 1 = real);
        block-causal ones need ``gamma``, the size of the trailing mask block.
        """
        if not self._stock:
            return self.model(input_ids=tokens, attention_mask=attention_mask).logits[:, -logits_to_keep:]
        batch, length = tokens.shape
        positions = torch.arange(length, device=tokens.device)[None].expand(batch, -1)
        if self.attention == "block_causal":
            if gamma is None:
                raise ValueError("a block-causal drafter needs gamma (the mask block size)")
            allowed = block_causal_allowed(0, length - gamma, gamma, tokens.device)[None].expand(
                batch, -1, -1
            )
            if attention_mask is not None:
                allowed = allowed & attention_mask.bool()[:, None, :]
            mask = self._model_mask(allowed)
        elif attention_mask is None:
            # No padding: the kernel's own non-causal path, no L x L mask to build or read.
            mask = None
        else:
            allowed = attention_mask.bool()[:, None, :].expand(batch, length, length)
            mask = self._model_mask(allowed)
        return self._stock_logits(
            logits_to_keep,
            input_ids=tokens,
            attention_mask=mask,
            position_ids=positions,
            use_cache=False,
            is_causal=False,
        )

    def _base(self) -> nn.Module:
        # A PEFT wrapper (LoRA fine-tuning) holds the stock model.
        return self.model.get_base_model() if hasattr(self.model, "get_base_model") else self.model

    def _stock_logits(self, keep: int, **inputs) -> torch.Tensor:
        """The stock model's decoder, then its LM head on the last ``keep`` positions only (0: all).

        Not ``logits_to_keep``: transformers slices the hidden states at an offset, and a bfloat16 CPU
        matmul on such a 3-D view takes a slow path (SmolLM2's head: 36 ms instead of 2 ms for 9 rows,
        measured), which made a drafting round cost more than a verifier step. A fresh 2-D copy is fast."""
        base = self._base()
        hidden = base.get_decoder()(**inputs).last_hidden_state
        if keep:
            hidden = hidden[:, -keep:]
        rows = hidden.reshape(-1, hidden.shape[-1]).clone()
        return base.get_output_embeddings()(rows).view(hidden.shape[0], hidden.shape[1], -1)

    def _model_mask(self, allowed: torch.Tensor) -> torch.Tensor:
        return to_model_mask(allowed, self.model, next(self.model.parameters()).dtype)

    def _keep(self, gamma: int) -> int:
        """Rows of logits a window needs: the masks (and the last prefix position when shifted)."""
        return gamma + 1 if self.shift_logits else gamma

    def _window(self, logits: torch.Tensor, prefix_len: int, gamma: int) -> torch.Tensor:
        start = prefix_len - 1 if self.shift_logits else prefix_len
        return logits[:, start : start + gamma]

    def blocks_logits(self, input_ids: torch.Tensor, starts: torch.Tensor, gamma: int) -> torch.Tensor:
        """Training forward of a block-causal drafter: many windows of one sequence in one pass.

        ``input_ids[B, L]`` is clean text (run causally); for every ``starts[B, M]`` value t a block of
        ``gamma`` masks at positions t..t+gamma-1 sees ``input_ids[:, :t]`` and itself, exactly what the
        drafter sees at decoding time with prefix ``input_ids[:, :t]``. Returns ``logits[B, M, gamma, V]``
        of ``q_j(. | input_ids[:, :t])``, computing the LM head only on those rows. Needs ``1 <= t``
        (``t >= 1`` shifted) and ``t + gamma <= L + gamma``.
        """
        if self.attention != "block_causal" or not self._stock:
            raise ValueError("blocks_logits needs a stock block-causal drafter")
        batch, length = input_ids.shape
        m = starts.shape[1]
        device = input_ids.device
        j = torch.arange(gamma, device=device)
        block_pos = (starts[:, :, None] + j).reshape(batch, m * gamma)  # [B, M*g]
        masks = torch.full_like(block_pos, self.mask_token_id)
        tokens = torch.cat([input_ids, masks], dim=1)
        positions = torch.cat([torch.arange(length, device=device)[None].expand(batch, -1), block_pos], dim=1)
        allowed = blocks_allowed(length, starts, gamma)
        base = self._base()
        hidden = base.get_decoder()(
            input_ids=tokens,
            attention_mask=self._model_mask(allowed),
            position_ids=positions,
            use_cache=False,
        ).last_hidden_state
        if self.shift_logits:
            # q_1 from the last prefix position (causal), q_j (j >= 2) from mask j - 1 of the block.
            first = (starts - 1)[:, :, None]
            rest = (
                length + (torch.arange(m, device=device) * gamma)[None, :, None] + j[None, None, : gamma - 1]
            )
            rows = torch.cat([first, rest.expand(batch, -1, -1)], dim=2)
        else:
            rows = (length + (torch.arange(m, device=device) * gamma)[:, None] + j)[None].expand(
                batch, -1, -1
            )
        picked = hidden.gather(1, rows.reshape(batch, -1, 1).expand(-1, -1, hidden.shape[-1]))
        return base.lm_head(picked).reshape(batch, m, gamma, -1)

    def reset(self) -> None:
        self._cache = None
        self._cached_ids = []

    def with_steps(self, steps: int) -> DiffusionDrafter:
        """The same drafter (same weights) with another number of denoising steps."""
        if steps < 1:
            raise ValueError(f"steps must be >= 1, got {steps}")
        clone = copy.copy(self)
        clone.steps = int(steps)
        clone.reset()
        return clone

    def _cached_window_logits(self, input_ids: torch.Tensor, gamma: int) -> torch.Tensor:
        """Window logits for ``input_ids[1, L]`` reusing the prefix KV cache: runs the tokens not yet
        cached plus the mask block, then drops the masks' keys/values again."""
        from transformers import DynamicCache

        ids = input_ids[0].tolist()
        past = len(self._cached_ids)
        # The cache must hold a strict prefix of this prefix (the last token always runs: when shifted
        # its logit is q_1); otherwise roll back to the common part.
        if past >= len(ids) or self._cached_ids != ids[:past]:
            common = 0
            limit = min(past, len(ids) - 1)
            while common < limit and self._cached_ids[common] == ids[common]:
                common += 1
            if self._cache is not None and common < past:
                self._cache.crop(common - past)
            self._cached_ids = self._cached_ids[:common]
            past = common
        if self._cache is None:
            self._cache = DynamicCache()
        if self.max_positions is not None and len(ids) + gamma > int(self.max_positions):
            raise ValueError(
                f"prefix ({len(ids)} tokens) + gamma ({gamma}) exceeds the drafter's context of "
                f"{self.max_positions} positions; use a smaller gamma or a shorter prompt"
            )
        new = input_ids[:, past:]
        num_new = new.shape[1]
        masks = torch.full((1, gamma), self.mask_token_id, dtype=input_ids.dtype, device=input_ids.device)
        allowed = block_causal_allowed(past, num_new, gamma, input_ids.device)
        logits = self._stock_logits(
            self._keep(gamma),
            input_ids=torch.cat([new, masks], dim=1),
            attention_mask=self._model_mask(allowed[None]),
            position_ids=torch.arange(past, past + num_new + gamma, device=input_ids.device)[None],
            cache=self._cache,
            use_cache=True,
        )
        self._cache.crop(-gamma)
        self._cached_ids = ids
        return logits[:, :gamma]

    def _masked_input(self, input_ids: torch.Tensor, gamma: int, attention_mask: torch.Tensor | None):
        if input_ids.shape[1] == 0:
            raise ValueError("the drafter needs a non-empty prefix")
        budget = self._prefix_budget(gamma)
        if budget is not None and input_ids.shape[1] > budget:
            input_ids = input_ids[:, -budget:]
            attention_mask = None if attention_mask is None else attention_mask[:, -budget:]
        batch = input_ids.shape[0]
        masks = torch.full((batch, gamma), self.mask_token_id, dtype=input_ids.dtype, device=input_ids.device)
        tokens = torch.cat([input_ids, masks], dim=1)
        if attention_mask is not None:
            attention_mask = torch.cat(
                [attention_mask, torch.ones_like(masks, dtype=attention_mask.dtype)], dim=1
            )
        return tokens, attention_mask, input_ids.shape[1]

    @torch.no_grad()
    def draft_logits(
        self, input_ids: torch.Tensor, gamma: int, attention_mask: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Per-position draft logits for the ``gamma`` masked slots after ``input_ids[B, L]``.

        Returns ``FloatTensor[B, gamma, V]`` (the model's dtype): row j is the logit of ``q_j(. | s)``.
        Runs without gradients; training uses :meth:`window_logits`.
        """
        return self.window_logits(input_ids, gamma, attention_mask)

    def window_logits(
        self, input_ids: torch.Tensor, gamma: int, attention_mask: torch.Tensor | None = None
    ) -> torch.Tensor:
        """:meth:`draft_logits` without ``no_grad`` (for streak-distillation)."""
        if (
            self.prefix_cache
            and attention_mask is None
            and input_ids.shape[0] == 1
            and not torch.is_grad_enabled()
        ):
            return self._cached_window_logits(input_ids, gamma)
        tokens, mask, _ = self._masked_input(input_ids, gamma, attention_mask)
        keep = self._keep(gamma)
        return self.denoise_logits(tokens, mask, gamma=gamma, logits_to_keep=keep)[:, :gamma]

    @torch.no_grad()
    def propose(
        self,
        input_ids: torch.Tensor,
        gamma: int,
        num_drafts: int = 1,
        temperature: float = 1.0,
        generator: torch.Generator | None = None,
    ) -> Proposal:
        # Cross devices once per round: the context in, the proposal back (see Drafter.device).
        home = input_ids.device
        input_ids = input_ids.to(self.device)
        generator = derived_generator(generator, self.device)
        if self.steps == 1:
            logits = self._restrict_logits(self.draft_logits(input_ids, gamma))
            proposal = sample_from_marginals(logits, num_drafts, temperature, generator)
        else:
            proposal = self._propose_multistep(input_ids, gamma, num_drafts, temperature, generator)
        return proposal.to(home)

    def _propose_multistep(self, input_ids, gamma, num_drafts, temperature, generator) -> Proposal:
        """Progressive unmasking, most confident sampled tokens first, one trajectory per draft."""
        batch = input_ids.shape[0]
        tokens, _, prefix_len = self._masked_input(input_ids, gamma, None)
        tokens = tokens.repeat_interleave(num_drafts, dim=0)  # [B*K, L + gamma]
        probs = None
        masked = torch.ones(tokens.shape[0], gamma, dtype=torch.bool, device=tokens.device)
        per_step = math.ceil(gamma / self.steps)
        for step in range(self.steps):
            logits = self._restrict_logits(
                self._window(self.denoise_logits(tokens, gamma=gamma), prefix_len, gamma)
            )
            q = logits_to_probs(logits, temperature)  # [B*K, gamma, V]
            if probs is None:
                probs = torch.zeros_like(q)
            sampled = torch.multinomial(q.reshape(-1, q.shape[-1]), 1, generator=generator).reshape(
                q.shape[:2]
            )
            confidence = q.gather(-1, sampled[..., None]).squeeze(-1).masked_fill(~masked, -1.0)
            count = gamma if step == self.steps - 1 else min(per_step, gamma)
            chosen = confidence.topk(count, dim=-1).indices
            chosen_mask = torch.zeros_like(masked).scatter_(1, chosen, True) & masked
            window = tokens[:, prefix_len:]
            window[chosen_mask] = sampled[chosen_mask]
            probs[chosen_mask] = q[chosen_mask]
            masked &= ~chosen_mask
            if not masked.any():
                break
        window = tokens[:, prefix_len:].reshape(batch, num_drafts, gamma)
        return Proposal(window, probs.reshape(batch, num_drafts, gamma, -1), exact_q=False)

    def __repr__(self) -> str:
        return (
            f"DiffusionDrafter({type(self.model).__name__}, mask_token_id={self.mask_token_id}, "
            f"shift_logits={self.shift_logits}, steps={self.steps}, max_prefix_tokens={self.max_prefix_tokens}, "
            f"attention={self.attention!r}, prefix_cache={self.prefix_cache})"
        )


def _first_not_none(*values):
    for value in values:
        if value is not None:
            return value
    return None
