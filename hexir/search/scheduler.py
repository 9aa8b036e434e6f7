"""Tasks of a model, and the scheduler that spends a tune's trials across them (DESIGN.md §5).

    tasks = extract_tasks(graph)             # distinct workloads, weighted by occurrences
    floors = [roofline(t, target) for t in tasks]
    sched = TaskScheduler([t.weight for t in tasks], trials=200, per_round=64, floors=floors)
    while (step := sched.next()) is not None:
        index, n = step                      # tune task `index` with `n` trials
        ...
        sched.record(index, measured=n, best=best_latency)   # seconds, or None

A model yields tasks the way `hexir.compile` builds it: simplify the graph, partition it into
fusion groups, lower each group; groups that lower to one workload key are one task, whose
weight is how many times it runs per inference.

The first round gives every task a few trials: `per_round`, or less, so that the first rounds
together take at most the `tune_first_round_share` of the budget (a model of 25 tasks tuned with
600 trials gets 6 each, not 24: the gradient phase is where the gain is), and at least one
each (its default schedule) while the budget holds one per task. After that each round goes
to the task whose next round promises the largest drop in end-to-end latency, Σ weight × best
latency, as in Ansor's and MetaSchedule's gradient-based schedulers. A task's gain is its
weight times

    min(alpha * (h[-1-w] - h[-1]) / w  +  (1 - alpha) * h[-1] / len(h) * hits,   h[-1] - floor)

where h is its best latency after each of its rounds: the recent improvement per round (over
the last w = `window` rounds), mixed with an optimistic forward estimate (the latency could keep
falling at its average rate) weighed by how often its rounds have found a better schedule,
hits = (rounds that improved its best by more than IMPROVED + 1) / len(h) (1 after its first
round; a task whose rounds keep finding nothing falls behind as 1/len(h)^2, where Ansor's
forward estimate alone kept a task that never improved after its first round picked for 462 of
ResNet-18's 2000 trials), and never more than its headroom: what separates its best from
its roofline `floor`, the time its flops take at the target's peak or its bytes (every input
read and output written once) at the target's bandwidth, whichever is longer (`roofline`). A
task at its roofline gets no more rounds while another has room. A task with no valid
measurement yet comes first, for up to `window` rounds; a task whose space is spent
(`exhaust`) gets no more.

A conv with two forms (Winograd and direct, hexir/graph/forms.py) runs the one whose kernels'
best times sum lower; a kernel of the form that sums higher saves nothing until its form
overtakes the other. So a task's gain in each such conv where its form is behind
(`losing_forms`: how often the kernel runs in that form, and the gap between the two sums)
is what its runs there would gain beyond the gap, nothing short of it (`form_gains`): the
direct forms of ResNet-18's Winograd convs, 1.6-1.8 ms against 0.6-0.9, took 135 trials each
of 2000 (950 in all) and gained 0-8% where the model runs none of them.
"""

from __future__ import annotations

import itertools
import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from hexir import knobs
from hexir.errors import TypeInferenceError
from hexir.ir.analysis import flop_count
from hexir.ir.dtype import numpy_dtype
from hexir.ir.graph import Graph
from hexir.ir.keys import workload_key
from hexir.ir.tir import PrimFunc

if TYPE_CHECKING:
    from hexir.database import Database
    from hexir.runtime.target import Target

__all__ = [
    "Task",
    "TaskScheduler",
    "extract_tasks",
    "first_round",
    "form_gains",
    "gradient_gains",
    "losing_forms",
    "mixed_tasks",
    "roofline",
    "traffic_bytes",
]


# A round improved a task's best where it fell by more than this share (less is the noise of
# timing the same kernel again).
IMPROVED = 0.01


@dataclass(frozen=True)
class Task:
    """One workload to tune: its unscheduled PrimFunc and how often the model runs it."""

    func: PrimFunc
    workload_key: str
    weight: int
    flops: int
    # A kernel only of a conv's other form (Winograd or direct: hexir/graph/forms.py),
    # measured so that compile can choose that form; not in the model as the rule builds it.
    alternative: bool = False

    @property
    def name(self) -> str:
        return self.func.name


