"""Executors: LocalExecutor in this process, and RayExecutor on a real local Ray cluster of two
CPUs (one cluster for the module: it takes seconds to start) measuring sampled schedules and
planted failures exactly as the local one does, in order, and cleaning up after itself; and a
node (or this machine) refusing candidates for another CPU than its own."""

from __future__ import annotations

import dataclasses
import itertools
import json
import os
import pickle
import random
import signal
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import ray

import hexir
from hexir import knobs
from hexir.errors import MeasureError
from hexir.ir.keys import candidate_key
from hexir.ir.tir import PrimFunc
from hexir.ops.parse import parse
from hexir.runtime.target import Target, host_key
from hexir.schedule import Schedule, Trace
from hexir.search.builders import CpuBuilder
from hexir.search.distributed import NodeRunner, RayExecutor, ShippedBuild, build_one
from hexir.search.executor import LocalExecutor, MeasureExecutor
from hexir.search.measure import Candidate, MeasureResult
from hexir.search.space import SearchSpace

WORKLOAD = hexir.workload("matmul", M=64, N=48, K=32)
DENSE = hexir.workload("dense", M=16, N=24, K=32, activation="relu")
UPDATE = "%C[vi0, vi1] = %C[vi0, vi1] + %A[vi0, vk0] * %B[vk0, vi1]"
REPEATS = 3


@pytest.fixture(scope="module", autouse=True)
def quick(tmp_path_factory):
    """A fresh build cache, short timings and a 2 s timeout, for the whole module (the Ray
    workers get the driver's knobs with every call)."""
    with knobs.scope(
        cache_dir=str(tmp_path_factory.mktemp("cache")),
        timing_warmup=1,
        timing_repeats=REPEATS,
        timing_min_seconds=0.003,
        measure_timeout=2.0,
        measure_build_workers=2,
        num_threads=2,
    ):
        yield


@pytest.fixture(scope="module")
def cluster():
    """A RayExecutor on a local cluster of two CPUs it starts (and stops at the end)."""
    if ray.is_initialized():  # left by another module: these tests start their own cluster
        ray.shutdown()
    executor = RayExecutor("cpu", num_cpus=2)
    yield executor
    executor.close()


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


def wrong_init() -> Candidate:
    return planted(edited("= 0.0", "= 1.0"))


def half_written() -> Candidate:
    # Only the first 32 rows of C: the rest keeps its NaN poison.
    return planted(edited("for %i0 in 0..64 serial", "for %i0 in 0..32 serial"))


def hanging() -> Candidate:
    lines = str(WORKLOAD).splitlines()
    text = "\n".join([lines[0], "for %t in 0..1000000000 serial {", *lines[1:-1], "}", lines[-1]])
    func = parse(text)
    assert isinstance(func, PrimFunc)
    return planted(func)


def sampled(func: PrimFunc, n: int, seed: int) -> list[Candidate]:
    schedules = SearchSpace().sample_schedules(func, "cpu", random.Random(seed), n)
    return [Candidate.from_schedule(func, sch, "cpu") for sch in schedules]


def mixed() -> tuple[list[Candidate], list[str | None]]:
    """Sampled schedules of two workloads around planted failures, and the kinds expected."""
    good = sampled(WORKLOAD, 3, seed=1) + sampled(DENSE, 2, seed=2)
    cands = [good[0], crashing(), good[3], wrong_init(), good[1], half_written(), good[4]]
    cands.append(good[2])
    kinds = [None, "crash", None, "wrong_result", None, "wrong_result", None, None]
    return cands, kinds


def assert_builds_then_runs(results: list[MeasureResult]) -> None:
    """Every run started after the last build ended; runs did not overlap (one node)."""
    last_build = max(r.build_info["build_end"] for r in results)
    spans = sorted((r.build_info["run_start"], r.build_info["run_end"]) for r in results)
    assert spans[0][0] >= last_build
    for (_, end), (start, _) in itertools.pairwise(spans):
        assert start >= end


@pytest.mark.serial
def test_local_executor_builds_then_runs_in_order():
    cands = [*sampled(WORKLOAD, 2, seed=0), wrong_init()]
    executor: MeasureExecutor
    with LocalExecutor("cpu") as executor:
        assert executor.workers == 2 and executor.measure([]) == []
        results = executor.measure(cands)
        cuda = Candidate.from_schedule(WORKLOAD, Schedule(WORKLOAD, seed=0), "cuda -arch=sm_90")
        with pytest.raises(ValueError, match="use one executor per target"):
            executor.measure([cuda])
    assert [r.error_kind for r in results] == [None, None, "wrong_result"]
    assert all(len(r.latencies) == REPEATS for r in results[:2])
    assert_builds_then_runs(results)
    executor.close()  # a second close does nothing
    with pytest.raises(RuntimeError, match="closed"):
        executor.measure(cands)


