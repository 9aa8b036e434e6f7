"""Evolutionary search: propose the candidates of one task worth measuring next (DESIGN.md §5).

    search = EvolutionarySearch(func, "cpu", rng=random.Random(0), database=db)
    batch = search.propose(model, 64)          # candidates never measured, best predicted first
    results = executor.measure(batch)
    search.measured(batch)                     # their keys: never proposed again

One round, MetaSchedule's shape, every number a knob (`SearchConfig.from_knobs`):

1. the initial population: the database's best records of this workload and target (a
   `search_init_best_fraction` share of `search_population`), and while those are fewer, in
   the task's first round, the best of similar workloads (other sizes of the same op,
   hexir/search/transfer.py; the `search_transfer` knob), topped up with fresh samples of the
   search space;
2. `search_generations` generations: the cost model scores the population; parents are drawn
   in proportion to their score; each child is a mutation of its parent (with probability
   `search_mutation_probability`, hexir/search/mutators.py) replayed on the workload, or a
   copy; a mutation that does not replay is dropped and tried again;
3. every candidate scored on the way that was never measured (by anyone: the database's
   candidate keys count) is ranked by score; the batch is the top of that ranking, less a
   `search_epsilon` share of random unmeasured samples, which keep the model honest. Where
   the model is informed, a `search_climb_share` of the batch comes first: the best-scored
   unmeasured neighbours of the task's best record (one step of one decision,
   `mutators.neighbours`), so that each round climbs from the incumbent; before any record
   (a first round, its model untrained), FIRST_CLIMB_SHARE of it, the default schedule's
   neighbours in random order.

On the CPU a candidate whose C is longer than `source_limit` (SOURCE_LIMIT_FACTOR) is not
proposed; the C printed to tell is the C its build compiles (`Candidate.c_source`). Where too
few of a round's candidates fit, fresh samples that fit make up the batch (`_fitting`): an
uninformed round of one draws two samples, and a conv's two may both print too long; a round
that proposes nothing ends its task's tuning.

Everything random draws from the generator given, so a seeded search proposes the same
candidates given the same model and the same measurements.
"""

from __future__ import annotations

import contextlib
import functools
import math
import random
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, fields, replace
from typing import TYPE_CHECKING, Protocol

import numpy as np

from hexir import knobs
from hexir.errors import HexirError, ResourceError, ScheduleError
from hexir.ir.keys import workload_key
from hexir.ir.tir import PrimFunc
from hexir.runtime.target import Target
from hexir.schedule import Trace
from hexir.search.measure import Candidate
from hexir.search.mutators import Mutator, default_mutators, mutate, neighbours
from hexir.search.sources import print_sources
from hexir.search.space import SearchSpace, check_resources

if TYPE_CHECKING:
    from hexir.database import Database

__all__ = [
    "EvolutionarySearch",
    "Predictor",
    "ReplayCache",
    "SearchConfig",
    "SearchProfile",
    "evolve",
    "pick",
    "replay",
]

# Replays kept per task (a trace seen again costs nothing); the cache is cleared when full.
REPLAY_CACHE = 8192

# A CPU candidate is proposed only if its C is at most max(search_max_source_lines, this many
# times the default schedule's lines) long. GCC's time grows with the lines (1-2 ms a line at
# -O3), and past a few thousand lines the kernels are unrolled beyond the register file: of 80
# random conv2d samples (1x64x56x56, 3x3, with and without the residual add), the 12 over
# 2000 lines took 4.2 s each to compile (3.9x the others' mean; 51 of 126 s in all) and ran in
# 1.7-27 ms, against 0.74 ms for the best sample and 0.6 ms for the default (979 lines).
# ResNet-18's default kernels print 19-849 lines. In a 64-trial tune of that conv, the limit
# took the C compiled from 58k lines to 39k and the time a trial from 1.71 to 1.28 s. With the
# knob at 2000, in 64-trial tunes of conv2d, its residual form, matmul 1024³ and dense
# (2026-12-06), each one's fastest candidates were no longer than its default (254, 199, 498
# and 454 lines; all of conv2d's 14 fastest), while 45 of conv2d's 69 and 15 of the residual
# conv's 69 were over twice as long: 2-13 s to compile each (0.3-0.9 s for the others), none
# of them within 1.4x of the best. So the knob, the floor under twice the default, is now 400.
SOURCE_LIMIT_FACTOR = 2
# The share of a first round's batch (no record of the task yet) that is the default
# schedule's neighbours (`EvolutionarySearch.climb`): on a conv two of three random samples
# print too long to propose, each costing half a second of Python, where its neighbours fit.
FIRST_CLIMB_SHARE = 0.5

