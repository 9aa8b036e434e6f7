"""attention: softmax(q·kᵀ·scale + bias, causal) · v as one op, and so one kernel that never
writes the scores of all queries against all keys: its default CPU schedule computes them per
tile of query rows, where they stay in cache (hexir/schedule/attention.py).

    %o = hexir.attention %q, %kt, %v {causal = true, scale = 0.125} : tensor<12x128x64xf32>

q is [B, S, D] (B: batch times heads), kt the keys transposed, [B, D, T], as the scores'
product reads them, v [B, T, Dv]; an optional fourth operand, bias, is added to the scaled
scores and broadcasts to [B, S, T] (a padding mask). `causal` hides key j from query i where
j > i + T - S (the last query sees every key: a decode step's query after T - 1 cached keys),
so T >= S. The CPU layout pass makes this op of batch_matmul -> (mul by a scalar) ->
(add) -> softmax -> batch_matmul (hexir/graph/attention.py); builders may write it directly.
Its numpy semantics compute in float64.
"""

from __future__ import annotations

import math

import numpy as np

from hexir.ir.graph import Op, TensorType
from hexir.ir.op_attrs import Check, dims, fail
from hexir.ir.tir import Binary, Buffer, Call, Expr, Select, const
from hexir.ops.base import Exporter, OpDef, Pattern, operand_names
from hexir.ops.compute import Kernel, add, attr_float, broadcast, lowest
from hexir.ops.numeric import Attrs, f64, get_float

__all__ = ["ATTENTION", "OPS", "broadcasts_to", "causal_mask"]


def causal_mask(s: int, t: int) -> np.ndarray:
    """[S, T] booleans: where query i may see key j (j <= i + T - S)."""
    return np.arange(t)[None, :] <= np.arange(s)[:, None] + (t - s)


def _infer(c: Check) -> TensorType:
    q, kt, v, *bias = c.ranks(3, 3, 3, *(len(t.shape) for t in c.types[3:]))
    c.dtype_in("float")
    c.same_dtype()
    (b, s, d), t = q.shape, kt.shape[2]
    if kt.shape[:2] != (b, d) or v.shape[:2] != (b, t):
        fail(f"q {dims(q)}, kt {dims(kt)} and v {dims(v)} are not [B,S,D], [B,D,T], [B,T,Dv]")
    if bias and not broadcasts_to(bias[0].shape, (b, s, t)):
        fail(f"bias {dims(bias[0])} does not broadcast to the scores [{b}, {s}, {t}]")
    if c.flag("causal", False) and t < s:
        fail(f"causal attention needs at least as many keys as queries: {t} keys, {s} queries")
    c.real("scale", 1.0 / math.sqrt(d))
    return TensorType((b, s, v.shape[2]), q.dtype)


def broadcasts_to(shape: tuple[int, ...], to: tuple[int, ...]) -> bool:
    """Whether numpy broadcasts an array of `shape` to `to` (a bias to the scores)."""
    return len(shape) <= len(to) and all(
        x in (1, y) for x, y in zip(reversed(shape), reversed(to), strict=False)
    )


def _evaluate(xs: list[np.ndarray], attrs: Attrs) -> np.ndarray:
    q, kt, v = map(f64, xs[:3])
    scores = (q @ kt) * get_float(attrs, "scale")
    if len(xs) == 4:
        scores = scores + f64(xs[3])
    if dict(attrs).get("causal", False):
        scores = np.where(causal_mask(*scores.shape[1:]), scores, -np.inf)
    e = np.exp(scores - scores.max(axis=2, keepdims=True))
    return ((e / e.sum(axis=2, keepdims=True)) @ v).astype(xs[0].dtype)


