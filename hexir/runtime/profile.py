"""`Module.profile`: where a module's time goes, command by command.

    profile = module.profile([x], repeats=10)
    print(profile)                     # the table: one row per command, slowest first
    row = profile.rows[0]              # .index, .kernel, .ops, .shapes, .seconds, .share,
                                       # .flops, .gflops, .peak_fraction, .schedule
    profile.command_seconds, profile.in_commands, profile.end_to_end, profile.ratio, profile.peak

Each repeat is a real planned run of the module (`Module.run_timed`): every command called in
order on the memory plan's buffers, with the clock read between commands (in the native
command runner on the CPU, CUDA events on a GPU), so each command reads what a real run hands
it, the data its producer just wrote, in the cache state that leaves. Beside each profiled run
one plain `Module.run` is timed end to end, what `hexir run --bench` reports; the totals
give the sum of the commands' medians, a run's time in its commands (the median over the runs
of each run's sum) and the end-to-end median, and the share of a run spent in commands (the
rest is binding the inputs and fresh outputs, and the call from Python, each Python object
touched a cache miss after the kernels have swept the caches; on a GPU, the copies in and
out).

`compare(default, tuned, inputs)` runs two builds of one model in turn (`hexir run MODEL --db
URL --compare-default`): each command's default and tuned medians and the median of their
paired runs' ratios, most time saved first, and the end-to-end speedup likewise paired. It
is the tune's gain as the model sees it, kernel by kernel, in one sitting.

FLOPs come from the ops each command computes (`hexir.ops.op_flops`: 2 per multiply-add of a
contraction or convolution, one per element of an elementwise op, none for data movement); a
command that only moves data shows no GFLOP/s. The peak is the target's (`Target.peak()`).
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from hexir.errors import HexirError
from hexir.ir.graph import Graph, Op
from hexir.ops import op_flops
from hexir.runtime.peak import Peak

if TYPE_CHECKING:
    from hexir.runtime.module import Command, Module

__all__ = [
    "ComparedRow",
    "Comparison",
    "Profile",
    "ProfileRow",
    "command_ops",
    "compare",
    "profile",
    "run_seconds",
]


@dataclass(frozen=True)
class ProfileRow:
    """One command: its place in the command list, its kernel, what it computes and its time
    (the median over the profiled runs)."""

    index: int
    kernel: str
    ops: tuple[str, ...]  # the op kinds it fuses, in graph order
    shapes: tuple[tuple[int, ...], ...]  # of its outputs
    seconds: float
    share: float  # of the sum of every command's seconds
    flops: int
    peak_fraction: float | None  # achieved FLOP/s over the target's peak; None without FLOPs
    schedule: str  # "tuned" (from the database) or "default"

    @property
    def gflops(self) -> float | None:
        return self.flops / self.seconds / 1e9 if self.flops else None


@dataclass(frozen=True)
class Profile:
    """Every command's row, slowest first, and the totals; `str()` is the table."""

    model: str
    target: str
    rows: tuple[ProfileRow, ...]
    end_to_end: float  # median seconds of a plain run, timed between the profiled ones
    in_commands: float  # median over the profiled runs of each run's commands' seconds, summed
    repeats: int
    peak: Peak
    outputs: list[np.ndarray] = field(repr=False, compare=False)  # of the last profiled run

    @property
    def command_seconds(self) -> float:
        """The sum of the commands' median seconds."""
        return sum(r.seconds for r in self.rows)

    @property
    def ratio(self) -> float:
        """The share of a run spent in its commands: a run's time in them (`in_commands`)
        over the end-to-end time. Not the sum of the commands' medians, which is less than
        a typical run's total wherever noise hits a different command in each run."""
        return self.in_commands / self.end_to_end

    @property
    def flops(self) -> int:
        return sum(r.flops for r in self.rows)

    def __str__(self) -> str:
        return format_profile(self)