# Under a search deadline, sampling fresh schedules stops after this share of the time left,
# and evolution has the rest (`_share`).
SAMPLING_SHARE = 0.5

# How many more draws of fresh samples (each as many as the batch misses, at least
# TOP_UP_SAMPLES) a round makes where too few of its candidates fit `source_limit`.
TOP_UP_DRAWS = 8
TOP_UP_SAMPLES = 4


class Predictor(Protocol):
    """What the search needs of a cost model: scores, higher is faster. A model may also say
    whether its scores are `informed` (False: random, so a round skips evolution); one that
    does not say is taken as informed."""

    def predict(self, candidates: list[Candidate]) -> np.ndarray: ...


def is_informed(model: Predictor) -> bool:
    return bool(getattr(model, "informed", True))


@dataclass(frozen=True)
class SearchConfig:
    """The numbers of the search (see the module docstring); `from_knobs` reads the knobs."""

    population: int = 512
    init_best_fraction: float = 0.2
    generations: int = 4
    mutation_probability: float = 0.85
    epsilon: float = 0.05
    measure_per_round: int = 64
    mutation_tries: int = 4
    min_population: int = 64

    @classmethod
    def from_knobs(cls) -> SearchConfig:
        """Each field from its knob, `search_<field>`."""
        k = knobs.get()
        return cls(**{f.name: getattr(k, f"search_{f.name}") for f in fields(cls)})

    def for_round(self, n: int, informed: bool) -> SearchConfig:
        """The settings of a round measuring `n`: the population scaled to the batch (a full
        `measure_per_round` batch gets all of it, a smaller one a share, at least
        `min_population`). When the model's scores are random (before it has trained, or the
        random model) there are no generations, and the population is the batch and a
        quarter: evolution or a ranking guided by noise picks no better than the first
        samples drawn, and each sample costs a schedule built in Python (a conv's, about
        0.15 s); the quarter makes up for draws that repeat a measured candidate."""
        if not informed:
            return replace(self, population=min(self.population, math.ceil(1.25 * n)),
                           generations=0)  # fmt: skip
        share = math.ceil(self.population * n / max(self.measure_per_round, 1))
        population = min(self.population, max(self.min_population, share))
        return replace(self, population=population)


@dataclass
class SearchProfile:
    """Seconds spent, by activity, summed over a tune (mutable: the tuner adds to it)."""

    sampling: float = 0.0
    mutation: float = 0.0
    prediction: float = 0.0
    model_update: float = 0.0
    building: float = 0.0
    measuring: float = 0.0
    database: float = 0.0

    @contextlib.contextmanager
    def timing(self, activity: str) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            setattr(self, activity, getattr(self, activity) + time.perf_counter() - start)

    @property
    def search(self) -> float:
        """The search's own time: sampling, mutation, prediction (features included)."""
        return self.sampling + self.mutation + self.prediction + self.model_update

    def as_dict(self) -> dict[str, float]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


def replay(func: PrimFunc, trace: Trace, target: Target) -> Candidate | None:
    """The candidate `trace` makes of `func`, or None when it does not replay or does not fit
    the target (ScheduleError, ResourceError)."""
    try:
        sch = trace.apply(func, target=target)
        check_resources(sch.func, target)
    except (ScheduleError, ResourceError):
        return None
    return Candidate.from_schedule(func, sch, target)


class ReplayCache:
    """`replay` of one workload with a cache: evolution meets the same traces again and again
    (a task keeps one across rounds; it starts over past REPLAY_CACHE traces)."""

    def __init__(self, func: PrimFunc, target: Target) -> None:
        self.func, self.target = func, target
        self._cache: dict[Trace, Candidate | None] = {}

    def __call__(self, trace: Trace) -> Candidate | None:
        if trace not in self._cache:
            if len(self._cache) >= REPLAY_CACHE:
                self._cache.clear()
            self._cache[trace] = replay(self.func, trace, self.target)
        return self._cache[trace]

    def many(
        self, traces: Sequence[Trace], deadline: float | None = None
    ) -> dict[Trace, Candidate | None]:
        """Each trace's candidate (or None), in order; past `deadline` (a
        `time.perf_counter()` value), only those replayed by then (and any cached)."""
        made: dict[Trace, Candidate | None] = {}
        for t in traces:
            if t not in self._cache and _past(deadline):
                continue
            made[t] = self(t)
        return made

    def seen(self) -> list[Candidate]:
        """Every candidate replayed and still cached."""
        return [c for c in self._cache.values() if c is not None]


