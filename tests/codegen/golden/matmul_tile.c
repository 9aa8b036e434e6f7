#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#define HX_EXPORT __attribute__((visibility("default")))
typedef float hx_f32x16 __attribute__((vector_size(64)));
static inline hx_f32x16 hx_load_f32x16(const float* p) {
  hx_f32x16 r; __builtin_memcpy(&r, p, 64); return r;
}
static inline void hx_storea_f32x16(float* p, hx_f32x16 x) {
  __builtin_memcpy(__builtin_assume_aligned(p, 64), &x, 64);
}
static inline hx_f32x16 hx_splat_f32x16(float s) { return (hx_f32x16){s, s, s, s, s, s, s, s, s, s, s, s, s, s, s, s}; }
static inline hx_f32x16 hx_loada_f32x16(const float* p) {
  hx_f32x16 r; __builtin_memcpy(&r, __builtin_assume_aligned(p, 64), 64); return r;
}
static inline void hx_store_f32x16(float* p, hx_f32x16 x) { __builtin_memcpy(p, &x, 64); }

HX_EXPORT void matmul(float* restrict A, float* restrict B, float* restrict C) {
  for (int32_t i1_0 = 0; i1_0 < 1; ++i1_0) {
    float B_global[64] __attribute__((aligned(64)));
    for (int32_t ax0_1 = 0; ax0_1 < 4; ++ax0_1) {
      {  // block B_global
        hx_storea_f32x16(&B_global[ax0_1 * 16], hx_load_f32x16(&B[ax0_1 * 16]));
      }
    }
    for (int32_t i0_0 = 0; i0_0 < 2; ++i0_0) {
      hx_f32x16 C_local[2][1];
      {  // block matmul_init
        C_local[0][0] = hx_splat_f32x16(0.0f);
      }
      {  // block matmul_init
        C_local[1][0] = hx_splat_f32x16(0.0f);
      }
      for (int32_t k0 = 0; k0 < 4; ++k0) {
        {  // block matmul
          C_local[0][0] = C_local[0][0] + (A[(i0_0 * 8) + k0] * hx_loada_f32x16(&B_global[k0 * 16]));
        }
        {  // block matmul
          C_local[1][0] = C_local[1][0] + (A[((i0_0 * 8) + k0) + 4] * hx_loada_f32x16(&B_global[k0 * 16]));
        }
      }
      {  // block C_local
        hx_store_f32x16(&C[i0_0 * 32], C_local[0][0]);
      }
      {  // block C_local
        hx_store_f32x16(&C[(i0_0 * 32) + 16], C_local[1][0]);
      }
    }
  }
}
