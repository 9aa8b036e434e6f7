"""Constant weights laid out at compile time: `layout_weights(graph, target)`.

    %w = hexir.constant @w : tensor<3072x768xf32>          %w_t_16n = hexir.constant @w_t_16n
    %0 = hexir.dense %x, %w : tensor<128x3072xf32>   ->    %0 = hexir.matmul %x, %w_t_16n
                                                               {weight_block = 16}

    %w = hexir.constant @w : tensor<512x512x3x3xf32>       %w_8k = hexir.constant @w_8k
    %1 = hexir.conv2d %y, %w {...}                   ->    %1 = hexir.conv2d %y, %w_8k
                                                               {..., weight_block = 8}

A kernel's default schedule and the CPU sketch vectorize a contraction along its output's
columns and copy the operand they read along them into panels per parallel job; an operand
read across the vector loop (dense's w[N, K] under a loop over N) is copied transposed, a
strided gather on every call. Where that operand is a constant, this pass lays it out once,
here, as the kernel reads it:
- dense with a constant weight becomes a matmul of the transposed constant, whose panels are
  contiguous rows;
- on the CPU, a matmul of a constant [K, N] (a dense's transposed weight too) with more than
  one row takes it in the column panels of its register tile (`weight_block`, [N/b, K, b]:
  b = 16 for AVX2's 6 x 2-vector tile), so each job reads its panel in place, one
  contiguous stretch, where its per-call copy read one 64-byte piece of every K-long row,
  a page apart (bert's 128 x 768 x 3072: 0.71x -> 1.00x numpy's matmul; 128 x 3072 x 768:
  0.73x -> 0.85x). A single row (a decode step's matrix-vector product) takes it in panels
  of up to 4 vectors (`matrix_vector_block`), each streamed whole into one accumulator a
  vector (gpt2-decode 0.76 -> 0.27 ms);
- on the CPU, a conv2d with a window (3x3, 7x7) and a constant weight takes it in panels of
  the vector width (`weight_block`, [K/b, C, R, S, b]: one vector of filters per input pixel,
  the panel of one register tile contiguous), so its kernel reads the weight in place and
  packs nothing (512x512x3x3 on 7x7: the per-call copy of the 9.4 MB weight was 20-40% of the
  kernel). A 1x1 conv, a matmul of its weight, takes it in the panels of its register tile
  like a matmul (b = 16 on AVX2: ResNet-50's 2048x7x7 -> 512 2.0 -> 0.96 ms, 1024x14x14 ->
  2048 with stride 2 3.7 -> 2.3 ms);
- on the CPU, before those, a 1x1 conv of one image with stride 1 whose pixels fill whole
  column panels (56x56, 28x28; not 14x14 or 7x7) becomes a matmul of its weight [K, C] by
  the image as [C, H*W], vectorized along the pixels, its epilogues moved onto [K, H*W] by
  `simplify_graph`'s reshape sink (`_pointwise_convs_as_matmuls`; ResNet-50 and MobileNetV2
  0.95x and 0.94x the time).
- on the CPU, the same 1x1 convs (and those of 14x14 and 7x7 images, whose filters fill
  whole panels) may compute in NHWC instead: a matmul of the image's pixels [H*W, C] (a
  transpose, then a view) by the weight [C, K] (laid out in panels as any matmul's), the
  result transposed back. Between Winograd convs, which read and write NHWC, those
  transposes meet the Winograd form's and go (`simplify_graph`; a ResNet-50 stage stays in
  NHWC from its first 1x1 conv to its last residual add); next to convs that read NCHW (a
  direct conv of stride 2) they stay. So both layouts are made whole, and the one that transposes
  fewer elements is kept (NCHW on a tie): ResNet-50 22 transposes -> 13, 0.90x the time in
  one process alternated with the NCHW build. The NHWC plan also computes depthwise convs,
  a narrow RGB stem and the pools whose images are NHWC already in NHWC (`_images_in_nhwc`:
  a depthwise conv then vectorizes along its channels), and a plan's cost counts what its
  NHWC depthwise convs save: MobileNetV2 computes in NHWC after one transform of its input
  (0.83x the time of its NCHW plan);
- on the CPU, before the weights are blocked, a 3x3 conv of stride 1 whose output has enough
  tiles (`winograd_tile`: F(4, 3) from 49 tiles of 4 x 4, F(2, 3) from 49 of 2 x 2, direct
  below) takes the Winograd form (hexir/ops/winograd.py): its image in NHWC tiles,
  transformed, one batch_matmul by the weight transformed here (U = G w Gᵀ, [(m+2)^2, C, K]),
  the products transformed back and returned to NCHW, where its epilogues fuse into the
  transposing copy; between two such convs (a ResNet stage) the transposes sink through the
  epilogues and cancel (`simplify_graph`, run after these rewrites), so the activations
  stay in NHWC there (ResNet-18: 20 transposing kernels -> 11, 0.28 ms less). 4x (F(4, 3))
  or 2.25x (F(2, 3)) fewer multiplications; ResNet-18's 64 x 56 x 56 conv with bias,
  residual add and relu 1.8 -> 0.95 ms. The transformed weight
  is in the column panels of the batch_matmul's register tile (`weight_block`, [K/b, (m+2)^2,
  C, b]), as a matmul's: ResNet-50's 16 x 49 x 256 · 256 x 256 1.3-1.45 -> 0.93-0.97 ms in the
  model, its 36 x 49 x 128 · 128 x 128 0.71-0.83 -> 0.56-0.59. The `winograd` knob
  (HEXIR_WINOGRAD=0, 2, 4) keeps every conv direct or forces a tile; `layout_weights`'s
  `winograd` argument gives chosen convs a tile (0: direct) in place of the rule, which is
  how a build with a database takes the form tuning measured faster (hexir/graph/forms.py).
The result keeps its value (and name), so users, graph outputs and fusion are as before; the
rewrites are exact (the same products summed in the same order), but for Winograd's, whose
error is bounded in hexir/ops/winograd.py.

It runs after `simplify_graph` (so batch norms are already folded into the weights) wherever
a model becomes kernels (`hexir.graph.fusion.fused_kernels`: compile, tune and show agree on
the workloads); the `pack_weights` knob (HEXIR_PACK_WEIGHTS=0) keeps the weights as they are,
for comparison.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import numpy as np

from hexir import knobs
from hexir.graph.rewrite import RewritePass, simplify_graph
from hexir.ir.graph import ConstantData, Graph, Op, Value
from hexir.ir.kept import keeping, kept
from hexir.ir.symbolic import SymbolicError
from hexir.ops import make_op
from hexir.ops.contraction import (
    block_matmul_weight,
    group_matmul_weight,
    int4_weight,
    matmul_weight_shape,
)
from hexir.ops.nn import as_nchw, block_conv_weight, conv_weight_shape, is_nhwc
from hexir.ops.winograd import winograd_weight
from hexir.runtime.target import Target
from hexir.runtime.tiling import matrix_vector_block, register_tile
from hexir.schedule.tensorize import BF16_DOT, VNNI_DOT, Intrinsic, dot_intrinsic

__all__ = ["layout_weights"]

# A matmul_int4 of more rows than this computes with its weight dequantized at compile time:
# its kernel converts each int4 once per tile of rows (768 x 3072, alternated: 1 row 0.063 ms
# against float32's 0.161, 4 rows 0.098 against 0.165, 8 rows 0.655 against 0.178).
INT4_ROWS = 4

TO_NHWC = {"src": "NCHW", "dst": "NHWC"}
TO_NCHW = {"src": "NHWC", "dst": "NCHW"}


def layout_weights(
    graph: Graph, target: Target | None = None, winograd: Mapping[str, int] | None = None
) -> Graph:
    """`graph` with every dense of a constant weight as a matmul of its transpose and, for a
    CPU target, every matmul and conv2d of a constant weight with it in the panels its kernel
    reads (see the module docstring); `graph` itself when the `pack_weights` knob is off.
    `winograd` names the Winograd tile (0: direct) of some convs by their results' names, in
    place of `winograd_tile`'s rule (a choice measured in the database: hexir/graph/forms.py);
    a tile forced by the `winograd` knob wins over both."""
    if not knobs.get().pack_weights:
        return graph
    target = target if target is not None else Target("cpu")
    if target.kind != "cpu":
        return _lay_out(graph, target, {})
    choice, plans = knobs.get().layout, []
    with keeping():  # both plans lay out the same weights: each transformed once
        if choice != "nhwc":
            nchw = _pointwise_convs_as_matmuls(_strided_pointwise_convs(graph, target), target)
            plans.append(_lay_out(nchw, target, winograd or {}))
        if choice != "nchw":
            nhwc = _strided_pointwise_convs(graph, target, True)
            nhwc = _pointwise_convs_as_matmuls(nhwc, target, True)
            forms = any(_has_nhwc_form(op, target) for op in graph.ops)
            if choice == "nhwc" or nhwc is not graph or forms:
                plans.append(_images_in_nhwc(_lay_out(nhwc, target, winograd or {}), target))
    return min(plans, key=_plan_cost)  # the first (NCHW) on a tie


def _has_nhwc_form(op: Op, target: Target) -> bool:
    """Whether the NHWC plan computes `op` in NHWC: a depthwise conv (its kernel then
    vectorizes along the channels, where in NCHW it takes the image's columns, 7 or 14 of
    them), a narrow stem (`_narrow_stem`) or a pool. Any other conv of one group stays NCHW:
    its kernel reads a window's pixels for each input channel, a line apart in NHWC, and ran
    1.2-2x slower so."""
    if is_nhwc(op):
        return False
    if op.kind == "conv2d":
        return _depthwise(op) or _narrow_stem(op, target)
    return op.kind in ("max_pool2d", "avg_pool2d", "global_avg_pool2d")


def _narrow_stem(op: Op, target: Target) -> bool:
    """A conv of one group on fewer channels than a vector (an RGB image) with a window of at
    most 3x3: in NHWC its input's transform moves fewer elements than its output's would,
    and the kernel ran faster (MobileNetV2's 3 -> 32 3x3 of stride 2 on 224x224, with the
    transform: 0.073 against 0.190 ms). ResNet's 7x7 stem ran slower so (0.93 against 0.76)."""
    _, c, r, s = conv_weight_shape(op.operands[1].type.shape)
    return op.attr("groups") == 1 and c < target.vector_width and max(r, s) <= 3


