"""Drafters on their own device, padded vocabularies, and the cache guards (issue 10 items 3, 4, 6).

No GPU here: the device tests check the mechanics that make a two-device run work (one move of the
proposal, a generator on the drafter's device derived from the caller's) on CPU and ``meta``; the
real cuda/cpu pairing is the command in docs/gpu.md.
"""

import pytest
import torch
from transformers.cache_utils import DynamicLayer

from helpers import reference_greedy, tree_for
from specdiff_lightning import AutoregressiveDrafter, DiffusionDrafter, speculative_generate
from specdiff_lightning.decoding import TreeVerifier, drafting, logits_to_probs
from specdiff_lightning.decoding.drafting import Proposal, derived_generator, share_vocabulary
from specdiff_lightning.decoding.sampling import restrict_vocab
from specdiff_lightning.decoding.validation import check_vocab
from specdiff_lightning.models import tiny_model

V = 48


# ---------------------------------------------------------------- item 3: devices
def test_proposal_moves_once_and_keeps_the_shared_rows_a_view():
    q = torch.softmax(torch.randn(1, 5, V), -1)
    proposal = Proposal(torch.zeros(1, 8, 5, dtype=torch.long), q[:, None].expand(1, 8, 5, V))
    moved = proposal.to("meta")
    assert moved.tokens.device.type == "meta" and moved.probs.device.type == "meta"
    assert moved.probs.shape == (1, 8, 5, V) and moved.probs.stride(1) == 0  # not K copies
    assert proposal.to("cpu") is proposal  # nothing to move: no copy


def test_derived_generator_for_another_device(monkeypatch):
    made = []
    caller, caller_again = torch.Generator().manual_seed(7), torch.Generator().manual_seed(7)

    real = torch.Generator

    def _generator(device=None):  # stands in for a cuda generator on this CPU-only machine
        made.append(torch.device(device))
        return real()

    assert derived_generator(caller, torch.device("cpu")) is caller  # same device: used as is
    assert derived_generator(None, torch.device("cuda")) is None
    monkeypatch.setattr(drafting.torch, "Generator", _generator)
    first = derived_generator(caller, torch.device("cuda:1"))
    assert made == [torch.device("cuda:1")]
    # seeded from one draw of the caller's stream: reproducible, never the caller's own seed
    again = derived_generator(caller_again, torch.device("cuda:1"))
    assert first.initial_seed() == again.initial_seed() != 7
    assert torch.equal(torch.rand(4, generator=first), torch.rand(4, generator=again))
    second = derived_generator(caller, torch.device("cuda:1"))
    assert second.initial_seed() != first.initial_seed()  # a fresh seed every round


@pytest.mark.parametrize("kind", ["diffusion", "autoregressive"])
def test_drafters_read_their_device_from_the_input_embeddings(kind):
    model = tiny_model("qwen2", vocab_size=V, seed=1, dtype=torch.float64)
    drafter = DiffusionDrafter(model, V - 1, True) if kind == "diffusion" else AutoregressiveDrafter(model)
    assert drafter.device == torch.device("cpu")
    proposal = drafter.propose(torch.tensor([[1, 2, 3]]), 4, generator=torch.Generator().manual_seed(0))
    assert proposal.tokens.device == torch.device("cpu")


# ---------------------------------------------------------------- item 4: padded vocabularies
class _Tokenizer:
    def __init__(self, size, offset=0):
        self.vocab = {f"t{i + offset}": i for i in range(size)}

    def get_vocab(self):
        return dict(self.vocab)

    def __len__(self):
        return len(self.vocab)


@pytest.mark.parametrize("verifier_vocab,drafter_vocab", [(V, V + 8), (V + 8, V)])
def test_padded_pair_is_accepted_when_tokenizers_agree(verifier_vocab, drafter_vocab):
    verifier = tiny_model("qwen2", vocab_size=verifier_vocab, seed=2, dtype=torch.float64)
    drafter = DiffusionDrafter(
        tiny_model("llama", vocab_size=drafter_vocab, seed=3, dtype=torch.float64), 40, True
    )
    with pytest.raises(ValueError, match="vocabulary mismatch"):  # without the tokenizers: the clear error
        check_vocab(verifier, drafter.vocab_size)
    shared = share_vocabulary(verifier, drafter, _Tokenizer(41), _Tokenizer(41))
    assert (
        shared
        == V
        == drafter.proposal_vocab_size
        == check_vocab(verifier, drafter.vocab_size, drafter.vocab_limit)
    )
    prefix = torch.tensor([[1, 2, 3]])
    proposal = drafter.propose(
        prefix, 5, num_drafts=4, temperature=1.3, generator=torch.Generator().manual_seed(0)
    )
    assert proposal.probs.shape[-1] == V and int(proposal.tokens.max()) < V
    full = drafter.draft_logits(prefix, 5)
    torch.testing.assert_close(proposal.probs[0, 0], torch.softmax(full[0, :, :V] / 1.3, -1))
    logits = torch.randn(3, verifier_vocab)
    assert restrict_vocab(logits, shared).shape == (3, V) and restrict_vocab(logits, None) is logits


