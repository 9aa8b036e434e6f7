"""A tensorized tile nest (`TileIntrinsic`, hexir/schedule/tensorize.py) as C: one call of a
helper that holds the nest's accumulators in AMX tile registers over its whole reduction.

    hx_amx_bf16(&c, c_row, c_panel, &a, a_row, &b, b_step, b_panel, rows, panels, steps);

(strides in bytes). The helper configures the tiles for its rows and panels (only where the
thread's configuration differs: another kernel may have changed it), loads the accumulators,
multiplies tile by tile over the reduction and stores them back. A process must ask Linux
for the tile registers before its first tile instruction (`hx_amx_ready`, once); where it is
refused, or the compiler does not target AMX, the nest runs as the loops it is.
"""

from __future__ import annotations

from hexir.ir.dtype import itemsize
from hexir.schedule.tensorize import AMX_BF16, AMX_INT8, TileIntrinsic
from hexir.schedule.tensorize_tile import TileMatch

# The process-wide permission (Linux's arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA),
# hexir/runtime/target.py) and the thread's tile configuration: tiles 0-3 the accumulators
# (rows 0-15 and 16-31, panels 0 and 1), 4-5 a's two row tiles, 6-7 b's two panels.
AMX_COMMON = """typedef struct {
  uint8_t palette, start_row, reserved[14];
  uint16_t colsb[16];
  uint8_t rows[16];
} hx_tilecfg_t;
extern long syscall(long number, ...);
static inline int hx_amx_ready(void) {
  static int state;  /* 0: not asked yet; 1: granted; -1: refused */
  int now = __atomic_load_n(&state, __ATOMIC_RELAXED);
  if (now == 0) {
    now = syscall(158, 0x1023, 18) == 0 ? 1 : -1;
    __atomic_store_n(&state, now, __ATOMIC_RELAXED);
  }
  return now > 0;
}
static inline void hx_tile_rows(hx_tilecfg_t* cfg, int tile, int rows) {
  cfg->rows[tile] = rows;
  cfg->colsb[tile] = rows ? 64 : 0;
}
static inline void hx_amx_config(int rows, int panels) {
  hx_tilecfg_t want, have;
  __builtin_memset(&want, 0, sizeof want);
  int top = rows < 16 ? rows : 16, rest = rows - top;
  want.palette = 1;
  for (int p = 0; p < panels; ++p) {
    hx_tile_rows(&want, p, top);
    hx_tile_rows(&want, 2 + p, rest);
    hx_tile_rows(&want, 6 + p, 16);
  }
  hx_tile_rows(&want, 4, top);
  hx_tile_rows(&want, 5, rest);
  _tile_storeconfig(&have);
  if (__builtin_memcmp(&want, &have, sizeof want)) _tile_loadconfig(&want);
}"""

_MULTIPLY = """static inline void {name}(void* c, int64_t c_row, int64_t c_panel, const void* a,
    int64_t a_row, const void* b, int64_t b_step, int64_t b_panel, int64_t rows, int panels,
    int64_t steps) {{
  if (rows <= 0) return;
  hx_amx_config(rows, panels);
  char* c0 = (char*)c;
  char* c1 = c0 + 16 * c_row;
  const char* a0 = (const char*)a;
  const char* b0 = (const char*)b;
  int both_rows = rows > 16, both_panels = panels > 1;
  _tile_loadd(0, c0, c_row);
  if (both_panels) _tile_loadd(1, c0 + c_panel, c_row);
  if (both_rows) _tile_loadd(2, c1, c_row);
  if (both_rows && both_panels) _tile_loadd(3, c1 + c_panel, c_row);
  if (both_rows && both_panels) {{  /* the full tile: every load first, then the products */
    for (int64_t s = 0; s < steps; ++s) {{
      const char* as = a0 + 64 * s;
      const char* bs = b0 + 16 * b_step * s;
      _tile_loadd(4, as, a_row);
      _tile_loadd(5, as + 16 * a_row, a_row);
      _tile_loadd(6, bs, b_step);
      _tile_loadd(7, bs + b_panel, b_step);
      {op}(0, 4, 6);
      {op}(1, 4, 7);
      {op}(2, 5, 6);
      {op}(3, 5, 7);
    }}
  }} else for (int64_t s = 0; s < steps; ++s) {{
    const char* as = a0 + 64 * s;
    const char* bs = b0 + 16 * b_step * s;
    _tile_loadd(4, as, a_row);
    _tile_loadd(6, bs, b_step);
    {op}(0, 4, 6);
    if (both_panels) {{
      _tile_loadd(7, bs + b_panel, b_step);
      {op}(1, 4, 7);
    }}
    if (both_rows) {{
      _tile_loadd(5, as + 16 * a_row, a_row);
      {op}(2, 5, 6);
      if (both_panels) {op}(3, 5, 7);
    }}
  }}
  _tile_stored(0, c0, c_row);
  if (both_panels) _tile_stored(1, c0 + c_panel, c_row);
  if (both_rows) _tile_stored(2, c1, c_row);
  if (both_rows && both_panels) _tile_stored(3, c1 + c_panel, c_row);
}}"""

# By intrinsic and a's dtype: the helper's name, the compiler's feature macro, the instruction.
_TILE_CALLS = {
    (AMX_BF16.name, "bfloat16"): ("hx_amx_bf16", "__AMX_BF16__", "_tile_dpbf16ps"),
    (AMX_INT8.name, "uint8"): ("hx_amx_u8s8", "__AMX_INT8__", "_tile_dpbusd"),
    (AMX_INT8.name, "int8"): ("hx_amx_s8u8", "__AMX_INT8__", "_tile_dpbsud"),
}


def tile_helpers(intrinsic: TileIntrinsic, found: TileMatch) -> tuple[str, str, dict[str, str]]:
    """The helper's name, the preprocessor condition it compiles under, and the helpers'
    sources by name, each under its condition (the shared configuration, then the multiply)."""
    name, feature, op = _TILE_CALLS[(intrinsic.name, found.a.buffer.dtype)]
    condition = f"defined(__AMX_TILE__) && defined({feature})"
    sources = {
        "hx_amx": f"#if defined(__AMX_TILE__)\n{AMX_COMMON}\n#endif",
        name: f"#if {condition}\n{_MULTIPLY.format(name=name, op=op)}\n#endif",
    }
    return name, condition, sources


def tile_arguments(found: TileMatch, access: dict[str, str], rows: str) -> str:
    """The helper's arguments after its name: `access` the C of the three tiles' first
    elements (acc, a, b), `rows` the C of the rows count."""
    s = found.strides
    c, a, b = (itemsize(x.buffer.dtype) for x in (found.acc, found.a, found.b))
    return (
        f"&{access['acc']}, {s['c_row'] * c}, {s['c_panel'] * c}, &{access['a']}, "
        f"{s['a_row'] * a}, &{access['b']}, {s['b_step'] * b}, {s['b_panel'] * b}, {rows}, "
        f"{found.panels}, {found.depth}"
    )
