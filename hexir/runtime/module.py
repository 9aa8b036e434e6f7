"""A compiled graph: its kernels, the flat command list that calls them, its constants and
its memory plan; `Module.run` runs it, `Module.save` writes it as one artifact file.

    module = hexir.compile(graph)
    outputs = module.run([x])                  # buffers from the memory plan, allocated once
    outputs = module.run([x], plan=False)      # a fresh buffer per value: the same bits
    print(module.profile([x]))                 # per command: time, share, GFLOP/s, of peak
    module.save("model.hxa"); hexir.runtime.load("model.hxa")

A planned run allocates the intermediates once per module — the plan's storages, with each
intermediate a view into one, and the constants — and then per run only a fresh array for
each output, and calls the kernels in command order on precomputed pointers, with the
caller's input arrays and those outputs in place (no copy in or out; an input is only read).
On the CPU one native call runs the whole command list (hexir/runtime/native.py; the
`native_run` knob off, Python calls each kernel). The intermediates belong to the module, so
one module runs one call at a time.

Views. A reshape that no command computes (`Module.views`: a value some command reads or the
graph returns that is no command's output, input or constant) is its operand's buffer under
another shape (every buffer is contiguous row-major), in planned and unplanned runs, on the CPU
and the GPU; the memory plan keeps that buffer alive while either name is used. Every output
is a fresh array: a view returned by the graph is its root's fresh array reshaped, and an
input or a constant returned is copied.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from hexir import knobs
from hexir.errors import HexirError
from hexir.graph.evaluate import bind_inputs
from hexir.graph.memory import MemoryPlan, Step, plan_memory
from hexir.ir.arrays import address, aligned, aligned_empty
from hexir.ir.dtype import itemsize, numpy_dtype
from hexir.ir.graph import Graph, Op, TensorType, Value
from hexir.ops import op_def
from hexir.runtime import binder, native
from hexir.runtime.kernel import threads_changes
from hexir.runtime.target import Target
from hexir.schedule.trace import Trace

if TYPE_CHECKING:
    from hexir.runtime.profile import Profile

__all__ = ["Command", "Module", "TaskReport", "plan_commands", "view_roots"]


@dataclass(frozen=True)
class Command:
    """Call kernel number `kernel` on the values named `args`: inputs, then the last
    `num_outputs`, which it writes."""

    kernel: int
    args: tuple[str, ...]
    num_outputs: int = 1

    @property
    def inputs(self) -> tuple[str, ...]:
        return self.args[: len(self.args) - self.num_outputs]

    @property
    def outputs(self) -> tuple[str, ...]:
        return self.args[len(self.args) - self.num_outputs :]


@dataclass(frozen=True)
class TaskReport:
    """How one command's kernel was made: its workload key, whether its schedule came from
    the tuning database ("tuned") or the default ("default"), and the trace applied."""

    name: str
    workload_key: str
    schedule: str
    trace: Trace
    kernel: int
    ops: tuple[str, ...]  # the op kinds the kernel computes, in order


class Module:
    """A compiled graph (see the module docstring). `kernels`: one per distinct scheduled
    kernel; `commands`: the calls in order; `plan`: where the intermediates live;
    `report`: one TaskReport per command; `views`: each view (a reshape no command computes)
    and the value whose buffer it is (`view_roots`)."""

    def __init__(
        self,
        graph: Graph,
        target: Target,
        kernels: list,
        commands: list[Command],
        constants: dict[str, np.ndarray],
        plan: MemoryPlan | None = None,
        report: tuple[TaskReport, ...] = (),
        runner_library: Path | None = None,
        binder_library: Path | None = None,
    ):
        self.graph = graph
        self.target = target
        self.kernels = kernels
        self.commands = commands
        self.constants = constants
        self.views = view_roots(graph, commands)
        self.plan = plan if plan is not None else plan_commands(graph, commands)
        self.report = report
        self._types = _value_types(graph)
        self._buffers: _CpuBuffers | None = None
        # The native command runner's library (hexir/runtime/native.py): an artifact's image,
        # or built here (once, then from the build cache), so running needs no compiler.
        # The binder's (binder.py), the same way where this module is built here; an artifact's
        # module has the artifact's image or none, and compiles nothing.
        if runner_library is None and target.kind == "cpu" and knobs.get().native_run:
            runner_library = native.runner_library(target)
            if binder_library is None and knobs.get().native_bind:
                binder_library = binder.library(target)
        self.runner_library = runner_library
        self.binder_library = binder_library
        self._threaded: list | None = None
        self._synced: tuple[int, int] | None = None  # (threads, threads_changes()) checked
        self._input_specs = tuple(
            (v.name, v.type.shape, numpy_dtype(v.type.dtype)) for v in graph.inputs
        )

    def run(
        self,
        inputs: Sequence[np.ndarray] | Mapping[str, np.ndarray],
        *,
        plan: bool = True,
    ) -> list[np.ndarray]:
        """Run the graph on numpy inputs (a list in graph order, or a dict by name); fresh
        output arrays. `plan=False` gives every value its own new buffer and calls each
        kernel through its checked call (on a GPU: copies in and out per kernel), for checking
        the plan: the results are the same bits."""
        if plan and (outputs := self._run_bound_in_c(inputs, timed=False)) is not None:
            return outputs
        bound = self._bind(inputs)
        if self.target.kind == "cpu":
            self._sync_threads()
        if not plan:
            return self._run_unplanned(bound)
        if self.target.kind != "cpu":
            from hexir.runtime.cuda_module import cuda_buffers

            return cuda_buffers(self).run(bound, self.graph.outputs)
        return self._cpu_buffers().run(bound, self.graph.outputs)

    def run_timed(
        self, inputs: Sequence[np.ndarray] | Mapping[str, np.ndarray]
    ) -> tuple[list[np.ndarray], list[float]]:
        """A planned run, as `run`, that also gives each command's seconds, timed in place:
        the clock read between calls on the CPU, CUDA events between launches on a GPU."""
        if (outputs := self._run_bound_in_c(inputs, timed=True)) is not None:
            return outputs, self._cpu_buffers().runner.seconds()  # type: ignore[union-attr]
        bound = self._bind(inputs)
        if self.target.kind != "cpu":
            from hexir.runtime.cuda_module import cuda_buffers

            return cuda_buffers(self).run_timed(bound, self.graph.outputs)
        self._sync_threads()
        return self._cpu_buffers().run_timed(bound, self.graph.outputs)

    def profile(
        self,
        inputs: Sequence[np.ndarray] | Mapping[str, np.ndarray],
        *,
        repeats: int = 10,
        warmup: int = 2,
    ) -> Profile:
        """Where the time goes, command by command (hexir/runtime/profile.py): the median over
        `repeats` planned runs, after `warmup` runs, of each command timed in place, with the
        end-to-end time of plain runs in between; `print` it for the table."""
        from hexir.runtime.profile import profile

        return profile(self, inputs, repeats=repeats, warmup=warmup)

    def save(self, path: str | Path) -> Path:
        """Write the module as one artifact file (hexir/runtime/artifact.py); its path."""
        from hexir.runtime.artifact import save

        return save(self, path)

    def value_type(self, name: str) -> TensorType:
        return self._types[name]

    def _run_unplanned(self, bound: dict[str, np.ndarray]) -> list[np.ndarray]:
        env: dict[str, np.ndarray] = {**self.constants, **bound}
        for command in self.commands:
            for name in command.outputs:
                env[name] = _empty(self._types[name])
        for view, root in self.views.items():
            env[view] = env[root].reshape(self._types[view].shape)  # no copy: contiguous
        for command in self.commands:
            self.kernels[command.kernel](*(env[name] for name in command.args))
        return [np.array(env[v.name]) for v in self.graph.outputs]

    def _cpu_buffers(self) -> _CpuBuffers:
        if self._buffers is None:
            self._buffers = _CpuBuffers(self)
        return self._buffers

    def _run_bound_in_c(
        self, inputs: Sequence[np.ndarray] | Mapping[str, np.ndarray], timed: bool
    ) -> list[np.ndarray] | None:
        """The usual call on the CPU, bound and answered in C (binder.py), into the same pooled
        outputs whether timed or not; None where there is no binder or the inputs need the
        checked path."""
        if self.target.kind != "cpu" or (in_c := self._cpu_buffers().binder) is None:
            return None
        self._sync_threads()
        return in_c.run(inputs, timed)

    def _sync_threads(self) -> None:
        # The thread count is set per library, once per change: one kernel per library with
        # a parallel loop checks it, unless the count and every library's are as when this
        # module last checked.
        threads = knobs.get().num_threads
        if self._synced == (threads, threads_changes()):
            return
        if self._threaded is None:
            threaded = (k for k in self.kernels if k._set_threads is not None)
            self._threaded = list({k.path: k for k in threaded}.values())
        for kernel in self._threaded:
            kernel._sync_threads()
        self._synced = (threads, threads_changes())

    def _bind(self, inputs: Sequence[np.ndarray] | Mapping[str, np.ndarray]) -> dict:
        """The inputs by name. A list of C-contiguous arrays of the graph's types, the usual
        call, is checked with a few attribute reads (after a run's kernels have swept the
        caches, each Python object touched is a miss); anything else goes through
        `bind_inputs`, which converts what it can and says what is wrong."""
        if type(inputs) in (list, tuple) and len(inputs) == len(self._input_specs):
            bound = {}
            for array, (name, shape, dtype) in zip(inputs, self._input_specs, strict=True):
                if (
                    type(array) is not np.ndarray
                    or array.shape != shape
                    or array.dtype != dtype
                    or not array.flags.c_contiguous
                ):
                    break
                bound[name] = array
            else:
                return bound
        return _bind_inputs(self.graph, inputs)

    def __repr__(self) -> str:
        lines = [
            f"Module @{self.graph.name} on {self.target}: {len(self.kernels)} kernels, "
            f"{len(self.commands)} commands"
        ]
        for c in self.commands:
            lines.append(f"  {self.kernels[c.kernel].func.name}({', '.join(c.args)})")
        lines.append(self.plan.summary())
        return "\n".join(lines)


# Arrays kept per returned value for later runs: a caller that holds a run's outputs while
# it makes the next run needs two.
OUTPUT_POOL = binder.POOL
FREE_REFERENCES = 2  # an array only its pool pair holds, as getrefcount counts it


class _CpuBuffers:
    """Every intermediate's array, allocated once from the plan, and each command's entry point
    and argument pointers. The graph's inputs and outputs are bound per run: a command reads
    the caller's input arrays where they are, and writes a graph output into a fresh array
    that the run returns (gpt2-decode: copying its 0.8 MB of KV cache in and out was 15% of
    a step)."""

    def __init__(self, module: Module):
        self.storages = [aligned_empty((n,), np.uint8) for n in module.plan.storage_sizes]
        self.types = module._types
        self.root = module.views
        computed = {name for c in module.commands for name in c.outputs}
        returned = (self._root(v.name) for v in module.graph.outputs)
        self.returned = [r for r in dict.fromkeys(returned) if r in computed]
        self.pools: dict[str, list[tuple[np.ndarray, int]]] = {n: [] for n in self.returned}
        # Bound per run, so given no array here: the graph's inputs and what it returns.
        bound = {v.name for v in module.graph.inputs} | set(self.returned)
        placed = module.plan.as_dict()
        arrays: dict[str, np.ndarray] = {}
        for name, data in module.constants.items():
            arrays[name] = aligned(data)  # a kernel's weights start on a cache line
        for command in module.commands:
            for name in command.outputs:
                if name in bound:
                    continue
                t, p = module.value_type(name), placed.get(name)
                if p is None:
                    arrays[name] = _empty(t)
                else:
                    raw = self.storages[p.storage][p.offset : p.offset + p.nbytes]
                    arrays[name] = raw.view(numpy_dtype(t.dtype)).reshape(t.shape)
        for view, root in module.views.items():
            if root not in bound:
                arrays[view] = arrays[root].reshape(module.value_type(view).shape)
        self.arrays = arrays
        # (entry point, pointers, [(argument position, the bound value it is)]): a bound
        # argument's pointer is filled in per run.
        self.calls = [
            (
                module.kernels[c.kernel]._fn,
                [0 if self._root(n) in bound else address(arrays[n]) for n in c.args],
                [(i, self._root(n)) for i, n in enumerate(c.args) if self._root(n) in bound],
            )
            for c in module.commands
        ]
        # The values whose pointers each run hands the native runner, in its order.
        self.bound_names = sorted(bound)
        self.runner = self._native_runner(module)
        self.binder = None
        if self.runner is not None and module.binder_library and knobs.get().native_bind:
            self.binder = binder.Binder.make(self, module.graph, module.binder_library)

    def _native_runner(self, module: Module) -> native.NativeRunner | None:
        """The commands as one native call (hexir/runtime/native.py), unless the knob is off
        or a kernel takes more arguments than the runner calls with."""
        if not knobs.get().native_run or not native.NativeRunner.fits(
            [len(p) for _, p, _ in self.calls]
        ):
            return None
        bound = self.bound_names
        index = {name: i for i, name in enumerate(bound)}
        calls = [(fn, p, [(i, index[name]) for i, name in slots]) for fn, p, slots in self.calls]
        library = module.runner_library or native.runner_library(module.target)
        return native.NativeRunner(calls, len(bound), library)

    def _root(self, name: str) -> str:
        """The value whose buffer `name` is: itself, or the root of its view."""
        return self.root.get(name, name)

    def run(self, bound: dict[str, np.ndarray], outputs: Sequence[Value]) -> list[np.ndarray]:
        if self.runner is not None:
            fresh = self._bind_native(bound)
            self.runner.run()
            return self._results(bound, fresh, outputs)
        fresh, calls = self._bind(bound)
        for fn, pointers in calls:
            fn(*pointers)
        return self._results(bound, fresh, outputs)

    def run_timed(
        self, bound: dict[str, np.ndarray], outputs: Sequence[Value]
    ) -> tuple[list[np.ndarray], list[float]]:
        if self.runner is not None:
            fresh = self._bind_native(bound)
            seconds = self.runner.run(timed=True)
            return self._results(bound, fresh, outputs), seconds
        fresh, calls = self._bind(bound)
        clock = time.perf_counter
        seconds = []
        for fn, pointers in calls:
            start = clock()
            fn(*pointers)
            seconds.append(clock() - start)
        return self._results(bound, fresh, outputs), seconds

    def _fresh_outputs(self) -> dict[str, tuple[np.ndarray, int]]:
        """An array for each returned value that nothing outside this module references, with
        its address: one of the earlier runs' that its caller has let go (the pool's reference
        the only one left, views of it included), else a new one, kept for later runs. Where
        malloc maps a block that large anew each time (glibc above its mmap threshold), a new
        array is fresh pages, and faulting them in costs more than a small kernel (two 393 KB
        arrays, gpt2-decode's KV-cache outputs, allocated and filled: 0.51 ms, against 0.02 ms
        reused)."""
        fresh = {}
        for name in self.returned:
            pool, found = self.pools[name], None
            for kept in pool:
                # Free: referenced only by the pool's pair (and getrefcount's argument).
                if sys.getrefcount(kept[0]) == FREE_REFERENCES:
                    found = kept
                    break
            if found is None:
                # numpy's own array, not an aligned view: a caller's view of it must count
                # as a reference to it (a view of a view refers to the memory's owner)
                t = self.types[name]
                array = np.empty(t.shape, dtype=numpy_dtype(t.dtype))
                found = (array, address(array))
                if len(pool) < OUTPUT_POOL:
                    pool.append(found)
            fresh[name] = found
        return fresh

    def _bind_native(self, bound: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Fresh arrays for the returned values, and the runner's bound pointers set to them
        and to the inputs."""
        fresh = self._fresh_outputs()
        pointers = self.runner.bound  # type: ignore[union-attr]
        for i, name in enumerate(self.bound_names):
            kept = fresh.get(name)
            pointers[i] = kept[1] if kept is not None else address(bound[name])
        return {name: array for name, (array, _) in fresh.items()}

    def _bind(self, bound: dict[str, np.ndarray]) -> tuple[dict[str, np.ndarray], list]:
        """Fresh arrays for the returned values, and each call's pointers with the inputs and
        those arrays in place."""
        kept = self._fresh_outputs()
        fresh = {name: array for name, (array, _) in kept.items()}
        where = {name: address(a) for name, a in bound.items()}
        where.update((name, pointer) for name, (_, pointer) in kept.items())
        calls = []
        for fn, pointers, slots in self.calls:
            if slots:
                pointers = list(pointers)
                for i, name in slots:
                    pointers[i] = where[name]
            calls.append((fn, pointers))
        return fresh, calls

    def _results(
        self, bound: dict[str, np.ndarray], fresh: dict[str, np.ndarray], outputs: Sequence[Value]
    ) -> list[np.ndarray]:
        """Each output as a fresh array: a command's result as it was written (a copy when
        the graph returns it twice), an input or a constant copied."""
        results, given = [], set()
        for v in outputs:
            name = self._root(v.name)
            if name in fresh and name not in given:
                array = fresh[name]
                given.add(name)
            else:
                source = fresh.get(name)
                if source is None:
                    source = bound[name] if name in bound else self.arrays[name]
                array = np.array(source)
            results.append(array.reshape(v.type.shape))
        return results


