"""What an attention kernel computes, read off the stages its op lowers to
(hexir/ops/attention.py): the `Attention` the flash nest (hexir/schedule/flash_nest.py) is
built from, each operand and the logit as expressions of their indices, so a fused
elementwise producer inlined into a stage, a bias or a mask carries over as it is.

    a = match(func)     # ScheduleError where func is not an attention or paged_attention kernel

An `attention` kernel is its six stages; a `paged_attention` kernel (a decode step over the
paged KV cache) is attention of one query per (sequence, head) against its cached keys in
the order of its block table, and, with the current token's key and value, that key next:
key j < length is cached slot j, key j == length the current token, the rest hidden.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from hexir.errors import ScheduleError
from hexir.ir.arith import affine_coefficients
from hexir.ir.tir import (
    Binary,
    Block,
    Buffer,
    BufferLoad,
    BufferStore,
    Expr,
    IntImm,
    PrimFunc,
    Select,
    Var,
)
from hexir.ir.visit import free_vars, map_expr, substitute, walk
from hexir.schedule.common import all_blocks, schedule_error
from hexir.schedule.flash_nest import Attention
from hexir.schedule.reduction import identity

STAGES = ("scores", "max", "exp", "sum", "values", "out")
BLOCKS = frozenset(f"attention_{s}" for s in STAGES)  # the op's stages, as it lowers them
PAGED = frozenset(f"paged_{s}" for s in STAGES)
PAGED_NEW = PAGED | {f"paged_{s}" for s in ("new_score", "max_new", "new_exp")}

Fail = Callable[[str], ScheduleError]


def match(func: PrimFunc) -> Attention:
    """The attention `func` computes: an attention or a paged_attention kernel."""
    names = {b.name for b in all_blocks(func.body)}
    return match_paged_attention(func) if "paged_scores" in names else match_attention(func)


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
    _, i, j, _ = (iv.var for iv in scores.iter_vars)
    q, k = _product(scores, {j}, {i}, fail)
    v = _values(values, blocks["attention_exp"].writes[0].buffer, fail)
    logit = _logit(mx, scores.writes[0].buffer, fail)
    _check_out(out, values.writes[0].buffer, blocks["attention_sum"].writes[0].buffer, fail)
    (b, s, t, d), (*_, e, _) = (iv.dom for iv in scores.iter_vars), values.iter_vars
    sv, mv, vv = ([iv.var for iv in x.iter_vars] for x in (scores, mx, values))
    dtype = out.writes[0].buffer.dtype
    causal = _causal_offset(logit(identity("+", dtype)), mv[1], mv[2])
    return Attention(
        b,
        s,
        t,
        d,
        e.dom,
        out.writes[0].buffer,
        lambda b, i, e: (b, i, e),
        _indexed(q, [sv[0], sv[1], sv[3]]),
        _indexed(k, [sv[0], sv[3], sv[2]]),
        _indexed(v, [vv[0], vv[3], vv[2]]),
        lambda b, i, j, score: _indexed(logit(score), mv)(b, i, j),
        None if causal is None else lambda b, i: i + (causal + 1),
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


def _product(scores: Block, keys: set[Var], queries: set[Var], fail: Fail) -> tuple[Expr, Expr]:
    """The scores stage's query and key factors: one free of the `keys` iter vars, the other
    of the `queries` ones."""
    match _update(scores, "+"):
        case Binary("*", a, b):
            for q, k in ((a, b), (b, a)):
                if not keys & free_vars(q) and not queries & free_vars(k):
                    return q, k
    raise fail(f"@{scores.name} is not a sum over D of a query times a key")


def _values(values: Block, exp: Buffer, fail: Fail) -> Expr:
    """The values stage's value factor (its other factor a load of the exp stage's)."""
    match _update(values, "+"):
        case Binary("*", BufferLoad(buf), v) if buf == exp:
            return v
    raise fail(f"@{values.name} is not a sum over the keys of an exp times a value")


def _logit(mx: Block, scores: Buffer, fail: Fail) -> Callable[[Expr], Expr]:
    """The max stage's logit as a function of the score it reads."""
    x = _update(mx, "max")
    ivs = tuple(iv.var for iv in mx.iter_vars)
    reads = [n for n in walk(x) if isinstance(n, BufferLoad) and n.buffer == scores] if x else []
    if x is None or not reads or any(load.indices != ivs for load in reads):
        raise fail(f"@{mx.name} is not the row max of logits of the scores")
    return lambda score: map_expr(x, lambda n: score if n in reads else n)


def _check_out(out: Block, acc: Buffer, total: Buffer, fail: Fail) -> None:
    """The out stage: the accumulator times 1 / the sum (linear in the accumulator, so the
    lanes' partial accumulators may be divided one by one)."""
    match out.body:
        case BufferStore(_, _, Binary("*", BufferLoad(a), Binary("/", _, BufferLoad(s)))):
            if a == acc and s == total:
                return
    raise fail(f"@{out.name} is not the accumulator times 1 / the sum")


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


# --- paged_attention ---------------------------------------------------------------------


