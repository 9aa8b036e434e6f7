"""flash_attention: an `attention` kernel's stages (hexir/ops/attention.py) replaced by one
online-softmax nest for the GPU (hexir/schedule/flash_nest.py), which holds no scores of all
queries against all keys.

    b0 = sch.get_block(name="attention_values")
    v1 = sch.sample_categorical(candidates=[16, 32, 64], probs=[...], decision=2)
    v2 = sch.sample_categorical(candidates=[16, 32, 64], probs=[...], decision=2)
    v3 = sch.sample_categorical(candidates=[1, 2, 4], probs=[...], decision=1)
    b4, b5 = sch.flash_attention(block=b0, query_tile=v1, key_tile=v2, lanes=v3)
    sch.storage_align(block=b5, buffer_index=0, axis=0, factor=32, offset=1)

A thread block takes `query_tile` query rows of one batch (blockIdx.x: the tiles of rows,
blockIdx.y: the batch), `lanes` threads a row (threadIdx.y: the row, threadIdx.x: the lane).
Each thread holds its row's query and its share of the row's running max, running sum and
output accumulator. Per tile of `key_tile` keys (a serial loop):

1. the block's threads copy the tile's keys ([D, key_tile]) and values ([key_tile, Dv]) to
   shared memory together (the two blocks returned: a schedule may pad the values' rows,
   which the lanes of a row read side by side);
2. each lane scores its row's query against keys lane, lane + lanes, ... of the tile (in
   registers) and makes them the op's logits (the expression of the `attention_max` stage:
   scale, bias, causal mask); a key past the last is hidden;
3. the tile's max of each row: a cross-thread max over its lanes;
4. each lane rescales its sum and accumulator by exp(old max - new max) and adds its keys'
   exp(logit - new max), times their values to the accumulator (a max still -inf, every key
   so far hidden, subtracts 0: nothing is rescaled from nothing).

Last, each row's sums and accumulators are summed over its lanes (cross-thread) into the
output, accumulator times 1 / sum as the `attention_out` stage has it. Causal attention's
tiles that the block's last query does not see are skipped; the diagonal tile is masked by
the logit. The trace replays on the op's own kernel (its workload is unchanged), and on the
CPU the nest runs serially (DESIGN.md §3) and computes the same values up to rounding.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from hexir.errors import ScheduleError
from hexir.ir.arith import affine_coefficients
from hexir.ir.tir import Binary, Block, Buffer, BufferLoad, BufferStore, Expr, PrimFunc, Select, Var
from hexir.ir.visit import free_vars, map_expr, substitute, walk
from hexir.schedule.common import all_blocks, schedule_error
from hexir.schedule.flash_nest import FETCHES, Attention, Tiles, flash_nest, shared_bytes
from hexir.schedule.reduction import identity
from hexir.schedule.state import ScheduleBase, primitive
from hexir.schedule.trace import BlockRV, ExprRV

STAGES = ("scores", "max", "exp", "sum", "values", "out")
BLOCKS = frozenset(f"attention_{s}" for s in STAGES)  # the op's stages, as it lowers them
STATIC_SHARED = 48 * 1024  # without a target: CUDA's static __shared__ limit


class FlashPrimitives(ScheduleBase):
    @primitive
    def flash_attention(
        self,
        block: BlockRV,
        query_tile: int | ExprRV,
        key_tile: int | ExprRV,
        lanes: int | ExprRV,
    ) -> list[BlockRV]:
        """The attention kernel holding `block` (one of its stages) as the online-softmax
        nest of the module docstring; returns its blocks that copy a tile of keys and of
        values to shared memory. Refuses a kernel whose blocks are not the attention op's
        six stages alone (a fused producer or consumer), tiles that are not positive, `lanes`
        not dividing `key_tile`, more threads (query_tile x lanes) than the target allows,
        and tiles whose shared memory exceeds its static limit (48 KB without a target)."""
        self._block(block, "flash_attention")
        tiles = Tiles(*(self._int(x, "flash_attention") for x in (query_tile, key_tile, lanes)))
        attention = match_attention(self.func)
        self._check(attention, tiles)
        taken = {p.name for p in self.func.params}
        func = replace(self.func, body=flash_nest(attention, tiles, taken))
        inputs = (("block", block), ("query_tile", query_tile), ("key_tile", key_tile))
        outs = [(BlockRV, name) for name in FETCHES]
        return self._commit("flash_attention", (*inputs, ("lanes", lanes)), (), func, outs)  # type: ignore[return-value]

    def _check(self, a: Attention, t: Tiles) -> None:
        def fail(reason: str) -> ScheduleError:
            return schedule_error("flash_attention", f"tiles {t}: {reason}", self.func)

        if min(t.queries, t.keys, t.lanes) < 1 or t.keys % t.lanes:
            raise fail("each positive, and the lanes dividing the keys of a tile")
        threads = getattr(self.target, "max_threads_per_block", None) or 1024
        if t.queries * t.lanes > threads:
            raise fail(f"{t.queries * t.lanes} threads a block, over the limit of {threads}")
        limit = getattr(self.target, "max_shared_memory_per_block", None) or STATIC_SHARED
        if shared_bytes(a, t) > limit:
            raise fail(f"{shared_bytes(a, t)} bytes of shared memory, over the limit of {limit}")


# ---------------------------------------------------------------------------------------------
# Reading the op's stages


def match_attention(func: PrimFunc) -> Attention:
    """The attention `func` computes, read from its stages; ScheduleError where its blocks
    are not exactly the stages hexir/ops/attention.py lowers the op to."""

    def fail(reason: str) -> ScheduleError:
        return schedule_error("flash_attention", reason, func)

    blocks = {b.name: b for b in all_blocks(func.body)}
    if set(blocks) != BLOCKS:
        odd = ", ".join(f"@{name}" for name in sorted(set(blocks) ^ BLOCKS))
        raise fail(f"the kernel's blocks are not the attention op's stages alone: {odd}")
    scores, mx, values, out = (blocks[f"attention_{s}"] for s in ("scores", "max", "values", "out"))
    if [len(b.iter_vars) for b in (scores, mx, values, out)] != [4, 3, 4, 3]:
        raise fail("the attention stages do not have the op's iter vars")
    q, k = _product(scores, fail)
    v = _values(values, blocks["attention_exp"].writes[0].buffer, fail)
    logit = _logit(mx, scores.writes[0].buffer, fail)
    _check_out(out, values.writes[0].buffer, blocks["attention_sum"].writes[0].buffer, fail)
    (b, s, t, d), (*_, e, _) = (iv.dom for iv in scores.iter_vars), values.iter_vars
    sv, mv, vv = ([iv.var for iv in x.iter_vars] for x in (scores, mx, values))
    dtype = out.writes[0].buffer.dtype
    return Attention(
        b,
        s,
        t,
        d,
        e.dom,
        out.writes[0].buffer,
        _indexed(q, [sv[0], sv[1], sv[3]]),
        _indexed(k, [sv[0], sv[3], sv[2]]),
        _indexed(v, [vv[0], vv[3], vv[2]]),
        lambda b, i, j, score: _indexed(logit(score), mv)(b, i, j),
        _causal_offset(logit(identity("+", dtype)), mv[1], mv[2]),
    )


def _indexed(expr: Expr, ivs: list[Var]) -> Callable[..., Expr]:
    """`expr` as a function of the iter vars `ivs`."""
    return lambda *xs: substitute(expr, dict(zip(ivs, xs, strict=True)))  # type: ignore[return-value]


def _update(block: Block, op: str) -> Expr | None:
    """The `x` of `block`'s `out = out OP x`."""
    match block.body:
        case BufferStore(buf, idx, Binary(o, BufferLoad(acc, at), x)) if o == op:
            return x if (acc, at) == (buf, idx) else None
    return None


