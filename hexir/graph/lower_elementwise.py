"""Lowering of elementwise ops: unary math, broadcasting binaries, where, cast, bias_add,
batch_norm. Each is one spatial block named after the op."""

from __future__ import annotations

import math
from collections.abc import Callable

from hexir.graph.compute import Kernel, attr_float, attr_int, broadcast
from hexir.ir.graph import Op
from hexir.ir.tir import Binary, Buffer, Call, Cast, Expr, Select, const

# The hextir operator of each broadcasting binary op (a table: the spelling of each op).
BINARY = {
    "add": "+",
    "sub": "-",
    "mul": "*",
    "div": "/",  # hextir "/" on ints truncates toward zero, as docs/ops.md asks
    "maximum": "max",
    "minimum": "min",
    "power": "pow",
    "equal": "==",
    "not_equal": "!=",
    "less": "<",
    "less_equal": "<=",
    "greater": ">",
    "greater_equal": ">=",
}


def _relu(x: Expr) -> Expr:
    return Binary("max", x, const(0, x.dtype))


def _call(name: str) -> Callable[[Expr], Expr]:
    return lambda x: Call(name, (x,))


UNARY: dict[str, Callable[[Expr], Expr]] = {
    "relu": _relu,
    "sigmoid": _call("sigmoid"),
    "tanh": _call("tanh"),
    "exp": _call("exp"),
    "log": _call("log"),
    "erf": _call("erf"),
    "sqrt": _call("sqrt"),
    "rsqrt": _call("rsqrt"),
}


def lower_unary(k: Kernel, op: Op, args: tuple[Buffer, ...], out: Buffer) -> None:
    (x,) = args
    fn = UNARY[op.kind]
    k.compute(op.kind, out, lambda i: fn(x[i]))


def gelu(x: Expr, approximate: str) -> Expr:
    """0.5·x·(1 + erf(x/√2)); approximate="tanh": 0.5·x·(1 + tanh(√(2/π)(x + 0.044715x³)))."""
    dt = x.dtype
    if approximate == "tanh":
        inner = const(math.sqrt(2 / math.pi), dt) * (x + const(0.044715, dt) * x * x * x)
        phi = Call("tanh", (inner,))
    else:
        phi = Call("erf", (x * const(1 / math.sqrt(2), dt),))
    return const(0.5, dt) * x * (const(1, dt) + phi)


def lower_gelu(k: Kernel, op: Op, args: tuple[Buffer, ...], out: Buffer) -> None:
    (x,) = args
    approximate = str(op.attr("approximate"))
    k.compute("gelu", out, lambda i: gelu(x[i], approximate))


def lower_binary(k: Kernel, op: Op, args: tuple[Buffer, ...], out: Buffer) -> None:
    a, b = args
    operator = BINARY[op.kind]
    shape = out.shape
    k.compute(
        op.kind, out, lambda i: Binary(operator, broadcast(a, i, shape), broadcast(b, i, shape))
    )


def lower_where(k: Kernel, op: Op, args: tuple[Buffer, ...], out: Buffer) -> None:
    c, a, b = args
    s = out.shape
    k.compute(
        "where", out, lambda i: Select(broadcast(c, i, s), broadcast(a, i, s), broadcast(b, i, s))
    )


def lower_cast(k: Kernel, op: Op, args: tuple[Buffer, ...], out: Buffer) -> None:
    (x,) = args
    k.compute("cast", out, lambda i: Cast(out.dtype, x[i]))


def lower_bias_add(k: Kernel, op: Op, args: tuple[Buffer, ...], out: Buffer) -> None:
    x, b = args
    axis = attr_int(op, "axis")
    k.compute("bias_add", out, lambda i: x[i] + b[i[axis]])


def lower_batch_norm(k: Kernel, op: Op, args: tuple[Buffer, ...], out: Buffer) -> None:
    x, scale, shift, mean, var = args
    axis = attr_int(op, "axis")
    eps = const(attr_float(op, "epsilon"), x.dtype)

    def value(i: tuple[Expr, ...]) -> Expr:
        c = i[axis]
        norm = (x[i] - mean[c]) / Call("sqrt", (var[c] + eps,))
        return norm * scale[c] + shift[c]

    k.compute("batch_norm", out, value)
