"""The `hextir` dialect: loop nests whose every loop carries its schedule as a `kind`.

Every node is a frozen dataclass: structural equality, hashable, rewritten by building new
trees (`dataclasses.replace`). Shapes and loop extents are static ints. Loops run from 0 to
`extent`. Index variables are `Var`s of dtype int32.

The text form (see `hexir.ir.tir_text`) is the `repr` of every node, and
`hexir.parse(str(func)) == func` holds for every PrimFunc the project produces.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Union

from hexir.ir.dtype import check_dtype, is_float
from hexir.ir.symbolic import Dim, Sym, SymbolicError

# ---------------------------------------------------------------------------------------------
# Expressions


class ExprBase:
    """Operator sugar shared by every expression node (builds nodes, does not simplify)."""

    __slots__ = ()

    def __add__(self, other: ExprLike) -> Binary:
        return Binary("+", self, as_expr(other, self))  # type: ignore[arg-type]

    def __radd__(self, other: ExprLike) -> Binary:
        return Binary("+", as_expr(other, self), self)  # type: ignore[arg-type]

    def __sub__(self, other: ExprLike) -> Binary:
        return Binary("-", self, as_expr(other, self))  # type: ignore[arg-type]

    def __rsub__(self, other: ExprLike) -> Binary:
        return Binary("-", as_expr(other, self), self)  # type: ignore[arg-type]

    def __mul__(self, other: ExprLike) -> Binary:
        return Binary("*", self, as_expr(other, self))  # type: ignore[arg-type]

    def __rmul__(self, other: ExprLike) -> Binary:
        return Binary("*", as_expr(other, self), self)  # type: ignore[arg-type]

    def __truediv__(self, other: ExprLike) -> Binary:
        return Binary("/", self, as_expr(other, self))  # type: ignore[arg-type]

    def __rtruediv__(self, other: ExprLike) -> Binary:
        return Binary("/", as_expr(other, self), self)  # type: ignore[arg-type]

    def __floordiv__(self, other: ExprLike) -> Binary:
        return Binary("floordiv", self, as_expr(other, self))  # type: ignore[arg-type]

    def __mod__(self, other: ExprLike) -> Binary:
        return Binary("floormod", self, as_expr(other, self))  # type: ignore[arg-type]

    def __neg__(self) -> Unary:
        return Unary("-", self)  # type: ignore[arg-type]

    def __repr__(self) -> str:
        from hexir.ir.tir_text import print_expr

        return print_expr(self)  # type: ignore[arg-type]

    __str__ = __repr__


@dataclass(frozen=True, slots=True, repr=False)
class Var(ExprBase):
    """A loop variable or a block iter var (always an int32 index)."""

    name: str
    dtype: str = "int32"


@dataclass(frozen=True, slots=True, repr=False)
class IntImm(ExprBase):
    """An integer or boolean constant (bool: value 0 or 1, dtype "bool")."""

    value: int
    dtype: str = "int32"

    def __post_init__(self) -> None:
        if isinstance(self.value, Sym):  # a size known at run time is `dim_expr`'s, not a literal
            raise SymbolicError(
                f"the dimension {{{self.value}}} is symbolic where a number is needed"
            )


@dataclass(frozen=True, slots=True, repr=False)
class FloatImm(ExprBase):
    """A floating-point constant; `value` may be inf, -inf or nan."""

    value: float
    dtype: str = "float32"

    def __eq__(self, other: object) -> bool:
        # nan == nan structurally, so a function holding a nan constant equals its parse.
        if not isinstance(other, FloatImm):
            return NotImplemented
        both_nan = self.value != self.value and other.value != other.value
        same = self.value == other.value or both_nan
        return same and self.dtype == other.dtype

    def __hash__(self) -> int:
        return hash(("FloatImm", repr(self.value), self.dtype))


# Binary operators. Arithmetic: + - * / (true division for floats), floordiv and floormod (for
# ints), fmod (C's remainder: the dividend's sign; ints and floats), min, max, pow, and on ints
# the bitwise shl, shr (arithmetic for signed), bitand, bitor, bitxor. Comparisons give bool:
# == != < <= > >=. Logic on bools: && ||.
BIT_OPS = ("shl", "shr", "bitand", "bitor", "bitxor")
ARITH_OPS = ("+", "-", "*", "/", "floordiv", "floormod", "fmod", "min", "max", "pow", *BIT_OPS)
COMPARE_OPS = ("==", "!=", "<", "<=", ">", ">=")
LOGIC_OPS = ("&&", "||")
BINARY_OPS = ARITH_OPS + COMPARE_OPS + LOGIC_OPS


@dataclass(frozen=True, slots=True, repr=False)
class Binary(ExprBase):
    op: str
    a: Expr
    b: Expr

    def __post_init__(self) -> None:
        if self.op not in BINARY_OPS:
            raise ValueError(f"unknown binary operator {self.op!r}")

    @property
    def dtype(self) -> str:
        if self.op in COMPARE_OPS or self.op in LOGIC_OPS:
            return "bool"
        return self.a.dtype


@dataclass(frozen=True, slots=True, repr=False)
class Unary(ExprBase):
    """Negation (`-`) or logical not (`!`)."""

    op: str
    a: Expr

    def __post_init__(self) -> None:
        if self.op not in ("-", "!"):
            raise ValueError(f"unknown unary operator {self.op!r}")

    @property
    def dtype(self) -> str:
        return self.a.dtype


# Math calls: the result has the dtype of the first argument. round: to nearest, ties to even.
CALLS = (
    "exp", "log", "sqrt", "rsqrt", "tanh", "erf", "sigmoid", "abs", "floor", "ceil",
    "round", "sin", "cos",
)  # fmt: skip


@dataclass(frozen=True, slots=True, repr=False)
class Call(ExprBase):
    name: str
    args: tuple[Expr, ...]

    def __post_init__(self) -> None:
        if self.name not in CALLS:
            raise ValueError(f"unknown math call {self.name!r}")

    @property
    def dtype(self) -> str:
        return self.args[0].dtype


@dataclass(frozen=True, slots=True, repr=False)
class Select(ExprBase):
    """`cond ? then : else_`, both branches evaluated (no side effects exist)."""

    cond: Expr
    then: Expr
    else_: Expr

    @property
    def dtype(self) -> str:
        return self.then.dtype


@dataclass(frozen=True, slots=True, repr=False)
class Cast(ExprBase):
    dtype: str
    value: Expr


@dataclass(frozen=True, slots=True, repr=False)
class BufferLoad(ExprBase):
    buffer: Buffer
    indices: tuple[Expr, ...]

    @property
    def dtype(self) -> str:
        return self.buffer.dtype


Expr = Union[Var, IntImm, FloatImm, Binary, Unary, Call, Select, Cast, BufferLoad]
ExprLike = Union[Expr, int, float, bool, Sym]


def as_expr(value: ExprLike, like: object = None) -> Expr:
    """Wrap a Python number as an immediate; a float takes `like`'s dtype when it is a float."""
    if isinstance(value, bool):
        return IntImm(int(value), "bool")
    if isinstance(value, int):
        return IntImm(value)
    if isinstance(value, float):
        dtype = getattr(like, "dtype", "float32")
        return FloatImm(value, dtype if is_float(dtype) else "float32")
    if isinstance(value, Sym):  # a symbolic size in an index: its value, an argument
        return dim_expr(value, "int32")
    return value


