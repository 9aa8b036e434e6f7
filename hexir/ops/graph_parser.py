"""The parser behind `hexir.ops.parse.parse_graph` (the rules are in `hexir.ir.graph_text`,
beside the printer).

A regex lexer and a recursive-descent parser; every op goes through `make_op`, so parsed
graphs are checked exactly as built ones are. It sits in `hexir.ops`, above the IR, because
it reads the op definitions.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator, Mapping
from typing import NamedTuple, NoReturn, TypeVar

import numpy as np

from hexir.errors import ParseError, TypeInferenceError
from hexir.ir.dtype import DTYPES, from_short, is_float, is_int, numpy_dtype, short_name
from hexir.ir.graph import ConstantData, Graph, Op, TensorType, Value
from hexir.ir.symbolic import Sym, SymbolicError, parse_dim
from hexir.ir.tir import AnnotationValue
from hexir.ops import make_op, op_def

_LEX = re.compile(
    r"""
    (?P<skip>[ \t\r\n]+|//[^\n]*)
  | (?P<type>tensor<[^>\n]*>)
  | (?P<value>%[A-Za-z0-9_.$-]+)
  | (?P<symbol>@[A-Za-z0-9_.$-]+)
  | (?P<string>"(?:[^"\\\n]|\\.)*")
  | (?P<number>[-+]?(?:\d+\.?\d*(?:[eE][-+]?\d+)?|\.\d+(?:[eE][-+]?\d+)?|inf|nan)(?![\w.]))
  | (?P<ident>[A-Za-z_][A-Za-z0-9_.]*)
  | (?P<dim>\{\ *[A-Za-z_][A-Za-z0-9_+*\ -]*\})
  | (?P<punct>->|[(){}\[\]<>,=:])
    """,
    re.VERBOSE,
)
_INT = re.compile(r"[-+]?\d+")
# One extent of a tensor type and its `x`: a number or a symbolic dimension in braces.
_EXTENT = re.compile(r"(\d+|\{[^{}]*\})x")
_SHORT_DTYPES = {short_name(d) for d in DTYPES}
T = TypeVar("T")


class Token(NamedTuple):
    kind: str  # skip-less lexer kinds above, or "eof"
    text: str
    line: int
    column: int


def _lex(text: str, lines: list[str]) -> Iterator[Token]:
    pos, line, line_start = 0, 1, 0
    while pos < len(text):
        m = _LEX.match(text, pos)
        if m is None:
            column = pos - line_start + 1
            raise ParseError(f"unexpected character {text[pos]!r}", line, column, lines[line - 1])
        if m.lastgroup != "skip":
            yield Token(m.lastgroup or "", m.group(), line, pos - line_start + 1)
        newlines = m.group().count("\n")
        if newlines:
            line += newlines
            line_start = m.start() + m.group().rindex("\n") + 1
        pos = m.end()
    yield Token("eof", "end of input", line, pos - line_start + 1)


class GraphParser:
    def __init__(self, text: str, constants: Mapping[str, np.ndarray | ConstantData]):
        self.lines = text.splitlines() or [""]
        self.tokens = list(_lex(text, self.lines))
        self.pos = 0
        self.blobs = constants
        self.values: dict[str, Value] = {}
        self.constants: list[tuple[str, ConstantData]] = []

    # --- tokens -------------------------------------------------------------------------

    def error(self, message: str, token: Token) -> NoReturn:
        line, column = token.line, token.column
        if line > len(self.lines):  # the end of input, after a final newline
            line, column = len(self.lines), len(self.lines[-1]) + 1
        raise ParseError(message, line, column, self.lines[line - 1])

    def peek(self) -> Token:
        return self.tokens[self.pos]

    def next(self) -> Token:
        token = self.tokens[self.pos]
        self.pos += 1 if token.kind != "eof" else 0
        return token

    def expect(self, kind: str, text: str | None = None) -> Token:
        token = self.next()
        if token.kind != kind or (text is not None and token.text != text):
            self.error(f"expected {text or kind}, got {token.text!r}", token)
        return token

    def accept(self, text: str) -> bool:
        if self.peek().text == text and self.peek().kind in ("punct", "ident"):
            self.pos += 1
            return True
        return False

    def comma_list(self, item: Callable[[], T], close: str) -> list[T]:
        """Items separated by commas, up to `close` (consumed); a trailing comma is allowed."""
        items = []
        while not self.accept(close):
            items.append(item())
            if not self.accept(","):
                self.expect("punct", close)
                break
        return items

    # --- the graph ----------------------------------------------------------------------

    def parse(self) -> Graph:
        self.expect("ident", "hexir.graph")
        name = self.expect("symbol").text[1:]
        self.expect("punct", "(")
        inputs = tuple(self.comma_list(self.argument, ")"))
        self.expect("punct", "->")
        result_types = self.result_types()
        self.expect("punct", "{")
        ops: list[Op] = []
        while self.peek().text != "hexir.return":
            ops.append(self.op())
        outputs = self.returned(result_types)
        self.expect("punct", "}")
        self.expect("eof")
        return Graph(name, inputs, tuple(ops), outputs, tuple(self.constants))

    def define(self, token: Token, value: Value) -> Value:
        if value.name in self.values:
            self.error(f"%{value.name} is defined twice", token)
        self.values[value.name] = value
        return value

    def argument(self) -> Value:
        token = self.expect("value")
        self.expect("punct", ":")
        return self.define(token, Value(token.text[1:], self.tensor_type()))

    def result_types(self) -> tuple[tuple[TensorType, Token], ...]:
        if self.accept("("):
            return tuple(self.comma_list(self.typed_token, ")"))
        return (self.typed_token(),)

    def typed_token(self) -> tuple[TensorType, Token]:
        token = self.peek()
        return self.tensor_type(), token

    def returned(self, declared: tuple[tuple[TensorType, Token], ...]) -> tuple[Value, ...]:
        start = self.expect("ident", "hexir.return")
        tokens = [self.expect("value")] if self.peek().kind == "value" else []
        while tokens and self.accept(","):
            tokens.append(self.expect("value"))
        outputs = tuple(self.use(t) for t in tokens)
        if len(outputs) != len(declared):
            self.error(
                f"returns {len(outputs)} value(s), the graph declares {len(declared)}", start
            )
        for token, value, (t, _) in zip(tokens, outputs, declared, strict=True):
            if value.type != t:
                self.error(f"%{value.name} is {value.type!r}, the graph declares {t!r}", token)
        return outputs

    def use(self, token: Token) -> Value:
        value = self.values.get(token.text[1:])
        if value is None:
            self.error(f"{token.text} is not defined", token)
        return value

    def tensor_type(self) -> TensorType:
        token = self.expect("type")
        body = token.text[len("tensor<") : -1]
        extents = _EXTENT.findall(body)
        short = _EXTENT.sub("", body)
        try:
            shape = tuple(parse_dim(e) for e in extents)
            if short not in _SHORT_DTYPES or any(isinstance(d, int) and d < 0 for d in shape):
                raise SymbolicError(short)
            return TensorType(shape, from_short(short))
        except SymbolicError:
            self.error(
                f"bad tensor type {token.text}; expected like tensor<2x3xf32> or "
                "tensor<1x{seq}x768xf32>",
                token,
            )

    # --- ops ----------------------------------------------------------------------------

    def op(self) -> Op:
        result = self.expect("value")
        self.expect("punct", "=")
        name = self.expect("ident")
        if not name.text.startswith("hexir.") or op_def(name.text) is None:
            self.error(f"unknown op {name.text!r}", name)
        if name.text == "hexir.constant":
            return self.constant(result, name)
        operands = [self.use(self.expect("value"))] if self.peek().kind == "value" else []
        while operands and self.accept(","):
            operands.append(self.use(self.expect("value")))
        attrs, placement = self.attr_dict()
        self.expect("punct", ":")
        declared, type_token = self.typed_token()
        try:
            op = make_op(name.text, operands, attrs, result.text[1:], placement)
        except TypeInferenceError as e:
            self.error(str(e).splitlines()[0], name)
        if op.result.type != declared:
            self.error(
                f"{name.text}: the result type {declared!r} disagrees with the inferred "
                f"{op.result.type!r}",
                type_token,
            )
        self.define(result, op.result)
        return op

    def attr_dict(self) -> tuple[dict[str, AnnotationValue], str]:
        attrs: dict[str, AnnotationValue] = {}
        if not self.accept("{"):
            return attrs, "cpu"
        for key, value in self.comma_list(self.attr_item, "}"):
            if key.text in attrs:
                self.error(f"attribute '{key.text}' is given twice", key)
            attrs[key.text] = value
        placement = attrs.pop("placement", "cpu")
        if not isinstance(placement, str):
            self.error(f"placement must be a string, got {placement!r}", self.tokens[self.pos - 1])
        return attrs, placement

    def attr_item(self) -> tuple[Token, AnnotationValue]:
        key = self.expect("ident")
        self.expect("punct", "=")
        token = self.next()
        match token.kind, token.text:
            case "number", text:
                return key, int(text) if _INT.fullmatch(text) else float(text)
            case "string", text:
                return key, json.loads(text)
            case "ident", "true" | "false":
                return key, token.text == "true"
            case "dim", _:
                return key, self.dim(token)
            case "punct", "(":
                return key, tuple(self.comma_list(self.int_item, ")"))
        self.error(f"expected an attribute value, got {token.text!r}", token)

    def int_item(self) -> int | Sym:
        """An int, or a symbolic dimension in braces (`{past + seq}`) where an attribute is
        a dimension."""
        token = self.next()
        if token.kind == "dim":
            return self.dim(token)
        if token.kind != "number" or not _INT.fullmatch(token.text):
            self.error(f"expected an int, got {token.text!r}", token)
        return int(token.text)

    def dim(self, token: Token) -> Sym:
        try:
            dim = parse_dim(token.text)
        except SymbolicError as e:
            self.error(str(e), token)
        if not isinstance(dim, Sym):
            self.error(f"a number in braces, {token.text}: write it without them", token)
        return dim

    # --- constants ----------------------------------------------------------------------

    def constant(self, result: Token, op_token: Token) -> Op:
        symbol = self.next() if self.peek().kind == "symbol" else None
        literal = self.dense() if self.peek().text == "dense" else None
        if symbol is None and literal is None:
            self.error("expected @name or dense<...> after hexir.constant", self.peek())
        attrs, placement = self.attr_dict()
        self.expect("punct", ":")
        declared, type_token = self.typed_token()
        name = symbol.text[1:] if symbol else result.text[1:]
        if literal is not None:
            data = self.dense_array(literal, declared, type_token)
        else:
            data = self.blob(name, declared, symbol or result)
        if any(key == name for key, _ in self.constants):
            self.error(f"constant @{name} is defined twice", symbol or result)
        try:
            attrs["name"] = name
            op = make_op("constant", [], attrs, result.text[1:], placement, result_type=declared)
        except TypeInferenceError as e:
            self.error(str(e).splitlines()[0], op_token)
        self.constants.append((name, ConstantData(data)))
        self.define(result, op.result)
        return op

    def blob(self, name: str, declared: TensorType, symbol: Token) -> np.ndarray:
        if name not in self.blobs:
            self.error(f"no data for constant @{name}; pass it in constants=", symbol)
        blob = self.blobs[name]
        array = blob.array if isinstance(blob, ConstantData) else np.array(blob)  # a copy
        if array.shape == (1,) and declared.shape == ():  # how ConstantData keeps rank 0
            array = array.reshape(())
        want = numpy_dtype(declared.dtype)
        raw = (np.dtype(f"V{want.itemsize}"), np.dtype(f"u{want.itemsize}"))
        if want.kind == "V" and array.dtype in raw:
            array = array.view(want)  # an .npz keeps ml_dtypes' types (bfloat16, int4) as bits
        if array.shape != declared.shape or array.dtype != numpy_dtype(declared.dtype):
            given = f"{array.dtype} of shape {array.shape}"
            self.error(f"the data of @{name} is {given}, the text declares {declared!r}", symbol)
        return array

    def dense(self) -> Dense:
        self.expect("ident", "dense")
        self.expect("punct", "<")
        literal = self.dense_item()
        self.expect("punct", ">")
        return literal

    def dense_item(self) -> Dense:
        token = self.next()
        if token.kind == "punct" and token.text == "[":
            return Dense(token, tuple(self.comma_list(self.dense_item, "]")))
        if token.kind == "number" or token.text in ("true", "false"):
            return Dense(token, None)
        self.error(f"expected a number, true, false or [, got {token.text!r}", token)

    def dense_array(self, literal: Dense, declared: TensorType, type_token: Token) -> np.ndarray:
        shape = self.dense_shape(literal)
        flat = list(literal.leaves())
        if (shape != declared.shape and declared.size) or len(flat) != declared.size:
            shown = "x".join(map(str, shape)) or "a scalar"
            self.error(f"the dense literal is {shown}, the type is {declared!r}", literal.token)
        values = [self.element(t, declared.dtype) for t in flat]
        try:
            return np.array(values, dtype=numpy_dtype(declared.dtype)).reshape(declared.shape)
        except OverflowError:
            self.error(f"a value of the dense literal does not fit {declared.dtype}", literal.token)

    def dense_shape(self, literal: Dense) -> tuple[int, ...]:
        if literal.items is None:
            return ()
        shapes = {self.dense_shape(item) for item in literal.items}
        if len(shapes) > 1:
            self.error("the dense literal is ragged", literal.token)
        return (len(literal.items), *(shapes.pop() if shapes else ()))

    def element(self, token: Token, dtype: str) -> bool | int | float:
        is_integer = bool(_INT.fullmatch(token.text))
        if dtype == "bool" and token.text in ("true", "false"):
            return token.text == "true"
        if is_int(dtype) and is_integer:
            return int(token.text)
        if is_float(dtype) and token.kind == "number":
            return float(token.text)
        self.error(f"{token.text!r} is not a {dtype} value", token)


class Dense(NamedTuple):
    """A dense literal: a number token (items None) or a bracket and its items."""

    token: Token
    items: tuple[Dense, ...] | None

    def leaves(self) -> Iterator[Token]:
        if self.items is None:
            yield self.token
            return
        for item in self.items:
            yield from item.leaves()
