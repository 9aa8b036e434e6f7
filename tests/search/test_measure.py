"""Measurement: real matmul schedules built in parallel and timed one at a time, and planted
candidates that crash, hang or compute the wrong thing, each one error record."""

from __future__ import annotations

import itertools
import json
import threading

import numpy as np
import pytest

import hexir
from hexir import knobs
from hexir.errors import MeasureError, ScheduleError
from hexir.ir.keys import candidate_key
from hexir.ir.tir import PrimFunc
from hexir.ops.parse import parse
from hexir.runtime import cc
from hexir.runtime.cuda_kernel import gpu_unavailable_reason
from hexir.runtime.target import Target
from hexir.schedule import Schedule, Trace
from hexir.search import (
    ERROR_KINDS,
    BuildResult,
    Candidate,
    CpuBuilder,
    CpuRunner,
    CudaBuilder,
    CudaRunner,
    MeasureResult,
    measure,
)
from hexir.search.calibration import load

REPEATS = 3
WORKLOAD = hexir.workload("matmul", M=64, N=48, K=32)
UPDATE = "%C[vi0, vi1] = %C[vi0, vi1] + %A[vi0, vk0] * %B[vk0, vi1]"


@pytest.fixture
def quick(tmp_path):
    """A fresh build cache (so builds really compile), short timings, a 1 s timeout."""
    with knobs.scope(
        cache_dir=str(tmp_path / "cache"),
        timing_warmup=1,
        timing_repeats=REPEATS,
        timing_min_seconds=0.003,
        measure_timeout=1.0,
        num_threads=2,
    ):
        yield


@pytest.fixture
def runner():
    with CpuRunner() as r:
        yield r


def schedules() -> list[Candidate]:
    """Four real schedules of WORKLOAD through the public Schedule API, the first unscheduled."""
    cands = [Candidate.from_trace(WORKLOAD, Trace(), "cpu")]
    for factor, parallel in ((16, False), (8, True), (48, True)):
        sch = Schedule(WORKLOAD, seed=0)
        i, j, k = sch.get_loops(sch.get_block("matmul"))
        j0, j1 = sch.split(j, [None, factor])
        sch.reorder(i, j0, k, j1)
        sch.vectorize(j1)
        if parallel:
            sch.parallel(i)
        cands.append(Candidate.from_trace(WORKLOAD, sch.trace, "cpu"))
    return cands


def planted(func: PrimFunc) -> Candidate:
    """A candidate whose 'schedule' is a hand-edited function under WORKLOAD's name."""
    return Candidate(WORKLOAD, Trace(), func, Target("cpu"), candidate_key(func))


def edited(old: str, new: str) -> PrimFunc:
    text = str(WORKLOAD)
    assert old in text
    result = parse(text.replace(old, new))
    assert isinstance(result, PrimFunc)
    return result


def crashing() -> Candidate:
    # Writes 7 GiB past the end of C: an unmapped page, a SIGSEGV.
    return planted(edited(UPDATE, UPDATE.replace("%C[vi0, vi1] =", "%C[vi0 + 30000000, vi1] =")))


def hanging() -> Candidate:
    # The whole matmul, a billion times over.
    lines = str(WORKLOAD).splitlines()
    text = "\n".join([lines[0], "for %t in 0..1000000000 serial {", *lines[1:-1], "}", lines[-1]])
    func = parse(text)
    assert isinstance(func, PrimFunc)
    return planted(func)


def wrong_init() -> Candidate:
    return planted(edited("= 0.0", "= 1.0"))


def half_written() -> Candidate:
    # Only the first 32 rows of C: the rest keeps its NaN poison.
    return planted(edited("for %i0 in 0..64 serial", "for %i0 in 0..32 serial"))


def assert_one_at_a_time(results: list[MeasureResult]) -> None:
    """Every run starts after every build ended, and after the previous run ended."""
    last_build = max(r.build_info["build_end"] for r in results)
    spans = [(r.build_info["run_start"], r.build_info["run_end"]) for r in results]
    assert spans[0][0] >= last_build
    for (_, end), (start, _) in itertools.pairwise(spans):
        assert start >= end


