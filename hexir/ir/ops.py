"""Shape and dtype inference, attribute checks and normalization for every `hexir` op.

`make_op` is the one way to build an `Op`: the builder, the parser and the graph passes all go
through it, so every op in a graph has been checked and its attributes are in the normalized
form of docs/ops.md (axes non-negative, pairs full length, defaults filled in, reshape's -1
resolved). `make_op` is idempotent on attributes: rebuilding an op from `dict(op.attrs)` gives
the same op.

    make_op("matmul", [x, w], {}, "0")                     # %0 = hexir.matmul %x, %w ...
    make_op("reduce_sum", [y], {"axes": -1}, "1")          # attrs: axes=(1,), keepdims=False

Slice attributes are taken in their normal form (Python's `slice(start, stop, step).indices`):
with a negative step, a stop of -1 means "through index 0", not "the last element", so
`make_op` cannot also read negative indices Python's way. `None` entries, a missing step and
trailing axes left out mean the full range. `slice_indices` (and `GraphBuilder.slice`) take
Python-style indices and give the normal form.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from hexir.errors import TypeInferenceError
from hexir.ir.graph import Op, TensorType, Value
from hexir.ir.op_attrs import NAME_RE, PLACEMENT_RE, Check, Reject, dims, fail, normalize_axis

Infer = Callable[[Check], TensorType]


@dataclass(frozen=True, slots=True)
class OpSpec:
    """One row of the op table: operand names (for messages), attribute keys, inference."""

    operands: tuple[str, ...]
    attrs: tuple[str, ...]
    infer: Infer
    variadic: bool = False  # one or more operands, all named after operands[0]


# --- linear algebra and convolution ---------------------------------------------------------


def _matmul(c: Check) -> TensorType:
    a, b = c.ranks(2, 2)
    c.dtype_in("numeric", 0)
    dtype = c.same_dtype()
    if a.shape[1] != b.shape[0]:
        fail(f"inner dimensions differ: a is {dims(a)}, b is {dims(b)}")
    return TensorType((a.shape[0], b.shape[1]), dtype)


def _batch_matmul(c: Check) -> TensorType:
    a, b = c.ranks(3, 3)
    c.dtype_in("numeric", 0)
    dtype = c.same_dtype()
    if a.shape[0] != b.shape[0]:
        fail(f"batch dimensions differ: a is {dims(a)}, b is {dims(b)}")
    if a.shape[2] != b.shape[1]:
        fail(f"inner dimensions differ: a is {dims(a)}, b is {dims(b)}")
    return TensorType((a.shape[0], a.shape[1], b.shape[2]), dtype)


def _dense(c: Check) -> TensorType:
    x, w = c.ranks(2, 2)
    c.dtype_in("numeric", 0)
    dtype = c.same_dtype()
    if x.shape[1] != w.shape[1]:
        fail(f"inner dimensions differ: x is {dims(x)}, w is {dims(w)} (w is [N, K])")
    return TensorType((x.shape[0], w.shape[0]), dtype)


def _bias_add(c: Check) -> TensorType:
    x, b = c.types
    dtype = c.same_dtype()
    c.dtype_in("numeric", 0)
    axis = c.axis("axis", len(x.shape), 1)
    if b.shape != (x.shape[axis],):
        fail(
            f"b must have shape [{x.shape[axis]}] (x.shape[{axis}]), x is {dims(x)}, b is {dims(b)}"
        )
    return TensorType(x.shape, dtype)


def _window_extent(size: int, kernel: int, stride: int, pad: int, dilation: int = 1) -> int:
    return (size + 2 * pad - dilation * (kernel - 1) - 1) // stride + 1


def _conv2d(c: Check) -> TensorType:
    x, w = c.ranks(4, 4)
    c.dtype_in("numeric", 0)
    dtype = c.same_dtype()
    stride = _at_least(c, "stride", c.ints("stride", 1, length=2), 1)
    padding = _at_least(c, "padding", c.ints("padding", 0, length=2), 0)
    dilation = _at_least(c, "dilation", c.ints("dilation", 1, length=2), 1)
    groups = c.integer("groups", 1, minimum=1)
    n, ch, h, wd = x.shape
    k, cg, r, s = w.shape
    if ch % groups or k % groups:
        fail(f"groups={groups} must divide x's {ch} channels and w's {k} filters")
    if cg * groups != ch:
        fail(f"w has {cg} channels per group, x has {ch} channels in {groups} group(s)")
    oh = _window_extent(h, r, stride[0], padding[0], dilation[0])
    ow = _window_extent(wd, s, stride[1], padding[1], dilation[1])
    if oh < 1 or ow < 1:
        fail(f"the {r}x{s} kernel (dilation {dilation}) does not fit x's padded {h}x{wd} image")
    return TensorType((n, k, oh, ow), dtype)


def _at_least(c: Check, key: str, values: tuple[int, ...], minimum: int) -> tuple[int, ...]:
    if any(v < minimum for v in values):
        fail(f"attribute '{key}' entries must be at least {minimum}, got {values}")
    return values


# --- normalizations --------------------------------------------------------------------------


def _batch_norm(c: Check) -> TensorType:
    x = c.types[0]
    c.same_dtype()
    c.dtype_in("float", 0)
    axis = c.axis("axis", len(x.shape), 1)
    c.real("epsilon", 1e-5)
    for name, t in zip(c.names[1:], c.types[1:], strict=True):
        if t.shape != (x.shape[axis],):
            fail(f"{name} must have shape [{x.shape[axis]}] (x.shape[{axis}]), got {dims(t)}")
    return x


def _layer_norm(c: Check) -> TensorType:
    x = c.types[0]
    dtype = c.same_dtype()
    c.dtype_in("float", 0)
    axis = c.axis("axis", len(x.shape), len(x.shape) - 1)
    c.real("epsilon", 1e-5)
    for name, t in zip(c.names[1:], c.types[1:], strict=True):
        if t.shape != x.shape[axis:]:
            want = "x".join(map(str, x.shape[axis:]))
            fail(f"{name} must have shape {want} (x.shape[{axis}:]), got {dims(t)}")
    return TensorType(x.shape, dtype)


def _softmax(c: Check) -> TensorType:
    (x,) = c.types
    c.dtype_in("float")
    c.axis("axis", len(x.shape), len(x.shape) - 1)
    return x


# --- elementwise -----------------------------------------------------------------------------


def _binary(allowed: str, result_dtype: str | None = None) -> Infer:
    def infer(c: Check) -> TensorType:
        dtype = c.same_dtype()
        c.dtype_in(allowed, 0)
        return TensorType(c.broadcast(), result_dtype or dtype)

    return infer


def _unary(allowed: str) -> Infer:
    def infer(c: Check) -> TensorType:
        c.dtype_in(allowed)
        return c.types[0]

    return infer


def _where(c: Check) -> TensorType:
    if c.types[0].dtype != "bool":
        fail(f"cond must be a bool tensor, got {c.types[0].dtype}")
    dtype = c.same_dtype(1, 2)
    return TensorType(c.broadcast(), dtype)


def _gelu(c: Check) -> TensorType:
    c.dtype_in("float")
    c.choice("approximate", ("none", "tanh"), "none")
    return c.types[0]


def _cast(c: Check) -> TensorType:
    return TensorType(c.types[0].shape, c.dtype("dtype"))


# --- reductions and data movement -----------------------------------------------------------


def _reduce(allowed: str) -> Infer:
    def infer(c: Check) -> TensorType:
        (x,) = c.types
        c.dtype_in(allowed)
        ndim = len(x.shape)
        if not isinstance(c.raw.get("axes"), bool) and hasattr(c.raw.get("axes"), "__index__"):
            c.raw["axes"] = (c.raw["axes"],)
        given = c.ints("axes", tuple(range(ndim)))
        axes = tuple(sorted(normalize_axis(a, ndim) for a in given))
        if len(set(axes)) != len(axes):
            fail(f"attribute 'axes' repeats an axis: {given}")
        c.out["axes"] = axes
        if c.flag("keepdims", False):
            return TensorType(tuple(1 if k in axes else d for k, d in enumerate(x.shape)), x.dtype)
        return TensorType(tuple(d for k, d in enumerate(x.shape) if k not in axes), x.dtype)

    return infer


def _transpose(c: Check) -> TensorType:
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


def _reshape(c: Check) -> TensorType:
    (x,) = c.types
    if not isinstance(c.raw.get("shape"), bool) and hasattr(c.raw.get("shape"), "__index__"):
        c.raw["shape"] = (c.raw["shape"],)
    shape = c.ints("shape")
    if shape.count(-1) > 1 or any(s < -1 for s in shape):
        fail(f"attribute 'shape' {shape} may hold one -1 and otherwise extents >= 0")
    known = math.prod(s for s in shape if s != -1)
    if -1 in shape:
        if known == 0 or x.size % known:
            fail(f"cannot resolve the -1 in {shape} for {dims(x)} ({x.size} elements)")
        shape = tuple(x.size // known if s == -1 else s for s in shape)
    if math.prod(shape) != x.size:
        fail(f"cannot reshape {dims(x)} ({x.size} elements) to {shape}")
    c.out["shape"] = shape
    return TensorType(shape, x.dtype)


def _concat(c: Check) -> TensorType:
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


def _slice(c: Check) -> TensorType:
    (x,) = c.types
    ndim = len(x.shape)
    # Axes past the given entries, and None entries, take their full range.
    starts, stops, steps = (
        (c.raw_entries(key, ndim) or ()) + (None,) * ndim for key in ("start", "stop", "step")
    )
    triples = [_slice_axis(k, dim, starts[k], stops[k], steps[k]) for k, dim in enumerate(x.shape)]
    for i, key in enumerate(("start", "stop", "step")):
        c.out[key] = tuple(t[i] for t in triples)
    return TensorType(tuple(len(range(*t)) for t in triples), x.dtype)


def _slice_axis(
    axis: int, dim: int, start: int | None, stop: int | None, step: int | None
) -> tuple[int, int, int]:
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
    triples = [slice(a, b, c).indices(dim) for a, b, c, dim in given]
    triples += [(0, dim, 1) for dim in shape[len(triples) :]]
    return {key: tuple(t[i] for t in triples) for i, key in enumerate(("start", "stop", "step"))}


def _pad(c: Check) -> TensorType:
    (x,) = c.types
    ndim = len(x.shape)
    before = _at_least(c, "before", c.ints("before", length=ndim), 0)
    after = _at_least(c, "after", c.ints("after", length=ndim), 0)
    c.real("value", 0.0)
    return TensorType(
        tuple(d + b + a for d, b, a in zip(x.shape, before, after, strict=True)), x.dtype
    )


def _pool2d(c: Check) -> TensorType:
    (x,) = c.ranks(4)
    c.dtype_in("numeric")
    kernel = _at_least(c, "kernel", c.ints("kernel", length=2), 1)
    stride = _at_least(c, "stride", c.ints("stride", kernel, length=2), 1)
    padding = _at_least(c, "padding", c.ints("padding", 0, length=2), 0)
    if padding[0] >= kernel[0] or padding[1] >= kernel[1]:
        fail(f"padding {padding} must be smaller than the kernel {kernel}")
    n, ch, h, w = x.shape
    oh = _window_extent(h, kernel[0], stride[0], padding[0])
    ow = _window_extent(w, kernel[1], stride[1], padding[1])
    if oh < 1 or ow < 1:
        fail(f"the {kernel[0]}x{kernel[1]} window does not fit x's padded {h}x{w} image")
    return TensorType((n, ch, oh, ow), x.dtype)


def _global_avg_pool2d(c: Check) -> TensorType:
    (x,) = c.ranks(4)
    c.dtype_in("numeric")
    return TensorType(x.shape[:2] + (1, 1), x.dtype)


def _constant(c: Check) -> TensorType:
    c.string("name", NAME_RE)
    if c.declared is None:
        fail("needs its result type (the shape and dtype of its data)")
    return c.declared


# --- the table -------------------------------------------------------------------------------

_BINARY = {
    **{k: _binary("numeric") for k in ("add", "sub", "mul", "div")},
    **{k: _binary("any") for k in ("maximum", "minimum")},
    "power": _binary("float"),
    **{
        k: _binary("any", "bool")
        for k in ("equal", "not_equal", "less", "less_equal", "greater", "greater_equal")
    },
}
_UNARY = {
    "relu": _unary("numeric"),
    **{k: _unary("float") for k in ("sigmoid", "tanh", "exp", "log", "erf", "sqrt", "rsqrt")},
}

OPS: dict[str, OpSpec] = {
    "constant": OpSpec((), ("name",), _constant),
    "matmul": OpSpec(("a", "b"), (), _matmul),
    "batch_matmul": OpSpec(("a", "b"), (), _batch_matmul),
    "dense": OpSpec(("x", "w"), (), _dense),
    "bias_add": OpSpec(("x", "b"), ("axis",), _bias_add),
    "conv2d": OpSpec(("x", "w"), ("stride", "padding", "dilation", "groups"), _conv2d),
    "batch_norm": OpSpec(("x", "scale", "shift", "mean", "var"), ("axis", "epsilon"), _batch_norm),
    **{k: OpSpec(("a", "b"), (), f) for k, f in _BINARY.items()},
    "where": OpSpec(("cond", "a", "b"), (), _where),
    **{k: OpSpec(("x",), (), f) for k, f in _UNARY.items()},
    "gelu": OpSpec(("x",), ("approximate",), _gelu),
    "cast": OpSpec(("x",), ("dtype",), _cast),
    "softmax": OpSpec(("x",), ("axis",), _softmax),
    "layer_norm": OpSpec(("x", "gamma", "beta"), ("axis", "epsilon"), _layer_norm),
    "reduce_sum": OpSpec(("x",), ("axes", "keepdims"), _reduce("numeric")),
    "reduce_mean": OpSpec(("x",), ("axes", "keepdims"), _reduce("numeric")),
    "reduce_max": OpSpec(("x",), ("axes", "keepdims"), _reduce("any")),
    "transpose": OpSpec(("x",), ("perm",), _transpose),
    "reshape": OpSpec(("x",), ("shape",), _reshape),
    "concat": OpSpec(("x",), ("axis",), _concat, variadic=True),
    "slice": OpSpec(("x",), ("start", "stop", "step"), _slice),
    "pad": OpSpec(("x",), ("before", "after", "value"), _pad),
    "max_pool2d": OpSpec(("x",), ("kernel", "stride", "padding"), _pool2d),
    "avg_pool2d": OpSpec(("x",), ("kernel", "stride", "padding"), _pool2d),
    "global_avg_pool2d": OpSpec(("x",), (), _global_avg_pool2d),
}


def op_spec(name: str) -> OpSpec | None:
    """The table row of `name` ("matmul" or "hexir.matmul"); None for an unknown op."""
    return OPS.get(name.removeprefix("hexir."))


def make_op(
    name: str,
    operands: Sequence[Value],
    attrs: Mapping[str, object] | None,
    result_name: str,
    placement: str = "cpu",
    *,
    result_type: TensorType | None = None,
) -> Op:
    """Check one op, infer its result type and normalize its attributes.

    `name` is "matmul" or "hexir.matmul". `result_type` is required for `constant` (the shape
    and dtype of its data); for other ops it is checked against inference when given.
    Raises `TypeInferenceError` naming the op, saying what is wrong and printing the op.
    """
    kind = name.removeprefix("hexir.")
    operands, attrs = tuple(operands), dict(attrs or {})
    try:
        spec = OPS.get(kind)
        if spec is None:
            fail(f"unknown op; the hexir ops are {', '.join(OPS)}")
        names = _check_signature(spec, operands, attrs, result_name, placement)
        check = Check(names, [v.type for v in operands], attrs, result_type)
        inferred = spec.infer(check)
        if result_type is not None and inferred != result_type:
            fail(f"the result type {result_type!r} disagrees with the inferred {inferred!r}")
    except Reject as e:
        written = _as_written(f"hexir.{kind}", operands, attrs, result_name, placement)
        raise TypeInferenceError(f"hexir.{kind}: {e}\n{written}") from None
    attrs_out = tuple(sorted(check.out.items()))
    return Op(f"hexir.{kind}", operands, Value(result_name, inferred), attrs_out, placement)


def _check_signature(
    spec: OpSpec, operands: tuple, attrs: dict, result_name: object, placement: object
) -> tuple[str, ...]:
    """Arity, operand kinds, attribute keys, names; returns the operands' names."""
    for i, v in enumerate(operands):
        if not isinstance(v, Value):
            fail(f"operand {i} is a {type(v).__name__}, not a Value")
    if spec.variadic:
        if not operands:
            fail("needs at least one operand")
        names = tuple(f"{spec.operands[0]}{i}" for i in range(len(operands)))
    elif len(operands) != len(spec.operands):
        wanted = f"{len(spec.operands)} operand(s) ({', '.join(spec.operands)})"
        fail(f"takes {wanted}, got {len(operands)}")
    else:
        names = spec.operands
    unknown = sorted(set(attrs) - set(spec.attrs))
    if unknown:
        takes = ", ".join(spec.attrs) or "no attributes"
        fail(f"unknown attribute(s) {', '.join(unknown)}; it takes {takes}")
    if not isinstance(result_name, str) or not NAME_RE.fullmatch(result_name):
        fail(f"bad result name {result_name!r}; names match {NAME_RE.pattern}")
    if not isinstance(placement, str) or not PLACEMENT_RE.fullmatch(placement):
        fail(f'bad placement {placement!r}; expected "cpu", "cuda:0", ...')
    return names


def _as_written(kind: str, operands: tuple, attrs: dict, result: object, placement: object) -> str:
    """The op in the text form, with the operands' types, as far as it can be printed."""
    from hexir.ir.graph_text import format_attr_value

    def show(value: object) -> str:
        try:
            return format_attr_value(tuple(value) if isinstance(value, list) else value)
        except TypeError:
            return repr(value)

    items = sorted({**attrs, "placement": placement}.items())
    attr_text = ", ".join(f"{k} = {show(v)}" for k, v in items)
    names = ", ".join(f"%{v.name}" if isinstance(v, Value) else repr(v) for v in operands)
    line = f"  in: %{result} = {kind} {names} {{{attr_text}}}".replace("  {", " {")
    typed = ", ".join(dict.fromkeys(repr(v) for v in operands if isinstance(v, Value)))
    return line + (f"\n  where {typed}" if typed else "")
