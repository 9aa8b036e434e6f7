"""Shape and dtype inference, attribute normalization and errors of every op (docs/ops.md).

Result shapes are checked against numpy doing the same computation on random arrays.
"""

from __future__ import annotations

import numpy as np
import pytest

import hexir
from hexir.errors import TypeInferenceError
from hexir.ir.graph import Op, TensorType, Value
from hexir.ops import OPS, make_op, slice_indices

RNG = np.random.default_rng(0)


def arr(*shape: int, dtype: str = "float32") -> np.ndarray:
    if dtype == "bool":
        return RNG.random(shape) < 0.5
    return (RNG.standard_normal(shape) * 4).astype(dtype)


def val(a: np.ndarray, name: str | None = None) -> Value:
    val.count = getattr(val, "count", 0) + 1
    return Value(name or f"v{val.count}", TensorType(a.shape, a.dtype.name))


def infer(name: str, *arrays: np.ndarray, **attrs: object) -> Op:
    return make_op(name, [val(a) for a in arrays], attrs, "r")


def check(name: str, expected: np.ndarray, *arrays: np.ndarray, **attrs: object) -> Op:
    op = infer(name, *arrays, **attrs)
    assert op.result.type == TensorType(np.shape(expected), np.asarray(expected).dtype.name)
    # normalized attributes are a fixed point: rebuilding the op gives the same op
    again = make_op(op.name, op.operands, dict(op.attrs), "r", op.placement)
    assert again == op
    return op


def bad(name: str, *arrays: np.ndarray, match: str, **attrs: object) -> TypeInferenceError:
    with pytest.raises(TypeInferenceError, match=match) as info:
        infer(name, *arrays, **attrs)
    text = str(info.value)
    assert text.startswith(f"hexir.{name}: ")
    assert f"in: %r = hexir.{name}" in text
    return info.value


# --- linear algebra and convolution ---------------------------------------------------------


@pytest.mark.parametrize("m,k,n", [(2, 3, 4), (1, 5, 1), (7, 1, 3)])
def test_matmul(m: int, k: int, n: int) -> None:
    a, b = arr(m, k), arr(k, n)
    assert check("matmul", np.matmul(a, b), a, b).attrs == ()


def test_matmul_message_names_the_op_and_prints_it() -> None:
    e = bad("matmul", arr(64, 784), arr(100, 256), match="inner dimensions differ")
    lines = str(e).splitlines()
    assert lines[0] == "hexir.matmul: inner dimensions differ: a is 64x784, b is 100x256"
    assert lines[1].strip().startswith("in: %r = hexir.matmul %v")
    assert "tensor<64x784xf32>" in lines[2] and "tensor<100x256xf32>" in lines[2]
    bad("matmul", arr(3), arr(3, 2), match="a must have rank 2")
    bad("matmul", arr(2, 3), arr(3, 2, dtype="float64"), match="dtypes differ")


@pytest.mark.parametrize("shapes", [((2, 3, 4), (2, 4, 5)), ((1, 1, 1), (1, 1, 6))])
def test_batch_matmul(shapes) -> None:
    a, b = arr(*shapes[0]), arr(*shapes[1])
    check("batch_matmul", np.matmul(a, b), a, b)
    bad("batch_matmul", arr(2, 3, 4), arr(3, 4, 5), match="batch dimensions differ")
    bad("batch_matmul", arr(2, 3, 4), arr(2, 3, 5), match="inner dimensions differ")


@pytest.mark.parametrize("m,k,n", [(2, 3, 4), (5, 8, 1)])
def test_dense(m: int, k: int, n: int) -> None:
    x, w = arr(m, k), arr(n, k)
    check("dense", x @ w.T, x, w)
    bad("dense", arr(m, k), arr(k + 1, n), match="inner dimensions differ")


