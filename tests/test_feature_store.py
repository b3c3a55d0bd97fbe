"""The feature store: the verifier's hidden states of each training sequence, written on its first
read and streamed back by the data module, so later epochs and runs never run the verifier."""

import json

import pytest
import torch

from helpers import quiet_trainer, random_sequence_corpus
from specdiff_lightning.data.sequences import SequenceDataModule
from specdiff_lightning.feature_store import STORE_FILE, FeatureStore, FeatureStoreError, sequence_key
from specdiff_lightning.training.dflash import DFlashDrafterTraining

TINY = dict(
    verifier="tiny-llama", num_layers=1, target_layer_ids=(0, 1), block_size=5, mask_token_id=63, blocks=4
)
IDENTITY = {"verifier": "v", "fingerprint": "1", "layers": [1, 2], "targets": "corpus"}


def test_sequences_round_trip_and_a_store_of_another_reading_is_refused(tmp_path):
    store = FeatureStore(tmp_path / "s", IDENTITY)
    features, greedy = torch.randn(6, 8), torch.arange(6)
    assert store.get([1, 2, 3]) is None
    store.put(torch.tensor([1, 2, 3]), features, greedy)
    got_features, got_greedy = store.get([1, 2, 3])
    assert got_features.dtype == torch.bfloat16 and torch.equal(got_features, features.to(torch.bfloat16))
    assert torch.equal(got_greedy, greedy) and len(store) == 1
    assert json.loads((tmp_path / "s" / STORE_FILE).read_text())["layers"] == [1, 2]
    assert not [p for p in (tmp_path / "s").iterdir() if p.name.startswith(".")]  # no temporary files
    assert sequence_key([1, 2, 3]) == sequence_key(torch.tensor([1, 2, 3])) != sequence_key([1, 2])
    with pytest.raises(FeatureStoreError, match="another feature_store directory"):
        FeatureStore(tmp_path / "s", {**IDENTITY, "layers": [1, 3]})
    with pytest.raises(FeatureStoreError, match="only reads"):
        FeatureStore(tmp_path / "s").put([4], features, greedy)
    # a damaged file (a full disk, a copy cut short) is read again by the verifier, never half-used
    (tmp_path / "s" / f"{sequence_key([1, 2, 3])}.safetensors").write_bytes(b"cut")
    assert store.get([1, 2, 3]) is None and len(store) == 0


def test_the_verifier_reads_each_sequence_once_across_epochs_and_runs(tmp_path):
    corpus = random_sequence_corpus(tmp_path / "corpus.jsonl", n=12)
    store = tmp_path / "features"

    def data():
        return SequenceDataModule(str(corpus), batch_size=4, max_length=32, feature_store=str(store))

    module = DFlashDrafterTraining(**TINY, cache_features=False, feature_store=str(store))
    calls = []
    module.verifier.register_forward_hook(lambda *args: calls.append(1))
    quiet_trainer(tmp_path, max_epochs=2, limit_val_batches=0).fit(module, data())
    dm = data()
    dm.setup("fit")
    sequences = sum(len(b["lengths"]) for b in dm.train_dataloader())
    assert len(FeatureStore(store)) == sequences  # one file per training sequence
    assert len(calls) == module.trainer.global_step // 2  # the second epoch read the store only

    # A later run (another session) over the same corpus: the verifier never runs, and a batch's
    # features are those the verifier gives (stored in bfloat16).
    again = DFlashDrafterTraining(**TINY, cache_features=False, feature_store=str(store), seed=4)
    again.verifier.register_forward_hook(lambda *args: pytest.fail("the verifier ran"))
    quiet_trainer(tmp_path, max_steps=2, limit_val_batches=0).fit(again, data())
    batch = next(iter(dm.train_dataloader()))
    assert batch["features"].shape[:2] == batch["input_ids"].shape
    fresh, greedy = DFlashDrafterTraining(**TINY).verifier_features(batch["input_ids"], batch["lengths"])
    valid = torch.arange(batch["input_ids"].shape[1])[None] < batch["lengths"][:, None]
    torch.testing.assert_close(batch["features"].float()[valid], fresh.to(torch.bfloat16).float()[valid])
    assert torch.equal(batch["greedy"], greedy)


def test_a_store_of_other_layers_stops_the_run_by_name(tmp_path):
    store = tmp_path / "features"
    FeatureStore(store, {**IDENTITY, "verifier": "tiny-llama"}).put([1], torch.zeros(1, 4), torch.zeros(1))
    module = DFlashDrafterTraining(**TINY, feature_store=str(store))
    with pytest.raises(FeatureStoreError, match="holds .* and this run reads"):
        module.feature_store()


def test_a_store_read_in_another_dtype_names_the_dtype_and_the_flag(tmp_path):
    """A store written with a bfloat16 verifier read, opened by a float32 run (say `validate`):
    the error names the dtype that differs and the flag that reuses the store."""
    store = tmp_path / "features"
    writer = DFlashDrafterTraining(**TINY, feature_store=str(store), verifier_dtype="bfloat16")
    writer.feature_store().put([1], torch.zeros(1, 4), torch.zeros(1))
    reader = DFlashDrafterTraining(**TINY, feature_store=str(store))
    with pytest.raises(FeatureStoreError, match="verifier_dtype='bfloat16'.*verifier_dtype='float32'") as err:
        reader.feature_store()
    assert "--model.init_args.verifier_dtype bfloat16" in str(err.value)
    assert "layers" not in str(err.value)  # only the keys that differ


def test_features_from_a_store_the_module_did_not_open_are_refused(tmp_path):
    """The data module reads a store without checking whose it is; the training module only takes
    features from the store it opened (and so checked against its verifier and layers)."""
    corpus = random_sequence_corpus(tmp_path / "corpus.jsonl", n=8)
    store = tmp_path / "features"
    writer = DFlashDrafterTraining(**TINY, cache_features=False, feature_store=str(store))
    quiet_trainer(tmp_path, max_epochs=1, limit_val_batches=0).fit(
        writer, SequenceDataModule(str(corpus), batch_size=4, max_length=32)
    )
    data = SequenceDataModule(str(corpus), batch_size=4, max_length=32, feature_store=str(store))
    data.setup("fit")
    batch = next(iter(data.train_dataloader()))
    assert "features" in batch
    with pytest.raises(FeatureStoreError, match="give both the same feature_store"):
        DFlashDrafterTraining(**TINY)._batch_features(batch)
    with pytest.raises(FeatureStoreError, match="did not open"):
        DFlashDrafterTraining(**TINY, feature_store=str(tmp_path / "other"))._batch_features(batch)
    feats, _ = DFlashDrafterTraining(**TINY, feature_store=str(store))._batch_features(batch)
    assert feats.dtype == torch.float32