def _depthwise(op: Op) -> bool:
    """A conv2d of one input channel per group, one filter each."""
    if op.kind != "conv2d":
        return False
    channels = as_nchw(op.operands[0].type.shape, is_nhwc(op))[1]
    return op.attr("groups") == channels == as_nchw(op.result.type.shape, is_nhwc(op))[1] > 1


def _images_in_nhwc(graph: Graph, target: Target) -> Graph:
    """Each conv that has an NHWC form (`_has_nhwc_form`) computing in NHWC between a
    layout_transform of its image and one of its result back; `simplify_graph` then cancels
    those between two such ops (through the epilogues between them), so only the graph's
    input is transformed (the stem's three channels) and its result (a pooled [1, 1, 1, C]
    is a view of [1, C, 1, 1]). A pool computes in NHWC so where that moves no more elements
    than before: a ResNet's global pool after its NHWC last stage, not the max pool after its
    NCHW stem (transforming the stem's output before the pool moved 4x the elements of
    transforming the pool's output: ResNet-18 and -50 1.02-1.03x the time)."""
    planned = _wrap(graph, lambda op: op.kind == "conv2d" and _has_nhwc_form(op, target))
    pools = [op.result.name for op in planned.ops if "pool" in op.kind]
    for name in pools:
        op = next(o for o in planned.ops if o.result.name == name)
        if not _has_nhwc_form(op, target):
            continue
        trial = _wrap(planned, lambda o, name=name: o.result.name == name)
        if transposed_elements(trial) <= transposed_elements(planned):
            planned = trial
    return planned


