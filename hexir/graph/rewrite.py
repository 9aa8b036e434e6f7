"""Compile-time evaluation and exact rewrites: `simplify_graph(graph)`.

    %0 = hexir.conv2d %x, %w ...              %w_1 = hexir.constant @w_1 (w scaled by bn)
    %1 = hexir.batch_norm %0, %s, %t, %m, %v   %b = hexir.constant @b
    %2 = hexir.mul %1, %ones                   %0_1 = hexir.conv2d %x, %w_1 ...
    %3 = hexir.relu %2                  ->     %1 = hexir.bias_add %0_1, %b {axis = 1}
                                               %3 = hexir.relu %1

Rounds of these passes run until the graph no longer changes:

- constant evaluation: an op whose operands are all constants becomes a constant, computed by
  the numpy semantics (`hexir.graph.fold.fold_constants`);
- batch-norm folding (`fold_batch_norms`): conv2d [-> bias_add] -> batch_norm over the
  channels becomes conv2d with scaled constant weights -> bias_add of a constant bias, when
  the weights and batch-norm parameters are constants and the conv2d (and bias_add) results
  have no other use; exact in real numbers, within rounding in floats;
- exact rewrites: x·1, 1·x, x/1, x+0, 0+x, x-0 become x when the constant is exactly that
  value everywhere and broadcasting changes neither shape nor dtype (x+0 may turn a -0.0
  into +0.0, which compares equal); a reshape of a reshape is one reshape; a transpose of a
  transpose is one transpose of the composed permutation; a reshape or transpose that changes
  nothing is dropped; a transpose that moves only axes of extent 1 is a reshape (so a view, no
  kernel: hexir.graph.fusion); a chain of broadcasts is one broadcast (this dialect has no
  broadcast op: a broadcast is an add of zeros or a mul by ones that makes the shape larger,
  and two in a row become one with a single constant); a reshape of a computed value that
  an elementwise op (or a bias_add) is the only use of moves below it, the op computing in
  the value's shape and its other operands viewed there (so an imported 3-D matmul, reshape
  -> matmul -> reshape, takes its bias, activation and residual add into its kernel); a
  transpose that an elementwise op (or a bias_add) is the only use of moves below it where
  the chain it starts is transposed back further down, where the two meet and go (the
  Winograd form's NHWC -> NCHW, a conv's epilogues, NCHW -> NHWC for the next conv);
- dead ops (and constants nobody uses) are removed (`remove_dead_ops`).

Graph inputs, graph outputs and the type of every value stay as they were: a rewrite that
would replace a graph output by another value is not made.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace

import numpy as np

from hexir import knobs
from hexir.errors import HexirError
from hexir.graph.evaluate import constant_array
from hexir.graph.fold import fold_constants
from hexir.ir.dtype import numpy_dtype
from hexir.ir.graph import ConstantData, Graph, Op, TensorType, Value
from hexir.ops import make_op, op_def
from hexir.ops.base import Pattern
from hexir.ops.movement import layout_permutation
from hexir.ops.nn import is_nhwc

__all__ = ["RewritePass", "fold_batch_norms", "remove_dead_ops", "simplify_graph"]

# Each round removes or shrinks something, so a fixed point comes within about as many rounds
# as the graph has ops; this bound only stops a bug from looping forever.
_MAX_ROUNDS = 1000


def simplify_graph(graph: Graph) -> Graph:
    """`graph` with every rewrite of this module applied until none applies."""
    for _ in range(_MAX_ROUNDS):
        simpler = _round(graph)
        if simpler == graph:
            return graph
        graph = simpler
    raise HexirError(
        f"simplify_graph did not reach a fixed point on @{graph.name} in {_MAX_ROUNDS} rounds; "
        "two rewrites undo each other: this is a bug in hexir.graph.rewrite"
    )


def _round(graph: Graph) -> Graph:
    graph = fold_constants(graph)
    graph = fold_batch_norms(graph)
    graph = _exact_rewrites(graph)
    return remove_dead_ops(graph)


def remove_dead_ops(graph: Graph) -> Graph:
    """`graph` without the ops no output depends on, nor the data of unused constants."""
    live = {v.name for v in graph.outputs}
    kept: list[Op] = []
    for op in reversed(graph.ops):
        if op.result.name in live:
            kept.append(op)
            live.update(v.name for v in op.operands)
    kept.reverse()
    referenced = {str(op.attr("name")) for op in kept if op.kind == "constant"}
    blobs = tuple((k, d) for k, d in graph.constants if k in referenced)
    return Graph(graph.name, graph.inputs, tuple(kept), graph.outputs, blobs)


# ---------------------------------------------------------------------------------------------
# The state of one pass over a graph


@dataclass
class RewritePass:
    """What rewrites of one op need: producers, constants' data, uses, fresh names."""

    graph: Graph
    producer: dict[str, Op] = field(default_factory=dict)
    data: dict[str, np.ndarray] = field(default_factory=dict)  # constant value -> its array
    uses: dict[str, int] = field(default_factory=dict)  # value -> uses (graph outputs count)
    taken: set[str] = field(default_factory=set)
    blobs: list[tuple[str, ConstantData]] = field(default_factory=list)
    emitted: list[Op] = field(default_factory=list)  # a pass's ops so far, in order
    consumers: dict[str, list[Op]] = field(default_factory=dict)  # value -> ops that read it

    def __post_init__(self) -> None:
        g = self.graph
        self.taken = {v.name for v in g.inputs} | {k for k, _ in g.constants}
        for op in g.ops:
            self.producer[op.result.name] = op
            self.taken.add(op.result.name)
            if op.kind == "constant":
                self.data[op.result.name] = constant_array(g, op)
            for v in op.operands:
                self.uses[v.name] = self.uses.get(v.name, 0) + 1
                self.consumers.setdefault(v.name, []).append(op)
        for v in g.outputs:
            self.uses[v.name] = self.uses.get(v.name, 0) + 1
        self.blobs = list(g.constants)

    def is_output(self, v: Value) -> bool:
        return any(o.name == v.name for o in self.graph.outputs)

    def sole_producer(self, v: Value) -> Op | None:
        """The op making `v`, where `v` has no other use (being a graph output is one)."""
        op = self.producer.get(v.name)
        return op if op is not None and self.uses.get(v.name) == 1 else None

    def fresh(self, base: str) -> str:
        name, n = base, 1
        while name in self.taken:
            name, n = f"{base}_{n}", n + 1
        self.taken.add(name)
        return name

    def constant(self, base: str, array: np.ndarray | ConstantData, placement: str) -> Op:
        """A new constant op holding `array` (its data as it is, where a ConstantData), its
        value and data named after `base`."""
        name = self.fresh(base)
        data = array if isinstance(array, ConstantData) else ConstantData(array)
        self.blobs.append((name, data))
        result = TensorType(data.array.shape, data.array.dtype.name)
        op = make_op("constant", [], {"name": name}, name, placement, result_type=result)
        self.data[name] = data.array
        return op

    def finish(self, ops: list[Op]) -> Graph:
        g = self.graph
        return Graph(g.name, g.inputs, tuple(ops), g.outputs, tuple(self.blobs))


