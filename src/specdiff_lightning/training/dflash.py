"""Training a DFlash drafter (``models/dflash.py``, transformers' stock ``MuseGlimmerAssistantModel``)
against a frozen verifier: masked cross-entropy on blocks at random anchors, as DFlash trains, or
streak-distillation (METHOD.md §5); the verifier's reading and the objectives live in
``training/features.py``. The export is a transformers-layout DFlash checkpoint
(``export --layout zlab`` rewrites it in z-lab's layout for vLLM / SGLang).
"""

from __future__ import annotations

import torch

from ..models.dflash import DFlashDrafter
from ..models.loading import load_verifier, resolve_dtype
from .features import VerifierFeatureTraining

__all__ = ["DFlashDrafterTraining", "init_layers_from_verifier"]

# The verifier-layer tensors a DFlash layer can start from (same shapes; the DFlash layer's QK-norms
# and context projection have no counterpart and keep their initialisation).
_SHARED = (
    "self_attn.q_proj.weight",
    "self_attn.k_proj.weight",
    "self_attn.v_proj.weight",
    "self_attn.o_proj.weight",
    "mlp.gate_proj.weight",
    "mlp.up_proj.weight",
    "mlp.down_proj.weight",
    "input_layernorm.weight",
    "post_attention_layernorm.weight",
)


@torch.no_grad()
def init_layers_from_verifier(
    drafter: DFlashDrafter, verifier: torch.nn.Module, layer_ids: list[int]
) -> None:
    """Start drafter layer i from verifier decoder layer ``layer_ids[i]`` (its attention and MLP
    weights and norms, where names and shapes agree) and the drafter's final norm from the
    verifier's: a language model's weights instead of noise, for short training budgets."""
    layers = verifier.get_decoder().layers
    if len(layer_ids) != len(drafter.model.layers):
        raise ValueError(
            f"init_layers_from_verifier names {len(layer_ids)} verifier layers for a drafter of "
            f"{len(drafter.model.layers)} layers; give one verifier layer per drafter layer"
        )
    for own, i in zip(drafter.model.layers, layer_ids, strict=True):
        if not 0 <= i < len(layers):
            raise ValueError(
                f"init_layers_from_verifier: layer {i} is outside the verifier's 0..{len(layers) - 1}"
            )
        source = layers[i].state_dict()
        target = own.state_dict()
        for name in _SHARED:
            if name in source and name in target and source[name].shape == target[name].shape:
                target[name].copy_(source[name])
    drafter.model.norm.weight.copy_(verifier.get_decoder().norm.weight)


def _weights_dtype(name: str) -> torch.dtype:
    """The verifier's weight dtype from its name (the project's one name lookup, ``resolve_dtype``),
    refused unless it is a floating dtype ("auto" included: a training run names its dtype)."""
    dtype = resolve_dtype(name)
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise ValueError(
            f"verifier_dtype={name!r} is not a floating dtype of torch; give 'float32' or 'bfloat16'"
        )
    return dtype


