"""flash_attention: an `attention` kernel's stages (hexir/ops/attention.py), or a
`paged_attention` kernel's (a decode step over the paged KV cache: one query per sequence
and head), replaced by one online-softmax nest for the GPU (hexir/schedule/flash_nest.py),
which holds no scores of all queries against all keys. What the kernel computes is read off
its stages (hexir/schedule/flash_match.py).

    b0 = sch.get_block(name="attention_values")
    v1 = sch.sample_categorical(candidates=[16, 32, 64, 128], probs=[...], decision=2)
    v2 = sch.sample_categorical(candidates=[16, 32, 64, 128], probs=[...], decision=2)
    v3 = sch.sample_categorical(candidates=[1, 2, 4, 8], probs=[...], decision=1)
    b4, b5 = sch.flash_attention(block=b0, query_tile=v1, key_tile=v2, lanes=v3)
    sch.storage_align(block=b4, buffer_index=0, axis=0, factor=32, offset=1)
    sch.storage_align(block=b5, buffer_index=0, axis=0, factor=32, offset=1)

A thread block takes `query_tile` query rows of one batch (blockIdx.x: the tiles of rows,
blockIdx.y: the batch), `lanes` threads a row (threadIdx.y: the row, threadIdx.x: the lane).
Each thread holds its row's query and its share of the row's running max, running sum and
output accumulator. Per tile of `key_tile` keys (a serial loop):

1. the block's threads copy the tile's keys and values to shared memory together (the two
   blocks returned: a schedule may pad their rows, which the lanes of a row read side by
   side); keys are kept as columns ([D, key_tile]) where that is how they lie in memory
   (the attention op's kt), else as rows (the paged cache's);
2. each lane scores its row's query against keys lane, lane + lanes, ... of the tile (in
   registers) and makes them the op's logits (the expression of its max stage: scale,
   bias, causal mask, a sequence's length); a key past the last is hidden;
3. the tile's max of each row: a cross-thread max over its lanes;
4. each lane rescales its sum and accumulator by exp(old max - new max) and adds its keys'
   exp(logit - new max), times their values to the accumulator (a max still -inf, every key
   so far hidden, subtracts 0: nothing is rescaled from nothing).

Last, each row's sums and accumulators are summed over its lanes (cross-thread) into the
output, accumulator times 1 / sum as the out stage has it. Tiles that the block's last query
does not see (causal attention; a sequence's keys past its length) are skipped; the diagonal
tile is masked by the logit. The trace replays on the op's own kernel (its workload is
unchanged), and on the CPU the nest runs serially (DESIGN.md §3) and computes the same
values up to rounding.
"""

from __future__ import annotations

from dataclasses import replace

from hexir.errors import ScheduleError
from hexir.schedule.common import schedule_error
from hexir.schedule.flash_match import match
from hexir.schedule.flash_nest import FETCHES, Attention, Tiles, flash_nest, shared_bytes
from hexir.schedule.state import ScheduleBase, primitive
from hexir.schedule.trace import BlockRV, ExprRV

STATIC_SHARED = 48 * 1024  # without a target: CUDA's static __shared__ limit


class FlashPrimitives(ScheduleBase):
    @primitive
    def flash_attention(
        self,
        block: BlockRV,
        query_tile: int | ExprRV,
        key_tile: int | ExprRV,
        lanes: int | ExprRV,
    ) -> list[BlockRV]:
        """The attention kernel holding `block` (one of its stages) as the online-softmax
        nest of the module docstring; returns its blocks that copy a tile of keys and of
        values to shared memory. Refuses a kernel whose blocks are not an attention or
        paged_attention op's stages alone (a fused producer or consumer), tiles that are not
        positive, `lanes` not dividing `key_tile`, more threads (query_tile x lanes) than the
        target allows, and tiles whose shared memory exceeds its static limit (48 KB
        without a target)."""
        self._block(block, "flash_attention")
        tiles = Tiles(*(self._int(x, "flash_attention") for x in (query_tile, key_tile, lanes)))
        attention = match(self.func)
        self._check(attention, tiles)
        taken = {p.name for p in self.func.params}
        func = replace(self.func, body=flash_nest(attention, tiles, taken))
        inputs = (("block", block), ("query_tile", query_tile), ("key_tile", key_tile))
        outs = [(BlockRV, name) for name in FETCHES]
        return self._commit("flash_attention", (*inputs, ("lanes", lanes)), (), func, outs)  # type: ignore[return-value]

    def _check(self, a: Attention, t: Tiles) -> None:
        def fail(reason: str) -> ScheduleError:
            return schedule_error("flash_attention", f"tiles {t}: {reason}", self.func)

        if min(t.queries, t.keys, t.lanes) < 1 or t.keys % t.lanes:
            raise fail("each positive, and the lanes dividing the keys of a tile")
        threads = getattr(self.target, "max_threads_per_block", None) or 1024
        if t.queries * t.lanes > threads:
            raise fail(f"{t.queries * t.lanes} threads a block, over the limit of {threads}")
        limit = getattr(self.target, "max_shared_memory_per_block", None) or STATIC_SHARED
        if shared_bytes(a, t) > limit:
            raise fail(f"{shared_bytes(a, t)} bytes of shared memory, over the limit of {limit}")
