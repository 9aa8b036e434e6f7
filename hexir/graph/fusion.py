"""Fusion: partition a graph's ops into groups, each lowered to one kernel.

    groups = partition(graph)            # every non-constant op in exactly one group
    func = lower(groups[0].graph())      # params: group.inputs, then group.outputs

Each op has a pattern (`pattern(op)`, from its definition's fusion role in `hexir.ops`), and
a group grows from its first op (its anchor) by taking in consumers, one op at a time in graph
order:

- an elementwise or broadcast op starts a chain that takes elementwise and broadcast
  consumers, and at most one reduction, which ends the group (`exp -> reduce_sum`);
- an out-fusable op (matmul, batch_matmul, dense, conv2d) takes elementwise and broadcast
  epilogues (bias_add, batch_norm, activations, the residual add);
- a cheap injective op (pad, concat, a slice with unit inner step, a transpose, a Winograd
  output transform: its kernel computes its consumers where it stores, a transposing copy in
  tiles included) takes
  elementwise and broadcast consumers; any other injective op, a reduction, or an opaque op
  stands alone, and so does a reshape (a view, below).

A consumer joins the group of one of its operands (out-fusable groups first) only if the
operands it reads from that group are not broadcast up (for a reduction: only its data
operand comes from the group), no other op of the group already reads them (each
intermediate has one consumer inside its group, so inlining never recomputes), the placements
agree, and no other operand depends on the group (which would make a cycle between groups).
Softmax, log_softmax, layer_norm and rms_norm are single ops, so each is one kernel, with its
elementwise producers.

With the `fusion` knob off, every op is its own group. Groups come out in a topological order:
running them in order computes the graph.

A reshape (`OpDef.view`) is always a group of its own, `is_view`, and no kernel: every buffer
is contiguous row-major, so its result is its operand's storage under another shape (the
memory plan aliases the two), and its consumers read that storage directly.
"""

from __future__ import annotations

import contextlib
import heapq
from collections.abc import Iterator, Mapping
from contextvars import ContextVar
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from hexir import knobs
from hexir.ir.graph import Graph, Op, Value
from hexir.ir.tir import PrimFunc
from hexir.ops import op_def
from hexir.ops.base import Pattern

if TYPE_CHECKING:
    from hexir.runtime.target import Target

__all__ = [
    "Group",
    "Pattern",
    "cheap_injective",
    "fused_kernels",
    "is_view",
    "lowering_once",
    "partition",
    "pattern",
]

_E, _B, _R = Pattern.ELEMENTWISE, Pattern.BROADCAST, Pattern.REDUCTION

# What a group accepts as a consumer, by the pattern of its first op.
_EPILOGUE = frozenset({_E, _B})
_CHAIN = frozenset({_E, _B, _R})
_CLOSED: frozenset[Pattern] = frozenset()


def pattern(op: Op) -> Pattern:
    """The fusion pattern of `op`: its definition's role (`hexir.ops`), made broadcast for an
    elementwise op with an operand smaller than its result; unknown kinds are opaque."""
    d = op_def(op.kind)
    base = d.fusion if d is not None else Pattern.OPAQUE
    if base is Pattern.ELEMENTWISE and any(
        v.type.shape != op.result.type.shape for v in op.operands
    ):
        return Pattern.BROADCAST
    return base


@dataclass(frozen=True, slots=True)
class Group:
    """Ops lowered into one kernel, in graph order.

    `inputs`: the values the ops read that the group does not compute (graph inputs,
    constants, other groups' results), in order of first use. `outputs`: the results used
    outside the group, returned by the graph, or used by nobody, in the order computed.
    """

    ops: tuple[Op, ...]
    inputs: tuple[Value, ...]
    outputs: tuple[Value, ...]

    def graph(self) -> Graph:
        """The group as a graph whose inputs (constants included) are `self.inputs`."""
        return Graph("group", self.inputs, self.ops, self.outputs)


def partition(graph: Graph) -> list[Group]:
    """Every non-constant op of `graph` in exactly one group; groups in a topological order."""
    ops = [op for op in graph.ops if op.kind != "constant"]
    if not knobs.get().fusion:
        members = [[op] for op in ops]
    else:
        state = _Partition()
        for op in ops:
            state.place(op)
        members = state.members
    return _groups(graph, _topological(members))