def symbol_var(name: str) -> Var:
    """The var holding a symbolic size's value in a kernel (an int64 argument)."""
    return Var(name, "int64")


def dim_expr(extent: Dim, dtype: str = "int64") -> Expr:
    """An extent as an expression: a literal, or its symbols' vars (int64) combined."""
    if isinstance(extent, int):
        return IntImm(extent, dtype)
    total: Expr | None = None
    for name, coefficient in extent.terms:
        term: Expr = symbol_var(name)
        if coefficient != 1:
            term = Binary("*", IntImm(coefficient, "int64"), term)
        total = term if total is None else Binary("+", total, term)
    assert total is not None
    if extent.offset:
        total = Binary("+", total, IntImm(extent.offset, "int64"))
    return total if dtype == "int64" else Cast(dtype, total)


def const(value: int | float, dtype: str) -> Expr:
    """An immediate of `dtype` holding `value`."""
    dtype = check_dtype(dtype)
    if is_float(dtype):
        return FloatImm(float(value), dtype)
    return IntImm(int(value), dtype)


# ---------------------------------------------------------------------------------------------
# Buffers and regions

SCOPES = ("global", "shared", "local")


@dataclass(frozen=True, slots=True, repr=False)
class Buffer:
    """A named n-d array. Parameters are `global`; `Allocate` declares the others. An extent
    may be symbolic (a `Sym`: a size the kernel is given when it runs, see `PrimFunc`)."""

    name: str
    shape: tuple[Dim, ...]
    dtype: str = "float32"
    scope: str = "global"

    def __post_init__(self) -> None:
        if self.scope not in SCOPES:
            raise ValueError(f"unknown buffer scope {self.scope!r}")

    def __getitem__(self, indices: ExprLike | tuple[ExprLike, ...]) -> BufferLoad:
        if not isinstance(indices, tuple):
            indices = (indices,)
        return BufferLoad(self, tuple(as_expr(i) for i in indices))

    @property
    def size(self) -> Dim:
        n: Dim = 1
        for s in self.shape:
            n *= s
        return n

    def __repr__(self) -> str:
        from hexir.ir.tir_text import print_buffer_type

        return f"%{self.name}: {print_buffer_type(self)}"