def match_paged_attention(func: PrimFunc) -> Attention:
    """The paged_attention `func` computes (module docstring), read from its stages; its
    batch is the sequences times the heads, one query each."""

    def fail(reason: str) -> ScheduleError:
        return schedule_error("flash_attention", reason, func)

    blocks = {b.name: b for b in all_blocks(func.body)}
    new = "paged_new_score" in blocks
    if set(blocks) != (PAGED_NEW if new else PAGED):
        odd = ", ".join(f"@{n}" for n in sorted(set(blocks) ^ (PAGED_NEW if new else PAGED)))
        raise fail(f"the kernel's blocks are not the paged_attention op's stages alone: {odd}")
    scores, mx, values = (blocks[f"paged_{s}"] for s in ("scores", "max", "values"))
    if [len(b.iter_vars) for b in (scores, mx, values)] != [5, 4, 5]:
        raise fail("the paged_attention stages do not have the op's iter vars")
    sv, mv, vv = ([iv.var for iv in x.iter_vars] for x in (scores, mx, values))
    q, k = _product(scores, {sv[2], sv[3]}, set(), fail)
    v = _values(values, blocks["paged_exp"].writes[0].buffer, fail)
    logit = _logit(mx, scores.writes[0].buffer, fail)
    (batch, heads, pages, slots, depth), width = (iv.dom for iv in scores.iter_vars), vv[2]
    length = _length(logit(identity("+", func.outputs[0].dtype)), mv, slots, fail)
    if not new:
        _check_out(
            blocks["paged_out"], values.writes[0].buffer, blocks["paged_sum"].writes[0].buffer, fail
        )
    cached = pages * slots

    def where(bh: Expr, j: Expr) -> tuple[Expr, Expr, Expr, Expr]:
        """(sequence, head, page, slot) of key j of batch bh (past the last slot: the last)."""
        c = Binary("min", j, IntImm(cached - 1))
        return bh // heads, bh % heads, c // slots, c % slots

    def seen(bh: Expr, i: Expr) -> Expr:
        n = _indexed(length, mv[:1])(bh // heads)
        return n + 1 if new else n

    a = Attention(
        batch * heads,
        1,
        cached + new,
        depth,
        next(iv.dom for iv in values.iter_vars if iv.var == width),
        func.outputs[0],
        lambda bh, i, e: (bh // heads, bh % heads, e),
        lambda bh, i, d: _indexed(q, [sv[0], sv[1], sv[4]])(bh // heads, bh % heads, d),
        lambda bh, d, j: _indexed(k, sv)(*where(bh, j), d),
        lambda bh, j, e: _indexed(v, [vv[0], vv[1], vv[3], vv[4], vv[2]])(*where(bh, j), e),
        lambda bh, i, j, score: _indexed(logit(score), mv)(*where(bh, j)),
        seen,
    )
    return _with_new_token(a, blocks, q, sv, length, mv[:1], fail) if new else a


def _length(logit: Expr, ivs: list[Var], slots: int, fail: Fail) -> Expr:
    """The sequence's length the paged logit hides slots from (`page * S + slot < length`),
    an expression of the batch iter var."""
    for n in walk(logit):
        match n:
            case Select(Binary("<", slot, length), _, hidden) if hidden == identity(
                "max", hidden.dtype
            ):
                coeffs = affine_coefficients(slot, ivs[2:])
                if coeffs == {ivs[2]: slots, ivs[3]: 1, None: 0} and free_vars(length) <= {ivs[0]}:
                    return length
    raise fail("@paged_max does not hide the slots at or past the sequence's length")


def _with_new_token(
    a: Attention,
    blocks: dict[str, Block],
    q: Expr,
    sv: list[Var],
    length: Expr,
    bv: list[Var],
    fail: Fail,
) -> Attention:
    """`a` with the current token's key, value and logit at key `length` (module docstring)."""
    heads = a.batch // blocks["paged_new_score"].iter_vars[0].dom
    nv = [iv.var for iv in blocks["paged_new_score"].iter_vars]
    query = _indexed(q, [sv[0], sv[1], sv[4]])(*nv)
    match _update(blocks["paged_new_score"], "+"):
        case Binary("*", x, y) if query in (x, y):
            k_new = y if x == query else x
        case _:
            raise fail("@paged_new_score is not the query times the current token's key")
    now = blocks["paged_new_score"].writes[0].buffer
    xv = [iv.var for iv in blocks["paged_max_new"].iter_vars]
    match blocks["paged_max_new"].body:
        case BufferStore(_, _, Binary("max", _, z)) if any(
            isinstance(n, BufferLoad) and n.buffer == now for n in walk(z)
        ):
            new_logit = z
        case _:
            raise fail("@paged_max_new is not the max of the cached keys' and the token's")
    e_new = blocks["paged_new_exp"].writes[0].buffer
    out = blocks["paged_out"]
    factors = [
        (x, y)
        for n in walk(out.body)
        if isinstance(n, Binary) and n.op == "*"
        for x, y in ((n.a, n.b), (n.b, n.a))
        if isinstance(x, BufferLoad) and x.buffer == e_new
    ]
    if len(factors) != 1:
        raise fail("@paged_out does not add the current token's exp times its value")
    ov = [iv.var for iv in out.iter_vars]
    v_new = factors[0][1]

    def current(bh: Expr, j: Expr) -> Expr:
        return Binary("==", j, _indexed(length, bv)(bh // heads))

    def token_logit(bh: Expr, score: Expr) -> Expr:
        z = map_expr(
            new_logit, lambda n: score if isinstance(n, BufferLoad) and n.buffer == now else n
        )
        return _indexed(z, xv)(bh // heads, bh % heads)

    return replace(
        a,
        k=lambda bh, d, j: Select(
            current(bh, j), _indexed(k_new, nv)(bh // heads, bh % heads, d), a.k(bh, d, j)
        ),
        v=lambda bh, j, e: Select(
            current(bh, j), _indexed(v_new, ov)(bh // heads, bh % heads, e), a.v(bh, j, e)
        ),
        logit=lambda bh, i, j, score: Select(
            current(bh, j), token_logit(bh, score), a.logit(bh, i, j, score)
        ),
    )
