"""The text form of the `hextir` dialect: the printer, and the entry points of the parser.

    hextir.func @relu(%A: buffer<16xf32>, %B: buffer<16xf32>) attributes {op = "hexir.relu"} {
      for %i in 0..16 serial {
        block @relu(vi = spatial(16) %i) reads(%A[vi]) writes(%B[vi]) {
          %B[vi] = max(%A[vi], 0.0)
        }
      }
    }

Loop vars and buffers print with `%`, block iter vars bare; the parser accepts either for any
name in scope. `parse_func(print_func(f)) == f` for every PrimFunc in canonical form (Seqs
flattened, every var bound by a loop or a block). The parser lives in `hexir.ir.tir_parse`.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterator
from contextlib import contextmanager

from hexir.ir.dtype import short_name
from hexir.ir.symbolic import format_dim
from hexir.ir.tir import (
    BIT_OPS,
    COMPARE_OPS,
    Allocate,
    Annotations,
    AnnotationValue,
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
    IterVar,
    PrimFunc,
    Range,
    Select,
    Seq,
    Stmt,
    Unary,
    Var,
)

# Binding strength of the infix operators; everything printed as a call is an atom.
INFIX_PREC = {
    "||": 1, "&&": 2,
    "==": 3, "!=": 3, "<": 3, "<=": 3, ">": 3, ">=": 3,
    "+": 4, "-": 4, "*": 5, "/": 5,
}  # fmt: skip
UNARY_PREC = 6
ATOM_PREC = 7
FUNCTION_OPS = ("floordiv", "floormod", "fmod", "min", "max", "pow", *BIT_OPS)

IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_.]*\Z")
# Identifiers that are literals: a var with such a name prints with `%` so it is never read back
# as a literal (`inf`, `nanf64`, `true`).
LITERAL_IDENT = re.compile(r"(?:inf|nan)(?:f16|f32|f64)?\Z|true\Z|false\Z")
# Names that start a call in an expression; a bare var of that name would read as one.
RESERVED = frozenset(FUNCTION_OPS) | {"select", "cast"}

INDENT = "  "


def print_expr(expr: Expr) -> str:
    """One expression; every var prints with `%` (no block is in sight to make one bare)."""
    return _Printer().expr(expr)


def print_stmt(stmt: Stmt) -> str:
    return _Printer().stmts(stmt)


def print_func(func: PrimFunc) -> str:
    return _Printer().func(func)


def print_buffer_type(buffer: Buffer) -> str:
    """`buffer<64x32xf32, shared>`: dims (`{seq}` for a symbolic one), then the short dtype;
    the scope unless global."""
    dims = "".join(f"{format_dim(d)}x" for d in buffer.shape)
    scope = "" if buffer.scope == "global" else f", {buffer.scope}"
    return f"buffer<{dims}{short_name(buffer.dtype)}{scope}>"


def print_region(region: BufferRegion) -> str:
    return _Printer().region(region)


def print_canonical(func: PrimFunc) -> str:
    """The key form: the func named `f`, buffers `b0, b1, ...` and vars `v0, v1, ...` numbered
    at their binding sites in printing order, attrs left out."""
    printer = _Printer(canonical=True)
    return printer.func(PrimFunc("f", func.params, func.body, func.num_outputs))


def parse_func(text: str) -> PrimFunc:
    from hexir.ir.tir_parse import parse_func as parse

    return parse(text)


def parse_expr(text: str, scope: dict[str, Var | Buffer] | None = None) -> Expr:
    """An expression over the names in `scope` (vars by name, buffers by name)."""
    from hexir.ir.tir_parse import parse_expr as parse

    return parse(text, scope)


def is_bare_name(name: str) -> bool:
    """Whether a var of this name can print without `%` and still read back as that var."""
    return bool(IDENT.match(name)) and not LITERAL_IDENT.match(name) and name not in RESERVED


# ---------------------------------------------------------------------------------------------
# Immediates and annotation values


def int_text(imm: IntImm) -> str:
    if imm.dtype == "bool" and imm.value in (0, 1):
        return "true" if imm.value else "false"
    suffix = "" if imm.dtype == "int32" else short_name(imm.dtype)
    return f"{imm.value}{suffix}"


def float_text(imm: FloatImm) -> str:
    # repr is the shortest text that reads back to the same double (inf, -inf and nan included).
    text = "nan" if math.isnan(imm.value) else repr(imm.value)
    suffix = "" if imm.dtype == "float32" else short_name(imm.dtype)
    return f"{text}{suffix}"


def annotation_value_text(value: AnnotationValue) -> str:
    match value:
        case bool():
            return "true" if value else "false"
        case int():
            return str(value)
        case float():
            return "nan" if math.isnan(value) else repr(value)
        case str():
            return json.dumps(value)
        case tuple():
            items = [annotation_value_text(v) for v in value]
            return f"({items[0]},)" if len(items) == 1 else f"({', '.join(items)})"
    raise TypeError(f"cannot print annotation value {value!r} of type {type(value).__name__}")


def annotations_text(items: Annotations) -> str:
    """` attributes {key = value, ...}`, or nothing for no annotations."""
    if not items:
        return ""
    parts = [
        f"{k if IDENT.match(k) else json.dumps(k)} = {annotation_value_text(v)}" for k, v in items
    ]
    return f" attributes {{{', '.join(parts)}}}"


# ---------------------------------------------------------------------------------------------
# The printer


class _Printer:
    """Prints with scopes, so that iter vars print bare and the canonical form numbers names."""

    def __init__(self, canonical: bool = False) -> None:
        self.canonical = canonical
        # Innermost scope last. Vars: name -> (printed name, bare); buffers: name -> printed.
        self.vars: list[dict[str, tuple[str, bool]]] = [{}]
        self.buffers: list[dict[str, str]] = [{}]
        self.counts = {"v": 0, "b": 0}
        self.lines: list[str] = []

    @contextmanager
    def scope(self) -> Iterator[None]:
        self.vars.append({})
        self.buffers.append({})
        try:
            yield
        finally:
            self.vars.pop()
            self.buffers.pop()

    def fresh(self, prefix: str, name: str) -> str:
        if not self.canonical:
            return name
        n = self.counts[prefix]
        self.counts[prefix] = n + 1
        return f"{prefix}{n}"

    def bind_var(self, var: Var, bare: bool) -> str:
        """Declare `var` in the innermost scope; return how its binder prints."""
        printed = self.fresh("v", var.name)
        bare = bare and is_bare_name(printed)
        self.vars[-1][var.name] = (printed, bare)
        return printed if bare else f"%{printed}"

    def bind_buffer(self, buffer: Buffer) -> str:
        printed = self.fresh("b", buffer.name)
        self.buffers[-1][buffer.name] = printed
        return f"%{printed}"

    def var_ref(self, var: Var) -> str:
        for frame in reversed(self.vars):
            if var.name in frame:
                printed, bare = frame[var.name]
                return printed if bare else f"%{printed}"
        # A free var (only in a standalone expression or statement): declared where first seen.
        self.bind_var_outermost(var)
        return self.var_ref(var)

    def bind_var_outermost(self, var: Var) -> None:
        self.vars[0][var.name] = (self.fresh("v", var.name), False)

    def buffer_ref(self, buffer: Buffer) -> str:
        for frame in reversed(self.buffers):
            if buffer.name in frame:
                return f"%{frame[buffer.name]}"
        printed = self.fresh("b", buffer.name)
        self.buffers[0][buffer.name] = printed
        return f"%{printed}"

    # -- expressions --------------------------------------------------------------------------

    def expr(self, e: Expr, prec: int = 0) -> str:
        text, own = self.expr_prec(e)
        return f"({text})" if own < prec else text

    def expr_prec(self, e: Expr) -> tuple[str, int]:
        """The text of `e` and how strongly it binds."""
        match e:
            case Var():
                return self.var_ref(e), ATOM_PREC
            case IntImm():
                return int_text(e), ATOM_PREC
            case FloatImm():
                return float_text(e), ATOM_PREC
            case Binary(op, a, b) if op in INFIX_PREC:
                p = INFIX_PREC[op]
                # Left-associative; comparisons also parenthesize a comparison on the left.
                left = self.expr(a, p + 1 if op in COMPARE_OPS else p)
                return f"{left} {op} {self.expr(b, p + 1)}", p
            case Binary(op, a, b):
                return f"{op}({self.expr(a)}, {self.expr(b)})", ATOM_PREC
            case Unary(op, a):
                # `-(3)` is a negation of a literal; `-3` is the literal itself.
                literal = op == "-" and isinstance(a, (IntImm, FloatImm))
                inner = f"({self.expr(a)})" if literal else self.expr(a, UNARY_PREC)
                return f"{op}{inner}", UNARY_PREC
            case Call(name, args):
                return f"{name}({', '.join(self.expr(x) for x in args)})", ATOM_PREC
            case Select(c, t, f):
                return f"select({self.expr(c)}, {self.expr(t)}, {self.expr(f)})", ATOM_PREC
            case Cast(dtype, value):
                return f"cast<{short_name(dtype)}>({self.expr(value)})", ATOM_PREC
            case BufferLoad(buffer, indices):
                return f"{self.buffer_ref(buffer)}[{self.exprs(indices)}]", ATOM_PREC
        raise TypeError(f"not a hextir expression: {type(e).__name__}")

    def exprs(self, items: tuple[Expr, ...]) -> str:
        return ", ".join(self.expr(x) for x in items)

    def region(self, region: BufferRegion) -> str:
        axes = [
            f"{self.expr(r.start)}:{self.expr(r.stop)}" if isinstance(r, Range) else self.expr(r)
            for r in region.region
        ]
        return f"{self.buffer_ref(region.buffer)}[{', '.join(axes)}]"

    # -- statements ---------------------------------------------------------------------------

    def emit(self, depth: int, text: str) -> None:
        self.lines.append(INDENT * depth + text)

    def stmts(self, stmt: Stmt, depth: int = 0) -> str:
        self.stmt(stmt, depth)
        return "\n".join(self.lines)

    def stmt(self, s: Stmt, depth: int) -> None:
        match s:
            case For(var, extent, kind, body, ann):
                with self.scope():
                    name = self.bind_var(var, bare=False)
                    self.emit(
                        depth,
                        f"for {name} in 0..{format_dim(extent)} {kind}{annotations_text(ann)} {{",
                    )
                    self.stmt(body, depth + 1)
                self.emit(depth, "}")
            case Block():
                self.block(s, depth)
            case BufferStore(buffer, indices, value):
                target = f"{self.buffer_ref(buffer)}[{self.exprs(indices)}]"
                self.emit(depth, f"{target} = {self.expr(value)}")
            case Allocate(buffer):
                self.emit(depth, f"alloc {self.bind_buffer(buffer)}: {print_buffer_type(buffer)}")
            case IfThenElse(cond, then, else_):
                self.emit(depth, f"if {self.expr(cond)} {{")
                self.nested(then, depth + 1)
                if else_ is not None:
                    self.emit(depth, "} else {")
                    self.nested(else_, depth + 1)
                self.emit(depth, "}")
            case Barrier():
                self.emit(depth, "barrier")
            case Seq(items):
                for item in items:
                    self.stmt(item, depth)
            case _:
                raise TypeError(f"not a hextir statement: {type(s).__name__}")

    def nested(self, body: Stmt, depth: int) -> None:
        with self.scope():
            self.stmt(body, depth)

    def block(self, b: Block, depth: int) -> None:
        # Bindings read the enclosing scope, so they print before the iter vars are declared.
        bindings = [self.expr(iv.binding) for iv in b.iter_vars]
        with self.scope():
            ivs = [self.iter_var(iv, text) for iv, text in zip(b.iter_vars, bindings, strict=True)]
            reads = ", ".join(self.region(r) for r in b.reads)
            writes = ", ".join(self.region(r) for r in b.writes)
            head = f"block @{b.name}({', '.join(ivs)}) reads({reads}) writes({writes})"
            if b.predicate is not None:
                head += f" where {self.expr(b.predicate)}"
            self.emit(depth, f"{head}{annotations_text(b.annotations)} {{")
            if b.init is not None:
                self.emit(depth + 1, "init {")
                self.nested(b.init, depth + 2)
                self.emit(depth + 1, "}")
            self.stmt(b.body, depth + 1)
        self.emit(depth, "}")

    def iter_var(self, iv: IterVar, binding: str) -> str:
        return f"{self.bind_var(iv.var, bare=True)} = {iv.kind}({format_dim(iv.dom)}) {binding}"

    # -- functions ----------------------------------------------------------------------------

    def func(self, f: PrimFunc) -> str:
        params = ", ".join(f"{self.bind_buffer(p)}: {print_buffer_type(p)}" for p in f.params)
        head = f"hextir.func @{f.name}({params})"
        if f.num_outputs != 1:
            head += f" outputs {f.num_outputs}"
        self.emit(0, f"{head}{annotations_text(f.attrs)} {{")
        with self.scope():
            self.stmt(f.body, 1)
        self.emit(0, "}")
        return "\n".join(self.lines)
