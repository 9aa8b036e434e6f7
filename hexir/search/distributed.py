"""Measurement across a Ray cluster: the only module of Hexir that imports Ray (lazily).

    with RayExecutor("cpu") as executor:                  # starts a local Ray cluster
        results = executor.measure(candidates)            # one MeasureResult each, in order
    RayExecutor("cpu", address="auto")                    # joins the cluster on this machine
    RayExecutor("cuda", address="ray://head:10001")       # joins a remote one (Ray Client)

Builders are Ray tasks (`build_one`, one CPU each); runners are Ray actors (`NodeRunner`): one
per node on a CPU cluster, each owning a CpuRunner (the crash- and timeout-proof worker
process), or one per GPU (`num_gpus=1`) for a CUDA target. A batch is built in full before
any of it is timed, so no node times a kernel while it compiles another; the runners then
take the built candidates one at a time, whichever runner is free next. Timings are only as
quiet as the cluster: run one tuning driver per cluster. The runners are placed when the
executor starts (and again after an error); nodes that join later are used for builds only.

What crosses the cluster is plain data: candidates without their traces (no worker reads
them), the driver's knobs (so `knobs.scope` holds on every worker, as it does for CpuRunner's
worker process), and `ShippedBuild`s. A CPU build is a shared library in the build node's
cache, and the node that times it may be another one, so a ShippedBuild carries the library's
bytes (tens of kilobytes): a runner uses the path where it exists on its node and otherwise
writes the bytes, with the C source, into a folder of its own. A CUDA build carries its
CudaKernel, which pickles with its CUBIN.

A Target crosses the cluster as the value it is on the driver (pickled, never probed again), so
a node knows what the candidates are for, and probes its own CPU to compare: every node must
have the candidates' CPU (one target key; the driver's own for `Target("cpu")`), and a node
that does not refuses the work with a MeasureError that names both keys, so that no time of
one machine is recorded under another's key. Each result says where it was timed: its
`build_info` gains `run_node` (the host name), `run_node_id` (the Ray node's id: several
nodes may share a host) and `run_target_key` (the key the runner probed on its node, which is
the candidates' key wherever a result is returned); builds add `build_node`.

Nothing of Ray leaves this module: results are MeasureResults, an exception raised in a task
or actor is raised here as itself (a HexirError stays a HexirError), and any other failure of
the cluster is a MeasureError. A runner lost while it times a candidate (its node left the
cluster, its process was killed) costs that candidate a "crash" record: the other runners
take the rest of the batch, or new ones where none is left, and the next batch starts a full
set on the nodes alive then. (Builds are Ray tasks, which Ray retries on another worker.)
After any exception, KeyboardInterrupt included, the executor cancels its builds and kills its
runner actors; the next `measure` starts new ones. A caller that stops reading `measure_each`
(closing it, as the tuner does after each slice's last result) stops only what still runs for
it: idle runners stay for the next batch.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
import os
import socket
import tempfile
import uuid
from collections import deque
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Self

from hexir import knobs
from hexir.errors import MeasureError
from hexir.runtime.target import Target, host_key
from hexir.schedule import Trace
from hexir.search.builders import CpuBuilder, CudaBuilder
from hexir.search.calibration import Calibration
from hexir.search.executor import check_targets
from hexir.search.measure import BuildResult, Candidate, MeasureResult
from hexir.search.runners import CpuRunner, CudaRunner

# Runner actors are named `hexir-runner-<tag>-<n>`, so `ray list actors` shows them.
RUNNER_NAME = "hexir-runner"
# Seconds `close()` waits for the runners to end their worker processes before killing them.
CLOSE_TIMEOUT = 10.0
# The same after an exception in `measure` (a runner busy with a candidate will not answer).
RESET_TIMEOUT = 1.0
# Seconds to wait for an address to join to accept a connection at all.
CONNECT_TIMEOUT = 10.0


@dataclass(frozen=True)
class ShippedBuild:
    """A BuildResult as it crosses the cluster: for a CPU build, the library's bytes too."""

    build: BuildResult
    library: bytes | None = None


