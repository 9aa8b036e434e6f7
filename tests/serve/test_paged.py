"""The paged KV cache and the `paged_attention` op that reads it: the same attention as over
a contiguous cache, evaluated, compiled for the CPU, compiled for CUDA (NVRTC) with its GPU
schedule's numerics checked on the CPU path, and exported to ONNX."""

import math

import numpy as np
import onnxruntime
import pytest

import hexir
from hexir.errors import HexirError, ResourceError, TypeInferenceError
from hexir.graph.lower import lower
from hexir.runtime.default_schedule import default_schedule
from hexir.runtime.kv_cache import PagedKVCache

LAYERS, HEADS, DIM, PAGE = 2, 3, 8, 4


def _filled(rng, lengths, pages=16):
    """A cache holding sequences of `lengths` tokens, their pages interleaved in the pool (each
    sequence grown a token at a time, in turn), and the contiguous keys and values."""
    cache = PagedKVCache(layers=LAYERS, heads=HEADS, head_dim=DIM, pages=pages, page_size=PAGE)
    seqs = [cache.add() for _ in lengths]
    keys = [rng.standard_normal((LAYERS, HEADS, n, DIM)).astype(np.float32) for n in lengths]
    values = [rng.standard_normal((LAYERS, HEADS, n, DIM)).astype(np.float32) for n in lengths]
    for t in range(max(lengths)):
        for seq, k, v, n in zip(seqs, keys, values, lengths, strict=True):
            if t < n:
                cache.append(seq, k[:, :, t], v[:, :, t])
    return cache, seqs, keys, values


def _contiguous(q, keys, values, k_new=None, v_new=None):
    """Attention of each sequence's query over its contiguous keys (and its own), in numpy."""
    out = []
    for b, (k, v) in enumerate(zip(keys, values, strict=True)):
        if k_new is not None:
            k = np.concatenate([k, k_new[b][:, None]], axis=1)
            v = np.concatenate([v, v_new[b][:, None]], axis=1)
        scores = np.einsum("hd,htd->ht", q[b], k) / math.sqrt(DIM)
        e = np.exp(scores - scores.max(-1, keepdims=True))
        out.append(np.einsum("ht,htd->hd", e / e.sum(-1, keepdims=True), v))
    return np.stack(out)


def _graph(cache, batch, new):
    b = hexir.GraphBuilder("paged")
    pages = cache.keys.shape[1]
    operands = [
        b.input("q", (batch, HEADS, DIM)),
        b.input("k_pages", (pages, HEADS, PAGE, DIM)),
        b.input("v_pages", (pages, HEADS, PAGE, DIM)),
        b.input("block_table", (batch, cache.max_pages), "int32"),
        b.input("lengths", (batch,), "int32"),
    ]
    if new:
        operands += [b.input("k_new", (batch, HEADS, DIM)), b.input("v_new", (batch, HEADS, DIM))]
    return b.build(b.paged_attention(*operands))