def traffic_bytes(func: PrimFunc) -> int:
    """The bytes a kernel of `func` must move at least: every parameter read or written once."""
    return sum(math.prod(b.shape) * numpy_dtype(b.dtype).itemsize for b in func.params)


def roofline(task: Task, target: Target | str) -> float:
    """The fewest seconds task's kernel can take on `target`: its flops at the target's fp32
    peak or its bytes (`traffic_bytes`) at its bandwidth, whichever is longer; the bandwidth
    of memory where the bytes are more than a tune times warm (COLD_BYTES: such a kernel is
    timed with its data in DRAM), else of a cache-sized copy."""
    from hexir.runtime.peak import bandwidth
    from hexir.runtime.target import Target
    from hexir.search.worker import COLD_BYTES

    target = Target.of(target)
    compute = task.flops / target.peak().flops
    moved = traffic_bytes(task.func)
    rate = bandwidth(target, knobs.get().cache_dir, memory=moved > COLD_BYTES).bytes_per_s
    return max(compute, moved / rate)


def extract_tasks(func_or_graph: PrimFunc | Graph, target: Target | str = "cpu") -> list[Task]:
    """The distinct workloads of a PrimFunc (one task) or a Graph (simplified, partitioned and
    lowered as `hexir.compile` does for `target`), in order of first occurrence; a graph's
    convs with a Winograd and a direct form add the tasks of both (`form_variants`)."""
    if isinstance(func_or_graph, PrimFunc):
        if func_or_graph.symbols:
            raise TypeInferenceError(
                f"kernel {func_or_graph.name} has symbolic extents "
                f"({', '.join(func_or_graph.symbols)}) and tuning works at fixed sizes: lower "
                "the graph specialized to them (hexir.specialize)"
            )
        variants = [[func_or_graph]]
    else:
        from hexir.graph.forms import form_variants
        from hexir.graph.fusion import fused_kernels
        from hexir.graph.rewrite import simplify_graph
        from hexir.graph.specialize import require_sizes

        require_sizes(func_or_graph, "tuning")
        graph = simplify_graph(func_or_graph)  # once: each lowering then finds it simplified
        variants = [
            [func for _, func in fused_kernels(graph, target, forms)[1]]
            for forms in form_variants(graph, target)
        ]
    # A workload's weight is its count in the first variant that has it: the rule's forms,
    # then the convs' other forms (hexir/graph/forms.py), which compile may choose instead.
    found: dict[str, Task] = {}
    for variant, funcs in enumerate(variants):
        for key, (f, count) in _workloads(funcs).items():
            if key not in found:
                found[key] = Task(f, key, count, flop_count(f), alternative=variant > 0)
    return list(found.values())


def _workloads(funcs: Sequence[PrimFunc]) -> dict[str, tuple[PrimFunc, int]]:
    """The distinct workloads of `funcs`, in order of first occurrence: key -> (the first
    func with it, how many have it)."""
    counts: dict[str, tuple[PrimFunc, int]] = {}
    for func in funcs:
        key = workload_key(func)
        first, count = counts.get(key, (func, 0))
        counts[key] = (first, count + 1)
    return counts


def mixed_tasks(
    graph: Graph, target: Target | str, database: Database, known: set[str]
) -> list[Task]:
    """The tasks of the kernels that a build with `database` makes where its convs' own
    times mix the forms of the variants `extract_tasks` lowers (`mixed_forms`): the
    layout changes between a Winograd conv and a direct one, which neither variant has.
    Those whose workload keys are not `known` and have no valid time in `database`, each
    weighted by its count in the mix; empty where the times pick no mix."""
    from hexir.graph.forms import mixed_forms
    from hexir.graph.fusion import fused_kernels
    from hexir.graph.rewrite import simplify_graph

    graph = simplify_graph(graph)  # once: each lowering then finds it simplified
    forms = mixed_forms(graph, target, database)
    if not forms:
        return []
    counts = _workloads([func for _, func in fused_kernels(graph, target, forms)[1]])
    return [
        Task(func, key, count, flop_count(func), alternative=True)
        for key, (func, count) in counts.items()
        if key not in known
        and not any(r.median is not None for r in database.best(key, target, k=1))
    ]


