"""The schedule state: the current PrimFunc, its trace, and what each random variable names.

Every primitive validates, builds the new PrimFunc, and only then commits: the new function,
the new RVs and one Instruction together. A primitive that raises leaves all three as they were.
"""

from __future__ import annotations

import copy as _copy
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TypeVar, Union

from hexir.errors import ScheduleError
from hexir.ir.tir import Block, For, PrimFunc, Stmt, Var
from hexir.schedule.common import (
    all_blocks,
    child_blocks,
    find_path,
    is_block,
    is_loop,
    loops_of,
    schedule_error,
    walk_stmts,
)
from hexir.schedule.trace import RV, BlockRV, ExprRV, Instruction, LoopRV, Trace, Value, freeze


@dataclass(frozen=True, slots=True)
class Location:
    """A compute location that is not a loop: `ROOT` (where the block is) or `INLINE`."""

    name: str

    def __repr__(self) -> str:
        return self.name


ROOT = Location("root")
INLINE = Location("inline")

# What an RV names: a block by name, a loop by its var, an integer, or a special location.
Symbol = Union[str, Var, int, Location]

F = TypeVar("F", bound=Callable)


def primitive(fn: F) -> F:
    """Mark a Schedule method as a primitive: `Trace.apply` replays only these."""
    fn.is_primitive = True  # type: ignore[attr-defined]
    return fn