def profile(
    module: Module,
    inputs: Sequence[np.ndarray] | Mapping[str, np.ndarray],
    *,
    repeats: int = 10,
    warmup: int = 2,
) -> Profile:
    """Profile `module` on `inputs` (see the module docstring)."""
    if repeats < 1 or warmup < 0:
        raise HexirError(f"a profile takes repeats >= 1 and warmup >= 0, got {repeats}, {warmup}")
    for _ in range(warmup):
        module.run(inputs)
        module.run_timed(inputs)
    per_command: list[list[float]] = [[] for _ in module.commands]
    per_run: list[float] = []
    end_to_end: list[float] = []
    outputs: list[np.ndarray] = []
    for _ in range(repeats):
        end_to_end.append(run_seconds(module, inputs))
        outputs, seconds = module.run_timed(inputs)
        for times, s in zip(per_command, seconds, strict=True):
            times.append(s)
        per_run.append(sum(seconds))
    medians = [statistics.median(times) for times in per_command]
    peak = module.target.peak()
    rows = [_row(module, i, s, sum(medians), peak) for i, s in enumerate(medians)]
    rows.sort(key=lambda r: (-r.seconds, r.index))
    return Profile(
        module.graph.name,
        f"{module.target} ({module.target.key})",
        tuple(rows),
        statistics.median(end_to_end),
        statistics.median(per_run),
        repeats,
        peak,
        outputs,
    )


def run_seconds(module: Module, inputs: Sequence[np.ndarray] | Mapping[str, np.ndarray]) -> float:
    """Seconds of one plain `module.run(inputs)`, end to end."""
    start = time.perf_counter()
    module.run(inputs)
    return time.perf_counter() - start


def _row(module: Module, index: int, seconds: float, total: float, peak: Peak) -> ProfileRow:
    command = module.commands[index]
    ops = command_ops(module.graph, command)
    flops = sum(op_flops(op) for op in ops)
    report = module.report[index] if index < len(module.report) else None
    return ProfileRow(
        index=index,
        kernel=module.kernels[command.kernel].func.name,
        ops=tuple(op.kind for op in ops),
        shapes=tuple(tuple(module.value_type(n).shape) for n in command.outputs),
        seconds=seconds,
        share=seconds / total if total > 0 else 0.0,
        flops=flops,
        peak_fraction=flops / seconds / peak.flops if flops and seconds > 0 else None,
        schedule=report.schedule if report is not None else "-",
    )


def command_ops(graph: Graph, command: Command) -> tuple[Op, ...]:
    """The ops `command` computes, in graph order: those its outputs depend on, back to its
    inputs (a fusion group's ops; constants are the kernel's parameters, not its work)."""
    producers = {op.result.name: op for op in graph.ops}
    stop = set(command.inputs)
    inside: set[str] = set()
    todo = list(command.outputs)
    while todo:
        name = todo.pop()
        if name in inside or name in stop or name not in producers:
            continue
        inside.add(name)
        todo.extend(v.name for v in producers[name].operands)
    return tuple(op for op in graph.ops if op.result.name in inside and op.kind != "constant")


# -- a tuned build against the default one ---------------------------------------------------


@dataclass(frozen=True)
class ComparedRow:
    """One command of two builds of the same model: its medians in each and the median of
    its paired runs' ratios (default over tuned: above 1, the tuned kernel is faster)."""

    index: int
    kernel: str
    shapes: tuple[tuple[int, ...], ...]
    default_seconds: float
    tuned_seconds: float
    speedup: float
    schedule: str  # of the tuned build: "tuned" (from the database) or "default"

    @property
    def saved(self) -> float:
        return self.default_seconds - self.tuned_seconds


@dataclass(frozen=True)
class Comparison:
    """A tuned build beside the default one, run in turn: per command where the commands are
    the same (`rows`, most time saved first; empty where a build chose another form of a
    conv, `forms_differ`), and end to end."""

    model: str
    target: str
    rows: tuple[ComparedRow, ...]
    forms_differ: bool
    default_end_to_end: float  # median seconds of a plain run
    tuned_end_to_end: float
    speedup: float  # median over the pairs of plain runs of default / tuned
    repeats: int
    # median over the pairs of profiled runs of their commands' seconds, default / tuned
    in_commands_speedup: float

    def __str__(self) -> str:
        return format_comparison(self)


