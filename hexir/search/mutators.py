"""Mutators: small changes to a trace's decisions, the evolutionary search's steps.

    child = mutate(trace, rng, func)        # a new Trace, or None when nothing applied
    child.apply(func)                       # may still raise ScheduleError: the caller drops it

A trace's structure (which blocks are tiled, cached, bound) is its sketch; a mutator changes
only decisions of its sampling instructions, and never the structure. What a decision controls
is read off the trace itself (`sites`): which loops each tile factor sizes, and whether those
are parallel or bound to GPU threads; which categorical choice sets an unroll step or a thread
count. The mutators:

- `TileMutator`: move a divisor of one level's factor to another level of a
  `sample_perfect_tile` decision (the product, the loop's extent, stays).
- `ParallelMutator`: the same with a parallel level on one side: more or fewer parallel jobs.
- `ThreadBindingMutator`: the same with a `threadIdx` level on one side, or another thread
  count for a categorical thread count: the threads per GPU block.
- `UnrollMutator`: another `pragma_auto_unroll_max_step` (a `sample_categorical`).
- `ComputeLocationMutator`: another legal index of a `sample_compute_location`.

Each is pure: the same trace and generator state give the same child.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from hexir import knobs
from hexir.errors import ScheduleError
from hexir.ir.tir import AUTO_UNROLL_KEY, Block, PrimFunc
from hexir.schedule import Trace
from hexir.schedule.sampling import compute_location_candidates, divisors
from hexir.schedule.trace import RV, ExprRV, Instruction, Value

__all__ = [
    "ChoiceSite",
    "ComputeLocationMutator",
    "Mutator",
    "ParallelMutator",
    "Sites",
    "ThreadBindingMutator",
    "TileMutator",
    "TileSite",
    "UnrollMutator",
    "default_mutators",
    "mutate",
    "neighbours",
    "sites",
]

PARALLEL = "parallel"
UNROLL = "unroll"


@dataclass(frozen=True)
class TileSite:
    """A `sample_perfect_tile` instruction: its index, factors, innermost limit, and per level
    the marks of the loops it sizes ("parallel", "threadIdx.x", "blockIdx.x", "vthread")."""

    index: int
    factors: tuple[int, ...]
    max_innermost: int
    marks: tuple[frozenset[str], ...]


@dataclass(frozen=True)
class ChoiceSite:
    """A `sample_categorical` instruction: its index, decision, probabilities, and marks:
    "unroll" where it sets an unroll step, an axis where its value sizes a bound loop."""

    index: int
    decision: int
    probs: tuple[float, ...]
    marks: frozenset[str]


@dataclass(frozen=True)
class Sites:
    """Every decision of a trace, by what it controls."""

    tiles: tuple[TileSite, ...] = ()
    choices: tuple[ChoiceSite, ...] = ()
    locations: tuple[int, ...] = ()  # indices of sample_compute_location instructions


def sites(trace: Trace) -> Sites:
    """What each decision of `trace` controls, read off the instructions that use it."""
    origin: dict[RV, set[tuple[int, int]]] = {}  # RV -> (instruction index, level) it comes from
    marks: dict[tuple[int, int], set[str]] = {}
    for n, inst in enumerate(trace.instructions):
        _track(n, inst, origin, marks)
    tiles, choices, locations = [], [], []
    for n, inst in enumerate(trace.instructions):
        match inst.kind:
            case "sample_perfect_tile":
                factors = tuple(_ints(inst.decision))
                levels = tuple(frozenset(marks.get((n, k), ())) for k in range(len(factors)))
                limit = _ints(_arg(inst, "max_innermost_factor", 0))[0]
                tiles.append(TileSite(n, factors, limit, levels))
            case "sample_categorical":
                probs = tuple(_floats(_arg(inst, "probs", ())))
                decision = _ints(inst.decision)[0]
                choices.append(ChoiceSite(n, decision, probs, frozenset(marks.get((n, 0), ()))))
            case "sample_compute_location":
                locations.append(n)
    return Sites(tuple(tiles), tuple(choices), tuple(locations))


def _items(value: Value) -> tuple[Value, ...]:
    return value if isinstance(value, tuple) else (value,)


def _ints(value: Value) -> list[int]:
    return [int(v) for v in _items(value) if isinstance(v, int)]


def _floats(value: Value) -> list[float]:
    return [float(v) for v in _items(value) if isinstance(v, int | float)]


def _track(
    n: int,
    inst: Instruction,
    origin: dict[RV, set[tuple[int, int]]],
    marks: dict[tuple[int, int], set[str]],
) -> None:
    """Follow decisions through the instructions: sampled values into split loops, split loops
    through fuse, and mark what a loop or value ends up as."""
    match inst.kind:
        case "sample_perfect_tile" | "sample_categorical":
            for level, rv in enumerate(inst.outputs):
                origin[rv] = {(n, level)}
        case "split":
            for factor, loop in zip(_items(_arg(inst, "factors", ())), inst.outputs, strict=True):
                if isinstance(factor, ExprRV) and factor in origin:
                    origin[loop] = set(origin[factor])
        case "fuse":
            loops = [lp for lp in _items(_arg(inst, "*loops", ())) if isinstance(lp, RV)]
            merged = set().union(*(origin.get(lp, set()) for lp in loops))
            if merged and inst.outputs:
                origin[inst.outputs[0]] = merged
        case "parallel":
            _mark(origin, marks, _arg(inst, "loop"), PARALLEL)
        case "bind":
            _mark(origin, marks, _arg(inst, "loop"), str(_arg(inst, "thread_axis", "")))
        case "annotate" if _arg(inst, "key") == AUTO_UNROLL_KEY:
            _mark(origin, marks, _arg(inst, "value"), UNROLL)
        case "flash_attention":  # query rows on threadIdx.y; a tile's keys over the lanes, x
            _mark(origin, marks, _arg(inst, "query_tile"), "threadIdx.y")
            _mark(origin, marks, _arg(inst, "key_tile"), "threadIdx.x")
            _mark(origin, marks, _arg(inst, "lanes"), "threadIdx.x")


def _mark(
    origin: dict[RV, set[tuple[int, int]]],
    marks: dict[tuple[int, int], set[str]],
    rv: Value,
    mark: str,
) -> None:
    if isinstance(rv, RV):
        for where in origin.get(rv, ()):
            marks.setdefault(where, set()).add(mark)


def _arg(inst: Instruction, name: str, default: Value = None) -> Value:
    for key, value in inst.inputs + inst.attrs:
        if key == name:
            return value
    return default


# ---------------------------------------------------------------------------------------------


class Mutator(Protocol):
    """Proposes a child of a trace by changing decisions; None where it cannot. `weight`:
    how often `mutate` draws it among the mutators that apply."""

    @property
    def weight(self) -> float: ...

    def applies(self, found: Sites) -> bool: ...

    def propose(
        self, trace: Trace, found: Sites, func: PrimFunc, rng: random.Random
    ) -> Trace | None: ...


def _move(site: TileSite, src: int, dst: int, rng: random.Random) -> tuple[int, ...] | None:
    """The factors with a divisor > 1 of level `src` moved to level `dst`, respecting the
    innermost limit; None when no divisor fits."""
    factors = list(site.factors)
    cap = _room(site, dst)
    options = [d for d in divisors(factors[src]) if d > 1 and (cap is None or d <= cap)]
    if not options:
        return None
    d = rng.choice(options)
    factors[src] //= d
    factors[dst] *= d
    return tuple(factors)


def _room(site: TileSite, dst: int) -> int | None:
    """The largest factor level `dst` may take in: the innermost limit over what the
    innermost level holds; None: any."""
    if dst == len(site.factors) - 1 and site.max_innermost >= 1:
        return site.max_innermost // site.factors[dst]
    return None


def _movable(site: TileSite, marked: str | None) -> list[tuple[int, int]]:
    """(src, dst) level pairs a factor may move between: any two levels, or, with `marked`,
    pairs with exactly one level whose marks start with `marked`."""
    n = len(site.factors)
    pairs = []
    for src in range(n):
        if site.factors[src] == 1:
            continue
        for dst in range(n):
            if dst == src:
                continue
            if marked is not None and _has(site, src, marked) == _has(site, dst, marked):
                continue
            pairs.append((src, dst))
    return pairs


def _has(site: TileSite, level: int, marked: str) -> bool:
    return any(m.startswith(marked) for m in site.marks[level])


def _tile_step(trace: Trace, found: Sites, rng: random.Random, marked: str | None) -> Trace | None:
    options = [(s, p) for s in found.tiles for p in _movable(s, marked)]
    if not options:
        return None
    site, (src, dst) = rng.choice(options)
    factors = _move(site, src, dst, rng)
    return None if factors is None else trace.with_decision(site.index, list(factors))


def _choice_step(trace: Trace, choices: Sequence[ChoiceSite], rng: random.Random) -> Trace | None:
    if not choices:
        return None
    site = rng.choice(list(choices))
    others = [k for k, p in enumerate(site.probs) if k != site.decision and p > 0]
    if not others:
        return None
    return trace.with_decision(site.index, rng.choice(others))


@dataclass(frozen=True)
class TileMutator:
    """Move a factor between two levels of one tile decision."""

    weight: float = 0.8

    def applies(self, found: Sites) -> bool:
        return any(_movable(s, None) for s in found.tiles)

    def propose(
        self, trace: Trace, found: Sites, func: PrimFunc, rng: random.Random
    ) -> Trace | None:
        return _tile_step(trace, found, rng, None)


@dataclass(frozen=True)
class ParallelMutator:
    """Grow or shrink the parallel level of a tile decision (the parallel extent)."""

    weight: float = 0.04

    def applies(self, found: Sites) -> bool:
        return any(_movable(s, PARALLEL) for s in found.tiles)

    def propose(
        self, trace: Trace, found: Sites, func: PrimFunc, rng: random.Random
    ) -> Trace | None:
        return _tile_step(trace, found, rng, PARALLEL)


@dataclass(frozen=True)
class ThreadBindingMutator:
    """Change the threads per GPU block: a factor into or out of a `threadIdx` level, or
    another thread count where one is a categorical choice."""

    weight: float = 0.03

    def applies(self, found: Sites) -> bool:
        return bool(_thread_choices(found)) or any(_movable(s, "threadIdx") for s in found.tiles)

    def propose(
        self, trace: Trace, found: Sites, func: PrimFunc, rng: random.Random
    ) -> Trace | None:
        choices = _thread_choices(found)
        tiles = any(_movable(s, "threadIdx") for s in found.tiles)
        if choices and (not tiles or rng.random() < 0.5):
            return _choice_step(trace, choices, rng)
        return _tile_step(trace, found, rng, "threadIdx")


def _thread_choices(found: Sites) -> list[ChoiceSite]:
    return [c for c in found.choices if any(m.startswith("threadIdx") for m in c.marks)]


@dataclass(frozen=True)
class UnrollMutator:
    """Another auto-unroll step."""

    weight: float = 0.08

    def applies(self, found: Sites) -> bool:
        return any(UNROLL in c.marks for c in found.choices)

    def propose(
        self, trace: Trace, found: Sites, func: PrimFunc, rng: random.Random
    ) -> Trace | None:
        return _choice_step(trace, [c for c in found.choices if UNROLL in c.marks], rng)


@dataclass(frozen=True)
class ComputeLocationMutator:
    """Another compute location for a block, among the candidates at that point of the trace
    (found by replaying the trace up to it)."""

    weight: float = 0.05

    def applies(self, found: Sites) -> bool:
        return bool(found.locations)

    def propose(
        self, trace: Trace, found: Sites, func: PrimFunc, rng: random.Random
    ) -> Trace | None:
        index = rng.choice(found.locations)
        inst = trace.instructions[index]
        try:
            prefix = Trace(trace.instructions[:index]).apply(func)
            block = prefix.get(_arg(inst, "block"))  # type: ignore[arg-type]
        except ScheduleError:
            return None
        assert isinstance(block, Block)
        count = len(compute_location_candidates(prefix.func, block))
        others = [k for k in range(count) if k != inst.decision]
        return trace.with_decision(index, rng.choice(others)) if others else None


def neighbours(trace: Trace) -> list[Trace]:
    """Every trace one step from `trace`: a prime factor of one tile level moved to another
    level of the same decision (within the innermost limit), or another option of one
    categorical choice; in instruction order. The search measures the best-scored of them
    around a task's incumbent (`EvolutionarySearch.propose`)."""
    found = sites(trace)
    out: list[Trace] = []
    for site in found.tiles:
        for src, dst in _movable(site, None):
            cap = _room(site, dst)
            for p in _primes(site.factors[src]):
                if cap is not None and p > cap:
                    continue
                factors = list(site.factors)
                factors[src] //= p
                factors[dst] *= p
                out.append(trace.with_decision(site.index, factors))
    for choice in found.choices:
        for k, p in enumerate(choice.probs):
            if k != choice.decision and p > 0:
                out.append(trace.with_decision(choice.index, k))
    return out


