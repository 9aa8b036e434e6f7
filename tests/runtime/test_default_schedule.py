"""Default schedules: what kernels run with when the database has nothing for them."""

from types import SimpleNamespace

import numpy as np
import pytest

import hexir
from hexir.codegen.c import generate_c
from hexir.codegen.gpu_verify import verify_gpu
from hexir.frontend import zoo
from hexir.graph.fusion import partition
from hexir.runtime.default_schedule import default_schedule
from hexir.runtime.executor import simplify
from hexir.runtime.target import Target
from hexir.runtime.tiling import register_tile
from hexir.schedule.common import all_blocks
from hexir.schedule.compact import compact_buffers
from hexir.search.sketch_cpu import GEMV_REDUCE_STEPS


def check_on_cpu(func: hexir.PrimFunc, scheduled: hexir.PrimFunc, rng: np.random.Generator) -> None:
    """The scheduled func, run on the CPU, computes numpy's answer for the unscheduled one."""
    inputs = [rng.standard_normal(b.shape).astype(b.dtype) for b in func.inputs]
    outputs = [np.full(b.shape, np.nan, b.dtype) for b in func.outputs]
    hexir.build(scheduled, "cpu")(*inputs, *outputs)
    for out, ref in zip(outputs, hexir.reference(func, inputs), strict=True):
        np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-5)


def _loops(func: hexir.PrimFunc):
    from hexir.schedule.common import all_loops

    return all_loops(func.body)


def test_cpu_matmul_gets_the_hand_schedule_shape_with_no_draw(rng):
    """Column panels and row tiles in parallel (enough jobs for the cores), B packed per
    job, the register tile of `register_tile` (rows unrolled, columns vectorized: 6 rows x 2
    vectors with AVX2's 16 registers, 8 x 3 with AVX-512's 32), the whole reduction inside;
    the same schedule every time."""
    func = hexir.workload("matmul", M=32, N=48, K=16)
    target = Target("cpu")
    cols, rows = register_tile(48, 32, target)
    sch = default_schedule(func, "cpu")
    assert str(sch.trace) == str(default_schedule(func, "cpu").trace)
    text = str(sch.trace)
    assert f"decision=[{48 // cols}, 1, 1, {cols}]" in text
    if 32 % rows:  # ragged: the row tile split off first, guarded
        assert f"factors=[None, {rows}]" in text
    else:
        assert f"decision=[{32 // rows}, 1, 1, {rows}]" in text
    assert 'cache_read(block=b0, read_buffer_index=1, storage_scope="global")' in text
    assert "sample_categorical" not in text  # no unroll draw
    compact = compact_buffers(sch.func)
    assert f"buffer<{rows}x{cols}xf32, local>" in str(compact)
    kinds = [lp.kind for lp in _loops(sch.func)]
    assert "parallel" in kinds and "vectorized" in kinds and "unrolled" in kinds
    check_on_cpu(func, sch.func, rng)


@pytest.mark.parametrize(
    "lanes, registers, cols, rows, expect",
    [
        (8, 16, 1024, 1024, (16, 6)),  # AVX2: 12 accumulators, the last row tile guarded
        (8, 16, 768, 128, (16, 6)),
        (8, 16, 512, 7, (16, 7)),  # 7 rows exactly beat 6 + a guarded 1: 7 x 2, every register
        (8, 16, 2048, 14, (16, 7)),
        (8, 16, 1024, 56, (16, 6)),  # a guarded tail of 2 rows in ten tiles: 6 x 2
        (8, 16, 96, 1021, (16, 6)),  # 7 does not divide: 6 x 2 and a guarded tail
        (8, 16, 1000, 1, (8, 1)),  # 1000 = 125 x 8: one vector panels
        (16, 32, 1024, 1024, (64, 6)),  # AVX-512: 24 accumulators
        (16, 32, 48, 32, (48, 8)),
        (16, 32, 1024, 14, (64, 7)),  # 7 x 4 on 14 rows, not 5 x 4 and a guarded row
        (16, 32, 1024, 56, (64, 6)),
        (8, 16, 1024, 3, (16, 3)),  # AVX2 keeps 4-vector panels within its registers
    ],
)
def test_the_register_tile_fits_the_vector_registers(lanes, registers, cols, rows, expect):
    target = SimpleNamespace(vector_width=lanes, vector_registers=registers)
    panel, tile_rows = register_tile(cols, rows, target)  # type: ignore[arg-type]
    assert (panel, tile_rows) == expect
    vectors = panel // lanes
    assert tile_rows * vectors + 2 <= registers  # accumulators, an operand vector, a broadcast


@pytest.mark.parametrize(
    "lanes, registers, cols, rows, expect",
    [
        (8, 16, 256, 14, (8, 7)),  # AVX2 conv 256x14x14: 7 rows x 1 vector, not 2 x 4
        (8, 16, 64, 56, (8, 8)),
        (8, 16, 512, 7, (8, 7)),
        (16, 32, 64, 56, (32, 8)),  # AVX-512: 8 rows, then as many vectors as still fit
    ],
)
def test_a_conv_register_tile_takes_the_most_rows_first(lanes, registers, cols, rows, expect):
    # Without ragged rows (a conv's several reduction loops), the packed weight panel streams
    # once per tile: the bytes per multiply-add fall with the rows.
    target = SimpleNamespace(vector_width=lanes, vector_registers=registers)
    assert register_tile(cols, rows, target, ragged=False) == expect  # type: ignore[arg-type]


