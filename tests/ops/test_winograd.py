"""Winograd convolution (hexir/ops/winograd.py, hexir/graph/layout.py): the transforms, the
rewrite of a conv2d into them, and the compiled form against a float64 direct convolution."""

from __future__ import annotations

import numpy as np
import pytest

import hexir
from hexir import knobs
from hexir.graph.evaluate import evaluate
from hexir.graph.fusion import fused_kernels, is_view, partition
from hexir.graph.layout import layout_weights, winograd_tile
from hexir.ops.builder import GraphBuilder
from hexir.ops.contraction import unblock_matmul_weight
from hexir.ops.winograd import matrices, winograd_weight
from hexir.runtime.default_schedule import default_schedule


def direct_conv(x: np.ndarray, w: np.ndarray, pad: int) -> np.ndarray:
    """A stride-1 conv in float64, the reference."""
    n, c, h, wd = x.shape
    k, _, r, s = w.shape
    xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    oh, ow = h + 2 * pad - r + 1, wd + 2 * pad - s + 1
    out = np.zeros((n, k, oh, ow))
    for i in range(r):
        for j in range(s):
            out += np.einsum("kc,nchw->nkhw", w[:, :, i, j], xp[:, :, i : i + oh, j : j + ow])
    return out


def conv_graph(rng, n, c, k, h, w, pad=1, residual=False):
    b = GraphBuilder("conv")
    x = b.input("x", (n, c, h, w))
    weight = (rng.standard_normal((k, c, 3, 3)) / np.sqrt(9 * c)).astype(np.float32)
    bias = rng.standard_normal(k).astype(np.float32)
    y = b.bias_add(b.conv2d(x, b.constant(weight, name="w"), padding=pad), b.constant(bias))
    if residual:
        y = b.add(y, b.input("r", y.type.shape))
    graph = b.build(b.relu(y))
    return graph, weight, bias


@pytest.mark.parametrize("m", [2, 4])
def test_the_matrices_compute_a_correlation(m, rng):
    # F(m, 3) in one dimension: Aᵀ [(G g) ⊙ (Bᵀ d)] = the m outputs of d correlated with g.
    at, g, bt = matrices(m)
    d, f = rng.standard_normal(m + 2), rng.standard_normal(3)
    want = np.array([d[i : i + 3] @ f for i in range(m)])
    np.testing.assert_allclose(at @ ((g @ f) * (bt @ d)), want, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize(
    ("tile", "n", "c", "k", "h", "w", "pad"),
    [
        ("4", 1, 16, 24, 12, 12, 1),  # tiles fill the output
        pytest.param("4", 2, 8, 16, 7, 9, 1, marks=pytest.mark.slow),  # cropped, two images
        ("2", 1, 12, 8, 9, 6, 1),
        ("2", 1, 8, 8, 10, 10, 0),  # no padding: the output 8 x 8
    ],
)
def test_a_conv_in_winograd_form_matches_the_direct_conv(tile, n, c, k, h, w, pad, rng):
    graph, weight, bias = conv_graph(rng, n, c, k, h, w, pad, residual=True)
    x = rng.standard_normal((n, c, h, w), dtype=np.float32)
    r = rng.standard_normal((n, k, h + 2 * pad - 2, w + 2 * pad - 2), dtype=np.float32)
    want = np.maximum(direct_conv(x, weight, pad) + bias[:, None, None] + r, 0)
    with knobs.scope(winograd=tile):
        laid_out = layout_weights(graph)
        kinds = [op.kind for op in laid_out.ops]
        assert "conv2d" not in kinds and {"winograd_input", "winograd_output"} <= set(kinds)
        (evaluated,) = evaluate(laid_out, [x, r])  # the rewrite's numpy semantics
        (got,) = hexir.compile(graph).run([x, r])
    scale = np.abs(want).max()
    # F(4, 3) scales rows by up to 8: its error, about 5e-6 of the largest output, is the bound.
    assert np.abs(evaluated - want).max() <= 1e-4 * scale
    assert np.abs(got - want).max() <= 1e-4 * scale


def test_two_winograd_convs_in_a_block_keep_their_activations_in_nhwc(rng):
    # A ResNet basic block: relu(conv2(relu(conv1(x) + b1)) + b2 + x). Each Winograd form
    # turns its input to NHWC and its result back to NCHW; between the convs, and for the
    # residual add, those layout transforms cancel: x is transformed once, the result once.
    b = GraphBuilder("block")
    x = b.input("x", (1, 16, 12, 12))

    def conv(v):
        w = (rng.standard_normal((16, 16, 3, 3)) / 12).astype(np.float32)
        return b.bias_add(b.conv2d(v, b.constant(w), padding=1), b.constant(rand16(rng)))

    graph = b.build(b.relu(b.add(conv(b.relu(conv(x))), x)))
    xv = rng.standard_normal((1, 16, 12, 12), dtype=np.float32)
    with knobs.scope(winograd="4"):
        laid_out = layout_weights(graph)
        (got,) = hexir.compile(graph).run([xv])
    transforms = [op for op in laid_out.ops if op.kind == "layout_transform"]
    assert [op.attr("dst") for op in transforms] == ["NHWC", "NCHW"]
    assert transforms[0].operands == (x,) and not any(op.kind == "transpose" for op in laid_out.ops)
    # conv1's bias and relu on its output transform's NHWC tiles ([N, TH, m, TW, m, K]),
    # computed where that kernel stores; conv2's epilogue stays with the transposing copy it
    # fuses into.
    assert [op.attr("axis") for op in laid_out.ops if op.kind == "bias_add"] == [5, 1]
    kernels = [[op.kind for op in g.ops] for g in partition(laid_out) if not is_view(g)]
    assert ["winograd_output", "bias_add", "relu"] in kernels
    assert ["layout_transform", "bias_add", "add", "relu"] in kernels
    (want,) = evaluate(graph, [xv])
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())


