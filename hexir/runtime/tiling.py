"""The CPU's register tile: how many rows by how wide a panel of vectors a contraction's
innermost tile takes, from the target's vector width and register count.

    panel, rows = register_tile(columns, rows, Target("cpu"))

The default schedule and the CPU sketch tile by it (hexir/search/sketch_cpu.py), and the
compile-time layout of constant weights cuts them into its panels (hexir/graph/layout.py), so
both agree on the panel without the layout pass loading the search.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from hexir.runtime.target import Target

__all__ = ["MAX_UNROLLED_ROWS", "largest_divisor", "matrix_vector_block", "register_tile"]

MAX_UNROLLED_ROWS = 8
# The widest column panel of a matrix-vector product's blocked weight, in vectors: one
# accumulator a vector, enough independent multiply-add chains to hide their latency.
MATRIX_VECTOR_BLOCK_VECTORS = 4


def register_tile(vector: int, rows: int, target: Target, ragged: bool = True) -> tuple[int, int]:
    """The register tile (panel, rows) for a vector loop of extent `vector` by a row loop of
    extent `rows`: the most multiply-adds per reduction step the vector registers hold. A step
    keeps rows x panel/lanes accumulators, one vector of the packed operand per column vector,
    a broadcast and one spare in registers (AVX2's 16: 6 rows x 2 vectors; AVX-512's 32: 6 x
    4; a tile that fills every register spills: 4 x 3 vectors runs 0.84x 6 x 2 on AVX2);
    a two-vector panel also takes one row more where the rows are one or two such tiles,
    GCC then feeding one panel vector to the FMAs from memory (AVX2's 7 x 2 on the 7 and 14
    columns of a 1x1 conv's image: 2048x7x7 -> 512 at 1.4x, 512x7x7 -> 2048 at 1.4x,
    256x14x14 -> 1024 at 1.1x the 6 x 2 tile and its guarded tail; on 56 columns, where
    that tail is one tile in ten, 6 x 2 runs 1.1x 7 x 2, and 1.15x on 1024^3). The
    panel is a multiple of the lanes dividing `vector` (else its largest divisor up to four
    vectors); with `ragged` the rows need not divide `rows` (the last tile is guarded), and
    are scored by the multiply-adds per step averaged over the tiles, the guarded tail
    included; ties go to the tile that computes fewer guarded-off rows, then to the narrower
    panel (more rows: conv2d 64x56x56 runs 8 x 8 at 1.2x 32 x 2 on AVX2). The default schedule
    lets only a single reduction (matmul, dense, a 1x1 conv) be ragged: 6 x 2 runs 1024^3 at
    1.9x 4 x 2 on AVX2, and 1x1 convs at 1.6-1.9x 7 x 1 (256x14x14 -> 1024: 73% of peak).
    Without `ragged` (a conv), the most rows come first, then the widest panel: a conv's
    packed weight panel (channels x window x panel) outgrows L1 and streams from L2 once per
    register tile, a vector per step, so the bytes per multiply-add fall with the rows alone
    (AVX2, 3x3 conv 256x14x14: 7 rows x 1 vector 73% of peak, 2 x 4 vectors 41%; 128x28x28:
    7 x 1 74%, 4 x 2 71%)."""
    lanes, registers = target.vector_width, max(target.vector_registers, 16)
    panels = [v * lanes for v in range(1, 5) if vector % (v * lanes) == 0]
    if not panels and ragged and vector > 2 * lanes:
        panels = [2 * lanes]  # ragged columns too (ViT's 197): the last panel guarded
    elif not panels:
        panels = [largest_divisor(vector, 4 * lanes, multiple=lanes)]
    candidates = []
    for panel in panels:
        vectors = -(-panel // lanes)
        most = max(1, min(MAX_UNROLLED_ROWS, (registers - vectors - 2) // vectors, rows))
        candidates += [(panel, r) for r in range(1, most + 1) if ragged or rows % r == 0]
        # Every register taken (the FMA reads panel vectors from memory): only where the
        # guarded tail of `most` rows would waste a quarter of the tiles or more. Two vectors
        # wide, or four on AVX-512's 32 registers (7 rows x 4 + a broadcast: the 14-column
        # images of ResNet-50's 1x1 convs, 1.07-1.12x the 5 x 4 tile and its guarded row).
        extra = most + 1
        wide = vectors == 2 or (vectors == 4 and registers >= 32)
        if ragged and wide and extra <= MAX_UNROLLED_ROWS and rows in (extra, 2 * extra):
            candidates.append((panel, extra))

    def score(tile: tuple[int, int]) -> tuple[float, int, int]:
        panel, r = tile
        tiles = -(-rows // r)  # the last one guarded when r does not divide rows
        return -(-panel // lanes) * rows / tiles, rows - tiles * r, -panel

    def rows_first(tile: tuple[int, int]) -> tuple[int, int]:
        return tile[1], tile[0]

    return max(candidates, key=score if ragged else rows_first)


def largest_divisor(n: int, limit: int, multiple: int = 1) -> int:
    """The largest divisor of `n` up to `limit`, a multiple of `multiple` if any is."""
    divisors = [d for d in range(1, min(n, max(limit, 1)) + 1) if n % d == 0]
    return max((d for d in divisors if d % multiple == 0), default=max(divisors))


def matrix_vector_block(columns: int, target: Target) -> int:
    """The column panel a single row's constant [K, N] weight is laid out in ([N/b, K, b]),
    so that each panel, all K rows of it, is one contiguous stretch a core streams through
    with one accumulator a vector: the widest of MATRIX_VECTOR_BLOCK_VECTORS vectors, then
    narrower by half a vector, that divides the columns into more panels than the cores
    (their jobs: `sketch_cpu.default_tiles`); 0 where none does (the weight keeps [K, N]).

    Whole panels streamed one after another, where [K, N] had each job read its part of
    every row, a row apart, hold up where the weights crowd the caches: gpt2-decode, four
    weights of 28 MiB in all, 0.76 -> 0.27 ms end to end (its 768 x 3072 GEMV with GELU 0.39
    -> 0.15 ms in the model's profile); alone, warm in the L3, 768 x 3072 0.066 -> 0.051 ms,
    3072 x 768 0.068 -> 0.057. 1000 logits take panels of 40 (2.5 vectors): 1280 x 1000
    0.067 -> 0.053 ms warm, 0.28 -> 0.22 ms with six such weights taking turns (AVX-512,
    2 cores)."""
    half = target.vector_width // 2
    widest = MATRIX_VECTOR_BLOCK_VECTORS * target.vector_width
    cores = max(1, target.num_cores)
    fits = (b for b in range(widest, 0, -half) if columns % b == 0 and columns // b > cores)
    return next(fits, 0)