@pytest.mark.parametrize("M", [126, 128])  # 6-row tiles: exact, and ragged (the last guarded)
def test_the_epilogue_folds_into_the_write_back_even_under_ragged_tiles(M, rng):
    # bias and relu are computed where the accumulator tile is stored: no block of their own
    # (a separate pass over the whole output), whether or not the row tiles are ragged.
    func = hexir.workload("dense", M=M, N=64, K=32, bias=True, activation="relu")
    sch = default_schedule(func, "cpu")
    names = {b.name for b in all_blocks(sch.func.body)}
    assert not names & {"bias_add", "relu"}, names
    assert sum(lp.kind == "parallel" for lp in _loops(sch.func)) == 1
    check_on_cpu(func, sch.func, rng)


@pytest.mark.parametrize("M, N, K", [(7, 16, 5), (13, 40, 9), (128, 24, 3)])
def test_ragged_register_rows_compute_the_same_values(M, N, K, rng):
    # Row extents the register tile does not divide: the last tile is guarded.
    func = hexir.workload("matmul", M=M, N=N, K=K)
    check_on_cpu(func, default_schedule(func, "cpu").func, rng)


@pytest.mark.parametrize("N, K", [(768, 96), (200, 30), (1000, 16)])
def test_cpu_matrix_vector_products_give_each_core_one_stretch_of_every_weight_row(N, K, rng):
    # The fewest jobs the cores share evenly (their columns inside the reduction: one job per
    # core where the panels allow; 1000 columns are 125 panels of 8, which 5 jobs would split
    # 3 against 2 on 2 cores), and GEMV_REDUCE_STEPS weight rows unrolled per pass over the
    # accumulator (K = 30: the largest divisor up to it, 3). The jobs split whole panels: the
    # register tile's, or half a vector where no multiple of the lanes divides the columns
    # (AVX-512's 16 lanes divide neither 200 nor 1000).
    func = hexir.workload("matmul", M=1, N=N, K=K)
    target = Target("cpu")
    sch = default_schedule(func, target)
    panel, _ = register_tile(N, 1, target)
    if N % panel:
        panel = target.vector_width // 2
    assert N % panel == 0
    cores, panels = target.num_cores, N // panel
    even = [
        d for d in range(cores, panels + 1) if panels % d == 0 and -(-d // cores) * cores / d <= 1.1
    ]
    jobs = even[0]
    text = str(sch.trace)
    assert f"decision=[{jobs}, 1, {N // panel // jobs}, {panel}]" in text
    steps = max(d for d in range(1, GEMV_REDUCE_STEPS + 1) if K % d == 0)
    assert f"decision=[{K // steps}, {steps}]" in text
    parallel = [lp for lp in _loops(sch.func) if lp.kind == "parallel"]
    assert [lp.extent for lp in parallel] == [jobs]
    assert any(lp.kind == "unrolled" and lp.extent == steps for lp in _loops(sch.func))
    check_on_cpu(func, sch.func, rng)


@pytest.mark.parametrize("rows", [1, 3])
def test_a_decode_steps_scores_are_dot_products_of_rows_read_in_place(rows, rng):
    # q·kᵀ against a key cache read untransposed ([heads, keys, head_dim]): each score is the
    # dot product of two contiguous rows, in vector lanes along head_dim, the scores of
    # every head in parallel, the scale computed where each is.
    b = hexir.GraphBuilder("g")
    q, k = b.input("q", (12, rows, 64)), b.input("k", (12, 1024, 64))
    scale = b.constant(np.array(0.125, np.float32))
    (group,) = partition(b.build(b.mul(b.batch_matmul(q, k, transpose_b=True), scale)))
    func = hexir.lower(group.graph())
    sch = default_schedule(func, "cpu")
    roots = _root_loops(sch.func)
    assert [lp.kind for lp in roots] == ["parallel"]
    assert {b.name for b in all_blocks(func.body)} <= {b.name for b in all_blocks(roots[0].body)}
    assert "rfactor" in str(sch.trace)  # the partial sums in lanes
    assert "vectorized" in [lp.kind for lp in _loops(sch.func)]
    check_on_cpu(func, sch.func, rng)


def test_a_transposed_operand_with_many_rows_is_tiled_and_packed(rng):
    # 128 queries reuse every key: the tile sketch, its panel of kᵀ packed per job.
    b = hexir.GraphBuilder("g")
    q, k = b.input("q", (2, 128, 64)), b.input("k", (2, 96, 64))
    func = hexir.lower(b.build(b.batch_matmul(q, k, transpose_b=True)))
    sch = default_schedule(func, "cpu")
    assert "rfactor" not in str(sch.trace) and "cache_read" in str(sch.trace)
    check_on_cpu(func, sch.func, rng)


@pytest.mark.parametrize("N", [985, 197])
def test_ragged_matrix_vector_products_run_one_stretch_per_core(N, rng):
    # No part of a vector divides 985 (or GPT-2's 50257) columns: each core takes the same
    # number of panels, the last job's last one partly past the edge. The C backend keeps the
    # loop over the jobs parallel and gives each job its own copy, in which the guards bound
    # the job's own panel loop: the full panels run unguarded, the partial one as vectors up to
    # the edge, then scalars.
    func = hexir.workload("matmul", M=1, N=N, K=64)
    target = Target("cpu")
    sch = default_schedule(func, target)
    parallel = [lp for lp in _loops(sch.func) if lp.kind == "parallel"]
    assert [lp.extent for lp in parallel] == [target.num_cores]
    source = hexir.build(sch.func).source
    assert "omp parallel" in source
    assert ("_fused == 0) {" in source) == (target.num_cores > 1)  # a copy per job
    guards = [line for line in source.splitlines() if "if (" in line]
    assert len(guards) == (target.num_cores > 1)  # no guard left but the job's
    check_on_cpu(func, sch.func, rng)


@pytest.mark.parametrize(
    "lanes, registers, N, expect",
    [
        (8, 16, 1000, [25, 1, 5, 8]),  # AVX2: 125 one-vector panels
        (16, 32, 1000, [25, 1, 5, 8]),  # AVX-512: no multiple of 16 divides 1000: half vectors
        (16, 32, 768, [2, 1, 6, 64]),
        (8, 16, 1012, [11, 1, 23, 4]),  # half of AVX2's vector does not divide it either
        (16, 32, 197, [2, 1, 4, 32]),  # no part of a vector divides: one stretch per core
    ],
)
def test_matrix_vector_jobs_split_panels_that_divide_the_columns(lanes, registers, N, expect):
    # A matrix-vector product's panels are its only parallel work: it takes the widest part
    # of a vector that divides its columns, on either width, so that the jobs split whole
    # panels; where none does, one stretch of panels per core, the last one ragged.
    from hexir.search.sketch_cpu import default_tiles

    target = SimpleNamespace(vector_width=lanes, vector_registers=registers, num_cores=2)
    assert default_tiles([1, N], target)[-1] == expect  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "lanes, N, block, expect",
    [
        (16, 768, 64, [2, 6, 1, 64]),  # gpt2's c_proj: 12 panels of 4 AVX-512 vectors
        (16, 2304, 64, [2, 18, 1, 64]),
        (8, 3072, 32, [2, 48, 1, 32]),  # AVX2: 4 vectors of 8
        (16, 96, 32, [3, 1, 1, 32]),  # 3 panels: the only split, 3 jobs
    ],
)
def test_a_matrix_vector_product_of_a_blocked_weight_streams_whole_panels(lanes, N, block, expect):
    # A weight laid out in panels ([N/b, K, b], layout.py's matrix_vector_block): each job
    # takes a stretch of whole panels, serially, each panel's reduction inside it (the panel
    # loop in the cache level), so that a core streams one contiguous stretch of the weight.
    from hexir.search.sketch_cpu import default_tiles

    target = SimpleNamespace(vector_width=lanes, vector_registers=32, num_cores=2)
    assert default_tiles([1, N], target, block=block)[-1] == expect  # type: ignore[arg-type]