def compare(
    default: Module,
    tuned: Module,
    inputs: Sequence[np.ndarray] | Mapping[str, np.ndarray],
    *,
    repeats: int = 10,
    warmup: int = 2,
) -> Comparison:
    """Two builds of one model (default schedules, and a database's), run in turn `repeats`
    times after `warmup`: a plain run of each, then a profiled run of each (`run_timed`). The
    host's speed shifts from one second to the next (a two-core VM's, by a third), so each
    command's and each run's gain is the median of ratios of runs taken side by side, not a
    ratio of medians taken apart."""
    if repeats < 1 or warmup < 0:
        raise HexirError(
            f"a comparison takes repeats >= 1 and warmup >= 0, got {repeats}, {warmup}"
        )
    for _ in range(warmup):
        for module in (default, tuned):
            module.run(inputs)
            module.run_timed(inputs)
    plain: tuple[list[float], list[float]] = ([], [])
    timed: tuple[list[list[float]], list[list[float]]] = ([], [])
    for _ in range(repeats):
        for module, times in zip((default, tuned), plain, strict=True):
            times.append(run_seconds(module, inputs))
        for module, runs in zip((default, tuned), timed, strict=True):
            runs.append(module.run_timed(inputs)[1])
    forms_differ = [c.args for c in default.commands] != [c.args for c in tuned.commands]
    rows = [] if forms_differ else [_compared(tuned, i, timed) for i in range(len(tuned.commands))]
    rows.sort(key=lambda r: (-r.saved, r.index))
    return Comparison(
        tuned.graph.name,
        f"{tuned.target} ({tuned.target.key})",
        tuple(rows),
        forms_differ,
        statistics.median(plain[0]),
        statistics.median(plain[1]),
        statistics.median(d / t for d, t in zip(*plain, strict=True)),
        repeats,
        statistics.median(sum(d) / sum(t) for d, t in zip(*timed, strict=True)),
    )


def _compared(
    tuned: Module, index: int, timed: tuple[list[list[float]], list[list[float]]]
) -> ComparedRow:
    default_runs = [run[index] for run in timed[0]]
    tuned_runs = [run[index] for run in timed[1]]
    command = tuned.commands[index]
    report = tuned.report[index] if index < len(tuned.report) else None
    return ComparedRow(
        index=index,
        kernel=tuned.kernels[command.kernel].func.name,
        shapes=tuple(tuple(tuned.value_type(n).shape) for n in command.outputs),
        default_seconds=statistics.median(default_runs),
        tuned_seconds=statistics.median(tuned_runs),
        speedup=statistics.median(
            d / t for d, t in zip(default_runs, tuned_runs, strict=True) if t > 0
        ),
        schedule=report.schedule if report is not None else "-",
    )


COMPARED_HEADER = (
    "#",
    "kernel",
    "output",
    "default ms",
    "tuned ms",
    "speedup",
    "saved ms",
    "schedule",
)
COMPARED_RIGHT = (True, False, False, True, True, True, True, False)