@pytest.mark.parametrize("new", [False, True])
def test_paged_attention_is_attention_over_the_contiguous_cache(new):
    rng = np.random.default_rng()
    lengths = [1, 9, 4, 14] if not new else [0, 9, 4, 14]
    cache, seqs, keys, values = _filled(rng, lengths)
    layer = 1
    q = rng.standard_normal((len(seqs), HEADS, DIM)).astype(np.float32)
    feeds = [
        q,
        cache.keys[layer],
        cache.values[layer],
        cache.block_table(seqs),
        cache.lengths(seqs),
    ]
    extra = [rng.standard_normal((len(seqs), HEADS, DIM)).astype(np.float32) for _ in range(2)]
    if new:
        feeds += extra
    want = _contiguous(
        q, [k[layer] for k in keys], [v[layer] for v in values], *(extra if new else ())
    )
    graph = _graph(cache, len(seqs), new)
    (evaluated,) = hexir.reference(graph, feeds)
    np.testing.assert_allclose(evaluated, want, rtol=1e-5, atol=1e-6)
    (compiled,) = hexir.compile(graph).run(feeds)
    np.testing.assert_allclose(compiled, want, rtol=1e-4, atol=1e-5)
    session = onnxruntime.InferenceSession(hexir.export_onnx(graph).SerializeToString())
    names = [v.name for v in graph.inputs]
    (exported,) = session.run(None, dict(zip(names, feeds, strict=True)))
    np.testing.assert_allclose(exported, want, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_paged_attention_builds_for_cuda_and_its_gpu_schedule_computes_it(arch):
    rng = np.random.default_rng()
    cache, seqs, keys, values = _filled(rng, [3, 11], pages=8)
    graph = _graph(cache, 2, new=True)
    sch = default_schedule(lower(graph), hexir.Target(f"cuda -arch={arch}"))
    kernel = hexir.build(sch.func, target=f"cuda -arch={arch}")  # NVRTC, no GPU needed
    assert kernel.binary.arch == arch and kernel.binary.resources["spill_bytes"] == 0
    q, k_new, v_new = (rng.standard_normal((2, HEADS, DIM)).astype(np.float32) for _ in range(3))
    out = np.empty((2, HEADS, DIM), np.float32)
    on_cpu = hexir.build(sch.func, target="cpu")  # the same schedule, serial semantics
    on_cpu(q, cache.keys[0], cache.values[0], cache.block_table(seqs), cache.lengths(seqs),
           k_new, v_new, out)  # fmt: skip
    want = _contiguous(q, [k[0] for k in keys], [v[0] for v in values], k_new, v_new)
    np.testing.assert_allclose(out, want, rtol=1e-4, atol=1e-5)


def test_pages_are_taken_as_tokens_arrive_and_freed_pages_are_reused():
    rng = np.random.default_rng()
    cache, (a, b), keys, _ = _filled(rng, [5, 9], pages=6)
    assert cache.pages_in_use == 2 + 3 and cache.free_pages == 1
    assert cache.lengths([a, b]).tolist() == [5, 9]
    table = cache.block_table([a, b])
    assert table.shape == (2, 6) and len({*table[0, :2], *table[1, :3]}) == 5
    freed = set(table[1, :3])
    cache.free(b)
    assert cache.pages_in_use == 2 and cache.free_pages == 4
    c = cache.add()
    more = rng.standard_normal((LAYERS, HEADS, 12, DIM)).astype(np.float32)
    cache.extend(c, more, more)  # 3 pages at once: the freed ones
    assert set(cache.block_table([c])[0, :3]) <= freed | set(range(6))
    assert cache.pages_in_use == 5 and cache.length(c) == 12
    pages = [cache.keys[:, p] for p in cache.block_table([c])[0, :3]]
    np.testing.assert_array_equal(np.concatenate(pages, axis=2), more)
    # the first sequence's keys are still its own
    pages = [cache.keys[:, p] for p in cache.block_table([a])[0, :2]]
    np.testing.assert_array_equal(np.concatenate(pages, axis=2)[:, :, :5], keys[0])


def test_running_out_of_pages_is_refused_and_changes_nothing():
    cache = PagedKVCache(layers=1, heads=1, head_dim=2, pages=2, page_size=2, max_pages=2)
    seq = cache.add()
    cache.extend(seq, np.ones((1, 1, 3, 2), np.float32), np.ones((1, 1, 3, 2), np.float32))
    with pytest.raises(ResourceError, match="holds at most 2"):
        cache.extend(seq, np.ones((1, 1, 2, 2), np.float32), np.ones((1, 1, 2, 2), np.float32))
    other = cache.add()
    with pytest.raises(ResourceError, match="out of pages: sequence 1 needs 1 more, 0 of 2"):
        cache.append(other, np.ones((1, 1, 2), np.float32), np.ones((1, 1, 2), np.float32))
    assert cache.length(seq) == 3 and cache.length(other) == 0 and cache.pages_in_use == 2
    with pytest.raises(HexirError, match="no sequence 7"):
        cache.free(7)


def test_the_op_checks_its_operands():
    b = hexir.GraphBuilder("g")
    q = b.input("q", (2, 3, 8))
    pages = b.input("p", (5, 3, 4, 8))
    table, lengths = b.input("t", (2, 4), "int32"), b.input("n", (2,), "int32")
    with pytest.raises(TypeInferenceError, match="k_new and v_new come together"):
        b.paged_attention(q, pages, pages, table, lengths, q)
    with pytest.raises(TypeInferenceError, match="a row per query"):
        b.paged_attention(q, pages, pages, b.input("t3", (3, 4), "int32"), lengths)
    with pytest.raises(TypeInferenceError, match="is not \\[P, H, S, D\\]"):
        b.paged_attention(q, b.input("p2", (5, 2, 4, 8)), pages, table, lengths)