# ---------------------------------------------------------------------------------------------
# Batch-norm folding


def fold_batch_norms(graph: Graph) -> Graph:
    """Every conv2d [-> bias_add] -> batch_norm with constant weights and parameters, and no
    other use of the intermediate results, as conv2d -> bias_add with constant weights."""
    p = RewritePass(graph)
    ops: list[Op] = []
    replaced: set[Op] = set()
    for op in graph.ops:
        chain = _conv_chain(op, p) if op.kind == "batch_norm" else None
        if chain is None:
            ops.append(op)
        else:
            ops.extend(_fold_batch_norm(op, *chain, p))
            replaced.update(o for o in chain if o is not None)
    # The folded conv2d keeps its name, so the one it replaces goes.
    return remove_dead_ops(p.finish([op for op in ops if op not in replaced]))


def _conv_chain(bn: Op, p: RewritePass) -> tuple[Op, Op | None] | None:
    """(conv2d, bias_add or None) computing the batch norm's input, when they fold into it."""
    x, *params = bn.operands
    if bn.attr("axis") != 1 or len(x.type.shape) != 4 or any(v.name not in p.data for v in params):
        return None
    op, bias = p.producer.get(x.name), None
    if op is not None and op.kind == "bias_add" and op.attr("axis") == 1:
        if p.uses[x.name] != 1 or op.operands[1].name not in p.data:
            return None
        bias, x = op, op.operands[0]
        op = p.producer.get(x.name)
    if op is None or op.kind != "conv2d" or p.uses[x.name] != 1 or is_nhwc(op):
        return None  # (an NHWC conv's channels are axis 3)
    return (op, bias) if op.operands[1].name in p.data else None


