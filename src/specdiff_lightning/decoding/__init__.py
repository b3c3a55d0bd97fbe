"""Decoding: drafting, draft trees, acceptance rules and the generate loops."""

from .acceptance import (
    ACCEPTANCE_RULES,
    AcceptanceRule,
    GreedyAcceptance,
    RecursiveAcceptance,
    StandardAcceptance,
    Verdict,
    accept_greedy,
    accept_recursive,
    accept_standard,
    expected_accepted_length,
    get_acceptance_rule,
)
from .drafting import Drafter, Proposal, sample_from_marginals
from .generate import speculative_generate, verifier_generate
from .sampling import logits_to_probs, sample_tokens
from .stats import DecodingStats, GenerationOutput, RoundStats
from .tree import DraftTree, TreeProbs, build_tree, path_probs, tree_attention_allowed, tree_probs
from .validation import check_tokenizers
from .verifier import TreeVerifier

__all__ = [
    "ACCEPTANCE_RULES",
    "AcceptanceRule",
    "DecodingStats",
    "DraftTree",
    "Drafter",
    "GenerationOutput",
    "GreedyAcceptance",
    "Proposal",
    "RecursiveAcceptance",
    "RoundStats",
    "StandardAcceptance",
    "TreeProbs",
    "TreeVerifier",
    "Verdict",
    "accept_greedy",
    "accept_recursive",
    "accept_standard",
    "build_tree",
    "check_tokenizers",
    "expected_accepted_length",
    "get_acceptance_rule",
    "logits_to_probs",
    "path_probs",
    "sample_from_marginals",
    "sample_tokens",
    "speculative_generate",
    "tree_attention_allowed",
    "tree_probs",
    "verifier_generate",
]