@pytest.mark.serial
def test_real_schedules_are_checked_and_timed(quick, runner):
    cands = schedules()
    assert len({c.candidate_key for c in cands}) == len(cands)
    results = measure(cands, CpuBuilder(workers=2), runner)
    for r in results:
        assert r.ok and r.error_kind is None and r.error_message is None, r.error_message
        assert len(r.latencies) == REPEATS and all(t > 0 for t in r.latencies)
        assert r.median is not None and r.median > 0
        assert r.build_info["build_workers"] == 2 and r.build_info["calls_per_latency"] >= 1
        json.dumps(r.build_info)
    # One worker measured them all (how fast each is belongs to benchmarks/, not to tests).
    assert len({r.build_info["worker_pid"] for r in results}) == 1
    assert_one_at_a_time(results)


def test_builds_run_in_parallel(quick, monkeypatch):
    # Every compile waits at a barrier for a second one: the four builds get through only
    # in pairs of compilers running at once.
    barrier = threading.Barrier(2, timeout=30.0)
    invoke = cc._invoke

    def in_pairs(command: list[str]):
        if "-o" in command and "c-header" not in command:  # a kernel's compile
            try:
                barrier.wait()
            except threading.BrokenBarrierError:
                pytest.fail("a compile waited alone: no other build ran beside it")
        return invoke(command)

    monkeypatch.setattr(cc, "_invoke", in_pairs)
    builds = CpuBuilder(workers=2).build(schedules())
    assert all(b.ok and b.path and "matmul" in b.source for b in builds)
    assert {b.info["build_workers"] for b in builds} == {2}


@pytest.mark.slow
@pytest.mark.serial
def test_planted_failures_cost_one_record_each(quick, runner):
    good = schedules()
    cands = [good[1], crashing(), good[2], hanging(), good[3], wrong_init(), half_written()]
    cands.append(good[0])
    results = measure(cands, CpuBuilder(workers=2), runner)
    kinds = [r.error_kind for r in results]
    assert kinds == [None, "crash", None, "timeout", None, "wrong_result", "wrong_result", None]
    for r in results:
        assert r.ok == (r.median is not None) == bool(r.latencies)
        json.dumps(r.build_info)
    crash, timeout, wrong, unwritten = results[1], results[3], results[5], results[6]
    assert "SIGSEGV" in (crash.error_message or "")
    assert "1 s timeout" in (timeout.error_message or "")
    assert "3072 of 3072 elements" in (wrong.error_message or "")
    assert "1536 of 3072 elements" in (unwritten.error_message or "")
    # The crash and the timeout each cost the worker; a wrong result does not.
    pids = [r.build_info["worker_pid"] for r in results]
    assert pids[0] == pids[1] != pids[2] == pids[3] != pids[4] == pids[5] == pids[6] == pids[7]
    assert_one_at_a_time(results)


@pytest.mark.serial
def test_candidates_timed_in_turn_are_checked_first_and_share_one_span(quick, runner):
    good = schedules()
    cands = [good[1], wrong_init(), good[2], good[3]]
    results = runner.run_in_turn(cands, CpuBuilder(workers=2).build(cands))
    assert [r.error_kind for r in results] == [None, "wrong_result", None, None]
    timed = [r for r in results if r.ok]
    for r in timed:
        assert len(r.latencies) == REPEATS and all(t > 0 for t in r.latencies)
        assert r.build_info["in_turn"] == 3 and r.build_info["calls_per_latency"] >= 1
        json.dumps(r.build_info)
    # One request: one worker, one span, one calibration kernel's ratio for the three of them;
    # each run's figure is that ratio or its own median over its fastest call, where larger.
    for key in ("worker_pid", "run_start", "run_end", "calibration_kernel"):
        assert len({r.build_info[key] for r in timed}) == 1, key
    for r in timed:
        assert r.calibration == load(r.build_info["calibration_kernel"], r.latencies)
    # Of two workloads (a conv's two forms are), each is checked against its own workload's
    # reference, and those that pass are timed in turn; one alone is run as `run` runs it.
    other = Candidate.from_trace(hexir.workload("matmul", M=8, N=8, K=8), Trace(), "cpu")
    mixed = [good[1], other, wrong_init()]
    results = runner.run_in_turn(mixed, CpuBuilder(workers=1).build(mixed))
    assert [r.error_kind for r in results] == [None, None, "wrong_result"]
    assert [r.build_info["in_turn"] for r in results[:2]] == [2, 2]
    assert results[0].build_info["run_start"] == results[1].build_info["run_start"]
    (alone,) = runner.run_in_turn(good[:1], CpuBuilder(workers=1).build(good[:1]))
    assert alone.ok and "in_turn" not in alone.build_info