class RayExecutor:
    """Measures candidates of `target` on a Ray cluster (the MeasureExecutor interface).

    `address` None starts a private local cluster with `num_cpus` CPUs (default: the
    machine's); `"auto"` joins the cluster running on this machine, `"ray://host:port"` a
    remote one through Ray Client (`runtime_env` then says how its workers get Hexir, e.g.
    `{"pip": ["hexir"]}`). Where Ray is already initialized in this process, the executor
    uses that connection. An address where nothing listens is a MeasureError within
    CONNECT_TIMEOUT seconds; one where something else listens is Ray's to give up on (20
    attempts of about half a minute; Ray's RAY_gcs_server_port_wait_time_s sets how many).
    `num_builders` caps the builds in flight (default: every CPU of the cluster). `close()`
    kills the runner actors and, where this executor called `ray.init`, `ray.shutdown()`: a
    local cluster it started stops, a joined one keeps running."""

    def __init__(
        self,
        target: Target | str,
        address: str | None = None,
        num_builders: int | None = None,
        num_cpus: int | None = None,
        runtime_env: dict[str, Any] | None = None,
    ) -> None:
        self.target = Target.of(target)
        self._closed = False
        self._actors: list[Any] | None = None
        self._in_flight: dict[Any, int] = {}  # builds running: Ray task -> candidate
        self._busy: dict[Any, Any] = {}  # runners timing: Ray call -> (candidate, actor)
        if self.target.kind == "cpu" and knobs.get().measure_calibration_threshold > 0:
            # The calibration's quiet time, settled here before the cluster's start loads the
            # machine where none is kept (or the one kept is stale); the runners here read it.
            Calibration(self.target, knobs.get().cache_dir)
        self._owns_connection = _connect(address, num_cpus, runtime_env)
        try:
            cpus = int(_ray().cluster_resources().get("CPU", 0))
            self._workers = max(1, num_builders if num_builders is not None else cpus)
            self._actors = self._start_runners()
        except BaseException:
            self._closed = True
            if self._owns_connection:
                _ray().shutdown()
            raise

    @property
    def workers(self) -> int:
        """How many builds run at once (Ray tasks in flight)."""
        return self._workers

    def measure(self, candidates: Sequence[Candidate]) -> list[MeasureResult]:
        """Build every candidate on the cluster, then check and time each on a runner."""
        return list(self.measure_each(candidates))

    def measure_each(self, candidates: Sequence[Candidate]) -> Iterator[MeasureResult]:
        """`measure`, the results in order, each as soon as it and those before it are
        timed."""
        if self._closed:
            raise RuntimeError("this RayExecutor is closed; make a new one")
        check_targets(candidates, self.target)
        if not candidates:
            return
        with self._guarded():
            wire, builds, values = self._shipped(candidates)
            yield from self._run_all(wire, builds, values)

    def measure_in_turn(self, candidates: Sequence[Candidate]) -> list[MeasureResult]:
        """`measure` for candidates to be compared, built on the cluster, then checked and
        timed in turn by one runner (`CpuRunner.run_in_turn`: a call of each, then the next
        of each; a CUDA runner times them one at a time). Where that runner is lost, each
        candidate's record says so."""
        if self._closed:
            raise RuntimeError("this RayExecutor is closed; make a new one")
        check_targets(candidates, self.target)
        if not candidates:
            return []
        ray = _ray()
        with self._guarded():
            wire, builds, values = self._shipped(candidates)
            try:
                return ray.get(self._actors[0].run_in_turn.remote(wire, builds, values))
            except ray.exceptions.RayActorError as e:
                self._stop_runners(CLOSE_TIMEOUT)  # the next batch starts new ones
                return [
                    _lost_runner(e, b.build) if b.build.ok else MeasureResult.from_build(b.build)
                    for b in builds
                ]

    def close(self) -> None:
        """End the runners (and their worker processes), then `ray.shutdown()` where this
        executor called `ray.init`; a second call does nothing."""
        if self._closed:
            return
        self._closed = True
        self._stop_runners(CLOSE_TIMEOUT)
        if self._owns_connection:
            _ray().shutdown()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @contextlib.contextmanager
    def _guarded(self) -> Iterator[None]:
        """Where what it wraps fails, nothing of this executor keeps running on the cluster
        (`_reset`), and a Ray error is raised as the error it carries. A `measure_each` closed
        by its caller (GeneratorExit) stops only what still works for it: where every result
        was taken, the runners stay, their worker processes holding the references, and the
        next batch skips their start (two to three seconds here)."""
        ray = _ray()
        try:
            yield
        except GeneratorExit:
            if self._in_flight or self._busy:
                self._reset()
            raise
        except BaseException as e:
            self._reset()
            if isinstance(e, ray.exceptions.RayError):
                raise _unwrapped(e) from None
            raise

    def _shipped(
        self, candidates: Sequence[Candidate]
    ) -> tuple[list[Candidate], list[ShippedBuild], Any]:
        """The candidates as they travel (without their traces), built on the cluster, and
        the driver's knobs in Ray's object store; the runners started where none run."""
        if self._actors is None:
            self._actors = self._start_runners()
        values = _ray().put(knobs.get())
        wire = [dataclasses.replace(c, trace=Trace()) for c in candidates]
        return wire, self._build_all(wire, values), values

    def _start_runners(self) -> list[Any]:
        """One runner actor per GPU (CUDA target) or per node with CPUs (CPU target)."""
        ray = _ray()
        _, runner = _remote()
        if self.target.kind == "cuda":
            gpus = int(ray.cluster_resources().get("GPU", 0))
            if gpus == 0:
                raise MeasureError(
                    f"the Ray cluster has no GPU to measure target {self.target} on; join a "
                    "cluster with GPU nodes (address=...), or measure CUDA with LocalExecutor"
                )
            options: list[dict[str, Any]] = [{"num_gpus": 1} for _ in range(gpus)]
        else:
            from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy as strategy

            nodes = [n["NodeID"] for n in ray.nodes() if n["Alive"] and n["Resources"].get("CPU")]
            if not nodes:
                raise MeasureError("the Ray cluster has no live node with CPUs to measure on")
            options = [{"scheduling_strategy": strategy(node, soft=False)} for node in nodes]
        # A fresh name each time: a killed runner's name may not be free yet.
        tag = uuid.uuid4().hex[:8]
        omp = os.environ.get("OMP_NUM_THREADS")
        return [
            runner.options(name=f"{RUNNER_NAME}-{tag}-{n}", **option).remote(self.target, omp)
            for n, option in enumerate(options)
        ]

    def _build_all(self, wire: list[Candidate], values: Any) -> list[ShippedBuild]:
        """Every candidate built, at most `workers` at a time; returns when all are done."""
        ray = _ray()
        task, _ = _remote()
        builds: list[ShippedBuild | None] = [None] * len(wire)
        queue = deque(range(len(wire)))
        self._in_flight = {}
        while queue or self._in_flight:
            while queue and len(self._in_flight) < self._workers:
                index = queue.popleft()
                self._in_flight[task.remote(wire[index], values)] = index
            done, _ = ray.wait(list(self._in_flight), num_returns=1)
            for ref in done:
                builds[self._in_flight.pop(ref)] = ray.get(ref)
        return [b for b in builds if b is not None]

    def _run_all(
        self, wire: list[Candidate], builds: list[ShippedBuild], values: Any
    ) -> Iterator[MeasureResult]:
        """Each built candidate timed by the next free runner, the results yielded in order;
        failed builds are records, and so is a candidate whose runner was lost."""
        ray = _ray()
        results: list[MeasureResult | None] = [None] * len(wire)
        given = 0
        queue: deque[int] = deque()
        for index, shipped in enumerate(builds):
            if shipped.build.ok:
                queue.append(index)
            else:
                results[index] = MeasureResult.from_build(shipped.build)
        idle = list(self._actors or [])
        busy: dict[Any, Any] = {}
        self._busy = busy
        lost = False
        while queue or busy:
            if queue and not idle and not busy:  # every runner lost: new ones for the rest
                idle = self._restart_runners()
            while queue and idle:
                index, actor = queue.popleft(), idle.pop()
                busy[actor.run.remote(wire[index], builds[index], values)] = (index, actor)
            done, _ = ray.wait(list(busy), num_returns=1)
            for ref in done:
                index, actor = busy.pop(ref)
                try:
                    results[index] = ray.get(ref)
                except ray.exceptions.RayActorError as e:
                    results[index] = _lost_runner(e, builds[index].build)
                    lost = True
                else:
                    idle.append(actor)
            while given < len(results) and (ready := results[given]) is not None:
                yield ready
                given += 1
        if lost:  # the next batch starts a runner on every node alive then
            self._stop_runners(CLOSE_TIMEOUT)
        yield from (r for r in results[given:] if r is not None)

    def _restart_runners(self) -> list[Any]:
        """New runners, on the nodes alive now, in place of this executor's (all lost)."""
        self._stop_runners(RESET_TIMEOUT)
        self._actors = self._start_runners()
        return list(self._actors)

    def _reset(self) -> None:
        """Cancel the builds in flight and stop the runners, busy ones too: nothing of this
        executor keeps running on the cluster."""
        ray = _ray()
        for ref in self._in_flight:
            with contextlib.suppress(Exception):
                ray.cancel(ref)
        self._in_flight, self._busy = {}, {}
        self._stop_runners(RESET_TIMEOUT)

    def _stop_runners(self, grace: float) -> None:
        """Ask the runners to close (their worker processes end, their files go), then kill
        them: a runner still busy after `grace` seconds is killed as it is (its worker process
        ends itself within a second; its temporary files stay behind)."""
        ray = _ray()
        actors, self._actors = self._actors or [], None
        try:
            if actors:
                with contextlib.suppress(Exception):
                    closing = [actor.close.remote() for actor in actors]
                    ray.wait(closing, num_returns=len(closing), timeout=grace)
        finally:
            for actor in actors:
                with contextlib.suppress(Exception):
                    ray.kill(actor, no_restart=True)


