"""Memory planning: liveness, the storage pool, in place, the figures, and the zoo bar."""

import itertools
import random

import pytest

import hexir
from hexir.graph.memory import ALIGN, MemoryPlan, Step, plan_memory, size_class

KIB = 1024


def check_plan(steps: list[Step], sizes: dict[str, int], plan: MemoryPlan) -> None:
    """Every value fits its storage, is aligned, and shares no byte with a value live at the
    same step, except the in-place pairs the plan names."""
    first: dict[str, int] = {}
    last: dict[str, int] = {}
    for t, step in enumerate(steps):
        for v in step.writes:
            first.setdefault(v, t)
            last[v] = max(last.get(v, t), t)
        for v in step.reads:
            last[v] = t
    placed = plan.as_dict()
    assert set(placed) == set(sizes)
    shared = set(plan.inplace) | {(b, a) for a, b in plan.inplace}
    for v, p in placed.items():
        assert p.nbytes == sizes[v]
        assert p.offset % ALIGN == 0
        assert p.offset + p.nbytes <= plan.storage_sizes[p.storage]
    names = sorted(placed)
    for i, a in enumerate(names):
        for b in names[i + 1 :]:
            pa, pb = placed[a], placed[b]
            live_together = first[a] <= last[b] and first[b] <= last[a]
            overlap = pa.storage == pb.storage and (
                pa.offset < pb.offset + pb.nbytes and pb.offset < pa.offset + pa.nbytes
            )
            if live_together and overlap:
                assert (a, b) in shared, f"%{a} and %{b} are live together in the same bytes"


def chain(n: int, size: int, inplace: bool = False) -> tuple[list[Step], dict[str, int]]:
    """x -> v0 -> v1 -> ... -> out: each value read by the next step only."""
    names = ["x"] + [f"v{i}" for i in range(n)] + ["out"]
    steps = [Step((a,), (b,), ((b, a),) if inplace else ()) for a, b in itertools.pairwise(names)]
    return steps, {v: size for v in names[1:-1]}


def test_a_chain_reuses_two_buffers_and_reaches_the_bound():
    steps, sizes = chain(10, 4 * KIB)
    plan = plan_memory(steps, sizes)
    check_plan(steps, sizes, plan)
    assert plan.total_bytes == 10 * 4 * KIB
    assert plan.lower_bound == 2 * 4 * KIB  # an input and an output are live at each step
    assert plan.peak_bytes == plan.lower_bound
    assert plan.inplace == ()


def test_an_elementwise_chain_runs_in_place_in_one_buffer():
    steps, sizes = chain(10, 4 * KIB, inplace=True)
    plan = plan_memory(steps, sizes)
    check_plan(steps, sizes, plan)
    assert plan.peak_bytes == 4 * KIB < plan.lower_bound
    assert len(plan.inplace) == 9
    assert len({plan.placement(v).offset for v in sizes}) == 1


def test_in_place_needs_the_input_to_die_there_and_the_same_size():
    steps = [
        Step(("x",), ("a",)),
        Step(("a",), ("b",), (("b", "a"),)),  # a is read again below: not in place
        Step(("a", "b"), ("c",), (("c", "b"),)),  # b dies here, same size: in place
        Step(("c",), ("d",), (("d", "c"),)),  # c dies, but d is larger: not in place
        Step(("d",), ("out",)),
    ]
    sizes = {"a": 1000, "b": 1000, "c": 1000, "d": 2000}
    plan = plan_memory(steps, sizes)
    check_plan(steps, sizes, plan)
    assert plan.inplace == (("c", "b"),)
    assert plan.placement("c") == plan.placement("b")


def test_a_diamond_keeps_the_shared_value_until_its_last_reader():
    # x -> a; a -> b; a -> c; (b, c) -> d; d -> out
    steps = [
        Step(("x",), ("a",)),
        Step(("a",), ("b",)),
        Step(("a",), ("c",)),
        Step(("b", "c"), ("d",)),
        Step(("d",), ("out",)),
    ]
    sizes = {"a": 3 * KIB, "b": 2 * KIB, "c": 2 * KIB, "d": 1 * KIB}
    plan = plan_memory(steps, sizes)
    check_plan(steps, sizes, plan)
    assert plan.lower_bound == 7 * KIB  # a, b and c at step 2
    assert plan.peak_bytes == plan.lower_bound
    assert plan.total_bytes == 8 * KIB