def _fold_batch_norm(bn: Op, conv: Op, bias: Op | None, p: RewritePass) -> list[Op]:
    scale, shift, mean, var = (p.data[v.name].astype(np.float64) for v in bn.operands[1:])
    inv = scale / np.sqrt(var + _number(bn, "epsilon"))
    dtype = numpy_dtype(bn.result.type.dtype)
    x, w = conv.operands
    weight = p.data[w.name].astype(np.float64) * inv[:, None, None, None]
    before = 0.0 if bias is None else p.data[bias.operands[1].name].astype(np.float64)
    shift = (before - mean) * inv + shift
    new_w = p.constant(f"{w.name}_bn", weight.astype(dtype), conv.placement)
    new_b = p.constant(f"{bn.result.name}_bias", shift.astype(dtype), bn.placement)
    new_conv = make_op("conv2d", [x, new_w.result], dict(conv.attrs), conv.result.name,
                       conv.placement)  # fmt: skip
    add = make_op("bias_add", [new_conv.result, new_b.result], {"axis": 1}, bn.result.name,
                  bn.placement)  # fmt: skip
    return [new_w, new_b, new_conv, add]


# ---------------------------------------------------------------------------------------------
# Exact rewrites

# A rewrite of one op (its operands already renamed): None when it does not apply, a Value
# that replaces the op's result everywhere, or ops whose last computes the op's result.
Rewrite = Callable[[Op, RewritePass], "Value | list[Op] | None"]


def _exact_rewrites(graph: Graph) -> Graph:
    p = RewritePass(graph)
    renamed: dict[str, Value] = {}
    ops = p.emitted
    for op in graph.ops:
        if any(v.name in renamed for v in op.operands):
            op = replace(op, operands=tuple(renamed.get(v.name, v) for v in op.operands))
        for rewrite in _REWRITES:
            result = rewrite(op, p)
            if result is not None:
                break
        if isinstance(result, Value):
            renamed[op.result.name] = result
        else:
            new = result or [op]
            ops.extend(new)
            p.producer.update((o.result.name, o) for o in new)
    return p.finish(ops)


def _keep(op: Op, x: Value, p: RewritePass) -> Value | None:
    """`x` in place of the result of `op`, when that keeps the graph's outputs and types."""
    if x.type != op.result.type or p.is_output(op.result):
        return None
    return x


def _filled(v: Value, value: float, p: RewritePass) -> bool:
    array = p.data.get(v.name)
    return array is not None and array.size > 0 and bool(np.all(array == value))


def _identity(op: Op, p: RewritePass) -> Value | None:
    """x·1, 1·x, x/1, x+0, 0+x, x-0 -> x."""
    match op.kind, op.operands:
        case ("mul", (a, b)) | ("add", (a, b)):
            unit = 1.0 if op.kind == "mul" else 0.0
            if _filled(b, unit, p):
                return _keep(op, a, p)
            if _filled(a, unit, p):
                return _keep(op, b, p)
        case ("div", (a, b)) | ("sub", (a, b)):
            if _filled(b, 1.0 if op.kind == "div" else 0.0, p):
                return _keep(op, a, p)
    return None


