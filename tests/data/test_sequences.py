"""The sequence corpus's token ranking: what the verifier wrote in the training split, most frequent
first (ties by id), the validation split left out."""

import json
import zlib

import pytest

from specdiff_lightning.data import CorpusError
from specdiff_lightning.data.sequences import SequenceDataModule, answer_token_ranking


def _val(record_id: str, percent: int) -> bool:
    return zlib.crc32(record_id.encode()) % 100 < percent


def test_the_ranking_counts_the_training_continuations_only(tmp_path):
    ids = [f"r{i}" for i in range(40)]
    val = next(i for i in ids if _val(i, 50))
    train = [i for i in ids if not _val(i, 50)][:2]
    records = [
        {"id": train[0], "prompt_ids": [9, 9, 9, 9], "continuation_ids": [5, 3, 3, 7]},
        {"id": train[1], "prompt_ids": [9], "continuation_ids": [7, 3, 2]},
        {"id": val, "prompt_ids": [1], "continuation_ids": [8, 8, 8, 8, 8]},
    ]
    path = tmp_path / "c.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    # 3 three times, 7 twice, then 2 and 5 once each (by id); the prompt's 9 and the val row's 8 never
    assert answer_token_ranking(str(path), val_percent=50) == [3, 7, 2, 5]
    data = SequenceDataModule(str(path), val_percent=50)
    assert data.answer_token_ranking() == [3, 7, 2, 5]
    with pytest.raises(CorpusError, match="no training continuations"):
        answer_token_ranking(str(path), val_percent=100)
