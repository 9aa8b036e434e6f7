#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#define HX_EXPORT __attribute__((visibility("default")))
typedef float hx_f32x16 __attribute__((vector_size(64)));
static inline hx_f32x16 hx_load_f32x16(const float* p) {
  hx_f32x16 r; __builtin_memcpy(&r, p, 64); return r;
}
static inline void hx_store_f32x16(float* p, hx_f32x16 x) { __builtin_memcpy(p, &x, 64); }

HX_EXPORT void axpb(float* restrict A, float* restrict B, float* restrict S, float* restrict Y) {
  {  // block axpb
    hx_store_f32x16(&Y[0], ((hx_load_f32x16(&A[0]) * S[0]) + hx_load_f32x16(&B[0])) + 0.5f);
  }
  for (int32_t i = 16; i < 20; ++i) {
    {  // block axpb
      Y[i] = ((A[i] * S[0]) + B[i]) + 0.5f;
    }
  }
}
