"""The shared timing protocol: runners made in mirrored order, run rotated, a median per model."""

from __future__ import annotations

from qnnx.targets.timing import mirrored_medians


def test_runners_are_made_mirrored_run_rotated_and_each_model_gets_both_copies():
    made, runs = [], []

    def make(i):
        made.append(i)
        copy = made.count(i)
        return lambda: runs.append((i, copy))

    ms = mirrored_medians(3, make, repeats=6, warmup=1)
    assert made == [0, 1, 2, 2, 1, 0]
    assert len(ms) == 3 and all(m >= 0 for m in ms)
    timed = runs[6:]  # after one warm-up run of each runner
    assert sorted(set(timed)) == [(i, c) for i in range(3) for c in (1, 2)]
    assert all(timed.count(r) == 6 for r in set(timed))
    assert [timed[k * 6] for k in range(6)] == [(0, 1), (1, 1), (2, 1), (2, 2), (1, 2), (0, 2)]