def build_one(candidate: Candidate, values: knobs.Knobs) -> ShippedBuild:
    """A build task's body: build one candidate under the driver's knobs."""
    with driver_knobs(values):
        check_node(candidate.target)
        cuda = candidate.target.kind == "cuda"
        builder = CudaBuilder(workers=1) if cuda else CpuBuilder(workers=1)
        (build,) = builder.build([candidate])
    build = dataclasses.replace(build, info={**build.info, "build_node": socket.gethostname()})
    if cuda or not build.ok or build.path is None:
        return ShippedBuild(build)
    return ShippedBuild(build, Path(build.path).read_bytes())


class NodeRunner:
    """A runner actor's body: a CpuRunner (or CudaRunner) that checks and times the built
    candidates it is given, one at a time, under the driver's knobs."""

    def __init__(self, target: Target, omp_num_threads: str | None = None) -> None:
        # Ray sets OMP_NUM_THREADS=1 in its workers; the kernels (and the CPU worker process,
        # which inherits this environment) run with the driver's setting instead.
        if omp_num_threads is None:
            os.environ.pop("OMP_NUM_THREADS", None)
        else:
            os.environ["OMP_NUM_THREADS"] = omp_num_threads
        self._runner = CudaRunner() if target.kind == "cuda" else CpuRunner()
        self._dir = tempfile.TemporaryDirectory(prefix="hexir-shipped-")
        self._node_id = _ray_node_id()  # an actor stays on the node it started on

    def run(
        self, candidate: Candidate, shipped: ShippedBuild, values: knobs.Knobs
    ) -> MeasureResult:
        """The candidate's MeasureResult; `build_info` gains where it was timed: `run_node`,
        `run_node_id` and `run_target_key` (this node's key, which check_node makes the
        candidate's)."""
        with driver_knobs(values):
            key = check_node(candidate.target)
            (result,) = self._runner.run([candidate], [self._local(shipped)])
        return self._placed(result, key)

    def run_in_turn(
        self, candidates: list[Candidate], shipped: list[ShippedBuild], values: knobs.Knobs
    ) -> list[MeasureResult]:
        """`run` for candidates to be compared, timed in turn where the runner can
        (`CpuRunner.run_in_turn`), else one at a time."""
        with driver_knobs(values):
            (key,) = {check_node(c.target) for c in candidates}  # one target: check_targets
            results = self._runner.run_in_turn(candidates, [self._local(s) for s in shipped])
        return [self._placed(r, key) for r in results]

    def _placed(self, result: MeasureResult, key: str) -> MeasureResult:
        """`result` with where it was timed in its build_info."""
        info = {
            **result.build_info,
            "run_node": socket.gethostname(),
            "run_node_id": self._node_id,
            "run_target_key": key,
        }
        return dataclasses.replace(result, build_info=info)

    def close(self) -> None:
        """End the worker process and remove the shipped libraries."""
        self._runner.close()
        self._dir.cleanup()

    def _local(self, shipped: ShippedBuild) -> BuildResult:
        """The build with a library path that exists on this node."""
        build = shipped.build
        if build.path is None or shipped.library is None or Path(build.path).exists():
            return build
        # Library names are digests of source, flags and compiler: one name, one content.
        file = Path(self._dir.name) / Path(build.path).name
        if not file.exists():
            file.with_suffix(".c").write_text(build.source)
            partial = file.with_suffix(".partial")
            partial.write_bytes(shipped.library)
            os.replace(partial, file)
        return dataclasses.replace(build, path=str(file))