def _empty(t: TensorType) -> np.ndarray:
    return aligned_empty(t.shape, numpy_dtype(t.dtype))


def _value_types(graph: Graph) -> dict[str, TensorType]:
    types = {v.name: v.type for v in graph.inputs}
    types.update((op.result.name, op.result.type) for op in graph.ops)
    return types


def view_roots(graph: Graph, commands: Sequence[Command]) -> dict[str, str]:
    """Each view -> the value whose buffer it is, the root of its chain of views (a command's
    output, a graph input or a constant), in graph order. A view is a value some command reads
    or the graph returns (or a view of it) that no command computes, made by a view op
    (`OpDef.view`, a reshape); such a value made by any other op is an error."""
    computed = {name for c in commands for name in c.outputs}
    computed |= {v.name for v in graph.inputs}
    needed = {name for c in commands for name in c.inputs} | {v.name for v in graph.outputs}
    views: list[Op] = []
    for op in reversed(graph.ops):
        name = op.result.name
        if op.kind == "constant" or name in computed or name not in needed:
            continue
        d = op_def(op.kind)
        if d is None or not d.view:
            raise HexirError(f"no command computes %{name} of @{graph.name} ({op.kind})")
        views.append(op)
        needed.add(op.operands[0].name)
    roots: dict[str, str] = {}
    for op in reversed(views):
        operand = op.operands[0].name
        roots[op.result.name] = roots.get(operand, operand)
    return roots


def plan_commands(
    graph: Graph,
    commands: Sequence[Command],
    inplace: Sequence[tuple[tuple[str, str], ...]] | None = None,
) -> MemoryPlan:
    """The memory plan of a command list (with each command's in-place pairs, if given): its
    intermediates (values some command writes that the graph does not return, nor a view of
    them) placed in a storage pool, and its views where their values are."""
    types = _value_types(graph)
    views = view_roots(graph, commands)
    returned = {v.name for v in graph.outputs}
    returned |= {views[name] for name in returned if name in views}  # returned as a view
    sizes = {
        n: types[n].size * itemsize(types[n].dtype)
        for c in commands
        for n in c.outputs
        if n not in returned
    }
    pairs = inplace if inplace is not None else [()] * len(commands)
    steps = [Step(c.inputs, c.outputs, p) for c, p in zip(commands, pairs, strict=True)]
    return plan_memory(steps, sizes, views)


def _bind_inputs(
    graph: Graph, inputs: Sequence[np.ndarray] | Mapping[str, np.ndarray]
) -> dict[str, np.ndarray]:
    # Kernels take C-contiguous buffers.
    bound = bind_inputs(graph, inputs)
    return {name: np.ascontiguousarray(array) for name, array in bound.items()}
