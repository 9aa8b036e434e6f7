"""Data movement: transpose, layout_transform, reshape, concat, slice, pad, and constant (the
graph's data). Moves at indices known only at run time are in `hexir.ops.indexing`.

Each moving op lowers to one spatial block whose every output element is one element of an
operand (or pad's fill); its fusion role is injective, and `cheap` says when computing it
inside its consumer's kernel costs no more than reading it (the consumer still reads the
operand row by row). A constant has no kernel and no numpy function: its value is the data
the graph keeps for it.

Slice attributes are taken in their normal form (Python's `slice(start, stop, step).indices`):
with a negative step, a stop of -1 means "through index 0", not "the last element", so
`make_op` cannot also read negative indices Python's way. `None` entries, a missing step and
trailing axes left out mean the full range. `slice_indices` (and `GraphBuilder.slice`) take
Python-style indices and give the normal form.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence

import numpy as np

from hexir.errors import TypeInferenceError
from hexir.ir.graph import Op, TensorType, Value
from hexir.ir.op_attrs import NAME_RE, Check, dims, fail, normalize_axis
from hexir.ir.symbolic import Dim, Sym, SymbolicError, format_dim, quotient
from hexir.ir.tir import Binary, Buffer, Expr, IntImm, Select, as_expr, const
from hexir.ops.base import (
    Exporter,
    OpDef,
    Pattern,
    always_cheap,
    at_least,
    no_flops,
    operand_names,
    symbolic_only,
    unpositional,
)
from hexir.ops.compute import (
    Kernel,
    add,
    affine,
    attr_float,
    attr_int,
    attr_ints,
    clamp,
    floordiv,
    guarded_value,
)
from hexir.ops.numeric import Attrs, get_int, get_ints

Indices = tuple[Expr, ...]


# --- constant ---------------------------------------------------------------------------------


def _constant_infer(c: Check) -> TensorType:
    c.string("name", NAME_RE)
    if c.declared is None:
        fail("needs its result type (the shape and dtype of its data)")
    return c.declared


def _constant_export(ex: Exporter, op: Op) -> None:
    data = ex.graph.constant(str(op.attr("name"))).reshape(op.result.type.shape)
    ex.const(data, op.result.name, name=op.result.name)


CONSTANT = OpDef(
    "constant",
    "the graph's data named `name`",
    (),
    ("name",),
    infer=_constant_infer,
    fusion=Pattern.OPAQUE,
    evaluate=None,
    lower=None,
    export=_constant_export,
    flops=no_flops,
)


# --- transpose --------------------------------------------------------------------------------


def _transpose_infer(c: Check) -> TensorType:
    (x,) = c.types
    ndim = len(x.shape)
    given = c.ints("perm", tuple(reversed(range(ndim))))
    if len(given) != ndim:
        fail(f"attribute 'perm' {given} has {len(given)} entries for rank {ndim}")
    perm = tuple(normalize_axis(p, ndim, "perm entry") for p in given)
    if sorted(perm) != list(range(ndim)):
        fail(f"attribute 'perm' {given} is not a permutation of 0..{ndim - 1}")
    c.out["perm"] = perm
    return TensorType(tuple(x.shape[p] for p in perm), x.dtype)


def _transpose_lower(k: Kernel, op: Op, args: tuple[Buffer, ...], out: Buffer) -> None:
    (x,) = args
    perm = attr_ints(op, "perm")

    def load(i: Indices) -> Expr:
        index: list[Expr] = [IntImm(0)] * len(perm)
        for d, p in enumerate(perm):
            index[p] = i[d]  # out.shape[d] == x.shape[perm[d]]
        return x[tuple(index)]

    k.compute("transpose", out, load)


def _transpose_positions(op: Op, axes: tuple[int | None, ...]) -> int | None:
    (a,) = axes
    return None if a is None else attr_ints(op, "perm").index(a)


TRANSPOSE = OpDef(
    "transpose",
    "x with its axes permuted: out.shape[d] = x.shape[perm[d]]",
    ("x",),
    ("perm",),
    infer=_transpose_infer,
    fusion=Pattern.INJECTIVE,
    evaluate=lambda xs, attrs: np.transpose(xs[0], get_ints(attrs, "perm")),
    lower=_transpose_lower,
    export=lambda ex, op: ex.node(
        "Transpose", operand_names(op), op.result.name, perm=list(attr_ints(op, "perm"))
    ),
    cheap=always_cheap,
    positions=_transpose_positions,
)


# --- layout_transform -------------------------------------------------------------------------

LAYOUT_RE = re.compile(r"(?:[A-Z]|[1-9][0-9]*[a-z])+")
_TOKEN_RE = re.compile(r"[A-Z]|[1-9][0-9]*[a-z]")


class Layout:
    """A layout string: one capital per axis in memory order, and `<b><letter>` for a block
    of b of that axis's capital, innermost where it stands ("NCHW16c": C in blocks of 16, the
    block after W). `axes` are the tokens, each (capital, block or 0)."""

    def __init__(self, text: str):
        if not LAYOUT_RE.fullmatch(text):
            fail(f"layout {text!r} is not capitals with optional blocks like NCHW16c")
        self.text = text
        self.axes: tuple[tuple[str, int], ...] = tuple(
            (t, 0) if t.isupper() else (t[-1].upper(), int(t[:-1])) for t in _TOKEN_RE.findall(text)
        )
        self.letters = tuple(a for a, b in self.axes if not b)
        self.blocks = {a: b for a, b in self.axes if b}
        if len(set(self.letters)) != len(self.letters):
            fail(f"layout {text!r} names an axis twice")
        if len(self.blocks) != len(self.axes) - len(self.letters) or not set(self.blocks) <= set(
            self.letters
        ):
            fail(f"layout {text!r}: each block needs its axis, once")

    def primal(self, letter: str) -> int:
        return self.axes.index((letter, 0))

    def inner(self, letter: str) -> int | None:
        b = self.blocks.get(letter)
        return None if b is None else self.axes.index((letter, b))

    def grouped(self) -> list[int]:
        """The axes in the order of the capitals, each capital's block after it: the
        transpose after which merging each pair gives the unblocked array."""
        return [d for a in self.letters for d in (self.primal(a), self.inner(a)) if d is not None]

    def permutation(self, dst: Layout) -> tuple[int, ...] | None:
        """The transpose this layout -> `dst` is where neither has blocks, else None."""
        if self.blocks or dst.blocks:
            return None
        return tuple(self.letters.index(a) for a in dst.letters)


def _layouts(attrs: Attrs) -> tuple[Layout, Layout]:
    return Layout(str(attrs["src"])), Layout(str(attrs["dst"]))


def layout_permutation(op: Op) -> tuple[int, ...] | None:
    """The permutation an op moves its operand's axes by, where it is one: a transpose's
    `perm`, an unblocked layout_transform's; None for any other op."""
    if op.kind == "transpose":
        return attr_ints(op, "perm")
    if op.kind == "layout_transform":
        src, dst = _layouts(dict(op.attrs))
        return src.permutation(dst)
    return None