@contextlib.contextmanager
def driver_knobs(values: knobs.Knobs) -> Iterator[None]:
    """The driver's knobs in force in this worker; its build cache folder where this node
    can make it, else this node's default one."""
    try:
        Path(values.cache_dir).expanduser().mkdir(parents=True, exist_ok=True)
    except OSError:
        values = dataclasses.replace(values, cache_dir=knobs.Knobs().cache_dir)
    with knobs.scope(**{f.name: getattr(values, f.name) for f in dataclasses.fields(values)}):
        yield


def check_node(target: Target) -> str | None:
    """This node's own key for `target`'s kind, probed here (hexir.runtime.target.host_key);
    MeasureError where `target` is a CPU and this node's CPU is another: code compiled here for
    `-march=native` would be timed and recorded under a key that is not this machine's."""
    here = host_key(target.kind)
    if target.kind == "cpu" and here != target.key:
        node = _ray_node_id()
        where = f"Ray node {node} on {socket.gethostname()}" if node else socket.gethostname()
        raise MeasureError(
            f"{where} has CPU target {here}, but the candidates are for {target.key} "
            f"({target}). Every node that builds or measures must have the candidates' CPU: "
            "tune from a node of the cluster (address='auto'), on a cluster of one kind of "
            "machine"
        )
    return here