def _reshape(op: Op, p: RewritePass) -> Value | list[Op] | None:
    """reshape(reshape(x)) -> reshape(x); a reshape to x's own shape -> x."""
    if op.kind != "reshape":
        return None
    x = op.operands[0]
    inner = p.producer.get(x.name)
    if inner is not None and inner.kind == "reshape":
        x = inner.operands[0]
    if x.type == op.result.type and not p.is_output(op.result):
        return x
    if x == op.operands[0]:
        return None
    return [make_op("reshape", [x], dict(op.attrs), op.result.name, op.placement)]


def _transpose(op: Op, p: RewritePass) -> Value | list[Op] | None:
    """transpose(transpose(x, p1), p2) -> transpose(x, p1∘p2); an identity transpose -> x (a
    reshape, where it is a graph output); a transpose that moves only axes of extent 1 -> a
    reshape (the same row-major order). A layout_transform between unblocked layouts is the
    transpose it moves by (`layout_permutation`); two of them in a row make one from the
    first's layout to the second's."""
    perm = layout_permutation(op)
    if perm is None:
        return None
    x, kind, attrs = op.operands[0], op.kind, dict(op.attrs)
    inner = p.producer.get(x.name)
    first = None if inner is None else layout_permutation(inner)
    if first is not None:
        x, perm = inner.operands[0], tuple(first[i] for i in perm)  # type: ignore[union-attr]
        if kind == inner.kind == "layout_transform" and inner.attr("dst") == op.attr("src"):
            attrs["src"] = inner.attr("src")  # type: ignore[union-attr]
        else:
            kind, attrs = "transpose", {"perm": perm}
    if perm == tuple(range(len(perm))) and not p.is_output(op.result):
        return x
    if (made := _made_transpose(x, perm, p)) is not None and not p.is_output(op.result):
        return made  # the same transpose again (a 1x1 conv and the residual both in NHWC)
    moved = [a for a in perm if x.type.shape[a] != 1]
    if moved == sorted(moved):  # (an identity that is a graph output too: a view of x)
        shape = {"shape": op.result.type.shape}
        return [make_op("reshape", [x], shape, op.result.name, op.placement)]
    if x == op.operands[0]:
        return None
    return [make_op(kind, [x], attrs, op.result.name, op.placement)]


def _slice_before_transpose(op: Op, p: RewritePass) -> list[Op] | None:
    """slice(transpose(x, perm)) -> transpose(slice(x), perm) where the transpose has no other
    use: the transpose moves less, and meets a transpose back above it (a strided 1x1 conv's
    every other pixel, picked from a ResNet stage's NHWC activations)."""
    if op.kind != "slice":
        return None
    t = p.producer.get(op.operands[0].name)
    perm = None if t is None else layout_permutation(t)
    if perm is None or p.uses.get(t.result.name) != 1:  # type: ignore[union-attr]
        return None
    bounds = {}
    for key in ("start", "stop", "step"):
        along = _ints(op, key)
        moved = [0] * len(perm)
        for axis, a in enumerate(perm):
            moved[a] = along[axis]
        bounds[key] = tuple(moved)
    picked = make_op("slice", [t.operands[0]], bounds, p.fresh(f"{op.result.name}_t"),
                     op.placement)  # fmt: skip
    out = make_op(t.kind, [picked.result], dict(t.attrs), op.result.name, op.placement)  # type: ignore[union-attr]
    return [picked, out]