def _extents(src: Layout, shape: tuple[int, ...]) -> dict[str, int]:
    """Each axis's whole extent, from an array in layout `src` of `shape`."""
    return {a: shape[src.primal(a)] * src.blocks.get(a, 1) for a in src.letters}


def _layout_transform_infer(c: Check) -> TensorType:
    (x,) = c.types
    src, dst = Layout(c.string("src", LAYOUT_RE)), Layout(c.string("dst", LAYOUT_RE))
    if len(src.axes) != len(x.shape):
        fail(f"layout {src.text!r} has {len(src.axes)} axes for rank {len(x.shape)}")
    if sorted(src.letters) != sorted(dst.letters):
        fail(f"layouts {src.text!r} and {dst.text!r} name different axes")
    whole = _extents(src, x.shape)
    shape = []
    for a, b in dst.axes:
        if b == 0 and whole[a] % dst.blocks.get(a, 1):
            fail(f"axis {a} of extent {whole[a]} does not split into blocks of {dst.blocks[a]}")
        shape.append(b or whole[a] // dst.blocks.get(a, 1))
    return TensorType(tuple(shape), x.dtype)


def _split(letters: tuple[str, ...], whole: dict[str, int], dst: Layout):
    """How an array of axes `letters` (blocks merged, extents `whole`) reaches layout `dst`:
    the shape that splits each blocked axis into its outer extent and block, and the
    transpose of that shape into dst's order."""
    split, where = [], {}
    for a in letters:
        b = dst.blocks.get(a)
        where[(a, 0)] = len(split)
        split.append(whole[a] // b if b else whole[a])
        if b:
            where[(a, b)] = len(split)
            split.append(b)
    return tuple(split), [where[t] for t in dst.axes]


def _layout_transform_evaluate(xs: list[np.ndarray], attrs: Attrs) -> np.ndarray:
    src, dst = _layouts(attrs)
    whole = _extents(src, xs[0].shape)
    unblocked = np.transpose(xs[0], src.grouped()).reshape([whole[a] for a in src.letters])
    shape, perm = _split(src.letters, whole, dst)
    return np.transpose(unblocked.reshape(shape), perm)


def _layout_transform_lower(k: Kernel, op: Op, args: tuple[Buffer, ...], out: Buffer) -> None:
    (x,) = args
    src, dst = _layouts(dict(op.attrs))

    def load(i: Indices) -> Expr:
        whole: dict[str, Expr] = {}
        for a in dst.letters:
            b, inner = dst.blocks.get(a, 1), dst.inner(a)
            whole[a] = (
                i[dst.primal(a)]
                if inner is None
                else affine([(i[dst.primal(a)], b), (i[inner], 1)])
            )
        index: list[Expr] = []
        for a, b in src.axes:
            if a not in src.blocks:
                index.append(whole[a])
            elif b == 0:
                index.append(floordiv(whole[a], src.blocks[a]))
            else:
                index.append(Binary("floormod", whole[a], IntImm(b)))
        return x[tuple(index)]

    # An unblocked transform is a transpose: the same kernel (and workload) as one.
    plain = src.permutation(dst) is not None
    k.compute("transpose" if plain else "layout_transform", out, load)


def _layout_transform_export(ex: Exporter, op: Op) -> None:
    """As ONNX's Transpose and Reshape: src's axes in order, merged; split, in dst's order."""
    src, dst = _layouts(dict(op.attrs))
    x, out = op.operands[0], op.result.name
    perm = src.permutation(dst)
    if perm is not None:
        ex.node("Transpose", [x.name], out, perm=list(perm))
        return
    whole = _extents(src, x.type.shape)
    merged = ex.node("Transpose", [x.name], perm=src.grouped())
    logical = tuple(whole[a] for a in src.letters)
    merged = ex.node("Reshape", [merged, ex.ints(logical, f"{out}.whole")])
    shape, perm = _split(src.letters, whole, dst)
    parts = ex.node("Reshape", [merged, ex.ints(shape, f"{out}.split")])
    ex.node("Transpose", [parts], out, perm=perm)


LAYOUT_TRANSFORM = OpDef(
    "layout_transform",
    "x, laid out as layout `src` (capitals are axes, `16c` a block of 16 of C), in layout `dst`",
    ("x",),
    ("src", "dst"),
    infer=_layout_transform_infer,
    fusion=Pattern.INJECTIVE,
    evaluate=_layout_transform_evaluate,
    lower=_layout_transform_lower,
    export=_layout_transform_export,
    cheap=always_cheap,
)


# --- reshape ----------------------------------------------------------------------------------


def _reshape_infer(c: Check) -> TensorType:
    (x,) = c.types
    shape = c.extents("shape")
    if sum(s == -1 for s in shape) > 1 or any(isinstance(s, int) and s < -1 for s in shape):
        fail(f"attribute 'shape' {shape} may hold one -1 and otherwise extents >= 0")
    if x.symbolic or any(isinstance(s, Sym) for s in shape):
        return _symbolic_reshape(c, x, shape)
    known = math.prod(s for s in shape if s != -1)
    if -1 in shape:
        if known == 0 or x.size % known:
            fail(f"cannot resolve the -1 in {shape} for {dims(x)} ({x.size} elements)")
        shape = tuple(x.size // known if s == -1 else s for s in shape)
    if math.prod(shape) != x.size:
        fail(f"cannot reshape {dims(x)} ({x.size} elements) to {shape}")
    c.out["shape"] = shape
    return TensorType(shape, x.dtype)


def _symbolic_reshape(c: Check, x: TensorType, shape: tuple[Dim, ...]) -> TensorType:
    """A reshape where symbols stand: the -1 is the quotient of the element counts (a number
    or one symbolic factor of x's), else the counts must be equal for every size. The normal
    form keeps a lone symbolic extent as the -1 it resolves to, and several as the
    dimensions they are (specialization makes them numbers)."""
    shown = "(" + ", ".join(map(format_dim, shape)) + ")"
    try:
        if -1 in shape:
            rest = quotient(x.shape, tuple(s for s in shape if s != -1))
            shape = tuple(rest if s == -1 else s for s in shape)
        elif quotient(x.shape, shape) != 1:
            raise SymbolicError("the element counts differ")
    except SymbolicError as e:
        fail(f"cannot reshape {dims(x)} to {shown}: {e}")
    symbolic = [s for s in shape if isinstance(s, Sym)]
    c.out["shape"] = tuple(-1 if len(symbolic) == 1 and isinstance(s, Sym) else s for s in shape)
    return TensorType(shape, x.dtype)


def _reshape_lower(k: Kernel, op: Op, args: tuple[Buffer, ...], out: Buffer) -> None:
    (x,) = args

    def load(i: Indices) -> Expr:
        index: list[Expr] = []
        for outs, ins in _reshape_groups(out.shape, x.shape):
            strides = [math.prod(out.shape[d + 1 : outs[-1] + 1]) for d in outs]
            flat = affine(
                (i[d], st) for d, st in zip(outs, strides, strict=True) if out.shape[d] != 1
            )
            index.extend(unflatten(k, flat, [x.shape[d] for d in ins]))
        return x[tuple(index)]

    k.compute("reshape", out, load)


def _reshape_groups(out_shape: tuple[int, ...], in_shape: tuple[int, ...]):
    """Pairs (output axes, input axes) of the smallest runs with equal element counts, so that
    a reshape that merges or splits some axes indexes the others directly."""
    groups, o, i = [], 0, 0
    while o < len(out_shape) or i < len(in_shape):
        outs, ins = [o], [i]
        po = out_shape[o] if o < len(out_shape) else 1
        pi = in_shape[i] if i < len(in_shape) else 1
        while po != pi:
            if po < pi:
                o += 1
                outs.append(o)
                po *= out_shape[o]
            else:
                i += 1
                ins.append(i)
                pi *= in_shape[i]
        o, i = o + 1, i + 1
        groups.append(
            ([d for d in outs if d < len(out_shape)], [d for d in ins if d < len(in_shape)])
        )
    return groups


def unflatten(k: Kernel, flat: Expr, shape: list[int]) -> list[Expr]:
    """The index into an array of `shape` of its element at row-major position `flat` (a
    floormod only where the bounds of the quotient can pass the extent)."""
    index: list[Expr] = []
    for d, extent in enumerate(shape):
        if extent == 1:
            index.append(IntImm(0))
            continue
        part = floordiv(flat, math.prod(shape[d + 1 :]))
        hi = (k.bound(part) or (0, extent))[1]
        index.append(part if hi < extent else Binary("floormod", part, IntImm(extent)))
    return index


def _reshape_export(ex: Exporter, op: Op) -> None:
    symbolic_only(ex, op, "shape")
    out, shape = op.result.name, attr_ints(op, "shape")
    # allowzero: an extent of 0 is an extent, not "copy the input's"
    extra = {"allowzero": 1} if 0 in shape else {}
    ex.node("Reshape", [op.operands[0].name, ex.ints(shape, f"{out}.shape")], out, **extra)


def _reshape_positions(op: Op, axes: tuple[int | None, ...]) -> int | None:
    """The positions' axis kept whole, with as many elements before it as in the operand."""
    (a,) = axes
    if a is None:
        return None
    shape, out = op.operands[0].type.shape, op.result.type.shape
    try:
        outer = math.prod(shape[:a])
        for b, d in enumerate(out):
            if d == shape[a] and math.prod(out[:b]) == outer:
                return b
    except SymbolicError:
        pass
    raise unpositional(op, f"it splits or merges axis {a}, along which the positions run")


RESHAPE = OpDef(
    "reshape",
    "x's elements in row-major order, in a new shape",
    ("x",),
    ("shape",),
    infer=_reshape_infer,
    fusion=Pattern.INJECTIVE,
    evaluate=lambda xs, attrs: np.reshape(xs[0], get_ints(attrs, "shape")),
    lower=_reshape_lower,
    export=_reshape_export,
    cheap=always_cheap,
    view=True,
    positions=_reshape_positions,
)


# --- concat -----------------------------------------------------------------------------------


def _concat_infer(c: Check) -> TensorType:
    first = c.types[0]
    dtype = c.same_dtype()
    axis = c.axis("axis", len(first.shape))
    extent = 0
    for name, t in zip(c.names, c.types, strict=True):
        if len(t.shape) != len(first.shape) or any(
            a != b for k, (a, b) in enumerate(zip(t.shape, first.shape, strict=True)) if k != axis
        ):
            fail(
                f"shapes differ off axis {axis}: {c.names[0]} is {dims(first)}, {name} is {dims(t)}"
            )
        extent += t.shape[axis]
    return TensorType(first.shape[:axis] + (extent,) + first.shape[axis + 1 :], dtype)


def _concat_lower(k: Kernel, op: Op, args: tuple[Buffer, ...], out: Buffer) -> None:
    """A select chain over the axis: `i < end0 ? x0[i] : i < end1 ? x1[i - end0] : ...`."""
    axis = attr_int(op, "axis")
    starts = [sum(x.shape[axis] for x in args[:n]) for n in range(len(args))]

    def load(i: Indices) -> Expr:
        def part(n: int) -> Expr:
            index = i[:axis] + (add(i[axis], -starts[n]),) + i[axis + 1 :]
            x = args[n]
            return x[tuple(clamp(k, e, x.shape[d]) for d, e in enumerate(index))]

        value = part(len(args) - 1)
        for n in reversed(range(len(args) - 1)):
            end = as_expr(starts[n] + args[n].shape[axis])
            value = Select(Binary("<", i[axis], end), part(n), value)
        return value

    k.compute("concat", out, load)


def _concat_positions(op: Op, axes: tuple[int | None, ...]) -> int | None:
    """Every part's positions along one axis, not the one joined."""
    if set(axes) == {None}:
        return None
    if len(set(axes)) > 1 or axes[0] == attr_int(op, "axis"):
        raise unpositional(op, "it joins along, or beside, the positions' axis")
    return axes[0]


CONCAT = OpDef(
    "concat",
    "x0, x1, ... joined along axis",
    ("x",),
    ("axis",),
    infer=_concat_infer,
    fusion=Pattern.INJECTIVE,
    evaluate=lambda xs, attrs: np.concatenate(xs, axis=get_int(attrs, "axis")),
    lower=_concat_lower,
    export=lambda ex, op: ex.node(
        "Concat", operand_names(op), op.result.name, axis=attr_int(op, "axis")
    ),
    variadic=True,
    cheap=always_cheap,
    positions=_concat_positions,
)


# --- slice ------------------------------------------------------------------------------------


def _slice_infer(c: Check) -> TensorType:
    (x,) = c.types
    ndim = len(x.shape)
    # Axes past the given entries, and None entries, take their full range.
    starts, stops, steps = (
        (c.raw_entries(key, ndim) or ()) + (None,) * ndim for key in ("start", "stop", "step")
    )
    triples = [_slice_axis(k, dim, starts[k], stops[k], steps[k]) for k, dim in enumerate(x.shape)]
    for i, key in enumerate(("start", "stop", "step")):
        c.out[key] = tuple(t[i] for t in triples)
    return TensorType(tuple(_length(*t) for t in triples), x.dtype)


def _length(start: int, stop: Dim, step: int) -> Dim:
    return stop if isinstance(stop, Sym) else len(range(start, stop, step))


def _slice_axis(
    axis: int, dim: Dim, start: Dim | None, stop: Dim | None, step: Dim | None
) -> tuple[int, Dim, int]:
    if isinstance(dim, Sym):  # taken whole: (0, dim, 1), the dimension in the attribute
        if start not in (None, 0) or stop not in (None, dim) or step not in (None, 1):
            bounds = ", ".join("None" if v is None else format_dim(v) for v in (start, stop, step))
            fail(f"slice ({bounds}) of the symbolic axis {axis} ({{{dim}}}): it is taken whole")
        return 0, dim, 1
    if any(isinstance(v, Sym) for v in (start, stop, step)):
        fail(f"a symbolic slice bound on axis {axis} of extent {dim}")
    step = 1 if step is None else step
    if step == 0:
        fail(f"slice step is 0 on axis {axis}")
    low, high = (0, dim) if step > 0 else (-1, dim - 1)
    start = (low if step > 0 else high) if start is None else start
    stop = (high if step > 0 else low) if stop is None else stop
    for what, v in (("start", start), ("stop", stop)):
        if not low <= v <= high:
            fail(
                f"slice {what} {v} on axis {axis} (extent {dim}, step {step}) is not in normal "
                f"form {low}..{high}; slice_indices/GraphBuilder.slice take Python-style indices"
            )
    return start, stop, step


def _slice_triple(a: int | None, b: object, c: int | None, dim: Dim) -> tuple:
    """One axis's (start, stop, step) in normal form; an axis of symbolic extent is taken
    whole only."""
    if not isinstance(dim, Sym):
        return slice(a, b, c).indices(dim)  # type: ignore[arg-type]
    if a in (0, None) and b in (None, dim) and c in (1, None):
        return (0, dim, 1)
    raise TypeInferenceError(
        f"hexir.slice: axis of symbolic extent {{{dim}}} can only be taken whole, not [{a}:{b}:{c}]"
    )


def slice_indices(
    shape: Sequence[int],
    start: Sequence[int | None],
    stop: Sequence[int | None],
    step: Sequence[int | None] | None = None,
) -> dict[str, tuple[int, ...]]:
    """Python-style slice bounds (negatives count from the end) in slice's normal form.

    Axes past the given entries take their full range, as in numpy indexing.
    """
    step = step if step is not None else (None,) * len(start)
    if not len(start) == len(stop) == len(step) <= len(shape):
        raise TypeInferenceError(
            f"hexir.slice: start, stop and step need equal lengths up to rank {len(shape)}, "
            f"got {tuple(start)}, {tuple(stop)}, {tuple(step)}"
        )
    if any(s == 0 for s in step):
        raise TypeInferenceError(f"hexir.slice: step is 0 in {tuple(step)}")
    given = zip(start, stop, step, shape[: len(start)], strict=True)
    triples = [_slice_triple(a, b, c, dim) for a, b, c, dim in given]
    triples += [(0, dim, 1) for dim in shape[len(triples) :]]
    return {key: tuple(t[i] for t in triples) for i, key in enumerate(("start", "stop", "step"))}


def _slice_build(
    x: Value,
    start: Sequence[int | None],
    stop: Sequence[int | None],
    step: Sequence[int | None] | None = None,
) -> tuple[Sequence[Value], dict[str, object]]:
    """`x[start:stop:step]` per axis, Python-style (negatives count from the end)."""
    return (x,), dict(slice_indices(x.type.shape, start, stop, step))


def _slice_evaluate(xs: list[np.ndarray], attrs: Attrs) -> np.ndarray:
    starts, stops = get_ints(attrs, "start"), get_ints(attrs, "stop")
    steps = get_ints(attrs, "step")
    # slice.indices gives stop = -1 for "before index 0" with a negative step; to numpy a
    # negative stop counts from the end, so spell it as None.
    index = tuple(
        slice(a, None if b < 0 else b, c) for a, b, c in zip(starts, stops, steps, strict=True)
    )
    return xs[0][index]


def _slice_lower(k: Kernel, op: Op, args: tuple[Buffer, ...], out: Buffer) -> None:
    (x,) = args
    start, step = attr_ints(op, "start"), attr_ints(op, "step")

    def load(i: Indices) -> Expr:
        # An axis that keeps one element needs no var: it reads `start` whatever the step.
        return x[
            tuple(
                IntImm(b) if n == 1 else affine([(v, s)], b)
                for v, b, s, n in zip(i, start, step, out.shape, strict=True)
            )
        ]

    k.compute("slice", out, load)


def _slice_export(ex: Exporter, op: Op) -> None:
    symbolic_only(ex, op, "stop")
    out = op.result.name
    starts, stops, steps = (attr_ints(op, k) for k in ("start", "stop", "step"))
    # In normal form a stop of -1 with a negative step means "through index 0"; to ONNX a -1
    # counts from the end, so say "before the start" with the most negative int64.
    ends = tuple(
        np.iinfo(np.int64).min if b == -1 and c < 0 else b
        for b, c in zip(stops, steps, strict=True)
    )
    axes = tuple(range(len(starts)))
    inputs = [
        ex.ints(v, f"{out}.{k}")
        for k, v in zip(
            ("starts", "ends", "axes", "steps"), (starts, ends, axes, steps), strict=True
        )
    ]
    ex.node("Slice", [op.operands[0].name, *inputs], out)


def _slice_cheap(op: Op) -> bool:
    """A slice with a unit step on the innermost axis."""
    ndim = len(op.operands[0].type.shape)
    step = op.attr("step")
    return isinstance(step, tuple) and (ndim == 0 or step[-1] == 1)


def _slice_positions(op: Op, axes: tuple[int | None, ...]) -> int | None:
    """The positions' axis taken whole."""
    (a,) = axes
    if a is None:
        return None
    start, stop, step = (op.attr(k) for k in ("start", "stop", "step"))
    whole = start[a] == 0 and step[a] == 1 and stop[a] == op.operands[0].type.shape[a]  # type: ignore[index]
    if not whole:
        raise unpositional(op, f"it slices axis {a}, along which the positions run")
    return a


SLICE = OpDef(
    "slice",
    "x[start:stop:step] per axis, in slice's normal form",
    ("x",),
    ("start", "stop", "step"),
    infer=_slice_infer,
    fusion=Pattern.INJECTIVE,
    evaluate=_slice_evaluate,
    lower=_slice_lower,
    export=_slice_export,
    build=_slice_build,
    cheap=_slice_cheap,
    positions=_slice_positions,
)


# --- pad --------------------------------------------------------------------------------------


def _pad_infer(c: Check) -> TensorType:
    (x,) = c.types
    ndim = len(x.shape)
    before = at_least("before", c.ints("before", length=ndim), 0)
    after = at_least("after", c.ints("after", length=ndim), 0)
    c.real("value", 0.0)
    return TensorType(
        tuple(d + b + a for d, b, a in zip(x.shape, before, after, strict=True)), x.dtype
    )


def _pad_evaluate(xs: list[np.ndarray], attrs: Attrs) -> np.ndarray:
    widths = list(zip(get_ints(attrs, "before"), get_ints(attrs, "after"), strict=True))
    return np.pad(xs[0], widths, constant_values=np.asarray(attrs["value"]).astype(xs[0].dtype))


def _pad_lower(k: Kernel, op: Op, args: tuple[Buffer, ...], out: Buffer) -> None:
    (x,) = args
    before = attr_ints(op, "before")
    fill = const(attr_float(op, "value"), x.dtype)

    def load(i: Indices) -> Expr:
        return guarded_value(k, x, [add(v, -b) for v, b in zip(i, before, strict=True)], fill)

    k.compute("pad", out, load)


def _pad_export(ex: Exporter, op: Op) -> None:
    out, x = op.result.name, op.operands[0]
    pads = ex.ints(attr_ints(op, "before") + attr_ints(op, "after"), f"{out}.pads")
    value = ex.scalar(attr_float(op, "value"), x, f"{out}.value")
    ex.node("Pad", [x.name, pads, value], out, mode="constant")


def _pad_positions(op: Op, axes: tuple[int | None, ...]) -> int | None:
    (a,) = axes
    if a is not None and (attr_ints(op, "before")[a] or attr_ints(op, "after")[a]):
        raise unpositional(op, f"it pads axis {a}, along which the positions run")
    return a


PAD = OpDef(
    "pad",
    "x with before/after elements of value added on each axis",
    ("x",),
    ("before", "after", "value"),
    infer=_pad_infer,
    fusion=Pattern.INJECTIVE,
    evaluate=_pad_evaluate,
    lower=_pad_lower,
    export=_pad_export,
    cheap=always_cheap,
    positions=_pad_positions,
)

OPS: tuple[OpDef, ...] = (
    TRANSPOSE,
    LAYOUT_TRANSFORM,
    RESHAPE,
    CONCAT,
    SLICE,
    PAD,
    CONSTANT,
)