def _ray_node_id() -> str | None:
    """The id of the Ray node this process runs on; None where Ray is not initialized here."""
    try:
        import ray
    except ImportError:
        return None
    return ray.get_runtime_context().get_node_id() if ray.is_initialized() else None


def _ray() -> Any:
    try:
        import ray
    except ImportError:
        raise MeasureError(
            "measuring on a Ray cluster needs Ray (`pip install 'ray>=2.9'`); without it, "
            "measure in this process with hexir.search.executor.LocalExecutor"
        ) from None
    return ray


@functools.cache
def _remote() -> tuple[Any, Any]:
    """The build task and the runner actor class, made once per process."""
    ray = _ray()
    # A runner holds no CPU of Ray's: builds and runs never overlap, by the batch's sequence.
    return ray.remote(num_cpus=1)(build_one), ray.remote(num_cpus=0)(NodeRunner)


def _connect(address: str | None, num_cpus: int | None, runtime_env: dict[str, Any] | None) -> bool:
    """Initialize Ray unless it already is; True where this call did."""
    ray = _ray()
    if ray.is_initialized():
        return False
    quiet: dict[str, Any] = {"logging_level": logging.ERROR, "log_to_driver": False}
    if runtime_env is not None:
        quiet["runtime_env"] = runtime_env
    try:
        if address is None:
            # "local": a new cluster even where one already runs on this machine.
            ray.init(address="local", num_cpus=num_cpus, include_dashboard=False, **quiet)
        else:
            _check_listening(address)
            ray.init(address=address, **quiet)
    except (ConnectionError, ValueError, RuntimeError, ray.exceptions.AuthenticationError) as e:
        raise _connect_error(address, str(e)) from None
    return True