def _broadcasts(op: Op, p: RewritePass) -> list[Op] | None:
    """(x + z1) + z2 -> x + (z1 + z2) and (x·1)·1 -> x·1 for constants z1, z2 of zeros and
    ones: exact, since adding zeros only broadcasts (and sums the signs of zero the same way)."""
    if op.kind not in ("add", "mul"):
        return None
    outer = _split_broadcast(op, p)
    inner = None if outer is None else p.producer.get(outer[0].name)
    inner_split = None if inner is None or inner.kind != op.kind else _split_broadcast(inner, p)
    if outer is None or inner_split is None:
        return None
    (x, c1), c2 = inner_split, outer[1]
    fn = np.add if op.kind == "add" else np.multiply
    combined = fn(p.data[c1.name], p.data[c2.name])
    const = p.constant(f"{op.result.name}_c", combined, op.placement)
    return [const, make_op(op.kind, [x, const.result], {}, op.result.name, op.placement)]


def _split_broadcast(op: Op, p: RewritePass) -> tuple[Value, Value] | None:
    """(x, c) when `op` is x + c or c + x with c all zeros (x·c, c·x with c all ones)."""
    unit = 0.0 if op.kind == "add" else 1.0
    a, b = op.operands
    if _filled(b, unit, p):
        return a, b
    if _filled(a, unit, p):
        return b, a
    return None


def _number(op: Op, key: str) -> float:
    value = op.attr(key)
    assert isinstance(value, int | float), f"{op!r}: attribute {key} is not normalized"
    return float(value)


def _ints(op: Op, key: str) -> tuple[int, ...]:
    value = op.attr(key)
    assert isinstance(value, tuple), f"{op!r}: attribute {key} is not normalized"
    return tuple(int(v) for v in value)


def _sinks_through(kind: str) -> bool:
    """Whether a reshape or a transpose of an operand can move below an op of `kind`: an
    elementwise op, or a bias_add (its axis moved)."""
    d = op_def(kind)
    return d is not None and (d.fusion is Pattern.ELEMENTWISE or kind == "bias_add")


def _only_uses(op: Op, kind: Callable[[Op], bool], p: RewritePass) -> dict[int, Op]:
    """`op`'s operands of its result's shape (not broadcast up) that an op `kind` holds for
    computes and that `op` is the only use of: their positions -> those ops."""
    found = {}
    for i, v in enumerate(op.operands):
        q = p.producer.get(v.name)
        if q is not None and kind(q) and p.uses.get(v.name) == 1:
            if v.type.shape == op.result.type.shape:
                found[i] = q
    return found


def _sink_reshape(op: Op, p: RewritePass) -> list[Op] | None:
    """f(reshape(x), y, ...) -> reshape(f(x, reshape(y), ...)) for an elementwise f (and a
    bias_add, its axis moved to the same axis of x's shape) whose reshaped operand has no
    other use, every other operand of f's shape: a matmul of a 3-D activation (imported as
    reshape -> matmul -> reshape) then takes its bias and activation into its kernel, which
    a reshape (a group of its own) would stop. An operand of one element (relu6's 6) goes
    along, with no more axes than x. Exact: the same values, in row-major order."""
    if not _sinks_through(op.kind):
        return None
    shape, attrs = op.result.type.shape, dict(op.attrs)
    # The operands that are reshapes of one shape, used only here: the source shape.
    sunk = {i: r.operands[0] for i, r in _only_uses(op, lambda q: q.kind == "reshape", p).items()}
    sources = {x.type.shape for x in sunk.values()}
    # Toward the shape something computes in (not a graph input viewed, which would undo
    # this rewrite's own views of the other operands), and toward fewer axes: two chains
    # that meet (a residual add of a 2-D matmul's result and a 4-D conv's) would otherwise
    # pull the ops between them back and forth.
    computed = any(
        (q := p.producer.get(x.name)) is not None and q.kind not in ("reshape", "constant")
        for x in sunk.values()
    )
    if len(sources) != 1 or not computed:
        return None
    (source,) = sources
    # Toward more axes only where f reads no other computed value (a Winograd form's bias and
    # relu, on the 6-D tiles its output transform writes): no second chain to meet.
    alone = all(i in sunk or v.name in p.data for i, v in enumerate(op.operands))
    if len(source) >= len(shape) and not alone:
        return None
    ops: list[Op] = []
    if op.kind == "bias_add":
        axis = _same_axis(shape, source, int(attrs["axis"]))  # type: ignore[arg-type]
        if 0 not in sunk or axis is None:
            return None
        attrs["axis"] = axis
        operands = [sunk[0], op.operands[1]]
    else:
        operands = []
        for i, v in enumerate(op.operands):
            if i in sunk:
                operands.append(sunk[i])
            elif v.type.shape == shape or v.type.size == 1:  # viewed in the source's shape
                view = source if v.type.size > 1 else (1,) * min(len(source), len(v.type.shape))
                if v.type.shape == view:
                    operands.append(v)  # one element of no more axes than the source: as is
                    continue
                name = p.fresh(f"{v.name}_flat")
                ops.append(make_op("reshape", [v], {"shape": view}, name, op.placement))
                operands.append(ops[-1].result)
            else:
                return None
    inner = make_op(op.kind, operands, attrs, p.fresh(f"{op.result.name}_flat"), op.placement)
    back = make_op("reshape", [inner.result], {"shape": shape}, op.result.name, op.placement)
    return [*ops, inner, back]