@pytest.mark.serial
def test_a_library_missing_on_the_runners_node_is_written_from_its_bytes(tmp_path):
    # What a runner on another node than the builder sees: the path of a library it lacks.
    (cand,) = sampled(WORKLOAD, 1, seed=8)
    shipped = pickle.loads(pickle.dumps(build_one(cand, knobs.get())))
    assert shipped.build.ok and shipped.library and shipped.build.info["build_node"]
    elsewhere = str(tmp_path / "another-node" / os.path.basename(shipped.build.path))
    moved = ShippedBuild(dataclasses.replace(shipped.build, path=elsewhere), shipped.library)
    runner = NodeRunner(Target("cpu"))
    try:
        result = runner.run(cand, moved, knobs.get())
        assert runner.run(cand, shipped, knobs.get()).ok  # the cache's own path, as it is
    finally:
        runner.close()
    assert result.ok and len(result.latencies) == REPEATS and result.build_info["run_node"]
    assert result.build_info["run_target_key"] == host_key("cpu") == cand.target.key
    assert "run_node_id" in result.build_info  # None here, outside Ray
    assert not os.path.exists(elsewhere)


def another_cpu() -> Target:
    """A described CPU that is not this machine's (an ARM one here, an x86 one on ARM)."""
    other = "avx2,fma" if "neon" in Target("cpu").features else "neon"
    return Target(f"cpu -features={other} -cores=64")


@pytest.mark.serial
def test_a_node_of_another_cpu_refuses_the_candidates_naming_both_keys():
    # What a node of the cluster whose CPU is not the candidates' does: it probes its own and
    # refuses, where timing them would record this machine's times under the other's key.
    (cand,) = sampled(WORKLOAD, 1, seed=11)
    shipped = build_one(cand, knobs.get())
    theirs = dataclasses.replace(cand, target=another_cpu())
    expected = rf"has CPU target {host_key('cpu')}, but the candidates are for {theirs.target.key}"
    with pytest.raises(MeasureError, match=expected):
        build_one(theirs, knobs.get())
    runner = NodeRunner(theirs.target)
    try:
        with pytest.raises(MeasureError, match=expected):
            runner.run(theirs, shipped, knobs.get())
        assert runner.run(cand, shipped, knobs.get()).ok
    finally:
        runner.close()
    with pytest.raises(MeasureError, match="is another CPU than this machine's"):
        LocalExecutor(theirs.target)


def gpu_candidate() -> Candidate:
    sch = Schedule(WORKLOAD, seed=0)
    i, j, _ = sch.get_loops(sch.get_block("matmul"))
    sch.bind(i, "blockIdx.x")
    sch.bind(j, "threadIdx.x")
    return Candidate.from_schedule(WORKLOAD, sch, "cuda -arch=sm_90")


def test_a_cuda_build_crosses_the_cluster_with_its_cubin():
    shipped = build_one(gpu_candidate(), knobs.get())
    assert shipped.build.ok and shipped.library is None, shipped.build.error_message
    copy = pickle.loads(pickle.dumps(shipped))
    kernel: Any = copy.build.kernel
    assert kernel.binary.cubin == shipped.build.kernel.binary.cubin  # type: ignore[union-attr]
    assert "registers" in copy.build.info["resources"]


@pytest.mark.slow
@pytest.mark.serial
def test_ray_measures_what_the_local_executor_measures(cluster):
    cands, kinds = mixed()
    results = cluster.measure(cands)
    with LocalExecutor("cpu") as local:
        expected = local.measure(cands)
    assert [r.error_kind for r in expected] == kinds
    assert [r.error_kind for r in results] == kinds, [r.error_message for r in results]
    assert cluster.workers == 2
    node = ray.get_runtime_context().get_node_id()  # one node, this process's
    for r in results:
        assert type(r) is MeasureResult and r.ok == (r.median is not None)
        assert r.build_info["build_node"] and r.build_info["run_node"]
        if r.error_kind != "crash":
            assert r.build_info["run_node_id"] == node
            assert r.build_info["run_target_key"] == host_key("cpu")
        json.dumps(r.build_info)
    assert all(len(r.latencies) == REPEATS and min(r.latencies) > 0 for r in results if r.ok)
    # One crash record: the worker was replaced, the next candidates measured as usual.
    assert "SIGSEGV" in (results[1].error_message or "")
    pids = [r.build_info["worker_pid"] for r in results]
    assert pids[0] == pids[1] != pids[2] == pids[7]
    # The order is the candidates': each wrong result names how much of C was wrong.
    assert "3072 of 3072 elements" in (results[3].error_message or "")
    assert "1536 of 3072 elements" in (results[5].error_message or "")
    assert_builds_then_runs(results)


