"""The search space: sampled traces replay, compute the reference result, respect the target's
limits, and carry decisions the search can change. The seven workloads of DESIGN.md §9, small,
on both targets; GPU traces are checked with serial semantics on the CPU (DESIGN.md §3)."""

from __future__ import annotations

import copy
import random
from collections.abc import Callable

import numpy as np
import pytest

import hexir
from hexir.codegen.gpu_verify import verify_gpu
from hexir.errors import ResourceError, ScheduleError, SpaceError
from hexir.ir.dtype import numpy_dtype, short_name
from hexir.ir.tir import Allocate, PrimFunc
from hexir.ir.visit import walk
from hexir.runtime.target import Target
from hexir.schedule import Schedule, Trace
from hexir.schedule.compact import compact_buffers
from hexir.schedule.sampling import divisors
from hexir.search import space
from hexir.search.space import SearchSpace, check_resources

WORKLOADS: dict[str, Callable[[], PrimFunc]] = {
    "matmul": lambda: hexir.workload("matmul", M=24, N=40, K=20),
    "batch_matmul": lambda: hexir.workload("batch_matmul", B=2, M=12, N=16, K=10),
    "conv2d": lambda: hexir.workload("conv2d", N=1, C=4, H=6, W=6, K=8, R=3, S=3, padding=1),
    "dense": lambda: hexir.workload("dense", M=12, N=20, K=16, activation="gelu"),
    "softmax": lambda: hexir.workload("softmax", M=6, N=40),
    "layer_norm": lambda: hexir.workload("layer_norm", M=6, N=48),
    "reduce_sum": lambda: hexir.workload("reduce_sum", M=8, N=36),
}
TARGETS = ("cpu", "cuda -arch=sm_90")
SAMPLING = ("sample_perfect_tile", "sample_categorical", "sample_compute_location")


def assert_computes_reference(func: PrimFunc, scheduled: PrimFunc, seed: int) -> None:
    """The scheduled kernel, built for the CPU, gives numpy's answer on fresh random inputs
    (outputs poisoned with NaN first)."""
    rng = np.random.default_rng(seed)
    inputs = [rng.standard_normal(p.shape).astype(np.float32) for p in func.inputs]
    outputs = [np.full(p.shape, np.nan, np.float32) for p in func.outputs]
    hexir.build(scheduled, "cpu")(*inputs, *outputs)
    for out, ref in zip(outputs, hexir.reference(func, inputs), strict=True):
        np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-4)


