// grid (2, 1, 1), block (64, 1, 1), 16 bytes of shared memory
#define INFINITY __int_as_float(0x7f800000)
#define NAN __int_as_float(0x7fffffff)
#define INT32_MIN (-2147483647 - 1)
#define INT64_MIN (-9223372036854775807LL - 1)
#define INT64_C(x) x##LL
#define UINT32_C(x) x##U
#define UINT64_C(x) x##ULL
static __device__ __forceinline__ float hx_max_f32(float a, float b) { return a > b ? a : b; }

extern "C" __global__ void __launch_bounds__(64) softmax(const float* __restrict__ X, float* __restrict__ Y) {
  __shared__ __align__(16) float softmax_sum[1];
  __shared__ __align__(16) float softmax_max[1];
  __shared__ float red_scratch_f32[2];
  {  // blockIdx.x
    const int i4 = (int)blockIdx.x;
    {  // threadIdx.x
      const int k0_1 = (int)threadIdx.x;
      float softmax_max_red[1];
      softmax_max_red[0] = (-INFINITY);
      for (int k0_0 = 0; k0_0 < 1; ++k0_0) {
        {  // block softmax_max
          if (k0_1 < 40) {
            softmax_max_red[0] = hx_max_f32(softmax_max_red[0], X[(i4 * 40) + k0_1]);
          }
        }
      }
      {  // all-reduce (max) over threadIdx.x
        float red = softmax_max_red[0];
        #pragma unroll
        for (int offset = 16; offset > 0; offset >>= 1) {
          red = hx_max_f32(red, __shfl_xor_sync(0xffffffffu, red, offset, 32));
        }
        if ((threadIdx.x & 31) == 0) red_scratch_f32[(threadIdx.y + 1 * threadIdx.z) * 2 + (threadIdx.x >> 5)] = red;
        __syncthreads();
        red = (threadIdx.x & 31) < 2 ? red_scratch_f32[(threadIdx.y + 1 * threadIdx.z) * 2 + (threadIdx.x & 31)] : (-INFINITY);
        #pragma unroll
        for (int offset_1 = 16; offset_1 > 0; offset_1 >>= 1) {
          red = hx_max_f32(red, __shfl_xor_sync(0xffffffffu, red, offset_1, 32));
        }
        __syncthreads();
        softmax_max_red[0] = red;
      }
      if (k0_1 == 0) {
        softmax_max[0] = (-INFINITY);
        softmax_max[0] = hx_max_f32(softmax_max[0], softmax_max_red[0]);
      }
    }
    __syncthreads();
    {  // threadIdx.x
      const int k1_1 = (int)threadIdx.x;
      float softmax_sum_red[1];
      softmax_sum_red[0] = 0.0f;
      for (int k1_0 = 0; k1_0 < 1; ++k1_0) {
        {  // block softmax_sum
          if (k1_1 < 40) {
            softmax_sum_red[0] = softmax_sum_red[0] + expf((X[(i4 * 40) + k1_1] - softmax_max[0]));
          }
        }
      }
      {  // all-reduce (+) over threadIdx.x
        float red_1 = softmax_sum_red[0];
        #pragma unroll
        for (int offset_2 = 16; offset_2 > 0; offset_2 >>= 1) {
          red_1 = red_1 + __shfl_xor_sync(0xffffffffu, red_1, offset_2, 32);
        }
        if ((threadIdx.x & 31) == 0) red_scratch_f32[(threadIdx.y + 1 * threadIdx.z) * 2 + (threadIdx.x >> 5)] = red_1;
        __syncthreads();
        red_1 = (threadIdx.x & 31) < 2 ? red_scratch_f32[(threadIdx.y + 1 * threadIdx.z) * 2 + (threadIdx.x & 31)] : 0.0f;
        #pragma unroll
        for (int offset_3 = 16; offset_3 > 0; offset_3 >>= 1) {
          red_1 = red_1 + __shfl_xor_sync(0xffffffffu, red_1, offset_3, 32);
        }
        __syncthreads();
        softmax_sum_red[0] = red_1;
      }
      if (k1_1 == 0) {
        softmax_sum[0] = 0.0f;
        softmax_sum[0] = softmax_sum[0] + softmax_sum_red[0];
      }
    }
    __syncthreads();
    {  // threadIdx.x
      const int i5_1 = (int)threadIdx.x;
      for (int i5_0 = 0; i5_0 < 1; ++i5_0) {
        {  // block softmax_norm
          if (i5_1 < 40) {
            Y[(i4 * 40) + i5_1] = expf((X[(i4 * 40) + i5_1] - softmax_max[0])) * (1.0f / softmax_sum[0]);
          }
        }
      }
    }
  }
}
