"""Converters of opset 23's Attention and RotaryEmbedding, compositions of Hexir's own ops that
compute what the ONNX spec writes, in its order: attention as two batch_matmuls around a
softmax (grouped-query heads by folding each group of query heads into one batch, not by
repeating the keys), the mask and causal bias added to the scores; rotary embedding as slices
of the head, products with the cosines and sines (gathered by position where position_ids are
given) and a concat.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence

import numpy as np

from hexir.frontend.onnx_context import Context, Unsupported, hexir_dtype
from hexir.frontend.onnx_ops import Spec, as_operands, cast, reshape
from hexir.ir.dtype import numpy_dtype
from hexir.ir.graph import Value

# --- Attention --------------------------------------------------------------------------------


def _attention(ctx: Context) -> Sequence[Value]:
    """Y = softmax(softcap(Q·√scale · (K·√scale)ᵀ) + bias) · V, per head; K and V after their
    past (present_key and present_value: the concatenation along the sequence). A query row
    whose bias is -inf everywhere gives zeros (the spec's errata), not NaN."""
    q_in = ctx.input(0)
    q = _heads(ctx, q_in, "q_num_heads", "Q")
    k = _heads(ctx, ctx.input(1), "kv_num_heads", "K")
    v = _heads(ctx, ctx.input(2), "kv_num_heads", "V")
    k, v, past = _with_past(ctx, k, v)
    nonpad = ctx.optional(6)
    if nonpad is not None and past:
        raise Unsupported("nonpad_kv_seqlen with past_key and past_value (the spec forbids it)")
    (b, heads, s, d), (kv_heads, total) = q.type.shape, k.type.shape[1:3]
    if k.type.shape[0] != b or k.type.shape[3] != d or v.type.shape[:3] != k.type.shape[:3]:
        raise Unsupported(f"Attention of Q {q.type!r}, K {k.type!r} and V {v.type!r}")
    if heads % kv_heads:
        raise Unsupported(f"Attention of {heads} query heads over {kv_heads} key/value heads")
    scale = ctx.attr("scale")
    root = ctx.scalar(float(np.sqrt(1 / math.sqrt(d) if scale is None else float(scale))), q)
    qk = _grouped_matmul(
        ctx,
        ctx.op("mul", q, root),
        ctx.op("transpose", ctx.op("mul", k, root), perm=(0, 1, 3, 2)),
        (b, heads, s, total),
    )
    capped = _softcap(ctx, qk)
    bias = _bias(ctx, q, total, past, nonpad)
    logits = capped if bias is None else ctx.op("add", capped, bias)
    if logits.type.shape != qk.type.shape:
        raise Unsupported(f"attn_mask {ctx.input(3).type!r} against scores {qk.type!r}")
    probs = _softmax(ctx, logits, bias)
    y = _grouped_matmul(ctx, probs, v, (b, heads, s, v.type.shape[3]))
    if len(q_in.type.shape) == 3:
        y = reshape(ctx, ctx.op("transpose", y, perm=(0, 2, 1, 3)), (b, s, heads * y.type.shape[3]))
    outputs = [y, k, v]
    if len(ctx.current.outputs) > 3 and ctx.current.outputs[3]:
        mode = int(ctx.attr("qk_matmul_output_mode", 0))
        outputs.append((qk, capped, logits, probs)[mode])
    return outputs


def _heads(ctx: Context, x: Value, attr: str, what: str) -> Value:
    """Q, K or V as [batch, heads, sequence, head size]: a 3-D one [batch, sequence, hidden]
    split into the heads its attribute counts."""
    shape = x.type.shape
    given = ctx.attr(attr)
    if len(shape) == 4:
        if given is not None and int(given) != shape[1]:
            raise Unsupported(f"{attr}={given} for a 4-D {what} of {shape[1]} heads")
        return x
    if len(shape) != 3:
        raise Unsupported(f"Attention of a {len(shape)}-D {what}: 3-D or 4-D only")
    if given is None or int(given) < 1 or shape[2] % int(given):
        raise Unsupported(f"a 3-D {what} {x.type!r} needs {attr} dividing its last axis")
    n = int(given)
    split = reshape(ctx, x, (shape[0], shape[1], n, shape[2] // n))
    return ctx.op("transpose", split, perm=(0, 2, 1, 3))


def _with_past(ctx: Context, k: Value, v: Value) -> tuple[Value, Value, int]:
    """K and V after past_key and past_value (both or neither), and the past's length."""
    past_k, past_v = ctx.optional(4), ctx.optional(5)
    if (past_k is None) != (past_v is None):
        raise Unsupported("past_key and past_value must be given together")
    if past_k is None or past_v is None:
        return k, v, 0
    return (
        ctx.op("concat", past_k, k, axis=2),
        ctx.op("concat", past_v, v, axis=2),
        past_k.type.shape[2],
    )


def _grouped_matmul(ctx: Context, a: Value, b: Value, shape: tuple[int, ...]) -> Value:
    """a [B, H, M, K] times b [B, G, K, N] per head, G dividing H, query head h with key head
    h // (H / G) as ONNX repeats them: the H / G heads of a group are one batch's rows."""
    batch, groups = b.type.shape[:2]
    rows = a.type.size // (batch * groups * a.type.shape[3])
    left = reshape(ctx, a, (batch * groups, rows, a.type.shape[3]))
    right = reshape(ctx, b, (batch * groups, *b.type.shape[2:]))
    return reshape(ctx, as_operands(ctx, ctx.op("batch_matmul", left, right), a), shape)


def _softcap(ctx: Context, qk: Value) -> Value:
    cap = float(ctx.attr("softcap", 0.0))
    if cap <= 0:
        return qk
    c = ctx.scalar(cap, qk)
    return ctx.op("mul", ctx.op("tanh", ctx.op("div", qk, c)), c)


def _bias(ctx: Context, q: Value, total: int, past: int, nonpad: Value | None) -> Value | None:
    """What is added to the scores: the mask's bias (a bool mask's False is -inf), plus -inf
    at the keys `_hidden` hides."""
    parts = []
    mask = ctx.optional(3)
    if mask is not None:
        parts.append(_mask_bias(ctx, mask, q, total))
    s, dtype = q.type.shape[2], numpy_dtype(q.type.dtype)
    for hidden in _hidden(ctx, s, total, past, nonpad):
        if isinstance(hidden, np.ndarray):
            parts.append(ctx.constant(np.where(hidden, -np.inf, 0).astype(dtype)))
        else:
            parts.append(ctx.op("where", hidden, ctx.scalar(-np.inf, q), ctx.scalar(0, q)))
    return functools.reduce(lambda a, b: ctx.op("add", a, b), parts) if parts else None


def _hidden(
    ctx: Context, s: int, total: int, past: int, nonpad: Value | None
) -> list[np.ndarray | Value]:
    """The keys hidden from each query, as [S, T] arrays (known at import) or bool values of
    [B, 1, S|1, T] (from nonpad_kv_seqlen, at run time). Query i sits at position p = i +
    offset, the offset being the past's length, or nonpad_kv_seqlen - S per batch for an
    external cache (0 without either); key j is hidden where j > p (is_causal), j < p -
    left_window_size or j > p + right_window_size (each >= 0; opset 25), or j >=
    nonpad_kv_seqlen (its padding)."""
    causal = bool(ctx.attr("is_causal", 0))
    left, right = (int(ctx.attr(f"{side}_window_size", -1)) for side in ("left", "right"))
    # each a comparison of j - p with a bound, where the key is hidden
    conds = [("greater", 0)] if causal else []
    conds += [("less", -left)] if left >= 0 else []
    conds += [("greater", right)] if right >= 0 else []
    rel = np.arange(total)[None, :] - np.arange(s)[:, None] - past  # j - p, the past's offset
    if nonpad is None:
        return [np.logical_or.reduce([_NUMPY[op](rel, c) for op, c in conds])] if conds else []
    lengths = reshape(ctx, cast(ctx, nonpad, "int64"), (nonpad.type.shape[0], 1, 1, 1))
    keys = ctx.constant(np.arange(total, dtype=np.int64).reshape(1, 1, 1, total))
    hidden: list[np.ndarray | Value] = [ctx.op("greater_equal", keys, lengths)]
    if conds:  # j - p with p = i + nonpad - S: rel + S - nonpad, per batch
        shifted = ctx.constant((rel + s).astype(np.int64).reshape(1, 1, s, total))
        relative = ctx.op("sub", shifted, lengths)
        for op, c in conds:
            hidden.append(ctx.op(op, relative, ctx.constant(np.array(c, np.int64))))
    return hidden


_NUMPY = {"greater": np.greater, "less": np.less}  # the Hexir comparisons _hidden uses


def _mask_bias(ctx: Context, mask: Value, q: Value, total: int) -> Value:
    """attn_mask as an additive bias of Q's dtype; one shorter than the keys (a mask written
    for the new keys only) is padded with -inf, as ONNX's function body and reference do."""
    if mask.type.dtype == "bool":
        mask = ctx.op("where", mask, ctx.scalar(0, q), ctx.scalar(-np.inf, q))
    elif mask.type.dtype != q.type.dtype:
        raise Unsupported(f"attn_mask of {mask.type.dtype}: only bool or Q's {q.type.dtype}")
    shape = mask.type.shape
    if not shape or shape[-1] == total:
        return mask
    if not 1 < shape[-1] < total:  # a last axis of 1: the spec broadcasts, the reference pads
        raise Unsupported(f"attn_mask {mask.type!r} against {total} keys")
    zeros = (0,) * len(shape)
    return ctx.op("pad", mask, before=zeros, after=(*zeros[1:], total - shape[-1]), value=-np.inf)


def _softmax(ctx: Context, logits: Value, bias: Value | None) -> Value:
    """The softmax over the keys, at softmax_precision where given; rows that the bias masks
    entirely are zeros."""
    dtype = logits.type.dtype
    precision = ctx.attr("softmax_precision")
    wanted = dtype if precision is None else hexir_dtype(int(precision), "softmax_precision")
    x = cast(ctx, logits, wanted)
    probs = _stepwise_softmax(ctx, x) if wanted == "float16" else ctx.op("softmax", x, axis=3)
    masked = None if bias is None else _masked_rows(ctx, bias)
    if masked is not None:
        probs = ctx.op("where", masked, ctx.scalar(0, probs), probs)
    return cast(ctx, probs, dtype)


def _stepwise_softmax(ctx: Context, x: Value) -> Value:
    """Softmax as ONNX's function body writes it, exp(x - max) / sum, each step rounded to
    float16: Hexir's softmax rounds once, a float16 ulp away from ONNX's (and its tests')."""
    peak = ctx.op("reduce_max", x, axes=(3,), keepdims=True)
    e = ctx.op("exp", ctx.op("sub", x, peak))
    return ctx.op("div", e, ctx.op("reduce_sum", e, axes=(3,), keepdims=True))


def _masked_rows(ctx: Context, bias: Value) -> Value | None:
    """Where every key of a row has a -inf bias (None where no row can be: a bias known at
    import without such a row)."""
    known = ctx.known(bias)
    if known is not None:
        rows = np.isneginf(known.max(axis=-1, keepdims=True))
        return ctx.constant(rows) if rows.any() else None
    last = len(bias.type.shape) - 1
    peak = ctx.op("reduce_max", bias, axes=(last,), keepdims=True)
    return ctx.op("equal", peak, ctx.scalar(-np.inf, bias))


# --- RotaryEmbedding --------------------------------------------------------------------------


def _rotary_embedding(ctx: Context) -> Sequence[Value]:
    """The first rotary_embedding_dim features of each head rotated pairwise (the two halves,
    or even and odd features where interleaved) by the angles of each token's position:
    (x1, x2) -> (cos·x1 - sin·x2, sin·x1 + cos·x2); the rest pass through. A 4-D X is
    [batch, heads, sequence, head size]; a 3-D one [batch, sequence, hidden] is split into
    num_heads heads in place ([batch, sequence, heads, head size]), so no transpose is needed."""
    x = ctx.input(0)
    shape = x.type.shape
    if len(shape) == 3:
        heads = int(ctx.attr("num_heads", 0))
        if heads < 1 or shape[2] % heads:
            raise Unsupported(f"a 3-D X {x.type!r} needs num_heads dividing its last axis")
        x = reshape(ctx, x, (shape[0], shape[1], heads, shape[2] // heads))
    elif len(shape) != 4:
        raise Unsupported(f"RotaryEmbedding of a {len(shape)}-D X: 3-D or 4-D only")
    size = x.type.shape[3]
    dim = int(ctx.attr("rotary_embedding_dim", 0)) or size
    if dim % 2 or dim > size:
        raise Unsupported(f"rotary_embedding_dim={dim} for heads of {size}: even, at most that")
    cos, sin = (_angles(ctx, i, dim // 2, heads_axis=1 if len(shape) == 4 else 2) for i in (1, 2))
    if ctx.attr("interleaved", 0):
        x1, x2 = _last(ctx, x, 0, dim, 2), _last(ctx, x, 1, dim, 2)
    else:
        x1, x2 = _last(ctx, x, 0, dim // 2), _last(ctx, x, dim // 2, dim)
    real = ctx.op("sub", ctx.op("mul", cos, x1), ctx.op("mul", sin, x2))
    imag = ctx.op("add", ctx.op("mul", sin, x1), ctx.op("mul", cos, x2))
    if ctx.attr("interleaved", 0):  # [..., dim / 2, 2] back to [..., dim]: pairs side by side
        pairs = [reshape(ctx, t, (*t.type.shape, 1)) for t in (real, imag)]
        rotated = [reshape(ctx, ctx.op("concat", *pairs, axis=4), (*real.type.shape[:3], dim))]
    else:
        rotated = [real, imag]
    rest = [_last(ctx, x, dim, size)] if dim < size else []
    y = ctx.op("concat", *rotated, *rest, axis=3)
    return [reshape(ctx, y, shape)]


def _angles(ctx: Context, i: int, half: int, heads_axis: int) -> Value:
    """cos_cache or sin_cache (input i) as [batch, sequence, half] with a unit heads axis put
    in: rows gathered by position_ids where given ([positions, half]), else as given."""
    cache = ctx.input(i)
    name = ("cos_cache", "sin_cache")[i - 1]
    positions = ctx.optional(3)
    rank = 3 if positions is None else 2
    if len(cache.type.shape) != rank or cache.type.shape[-1] != half:
        given = "with" if positions is not None else "without"
        raise Unsupported(
            f"{name} {cache.type!r} {given} position_ids: rank {rank}, last axis {half}"
        )
    if positions is not None:
        if len(positions.type.shape) != 2:
            raise Unsupported(f"position_ids {positions.type!r}: [batch, sequence] only")
        cache = ctx.op("gather", cache, positions, axis=0)
    b, s, _ = cache.type.shape
    return reshape(ctx, cache, (b, 1, s, half) if heads_axis == 1 else (b, s, 1, half))


def _last(ctx: Context, x: Value, start: int, stop: int, step: int = 1) -> Value:
    """x[..., start:stop:step]."""
    shape = x.type.shape
    lead = len(shape) - 1
    return ctx.op(
        "slice",
        x,
        start=(0,) * lead + (start,),
        stop=shape[:-1] + (stop,),
        step=(1,) * lead + (step,),
    )


ATTENTION_SPECS: dict[str, Spec] = {
    "Attention": Spec(
        _attention,
        {
            "is_causal": (0, 1),
            "q_num_heads": None,
            "kv_num_heads": None,
            "scale": None,
            "softcap": None,
            "softmax_precision": None,
            "qk_matmul_output_mode": (0, 1, 2, 3),
            "left_window_size": None,
            "right_window_size": None,
        },
        outputs=4,
    ),
    "RotaryEmbedding": Spec(
        _rotary_embedding,
        {"interleaved": (0, 1), "rotary_embedding_dim": None, "num_heads": None},
    ),
}
