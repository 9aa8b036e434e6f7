from __future__ import annotations

import math
import random

import pytest
from tir_fixtures import ALL, MATMUL_TEXT, dtypes_and_specials, matmul, scheduled_gpu

from hexir.errors import ParseError
from hexir.ir.tir import (
    ARITH_OPS,
    CALLS,
    COMPARE_OPS,
    LOGIC_OPS,
    Allocate,
    Barrier,
    Binary,
    Buffer,
    BufferStore,
    Call,
    Cast,
    Expr,
    FloatImm,
    IntImm,
    PrimFunc,
    Range,
    Select,
    Unary,
    Var,
)
from hexir.ir.tir_text import parse_expr, parse_func, print_expr, print_func, print_stmt
from hexir.ops.parse import parse

# ---------------------------------------------------------------------------------------------
# Printing


def test_matmul_prints_as_in_the_design() -> None:
    assert print_func(matmul()) == MATMUL_TEXT
    assert repr(matmul()) == MATMUL_TEXT


def test_header_outputs_and_attributes() -> None:
    text = print_func(scheduled_gpu())
    head = text.splitlines()[0]
    assert head.startswith("hextir.func @sum_kernel(%A: buffer<128x64xf32>, %B: buffer<128xf32>)")
    assert " outputs " not in head
    assert 'empty = (), f = 0.044715, flag = true, neg = -3, one = (3,), op = "hexir.sum"' in head
    assert '"weird key" = "v"' in head and "tiny = 1e-05" in head
    assert print_func(dtypes_and_specials()).splitlines()[0].endswith(" outputs 3 {")


def test_statements_print() -> None:
    text = print_func(scheduled_gpu())
    for line in (
        "  for %i_0 in 0..2 blockIdx.x {",
        "    for %vt in 0..1 vthread {",
        "      for %i_1 in 0..64 threadIdx.x {",
        "        alloc %A_shared: buffer<64x32xf32, shared>",
        "          alloc %acc: buffer<4xf32, local>",
        "          for %u in 0..32 unrolled attributes {unroll_step = 16} {",
        "          barrier",
        "          } else {",
        "              %B[%i_0 * 64 + %i_1] = -1.5",
    ):
        assert line in text.splitlines()
    assert "reads(%A[vi, 0:64], %A_shared[floormod(vi, 64), vk]) writes(%B[vi])" in text
    assert " where %i_0 * 64 + %i_1 < 128 && !false attributes {meta = " in text


def test_zero_dim_and_immediates() -> None:
    text = print_func(dtypes_and_specials())
    assert "%x: buffer<f32>" in text and "%y[] = select(" in text
    assert "inff64" in text and "-inff64" in text and "nanf16" in text and "nan)" in text
    assert (
        "3i64" in text
        and "-7i64" in text
        and "1.5f64" in text
        and "cast<i32>(%q[%i]) != -1" in text
    )
    assert "%x[] = -(2.0) * -%x[] - -0.0" in text


@pytest.mark.parametrize(
    ("expr", "text"),
    [
        (Binary("-", Var("a"), Binary("-", Var("b"), Var("c"))), "%a - (%b - %c)"),
        (Binary("-", Binary("-", Var("a"), Var("b")), Var("c")), "%a - %b - %c"),
        (Binary("*", Binary("+", Var("a"), Var("b")), Var("c")), "(%a + %b) * %c"),
        (Binary("+", Var("a"), Binary("*", Var("b"), Var("c"))), "%a + %b * %c"),
        (Binary("<", Binary("<", Var("a"), Var("b")), Var("c")), "(%a < %b) < %c"),
        (Binary("||", Binary("&&", Var("a"), Var("b")), Var("c")), "%a && %b || %c"),
        (Binary("&&", Var("a"), Binary("||", Var("b"), Var("c"))), "%a && (%b || %c)"),
        (Unary("-", IntImm(3)), "-(3)"),
        (IntImm(-3), "-3"),
        (Unary("-", Binary("+", Var("a"), IntImm(1))), "-(%a + 1)"),
        (Binary("*", Unary("-", Var("a")), IntImm(2)), "-%a * 2"),
        (Unary("!", Binary("==", Var("a"), IntImm(0))), "!(%a == 0)"),
        (Binary("-", Var("a"), IntImm(-3)), "%a - -3"),
        (IntImm(1, "bool"), "true"),
        (FloatImm(math.inf), "inf"),
        (FloatImm(-math.inf, "float16"), "-inff16"),
        (Cast("float32", Var("a")), "cast<f32>(%a)"),
    ],
)
def test_expression_text(expr: Expr, text: str) -> None:
    assert print_expr(expr) == text
    assert parse_expr(text) == expr


def test_stmt_repr_uses_the_printer() -> None:
    buf = Buffer("X", (4,))
    assert repr(BufferStore(buf, (Var("i"),), FloatImm(1.0))) == "%X[%i] = 1.0"
    assert print_stmt(Allocate(Buffer("S", (2, 2), "float16", "shared"))) == (
        "alloc %S: buffer<2x2xf16, shared>"
    )
    assert repr(Barrier()) == "barrier"


