"""Constant weights laid out at compile time (hexir/graph/layout.py)."""

from __future__ import annotations

import numpy as np
import pytest

import hexir
from hexir import knobs
from hexir.graph.evaluate import evaluate
from hexir.graph.fusion import fused_kernels
from hexir.graph.layout import PADDED_PANELS, layout_weights, transposed_elements
from hexir.ops.builder import GraphBuilder
from hexir.runtime.default_schedule import default_schedule
from hexir.runtime.target import Target
from hexir.runtime.tiling import matrix_vector_block, register_tile


def _mlp(
    rng: np.random.Generator, weight_is_input: bool = False, rows: int = 6
) -> tuple[hexir.Graph, dict]:
    b = GraphBuilder("mlp")
    x = b.input("x", (rows, 24))
    w1 = rng.standard_normal((40, 24), dtype=np.float32)
    w2 = rng.standard_normal((8, 40), dtype=np.float32)
    bias = rng.standard_normal(40, dtype=np.float32)
    h = b.relu(b.bias_add(b.dense(x, b.constant(w1, name="w1")), b.constant(bias), axis=1))
    second = b.input("w2", (8, 40)) if weight_is_input else b.constant(w2, name="w2")
    graph = b.build(b.dense(h, second))
    return graph, {"w1": w1, "w2": w2, "bias": bias}


def _block(rows: int, columns: int) -> int | None:
    """The column panel of a matmul's register tile on this CPU, where one divides the columns
    (AVX2: 8 of 40 and of 8; AVX-512: none of 40, whose 16-lane panels do not divide it)."""
    panel, _ = register_tile(columns, rows, Target("cpu"))
    return panel if columns % panel == 0 else None


