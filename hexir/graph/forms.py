"""Which form each convolution compiles to, Winograd or direct, as the database measured it.

    variants = form_variants(graph, target)           # [the rule's forms, the other forms]
    forms = measured_forms(graph, target, database)   # {conv's result: tile (0: direct)}

On the CPU a 3x3 conv of stride 1 with a constant weight has two forms (hexir/graph/layout.py):
direct, one kernel that takes its epilogues, or Winograd F(m, 3): the image's transforms, a
batch_matmul and the copy back that takes the epilogues. `winograd_tile` is the rule a build
without measurements follows. `hexir tune` tunes the kernels of both forms: the tasks of
`form_variants`, the rule's forms and then, for every such conv at once, the other one
(direct where the rule says Winograd; F(2, 3) where it says direct). `hexir.compile` with a
database gives each conv the form whose kernels' best measured times add up to less
(`measured_forms`), and the rule's form where the database lacks a time for a kernel of
either. Those times are the kernels' inside a run of the model where a tune timed them
there (`Database.in_model`: one sitting, every kernel of both forms, since their best
records), else their best times alone. Where those picks mix the two variants' forms, the
mix has kernels of its own (a layout change between a Winograd conv and a direct one:
ResNet-18's stride-2 1x1 conv as a matmul over NHWC): the mix is built only where the
database times each of them and the whole build sums lower than either variant's; else,
from the variant that sums lower, each conv's pick alone where its kernels are timed and save
time (the picks that save most first).
`hexir tune` times the mix's own kernels (`mixed_forms`, hexir/search/scheduler.py
`mixed_tasks`). A tile forced by the `winograd` knob leaves nothing to choose.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from hexir import knobs
from hexir.graph.fusion import Group, fused_kernels
from hexir.graph.layout import winograd_applies, winograd_tile
from hexir.graph.rewrite import simplify_graph
from hexir.ir.graph import Graph, Op
from hexir.ir.kept import keeping
from hexir.ir.keys import workload_key
from hexir.ir.tir import PrimFunc
from hexir.runtime.target import Target

__all__ = [
    "ConvForms",
    "Form",
    "conv_forms",
    "form_counts",
    "form_kernels",
    "form_variants",
    "measured_forms",
    "measured_kernels",
    "mixed_forms",
    "summed",
    "winograd_choices",
]

# The Winograd tile a conv the rule keeps direct is measured with: its output is small (7x7),
# and F(2, 3)'s tiles are the ones that cover it with the least waste.
ALTERNATIVE_TILE = 2


class _Database(Protocol):
    def best(self, workload_key: str, target: Target | str, k: int = 1) -> list: ...

    def in_model(self, workload_key: str, target: Target | str) -> Any: ...


def winograd_choices(graph: Graph, target: Target | str = "cpu") -> dict[str, tuple[int, int]]:
    """For each conv of `graph` (simplified, as compile sees it) that has both forms on
    `target`: its result's name -> (the rule's tile, the other form's tile); empty on a GPU,
    with weight packing off or with a tile forced by the `winograd` knob."""
    k = knobs.get()
    if Target.of(target).kind != "cpu" or not k.pack_weights or k.winograd != "auto":
        return {}
    simplified = simplify_graph(graph)
    constants = {op.result.name for op in simplified.ops if op.kind == "constant"}
    choices = {}
    for op in simplified.ops:
        if winograd_applies(op) and op.operands[1].name in constants:
            rule = winograd_tile(op)
            choices[op.result.name] = (rule, 0 if rule else ALTERNATIVE_TILE)
    return choices


def form_variants(graph: Graph, target: Target | str = "cpu") -> list[dict[str, int]]:
    """The forms tuning measures: the rule's for every conv, then (where any conv has two
    forms) every such conv in its other form."""
    choices = winograd_choices(graph, target)
    if not choices:
        return [{}]
    return [{name: rule for name, (rule, _) in choices.items()},
            {name: other for name, (_, other) in choices.items()}]  # fmt: skip


@dataclass(frozen=True)
class Form:
    """One form of a conv as the database measured it: its tile (0: direct), how many
    kernels compute it, and the sum of their best times in seconds (None: one unmeasured):
    their times inside a run of the model where `inside` (see the module)."""

    tile: int
    kernels: int
    seconds: float | None
    inside: bool = False


@dataclass(frozen=True)
class ConvForms:
    """A conv with two forms (`hexir show MODEL --forms`): its result's name and shape, the
    rule's form and the other, and the tile a build with the database gives it."""

    name: str
    shape: tuple[int, ...]
    rule: Form
    other: Form
    chosen: int


