"""Task extraction and the gradient task scheduler, on synthetic latency curves."""

from __future__ import annotations

import math
from collections import Counter

import pytest

import hexir
from hexir.frontend.zoo import mlp
from hexir.ir.keys import workload_key
from hexir.runtime.peak import bandwidth
from hexir.search.scheduler import (
    TaskScheduler,
    extract_tasks,
    first_round,
    form_gains,
    gradient_gains,
    losing_forms,
    roofline,
    traffic_bytes,
)
from hexir.search.worker import COLD_BYTES


def test_a_primfunc_is_one_task():
    func = hexir.workload("matmul", M=32, N=32, K=32)
    (task,) = extract_tasks(func)
    assert task.func == func and task.weight == 1 and task.workload_key == workload_key(func)
    assert task.flops == 2 * 32**3


def test_a_graph_yields_distinct_workloads_weighted_by_occurrence():
    # Two hidden layers of the same shape lower to one workload: one task of weight 2.
    tasks = extract_tasks(mlp(batch=4, sizes=(16, 16, 16, 8)))
    assert [t.weight for t in tasks] == [2, 1, 1]
    assert len({t.workload_key for t in tasks}) == 3
    assert tasks[0].name.startswith("fused_matmul") and tasks[-1].name == "softmax"


def test_first_round_scales_down_to_the_budget():
    assert first_round([1, 1, 1], trials=1000, per_round=64) == [64, 64, 64]
    assert first_round([1, 1, 1], trials=30, per_round=64) == [10, 10, 10]
    # Fewer trials than tasks: one each for the heaviest.
    assert first_round([1, 5, 3], trials=2, per_round=64) == [0, 1, 1]
    assert first_round([], trials=10, per_round=64) == []


def test_first_round_takes_a_share_of_the_budget():
    # 25 tasks, 600 trials, a quarter for the first round: 6 each, not 24.
    assert first_round([1] * 25, trials=600, per_round=64, share=0.25) == [6] * 25
    assert first_round([1] * 25, trials=20000, per_round=64, share=0.25) == [64] * 25
    # At least one each (the default schedule) while the budget holds one per task.
    assert first_round([1] * 25, trials=30, per_round=64, share=0.25) == [1] * 25
    assert first_round([1, 5, 3], trials=2, per_round=64, share=0.25) == [0, 1, 1]
    sched = TaskScheduler([1] * 25, 600, 64, first_share=0.25)
    firsts = [sched.next() for _ in range(25)]
    assert firsts == [(i, 6) for i in range(25)]
    assert sched.next()[1] == 64  # then full rounds


def test_headroom_caps_a_tasks_gain_at_its_roofline():
    flat = [2e-3, 1e-3]
    uncapped = gradient_gains([flat, flat], [1, 1], alpha=0.2, window=3)
    capped = gradient_gains([flat, flat], [1, 1], alpha=0.2, window=3, floors=[0.99e-3, 0.0])
    assert capped[1] == uncapped[1] and capped[0] == pytest.approx(0.01e-3)
    # At or below its roofline (a floor estimated high): nothing to gain.
    assert gradient_gains([flat], [1], 0.2, 3, floors=[2e-3]) == [0.0]


def test_a_task_at_its_roofline_yields_its_rounds():
    # Two tasks improving alike; the first is already at its roofline: the rounds go to the
    # second, though its gain alone would not win them.
    curves = [lambda r: 1e-3 / r, lambda r: 0.5e-3 / r]
    weights = [1, 1]
    sched = TaskScheduler(weights, 80, 4, alpha=0.2, window=3, floors=[1e-3, 0.0])
    order = []
    while (step := sched.next()) is not None:
        i, n = step
        order.append(i)
        sched.record(i, n, curves[i](sched.rounds[i] + 1) if i else 1e-3)
    assert order[:2] == [0, 1] and set(order[2:]) == {1}


