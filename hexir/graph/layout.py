"""Constant weights laid out at compile time: `layout_weights(graph, target)`.

    %w = hexir.constant @w : tensor<3072x768xf32>          %w_t = hexir.constant @w_t
    %0 = hexir.dense %x, %w : tensor<128x3072xf32>   ->    %0 = hexir.matmul %x, %w_t

    %w = hexir.constant @w : tensor<512x512x3x3xf32>       %w_8k = hexir.constant @w_8k
    %1 = hexir.conv2d %y, %w {...}                   ->    %1 = hexir.conv2d %y, %w_8k
                                                               {..., weight_block = 8}

A kernel's default schedule and the CPU sketch vectorize a contraction along its output's
columns and copy the operand they read along them into panels per parallel job; an operand
read across the vector loop (dense's w[N, K] under a loop over N) is copied transposed, a
strided gather on every call. Where that operand is a constant, this pass lays it out once,
here, as the kernel reads it:
- dense with a constant weight becomes a matmul of the transposed constant, whose panels are
  contiguous rows;
- on the CPU, a conv2d with a window (3x3, 7x7) and a constant weight takes it in panels of
  the vector width (`weight_block`, [K/b, C, R, S, b]: one vector of filters per input pixel,
  the panel of one register tile contiguous), so its kernel reads the weight in place and
  packs nothing (512x512x3x3 on 7x7: the per-call copy of the 9.4 MB weight was 20-40% of the
  kernel). A 1x1 conv keeps KCRS: its register tile is two vectors wide, and its small
  weight's copy costs little.
The result keeps its value (and name), so users, graph outputs and fusion are as before; the
rewrites are exact (the same products summed in the same order).

It runs after `simplify_graph` (so batch norms are already folded into the weights) wherever
a model becomes kernels (`hexir.graph.fusion.fused_kernels`: compile, tune and show agree on
the workloads); the `pack_weights` knob (HEXIR_PACK_WEIGHTS=0) keeps the weights as they are,
for comparison.
"""

from __future__ import annotations

import numpy as np

from hexir import knobs
from hexir.graph.rewrite import RewritePass, remove_dead_ops
from hexir.ir.graph import Graph, Op
from hexir.ops import make_op
from hexir.ops.nn import block_conv_weight
from hexir.runtime.target import Target

__all__ = ["layout_weights"]


def layout_weights(graph: Graph, target: Target | None = None) -> Graph:
    """`graph` with every dense of a constant weight as a matmul of its transpose and, for a
    CPU target, every windowed conv2d of a constant weight with it in panels of the vector
    width (see the module docstring); `graph` itself when the `pack_weights` knob is off."""
    if not knobs.get().pack_weights:
        return graph
    target = target if target is not None else Target("cpu")
    p = RewritePass(graph)
    ops: list[Op] = []
    for op in graph.ops:
        rewritten = _transposed_dense(op, p)
        if rewritten is None and target.kind == "cpu":
            rewritten = _blocked_conv(op, p, target.vector_width)
        ops.extend(rewritten or [op])
    return remove_dead_ops(p.finish(ops))


def _transposed_dense(op: Op, p: RewritePass) -> list[Op] | None:
    if op.kind != "dense" or op.operands[1].name not in p.data:
        return None
    x, w = op.operands
    weight = np.ascontiguousarray(p.data[w.name].T)
    new_w = p.constant(f"{w.name}_t", weight, op.placement)
    matmul = make_op("matmul", [x, new_w.result], {}, op.result.name, op.placement)
    return [new_w, matmul]


def _blocked_conv(op: Op, p: RewritePass, block: int) -> list[Op] | None:
    if op.kind != "conv2d" or op.operands[1].name not in p.data or op.attr("weight_block"):
        return None
    x, w = op.operands
    k, _, r, s = w.type.shape
    if r * s == 1 or k % block or op.attr("groups") != 1:
        return None
    weight = block_conv_weight(p.data[w.name], block)
    new_w = p.constant(f"{w.name}_{block}k", weight, op.placement)
    attrs = {**dict(op.attrs), "weight_block": block}
    conv = make_op("conv2d", [x, new_w.result], attrs, op.result.name, op.placement)
    return [new_w, conv]