def _wrap(graph: Graph, which: Callable[[Op], bool]) -> Graph:
    """`graph` with each op `which` picks computing in NHWC between layout_transforms,
    simplified."""
    p = RewritePass(graph)
    ops: list[Op] = []
    for op in graph.ops:
        if not which(op):
            ops.append(op)
            continue
        x, *rest = op.operands
        where, base = op.placement, op.result.name
        image = make_op("layout_transform", [x], TO_NHWC, p.fresh(f"{x.name}_nhwc"), where)
        attrs = {**dict(op.attrs), "layout": "NHWC"}
        nhwc = make_op(op.kind, [image.result, *rest], attrs, p.fresh(f"{base}_nhwc"), where)
        back = make_op("layout_transform", [nhwc.result], TO_NCHW, base, where)
        ops.extend([image, nhwc, back])
    return simplify_graph(p.finish(ops))


def _plan_cost(graph: Graph) -> int:
    """What a plan costs beyond the kernels both plans share, in elements moved: its layout
    transforms', less what each depthwise conv it computes in NHWC saves, counted as moving
    its output once (measured: 0.2 ns an output element saved, 0.1-0.5 ns one transformed;
    MobileNetV2's 56x56x144 of stride 1: 0.136 -> 0.063 ms)."""
    saved = sum(op.result.type.size for op in graph.ops if is_nhwc(op) and _depthwise(op))
    return transposed_elements(graph) - saved


def transposed_elements(graph: Graph) -> int:
    """How many elements `graph`'s transposes and layout transforms move."""
    moving = ("transpose", "layout_transform")
    return sum(op.result.type.size for op in graph.ops if op.kind in moving)