def rand16(rng) -> np.ndarray:
    return rng.standard_normal(16).astype(np.float32)


def test_winograd_is_chosen_by_the_number_of_tiles():
    b = GraphBuilder("convs")
    x56, x14, x7 = (b.input(f"x{h}", (1, 8, h, h)) for h in (56, 14, 7))
    w = b.constant(np.ones((8, 8, 3, 3), np.float32))
    convs = [b.conv2d(v, w, padding=1) for v in (x56, x14, x7)]
    strided = b.conv2d(x56, w, stride=2, padding=1)
    graph = b.build([*convs, strided])
    ops = {op.result.name: op for op in graph.ops}
    # 56x56: 196 tiles of 4 x 4; 14x14: 16 of them, 49 of 2 x 2; 7x7: 16 of 2 x 2: direct.
    assert [winograd_tile(ops[v.name]) for v in convs] == [4, 2, 0]
    assert winograd_tile(ops[strided.name]) == 0
    with knobs.scope(winograd="0"):
        assert winograd_tile(ops[convs[0].name]) == 0
    with knobs.scope(winograd="4"):
        assert winograd_tile(ops[convs[2].name]) == 4


def test_the_weight_is_transformed_once_at_compile_time(rng):
    graph, weight, _ = conv_graph(rng, 1, 8, 16, 8, 8)
    with knobs.scope(winograd="2"):
        laid_out = layout_weights(graph)
        module = hexir.compile(graph)
    (u,) = [data.array for name, data in laid_out.constants if name.startswith("w_wino2")]
    # [(m+2)^2, C, K] = [16, 8, 16] in the column panels of the batch_matmul: [K/16, 16, 8, 16]
    assert u.shape == (1, 16, 8, 16)
    np.testing.assert_array_equal(unblock_matmul_weight(u), winograd_weight(weight, 2))
    assert all(name != "w" for name, _ in laid_out.constants)  # the KCRS weight is gone
    assert any(np.array_equal(c, u) for c in module.constants.values())
    assert all(c.shape != weight.shape for c in module.constants.values())


def test_the_transforms_unroll_their_tile_positions(rng):
    # The position in the tile (u, v; i, j) is a case split: the default schedule unrolls
    # those loops around one vector of channels, so each case folds to constants in the C.
    graph, _, _ = conv_graph(rng, 1, 16, 24, 12, 12)  # the kernels of the first case above
    with knobs.scope(winograd="4"):
        _, funcs = fused_kernels(graph, "cpu")
    transforms = [f for _, f in funcs if "winograd" in f.name]
    assert len(transforms) == 2
    for func in transforms:
        kinds = [line.split()[-2] for line in str(default_schedule(func).func).splitlines()
                 if line.strip().startswith("for ")]  # fmt: skip
        assert kinds.count("unrolled") == 2 and kinds[-1] == "vectorized", kinds
        source = hexir.build(default_schedule(func).func, target="cpu").source
        assert "?" not in source.split("HX_EXPORT", 1)[1]  # no select left in the kernel
