#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#define HX_EXPORT __attribute__((visibility("default")))
typedef float hx_f32x16 __attribute__((vector_size(64)));
static inline hx_f32x16 hx_load_f32x16(const float* p) {
  hx_f32x16 r; __builtin_memcpy(&r, p, 64); return r;
}
typedef int32_t hx_i32x16 __attribute__((vector_size(64)));
static inline hx_f32x16 hx_select_f32x16(hx_i32x16 c, hx_f32x16 a, hx_f32x16 b) {
  return (hx_f32x16)(((hx_i32x16)a & c) | ((hx_i32x16)b & ~c));
}
static inline hx_f32x16 hx_abs_f32x16(hx_f32x16 a) { return (hx_f32x16)((hx_i32x16)a & INT32_MAX); }
static inline hx_f32x16 hx_splat_f32x16(float s) { return (hx_f32x16){s, s, s, s, s, s, s, s, s, s, s, s, s, s, s, s}; }
static inline hx_f32x16 hx_erf_f32x16(hx_f32x16 x) {
  /* a + a P(a^2) below 0.875, 1 - erfc's polynomials in a - 1.5 and a - 3 above (a = |x|);
     x's sign */
  hx_f32x16 a = hx_abs_f32x16(x), z = a * a, t = a - 1.5f, u = a - 3.0f;
  hx_f32x16 p = -0.0006203255f * z + 0.0050321813f;
  p = p * z - 0.026791463f;
  p = p * z + 0.11282455f;
  p = p * z - 0.3761255f;
  p = p * z + 0.12837915f;
  hx_f32x16 q = 0.00013042685f * t - 0.0014417974f;
  q = q * t + 0.0022792632f;
  q = q * t + 0.0046348255f;
  q = q * t - 0.019292198f;
  q = q * t + 0.014886065f;
  q = q * t + 0.044593748f;
  q = q * t - 0.13875353f;
  q = q * t + 0.17839569f;
  q = q * t - 0.11893026f;
  q = q * t + 0.03389485f;
  hx_f32x16 w = -1.2683269e-05f * u + 2.6381015e-06f;
  w = w * u + 0.00012682313f;
  w = w * u - 0.000400109f;
  w = w * u + 0.00074265455f;
  w = w * u - 0.0010140585f;
  w = w * u + 0.0010433912f;
  w = w * u - 0.00078937726f;
  w = w * u + 0.00041783325f;
  w = w * u - 0.00013924399f;
  w = w * u + 2.2089653e-05f;
  hx_f32x16 big = 1.0f - hx_select_f32x16(a < 2.25f, q, w);
  big = hx_select_f32x16(a >= 3.919206f, hx_splat_f32x16(1.0f), big);  /* erf rounds to 1 */
  hx_f32x16 r = hx_select_f32x16(a < 0.875f, a * p + a, big);
  return (hx_f32x16)((hx_i32x16)r | ((hx_i32x16)x & INT32_MIN));  /* x's sign, -0 too */
}
static inline void hx_store_f32x16(float* p, hx_f32x16 x) { __builtin_memcpy(p, &x, 64); }

HX_EXPORT void gelu(float* restrict A, float* restrict B) {
  {  // block gelu
    hx_store_f32x16(&B[0], (0.5f * hx_load_f32x16(&A[0])) * (1.0f + hx_erf_f32x16((hx_load_f32x16(&A[0]) * 0.70710677f))));
  }
  {  // block gelu
    hx_store_f32x16(&B[16], (0.5f * hx_load_f32x16(&A[16])) * (1.0f + hx_erf_f32x16((hx_load_f32x16(&A[16]) * 0.70710677f))));
  }
}