def _laid_out(
    op: Op, p: RewritePass, target: Target, winograd: Mapping[str, int], transposed: dict
) -> list[Op] | None:
    """`op` with its weight laid out, or None where it stays as it is."""
    rewritten = _matmul_of_constant(op, p, target) or _int4_panels(op, p, target)
    if op.kind == "dense" and rewritten and not rewritten[1].attr("weight_block"):
        transposed[op.operands[1].name] = rewritten[0].result
    if rewritten is None and target.kind == "cpu":
        rewritten = _winograd_conv(op, p, target, winograd)
        rewritten = rewritten or _blocked_conv(op, p, target)
    return rewritten


def _lay_out(graph: Graph, target: Target, winograd: Mapping[str, int]) -> Graph:
    """The weights of `graph`'s matmuls and convs laid out (its 1x1 convs already chosen)."""
    p = RewritePass(graph)
    ops: list[Op] = []
    transposed: dict[str, Value] = {}  # a dense's constant weight -> its plain transpose
    for op in graph.ops:
        try:
            rewritten = _laid_out(op, p, target, winograd, transposed)
        except SymbolicError:  # a layout chosen by sizes known only at run time: none
            rewritten = None
        ops.extend(rewritten or [op])
    ops = _gathers_of_transposed(ops, transposed, p)
    # The Winograd form's transposes sink through the epilogues between two such convs and
    # cancel (`simplify_graph`'s transpose sink): its activations stay in NHWC between them.
    return simplify_graph(p.finish(ops))  # (its rounds remove the dead ops too)


def _gathers_of_transposed(
    ops: list[Op], transposed: Mapping[str, Value], p: RewritePass
) -> list[Op]:
    """A lookup of rows of a constant that a dense now reads transposed, plainly
    (`transposed`: the weight's name -> the transpose; a tied embedding: GPT-2's wte [vocab,
    hidden], also the logits' weight), made from the transpose instead, so that one copy of
    the weight is kept: `gather(w, ids, axis=0)` as `transpose(gather(wᵀ, ids, axis=1))`,
    its columns read with a stride (one token's hidden, per token)."""
    if not any(op.kind == "gather" and op.operands[0].name in transposed for op in ops):
        return ops
    # the transposed constants first (they read nothing): a lookup may come before the dense
    hoisted = {w.name for w in transposed.values()}
    out = [op for op in ops if op.result.name in hoisted]
    for op in ops:
        if op.result.name in hoisted:
            continue
        data = op.operands[0].name if op.operands else None
        if op.kind != "gather" or data not in transposed or op.attr("axis") != 0:
            out.append(op)
            continue
        w_t, ids = transposed[data], op.operands[1]
        rank = len(ids.type.shape)
        columns = make_op("gather", [w_t, ids], {"axis": 1}, p.fresh(f"{op.result.name}_t"),
                          op.placement)  # fmt: skip
        perm = (*range(1, rank + 1), 0)
        out += [columns, make_op("transpose", [columns.result], {"perm": perm},
                                 op.result.name, op.placement)]  # fmt: skip
    return out


def _matmul_of_constant(op: Op, p: RewritePass, target: Target) -> list[Op] | None:
    """A dense of a constant weight as a matmul of its transpose; on the CPU, a matmul of a
    constant [K, N] takes it in column panels (`weight_block`): of its register tile's width,
    or for a single row of `matrix_vector_block`'s, unless no panel divides N; 8-bit operands
    on a CPU with VNNI, in its groups (`weight_kgroup`, `_dot_groups`)."""
    dense = op.kind == "dense"
    if op.kind not in ("dense", "matmul") or op.attr("weight_block"):
        return None
    x, w = op.operands
    if w.name not in p.data:
        return None
    weight = np.ascontiguousarray(p.data[w.name].T) if dense else p.data[w.name]
    weight, suffix, attrs = _cpu_weight(x, w, weight, target)
    if not attrs and not dense:
        return None
    name = f"{w.name}_t{suffix}" if dense else f"{w.name}{suffix}"
    new_w = p.constant(name, weight, op.placement)
    columns = op.result.type.shape[1]
    block, group = (int(attrs.get(key, 0)) for key in ("weight_block", "weight_kgroup"))
    if matmul_weight_shape(weight.shape, block, group)[1] == columns:
        return [new_w, make_op("matmul", [x, new_w.result], attrs, op.result.name, op.placement)]
    # padded: the product of the padded weight, then its first `columns` columns
    wide = make_op("matmul", [x, new_w.result], attrs, p.fresh(f"{op.result.name}_padded"),
                   op.placement)  # fmt: skip
    rows = op.result.type.shape[0]
    bounds = {"start": (0, 0), "stop": (rows, columns), "step": (1, 1)}
    return [new_w, wide, make_op("slice", [wide.result], bounds, op.result.name, op.placement)]