def test_roofline_of_compute_and_memory_bound_tasks():
    target = hexir.Target("cpu")
    (matmul,) = extract_tasks(hexir.workload("matmul", M=256, N=256, K=256))
    (relu,) = extract_tasks(hexir.workload("relu", shape=(1024, 1024)))
    assert traffic_bytes(matmul.func) == 3 * 256 * 256 * 4
    assert traffic_bytes(relu.func) == 2 * 1024 * 1024 * 4
    peak, rate = target.peak().flops, bandwidth(target, hexir.knobs.get().cache_dir).bytes_per_s
    assert roofline(matmul, target) == pytest.approx(max(2 * 256**3 / peak, 3 * 256**2 * 4 / rate))
    assert roofline(relu, target) == pytest.approx(2 * 1024**2 * 4 / rate)
    # A 256^3 matmul takes longer at the peak than moving its bytes; a relu the other way.
    assert 2 * 256**3 / peak > 3 * 256**2 * 4 / rate and relu.flops / peak < 2 * 1024**2 * 4 / rate
    # 16 MB, more than a tune times warm (COLD_BYTES): its bytes move at memory's rate.
    (big,) = extract_tasks(hexir.workload("relu", shape=(2048, 1024)))
    memory = bandwidth(target, hexir.knobs.get().cache_dir, memory=True).bytes_per_s
    assert traffic_bytes(big.func) > COLD_BYTES
    assert roofline(big, target) == pytest.approx(2 * 2048 * 1024 * 4 / memory)


def test_gradient_gains_weigh_recent_progress_and_the_forward_estimate():
    flat = [1.0, 1.0, 1.0, 1.0]
    falling = [4.0, 3.0, 2.0, 1.0]
    gains = gradient_gains([flat, falling, [math.inf], []], [1, 1, 1, 1], alpha=0.5, window=3)
    assert gains[1] > gains[0] > 0 and gains[2] == math.inf and gains[3] == 0.0
    # The flat task's forward estimate is weighed by its rounds' hits: its first of four.
    assert gains[0] == pytest.approx(0.5 * 1.0 / 4 * 1 / 4)
    assert gains[1] == pytest.approx(0.5 * (4.0 - 1.0) / 3 + 0.5 * 1.0 / 4)
    heavy = gradient_gains([flat, flat], [1, 10], alpha=0.2, window=3)
    assert heavy[1] == pytest.approx(10 * heavy[0])


def test_a_task_whose_rounds_find_nothing_falls_behind_one_that_keeps_finding():
    # ResNet-18 at 2000 trials: a Winograd batch_matmul run three times, 0.54 ms from its
    # first round on, was picked for 462 trials while convs still improving waited.
    curves = [lambda r: 0.54e-3, lambda r: 0.9e-3 * 0.97 ** (r - 1)]
    order, _ = _simulate(curves, [3, 1], trials=120)
    assert order[:2] == [0, 1]
    later = order[2:]  # 21 rounds to 7 (without the hits, the stuck task's forward estimate,
    assert later.count(1) >= 2.5 * later.count(0)  # 3 x 0.54 / rounds, won 19 to 9)
    stuck = gradient_gains([[0.54e-3] * 4, [0.9e-3 * 0.97**r for r in range(4)]], [3, 1], 0.2, 3)
    assert stuck[1] > stuck[0]
    noisy = gradient_gains([[1.0, 0.995, 0.999, 0.996]], [1], 0.2, 3)  # timing noise: no hit
    assert noisy[0] == pytest.approx(0.2 * (1.0 - 0.996) / 3 + 0.8 * 0.996 / 4 / 4)


def _simulate(curves, weights, trials, per_round=4, exhausted=()):
    """Run the scheduler against synthetic curves: task i's best latency after r rounds is
    curves[i](r). Returns the rounds each task got, in order."""
    sched = TaskScheduler(weights, trials, per_round, alpha=0.2, window=3)
    order = []
    while (step := sched.next()) is not None:
        i, n = step
        if i in exhausted and sched.rounds[i] > 0:
            sched.exhaust(i)
            continue
        order.append(i)
        sched.record(i, n, curves[i](sched.rounds[i] + 1))
    return order, sched


