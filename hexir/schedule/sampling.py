"""Sampling: instructions that choose, record their choice as the decision, and return RVs.

    v4, v5 = sch.sample_perfect_tile(loop=l1, n=2, max_innermost_factor=16, decision=[64, 16])
    v6 = sch.sample_categorical(candidates=[0, 16, 64], probs=[0.5, 0.25, 0.25], decision=1)
    l7 = sch.sample_compute_location(block=b0, decision=2)

Given a decision, an instruction checks it and uses it (replay); without, it draws one from
the schedule's own `random.Random`. The IR never changes: sampling only defines RVs.
"""

from __future__ import annotations

import itertools
import math
import random
from collections.abc import Sequence

from hexir.ir.tir import Block, BufferStore, For, PrimFunc, Var
from hexir.schedule.common import all_blocks, find_path, loops_of, schedule_error
from hexir.schedule.state import INLINE, ROOT, Location, ScheduleBase, primitive
from hexir.schedule.trace import BlockRV, ExprRV, LoopRV


class SamplingPrimitives(ScheduleBase):
    @primitive
    def sample_perfect_tile(
        self,
        loop: LoopRV,
        n: int,
        max_innermost_factor: int = 16,
        decision: Sequence[int] | None = None,
    ) -> list[ExprRV]:
        """`n` factors whose product is `loop`'s extent, the innermost at most
        `max_innermost_factor` (below 1: no limit); feed them to `split`.

        The IR is unchanged; `v4, v5 = sch.sample_perfect_tile(l1, n=2)` on `for %i in 0..1024`
        may give [64, 16], and `sch.split(l1, [v4, v5])` then makes `%i_0 in 0..64`,
        `%i_1 in 0..16`.
        """
        node = self._loop(loop, "sample_perfect_tile")
        if n < 1:
            raise schedule_error("sample_perfect_tile", f"n must be positive, got {n}", self.func)
        if decision is None:
            factors = _sample_tile(self.rng, node.extent, n, max_innermost_factor)
        else:
            factors = list(decision)
        _check_tile(self.func, node.var, node.extent, n, max_innermost_factor, factors)
        attrs = (("n", n), ("max_innermost_factor", max_innermost_factor))
        outs = [(ExprRV, f) for f in factors]
        rvs = self._commit(
            "sample_perfect_tile", (("loop", loop),), attrs, self.func, outs, decision=factors
        )
        return rvs  # type: ignore[return-value]

    @primitive
    def sample_categorical(
        self, candidates: Sequence[int], probs: Sequence[float], decision: int | None = None
    ) -> ExprRV:
        """One of the integer `candidates`, drawn with `probs`; the decision is its index.

        The IR is unchanged; `v3 = sch.sample_categorical([0, 16, 64], [0.5, 0.25, 0.25])`
        then `sch.annotate(l1, "pragma_auto_unroll_max_step", v3)` sets the drawn value.
        """
        _check_categorical(self.func, candidates, probs)
        if decision is None:
            decision = self.rng.choices(range(len(candidates)), weights=probs)[0]
        if not _is_index(decision, len(candidates)):
            raise schedule_error(
                "sample_categorical",
                f"decision {decision!r} is not an index into the {len(candidates)} candidates",
                self.func,
            )
        attrs = (("candidates", list(candidates)), ("probs", [float(p) for p in probs]))
        out = [(ExprRV, candidates[decision])]
        (rv,) = self._commit("sample_categorical", (), attrs, self.func, out, decision=decision)
        return rv  # type: ignore[return-value]

    @primitive
    def sample_compute_location(self, block: BlockRV, decision: int | None = None) -> LoopRV:
        """Where `block` could be computed: a loop, or the `ROOT` / `INLINE` location; the
        decision is an index into `compute_location_candidates`. Feed it to `compute_at`.

        The IR is unchanged; for a producer block @pad read by @conv under loops %n, %k, the
        candidates are [root, inline, %n, %k] and decision 3 returns a LoopRV on %k.
        """
        node = self._block(block, "sample_compute_location")
        candidates = compute_location_candidates(self.func, node)
        if decision is None:
            decision = self.rng.randrange(len(candidates))
        if not _is_index(decision, len(candidates)):
            raise schedule_error(
                "sample_compute_location",
                f"decision {decision!r} is not an index into the {len(candidates)} candidate "
                f"locations of block @{node.name}: {candidates}",
                self.func,
                block=node.name,
            )
        out = [(LoopRV, candidates[decision])]
        inputs = (("block", block),)
        kind = "sample_compute_location"
        (rv,) = self._commit(kind, inputs, (), self.func, out, decision=decision)
        return rv  # type: ignore[return-value]


