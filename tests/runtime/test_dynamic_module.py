"""A graph with symbolic dimensions compiled once (`hexir.compile(graph, dynamic=True)`): its
kernels take the sizes at run time, its contractions run per bucket, its memory is a plan
over symbolic sizes."""

import itertools

import numpy as np
import pytest
from test_symbolic_module import _block, _numpy

import hexir
from hexir.errors import HexirError, TypeInferenceError
from hexir.frontend.zoo_transformer import gpt2_small
from hexir.runtime.dynamic_module import DynamicModule


def test_one_compile_runs_every_size_of_two_symbols():
    rng = np.random.default_rng()
    graph, weights = _block(rng)
    module = hexir.compile(graph, dynamic=True)
    assert isinstance(module, DynamicModule) and module.symbols == ("past", "seq")
    hows = {step.name: step.how for step in module.steps}
    # the sum {past + seq} is computed at run time by the concat and layer_norm kernels
    assert hows["concat"] == hows["layer_norm"] == hows["softmax"] == "kernel"
    assert hows["matmul_relu"] == "buckets"  # a contraction: tiled at the bucket's sizes
    program = module.program()  # the steps, their values' shapes, the slots' sizes
    assert "kernel  %5 = concat(%past, %4)  %5: 1x{past + seq}x16 @slot1" in program
    assert "slot1: max(64*past + 64*seq) bytes" in program
    kernels = [step.runner for step in module.steps if step.how == "kernel"]
    for seq, past in [(1, 3), (17, 5), (200, 1), (30, 2)]:
        x = rng.standard_normal((1, seq, 32)).astype(np.float32)
        p = rng.standard_normal((1, past, 16)).astype(np.float32)
        (out,) = module.run([x, p])
        np.testing.assert_allclose(out, _numpy(x, p, *weights), rtol=1e-4, atol=1e-5)
        (unplanned,) = module.run({"x": x, "past": p}, plan=False)
        np.testing.assert_array_equal(out, unplanned)
    # the same kernels ran every size: nothing compiled between runs
    assert [step.runner for step in module.steps if step.how == "kernel"] == kernels


@pytest.mark.slow  # two compiles of a 2-layer GPT-2 and three buckets each: 6.6 s
def test_a_small_gpt2_compiled_once_computes_what_the_bucketed_module_does():
    graph = gpt2_small(seq="seq", layers=2, hidden=64, heads=4, vocab=300)
    dynamic, bucketed = hexir.compile(graph, dynamic=True), hexir.compile(graph)
    hows = {step.how for step in dynamic.steps}
    assert hows == {"kernel", "buckets", "view"}
    for step in dynamic.steps:
        assert (step.how == "buckets") == any(
            k in step.name for k in ("matmul", "dense", "attention")
        )
    rng = np.random.default_rng()
    for n in (1, 17, 200):
        ids = rng.integers(0, 300, n).astype(np.int64)
        got, want = dynamic.run([ids]), bucketed.run([ids])
        assert len(got) == len(want) == 5  # logits, then each layer's key and value
        for a, b in zip(got, want, strict=True):
            assert a.shape == b.shape
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)


def test_the_memory_plan_shares_slots_and_is_sized_at_run_time():
    module = hexir.compile(
        gpt2_small(seq="seq", layers=2, hidden=64, heads=4, vocab=300), dynamic=True
    )
    planned = [name for members in module.slots for name in members]
    assert len(module.slots) < len(planned)  # intermediates dead before others share
    order = {name: i for i, step in enumerate(module.steps) for name in step.outputs}
    storage = {}  # a view -> the value whose storage it is
    for step in module.steps:
        if step.how == "view":
            storage[step.outputs[0]] = storage.get(step.inputs[0], step.inputs[0])
    for members in module.slots:  # members of a slot: each written after the last is dead
        for a, b in itertools.pairwise(members):
            readers = [
                i for i, s in enumerate(module.steps) for n in s.inputs if storage.get(n, n) == a
            ]
            assert max(readers, default=order[a]) < order[b]
    small, large = module.arena_bytes({"seq": 16}), module.arena_bytes({"seq": 160})
    assert large > 9 * small  # every slot's size is linear in seq here


def test_inputs_that_do_not_fit_and_targets_it_does_not_run_on_are_refused(tmp_path):
    graph, _ = _block(np.random.default_rng(0))
    module = hexir.compile(graph, dynamic=True)
    with pytest.raises(TypeInferenceError, match=r"%x is 1x\{seq\}x32"):
        module.run([np.zeros((2, 7, 32), np.float32), np.zeros((1, 4, 16), np.float32)])
    with pytest.raises(HexirError, match="runs on the CPU"):
        hexir.compile(graph, target="cuda", dynamic=True)


def test_an_artifact_runs_every_size_without_compiling_what_it_holds(tmp_path, monkeypatch):
    rng = np.random.default_rng()
    graph, weights = _block(rng)
    module = hexir.compile(graph, dynamic=True)
    x = rng.standard_normal((1, 17, 32)).astype(np.float32)
    p = rng.standard_normal((1, 5, 16)).astype(np.float32)
    (before,) = module.run([x, p])  # compiles the contraction's bucket of 17: 32
    path = module.save(tmp_path / "block.hxa")
    loaded = hexir.runtime.load(path)
    assert isinstance(loaded, DynamicModule) and loaded.symbols == ("past", "seq")
    assert [s.how for s in loaded.steps] == [s.how for s in module.steps]

    def no_compile(*args, **kwargs):
        raise AssertionError("compiled after loading")

    with monkeypatch.context() as m:
        m.setattr("hexir.runtime.executor.compile", no_compile)
        m.setattr("hexir.runtime.build.compile_c", no_compile)
        (after,) = loaded.run([x, p])
        np.testing.assert_array_equal(after, before)
        x30 = rng.standard_normal((1, 30, 32)).astype(np.float32)  # the same bucket
        (out,) = loaded.run([x30, p[:, :2]])
        np.testing.assert_allclose(out, _numpy(x30, p[:, :2], *weights), rtol=1e-4, atol=1e-5)
    x200 = rng.standard_normal((1, 200, 32)).astype(np.float32)  # a new bucket compiles
    (out,) = loaded.run([x200, p])
    np.testing.assert_allclose(out, _numpy(x200, p, *weights), rtol=1e-4, atol=1e-5)