@pytest.mark.slow
@pytest.mark.serial
def test_a_batch_that_crashes_the_worker_in_turn_is_run_one_at_a_time(quick, runner):
    good = schedules()
    cands = [good[1], crashing(), good[2]]
    results = runner.run_in_turn(cands, CpuBuilder(workers=2).build(cands))
    assert [r.error_kind for r in results] == [None, "crash", None]
    assert "SIGSEGV" in (results[1].error_message or "")
    assert all("in_turn" not in r.build_info for r in results)
    assert_one_at_a_time(results)


def test_a_failed_build_is_a_build_record(quick, runner):
    with knobs.scope(cflags="-O3 -fno-such-flag-for-hexir"):
        builds = CpuBuilder(workers=1).build(schedules()[:1])
        (result,) = runner.run(schedules()[:1], builds)
    assert not builds[0].ok and builds[0].path is None
    assert result.error_kind == "build" and "fno-such-flag" in (result.error_message or "")
    assert result.median is None and result.latencies == ()


@pytest.mark.serial
def test_a_reference_that_fails_raises(quick, runner):
    # The workload itself crashes: nothing can be checked, so the runner refuses.
    bad = crashing().func
    cand = Candidate(bad, Trace(), WORKLOAD, Target("cpu"), candidate_key(WORKLOAD))
    builds = CpuBuilder(workers=1).build([cand])
    with pytest.raises(MeasureError, match="unscheduled kernel .*SIGSEGV"):
        runner.run([cand], builds)
    # The runner goes on with a new worker.
    (ok,) = measure(schedules()[:1], CpuBuilder(workers=1), runner)
    assert ok.ok


def test_candidate_from_trace_and_schedule():
    sch = Schedule(WORKLOAD, seed=0)
    i, _, _ = sch.get_loops(sch.get_block("matmul"))
    sch.split(i, sch.sample_perfect_tile(i, n=2))
    cand = Candidate.from_trace(WORKLOAD, Trace.from_json(sch.trace.to_json()), "cpu")
    assert cand == Candidate.from_schedule(WORKLOAD, sch, Target("cpu"))
    assert cand.func == sch.func and cand.candidate_key == candidate_key(sch.func)
    assert cand.workload_key == hexir.workload_key(WORKLOAD) != cand.candidate_key
    index, _ = sch.trace.decisions[0]
    with pytest.raises(ScheduleError):
        Candidate.from_trace(WORKLOAD, sch.trace.with_decision(index, [5, 5]), "cpu")


def test_measure_result_invariants():
    ok = MeasureResult((3.0, 1.0, 2.0), build_info={"build_seconds": 0.5})
    assert ok.ok and ok.median == 2.0 and ok.error_kind is None
    err = MeasureResult.error("timeout", "x" * 10_000)
    assert not err.ok and err.median is None and len(err.error_message or "") <= 4000
    assert set(ERROR_KINDS) >= {"schedule", "build", "run", "wrong_result", "timeout", "crash"}
    with pytest.raises(ValueError, match="unknown error kind"):
        MeasureResult.error("segfault", "no such kind")
    with pytest.raises(ValueError):
        MeasureResult()  # neither latencies nor an error
    with pytest.raises(ValueError):
        BuildResult(error_kind="oops")


def gpu_candidates() -> list[Candidate]:
    """A thread-bound schedule of WORKLOAD for CUDA, and a wrong one."""
    sch = Schedule(WORKLOAD, seed=0)
    i, j, _ = sch.get_loops(sch.get_block("matmul"))
    sch.bind(i, "blockIdx.x")
    sch.bind(j, "threadIdx.x")
    good = Candidate.from_schedule(WORKLOAD, sch, "cuda -arch=sm_90")
    wrong = edited("= 0.0", "= 1.0")
    wsch = Schedule(wrong, seed=0)
    wi, wj, _ = wsch.get_loops(wsch.get_block("matmul"))
    wsch.bind(wi, "blockIdx.x")
    wsch.bind(wj, "threadIdx.x")
    bad = Candidate(WORKLOAD, Trace(), wsch.func, good.target, candidate_key(wsch.func))
    return [good, bad]