# ---------------------------------------------------------------------------------------------
# Round trips


@pytest.mark.parametrize("make", ALL, ids=lambda f: f.__name__)
def test_round_trip(make) -> None:
    func = make()
    text = print_func(func)
    back = parse_func(text)
    assert back == func
    assert print_func(back) == text
    assert parse(text) == func


def test_parse_accepts_comments_and_free_layout() -> None:
    text = "// a comment\n" + MATMUL_TEXT.replace(" reads(", "\n      // note\n   reads(")
    assert parse_func(text) == matmul()


def test_parse_resolves_bare_and_percent_names() -> None:
    text = MATMUL_TEXT.replace("%C[vi, vj] + %A", "C[%vi, vj] + %A")
    assert parse_func(text) == matmul()


def test_loads_carry_the_declared_buffer() -> None:
    func = parse_func(print_func(scheduled_gpu()))
    stores = [n for n in _walk_stores(func) if n.buffer.name == "A_shared"]
    assert stores and all(s.buffer.scope == "shared" for s in stores)


def _walk_stores(func: PrimFunc) -> list[BufferStore]:
    from hexir.ir.visit import walk

    return [n for n in walk(func.body) if isinstance(n, BufferStore)]


_BUF = Buffer("T", (4, 4), "float32")


def _random_expr(rng: random.Random, depth: int) -> Expr:
    if depth == 0 or rng.random() < 0.2:
        return _random_leaf(rng)
    choice = rng.randrange(7)
    sub = lambda: _random_expr(rng, depth - 1)  # noqa: E731
    if choice <= 2:
        return Binary(rng.choice(ARITH_OPS + COMPARE_OPS + LOGIC_OPS), sub(), sub())
    if choice == 3:
        return Unary(rng.choice("-!"), sub())
    if choice == 4:
        return Call(rng.choice(CALLS), (sub(),))
    if choice == 5:
        return Select(sub(), sub(), sub())
    return Cast(rng.choice(("float32", "float64", "int32", "int64", "bool")), sub())


def _random_leaf(rng: random.Random) -> Expr:
    match rng.randrange(6):
        case 0:
            return Var(rng.choice(("i", "j", "vi", "k_0")))
        case 1:
            return IntImm(rng.randint(-20, 20), rng.choice(("int32", "int32", "int64")))
        case 2:
            return IntImm(rng.randint(0, 1), "bool")
        case 3:
            special = (math.inf, -math.inf, math.nan, -0.0, 1e-05, 0.1, 2.5e300, -3.0)
            value = rng.choice((rng.uniform(-10, 10), *special))
            return FloatImm(value, rng.choice(("float32", "float64", "float16")))
        case 4:
            return _BUF[Var("i"), IntImm(rng.randint(-2, 2))]
    return _BUF[Var("j"), Var("vi") - IntImm(1)]


def test_random_expression_round_trip() -> None:
    rng = random.Random(20240601)
    scope = {"i": Var("i"), "j": Var("j"), "vi": Var("vi"), "k_0": Var("k_0"), "T": _BUF}
    for _ in range(1500):
        expr = _random_expr(rng, 5)
        text = print_expr(expr)
        assert parse_expr(text, scope) == expr, text


def test_random_expressions_inside_a_block_round_trip() -> None:
    from hexir.ir.tir import Block, BufferRegion, For, IterVar

    rng = random.Random(7)
    out = Buffer("out", (4,))
    for _ in range(200):
        value = _random_expr(rng, 4)
        # The iter var `vi` prints bare inside the block; the loop vars print with `%`.
        ivs = (IterVar(Var("vi"), "spatial", 4, Var("i")),)
        reads = (BufferRegion(_BUF, (Var("vi"), Range(IntImm(0), Var("j") + 1))),)
        writes = (BufferRegion(out, (Var("vi"),)),)
        block = Block(
            "b", ivs, reads, writes, BufferStore(out, (Var("vi"),), value), predicate=value
        )
        body = For(
            Var("i"), 4, "serial", For(Var("j"), 4, "serial", For(Var("k_0"), 1, "serial", block))
        )
        func = PrimFunc("r", (_BUF, out), body)
        assert parse_func(print_func(func)) == func


# ---------------------------------------------------------------------------------------------
# Errors


def _parse_error(text: str) -> ParseError:
    with pytest.raises(ParseError) as info:
        parse_func(text)
    return info.value


def test_unknown_buffer_points_at_it() -> None:
    text = MATMUL_TEXT.replace("%B[vk, vj]) writes", "%Q[vk, vj]) writes")
    err = _parse_error(text)
    line = text.splitlines()[4]
    assert err.line == 5 and err.column == line.index("%Q") + 1
    assert err.source_line == line
    assert "unknown buffer '%Q'" in str(err)
    assert str(err).splitlines()[-1] == "  " + " " * line.index("%Q") + "^"