def measured_kernels(
    graph: Graph, target: Target | str, database: _Database
) -> tuple[Graph, list[tuple[Group, PrimFunc]]]:
    """`fused_kernels` of `graph` with each conv in the form `measured_forms` gives it (a
    variant tuning lowered reused where that is the choice)."""
    return _choose(graph, target, database)[1]


def measured_forms(graph: Graph, target: Target | str, database: _Database) -> dict[str, int]:
    """Each conv with two forms -> the tile of the form a build with `database` gives it (0:
    direct); empty where no conv has two forms. Each conv takes the form whose kernels' best
    times there sum lower, the rule's where a kernel of either form has no valid time; where
    that mixes the forms of the two variants tuning measures (`form_variants`), the mix
    makes kernels of its own (a layout change between a Winograd conv and a direct one):
    it stands only where the database times every one of them and the whole build sums
    lower than each variant's; else the variant that sums lower (the rule's where either is
    not timed in full), with each conv's own pick where that alone is timed and faster."""
    return _choose(graph, target, database)[0]


def mixed_forms(graph: Graph, target: Target | str, database: _Database) -> dict[str, int]:
    """The forms each conv's own times pick (`measured_forms` before it weighs the whole
    build), where they mix the variants tuning measures; empty where they do not (no conv
    with two forms, or the picks are one of the variants). What `hexir tune` times the
    kernels of after its rounds, so that a build may take the mix."""
    with keeping():
        _, variants, _, convs, _ = _picks(graph, target, database)
    picked = {c.name: c.chosen for c in convs}
    return {} if len(variants) == 1 or picked in variants else picked


def form_kernels(graph: Graph, target: Target | str = "cpu") -> dict[str, set[str]]:
    """Each conv with two forms -> the workload keys of the kernels of both its forms: what a
    build's pick between them weighs (`measured_forms`), and so what `hexir tune` times
    together at its end (hexir/search/tune.py)."""
    return {
        name: set(rule) | set(other) for name, (rule, other) in form_counts(graph, target).items()
    }


def form_counts(
    graph: Graph, target: Target | str = "cpu"
) -> dict[str, tuple[Counter[str], Counter[str]]]:
    """Each conv with two forms -> the workload keys of its rule's form's kernels and of its
    other form's, each counted as often as it runs there: the sums a build's pick compares,
    and so where `hexir tune`'s trials can change the pick (hexir/search/scheduler.py
    `losing_forms`)."""
    _, variants, laid_out = _lowered(graph, target)
    if len(variants) == 1:
        return {}
    return {name: (rule, other) for name, (rule, other) in _form_keys(variants, laid_out).items()}


def conv_forms(graph: Graph, target: Target | str, database: _Database) -> list[ConvForms]:
    """Each conv with two forms, both measured, and the form a build takes
    (`measured_forms`)."""
    return _choose(graph, target, database)[2]