def check_space(name: str, target: str, n: int, built: int, seed: int = 0) -> None:
    """`n` sampled schedules replay (through JSON) to the function they made; `built` of them,
    spread over the sample, compute the reference result."""
    func = WORKLOADS[name]()
    schedules = SearchSpace().sample_schedules(func, target, random.Random(seed), n)
    assert len(schedules) == n
    for sch in schedules:
        replayed = Trace.from_json(sch.trace.to_json()).apply(func)
        assert replayed.func == sch.func, f"{name} on {target}: replay differs\n{sch.trace}"
        assert any(i.kind in SAMPLING for i in sch.trace), f"no sampling instruction\n{sch.trace}"
    distinct = len({s.func for s in schedules})
    assert distinct >= min(8, n // 2), f"only {distinct} distinct schedules of {n}"
    for k, sch in enumerate(schedules[:: max(1, n // built)][:built]):
        try:
            assert_computes_reference(func, sch.func, seed=k)
        except AssertionError as e:
            raise AssertionError(f"{name} on {target}:\n{sch.trace}") from e


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("name", WORKLOADS)
def test_a_few_samples_replay_and_compute(name, target):
    check_space(name, target, n=6, built=2)


@pytest.mark.slow
@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("name", WORKLOADS)
def test_many_samples_replay_and_compute(name, target):
    # 80 samples replay; 10 built per target: 20 per workload compute the reference result.
    check_space(name, target, n=80, built=10, seed=1)


@pytest.mark.parametrize("name", ["matmul", "conv2d", "softmax"])
def test_gpu_samples_fit_the_target(name):
    target = Target("cuda -arch=sm_90")
    func = WORKLOADS[name]()
    for sch in SearchSpace().sample_schedules(func, target, random.Random(2), 6):
        launch = verify_gpu(compact_buffers(sch.func), target)
        assert 1 < launch.threads <= target.max_threads_per_block
        assert launch.grid[0] >= 1
        kinds = {loop.kind for loop in _loops(sch.func)}
        assert "blockIdx.x" in kinds and "threadIdx.x" in kinds


def test_gpu_matmul_sketch_has_shared_fetch_and_local_accumulator():
    func = WORKLOADS["matmul"]()
    (sch,) = SearchSpace().sample_schedules(func, "cuda -arch=sm_90", random.Random(3), 1)
    text = str(sch.func)
    assert "buffer<24x20xf32, shared>" in text and "buffer<20x40xf32, shared>" in text
    assert "buffer<24x40xf32, local>" in text and "vthread" in text
    kinds = [i.kind for i in sch.trace]
    assert kinds.count("cache_read") == 2 and "decompose_reduction" in kinds


def test_every_gpu_draw_of_a_matmul_fetches_its_tiles_into_shared_memory_some_as_vectors():
    """The sketch's shared fetches are stages of their own: the inlining after tiling used to
    fold them back into the product (most draws then read A and B from global memory). Each
    fetch's width is drawn: float2/float4 copies where the rows allow."""
    from hexir.codegen.cuda import generate_cuda

    func = hexir.workload("matmul", M=64, N=64, K=64)
    target = Target("cuda -arch=sm_90")
    schedules = SearchSpace().sample_schedules(func, target, random.Random(5), 12)
    vector = []
    for sch in schedules:
        source = generate_cuda(sch.func, target).source
        assert source.count("__shared__") == 2, sch.trace
        drawn = [(dict(i.attrs)["candidates"], i.decision) for i in sch.trace
                 if i.kind == "sample_categorical"]  # fmt: skip
        widths = [options[d] for options, d in drawn if options[0] == 1]  # not unroll steps
        if max(widths, default=1) > 1:  # a fetch of 2 or 4 elements a thread drawn
            vector.append(sch)
            assert "float2" in source or "float4" in source, sch.trace
    assert vector, "no draw fetched with vectors"
    for k, sch in enumerate(vector[:2]):
        assert_computes_reference(func, sch.func, seed=k)


@pytest.mark.slow
@pytest.mark.parametrize(
    "name,shape",
    [
        ("batch_matmul", dict(B=12, M=128, N=128, K=64)),  # BERT's attention scores
        ("conv2d", dict(N=1, C=64, H=56, W=56, K=64, R=3, S=3, padding=1)),
    ],
)
def test_gpu_draws_size_their_step_to_shared_memory(name, shape):
    """A batched or convolved operand's shared tile spans more loops than a matmul's: the
    sketch draws tiles until one step's tiles fit 48 KB (14 of 32 batch_matmul draws and a
    fifth of the conv's overflowed before)."""
    func = hexir.workload(name, **shape)
    target = Target("cuda -arch=sm_90")
    rng = random.Random(1)
    for _ in range(12):
        sch = SearchSpace().sample_schedule(func, target, rng)  # ResourceError if it overflows
        assert sum(a.buffer.scope == "shared" for a in walk(compact_buffers(sch.func).body)
                   if isinstance(a, Allocate)) == 2  # fmt: skip


def test_gpu_reductions_are_cross_thread_in_one_kernel():
    func = WORKLOADS["softmax"]()
    for sch in SearchSpace().sample_schedules(func, "cuda -arch=sm_90", random.Random(4), 5):
        loops = list(_loops(sch.func))
        assert [lp.kind for lp in loops].count("blockIdx.x") == 1  # one grid: one kernel
        reduce_bound = [lp for lp in loops if lp.kind == "threadIdx.x" and _feeds_reduce(sch, lp)]
        assert len(reduce_bound) == 2  # the max and the sum, each over threads


def test_cpu_matmul_sketch_is_parallel_vectorized_with_a_register_tile():
    func = hexir.workload("matmul", M=64, N=64, K=64)
    traces = space.sample(func, "cpu", random.Random(5), 8)
    for trace in traces:
        text = str(trace.apply(func).func)
        assert " parallel " in text and "buffer<64x64xf32, local>" in text
        assert "pragma_auto_unroll_max_step" in text
    assert any(" vectorized " in str(t.apply(func).func) for t in traces)
    assert any("cache_read" in str(t) for t in traces)  # packing, sometimes


def test_sampling_is_reproducible():
    func = WORKLOADS["dense"]()
    for target in TARGETS:
        first = space.sample(func, target, random.Random(7), 4)
        assert first == space.sample(func, target, random.Random(7), 4)
        assert first != space.sample(func, target, random.Random(8), 4)


def test_a_changed_tile_decision_replays_and_computes():
    func = WORKLOADS["matmul"]()
    (trace,) = space.sample(func, "cpu", random.Random(9), 1)
    index, decision = next(
        (n, d) for n, d in trace.decisions if trace.instructions[n].kind == "sample_perfect_tile"
    )
    extent = int(np.prod(decision))
    other = [extent // 4, 1, 2, 2] if extent % 4 == 0 else [1, 1, 1, extent]
    assert other != list(decision) and other[-1] in divisors(extent)
    changed = trace.with_decision(index, other)
    sch = changed.apply(func)
    assert sch.trace.decisions[0][1] == tuple(other)
    assert_computes_reference(func, sch.func, seed=9)
    with pytest.raises(hexir.ScheduleError):
        trace.with_decision(index, [extent + 1, 1, 1, 1]).apply(func)


def test_over_limit_schedules_are_rejected():
    func = WORKLOADS["matmul"]()
    sch = Schedule(func, seed=0)
    i, j, _ = sch.get_loops(sch.get_block("matmul"))
    sch.bind(i, "blockIdx.x")
    sch.bind(j, "threadIdx.x")
    check_resources(sch.func, Target("cuda -arch=sm_90"))
    tiny = copy.copy(Target("cuda -arch=sm_90"))
    object.__setattr__(tiny, "max_threads_per_block", 32)
    with pytest.raises(ResourceError, match="40 threads per block"):
        check_resources(sch.func, tiny)


def test_a_space_with_no_valid_schedule_says_why():
    no_shared = copy.copy(Target("cuda -arch=sm_90"))
    # 0 bytes: only the draws that fetch nothing into shared memory fit (few of them)
    object.__setattr__(no_shared, "max_shared_memory_per_block", 0)
    with pytest.raises(SpaceError, match=r"gave [01] valid schedules of the 2.*shared memory"):
        SearchSpace(max_attempts=3).sample(WORKLOADS["matmul"](), no_shared, random.Random(0), 2)


@pytest.mark.parametrize("target", TARGETS)
def test_any_lowered_op_gets_a_space(target):
    ops = [
        hexir.workload("relu", shape=(6, 20)),
        hexir.workload("add", shapes=[(6, 20), (20,)]),
        hexir.workload("reduce_max", shape=(6, 40), axes=(1,), keepdims=True),
        hexir.workload("transpose", shape=(6, 20), perm=(1, 0)),
    ]
    for n, func in enumerate(ops):
        (sch,) = SearchSpace().sample_schedules(func, target, random.Random(n), 1)
        assert Trace.from_json(sch.trace.to_json()).apply(func).func == sch.func
        assert_computes_reference(func, sch.func, seed=n)


@pytest.mark.slow
def test_cpu_samples_have_the_structure_of_a_fast_matmul():
    """Speed is measured in benchmarks/measure_random.py; here, the structure that makes it:
    every sample computes the product, runs its outer loop in parallel and vectorizes, and
    most hold their accumulator tile in a `local` buffer."""
    func = hexir.workload("matmul", M=256, N=256, K=256)
    rng = np.random.default_rng(0)
    a, b = (rng.standard_normal((256, 256)).astype(np.float32) for _ in range(2))
    tiles = 0
    for trace in space.sample(func, "cpu", random.Random(0), 30):
        scheduled = trace.apply(func).func
        c = np.full((256, 256), np.nan, np.float32)  # fresh: no candidate passes on another's C
        hexir.build(scheduled)(a, b, c)
        np.testing.assert_allclose(c, a @ b, rtol=1e-3, atol=1e-3)
        kinds = {loop.kind for loop in _loops(scheduled)}
        assert {"parallel", "vectorized"} <= kinds, kinds
        tiles += any(
            isinstance(n, Allocate) and n.buffer.scope == "local" for n in walk(scheduled.body)
        )
    assert tiles >= 15, f"only {tiles} of 30 samples keep a local accumulator tile"


def _loops(func: PrimFunc):
    from hexir.schedule.common import all_loops

    return all_loops(func.body)


def _feeds_reduce(sch: Schedule, loop) -> bool:
    from hexir.schedule.common import reduce_fed_by

    return reduce_fed_by(loop.body, loop.var) is not None


@pytest.mark.parametrize(
    "name,func,pack,local",
    [
        # dense reads W[n, k]: the vector loop over n needs it packed as [k, n].
        ("dense", lambda: hexir.workload("dense", M=32, N=64, K=48, activation="relu"),
         "W_global[vk0, vi1]", "dense_local[vi0, vi1]"),
        # conv2d reads X through windows along rows and columns: it vectorizes over the
        # output channels, with W packed channels-last and the accumulator too (its iter vars
        # are vi4..vi7: i0..i3 are the loops of the padding stage).
        ("conv2d", lambda: hexir.workload("conv2d", N=1, C=8, H=10, W=10, K=32, R=3, S=3,
                                          padding=1),
         "W_global[vk0, vk1, vk2, vi5]", "Y_local[vi4, vi6, vi7, vi5]"),
    ],
)  # fmt: skip
def test_cpu_sketch_vectorizes_an_axis_every_operand_reads_well(name, func, pack, local):
    """The register tile's vector loop reads each operand contiguously or not at all: an
    operand indexed along it in another axis is packed transposed, every time; the samples
    vectorize that loop and compute the reference result."""
    func = func()
    vectorized = 0
    for k, trace in enumerate(space.sample(func, "cpu", random.Random(3), 8)):
        scheduled = trace.apply(func).func
        text = str(scheduled)
        assert pack in text, f"{name}: no transposed pack\n{trace}"
        block = next(b for b in _blocks(scheduled) if b.name == func.name)
        if "local" in text:
            assert local in text, f"{name}: accumulator not vector-axis-last\n{trace}"
        loops = _loops_around(scheduled, block)
        vectorized += loops[-1].kind == "vectorized"
        if k < 3:
            assert_computes_reference(func, scheduled, seed=k)
    assert vectorized >= 6, f"{name}: only {vectorized} of 8 samples vectorize the tile"


def _blocks(func: PrimFunc):
    from hexir.schedule.common import all_blocks

    return all_blocks(func.body)


def _loops_around(func: PrimFunc, block):
    from hexir.search.analysis import loops_around

    return loops_around(func, block)


@pytest.mark.parametrize(
    "name,shape",
    [
        # The matmul takes 1.2 s, the conv and the dense 2-4 s each: in the slow suite (CI
        # runs both); the softmax's rows stay in the quick one.
        pytest.param("matmul", dict(M=4096, N=4096, K=4096), marks=pytest.mark.slow),
        pytest.param("dense", dict(M=128, N=3072, K=768, bias=True), marks=pytest.mark.slow),
        pytest.param(
            "conv2d", dict(N=1, C=64, H=56, W=56, K=64, R=3, S=3, padding=1), marks=pytest.mark.slow
        ),  # ResNet's 3x3
        ("softmax", dict(M=1536, N=128)),  # BERT's attention rows
    ],
)
def test_most_gpu_draws_at_model_sizes_are_valid_kernels(name, shape):
    """The GPU sketch draws its tiles within the block's budgets (threads, vthreads, registers
    per thread, a block's tile of each axis), so most draws fit the target: at least half,
    where drawing factors uniformly kept 1 to 3 of 50 (0 for the conv)."""
    func = hexir.workload(name, **shape)
    target, rng, draws = Target("cuda -arch=sm_90"), random.Random(0), 60
    valid = 0
    for _ in range(draws):
        try:
            SearchSpace().sample_schedule(func, target, rng)
        except (ScheduleError, ResourceError):
            continue
        valid += 1
    assert valid >= draws // 2, f"{valid} of {draws} draws valid"


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_gpu_draws_of_a_half_precision_matmul_are_tensor_core_kernels(dtype):
    """A float16/bfloat16 contraction is tiled for mma.sync (handwritten_mma.tile_tensor_cores)
    with sampled warp and block tiles: every draw fits sm_90, replays, and computes the
    product on the CPU; the mutator's tile decisions are the warps', the tiles' and the
    step's."""
    func = hexir.workload("matmul", M=256, N=128, K=128, dtype=dtype)
    target = Target("cuda -arch=sm_90")
    schedules = SearchSpace().sample_schedules(func, target, random.Random(4), 6)
    assert len({s.func for s in schedules}) >= 3
    rng = np.random.default_rng(4)
    a, b = (rng.standard_normal(p.shape).astype(numpy_dtype(dtype)) for p in func.inputs)
    want = a.astype(np.float64) @ b.astype(np.float64)
    for sch in schedules:
        check_resources(sch.func, target)
        assert f'intrinsic="cuda_mma_m16n8k16_{short_name(dtype)}")' in str(sch.trace)
        assert Trace.from_json(sch.trace.to_json()).apply(func).func == sch.func
        tiles = [i for i in sch.trace if i.kind == "sample_perfect_tile"]
        assert [len(i.decision) for i in tiles] == [3, 3, 2]  # type: ignore[arg-type]
    sch = schedules[0]
    assert "mma.sync" in hexir.build(sch.func, target).source
    out = np.zeros((256, 128), numpy_dtype(func.outputs[0].dtype))
    hexir.build(sch.func, "cpu")(a, b, out)
    np.testing.assert_allclose(out.astype(np.float64), want, rtol=2e-3, atol=2e-2)