def test_a_1x1_conv_takes_the_matmul_register_tile_with_ragged_rows(rng):
    # One reduction loop of more than one step (the channels): the tile of a matmul, rows
    # ragged over the 9 output columns (5 + 4 rows of 2 vectors on AVX2 and AVX-512, the
    # last tile guarded), not a window's 3 rows, which divide them.
    func = hexir.workload("conv2d", N=1, C=16, H=9, W=9, K=32, R=1, S=1)
    target = Target("cpu")
    panel, rows = register_tile(32, 9, target)
    sch = default_schedule(func, target)
    text = str(sch.trace)
    assert 9 % rows and f"factors=[None, {rows}]" in text
    assert f"decision=[{32 // panel}, 1, 1, {panel}]" in text
    check_on_cpu(func, sch.func, rng)
    three = hexir.workload("conv2d", N=1, C=16, H=9, W=9, K=32, R=3, S=3, padding=1)
    assert register_tile(32, 9, target, ragged=False)[1] == 3
    assert "factors=[None," not in str(default_schedule(three, target).trace)  # rows divide


@pytest.mark.parametrize("N", [37, 197])
def test_columns_no_panel_divides_take_ragged_panels_not_one_lane(N, rng):
    # ViT's 12x197x197 attention scores: no multiple of the lanes divides 197. The columns
    # take two-vector panels, the last guarded, run serially in each job (the batches and
    # rows in parallel), so the C backend splits the guarded panel off: no 1-lane panel.
    func = hexir.workload("batch_matmul", B=3, M=13, N=N, K=8)
    target = Target("cpu")
    sch = default_schedule(func, target)
    lanes = target.vector_width
    assert f"factors=[None, {2 * lanes}]" in str(sch.trace)
    parallel = [lp for lp in _loops(sch.func) if lp.kind == "parallel"]
    assert len(parallel) == 1 and parallel[0].extent % 3 == 0  # batches (and rows), no panels
    check_on_cpu(func, sch.func, rng)


def test_row_reductions_the_lanes_do_not_divide_still_reduce_in_lanes(rng):
    func = hexir.workload("softmax", shape=(2, 5, 197), axis=2)
    sch = default_schedule(func, "cpu")
    assert "rfactor" in str(sch.trace)
    check_on_cpu(func, sch.func, rng)


