"""Bad input gets a clear error naming the problem and the fix, before any model runs."""

import pytest
import torch
from tokenizers import Tokenizer
from tokenizers.models import WordLevel
from transformers import PreTrainedTokenizerFast

from specdiff_lightning import DiffusionDrafter, speculative_generate, verifier_generate
from specdiff_lightning.decoding import check_tokenizers
from specdiff_lightning.models import tiny_model

V = 32


@pytest.fixture(scope="module")
def pair():
    verifier = tiny_model("qwen2", vocab_size=V, seed=0, max_positions=64)
    drafter = DiffusionDrafter(tiny_model("llama", vocab_size=V, seed=1), V - 1, True)
    return verifier, drafter


PROMPT = torch.tensor([[1, 2, 3]])


@pytest.mark.parametrize(
    "kwargs,error,match",
    [
        (dict(gamma=0), ValueError, "gamma"),
        (dict(gamma=2.5), ValueError, "gamma"),
        (dict(num_drafts=0), ValueError, "num_drafts"),
        (dict(acceptance="lenient"), ValueError, "unknown acceptance mode"),
        (dict(acceptance="standard", num_drafts=4), ValueError, "single draft"),
        # 3 + 63 tokens feed 65 positions (the last new token is never fed): one too many
        (dict(max_new_tokens=63), ValueError, "exceeds the verifier's context of 64"),
        (dict(max_new_tokens=0), ValueError, "max_new_tokens"),
        (dict(temperature=-1.0), ValueError, "temperature"),
        (dict(top_p=1.5), ValueError, "top_p"),
        (dict(top_k=0), ValueError, "top_k"),
        (dict(draft_temperature=-0.5), ValueError, "draft_temperature"),
        (dict(input_ids=torch.empty(1, 0, dtype=torch.long)), ValueError, "prompt is empty"),
        (dict(input_ids=torch.tensor([[1, V + 5]])), ValueError, "another model's tokenizer"),
        (dict(input_ids=torch.tensor([1, 2])), ValueError, r"shape \[batch, length\]"),
        (dict(input_ids=torch.tensor([[1.0, 2.0]])), TypeError, "integer"),
        (dict(input_ids=torch.tensor([[1, 2], [3, 4]])), NotImplementedError, "one sequence at a time"),
    ],
)
def test_speculative_generate_rejects_bad_input(pair, kwargs, error, match):
    verifier, drafter = pair
    args = dict(input_ids=PROMPT, max_new_tokens=4, gamma=4)
    args.update(kwargs)
    with pytest.raises(error, match=match):
        speculative_generate(verifier, drafter, args.pop("input_ids"), **args)


def test_vocab_mismatch(pair):
    verifier, _ = pair
    other = DiffusionDrafter(tiny_model("llama", vocab_size=V + 8, seed=2), V, True)
    with pytest.raises(ValueError, match="vocabulary mismatch.*same tokenizer"):
        speculative_generate(verifier, other, PROMPT, max_new_tokens=4, gamma=4)


def test_verifier_generate_rejects_bad_input(pair):
    verifier, _ = pair
    with pytest.raises(ValueError, match="exceeds the verifier's context"):
        verifier_generate(verifier, torch.ones(1, 60, dtype=torch.long), max_new_tokens=10)
    with pytest.raises(ValueError, match="prompt is empty"):
        verifier_generate(verifier, torch.empty(1, 0, dtype=torch.long), max_new_tokens=10)


def test_context_allows_exactly_what_fits(pair):
    """The last emitted token is never fed to the verifier: a 64-token prompt on a 64-position
    model may emit one token, and a 3-token prompt 62."""
    verifier, drafter = pair
    full = torch.arange(64).remainder(V - 1)[None]
    assert verifier_generate(verifier, full, max_new_tokens=1).sequences.shape == (1, 65)
    out = speculative_generate(verifier, drafter, full, max_new_tokens=1, gamma=4)
    assert out.sequences.shape == (1, 65)
    out = speculative_generate(verifier, drafter, PROMPT, max_new_tokens=62, gamma=4, temperature=0)
    assert out.sequences.shape == (1, 65)
    with pytest.raises(ValueError, match="lower max_new_tokens to 1"):
        speculative_generate(verifier, drafter, full, max_new_tokens=2, gamma=4)
    # Issue 19: a prompt longer than the context was told to "lower max_new_tokens to 0", which is refused.
    longer = torch.arange(66).remainder(V - 1)[None]
    with pytest.raises(
        ValueError, match=r"the prompt alone fills it: keep at most its last 61 tokens"
    ) as err:
        speculative_generate(verifier, drafter, longer, max_new_tokens=4, gamma=4)
    assert "max_new_tokens to" not in str(err.value)


def test_unsupported_attention_kernel_is_named():
    verifier = tiny_model("qwen2", vocab_size=V, seed=0)
    drafter_model = tiny_model("llama", vocab_size=V, seed=1)
    drafter = DiffusionDrafter(drafter_model, V - 1, True)
    verifier.config._attn_implementation = "flex_attention"
    with pytest.raises(
        ValueError, match="verifier's attention implementation 'flex_attention'.*attn_implementation='sdpa'"
    ):
        speculative_generate(verifier, drafter, PROMPT, max_new_tokens=4, gamma=4)
    drafter_model.config._attn_implementation = "flex_attention"
    with pytest.raises(ValueError, match="drafter's attention implementation"):
        DiffusionDrafter(drafter_model, V - 1, True)


def _tokenizer(words):
    tok = Tokenizer(WordLevel({w: i for i, w in enumerate(words)}, unk_token=words[0]))
    return PreTrainedTokenizerFast(tokenizer_object=tok)


def test_tokenizer_mismatch():
    same = ["<unk>", "a", "b", "c"]
    check_tokenizers(_tokenizer(same), _tokenizer(same))
    with pytest.raises(ValueError, match="tokenizer mismatch.*only in drafter: \\['d'\\]"):
        check_tokenizers(_tokenizer(same), _tokenizer(["<unk>", "a", "b", "d"]))
    with pytest.raises(ValueError, match="different ids"):
        check_tokenizers(_tokenizer(same), _tokenizer(["<unk>", "b", "a", "c"]))


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"tree": {"min_conf": 0.1}}, r"decoding.tree has unknown option\(s\) \['min_conf'\]"),
        ({"lookup": {"num_lookup": 2}}, r"decoding.lookup has unknown option\(s\) \['num_lookup'\]"),
        ({"tree": 0.1}, "decoding.tree must be a mapping of AdaptiveDrafter options"),
    ],
)
def test_a_misspelt_draft_tree_option_names_the_config_key(kwargs, match):
    from specdiff_lightning.decoding.config import DecodingConfig

    with pytest.raises(ValueError, match=match):
        DecodingConfig(**kwargs)
    DecodingConfig(tree={"min_confidence": 0.1, "siblings": [0]}, lookup=True)  # well-formed: accepted