class DFlashDrafterTraining(VerifierFeatureTraining):
    """Train a :class:`~specdiff_lightning.models.dflash.DFlashDrafter` against a frozen verifier.

    Args:
        verifier: a :func:`~specdiff_lightning.models.loading.load_verifier` spec.
        num_layers: the drafter's depth.
        target_layer_ids: the verifier layers (0-based, DFlash's convention: id i is layer i's
            output) whose hidden states the drafter reads.
        block_size: the block (the pending token plus ``block_size - 1`` masks; it drafts
            ``block_size - 1`` tokens).
        mask_token_id: an id the verifier never emits (SmolLM2: 16, ``<empty_output>``).
        init_layers_from: verifier layer ids whose weights start the drafter's layers (one per
            layer); None: the stock random initialisation.
        init_from: a saved DFlash drafter (either layout) to continue training.
        objective: ``"masked_ce"`` (DFlash's) or ``"streak"`` (streak-distillation).
        loss_decay: masked_ce weighted by ``exp(-(k - 1) / loss_decay)`` at block position k, as
            DFlash trains (SpecForge's trainer calls it loss_decay_gamma); None: the plain mean.
        blocks: blocks per sequence and step.
        anchors: where they start: ``"uniform"`` over the continuation (DFlash's), or
            ``"decode"``: where greedy decoding with the drafter as it is starts its rounds, right
            after its misses (on-policy; every anchor of the sequence is scored first, without
            gradients). Validation scores ``val/accepted`` at uniform anchors either way.
        targets: ``"corpus"`` (the record's tokens: the verifier's continuations) or ``"verifier"``
            (its teacher-forced argmax at every position, for any text).
        cache_features: keep each sequence's features after its first read (bf16, in memory).
        feature_store: a directory that keeps each sequence's verifier features on disk
            (:mod:`~specdiff_lightning.feature_store`): written on the first read, read back by
            the data module (``SequenceDataModule(feature_store=...)``, linked by the CLI) in later
            epochs and runs, so the verifier reads each training sequence once. None: no store.
        verifier_dtype: the frozen verifier's weights (``"float32"``, ``"bfloat16"``...). Under
            ``precision: bf16-mixed`` a bfloat16 verifier reads a batch faster (2 CPU cores with AMX:
            ~1.7 s against ~2.5 s for 8 sequences of ~300 tokens), with the features decoding in
            bfloat16 sees; the drafter's own weights stay float32 either way.
        val_decode_path: validation also logs ``val/decode_accepted``: what greedy decoding with
            the chain accepts a call along each held-out continuation (every anchor scored, the
            rounds walked as decoding takes them). ``val/accepted`` averages uniform anchors and
            overstates it (SmolLM2: 1.46 against 1.14); this costs a few times the validation.
        export_dir / export_dtype / overwrite_export: as every drafter training module.
    """

    def __init__(
        self,
        verifier: str = "smollm2-135m-instruct",
        num_layers: int = 3,
        target_layer_ids: tuple[int, ...] = (1, 8, 15, 22, 29),
        block_size: int = 16,
        mask_token_id: int = 16,
        init_layers_from: tuple[int, ...] | None = None,
        init_from: str | None = None,
        objective: str = "masked_ce",
        loss_decay: float | None = None,
        blocks: int = 16,
        draft_temperature: float = 1.0,
        lr: float = 6e-4,
        weight_decay: float = 0.0,
        warmup_steps: int = 20,
        seed: int = 0,
        targets: str = "corpus",
        cache_features: bool = True,
        feature_store: str | None = None,
        export_dir: str | None = None,
        export_dtype: str = "bfloat16",
        overwrite_export: bool = False,
        verifier_dtype: str = "float32",
        val_decode_path: bool = False,
        anchors: str = "uniform",
    ) -> None:
        super().__init__()
        self._check_objective(objective, targets, loss_decay, anchors)
        self.save_hyperparameters()
        frozen = load_verifier(verifier, dtype=_weights_dtype(verifier_dtype))
        self._hold_verifier(frozen)  # not a submodule: frozen, shared, never checkpointed
        if init_from:
            drafter = DFlashDrafter.from_pretrained(init_from, verifier=frozen, dtype=torch.float32)
        else:
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(seed)
                drafter = DFlashDrafter.build(
                    frozen,
                    num_layers,
                    tuple(target_layer_ids),
                    mask_token_id,
                    block_size,
                    dtype=torch.float32,
                )
            if init_layers_from is not None:
                init_layers_from_verifier(drafter, frozen, list(init_layers_from))
        self.drafter_model = drafter.model.train().requires_grad_(True)
        self.drafter = drafter
        self.window = drafter.block_size - 1
        self._generator = torch.Generator().manual_seed(seed)

    def export(self, path: str, dtype: torch.dtype | None = torch.bfloat16, layout: str = "hf") -> None:
        """Write the drafter as a DFlash checkpoint (never the verifier's embeddings or head) in
        ``dtype`` (None: as it is; the training copy is never cast) and ``layout``: ``"hf"``
        (transformers') or ``"zlab"`` (z-lab's, for vLLM / SGLang). With it goes the ranking of the
        tokens the verifier wrote in the training corpus (``draft_vocab.json``, from which a
        decoding ``head_vocab`` takes its ids), else the one the drafter started from."""
        import copy

        model = self.drafter.model if dtype is None else copy.deepcopy(self.drafter.model).to(dtype)
        DFlashDrafter(model, self.verifier, vocab_ranking=self._vocab_ranking()).save_pretrained(
            path, layout=layout
        )

    def _vocab_ranking(self) -> list[int] | None:
        trainer = self._trainer  # None outside a run (an export from a notebook)
        data = getattr(trainer, "datamodule", None) if trainer is not None else None
        if data is not None and hasattr(data, "answer_token_ranking"):
            return data.answer_token_ranking()
        return self.drafter.vocab_ranking