# ---------------------------------------------------------------------------------------------


def divisors(n: int) -> list[int]:
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    return sorted(set(small + [n // d for d in small]))


def _sample_tile(rng: random.Random, extent: int, n: int, max_inner: int) -> list[int]:
    inner_choices = [d for d in divisors(extent) if max_inner < 1 or d <= max_inner]
    if n == 1:
        return [extent]
    factors = [1] * n
    factors[-1] = rng.choice(inner_choices)
    rest = extent // factors[-1]
    for pos in range(n - 2, 0, -1):
        factors[pos] = rng.choice(divisors(rest))
        rest //= factors[pos]
    factors[0] = rest
    return factors


def _check_tile(
    func: PrimFunc, var: Var, extent: int, n: int, max_inner: int, factors: list[int]
) -> None:
    what = f"tile {factors} of loop %{var.name} (extent {extent})"
    if len(factors) != n or not all(_is_index(f, extent + 1) and f > 0 for f in factors):
        reason = f"{what}: expected {n} positive integers"
    elif math.prod(factors) != extent:
        reason = f"{what}: the factors multiply to {math.prod(factors)}, not {extent}"
    elif 1 <= max_inner < factors[-1]:
        reason = f"{what}: the innermost factor exceeds max_innermost_factor={max_inner}"
    else:
        return
    raise schedule_error("sample_perfect_tile", reason, func, loop=var)


def _check_categorical(func: PrimFunc, candidates: Sequence[int], probs: Sequence[float]) -> None:
    if not candidates or len(candidates) != len(probs):
        reason = f"{len(candidates)} candidates and {len(probs)} probabilities"
    elif not all(isinstance(c, int) and not isinstance(c, bool) for c in candidates):
        reason = f"candidates must be integers, got {list(candidates)}"
    elif any(p < 0 for p in probs) or sum(probs) <= 0:
        reason = f"probabilities must be non-negative with a positive sum, got {list(probs)}"
    else:
        return
    raise schedule_error("sample_categorical", reason, func)


def _is_index(value: object, n: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < n


def compute_location_candidates(func: PrimFunc, block: Block) -> list[Var | Location]:
    """Where `block` may be computed: ROOT (where it is), INLINE when it is an elementwise
    producer of an intermediate buffer, then the loops around all of its consumers that are
    not around it, outermost first."""
    candidates: list[Var | Location] = [ROOT]
    if _inlinable(func, block):
        candidates.append(INLINE)
    written = {r.buffer for r in block.writes}
    consumers = [
        b for b in all_blocks(func.body) if b is not block and written & {r.buffer for r in b.reads}
    ]
    if not consumers:
        return candidates
    paths = [[f.var for f in _loops_around(func, b)] for b in consumers]
    # The loops every consumer shares: the common prefix of paths of any lengths.
    shared = itertools.takewhile(lambda vs: len(set(vs)) == 1, zip(*paths, strict=False))
    common = [vs[0] for vs in shared]
    own = {f.var for f in _loops_around(func, block)}
    return candidates + [v for v in common if v not in own]


def _loops_around(func: PrimFunc, block: Block) -> list[For]:
    return loops_of(find_path(func.body, lambda s: s is block) or [])


def _inlinable(func: PrimFunc, block: Block) -> bool:
    return (
        block.init is None
        and all(iv.kind == "spatial" for iv in block.iter_vars)
        and isinstance(block.body, BufferStore)
        and block.body.buffer not in func.params
    )