def test_cpu_transposes_run_in_unrolled_8x8_tiles_in_parallel_over_the_outer_loops(rng):
    # A transpose reads across its vector loop: it does not vectorize. It runs in 8 x 8 tiles
    # over the loop it writes along and the one it reads along, both unrolled (straight-line
    # code GCC transposes in registers); only the outer loops that give the cores enough jobs
    # are fused and run in parallel, the inner ones nested, free of the fused index's
    # divisions.
    func = hexir.workload("transpose", shape=(12, 128, 64), perm=(0, 2, 1))
    sch = default_schedule(func, "cpu")
    kinds = [(lp.kind, lp.extent) for lp in _loops(sch.func)]
    assert kinds == [("parallel", 12), ("serial", 8), ("serial", 16), ("unrolled", 8),
                     ("unrolled", 8)]  # fmt: skip
    check_on_cpu(func, sch.func, rng)


@pytest.mark.parametrize(
    "shape, perm, tiled",
    [
        ((128, 12, 64), (1, 2, 0), (8, 8)),
        ((12, 197, 64), (0, 2, 1), (8, 8)),  # 197 (prime): 24 tiles and a guarded one
        ((2, 11, 13), (0, 2, 1), None),  # short and without divisors: the plain loops
        ((128, 12, 64), (1, 0, 2), None),
        ((1, 14, 14, 512), (0, 3, 1, 2), (8, 7)),  # ResNet-50's NHWC -> NCHW at 14 x 14
        ((1, 7, 7, 2048), (0, 3, 1, 2), (8, 7)),
    ],  # fmt: skip
)
def test_cpu_transposes_tile_by_divisors_of_both_loops_up_to_8(shape, perm, tiled, rng):
    # A transpose that keeps the last axis vectorizes instead; 7, 14 and 28 tile by 7; 197
    # (prime) by 8, its last tile guarded.
    func = hexir.workload("transpose", shape=shape, perm=perm)
    sch = default_schedule(func, "cpu")
    unrolled = tuple(lp.extent for lp in _loops(sch.func) if lp.kind == "unrolled")
    assert unrolled == (tiled or ())
    check_on_cpu(func, sch.func, rng)


@pytest.mark.parametrize(
    "kind, attrs",
    [("max_pool2d", {"kernel": 3, "stride": 2, "padding": 1}),
     ("avg_pool2d", {"kernel": 3, "stride": 1, "padding": 1}), ("global_avg_pool2d", {})],
)  # fmt: skip
def test_cpu_nhwc_pools_accumulate_each_pixels_channels_in_registers(kind, attrs, rng):
    # Along the channels (unit stride in and out): a vector of them per output pixel,
    # accumulated in registers over the unrolled window, the rows in parallel and each row's
    # pixels a serial loop (no fused index to divide at every window element); a global
    # pool of 7x7x64 is too little work to share, and runs on one core.
    shape = (1, 7, 7, 64) if kind == "global_avg_pool2d" else (1, 40, 36, 32)
    func = hexir.workload(kind, shape=shape, layout="NHWC", **attrs)
    sch = default_schedule(func, "cpu")
    text = str(sch.func)
    assert "_local" in text and "vectorized" in text
    kinds = [lp.kind for lp in _loops(sch.func)]
    assert kinds[0] == "parallel" if kind != "global_avg_pool2d" else "parallel" not in kinds
    check_on_cpu(func, sch.func, rng)


def test_cpu_padded_conv2d_vectorizes_output_channels_with_a_channels_last_weight(rng):
    # The input is read through windows along rows and columns: the vector loop runs over
    # output channels, W packed channels-last per parallel job. The zero border is a stage of
    # its own (loops i0..i3), so the contraction (iter vars vi4..vi7) reads it unguarded.
    func = hexir.workload("conv2d", N=1, C=4, H=8, W=8, K=16, R=3, S=3, padding=1)
    sch = default_schedule(func, "cpu")
    text = str(sch.func)
    assert "W_global[vk0, vk1, vk2, vi5]" in text and "Y_local[vi4, vi6, vi7, vi5]" in text
    assert "block @conv2d_pad" in text
    conv = next(b for b in all_blocks(sch.func.body) if b.name == "conv2d")
    assert "select" not in str(conv.body)
    kinds = [lp.kind for lp in _loops(sch.func)]
    assert "parallel" in kinds and "vectorized" in kinds
    check_on_cpu(func, sch.func, rng)