def format_comparison(c: Comparison) -> str:
    """The comparison as aligned text: per command, most time saved first, then the totals
    (the sums of the medians, and the median of the paired runs' ratios of their commands'
    sums) and the end-to-end speedup."""
    body = [
        (
            str(r.index),
            r.kernel,
            ",".join(_shape(s) for s in r.shapes),
            _ms(r.default_seconds),
            _ms(r.tuned_seconds),
            f"{r.speedup:.3f}",
            f"{r.saved * 1e3:+.4f}",
            r.schedule,
        )
        for r in c.rows
    ]
    default = sum(r.default_seconds for r in c.rows)
    tuned = sum(r.tuned_seconds for r in c.rows)
    totals = [
        ("", "sum of commands", "", _ms(default), _ms(tuned), f"{c.in_commands_speedup:.3f}",
         f"{(default - tuned) * 1e3:+.4f}", ""),
    ] if c.rows else []  # fmt: skip
    faster = sum(r.speedup > 1 for r in c.rows if r.schedule == "tuned")
    tuned_rows = sum(r.schedule == "tuned" for r in c.rows)
    lines = [
        f"tuned against default schedules, @{c.model} on {c.target}: the two builds run in "
        f"turn, {c.repeats} runs each; speedup = the median of the paired runs' default / "
        "tuned (above 1: the tuned build is faster)",
    ]
    if c.forms_differ:
        lines.append(
            "  the builds compile some convs in different forms (Winograd or direct: the "
            "database's measurements chose), so their commands do not pair up: end to end only"
        )
    else:
        lines += _align([COMPARED_HEADER, *body, *totals], COMPARED_RIGHT)
        lines.append(f"tuned commands faster than their default: {faster} of {tuned_rows}")
    lines.append(
        f"end to end: default {_ms(c.default_end_to_end)} ms, tuned {_ms(c.tuned_end_to_end)} "
        f"ms, speedup {c.speedup:.3f} (median of {c.repeats} pairs)"
    )
    return "\n".join(lines)


# -- the table --------------------------------------------------------------------------------

HEADER = ("#", "kernel", "ops", "output", "ms", "share", "GFLOP/s", "of peak", "schedule")
# Which columns align right (numbers) and which left (names).
RIGHT = (True, False, False, False, True, True, True, True, False)


def format_profile(p: Profile) -> str:
    """The profile as aligned text: a title, the peak, the rows and the totals."""
    body = [
        (
            str(r.index),
            r.kernel,
            "+".join(r.ops) or "-",
            ",".join(_shape(s) for s in r.shapes),
            _ms(r.seconds),
            _percent(r.share),
            _number(r.gflops),
            _percent(r.peak_fraction),
            r.schedule,
        )
        for r in p.rows
    ]
    seconds = p.command_seconds
    rate = p.flops / seconds if p.flops and seconds > 0 else None
    totals = [
        ("", "sum of commands", "", "", _ms(seconds), _percent(1.0 if seconds > 0 else 0.0),
         _number(rate and rate / 1e9), _percent(rate and rate / p.peak.flops), ""),
        ("", "commands, a run", "", "", _ms(p.in_commands), "", "", "", ""),
        ("", "end to end", "", "", _ms(p.end_to_end), "", "", "", ""),
    ]  # fmt: skip
    lines = [
        f"profile of @{p.model} on {p.target}: {len(p.rows)} commands, median of "
        f"{p.repeats} runs each",
        f"peak {p.peak}",
        *_align([HEADER, *body, *totals], RIGHT),
        f"in commands / end to end = {p.ratio:.2f}",
    ]
    return "\n".join(lines)


def _align(rows: list[tuple[str, ...]], right: tuple[bool, ...]) -> list[str]:
    widths = [max(len(row[i]) for row in rows) for i in range(len(right))]
    return [
        "  ".join(
            cell.rjust(w) if r else cell.ljust(w)
            for cell, w, r in zip(row, widths, right, strict=True)
        ).rstrip()
        for row in rows
    ]


def _shape(shape: tuple[int, ...]) -> str:
    return "x".join(map(str, shape)) or "scalar"


def _ms(seconds: float) -> str:
    # Four decimals below a millisecond: small kernels take microseconds.
    return f"{seconds * 1e3:.3f}" if seconds >= 1e-3 else f"{seconds * 1e3:.4f}"


def _percent(fraction: float | None) -> str:
    return "-" if fraction is None or not math.isfinite(fraction) else f"{fraction * 100:.1f}%"


def _number(value: float | None) -> str:
    return "-" if value is None or not math.isfinite(value) else f"{value:.1f}"
