"""Lowering graph ops to unscheduled hextir: `lower(graph)` makes one PrimFunc of a small graph.

    func = lower(graph)          # params: graph inputs, constants used, then the outputs
    func = lower_op(op)          # one op, as a one-op graph

Each op becomes what its definition's `lower` writes (`hexir.ops`): one block named after it
(`matmul`, `relu`, ...), or a few named `<op>_<stage>` (`softmax_max`, `softmax_exp`,
`softmax_sum`, `softmax_norm`); a repeated name gets `_1`, `_2`, ... Each block sits in its own
`serial` loop nest (see hexir.ops.compute).
The result of an op that is not a graph output is a global buffer named after the op,
allocated at the top of the body.

Names are canonical, so the same computation lowered from two models is the same func: the
params are `in0, in1, ...` and `out0, ...` unless `param_names` says otherwise, the func is
named after its ops, and the `source` attr holds the graph in hexir text with its inputs named
after the params and its op results `%0, %1, ...` (placement "cpu"): `hexir.reference`
evaluates that graph with numpy. Constants' data is not part of the func.
"""

from __future__ import annotations

from collections.abc import Sequence

from hexir.errors import HexirError
from hexir.ir.graph import Graph, Op, Value
from hexir.ir.op_attrs import NAME_RE
from hexir.ir.symbolic import SymbolicError
from hexir.ir.tir import Buffer, PrimFunc
from hexir.ops import OPS, make_op, op_def
from hexir.ops.base import Lower
from hexir.ops.compute import Kernel


def lower(
    graph: Graph, name: str | None = None, param_names: Sequence[str] | None = None
) -> PrimFunc:
    """One PrimFunc computing `graph`; `name` defaults to one made of its op kinds. A graph
    with symbolic dimensions lowers to a func of symbolic extents (compiled once for every
    size, see `PrimFunc`) where each op's lowering holds them; an op whose lowering needs a
    number where a symbol stands is a HexirError naming it."""
    canon, out_names = canonicalize(graph, name, param_names)
    k = Kernel(reserved=[v.name for v in canon.inputs] + list(out_names))
    buffers = {v.name: Buffer(v.name, v.type.shape, v.type.dtype) for v in canon.inputs}
    outputs = {
        v.name: Buffer(p, v.type.shape, v.type.dtype)
        for v, p in zip(canon.outputs, out_names, strict=True)
    }
    for op in canon.ops:
        out = outputs.get(op.result.name)
        if out is None:
            out = k.alloc(op.kind, op.result.type.shape, op.result.type.dtype)
        try:
            _lowering(op)(k, op, tuple(buffers[v.name] for v in op.operands), out)
        except SymbolicError as e:
            raise HexirError(f"{op.name} does not lower at symbolic sizes: {e}") from None
        buffers[op.result.name] = out
    params = tuple(buffers[v.name] for v in canon.inputs) + tuple(outputs.values())
    return PrimFunc(canon.name, params, k.body(), len(outputs), (("source", _source(canon)),))


def lower_op(op: Op, name: str | None = None, param_names: Sequence[str] | None = None) -> PrimFunc:
    """`op` lowered alone: its distinct operands are the inputs, its result the output."""
    if not lowered(op.kind):
        raise HexirError(f"cannot lower {op.name} alone: {op!r}")
    inputs = tuple({v.name: v for v in op.operands}.values())
    return lower(Graph(op.kind, inputs, (op,), (op.result,)), name, param_names)


def lowered(kind: str) -> bool:
    """Whether ops of `kind` lower to hextir (every op of docs/ops.md but `constant`)."""
    d = OPS.get(kind)
    return d is not None and d.lower is not None


def lowered_kinds() -> list[str]:
    """The kinds that lower, in the order of `hexir.ops.OPS`."""
    return [kind for kind in OPS if lowered(kind)]


def _lowering(op: Op) -> Lower:
    d = op_def(op.kind)
    assert d is not None and d.lower is not None, f"{op!r} has no lowering"
    return d.lower


def canonicalize(
    graph: Graph, name: str | None = None, param_names: Sequence[str] | None = None
) -> tuple[Graph, tuple[str, ...]]:
    """(`graph` in canonical form, the names of the output params).

    The canonical graph has no constants: its inputs are the graph's inputs then the constants
    in order of first use, named after the params; op results are `0, 1, ...`; placement is
    "cpu" (a kernel's computation does not depend on where the graph placed it).
    """
    inputs = list(graph.inputs) + _constants_used(graph)
    names = _param_names(len(inputs), len(graph.outputs), param_names)
    env = {v.name: Value(n, v.type) for v, n in zip(inputs, names[: len(inputs)], strict=True)}
    ops: list[Op] = []
    for op in graph.ops:
        if op.kind == "constant":
            continue
        if not lowered(op.kind):
            raise HexirError(f"no lowering for {op.name}: {op!r}")
        new = make_op(op.kind, [env[v.name] for v in op.operands], dict(op.attrs), str(len(ops)))
        env[op.result.name] = new.result
        ops.append(new)
    _check_outputs(graph)
    outputs = tuple(env[v.name] for v in graph.outputs)
    canon = Graph(
        name or _default_name(ops), tuple(env[v.name] for v in inputs), tuple(ops), outputs
    )
    return canon, names[len(inputs) :]


def _constants_used(graph: Graph) -> list[Value]:
    """The results of constant ops that some op or output uses, in order of first use."""
    constants = {op.result.name: op.result for op in graph.ops if op.kind == "constant"}
    used: dict[str, Value] = {}
    for v in [v for op in graph.ops for v in op.operands] + list(graph.outputs):
        if v.name in constants:
            used.setdefault(v.name, constants[v.name])
    return list(used.values())


def _param_names(num_inputs: int, num_outputs: int, given: Sequence[str] | None) -> tuple[str, ...]:
    if given is None:
        return tuple(f"in{i}" for i in range(num_inputs)) + tuple(
            f"out{i}" for i in range(num_outputs)
        )
    names = tuple(given)
    if len(names) != num_inputs + num_outputs or len(set(names)) != len(names):
        raise HexirError(
            f"param_names {names} must be {num_inputs + num_outputs} distinct names: "
            f"{num_inputs} inputs (constants included), then {num_outputs} outputs"
        )
    for n in names:
        if not NAME_RE.fullmatch(n):
            raise HexirError(f"bad param name {n!r}; names match {NAME_RE.pattern}")
    return names


def _check_outputs(graph: Graph) -> None:
    # An output that no op computes would need a copy kernel; fusion never makes one.
    computed = {op.result.name for op in graph.ops if op.kind != "constant"}
    names = [v.name for v in graph.outputs]
    for n in names:
        if n not in computed:
            raise HexirError(f"graph @{graph.name}: output %{n} is not computed by an op")
    if len(set(names)) != len(names):
        raise HexirError(f"graph @{graph.name} returns a value twice: {names}")


def _default_name(ops: list[Op]) -> str:
    kinds = [op.kind for op in ops]
    if len(kinds) == 1:
        return kinds[0]
    more = f"_and_{len(kinds) - 4}_more" if len(kinds) > 4 else ""
    return "fused_" + "_".join(kinds[:4]) + more


def _source(graph: Graph) -> str:
    from hexir.ir.graph_text import print_graph

    return print_graph(graph)
