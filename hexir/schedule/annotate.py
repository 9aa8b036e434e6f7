"""Loop kinds and annotations: parallel, vectorize, unroll, bind, annotate, tensorize,
unannotate.

A loop's kind is its schedule, visible in the IR (`for %i_0 in 0..32 parallel`). Changing it
is legal only where the result cannot change: no parallel or blockIdx loop feeds a reduction
(a threadIdx one may: a cross-thread reduction), and a vectorized loop is innermost with
unit-stride or invariant accesses. A vectorized loop may feed a reduction only as the whole of
one float block `out = out OP expr` (OP one of + max min, out free of the loop): its lanes are
then combined in a tree (a horizontal reduction), which reorders a sum as rfactor does.
"""

from __future__ import annotations

import math
from dataclasses import replace

from hexir.errors import ScheduleError
from hexir.ir import arith
from hexir.ir.dtype import is_float
from hexir.ir.tir import GPU_KINDS, AnnotationValue, Block, For, PrimFunc, Var
from hexir.ir.visit import free_vars
from hexir.schedule.common import (
    accesses,
    all_loops,
    find_path,
    is_block,
    is_loop,
    loop_ranges,
    loops_of,
    reduce_fed_by,
    replace_body,
    schedule_error,
)
from hexir.schedule.reduction import LANE_COMBINERS, match_reduction
from hexir.schedule.state import ScheduleBase, primitive
from hexir.schedule.tensorize import (
    INTRINSICS,
    TENSORIZE,
    TileIntrinsic,
    WarpMma,
    match_dot,
    match_mma,
)
from hexir.schedule.tensorize_tile import match_tile
from hexir.schedule.trace import BlockRV, ExprRV, LoopRV

THREAD_AXES = GPU_KINDS


