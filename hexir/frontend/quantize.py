"""`quantize`: a float32 model's linear layers as 8-bit integer (or bfloat16) products.

Every `matmul` or `dense` of a float32 activation by a constant 2-D float32 weight becomes

    y = float32(integer_matmul(xq, wq, x_zero, 0)) * (x_scale * w_scale)

- the weight: int8, symmetric, one scale per output column (`w_scale[n] = max|W[:, n]| /
  127`, `wq = round(W / w_scale)`), computed here, once: a quarter of the float32 bytes;
- with `weights="bfloat16"` instead, y = x @ W with both in bfloat16 (the activation cast at
  every run, the weight once; AVX512_BF16's vdpbf16ps where the CPU has it): half the bytes,
  no scales, 8 significant bits;
- with `weights="int4"` instead, weight-only: y = matmul_int4(x, wq, w_scale) with the
  activation as it is, the weight int4 (symmetric, one scale per INT4_GROUP rows of a column,
  `w_scale = max|W[group, n]| / 7`, `wq = round(W / w_scale)` in -7..7), packed two rows a
  byte (hexir/ops/contraction.py): an eighth of the float32 bytes and 1/INT4_GROUP of them
  again in scales. A decode step's GEMV reads it so (2.6x faster than float32 at 768 x
  3072); more rows compute with the weight dequantized at compile time (graph/layout.py).
  A layer whose K the group does not divide stays float32;
- the activation: uint8 with a scale and zero point over [min(x, 0), max(x, 0)], either
  computed by the model at every run from the values it meets (`activations="dynamic"`, ONNX's
  DynamicQuantizeLinear: no data needed) or fixed from calibration inputs (`activations=
  "static"`: the same rule over every value the calibration runs give that layer).

The integer product is the ONNX front end's (`onnx_ops_quant.integer_matmul`): a uint8 x
int8 matmul, on VNNI where the CPU has it (`vpdpbusd`), its zero point applied after. The rest
of the graph is copied as it is. `quantization_error` measures the result against the float32
model on inputs it was not calibrated on.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from hexir.errors import HexirError
from hexir.frontend.onnx_context import Context
from hexir.frontend.onnx_ops import cast
from hexir.frontend.onnx_ops_quant import dynamic_quantize, integer_matmul, quantize_linear
from hexir.graph.evaluate import evaluate
from hexir.graph.rewrite import RewritePass, remove_dead_ops
from hexir.ir.dtype import numpy_dtype
from hexir.ir.graph import Graph, Op, Value
from hexir.ops.builder import GraphBuilder
from hexir.ops.contraction import int4_weight, pack_int4

WEIGHTS = ("int8", "int4", "bfloat16")
# Rows of a column that share an int4 weight scale (as llama.cpp's Q4_0 and ONNX Runtime's
# MatMulNBits default): 1/32 more bytes of scales, a bit a weight, for 2-3x smaller errors than
# one scale a column.
INT4_GROUP = 32
ACTIVATIONS = ("dynamic", "static")
# The narrowest layer worth quantizing: below this many weights the extra kernels of the
# activation's quantization cost more than the product saves.
MIN_WEIGHTS = 4096


@dataclass(frozen=True)
class Layer:
    """One linear layer `quantize` rewrote: its op's result name, its weight's shape [K, N],
    and the largest relative error of its int8 weight (|wq * scale - W| / max|W|)."""

    name: str
    shape: tuple[int, int]
    weight_error: float


def quantize(
    graph: Graph,
    weights: str = "int8",
    activations: str = "dynamic",
    calibration: Sequence[Sequence[np.ndarray]] = (),
) -> tuple[Graph, list[Layer]]:
    """`graph` with its float32 linear layers of constant weights in 8-bit integers (see the
    module's docstring), and the layers it rewrote. `calibration`: input sets (each a list of
    arrays in the graph's input order), needed by `activations="static"`."""
    weights = {"bf16": "bfloat16"}.get(weights, weights)
    if weights not in WEIGHTS:
        raise HexirError(
            f"quantizing weights to {weights!r}: Hexir quantizes weights to {', '.join(WEIGHTS)}"
        )
    if weights == "bfloat16" and activations != "dynamic":
        raise HexirError(
            "bfloat16 weights take bfloat16 activations, cast at every run: no calibration"
        )
    if weights == "int4" and activations != "dynamic":
        raise HexirError(
            "int4 weights are weight-only: the activations stay float32, no calibration"
        )
    if activations not in ACTIVATIONS:
        raise HexirError(
            f"activations {activations!r}: one of {', '.join(ACTIVATIONS)} (dynamic: quantized "
            "at every run from their own range; static: from calibration inputs)"
        )
    p = RewritePass(graph)  # its constants' data, by value
    layers = [op for op in graph.ops if _quantizable(p, op, weights)]
    rewrite = {op.result.name for op in layers}
    ranges = {}
    if activations == "static":
        if not calibration:
            raise HexirError(
                "static activation quantization needs calibration inputs (input sets that "
                "look like the model's real inputs); or quantize them dynamically"
            )
        ranges = _calibrated_ranges(graph, [op.operands[0] for op in layers], calibration)
    builder = GraphBuilder(graph.name)
    builder.reserve([op.result.name for op in graph.ops] + [k for k, _ in graph.constants])
    ctx = Context(builder, {}, opset=21)
    env: dict[str, Value] = {
        v.name: builder.input(v.name, v.type.shape, v.type.dtype) for v in graph.inputs
    }
    rewritten: list[Layer] = []
    for op in graph.ops:  # every value keeps its name; the new ones get fresh names
        name = op.result.name
        if name in rewrite:
            x, w = env[op.operands[0].name], p.data[op.operands[1].name]
            w = w.T if op.kind == "dense" else w  # [N, K] -> [K, N]
            if weights == "bfloat16":
                value, error = _bfloat16_layer(ctx, x, w, name)
            elif weights == "int4":
                value, error = _int4_layer(ctx, x, w, name)
            else:
                value, error = _integer_layer(ctx, x, w, ranges.get(op.operands[0].name), name)
            rewritten.append(Layer(name, w.shape, error))
        elif op.kind == "constant":
            value = builder.constant(p.data[name], name=name)
        else:
            operands = [env[v.name] for v in op.operands]
            value = builder.op(op.kind, *operands, name=name, **dict(op.attrs))
        env[name] = value
    # The float32 weights the integer layers replaced are dead: no file or module keeps them.
    return remove_dead_ops(builder.build([env[v.name] for v in graph.outputs])), rewritten


def _quantizable(p: RewritePass, op: Op, weights: str) -> bool:
    if op.kind not in ("matmul", "dense") or len(op.operands) != 2 or op.attrs:
        return False
    x, w = op.operands
    k = w.type.shape[-1 if op.kind == "dense" else 0]
    if weights == "int4" and k % INT4_GROUP:
        return False
    return (
        w.name in p.data  # a constant's
        and x.type.dtype == w.type.dtype == "float32"
        and len(w.type.shape) == 2
        and len(x.type.shape) == 2
        and w.type.size >= MIN_WEIGHTS
    )


def _integer_layer(
    ctx: Context, x: Value, w: np.ndarray, x_range: tuple[float, float] | None, name: str
) -> tuple[Value, float]:
    """x @ w through int8 weights and a uint8 activation, named `name`, and the weight's
    largest relative rounding error."""
    top = np.abs(w).max(axis=0)
    w_scale = np.where(top > 0, top / 127, 1).astype(np.float32)
    wq = np.clip(np.rint(w / w_scale), -127, 127).astype(np.int8)
    error = float(np.abs(wq * w_scale - w).max() / max(float(np.abs(w).max()), 1e-30))
    if x_range is None:
        xq, x_scale, x_zero = dynamic_quantize(ctx, x)
    else:
        scale, zero = _uint8_grid(*x_range)
        x_scale, x_zero = ctx.constant(np.float32(scale)), ctx.constant(np.uint8(zero))
        xq = quantize_linear(ctx, x, x_scale, x_zero, "uint8")
    acc = integer_matmul(ctx, xq, ctx.constant(wq), x_zero, None)
    scale = ctx.op("mul", x_scale, ctx.constant(w_scale))
    return ctx.builder.op("mul", cast(ctx, acc, "float32"), scale, name=name), error


def _int4_layer(ctx: Context, x: Value, w: np.ndarray, name: str) -> tuple[Value, float]:
    """x @ w through int4 weights in groups of INT4_GROUP rows (matmul_int4), named `name`,
    and the weight's largest relative rounding error."""
    k, n = w.shape
    groups = np.abs(w).reshape(k // INT4_GROUP, INT4_GROUP, n).max(axis=1)
    w_scale = np.where(groups > 0, groups / 7, 1).astype(np.float32)
    wq = np.clip(np.rint(w / np.repeat(w_scale, INT4_GROUP, axis=0)), -7, 7).astype(np.int8)
    packed = pack_int4(wq)
    deq = int4_weight(packed, w_scale, INT4_GROUP)
    error = float(np.abs(deq - w).max() / max(float(np.abs(w).max()), 1e-30))
    weight, scale = ctx.constant(packed), ctx.constant(w_scale)
    return ctx.builder.op("matmul_int4", x, weight, scale, group=INT4_GROUP, name=name), error


def _bfloat16_layer(ctx: Context, x: Value, w: np.ndarray, name: str) -> tuple[Value, float]:
    """x @ w with both rounded to bfloat16 (into float32), named `name`, and the weight's
    largest relative rounding error."""
    wb = w.astype(numpy_dtype("bfloat16"))
    error = float(np.abs(wb.astype(np.float32) - w).max() / max(float(np.abs(w).max()), 1e-30))
    xb = cast(ctx, x, "bfloat16")
    return ctx.builder.op("matmul", xb, ctx.constant(wb), name=name), error


def _uint8_grid(low: float, high: float) -> tuple[float, int]:
    """DynamicQuantizeLinear's scale and zero point for a fixed range [low, high]."""
    low, high = min(low, 0.0), max(high, 0.0)
    span = np.float32(high - low) or np.float32(1)
    scale = np.float32(span / np.float32(255))
    return float(scale), int(np.rint(np.clip(np.float32(-low) / scale, 0, 255)))


def _calibrated_ranges(
    graph: Graph, values: list[Value], calibration: Sequence[Sequence[np.ndarray]]
) -> dict[str, tuple[float, float]]:
    """The smallest and largest element each of `values` takes over the calibration runs."""
    probe = replace(graph, outputs=tuple(values))
    ranges: dict[str, tuple[float, float]] = {}
    for inputs in calibration:
        for v, array in zip(values, evaluate(probe, list(inputs)), strict=True):
            low, high = ranges.get(v.name, (np.inf, -np.inf))
            ranges[v.name] = (min(low, float(array.min())), max(high, float(array.max())))
    return ranges


def quantization_error(graph: Graph, quantized: Graph, inputs: Sequence[np.ndarray]) -> list[float]:
    """Per output: the largest |quantized - float32| relative to the largest |float32|, on
    `inputs` (the reference evaluator's values of both graphs)."""
    want, got = evaluate(graph, list(inputs)), evaluate(quantized, list(inputs))
    return [
        float(np.abs(g.astype(np.float64) - w).max(initial=0.0))
        / max(float(np.abs(w).max(initial=0.0)), 1e-30)
        for g, w in zip(got, want, strict=True)
    ]
