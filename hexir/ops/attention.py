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
from hexir.ir.tir import Binary, Buffer, Call, Cast, Expr, IntImm, Select, const
from hexir.ops.base import Exporter, OpDef, Pattern, operand_names, unpositional
from hexir.ops.compute import Kernel, add, attr_float, broadcast, clamp, lowest
from hexir.ops.numeric import Attrs, f64, get_float

__all__ = ["ATTENTION", "OPS", "PAGED_ATTENTION", "broadcasts_to", "causal_mask", "paged_keys"]


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


def _positions(op: Op, axes: tuple[int | None, ...]) -> int | None:
    """Positions along the queries (S) stay the result's rows. Keys positioned too (T, the
    same symbol) only under the causal mask, which hides key j from every query before it:
    then a query reads the keys up to its own position, never a later one."""
    q, kt, v, *bias = axes
    if any(b is not None for b in bias):
        raise unpositional(op, "its bias runs along the positions")
    if q not in (None, 1):
        raise unpositional(op, "the positions run along the queries' batch or features")
    if kt is None and v is None:
        return q
    shapes = [x.type.shape for x in op.operands[:3]]
    same = kt == 2 and v == 1 and q == 1 and shapes[0][1] == shapes[1][2] == shapes[2][1]
    if not (same and op.attr("causal")):
        raise unpositional(op, "each query reads every key, and the keys run along the positions")
    return q


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
    positions=_positions,
)

# --- paged_attention: one query per sequence against its keys and values in cache pages -----


def _paged_infer(c: Check) -> TensorType:
    if len(c.types) == 6:
        fail("k_new and v_new come together: the current token's key and value")
    q, kp, vp, table, lengths, *new = c.ranks(3, 4, 4, 2, 1, *(3,) * (len(c.types) - 5))
    floats = (0, 1, 2, *range(5, len(c.types)))
    c.dtype_in("float", *floats)
    c.same_dtype(*floats)
    c.dtype_in("int", 3, 4)
    (b, h, d), (_, _, s, _) = q.shape, kp.shape
    if new and (new[0].shape != q.shape or new[1].shape != (b, h, vp.shape[3])):
        fail(f"k_new {dims(new[0])} and v_new {dims(new[1])} are not [B, H, D] and [B, H, Dv]")
    if kp.shape[1] != h or kp.shape[3] != d:
        fail(f"k_pages {dims(kp)} is not [P, H, S, D] for q {dims(q)} ([B, H, D])")
    if vp.shape[:3] != kp.shape[:3]:
        fail(f"v_pages {dims(vp)} does not have k_pages' pages, heads and page size {dims(kp)}")
    if table.shape[0] != b or lengths.shape[0] != b:
        fail(f"block_table {dims(table)} and lengths {dims(lengths)} need a row per query ({b})")
    if s < 1 or table.shape[1] < 1:
        fail("pages of at least one token and at least one page per sequence")
    c.real("scale", 1.0 / math.sqrt(d))
    return TensorType((b, h, vp.shape[3]), q.dtype)