def test_cuda_builder_compiles_with_nvrtc_without_a_gpu(tmp_path):
    with knobs.scope(cache_dir=str(tmp_path)):
        builds = CudaBuilder(workers=2).build(gpu_candidates())
    for b in builds:
        assert b.ok, b.error_message
        assert b.kernel is not None and "__global__" in b.source
        assert "registers" in b.info["resources"]
        json.dumps(b.info)
    with CudaRunner() as runner:
        assert runner.run([], []) == []


@pytest.mark.slow  # a worker process started for each record
def test_the_cuda_runner_says_there_is_no_gpu_in_each_record(tmp_path):
    # Its worker process, not this one, reaches the driver: where there is none, each built
    # candidate is a "run" error that says so, and the runner goes on to the next.
    if gpu_unavailable_reason() is None:
        pytest.skip("this machine has a GPU: tests/gpu measures there")
    candidates = gpu_candidates()
    with knobs.scope(cache_dir=str(tmp_path)):
        builds = CudaBuilder(workers=1).build(candidates)
        with CudaRunner() as runner:
            results = runner.run(candidates, builds)
    assert [r.error_kind for r in results] == ["run", "run"]
    assert all("no GPU to run on" in r.error_message for r in results)


def test_a_cuda_candidate_that_spills_is_a_resource_error_not_a_measurement(tmp_path):
    from hexir.schedule.handwritten import Tiling, gpu_schedule

    func = hexir.workload("matmul", M=512, N=512, K=64)
    sch = gpu_schedule(func, Tiling(ty=2, tx=32, mi=16, nj=16, bk=8))  # 256 outputs a thread
    candidate = Candidate.from_schedule(func, sch, "cuda -arch=sm_90")
    with knobs.scope(cache_dir=str(tmp_path)):
        (result,) = CudaBuilder(workers=1).build([candidate])
    assert result.error_kind == "resource" and result.kernel is None
    assert "spills" in result.error_message and result.info["resources"]["spill_bytes"] > 0


class _Clock:
    """A kernel whose every call takes `seconds` (as `CpuKernel.time` reports it)."""

    def __init__(self, seconds: float) -> None:
        self.seconds, self.calls = seconds, 0

    def time(self, *arrays) -> float:  # noqa: ANN002 - CpuKernel.time's signature
        k = knobs.get()
        n = k.timing_warmup + max(k.timing_repeats, 1)
        self.calls += n
        return self.seconds

    def __call__(self, *arrays) -> None:  # noqa: ANN002 - CpuKernel's
        self.calls += 1


class _Shifting:
    """Kernels on a host whose speed halves for a stretch of calls (a two-core VM's shifts),
    whatever kernel they are: `kernel(seconds)` is one taking `seconds` a call at full speed."""

    def __init__(self, slow: range) -> None:
        self.slow, self.order = slow, []

    def kernel(self, seconds: float) -> _Clock:
        host = self

        class Shifted(_Clock):
            def time(self, *arrays) -> float:  # noqa: ANN002
                super().time(*arrays)
                host.order.append(self)
                return self.seconds * (2 if len(host.order) in host.slow else 1)

        return Shifted(seconds)


