"""`Module.profile`: every command once, FLOPs counted from the ops, shares that add up, a
memory plan left as it was; and the target's peak. `compare`: a tuned build's commands paired
with the default build's. No test asserts a speed: times only have to be positive and finite."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

import hexir
from hexir import knobs
from hexir.errors import TargetError
from hexir.frontend import zoo
from hexir.graph.evaluate import evaluate
from hexir.ops import op_flops
from hexir.runtime import peak as peak_module
from hexir.runtime.profile import Profile, command_ops, compare
from hexir.runtime.target import CUDA_ARCHS


def _weights(rng, *shape):
    return (rng.standard_normal(shape) * 0.1).astype("float32")


def _inputs(graph: hexir.Graph, rng) -> list[np.ndarray]:
    return [rng.standard_normal(v.type.shape).astype("float32") for v in graph.inputs]


def convnet(rng) -> hexir.Graph:
    """Convolutions, pools, a residual add (an in-place candidate), a reshape and a dense."""
    g = hexir.GraphBuilder("convnet")
    x = g.input("image", (1, 3, 12, 12))
    h = g.relu(g.conv2d(x, g.constant(_weights(rng, 8, 3, 3, 3)), padding=1))
    h = g.max_pool2d(h, kernel=2)
    skip = h
    h = g.conv2d(h, g.constant(_weights(rng, 8, 8, 3, 3)), padding=1)
    h = g.relu(g.add(h, skip))
    h = g.reshape(g.global_avg_pool2d(h), (1, 8))
    return g.build([g.softmax(g.dense(h, g.constant(_weights(rng, 5, 8))))])


@pytest.fixture(autouse=True)
def _given_peak():
    # A given peak: these tests are about the rows, not the clock measurement (tested below).
    with knobs.scope(cpu_peak_gflops=100.0):
        yield


def _profile(graph: hexir.Graph, rng, repeats: int = 3) -> tuple[hexir.Module, Profile, list]:
    module = hexir.compile(graph, target="cpu")
    inputs = _inputs(graph, rng)
    return module, module.profile(inputs, repeats=repeats, warmup=1), inputs


def test_every_command_appears_exactly_once(rng):
    module, p, _ = _profile(convnet(rng), rng)
    assert sorted(r.index for r in p.rows) == list(range(len(module.commands)))
    for row in p.rows:
        command, report = module.commands[row.index], module.report[row.index]
        assert row.kernel == module.kernels[command.kernel].func.name == report.name
        assert row.ops == report.ops
        assert row.schedule == report.schedule == "default"
        assert row.shapes == tuple(module.value_type(n).shape for n in command.outputs)
    assert [r.seconds for r in p.rows] == sorted((r.seconds for r in p.rows), reverse=True)


def test_times_are_positive_and_shares_add_up_to_one(rng):
    _, p, _ = _profile(convnet(rng), rng)
    totals = (p.end_to_end, p.command_seconds, p.in_commands, p.ratio)
    for value in (*(r.seconds for r in p.rows), *totals):
        assert value > 0 and math.isfinite(value)
    assert p.ratio == p.in_commands / p.end_to_end
    assert sum(r.share for r in p.rows) == pytest.approx(1.0)
    assert all(0 < r.share <= 1 for r in p.rows)


def test_the_profiled_runs_leave_the_memory_plan_intact(rng):
    graph = convnet(rng)
    module, p, inputs = _profile(graph, rng)
    assert module.plan.storage_sizes  # the intermediates share storages
    expected = evaluate(graph, inputs)
    for got in (p.outputs, module.run(inputs), module.run(inputs, plan=False)):
        for out, ref in zip(got, expected, strict=True):
            np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-5)


def _one_kernel(build) -> hexir.Graph:
    g = hexir.GraphBuilder("one")
    return g.build([build(g)])


def _row_flops(graph: hexir.Graph, rng) -> int:
    _, p, _ = _profile(graph, rng, repeats=1)
    (row,) = p.rows
    return row.flops


def test_flops_of_a_matmul_kernel(rng):
    m, k, n = 8, 24, 16
    graph = _one_kernel(lambda g: g.matmul(g.input("a", (m, k)), g.input("b", (k, n))))
    assert _row_flops(graph, rng) == 2 * m * n * k


def test_flops_of_a_dense_kernel_with_its_epilogue(rng):
    m, k, n = 8, 24, 16

    def dense(g):
        w, b = g.constant(_weights(rng, n, k)), g.constant(_weights(rng, n))
        return g.relu(g.bias_add(g.dense(g.input("x", (m, k)), w), b))

    # the multiply-adds, then one add (bias) and one max (relu) per output element
    assert _row_flops(_one_kernel(dense), rng) == 2 * m * n * k + m * n + m * n


def test_flops_of_a_conv2d_kernel(rng):
    n, c, h, w, k, r, s = 1, 4, 10, 10, 6, 3, 3
    graph = _one_kernel(
        lambda g: g.conv2d(
            g.input("x", (n, c, h, w)), g.constant(_weights(rng, k, c, r, s)), stride=2, padding=1
        )
    )
    oh = ow = 5  # (10 + 2 - 3) // 2 + 1
    assert _row_flops(graph, rng) == 2 * n * k * oh * ow * c * r * s


def test_flops_of_an_elementwise_kernel(rng):
    graph = _one_kernel(lambda g: g.add(g.input("a", (6, 7)), g.input("b", (6, 7))))
    assert _row_flops(graph, rng) == 6 * 7


@pytest.mark.parametrize("tile", [2, 4])
def test_flops_of_a_winograd_transform_count_one_case_an_element(tile):
    # Each element of (Bt d B) is one case of a select chain on its (u, v): a weighted sum of
    # at most a x a pixels, under 2 a^2 operations. Counting every case's arithmetic (a^2
    # cases) made F(4x4)'s input transform 784 operations an element, 31x its real cost.
    import math

    from hexir.ir.analysis import flop_count
    from hexir.search.scheduler import extract_tasks

    a = tile + 2
    g = hexir.GraphBuilder("w")
    x = g.input("x", (1, 2 + 3 * tile, 2 + 3 * tile, 16))
    graph = g.build(g.winograd_input(x, tile=tile))
    (task,) = (t for t in extract_tasks(graph, "cpu") if t.name == "winograd_input")
    elements = math.prod(task.func.params[-1].shape)
    assert 1 <= flop_count(task.func) / elements < 2 * a * a


def test_flops_per_op():
    g = hexir.GraphBuilder("ops")
    x = g.input("x", (2, 8, 9, 9))
    grouped = g.conv2d(x, g.input("w", (4, 2, 3, 3)), groups=4)  # 2 channels per filter
    pooled = g.max_pool2d(x, kernel=3, stride=2)
    graph = g.build([grouped, pooled, g.reshape(x, (2, 648)), g.softmax(x)])
    flops = {op.kind: op_flops(op) for op in graph.ops}
    assert flops["conv2d"] == 2 * (2 * 4 * 7 * 7) * (2 * 3 * 3)
    assert flops["max_pool2d"] == (2 * 8 * 4 * 4) * 9
    assert flops["reshape"] == 0
    assert flops["softmax"] == 5 * x.type.size


def test_command_ops_are_the_fusion_groups(rng):
    module = hexir.compile(zoo.mlp(batch=4, sizes=(32, 16, 8)), target="cpu")
    groups = [command_ops(module.graph, c) for c in module.commands]
    assert [tuple(op.kind for op in ops) for ops in groups] == [r.ops for r in module.report]
    names = [op.result.name for ops in groups for op in ops]
    assert len(names) == len(set(names))  # no op in two commands


def test_the_table_lists_every_row_and_the_totals(rng):
    module, p, _ = _profile(convnet(rng), rng)
    text = str(p)
    lines = text.splitlines()
    assert lines[0].startswith(f"profile of @convnet on cpu ({module.target.key})")
    assert "peak 100.0 GFLOP/s fp32 = HEXIR_CPU_PEAK_GFLOPS" in lines[1]
    assert lines[2].split() == [
        "#", "kernel", "ops", "output", "ms", "share", "GFLOP/s", "of", "peak", "schedule"
    ]  # fmt: skip
    for row, line in zip(p.rows, lines[3:], strict=False):
        assert line.split()[:3] == [str(row.index), row.kernel, "+".join(row.ops)]
    assert "sum of commands" in text and "end to end" in text
    assert lines[-1].startswith("in commands / end to end = ")


def test_a_cuda_module_profiles_only_where_it_runs(rng):
    graph = zoo.mlp(batch=4, sizes=(32, 16, 8))
    module = hexir.compile(graph, target="cuda -arch=sm_90")
    from hexir.runtime.cuda_kernel import gpu_unavailable_reason

    if gpu_unavailable_reason() is None:
        pytest.skip("a GPU is here: tests/gpu/test_gpu_module.py profiles on it")
    with pytest.raises(TargetError, match="no GPU to run on"):
        module.profile(_inputs(graph, rng), repeats=1)


# -- the peak ----------------------------------------------------------------------------------


def test_a_given_cpu_peak_is_the_knob():
    assert hexir.Target("cpu").peak().flops == 100.0e9


def test_the_cpu_peak_is_derived_from_a_clock_measured_once(tmp_path, monkeypatch):
    target = hexir.Target("cpu")
    with knobs.scope(cpu_peak_gflops=0.0, cache_dir=str(tmp_path)):
        first = target.peak()
        (cached,) = (tmp_path / "peak").glob(f"{target.key}-*.json")
        clock = json.loads(cached.read_text())["clock_hz"]

        def measured_again(*args, **kwargs):
            raise AssertionError("the clock is measured once and then read from the cache")

        monkeypatch.setattr(peak_module, "measure_cpu_clock", measured_again)
        second = target.peak()
    lanes = target.num_cores * target.vector_width * 2 * 2
    assert first.flops == second.flops == pytest.approx(lanes * clock)
    assert 0 < first.flops < math.inf and "measured now" in first.how and "cached" in second.how


@pytest.mark.serial
def test_the_cpu_bandwidth_is_measured_once(tmp_path, monkeypatch):
    target = hexir.Target("cpu")
    first = peak_module.bandwidth(target, str(tmp_path))
    (cached,) = (tmp_path / "peak").glob("*.bandwidth-cache.json")
    rate = json.loads(cached.read_text())["bytes_per_s"]

    def measured_again(*args, **kwargs):
        raise AssertionError("the bandwidth is measured once and then read from the cache")

    monkeypatch.setattr(peak_module, "measure_cpu_bandwidth", measured_again)
    second = peak_module.bandwidth(target, str(tmp_path))
    assert first.bytes_per_s == second.bytes_per_s == rate
    # A copy moves bytes faster than a core adds floats (a few GB/s) and slower than light.
    assert 1e9 < rate < 1e13 and "measured now" in first.how and "cached" in second.how
    gpu = peak_module.bandwidth(hexir.Target("cuda -arch=sm_90"), str(tmp_path))
    assert gpu.bytes_per_s == pytest.approx(3.35e12) and "GB/s" in str(gpu)


@pytest.mark.serial
def test_the_memory_bandwidth_is_a_copy_past_the_caches_measured_once(tmp_path, monkeypatch):
    target = hexir.Target("cpu")
    sizes = []
    measure = peak_module.measure_cpu_bandwidth

    def measuring(*args, size, **kwargs):
        sizes.append(size)
        return measure(*args, size=size, **kwargs)

    monkeypatch.setattr(peak_module, "measure_cpu_bandwidth", measuring)
    first = peak_module.bandwidth(target, str(tmp_path), memory=True)
    second = peak_module.bandwidth(target, str(tmp_path), memory=True)
    (cached,) = (tmp_path / "peak").glob("*.bandwidth-memory.json")
    assert sizes == [peak_module.MEMORY_BANDWIDTH_BYTES] and sizes[0] >= 4 * (32 << 20)
    assert first.bytes_per_s == second.bytes_per_s == json.loads(cached.read_text())["bytes_per_s"]
    assert 1e9 < first.bytes_per_s < 1e13 and "128 MiB copy" in first.how
    assert not list((tmp_path / "peak").glob("*.bandwidth-cache.json"))  # the cache's: apart


def test_the_cuda_peak_comes_from_the_arch_table():
    peak = hexir.Target("cuda -arch=sm_90").peak()
    assert peak.flops == pytest.approx(132 * 1.98e9 * 128 * 2)  # ~66.9 TFLOP/s
    assert "132 SMs" in peak.how
    for arch in CUDA_ARCHS:
        assert hexir.Target(f"cuda -arch={arch}").peak().flops > 1e12


def _tuned_first_dense(graph: hexir.Graph, url: str) -> str:
    """Record, for the first kernel of `graph` (a dense, as compile builds it), its default
    schedule and one with the rows split in parallel, the latter far faster: a build with
    the database then takes it (past TUNED_MARGIN). Its workload key."""
    from hexir.database import Database
    from hexir.graph.fusion import fused_kernels
    from hexir.runtime.default_schedule import default_schedule
    from hexir.search.measure import MeasureResult

    func = fused_kernels(graph)[1][0][1]
    sch = hexir.Schedule(func, seed=0)
    i, _, _ = sch.get_loops(sch.get_block("matmul"))
    sch.parallel(sch.split(i, [None, 8])[0])
    db = Database(url)
    db.commit_record(func, "cpu", default_schedule(func, "cpu").trace, MeasureResult((1e-3,)))
    db.commit_record(func, "cpu", sch.trace, MeasureResult((1e-4,)))
    return hexir.workload_key(func)


def test_compare_pairs_each_command_of_a_tuned_build_with_the_default_one(rng, tmp_path):
    graph = zoo.mlp(batch=16, sizes=(64, 32, 8))
    url = f"sqlite:///{tmp_path / 'tuning.db'}"
    key = _tuned_first_dense(graph, url)
    default, tuned = hexir.compile(graph, "cpu"), hexir.compile(graph, "cpu", database=url)
    assert [r.schedule for r in tuned.report].count("tuned") == 1
    c = compare(default, tuned, _inputs(graph, rng), repeats=3, warmup=1)
    assert not c.forms_differ and c.repeats == 3
    assert sorted(r.index for r in c.rows) == list(range(len(tuned.commands)))
    for row in c.rows:
        report = tuned.report[row.index]
        assert row.kernel == report.name and row.schedule == report.schedule
        assert (report.workload_key == key) == (row.schedule == "tuned")
        for value in (row.default_seconds, row.tuned_seconds, row.speedup):
            assert value > 0 and math.isfinite(value)
        assert row.saved == row.default_seconds - row.tuned_seconds
    assert [r.saved for r in c.rows] == sorted((r.saved for r in c.rows), reverse=True)
    assert c.default_end_to_end > 0 and c.tuned_end_to_end > 0
    assert c.speedup > 0 and c.in_commands_speedup > 0
    text = str(c)
    assert text.splitlines()[0].startswith("tuned against default schedules, @mlp on cpu")
    assert "sum of commands" in text and "tuned commands faster than their default: " in text
    assert "end to end: default " in text.splitlines()[-1]


def test_compare_of_builds_with_other_conv_forms_is_end_to_end_only(rng):
    g = hexir.GraphBuilder("conv")
    x = g.input("x", (1, 8, 28, 28))
    graph = g.build([g.relu(g.conv2d(x, g.constant(_weights(rng, 8, 8, 3, 3)), padding=1))])
    with knobs.scope(winograd="0"):
        direct = hexir.compile(graph, "cpu")
    with knobs.scope(winograd="4"):
        winograd = hexir.compile(graph, "cpu")
    assert len(direct.commands) != len(winograd.commands)
    c = compare(direct, winograd, _inputs(graph, rng), repeats=2, warmup=0)
    assert c.forms_differ and c.rows == () and c.speedup > 0
    assert "do not pair up: end to end only" in str(c)


def test_compare_refuses_no_runs(rng):
    module = hexir.compile(convnet(rng), "cpu")
    with pytest.raises(hexir.HexirError, match="repeats >= 1"):
        compare(module, module, _inputs(module.graph, rng), repeats=0)
