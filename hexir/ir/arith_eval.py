"""A tiny evaluator of hextir expressions over Python numbers, for tests and constant folding.

    evaluate(floordiv(i * 4 + j, 3), {i: 2, j: 1})     # 3

Integers are exact (floordiv and floormod round toward -inf, as in the IR); floats are Python
floats, not rounded to the expression's dtype. Loads have no value here. `fold_float` and
`fold_cast` fold constants exactly as the compiled kernel would, for `simplify`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping

import numpy as np

from hexir.ir.dtype import is_float, is_int, numpy_dtype, wrap_int
from hexir.ir.tir import Binary, BufferLoad, Call, Cast, Expr, FloatImm, IntImm, Select, Unary, Var

Value = int | float | bool


def _trunc_mod(a: int, b: int) -> int:
    """C's integer remainder: the dividend's sign."""
    r = abs(a) % abs(b)
    return r if a >= 0 else -r


_BINARY: dict[str, Callable[[Value, Value], Value]] = {
    "+": lambda a, b: a + b,
    "-": lambda a, b: a - b,
    "*": lambda a, b: a * b,
    "floordiv": lambda a, b: a // b,
    "floormod": lambda a, b: a % b,
    "fmod": lambda a, b: math.fmod(a, b) if isinstance(a, float) else _trunc_mod(a, b),
    "shl": lambda a, b: a << b,
    "shr": lambda a, b: a >> b,
    "bitand": lambda a, b: a & b,
    "bitor": lambda a, b: a | b,
    "bitxor": lambda a, b: a ^ b,
    "min": min,
    "max": max,
    "pow": lambda a, b: a**b,
    "==": lambda a, b: a == b,
    "!=": lambda a, b: a != b,
    "<": lambda a, b: a < b,
    "<=": lambda a, b: a <= b,
    ">": lambda a, b: a > b,
    ">=": lambda a, b: a >= b,
    "&&": lambda a, b: bool(a) and bool(b),
    "||": lambda a, b: bool(a) or bool(b),
}

_CALLS: dict[str, Callable[[float], float]] = {
    "exp": math.exp,
    "log": math.log,
    "sqrt": math.sqrt,
    "rsqrt": lambda x: 1.0 / math.sqrt(x),
    "tanh": math.tanh,
    "erf": math.erf,
    "sigmoid": lambda x: 1.0 / (1.0 + math.exp(-x)),
    "abs": abs,  # type: ignore[dict-item]
    "floor": math.floor,
    "ceil": math.ceil,
    "round": round,  # type: ignore[dict-item] - ties to even, as C's nearbyint
    "sin": math.sin,
    "cos": math.cos,
}


def evaluate(expr: Expr, env: Mapping[Var, Value]) -> Value:
    """The value of `expr` with each var taking its value from `env`."""
    match expr:
        case IntImm(v, dt):
            return bool(v) if dt == "bool" else v
        case FloatImm(v):
            return v
        case Var():
            return env[expr]
        case Binary("/", a, b):
            return _divide(evaluate(a, env), evaluate(b, env), a.dtype)
        case Binary(op, a, b):
            return _BINARY[op](evaluate(a, env), evaluate(b, env))
        case Unary("-", a):
            return -evaluate(a, env)
        case Unary("!", a):
            return not evaluate(a, env)
        case Select(c, t, f):
            return evaluate(t if evaluate(c, env) else f, env)
        case Cast(dt, v):
            return _cast(dt, evaluate(v, env))
        case Call(name, args):
            value = _CALLS[name](evaluate(args[0], env))
            return float(value) if is_float(expr.dtype) else value
        case BufferLoad():
            raise ValueError(f"cannot evaluate a load of %{expr.buffer.name}")
    raise TypeError(f"not a hextir expression: {type(expr).__name__}")


def _divide(a: Value, b: Value, dtype: str) -> Value:
    if is_int(dtype):
        q = abs(a) // abs(b)  # C integer division truncates toward zero
        return q if (a >= 0) == (b > 0) else -q
    return a / b


def _cast(dtype: str, x: Value) -> Value:
    if dtype == "bool":
        return bool(x)
    if is_int(dtype):
        return wrap_int(int(x), dtype)
    return float(x)


def _is_float(e: Expr, value: float) -> bool:
    return isinstance(e, FloatImm) and e.value == value and math.copysign(1.0, e.value) > 0


def fold_float(op: str, a: Expr, b: Expr) -> Expr:
    """`a op b` on floats, folded where the result is exactly what the kernel would compute."""
    if isinstance(a, FloatImm) and isinstance(b, FloatImm):
        folded = _float_op(op, a.value, b.value, a.dtype)
        if folded is not None:
            return FloatImm(folded, a.dtype)
    # Only identities exact for every x (nan, inf, -0.0): x + 0.0 is not (-0.0 + 0.0 == +0.0).
    if (op in ("*", "/") and _is_float(b, 1.0)) or (op == "-" and _is_float(b, 0.0)):
        return a
    if op == "*" and _is_float(a, 1.0):
        return b
    return Binary(op, a, b)


def _float_op(op: str, x: float, y: float, dtype: str) -> float | None:
    """x op y rounded once in `dtype`, as the compiled kernel would; None where folding could
    disagree with the target (division by zero, nan in min/max, libm's pow)."""
    t = numpy_dtype(dtype).type
    fx, fy = t(x), t(y)
    with np.errstate(all="ignore"):
        match op:
            case "+":
                return float(fx + fy)
            case "-":
                return float(fx - fy)
            case "*":
                return float(fx * fy)
            case "/" if fy != 0:
                return float(fx / fy)
            case "min" | "max" if not (math.isnan(x) or math.isnan(y)):
                return float(min(fx, fy) if op == "min" else max(fx, fy))
    return None


def _fits(value: int, dtype: str) -> bool:
    return value == wrap_int(value, dtype)


def fold_cast(dtype: str, v: Expr) -> Expr:
    """`Cast(dtype, v)`, folded when v is a constant and dropped when v already has dtype."""
    if v.dtype == dtype:
        return v
    match v:
        case IntImm(x) | FloatImm(x) if dtype == "bool":
            return IntImm(int(x != 0), "bool")
        case IntImm(x) if is_int(dtype):
            return IntImm(wrap_int(x, dtype), dtype)
        case IntImm(x) | FloatImm(x) if is_float(dtype):
            return FloatImm(float(numpy_dtype(dtype).type(x)), dtype)
        case FloatImm(x) if is_int(dtype) and math.isfinite(x) and _fits(int(x), dtype):
            return IntImm(int(x), dtype)  # C truncates toward zero, as int() does
    return Cast(dtype, v)