@dataclass(frozen=True, slots=True, repr=False)
class Range:
    """The half-open interval [start, stop) of one axis of a buffer region."""

    start: Expr
    stop: Expr


@dataclass(frozen=True, slots=True, repr=False)
class BufferRegion:
    """A region of a buffer: a point index (an Expr) or a Range per axis."""

    buffer: Buffer
    region: tuple[Expr | Range, ...]


# ---------------------------------------------------------------------------------------------
# Statements

LOOP_KINDS = (
    "serial", "parallel", "vectorized", "unrolled",
    "blockIdx.x", "blockIdx.y", "blockIdx.z",
    "threadIdx.x", "threadIdx.y", "threadIdx.z",
    "vthread",
)  # fmt: skip
GPU_KINDS = LOOP_KINDS[4:]

# An annotation value: ints, floats, strings, bools, and flat tuples of ints. A graph op's
# attribute that is a dimension may be symbolic (a Sym, alone or in the tuple).
AnnotationValue = Union[int, float, str, bool, Sym, tuple[int | Sym, ...]]
Annotations = tuple[tuple[str, AnnotationValue], ...]


class StmtBase:
    __slots__ = ()

    def __repr__(self) -> str:
        from hexir.ir.tir_text import print_stmt

        return print_stmt(self)  # type: ignore[arg-type]

    __str__ = __repr__


@dataclass(frozen=True, slots=True, repr=False)
class For(StmtBase):
    """`for var in 0..extent kind { body }`. Annotations are sorted by key. The extent may
    be symbolic (`for %i in 0..{seq} parallel`)."""

    var: Var
    extent: Dim
    kind: str
    body: Stmt
    annotations: Annotations = ()

    def __post_init__(self) -> None:
        if self.kind not in LOOP_KINDS:
            raise ValueError(f"unknown loop kind {self.kind!r}; expected one of {LOOP_KINDS}")


@dataclass(frozen=True, slots=True, repr=False)
class IterVar:
    """A block iter var: `var = kind(dom) binding`; kind is "spatial" or "reduce"."""

    var: Var
    kind: str
    dom: Dim
    binding: Expr

    def __post_init__(self) -> None:
        if self.kind not in ("spatial", "reduce"):
            raise ValueError(f"unknown iter var kind {self.kind!r}")