class ScheduleBase:
    """The state every primitive group builds on (see `hexir.schedule.Schedule`)."""

    def __init__(
        self,
        func: PrimFunc,
        *,
        seed: int | None = None,
        rng: random.Random | None = None,
        target: object = None,
    ) -> None:
        self._func = func
        self._nodes: tuple[Stmt, dict[str | Var, Block | For]] | None = None  # `_node`'s index
        self._searched: Stmt | None = None  # the body `_node` last searched
        self._instructions: list[Instruction] = []
        self._symbols: dict[RV, Symbol] = {}
        self._num_rvs = 0  # RVs are numbered by position of definition across the trace
        # Sampling draws from this generator only, never the global one.
        self.rng = rng if rng is not None else random.Random(seed)
        # Anything with `max_threads_per_block` (a hexir Target); None checks no limits.
        self.target = target

    @property
    def func(self) -> PrimFunc:
        return self._func

    @property
    def trace(self) -> Trace:
        return Trace(tuple(self._instructions))

    def copy(self) -> ScheduleBase:
        """An independent schedule at the same point (RVs of this one are valid in it)."""
        new = _copy.copy(self)
        new._instructions = list(self._instructions)
        new._symbols = dict(self._symbols)
        new.rng = random.Random()
        new.rng.setstate(self.rng.getstate())
        return new

    fork = copy

    # -- RVs ----------------------------------------------------------------------------------

    def describe(self, rv: RV) -> str:
        """What `rv` points at, as the IR names it (`matmul`, `i_0`, `32`, `root`)."""
        sym = self._symbols.get(rv)
        match sym:
            case None:
                return f"{rv.trace_name}?"
            case Var(name):
                return name
            case _:
                return str(sym)

    def get(self, rv: RV) -> Block | For | int | Location:
        """The block, loop, integer or location `rv` points at now."""
        sym = self._symbol(rv, "get")
        if isinstance(sym, str):
            return self._block(rv, "get")
        if isinstance(sym, Var):
            return self._loop(rv, "get")
        return sym

    def _symbol(self, rv: object, primitive: str) -> Symbol:
        if not isinstance(rv, RV) or rv not in self._symbols:
            raise ScheduleError(f"{rv!r} is not a handle of this schedule", primitive)
        return self._symbols[rv]

    def _block(self, rv: object, primitive: str) -> Block:
        name = self._symbol(rv, primitive)
        if not isinstance(rv, BlockRV) or not isinstance(name, str):
            raise ScheduleError(f"expected a block, got {rv!r}", primitive)
        block = self._node(name)
        if block is None:
            raise schedule_error(primitive, f"block @{name} no longer exists", self._func)
        return block  # type: ignore[return-value]

    def _loop(self, rv: object, primitive: str) -> For:
        var = self._symbol(rv, primitive)
        if not isinstance(rv, LoopRV) or not isinstance(var, Var):
            raise ScheduleError(f"expected a loop, got {rv!r}", primitive)
        loop = self._node(var)
        if loop is None:
            raise schedule_error(
                primitive, f"loop %{var.name} no longer exists (split, fused away?)", self._func
            )
        return loop  # type: ignore[return-value]

    def _node(self, key: str | Var) -> Block | For | None:
        """The first block named `key` (a str) or loop over `key` (a Var) in pre-order. The
        first lookup in a body searches it; a second indexes it, once for that body: a default
        schedule looks up its handles many times between two changes (its loops, each by its
        var), a sampled one mostly once (the index, a walk of the whole body, cost it more)."""
        body = self._func.body
        if self._nodes is None or self._nodes[0] is not body:
            if self._searched is not body:
                self._searched = body
                match = is_block(key) if isinstance(key, str) else is_loop(key)
                path = find_path(body, match)
                return None if path is None else path[-1]  # type: ignore[return-value]
            nodes: dict[str | Var, Block | For] = {}
            for stmt in walk_stmts(body):
                if isinstance(stmt, Block):
                    nodes.setdefault(stmt.name, stmt)
                elif isinstance(stmt, For):
                    nodes.setdefault(stmt.var, stmt)
            self._nodes = (body, nodes)
        return self._nodes[1].get(key)

    def _int(self, value: object, primitive: str) -> int:
        """An int argument, given as an int or an ExprRV."""
        if isinstance(value, ExprRV):
            value = self._symbol(value, primitive)
        if isinstance(value, bool) or not isinstance(value, int):
            raise ScheduleError(f"expected an integer or an ExprRV, got {value!r}", primitive)
        return value

    def _commit(
        self,
        kind: str,
        inputs: Sequence[tuple[str, object]],
        attrs: Sequence[tuple[str, object]],
        func: PrimFunc,
        outputs: Sequence[tuple[type[RV], Symbol]] = (),
        decision: object = None,
    ) -> list[RV]:
        """Install `func`, define the output RVs, and append the instruction."""
        first = self._num_rvs
        rvs = [cls(first + n, self) for n, (cls, _) in enumerate(outputs)]  # type: ignore
        inst = Instruction(
            kind,
            tuple((k, freeze(v)) for k, v in inputs),
            tuple((k, freeze(v)) for k, v in attrs),
            tuple(freeze(rv) for rv in rvs),  # type: ignore[misc]
            None if decision is None else freeze(decision),
        )
        self._func = func
        self._symbols.update((rv, sym) for rv, (_, sym) in zip(rvs, outputs, strict=True))
        self._instructions.append(inst)
        self._num_rvs += len(rvs)
        return rvs

    # -- Getting handles ----------------------------------------------------------------------

    @primitive
    def get_block(self, name: str) -> BlockRV:
        """The block named `name` (block names are structural: DESIGN.md §2)."""
        found = [b.name for b in all_blocks(self._func.body)]
        if found.count(name) != 1:
            why = "no block" if name not in found else f"{found.count(name)} blocks"
            raise schedule_error(
                "get_block", f"{why} named {name!r}; blocks: {', '.join(found)}", self._func
            )
        (rv,) = self._commit("get_block", (), (("name", name),), self._func, [(BlockRV, name)])
        return rv  # type: ignore[return-value]

    @primitive
    def get_loops(self, block: BlockRV) -> list[LoopRV]:
        """The loops around `block`, outermost first."""
        node = self._block(block, "get_loops")
        path = find_path(self._func.body, lambda s: s is node)
        loops = loops_of(path or [])
        outs = [(LoopRV, loop.var) for loop in loops]
        return self._commit("get_loops", (("block", block),), (), self._func, outs)  # type: ignore

    @primitive
    def get_child_blocks(self, block_or_loop: BlockRV | LoopRV) -> list[BlockRV]:
        """The blocks directly under a block or loop (not inside another block), in order."""
        if isinstance(block_or_loop, LoopRV):
            node: Block | For = self._loop(block_or_loop, "get_child_blocks")
        else:
            node = self._block(block_or_loop, "get_child_blocks")
        outs = [(BlockRV, b.name) for b in child_blocks(node)]
        inputs = (("block_or_loop", block_or_loop),)
        return self._commit("get_child_blocks", inputs, (), self._func, outs)  # type: ignore


__all__ = ["INLINE", "ROOT", "Location", "ScheduleBase", "Symbol", "Value", "primitive"]
