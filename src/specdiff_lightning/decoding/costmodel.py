"""What a verifier forward costs on this machine: a table measured once, read every round.

A draft tree pays when the tokens it is expected to add outweigh what its nodes cost the verifier.
That cost is a property of the machine, the model and the dtype, not a constant: a 16-node forward
costs ~1.4 one-token steps where bf16 matrix units exist and ~7 where bf16 is emulated. So the loop
reads it from a :class:`CostModel`, measured on the machine (:mod:`.calibration`), and sizes each
round's tree with it (:mod:`.autotree`).
"""

from __future__ import annotations

import bisect
from dataclasses import asdict, dataclass, field

__all__ = ["CostModel", "isotonic", "COST_MODEL_VERSION"]

#: bumped whenever what a cost model holds or how it is measured changes: older files are stale
#: (3: timed through the loop's verifier state, keyed by its forward, eager or compiled; 4: eager
#: forwards timed under inference_mode, as the loop runs them)
COST_MODEL_VERSION = 4


def isotonic(values: list[float]) -> list[float]:
    """The non-decreasing sequence closest to ``values`` in least squares (pool adjacent violators).

    A forward over more tokens never costs less; timing noise can make a measured curve dip, which
    would make the tree sizing prefer a bigger tree for nothing."""
    blocks: list[list[float]] = []  # [sum, count]
    for v in values:
        blocks.append([float(v), 1.0])
        while len(blocks) > 1 and blocks[-2][0] / blocks[-2][1] > blocks[-1][0] / blocks[-1][1]:
            s, c = blocks.pop()
            blocks[-1][0] += s
            blocks[-1][1] += c
    out: list[float] = []
    for s, c in blocks:
        out += [s / c] * int(c)
    return out


def _interp(xs: list[float], ys: list[float], x: float) -> float:
    """Piecewise-linear through ``(xs, ys)``, extended linearly past both ends."""
    if len(xs) == 1:
        return ys[0]
    i = min(max(bisect.bisect_right(xs, x) - 1, 0), len(xs) - 2)
    x0, x1, y0, y1 = xs[i], xs[i + 1], ys[i], ys[i + 1]
    return y0 + (y1 - y0) * (x - x0) / (x1 - x0)


@dataclass
class CostModel:
    """A verifier's forward time over ``n`` new tokens (a tree of ``n`` nodes) after a KV cache of
    ``context`` tokens, measured at a grid of both.

    Attributes:
        nodes: the measured tree sizes, increasing, starting at 1 (a plain decoding step).
        contexts: the measured context lengths, increasing.
        verifier_ms: ``[len(contexts)][len(nodes)]`` median milliseconds, non-decreasing in n.
        key: what the table was measured for (machine, model, dtype, device; see
            :func:`~specdiff_lightning.decoding.calibration.calibration_key`).
        seconds: how long the measurement took.
    """

    nodes: list[int]
    contexts: list[int]
    verifier_ms: list[list[float]]
    key: dict = field(default_factory=dict)
    seconds: float = 0.0
    version: int = COST_MODEL_VERSION

    def __post_init__(self) -> None:
        if not self.nodes or self.nodes[0] != 1 or sorted(set(self.nodes)) != list(self.nodes):
            raise ValueError(f"nodes must be increasing and start at 1, got {self.nodes}")
        if not self.contexts or sorted(set(self.contexts)) != list(self.contexts):
            raise ValueError(f"contexts must be increasing, got {self.contexts}")
        if len(self.verifier_ms) != len(self.contexts) or any(
            len(row) != len(self.nodes) for row in self.verifier_ms
        ):
            raise ValueError("verifier_ms must hold one row per context and one entry per node count")
        if any(not (v > 0) for row in self.verifier_ms for v in row):
            raise ValueError("verifier_ms must be positive")

    def verifier_cost(self, nodes: int, context: int) -> float:
        """Milliseconds of a forward over ``nodes`` new tokens after ``context`` cached ones."""
        per_context = [_interp(self.nodes, row, nodes) for row in self.verifier_ms]
        return max(_interp(self.contexts, per_context, context), 1e-6)

    def step_cost(self, context: int) -> float:
        """Milliseconds of one plain decoding step (a one-node tree) after ``context`` tokens."""
        return self.verifier_cost(1, context)

    def relative(self, context: int) -> dict[int, float]:
        """``{n: cost(n) / cost(1)}`` at ``context``: the shape that decides the tree size."""
        step = self.step_cost(context)
        return {n: self.verifier_cost(n, context) / step for n in self.nodes}

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> CostModel:
        """Rebuild a saved model; raises ``ValueError`` (or ``KeyError``/``TypeError``) when the
        content is not a cost model of this version."""
        if data.get("version") != COST_MODEL_VERSION:
            raise ValueError(f"cost model version {data.get('version')!r}, expected {COST_MODEL_VERSION}")
        return cls(
            nodes=[int(n) for n in data["nodes"]],
            contexts=[int(c) for c in data["contexts"]],
            verifier_ms=[[float(v) for v in row] for row in data["verifier_ms"]],
            key=dict(data["key"]),
            seconds=float(data.get("seconds", 0.0)),
        )

    def summary(self, context: int | None = None) -> str:
        """One line: the step time and the relative cost of a few tree sizes."""
        context = self.contexts[0] if context is None else context
        rel = self.relative(context)
        shape = ", ".join(f"{n}: {r:.2f}x" for n, r in rel.items() if n in (2, 4, 8, 16, 32, 64))
        return f"{self.key.get('dtype', '?')}: step {self.step_cost(context):.1f} ms at {context} tokens; {shape}"