@pytest.mark.parametrize(
    "shape,stride,padding,dilation",
    [
        ((16, 19, 19), 1, 1, 1),
        ((16, 19, 21), 2, 1, 1),  # odd widths: a ragged last phase column
        ((8, 16, 16), 2, 0, 1),  # unpadded: the copy only splits the phases
        ((8, 17, 17), 2, 2, 2),  # dilated: every window column in phase 0
        ((24, 7, 7), 1, 1, 1),  # rows narrower than a vector: the window unrolled
    ],
)
def test_cpu_depthwise_conv2d_vectorizes_output_columns_copying_its_planes_per_job(
    shape, stride, padding, dilation, rng
):
    # Each channel is a plane of its own in NCHW: the vector loop runs along the output's
    # columns, reading the zero-bordered copy with unit stride; with a column stride the copy
    # splits the columns by phase ([.., q, j] holds column j*2 + q). The copy is made per
    # parallel job (its channels), and its border guards partition away in the C.
    c, h, w = shape
    func = hexir.workload("conv2d", N=1, C=c, H=h, W=w, K=c, R=3, S=3, stride=stride,
                          padding=padding, dilation=dilation, groups=c)  # fmt: skip
    copy_shape = "x".join(map(str, (1, c, h + 2 * padding)))
    split = f"x2x{-(-(w + 2 * padding) // 2)}" if stride > 1 else f"x{w + 2 * padding}"
    assert f"alloc %conv2d_pad: buffer<{copy_shape}{split}xf32>" in str(func)
    sch = default_schedule(func, "cpu")
    loops = list(_loops(sch.func))
    assert loops[0].kind == "parallel" and sum(lp.kind == "parallel" for lp in loops) == 1
    assert {b.name for b in all_blocks(loops[0].body)} >= {"conv2d_pad", "conv2d"}
    conv = next(b for b in all_blocks(sch.func.body) if b.name == "conv2d")
    vector = {lp.var for lp in loops if lp.kind == "vectorized"}
    (_, _, _, column, *_) = conv.iter_vars
    assert vector & hexir.ir.visit.free_vars(column.binding)  # the output's columns
    source = generate_c(sch.func)
    copy = source[source.index("block conv2d_pad") : source.index("block conv2d_init")]
    assert "?" not in copy  # the copy's border guards partitioned away
    check_on_cpu(func, sch.func, rng)


@pytest.mark.parametrize("stride", [1, 2])
def test_a_strided_nhwc_depthwise_conv_pads_each_jobs_rows_in_the_job(stride, rng):
    # In NHWC the jobs split the output rows, whose windows read overlapping input rows. With
    # a stride of 2 a job's rows need their input rows and one in three more: each job pads
    # its own rows, in cache, inside the parallel loop (MobileNetV2's 112x112x96 -> 56x56:
    # 0.63 -> 0.21-0.28 ms). With a stride of 1 (a halo of 2 rows per job, on 14x14 images
    # one job's rows or two) the border stays a pass of its own before the jobs.
    from hexir.graph.fusion import fused_kernels
    from hexir.ops.builder import GraphBuilder

    b = GraphBuilder("dw")
    weight = rng.standard_normal((96, 1, 3, 3)).astype(np.float32)
    image = b.input("x", (1, 28, 28, 96))
    conv = b.op("conv2d", image, b.constant(weight), stride=stride, padding=1, groups=96,
                layout="NHWC")  # fmt: skip
    (func,) = [f for _, f in fused_kernels(b.build(conv))[1]]
    sch = default_schedule(func, "cpu")
    loops = list(_loops(sch.func))
    parallel = [lp for lp in loops if lp.kind == "parallel"]
    inside = {b.name for lp in parallel for b in all_blocks(lp.body)}
    conv_loop = next(lp for lp in parallel if "conv2d" in {b.name for b in all_blocks(lp.body)})
    pads_in_the_job = "conv2d_pad" in {b.name for b in all_blocks(conv_loop.body)}
    assert "conv2d_pad" in inside and pads_in_the_job == (stride == 2)
    x = rng.standard_normal((1, 28, 28, 96)).astype(np.float32)
    outputs = [np.full(p.shape, np.nan, p.dtype) for p in func.outputs]
    hexir.build(sch.func, "cpu")(x, weight, *outputs)
    (want,) = hexir.reference(func, [x, weight])
    np.testing.assert_allclose(outputs[0], want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("size, blocked", [(7, True), (14, False)])
def test_cpu_1x1_convs_of_small_images_reduce_over_blocks_of_input_channels(size, blocked, rng):
    # On 7x7 the weight panel would stream once per row tile: blocks of channels instead.
    from hexir.search.sketch_cpu import CONV_CHANNEL_BLOCK

    func = hexir.workload("conv2d", N=1, C=256, H=size, W=size, K=64, R=1, S=1)
    sch = default_schedule(func, "cpu")
    blocks = f"decision=[{256 // CONV_CHANNEL_BLOCK}, {CONV_CHANNEL_BLOCK}]"
    assert (blocks in str(sch.trace)) == blocked
    x, w = (rng.standard_normal(b.shape).astype(b.dtype) for b in func.inputs)
    (out,) = (np.full(b.shape, np.nan, b.dtype) for b in func.outputs)
    hexir.build(sch.func, "cpu")(x, w, out)
    (ref,) = hexir.reference(func, [x, w])
    # Sums of 256 products of unit normals: float32's error grows with their size.
    np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-4 * np.abs(ref).max())


