"""`__syncthreads()` where threads pass data through memory: a pass over lowered hextir.

    body = insert_syncs(body)     # Barrier nodes added

Thread-bound loop nests are stages (DESIGN.md §3). A barrier goes before a stage that reads a
buffer an earlier stage wrote since the last barrier, or writes one an earlier stage read or
wrote since then; and, in a serial loop holding stages, before the first stage of the body
that would overwrite what the end of the previous iteration still reads (the loop body is
analysed as if the previous iteration's pending accesses came first). A barrier goes before
the outermost statement that holds the waiting stage, so a loop of fetch stages waits once.
Per-thread (`local`) buffers never need one. Barriers go only where every thread of the
block reaches them: between statements of sequences and loop bodies that hold thread loops,
never inside a stage.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from hexir.ir.tir import Barrier, Block, Buffer, BufferLoad, BufferStore, For, Seq, Stmt, seq
from hexir.ir.visit import walk

THREAD_KINDS = ("threadIdx.x", "threadIdx.y", "threadIdx.z")
BOUND_KINDS = (*THREAD_KINDS, "blockIdx.x", "blockIdx.y", "blockIdx.z")


@dataclass(frozen=True)
class Pending:
    """Accesses to block-visible buffers since the last barrier."""

    reads: frozenset[Buffer] = frozenset()
    writes: frozenset[Buffer] = frozenset()

    def __or__(self, other: Pending) -> Pending:
        return Pending(self.reads | other.reads, self.writes | other.writes)

    def conflicts(self, other: Pending) -> bool:
        """Whether `other`, coming after these accesses, must wait for them: it reads what
        they wrote, or writes what they read. (Two stages writing one buffer write different
        elements in every schedule Hexir makes, so a write after a write does not wait.)"""
        return bool(other.reads & self.writes or other.writes & self.reads)


NOTHING = Pending()


def insert_syncs(body: Stmt) -> Stmt:
    """`body` with a Barrier wherever a stage must wait for an earlier one."""
    new, _ = _sync(body, NOTHING)
    return new


def _sync(stmt: Stmt, pending: Pending) -> tuple[Stmt, Pending]:
    if not isinstance(stmt, Seq) and pending.conflicts(accesses(stmt)):
        # As early as possible: before the outermost statement holding the stage that waits.
        new, after = _sync(stmt, NOTHING)
        return seq(Barrier(), new), after
    match stmt:
        case Seq(stmts):
            out: list[Stmt] = []
            for s in stmts:
                new, pending = _sync(s, pending)
                out.append(new)
            return seq(*out), pending
        case Barrier() if type(stmt) is Barrier:
            return stmt, NOTHING
        case For() if stmt.kind in BOUND_KINDS and _has_threads(stmt.body):
            # A bound loop is no loop on the GPU: nothing carries over between "iterations".
            body, pending = _sync(stmt.body, pending)
            return replace(stmt, body=body), pending
        case For() if stmt.kind != "vectorized" and _has_threads(stmt.body):
            return _sync_loop(stmt, pending)
        case Block(iter_vars=()) if stmt.predicate is None and _has_threads(stmt.body):
            body, pending = _sync(stmt.body, pending)
            return replace(stmt, body=body), pending
    return stmt, pending | accesses(stmt)


def _sync_loop(loop: For, pending: Pending) -> tuple[Stmt, Pending]:
    """The loop's body synced for its first iteration and for every later one, which starts
    with what the previous one left pending (a fixed point: accesses only accumulate)."""
    body, end = _sync(loop.body, pending)
    for _ in range(4):
        entry = pending | end
        body, new_end = _sync(loop.body, entry)
        if new_end == end:
            break
        end = new_end
    return replace(loop, body=body), end


def accesses(stmt: Stmt) -> Pending:
    """The block-visible buffers `stmt` reads and writes (`local` ones are per thread)."""
    reads: set[Buffer] = set()
    writes: set[Buffer] = set()
    for n in walk(stmt):
        match n:
            case BufferLoad(buffer) if buffer.scope != "local":
                reads.add(buffer)
            case BufferStore(buffer) if buffer.scope != "local":
                writes.add(buffer)
    return Pending(frozenset(reads), frozenset(writes))


def _has_threads(stmt: Stmt) -> bool:
    return any(isinstance(n, For) and n.kind in THREAD_KINDS for n in walk(stmt))


__all__ = ["Pending", "accesses", "insert_syncs"]
