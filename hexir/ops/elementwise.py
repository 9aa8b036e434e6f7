"""Elementwise ops: broadcasting binaries, comparisons, where, unary math, gelu, cast.

Each lowers to one spatial block named after the op; the binaries and where read their
operands under numpy broadcasting. Their fusion role is elementwise (`hexir.graph.fusion`
makes it broadcast where an operand is smaller than the result).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from hexir.errors import HexirError
from hexir.ir.dtype import is_float, is_unsigned, itemsize, numpy_dtype
from hexir.ir.graph import Op, TensorType
from hexir.ir.op_attrs import Check, fail
from hexir.ir.tir import Binary, Buffer, Call, Cast, Expr, Select, const
from hexir.ops.base import (
    Export,
    Exporter,
    Infer,
    Lower,
    OpDef,
    Pattern,
    no_flops,
    onnx_same,
    operand_names,
)
from hexir.ops.compute import Kernel, broadcast
from hexir.ops.numeric import Attrs, Evaluate, erf, erfc, f64, in_dtype, in_f64, trunc_div

# --- binaries ---------------------------------------------------------------------------------


def _binary_infer(allowed: str, result_dtype: str | None) -> Infer:
    def infer(c: Check) -> TensorType:
        dtype = c.same_dtype()
        c.dtype_in(allowed, 0)
        return TensorType(c.broadcast(), result_dtype or dtype)

    return infer


def _lower_binary(operator: str) -> Lower:
    def lower(k: Kernel, op: Op, args: tuple[Buffer, ...], out: Buffer) -> None:
        a, b = args
        shape = out.shape
        k.compute(
            op.kind, out, lambda i: Binary(operator, broadcast(a, i, shape), broadcast(b, i, shape))
        )

    return lower


def binary(
    name: str,
    doc: str,
    operator: str,
    allowed: str,
    evaluate: Evaluate,
    export: Export,
    result_dtype: str | None = None,
    lower: Lower | None = None,
) -> OpDef:
    """A broadcasting binary op: hextir `operator` of its operands (or `lower`'s kernel),
    `allowed` dtypes ("float", "int", "numeric" or "any"), the operands' dtype or
    `result_dtype` as the result's."""
    return OpDef(
        name,
        doc,
        ("a", "b"),
        (),
        infer=_binary_infer(allowed, result_dtype),
        fusion=Pattern.ELEMENTWISE,
        evaluate=evaluate,
        lower=lower or _lower_binary(operator),
        export=export,
    )


def _div(xs: list[np.ndarray], attrs: Attrs) -> np.ndarray:
    a, b = xs
    if a.dtype.kind in "iu":
        # Division by zero is undefined in C; 0 keeps the reference quiet and deterministic.
        safe = np.where(b == 0, 1, b)
        return np.where(b == 0, 0, trunc_div(a, safe))
    return np.true_divide(a, b)


def _remainder_evaluate(fn: Callable[..., np.ndarray]) -> Evaluate:
    def evaluate(xs: list[np.ndarray], attrs: Attrs) -> np.ndarray:
        a, b = xs
        if a.dtype.kind in "iu":  # a remainder by zero is 0, as the kernels guard it
            return np.where(b == 0, 0, fn(a, np.where(b == 0, 1, b)))
        return fn(a, b)

    return evaluate


def _lower_remainder(operator: str) -> Lower:
    """The remainder; an integer one is 0 where the divisor is 0 (C would trap there); a
    float floor remainder is C's fmod moved to the divisor's sign (`_floor_moved`)."""

    def lower(k: Kernel, op: Op, args: tuple[Buffer, ...], out: Buffer) -> None:
        a, b = args
        shape = out.shape

        def value(i: tuple[Expr, ...]) -> Expr:
            x, y = broadcast(a, i, shape), broadcast(b, i, shape)
            if is_float(out.dtype):
                r = Binary("fmod", x, y)
                return r if operator == "fmod" else _floor_moved(r, y, out.dtype)
            zero, one = const(0, out.dtype), const(1, out.dtype)
            by_zero = Binary("==", y, zero)  # the divisor made 1 too: vector code takes both
            return Select(by_zero, zero, Binary(operator, x, Select(by_zero, one, y)))

        k.compute(op.kind, out, value)

    return lower


def _floor_moved(r: Expr, y: Expr, dtype: str) -> Expr:
    """C's fmod remainder `r` of a division by `y` moved to the divisor's sign, numpy's floor
    remainder (and ONNX Mod 28's): a nonzero one of the other sign plus y; a zero one (fmod
    gives the dividend's sign) 0 times -1 or 1."""
    zero = const(0, dtype)
    negative = Binary("<", y, zero)
    moved = Binary("&&", Binary("!=", r, zero), Binary("!=", Binary("<", r, zero), negative))
    sign = Select(negative, const(-1, dtype), const(1, dtype))
    return Select(
        Binary("==", r, zero), Binary("*", zero, sign), Select(moved, Binary("+", r, y), r)
    )


def _remainder(name: str, doc: str, operator: str, allowed: str, fn, fmod: int) -> OpDef:  # noqa: ANN001
    def export(ex: Exporter, op: Op) -> None:
        ex.node("Mod", operand_names(op), op.result.name, fmod=fmod)

    evaluate, lower = _remainder_evaluate(fn), _lower_remainder(operator)
    return binary(name, doc, operator, allowed, evaluate, export, lower=lower)


def _lower_shift(operator: str) -> Lower:
    """A shift; by a negative amount or the width or more (C leaves it undefined) what numpy
    gives: 0, or for a right shift of a negative integer -1. The amount is made 0 there too,
    as vector code computes both sides of a select."""

    def lower(k: Kernel, op: Op, args: tuple[Buffer, ...], out: Buffer) -> None:
        a, b = args
        shape, dtype = out.shape, out.dtype
        width = const(8 * itemsize(dtype), dtype)

        def value(i: tuple[Expr, ...]) -> Expr:
            x, y = broadcast(a, i, shape), broadcast(b, i, shape)
            zero = const(0, dtype)
            ok = Binary("<", y, width)
            if not is_unsigned(dtype):
                ok = Binary("&&", Binary(">=", y, zero), ok)
            outside = zero
            if operator == "shr" and not is_unsigned(dtype):
                outside = Select(Binary("<", x, zero), const(-1, dtype), zero)
            return Select(ok, Binary(operator, x, Select(ok, y, zero)), outside)

        k.compute(op.kind, out, value)

    return lower


def _export_opset18(op_type: str) -> Export:
    def export(ex: Exporter, op: Op) -> None:
        raise HexirError(f"{op.kind} has no ONNX form at opset 17 ({op_type} arrived in opset 18)")

    return export


def _shift(name: str, doc: str, operator: str, fn, direction: str) -> OpDef:  # noqa: ANN001
    def export(ex: Exporter, op: Op) -> None:
        if not is_unsigned(op.operands[0].type.dtype):
            raise HexirError(
                f"{op.kind} of signed integers has no ONNX form (BitShift's are unsigned)"
            )
        ex.node("BitShift", operand_names(op), op.result.name, direction=direction)

    def evaluate(xs: list[np.ndarray], attrs: Attrs) -> np.ndarray:
        a, b = xs
        width = 8 * a.dtype.itemsize
        ok = (b >= 0) & (b < width)
        outside = np.zeros_like(a)  # in a's dtype: a uint64 beside an int64 would go float
        if operator == "shr" and a.dtype.kind == "i":
            outside = np.where(a < 0, np.asarray(-1, a.dtype), outside)
        return np.where(ok, fn(a, np.where(ok, b, 0).astype(b.dtype)), outside)

    return binary(name, doc, operator, "int", evaluate, export, lower=_lower_shift(operator))


def _export_extremum(ex: Exporter, op: Op) -> None:
    # ONNX's Max and Min take no bools: on bools maximum is Or and minimum is And.
    names, out = operand_names(op), op.result.name
    if op.operands[0].type.dtype == "bool":
        ex.node("Or" if op.kind == "maximum" else "And", names, out)
    else:
        ex.node("Max" if op.kind == "maximum" else "Min", names, out)


def _export_order(onnx_op: str) -> Export:
    """An ordering comparison; bools compare as int32 (ONNX orders no bools)."""

    def export(ex: Exporter, op: Op) -> None:
        names = operand_names(op)
        if op.operands[0].type.dtype == "bool":
            int32 = ex.elem_type("int32")
            names = [ex.node("Cast", [n], to=int32) for n in names]
        ex.node(onnx_op, names, op.result.name)

    return export


def _export_not_equal(ex: Exporter, op: Op) -> None:
    ex.node("Not", [ex.node("Equal", operand_names(op))], op.result.name)


def _compare(
    name: str, doc: str, operator: str, fn: Callable[..., np.ndarray], export: Export
) -> OpDef:
    return binary(name, doc, operator, "any", in_dtype(fn), export, result_dtype="bool")


_ARITHMETIC = (
    binary("add", "a + b", "+", "numeric", in_dtype(np.add), onnx_same("Add")),
    binary("sub", "a - b", "-", "numeric", in_dtype(np.subtract), onnx_same("Sub")),
    binary("mul", "a · b", "*", "numeric", in_dtype(np.multiply), onnx_same("Mul")),
    # hextir "/" on ints truncates toward zero, as docs/ops.md asks
    binary("div", "a / b (ints: truncated toward zero)", "/", "numeric", _div, onnx_same("Div")),
    binary("maximum", "max(a, b)", "max", "any", in_dtype(np.maximum), _export_extremum),
    binary("minimum", "min(a, b)", "min", "any", in_dtype(np.minimum), _export_extremum),
    binary("power", "a ** b (floats)", "pow", "float", in_f64(np.power), onnx_same("Pow")),
    _remainder("mod", "a mod b, the divisor's sign (numpy's %)", "floormod", "numeric", np.mod, 0),
    _remainder(
        "fmod", "a - b·trunc(a / b), the dividend's sign (C's %)", "fmod", "numeric", np.fmod, 1
    ),
)
_BITWISE = (
    binary("bitwise_and", "a & b (ints)", "bitand", "int", in_dtype(np.bitwise_and),
           _export_opset18("BitwiseAnd")),
    binary("bitwise_or", "a | b (ints)", "bitor", "int", in_dtype(np.bitwise_or),
           _export_opset18("BitwiseOr")),
    binary("bitwise_xor", "a ^ b (ints)", "bitxor", "int", in_dtype(np.bitwise_xor),
           _export_opset18("BitwiseXor")),
    _shift("left_shift", "a << b (ints; 0 where b is negative or the width or more)", "shl",
           np.left_shift, "LEFT"),
    _shift("right_shift", "a >> b (ints, arithmetic where signed; a's sign where b is negative "
           "or the width or more)", "shr", np.right_shift, "RIGHT"),
)  # fmt: skip
_COMPARISONS = (
    _compare("equal", "a == b", "==", np.equal, onnx_same("Equal")),
    _compare("not_equal", "a != b", "!=", np.not_equal, _export_not_equal),
    _compare("less", "a < b", "<", np.less, _export_order("Less")),
    _compare("less_equal", "a <= b", "<=", np.less_equal, _export_order("LessOrEqual")),
    _compare("greater", "a > b", ">", np.greater, _export_order("Greater")),
    _compare("greater_equal", "a >= b", ">=", np.greater_equal, _export_order("GreaterOrEqual")),
)


# --- where ------------------------------------------------------------------------------------


def _where_infer(c: Check) -> TensorType:
    if c.types[0].dtype != "bool":
        fail(f"cond must be a bool tensor, got {c.types[0].dtype}")
    dtype = c.same_dtype(1, 2)
    return TensorType(c.broadcast(), dtype)


def _where_lower(k: Kernel, op: Op, args: tuple[Buffer, ...], out: Buffer) -> None:
    c, a, b = args
    s = out.shape
    k.compute(
        "where", out, lambda i: Select(broadcast(c, i, s), broadcast(a, i, s), broadcast(b, i, s))
    )


WHERE = OpDef(
    "where",
    "cond ? a : b, broadcast",
    ("cond", "a", "b"),
    (),
    infer=_where_infer,
    fusion=Pattern.ELEMENTWISE,
    evaluate=in_dtype(np.where),
    lower=_where_lower,
    export=onnx_same("Where"),
)


# --- unary math -------------------------------------------------------------------------------


def _unary_infer(allowed: str) -> Infer:
    def infer(c: Check) -> TensorType:
        c.dtype_in(allowed)
        return c.types[0]

    return infer


def unary(
    name: str,
    doc: str,
    allowed: str,
    fn: Callable[[Expr], Expr],
    evaluate: Evaluate,
    export: Export,
) -> OpDef:
    """An op of one operand: hextir `fn` of each element, `allowed` dtypes, x's type."""

    def lower(k: Kernel, op: Op, args: tuple[Buffer, ...], out: Buffer) -> None:
        (x,) = args
        k.compute(op.kind, out, lambda i: fn(x[i]))

    return OpDef(
        name,
        doc,
        ("x",),
        (),
        infer=_unary_infer(allowed),
        fusion=Pattern.ELEMENTWISE,
        evaluate=evaluate,
        lower=lower,
        export=export,
    )


def _call(name: str) -> Callable[[Expr], Expr]:
    return lambda x: Call(name, (x,))


def _relu_evaluate(xs: list[np.ndarray], attrs: Attrs) -> np.ndarray:
    return np.maximum(xs[0], np.zeros((), xs[0].dtype))


def _export_relu(ex: Exporter, op: Op) -> None:
    # ONNX's Relu is for floats: on ints relu is Max(x, 0).
    names, out, x = operand_names(op), op.result.name, op.operands[0]
    if x.type.dtype.startswith("float"):
        ex.node("Relu", names, out)
    else:
        ex.node("Max", [names[0], ex.scalar(0, x, f"{out}.zero")], out)


def _export_rsqrt(ex: Exporter, op: Op) -> None:
    # Reciprocal(Sqrt(x)), which the importer turns back into one rsqrt.
    ex.node("Reciprocal", [ex.node("Sqrt", operand_names(op))], op.result.name)


def _sign(x: Expr) -> Expr:
    """1 where x > 0, -1 where x < 0, else x itself (0, -0, nan)."""
    dt = x.dtype
    rest = x if is_unsigned(dt) else Select(Binary("<", x, const(0, dt)), const(-1, dt), x)
    return Select(Binary(">", x, const(0, dt)), const(1, dt), rest)


def _float_unary(
    name: str, doc: str, fn: Callable[[np.ndarray], np.ndarray], export: Export
) -> OpDef:
    return unary(name, doc, "float", _call(name), in_f64(fn), export)


_UNARIES = (
    unary(
        "relu",
        "max(x, 0)",
        "numeric",
        lambda x: Binary("max", x, const(0, x.dtype)),
        _relu_evaluate,
        _export_relu,
    ),
    _float_unary(
        "sigmoid", "1 / (1 + exp(-x))", lambda x: 1.0 / (1.0 + np.exp(-x)), onnx_same("Sigmoid")
    ),
    _float_unary("tanh", "tanh(x)", np.tanh, onnx_same("Tanh")),
    _float_unary("exp", "e ** x", np.exp, onnx_same("Exp")),
    _float_unary("log", "the natural logarithm", np.log, onnx_same("Log")),
    _float_unary("erf", "the error function", erf, onnx_same("Erf")),
    _float_unary("sqrt", "the square root", np.sqrt, onnx_same("Sqrt")),
    _float_unary("rsqrt", "1 / sqrt(x)", lambda x: 1.0 / np.sqrt(x), _export_rsqrt),
    _float_unary("floor", "the largest integer <= x", np.floor, onnx_same("Floor")),
    _float_unary("ceil", "the smallest integer >= x", np.ceil, onnx_same("Ceil")),
    _float_unary("round", "the nearest integer, ties to even", np.rint, onnx_same("Round")),
    _float_unary("sin", "the sine", np.sin, onnx_same("Sin")),
    _float_unary("cos", "the cosine", np.cos, onnx_same("Cos")),
    unary("sign", "-1, 0 or 1 (nan: nan)", "numeric", _sign, in_dtype(np.sign), onnx_same("Sign")),
)


# --- gelu -------------------------------------------------------------------------------------


def _gelu_infer(c: Check) -> TensorType:
    c.dtype_in("float")
    c.choice("approximate", ("none", "tanh"), "none")
    return c.types[0]


def _gelu_evaluate(xs: list[np.ndarray], attrs: Attrs) -> np.ndarray:
    x = f64(xs[0])
    if attrs["approximate"] == "tanh":
        inner = math.sqrt(2.0 / math.pi) * (x + 0.044715 * x**3)
        return 0.5 * x * (1.0 + np.tanh(inner))
    # x * Phi(x) = x/2 * erfc(-x/sqrt(2)): no cancellation for large negative x.
    return 0.5 * x * erfc(-x * math.sqrt(0.5))


def gelu(x: Expr, approximate: str) -> Expr:
    """0.5·x·(1 + erf(x/√2)); approximate="tanh": 0.5·x·(1 + tanh(√(2/π)(x + 0.044715x³)))."""
    dt = x.dtype
    if approximate == "tanh":
        inner = const(math.sqrt(2 / math.pi), dt) * (x + const(0.044715, dt) * x * x * x)
        phi = Call("tanh", (inner,))
    else:
        phi = Call("erf", (x * const(1 / math.sqrt(2), dt),))
    return const(0.5, dt) * x * (const(1, dt) + phi)


def _gelu_lower(k: Kernel, op: Op, args: tuple[Buffer, ...], out: Buffer) -> None:
    (x,) = args
    approximate = str(op.attr("approximate"))
    k.compute("gelu", out, lambda i: gelu(x[i], approximate))


def _gelu_export(ex: Exporter, op: Op) -> None:
    """PyTorch's spellings (Gelu arrived in opset 20): x·(1 + erf(x/√2))·0.5, or the same with
    tanh(√(2/π)·(x + 0.044715·x³)) in place of the erf; the importer turns both back."""
    (x,) = op.operands
    out = op.result.name
    if op.attr("approximate") == "tanh":
        cube = ex.node("Pow", [x.name, ex.scalar(3.0, x, f"{out}.three")])
        inner = ex.node("Mul", [cube, ex.scalar(0.044715, x, f"{out}.coeff")])
        inner = ex.node("Add", [x.name, inner])
        inner = ex.node("Mul", [inner, ex.scalar(math.sqrt(2.0 / math.pi), x, f"{out}.k")])
        core = ex.node("Tanh", [inner])
    else:
        core = ex.node("Erf", [ex.node("Div", [x.name, ex.scalar(math.sqrt(2.0), x, f"{out}.k")])])
    one_plus = ex.node("Add", [core, ex.scalar(1.0, x, f"{out}.one")])
    ex.node("Mul", [ex.node("Mul", [x.name, one_plus]), ex.scalar(0.5, x, f"{out}.half")], out)


GELU = OpDef(
    "gelu",
    'x·Φ(x), exact (erf) or approximate="tanh"',
    ("x",),
    ("approximate",),
    infer=_gelu_infer,
    fusion=Pattern.ELEMENTWISE,
    evaluate=_gelu_evaluate,
    lower=_gelu_lower,
    export=_gelu_export,
)


# --- cast -------------------------------------------------------------------------------------


def _cast_infer(c: Check) -> TensorType:
    return TensorType(c.types[0].shape, c.dtype("dtype"))


def _cast_evaluate(xs: list[np.ndarray], attrs: Attrs) -> np.ndarray:
    return xs[0].astype(numpy_dtype(str(attrs["dtype"])))


def _cast_lower(k: Kernel, op: Op, args: tuple[Buffer, ...], out: Buffer) -> None:
    (x,) = args
    k.compute("cast", out, lambda i: Cast(out.dtype, x[i]))


def _cast_export(ex: Exporter, op: Op) -> None:
    ex.node("Cast", operand_names(op), op.result.name, to=ex.elem_type(str(op.attr("dtype"))))


CAST = OpDef(
    "cast",
    "x converted to dtype",
    ("x",),
    ("dtype",),
    infer=_cast_infer,
    fusion=Pattern.ELEMENTWISE,
    evaluate=_cast_evaluate,
    lower=_cast_lower,
    export=_cast_export,
    flops=no_flops,
)

OPS: tuple[OpDef, ...] = (*_ARITHMETIC, *_BITWISE, WHERE, *_COMPARISONS, *_UNARIES, GELU, CAST)