class _Times:
    """The best valid time `database` holds for each workload on `target`, and that best
    candidate's time inside a model's run where a tune timed it there, read once."""

    def __init__(self, target: Target | str, database: _Database) -> None:
        self.target, self.database = target, database
        self.best: dict[str, Any] = {}  # the best record, None where there is none
        self.inside: dict[str, tuple[float, str] | None] = {}  # seconds, the sitting

    def __call__(self, key: str) -> float | None:
        record = self._best(key)
        return None if record is None else record.median

    def _best(self, key: str) -> Any:
        if key not in self.best:
            records = self.database.best(key, self.target, k=1)
            valid = [r for r in records if r.median is not None]
            self.best[key] = valid[0] if valid else None
        return self.best[key]

    def _inside(self, key: str) -> tuple[float, str] | None:
        """The workload's time inside a model's run and its sitting: where one timed it since
        its best record alone (else a better candidate may have come since)."""
        if key not in self.inside:
            best = self._best(key)
            record = None if best is None else self.database.in_model(key, self.target)
            fresh = record is not None and record.created >= best.created
            self.inside[key] = (
                (record.median, str(record.build_info["in_model"])) if fresh else None
            )
        return self.inside[key]

    def faster(self, a: _Kernels, b: _Kernels) -> bool:
        """Whether the kernels of `a` take less time than those of `b`: each that one runs
        and the other does not is timed (as often as it runs), and they sum lower."""
        keys = [Counter(workload_key(f) for _, f in kernels) for _, kernels in (a, b)]
        common = keys[0] & keys[1]
        totals, _ = self.totals(keys[0] - common, keys[1] - common)
        return None not in totals and totals[0] < totals[1]  # type: ignore[operator]

    def totals(self, *keys: Counter[str]) -> tuple[list[float | None], bool]:
        """For each of `keys`, the summed times of the workloads it counts (None: one
        untimed), to compare, and whether they are of a model's run: inside one where one
        sitting timed every one of them there since its best record (a tune's end times the
        model so in each form: hexir/search/tune.py), else their best times alone."""
        every = {key for counted in keys for key in counted}
        inside = {key: found for key in every if (found := self._inside(key)) is not None}
        if every and len(inside) == len(every) and len({s for _, s in inside.values()}) == 1:
            sums: list[float | None] = [
                sum(n * inside[key][0] for key, n in counted.items()) for counted in keys
            ]
            return sums, True
        return [self.total(counted) for counted in keys], False

    def total(self, keys: Counter[str]) -> float | None:
        """The summed best times of the workloads `keys` counts (None: one untimed)."""
        return summed(keys, self)


def summed(keys: Counter[str], seconds: Callable[[str], float | None]) -> float | None:
    """The `seconds` of each workload `keys` counts, times its count, summed (None: one has
    none): a form's time, as a build's pick (`measured_forms`) and the tune's scheduler
    (hexir/search/scheduler.py `losing_forms`) weigh it."""
    total = 0.0
    for key, count in keys.items():
        time = seconds(key)
        if time is None:
            return None
        total += count * time
    return total


_Kernels = tuple[Graph, list[tuple[Group, PrimFunc]]]


def _picks(
    graph: Graph, target: Target | str, database: _Database
) -> tuple[Graph, list[dict[str, int]], list[_Kernels], list[ConvForms], _Times]:
    """The graph simplified, its variants (`form_variants`) lowered, each conv with two
    forms and the form its own kernels' times pick, and the times read."""
    graph, variants, laid_out = _lowered(graph, target)
    times = _Times(target, database)
    if len(variants) == 1:
        return graph, variants, laid_out, [], times
    # (by the graph's names: a layout pass may rename a conv in either form, `4` to `4_nhwc`)
    shapes = {op.result.name: op.result.type.shape for op in graph.ops}
    return graph, variants, laid_out, _measure(variants, laid_out, times, shapes), times


def _lowered(
    graph: Graph, target: Target | str
) -> tuple[Graph, list[dict[str, int]], list[_Kernels]]:
    """The graph simplified, its variants (`form_variants`) and each lowered."""
    graph = simplify_graph(graph)  # once: each lowering then finds it simplified
    variants = form_variants(graph, target)
    return graph, variants, [fused_kernels(graph, target, variant) for variant in variants]


def _choose(
    graph: Graph, target: Target | str, database: _Database
) -> tuple[dict[str, int], _Kernels, list[ConvForms]]:
    """`measured_forms`, the kernels it lowers to and `conv_forms`."""
    with keeping():  # the kernels of each lowering are keyed by each weighing of them
        return _chosen(graph, target, database)


