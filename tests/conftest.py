import os
from pathlib import Path

import pytest
import torch

# Tiny models are dominated by per-op overhead; one thread is faster and keeps runs reproducible.
torch.set_num_threads(1)
# and in the processes tests start (notebook kernels, DDP ranks, CLI runs): `make test` runs one
# pytest worker per core (pytest-xdist), and a child with a thread per core on top of them
# oversubscribes the CPU; measured on 2 cores, a notebook ran 5x slower (63 -> 352 s) without this.
os.environ["OMP_NUM_THREADS"] = "1"

ROOT = Path(__file__).parents[1]
#: what a Trainer without a root directory writes into the working directory
_STRAY = ("checkpoints", "lightning_logs")


@pytest.fixture(autouse=True, scope="session")
def _calibrations_in_a_temporary_directory(tmp_path_factory):
    """Cost models measured by tests (tiny models, tree: auto) go to a directory of the session's."""
    # and the compiled peer's kernels (compiled for this session's CPU and kernel level only)
    names = ("SPECDIFF_CALIBRATION_DIR", "TORCHINDUCTOR_CACHE_DIR")
    previous = {name: os.environ.get(name) for name in names}
    for name in names:
        os.environ[name] = str(tmp_path_factory.mktemp(name.lower()))
    yield
    for name, value in previous.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


@pytest.fixture(autouse=True)
def _nothing_written_into_the_checkout():
    """Tests never write into the checkout: every Trainer gets ``tmp_path`` as its root."""
    before = {name for name in _STRAY if (ROOT / name).exists()}
    yield
    stray = {name for name in _STRAY if (ROOT / name).exists()} - before
    assert not stray, (
        f"the test wrote {sorted(stray)} into the checkout: give its Trainer default_root_dir=tmp_path"
    )


def pytest_collection_modifyitems(config, items):
    """Run the ``slow`` tests first (a stable sort: otherwise in collection order).

    ``make test`` spreads the tests over one pytest-xdist worker per core. A minutes-long test that
    starts last leaves the other worker idle while it runs; started first, it runs beside the short
    ones (on 2 cores the slow tests are about four fifths of the suite's test time). This needs
    ``--dist worksteal`` (the Makefile's): xdist's default scheduler hands each worker its share up
    front, and with the slow tests first one worker was left with the long tail (13:46 of pytest
    under AVX2 kernels, against 10:21 in collection order and 8:40 with both)."""
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)
