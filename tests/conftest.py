from pathlib import Path

import pytest
import torch

# Tiny models are dominated by per-op overhead; one thread is faster and keeps runs reproducible.
torch.set_num_threads(1)

ROOT = Path(__file__).parents[1]
#: what a Trainer without a root directory writes into the working directory
_STRAY = ("checkpoints", "lightning_logs")


@pytest.fixture(autouse=True, scope="session")
def _calibrations_in_a_temporary_directory(tmp_path_factory):
    """Cost models measured by tests (tiny models, tree: auto) go to a directory of the session's."""
    import os

    previous = os.environ.get("SPECDIFF_CALIBRATION_DIR")
    os.environ["SPECDIFF_CALIBRATION_DIR"] = str(tmp_path_factory.mktemp("calibration"))
    yield
    if previous is None:
        os.environ.pop("SPECDIFF_CALIBRATION_DIR", None)
    else:
        os.environ["SPECDIFF_CALIBRATION_DIR"] = previous


@pytest.fixture(autouse=True)
def _nothing_written_into_the_checkout():
    """Tests never write into the checkout: every Trainer gets ``tmp_path`` as its root."""
    before = {name for name in _STRAY if (ROOT / name).exists()}
    yield
    stray = {name for name in _STRAY if (ROOT / name).exists()} - before
    assert not stray, (
        f"the test wrote {sorted(stray)} into the checkout: give its Trainer default_root_dir=tmp_path"
    )