@pytest.mark.slow
@pytest.mark.serial
def test_ray_times_one_workloads_candidates_in_turn_as_the_local_executor_does(cluster):
    cands = [*sampled(WORKLOAD, 3, seed=5), wrong_init()]
    results = cluster.measure_in_turn(cands)
    with LocalExecutor("cpu") as local:
        expected = local.measure_in_turn(cands)
    kinds = [None, None, None, "wrong_result"]
    assert [r.error_kind for r in expected] == [r.error_kind for r in results] == kinds
    for r in [*results[:3], *expected[:3]]:
        assert r.build_info["in_turn"] == 3 and len(r.latencies) == REPEATS
    # One runner timed them in one span, on this node, its target key theirs.
    node = ray.get_runtime_context().get_node_id()
    for key in ("worker_pid", "run_start", "run_end", "run_node_id"):
        assert len({r.build_info[key] for r in results[:3]}) == 1, key
    assert results[0].build_info["run_node_id"] == node
    assert {r.build_info["run_target_key"] for r in results} == {host_key("cpu")}
    assert cluster.measure_in_turn([]) == []


@pytest.mark.slow
@pytest.mark.serial
def test_the_drivers_knobs_hold_on_the_workers(cluster):
    cands = sampled(WORKLOAD, 2, seed=3)
    with knobs.scope(cflags="-O3 -fno-such-flag-for-hexir"):
        failed = cluster.measure(cands)
    assert [r.error_kind for r in failed] == ["build", "build"]
    assert "fno-such-flag" in (failed[0].error_message or "")
    with knobs.scope(timing_repeats=5):
        (ok, _) = cluster.measure(cands)
    assert ok.ok and len(ok.latencies) == 5


@pytest.mark.slow
@pytest.mark.serial
def test_an_error_raised_on_a_worker_is_raised_as_itself(cluster):
    # The workload itself crashes: nothing can be checked, the runner actor raises.
    bad = crashing().func
    cand = Candidate(bad, Trace(), WORKLOAD, Target("cpu"), candidate_key(WORKLOAD))
    with pytest.raises(MeasureError, match="unscheduled kernel .*SIGSEGV") as info:
        cluster.measure([cand])
    assert type(info.value) is MeasureError  # not a Ray exception type
    (ok,) = cluster.measure(sampled(WORKLOAD, 1, seed=4))  # new runners
    assert ok.ok


@pytest.mark.slow
@pytest.mark.serial
def test_keyboard_interrupt_leaves_no_runner_behind(cluster):
    cand = hanging()
    library = library_of(cand)
    seen: list[int] = []

    def interrupt() -> None:
        seen.append(measuring(library))
        if seen[0]:
            os.kill(os.getpid(), signal.SIGINT)

    thread = threading.Thread(target=interrupt)
    # Python raises KeyboardInterrupt even where pytest runs in a background job (`cmd &` in
    # a script), which starts with SIGINT ignored.
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with knobs.scope(measure_timeout=60.0), pytest.raises(KeyboardInterrupt):
            thread.start()
            cluster.measure([cand])
        thread.join()
    finally:
        signal.signal(signal.SIGINT, previous)
    assert seen[0], "no measurement worker loaded the hanging candidate"
    assert runners(0) == 0, "the runner actor survived the interrupt"
    (ok,) = cluster.measure(sampled(WORKLOAD, 1, seed=5))
    assert ok.ok and runners(1) == 1


@pytest.mark.slow
@pytest.mark.serial
def test_a_batch_closed_after_its_results_keeps_its_runner_for_the_next(cluster):
    # The tuner reads a slice's results as they come, one per candidate, and closes the
    # iterator after the last: the runner and its worker process (with the workload's
    # reference) stay for the next slice, whose start would otherwise cost seconds.
    cands = sampled(WORKLOAD, 3, seed=11)
    each = cluster.measure_each(cands)
    taken = [r for _, r in zip(cands, each, strict=False)]
    each.close()
    assert [r.ok for r in taken] == [True] * 3
    (ok,) = cluster.measure(sampled(WORKLOAD, 1, seed=12))
    assert ok.ok and ok.build_info["worker_pid"] == taken[0].build_info["worker_pid"]
    assert runners(1) == 1