def test_kernels_timed_in_turn_call_each_in_turn_and_share_the_hosts_shifts(monkeypatch):
    from hexir.search import worker

    flushed = []
    monkeypatch.setattr(worker, "flush_arrays", lambda arrays: flushed.append(arrays))
    big = [np.empty(worker.COLD_BYTES + 1, dtype=np.uint8)]
    with knobs.scope(timing_warmup=1, timing_repeats=4, timing_min_seconds=0.016):
        # One after the other, the second kernel timed while the host is slow: it reads
        # 2.2x the first, for 1.1x.
        host = _Shifting(slow=range(1000, 2000))
        a, b = host.kernel(0.001), host.kernel(0.0011)
        first, _ = worker.time_kernel(a, [], first=0.001)
        host.order.extend([None] * (1000 - len(host.order)))  # the host slows down here
        second, _ = worker.time_kernel(b, [], first=0.001)
        assert np.median(second) / np.median(first) == pytest.approx(2.2)
        # In turn, through a slow stretch: every turn a call of each, in order, and each
        # latency group sees the same shifts, so the ratio stands at 1.1.
        host = _Shifting(slow=range(7, 20))
        a, b, c = host.kernel(0.001), host.kernel(0.0011), host.kernel(0.001)
        (la, na), (lb, nb), (lc, nc) = worker.time_in_turn([(a, []), (b, []), (c, big)])
        assert host.order == [a, b, c] * (len(host.order) // 3)
        # a turn takes 3.1 ms: 16 ms of each kernel's calls are ~15 turns, ~4 a latency
        assert na == nb == nc == 4 and len(la) == len(lb) == len(lc) == 4
        assert len(host.order) == 3 * (1 + 1 + 4 * 4)  # warm-up, sizing, then the turns
        assert [y / x for x, y in zip(la, lb, strict=True)] == pytest.approx([1.1] * 4)
        # Only the cold kernel's arrays are flushed, before each of its calls.
        assert len(flushed) == len(host.order) // 3 and all(f is big for f in flushed)
        assert worker.time_in_turn([]) == []


def test_a_slow_candidate_is_timed_in_fewer_calls():
    from hexir.search.worker import time_kernel

    with knobs.scope(timing_repeats=10, timing_min_seconds=0.05, timing_max_seconds=1.0):
        fast = _Clock(0.001)
        latencies, number = time_kernel(fast, [], first=0.001)
        assert len(latencies) == 10 and number == 5  # 10 x 5 calls of 1 ms = 50 ms
        slow = _Clock(0.5)
        latencies, number = time_kernel(slow, [], first=0.5)
        # The check call stood for warm-up and the first timing; 3 repeats, one call each.
        assert len(latencies) == 3 and number == 1 and slow.calls == 3


def test_a_candidate_past_its_cutoff_is_timed_by_one_warm_call():
    from hexir.search.worker import time_kernel

    with knobs.scope(timing_repeats=10, timing_min_seconds=0.05, timing_max_seconds=1.0):
        slow = _Clock(0.01)
        latencies, number = time_kernel(slow, [], first=0.01, cutoff=0.003)
        assert latencies == [0.01] and number == 1 and slow.calls == 1
        # Under the cutoff, or a cold first call that the warm one puts right: timed in full.
        for first, cutoff in [(0.01, 0.05), (0.02, 0.012)]:
            clock = _Clock(0.01)
            latencies, _ = time_kernel(clock, [], first=first, cutoff=cutoff)
            assert len(latencies) == 10 and clock.calls > 10


def test_a_candidate_slower_than_near_is_timed_by_three_latencies(monkeypatch):
    from hexir.search import worker

    monkeypatch.setattr(worker, "flush_arrays", lambda arrays: None)
    big = [np.empty(worker.COLD_BYTES + 1, dtype=np.uint8)]
    with knobs.scope(timing_repeats=10, timing_min_seconds=0.05, timing_max_seconds=1.0):
        for arrays in ([], big):  # warm (5 calls a latency) and cold (one)
            far = _Clock(0.001)
            latencies, _ = worker.time_kernel(far, arrays, first=0.001, near=0.0008)
            assert len(latencies) == worker.MIN_SLOW_REPEATS
            # Within `near` (or none given): all ten, and seven more latencies' calls.
            for near in (0.002, None):
                close = _Clock(0.001)
                latencies, number = worker.time_kernel(close, arrays, first=0.001, near=near)
                assert len(latencies) == 10
                assert close.calls - far.calls == 7 * number


def test_a_kernel_of_large_arrays_is_timed_cold_one_call_at_a_time(monkeypatch):
    from hexir.search import worker

    evictions = []
    monkeypatch.setattr(worker, "flush_arrays", lambda arrays: evictions.append(arrays))
    big = [np.empty(worker.COLD_BYTES + 1, dtype=np.uint8)]
    with knobs.scope(timing_repeats=10, timing_min_seconds=0.05, timing_max_seconds=1.0):
        clock = _Clock(0.001)
        latencies, number = worker.time_kernel(clock, big, first=0.001)
        assert len(latencies) == 10 and number == 1 and clock.calls == 10 == len(evictions)
        assert all(flushed is big for flushed in evictions)  # the kernel's own arrays
        slow = _Clock(0.4)  # past timing_max_seconds: the fewest repeats
        latencies, number = worker.time_kernel(slow, big, first=0.4)
        assert len(latencies) == worker.MIN_SLOW_REPEATS and number == 1
        cut = _Clock(0.01)
        latencies, number = worker.time_kernel(cut, big, first=0.01, cutoff=0.003)
        assert latencies == [0.01] and cut.calls == 1
        small = _Clock(0.001)  # under COLD_BYTES: warm, several calls a latency
        assert worker.time_kernel(small, [big[0][:1024]], first=0.001)[1] == 5


@pytest.mark.parametrize("how", ["lines", "everything"])
@pytest.mark.serial
def test_emptying_the_caches_slows_a_kernel_whose_data_fit_in_them(how):
    import platform

    from hexir.runtime import cache_flush

    if how == "lines" and platform.machine().lower() not in ("x86_64", "amd64"):
        pytest.skip("the arrays' lines are flushed on x86-64 only (elsewhere: everything)")
    a = np.random.default_rng(0).standard_normal(1 << 20, dtype=np.float32)  # 4 MB
    b = np.empty_like(a)
    flush = {"lines": cache_flush.flush_arrays, "everything": lambda _: cache_flush._evict_all()}

    def copy() -> None:  # bound by the memory it moves (a sum of it is half compute)
        np.copyto(b, a)

    copy()
    warm = min(_timed(copy) for _ in range(20))
    cold = []
    for _ in range(20):
        flush[how]([a, b])
        cold.append(_timed(copy))
    assert sorted(cold)[10] > 1.5 * warm  # from memory, not from cache (here 3.4-4x)


def _timed(f) -> float:  # noqa: ANN001
    import time

    start = time.perf_counter()
    f()
    return time.perf_counter() - start


@pytest.mark.serial
def test_the_runner_cuts_a_slow_candidate_short(quick, runner):
    import dataclasses

    unscheduled, *rest = schedules()
    builds = CpuBuilder(workers=2).build([unscheduled, rest[0]])
    cut = dataclasses.replace(unscheduled, cutoff=1e-9)
    (whole,) = runner.run([unscheduled], builds[:1])
    (short,) = runner.run([cut], builds[:1])
    assert whole.ok and short.ok and len(whole.latencies) == REPEATS
    assert len(short.latencies) == 1 and short.build_info["cut"] is True
    assert "cut" not in whole.build_info
    # A cutoff above its time: in full.
    (fast,) = runner.run([dataclasses.replace(rest[0], cutoff=10.0)], builds[1:])
    assert fast.ok and len(fast.latencies) == REPEATS and "cut" not in fast.build_info


def test_a_kernel_timed_in_turn_is_called_untimed_before_each_timed_call():
    """In turn, the other kernels' calls take the caches: each timed call of a kernel comes
    right after untimed ones (its arrays warm, as in its trials and a model's run), but a
    cold kernel's (arrays past COLD_BYTES), whose arrays are flushed before each call."""
    from hexir.search.worker import COLD_BYTES, WARM_CALLS, time_in_turn

    events: list[tuple[str, str]] = []

    class Recording:
        def __init__(self, name: str) -> None:
            self.name = name

        def __call__(self, *arrays: np.ndarray) -> None:
            events.append(("call", self.name))

        def time(self, *arrays: np.ndarray) -> float:
            events.append(("time", self.name))
            return 1e-3

    small = [np.ones(1024, np.float32)]
    large = [np.ones(COLD_BYTES // 4 + 1024, np.float32)]
    with knobs.scope(timing_warmup=1, timing_repeats=2, timing_min_seconds=0.0):
        times = time_in_turn([(Recording("a"), small), (Recording("big"), large),
                              (Recording("b"), small)])  # fmt: skip
    assert [t for t, _ in times] == [[1e-3, 1e-3]] * 3
    warm = [("call", "a")] * WARM_CALLS, [("call", "b")] * WARM_CALLS
    turn = [*warm[0], ("time", "a"), ("time", "big"), *warm[1], ("time", "b")]
    assert WARM_CALLS >= 1
    # The warm-up turn, the turn that sizes the calls, then two latencies of one call each.
    assert events == turn * 4