def test_dense_of_a_constant_weight_becomes_a_matmul_of_its_transpose_in_panels(rng):
    # 6 rows: the weight transposed to [K, N] and cut into panels of the register tile's
    # width b, [N/b, K, b], each panel contiguous; kept whole where no panel divides N.
    graph, data = _mlp(rng)
    after = layout_weights(graph)
    matmuls = [op for op in after.ops if op.kind == "matmul"]
    assert [op.kind for op in after.ops if op.kind != "constant"] == [
        "matmul", "bias_add", "relu", "matmul"
    ]  # fmt: skip
    blocks = [_block(6, 40), _block(6, 8)]
    assert [op.attr("weight_block") for op in matmuls] == blocks
    assert after.outputs == graph.outputs and after.inputs == graph.inputs
    names = {name for name, _ in after.constants}
    laid = [f"{w}_t_{b}n" if b else f"{w}_t" for w, b in zip(["w1", "w2"], blocks, strict=True)]
    assert set(laid) <= names and not {"w1", "w2"} & names
    weight = after.constant(laid[0])
    assert weight.flags.c_contiguous
    if blocks[0] is None:
        np.testing.assert_array_equal(weight, data["w1"].T)
    else:
        b = blocks[0]
        assert weight.shape == (40 // b, 24, b)
        np.testing.assert_array_equal(weight[1], data["w1"].T[:, b : 2 * b])
    x = rng.standard_normal((6, 24), dtype=np.float32)
    (got,) = hexir.compile(graph).run([x])
    (want,) = evaluate(graph, [x])  # numpy semantics of the graph as given
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


# Columns -> the panel of a single row's weight on 2 cores, by vector width (AVX-512's 16
# lanes, AVX2's 8).
MATRIX_VECTOR_BLOCKS = {3072: {16: 64, 8: 32}, 96: {16: 32, 8: 32}, 40: {16: 8, 8: 8},
                        1000: {16: 40, 8: 20}, 1001: {16: 0, 8: 0}, 16: {16: 0, 8: 4}}  # fmt: skip


@pytest.mark.parametrize("columns", list(MATRIX_VECTOR_BLOCKS))
@pytest.mark.parametrize("lanes", [16, 8])
def test_a_single_row_takes_its_weight_in_panels_it_streams_whole(columns, lanes, rng):
    # A matrix-vector product reads its weight once: in panels ([N/b, K, b]) of up to 4
    # vectors, in steps of half a vector, each one contiguous stretch with its reduction
    # inside, more panels than cores (1000: 40 columns on AVX-512, 2.5 vectors; 96 on
    # AVX-512: 3 panels of 32, not 2 of 48; 40: 5 of 8); where none divides the columns
    # (1001, odd) or gives the cores work (16 on AVX-512), the weight keeps [K, N].
    from types import SimpleNamespace

    two_cores = SimpleNamespace(vector_width=lanes, num_cores=2)
    assert matrix_vector_block(columns, two_cores) == MATRIX_VECTOR_BLOCKS[columns][lanes]  # type: ignore[arg-type]
    target = Target("cpu")
    block = matrix_vector_block(columns, target)
    b = GraphBuilder("gemv")
    w = rng.standard_normal((24, columns), dtype=np.float32)
    graph = b.build(b.matmul(b.input("x", (1, 24)), b.constant(w, name="w")))
    (matmul,) = (op for op in layout_weights(graph).ops if op.kind == "matmul")
    assert matmul.attr("weight_block") == (block or None)
    module = hexir.compile(graph)
    (weight,) = module.constants.values()
    if block:
        assert weight.shape == (columns // block, 24, block)
        np.testing.assert_array_equal(weight[-1], w[:, columns - block :])
    else:
        np.testing.assert_array_equal(weight, w)
    x = rng.standard_normal((1, 24), dtype=np.float32)
    np.testing.assert_allclose(module.run([x])[0], x @ w, rtol=1e-4, atol=1e-4)


def test_a_matmul_of_a_constant_takes_it_in_panels_that_its_kernel_reads_in_place(rng):
    b = GraphBuilder("proj")
    x = b.input("x", (12, 32))
    w = rng.standard_normal((32, 48), dtype=np.float32)
    graph = b.build(b.matmul(x, b.constant(w, name="w")))
    module = hexir.compile(graph)
    (panels,) = (a for a in module.constants.values() if a.ndim == 3)
    panel, _ = register_tile(48, 12, Target("cpu"))  # AVX2's 6 x 2 vectors: 16 columns
    assert panels.shape == (48 // panel, 32, panel)
    np.testing.assert_array_equal(panels[-1], w[:, 48 - panel :])
    _, kernels = fused_kernels(layout_weights(graph))
    (func,) = (f for _, f in kernels)
    assert "_global" not in str(default_schedule(func).func)  # nothing packed per call
    a = rng.standard_normal((12, 32), dtype=np.float32)
    np.testing.assert_allclose(module.run([a])[0], a @ w, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("columns", [300, 2604])
def test_columns_that_fill_no_whole_panels_are_padded_and_sliced(rng, columns):
    """A dense whose columns are no multiple of its panel (GPT-2's 50257 logits; here 300 and
    2604, past PADDED_MIN_COLUMNS, multiples of no panel of 8, 16 or 32) takes its weight
    padded with zero columns to whole panels, a multiple of PADDED_PANELS of them where there
    are 64 or more, then the result's first columns; its bias and relu still apply, and the
    values are numpy's."""
    b = GraphBuilder("odd")
    x = b.input("x", (24, 40))
    w = rng.standard_normal((columns, 40), dtype=np.float32)
    bias = rng.standard_normal(columns, dtype=np.float32)
    graph = b.build(b.relu(b.bias_add(b.dense(x, b.constant(w, name="w")), b.constant(bias))))
    after = layout_weights(graph)
    (matmul,) = (op for op in after.ops if op.kind == "matmul")
    panel = matmul.attr("weight_block")
    panels = after.constant(matmul.operands[1].name)
    multiple = PADDED_PANELS if columns >= 64 * panel else 1
    assert (
        panels.shape[0] % multiple == 0
        and panels.shape[0] * panel >= columns > (panels.shape[0] - multiple) * panel
    )
    padded = panels.transpose(1, 0, 2).reshape(40, -1)
    np.testing.assert_array_equal(padded[:, :columns], w.T)
    assert not padded[:, columns:].any()
    assert "slice" in [op.kind for op in after.ops]
    a = rng.standard_normal((24, 40), dtype=np.float32)
    (got,) = hexir.compile(graph).run([a])
    np.testing.assert_allclose(got, np.maximum(a @ w.T + bias, 0), rtol=1e-4, atol=1e-4)


def test_the_module_holds_the_laid_out_constants_and_no_kernel_transposes_them(rng):
    graph, data = _mlp(rng)
    module = hexir.compile(graph)
    shapes = sorted(a.shape for a in module.constants.values())
    first, second = _block(6, 40), _block(6, 8)
    w1 = (40 // first, 24, first) if first else (24, 40)
    w2 = (8 // second, 40, second) if second else (40, 8)
    assert shapes == sorted([w1, w2, (40,)])  # laid out once, at compile time
    assert all("dense" not in r.name and "transpose" not in r.name for r in module.report)
    # Each matmul reads its weight along N with unit stride: its pack is a copy of a panel.
    _, kernels = fused_kernels(graph)
    for _, func in kernels:
        assert "dense" not in func.name


def test_a_tied_embedding_keeps_one_copy_of_its_weight(rng):
    # GPT-2's wte: rows looked up by token, and the logits' weight of one row (kept [K, N]
    # transposed, as 1003 columns fill no panel): the lookup reads the transpose's columns.
    wte = rng.standard_normal((1003, 32)).astype(np.float32)
    b = GraphBuilder("tied")
    ids = b.input("ids", (1,), "int64")
    w = b.constant(wte, name="wte")
    x = b.op("gather", w, ids, axis=0)
    graph = b.build(b.dense(b.relu(x), w))
    module = hexir.compile(graph)
    assert [a.shape for a in module.constants.values()] == [(32, 1003)]
    for token in (0, 517, 1002):
        (got,) = module.run([np.array([token])])
        want = np.maximum(wte[[token]], 0) @ wte.T
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_a_lookup_reads_only_the_transpose_the_pass_made_of_its_table(rng):
    # A graph's own constant named like a transpose (emb_t, of emb's transposed shape but
    # other values) is no transpose of emb: the lookup keeps reading emb.
    emb, other = (rng.standard_normal(s).astype(np.float32) for s in ((1003, 32), (32, 1003)))
    b = GraphBuilder("named")
    ids = b.input("ids", (1,), "int64")
    x = b.op("gather", b.constant(emb, name="emb"), ids, axis=0)
    graph = b.build(b.matmul(x, b.constant(other, name="emb_t")))
    (got,) = hexir.compile(graph).run([np.array([517])])
    np.testing.assert_allclose(got, emb[[517]] @ other, rtol=1e-5, atol=1e-5)


def test_a_weight_that_is_an_input_stays_a_dense(rng):
    graph, _ = _mlp(rng, weight_is_input=True)
    kinds = [op.kind for op in layout_weights(graph).ops]
    assert kinds.count("dense") == 1 and kinds.count("matmul") == 1


def test_the_knob_keeps_the_weights_as_they_are(rng):
    graph, _ = _mlp(rng)
    with knobs.scope(pack_weights=False):
        assert layout_weights(graph) == graph
        module = hexir.compile(graph)
    assert any(r.name.startswith("fused_dense") for r in module.report)
    x = rng.standard_normal((6, 24), dtype=np.float32)
    (got,) = module.run([x])
    (want,) = hexir.compile(graph).run([x])
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def _convs(rng: np.random.Generator) -> hexir.Graph:
    """A 3x3 conv (laid out in blocks of the vector width), a 1x1 (in its register tile's
    panels) and a grouped one (kept KCRS)."""
    b = GraphBuilder("convs")
    x = b.input("x", (1, 8, 10, 10))
    w3 = rng.standard_normal((16, 8, 3, 3), dtype=np.float32)
    w1 = rng.standard_normal((16, 16, 1, 1), dtype=np.float32)
    wg = rng.standard_normal((16, 8, 3, 3), dtype=np.float32)
    h = b.relu(b.conv2d(x, b.constant(w3, name="w3"), padding=1))
    h = b.conv2d(h, b.constant(w1, name="w1"))
    return b.build(b.conv2d(h, b.constant(wg, name="wg"), padding=1, groups=2))


def test_convs_take_their_constant_weights_in_the_panels_their_kernels_read(rng):
    from hexir.ops.nn import unblock_conv_weight
    from hexir.runtime.target import Target
    from hexir.runtime.tiling import register_tile

    graph = _convs(rng)
    target = Target("cpu")
    lanes = target.vector_width
    panel, _ = register_tile(16, 10, target)  # the 1x1's: 16 filters by 10-pixel rows
    after = layout_weights(graph, target)
    convs = [op for op in after.ops if op.kind == "conv2d"]
    assert [op.attr("weight_block") for op in convs] == [lanes, panel, None]
    packed = after.constant(convs[0].operands[1].name)
    assert packed.shape == (16 // lanes, 8, 3, 3, lanes)
    np.testing.assert_array_equal(unblock_conv_weight(packed), graph.constant("w3"))
    pointwise = after.constant(convs[1].operands[1].name)
    assert pointwise.shape == (16 // panel, 16, 1, 1, panel)
    np.testing.assert_array_equal(unblock_conv_weight(pointwise), graph.constant("w1"))
    assert after.outputs == graph.outputs
    assert layout_weights(graph, Target("cuda")) == graph  # the GPU's kernels read KCRS
    x = rng.standard_normal((1, 8, 10, 10), dtype=np.float32)
    module = hexir.compile(graph)
    (got,) = module.run([x])
    (want,) = evaluate(graph, [x])
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    # Laid out once, here: the kernel of the blocked conv reads its weight in place, no pack.
    assert any(a.shape == packed.shape for a in module.constants.values())
    blocked, pointwise_kernel = [r for r in module.report if r.ops[0] == "conv2d"][:2]
    for report in (blocked, pointwise_kernel):
        assert "read_buffer_index=1" not in str(report.trace)  # no pack of the weight
    with knobs.scope(pack_weights=False):
        assert layout_weights(graph, Target("cpu")) == graph


def _residual_block(rng: np.random.Generator, size: int) -> hexir.Graph:
    """Two 1x1 convs with bias, their sum and a relu (a ResNet block's end: the main branch
    and the shortcut meet at the add); the shortcut comes after the main branch."""
    b = GraphBuilder("block")
    x = b.input("x", (1, 8, size, size))
    main = b.conv2d(x, b.constant(rng.standard_normal((16, 8, 1, 1), dtype=np.float32)))
    main = b.bias_add(main, b.constant(rng.standard_normal(16, dtype=np.float32)), axis=1)
    shortcut = b.conv2d(x, b.constant(rng.standard_normal((16, 8, 1, 1), dtype=np.float32)))
    shortcut = b.bias_add(shortcut, b.constant(np.ones(16, np.float32)), axis=1)
    return b.build(b.relu(b.add(main, shortcut)))


def _strided(rng: np.random.Generator, size: int = 14) -> hexir.Graph:
    b = GraphBuilder("strided")
    x = b.input("x", (1, 8, size, size))
    w = b.constant(rng.standard_normal((16, 8, 1, 1), dtype=np.float32))
    return b.build(b.relu(b.conv2d(x, w, stride=2)))


def test_a_1x1_conv_and_its_epilogues_become_a_matmul_over_the_pixels(rng):
    from hexir.runtime.target import Target

    graph = _residual_block(rng, 16)  # 256 pixels: whole column panels
    after = layout_weights(graph, Target("cpu"))
    assert not any(op.kind == "conv2d" for op in after.ops)
    matmuls = [op for op in after.ops if op.kind == "matmul"]
    assert [op.result.type.shape for op in matmuls] == [(16, 256)] * 2
    assert [op.attr("axis") for op in after.ops if op.kind == "bias_add"] == [0, 0]
    assert after.outputs == graph.outputs  # read back as [1, K, H, W] under its name
    x = rng.standard_normal((1, 8, 16, 16), dtype=np.float32)
    np.testing.assert_allclose(evaluate(after, [x])[0], evaluate(graph, [x])[0], rtol=1e-5)
    module = hexir.compile(graph)
    # One kernel per conv: the bias, the residual add and the relu fused into the matmuls;
    # the image and the results are views.
    assert [r.ops for r in module.report] == [("matmul", "bias_add"),
                                              ("matmul", "bias_add", "add", "relu")]  # fmt: skip
    np.testing.assert_allclose(module.run([x])[0], evaluate(graph, [x])[0], rtol=1e-4, atol=1e-5)


def test_1x1_convs_that_do_not_fill_column_panels_stay_convs(rng):
    from hexir.runtime.target import Target

    for graph, convs in ((_residual_block(rng, 7), 2), (_strided(rng, 14), 1)):  # 49 pixels
        after = layout_weights(graph, Target("cpu"))
        assert sum(op.kind == "conv2d" for op in after.ops) == convs
        x = rng.standard_normal(graph.inputs[0].type.shape, dtype=np.float32)
        got = hexir.compile(graph).run([x])[0]
        np.testing.assert_allclose(got, evaluate(graph, [x])[0], rtol=1e-4, atol=1e-5)
    graph = _residual_block(rng, 16)
    assert layout_weights(graph, Target("cuda")) == graph  # the GPU's kernels read KCRS


def test_a_strided_1x1_conv_becomes_a_slice_and_a_matmul_over_the_pixels_it_keeps(rng):
    from hexir.runtime.target import Target

    graph = _strided(rng, 31)  # stride 2 keeps 16 x 16 pixels: whole column panels
    after = layout_weights(graph, Target("cpu"))
    assert not any(op.kind == "conv2d" for op in after.ops)
    (picked,) = [op for op in after.ops if op.kind == "slice"]
    assert picked.attr("step") == (1, 1, 2, 2) and picked.result.type.shape == (1, 8, 16, 16)
    assert [op.result.type.shape for op in after.ops if op.kind == "matmul"] == [(16, 256)]
    x = rng.standard_normal((1, 8, 31, 31), dtype=np.float32)
    np.testing.assert_allclose(evaluate(after, [x])[0], evaluate(graph, [x])[0], rtol=1e-5)
    got = hexir.compile(graph).run([x])[0]
    np.testing.assert_allclose(got, evaluate(graph, [x])[0], rtol=1e-4, atol=1e-5)


def test_a_bottleneck_resnet_with_its_1x1_convs_as_matmuls_reaches_a_fixed_point(rng):
    # 2-D matmuls between 4-D views meet 4-D convs at every residual add: simplify_graph's
    # reshape sink must not pull the ops between them back and forth.
    from hexir.frontend import zoo
    from hexir.graph.rewrite import simplify_graph
    from hexir.runtime.target import Target

    graph = zoo.resnet(50, image=64, width=8, classes=10)
    after = layout_weights(simplify_graph(graph), Target("cpu"))
    assert sum(op.kind == "matmul" for op in after.ops) > 1
    x = rng.standard_normal(graph.inputs[0].type.shape, dtype=np.float32)
    np.testing.assert_allclose(
        evaluate(after, [x])[0], evaluate(graph, [x])[0], rtol=1e-4, atol=1e-5
    )


def _between_winograd_convs(rng: np.random.Generator) -> hexir.Graph:
    """3x3 conv -> relu -> 1x1 conv -> relu -> 3x3 conv on 28 x 28 (F(4, 3): 49 tiles)."""
    b = GraphBuilder("g")
    x = b.input("x", (1, 16, 28, 28))

    def conv(v, k: int, c: int, size: int):
        w = (rng.standard_normal((k, c, size, size)) / np.sqrt(c * size * size)).astype("f4")
        return b.conv2d(v, b.constant(w), padding=size // 2)

    h = b.relu(conv(x, 16, 16, 3))
    h = b.relu(conv(h, 32, 16, 1))
    return b.build(conv(h, 16, 32, 3))


@pytest.mark.slow
def test_a_1x1_conv_between_winograd_convs_computes_in_nhwc_where_fewer_elements_move(rng):
    # The Winograd form reads and writes NHWC: the 1x1 conv as a matmul of the pixels [H*W, C]
    # by its weight [C, K] keeps the activations in NHWC between them, its transposes meeting
    # the Winograd form's and going; as a matmul over NCHW pixels, both stay.
    from hexir.graph import layout

    graph = _between_winograd_convs(rng)
    target = Target("cpu")
    after = layout_weights(graph, target)
    nchw = layout._lay_out(layout._pointwise_convs_as_matmuls(graph, target), target, {})
    assert transposed_elements(after) < transposed_elements(nchw)
    assert not any(op.kind == "transpose" for op in after.ops)  # layout_transforms, named
    (pointwise,) = [op for op in after.ops if op.kind == "matmul"]
    assert pointwise.result.type.shape == (28 * 28, 32)  # the pixels' rows by the filters
    x = rng.standard_normal((1, 16, 28, 28), dtype=np.float32)
    expected = evaluate(graph, [x])[0]
    np.testing.assert_allclose(evaluate(after, [x])[0], expected, rtol=1e-4, atol=1e-4)
    got = hexir.compile(graph).run([x])[0]
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4)


@pytest.mark.slow
def test_resnet50s_1x1_convs_and_mobilenets_depthwise_convs_compute_in_nhwc():
    # ResNet-50's stages are Winograd convs between 1x1 convs: in NHWC, 11 layout transforms
    # where 22 were (its global pool in NHWC too, its max pool after the NCHW stem not).
    # MobileNetV2's depthwise convs vectorize along the channels in NHWC (0.14 -> 0.06 ms on
    # 56x56x144): its whole graph computes in NHWC, its 3x3 stem on the RGB image too, one
    # transform of that image; its 1x1 convs are matmuls of the pixels by the filters.
    from hexir.frontend.zoo import zoo_model
    from hexir.graph.rewrite import simplify_graph

    target = Target("cpu")
    resnet = layout_weights(simplify_graph(zoo_model("resnet50")), target)
    rows = [op for op in resnet.ops if op.kind == "matmul" and op.operands[0].type.shape[0] > 1]
    assert len(rows) == 36 and all(op.attr("weight_block") for op in rows)  # every 1x1 conv:
    # the pixels' rows by the filters, in panels
    transforms = [op for op in resnet.ops if op.kind == "layout_transform"]
    assert len(transforms) <= 12 and not any(op.kind == "transpose" for op in resnet.ops)
    assert {(op.attr("src"), op.attr("dst")) for op in transforms} == {
        ("NCHW", "NHWC"), ("NHWC", "NCHW")}  # fmt: skip
    pools = [op for op in resnet.ops if "pool" in op.kind]
    assert [(op.kind, op.attr("layout")) for op in pools] == [
        ("max_pool2d", None), ("global_avg_pool2d", "NHWC")]  # fmt: skip
    mobilenet = layout_weights(simplify_graph(zoo_model("mobilenet-v2")), target)
    (transform,) = [op for op in mobilenet.ops if op.kind == "layout_transform"]
    assert transform.operands == zoo_model("mobilenet-v2").inputs
    convs = [op for op in mobilenet.ops if op.kind == "conv2d"]
    assert len(convs) == 18 and all(op.attr("layout") == "NHWC" for op in convs)
    assert sum(op.attr("groups") > 1 for op in convs) == 17  # and the stem


@pytest.mark.parametrize(
    "name",
    [pytest.param(n, marks=pytest.mark.slow) for n in ("resnet18", "resnet50", "mobilenet-v2")],
)  # whole models, 1-2.5 s each: the slow suite (CI runs it)
def test_the_planned_layouts_compute_what_nchw_everywhere_does(name, rng):
    # The zoo's CNNs at full size, evaluated by the reference: the layouts planned for the
    # whole graph (`layout` knob "auto"), NCHW between every two ops ("nchw") and the NHWC
    # plan ("nhwc") agree with the model as imported; a ResNet keeps its stages in NHWC, so
    # fewer elements move, and MobileNetV2 computes in NHWC after its stem.
    from hexir.frontend.zoo import zoo_model
    from hexir.graph.rewrite import simplify_graph

    graph = zoo_model(name)
    x = rng.standard_normal(graph.inputs[0].type.shape, dtype=np.float32)
    expected = evaluate(graph, [x])[0]
    planned = {}
    for layout in ("auto", "nchw", "nhwc"):
        with knobs.scope(layout=layout):
            planned[layout] = layout_weights(simplify_graph(graph), Target("cpu"))
        got = evaluate(planned[layout], [x])[0]
        np.testing.assert_allclose(got, expected, rtol=1e-3, atol=1e-4)
    moved = {k: transposed_elements(g) for k, g in planned.items()}
    if name.startswith("resnet"):
        assert moved["auto"] == min(moved.values()) < moved["nchw"]
    else:  # its depthwise convs save more than the transform after its stem costs
        assert 0 == moved["nchw"] < moved["auto"] == moved["nhwc"]


@pytest.mark.slow  # 1.7 s
def test_the_layout_knob_keeps_activations_in_nchw_between_kernels(rng):
    # Under "nchw" the 1x1 conv stays a matmul over NCHW pixels and each Winograd conv
    # transforms its own input and output: a layout_transform to NHWC is read only by the
    # Winograd form's pad, and the module's answer is the same.
    graph = _between_winograd_convs(rng)
    x = rng.standard_normal((1, 16, 28, 28), dtype=np.float32)
    expected = evaluate(graph, [x])[0]
    with knobs.scope(layout="nchw"):
        after = layout_weights(graph, Target("cpu"))
        got = hexir.compile(graph).run([x])[0]
    producers = {op.result.name: op for op in after.ops}
    to_nhwc = [op for op in after.ops if op.kind == "layout_transform" and op.attr("dst") == "NHWC"]
    assert len(to_nhwc) == 2  # one per Winograd conv
    for op in after.ops:
        if any(producers.get(v.name) in to_nhwc for v in op.operands):
            assert op.kind == "pad"
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4)