class AnnotatePrimitives(ScheduleBase):
    @primitive
    def parallel(self, loop: LoopRV) -> None:
        """Run `loop`'s iterations on CPU threads (OpenMP).

        for %i_0 in 0..32 serial {    ->    for %i_0 in 0..32 parallel {
        """
        self._set_kind("parallel", loop, "parallel")

    @primitive
    def vectorize(self, loop: LoopRV) -> None:
        """Run innermost `loop` as SIMD lanes.

        for %j_1 in 0..16 serial {    ->    for %j_1 in 0..16 vectorized {
          block @add(vj = spatial(64) %j_0 * 16 + %j_1) ...     (unit stride in %j_1)
        """
        self._set_kind("vectorize", loop, "vectorized")

    @primitive
    def unroll(self, loop: LoopRV) -> None:
        """Unroll `loop` in the generated source.

        for %k_1 in 0..4 serial {    ->    for %k_1 in 0..4 unrolled {
        """
        self._set_kind("unroll", loop, "unrolled")

    @primitive
    def bind(self, loop: LoopRV, thread_axis: str) -> None:
        """Bind `loop` to a GPU thread axis: blockIdx.x|y|z, threadIdx.x|y|z or vthread.

            for %i_0 in 0..32 serial {    ->    for %i_0 in 0..32 blockIdx.x {
              for %i_1 in 0..32 serial {          for %i_1 in 0..32 threadIdx.x {

        With a target, the threadIdx extents' product must fit its `max_threads_per_block`.
        """
        if thread_axis not in THREAD_AXES:
            raise schedule_error(
                "bind", f"unknown thread axis {thread_axis!r}; one of {THREAD_AXES}", self.func
            )
        self._set_kind("bind", loop, thread_axis, (("thread_axis", thread_axis),))

    @primitive
    def annotate(
        self, block_or_loop: BlockRV | LoopRV, key: str, value: AnnotationValue | ExprRV
    ) -> None:
        """Set annotation `key` (an ExprRV value records its integer).

        for %i in 0..64 serial {  ->  for %i in 0..64 serial attributes {pragma_unroll = 16} {
        """
        plain = self._int(value, "annotate") if isinstance(value, ExprRV) else value
        plain = _annotation_value(self.func, plain)
        inputs = (("block_or_loop", block_or_loop), ("key", key), ("value", value))
        self._set_annotations("annotate", block_or_loop, inputs, lambda ann: {**ann, key: plain})

    @primitive
    def tensorize(self, loop: LoopRV | BlockRV, intrinsic: str) -> None:
        """Compute `loop`'s nest with one instruction (`hexir/schedule/tensorize.py`): the nest
        must compute what the intrinsic does; a mismatch names why, beside both. A block made
        by `blockize` stands for the nest it holds.

        for %j_2 in 0..16 serial {      ->   for %j_2 in 0..16 serial attributes
          for %k_1 in 0..4 serial {            {tensorize = "x86_vnni_dot_u8s8"} {
            block @matmul ... c += int32(a) * int32(b)
        """
        if isinstance(loop, BlockRV):
            block = self._block(loop, "tensorize")
            if not isinstance(block.body, For):
                reason = f"block @{block.name} holds no loop nest (blockize one first)"
                raise schedule_error("tensorize", reason, self.func, block=block.name)
            node = block.body
        else:
            node = self._loop(loop, "tensorize")
        known = INTRINSICS.get(intrinsic)
        if known is None:
            reason = f"unknown intrinsic {intrinsic!r}; one of {', '.join(INTRINSICS)}"
            raise schedule_error("tensorize", reason, self.func, loop=node.var)
        if isinstance(known, WarpMma):
            found = match_mma(node, known, loop_ranges(self.func), self._lane(node))
        elif isinstance(known, TileIntrinsic):
            found = match_tile(node, known, loop_ranges(self.func))
        else:
            found = match_dot(node, known, loop_ranges(self.func))
        if isinstance(found, str):
            reason = f"the nest does not compute {intrinsic} ({known.description}): {found}"
            raise schedule_error("tensorize", reason, self.func, loop=node.var)
        inputs = (("loop", loop), ("intrinsic", intrinsic))
        ann = tuple(sorted({**dict(node.annotations), TENSORIZE: intrinsic}.items()))
        func = replace_body(self.func, is_loop(node.var), lambda s: replace(s, annotations=ann))
        self._commit("tensorize", inputs, (), func)

    @primitive
    def unannotate(self, block_or_loop: BlockRV | LoopRV, key: str) -> None:
        """Remove annotation `key`, which must be set.

        for %i in 0..64 serial attributes {pragma_unroll = 16} {  ->  for %i in 0..64 serial {
        """

        def drop(ann: dict) -> dict:
            if key not in ann:
                raise self._target_error("unannotate", block_or_loop, f"no annotation {key!r}")
            return {k: v for k, v in ann.items() if k != key}

        inputs = (("block_or_loop", block_or_loop), ("key", key))
        self._set_annotations("unannotate", block_or_loop, inputs, drop)

    # -- helpers ------------------------------------------------------------------------------

    def _lane(self, node: For) -> Var:
        """The var of the threadIdx.x loop around `node` (a warp's lane where it has 32
        threads; a placeholder that no range knows where there is none)."""
        path = find_path(self.func.body, lambda s: s is node) or []
        axes = [lp.var for lp in loops_of(path) if lp.kind == "threadIdx.x"]
        return axes[-1] if axes else Var("threadIdx.x")

    def _set_kind(self, name: str, loop: LoopRV, kind: str, attrs: tuple = ()) -> None:
        node = self._loop(loop, name)
        func = set_loop_kind(self.func, node, kind, name, self.target)
        self._commit(name, (("loop", loop),), attrs, func)

    def _set_annotations(self, name: str, rv: object, inputs: tuple, update) -> None:  # noqa: ANN001
        if isinstance(rv, LoopRV):
            node: For | Block = self._loop(rv, name)
        else:
            node = self._block(rv, name)
        ann = tuple(sorted(update(dict(node.annotations)).items()))
        match_ = is_loop(node.var) if isinstance(node, For) else is_block(node.name)
        func = replace_body(self.func, match_, lambda s: replace(s, annotations=ann))
        self._commit(name, inputs, (), func)

    def _target_error(self, name: str, rv: object, reason: str) -> Exception:
        node = self.get(rv)  # type: ignore[arg-type]
        if isinstance(node, For):
            return schedule_error(name, reason, self.func, loop=node.var)
        return schedule_error(name, reason, self.func, block=getattr(node, "name", None))


def _annotation_value(func: PrimFunc, value: object) -> AnnotationValue:
    if isinstance(value, (list, tuple)) and all(
        isinstance(v, int) and not isinstance(v, bool) for v in value
    ):
        return tuple(value)
    if isinstance(value, (int, float, str, bool)):
        return value
    raise schedule_error(
        "annotate", f"an annotation is an int, float, str, bool or ints, not {value!r}", func
    )


