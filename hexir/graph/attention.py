"""Attention written as its parts, made one `attention` op on the CPU: `fuse_attention`.

    %s = hexir.batch_matmul %q, %kt                     %o = hexir.attention %q, %kt, %v
    %z = hexir.mul %s, %scale      (optional)       ->       {causal = true, scale = 0.125}
    %m = hexir.add %z, %mask       (optional)
    %p = hexir.softmax %m {axis = 2}
    %o = hexir.batch_matmul %p, %v

The scale is a one-element constant (a division by one too); the added operand is a bias that
broadcasts to the scores, and a constant one that is 0 where bottom-right-aligned causal
attention lets query i see key j (j <= i + T - S) and -1e9 or below elsewhere (GPT-2's mask;
its exp is 0 either way) becomes `causal = true` instead. Every intermediate has that one use.
The op's kernel (hexir/schedule/handwritten_attention.py) computes the scores per tile of
query rows and never writes all of them. Against the parts' kernels with GPT-2's mask
(`python benchmarks/attention_cpu.py`, 12 heads, causal): 1.36x at 1024 keys, 1.28x at 2048
(403 MB of scores and probabilities not written), 0.94-0.97x at 256 and 512; so attention of
fewer than MIN_KEYS keys keeps its parts, and so does a decode step's (fewer than MIN_QUERIES
queries: their scores are a row a head). Causal attention is one op from 32 queries whatever
its keys (as fast as the parts there), and from 128 queries one attention op per block of
queries (`causal_block`), each reading only the keys its queries see, the blocks' results
concatenated: faster than the parts at every length measured, 1.1x at 128 queries to 1.9x at
1024. The `fuse_attention` knob
(HEXIR_FUSE_ATTENTION=0) turns the rewrite off.
"""

from __future__ import annotations

import numpy as np

from hexir import knobs
from hexir.graph.rewrite import RewritePass, remove_dead_ops
from hexir.ir.graph import Graph, Op, Value
from hexir.ops import make_op
from hexir.ops.attention import broadcasts_to, causal_mask
from hexir.runtime.target import Target

__all__ = ["MIN_KEYS", "MIN_QUERIES", "causal_block", "fuse_attention"]

MIN_KEYS = 1024
# A decode step's few queries keep the parts: their scores are one row a head, and the one
# kernel's tiles of 32 query rows would compute 31 rows for nothing (GPT-2 small after 1023
# tokens: 4.1 ms an attention, 78 ms the step, against 27 ms for ONNX Runtime).
MIN_QUERIES = 64
HIDDEN = -1e9  # a mask entry at or below this hides its key (exp(HIDDEN - max) is 0)
# Causal attention of at least two blocks of queries runs as one attention op per block,
# each over only the keys its queries see: blocks of 64 queries up to 256 of them, of 128
# beyond (`python benchmarks/attention_cpu.py`, 12 heads x 64: 0.184 against 0.203 ms for
# the parts at 128 queries, 0.68 against 0.84 at 256, 2.47 against 3.41 at 512, 9.3 against
# 18.0 at 1024: the hidden half of the keys is never read).
SMALL_BLOCK, LARGE_BLOCK = 64, 128
# Causal attention of fewer queries than two blocks is one attention op from this many queries
# (0.016 against 0.018 ms for the parts at 32, 0.056 against 0.054 at 64, 0.119 against 0.118
# at 96): no buffer of queries x keys. Below it the parts are faster (16: 0.01 ms).
CAUSAL_MIN_QUERIES = 32


def causal_block(queries: int) -> int | None:
    """The queries of a block of causal attention, or None where it stays whole."""
    if queries < 2 * SMALL_BLOCK:
        return None
    return SMALL_BLOCK if queries <= 256 else LARGE_BLOCK


def fuse_attention(
    graph: Graph, target: Target, min_keys: int = MIN_KEYS, min_queries: int = MIN_QUERIES
) -> Graph:
    """`graph` with each attention of at least `min_keys` keys and `min_queries` queries
    (module docstring) as one `attention` op, on a CPU target with the knob on; else `graph`
    itself."""
    if target.kind != "cpu" or not knobs.get().fuse_attention:
        return graph
    p = RewritePass(graph)
    fused: dict[str, list[Op]] = {}  # the second batch_matmul's result -> its attention op
    for op in graph.ops:
        if op.kind == "batch_matmul" and not op.attrs:
            found = _attention(op, p, min_keys, min_queries)
            if found is not None:
                fused[op.result.name] = found
    if not fused:
        return graph
    ops = [new for op in graph.ops for new in fused.get(op.result.name, [op])]
    return remove_dead_ops(p.finish(ops))