def evolve(
    population: Sequence[Candidate],
    model: Predictor,
    rng: random.Random,
    *,
    measured: set[str] | frozenset[str] = frozenset(),
    config: SearchConfig | None = None,
    mutators: Sequence[Mutator] | None = None,
    replayer: ReplayCache | None = None,
    profile: SearchProfile | None = None,
    deadline: float | None = None,
) -> list[tuple[float, Candidate]]:
    """Evolve `population` (candidates of one workload) for `config.generations` generations
    (fewer where `time.perf_counter()` passes `deadline`) and return every unmeasured
    candidate met, (score, candidate), best score first."""
    config = config or SearchConfig.from_knobs()
    mutators = default_mutators() if mutators is None else mutators
    profile = profile or SearchProfile()
    if not population:
        return []
    first = population[0]
    replayer = replayer or ReplayCache(first.workload, first.target)
    scores: dict[str, float] = {}  # the model does not change within a round: score once
    current = _distinct(population)
    for generation in range(config.generations + 1):
        with profile.timing("prediction"):
            _score(current, model, scores)
        if generation == config.generations or _past(deadline):
            break
        with profile.timing("mutation"):
            current = _breed(current, scores, rng, config, mutators, replayer, deadline)
    met = {c.candidate_key: c for c in population}
    met.update((c.candidate_key, c) for c in [*replayer.seen(), *current])
    ranked = [(scores[k], c) for k, c in met.items() if k in scores and k not in measured]
    # Stable for equal scores: ties keep the order met, so a seeded search stays reproducible.
    ranked.sort(key=lambda sc: -sc[0])
    return ranked


def _past(deadline: float | None) -> bool:
    return deadline is not None and time.perf_counter() >= deadline


def _share(deadline: float | None) -> float | None:
    """When sampling must stop so that evolution keeps the rest of the time to `deadline`:
    the `SAMPLING_SHARE` of it from now (drawing a conv's schedules takes tens of ms each, and
    a round's population would take all of it, leaving the model nothing to steer)."""
    if deadline is None:
        return None
    now = time.perf_counter()
    return now + SAMPLING_SHARE * max(0.0, deadline - now)


def _distinct(candidates: Sequence[Candidate]) -> list[Candidate]:
    return list({c.candidate_key: c for c in candidates}.values())


def _score(candidates: list[Candidate], model: Predictor, scores: dict[str, float]) -> None:
    fresh = _distinct([c for c in candidates if c.candidate_key not in scores])
    if not fresh:
        return
    predicted = np.asarray(model.predict(fresh), dtype=float).reshape(-1)
    if len(predicted) != len(fresh):
        raise ValueError(f"the cost model gave {len(predicted)} scores for {len(fresh)}")
    scores.update((c.candidate_key, float(s)) for c, s in zip(fresh, predicted, strict=True))


def _breed(
    parents: list[Candidate],
    scores: dict[str, float],
    rng: random.Random,
    config: SearchConfig,
    mutators: Sequence[Mutator],
    replayer: ReplayCache,
    deadline: float | None = None,
) -> list[Candidate]:
    """The next generation: `config.population` children of parents drawn by score. A child
    to mutate gets `config.mutation_tries` mutations that replay and are new to the
    generation, else it is a copy of its parent. Mutations are drawn in slot order, then
    replayed as one batch per try, so the draws do not depend on how replays are run. Past
    `deadline` nothing more is replayed: the children not made by then are copies (a conv's
    generation of 512 replays took 10 s, where a round's search had 9)."""
    weights = _weights([scores[c.candidate_key] for c in parents])
    slots = rng.choices(parents, weights=weights, k=config.population)
    mutating = [n for n in range(len(slots)) if rng.random() < config.mutation_probability]
    children: list[Candidate | None] = list(slots)
    for n in mutating:
        children[n] = None
    taken = {c.candidate_key for c in children if c is not None}
    for _ in range(config.mutation_tries):
        traces = {n: mutate(slots[n].trace, rng, slots[n].workload, mutators) for n in mutating}
        made = replayer.many([t for t in traces.values() if t is not None], deadline)
        for n, trace in traces.items():
            child = made.get(trace) if trace is not None else None
            if child is not None and child.candidate_key not in taken:
                children[n] = child
                taken.add(child.candidate_key)
        mutating = [n for n in mutating if children[n] is None]
        if not mutating or _past(deadline):
            break
    return _distinct([c if c is not None else slots[n] for n, c in enumerate(children)])