@pytest.mark.slow
@pytest.mark.serial
def test_a_runner_lost_mid_measure_costs_its_candidate_one_crash_record(cluster):
    # What a node that leaves the cluster does to the driver: the runner actor's process
    # ends while it times a candidate (here the hanging one, so it surely is timing it).
    cand = hanging()
    library = library_of(cand)
    killed: list[str] = []

    def kill_the_runner() -> None:
        worker = measuring(library)
        if worker:
            runner = parent_of(worker)
            killed.append(Path(f"/proc/{runner}/cmdline").read_text())
            os.kill(runner, signal.SIGKILL)

    thread = threading.Thread(target=kill_the_runner)
    thread.start()
    with knobs.scope(measure_timeout=60.0):
        results = cluster.measure([cand, *sampled(WORKLOAD, 2, seed=9)])
    thread.join()
    assert killed and "NodeRunner" in killed[0], killed
    assert [r.error_kind for r in results] == ["crash", None, None]
    assert "runner timing this candidate was lost" in (results[0].error_message or "")
    assert all(len(r.latencies) == REPEATS for r in results[1:])
    # The next batch gets a full set of runners again.
    assert runners(0) == 0
    (ok,) = cluster.measure(sampled(WORKLOAD, 1, seed=10))
    assert ok.ok and runners(1) == 1


def library_of(cand: Candidate) -> str:
    """The path of the candidate's library in the module's build cache: built here first, the
    cluster's build finds it there, and the runner (on this machine) loads it from there."""
    (build,) = CpuBuilder(workers=1).build([cand])
    assert build.ok and build.path, build.error_message
    return build.path


def measuring(library: str) -> int:
    """The pid of a measurement worker process that has loaded `library`, which it does only
    to call it: a runner is then inside that kernel. Waits for one (60 s at most; 0 if none)."""
    deadline = time.monotonic() + 60.0
    while time.monotonic() < deadline:
        for proc in Path("/proc").iterdir():
            if proc.name.isdigit() and _worker_with(proc, library):
                return int(proc.name)
        time.sleep(0.1)
    return 0


def _worker_with(proc: Path, library: str) -> bool:
    try:
        if "hexir.search.worker import serve" not in (proc / "cmdline").read_text():
            return False
        return library in (proc / "maps").read_text()
    except OSError:  # a process that ended meanwhile, or one of another user
        return False


def parent_of(pid: int) -> int:
    stat = Path(f"/proc/{pid}/stat").read_text()
    return int(stat.rpartition(")")[2].split()[1])  # after "pid (name) state"


def runners(expected: int) -> int:
    """How many Hexir runner actors live, once the cluster has caught up with kills (or
    after 10 s)."""
    deadline = time.monotonic() + 10.0
    while True:
        names = ray.util.list_named_actors(all_namespaces=True)
        count = sum(a["name"].startswith("hexir-runner") for a in names)
        if count == expected or time.monotonic() > deadline:
            return count
        time.sleep(0.2)


@pytest.mark.slow
@pytest.mark.serial
def test_a_cuda_target_needs_a_gpu_in_the_cluster(cluster):
    if ray.cluster_resources().get("GPU"):
        pytest.skip("this cluster has a GPU")
    with pytest.raises(MeasureError, match="no GPU"):
        RayExecutor("cuda -arch=sm_90")
    assert ray.is_initialized()  # the executor joined the running cluster: it stays up


@pytest.mark.slow
@pytest.mark.serial
def test_executors_close_cleanly_and_start_again(cluster):
    # A second executor uses the running cluster, and leaves it running when it closes.
    with RayExecutor("cpu") as second:
        (ok,) = second.measure(sampled(WORKLOAD, 1, seed=6))
        assert ok.ok and runners(2) == 2
    assert ray.is_initialized() and runners(1) == 1
    cluster.close()
    cluster.close()
    assert not ray.is_initialized()
    with pytest.raises(RuntimeError, match="closed"):
        cluster.measure(sampled(WORKLOAD, 1, seed=6))
    # A new executor starts a new cluster in the same process.
    with RayExecutor("cpu", num_cpus=2) as third:
        (ok,) = third.measure(sampled(WORKLOAD, 1, seed=7))
        assert ok.ok
    assert not ray.is_initialized()
