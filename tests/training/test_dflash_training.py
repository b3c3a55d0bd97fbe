"""Training a DFlash drafter through our LightningModule: it learns under both objectives, exports a
transformers-layout checkpoint that reloads and decodes losslessly, and can start from verifier layers."""

import json

import pytest
import torch

from helpers import fit_briefly, random_sequence_corpus, reference_greedy
from specdiff_lightning import DFlashDrafter, speculative_generate
from specdiff_lightning.data.sequences import answer_token_ranking
from specdiff_lightning.models.loading import load_drafter, load_verifier
from specdiff_lightning.training.dflash import DFlashDrafterTraining, init_layers_from_verifier

TINY = dict(
    verifier="tiny-llama", num_layers=1, target_layer_ids=(0, 1), block_size=5, mask_token_id=63, blocks=4
)


@pytest.mark.parametrize("objective", ["masked_ce", "streak"])
def test_fit_export_reload_and_decode_losslessly(tmp_path, objective):
    corpus = random_sequence_corpus(tmp_path / "corpus.jsonl")
    export = tmp_path / "export"
    module = DFlashDrafterTraining(**TINY, objective=objective, export_dir=str(export), val_decode_path=True)
    before = {k: v.clone() for k, v in module.drafter_model.state_dict().items()}
    fit_briefly(module, corpus, tmp_path, max_steps=4)
    after = module.drafter_model.state_dict()
    assert any(not torch.equal(before[k], after[k]) for k in before)  # it trained
    assert module._features  # the verifier read each sequence once
    from specdiff_lightning.data.sequences import SequenceDataModule

    data = SequenceDataModule(str(corpus), batch_size=4, max_length=32, val_percent=50)
    (metrics,) = module.trainer.validate(module, data)
    assert {"val/loss", "val/streak", "val/accepted", "val/decode_accepted"} <= set(metrics)
    assert 0 <= metrics["val/accepted"] <= module.window
    assert 0 <= metrics["val/decode_accepted"] <= module.window
    state = " ".join(module.state_dict())
    assert "embed_tokens" not in state and "lm_head" not in state and "verifier" not in state
    assert (export / "config.json").is_file() and (export / "model.safetensors").is_file()
    assert all(f.stat().st_mode & 0o777 == 0o644 for f in export.iterdir())  # readable by others
    # the tokens the verifier wrote in the training split, most frequent first, go with the export
    ranking = json.loads((export / "draft_vocab.json").read_text())["ranking"]
    assert ranking == answer_token_ranking(str(corpus))

    verifier = load_verifier("tiny-llama", dtype=torch.float32)
    for drafter in (
        DFlashDrafter.from_pretrained(export, verifier=verifier),
        load_drafter(str(export), verifier=verifier),
    ):
        assert type(drafter) is DFlashDrafter and drafter.block_size == 5
        assert next(drafter.model.parameters()).dtype == torch.float32  # the verifier's dtype
        ids = torch.tensor([[5, 9, 2, 44]])
        out = speculative_generate(
            verifier, drafter, ids, max_new_tokens=12, gamma=4, num_drafts=2, temperature=0
        )
        assert torch.equal(out.sequences, reference_greedy(verifier, ids, 12))


def test_the_loss_reads_the_blocks_a_decoding_round_drafts():
    """The training loss is the objective on ``blocks_logits`` at the sampled anchors, with the
    corpus tokens after each anchor as targets."""
    from specdiff_lightning.training.losses import masked_ce_loss
    from specdiff_lightning.training.slice_drafter import block_targets, sample_block_starts

    module = DFlashDrafterTraining(**TINY, seed=3, cache_features=False)  # both reads in float32
    ids = torch.tensor([[3, 7, 9, 11, 2, 5, 8, 1], [4, 5, 6, 10, 12, 0, 0, 0]])
    batch = {"input_ids": ids, "lengths": torch.tensor([8, 5]), "cont_start": torch.tensor([2, 1])}
    loss, streak = module._loss(batch)
    starts = sample_block_starts(batch["cont_start"], batch["lengths"], 4, torch.Generator().manual_seed(3))
    feats, _ = module.verifier_features(ids, batch["lengths"])
    logits = module.drafter.blocks_logits(feats, ids, starts, 4)
    want, _ = masked_ce_loss(
        logits.flatten(0, 1), block_targets(ids, batch["lengths"], starts, 4).flatten(0, 1)
    )
    torch.testing.assert_close(loss, want)
    assert streak.shape == (8,)
    # DFlash's position decay: the same blocks, the positions weighted
    decayed = DFlashDrafterTraining(**TINY, seed=3, cache_features=False, loss_decay=2.0)
    decayed.drafter_model.load_state_dict(module.drafter_model.state_dict())
    want, _ = masked_ce_loss(
        logits.flatten(0, 1), block_targets(ids, batch["lengths"], starts, 4).flatten(0, 1), decay=2.0
    )
    torch.testing.assert_close(decayed._loss(batch)[0], want)
    with pytest.raises(ValueError, match="loss_decay weights masked_ce"):
        DFlashDrafterTraining(**TINY, objective="streak", loss_decay=2.0)