def _attention(out: Op, p: RewritePass, min_keys: int, min_queries: int) -> list[Op] | None:
    """The attention op computing `out` (a batch_matmul of probabilities by values), after
    the transpose of its keys where the scores' batch_matmul read them in place, or None
    where its operand is not the chain of the module docstring."""
    probs, v = out.operands
    softmax = p.sole_producer(probs)
    if softmax is None or softmax.kind != "softmax" or softmax.attr("axis") != 2:
        return None
    logits, bias, causal = softmax.operands[0], None, False
    op = p.sole_producer(logits)
    if op is not None and op.kind == "add":
        logits, bias = _scores_and_other(op, p)
        causal = bias is not None and _is_causal_mask(bias, p, op.result.type.shape)
        op = p.sole_producer(logits) if bias is not None else None
    scale = 1.0
    if op is not None and op.kind in ("mul", "div"):
        logits, factor = _scores_and_other(op, p)
        value = _scalar(factor, p)
        if value is None or (op.kind == "div" and value == 0):
            return None
        scale = value if op.kind == "mul" else 1.0 / value
        op = p.sole_producer(logits)
    if op is None or op.kind != "batch_matmul" or dict(op.attrs).keys() - {"transpose_b"}:
        return None
    q, kt = op.operands
    queries, keys = q.type.shape[1], op.result.type.shape[2]
    if causal:  # one op from CAUSAL_MIN_QUERIES queries, blocks of them from 128: never slower
        if queries < min(min_queries, CAUSAL_MIN_QUERIES):
            return None
    elif keys < min_keys or queries < min_queries:
        return None
    if bias is not None and not broadcasts_to(bias.type.shape, op.result.type.shape):
        return None
    ops = []
    if op.attr("transpose_b"):  # the attention op reads its keys as [B, D, T]
        name = p.fresh(f"{kt.name}_t")
        turn = make_op("transpose", [kt], {"perm": (0, 2, 1)}, name, op.placement)
        ops, kt = [turn], turn.result
    operands = [q, kt, v] if bias is None or causal else [q, kt, v, bias]
    attrs = {"scale": scale, "causal": causal}
    if causal and causal_block(queries) is not None:
        return [*ops, *_causal_blocks(q, kt, v, scale, out, p)]
    return [*ops, make_op("attention", operands, attrs, out.result.name, out.placement)]


def _causal_blocks(
    q: Value, kt: Value, v: Value, scale: float, out: Op, p: RewritePass
) -> list[Op]:
    """Causal attention as one attention op per block of `causal_block` queries, each over the
    keys its last query sees (bottom-right aligned: block i's last query row r sees keys up
    to r + T - S), and their results concatenated along the queries: the keys every query
    of a block hides are never read, about half of all of them."""
    queries, keys = q.type.shape[1], kt.type.shape[2]
    block = causal_block(queries) or queries
    ops: list[Op] = []
    blocks: list[Value] = []

    def sliced(x: Value, axis: int, start: int, stop: int) -> Value:
        starts = [0] * len(x.type.shape)
        stops = list(x.type.shape)
        starts[axis], stops[axis] = start, stop
        if (start, stop) == (0, x.type.shape[axis]):
            return x
        attrs = {"start": tuple(starts), "stop": tuple(stops), "step": (1,) * len(stops)}
        ops.append(make_op("slice", [x], attrs, p.fresh(f"{x.name}_block"), out.placement))
        return ops[-1].result

    for start in range(0, queries, block):
        stop = min(start + block, queries)
        seen = stop + keys - queries  # the keys the block's last query sees
        operands = [sliced(q, 1, start, stop), sliced(kt, 2, 0, seen), sliced(v, 1, 0, seen)]
        attrs = {"scale": scale, "causal": True}
        name = p.fresh(f"{out.result.name}_block")
        ops.append(make_op("attention", operands, attrs, name, out.placement))
        blocks.append(ops[-1].result)
    ops.append(make_op("concat", blocks, {"axis": 1}, out.result.name, out.placement))
    return ops


def _scores_and_other(op: Op, p: RewritePass) -> tuple[Value, Value | None]:
    """A binary op's operand that continues the chain (the one with the op's own shape and a
    producer of its own) and the other; (first, None) where neither or both qualify."""
    a, b = op.operands
    chain = [v for v in (a, b) if v.type.shape == op.result.type.shape and v.name in p.producer]
    if len(chain) != 1 or (op.kind == "div" and chain[0] is not a):
        return a, None
    return chain[0], (b if chain[0] is a else a)


def _scalar(value: Value | None, p: RewritePass) -> float | None:
    if value is None or value.name not in p.data or value.type.size != 1:
        return None
    return float(p.data[value.name].reshape(()))


def _is_causal_mask(mask: Value, p: RewritePass, scores: tuple[int, ...]) -> bool:
    """Whether `mask` is a constant 0 where causal attention sees a key and at most HIDDEN
    where it does not, for every batch."""
    data = p.data.get(mask.name)
    if data is None or len(mask.type.shape) > 3:
        return False
    full = np.broadcast_to(data, scores)
    visible = causal_mask(*scores[1:])
    return bool(np.all(full[:, visible] == 0) and np.all(full[:, ~visible] <= HIDDEN))