def first_round(
    weights: Sequence[float], trials: int, per_round: int, share: float = 1.0
) -> list[int]:
    """Trials of each task's first round: `per_round` each, or less, so that together they
    take at most the `share` of `trials`, and at least one each while `trials` holds one per
    task; one each for the heaviest tasks when even that does not fit."""
    n = len(weights)
    if n == 0 or trials <= 0:
        return [0] * n
    each = min(per_round, max(1, int(trials * share) // n), trials // n)
    if each >= 1:
        return [each] * n
    order = sorted(range(n), key=lambda i: -weights[i])
    chosen = set(order[:trials])
    return [1 if i in chosen else 0 for i in range(n)]


def gradient_gains(
    histories: Sequence[Sequence[float]],
    weights: Sequence[float],
    alpha: float,
    window: int,
    floors: Sequence[float] | None = None,
) -> list[float]:
    """Each task's expected drop in weighted latency from one more round (see the module
    docstring); `histories` hold best latencies per round (math.inf: none valid yet),
    `floors` each task's roofline in seconds (None: no headroom cap)."""
    gains = []
    floors = floors if floors is not None else [0.0] * len(weights)
    for h, weight, floor in zip(histories, weights, floors, strict=True):
        if not h:
            gains.append(0.0)
            continue
        best = h[-1]
        if math.isinf(best):
            gains.append(math.inf)
            continue
        back = (h[-1 - window] - best) / window if len(h) > window else 0.0
        forward = best / len(h) * _hits(h)
        headroom = max(0.0, best - floor)
        gains.append(weight * min(alpha * back + (1.0 - alpha) * forward, headroom))
    return gains


def losing_forms(
    forms: Sequence[tuple[Counter[str], Counter[str]]], best: dict[str, float | None]
) -> dict[str, list[tuple[int, float]]]:
    """Each workload key in the form that sums higher of a conv with two `forms` (each conv's
    rule's and other form's kernels' keys, counted as often as they run there:
    hexir/graph/forms.py `form_counts`) -> per such conv, (how often it runs in that form,
    the seconds by which that form's `best` times sum higher than the other's). A conv with a
    kernel without a time in either form has no form behind."""
    from hexir.graph.forms import summed

    losing: dict[str, list[tuple[int, float]]] = {}
    for counts in forms:
        sums = [summed(keys, best.get) for keys in counts]
        if None in sums:
            continue
        rule, other = sums
        behind, gap = (counts[0], rule - other) if rule > other else (counts[1], other - rule)
        for key, n in behind.items():
            losing.setdefault(key, []).append((n, gap))
    return losing


def form_gains(
    gains: Sequence[float], weights: Sequence[float], losing: Sequence[Sequence[tuple[int, float]]]
) -> list[float]:
    """`gains` (`gradient_gains`, weight x the gain of one run) where each task's runs in a
    conv's form that is behind (`losing[i]`: per such conv, its runs there and the gap,
    `losing_forms`) count only beyond the gap (see the module docstring)."""
    out = []
    for gain, weight, behind in zip(gains, weights, losing, strict=True):
        if not behind or math.isinf(gain) or weight <= 0:
            out.append(gain)
            continue
        each = gain / weight
        elsewhere = max(0.0, weight - sum(n for n, _ in behind))
        out.append(each * elsewhere + sum(max(0.0, each * n - gap) for n, gap in behind))
    return out


def _hits(h: Sequence[float]) -> float:
    """The share of a task's rounds that found a better schedule, counting its first: (rounds
    after the first whose best fell by more than IMPROVED, + 1) / rounds."""
    found = sum(1 for a, b in itertools.pairwise(h) if b < a * (1.0 - IMPROVED))
    return (found + 1) / len(h)


class TaskScheduler:
    """Which task gets the next round, and how many trials (see the module docstring).
    `trials` is the budget of the whole call; `record` tells what each round measured;
    `floors` are the tasks' rooflines in seconds (`roofline`; None: no headroom cap)."""

    def __init__(
        self,
        weights: Sequence[float],
        trials: int,
        per_round: int | None = None,
        *,
        alpha: float | None = None,
        window: int | None = None,
        initial: Sequence[float | None] | None = None,
        floors: Sequence[float] | None = None,
        first_share: float | None = None,
    ) -> None:
        k = knobs.get()
        self.weights = list(weights)
        self.floors = list(floors) if floors is not None else None
        self.trials = trials
        self.per_round = per_round if per_round is not None else k.search_measure_per_round
        self.alpha = alpha if alpha is not None else k.tune_gradient_alpha
        self.window = window if window is not None else k.tune_gradient_window
        self.used = 0
        # Best latency per task after each round; a known best (from the database) starts it.
        start = initial or [None] * len(self.weights)
        self.histories: list[list[float]] = [[] if b is None else [b] for b in start]
        self.rounds = [0] * len(self.weights)
        self.exhausted = [False] * len(self.weights)
        share = first_share if first_share is not None else k.tune_first_round_share
        self._first = first_round(self.weights, trials, self.per_round, share)
        self._pending = [i for i, n in enumerate(self._first) if n > 0]
        # Per task, its runs in conv forms that sum higher and the gaps (`weigh_forms`).
        self.losing: list[list[tuple[int, float]]] = [[] for _ in self.weights]

    @property
    def left(self) -> int:
        return max(0, self.trials - self.used)

    def next(self) -> tuple[int, int] | None:
        """(task index, trials) of the next round, or None when the budget or every task's
        space is spent."""
        while self._pending:
            i = self._pending.pop(0)
            if not self.exhausted[i] and self.left > 0:
                return i, min(self._first[i], self.left)
        if self.left <= 0:
            return None
        chosen = self.pick()
        return None if chosen is None else (chosen, min(self.per_round, self.left))

    def pick(self) -> int | None:
        """The live task of largest gain (ties: the first)."""
        gains = gradient_gains(self.histories, self.weights, self.alpha, self.window, self.floors)
        gains = form_gains(gains, self.weights, self.losing)
        live = [i for i in range(len(gains)) if self._live(i)]
        if not live:
            return None
        return max(live, key=lambda i: (gains[i], -i))

    def _live(self, i: int) -> bool:
        if self.exhausted[i]:
            return False
        no_valid = not self.histories[i] or math.isinf(self.histories[i][-1])
        # A task that never measured a valid candidate gets `window` rounds, then none.
        return not (no_valid and self.rounds[i] >= max(1, self.window))

    @property
    def in_first_rounds(self) -> bool:
        """Whether a first round is still to come."""
        return bool(self._pending)

    def weigh_forms(self, losing: Sequence[Sequence[tuple[int, float]]]) -> None:
        """Each task's runs in the conv forms that now sum higher, and by how much
        (`losing_forms`, by task): `pick` counts its gain there beyond the gap only."""
        assert len(losing) == len(self.weights)
        self.losing = [list(behind) for behind in losing]

    def add(self, weight: float, floor: float | None = None) -> int:
        """A task found during the tune (`mixed_tasks`): its index. Its first round, as
        short as the shortest of the others', comes next."""
        i = len(self.weights)
        self.weights.append(weight)
        if self.floors is not None:
            self.floors.append(0.0 if floor is None else floor)
        self.histories.append([])
        self.rounds.append(0)
        self.exhausted.append(False)
        self.losing.append([])
        self._first.append(min((n for n in self._first if n > 0), default=1))
        self._pending.append(i)
        return i

    def record(self, task: int, measured: int, best: float | None) -> None:
        """A round of `task` measured `measured` candidates; its best latency is now `best`."""
        self.used += measured
        self.rounds[task] += 1
        self.histories[task].append(math.inf if best is None else best)

    def exhaust(self, task: int) -> None:
        """The task's search finds nothing new: give it no more rounds."""
        self.exhausted[task] = True
