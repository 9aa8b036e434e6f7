"""The loop nest `sch.flash_attention` puts in place of an attention kernel's stages
(hexir/schedule/flash.py): online softmax, a thread block per tile of query rows of a batch
(a paged decode step's batch: a sequence's head, one query).

    body = flash_nest(attention, Tiles(queries=64, keys=64, lanes=2), taken_names)

    for %batch in 0..B blockIdx.y {  for %query_tile in 0..S/64 blockIdx.x {
      each thread (threadIdx.y: row, threadIdx.x: lane): its query row, max -inf, sum 0, acc 0
      for %key_tile in 0..T/64 serial {
        block @attention_keys_shared, @attention_values_shared: the tile, every thread copying
        each lane: scores of keys lane, lane + lanes, ... (registers), then their logits
        block @attention_tile_max: the row's max over its lanes (cross-thread)
        each lane: max, sum and acc rescaled by exp(old max - new max), its keys' exps added
      }
      block @attention_row_sum: the row's sum over its lanes (cross-thread)
      block @attention_out: acc x 1/sum, over the lanes (cross-thread), to the output
    } }

Every stage of a tile is guarded by whether the block's last query sees the tile's first key
(where the keys a query sees end early: causal attention, a sequence's length; the guard is
block-uniform, so every thread reaches the barriers between stages).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from hexir.ir.arith import affine_coefficients, flat_index, simplify
from hexir.ir.names import unique_name
from hexir.ir.tir import (
    Allocate,
    Binary,
    Block,
    Buffer,
    BufferLoad,
    BufferRegion,
    BufferStore,
    Call,
    Expr,
    For,
    IfThenElse,
    IntImm,
    IterVar,
    Select,
    Stmt,
    Var,
    const,
    seq,
)
from hexir.ir.visit import substitute, walk
from hexir.schedule.reduction import identity

# The blocks that copy a tile to shared memory (flash_attention returns them, in this order).
FETCHES = ("attention_keys_shared", "attention_values_shared")


@dataclass(frozen=True)
class Tiles:
    """Query rows per thread block, keys per shared tile, threads per query row."""

    queries: int = 64
    keys: int = 64
    lanes: int = 2


@dataclass(frozen=True)
class Attention:
    """What an attention kernel computes: batch x queries against keys of depth D, values of
    width Dv; each operand as a function of its indices (q(b, i, d), k(b, d, j), v(b, j, e)),
    the logit of a score (logit(b, i, j, score): scale, bias, masks), where the output of
    (b, i, e) is stored (`at`: its indices into `out`), and, where the keys a query sees
    end early, `seen(b, i)`: how many keys query i (and every earlier one) sees at most, so
    that a tile of keys from there on is skipped (causal attention: i + T - S + 1; a cached
    sequence: its length)."""

    batch: int
    queries: int
    keys: int
    depth: int
    width: int
    out: Buffer
    at: Callable[[Expr, Expr, Expr], tuple[Expr, ...]]
    q: Callable[[Expr, Expr, Expr], Expr]
    k: Callable[[Expr, Expr, Expr], Expr]
    v: Callable[[Expr, Expr, Expr], Expr]
    logit: Callable[[Expr, Expr, Expr, Expr], Expr]
    seen: Callable[[Expr, Expr], Expr] | None = None

    def keys_by_row(self) -> bool:
        """Whether a key's D values lie side by side in memory (paged: [.., slot, D]), so
        the tile of keys is copied and kept as rows ([key tile, D]), not columns ([D, key
        tile]: the attention op's kt), the copy's consecutive threads reading consecutive
        words either way."""
        d, j = Var("d"), Var("j")
        for load in walk(self.k(IntImm(0), d, j)):
            if isinstance(load, BufferLoad) and len(load.buffer.shape) > 1:
                flat = flat_index(load.buffer, load.indices)
                coeffs = affine_coefficients(flat, [d, j])
                if coeffs is not None and coeffs[d] == 1:
                    return True
        return False


def shared_bytes(a: Attention, t: Tiles) -> int:
    """The nest's static shared memory: the key and value tiles, two values a row."""
    from hexir.ir.dtype import itemsize

    return itemsize(a.out.dtype) * (t.keys * (a.depth + a.width) + 2 * t.queries)


@dataclass(frozen=True)
class _Names:
    """The nest's loop vars (a stage's own thread loops rename row and lane) and buffers."""

    batch: Var
    tile: Var  # the block's tile of query rows
    row: Var  # threadIdx.y
    lane: Var  # threadIdx.x
    kt: Var  # the tile of keys
    q: Buffer  # each thread's query row
    m: Buffer  # running max: each lane's copy of its row's
    l: Buffer  # running sum: the lane's share  # noqa: E741
    acc: Buffer  # output accumulator: the lane's share
    alpha: Buffer  # the tile's rescale
    s: Buffer  # [rows, key tile]: each lane's keys' scores, logits, then exps (registers)
    p: Buffer  # the exps again, read at a loop's index (local memory, not registers)
    k: Buffer  # shared: the tile's keys, [D, key tile] or by row [key tile, D]
    v: Buffer  # shared: its values [key tile, Dv]
    tile_max: Buffer  # shared: the tile's max per row
    total: Buffer  # shared: each row's sum over its lanes


def _names(a: Attention, t: Tiles, taken: set[str]) -> _Names:
    def var(name: str) -> Var:
        return Var(unique_name(name, taken))

    def buf(name: str, shape: tuple[int, ...], scope: str) -> Buffer:
        return Buffer(unique_name(name, taken), shape, a.out.dtype, scope)

    r, g = t.queries, t.lanes
    return _Names(
        *(var(x) for x in ("batch", "query_tile", "row", "lane", "key_tile")),
        buf("flash_q", (r, g, a.depth), "local"),
        buf("flash_max", (r, g), "local"),
        buf("flash_sum", (r, g), "local"),
        buf("flash_acc", (r, g, a.width), "local"),
        buf("flash_rescale", (r, g), "local"),
        buf("flash_scores", (r, t.keys), "local"),
        buf("flash_probs", (r, t.keys), "local"),
        buf("flash_keys", (t.keys, a.depth) if a.keys_by_row() else (a.depth, t.keys), "shared"),
        buf("flash_values", (t.keys, a.width), "shared"),
        buf("flash_tile_max", (r,), "shared"),
        buf("flash_total", (r,), "shared"),
    )


def flash_nest(a: Attention, t: Tiles, taken: set[str]) -> Stmt:
    """The nest of the module docstring; its names avoid `taken` (and are added to it)."""
    n = _names(a, t, taken)
    nest = _Nest(a, t, n, taken)
    per_tile = seq(
        *(Allocate(b) for b in (n.k, n.v, n.s, n.p, n.tile_max)),
        nest.fetch(),
        nest.scores(),
        nest.tile_max(),
        nest.update(),
    )
    body = seq(
        *(Allocate(b) for b in (n.q, n.m, n.l, n.acc, n.alpha, n.total)),
        nest.start(),
        For(n.kt, -(-a.keys // t.keys), "serial", per_tile),
        nest.row_sum(),
        nest.out(),
    )
    tiles = For(n.tile, -(-a.queries // t.queries), "blockIdx.x", body)
    return For(n.batch, a.batch, "blockIdx.y", tiles)


class _Nest:
    """The nest's stages, each a loop nest over the block's threads of its own."""

    def __init__(self, a: Attention, t: Tiles, n: _Names, taken: set[str]) -> None:
        self.a, self.t, self.n, self.taken = a, t, n, taken
        self.dt = a.out.dtype
        self.lowest = identity("max", self.dt)
        self.per_lane = t.keys // t.lanes

    def fresh(self, name: str) -> Var:
        return Var(unique_name(name, self.taken))

    def threads(self, body: Stmt, between: Callable[[Stmt], Stmt] = lambda s: s) -> Stmt:
        """`body` run by every thread of the block, threadIdx.y the row and threadIdx.x the
        lane, loops of its own; `between` wraps the lane loop inside the row loop."""
        row, lane = self.fresh("row"), self.fresh("lane")
        own = substitute(body, {self.n.row: row, self.n.lane: lane})
        inner = between(For(lane, self.t.lanes, "threadIdx.x", own))  # type: ignore[arg-type]
        return For(row, self.t.queries, "threadIdx.y", inner)

    # -- indices ------------------------------------------------------------------------------

    def row(self) -> Expr:
        """The thread's query row, clamped into the rows (a ragged last tile's extra rows
        compute the last row again, and do not write it)."""
        i = self.n.tile * self.t.queries + self.n.row
        return i if self.a.queries % self.t.queries == 0 else _min(i, self.a.queries - 1)

    def mine(self, j: Expr) -> Expr:
        """The tile column of the lane's `j`th key."""
        return j * self.t.lanes + self.n.lane

    def key(self, column: Expr, tile: Expr | None = None) -> Expr:
        """The key at `column` of the tile, clamped into the keys (past the last, a copy
        reads the last again and the logit hides it)."""
        j = simplify((self.n.kt if tile is None else tile) * self.t.keys + column)
        return j if self.a.keys % self.t.keys == 0 else _min(j, self.a.keys - 1)

    def visible(self) -> Expr | None:
        """Whether the block's last query sees the tile's first key (None: always)."""
        if self.a.seen is None:
            return None
        last = self.n.tile * self.t.queries + (self.t.queries - 1)
        return Binary("<", self.n.kt * self.t.keys, simplify(self.a.seen(self.n.batch, last)))

    def guarded(self, body: Stmt) -> Stmt:
        cond = self.visible()
        return body if cond is None else IfThenElse(cond, body)

    def own(self) -> tuple[Expr, Expr]:
        return (self.n.row, self.n.lane)

    # -- stages -------------------------------------------------------------------------------

    def start(self) -> Stmt:
        """Each thread: its query row, and an empty max, sum and accumulator."""
        n, a, own = self.n, self.a, self.own()
        d, e = self.fresh("d"), self.fresh("e")
        query = BufferStore(n.q, (*own, d), a.q(n.batch, self.row(), d))
        return self.threads(
            seq(
                BufferStore(n.m, own, self.lowest),
                BufferStore(n.l, own, const(0, self.dt)),
                For(e, a.width, "unrolled", BufferStore(n.acc, (*own, e), const(0, self.dt))),
                For(d, a.depth, "serial", query),
            )
        )

    def fetch(self) -> Stmt:
        """The tile's keys, then its values, copied to shared memory by all the threads."""
        n, a = self.n, self.a
        if a.keys_by_row():
            keys = self.copy(FETCHES[0], n.k, lambda b, kt, j, d: a.k(b, d, self.key(j, kt)))
        else:
            keys = self.copy(FETCHES[0], n.k, lambda b, kt, d, j: a.k(b, d, self.key(j, kt)))
        values = self.copy(FETCHES[1], n.v, lambda b, kt, j, e: a.v(b, self.key(j, kt), e))
        return self.threads(self.guarded(seq(keys, values)))

    def copy(self, name: str, dst: Buffer, value: Callable[..., Expr]) -> Stmt:
        """Block `name`: `dst[r, c] = value(batch, key tile, r, c)`, the threads taking
        consecutive elements (consecutive columns: a warp's loads coalesce)."""
        n, t = self.n, self.t
        rows, cols = dst.shape
        threads = t.queries * t.lanes
        step = self.fresh(f"{name.split('_')[1]}_step")
        flat = simplify((step * t.queries + n.row) * t.lanes + n.lane)
        vb, vt, vr, vc = (self.fresh(x) for x in ("vb", "vt", "vr", "vc"))
        ivs = (
            IterVar(vb, "spatial", self.a.batch, n.batch),
            IterVar(vt, "spatial", -(-self.a.keys // t.keys), n.kt),
            IterVar(vr, "spatial", rows, flat // cols),
            IterVar(vc, "spatial", cols, flat % cols),
        )
        x = value(vb, vt, vr, vc)
        loads = tuple(dict.fromkeys(m for m in walk(x) if isinstance(m, BufferLoad)))
        whole = rows * cols % threads == 0
        block = Block(
            name,
            ivs,
            tuple(BufferRegion(m.buffer, m.indices) for m in loads),
            (BufferRegion(dst, (vr, vc)),),
            BufferStore(dst, (vr, vc), x),
            predicate=None if whole else Binary("<", flat, IntImm(rows * cols)),
        )
        return For(step, -(-rows * cols // threads), "serial", block)

    def scores(self) -> Stmt:
        """Each lane's keys' scores in registers (over the head dimension), then their
        logits; a key past the last is hidden."""
        n, a = self.n, self.a
        j0, d, j, j1 = (self.fresh(x) for x in ("j0", "d", "j", "j1"))
        at = (n.row, self.mine(j))
        key = (self.mine(j), d) if a.keys_by_row() else (d, self.mine(j))
        q, k = BufferLoad(n.q, (*self.own(), d)), BufferLoad(n.k, key)
        score = BufferLoad(n.s, (n.row, self.mine(j1)))
        column = simplify(n.kt * self.t.keys + self.mine(j1))
        logit = a.logit(n.batch, self.row(), self.key(self.mine(j1)), score)
        if a.keys % self.t.keys:
            logit = Select(Binary("<", column, IntImm(a.keys)), logit, self.lowest)
        return self.threads(
            self.guarded(
                seq(
                    For(j0, self.per_lane, "unrolled",
                        BufferStore(n.s, (n.row, self.mine(j0)), const(0, self.dt))),
                    For(d, a.depth, "serial",
                        For(j, self.per_lane, "unrolled",
                            BufferStore(n.s, at, BufferLoad(n.s, at) + q * k))),
                    For(j1, self.per_lane, "unrolled", BufferStore(n.s, score.indices, logit)),
                )
            )
        )  # fmt: skip

    def tile_max(self) -> Stmt:
        """Block @attention_tile_max: each row's max logit of the tile, over its lanes."""
        n, t = self.n, self.t
        j, vr, vk = self.fresh("j"), self.fresh("vr"), self.fresh("vk")
        out = BufferLoad(n.tile_max, (vr,))
        block = Block(
            "attention_tile_max",
            (IterVar(vr, "spatial", t.queries, n.row), IterVar(vk, "reduce", t.keys, self.mine(j))),
            (BufferRegion(n.s, (vr, vk)),),
            (BufferRegion(n.tile_max, (vr,)),),
            BufferStore(n.tile_max, (vr,), Binary("max", out, BufferLoad(n.s, (vr, vk)))),
            init=BufferStore(n.tile_max, (vr,), self.lowest),
            predicate=self.visible(),
        )
        return self.threads(For(j, self.per_lane, "unrolled", block))

    def update(self) -> Stmt:
        """Each lane: the new max; its sum and accumulator rescaled by exp(old - new); its
        keys' exp(logit - new) added to the sum, and times their values to the accumulator."""
        n, a, own = self.n, self.a, self.own()
        m, alpha, total = BufferLoad(n.m, own), BufferLoad(n.alpha, own), BufferLoad(n.l, own)
        new_max = Binary("max", m, BufferLoad(n.tile_max, (n.row,)))
        j0, j1, e0, j, e = (self.fresh(x) for x in ("j0", "j1", "e0", "j", "e"))
        s0 = (n.row, self.mine(j0))
        exp = Call("exp", (BufferLoad(n.s, s0) - self.safe(m),))
        acc0, acc = BufferLoad(n.acc, (*own, e0)), BufferLoad(n.acc, (*own, e))
        p = BufferLoad(n.p, (n.row, self.mine(j)))
        value = BufferLoad(n.v, (self.mine(j), e))
        return self.threads(
            self.guarded(
                seq(
                    BufferStore(n.alpha, own, Call("exp", (m - self.safe(new_max),))),
                    BufferStore(n.m, own, new_max),
                    For(j0, self.per_lane, "unrolled", seq(
                        BufferStore(n.s, s0, exp),
                        BufferStore(n.p, s0, BufferLoad(n.s, s0)))),
                    BufferStore(n.l, own, total * alpha),
                    For(j1, self.per_lane, "unrolled", BufferStore(
                        n.l, own, total + BufferLoad(n.s, (n.row, self.mine(j1))))),
                    For(e0, a.width, "unrolled", BufferStore(n.acc, acc0.indices, acc0 * alpha)),
                    For(j, self.per_lane, "serial", For(e, a.width, "unrolled", BufferStore(
                        n.acc, acc.indices, acc + p * value))),
                )
            )
        )  # fmt: skip

    def safe(self, m: Expr) -> Expr:
        """The max an exp subtracts: 0 while it is -inf (every key so far hidden)."""
        return Select(Binary("==", m, self.lowest), const(0, self.dt), m)

    def row_sum(self) -> Stmt:
        """Block @attention_row_sum: each row's sum, over its lanes."""
        n, t = self.n, self.t
        vr, vk = self.fresh("vr"), self.fresh("vk")
        total = BufferLoad(n.total, (vr,))
        block = Block(
            "attention_row_sum",
            (IterVar(vr, "spatial", t.queries, n.row), IterVar(vk, "reduce", t.lanes, n.lane)),
            (BufferRegion(n.l, (vr, vk)),),
            (BufferRegion(n.total, (vr,)),),
            BufferStore(n.total, (vr,), total + BufferLoad(n.l, (vr, vk))),
            init=BufferStore(n.total, (vr,), const(0, self.dt)),
        )
        return self.threads(block)

    def out(self) -> Stmt:
        """Block @attention_out: the output, each lane's accumulator times 1 / the row's sum
        summed over the lanes, where the row is one (a ragged last tile's are not)."""
        n, a, t = self.n, self.a, self.t
        e = self.fresh("e")
        vb, vi, ve, vl = (self.fresh(x) for x in ("vb", "vi", "ve", "vl"))
        row = simplify(n.tile * t.queries + n.row)
        at = a.at(vb, vi, ve)
        mine = simplify(Binary("floormod", vi, IntImm(t.queries)))
        part = BufferLoad(n.acc, (mine, vl, ve)) * (
            const(1, self.dt) / BufferLoad(n.total, (mine,))
        )
        block = Block(
            "attention_out",
            (
                IterVar(vb, "spatial", a.batch, n.batch),
                IterVar(vi, "spatial", a.queries, row),
                IterVar(ve, "spatial", a.width, e),
                IterVar(vl, "reduce", t.lanes, n.lane),
            ),
            (BufferRegion(n.acc, (mine, vl, ve)), BufferRegion(n.total, (mine,))),
            (BufferRegion(a.out, at),),
            BufferStore(a.out, at, BufferLoad(a.out, at) + part),
            init=BufferStore(a.out, at, const(0, self.dt)),
            predicate=None if a.queries % t.queries == 0 else Binary("<", row, IntImm(a.queries)),
        )
        return self.threads(block, lambda lanes: For(e, a.width, "serial", lanes))


def _min(a: Expr, b: int) -> Expr:
    return Binary("min", a, IntImm(b))