def _sink_transpose(op: Op, p: RewritePass) -> list[Op] | None:
    """f(transpose(x, perm), transpose(y, perm), c) -> transpose(f(x, y, c'), perm) for an
    elementwise f (and a bias_add, its axis moved to x's) whose transposed operands share one
    permutation and have no other use, where f's result (or an elementwise chain's from it) is
    transposed back by a consumer (`_meets`); any other operand is a constant of f's rank, c'
    its transpose back (folded here), a value an earlier op transposes back already (c' that
    op's result), or holds one element. So a transpose meets the one its
    consumer makes back (the Winograd form's NHWC -> NCHW, then NCHW -> NHWC for the next
    conv) and both go (`_transpose`); the ops between compute in the layout they came in,
    a vectorized pass where the transposing copy that fused them was a scalar one. Exact: the
    same operations on the same values."""
    if not _sinks_through(op.kind):
        return None
    shape, attrs = op.result.type.shape, dict(op.attrs)
    transposes = _only_uses(op, _sinkable_transpose, p)
    sunk = {i: t.operands[0] for i, t in transposes.items()}
    made = {(t.kind, t.attrs) for t in transposes.values()}
    if len(made) != 1:
        return None
    ((kind, made_attrs),) = made
    perm = layout_permutation(next(iter(transposes.values())))
    assert perm is not None
    back = tuple(perm.index(a) for a in range(len(perm)))  # x's axis a is the result's back[a]
    if not _meets(op.result.name, back, p):
        return None  # it would only part the transposing copy from the epilogue it fuses
    ops: list[Op] = []
    operands = []
    for i, v in enumerate(op.operands):
        if i in sunk:
            operands.append(sunk[i])
        elif op.kind == "bias_add" or v.type.size == 1:
            operands.append(v)  # a bias along one axis, or one element: any layout
        elif v.name in p.data and len(v.type.shape) == len(shape):
            name = p.fresh(f"{v.name}_t")
            ops.append(make_op("transpose", [v], {"perm": back}, name, op.placement))
            operands.append(ops[-1].result)
        elif (made := _made_transpose(v, back, p)) is not None:
            operands.append(made)
        else:
            return None
    if op.kind == "bias_add":
        if 0 not in sunk:
            return None
        attrs["axis"] = perm[int(attrs["axis"])]  # type: ignore[arg-type]
    inner = make_op(op.kind, operands, attrs, p.fresh(f"{op.result.name}_t"), op.placement)
    out = make_op(kind, [inner.result], dict(made_attrs), op.result.name, op.placement)
    return [*ops, inner, out]


def _sinkable_transpose(op: Op) -> bool:
    """A transpose, or a layout_transform between unblocked layouts unless the `layout` knob
    keeps every activation in the layout it has (then each stays beside the op it serves)."""
    if op.kind == "layout_transform" and knobs.get().layout == "nchw":
        return False
    return layout_permutation(op) is not None