def _connect_error(address: str | None, reason: str) -> MeasureError:
    where = "start a local Ray cluster" if address is None else f"join {address!r}"
    token = ""
    if "authentication token" in reason:
        # Ray's own words run to a paragraph of their own, with a link: say what to do, briefly.
        reason = "it asks for a token and none was found here"
        token = (
            ", and give this process the cluster's token: RAY_AUTH_TOKEN, RAY_AUTH_TOKEN_PATH "
            "or ~/.ray/auth_token"
        )
    elif address not in (None, "auto") and "Failed to connect" in reason:
        # Ray sends its token only to a cluster it found itself ("auto"), never to an address.
        token = (
            ", and where it asks for a token (`ray start` makes it ask where it finds one), "
            "that RAY_AUTH_MODE=token is set here"
        )
    return MeasureError(
        f"could not {where}: {reason.rstrip('.')}. Check the address and that the cluster runs "
        f"(`ray status`){token}; or leave address=None to start a local cluster"
    )


def _check_listening(address: str) -> None:
    """MeasureError at once where nothing listens at a `host:port` or `ray://host:port`
    address: Ray itself retries one for a quarter of an hour. ("auto" is Ray's to find; it
    refuses at once where no cluster runs on this machine.)"""
    host, _, port = address.removeprefix("ray://").rpartition(":")
    if not port.isdigit():
        return
    if host in ("", "localhost", "127.0.0.1", "::1") and not address.startswith("ray://"):
        host = _ray().util.get_node_ip_address()  # where Ray joins a cluster of this machine
    try:
        socket.create_connection((host, int(port)), timeout=CONNECT_TIMEOUT).close()
    except OSError as e:
        raise _connect_error(address, f"nothing answers at {host}:{port} ({e})") from None


def _lost_runner(error: BaseException, build: BuildResult) -> MeasureResult:
    """The record of a candidate whose runner actor died under it."""
    return MeasureResult.error(
        "crash",
        f"the Ray runner timing this candidate was lost ({type(error).__name__}: "
        f"{_first_line(error)}): its node left the cluster or its process was killed. The "
        "rest of the batch went to the other runners, or new ones; check the cluster's nodes "
        "(`ray status`) and its logs (/tmp/ray/session_latest/logs). Library "
        f"{build.path}, its C source beside it",
        dict(build.info),
    )


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else ""


def _unwrapped(error: BaseException) -> BaseException:
    """What a Ray error means here: the exception a task or actor raised, as itself, or a
    MeasureError for a cluster that failed under us."""
    ray = _ray()
    cause = getattr(error, "cause", None)
    if isinstance(error, ray.exceptions.RayTaskError) and isinstance(cause, BaseException):
        cause.add_note(f"(raised in a Ray worker; its traceback:)\n{error}")
        return cause
    return MeasureError(
        f"the Ray cluster failed while measuring ({type(error).__name__}: "
        f"{_first_line(error)}); the "
        "executor stopped its runners and starts new ones on the next measure. Check the "
        "cluster's nodes (`ray status`) and its logs (/tmp/ray/session_latest/logs)"
    )