def test_real_mismatches_stay_errors():
    verifier = tiny_model("qwen2", vocab_size=V, seed=2)
    drafter = DiffusionDrafter(tiny_model("llama", vocab_size=V + 8, seed=3), 40, True)
    with pytest.raises(ValueError, match="tokenizer mismatch"):
        share_vocabulary(verifier, drafter, _Tokenizer(41), _Tokenizer(41, offset=1))
    with pytest.raises(ValueError, match="only padding rows"):  # a tokenizer id the verifier cannot score
        share_vocabulary(verifier, drafter, _Tokenizer(V + 2), _Tokenizer(V + 2))
    with pytest.raises(ValueError, match="exceeds"):
        check_vocab(verifier, drafter.vocab_size, V + 4)
    with pytest.raises(ValueError, match="restrict_vocab"):
        drafter.restrict_vocab(V + 9)


def test_autoregressive_drafter_restricts_its_proposal():
    drafter = AutoregressiveDrafter(tiny_model("qwen2", vocab_size=V + 8, seed=4, dtype=torch.float64))
    drafter.restrict_vocab(V)
    proposal = drafter.propose(torch.tensor([[1, 2, 3]]), 4, temperature=0.8, generator=torch.Generator())
    assert proposal.probs.shape == (1, 1, 4, V) and int(proposal.tokens.max()) < V


@pytest.mark.parametrize("verifier_vocab,drafter_vocab", [(V, V + 8), (V + 8, V)])
@pytest.mark.parametrize("acceptance,num_drafts", [("greedy", 4), ("standard", 1), ("recursive", 4)])
def test_padded_pair_decodes_greedy_exact(verifier_vocab, drafter_vocab, acceptance, num_drafts):
    verifier = tiny_model("qwen2", vocab_size=verifier_vocab, seed=5, dtype=torch.float64)
    drafter = DiffusionDrafter(
        tiny_model("llama", vocab_size=drafter_vocab, seed=6, dtype=torch.float64), 40, True
    )
    share_vocabulary(verifier, drafter, _Tokenizer(41))
    prompt = torch.tensor([[3, 1, 4, 1, 5]])
    out = speculative_generate(
        verifier, drafter, prompt, max_new_tokens=16, gamma=4, num_drafts=num_drafts,
        acceptance=acceptance, temperature=0, generator=torch.Generator().manual_seed(0),
        tree=tree_for(acceptance),
    )  # fmt: skip
    # The target is the verifier restricted to the shared ids: generate() with the padding ids suppressed
    # (random padding rows here, so this also shows they are never proposed nor emitted).
    ref = verifier.generate(
        prompt, attention_mask=torch.ones_like(prompt), do_sample=False, max_new_tokens=16, pad_token_id=0,
        suppress_tokens=list(range(V, verifier_vocab)) or None,
    )  # fmt: skip
    assert out.sequences.tolist() == ref.tolist()


# ---------------------------------------------------------------- item 6: cache guards
def test_verifier_refuses_dynamic_layer_subclasses_with_extra_state(monkeypatch):
    """isinstance(layer, DynamicLayer) is not enough: a subclass carrying more state (a hybrid
    linear-attention layer, an indexed layer) would keep rejected nodes after compaction."""

    class StatefulLayer(DynamicLayer):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.recurrent_state = None

    from transformers import cache_utils

    monkeypatch.setitem(cache_utils.DYNAMIC_LAYER_TYPE_MAPPING, "full_attention", StatefulLayer)
    model = tiny_model("qwen2", vocab_size=V, seed=7)
    with pytest.raises(ValueError, match="StatefulLayer"):
        TreeVerifier(model, torch.tensor([[1, 2, 3]]))
    monkeypatch.undo()
    TreeVerifier(model, torch.tensor([[1, 2, 3]]))  # plain DynamicLayer: accepted


def test_sliding_window_autoregressive_drafter_runs_past_its_window():
    window = 4
    model = tiny_model(
        "qwen2", vocab_size=V, seed=8, dtype=torch.float64, use_sliding_window=True, sliding_window=window,
        max_window_layers=0,
    )  # fmt: skip
    drafter = AutoregressiveDrafter(model)
    context = torch.tensor([[1, 2, 3, 4, 5, 6, 7]])
    for round_ in range(4):  # drafts, then a context that diverges from them: the cache is cropped
        proposal = drafter.propose(context, gamma=3, temperature=0)
        with torch.no_grad():
            ref = model(input_ids=context).logits[0, -1]  # the sliding-window forward without a cache
        assert int(proposal.tokens[0, 0, 0]) == int(ref.argmax())
        torch.testing.assert_close(proposal.probs[0, 0, 0], logits_to_probs(ref, 0))
        context = torch.cat([context, proposal.tokens[0, :, :1], torch.tensor([[round_ + 9]])], dim=1)
    assert context.shape[1] > 2 * window


def test_sliding_window_autoregressive_drafter_is_greedy_exact():
    verifier = tiny_model("qwen2", vocab_size=V, seed=9, dtype=torch.float64)
    model = tiny_model(
        "qwen2", vocab_size=V, seed=10, dtype=torch.float64, use_sliding_window=True, sliding_window=3,
        max_window_layers=0,
    )  # fmt: skip
    prompt = torch.tensor([[5, 6, 7, 8, 9, 10]])
    out = speculative_generate(
        verifier, AutoregressiveDrafter(model), prompt, max_new_tokens=20, gamma=4, acceptance="standard",
        temperature=0, tree=None,
    )  # fmt: skip
    assert out.sequences.tolist() == reference_greedy(verifier, prompt, 20).tolist()