def _chosen(
    graph: Graph, target: Target | str, database: _Database
) -> tuple[dict[str, int], _Kernels, list[ConvForms]]:
    graph, variants, laid_out, convs, times = _picks(graph, target, database)
    if len(variants) == 1:
        return {}, laid_out[0], []
    picked = {c.name: c.chosen for c in convs}
    if picked in variants:
        return picked, laid_out[variants.index(picked)], convs
    # A mix: from the variant that sums lower (the rule's where either is untimed), the whole
    # mix where it is timed and faster, else each conv's pick alone where that is, the
    # picks that save most first.
    rule, other = zip(variants, laid_out, strict=True)
    chosen, kernels = other if times.faster(other[1], rule[1]) else rule
    saving = {c.name: abs((c.rule.seconds or 0.0) - (c.other.seconds or 0.0)) for c in convs}
    flips = sorted(picked, key=lambda name: -saving[name])
    for step in [picked, *({name: picked[name]} for name in flips)]:
        trial = chosen | step
        if trial == chosen:
            continue
        lowered = fused_kernels(graph, target, trial)
        if times.faster(lowered, kernels):
            chosen, kernels = trial, lowered
    convs = [dataclasses.replace(c, chosen=chosen[c.name]) for c in convs]
    return chosen, kernels, convs


def _measure(
    variants: list[dict[str, int]],
    laid_out: list[_Kernels],
    times: _Times,
    shapes: dict[str, tuple[int, ...]],
) -> list[ConvForms]:
    """Each conv with two forms, both measured, and the form its own kernels' times pick."""
    convs = []
    for name, keys in _form_keys(variants, laid_out).items():
        seconds, inside = times.totals(*keys)
        rule, other = (
            Form(variants[v][name], keys[v].total(), seconds[v], inside) for v in range(2)
        )
        chosen = rule.tile
        if rule.seconds is not None and other.seconds is not None and other.seconds < rule.seconds:
            chosen = other.tile
        convs.append(ConvForms(name, shapes[name], rule, other, chosen))
    return convs


def _form_keys(
    variants: list[dict[str, int]], laid_out: list[_Kernels]
) -> dict[str, list[Counter[str]]]:
    """Each conv with two forms -> per variant, the workload keys of the kernels that compute
    it in that variant's form (each as often as it runs)."""
    # Per variant: each value's producing op, the groups, each group's func.
    producers = [{op.result.name: op for op in g.ops} for g, _ in laid_out]
    groups = [[group for group, _ in kernels] for _, kernels in laid_out]
    funcs = [{id(group): func for group, func in kernels} for _, kernels in laid_out]
    keys = {}
    for name in variants[0]:
        keys[name] = [
            Counter(
                workload_key(funcs[v][id(g)])
                for g in _form_groups(producers[v], groups[v], name, producers[1 - v])
            )
            for v in range(len(laid_out))
        ]
    return keys


def _form_groups(
    producer: dict[str, Op], groups: list[Group], name: str, elsewhere: dict[str, Op]
) -> list[Group]:
    """The groups that compute the conv `name` in one variant's form of it (`producer`: that
    variant's ops by result): those holding an op of its form, one that only this variant
    has (its result is not among `elsewhere`, the other variant's) named after `name` (the
    Winograd form's transforms, batch_matmul and transposes) or `name` itself (the direct
    conv, the Winograd form's copy back to NCHW where it has not sunk away), and the
    groups of this variant only that read the form's result: the Winograd form's epilogue
    where its transposes sank through it (hexir/graph/rewrite.py), which the direct conv's
    kernel computes too."""
    form = {n for n in producer if n.startswith(f"{name}_") and n not in elsewhere}
    form |= {name} & producer.keys()
    mine = [g for g in groups if any(op.result.name in form for op in g.ops)]
    read_inside = {v.name for n in form for v in producer[n].operands}
    results = form - read_inside  # (not its NHWC copy of the image, which a residual reads)
    for group in groups:
        if group in mine or any(op.result.name in elsewhere for op in group.ops):
            continue
        if any(v.name in results for op in group.ops for v in op.operands):
            mine.append(group)
    return mine