class _Partition:
    """The groups being grown: members, what each accepts, and which groups each reads."""

    def __init__(self) -> None:
        self.members: list[list[Op]] = []
        self.accepts: list[frozenset[Pattern]] = []
        self.reads: list[set[int]] = []
        self.group_of: dict[str, int] = {}  # op result name -> group index
        self.read_inside: set[str] = set()  # results already read by an op of their group

    def place(self, op: Op) -> None:
        p = pattern(op)
        for g in self._candidates(op):
            if self._can_join(g, op, p):
                self._add(g, op)
                if p is Pattern.REDUCTION:
                    self.accepts[g] = _CLOSED
                return
        self.members.append([])
        self.accepts.append(_opens(op, p))
        self.reads.append(set())
        self._add(len(self.members) - 1, op)

    def _candidates(self, op: Op) -> list[int]:
        found = [self.group_of[v.name] for v in op.operands if v.name in self.group_of]
        unique = list(dict.fromkeys(found))
        # An epilogue goes to its contraction first: that saves the most memory traffic.
        return sorted(unique, key=lambda g: pattern(self.members[g][0]) is not Pattern.OUT_FUSABLE)

    def _can_join(self, g: int, op: Op, p: Pattern) -> bool:
        if p not in self.accepts[g] or op.placement != self.members[g][0].placement:
            return False
        mine = [i for i, v in enumerate(op.operands) if self.group_of.get(v.name) == g]
        if p is Pattern.REDUCTION:
            if mine != [0]:
                return False
        elif any(op.operands[i].type.shape != op.result.type.shape for i in mine):
            return False
        if any(op.operands[i].name in self.read_inside for i in mine):
            return False
        others = {self.group_of[v.name] for v in op.operands if v.name in self.group_of} - {g}
        return not any(self._reaches(h, g) for h in others)

    def _reaches(self, start: int, target: int) -> bool:
        """Whether group `start` depends, directly or not, on group `target`."""
        seen, stack = {start}, [start]
        while stack:
            for h in self.reads[stack.pop()]:
                if h == target:
                    return True
                if h not in seen:
                    seen.add(h)
                    stack.append(h)
        return False

    def _add(self, g: int, op: Op) -> None:
        for v in op.operands:
            h = self.group_of.get(v.name)
            if h == g:
                self.read_inside.add(v.name)
            elif h is not None:
                self.reads[g].add(h)
        self.members[g].append(op)
        self.group_of[op.result.name] = g


def _opens(op: Op, p: Pattern) -> frozenset[Pattern]:
    """What a group that starts with `op` accepts as consumers: nothing for a view op, which
    stays a lone view (`is_view`) that its consumers read as another name of its operand."""
    d = op_def(op.kind)
    if d is not None and d.view:
        return _CLOSED
    match p:
        case Pattern.ELEMENTWISE | Pattern.BROADCAST:
            return _CHAIN
        case Pattern.OUT_FUSABLE:
            return _EPILOGUE
        case Pattern.INJECTIVE if cheap_injective(op):
            return _EPILOGUE
        case _:
            return _CLOSED


def cheap_injective(op: Op) -> bool:
    """Whether an injective op is cheap to compute inside its consumer's kernel: its
    definition's `cheap` says so (the consumer still reads its operand row by row: reshape,
    pad, concat, a slice with a unit step on the innermost axis, a transpose)."""
    d = op_def(op.kind)
    return d is not None and d.cheap is not None and d.cheap(op)


def _topological(members: list[list[Op]]) -> list[list[Op]]:
    """The groups ordered so each comes after those it reads; ties by first op in the graph."""
    where = {op.result.name: g for g, ops in enumerate(members) for op in ops}
    reads = [{where[v.name] for op in ops for v in op.operands if v.name in where} - {g}
             for g, ops in enumerate(members)]  # fmt: skip
    readers: list[list[int]] = [[] for _ in members]
    for g, rs in enumerate(reads):
        for h in rs:
            readers[h].append(g)
    waiting = [len(rs) for rs in reads]
    ready = [g for g, n in enumerate(waiting) if n == 0]
    heapq.heapify(ready)
    order: list[int] = []
    while ready:
        g = heapq.heappop(ready)
        order.append(g)
        for r in readers[g]:
            waiting[r] -= 1
            if waiting[r] == 0:
                heapq.heappush(ready, r)
    assert len(order) == len(members), "fusion made a cycle between groups"
    return [members[g] for g in order]