def _meets(name: str, back: tuple[int, ...], p: RewritePass, depth: int = 8) -> bool:
    """Whether value `name` is transposed by `back` (its own transpose's inverse), by a
    consumer or through a chain of elementwise consumers (and bias_adds) of up to `depth`."""
    for c in p.consumers.get(name, ()):
        if layout_permutation(c) == back:
            return True
        if _sinks_through(c.kind) and depth > 0 and _meets(c.result.name, back, p, depth - 1):
            return True
    return False


def _made_transpose(v: Value, perm: tuple[int, ...], p: RewritePass) -> Value | None:
    """transpose(v, perm) where an op before this one makes it already (for another
    consumer: the residual of a ResNet block, which the next conv reads in NHWC), else None:
    an operand in the other layout costs no new transpose, so sinking past it is free."""
    for o in p.emitted:
        if o.operands and o.operands[0].name == v.name and layout_permutation(o) == perm:
            return o.result
    return None


def _same_axis(shape: tuple[int, ...], source: tuple[int, ...], axis: int) -> int | None:
    """The axis of `source` that row-major order lays out as `axis` of `shape` (the same
    extent, the same number of elements before it), or None."""
    before = math.prod(shape[:axis])
    for a, extent in enumerate(source):
        if extent == shape[axis] and math.prod(source[:a]) == before:
            return a
    return None


def _transposed_operand(op: Op, p: RewritePass) -> list[Op] | None:
    """batch_matmul(a, transpose(x, (0, 2, 1))) -> batch_matmul(a, x, transpose_b), the
    transpose read in place (its kernel was a strided copy of x; a decode step's keys are
    its whole cache). Also through the view an imported N-D matmul takes (x of [.., N, K],
    transposed by its last two axes and viewed as [B, K, N], becomes x viewed as [B, N, K])
    and through elementwise ops of x by scalars on the way (an exported attention scales
    its keys after transposing them), which then compute on x as it is laid out. Only where
    each of those values has no other use."""
    if op.kind != "batch_matmul" or op.attrs:
        return None
    a, b = op.operands
    chain, made = [], p.sole_producer(b)
    while made is not None and _by_scalars(made):
        chain.append(made)
        made = p.sole_producer(made.operands[0])
    moved = made if made is None or made.kind != "reshape" else p.sole_producer(made.operands[0])
    perm = None if moved is None else layout_permutation(moved)
    rank = 0 if perm is None else len(perm)
    if moved is None or perm != (*range(rank - 2), rank - 1, rank - 2):
        return None
    x, ops = moved.operands[0], []
    batch, k, n = b.type.shape
    if moved is not made:  # [.., K, N] viewed as [B, K, N]: its leading axes merged
        if moved.result.type.shape[-2:] != (k, n):
            return None
        name = p.fresh(f"{x.name}_rows")
        ops.append(make_op("reshape", [x], {"shape": (batch, n, k)}, name, op.placement))
        x = ops[-1].result
    for step in reversed(chain):  # the scalings, on x as it is laid out
        operands, name = [x, *step.operands[1:]], p.fresh(step.result.name)
        ops.append(make_op(step.kind, operands, dict(step.attrs), name, step.placement))
        x = ops[-1].result
    attrs = {"transpose_b": True}
    return [*ops, make_op("batch_matmul", [a, x], attrs, op.result.name, op.placement)]


def _by_scalars(op: Op) -> bool:
    """An elementwise op of its first operand and scalars (one element each)."""
    d = op_def(op.kind)
    return (
        d is not None
        and d.fusion is Pattern.ELEMENTWISE
        and bool(op.operands)
        and op.operands[0].type.shape == op.result.type.shape
        and all(v.type.size == 1 for v in op.operands[1:])
    )


_REWRITES: tuple[Rewrite, ...] = (
    _identity,
    _reshape,
    _transpose,
    _slice_before_transpose,
    _broadcasts,
    _sink_reshape,
    _sink_transpose,
    _transposed_operand,
)