def _cpu_weight(
    x: Value, w: Value, weight: np.ndarray, target: Target
) -> tuple[np.ndarray, str, dict[str, object]]:
    """A matmul's constant [K, N] as the target's kernels read it, the suffix its constant's
    name takes and the matmul's attributes saying so (none: as it is)."""
    dot = _dot_groups(x, w, weight.shape, target)
    if dot is not None:
        attrs: dict[str, object] = {"weight_block": dot.lanes, "weight_kgroup": dot.group}
        suffix = "_vnni" if dot == VNNI_DOT else "_bf16dot"
        return group_matmul_weight(weight, dot.lanes, dot.group), suffix, attrs
    rows, columns = x.type.shape[0], weight.shape[1]
    single_row = rows == 1 and target.kind == "cpu"
    if single_row:
        block = matrix_vector_block(columns, target)
    else:  # a last panel the columns do not fill is padded with zeros, where many
        block = _panel(rows, columns, target, ragged=columns >= PADDED_MIN_COLUMNS)
    if not block:
        return weight, "", {}
    if columns % block:  # zero columns to whole panels, PADDED_PANELS of them where many
        multiple = block * (PADDED_PANELS if columns >= 64 * block else 1)
        weight = np.pad(weight, ((0, 0), (0, -columns % multiple)))
    return block_matmul_weight(weight, block), f"_{block}n", {"weight_block": block}


def _dot_groups(x: Value, w: Value, shape: tuple[int, ...], target: Target) -> Intrinsic | None:
    """The dot-product intrinsic in whose groups a matmul takes its constant [K, N]: 8-bit
    operands on a CPU with VNNI (`Target.int8_dot`), bfloat16 ones on a CPU with AVX512_BF16
    (`Target.bf16_dot`), where the intrinsic's columns and products divide it; else None."""
    k, n = shape
    dot = dot_intrinsic(x.type.dtype, w.type.dtype)
    has = {VNNI_DOT: target.int8_dot, BF16_DOT: target.bf16_dot}
    if dot is None or target.kind != "cpu" or not has.get(dot, False):
        return None
    return dot if k % dot.group == 0 and n % dot.lanes == 0 else None


# A matmul of at least PADDED_MIN_COLUMNS columns that fill no whole number of panels
# (GPT-2's logits: 50257) takes its constant weight padded with zero columns to whole panels,
# a multiple of PADDED_PANELS of them where there are 64 or more, and its result's first
# columns (a slice): the panels then split among jobs and cache blocks as a composite number
# does (50257 in 1571 panels of 32, a prime, ran at 0.45x the speed of 50256 columns: each of
# 8 jobs read the whole 154 MB weight; padded, 0.92x; 128 rows of 1000 columns 1.18 -> 0.65
# ms, of 300 0.32 -> 0.20 ms). Fewer columns keep their weight as it is (an MLP's 10 classes:
# a panel of zeros and a slice would cost more than they save).
PADDED_MIN_COLUMNS = 256
PADDED_PANELS = 8


def _int4_panels(op: Op, p: RewritePass, target: Target) -> list[Op] | None:
    """On the CPU, a matmul_int4 of a constant weight and scales: for a few rows (at most
    INT4_ROWS, a decode step's), both in the column panels of a float32 GEMV's weight
    (`weight_block`), each panel's bytes one contiguous stretch; for more rows, a matmul of
    the weight dequantized here, once (the same float32 values the op multiplies by: its
    kernel would convert each int4 again for every tile of rows, 5.6x slower than the
    float32 GEMM at 128 x 768 x 3072), laid out as any matmul's."""
    if op.kind != "matmul_int4" or op.attr("weight_block") or target.kind != "cpu":
        return None
    x, w, scale = op.operands
    if w.name not in p.data or scale.name not in p.data:
        return None
    rows, columns = op.result.type.shape
    if rows > INT4_ROWS:
        group = int(op.attr("group"))  # type: ignore[arg-type]
        dequantized = int4_weight(p.data[w.name], p.data[scale.name], group)
        weight = p.constant(f"{w.name}_f32", dequantized, op.placement)
        product = make_op("matmul", [x, weight.result], {}, op.result.name, op.placement)
        return [weight, *(_matmul_of_constant(product, p, target) or [product])]
    block = matrix_vector_block(columns, target) if rows == 1 else _panel(rows, columns, target)
    if not block or columns % block:
        return None
    new = [
        p.constant(f"{v.name}_{block}n", block_matmul_weight(p.data[v.name], block), op.placement)
        for v in (w, scale)
    ]
    attrs = {**dict(op.attrs), "weight_block": block}
    operands = [x, *(c.result for c in new)]
    return [*new, make_op("matmul_int4", operands, attrs, op.result.name, op.placement)]