def test_layers_can_start_from_the_verifiers():
    module = DFlashDrafterTraining(**TINY, init_layers_from=(1,))
    own = module.drafter_model.layers[0]
    theirs = module.verifier.get_decoder().layers[1]
    assert torch.equal(own.self_attn.q_proj.weight, theirs.self_attn.q_proj.weight)
    assert torch.equal(own.mlp.down_proj.weight, theirs.mlp.down_proj.weight)
    assert torch.equal(module.drafter_model.norm.weight, module.verifier.get_decoder().norm.weight)
    with pytest.raises(ValueError, match="one verifier layer per drafter layer"):
        init_layers_from_verifier(module.drafter, module.verifier, [0, 1])
    with pytest.raises(ValueError, match="outside the verifier"):
        init_layers_from_verifier(module.drafter, module.verifier, [7])


def test_training_continues_from_a_saved_drafter(tmp_path):
    module = DFlashDrafterTraining(**TINY)
    module.export(str(tmp_path / "d"), dtype=None)
    again = DFlashDrafterTraining(**TINY, init_from=str(tmp_path / "d"), seed=5)
    for a, b in zip(module.drafter_model.parameters(), again.drafter_model.parameters(), strict=True):
        assert torch.equal(a, b)


def test_a_bad_objective_is_a_clear_error():
    with pytest.raises(ValueError, match="objective must be one of"):
        DFlashDrafterTraining(**TINY, objective="kl")
    with pytest.raises(ValueError, match=r"anchors must be one of \['uniform', 'decode'\]"):
        DFlashDrafterTraining(**TINY, anchors="random")


def test_decode_anchors_are_where_greedy_decoding_starts_its_rounds(tmp_path):
    """anchors="decode": each row's blocks start on the drafter's own decoding path (all of it
    where it is shorter than the blocks asked for, else that many of its anchors), and it trains."""
    from specdiff_lightning.data.sequences import collate_sequences
    from specdiff_lightning.training.losses import decode_path

    corpus = random_sequence_corpus(tmp_path / "corpus.jsonl")
    module = DFlashDrafterTraining(**{**TINY, "blocks": 6}, anchors="decode")
    records = [json.loads(line) for line in corpus.read_text().splitlines()[:4]]
    batch = collate_sequences(
        [(r["prompt_ids"] + r["continuation_ids"], len(r["prompt_ids"])) for r in records]
    )
    ids, lengths, cont = batch["input_ids"], batch["lengths"], batch["cont_start"]
    feats, _ = module._batch_features(batch)
    uniform = torch.zeros(4, 6, dtype=torch.long)
    starts = module._decode_anchors(feats, ids, ids, lengths, cont, uniform)
    for b in range(4):
        first, streaks = module._all_anchor_streaks(feats, ids, ids, lengths, cont, b)
        path = (decode_path(streaks) + first).tolist()
        if len(path) >= 6:
            assert len(set(starts[b].tolist())) == 6 and set(starts[b].tolist()) <= set(path)
        else:
            assert starts[b, : len(path)].tolist() == path and (starts[b, len(path) :] == 0).all()
    before = {k: v.clone() for k, v in module.drafter_model.state_dict().items()}
    fit_briefly(module, corpus, tmp_path, max_steps=2)
    assert any(not torch.equal(before[k], v) for k, v in module.drafter_model.state_dict().items())


def test_a_bfloat16_verifier_trains_a_float32_drafter_and_a_bad_dtype_is_a_clear_error(tmp_path):
    """verifier_dtype casts the frozen verifier only: the drafter's weights stay float32 and train
    under bf16-mixed; a name that is no floating dtype is refused naming the choices."""
    corpus = random_sequence_corpus(tmp_path / "corpus.jsonl")
    module = DFlashDrafterTraining(**TINY, verifier_dtype="bfloat16")
    assert module.verifier.dtype == torch.bfloat16
    assert {p.dtype for p in module.drafter_model.parameters()} == {torch.float32}
    before = {k: v.clone() for k, v in module.drafter_model.state_dict().items()}
    fit_briefly(module, corpus, tmp_path, max_steps=2, precision="bf16-mixed")
    assert any(not torch.equal(before[k], v) for k, v in module.drafter_model.state_dict().items())
    with pytest.raises(ValueError, match="verifier_dtype='int8'.*'float32' or 'bfloat16'"):
        DFlashDrafterTraining(**TINY, verifier_dtype="int8")
