"""Decoding settings as one YAML-friendly object (LightningCLI ``model.decoding``)."""

from __future__ import annotations

import hashlib
import inspect
import json
from dataclasses import asdict, dataclass, replace

from .adaptive import AdaptiveDrafter
from .drafting import Drafter
from .lookup import LookupAugmentedDrafter

__all__ = ["DecodingConfig"]


@dataclass
class DecodingConfig:
    """Arguments of :func:`~specdiff_lightning.speculative_generate` for predict and bench.

    ``temperature=0`` is greedy decoding; ``acceptance`` is ``greedy`` (self-selection, any K),
    ``standard`` (K = 1) or ``recursive``. ``gamma=None`` (the default in configs) means the
    drafter's trained window: :class:`~specdiff_lightning.training.DrafterDistillation` fills in
    its ``gamma``, so a config names the window once.

    ``tree`` shapes each round's draft tree (``greedy`` acceptance only; lossless for any shape):
    ``auto`` (default) sizes it each round for this machine (the verifier's measured cost and the
    drafter's calibrated confidences, :mod:`~specdiff_lightning.decoding.autotree`: runner-ups,
    the K drafts and context copies join where they pay; plain decoding where nothing does); null
    keeps the drafts as drawn (K windows of gamma: what ``standard`` / ``recursive`` need); a
    mapping is a fixed shape, the options of :class:`~specdiff_lightning.decoding.AdaptiveDrafter`
    (``min_confidence``, ``siblings``, ``branch_width``, ``mode_first``), with ``lookup`` True or
    the options of :class:`~specdiff_lightning.decoding.LookupAugmentedDrafter` (``num_lookups``,
    ``ngram_lengths``, ``max_ngram``). In YAML::

        decoding:
          tree: auto                  # the default
        decoding:                     # a fixed shape (ablations)
          tree: {min_confidence: 0.1, siblings: [0]}
          lookup: {num_lookups: 2, ngram_lengths: {1: 2, 2: 5}}

    ``datastore`` (``tree: auto`` only): a corpus file of the verifier's answers, or a list of them
    (``.parquet`` or ``.jsonl`` records with ``continuation_ids``, as ``generate-corpus`` writes;
    e.g. the drafter's distillation corpora, indexed as one) whose continuations of the context's
    longest suffix join each round's candidates (:mod:`~specdiff_lightning.decoding.datastore`);
    null: none.

    ``compile``: score every tree through the verifier's compiled forward over a static KV cache
    (:mod:`~specdiff_lightning.decoding.compiled`): no framework overhead per round, after a
    one-time compile (minutes on a CPU with a cold inductor cache, seconds once cached); the
    output is the same.
    """

    max_new_tokens: int = 128
    gamma: int | None = None
    num_drafts: int = 1
    draft_temperature: float = 1.0
    acceptance: str = "greedy"
    temperature: float = 0.0
    top_k: int | None = None
    top_p: float | None = None
    seed: int = 0
    tree: dict | str | None = "auto"
    lookup: bool | dict = False
    datastore: str | list[str] | None = None
    compile: bool = False

    def __post_init__(self) -> None:
        from .acceptance import get_acceptance_rule
        from .generate import check_tree

        if not isinstance(self.compile, bool):
            raise ValueError(f"decoding.compile must be true or false, got {self.compile!r}")

        # a misspelt option fails here, naming the config key, not later inside a wrapper's __init__
        for name, value, wrapper in (
            ("tree", self.tree, AdaptiveDrafter),
            ("lookup", self.lookup, LookupAugmentedDrafter),
        ):
            if value is None or value is False or (name == "lookup" and value is True) or value == "auto":
                continue
            if not isinstance(value, dict):
                raise ValueError(
                    f"decoding.{name} must be a mapping of {wrapper.__name__} options, got {value!r}"
                )
            known = set(inspect.signature(wrapper).parameters) - {"base"}
            unknown = sorted(set(value) - known)
            if unknown:
                raise ValueError(
                    f"decoding.{name} has unknown option(s) {unknown}; {wrapper.__name__} takes {sorted(known)}"
                )
        if isinstance(self.tree, str):
            check_tree(self.tree, get_acceptance_rule(self.acceptance))  # 'auto' with greedy only
            if self.lookup:
                raise ValueError(
                    "decoding.lookup shapes a fixed tree (decoding.tree: a mapping or null); tree: auto "
                    "offers context copies itself. Drop decoding.lookup, or give a fixed decoding.tree"
                )
        if self.datastore is not None:
            if self.tree != "auto":
                raise ValueError(
                    "decoding.datastore joins the trees that tree: auto sizes; with a fixed decoding.tree "
                    "its continuations have no place. Use tree: auto, or set datastore: null"
                )
            from .datastore import load_datastore

            # read now (once per process): a missing or unreadable corpus fails at config time,
            # with the file named, not at the first decode
            load_datastore(self.datastore)

    def with_gamma(self, gamma: int) -> DecodingConfig:
        """This config, with ``gamma`` filled in where it was left unset."""
        return self if self.gamma is not None else replace(self, gamma=gamma)

    def generate_kwargs(self) -> dict:
        if self.gamma is None:
            raise ValueError("DecodingConfig.gamma is unset: give a draft window, or use with_gamma(...)")
        kwargs = asdict(self)
        for name in ("seed", "lookup"):  # not speculative_generate's: see shape_drafter
            kwargs.pop(name)
        # a fixed shape wraps the drafter (shape_drafter); 'auto' is the loop's own sizing
        kwargs["tree"] = "auto" if self.tree == "auto" else None
        return kwargs

    def shape_drafter(self, drafter: Drafter) -> Drafter:
        """``drafter`` wrapped to shape its drafts as a fixed ``tree`` and ``lookup`` say (itself if
        neither, or for ``tree: auto``, which :func:`speculative_generate` sizes each round)."""
        if isinstance(self.tree, dict) and self.tree:
            drafter = AdaptiveDrafter(drafter, **self.tree)
        if self.lookup:
            drafter = LookupAugmentedDrafter(
                drafter, **(self.lookup if isinstance(self.lookup, dict) else {})
            )
        return drafter

    def sampling_kwargs(self) -> dict:
        """The verifier-side arguments (shared with the verifier-only baseline)."""
        return {k: getattr(self, k) for k in ("max_new_tokens", "temperature", "top_k", "top_p", "compile")}

    def config_hash(self) -> str:
        return hashlib.sha1(json.dumps(asdict(self), sort_keys=True).encode()).hexdigest()[:12]