def _panel(rows: int, columns: int, target: Target, ragged: bool = False) -> int:
    """The column panel a CPU matmul of `rows` x `columns` tiles by (0: none, on other
    targets, for a single row, whose weight is read once in rows, or where no panel divides
    the columns, unless the last may be `ragged`)."""
    if target.kind != "cpu" or rows == 1:
        return 0
    panel, _ = register_tile(columns, rows, target)
    return panel if columns % panel == 0 or ragged else 0


def _blocked_conv(op: Op, p: RewritePass, target: Target) -> list[Op] | None:
    block = target.vector_width
    if op.kind != "conv2d" or op.operands[1].name not in p.data or op.attr("weight_block"):
        return None
    x, w = op.operands
    k, _, r, s = w.type.shape
    if r * s == 1:  # a matmul's register tile, its rows the image's columns
        block = _panel(as_nchw(op.result.type.shape, is_nhwc(op))[3], k, target)
    if not block or k % block or op.attr("groups") != 1:
        return None
    weight = block_conv_weight(p.data[w.name], block)
    new_w = p.constant(f"{w.name}_{block}k", weight, op.placement)
    attrs = {**dict(op.attrs), "weight_block": block}
    conv = make_op("conv2d", [x, new_w.result], attrs, op.result.name, op.placement)
    return [new_w, conv]


# --- 1x1 convs over the pixels -----------------------------------------------------------------


def _strided_pointwise_convs(graph: Graph, target: Target, nhwc: bool = False) -> Graph:
    """Each 1x1 conv of stride s > 1 (no padding or dilation, one group) whose output pixels
    fill whole column panels as a slice of every s-th row and column of its image, then the
    same conv of stride 1, which becomes a matmul over the pixels below (ResNet-50's 256 x
    56 x 56 -> 512 with stride 2: 2.2 -> 1.6 ms, the slice included). On smaller outputs
    (14 x 14, 7 x 7) the strided conv stays: there the stride-1 conv of the sliced image ran
    1.35x slower than it. `nhwc`: every such conv whose filters fill whole panels, for the
    NHWC matmul below (the slice then picks the pixels from NHWC activations: simplify_graph
    moves it above the transpose)."""
    p = RewritePass(graph)
    ops: list[Op] = []
    for op in graph.ops:
        if not _strided_pointwise(op, p, target, nhwc):
            ops.append(op)
            continue
        x, w = op.operands
        n, c, oh, ow = (*x.type.shape[:2], *op.result.type.shape[2:])
        sh, sw = op.attr("stride")  # type: ignore[misc]
        bounds = {"start": (0, 0, 0, 0), "stop": (n, c, (oh - 1) * sh + 1, (ow - 1) * sw + 1),
                  "step": (1, 1, sh, sw)}  # fmt: skip
        picked = make_op("slice", [x], bounds, p.fresh(f"{x.name}_s{sh}"), op.placement)
        attrs = {**dict(op.attrs), "stride": (1, 1)}
        conv = make_op("conv2d", [picked.result, w], attrs, op.result.name, op.placement)
        ops.extend([picked, conv])
    return graph if len(ops) == len(graph.ops) else p.finish(ops)


def _strided_pointwise(op: Op, p: RewritePass, target: Target, nhwc: bool) -> bool:
    return _one_image_1x1(op, p, target, nhwc) and tuple(op.attr("stride")) != (1, 1)  # type: ignore