def test_bias_add() -> None:
    x, b = arr(2, 3, 4), arr(3)
    assert check("bias_add", x + b[:, None], x, b).attrs == (("axis", 1),)
    x, b = arr(2, 5), arr(5)
    assert check("bias_add", x + b, x, b, axis=-1).attrs == (("axis", 1),)
    assert infer("bias_add", arr(4, 2), arr(4), axis=0).attr("axis") == 0
    bad("bias_add", arr(2, 3), arr(2), match=r"b must have shape \[3\]")
    bad("bias_add", arr(2, 3), arr(3), axis=2, match="axis 2 is out of range")


def conv2d_reference(x, w, stride, padding, dilation, groups) -> np.ndarray:
    """A direct numpy convolution (grouped, strided, dilated)."""
    (sh, sw), (ph, pw), (dh, dw) = stride, padding, dilation
    xp = np.pad(x, ((0, 0), (0, 0), (ph, ph), (pw, pw)))
    k, cg, r, s = w.shape
    dilated = np.zeros((k, cg, dh * (r - 1) + 1, dw * (s - 1) + 1), w.dtype)
    dilated[:, :, ::dh, ::dw] = w
    windows = np.lib.stride_tricks.sliding_window_view(xp, dilated.shape[2:], axis=(2, 3))
    windows = windows[:, :, ::sh, ::sw]  # n, c, oh, ow, r', s'
    out = []
    for g in range(groups):
        part = windows[:, g * cg : (g + 1) * cg]
        wg = dilated[g * (k // groups) : (g + 1) * (k // groups)]
        out.append(np.einsum("ncijrs,kcrs->nkij", part, wg))
    return np.concatenate(out, axis=1)


@pytest.mark.parametrize(
    "xs,ws,attrs,normal",
    [
        ((1, 3, 8, 8), (4, 3, 3, 3), {}, ((1, 1), (0, 0), (1, 1), 1)),
        ((2, 4, 9, 7), (6, 2, 3, 2), dict(stride=2, padding=(1, 2), groups=2), None),
        ((1, 2, 10, 10), (2, 1, 3, 3), dict(stride=(1, 3), dilation=2, groups=2), None),
    ],
)
def test_conv2d(xs, ws, attrs, normal) -> None:
    x, w = arr(*xs), arr(*ws)
    op = infer("conv2d", x, w, **attrs)
    a = dict(op.attrs)
    expected = conv2d_reference(x, w, a["stride"], a["padding"], a["dilation"], a["groups"])
    check("conv2d", expected, x, w, **attrs)
    assert all(len(a[k]) == 2 for k in ("stride", "padding", "dilation"))
    if normal:
        assert (a["stride"], a["padding"], a["dilation"], a["groups"]) == normal


@pytest.mark.parametrize("block", [4, 16])
def test_matmul_with_its_columns_in_blocks_computes_the_same_product(block, rng):
    from hexir.graph.evaluate import evaluate
    from hexir.ops.contraction import block_matmul_weight, unblock_matmul_weight

    a = rng.standard_normal((5, 12), dtype=np.float32)
    w = rng.standard_normal((12, 32), dtype=np.float32)
    packed = block_matmul_weight(w, block)
    assert packed.shape == (32 // block, 12, block)
    np.testing.assert_array_equal(unblock_matmul_weight(packed), w)
    op = check("matmul", a @ w, a, packed, weight_block=block)
    assert op.attr("weight_block") == block
    b = hexir.GraphBuilder("blocked")
    graph = b.build(b.matmul(b.input("a", a.shape), b.constant(packed), weight_block=block))
    (got,) = evaluate(graph, [a])
    np.testing.assert_allclose(got, a @ w, rtol=1e-5, atol=1e-5)
    (built,) = hexir.compile(graph).run([a])
    np.testing.assert_allclose(built, a @ w, rtol=1e-4, atol=1e-4)
    assert "weight_block" not in str(infer("matmul", a, w))  # a plain matmul records none
    bad("matmul", a, w, weight_block=block, match="b must have rank")
    bad("matmul", a, packed[..., :2], weight_block=block, match="needs b of shape")
    bad("matmul", a[:, :5], packed, weight_block=block, match="inner dimensions differ")


@pytest.mark.parametrize("block", [4, 16])
def test_batch_matmul_with_its_columns_in_blocks_computes_the_same_products(block, rng):
    from hexir.graph.evaluate import evaluate
    from hexir.ops.contraction import block_matmul_weight, unblock_matmul_weight

    a = rng.standard_normal((3, 7, 12), dtype=np.float32)
    w = rng.standard_normal((3, 12, 32), dtype=np.float32)
    packed = block_matmul_weight(w, block)
    assert packed.shape == (32 // block, 3, 12, block)
    np.testing.assert_array_equal(unblock_matmul_weight(packed), w)
    op = check("batch_matmul", a @ w, a, packed, weight_block=block)
    assert op.attr("weight_block") == block
    b = hexir.GraphBuilder("blocked")
    product = b.batch_matmul(b.input("a", a.shape), b.constant(packed), weight_block=block)
    graph = b.build(product)
    (got,) = evaluate(graph, [a])
    np.testing.assert_allclose(got, a @ w, rtol=1e-5, atol=1e-5)
    (built,) = hexir.compile(graph).run([a])
    np.testing.assert_allclose(built, a @ w, rtol=1e-4, atol=1e-4)
    assert "weight_block" not in str(infer("batch_matmul", a, w))
    bad("batch_matmul", a, w, weight_block=block, match="b must have rank")
    bad("batch_matmul", a, packed[..., :2], weight_block=block, match="needs b of shape")
    bad("batch_matmul", a[..., :5], packed, weight_block=block, match="inner dimensions differ")
    bad("batch_matmul", a[:2], packed, weight_block=block, match="batch dimensions differ")


@pytest.mark.parametrize("block, groups", [(4, 1), (8, 1), (4, 2)])
def test_conv2d_with_its_filters_in_blocks_computes_the_same_convolution(block, groups, rng):
    from hexir.graph.evaluate import evaluate
    from hexir.ops.nn import block_conv_weight, unblock_conv_weight

    x = rng.standard_normal((1, 4, 9, 9), dtype=np.float32)
    w = rng.standard_normal((8, 4 // groups, 3, 3), dtype=np.float32)
    packed = block_conv_weight(w, block)
    assert packed.shape == (8 // block, 4 // groups, 3, 3, block)
    np.testing.assert_array_equal(unblock_conv_weight(packed), w)
    attrs = dict(stride=2, padding=1, groups=groups)
    expected = conv2d_reference(x, w, (2, 2), (1, 1), (1, 1), groups)
    op = check("conv2d", expected, x, packed, weight_block=block, **attrs)
    assert op.attr("weight_block") == block
    b = hexir.GraphBuilder("blocked")
    xv = b.input("x", x.shape)
    graph = b.build(b.conv2d(xv, b.constant(packed), weight_block=block, **attrs))
    (got,) = evaluate(graph, [x])
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)
    (built,) = hexir.compile(graph).run([x])
    np.testing.assert_allclose(built, expected, rtol=1e-4, atol=1e-4)
    # A plain conv2d records no block: its text (and workload key) is as before.
    assert "weight_block" not in str(infer("conv2d", x, w, groups=groups))
    bad("conv2d", x, w, weight_block=block, match="x must have rank|w must have rank")
    bad("conv2d", x, packed[..., :2], weight_block=block, match="needs w of shape")


def test_conv2d_errors() -> None:
    bad("conv2d", arr(1, 4, 8, 8), arr(4, 2, 3, 3), groups=3, match="groups=3 must divide")
    bad("conv2d", arr(1, 4, 8, 8), arr(4, 3, 3, 3), match="3 channels per group")
    bad("conv2d", arr(1, 1, 2, 2), arr(1, 1, 3, 3), match="does not fit")
    bad("conv2d", arr(1, 1, 8, 8), arr(1, 1, 3, 3), stride=0, match="at least 1")
    bad("conv2d", arr(1, 1, 8, 8), arr(1, 1, 3, 3), padding=(1, 2, 3), match="2 entries")
    bad("conv2d", arr(1, 8, 8), arr(1, 1, 3, 3), match="x must have rank 4")


# --- normalizations --------------------------------------------------------------------------


@pytest.mark.parametrize("shape,axis", [((2, 3, 4, 4), None), ((5, 3), -1), ((3, 2, 2), 0)])
def test_batch_norm(shape, axis) -> None:
    x = arr(*shape)
    c = shape[1 if axis is None else axis]
    params = [arr(c) for _ in range(4)]
    op = check("batch_norm", x, x, *params, axis=axis)
    assert op.attr("axis") == (1 if axis is None else axis % len(shape))
    assert op.attr("epsilon") == 1e-5
    bad("batch_norm", x, arr(c), arr(c + 1), arr(c), arr(c), axis=axis, match="shift must")
    ints = [arr(*shape).astype("int32")] + [arr(c).astype("int32") for _ in range(4)]
    bad("batch_norm", *ints, axis=axis, match="float tensor")


@pytest.mark.parametrize("shape,axis", [((2, 3, 4), None), ((2, 3, 4), 1), ((6,), -1)])
def test_layer_norm(shape, axis) -> None:
    x = arr(*shape)
    a = len(shape) - 1 if axis is None else axis % len(shape)
    g, b = arr(*shape[a:]), arr(*shape[a:])
    op = check("layer_norm", (x - x.mean()) * g + b, x, g, b, axis=axis, epsilon=1e-3)
    assert dict(op.attrs) == {"axis": a, "epsilon": 1e-3}
    bad("layer_norm", x, arr(7), arr(7), match="gamma must have shape")


@pytest.mark.parametrize("shape,axis", [((2, 3, 4), None), ((2, 3, 4), -2), ((6,), -1)])
def test_rms_norm(shape, axis) -> None:
    x = arr(*shape)
    a = len(shape) - 1 if axis is None else axis % len(shape)
    op = check("rms_norm", x * arr(*shape[a:]), x, arr(*shape[a:]), axis=axis)
    assert dict(op.attrs) == {"axis": a, "epsilon": 1e-5}
    bad("rms_norm", x, arr(7), match="scale must have shape")
    bad("rms_norm", x, arr(*shape[a:]), axis=len(shape), match="out of range")
    bad("rms_norm", x, arr(*shape[a:], dtype="float64"), match="dtypes differ")
    bad("rms_norm", x.astype("int32"), arr(*shape[a:]).astype("int32"), match="float tensor")


@pytest.mark.parametrize("kind", ["softmax", "log_softmax"])
@pytest.mark.parametrize("shape", [(2, 5), (3, 1, 4)])
def test_softmax(kind, shape) -> None:
    x = arr(*shape)
    assert check(kind, x, x).attr("axis") == len(shape) - 1
    assert check(kind, x, x, axis=-len(shape)).attr("axis") == 0
    bad(kind, x, axis=len(shape), match="out of range")
    bad(kind, arr(3).astype("int64"), match="float tensor")


# --- elementwise -----------------------------------------------------------------------------

BROADCASTS = [((3, 1, 5), (4, 5)), ((2, 3), ()), ((1,), (6, 1)), ((0, 4), (1, 4))]
ARITH = {"add": np.add, "sub": np.subtract, "mul": np.multiply, "div": np.divide}
ARITH |= {"maximum": np.maximum, "minimum": np.minimum, "power": np.power}
COMPARE = {"equal": np.equal, "not_equal": np.not_equal, "less": np.less}
COMPARE |= {"less_equal": np.less_equal, "greater": np.greater, "greater_equal": np.greater_equal}


@pytest.mark.parametrize("shapes", BROADCASTS)
@pytest.mark.parametrize("name", list(ARITH) + list(COMPARE))
def test_binary(name: str, shapes) -> None:
    a, b = arr(*shapes[0]), arr(*shapes[1])
    with np.errstate(all="ignore"):
        check(name, (ARITH | COMPARE)[name](a, b), a, b)
        check(name, (ARITH | COMPARE)[name](b, a), b, a)


@pytest.mark.parametrize("name", list(ARITH) + list(COMPARE))
def test_binary_errors(name: str) -> None:
    bad(name, arr(3, 4), arr(3), match=r"shapes do not broadcast: a is 3x4, b is 3")
    bad(name, arr(3), arr(3, dtype="float64"), match="operand dtypes differ")


def test_binary_dtypes() -> None:
    i = arr(4).astype("int32")
    assert infer("div", i, i).result.type.dtype == "int32"
    assert infer("less", i, i).result.type.dtype == "bool"
    bad("power", i, i, match="float tensor")
    bad("add", arr(2, dtype="bool"), arr(2, dtype="bool"), match="numeric tensor")


@pytest.mark.parametrize("shapes", [((2, 3), (2, 3), (2, 3)), ((3, 1), (1, 4), ()), ((5,),) * 3])
def test_where(shapes) -> None:
    c, a, b = arr(*shapes[0], dtype="bool"), arr(*shapes[1]), arr(*shapes[2])
    check("where", np.where(c, a, b), c, a, b)
    bad("where", a.astype("float32"), a, b, match="cond must be a bool tensor")
    bad("where", c, a, b.astype("float64"), match="dtypes differ")


UNARY = ["relu", "sigmoid", "tanh", "exp", "log", "erf", "sqrt", "rsqrt", "gelu"]
UNARY += ["floor", "ceil", "round", "sin", "cos"]


@pytest.mark.parametrize("shape", [(3, 4), (), (2, 0, 5)])
@pytest.mark.parametrize("name", UNARY)
def test_unary(name: str, shape) -> None:
    x = arr(*shape)
    check(name, x, x)
    check(name, x.astype("float16"), x.astype("float16"))


@pytest.mark.parametrize("name", UNARY)
def test_unary_dtypes(name: str) -> None:
    i = arr(3).astype("int32")
    if name == "relu":
        check(name, i, i)
        bad(name, arr(3, dtype="bool"), match="numeric tensor")
    else:
        bad(name, i, match="x must be a float tensor, got int32")
    bad(name, arr(3), arr(3), match=r"takes 1 operand\(s\) \(x\), got 2")


def test_gelu_approximate() -> None:
    assert infer("gelu", arr(2)).attrs == (("approximate", "none"),)
    assert infer("gelu", arr(2), approximate="tanh").attrs == (("approximate", "tanh"),)
    bad("gelu", arr(2), approximate="fast", match='must be "none" | "tanh"')


@pytest.mark.parametrize("shape", [(2, 3), ()])
@pytest.mark.parametrize("dtype", ["float16", "int64", "bool", "f64", "i32"])
def test_cast(shape, dtype: str) -> None:
    x = arr(*shape)
    op = infer("cast", x, dtype=dtype)
    expected = x.astype(np.dtype({"f64": "float64", "i32": "int32"}.get(dtype, dtype)))
    check("cast", expected, x, dtype=dtype)
    assert op.attr("dtype") == expected.dtype.name
    bad("cast", x, dtype="complex64", match="unknown dtype")
    bad("cast", x, match="missing attribute 'dtype'")


# --- reductions ------------------------------------------------------------------------------

REDUCE = {"reduce_sum": np.sum, "reduce_mean": np.mean, "reduce_max": np.max}


@pytest.mark.parametrize("name", list(REDUCE))
@pytest.mark.parametrize(
    "shape,axes",
    [((2, 3, 4), None), ((2, 3, 4), (-1, 0)), ((2, 3, 4), 1), ((5,), ()), ((4, 6), (0, 1))],
)
@pytest.mark.parametrize("keepdims", [False, True])
def test_reduce(name: str, shape, axes, keepdims: bool) -> None:
    x = arr(*shape)
    expected = REDUCE[name](x, axis=axes, keepdims=keepdims)
    op = check(name, expected, x, axes=axes, keepdims=keepdims)
    want = tuple(range(len(shape))) if axes is None else tuple(sorted(np.atleast_1d(axes) % 3))
    if axes == ():
        want = ()
    assert op.attrs == (("axes", tuple(int(a) for a in want)), ("keepdims", keepdims))


@pytest.mark.parametrize("name", list(REDUCE))
def test_reduce_errors(name: str) -> None:
    bad(name, arr(2, 3), axes=(1, -1), match="repeats an axis")
    bad(name, arr(2, 3), axes=(2,), match="axis 2 is out of range for rank 2")
    bad(name, arr(2, 3), keepdims="yes", match="must be a bool")


# --- data movement ---------------------------------------------------------------------------


@pytest.mark.parametrize("shape,perm", [((2, 3, 4), None), ((2, 3, 4), (1, -1, 0)), ((5,), (0,))])
def test_transpose(shape, perm) -> None:
    x = arr(*shape)
    op = check("transpose", np.transpose(x, perm), x, perm=perm)
    normal = tuple(reversed(range(len(shape)))) if perm is None else tuple(p % 3 for p in perm)
    assert op.attr("perm") == normal
    bad("transpose", x, perm=(0,) * len(shape) + (0,), match="entries for rank")
    bad("transpose", arr(2, 3), perm=(1, 1), match="not a permutation")


@pytest.mark.parametrize(
    "shape,new", [((2, 3, 4), (6, -1)), ((2, 3, 4), (-1,)), ((6,), (1, 2, 1, 3)), ((4,), 4)]
)
def test_reshape(shape, new) -> None:
    x = arr(*shape)
    op = check("reshape", x.reshape(new), x, shape=new)
    assert op.attr("shape") == x.reshape(new).shape


def test_reshape_errors() -> None:
    bad("reshape", arr(2, 3), shape=(4, 2), match=r"cannot reshape 2x3 \(6 elements\)")
    bad("reshape", arr(2, 3), shape=(-1, -1), match="one -1")
    bad("reshape", arr(2, 3), shape=(4, -1), match="cannot resolve the -1")
    bad("reshape", arr(0, 3), shape=(0, -1), match="cannot resolve the -1")


@pytest.mark.parametrize(
    "shapes,axis", [(((2, 3), (4, 3)), 0), (((2, 3), (2, 1), (2, 0)), -1), (((5,),), 0)]
)
def test_concat(shapes, axis: int) -> None:
    xs = [arr(*s) for s in shapes]
    op = check("concat", np.concatenate(xs, axis=axis), *xs, axis=axis)
    assert op.attr("axis") == axis % len(shapes[0])


def test_concat_errors() -> None:
    bad("concat", arr(2, 3), arr(3, 3), axis=1, match="shapes differ off axis 1: x0 is 2x3")
    bad("concat", arr(2, 3), arr(2, 3, 1), axis=0, match="shapes differ off axis 0")
    bad("concat", arr(2, 3), match="missing attribute 'axis'")
    bad("concat", match="at least one operand")


SLICES = [
    ((10,), (2,), (8,), (3,)),
    ((10,), (None,), (None,), (-1,)),
    ((10,), (-2,), (1,), (-3,)),
    ((10,), (-1,), (-12,), (-1,)),
    ((5, 6), (1, -1), (100, 0), (1, -2)),
    ((5, 6), (-100, 4), (-1, 4), None),
    ((4, 3, 2), (1,), (3,), None),
    ((0, 3), (None, None), (None, None), (-1, -1)),
]


@pytest.mark.parametrize("shape,start,stop,step", SLICES)
def test_slice_matches_numpy(shape, start, stop, step) -> None:
    x = arr(*shape)
    steps = step or (None,) * len(start)
    index = tuple(slice(*t) for t in zip(start, stop, steps, strict=True))
    attrs = slice_indices(shape, start, stop, step)
    op = check("slice", x[index], x, **attrs)
    for k, dim in enumerate(shape):
        t = (
            slice(*(index[k].start, index[k].stop, index[k].step))
            if k < len(index)
            else slice(None)
        )
        assert (op.attr("start")[k], op.attr("stop")[k], op.attr("step")[k]) == t.indices(dim)
    # element i along each axis is x[start + i * step] (docs/ops.md)
    shape, steps, starts = op.result.type.shape, op.attr("step"), op.attr("start")
    grids = np.ix_(*[np.arange(n) * s + b for n, s, b in zip(shape, steps, starts, strict=True)])
    np.testing.assert_array_equal(x[grids], x[index])


def test_slice_normal_form_in_make_op() -> None:
    x = arr(4, 5)
    op = infer("slice", x, start=(3,), stop=(-1,), step=(-1,))  # -1 stop: through index 0
    assert op.result.type.shape == (4, 5)
    assert dict(op.attrs) == {"start": (3, 0), "stop": (-1, 5), "step": (-1, 1)}
    op = infer("slice", x, start=(None, 1), stop=(None, None))
    assert dict(op.attrs) == {"start": (0, 1), "stop": (4, 5), "step": (1, 1)}
    bad("slice", x, start=(-2,), stop=(4,), match="not in normal form 0..4")
    bad("slice", x, start=(0,), stop=(4,), step=(0,), match="step is 0 on axis 0")
    bad("slice", x, start=(0, 0, 0), stop=(1, 1, 1), match="3 entries for rank 2")
    with pytest.raises(TypeInferenceError, match="step is 0"):
        slice_indices((4,), (0,), (2,), (0,))


@pytest.mark.parametrize(
    "shape,before,after", [((2, 3), (1, 0), (0, 2)), ((4,), 2, 3), ((1, 2, 3), (0, 0, 1), 0)]
)
def test_pad(shape, before, after) -> None:
    x = arr(*shape)
    b = (before,) * len(shape) if isinstance(before, int) else before
    a = (after,) * len(shape) if isinstance(after, int) else after
    op = check("pad", np.pad(x, list(zip(b, a, strict=True))), x, before=before, after=after)
    assert dict(op.attrs) == {"before": b, "after": a, "value": 0.0}
    assert infer("pad", x, before=before, after=after, value=-np.inf).attr("value") == -np.inf
    bad("pad", x, before=-1, after=0, match="at least 0")
    bad("pad", x, before=(1,) * (len(shape) + 1), after=0, match="entries")


def pool_reference(x, kernel, stride, padding, reducer) -> np.ndarray:
    (kh, kw), (sh, sw), (ph, pw) = kernel, stride, padding
    xp = np.pad(x, ((0, 0), (0, 0), (ph, ph), (pw, pw)), constant_values=np.nan)
    windows = np.lib.stride_tricks.sliding_window_view(xp, (kh, kw), axis=(2, 3))
    return reducer(windows[:, :, ::sh, ::sw], axis=(-2, -1))


@pytest.mark.parametrize("name,reducer", [("max_pool2d", np.nanmax), ("avg_pool2d", np.nanmean)])
@pytest.mark.parametrize(
    "shape,attrs",
    [
        ((1, 2, 8, 8), dict(kernel=2)),
        ((2, 3, 9, 7), dict(kernel=(3, 2), stride=(2, 1), padding=(1, 0))),
        ((1, 1, 5, 5), dict(kernel=3, stride=1, padding=1)),
    ],
)
def test_pool2d(name: str, reducer, shape, attrs) -> None:
    x = arr(*shape)
    op = infer(name, x, **attrs)
    a = dict(op.attrs)
    check(name, pool_reference(x, a["kernel"], a["stride"], a["padding"], reducer), x, **attrs)
    if "stride" not in attrs:
        assert a["stride"] == a["kernel"]
    bad(name, x, kernel=2, padding=2, match="smaller than the kernel")
    bad(name, x, kernel=20, match="does not fit")
    bad(name, x, match="missing attribute 'kernel'")


@pytest.mark.parametrize("shape", [(2, 3, 5, 7), (1, 1, 1, 1)])
def test_global_avg_pool2d(shape) -> None:
    x = arr(*shape)
    check("global_avg_pool2d", x.mean(axis=(2, 3), keepdims=True), x)
    bad("global_avg_pool2d", arr(2, 3, 4), match="x must have rank 4")


def test_constant() -> None:
    t = TensorType((2, 3), "int32")
    op = make_op("hexir.constant", [], {"name": "w0"}, "w0", result_type=t)
    assert op.result == Value("w0", t) and op.attrs == (("name", "w0"),)
    with pytest.raises(TypeInferenceError, match="hexir.constant: needs its result type"):
        make_op("constant", [], {"name": "w0"}, "w0")
    with pytest.raises(TypeInferenceError, match="hexir.constant: attribute 'name'"):
        make_op("constant", [], {"name": "a b"}, "w0", result_type=t)


# --- what every op shares --------------------------------------------------------------------


def test_every_op_of_the_contract_is_in_the_table() -> None:
    contract = open("docs/ops.md").read()
    for name in OPS:
        assert f"| {name}" in contract or f", {name}" in contract, name


def test_signature_errors() -> None:
    x = arr(2, 3)
    with pytest.raises(TypeInferenceError, match="hexir.frobnicate: unknown op"):
        infer("frobnicate", x)
    bad("relu", x, axis=1, match="unknown attribute.*axis; it takes no attributes")
    bad("softmax", x, axes=1, match="unknown attribute.*axes; it takes axis")
    bad("add", x, match=r"takes 2 operand\(s\) \(a, b\), got 1")
    with pytest.raises(TypeInferenceError, match="operand 1 is a ndarray, not a Value"):
        make_op("add", [val(x), x], {}, "r")
    with pytest.raises(TypeInferenceError, match="bad result name"):
        make_op("relu", [val(x)], {}, "a b")
    with pytest.raises(TypeInferenceError, match="bad placement"):
        make_op("relu", [val(x)], {}, "r", placement="gpu 0")
    bad("softmax", x, axis=True, match="must be an int")
    bad("softmax", x, axis=1.0, match="must be an int")


def test_declared_result_type_is_checked() -> None:
    a, b = val(arr(2, 3)), val(arr(3, 4))
    op = make_op("matmul", [a, b], {}, "r", "cuda:0", result_type=TensorType((2, 4)))
    assert op.placement == "cuda:0" and op.result.name == "r"
    with pytest.raises(TypeInferenceError, match="disagrees with the inferred tensor<2x4xf32>"):
        make_op("matmul", [a, b], {}, "r", result_type=TensorType((2, 5)))


def test_attribute_values_are_plain_python() -> None:
    op = infer("conv2d", arr(1, 2, 6, 6), arr(2, 2, 3, 3), stride=np.int64(2), padding=[1, 1])
    for _, value in op.attrs:
        assert type(value) in (int, tuple)
        assert all(type(v) is int for v in (value if isinstance(value, tuple) else (value,)))
    assert type(infer("reduce_sum", arr(2), keepdims=np.bool_(True)).attr("keepdims")) is bool
    assert type(infer("pad", arr(2), before=1, after=1, value=1).attr("value")) is float
