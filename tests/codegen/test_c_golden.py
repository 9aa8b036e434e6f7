"""Golden C for three small schedules: a change in what the printer emits shows in review.

Regenerate after a deliberate change with `python tests/codegen/test_c_golden.py` and read
the diff before committing it.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

import hexir
from hexir import knobs
from hexir.codegen.c import generate_c
from hexir.ops.numeric import erf
from hexir.runtime.build import build

HERE = Path(__file__).parent / "golden"

# 1. A vectorized loop of 20 fp32 lanes: one 16-lane chunk, a 4-element scalar tail; a
#    unit-stride load, a broadcast one, a constant.
AXPB = """
hextir.func @axpb(%A: buffer<20xf32>, %B: buffer<20xf32>, %S: buffer<1xf32>,
                  %Y: buffer<20xf32>) {
  for %i in 0..20 vectorized {
    block @axpb(vi = spatial(20) %i) reads(%A[vi], %B[vi], %S[0]) writes(%Y[vi]) {
      %Y[vi] = %A[vi] * %S[0] + %B[vi] + 0.5
    }
  }
}
"""

# 2. Rows unrolled around a vectorized leaky relu: straight-line vector code, a mask blend.
LEAKY = """
hextir.func @leaky(%A: buffer<2x32xf32>, %B: buffer<2x32xf32>) {
  for %i in 0..2 unrolled {
    for %j in 0..32 vectorized {
      block @leaky(vi = spatial(2) %i, vj = spatial(32) %j) reads(%A[vi, vj]) writes(%B[vi, vj]) {
        %B[vi, vj] = select(%A[vi, vj] > 0.0, %A[vi, vj], %A[vi, vj] * 0.125)
      }
    }
  }
}
"""

# 3. The CPU matmul schedule, compacted: B packed per panel, a 2x16 accumulator tile in
#    registers, the k loop outside the unrolled rows.
MATMUL = (Path(__file__).parent / "golden" / "matmul_tile.hextir").read_text()

# 4. A vectorized gelu: erf as a SIMD helper (hexir/codegen/c_math.py) and the helpers it calls,
#    two 16-lane chunks in straight-line code.
GELU = """
hextir.func @gelu(%A: buffer<32xf32>, %B: buffer<32xf32>) {
  for %i in 0..32 vectorized {
    block @gelu(vi = spatial(32) %i) reads(%A[vi]) writes(%B[vi]) {
      %B[vi] = 0.5 * %A[vi] * (1.0 + erf(%A[vi] * 0.70710677))
    }
  }
}
"""

CASES = {"axpb": AXPB, "leaky": LEAKY, "matmul_tile": MATMUL, "gelu": GELU}


@pytest.fixture(scope="module", autouse=True)
def _cache(tmp_path_factory):
    with knobs.scope(cache_dir=str(tmp_path_factory.mktemp("cache"))):
        yield


@pytest.mark.parametrize("name", CASES)
def test_golden_source(name):
    source = generate_c(hexir.parse(CASES[name]))
    assert source == (HERE / f"{name}.c").read_text()


@pytest.mark.parametrize("name", CASES)
def test_golden_kernel_runs(name, rng):
    func = hexir.parse(CASES[name])
    inputs = [rng.standard_normal(b.shape, dtype=np.float32) for b in func.inputs]
    out = np.full(func.outputs[0].shape, np.nan, np.float32)
    build(func)(*inputs, out)
    expect = {
        "axpb": lambda a, b, s: a * s[0] + b + np.float32(0.5),
        "leaky": lambda a: np.where(a > 0, a, a * np.float32(0.125)),
        "matmul_tile": lambda a, b: a @ b,
        "gelu": lambda a: 0.5 * a * (1 + erf(a * np.float32(0.70710677))),
    }[name](*inputs)
    np.testing.assert_allclose(out, expect, rtol=1e-5, atol=1e-6)


if __name__ == "__main__":
    for name, text in CASES.items():
        (HERE / f"{name}.c").write_text(generate_c(hexir.parse(text)))
        print(f"wrote {HERE / name}.c", file=sys.stderr)