def _pointwise_convs_as_matmuls(graph: Graph, target: Target, nhwc: bool = False) -> Graph:
    """Each 1x1 conv of one image (stride 1, no padding, one group, constant weight) whose
    pixels fill whole column panels as a matmul of the weight [K, C] by the image read as
    [C, H*W] (a view), read back as [1, K, H, W] (a view): the kernel vectorizes along the
    pixels, contiguous in the image and the output, instead of along the filters, written
    back across the output channels a plane apart (256 -> 128 on 56x56: 3.7 -> 2.1 ms; 128 ->
    512 on 28x28 with the residual add: 1.6 -> 1.0 ms). `simplify_graph` then moves the
    reshape below the conv's elementwise epilogues (bias, residual add, activation), so they
    compute on [K, H*W] in the matmul's kernel."""
    p = RewritePass(graph)
    ops: list[Op] = []
    for op in graph.ops:
        if not _pointwise_conv(op, p, target, nhwc):
            ops.append(op)
        else:
            ops.extend(_as_nhwc_matmul(op, p) if nhwc else _as_matmul(op, p))
    if len(ops) == len(graph.ops):
        return graph
    return simplify_graph(p.finish(ops))


def _pointwise_conv(op: Op, p: RewritePass, target: Target, nhwc: bool) -> bool:
    return _one_image_1x1(op, p, target, nhwc) and tuple(op.attr("stride")) == (1, 1)  # type: ignore


def _one_image_1x1(op: Op, p: RewritePass, target: Target, nhwc: bool) -> bool:
    """A 1x1 conv2d of one image, no padding or dilation, one group, its weight a constant
    not yet blocked, whose output pixels fill whole column panels (any stride); `nhwc`,
    whose filters do (the matmul's columns are then the filters)."""
    if op.kind != "conv2d" or op.attr("weight_block") or op.operands[1].name not in p.data:
        return False
    if is_nhwc(op):
        return False
    n, k, h, w = op.result.type.shape
    one_by_one = op.operands[1].type.shape[2:] == (1, 1)
    no_pad = not any(op.attr("padding"))  # type: ignore[arg-type]
    undilated = tuple(op.attr("dilation")) == (1, 1)  # type: ignore[arg-type]
    if not (n == 1 and one_by_one and no_pad and undilated and op.attr("groups") == 1):
        return False
    return _panel(h * w, k, target) > 0 if nhwc else _panel(k, h * w, target) > 0


def _as_nhwc_matmul(conv: Op, p: RewritePass) -> list[Op]:
    """`conv` as transpose to NHWC -> reshape -> matmul by the weight [C, K] -> reshape ->
    transpose back, the last under the conv's name."""
    x, w = conv.operands
    n, k, h, wd = conv.result.type.shape
    c, where = w.type.shape[1], conv.placement
    weight = p.constant(f"{w.name}_ck", np.ascontiguousarray(p.data[w.name].reshape(k, c).T),
                        where)  # fmt: skip
    nhwc = make_op("layout_transform", [x], TO_NHWC, p.fresh(f"{x.name}_nhwc"), where)
    rows = make_op("reshape", [nhwc.result], {"shape": (n * h * wd, c)},
                   p.fresh(f"{x.name}_rows"), where)  # fmt: skip
    product = make_op("matmul", [rows.result, weight.result], {},
                      p.fresh(f"{conv.result.name}_pk"), where)  # fmt: skip
    image = make_op("reshape", [product.result], {"shape": (n, h, wd, k)},
                    p.fresh(f"{conv.result.name}_nhwc"), where)  # fmt: skip
    back = make_op("layout_transform", [image.result], TO_NCHW, conv.result.name, where)
    return [weight, nhwc, rows, product, image, back]


def _as_matmul(conv: Op, p: RewritePass) -> list[Op]:
    """`conv` as reshape -> matmul -> reshape, the last under the conv's name."""
    x, w = conv.operands
    shape = conv.result.type.shape
    k, c, where = shape[1], w.type.shape[1], conv.placement
    weight = p.constant(f"{w.name}_kc", p.data[w.name].reshape(k, c), where)
    image = make_op("reshape", [x], {"shape": (c, shape[2] * shape[3])},
                    p.fresh(f"{x.name}_flat"), where)  # fmt: skip
    product = make_op("matmul", [weight.result, image.result], {},
                      p.fresh(f"{conv.result.name}_kp"), where)  # fmt: skip
    back = make_op("reshape", [product.result], {"shape": shape}, conv.result.name, where)
    return [weight, image, product, back]


# --- Winograd --------------------------------------------------------------------------------


