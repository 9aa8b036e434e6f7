"""The parser of the `hextir` text form (the printer, and the grammar by example, are in
`hexir.ir.tir_text`): a regex tokenizer and recursive descent with precedence climbing.

Every error is a ParseError at the offending token. Names resolve against what is in scope:
buffers against the params and the `alloc`s before them, vars against the enclosing loops and
blocks, so a load carries the full Buffer (shape, dtype, scope) of its declaration.
"""

from __future__ import annotations

import json
import re
from typing import NamedTuple, cast

from hexir.errors import ParseError
from hexir.ir.dtype import check_dtype
from hexir.ir.dtype import is_float as is_float_dtype
from hexir.ir.symbolic import Dim, SymbolicError, parse_dim
from hexir.ir.tir import (
    CALLS,
    LOOP_KINDS,
    SCOPES,
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
    Stmt,
    Unary,
    Var,
    seq,
    symbol_var,
    symbols_of,
)
from hexir.ir.tir_text import FUNCTION_OPS, INFIX_PREC, LITERAL_IDENT

_TOKEN = re.compile(
    r"""
    (?P<skip>[ \t\r]+|//[^\n]*)
    |(?P<newline>\n)
    |(?P<string>"(?:[^"\\\n]|\\.)*")
    |(?P<shape>(?:(?:\d+|\{[^{}\n]*\})x)+[A-Za-z][A-Za-z0-9]*)
    |(?P<dim>\{\ *[A-Za-z_][A-Za-z0-9_+*\ -]*\})
    |(?P<number>(?:\d+\.\d+(?:[eE][+-]?\d+)?|\d+[eE][+-]?\d+|\d+)(?:bf16|[fiu]\d+)?)
    |(?P<name>[%@][A-Za-z_][A-Za-z0-9_.]*)
    |(?P<ident>[A-Za-z_][A-Za-z0-9_.]*)
    |(?P<punct>\.\.|==|!=|<=|>=|&&|\|\||[-+*/<>=!(){}\[\],:])
    """,
    re.VERBOSE,
)
# One extent of a shape token and its `x`: a number or a symbolic size in braces.
_SHAPE_DIM = re.compile(r"(\d+|\{[^{}]*\})x")
_NUMBER = re.compile(r"(\d+\.\d+(?:[eE][+-]?\d+)?|\d+[eE][+-]?\d+|\d+)(bf16|[fiu]\d+)?\Z")
_SHORT_DTYPES = {"f16": "float16", "f32": "float32", "f64": "float64"}


class Token(NamedTuple):
    kind: str  # string, shape, number, name (%x or @x), ident, punct, eof
    text: str
    line: int
    column: int


def parse_func(text: str) -> PrimFunc:
    """A `hextir.func` from its text form; raises ParseError at the first thing that is wrong."""
    parser = _Parser(text)
    func = parser.func()
    parser.expect_eof()
    return func


def parse_expr(text: str, scope: dict[str, Var | Buffer] | None = None) -> Expr:
    """An expression whose names resolve against `scope` (vars and buffers by name). Without a
    scope, any var name is taken as a Var of that name; buffers always need the scope."""
    parser = _Parser(text)
    parser.free_vars = scope is None
    for name, item in (scope or {}).items():
        if isinstance(item, Buffer):
            parser.buffers[-1][name] = item
        else:
            parser.vars[-1][name] = item
    expr = parser.expr()
    parser.expect_eof()
    return expr


def tokenize(text: str) -> list[Token]:
    tokens: list[Token] = []
    pos, line, line_start = 0, 1, 0
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if m is None:
            raise _error(text, f"unexpected character {text[pos]!r}", line, pos - line_start + 1)
        kind = m.lastgroup or ""
        if kind == "newline":
            line, line_start = line + 1, m.end()
        elif kind != "skip":
            tokens.append(Token(kind, m.group(), line, pos - line_start + 1))
        pos = m.end()
    tokens.append(Token("eof", "", line, pos - line_start + 1))
    return tokens


