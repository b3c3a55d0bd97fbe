"""Shipped verifier + drafter pairs, loaded in one call with the settings recommended for them.

>>> pair = load_pair("smollm2-135m-instruct")            # dtype "auto": the fastest here
>>> out = pair.generate("Write a Python function that reverses a string.", max_new_tokens=64)
>>> print(pair.decode(out))

``generate`` decodes through :func:`~specdiff_lightning.speculative_generate` with greedy
(lossless) acceptance and ``tree="auto"``: each round's draft tree is sized for this machine from
its measured verifier cost, so on a machine where drafting does not pay it decodes as plain
decoding does. A pair that ships its distillation corpus offers that corpus's continuations as
candidates too (``datastore``).

``compile="auto"`` (the default) decodes through the verifier's compiled forward wherever
``torch.compile`` can build kernels (a C++ compiler on a CPU, Triton on a GPU): plain decoding's
fastest form is compiled, and an eager loop, whatever its trees, does not keep up with it on the
CPUs measured (docs/results.md). The first call in a process compiles first (about two minutes on
a 2-core CPU; :meth:`LoadedPair.warm` does it up front); ``compile=False`` decodes eagerly at once.
"""

from __future__ import annotations

import logging
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import torch

__all__ = ["PairSpec", "SHIPPED_PAIRS", "LoadedPair", "load_pair", "assets_dir"]

log = logging.getLogger(__name__)


def assets_dir() -> Path:
    """The repository's ``assets/`` (the shipped drafters live beside the package's source)."""
    return Path(__file__).resolve().parents[2] / "assets"


@dataclass(frozen=True)
class PairSpec:
    """One shipped pair: the verifier's spec, the drafter's folder under :func:`assets_dir`, its
    loading options, the decoding settings recommended for it and the corpus files (under
    :func:`assets_dir`) whose continuations join its trees (``datastore``, indexed as one; empty:
    none)."""

    verifier: str
    drafter: str
    summary: str
    drafter_options: dict = field(default_factory=dict)
    decoding: dict = field(default_factory=dict)
    datastore: tuple[str, ...] = ()


#: name -> pair; a name is what ``load_pair`` takes
SHIPPED_PAIRS: dict[str, PairSpec] = {
    "smollm2-135m-instruct": PairSpec(
        verifier="smollm2-135m-instruct",
        drafter="smollm2/drafter_dflash",
        summary="SmolLM2-135M-Instruct + its 3-layer DFlash drafter reading the verifier's hidden states",
        # the head over the first 8,192 ids when decoding: docs/drafters.md
        drafter_options={"head_vocab": 8192},
        # drafts at T=0: the tree takes the drafter's mode chain and runner-ups (what bench measures)
        decoding={"gamma": 8, "acceptance": "greedy", "tree": "auto", "draft_temperature": 0.0},
        # the verifier's own answers to 32,040 function prompts (the DFlash drafter's two corpora,
        # 3.8M answer tokens, one index): 3.11 tokens a round against 2.94 with the first alone,
        # +7% tokens a second (dev split, docs/results.md stop 46)
        datastore=("smollm2/corpus_dflash_1m.parquet", "smollm2/corpus_dflash_gpu.parquet"),
    ),
}