def _primes(n: int) -> list[int]:
    found, p = [], 2
    while p * p <= n:
        if n % p == 0:
            found.append(p)
            while n % p == 0:
                n //= p
        p += 1
    return found + [n] if n > 1 else found


def default_mutators() -> tuple[Mutator, ...]:
    """The mutators with their weights from the knobs (`search_mutate_*`)."""
    k = knobs.get()
    return (
        TileMutator(k.search_mutate_tile),
        ParallelMutator(k.search_mutate_parallel),
        ThreadBindingMutator(k.search_mutate_thread_binding),
        UnrollMutator(k.search_mutate_unroll),
        ComputeLocationMutator(k.search_mutate_compute_location),
    )


def mutate(
    trace: Trace,
    rng: random.Random,
    func: PrimFunc,
    mutators: Sequence[Mutator] | None = None,
) -> Trace | None:
    """A child of `trace`: one mutator, drawn by weight among those that apply, changes its
    decisions. None when none applies or the drawn one found nothing to change. The child is
    not replayed here: `child.apply(func)` may raise ScheduleError."""
    mutators = default_mutators() if mutators is None else mutators
    found = sites(trace)
    applicable = [m for m in mutators if m.weight > 0 and m.applies(found)]
    if not applicable:
        return None
    (chosen,) = rng.choices(applicable, weights=[m.weight for m in applicable])
    return chosen.propose(trace, found, func, rng)