@dataclass(frozen=True, slots=True, repr=False)
class Block(StmtBase):
    """A named unit of computation (TVM-style).

    It runs once per value of its iter vars, each bound to an expression of the enclosing
    loop vars, and only where `predicate` holds. `init` runs before the body on the first
    iteration of the reduce iter vars (all of them equal to 0).
    """

    name: str
    iter_vars: tuple[IterVar, ...]
    reads: tuple[BufferRegion, ...]
    writes: tuple[BufferRegion, ...]
    body: Stmt
    init: Stmt | None = None
    predicate: Expr | None = None
    annotations: Annotations = ()


@dataclass(frozen=True, slots=True, repr=False)
class BufferStore(StmtBase):
    buffer: Buffer
    indices: tuple[Expr, ...]
    value: Expr


@dataclass(frozen=True, slots=True, repr=False)
class Allocate(StmtBase):
    """Declares `buffer` (its scope says where it lives) for the rest of the enclosing body."""

    buffer: Buffer


@dataclass(frozen=True, slots=True, repr=False)
class IfThenElse(StmtBase):
    cond: Expr
    then: Stmt
    else_: Stmt | None = None


@dataclass(frozen=True, slots=True, repr=False)
class Barrier(StmtBase):
    """Thread synchronization within a GPU thread block (`__syncthreads()`)."""


@dataclass(frozen=True, slots=True, repr=False)
class Seq(StmtBase):
    """Statements in order. Canonical form: at least two, none of them a Seq (see `seq`)."""

    stmts: tuple[Stmt, ...]


Stmt = Union[For, Block, BufferStore, Allocate, IfThenElse, Barrier, Seq]


def seq(*stmts: Stmt) -> Stmt:
    """Build the canonical sequence of `stmts`: nested Seqs flattened, a single one unwrapped."""
    flat: list[Stmt] = []
    for s in stmts:
        flat.extend(s.stmts if isinstance(s, Seq) else (s,))
    if not flat:
        raise ValueError("an empty sequence of statements")
    return flat[0] if len(flat) == 1 else Seq(tuple(flat))


# ---------------------------------------------------------------------------------------------
# Functions


@dataclass(frozen=True, slots=True, repr=False)
class PrimFunc:
    """A kernel in destination-passing style: the last `num_outputs` params are its outputs.

    `attrs` records what the function computes, for `hexir.reference` and for people:
    `("op", "hexir.matmul")` and the op's attributes, sorted by key.

    A param's extent may be symbolic (`buffer<1x{seq}x768xf32>`): the function is then
    compiled once for every size, and `symbols` (the names its params' extents use, sorted)
    are extra int64 arguments of the kernel, each read from the arrays it is called with.
    """

    name: str
    params: tuple[Buffer, ...]
    body: Stmt
    num_outputs: int = 1
    attrs: Annotations = ()

    @property
    def inputs(self) -> tuple[Buffer, ...]:
        return self.params[: len(self.params) - self.num_outputs]

    @property
    def outputs(self) -> tuple[Buffer, ...]:
        return self.params[len(self.params) - self.num_outputs :]

    @property
    def symbols(self) -> tuple[str, ...]:
        """The symbolic sizes the params' extents name, sorted (none: a fixed-size kernel)."""
        return symbols_of(self.params)

    def attr(self, key: str, default: AnnotationValue | None = None) -> AnnotationValue | None:
        return dict(self.attrs).get(key, default)

    def __repr__(self) -> str:
        from hexir.ir.tir_text import print_func

        return print_func(self)

    __str__ = __repr__


# A loop annotation (the search's `sample_categorical` draws its value): serial loops inside
# the annotated loop whose nest does at most this many iterations are unrolled by the
# backend's compiler (`#pragma GCC unroll` / `#pragma unroll`); 0 leaves it to the compiler.
AUTO_UNROLL_KEY = "pragma_auto_unroll_max_step"


def make_annotations(**items: AnnotationValue) -> Annotations:
    """Canonical (sorted) annotations from keyword arguments."""
    return tuple(sorted(items.items()))


def symbols_of(buffers: Iterable[Buffer]) -> tuple[str, ...]:
    """The symbolic sizes the buffers' extents name, sorted."""
    return tuple(
        sorted({n for b in buffers for d in b.shape if isinstance(d, Sym) for n in d.symbols})
    )
