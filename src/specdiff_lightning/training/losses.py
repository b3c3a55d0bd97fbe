"""Training objectives for diffusion drafters (METHOD.md §5), as pure tensor functions.

Shapes: ``draft_logits[B, g, V]`` are the drafter's window logits (row k is ``q_k(. | s)``);
``targets[B, g]`` the verifier's continuation ``x_1..x_g`` with ``IGNORE_INDEX`` where a window ended
early (EOS / end of record); ``verifier_logprobs[B, g, V]`` are ``log p(. | s ⊕ x_<k)``.

Every objective has one signature, ``fn(draft_logits, targets, temperature=1.0,
verifier_logprobs=None) -> (loss, expected_streak[B])``: the scalar to minimise and the drafter's
expected accepted streak on the batch (the validation signal). An objective that needs the
verifier's distributions declares it with :func:`uses_verifier_logprobs`; the training loop then
computes them, and calls every objective the same way.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch
import torch.nn.functional as F

from ..constants import IGNORE_INDEX
from ..decoding.sampling import compute_dtype

__all__ = [
    "greedy_chain_accepted",
    "greedy_chain_streaks",
    "decode_path",
    "decode_path_streaks",
    "IGNORE_INDEX",
    "streak_loss",
    "expected_streak_loss",
    "ar_distillation_loss",
    "tv_loss",
    "forward_kl_loss",
    "masked_ce_loss",
    "mdm_corrupt",
    "mdm_loss",
    "streak_terms",
    "window_streak_terms",
    "uses_verifier_logprobs",
    "needs_verifier_logprobs",
    "LOSSES",
]


def _up(x: torch.Tensor) -> torch.Tensor:
    """Losses run in float32 at least (bf16/fp16 logits are upcast; float64 stays float64)."""
    return x.to(compute_dtype(x.dtype))


def _valid(targets: torch.Tensor) -> torch.Tensor:
    return targets != IGNORE_INDEX


#: rows of logits :class:`_TargetLogProbs` upcasts at a time (~25 MB of float32 at a 49k vocabulary)
_ROWS_PER_CHUNK = 128


class _TargetLogProbs(torch.autograd.Function):
    """``log softmax(logits / T)[x]`` row by row, in chunks of :data:`_ROWS_PER_CHUNK` rows.

    The same values and gradients as ``F.log_softmax(_up(logits) / T).gather(-1, x)``, without its
    float32 copies of the whole ``[rows, V]`` tensor: a drafter's training step scores thousands of
    rows over a 49k vocabulary (SmolLM2: 3,840 x 49,152 = 755 MB per float32 copy), and the
    several whole copies the plain expression allocates cost more than the drafter's forward and
    backward together (measured on 2 CPU cores: 3.5-5.5 s of a ~10 s step, much of it page
    faults). The gradient ``(onehot(x) - softmax) / T`` is recomputed chunk by chunk in backward
    and written in the logits' own dtype.
    """

    @staticmethod
    def forward(ctx, logits: torch.Tensor, targets: torch.Tensor, temperature: float) -> torch.Tensor:
        flat, index = logits.reshape(-1, logits.shape[-1]), targets.reshape(-1, 1).clamp_min(0)
        out = torch.empty(flat.shape[0], dtype=compute_dtype(logits.dtype), device=logits.device)
        for s in range(0, flat.shape[0], _ROWS_PER_CHUNK):
            up = _up(flat[s : s + _ROWS_PER_CHUNK]) / temperature
            picked = up.gather(-1, index[s : s + _ROWS_PER_CHUNK]).squeeze(-1)
            out[s : s + _ROWS_PER_CHUNK] = picked - torch.logsumexp(up, dim=-1)
        ctx.save_for_backward(logits, targets)
        ctx.temperature = temperature
        return out.view(targets.shape)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        logits, targets = ctx.saved_tensors
        flat, index = logits.reshape(-1, logits.shape[-1]), targets.reshape(-1, 1).clamp_min(0)
        scale = grad.reshape(-1, 1) / ctx.temperature
        out = torch.empty_like(flat)
        for s in range(0, flat.shape[0], _ROWS_PER_CHUNK):
            rows = slice(s, s + _ROWS_PER_CHUNK)
            g = torch.softmax(_up(flat[rows]) / ctx.temperature, dim=-1).neg_()
            g.scatter_add_(-1, index[rows], torch.ones_like(index[rows], dtype=g.dtype))
            out[rows] = g.mul_(scale[rows].to(g.dtype))
        return out.view_as(logits), None, None


def _target_logprobs(draft_logits: torch.Tensor, targets: torch.Tensor, temperature: float) -> torch.Tensor:
    """``log q_k(x_k)`` (0 at ignored positions), in at least float32, computed in row chunks
    (:class:`_TargetLogProbs`)."""
    picked = _TargetLogProbs.apply(draft_logits, targets, float(temperature))
    return picked.masked_fill(~_valid(targets), 0.0)


def streak_terms(log_factors: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """``P_j = prod_{k<=j} factor_k`` from log-factors, via a cumulative log-sum (stable for g = 32);
    0 at invalid positions. ``[B, g] -> [B, g]``."""
    return torch.exp(torch.cumsum(log_factors, dim=-1)) * valid


def uses_verifier_logprobs(fn: Callable) -> Callable:
    """Declare that objective ``fn`` reads ``verifier_logprobs`` (it then refuses ``None``)."""

    @functools.wraps(fn)
    def checked(draft_logits, targets, temperature=1.0, verifier_logprobs=None):
        if verifier_logprobs is None:
            raise ValueError(f"{fn.__name__} needs verifier_logprobs [B, g, V] (log p(. | s ⊕ x_<k))")
        return fn(draft_logits, targets, temperature, verifier_logprobs)

    checked.needs_verifier_logprobs = True
    return checked


def needs_verifier_logprobs(fn: Callable) -> bool:
    """Whether objective ``fn`` was declared with :func:`uses_verifier_logprobs`."""
    return bool(getattr(fn, "needs_verifier_logprobs", False))


def window_streak_terms(
    draft_logits: torch.Tensor, targets: torch.Tensor, temperature: float = 1.0
) -> torch.Tensor:
    """``P_j = prod_{k<=j} q_k(x_k | s)``, j = 1..g: the probability that greedy acceptance keeps
    the first j draft tokens when the verifier's path is ``x`` (``[B, g]``, 0 past the window's
    end). Summed over j: the expected streak; per position: the positional acceptance counts."""
    return streak_terms(_target_logprobs(draft_logits, targets, temperature), _valid(targets))


def streak_loss(
    draft_logits: torch.Tensor,
    targets: torch.Tensor,
    temperature: float = 1.0,
    verifier_logprobs: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Streak-distillation (Def. 5.1): ``-E[ sum_j prod_{k<=j} q_k(x_k | s) ]`` along verifier paths.

    Its expectation over ``x ~ P(. | s)`` equals the expected accepted length of a draft sampled
    from ``prod q_k`` under greedy acceptance.
    """
    streak = window_streak_terms(draft_logits, targets, temperature).sum(-1)
    return -streak.mean(), streak.detach()