@dataclass
class LoadedPair:
    """A verifier, its drafter and tokenizer, in ``dtype``, ready to decode (through the compiled
    forward when ``compile``)."""

    name: str
    verifier: torch.nn.Module
    drafter: object
    tokenizer: object
    dtype: torch.dtype
    decoding: dict
    compile: bool = False
    #: seconds :meth:`warm` took in this process (None: not compiled yet)
    compile_seconds: float | None = None

    def encode(self, prompt: str) -> torch.Tensor:
        """``LongTensor[1, L]``: ``prompt`` as a user turn through the chat template."""
        from .data.tokenization import encode_prompt

        return torch.tensor([encode_prompt(self.tokenizer, prompt)], device=self.verifier.device)

    def generate(
        self, input_ids: torch.Tensor | str, max_new_tokens: int = 128, temperature: float = 0.0, **overrides
    ):
        """Decode ``input_ids`` (``LongTensor[1, L]``, or a prompt string for the chat template) with
        the recommended settings; ``overrides`` go to :func:`speculative_generate` (``compile=False``
        decodes eagerly). Returns what it returns (a :class:`~specdiff_lightning.GenerationOutput`)."""
        from .decoding.generate import speculative_generate

        if isinstance(input_ids, str):
            input_ids = self.encode(input_ids)
        kwargs = {**self.decoding, "compile": self.compile, **overrides}
        if kwargs["compile"] is True:
            self.warm()
        return speculative_generate(
            self.verifier,
            self.drafter,
            input_ids,
            max_new_tokens=max_new_tokens,
            temperature=temperature,
            **kwargs,
        )

    def warm(self) -> float:
        """Compile the verifier's tree forward and the drafter's round now, as the first compiled
        call would, and with ``tree="auto"`` the compiled forward's cost model (measured once per
        machine, ~10 s, then read from the disk cache); the seconds it took (a process compiles
        once: later calls return at once)."""
        from .decoding.compiled import warm_decoding

        if self.compile_seconds is None:
            log.warning(
                "%s: compiling the verifier's forward and the drafter's round for this process (once; "
                "minutes on a CPU); load_pair(..., compile=False) decodes eagerly without this wait, "
                "slower per token",
                self.name,
            )
            self.compile_seconds = warm_decoding(
                self.verifier, drafter=self.drafter, tree_auto=self.decoding.get("tree") == "auto"
            )
            log.warning("%s: compiled in %.0f s", self.name, self.compile_seconds)
        return self.compile_seconds

    def decode(self, output, prompt_length: int | None = None) -> str:
        """The generated text of ``output`` (a :class:`GenerationOutput`), special tokens dropped."""
        new = output.sequences[0, -output.stats.new_tokens :] if output.stats.new_tokens else []
        return self.tokenizer.decode(new, skip_special_tokens=True)


def load_pair(
    name: str,
    dtype: str | torch.dtype = "auto",
    assets: str | Path | None = None,
    compile: bool | str = "auto",
) -> LoadedPair:
    """Load a shipped pair by name (:data:`SHIPPED_PAIRS`) in ``dtype`` ("auto": the fastest on
    this machine for the forward it decodes through, compiled or eager, measured once and cached;
    compiled, the first load on a machine compiles the verifier in each dtype its eager prices
    leave in the running). ``compile``: decode through the verifier's compiled
    forward (True), eagerly (False), or "auto": compiled wherever ``torch.compile`` can build kernels
    for the verifier's device, eagerly (with a warning naming the missing piece) elsewhere."""
    from transformers import AutoTokenizer

    from .decoding.compiled import compile_unavailable
    from .models.dflash import DFlashDrafter
    from .models.dflash_format import dflash_layout
    from .models.loading import NAMED_VERIFIERS, load_verifier

    if name not in SHIPPED_PAIRS:
        raise ValueError(f"unknown pair {name!r}; the shipped pairs are {sorted(SHIPPED_PAIRS)}")
    if not (isinstance(compile, bool) or compile == "auto"):
        raise ValueError(
            f"compile must be True, False or 'auto' (compiled where torch.compile works), got {compile!r}"
        )
    spec = SHIPPED_PAIRS[name]
    path = Path(assets) if assets is not None else assets_dir()
    drafter_dir = path / spec.drafter
    if dflash_layout(drafter_dir) is None:
        raise FileNotFoundError(
            f"the shipped drafter of {name!r} is missing ({drafter_dir}); load_pair reads it from the "
            f"repository's assets/ (install with `pip install -e .` from a clone), or pass assets="
        )
    decoding = dict(spec.decoding)
    if spec.datastore:
        files = [path / f for f in spec.datastore]
        absent = [str(f) for f in files if not f.is_file()]
        if absent:
            raise FileNotFoundError(f"the shipped corpus of {name!r} is missing ({', '.join(absent)})")
        decoding["datastore"] = [str(f) for f in files]
    if compile == "auto":
        missing = compile_unavailable(torch.device("cpu"))  # where load_verifier puts the verifier
        if missing is not None:
            warnings.warn(f"load_pair({name!r}) decodes eagerly: {missing}", stacklevel=2)
        compile = missing is None
    # dtype "auto" compares the forward this pair decodes through: the compiled one where it compiles
    verifier = load_verifier(spec.verifier, dtype=dtype, compiled=compile)
    drafter = DFlashDrafter.from_pretrained(drafter_dir, verifier=verifier, **spec.drafter_options)
    source = NAMED_VERIFIERS[spec.verifier]() if spec.verifier in NAMED_VERIFIERS else spec.verifier
    tokenizer = AutoTokenizer.from_pretrained(source)
    return LoadedPair(name, verifier, drafter, tokenizer, verifier.dtype, decoding, compile)