# ---------------------------------------------------------------------------------------------
# Loop kinds


def set_loop_kind(
    func: PrimFunc, loop: For, kind: str, primitive: str = "", target: object = None
) -> PrimFunc:
    """`func` with `loop`'s kind set to `kind`, after the legality checks."""
    primitive = primitive or kind

    def fail(reason: str) -> Exception:
        return schedule_error(primitive, reason, func, loop=loop.var)

    if loop.kind != "serial":
        raise fail(f"loop %{loop.var.name} is already {loop.kind}")
    if kind in ("parallel", "vectorized") or kind.startswith("blockIdx"):
        fed = reduce_fed_by(loop.body, loop.var)
        if fed is not None and not (kind == "vectorized" and _lane_reduction(loop)):
            raise fail(
                f"loop %{loop.var.name} feeds reduce iter var {fed[1].name} of block "
                f"@{fed[0].name}: a {kind} reduction would race (bind it to threadIdx for a "
                "cross-thread reduction, or rfactor it)"
            )
    if kind == "vectorized":
        _check_vectorizable(func, loop, fail)
    if kind in GPU_KINDS:
        _check_nesting(func, loop, kind, fail)
    new = replace_body(func, is_loop(loop.var), lambda s: replace(s, kind=kind))
    if kind.startswith("threadIdx"):
        _check_threads(new, target, fail)
    return new


def _lane_reduction(loop: For) -> bool:
    """Whether `loop`'s body is one float reduction block whose lanes a tree may combine:
    `init { out = v }`, `out = out OP expr` with OP one of + max min, no predicate, and every
    iter var the loop feeds a reduce one."""
    block = loop.body
    if not isinstance(block, Block) or block.predicate is not None:
        return False
    try:
        red = match_reduction(block, lambda *a, **k: ScheduleError(""))
    except ScheduleError:
        return False
    fed = [iv for iv in block.iter_vars if loop.var in free_vars(iv.binding)]
    return (
        red.op in LANE_COMBINERS
        and is_float(red.out.dtype)
        and all(iv.kind == "reduce" for iv in fed)
    )


def _check_vectorizable(func: PrimFunc, loop: For, fail) -> None:  # noqa: ANN001
    inner = next(all_loops(loop.body), None)
    if inner is not None:
        raise fail(f"loop %{loop.var.name} is not innermost (loop %{inner.var.name} is inside it)")
    ranges = loop_ranges(func)
    for access in accesses(loop.body):
        last = len(access.indices) - 1
        for axis, index in enumerate(access.indices):
            coeffs = arith.affine_coefficients(index, [loop.var], ranges)
            stride = None if coeffs is None else coeffs[loop.var]
            if stride == 0 or (stride == 1 and axis == last):
                continue
            what = "not affine" if stride is None else f"stride {stride}"
            raise fail(
                f"access {access} is {what} in %{loop.var.name} along axis {axis}: a vectorized "
                "loop needs unit stride in the innermost axis and invariance in the others"
            )


def _check_nesting(func: PrimFunc, loop: For, kind: str, fail) -> None:  # noqa: ANN001
    outer = loops_of(find_path(func.body, is_loop(loop.var)) or [])[:-1]
    inner = list(all_loops(loop.body))
    for other in outer + inner:
        if other.kind == kind and kind != "vthread":
            raise fail(f"loop %{other.var.name} around or inside it is already bound to {kind}")
    if kind.startswith("blockIdx") and any(o.kind.startswith("threadIdx") for o in outer):
        raise fail("a blockIdx loop cannot be inside a threadIdx loop")
    if kind.startswith("threadIdx") and any(o.kind.startswith("blockIdx") for o in inner):
        raise fail("a threadIdx loop cannot hold a blockIdx loop")


def _check_threads(func: PrimFunc, target: object, fail) -> None:  # noqa: ANN001
    limit = getattr(target, "max_threads_per_block", None)
    if limit is None:
        return
    # Loops bound to one axis share its threads: the block needs the largest of them.
    extents: dict[str, int] = {}
    for loop in all_loops(func.body):
        if loop.kind.startswith("threadIdx"):
            extents[loop.kind] = max(extents.get(loop.kind, 1), loop.extent)
    total = math.prod(extents.values())
    if total > limit:
        shape = " x ".join(f"{k}={v}" for k, v in sorted(extents.items()))
        raise fail(f"{total} threads per block ({shape}) exceed the target's limit of {limit}")