@uses_verifier_logprobs
def expected_streak_loss(
    draft_logits: torch.Tensor,
    targets: torch.Tensor,
    temperature: float = 1.0,
    verifier_logprobs: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The lower-variance variant: the last factor of each term replaced by its expectation,
    ``sum_j (prod_{k<j} q_k(x_k)) <q_j, p_j>`` with ``p_j = p(. | s ⊕ x_<j)``.

    Unbiased for :func:`streak_loss` (E[q_j(x_j) | x_<j] = <q_j, p_j>, Eq. 5a). Replacing *every*
    factor by its inner product, as a literal reading of METHOD.md §5 suggests, is biased: for
    g = 2 it gives <q_1,p_1> E[<q_2,p_2>] instead of E[q_1(x_1) <q_2,p_2>].
    """
    valid = _valid(targets)
    logq_all = F.log_softmax(_up(draft_logits) / temperature, dim=-1)
    log_inner = torch.logsumexp(logq_all + _up(verifier_logprobs), dim=-1).masked_fill(~valid, 0.0)
    logq_x = logq_all.gather(-1, targets.clamp_min(0)[..., None]).squeeze(-1).masked_fill(~valid, 0.0)
    before = torch.cumsum(logq_x, dim=-1) - logq_x  # sum_{k<j} log q_k(x_k)
    streak = (torch.exp(before + log_inner) * valid).sum(-1)
    return -streak.mean(), streak.detach()


def greedy_chain_accepted(draft_logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """``LongTensor[B]``: leading positions where the drafter's argmax equals the verifier's token
    (``targets[B, g]``, ``IGNORE_INDEX`` past the end): what greedy acceptance keeps of the argmax
    chain when the verifier's path is ``targets``."""
    hit = (draft_logits.argmax(-1) == targets) & _valid(targets)
    return hit.long().cumprod(-1).sum(-1)


def greedy_chain_streaks(rows: torch.Tensor, head: torch.nn.Module, targets: torch.Tensor) -> torch.Tensor:
    """:func:`greedy_chain_accepted` from the drafter's hidden rows ``[N, g, H]`` before its
    ``head``, scoring position j only for the blocks whose first j positions matched: the head runs
    on about (mean streak + 1) rows a block instead of g, which makes scoring every anchor of a
    sequence affordable. ``LongTensor[N]``."""
    streaks = torch.zeros(rows.shape[0], dtype=torch.long, device=targets.device)
    alive = torch.arange(rows.shape[0], device=targets.device)
    for j in range(rows.shape[1]):
        if alive.numel() == 0:
            break
        tokens = head(rows[alive.to(rows.device), j]).argmax(-1).to(targets.device)
        hit = (tokens == targets[alive, j]) & _valid(targets[alive, j])
        alive = alive[hit]
        streaks[alive] += 1
    return streaks


def decode_path(streaks: torch.Tensor) -> torch.Tensor:
    """``LongTensor[R]``: the anchors greedy decoding starts its rounds from along one sequence,
    as indices into ``streaks[T]``, the greedy chain's accepted length at every consecutive anchor
    (anchor 0: the first decoding round). A round that accepts s tokens emits s + 1, so the next
    round starts s + 1 anchors on.

    Decoding starts its rounds right after the drafter's misses, so the streaks on this path are
    shorter on average than at uniform anchors (which land inside long easy stretches more often):
    on SmolLM2's corpus 1.10 against 1.56, the first what the decoding loop accepts."""
    path, i = [], 0
    values = streaks.tolist()
    while i < len(values):
        path.append(i)
        i += values[i] + 1
    return torch.tensor(path, dtype=torch.long)


def decode_path_streaks(streaks: torch.Tensor) -> torch.Tensor:
    """``LongTensor[R]``: the streaks of the rounds on :func:`decode_path`."""
    return streaks.cpu()[decode_path(streaks)]


def _with_streak(loss, draft_logits, targets, temperature):
    with torch.no_grad():
        _, streak = streak_loss(draft_logits, targets, temperature)
    return loss, streak


def ar_distillation_loss(
    draft_logits: torch.Tensor,
    targets: torch.Tensor,
    temperature: float = 1.0,
    verifier_logprobs: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The "AR-distillation" baseline: the window-1 objective (aligns only the first position)."""
    loss, _ = streak_loss(draft_logits[:, :1], targets[:, :1], temperature)
    return _with_streak(loss, draft_logits, targets, temperature)


def _position_mean(values: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    return (values * valid).sum() / valid.sum().clamp_min(1)


@uses_verifier_logprobs
def tv_loss(
    draft_logits: torch.Tensor,
    targets: torch.Tensor,
    temperature: float = 1.0,
    verifier_logprobs: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """DistillSpec-style baseline: position-averaged total variation ``1 - sum_x min(p, q)``."""
    q = F.softmax(_up(draft_logits) / temperature, dim=-1)
    tv = 1 - torch.minimum(q, _up(verifier_logprobs).exp()).sum(-1)
    return _with_streak(_position_mean(tv, _valid(targets)), draft_logits, targets, temperature)


@uses_verifier_logprobs
def forward_kl_loss(
    draft_logits: torch.Tensor,
    targets: torch.Tensor,
    temperature: float = 1.0,
    verifier_logprobs: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """DistillSpec-style baseline: position-averaged forward KL ``KL(p || q)``."""
    logq = F.log_softmax(_up(draft_logits) / temperature, dim=-1)
    logp = _up(verifier_logprobs)
    kl = (logp.exp() * (logp - logq)).nan_to_num(0.0).sum(-1)  # 0 * -inf where p = 0
    return _with_streak(_position_mean(kl, _valid(targets)), draft_logits, targets, temperature)


def masked_ce_loss(
    draft_logits: torch.Tensor,
    targets: torch.Tensor,
    temperature: float = 1.0,
    verifier_logprobs: torch.Tensor | None = None,
    decay: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Cross-entropy on the verifier's tokens at the masked positions: their plain mean, or with
    ``decay`` (DFlash's position decay) the mean weighted by ``exp(-(k - 1) / decay)`` at window
    position k = 1..g, since a token is only accepted after every earlier one was: the first
    positions carry most of the accepted length."""
    if decay is not None and decay <= 0:
        raise ValueError(f"decay must be > 0 (or None: no decay), got {decay}")
    # cross-entropy is -log q_k(x_k): the same chunked log-probabilities give the loss and the
    # streak, so the [rows, V] logits are read twice (forward, backward), never copied whole
    logq = _target_logprobs(draft_logits, targets, temperature)
    valid = _valid(targets)
    weights = valid.to(logq.dtype)
    if decay:
        k = torch.arange(targets.shape[1], device=logq.device, dtype=logq.dtype)
        weights = torch.exp(-k / decay).expand_as(logq) * weights
    ce = -(logq * weights).sum() / weights.sum().clamp_min(1e-12)
    return ce, streak_terms(logq.detach(), valid).sum(-1)


def mdm_corrupt(
    tokens: torch.Tensor,
    mask_token_id: int,
    eps: float = 1e-3,
    valid: torch.Tensor | None = None,
    generator: torch.Generator | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Forward process of the MDM objective: ``t ~ U(eps, 1]``, mask each token with probability t.

    Returns ``(noisy[B, L], masked[B, L] bool, t[B])``; never masks invalid (padding) positions.
    """
    batch = tokens.shape[0]
    t = eps + (1 - eps) * torch.rand(batch, generator=generator, device=tokens.device)
    masked = torch.rand(tokens.shape, generator=generator, device=tokens.device) < t[:, None]
    if valid is not None:
        masked &= valid
    return tokens.masked_fill(masked, mask_token_id), masked, t


def mdm_loss(
    logits: torch.Tensor, tokens: torch.Tensor, masked: torch.Tensor, t: torch.Tensor, shift_logits: bool
) -> torch.Tensor:
    """MDLM/LLaDA pretraining/adaptation loss: cross-entropy on masked tokens weighted by 1/t,
    normalised by the number of tokens. ``logits[B, L, V]`` from the model on the noisy input; with
    ``shift_logits`` the logit at i-1 predicts token i (the DiffuCoder/DiffuLLaMA convention)."""
    if shift_logits:
        logits, tokens, masked = logits[:, :-1], tokens[:, 1:], masked[:, 1:]
    ce = F.cross_entropy(_up(logits).transpose(1, 2), tokens, reduction="none")  # [B, L]
    weighted = (ce * masked) / t[:, None]
    return weighted.sum() / tokens.numel()


#: loss name -> objective ``fn(draft_logits, targets, temperature=1.0, verifier_logprobs=None)``
#: (register your own here; see :func:`uses_verifier_logprobs`)
LOSSES: dict[str, Callable] = {
    "streak": streak_loss,
    "expected_streak": expected_streak_loss,
    "ar_distillation": ar_distillation_loss,
    "tv": tv_loss,
    "forward_kl": forward_kl_loss,
    "masked_ce": masked_ce_loss,
}
