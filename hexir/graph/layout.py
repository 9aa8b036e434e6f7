"""Constant weights laid out at compile time: `layout_weights(graph)`.

    %w = hexir.constant @w : tensor<3072x768xf32>          %w_t = hexir.constant @w_t
    %0 = hexir.dense %x, %w : tensor<128x3072xf32>   ->    %0 = hexir.matmul %x, %w_t

A kernel's default schedule and the CPU sketch vectorize a contraction along its output's
columns and copy the operand they read along them into panels per parallel job; an operand
read across the vector loop (dense's w[N, K] under a loop over N) is copied transposed, a
strided gather on every call. Where that operand is a constant, this pass transposes it once,
here: dense with a constant weight becomes a matmul of the transposed constant, whose panels
are contiguous rows. The result keeps its value (and name), so users, graph outputs and
fusion are as before; the rewrite is exact (the same products summed in the same order).

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

__all__ = ["layout_weights"]


def layout_weights(graph: Graph) -> Graph:
    """`graph` with every dense of a constant weight as a matmul of its transpose (see the
    module docstring); `graph` itself when the `pack_weights` knob is off."""
    if not knobs.get().pack_weights:
        return graph
    p = RewritePass(graph)
    ops: list[Op] = []
    for op in graph.ops:
        ops.extend(_transposed_dense(op, p) or [op])
    return remove_dead_ops(p.finish(ops))


def _transposed_dense(op: Op, p: RewritePass) -> list[Op] | None:
    if op.kind != "dense" or op.operands[1].name not in p.data:
        return None
    x, w = op.operands
    weight = np.ascontiguousarray(p.data[w.name].T)
    new_w = p.constant(f"{w.name}_t", weight, op.placement)
    matmul = make_op("matmul", [x, new_w.result], {}, op.result.name, op.placement)
    return [new_w, matmul]
