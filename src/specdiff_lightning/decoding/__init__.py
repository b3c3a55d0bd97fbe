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
from .adaptive import AdaptiveDrafter, confident_lengths
from .datastore import TokenDatastore, load_datastore
from .drafting import Drafter, DrafterWrapper, Proposal, sample_from_marginals
from .generate import speculative_generate, verifier_generate
from .lookup import LookupAugmentedDrafter, lookup_continuations
from .sampling import logits_to_probs, sample_tokens
from .stats import DecodingStats, GenerationOutput, RoundStats
from .tree import DraftTree, TreeProbs, build_tree, path_probs, tree_attention_allowed, tree_probs
from .validation import check_tokenizers
from .verifier import TreeVerifier

__all__ = [
    "ACCEPTANCE_RULES",
    "AcceptanceRule",
    "AdaptiveDrafter",
    "DecodingStats",
    "DraftTree",
    "Drafter",
    "DrafterWrapper",
    "GenerationOutput",
    "GreedyAcceptance",
    "LookupAugmentedDrafter",
    "TokenDatastore",
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
    "confident_lengths",
    "expected_accepted_length",
    "get_acceptance_rule",
    "logits_to_probs",
    "lookup_continuations",
    "load_datastore",
    "path_probs",
    "sample_from_marginals",
    "sample_tokens",
    "speculative_generate",
    "tree_attention_allowed",
    "tree_probs",
    "verifier_generate",
]