def test_unknown_var_points_at_it() -> None:
    text = MATMUL_TEXT.replace("vk = reduce(1024) %k", "vk = reduce(1024) %z")
    err = _parse_error(text)
    assert (err.line, err.column) == (5, text.splitlines()[4].index("%z") + 1)
    assert "unknown name '%z'" in err.message


def test_iter_vars_are_not_in_scope_of_their_bindings() -> None:
    err = _parse_error(MATMUL_TEXT.replace("vj = spatial(1024) %j", "vj = spatial(1024) vi"))
    assert "unknown name 'vi'" in err.message and err.line == 5


def test_alloc_scope_ends_with_its_body() -> None:
    text = """hextir.func @f(%A: buffer<4xf32>) {
  for %i in 0..4 serial {
    alloc %S: buffer<4xf32, local>
    %S[%i] = 1.0
  }
  %A[0] = %S[0]
}"""
    err = _parse_error(text)
    assert (err.line, err.column) == (6, 11)


@pytest.mark.parametrize(
    ("old", "new", "message", "line"),
    [
        (
            "0..1024 serial {\n    for %j",
            "0..1024 sequential {\n    for %j",
            "unknown loop kind",
            2,
        ),
        ("for %k in 0..1024", "for %k in 1..1024", "a loop starts at 0", 4),
        ("= 0.0\n", "= 0.0 $\n", "unexpected character '$'", 7),
        ("%C[vi, vj] = 0.0", "%C[vi, vj] = ", "expected an expression", 8),
        ("xf32>) {", "xf99>) {", "unknown dtype 'f99'", 1),
        ("spatial(1024) %i,", "spatial(1024) %i +,", "expected an expression", 5),
    ],
)
def test_parse_errors(old: str, new: str, message: str, line: int) -> None:
    assert old in MATMUL_TEXT
    err = _parse_error(MATMUL_TEXT.replace(old, new, 1))
    assert message in err.message and err.line == line and err.column >= 1


def test_missing_brace_is_reported_at_the_end() -> None:
    err = _parse_error(MATMUL_TEXT[: -len("\n}")])
    assert "found the end of the text" in err.message and err.line == 13


def test_empty_body_is_an_error() -> None:
    err = _parse_error("hextir.func @f(%A: buffer<f32>) {\n}")
    assert err.line == 2 and err.column == 1 and "cannot be empty" in err.message


def test_parse_error_pickles() -> None:
    import pickle

    err = _parse_error(MATMUL_TEXT.replace("%A[vi, vk] *", "%A[vi, vk] * )"))
    back = pickle.loads(pickle.dumps(err))
    assert (back.line, back.column, str(back)) == (err.line, err.column, str(err))


def _one_block(iter_name: str, attrs: tuple = ()) -> PrimFunc:
    from hexir.ir.tir import Block, BufferRegion, For, IterVar

    out = Buffer("out", (4,))
    v = Var(iter_name)
    block = Block(
        "b",
        (IterVar(v, "spatial", 4, Var("i")),),
        (),
        (BufferRegion(out, (v,)),),
        BufferStore(out, (v,), Cast("float32", Unary("-", v))),
        predicate=Binary("<", v, IntImm(4)),
        annotations=attrs,
    )
    return PrimFunc("e", (out,), For(Var("i"), 4, "serial", block), attrs=attrs)


@pytest.mark.parametrize(
    "name", ["inf", "nanf64", "true", "select", "cast", "floordiv", "exp", "where", "if", "a.b"]
)
def test_iter_vars_named_like_keywords_round_trip(name: str) -> None:
    func = _one_block(name)
    assert parse_func(print_func(func)) == func


def test_attribute_values_round_trip() -> None:
    attrs = (
        ("a", -2.5),
        ("b", -math.inf),
        ("c", 10**20),
        ("d", (1, -2, 3)),
        ("e", False),
        ("f", "ünïcode \u2603 \x00"),
        ("g", 5e-324),
    )
    func = _one_block("vi", attrs)
    back = parse_func(print_func(func))
    assert back == func and back.attrs == attrs
    assert isinstance(back.attr("e"), bool) and isinstance(back.attr("c"), int)


@pytest.mark.parametrize("value", ["3i64", "1.5f64", "inff64", "%x", "-true"])
def test_attribute_values_have_no_suffixes_or_names(value: str) -> None:
    text = MATMUL_TEXT.replace(") {\n  for", f") attributes {{k = {value}}} {{\n  for", 1)
    err = _parse_error(text)
    assert err.line == 1 and "expected an attribute value" in err.message


def test_negated_bool_and_nested_negations() -> None:
    for expr in (
        Unary("-", IntImm(1, "bool")),
        Unary("-", Unary("-", Var("a"))),
        Unary("-", IntImm(-3)),
        Binary("-", Var("a"), Unary("-", FloatImm(3.0, "float64"))),
        Unary("!", Unary("!", IntImm(0, "bool"))),
        IntImm(2, "bool"),
    ):
        assert parse_expr(print_expr(expr)) == expr, print_expr(expr)