def _product(scores: Block, fail: Callable[[str], ScheduleError]) -> tuple[Expr, Expr]:
    """The scores stage's query and key factors: one free of the key, one of the query."""
    _, i, j, _ = (iv.var for iv in scores.iter_vars)
    match _update(scores, "+"):
        case Binary("*", a, b):
            for q, k in ((a, b), (b, a)):
                if j not in free_vars(q) and i not in free_vars(k):
                    return q, k
    raise fail("@attention_scores is not a sum over D of a query times a key")


def _values(values: Block, exp: Buffer, fail: Callable[[str], ScheduleError]) -> Expr:
    """The values stage's value factor (its other factor a load of the exp stage's)."""
    match _update(values, "+"):
        case Binary("*", BufferLoad(buf), v) if buf == exp:
            return v
    raise fail("@attention_values is not a sum over T of an exp times a value")


def _logit(
    mx: Block, scores: Buffer, fail: Callable[[str], ScheduleError]
) -> Callable[[Expr], Expr]:
    """The max stage's logit as a function of the score it reads."""
    x = _update(mx, "max")
    ivs = tuple(iv.var for iv in mx.iter_vars)
    reads = [n for n in walk(x) if isinstance(n, BufferLoad) and n.buffer == scores] if x else []
    if x is None or not reads or any(load.indices != ivs for load in reads):
        raise fail("@attention_max is not the row max of logits of the scores")
    return lambda score: map_expr(x, lambda n: score if n in reads else n)


def _check_out(out: Block, acc: Buffer, total: Buffer, fail: Callable) -> None:
    """The out stage: the accumulator times 1 / the sum (linear in the accumulator, so the
    lanes' partial accumulators may be divided one by one)."""
    match out.body:
        case BufferStore(_, _, Binary("*", BufferLoad(a), Binary("/", _, BufferLoad(s)))):
            if a == acc and s == total:
                return
    raise fail("@attention_out is not the accumulator times 1 / the sum")


def _causal_offset(logit: Expr, query: Var, key: Var) -> int | None:
    """c where the logit hides key j from query i unless j <= i + c (a select of the lowest
    value on that condition); None where it has no such mask."""
    for n in walk(logit):
        match n:
            case Select(Binary("<=", a, b), _, hidden) if hidden == identity("max", hidden.dtype):
                coeffs = affine_coefficients(b - a, [query, key])
                if coeffs is not None and (coeffs[query], coeffs[key]) == (1, -1):
                    return coeffs[None]
    return None
