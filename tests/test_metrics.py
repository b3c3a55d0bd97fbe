"""Decoding metrics: values, and reduction across two processes (gloo)."""

import os

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from specdiff_lightning.metrics import PositionalAcceptance, Speedup, StreakLength, Throughput


def test_streak_length_with_and_without_bonus():
    m = StreakLength()
    m.update(accepted=5, calls=4, emitted=9)
    m.update(accepted=torch.tensor([1.0, 2.0]), calls=torch.tensor([1.0, 1.0]))
    assert float(m.compute()) == pytest.approx(8 / 6)
    assert float(m.compute_with_bonus()) == pytest.approx((9 + 3 + 2) / 6)


def test_positional_acceptance_from_counts_and_streak_terms():
    m = PositionalAcceptance(gamma=4)
    m.update(torch.tensor([3, 1]), torch.tensor([4, 3]))  # a shorter window pads with zeros
    assert m.compute()[:2].tolist() == pytest.approx([0.75, 1 / 3]) and m.compute()[2:].isnan().all()
    e = PositionalAcceptance(gamma=3)
    e.update_from_streak_terms(torch.tensor([[0.5, 0.25, 0.2]], dtype=torch.float64))
    assert e.compute().tolist() == pytest.approx([0.5, 0.5, 0.8])
    fig, _ = e.plot()
    assert fig is not None


def test_throughput_and_speedup_are_per_sample_means():
    t = Throughput()
    t.update(11, 2.0)
    t.update(5, 1.0)
    assert float(t.compute()) == pytest.approx((5 + 4) / 2)
    s = Speedup()
    s.update(new_tokens=11, seconds=1.0, baseline_new_tokens=11, baseline_seconds=3.0)
    s.update(new_tokens=5, seconds=1.0, baseline_new_tokens=5, baseline_seconds=1.0)
    assert float(s.compute()) == pytest.approx(2.0)


def _worker(rank, world, port, results):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        streak, pos, thr, spd = StreakLength(), PositionalAcceptance(3), Throughput(), Speedup()
        if rank == 0:
            streak.update(4, 2)
            pos.update(torch.tensor([2, 1, 0]), torch.tensor([2, 2, 1]))
            thr.update(11, 1.0)
            spd.update(11, 1.0, 11, 2.0)
        else:
            streak.update(2, 4)
            pos.update(torch.tensor([1, 1, 1]), torch.tensor([2, 1, 1]))
            thr.update(21, 1.0)
            spd.update(11, 1.0, 11, 4.0)
        results[rank] = [
            float(streak.compute()),
            pos.compute().tolist(),
            float(thr.compute()),
            float(spd.compute()),
        ]
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
def test_metrics_reduce_across_two_processes():
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    results = mp.Manager().dict()
    mp.spawn(_worker, args=(2, port, results), nprocs=2, join=True)
    expected = [6 / 6, [3 / 4, 2 / 3, 1 / 2], (10 + 20) / 2, (2 + 4) / 2]
    for rank in range(2):
        streak, pos, thr, spd = results[rank]
        assert streak == pytest.approx(expected[0])
        assert pos == pytest.approx(expected[1])
        assert thr == pytest.approx(expected[2]) and spd == pytest.approx(expected[3])
