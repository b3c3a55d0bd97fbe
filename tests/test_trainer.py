"""SpecDiffTrainer's helpers."""

import os
import pickle

import pytest
import torch


class _RunsCode:
    def __reduce__(self):
        return (os.system, ("echo this checkpoint ran code",))


def test_drafter_weights_are_loaded_as_tensors_only(tmp_path):
    """bench/eval-budget/export --ckpt_path unpickle tensors and plain data, never objects."""
    from specdiff_lightning.decoding.config import DecodingConfig
    from specdiff_lightning.trainer import _load_drafter_weights

    model = torch.nn.Linear(2, 2)
    weights = {k: torch.full_like(v, 3.0) for k, v in model.state_dict().items()}
    torch.save(
        {"state_dict": weights, "hyper_parameters": {"decoding": DecodingConfig(gamma=4)}},
        tmp_path / "a.ckpt",
    )
    _load_drafter_weights(model, str(tmp_path / "a.ckpt"))
    assert torch.equal(model.weight, torch.full((2, 2), 3.0))
    torch.save({"state_dict": weights, "hyper_parameters": {"x": _RunsCode()}}, tmp_path / "b.ckpt")
    with pytest.raises(pickle.UnpicklingError):
        _load_drafter_weights(model, str(tmp_path / "b.ckpt"))
