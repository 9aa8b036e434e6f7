"""Converters of ONNX's activations that are compositions of Hexir's elementwise ops, exact as
written (ONNX's reference evaluates the same formulas): LeakyRelu, PRelu, Elu, Selu, Celu,
HardSigmoid, HardSwish, Softplus, Mish and Swish.
"""

from __future__ import annotations

from collections.abc import Sequence

from hexir.frontend.onnx_context import Context
from hexir.frontend.onnx_ops import Spec
from hexir.ir.graph import Value


def _negative_part(ctx: Context, x: Value, negative: Value) -> Value:
    """`x` where x >= 0, `negative` elsewhere."""
    return ctx.op("where", ctx.op("greater_equal", x, ctx.scalar(0, x)), x, negative)


def _scaled(ctx: Context, x: Value, a: float, b: float = 0.0) -> Value:
    out = ctx.op("mul", x, ctx.scalar(a, x))
    return out if b == 0 else ctx.op("add", out, ctx.scalar(b, x))


def _expm1_scaled(ctx: Context, x: Value, alpha: float) -> Value:
    """alpha * (exp(x) - 1), Elu's and Selu's negative side."""
    return _scaled(ctx, ctx.op("sub", ctx.op("exp", x), ctx.scalar(1, x)), alpha)


def _swish(ctx: Context) -> Sequence[Value]:
    """x * sigmoid(alpha * x)."""
    x = ctx.input(0)
    alpha = ctx.float_attr("alpha", 1.0)
    inner = x if alpha == 1.0 else _scaled(ctx, x, alpha)
    return [ctx.op("mul", x, ctx.op("sigmoid", inner))]


def _leaky_relu(ctx: Context) -> Sequence[Value]:
    x = ctx.input(0)
    return [_negative_part(ctx, x, _scaled(ctx, x, ctx.float_attr("alpha", 0.01)))]


def _prelu(ctx: Context) -> Sequence[Value]:
    x = ctx.input(0)
    return [_negative_part(ctx, x, ctx.op("mul", x, ctx.input(1)))]


def _elu(ctx: Context) -> Sequence[Value]:
    x = ctx.input(0)
    return [_positive_or(ctx, x, _expm1_scaled(ctx, x, ctx.float_attr("alpha", 1.0)))]


def _selu(ctx: Context) -> Sequence[Value]:
    x = ctx.input(0)
    alpha = ctx.float_attr("alpha", 1.6732632423543772)
    inner = _positive_or(ctx, x, _expm1_scaled(ctx, x, alpha))
    return [_scaled(ctx, inner, ctx.float_attr("gamma", 1.0507009873554805))]


def _positive_or(ctx: Context, x: Value, other: Value) -> Value:
    """`x` where x > 0, `other` elsewhere (Elu, Selu: zero takes the other side)."""
    return ctx.op("where", ctx.op("greater", x, ctx.scalar(0, x)), x, other)


def _hard_sigmoid_of(ctx: Context, x: Value, alpha: float, beta: float) -> Value:
    line = _scaled(ctx, x, alpha, beta)
    return ctx.op("maximum", ctx.op("minimum", line, ctx.scalar(1, x)), ctx.scalar(0, x))


def _hard_sigmoid(ctx: Context) -> Sequence[Value]:
    alpha, beta = ctx.float_attr("alpha", 0.2), ctx.float_attr("beta", 0.5)
    return [_hard_sigmoid_of(ctx, ctx.input(0), alpha, beta)]


def _hard_swish(ctx: Context) -> Sequence[Value]:
    x = ctx.input(0)
    return [ctx.op("mul", x, _hard_sigmoid_of(ctx, x, 1 / 6, 0.5))]


def _softplus_of(ctx: Context, x: Value) -> Value:
    return ctx.op("log", ctx.op("add", ctx.op("exp", x), ctx.scalar(1, x)))


def _mish(ctx: Context) -> Sequence[Value]:
    x = ctx.input(0)
    return [ctx.op("mul", x, ctx.op("tanh", _softplus_of(ctx, x)))]


def _celu(ctx: Context) -> Sequence[Value]:
    """max(0, x) + min(0, alpha * (exp(x / alpha) - 1))."""
    x = ctx.input(0)
    alpha = ctx.float_attr("alpha", 1.0)
    negative = _expm1_scaled(ctx, _scaled(ctx, x, 1.0 / alpha), alpha)
    zero = ctx.scalar(0, x)
    return [ctx.op("add", ctx.op("maximum", x, zero), ctx.op("minimum", negative, zero))]


ACTIVATION_SPECS: dict[str, Spec] = {
    "LeakyRelu": Spec(_leaky_relu, {"alpha": None}),
    "PRelu": Spec(_prelu),
    "Elu": Spec(_elu, {"alpha": None}),
    "Selu": Spec(_selu, {"alpha": None, "gamma": None}),
    "HardSigmoid": Spec(_hard_sigmoid, {"alpha": None, "beta": None}),
    "HardSwish": Spec(_hard_swish),
    "Softplus": Spec(lambda ctx: [_softplus_of(ctx, ctx.input(0))]),
    "Mish": Spec(_mish),
    "Swish": Spec(_swish, {"alpha": None}),
    "Celu": Spec(_celu, {"alpha": None}),
}
