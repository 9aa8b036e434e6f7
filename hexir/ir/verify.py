"""The invariants of a hextir PrimFunc, checked after every schedule primitive in tests.

    verify(func)          # None, or VerifyError listing every problem, each naming its node
    problems(func)        # the same list, without raising

Scoping is TVM's: a block is opaque. Its iter var bindings see the enclosing loop vars (and
the iter vars of enclosing blocks); its regions, init and body see only its own iter vars, the
iter vars of enclosing blocks, and loops opened inside it. Its predicate also sees the
enclosing loop vars, as a non-dividing split writes it.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, replace

from hexir.errors import VerifyError
from hexir.ir.dtype import is_float, is_int
from hexir.ir.tir import (
    ARITH_OPS,
    BIT_OPS,
    LOGIC_OPS,
    Allocate,
    Annotations,
    Barrier,
    Binary,
    Block,
    Buffer,
    BufferLoad,
    BufferRegion,
    BufferStore,
    Call,
    Cast,
    Expr,
    FloatImm,
    For,
    IfThenElse,
    IntImm,
    PrimFunc,
    Range,
    Select,
    Seq,
    Stmt,
    Unary,
    Var,
)
from hexir.ir.tir_text import print_expr
from hexir.ir.visit import free_vars


def verify(func: PrimFunc) -> None:
    """Raise VerifyError listing every broken invariant of `func`; return None when it has none."""
    found = problems(func)
    if found:
        raise VerifyError(f"@{func.name} breaks {len(found)} hextir invariant(s):", tuple(found))


def problems(func: PrimFunc) -> list[str]:
    """Every broken invariant of `func`, in program order, each prefixed by where it is."""
    v = _Verifier()
    v.func(func)
    return list(dict.fromkeys(v.problems))  # a var misused in ten places is one problem


@dataclass(frozen=True, slots=True)
class _Scope:
    vars: frozenset[Var]  # usable here
    hidden: frozenset[Var]  # loop vars outside the enclosing block: defined, but opaque
    block_vars: frozenset[Var]  # iter vars of the enclosing blocks
    buffers: Mapping[str, Buffer]
    where: str  # the innermost loop or block, to name it in messages


def _show(e: Expr) -> str:
    text = print_expr(e)
    return text if len(text) <= 80 else text[:77] + "..."


class _Verifier:
    def __init__(self) -> None:
        self.problems: list[str] = []
        self.loop_names: set[str] = set()
        self.written: set[str] = set()

    def report(self, where: str, message: str) -> None:
        self.problems.append(f"{where}: {message}")

    def func(self, f: PrimFunc) -> None:
        where = f"func @{f.name}"
        names = [p.name for p in f.params]
        for dup in sorted({n for n in names if names.count(n) > 1}):
            self.report(where, f"two params named %{dup}")
        if not 0 < f.num_outputs <= len(f.params):
            self.report(where, f"num_outputs={f.num_outputs} with {len(f.params)} params")
        for p in f.params:
            self.shape(p, where)
        self.annotations(f.attrs, where, "attrs")
        scope = _Scope(frozenset(), frozenset(), frozenset(), {p.name: p for p in f.params}, where)
        self.stmt(f.body, scope)
        for out in f.outputs if 0 < f.num_outputs <= len(f.params) else ():
            if out.name not in self.written:
                self.report(where, f"output %{out.name} is never stored to")

    # -- statements -----------------------------------------------------------------------

    def stmt(self, s: Stmt, sc: _Scope) -> None:
        match s:
            case For():
                self.loop(s, sc)
            case Block():
                self.block(s, sc)
            case BufferStore(buf, indices, value):
                self.access(buf, indices, sc, "store to")
                self.expr(value, sc)
                if value.dtype != buf.dtype:
                    self.report(sc.where, f"stores {value.dtype} into %{buf.name} of {buf.dtype}")
                self.written.add(buf.name)
            case IfThenElse(cond, then, else_):
                self.condition(cond, sc, "if condition")
                self.stmt(then, sc)
                if else_ is not None:
                    self.stmt(else_, sc)
            case Seq(stmts):
                for child in stmts:
                    sc = self.stmt_in_seq(child, sc)
            case Allocate(buf):
                self.allocate(buf, sc)  # declares nothing: no statement follows it
            case Barrier():
                pass
            case _:
                self.report(sc.where, f"{type(s).__name__} where a statement belongs")

    def stmt_in_seq(self, s: Stmt, sc: _Scope) -> _Scope:
        """Check `s`; an Allocate declares its buffer for the statements after it."""
        if not isinstance(s, Allocate):
            self.stmt(s, sc)
            return sc
        self.allocate(s.buffer, sc)
        return replace(sc, buffers={**sc.buffers, s.buffer.name: s.buffer})

    def allocate(self, buf: Buffer, sc: _Scope) -> None:
        if buf.name in sc.buffers:
            self.report(sc.where, f"allocates %{buf.name}, a name already declared here")
        self.shape(buf, sc.where)

    def loop(self, s: For, sc: _Scope) -> None:
        where = f"for %{s.var.name}"
        if s.var.name in self.loop_names:
            self.report(where, f"loop var %{s.var.name} is bound by two loops")
        elif _named(s.var.name, sc.vars | sc.hidden):
            self.report(where, f"loop var %{s.var.name} shadows a var of an enclosing scope")
        self.loop_names.add(s.var.name)
        if s.extent <= 0:
            self.report(where, f"extent {s.extent} is not positive")
        self.annotations(s.annotations, where, "annotations")
        self.stmt(s.body, replace(sc, vars=sc.vars | {s.var}, where=where))

    def block(self, b: Block, sc: _Scope) -> None:
        where = f"block @{b.name}"
        outer = replace(sc, where=where)
        seen: set[str] = set()
        for iv in b.iter_vars:
            if iv.var.name in seen or _named(iv.var.name, sc.vars | sc.hidden):
                self.report(where, f"iter var {iv.var.name} is bound twice or shadows a var")
            seen.add(iv.var.name)
            if iv.dom <= 0:
                self.report(where, f"iter var {iv.var.name} has domain {iv.dom}, not positive")
            self.index(iv.binding, outer, f"binding of {iv.var.name}")
        own = frozenset(iv.var for iv in b.iter_vars)
        inner = _Scope(
            vars=sc.block_vars | own,
            hidden=sc.hidden | (sc.vars - sc.block_vars),
            block_vars=sc.block_vars | own,
            buffers=sc.buffers,
            where=where,
        )
        for region in b.reads + b.writes:
            self.region(region, inner)
        if b.predicate is not None:
            # TVM-style: a predicate (from a non-dividing split) reads the enclosing loop vars.
            guard = replace(inner, vars=sc.vars | own, hidden=sc.hidden)
            self.condition(b.predicate, guard, "predicate")
        for part in (b.init, b.body):
            if part is not None:
                self.stmt(part, inner)
        self.reduce_writes(b)
        self.annotations(b.annotations, where, "annotations")

    def reduce_writes(self, b: Block) -> None:
        """A reduce iter var indexing a write would give each reduction step its own result."""
        reduce = {iv.var for iv in b.iter_vars if iv.kind == "reduce"}
        if not reduce:
            return
        writes = [(w.buffer.name, _region_exprs(w)) for w in b.writes]
        writes += [(s.buffer.name, s.indices) for s in _own_stores(b)]
        for name, exprs in writes:
            for var in sorted(_vars_of(exprs) & reduce, key=lambda v: v.name):
                self.report(
                    f"block @{b.name}", f"reduce iter var {var.name} indexes the write of %{name}"
                )

    def annotations(self, items: Annotations, where: str, what: str) -> None:
        keys = [k for k, _ in items]
        if any(a >= b for a, b in itertools.pairwise(keys)):
            self.report(where, f"{what} not sorted by unique key: {keys}")

    def shape(self, buf: Buffer, where: str) -> None:
        if any(d <= 0 for d in buf.shape):
            self.report(where, f"buffer %{buf.name} has a non-positive extent: {buf.shape}")

    # -- expressions ----------------------------------------------------------------------

    def expr(self, e: Expr, sc: _Scope) -> None:
        match e:
            case Var():
                self.var(e, sc)
            case IntImm() | FloatImm():
                pass
            case Binary(op, a, b):
                self.expr(a, sc)
                self.expr(b, sc)
                self.binary_types(e, op, a.dtype, b.dtype, sc.where)
            case Unary(op, a):
                self.expr(a, sc)
                if (op == "!") != (a.dtype == "bool"):
                    self.report(sc.where, f"{op} applied to {a.dtype} in {_show(e)}")
            case Call(_, args):
                for a in args:
                    self.expr(a, sc)
            case Select(c, t, f):
                self.condition(c, sc, "select condition")
                self.expr(t, sc)
                self.expr(f, sc)
                if t.dtype != f.dtype:
                    self.report(sc.where, f"select branches {t.dtype} vs {f.dtype}: {_show(e)}")
            case Cast(_, value):
                self.expr(value, sc)
            case BufferLoad(buf, indices):
                self.access(buf, indices, sc, "load of")
            case _:
                self.report(sc.where, f"{type(e).__name__} where an expression belongs")

    def var(self, v: Var, sc: _Scope) -> None:
        if v in sc.vars:
            return
        if v in sc.hidden:
            self.report(sc.where, f"uses loop var %{v.name} from outside the block (opaque)")
        else:
            self.report(sc.where, f"uses undefined var %{v.name}")

    def binary_types(self, e: Expr, op: str, da: str, db: str, where: str) -> None:
        if op in LOGIC_OPS:
            ok = da == db == "bool"
        elif op in ("floordiv", "floormod", *BIT_OPS):
            ok = is_int(da) and is_int(db)
        elif op in ARITH_OPS:
            ok = (is_int(da) and is_int(db)) or (is_float(da) and da == db)
        else:  # comparisons: bools compare with bools
            ok = (is_int(da) and is_int(db)) or da == db
        if not ok:
            self.report(where, f"operands of {op} are {da} and {db}: {_show(e)}")

    def condition(self, cond: Expr, sc: _Scope, what: str) -> None:
        self.expr(cond, sc)
        if cond.dtype != "bool":
            self.report(sc.where, f"{what} is {cond.dtype}, not bool: {_show(cond)}")

    def index(self, e: Expr, sc: _Scope, what: str) -> None:
        self.expr(e, sc)
        if not is_int(e.dtype):
            self.report(sc.where, f"{what} is {e.dtype}, not an integer: {_show(e)}")

    def access(self, buf: Buffer, indices: Iterable[Expr], sc: _Scope, what: str) -> None:
        indices = tuple(indices)
        self.buffer(buf, sc)
        if len(indices) != len(buf.shape):
            self.report(
                sc.where, f"{what} %{buf.name} has {len(indices)} indices, rank {len(buf.shape)}"
            )
        for i in indices:
            self.index(i, sc, f"index of %{buf.name}")

    def region(self, region: BufferRegion, sc: _Scope) -> None:
        axes = region.region
        self.buffer(region.buffer, sc)
        if len(axes) != len(region.buffer.shape):
            self.report(
                sc.where,
                f"region of %{region.buffer.name} has {len(axes)} axes, "
                f"rank {len(region.buffer.shape)}",
            )
        for e in _region_exprs(region):
            self.index(e, sc, f"region bound of %{region.buffer.name}")

    def buffer(self, buf: Buffer, sc: _Scope) -> None:
        declared = sc.buffers.get(buf.name)
        if declared is None:
            self.report(sc.where, f"uses %{buf.name}, neither a param nor allocated before")
        elif declared != buf:
            self.report(sc.where, f"uses %{buf.name} with a type other than its declaration's")


def _named(name: str, vars: Iterable[Var]) -> bool:
    return any(v.name == name for v in vars)


def _region_exprs(region: BufferRegion) -> tuple[Expr, ...]:
    out: list[Expr] = []
    for r in region.region:
        out.extend((r.start, r.stop) if isinstance(r, Range) else (r,))
    return tuple(out)


def _vars_of(exprs: Iterable[Expr]) -> set[Var]:
    out: set[Var] = set()
    for e in exprs:
        out |= free_vars(e)
    return out


def _own_stores(b: Block) -> Iterator[BufferStore]:
    """The stores of `b` itself: nested blocks own theirs."""
    stack: list[Stmt] = [b.body] + ([b.init] if b.init is not None else [])
    while stack:
        match stack.pop():
            case BufferStore() as s:
                yield s
            case For(body=body):
                stack.append(body)
            case Seq(stmts):
                stack.extend(stmts)
            case IfThenElse(then=then, else_=else_):
                stack.extend([then] if else_ is None else [then, else_])