def winograd_tile(op: Op) -> int:
    """The output tile m of the Winograd form F(m, 3) a CPU conv2d compiles to, 0 for the
    direct form: a 3x3 conv of stride and dilation 1, one group and a constant weight, whose
    output tiles fill the batch_matmul's rows (the `winograd` knob forces m, or 0 for none).
    F(4, 3) where its tiles number at least WINOGRAD_MIN_TILES (56x56: 196 tiles, 28x28: 49),
    F(2, 3) where its do (14x14: 49 tiles), direct below (7x7)."""
    if not winograd_applies(op):
        return 0
    forced = knobs.get().winograd
    if forced != "auto":
        return int(forced)
    n, _, h, w = op.result.type.shape
    for m in (4, 2):
        if n * -(-h // m) * -(-w // m) >= WINOGRAD_MIN_TILES:
            return m
    return 0


WINOGRAD_MIN_TILES = 49


def winograd_applies(op: Op) -> bool:
    """Whether `op` has a Winograd form: a 3x3 conv2d of stride and dilation 1, one group,
    its weight not yet blocked (the weight must also be a constant, which the caller knows)."""
    if op.kind != "conv2d" or op.attr("weight_block") or op.attr("groups") != 1:
        return False
    if is_nhwc(op) or op.operands[1].type.shape[2:] != (3, 3):
        return False
    return all(tuple(op.attr(a)) == (1, 1) for a in ("stride", "dilation"))  # type: ignore


def _winograd_conv(
    conv: Op, p: RewritePass, target: Target, chosen: Mapping[str, int]
) -> list[Op] | None:
    """`conv` in the Winograd form F(m, 3) (hexir/ops/winograd.py), its weight transformed
    here: NHWC tiles of the padded image, transformed; one batch_matmul by the transformed
    weight; the products transformed back into NHWC tiles, then NCHW (cropped to the
    output). The result keeps the conv's name, so its epilogues read it as before. m is
    `chosen`'s for the conv where it names one (and the knob forces none), else the rule's."""
    m = winograd_tile(conv)
    if knobs.get().winograd == "auto" and winograd_applies(conv):
        m = chosen.get(conv.result.name, m)
    if not m or conv.operands[1].name not in p.data:
        return None
    x, w = conv.operands
    n, c, h, wd = x.type.shape
    _, k, oh, ow = conv.result.type.shape
    th, tw = -(-oh // m), -(-ow // m)
    ph, pw = conv.attr("padding")  # type: ignore[misc]
    a, where, base = m + 2, conv.placement, conv.result.name
    ops: list[Op] = []

    def add(kind: str, operand: Op | object, attrs: dict, name: str | None = None) -> Op:
        operands = [operand.result if isinstance(operand, Op) else operand]
        op = make_op(kind, operands, attrs, name or p.fresh(f"{base}_{kind}"), where)
        ops.append(op)
        return op

    nhwc = add("layout_transform", x, TO_NHWC)
    after = (th * m + 2 - h - ph, tw * m + 2 - wd - pw)
    padded = add("pad", nhwc, {"before": (0, ph, pw, 0), "after": (0, *after, 0)})
    tiles = add("winograd_input", padded, {"tile": m})
    rows = add("reshape", tiles, {"shape": (a * a, n * th * tw, c)})
    name, attrs, block = f"{w.name}_wino{m}", {}, _panel(n * th * tw, k, target)
    if block:  # in the column panels of the batch_matmul's register tile, as a matmul's
        name, attrs = f"{name}_{block}n", {"weight_block": block}
    u = kept(("winograd_weight", m, block), (p.data[w.name],),
             lambda: ConstantData(_winograd_weight(p.data[w.name], m, block)))  # fmt: skip
    weight = p.constant(name, u, where)
    ops.append(weight)
    product = make_op("batch_matmul", [rows.result, weight.result], attrs,
                      p.fresh(f"{base}_wino"), where)  # fmt: skip
    ops.append(product)
    spread = add("reshape", product, {"shape": (a, a, n, th, tw, k)})
    out_tiles = add("winograd_output", spread, {"tile": m})
    image = add("reshape", out_tiles, {"shape": (n, th * m, tw * m, k)})
    cropped = (th * m, tw * m) != (oh, ow)
    nchw = add("layout_transform", image, TO_NCHW, None if cropped else base)
    if cropped:
        bounds = {"start": (0, 0, 0, 0), "stop": (n, k, oh, ow), "step": (1, 1, 1, 1)}
        add("slice", nchw, bounds, base)
    return ops


def _winograd_weight(w: np.ndarray, m: int, block: int) -> np.ndarray:
    """A conv's weight `w` transformed for F(m, 3), in column panels of `block` (0: none).
    Kept per weight array within `hexir.ir.kept.keeping`, as the constant's data (copied and
    digested once): `layout_weights` lays out two plans, and a build with a database lowers a
    model once for each set of forms it weighs (ResNet-18: 94 transforms of 19 weights, 25 ms
    each, and 10 ms to digest)."""
    u = winograd_weight(w, m)
    return block_matmul_weight(u, block) if block else u
