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
static inline void hx_store_f32x16(float* p, hx_f32x16 x) { __builtin_memcpy(p, &x, 64); }

HX_EXPORT void leaky(float* restrict A, float* restrict B) {
  {  // block leaky
    hx_store_f32x16(&B[0], hx_select_f32x16((hx_load_f32x16(&A[0]) > 0.0f), hx_load_f32x16(&A[0]), (hx_load_f32x16(&A[0]) * 0.125f)));
  }
  {  // block leaky
    hx_store_f32x16(&B[16], hx_select_f32x16((hx_load_f32x16(&A[16]) > 0.0f), hx_load_f32x16(&A[16]), (hx_load_f32x16(&A[16]) * 0.125f)));
  }
  {  // block leaky
    hx_store_f32x16(&B[32], hx_select_f32x16((hx_load_f32x16(&A[32]) > 0.0f), hx_load_f32x16(&A[32]), (hx_load_f32x16(&A[32]) * 0.125f)));
  }
  {  // block leaky
    hx_store_f32x16(&B[48], hx_select_f32x16((hx_load_f32x16(&A[48]) > 0.0f), hx_load_f32x16(&A[48]), (hx_load_f32x16(&A[48]) * 0.125f)));
  }
}