def paged_keys(pages: np.ndarray, table: np.ndarray, lengths: np.ndarray) -> list[np.ndarray]:
    """Each sequence's first `lengths[b]` tokens read through its row of the block table:
    [H, length, D] per sequence, from pages [P, H, S, D]."""
    s = pages.shape[2]
    out = []
    for row, n in zip(table, lengths, strict=True):
        used = -(-int(n) // s)
        tokens = np.concatenate([pages[int(p)] for p in row[:used]], axis=1) if used else None
        out.append(tokens[:, : int(n)] if tokens is not None else pages[0, :, :0])
    return out


def _paged_evaluate(xs: list[np.ndarray], attrs: Attrs) -> np.ndarray:
    q, kp, vp, table, lengths, *new = xs
    p, _, s, _ = kp.shape
    least = 0 if new else 1
    if np.any(lengths < least) or np.any(lengths > table.shape[1] * s):
        raise ValueError(f"lengths {lengths.tolist()} outside [{least}, {table.shape[1] * s}]")
    if np.any(table < 0) or np.any(table >= p):
        raise ValueError(f"block_table names pages outside [0, {p}): {table.tolist()}")
    scale = get_float(attrs, "scale")
    out = np.empty((q.shape[0], q.shape[1], vp.shape[3]))
    for b, (keys, values) in enumerate(
        zip(paged_keys(kp, table, lengths), paged_keys(vp, table, lengths), strict=True)
    ):
        if new:  # the current token after the cached ones
            keys = np.concatenate([keys, new[0][b][:, None]], axis=1)
            values = np.concatenate([values, new[1][b][:, None]], axis=1)
        scores = np.einsum("hd,htd->ht", f64(q[b]), f64(keys)) * scale
        e = np.exp(scores - scores.max(axis=1, keepdims=True))
        out[b] = np.einsum("ht,hte->he", e / e.sum(axis=1, keepdims=True), f64(values))
    return out.astype(q.dtype)


def _paged_lower(k: Kernel, op: Op, args: tuple[Buffer, ...], out: Buffer) -> None:
    """The attention stages over every slot of every page in the sequence's row of the block
    table (M pages of S slots), a slot at or past the sequence's length hidden as the dtype's
    lowest logit; a page id is clamped into the pool, so no read leaves it."""
    q, kp, vp, table, lengths, *new = args
    (b, h, d), (p, _, s, _), m, dt = q.shape, kp.shape, table.shape[1], out.dtype
    scale = attr_float(op, "scale")

    def page(bi: Expr, mi: Expr) -> Expr:
        return clamp(k, Cast("int32", table[bi, mi]), p)

    def visible(i: tuple[Expr, ...]) -> Expr:  # i = (b, h, m, s)
        slot = add(Binary("*", i[2], IntImm(s)), i[3])
        return Binary("<", slot, Cast("int32", lengths[i[0]]))

    scores = k.alloc("paged_scores", (b, h, m, s), dt)
    k.reduce(
        "paged_scores",
        scores,
        (d,),
        lambda x, r: q[x[0], x[1], r[0]] * kp[page(x[0], x[2]), x[1], x[3], r[0]],
    )

    def logit(i: tuple[Expr, ...]) -> Expr:
        return Select(visible(i), scores[i] * const(scale, dt), lowest(dt))

    mx = k.alloc("paged_max", (b, h), dt)
    k.reduce("paged_max", mx, (m, s), lambda x, r: logit((*x, *r)), "max", lowest(dt))
    if new:  # the current token's logit joins the max
        now = k.alloc("paged_new_score", (b, h), dt)
        k.reduce("paged_new_score", now, (d,), lambda x, r: q[(*x, r[0])] * new[0][(*x, r[0])])
        cached = mx
        mx = k.alloc("paged_max_new", (b, h), dt)
        k.compute(
            "paged_max_new", mx, lambda i: Binary("max", cached[i], now[i] * const(scale, dt))
        )
        e_new = k.alloc("paged_new_exp", (b, h), dt)
        k.compute(
            "paged_new_exp", e_new, lambda i: Call("exp", (now[i] * const(scale, dt) - mx[i],))
        )
    e = k.alloc("paged_exp", (b, h, m, s), dt)
    k.compute("paged_exp", e, lambda i: Call("exp", (logit(i) - mx[i[0], i[1]],)))
    total = k.alloc("paged_sum", (b, h), dt)
    k.reduce("paged_sum", total, (m, s), lambda x, r: e[(*x, *r)])
    acc = k.alloc("paged_values", out.shape, dt)
    k.reduce(
        "paged_values",
        acc,
        (m, s),
        lambda x, r: e[x[0], x[1], r[0], r[1]] * vp[page(x[0], r[0]), x[1], r[1], x[2]],
    )
    if not new:
        k.compute("paged_out", out, lambda i: acc[i] * (const(1, dt) / total[i[0], i[1]]))
        return
    k.compute(
        "paged_out",
        out,
        lambda i: (
            (acc[i] + e_new[i[0], i[1]] * new[1][i])
            * (const(1, dt) / (total[i[0], i[1]] + e_new[i[0], i[1]]))
        ),
    )


def _paged_export(ex: Exporter, op: Op) -> None:
    """Gather each sequence's pages, lay them out [B, H, M*S, D], then attention with the
    slots at or past each length hidden (Where of the scores against a Range)."""
    q, kp, vp, table, lengths, *new = operand_names(op)
    out = op.result.name
    (b, h, d), (_, _, s, dv), m = (
        op.operands[0].type.shape,
        op.operands[1].type.shape,
        op.operands[3].type.shape[1],
    )
    dtype = np.dtype(op.result.type.dtype)
    ex.node("Cast", [table], f"{out}_table", to=7)  # int64
    for name, src, width in (("keys", kp, d), ("values", vp, dv)):
        ex.node("Gather", [src, f"{out}_table"], f"{out}_{name}_pages", axis=0)  # [B,M,H,S,w]
        ex.node("Transpose", [f"{out}_{name}_pages"], f"{out}_{name}_t", perm=[0, 2, 1, 3, 4])
        shape = ex.const(np.array([b, h, m * s, width], np.int64), f"{out}_{name}_shape")
        ex.node("Reshape", [f"{out}_{name}_t", shape], f"{out}_{name}")
    axis2 = ex.const(np.array([2], np.int64), f"{out}_axis2")
    ex.node("Unsqueeze", [q, axis2], f"{out}_q")
    slots = np.arange(m * s, dtype=np.int64)
    if new:  # the current token, always visible: slot -1
        for name, given in (("keys", new[0]), ("values", new[1])):
            ex.node("Unsqueeze", [given, axis2], f"{out}_{name}_new")
            ex.node("Concat", [f"{out}_{name}", f"{out}_{name}_new"], f"{out}_{name}_all", axis=2)
        slots = np.append(slots, -1)
    keys, values = (f"{out}_{n}_all" if new else f"{out}_{n}" for n in ("keys", "values"))
    ex.node("Transpose", [keys], f"{out}_kt", perm=[0, 1, 3, 2])
    ex.node("MatMul", [f"{out}_q", f"{out}_kt"], f"{out}_scores")  # [B, H, 1, M*S]
    scale = ex.const(np.array(attr_float(op, "scale"), dtype), f"{out}_scale")
    ex.node("Mul", [f"{out}_scores", scale], f"{out}_logits")
    slots = ex.const(slots, f"{out}_slots")
    ex.node("Cast", [lengths], f"{out}_lengths64", to=7)
    shape4 = ex.const(np.array([b, 1, 1, 1], np.int64), f"{out}_lengths_shape")
    ex.node("Reshape", [f"{out}_lengths64", shape4], f"{out}_lengths4")
    ex.node("Less", [slots, f"{out}_lengths4"], f"{out}_visible")  # [B, 1, 1, M*S]
    hidden = ex.const(np.array(-np.inf, dtype), f"{out}_hidden")
    ex.node("Where", [f"{out}_visible", f"{out}_logits", hidden], f"{out}_masked")
    ex.node("Softmax", [f"{out}_masked"], f"{out}_probs", axis=-1)
    ex.node("MatMul", [f"{out}_probs", values], f"{out}_out4")  # [B, H, 1, Dv]
    ex.node("Squeeze", [f"{out}_out4", axis2], out)


def _paged_flops(op: Op) -> int:
    (b, h, d), (_, _, s, dv), m = (
        op.operands[0].type.shape,
        op.operands[2].type.shape,
        op.operands[3].type.shape[1],
    )
    return 2 * b * h * m * s * (d + dv) + 5 * b * h * m * s


PAGED_ATTENTION = OpDef(
    "paged_attention",
    "one query per sequence against its cached keys and values in pages: q[B,H,D], "
    "k_pages[P,H,S,D], v_pages[P,H,S,Dv], block_table[B,M] (int: the pages of each sequence "
    "in order), lengths[B] (int: its cached tokens, 1..M*S), and optionally the current "
    "token's k_new[B,H,D] and v_new[B,H,Dv], attended after the cached ones (lengths may then "
    "be 0) -> [B,H,Dv]",
    ("q", "k_pages", "v_pages", "block_table", "lengths", "k_new", "v_new"),
    ("scale",),
    infer=_paged_infer,
    fusion=Pattern.REDUCTION,
    evaluate=_paged_evaluate,
    lower=_paged_lower,
    export=_paged_export,
    flops=_paged_flops,
    optional=2,
)

OPS = (ATTENTION, PAGED_ATTENTION)