def test_every_task_gets_a_first_round_then_the_largest_gain_wins():
    curves = [
        lambda r: 1e-4,  # stuck
        lambda r: 1e-3 / r,  # slow, and improving
        lambda r: 1e-5,  # already tiny: little to gain end to end
    ]
    order, sched = _simulate(curves, [1, 1, 1], trials=60)
    assert order[:3] == [0, 1, 2]
    assert sched.used == 60
    later = order[3:]
    assert later.count(1) > later.count(0) > later.count(2) == 0
    # Each later round went to the task of largest gain at that point.
    again = TaskScheduler([1, 1, 1], 60, 4, alpha=0.2, window=3)
    for i in order:
        if sum(again.rounds) >= 3:
            gains = gradient_gains(again.histories, [1, 1, 1], 0.2, 3)
            assert gains[i] == max(gains)
        assert again.next() == (i, 4)
        again.record(i, 4, curves[i](again.rounds[i] + 1))


def test_weight_moves_trials_to_the_task_that_runs_most():
    curves = [lambda r: 1e-3 / r, lambda r: 1e-3 / r]
    order, _ = _simulate(curves, [1, 8], trials=80)
    assert order[3:].count(1) > 2 * order[3:].count(0)


def test_small_budget_exhausted_and_invalid_tasks():
    order, sched = _simulate([lambda r: 1e-3] * 5, [1] * 5, trials=3)
    assert sorted(order) == [0, 1, 2] and sched.used == 3
    # A task whose space is spent gets nothing more; a task that never measures a valid
    # candidate gets `window` rounds, then none.
    curves = [lambda r: 1e-3 / r, lambda r: None, lambda r: 1e-3 / r]
    order, sched = _simulate(curves, [1, 1, 100], trials=80, exhausted={2})
    assert order.count(2) == 1 and order.count(1) == 3 and sched.used == 80
    assert all(i == 0 for i in order[5:])


def test_a_kernel_of_the_form_behind_gains_only_beyond_the_gap():
    # Two convs, each direct ("d1", "d2") or Winograd (a transform "t" and a batch_matmul
    # "b" they share): conv 1's Winograd form sums 0.9 ms against 1.7 direct, conv 2's
    # direct form 1.4 ms against 1.6.
    forms = [
        (Counter({"t1": 1, "b": 1}), Counter({"d1": 1})),
        (Counter({"d2": 1}), Counter({"t2": 1, "b": 1})),
    ]
    best = {"t1": 0.1e-3, "t2": 0.8e-3, "b": 0.8e-3, "d1": 1.7e-3, "d2": 1.4e-3}
    losing = losing_forms(forms, best)
    assert losing == {"d1": [(1, pytest.approx(0.8e-3))], "t2": [(1, pytest.approx(0.2e-3))],
                      "b": [(1, pytest.approx(0.2e-3))]}  # fmt: skip
    # A form with a kernel not timed yet is behind nowhere.
    assert losing_forms(forms, best | {"t2": None}) == {"d1": [(1, pytest.approx(0.8e-3))]}
    # d1 would need to gain 0.8 ms before the model does; the batch_matmul's run in conv 1
    # counts whole, its run in conv 2 beyond the 0.2 ms gap; a task in no form as it was.
    gains = form_gains(
        [0.5e-3, 2 * 0.3e-3, 0.4e-3],
        [1, 2, 1],
        [losing["d1"], losing["b"], []],
    )
    assert gains == pytest.approx([0.0, 0.3e-3 + 0.1e-3, 0.4e-3])
    assert form_gains([math.inf], [1], [losing["d1"]]) == [math.inf]


def test_the_scheduler_skips_a_task_whose_form_stays_behind():
    # Task 0 (weight 2, 1.7 ms) has the larger gain by itself, but its form is 0.9 ms
    # behind the other; task 1 (0.5 ms) is in the form the model runs.
    curves = [lambda r: 1.7e-3, lambda r: 0.5e-3 * 0.97 ** (r - 1)]
    plain, _ = _simulate(curves, [2, 1], trials=40)
    assert plain.count(0) == 6  # its flat curve's forward estimate: 1.7 ms / rounds / rounds
    sched = TaskScheduler([2, 1], 40, 4, alpha=0.2, window=3)
    order = []
    while (step := sched.next()) is not None:
        i, n = step
        order.append(i)
        sched.record(i, n, curves[i](sched.rounds[i] + 1))
        sched.weigh_forms([[(2, 0.9e-3)], []])
    # A second round (its forward estimate, 2 x 0.8 x 1.7 ms, is past the gap), then none.
    assert order == [0, 1, 0] + [1] * 7
