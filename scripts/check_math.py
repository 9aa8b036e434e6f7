"""Measure the vector math helpers (hexir/codegen/c_math.py) on every float32 input.

    python scripts/check_math.py [--lanes 8] [--step 1] [--cflags "-mno-fma"] [exp log ...]

The helpers the printer emits, compiled with the system C compiler (the flags hexir uses for
this machine, then --cflags) into a C program that runs each over all 2^32 float32 bit
patterns (every --step-th one) and compares with the C library's double-precision function
rounded to float32: the largest error in ulp, where, and how many inputs are beyond 1 ulp.
pow runs over a grid: every --step*65537th x against 500 exponents (special values,
integers, random). OpenMP uses every core; a full run takes a few minutes per function.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path
from types import SimpleNamespace

from hexir import knobs
from hexir.codegen.c import CPrinter
from hexir.runtime.cc import compile_flags
from hexir.runtime.target import Target

# The double-precision reference of each unary helper.
UNARY = {
    "exp": "exp(x)",
    "log": "log(x)",
    "tanh": "tanh(x)",
    "sigmoid": "1.0 / (1.0 + exp(-x))",
    "erf": "erf(x)",
    "sqrt": "sqrt(x)",
    "rsqrt": "1.0 / sqrt(x)",
}

ULPS = r"""
/* |got - r| in float32 ulp at r; 1e9 where they disagree on inf, NaN or the sign of 0 */
static double ulps(float got, double r) {
  if (isnan(r) || isnan(got)) return isnan(r) && isnan(got) ? 0 : 1e9;
  float rf = (float)r;
  if (isinf(rf) || isinf(got)) return got == rf ? 0 : 1e9;
  if (rf == 0 && got == 0 && r == 0) return !signbit(got) == !signbit(r) ? 0 : 1e9;
  int e = fabs(r) < 0x1p-126 ? -126 : ilogb(r);
  return fabs((double)got - r) / ldexp(1.0, e - 23);
}
typedef struct { double worst; float at, at_y; long over; } result;
static void report(const char* name, result* rs, int n) {
  result w = {0};
  long over = 0;
  for (int t = 0; t < n; ++t) { over += rs[t].over; if (rs[t].worst >= w.worst) w = rs[t]; }
  printf("%-8s %8.3f ulp at x = %.9g (y = %.9g), %ld beyond 1 ulp\n", name, w.worst, w.at,
         w.at_y, over);
  fflush(stdout);
}
"""

UNARY_MAIN = r"""
static double ref_NAME(double x) { return REF; }
static void check_NAME(long step) {
  result rs[256] = {{0}};
  #pragma omp parallel for schedule(dynamic, 1024)
  for (long base = 0; base < (1L << 32); base += LANES * step) {
    result* me = &rs[omp_get_thread_num() % 256];
    VF x;
    for (int k = 0; k < LANES; ++k) {
      uint32_t b = (uint32_t)(base + k * step);
      memcpy(&x[k], &b, 4);
    }
    VF y = hx_NAME_SV(x);
    for (int k = 0; k < LANES; ++k) {
      double e = ulps(y[k], ref_NAME((double)x[k]));
      me->over += e > 1.0;
      if (e > me->worst) { me->worst = e; me->at = x[k]; }
    }
  }
  report("NAME", rs, 256);
}
"""

POW_MAIN = r"""
static void check_pow(long step) {
  float ys[512]; int ny = 0;
  const float special[] = {0.0f, -0.0f, 1.0f, -1.0f, 2.0f, -2.0f, 3.0f, -3.0f, 0.5f, -0.5f,
    1.5f, -1.5f, INFINITY, -INFINITY, NAN, 16777216.0f, 16777218.0f, 8388609.0f, -8388609.0f,
    1e10f, -1e10f, 1e-10f, 1e30f, -1e30f, 127.0f, 128.0f, -149.0f, 0.99999994f, 1.0000001f};
  for (unsigned k = 0; k < sizeof special / sizeof special[0]; ++k) ys[ny++] = special[k];
  for (int k = -40; k <= 40; ++k) ys[ny++] = (float)k;
  srand(1);
  while (ny < 500) ys[ny++] = (float)((rand() / (double)RAND_MAX - 0.5) * (ny % 2 ? 100 : 6));
  result rs[256] = {{0}};
  step *= 65537;
  #pragma omp parallel for schedule(dynamic, 16)
  for (long base = 0; base < (1L << 32); base += LANES * step) {
    result* me = &rs[omp_get_thread_num() % 256];
    VF x;
    for (int k = 0; k < LANES; ++k) {
      uint32_t b = (uint32_t)(base + k * step);
      memcpy(&x[k], &b, 4);
    }
    for (int j = 0; j < ny; ++j) {
      VF y = (VF){0} + ys[j], r = hx_pow_SV(x, y);
      for (int k = 0; k < LANES; ++k) {
        double e = ulps(r[k], pow((double)x[k], (double)ys[j]));
        me->over += e > 1.0;
        if (e > me->worst) { me->worst = e; me->at = x[k]; me->at_y = ys[j]; }
      }
    }
  }
  report("pow", rs, 256);
}
"""


def program(names: list[str], lanes: int, step: int) -> str:
    printer = CPrinter(SimpleNamespace(vector_width=lanes))  # type: ignore[arg-type]
    sv = f"f32x{lanes}"
    for name in names:
        printer.vector_helper(name, "float32", lanes)
    parts = [
        "#include <math.h>\n#include <omp.h>\n#include <stdbool.h>\n#include <stdint.h>",
        "#include <stdio.h>\n#include <stdlib.h>\n#include <string.h>",
        f"#define LANES {lanes}",
        *printer._helpers.values(),  # the preamble the printer would emit
        f"typedef hx_{sv} VF;",
        ULPS,
    ]
    for name in names:
        if name == "pow":
            parts.append(POW_MAIN.replace("SV", sv))
        else:
            parts.append(
                UNARY_MAIN.replace("NAME", name).replace("SV", sv).replace("REF", UNARY[name])
            )
    calls = "".join(f"  check_{name}({step});\n" for name in names)
    parts.append(f"int main(void) {{\n{calls}  return 0;\n}}")
    return "\n".join(parts)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", default=[*UNARY, "pow"])
    parser.add_argument("--lanes", type=int, default=Target("cpu").vector_width)
    parser.add_argument("--step", type=int, default=1)
    parser.add_argument("--cflags", default="")
    args = parser.parse_args()
    source = program(args.names, args.lanes, args.step)
    flags = [f for f in compile_flags(Target("cpu")) if f not in ("-shared", "-fPIC")]
    with tempfile.TemporaryDirectory() as tmp:
        c_file, exe = Path(tmp) / "check_math.c", Path(tmp) / "check_math"
        c_file.write_text(source)
        cc = [knobs.get().cc, *flags, *args.cflags.split(), "-Wno-psabi", "-o", str(exe)]
        subprocess.run([*cc, str(c_file), "-lm"], check=True)
        print(f"{args.lanes} lanes, every {args.step}th input, {' '.join(cc[1:-2])}")
        sys.stdout.flush()
        subprocess.run([str(exe)], check=True)


if __name__ == "__main__":
    main()