def _weights(scores: list[float]) -> list[float]:
    """Selection weights from scores of any sign: shifted to start at 0, with a floor so that
    the worst still has a (small) chance; uniform when the model cannot tell them apart."""
    low, high = min(scores), max(scores)
    if not high > low:
        return [1.0] * len(scores)
    floor = 0.01 * (high - low)
    return [s - low + floor for s in scores]


def pick(
    ranked: Sequence[tuple[float, Candidate]],
    randoms: Sequence[Candidate],
    n: int,
    epsilon: float,
    rng: random.Random,
    fits: Callable[[Candidate], bool] | None = None,
) -> list[Candidate]:
    """`n` distinct candidates that `fits` accepts (default: all): the best ranked, less an
    `epsilon` share drawn from `randoms` (where there are too few of either, the other makes
    up the batch). `fits` is asked only of candidates about to be taken."""
    n_random = min(int(round(epsilon * n)), len(randoms))
    batch: dict[str, Candidate] = {}
    refused: set[str] = set()

    def take(c: Candidate) -> None:
        key = c.candidate_key
        if key in batch or key in refused:
            return
        if fits is None or fits(c):
            batch[key] = c
        else:
            refused.add(key)

    for _, c in ranked:
        if len(batch) >= n - n_random:
            break
        take(c)
    pool = [c for c in _distinct(randoms) if c.candidate_key not in batch]
    for c in rng.sample(pool, min(len(pool), n - len(batch))):
        take(c)
    for _, c in ranked:  # too few random ones: more of the ranked
        if len(batch) >= n:
            break
        take(c)
    return list(batch.values())