def _error(text: str, message: str, line: int, column: int) -> ParseError:
    lines = text.split("\n")
    source = lines[line - 1] if line <= len(lines) else ""
    return ParseError(message, line, column, source.rstrip("\r"))


class _Parser:
    def __init__(self, text: str) -> None:
        self.text = text
        self.tokens = tokenize(text)
        self.pos = 0
        # Innermost scope last; vars and buffers are separate namespaces (as `%` does not say).
        self.vars: list[dict[str, Var]] = [{}]
        self.buffers: list[dict[str, Buffer]] = [{}]
        self.free_vars = False

    # -- tokens -------------------------------------------------------------------------------

    def peek(self, ahead: int = 0) -> Token:
        return self.tokens[min(self.pos + ahead, len(self.tokens) - 1)]

    def next(self) -> Token:
        tok = self.peek()
        self.pos += 1
        return tok

    def at(self, text: str, ahead: int = 0) -> bool:
        tok = self.peek(ahead)
        return tok.text == text and tok.kind in ("punct", "ident")

    def accept(self, text: str) -> bool:
        if self.at(text):
            self.pos += 1
            return True
        return False

    def expect(self, text: str) -> Token:
        if not self.at(text):
            raise self.error(f"expected {text!r}, found {self.describe(self.peek())}")
        return self.next()

    def expect_kind(self, kind: str, what: str) -> Token:
        if self.peek().kind != kind:
            raise self.error(f"expected {what}, found {self.describe(self.peek())}")
        return self.next()

    def expect_eof(self) -> None:
        if self.peek().kind != "eof":
            raise self.error(f"expected the end of the text, found {self.describe(self.peek())}")

    @staticmethod
    def describe(tok: Token) -> str:
        return "the end of the text" if tok.kind == "eof" else repr(tok.text)

    def error(self, message: str, tok: Token | None = None) -> ParseError:
        tok = tok or self.peek()
        return _error(self.text, message, tok.line, tok.column)

    # -- scopes -------------------------------------------------------------------------------

    def push(self, variables: list[Var] | tuple[Var, ...] = ()) -> None:
        self.vars.append({v.name: v for v in variables})
        self.buffers.append({})

    def pop(self) -> None:
        self.vars.pop()
        self.buffers.pop()

    def lookup_var(self, tok: Token) -> Var:
        name = tok.text.lstrip("%")
        for frame in reversed(self.vars):
            if name in frame:
                return frame[name]
        if self.free_vars:
            return Var(name)
        raise self.error(f"unknown name {tok.text!r}: no loop or block var of that name", tok)

    def lookup_buffer(self, tok: Token) -> Buffer:
        name = tok.text.lstrip("%")
        for frame in reversed(self.buffers):
            if name in frame:
                return frame[name]
        raise self.error(f"unknown buffer {tok.text!r}: no param or alloc of that name", tok)

    def binder(self) -> str:
        """The name a loop var, iter var, param or alloc declares: `%x` (or bare `x`)."""
        return self.binder_token().text.lstrip("%")

    # -- expressions --------------------------------------------------------------------------

    def expr(self, min_prec: int = 1) -> Expr:
        lhs = self.unary()
        while True:
            tok = self.peek()
            prec = INFIX_PREC.get(tok.text) if tok.kind == "punct" else None
            if prec is None or prec < min_prec:
                return lhs
            self.next()
            lhs = Binary(tok.text, lhs, self.expr(prec + 1))

    def unary(self) -> Expr:
        if self.accept("-"):
            # `-3` is the literal -3; `-(3)` and `-x` are negations.
            if self.is_literal(self.peek()) and self.peek().text not in ("true", "false"):
                return self.literal(self.next(), negate=True)
            return Unary("-", self.unary())
        if self.accept("!"):
            return Unary("!", self.unary())
        return self.primary()

    @staticmethod
    def is_literal(tok: Token) -> bool:
        return tok.kind == "number" or (tok.kind == "ident" and bool(LITERAL_IDENT.match(tok.text)))

    def primary(self) -> Expr:
        tok = self.peek()
        if self.is_literal(tok):
            return self.literal(self.next())
        if tok.kind == "ident" and (self.at("(", 1) or tok.text == "cast"):
            return self.call(self.next())
        if (tok.kind == "name" and tok.text[0] == "%") or tok.kind == "ident":
            self.next()
            if self.at("["):
                return BufferLoad(self.lookup_buffer(tok), self.indices())
            return self.lookup_var(tok)
        if self.accept("("):
            inner = self.expr()
            self.expect(")")
            return inner
        raise self.error(f"expected an expression, found {self.describe(tok)}")

    def call(self, tok: Token) -> Expr:
        name = tok.text
        if name == "cast":
            self.expect("<")
            dtype = self.dtype(self.next())
            self.expect(">")
            self.expect("(")
            value = self.expr()
            self.expect(")")
            return Cast(dtype, value)
        self.expect("(")
        args = self.expr_list(")")
        if name in CALLS:
            return Call(name, tuple(args))
        want = 3 if name == "select" else 2
        if name not in FUNCTION_OPS and name != "select":
            raise self.error(f"unknown function {name!r}", tok)
        if len(args) != want:
            raise self.error(f"{name} takes {want} arguments, not {len(args)}", tok)
        return Select(*args) if name == "select" else Binary(name, *args)

    def expr_list(self, close: str) -> list[Expr]:
        """Comma-separated expressions up to and including `close`."""
        items: list[Expr] = []
        while not self.accept(close):
            if items:
                self.expect(",")
            items.append(self.expr())
        return items

    def indices(self) -> tuple[Expr, ...]:
        self.expect("[")
        return tuple(self.expr_list("]"))

    def literal(self, tok: Token, negate: bool = False) -> Expr:
        if tok.kind == "ident":
            if tok.text in ("true", "false"):
                return IntImm(int(tok.text == "true"), "bool")
            body, suffix = tok.text[:3], tok.text[3:]
        else:
            m = _NUMBER.match(tok.text)
            assert m is not None  # the tokenizer matched the same pattern
            body, suffix = m.group(1), m.group(2) or ""
        is_float = not body.isdigit()
        dtype = self.suffix_dtype(tok, suffix, is_float)
        if is_float_dtype(dtype):
            return FloatImm(-float(body) if negate else float(body), dtype)
        if is_float:
            raise self.error(f"a float literal cannot have the integer type {suffix}", tok)
        return IntImm(-int(body) if negate else int(body), dtype)

    def suffix_dtype(self, tok: Token, suffix: str, is_float: bool) -> str:
        if not suffix:
            return "float32" if is_float else "int32"
        try:
            return check_dtype(suffix)
        except ValueError:
            raise self.error(f"unknown type suffix {suffix!r}", tok) from None

    def dtype(self, tok: Token) -> str:
        try:
            return check_dtype(tok.text)
        except ValueError:
            raise self.error(f"unknown dtype {tok.text!r}", tok) from None

    # -- attributes ---------------------------------------------------------------------------

    def attributes(self) -> Annotations:
        """`attributes {key = value, ...}` if present, in the order written."""
        if not self.accept("attributes"):
            return ()
        self.expect("{")
        items: list[tuple[str, AnnotationValue]] = []
        while not self.accept("}"):
            if items:
                self.expect(",")
            tok = self.next()
            if tok.kind not in ("ident", "string"):
                raise self.error(f"expected an attribute name, found {self.describe(tok)}", tok)
            key = json.loads(tok.text) if tok.kind == "string" else tok.text
            self.expect("=")
            items.append((key, self.attribute_value()))
        return tuple(items)

    def attribute_value(self) -> AnnotationValue:
        if self.accept("("):
            values: list[AnnotationValue] = []
            while not self.accept(")"):
                values.append(self.attribute_value())
                if not self.at(")"):
                    self.expect(",")
            return cast(AnnotationValue, tuple(values))
        tok = self.next()
        if tok.kind == "string":
            return json.loads(tok.text)
        negate = tok.kind == "punct" and tok.text == "-"
        return self.scalar_attribute(self.next() if negate else tok, negate)

    def scalar_attribute(self, tok: Token, negate: bool) -> AnnotationValue:
        """An int, float or bool: literals as in expressions, but without type suffixes."""
        value: int | float
        number = _NUMBER.match(tok.text) if tok.kind == "number" else None
        if tok.text in ("true", "false") and not negate:
            return tok.text == "true"
        if number and not number.group(2):
            value = int(tok.text) if tok.text.isdigit() else float(tok.text)
        elif tok.text in ("inf", "nan"):
            value = float(tok.text)
        else:
            raise self.error(f"expected an attribute value, found {self.describe(tok)}", tok)
        return -value if negate else value

    # -- statements ---------------------------------------------------------------------------

    def body(self, variables: tuple[Var, ...] = ()) -> Stmt:
        """`{ stmt ... }` in a new scope where `variables` are bound."""
        self.expect("{")
        self.push(variables)
        stmt = self.stmt_list()
        self.pop()
        return stmt

    def stmt_list(self) -> Stmt:
        """Statements up to and including the closing `}`."""
        stmts: list[Stmt] = []
        while not self.at("}"):
            stmts.append(self.stmt())
        if not stmts:
            raise self.error("expected a statement: a body cannot be empty")
        self.next()
        return seq(*stmts)

    def stmt(self) -> Stmt:
        tok = self.peek()
        match tok.text if tok.kind == "ident" else None:
            case "for":
                return self.for_stmt()
            case "block":
                return self.block()
            case "if":
                return self.if_stmt()
            case "alloc":
                return self.alloc()
            case "barrier":
                self.next()
                return Barrier()
        if tok.kind in ("name", "ident") and tok.text[0] != "@" and self.at("[", 1):
            self.next()
            indices = self.indices()
            self.expect("=")
            return BufferStore(self.lookup_buffer(tok), indices, self.expr())
        raise self.error(f"expected a statement, found {self.describe(tok)}")

    def for_stmt(self) -> For:
        self.expect("for")
        var = Var(self.binder())
        self.expect("in")
        start = self.peek()
        if self.integer() != 0:
            raise self.error("a loop starts at 0", start)
        self.expect("..")
        extent = self.dim()
        kind = self.next()
        if kind.text not in LOOP_KINDS:
            raise self.error(f"unknown loop kind {kind.text!r}; expected one of {LOOP_KINDS}", kind)
        annotations = self.attributes()
        return For(var, extent, kind.text, self.body((var,)), annotations)

    def dim(self) -> Dim:
        """An extent: an integer, or a symbolic size in braces (`{seq}`, `{past + 1}`)."""
        tok = self.peek()
        if tok.kind != "dim":
            return self.integer()
        self.next()
        try:
            return parse_dim(tok.text)
        except SymbolicError as e:
            raise self.error(str(e), tok) from None

    def integer(self) -> int:
        negate = self.accept("-")
        tok = self.expect_kind("number", "an integer")
        if not tok.text.isdigit():
            raise self.error(f"expected an integer, found {tok.text!r}", tok)
        return -int(tok.text) if negate else int(tok.text)

    def if_stmt(self) -> IfThenElse:
        self.expect("if")
        cond = self.expr()
        then = self.body()
        else_ = self.body() if self.accept("else") else None
        return IfThenElse(cond, then, else_)

    def alloc(self) -> Allocate:
        self.expect("alloc")
        name = self.binder()
        self.expect(":")
        buffer = self.buffer_type(name)
        self.buffers[-1][name] = buffer
        return Allocate(buffer)

    def block(self) -> Block:
        self.expect("block")
        name = self.expect_kind("name", "a block name (@name)")
        if name.text[0] != "@":
            raise self.error(f"expected a block name (@name), found {name.text!r}", name)
        self.expect("(")
        iter_vars: list[IterVar] = []
        while not self.accept(")"):
            if iter_vars:
                self.expect(",")
            iter_vars.append(self.iter_var())
        # The bindings read the enclosing scope; everything after them sees the iter vars.
        self.push(tuple(iv.var for iv in iter_vars))
        reads = self.regions("reads")
        writes = self.regions("writes")
        predicate = self.expr() if self.accept("where") else None
        annotations = self.attributes()
        self.expect("{")
        init = self.body() if self.accept("init") else None
        body = self.stmt_list()
        self.pop()
        return Block(
            name.text[1:], tuple(iter_vars), reads, writes, body, init, predicate, annotations
        )

    def iter_var(self) -> IterVar:
        var = Var(self.binder())
        self.expect("=")
        kind = self.next()
        if kind.text not in ("spatial", "reduce"):
            raise self.error(f"expected spatial or reduce, found {self.describe(kind)}", kind)
        self.expect("(")
        dom = self.dim()
        self.expect(")")
        return IterVar(var, kind.text, dom, self.expr())

    def regions(self, keyword: str) -> tuple[BufferRegion, ...]:
        self.expect(keyword)
        self.expect("(")
        regions: list[BufferRegion] = []
        while not self.accept(")"):
            if regions:
                self.expect(",")
            buffer = self.lookup_buffer(self.binder_token())
            self.expect("[")
            axes: list[Expr | Range] = []
            while not self.accept("]"):
                if axes:
                    self.expect(",")
                start = self.expr()
                axes.append(Range(start, self.expr()) if self.accept(":") else start)
            regions.append(BufferRegion(buffer, tuple(axes)))
        return tuple(regions)

    def binder_token(self) -> Token:
        tok = self.peek()
        if (tok.kind == "name" and tok.text[0] == "%") or tok.kind == "ident":
            return self.next()
        raise self.error(f"expected a name, found {self.describe(tok)}")

    # -- functions ----------------------------------------------------------------------------

    def buffer_type(self, name: str) -> Buffer:
        """`buffer<4x8xf32>`, `buffer<f32>` (zero-dim), `buffer<64x32xf32, shared>`."""
        self.expect("buffer")
        self.expect("<")
        tok = self.next()
        if tok.kind not in ("shape", "ident"):
            raise self.error(f"expected a shape and dtype, found {self.describe(tok)}", tok)
        dims, short = _SHAPE_DIM.findall(tok.text), _SHAPE_DIM.sub("", tok.text)
        dtype = self.dtype(Token(tok.kind, short, tok.line, tok.column))
        scope = "global"
        if self.accept(","):
            scope_tok = self.next()
            if scope_tok.text not in SCOPES:
                raise self.error(f"unknown buffer scope {scope_tok.text!r}", scope_tok)
            scope = scope_tok.text
        self.expect(">")
        try:
            shape = tuple(parse_dim(d) for d in dims)
        except SymbolicError as e:
            raise self.error(str(e), tok) from None
        return Buffer(name, shape, dtype, scope)

    def func(self) -> PrimFunc:
        self.expect("hextir.func")
        name = self.expect_kind("name", "a function name (@name)")
        if name.text[0] != "@":
            raise self.error(f"expected a function name (@name), found {name.text!r}", name)
        self.expect("(")
        params: list[Buffer] = []
        while not self.accept(")"):
            if params:
                self.expect(",")
            param = self.binder()
            self.expect(":")
            params.append(self.buffer_type(param))
            self.buffers[-1][param] = params[-1]
        num_outputs = self.integer() if self.accept("outputs") else 1
        attrs = self.attributes()
        # A symbolic size the params name is a var of the body too (`%seq`: its value).
        self.push(tuple(symbol_var(n) for n in symbols_of(params)))
        body = self.body()
        self.pop()
        return PrimFunc(name.text[1:], tuple(params), body, num_outputs, attrs)