@pytest.mark.parametrize("channels, stride", [(128, 1), (192, 2), (64, 1)])
def test_cpu_conv2d_reduces_over_blocks_of_input_channels_with_its_rows_inside(
    channels, stride, rng
):
    # More input channels than a block: the reduction runs over blocks of CONV_CHANNEL_BLOCK
    # (the window inside each), and every output row of the job between the blocks and the
    # window, its accumulators kept across blocks. 64 channels: one block, the plain order.
    from hexir.search.sketch_cpu import CONV_CHANNEL_BLOCK, DEFAULT_JOBS_PER_CORE

    # Output rows enough to leave every job 3: the job loop splits them in the fewest parts
    # that, times the panels of the 64 output channels, give each core DEFAULT_JOBS_PER_CORE
    # jobs (on 2 cores: AVX2's 4 panels of 16, 6 rows in 2; AVX-512's one panel of 64, 24
    # rows in 8).
    target = Target("cpu")
    panel, _ = register_tile(64, 9, target, ragged=False)
    want = DEFAULT_JOBS_PER_CORE * target.num_cores
    rows = 3 * max(1, -(-want // (64 // panel)))
    func = hexir.workload("conv2d", N=1, C=channels, H=rows * stride, W=9 * stride, K=64, R=3,
                          S=3, stride=stride, padding=1)  # fmt: skip
    assert func.outputs[0].shape == (1, 64, rows, 9)
    sch = default_schedule(func, target)
    text = str(sch.trace)
    blocks = channels // CONV_CHANNEL_BLOCK
    if channels > CONV_CHANNEL_BLOCK:
        assert f"decision=[{blocks}, {CONV_CHANNEL_BLOCK}]" in text
        from hexir.ir.visit import free_vars
        from hexir.search.analysis import loops_around

        conv = next(b for b in all_blocks(sch.func.body) if b.name == "conv2d")
        around = [lp.var for lp in loops_around(sch.func, conv)]
        channel, row = conv.iter_vars[4].binding, conv.iter_vars[2].binding
        c_loops = [around.index(v) for v in free_vars(channel)]
        row_loops = [around.index(v) for v in free_vars(row) if v in around]
        assert min(c_loops) < max(row_loops) < max(c_loops)  # rows between blocks and window
    else:
        assert f"decision=[{channels}, 1]" in text
    x, w = (rng.standard_normal(b.shape).astype(b.dtype) for b in func.inputs)
    (out,) = (np.full(b.shape, np.nan, b.dtype) for b in func.outputs)
    hexir.build(sch.func, "cpu")(x, w, out)
    (ref,) = hexir.reference(func, [x, w])
    # Sums of channels x 9 products of unit normals: float32's error grows with their size.
    np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-6 * channels * 9)


@pytest.mark.parametrize("stride", [(2, 2), (3, 1)])
def test_cpu_strided_1x1_conv2d_gathers_its_pixels_then_runs_unstrided(stride, rng):
    # The pixels a strided 1x1 conv reads are copied into a compact image once (a stage the
    # default keeps), so each pass of the contraction reads only them.
    func = hexir.workload("conv2d", N=1, C=8, H=15, W=14, K=32, R=1, S=1, stride=stride)
    oh, ow = -(-15 // stride[0]), -(-14 // stride[1])
    assert f"alloc %conv2d_stride: buffer<1x8x{oh}x{ow}xf32>" in str(func)
    sch = default_schedule(func, "cpu")
    assert {"conv2d_stride", "conv2d"} <= {b.name for b in all_blocks(sch.func.body)}
    conv = next(b for b in all_blocks(sch.func.body) if b.name == "conv2d")
    assert conv.reads[0].buffer.name == "conv2d_stride"
    check_on_cpu(func, sch.func, rng)


@pytest.mark.parametrize("op", ["max_pool2d", "avg_pool2d"])
def test_cpu_strided_pools_run_per_output_row_with_the_window_unrolled(op, rng):
    # A 3x3 stride-2 window does not vectorize along the row: the outer loops run in
    # parallel, each output accumulates in a register over its unrolled window.
    func = hexir.workload(op, shape=(1, 32, 31, 31), kernel=(3, 3), stride=(2, 2), padding=(1, 1))
    sch = default_schedule(func, "cpu")
    text = str(sch.trace)
    assert 'storage_scope="local"' in text and "decompose_reduction" in text
    assert text.count("sch.unroll(") == 2 and "sch.parallel(" in text
    kinds = {lp.var.name: lp.kind for lp in _loops(sch.func)}
    assert "parallel" in kinds.values() and kinds["i3"] == "serial"  # the output row
    check_on_cpu(func, sch.func, rng)


@pytest.mark.parametrize(
    "func",
    [
        lambda: hexir.workload("softmax", shape=(3, 64, 64), axis=2),
        lambda: hexir.workload("layer_norm", M=256, N=48),
        lambda: hexir.workload("softmax", M=1024, N=12),  # 12: too short for the lanes
        lambda: hexir.workload("reduce_sum", M=256, N=197),  # one stage; a ragged last step
        lambda: hexir.workload("reduce_max", shape=(4, 64, 160), axes=(2,)),
    ],
)
def test_cpu_row_chains_run_every_stage_per_row_in_one_parallel_loop(func, rng):
    func = func()
    sch = default_schedule(func, "cpu")
    roots = _root_loops(sch.func)
    assert [lp.kind for lp in roots] == ["parallel"]  # one parallel region, the rows
    names = {b.name for b in all_blocks(func.body)}
    inside = {b.name for b in all_blocks(roots[0].body)}
    assert names <= inside  # every stage (and its partial sums) is computed per row
    lanes = Target("cpu").vector_width
    if func.inputs[0].shape[-1] >= 2 * lanes:
        assert "rfactor" in str(sch.trace)
    check_on_cpu(func, sch.func, rng)


@pytest.mark.parametrize("op", ["layer_norm", "reduce_sum"])
def test_cpu_long_row_reductions_keep_chains_of_partial_sums_in_flight(op, rng):
    # A row of at least 4 x CHAINS vectors keeps CHAINS vectors of partials (one chain the
    # length of the row waits on each addition's latency), combined by a vectorized
    # write-back loop (vector by vector, then across the lanes); a shorter row keeps one.
    from hexir.ir.tir import Allocate, For
    from hexir.ir.visit import walk
    from hexir.runtime.default_schedule import CHAINS

    lanes = Target("cpu").vector_width
    for n, chains in ((4 * CHAINS * lanes + 3 * lanes, CHAINS), (4 * CHAINS * lanes - lanes, 1)):
        func = hexir.workload(op, M=8, N=n)
        sch = default_schedule(func, "cpu")
        partials = sorted(
            node.buffer.shape[-1] for node in walk(sch.func.body)
            if isinstance(node, Allocate) and node.buffer.name.endswith("_rf")
        )  # fmt: skip
        assert partials == [chains * lanes] * (2 if op == "layer_norm" else 1)
        write_backs = [
            node for node in walk(sch.func.body)
            if isinstance(node, For) and node.var.name.endswith("_wb")
        ]  # fmt: skip
        assert write_backs and all(lp.kind == "vectorized" for lp in write_backs)
        assert all(lp.extent == chains * lanes for lp in write_backs)
        check_on_cpu(func, sch.func, rng)


def _root_loops(func: hexir.PrimFunc):
    from hexir.ir.tir import For
    from hexir.ir.visit import walk

    top = [n for n in walk(func.body) if isinstance(n, For)]
    return [lp for lp in top if not any(lp is not o and lp in list(walk(o.body)) for o in top)]


def test_cpu_defaults_of_elementwise_and_row_reductions_stay_simple():
    func = hexir.workload("softmax", M=256, N=40)
    text = str(default_schedule(func, "cpu").trace)
    assert "cache_read" not in text and "sch.parallel" in text


@pytest.mark.parametrize(
    "func",
    [
        lambda: hexir.workload("layer_norm", M=1, N=768),  # gpt2-decode's
        lambda: hexir.workload("softmax", shape=(12, 1, 128), axis=2),
        lambda: hexir.workload("relu", shape=(1, 3072)),
        lambda: hexir.workload(
            "max_pool2d", shape=(1, 8, 15, 15), kernel=(3, 3), stride=(2, 2), padding=(1, 1)
        ),
    ],
)
def test_cpu_kernels_of_little_work_run_on_one_core(func, rng):
    # Starting the threads of a parallel loop would cost more than the work.
    func = func()
    sch = default_schedule(func, "cpu")
    assert not any(lp.kind == "parallel" for lp in _loops(sch.func))
    assert "omp parallel" not in hexir.build(sch.func).source
    check_on_cpu(func, sch.func, rng)


def test_a_replayed_default_trace_gives_the_same_kernel():
    func = hexir.workload("softmax", M=16, N=40)
    sch = default_schedule(func, "cpu")
    assert hexir.Trace.from_json(sch.trace.to_json()).apply(func).func == sch.func


@pytest.mark.parametrize("name", ["bert", pytest.param("resnet", marks=pytest.mark.slow)])
def test_gpu_defaults_bind_threads_fit_the_gpu_and_compute_the_same_values(name, rng):
    graph = {
        "bert": lambda: zoo.bert(seq=8, hidden=32, heads=2, ffn=64),
        "resnet": lambda: zoo.resnet(18, image=16, width=4, classes=10),
    }[name]()
    target = hexir.Target("cuda -arch=sm_90")
    # In graph order (a set's order would change with the hash seed, and so the draws).
    funcs = dict.fromkeys(hexir.lower(group.graph()) for group in partition(simplify(graph)))
    for func in funcs:
        sch = default_schedule(func, target)
        launch = verify_gpu(compact_buffers(sch.func), target)
        assert launch.threads > 1, f"{func.name} runs on one thread"
        check_on_cpu(func, sch.func, rng)


def test_a_gpu_softmax_over_a_3d_tensor_runs_a_thread_block_per_row(rng):
    # Its max over the last axis reduces one operand: a row reduction, not a contraction
    # (taken for one, it ran a thread per row on 12 blocks: 45 us on an H100 for BERT's
    # 12x128x128 scores, 2.5 us as a block per row).
    b = hexir.GraphBuilder("g")
    (group,) = partition(b.build(b.softmax(b.input("x", (12, 16, 64)), axis=2)))
    func = hexir.lower(group.graph())
    target = hexir.Target("cuda -arch=sm_90")
    launch = verify_gpu(compact_buffers(default_schedule(func, target).func), target)
    assert launch.grid == (12 * 16, 1, 1) and launch.block == (64, 1, 1)
    sch = default_schedule(func, target)
    check_on_cpu(func, sch.func, rng)


@pytest.mark.parametrize(
    "weight, N, K, grid, block",
    [
        ("KN", 768, 768, 96, (8, 32, 1)),  # GPT-2 decode: 8 columns, 32 lanes of 24 rows each
        ("KN", 3072, 768, 384, (8, 32, 1)),
        ("KN", 768, 3072, 96, (8, 32, 1)),
        ("NK", 768, 768, 96, (32, 8, 1)),  # a dense's W[n][k]: lanes along k
        ("KN", 600, 96, 75, (8, 8, 1)),  # a shallow depth: 8 lanes of 12 rows
    ],
)
def test_a_gpu_matrix_vector_product_shares_each_columns_depth_among_threads(
    weight, N, K, grid, block, rng
):
    # With its epilogue (bias, GELU) in the write-back; a warp reads whole sectors of W.
    b = hexir.GraphBuilder("g")
    x = b.input("x", (1, K))
    w = b.input("w", (K, N) if weight == "KN" else (N, K))
    y = b.matmul(x, w) if weight == "KN" else b.dense(x, w)
    (group,) = partition(b.build(b.gelu(b.bias_add(y, b.input("bias", (N,))))))
    func = hexir.lower(group.graph())
    target = hexir.Target("cuda -arch=sm_90")
    sch = default_schedule(func, target)
    launch = verify_gpu(compact_buffers(sch.func), target)
    assert (launch.grid, launch.block) == ((grid, 1, 1), block)
    kernel = hexir.build(sch.func, target)
    assert kernel.resources["spill_bytes"] == 0 and kernel.resources["shared_bytes"] > 0
    check_on_cpu(func, sch.func, rng)


@pytest.mark.parametrize("op", ["matmul", "dense"])
def test_the_gpu_default_of_a_contraction_is_one_tile_step_from_its_neighbours(op, rng):
    # Its tiles are drawn decisions, so the search's climb (mutators.neighbours) moves them
    # from the default: each neighbour a valid kernel computing the same values, the thread
    # splits of its fetches and write-back moving with the tile.
    from hexir.search.evolutionary import replay
    from hexir.search.mutators import neighbours, sites

    func = hexir.workload(op, M=64, N=128, K=64)
    target = hexir.Target("cuda -arch=sm_90")
    sch = default_schedule(func, target)
    assert len(sites(sch.trace).tiles) == 3  # rows (block, threads, each thread's), cols, depth
    assert hexir.Trace.from_json(sch.trace.to_json()).apply(func, target=target).func == sch.func
    made = [replay(func, step, target) for step in neighbours(sch.trace)]
    valid = [c for c in made if c is not None]
    assert len(valid) >= len(made) // 2 >= 3
    launches = {verify_gpu(compact_buffers(c.func), target) for c in valid}
    assert len(launches) > 1  # the threads moved, not only each thread's share
    for c in valid[:3]:
        check_on_cpu(func, c.func, rng)


@pytest.mark.parametrize("block", [8, 16])
def test_a_conv_of_a_blocked_weight_takes_panels_of_one_block(block, rng):
    # A 3x3 conv's weight laid out in blocks of b filters ([K/b, C, R, S, b]) is contiguous
    # within a block only: its register tile's panel is one block where a vector holds the
    # whole block, whatever the vector width's rule would take (AVX-512's rule is 32 filters:
    # a panel across two blocks ran scalar, 40x slower), and one vector within the block where
    # a vector is narrower (AVX2's 8 lanes in a block of 16).
    from hexir.ops.builder import GraphBuilder
    from hexir.search.scheduler import extract_tasks

    b = GraphBuilder("blocked")
    x = b.input("x", (1, 16, 14, 14))
    w = b.input("w", (32 // block, 16, 3, 3, block))
    graph = b.build(b.relu(b.conv2d(x, w, padding=1, weight_block=block)))
    (task,) = extract_tasks(graph, "cpu")
    sch = default_schedule(task.func, "cpu")
    text = str(sch.trace)
    panel = min(block, Target("cpu").vector_width)
    one, pair = f"[{32 // panel}, 1, 1, {panel}]", f"[{16 // panel}, 1, 2, {panel}]"
    assert f"decision={one}" in text or f"decision={pair}" in text  # a pair: see below
    vectorized = [lp for lp in _loops(sch.func) if lp.kind == "vectorized"]
    assert any(lp.extent == panel for lp in vectorized)
    check_on_cpu(task.func, sch.func, rng)


@pytest.mark.parametrize("features, paired", [("avx2,avx512f,fma", True), ("avx2,fma", False)])
def test_a_conv_of_a_blocked_weight_pairs_its_blocks_where_registers_allow(features, paired, rng):
    # One block of a 3x3 conv's blocked weight is one vector: the register tile of 7 rows x 1
    # vector keeps 7 accumulators, a broadcast per multiply-add. Where the registers hold 7 x
    # 2 (AVX-512's 32), two blocks at level 2 with the whole reduction outside them make one
    # tile of 14; AVX2's 16 registers do not hold it (7 x 2 + 3 = 17).
    from hexir.ops.builder import GraphBuilder
    from hexir.runtime.target import Target
    from hexir.search.scheduler import extract_tasks

    target = Target(f"cpu -features={features} -cores=2")
    block = target.vector_width
    b = GraphBuilder("paired")
    x = b.input("x", (1, 32, 7, 7))
    w = b.input("w", (64 // block, 32, 3, 3, block))
    graph = b.build(b.relu(b.conv2d(x, w, padding=1, weight_block=block)))
    (task,) = extract_tasks(graph, target)
    sch = default_schedule(task.func, target)
    text = str(sch.trace)
    if paired:
        assert f"decision=[{64 // block // 2}, 1, 2, {block}]" in text
        for reduction in ("[32, 1]", "[3, 1]"):  # the whole reduction outside the tile
            assert f"max_innermost_factor=0, decision={reduction}" in text
    else:
        assert f"decision=[{64 // block}, 1, 1, {block}]" in text
    if target.key == Target("cpu").key:
        check_on_cpu(task.func, sch.func, rng)
