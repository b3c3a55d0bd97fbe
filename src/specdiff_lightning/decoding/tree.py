"""Draft trees: K drafts merged into one prefix trie, scored by the verifier in one forward.

Node 0 is the *root*: the last committed token, which the verifier has not processed yet (its KV
is not in the cache). Every other node is a draft token. Nodes are stored parents-first, so an
accepted root-to-leaf path is an increasing index sequence and the cache can be compacted in place.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["DraftTree", "TreeProbs", "build_tree", "tree_attention_allowed", "path_probs", "tree_probs"]


@dataclass(frozen=True)
class DraftTree:
    """A flattened prefix trie.

    Attributes:
        tokens: ``LongTensor[n]`` node tokens; ``tokens[0]`` is the root.
        parents: ``LongTensor[n]`` parent index; the root is its own parent.
        depth: ``LongTensor[n]`` 0 for the root, j for the j-th draft token.
        paths: ``LongTensor[K, g]`` node index of draft k's j-th token; past the end of a shorter
            draft, its last node repeated.
        ancestors: ``BoolTensor[n, n]``; ``ancestors[i, j]`` iff node j is i or an ancestor of i.
    """

    tokens: torch.Tensor
    parents: torch.Tensor
    depth: torch.Tensor
    paths: torch.Tensor
    ancestors: torch.Tensor

    @property
    def size(self) -> int:
        return self.tokens.shape[0]


def build_tree(
    root_token: int | torch.Tensor, drafts: torch.Tensor, lengths: torch.Tensor | None = None
) -> DraftTree:
    """Merge drafts sharing prefixes into a trie.

    Args:
        root_token: the last committed token (the pending verifier input).
        drafts: ``LongTensor[K, g]`` (g may be 0: a root-only tree, i.e. plain decoding).
        lengths: ``LongTensor[K]`` each draft's length (``>= 1``; the tokens after it are padding and
            get no node), or None: all ``g``.
    """
    device = drafts.device
    num_drafts, gamma = drafts.shape
    root = int(root_token)
    tokens, parents, depth = [root], [0], [0]
    if num_drafts == 1 and lengths is None:
        # A single chain needs no trie lookups.
        tokens += drafts[0].tolist()
        parents += list(range(gamma))
        depth += list(range(1, gamma + 1))
        paths = [list(range(1, gamma + 1))]
    else:
        index: dict[tuple[int, int], int] = {}
        paths = []
        sizes = [gamma] * num_drafts if lengths is None else lengths.tolist()
        for row, size in zip(drafts.tolist(), sizes, strict=True):
            node, path = 0, []
            for j, tok in enumerate(row[:size]):
                child = index.get((node, tok))
                if child is None:
                    child = len(tokens)
                    index[(node, tok)] = child
                    tokens.append(tok)
                    parents.append(node)
                    depth.append(j + 1)
                node = child
                path.append(node)
            paths.append(path + path[-1:] * (gamma - len(path)))
    tokens_t = torch.tensor(tokens, dtype=torch.long, device=device)
    parents_t = torch.tensor(parents, dtype=torch.long, device=device)
    depth_t = torch.tensor(depth, dtype=torch.long, device=device)
    paths_t = torch.tensor(paths, dtype=torch.long, device=device).reshape(num_drafts, gamma)
    n = len(tokens)
    # Walk every node up to the root in lock-step: gamma + 1 vectorised steps instead of n.
    ancestors = torch.zeros(n, n, dtype=torch.bool, device=device)
    rows = torch.arange(n, device=device)
    cur = rows.clone()
    for _ in range(gamma + 1):
        ancestors[rows, cur] = True
        cur = parents_t[cur]
    return DraftTree(tokens_t, parents_t, depth_t, paths_t, ancestors)


def tree_attention_allowed(tree: DraftTree, past_length: int) -> torch.Tensor:
    """``BoolTensor[1, n, past_length + n]``: each node sees the whole cached prefix and its ancestors."""
    n = tree.size
    allowed = torch.ones(1, n, past_length + n, dtype=torch.bool, device=tree.tokens.device)
    allowed[0, :, past_length:] = tree.ancestors
    return allowed


def path_probs(node_probs: torch.Tensor, tree: DraftTree) -> torch.Tensor:
    """Distributions along each draft.

    Args:
        node_probs: ``FloatTensor[n, V]``; row i is ``p(. | prefix ⊕ path to node i)``.
    Returns:
        ``FloatTensor[K, g + 1, V]``: ``[k, j]`` is ``p(. | s ⊕ x^(k)_{<=j})``; ``[k, 0]`` is ``p(. | s)``
        and ``[k, g]`` is the bonus distribution after the whole draft.
    """
    num_drafts = tree.paths.shape[0]
    root = torch.zeros(num_drafts, 1, dtype=torch.long, device=tree.paths.device)
    return node_probs[torch.cat([root, tree.paths], dim=1)]


class TreeProbs:
    """``p`` along every draft without copying it: the lazy form of :func:`path_probs`.

    The trie has at most ``K·g + 1`` distinct rows (``node_probs[n, V]``, one verifier forward);
    :func:`path_probs` copies them into ``K·(g + 1)·V`` floats (with V = 152,064, K = 8, g = 32:
    160 MB in float32 per round) although acceptance reads K·g scalars and one or two rows. This
    holds the rows once plus ``index[..., g + 1]`` (node id of each (draft, position)) and answers
    the indexing the rules use by gathering from the trie rows:

    - keys on the leading (draft/position) dimensions give another :class:`TreeProbs` (or a row
      ``[V]`` when they select one node);
    - keys that reach the vocabulary dimension (``p[k, j, x]``, ``p[arange(g), draft]``) gather
      scalars directly from ``node_probs``;
    - any other use (a torch function, arithmetic, a method) materialises the dense tensor first,
      so code written for :func:`path_probs`'s tensor keeps working.
    """

    def __init__(self, node_probs: torch.Tensor, index: torch.Tensor) -> None:
        self.node_probs = node_probs
        self.index = index

    # -- tensor-like metadata
    @property
    def shape(self) -> torch.Size:
        return torch.Size((*self.index.shape, self.node_probs.shape[-1]))

    def size(self, dim: int | None = None):
        return self.shape if dim is None else self.shape[dim]

    def dim(self) -> int:
        return self.index.dim() + 1

    @property
    def dtype(self) -> torch.dtype:
        return self.node_probs.dtype

    @property
    def device(self) -> torch.device:
        return self.node_probs.device

    def __len__(self) -> int:
        return self.index.shape[0]

    def dense(self) -> torch.Tensor:
        """The materialised ``FloatTensor[..., V]`` (what :func:`path_probs` returns)."""
        return self.node_probs[self.index]

    def token_probs(self, tokens: torch.Tensor) -> torch.Tensor:
        """``p[..., j, tokens[..., j]]`` for ``tokens[..., g]`` against rows ``0..g-1``: K·g scalars."""
        return self.node_probs[self.index[..., : tokens.shape[-1]], tokens]

    def __getitem__(self, key):
        key = key if isinstance(key, tuple) else (key,)
        lead, rest = key[: self.index.dim()], key[self.index.dim() :]
        if any(k is Ellipsis or k is None for k in key):
            return self.dense()[key]
        nodes = self.index[lead]
        if rest:
            return self.node_probs[(nodes, *rest)]
        if nodes.dim() == 0:
            return self.node_probs[nodes]
        return type(self)(self.node_probs, nodes)

    # -- everything else: materialise
    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        def dense(x):
            if isinstance(x, TreeProbs):
                return x.dense()
            if isinstance(x, (list, tuple)):
                return type(x)(dense(v) for v in x)
            return x

        return func(*dense(args), **{k: dense(v) for k, v in (kwargs or {}).items()})

    def __getattr__(self, name):
        if name in ("node_probs", "index") or name.startswith("__"):
            raise AttributeError(name)
        return getattr(self.dense(), name)

    def __repr__(self) -> str:
        return f"TreeProbs(shape={tuple(self.shape)}, rows={self.node_probs.shape[0]})"


def _dense_binary(name):
    def op(self, other):
        other = other.dense() if isinstance(other, TreeProbs) else other
        return getattr(self.dense(), name)(other)

    return op


for _name in ("__add__", "__radd__", "__sub__", "__rsub__", "__mul__", "__rmul__", "__truediv__", "__rtruediv__",
              "__lt__", "__le__", "__gt__", "__ge__", "__eq__", "__ne__", "__pow__", "__matmul__"):  # fmt: skip
    setattr(TreeProbs, _name, _dense_binary(_name))
TreeProbs.__hash__ = None  # type: ignore[assignment]


def tree_probs(node_probs: torch.Tensor, tree: DraftTree) -> TreeProbs:
    """:func:`path_probs` without the copy: a :class:`TreeProbs` over the trie's rows.

    Acceptance rules given it read only what they need (K·g scalars for self-selection, one row per
    rejection or bonus token) instead of K·(g+1)·V floats; memory stays O(trie rows · V)."""
    num_drafts = tree.paths.shape[0]
    root = torch.zeros(num_drafts, 1, dtype=torch.long, device=tree.paths.device)
    return TreeProbs(node_probs, torch.cat([root, tree.paths], dim=1))