def _lower(k: Kernel, op: Op, args: tuple[Buffer, ...], out: Buffer) -> None:
    """Scores (a contraction over D), their row max, exp, row sum, the probabilities times v
    (a contraction over T) and the division by the sum: the stages the schedule computes per
    tile of query rows. A hidden key's logit is the dtype's lowest, whose exp is 0."""
    q, kt, v = args[:3]
    bias = args[3] if len(args) == 4 else None
    (b, s, d), t, dt = q.shape, kt.shape[2], out.dtype
    scale, causal = attr_float(op, "scale"), bool(op.attr("causal", False))
    scores = k.alloc("attention_scores", (b, s, t), dt)
    k.reduce(
        "attention_scores", scores, (d,), lambda x, r: q[x[0], x[1], r[0]] * kt[x[0], r[0], x[2]]
    )

    def logit(i: tuple[Expr, ...]) -> Expr:
        z: Expr = scores[i] * const(scale, dt)
        if bias is not None:
            z = z + broadcast(bias, i, (b, s, t))
        if causal:
            visible = Binary("<=", i[2], add(i[1], t - s))
            z = Select(visible, z, lowest(dt))
        return z

    mx = k.alloc("attention_max", (b, s), dt)
    k.reduce("attention_max", mx, (t,), lambda x, r: logit((*x, r[0])), "max", lowest(dt))
    e = k.alloc("attention_exp", (b, s, t), dt)
    k.compute("attention_exp", e, lambda i: Call("exp", (logit(i) - mx[i[0], i[1]],)))
    total = k.alloc("attention_sum", (b, s), dt)
    k.reduce("attention_sum", total, (t,), lambda x, r: e[x[0], x[1], r[0]])
    acc = k.alloc("attention_values", out.shape, dt)
    k.reduce("attention_values", acc, (t,), lambda x, r: e[x[0], x[1], r[0]] * v[x[0], r[0], x[2]])
    k.compute("attention_out", out, lambda i: acc[i] * (const(1, dt) / total[i[0], i[1]]))


def _export(ex: Exporter, op: Op) -> None:
    """MatMul, Mul by the scale, Add of the bias (and of the causal mask's -inf), Softmax,
    MatMul: opset 17 has no Attention."""
    names = operand_names(op)
    out = op.result.name
    s, t = op.operands[0].type.shape[1], op.operands[1].type.shape[2]
    dtype = np.dtype(op.result.type.dtype)
    ex.node("MatMul", names[:2], f"{out}_scores")
    scale = ex.const(np.array(attr_float(op, "scale"), dtype), f"{out}_scale")
    logits = f"{out}_logits"
    ex.node("Mul", [f"{out}_scores", scale], logits)
    if len(names) == 4:
        ex.node("Add", [logits, names[3]], f"{out}_biased")
        logits = f"{out}_biased"
    if op.attr("causal", False):
        hidden = np.where(causal_mask(s, t), 0, -np.inf).astype(dtype)
        ex.node("Add", [logits, ex.const(hidden, f"{out}_causal")], f"{out}_masked")
        logits = f"{out}_masked"
    ex.node("Softmax", [logits], f"{out}_probs", axis=-1)
    ex.node("MatMul", [f"{out}_probs", names[2]], out)


def _flops(op: Op) -> int:
    (b, s, d), t, dv = (
        op.operands[0].type.shape,
        op.operands[1].type.shape[2],
        op.result.type.shape[2],
    )
    return 2 * b * s * t * (d + dv) + 5 * b * s * t


ATTENTION = OpDef(
    "attention",
    "softmax(q·kt·scale + bias, causal) · v per batch: q[B,S,D], kt[B,D,T], v[B,T,Dv], bias "
    "(optional) broadcast to [B,S,T]; causal hides key j from query i where j > i + T - S",
    ("q", "kt", "v", "bias"),
    ("scale", "causal"),
    infer=_infer,
    fusion=Pattern.REDUCTION,
    evaluate=_evaluate,
    lower=_lower,
    export=_export,
    flops=_flops,
    optional=1,
)

OPS = (ATTENTION,)