def test_a_freed_large_buffer_holds_several_smaller_values_at_offsets():
    # A large value dies; two smaller ones then live together inside its storage.
    steps = [
        Step(("x",), ("big",)),
        Step(("big",), ("s1",)),
        Step(("s1",), ("s2",)),
        Step(("s1", "s2"), ("s3",)),
        Step(("s3",), ("out",)),
    ]
    sizes = {"big": 8 * KIB, "s1": 2 * KIB, "s2": 2 * KIB, "s3": 2 * KIB}
    plan = plan_memory(steps, sizes)
    check_plan(steps, sizes, plan)
    assert plan.peak_bytes == plan.lower_bound == 10 * KIB
    assert plan.placement("s2").storage == plan.placement("big").storage


@pytest.mark.parametrize("seed", range(20))
def test_random_command_lists_give_valid_plans(seed):
    rng = random.Random(seed)
    values = ["x"]
    steps, sizes = [], {}
    for t in range(rng.randint(5, 40)):
        reads = tuple(rng.sample(values, min(len(values), rng.randint(1, 3))))
        outs = tuple(f"v{t}_{k}" for k in range(rng.choice([1, 1, 1, 2])))
        pairs = tuple((outs[0], r) for r in reads if rng.random() < 0.5)
        steps.append(Step(reads, outs, pairs))
        for o in outs:
            sizes[o] = rng.choice([64, 100, 1000, 4096, 5000, 65536, 100_000])
        values.extend(outs)
    plan = plan_memory(steps, sizes)
    check_plan(steps, sizes, plan)
    assert all(sizes[out] == sizes[donor] for out, donor in plan.inplace)
    if not plan.inplace:
        assert plan.peak_bytes >= plan.lower_bound
    assert plan.peak_bytes <= sum(-(-s // ALIGN) * ALIGN for s in sizes.values())


def test_size_classes_are_quarter_steps_between_powers_of_two():
    assert [size_class(n) for n in (1, 64, 65, 256)] == [64, 64, 128, 256]
    assert [size_class(n) for n in (1024, 1025, 1280, 1281, 1800, 2049)] == [
        1024,
        1280,
        1280,
        1536,
        2048,
        2560,
    ]
    for n in range(1, 100_000, 997):
        assert n <= size_class(n) < max(1.25 * n + ALIGN, 4 * ALIGN + 1)


def test_a_value_read_before_written_or_never_written_is_refused():
    with pytest.raises(ValueError, match="reads %a before"):
        plan_memory([Step(("a",), ("b",))], {"a": 64, "b": 64})
    with pytest.raises(ValueError, match="no step writes: c"):
        plan_memory([Step(("x",), ("b",))], {"b": 64, "c": 64})


def test_the_plan_prints_its_figures_and_round_trips_through_json():
    steps, sizes = chain(4, 3 * 2**20)
    plan = plan_memory(steps, sizes)
    text = plan.summary()
    assert "planned peak" in text and "liveness lower bound" in text
    assert "sum of intermediates" in text and "12.000 MiB" in text
    assert MemoryPlan.from_json(plan.to_json()) == plan


# -- the zoo ----------------------------------------------------------------------------------

ZOO = ["mlp", "resnet18", "resnet50", "mobilenet-v2", "bert-base", "vit", "gpt2", "gpt2-decode"]


@pytest.mark.parametrize("fusion", [True, False], ids=["fused", "unfused"])
@pytest.mark.parametrize(
    "name", [pytest.param(n, marks=pytest.mark.slow) if n == "resnet50" else n for n in ZOO]
)
def test_the_planned_peak_is_within_a_quarter_of_the_bound_on_every_zoo_model(name, fusion):
    from hexir.frontend.zoo import zoo_model
    from hexir.runtime.executor import plan_graph

    with hexir.knobs.scope(fusion=fusion):
        plan = plan_graph(zoo_model(name))
    assert plan.peak_bytes <= 1.25 * plan.lower_bound, plan.summary()
    assert plan.peak_bytes < plan.total_bytes
    if not fusion and name.startswith("resnet"):
        assert plan.inplace  # unfused, batch norm and relu run in place
