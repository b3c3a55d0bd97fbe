"""Draft trees: K drafts merged into one prefix trie, scored by the verifier in one forward.

Node 0 is the *root*: the last committed token, which the verifier has not processed yet (its KV
is not in the cache). Every other node is a draft token. Nodes are stored parents-first, so an
accepted root-to-leaf path is an increasing index sequence and the cache can be compacted in place.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["DraftTree", "build_tree", "tree_attention_allowed", "path_probs"]


@dataclass(frozen=True)
class DraftTree:
    """A flattened prefix trie.

    Attributes:
        tokens: ``LongTensor[n]`` node tokens; ``tokens[0]`` is the root.
        parents: ``LongTensor[n]`` parent index; the root is its own parent.
        depth: ``LongTensor[n]`` 0 for the root, j for the j-th draft token.
        paths: ``LongTensor[K, g]`` node index of draft k's j-th token.
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


def build_tree(root_token: int | torch.Tensor, drafts: torch.Tensor) -> DraftTree:
    """Merge drafts sharing prefixes into a trie.

    Args:
        root_token: the last committed token (the pending verifier input).
        drafts: ``LongTensor[K, g]`` (g may be 0: a root-only tree, i.e. plain decoding).
    """
    device = drafts.device
    num_drafts, gamma = drafts.shape
    root = int(root_token)
    tokens, parents, depth = [root], [0], [0]
    if num_drafts == 1:
        # A single chain needs no trie lookups.
        tokens += drafts[0].tolist()
        parents += list(range(gamma))
        depth += list(range(1, gamma + 1))
        paths = [list(range(1, gamma + 1))]
    else:
        index: dict[tuple[int, int], int] = {}
        paths = []
        for row in drafts.tolist():
            node, path = 0, []
            for j, tok in enumerate(row):
                child = index.get((node, tok))
                if child is None:
                    child = len(tokens)
                    index[(node, tok)] = child
                    tokens.append(tok)
                    parents.append(node)
                    depth.append(j + 1)
                node = child
                path.append(node)
            paths.append(path)
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
