"""Training the feature-conditioned drafter: it learns, exports, reloads and decodes losslessly."""

import pytest
import torch

from helpers import fit_briefly, random_sequence_corpus, reference_greedy
from specdiff_lightning import speculative_generate
from specdiff_lightning.models.conditioned import ConditionedDrafter
from specdiff_lightning.models.loading import load_verifier
from specdiff_lightning.training.conditioned import ConditionedDrafterTraining


@pytest.mark.parametrize("targets", ["corpus", "verifier"])
def test_fit_export_reload_and_decode_losslessly(tmp_path, targets):
    corpus = random_sequence_corpus(tmp_path / "corpus.jsonl")
    export = tmp_path / "export"
    module = ConditionedDrafterTraining(
        verifier="tiny-llama",
        num_layers=1,
        feature_layers=(1, 2),
        gamma=4,
        blocks=4,
        mask_token_id=63,
        targets=targets,
        export_dir=str(export),
    )
    before = module.fusion.proj.weight.clone()
    fit_briefly(module, corpus, tmp_path, max_steps=4)
    assert not torch.equal(before, module.fusion.proj.weight)  # it trained
    assert module._features  # the verifier read each sequence once; later epochs reuse its features
    state = " ".join(module.state_dict())
    assert "embed_tokens" not in state and "verifier" not in state  # only the drafter is checkpointed
    verifier = load_verifier("tiny-llama", dtype=torch.float32)
    drafter = ConditionedDrafter.from_slice(verifier, export)
    drafter.model.float()
    drafter.fusion.float()
    ids = torch.tensor([[5, 9, 2, 44]])
    out = speculative_generate(
        verifier, drafter, ids, max_new_tokens=12, gamma=4, num_drafts=2, temperature=0
    )
    assert torch.equal(out.sequences, reference_greedy(verifier, ids, 12))


def test_verifier_targets_are_its_teacher_forced_argmax():
    module = ConditionedDrafterTraining(
        verifier="tiny-llama", num_layers=1, feature_layers=(1,), mask_token_id=63, targets="verifier"
    )
    ids = torch.tensor([[3, 7, 9, 11, 2], [4, 5, 6, 0, 0]])
    lengths = torch.tensor([5, 3])
    feats, greedy = module.verifier_features(ids, lengths)
    logits = module.verifier(input_ids=ids[:1]).logits
    assert greedy[0, 0] == 3 and torch.equal(greedy[0, 1:], logits[0, :-1].argmax(-1))
    assert feats.shape == (2, 5, 32) and not feats[1, 3:].any()  # padding rows stay zero
    again = module.verifier_features(ids, lengths)  # from the cache
    assert torch.equal(again[1], greedy) and torch.allclose(again[0], feats, atol=1e-2)
    corpus = ConditionedDrafterTraining(
        verifier="tiny-llama", num_layers=1, feature_layers=(1,), mask_token_id=63, cache_features=False
    )
    own_feats, own = corpus.verifier_features(ids, lengths)  # the corpus's tokens: no logits read
    assert torch.equal(own, ids) and torch.allclose(own_feats, feats)


def test_export_loads_through_load_drafter(tmp_path):
    from specdiff_lightning.models.loading import load_drafter

    module = ConditionedDrafterTraining(
        verifier="tiny-llama", num_layers=1, feature_layers=(1,), mask_token_id=63
    )
    module.export(str(tmp_path / "export"))
    verifier = load_verifier("tiny-llama", dtype=torch.float32)
    drafter = load_drafter(str(tmp_path / "export"), verifier=verifier, cache_window=6)
    assert type(drafter) is ConditionedDrafter and drafter.cache_window == 6 and drafter.block == 8
    ids = torch.tensor([[5, 9, 2, 44]])
    out = speculative_generate(verifier, drafter, ids, max_new_tokens=10, gamma=4, temperature=0)
    assert torch.equal(out.sequences, reference_greedy(verifier, ids, 10))