class EvolutionarySearch:
    """The search of one task (workload and target) across rounds: what it has measured, its
    replay cache, its generator. `propose` is one round (see the module docstring)."""

    def __init__(
        self,
        func: PrimFunc,
        target: Target | str,
        *,
        rng: random.Random,
        database: Database | None = None,
        config: SearchConfig | None = None,
        space: SearchSpace | None = None,
        mutators: Sequence[Mutator] | None = None,
        profile: SearchProfile | None = None,
    ) -> None:
        self.func = func
        self.target = Target.of(target)
        self.workload_key = workload_key(func)
        self.rng = rng
        self.database = database
        self.config = config or SearchConfig.from_knobs()
        self.space = space or SearchSpace()
        self.mutators = default_mutators() if mutators is None else tuple(mutators)
        self.profile = profile or SearchProfile()
        self._measured: set[str] = set()
        self._replayer = ReplayCache(func, self.target)
        self._transfer_tried = False
        self.transferred: list[Candidate] = []  # from similar workloads, in the first round
        self.oversized = 0  # candidates not proposed for printing past `source_limit`
        self._refused: list[Candidate] = []  # those candidates, since `take_refused`

    def measured_keys(self) -> set[str]:
        """Candidate keys never to propose: measured here, or recorded in the database."""
        if self.database is None:
            return set(self._measured)
        with self.profile.timing("database"):
            return self._measured | self.database.measured_keys(self.workload_key, self.target)

    def replay(self, trace: Trace) -> Candidate | None:
        """`trace` replayed on this task (cached), or None where it does not replay."""
        return self._replayer(trace)

    def mark_measured(self, candidates: Sequence[Candidate]) -> None:
        self._measured.update(c.candidate_key for c in candidates)

    def take_refused(self) -> list[Candidate]:
        """The candidates not proposed for their C's length (past `source_limit`) since the
        last call: the tuner teaches the model they are the worst, so that the next rounds
        rank such schedules low instead of printing them again and again."""
        refused, self._refused = self._refused, []
        return refused

    def propose(self, model: Predictor, n: int, deadline: float | None = None) -> list[Candidate]:
        """Up to `n` distinct candidates never measured, to measure next; fewer (or none) when
        the space holds no more that the search can find. Past `deadline` (a
        `time.perf_counter()` value) it samples no more and evolves no further generation,
        but for fresh samples where none of its candidates fits `source_limit`."""
        if n <= 0:
            return []
        config = self.config.for_round(n, is_informed(model))
        measured = self.measured_keys()
        best = self.best_candidates(config)
        with self.profile.timing("sampling"):
            fresh = self.sample(
                config.population - len(best), _share(deadline), least=n, skip=measured
            )
        ranked = evolve(
            best + fresh,
            model,
            self.rng,
            measured=measured,
            config=config,
            mutators=self.mutators,
            replayer=self._replayer,
            profile=self.profile,
            deadline=deadline,
        )
        randoms = [c for c in fresh if c.candidate_key not in measured]
        climb = self.climb(model, n, measured)
        taken = {c.candidate_key for c in climb}
        ranked = [(s, c) for s, c in ranked if c.candidate_key not in taken]
        if self.source_limit is not None:  # the C `_fits` reads, printed side by side
            with self.profile.timing("building"):
                self._print_until_fit(_distinct([c for _, c in ranked]), n - len(climb))
        randoms = [c for c in randoms if c.candidate_key not in taken]
        rest = pick(ranked, randoms, n - len(climb), config.epsilon, self.rng, self._fits)
        batch = climb + rest
        if len(batch) < n and self.source_limit is not None:
            seen = measured | taken | {c.candidate_key for c in best + fresh}
            seen |= {c.candidate_key for _, c in ranked}
            # Past the deadline too where nothing fits yet: a round of none tells the tuner
            # the space is spent (it tunes the task no more), where draws would find more.
            batch += self._fitting(n - len(batch), deadline if batch else None, seen)
        return batch

    def _fitting(self, n: int, deadline: float | None, seen: set[str]) -> list[Candidate]:
        """Up to `n` fresh samples that fit `source_limit`, none of `seen`'s keys: at most
        TOP_UP_DRAWS draws, each printed side by side, while draws still find new samples and
        `deadline` has not passed."""
        found: list[Candidate] = []
        seen = set(seen)
        for _ in range(TOP_UP_DRAWS):
            if len(found) >= n or _past(deadline):
                break
            with self.profile.timing("sampling"):
                more = self.sample(max(n - len(found), TOP_UP_SAMPLES), deadline, skip=seen)
            if not more:
                break
            with self.profile.timing("building"):
                print_sources(more, max_lines=self.source_limit)
            for c in _distinct(more):
                seen.add(c.candidate_key)
                if len(found) < n and self._fits(c):
                    found.append(c)
        return found

    def climb(self, model: Predictor, n: int, measured: set[str]) -> list[Candidate]:
        """A `search_climb_share` of `n`: the unmeasured neighbours (`mutators.neighbours`:
        one tile factor moved, or one other choice) of the task's best record so far, best
        scored first. Evolution's children are drawn in proportion to their scores, so on a
        model trained on a few dozen records it may never step next to the incumbent; these
        steps climb from it one measured round at a time. Before any record, the incumbent is
        the default schedule (a first round, the model untrained: in random order): its
        neighbours print within `source_limit` where two thirds of a conv's random samples
        do not, and each costs half a second to print."""
        share = knobs.get().search_climb_share
        incumbent, recorded = self._incumbent() if share > 0 else (None, False)
        # On random scores, only from the default: the best record is the luck of timings,
        # and a seeded search proposes the same given the same model.
        if incumbent is None or (recorded and not is_informed(model)):
            return []
        k = int((share if recorded else max(share, FIRST_CLIMB_SHARE)) * n)
        if k <= 0:
            return []
        with self.profile.timing("mutation"):
            made = self._replayer.many(neighbours(incumbent))
            near = _distinct([c for c in made.values()
                              if c is not None and c.candidate_key not in measured])  # fmt: skip
        if not near:
            return []
        with self.profile.timing("prediction"):
            scores = np.asarray(model.predict(near), dtype=float).reshape(-1)
        order = sorted(range(len(near)), key=lambda i: -scores[i])
        if self.source_limit is not None:
            with self.profile.timing("building"):
                print_sources([near[i] for i in order[:k]], max_lines=self.source_limit)
        return pick([(float(scores[i]), near[i]) for i in order], [], k, 0.0, self.rng, self._fits)

    def _incumbent(self) -> tuple[Trace | None, bool]:
        """The trace `climb` steps from, and whether it is a record's: the best record's, else
        the default schedule's (None where there is neither)."""
        if self.database is not None:
            with self.profile.timing("database"):
                records = self.database.best(self.workload_key, self.target, k=1)
            if records:
                return records[0].load_trace(), True
        return (self.default.trace if self.default is not None else None), False

    @functools.cached_property
    def source_limit(self) -> int | None:
        """The most lines of C a proposed CPU candidate may print (None: no limit): the
        `search_max_source_lines` knob, or SOURCE_LIMIT_FACTOR times the default schedule's
        lines where that is more (see SOURCE_LIMIT_FACTOR)."""
        limit = knobs.get().search_max_source_lines
        if limit <= 0 or self.target.kind != "cpu":
            return None
        if self.default is not None:  # else no default to compare with: the knob's limit
            with self.profile.timing("building"):
                limit = max(limit, SOURCE_LIMIT_FACTOR * self.default.c_lines)
        return limit

    @functools.cached_property
    def default(self) -> Candidate | None:
        """The task's default schedule (hexir/runtime/default_schedule.py), made once: a tune
        measures it first and confirms it, and its C sets `source_limit` (printed once, the
        builder compiles the same text); None where it cannot be made."""
        from hexir.runtime.default_schedule import default_schedule

        try:
            return Candidate.from_schedule(
                self.func, default_schedule(self.func, self.target), self.target
            )
        except HexirError:
            return None

    def _print_until_fit(self, ranked: list[Candidate], n: int) -> None:
        """Print the C of `ranked`'s first candidates, a slice at a time side by side
        (`print_sources`), until `n` of them fit `source_limit` or none is left: `pick` then
        reads each one's size without printing it alone. Each slice is as long as the fitting
        ones still missing (the first, `n`): where the limit refuses half of a round's best
        ranked (a conv2d's rounds), they had been printed one at a time in this process."""
        limit = self.source_limit
        assert limit is not None
        start, fitting = 0, 0
        while fitting < n and start < len(ranked):
            chunk = ranked[start : start + n - fitting]
            print_sources(chunk, max_lines=limit)
            fitting += sum(1 for c in chunk if c.fits(limit))
            start += len(chunk)

    def _fits(self, candidate: Candidate) -> bool:
        """Whether `candidate` prints within `source_limit` (its C, made here, is what the
        builder then compiles: the time counts as building)."""
        limit = self.source_limit
        if limit is None:
            return True
        with self.profile.timing("building"):
            fits = candidate.fits(limit)
        if not fits:
            self.oversized += 1
            self._refused.append(candidate)
        return fits

    def best_candidates(self, config: SearchConfig | None = None) -> list[Candidate]:
        """The database's best records of this task, replayed (the initial population's
        measured share)."""
        config = config or self.config
        k = int(config.population * config.init_best_fraction)
        if self.database is None or k <= 0:
            return []
        with self.profile.timing("database"):
            records = self.database.best(self.workload_key, self.target, k=k)
        # In key order, not latency order: timings vary from run to run, and a seeded search
        # should then still start from the same population.
        records = sorted(records, key=lambda r: r.candidate_key)
        found = []
        with self.profile.timing("sampling"):
            for record in records:
                c = self._replayer(record.load_trace())
                if c is not None:
                    found.append(c)
        if len(records) < k and not self._transfer_tried and knobs.get().search_transfer:
            # A new task: the best of similar workloads, once (hexir/search/transfer.py).
            from hexir.search.transfer import transferred

            self._transfer_tried = True
            with self.profile.timing("sampling"):
                own = {c.candidate_key for c in found}
                more = transferred(self.database, self.func, self.target, k - len(records))
                self.transferred = [c for c in more if c.candidate_key not in own]
            found += self.transferred
        return found

    def sample(
        self,
        n: int,
        deadline: float | None = None,
        least: int = 1,
        skip: set[str] | frozenset[str] = frozenset(),
    ) -> list[Candidate]:
        """Up to `n` fresh samples of the space (drawn `space.max_attempts` times as often,
        at most; the invalid draws, and those whose key is in `skip`, are dropped); past
        `deadline`, what it has once that is `least` (a round's batch). A resumed tune's
        generator draws what the last one measured first: skipping them keeps a small round
        from finding nothing new."""
        found: list[Candidate] = []
        for _ in range(max(0, n) * self.space.max_attempts):
            if len(found) >= n or (len(found) >= least and _past(deadline)):
                break
            try:
                sch = self.space.sample_schedule(self.func, self.target, self.rng)
            except (ScheduleError, ResourceError):
                continue
            candidate = Candidate.from_schedule(self.func, sch, self.target)
            if candidate.candidate_key not in skip:
                found.append(candidate)
        return found
