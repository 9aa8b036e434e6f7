"""sch.flash_attention: an attention kernel's six stages replaced by the online-softmax nest
(hexir/schedule/flash.py), its tiles three decisions of the trace; the result verifies,
prints, parses and replays; kernels and tiles it cannot take are refused with the reason and
leave the schedule as it was. Its numerics and CUDA: tests/codegen/test_cuda_attention.py."""

from __future__ import annotations

import random

import pytest

import hexir
from hexir.errors import ScheduleError
from hexir.graph.lower import lower
from hexir.schedule import Schedule, Trace
from hexir.schedule.flash_match import match_attention
from hexir.search.mutators import mutate
from hexir.search.space import sample


def attention(s: int = 40, t: int = 72, d: int = 64, causal: bool = True) -> hexir.PrimFunc:
    b = hexir.GraphBuilder("attention")
    q, kt, v = b.input("q", (3, s, d)), b.input("kt", (3, d, t)), b.input("v", (3, t, d))
    return lower(b.build(b.attention(q, kt, v, causal=causal)))


def test_the_stages_become_the_flash_nest():
    func = attention()
    sch = Schedule(func)
    keys, values = sch.flash_attention(sch.get_block("attention_values"), 32, 16, 4)
    assert [sch.describe(b) for b in (keys, values)] == [
        "attention_keys_shared",
        "attention_values_shared",
    ]
    text = str(sch.func)
    for line in (
        "for %batch in 0..3 blockIdx.y",
        "for %query_tile in 0..2 blockIdx.x",  # 40 rows in tiles of 32
        "for %key_tile in 0..5 serial",  # 72 keys in tiles of 16
        "alloc %flash_keys: buffer<64x16xf32, shared>",
        "alloc %flash_values: buffer<16x64xf32, shared>",
        "if %key_tile * 16 < %query_tile * 32 + 64",  # causal: T - S = 32, last row 31
        "block @attention_tile_max(",
        "block @attention_out(",
    ):
        assert line in text, line
    assert "attention_scores" not in text and "attention_exp" not in text
    hexir.verify(sch.func)
    assert hexir.parse(text) == sch.func
    assert Trace.from_json(sch.trace.to_json()).apply(func).func == sch.func


def test_attention_without_a_causal_mask_reads_every_tile():
    sch = Schedule(attention(causal=False))
    sch.flash_attention(sch.get_block("attention_values"), 32, 16, 4)
    assert "key_tile * 16 <" not in str(sch.func)
    assert match_attention(attention(causal=False)).seen is None
    assert match_attention(attention(s=40, t=72)).seen is not None


@pytest.mark.parametrize(
    "tiles, reason",
    [
        ((32, 16, 3), "lanes dividing the keys"),
        ((0, 16, 2), "each positive"),
        ((512, 16, 4), "2048 threads a block"),
        ((64, 256, 2), "bytes of shared memory"),
    ],
)
def test_tiles_that_do_not_fit_are_refused_and_change_nothing(tiles, reason):
    sch = Schedule(attention(), target=hexir.Target("cuda -arch=sm_90"))
    block = sch.get_block("attention_values")
    before, trace = sch.func, sch.trace
    with pytest.raises(ScheduleError, match=reason):
        sch.flash_attention(block, *tiles)
    assert sch.func == before and sch.trace == trace


def test_a_kernel_that_is_not_the_attention_stages_alone_is_refused():
    sch = Schedule(attention())
    sch.compute_inline(sch.get_block("attention_exp"))
    with pytest.raises(ScheduleError, match="not the attention op's stages alone"):
        sch.flash_attention(sch.get_block("attention_values"), 64, 64, 2)
    sch = Schedule(hexir.workload("softmax", M=4, N=64))
    with pytest.raises(ScheduleError, match="attention_exp"):
        sch.flash_attention(sch.get_block("softmax_exp"), 64, 64, 2)


def test_the_search_draws_and_mutates_the_tiles():
    func = attention()
    target = hexir.Target("cuda -arch=sm_90")
    traces = sample(func, target, random.Random(0), 8)
    assert all("flash_attention" in str(t) for t in traces)
    drawn = {tuple(d for _, d in t.decisions) for t in traces}
    assert len(drawn) > 1
    rng = random.Random(1)
    children = [mutate(traces[0], rng, func) for _ in range(8)]
    assert any(c is not None and c.decisions != traces[0].decisions for c in children)


def test_a_paged_decode_step_is_the_nest_of_one_query_per_sequence_and_head():
    b = hexir.GraphBuilder("paged")
    operands = [
        b.input("q", (2, 3, 8)),
        b.input("k_pages", (6, 3, 4, 8)),
        b.input("v_pages", (6, 3, 4, 8)),
        b.input("block_table", (2, 5), "int32"),
        b.input("lengths", (2,), "int32"),
        b.input("k_new", (2, 3, 8)),
        b.input("v_new", (2, 3, 8)),
    ]
    func = lower(b.build(b.paged_attention(*operands)))
    sch = Schedule(func)
    sch.flash_attention(sch.get_block("paged_values"), 1, 8, 4)
    text = str(sch.func)
    for line in (
        "for %batch in 0..6 blockIdx.y",  # 2 sequences x 3 heads
        "for %key_tile in 0..3 serial",  # 5 pages of 4 slots and the current token: 21 keys
        "alloc %flash_keys: buffer<8x8xf32, shared>",
        "if %key_tile * 8 < %in4[floordiv(%batch, 3)] + 1",  # past the length: skipped
    ):
        assert line in text, line
    assert "paged_scores" not in text
    hexir.verify(sch.func)
    assert hexir.parse(text) == sch.func