def _groups(graph: Graph, members: list[list[Op]]) -> list[Group]:
    where = {op.result.name: g for g, ops in enumerate(members) for op in ops}
    used_by: dict[str, set[int]] = {}
    for g, ops in enumerate(members):
        for op in ops:
            for v in op.operands:
                used_by.setdefault(v.name, set()).add(g)
    returned = {v.name for v in graph.outputs}
    groups = []
    for g, ops in enumerate(members):
        inputs = {v.name: v for op in ops for v in op.operands if where.get(v.name) != g}
        outputs = [
            op.result
            for op in ops
            if op.result.name in returned or used_by.get(op.result.name, set()) != {g}
        ]
        groups.append(Group(tuple(ops), tuple(inputs.values()), tuple(outputs)))
    return groups


def is_view(group: Group) -> bool:
    """Whether `group` is a lone view op (a reshape, `OpDef.view`): no kernel computes it,
    its result is its operand's storage under another shape (the memory plan aliases them)."""
    if len(group.ops) != 1:
        return False
    d = op_def(group.ops[0].kind)
    return d is not None and d.view


def compiled_graph(
    graph: Graph, target: Target | str = "cpu", winograd: Mapping[str, int] | None = None
) -> Graph:
    """The graph a model's kernels are partitioned from: simplified (constants evaluated,
    batch norm folded, exact rewrites), long attention as one op on the CPU
    (hexir.graph.attention), its constant weights laid out for `target`'s kernels
    (hexir.graph.layout; `winograd` chooses some convs' forms there)."""
    from hexir.graph.attention import fuse_attention
    from hexir.graph.layout import layout_weights
    from hexir.graph.rewrite import simplify_graph
    from hexir.runtime.target import Target

    target = Target.of(target)
    return layout_weights(fuse_attention(simplify_graph(graph), target), target, winograd)


def fused_kernels(
    graph: Graph, target: Target | str = "cpu", winograd: Mapping[str, int] | None = None
) -> tuple[Graph, list[tuple[Group, PrimFunc]]]:
    """What a model compiles to for `target`, as `hexir.compile` builds it, `hexir.tune` tunes
    it and `hexir show --kernels` lists it: `compiled_graph`, and each of its fusion groups
    but the views (`is_view`) with the PrimFunc it lowers to. Within `lowering_once`, made
    once for the same graph object, target, forms and knobs (the result is then shared: read
    it, do not change it)."""
    from hexir.graph.lower import lower
    from hexir.runtime.target import Target

    made = _MADE.get()
    key = (id(graph), Target.of(target), tuple(sorted((winograd or {}).items())), knobs.get())
    if made is not None and key in made:  # (its graph kept there: no other has its id)
        return made[key][1]
    compiled = compiled_graph(graph, target, winograd)
    groups = [group for group in partition(compiled) if not is_view(group)]
    result = compiled, [(group, lower(group.graph())) for group in groups]
    if made is not None:
        made[key] = (graph, result)  # the graph kept: its id stays its own
    return result


# What `fused_kernels` made within the `lowering_once` of this context (None outside one).
_MADE: ContextVar[dict[tuple, tuple[Graph, Any]] | None] = ContextVar("hexir_lowered", default=None)


@contextlib.contextmanager
def lowering_once() -> Iterator[None]:
    """A scope in which `fused_kernels` lowers a graph object once for each target, set of
    forms and knobs. A tune lowers its model's variants of conv forms at its start, to find
    their kernels and to weigh the forms, again at each look for a mix of forms and at its end
    (ResNet-18's two variants: 2.6 s each time, about half a minute of a tune)."""
    token = _MADE.set({})
    try:
        yield
    finally:
        _MADE.reset(token)
