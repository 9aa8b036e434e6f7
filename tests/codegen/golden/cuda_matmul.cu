// grid (2, 2, 1), block (4, 2, 1), 192 bytes of shared memory
#define INFINITY __int_as_float(0x7f800000)
#define NAN __int_as_float(0x7fffffff)
#define INT32_MIN (-2147483647 - 1)
#define INT64_MIN (-9223372036854775807LL - 1)
#define INT64_C(x) x##LL
#define UINT32_C(x) x##U
#define UINT64_C(x) x##ULL

extern "C" __global__ void __launch_bounds__(8) matmul(const float* __restrict__ A, const float* __restrict__ B, float* __restrict__ C) {
  __shared__ __align__(16) float B_shared[32];
  __shared__ __align__(16) float A_shared[16];
  {  // blockIdx.y
    const int i0_0 = (int)blockIdx.y;
    {  // blockIdx.x
      const int i1_0 = (int)blockIdx.x;
      float C_local[4];
      {  // threadIdx.y
        {  // threadIdx.x
          {  // block matmul_init
            C_local[0] = 0.0f;
          }
          {  // block matmul_init
            C_local[1] = 0.0f;
          }
          {  // block matmul_init
            C_local[2] = 0.0f;
          }
          {  // block matmul_init
            C_local[3] = 0.0f;
          }
        }
      }
      for (int k0_0 = 0; k0_0 < 2; ++k0_0) {
        __syncthreads();
        for (int ax0_1_ax1_1_fused_0 = 0; ax0_1_ax1_1_fused_0 < 2; ++ax0_1_ax1_1_fused_0) {
          {  // threadIdx.y
            const int ax0_1_ax1_1_fused_1 = (int)threadIdx.y;
            {  // threadIdx.x
              const int ax0_1_ax1_1_fused_2 = (int)threadIdx.x;
              {  // block A_shared
                A_shared[((ax0_1_ax1_1_fused_0 * 8) + (ax0_1_ax1_1_fused_1 * 4)) + ax0_1_ax1_1_fused_2] = A[((((i0_0 * 32) + (ax0_1_ax1_1_fused_0 * 16)) + (ax0_1_ax1_1_fused_1 * 8)) + (k0_0 * 4)) + ax0_1_ax1_1_fused_2];
              }
            }
          }
        }
        for (int ax0_2_ax1_2_fused_0 = 0; ax0_2_ax1_2_fused_0 < 1; ++ax0_2_ax1_2_fused_0) {
          {  // threadIdx.y
            const int ax0_2_ax1_2_fused_1 = (int)threadIdx.y;
            {  // threadIdx.x
              const int ax0_2_ax1_2_fused_2 = (int)threadIdx.x;
              {  // vectorized ax0_2_ax1_2_fused_3: float4
                *reinterpret_cast<float4*>(&B_shared[(ax0_2_ax1_2_fused_1 * 16) + (ax0_2_ax1_2_fused_2 * 4)]) = *reinterpret_cast<const float4*>(&B[((((k0_0 * 64) + (ax0_2_ax1_2_fused_1 * 32)) + ((ax0_2_ax1_2_fused_2 / 2) * 16)) + (i1_0 * 8)) + ((ax0_2_ax1_2_fused_2 % 2) * 4)]);
              }
            }
          }
        }
        __syncthreads();
        {  // threadIdx.y
          const int i0_1 = (int)threadIdx.y;
          {  // threadIdx.x
            const int i1_1 = (int)threadIdx.x;
            for (int k0_1 = 0; k0_1 < 4; ++k0_1) {
              {  // block matmul
                C_local[0] = C_local[0] + (A_shared[(i0_1 * 8) + k0_1] * B_shared[(k0_1 * 8) + (i1_1 * 2)]);
              }
              {  // block matmul
                C_local[1] = C_local[1] + (A_shared[(i0_1 * 8) + k0_1] * B_shared[((k0_1 * 8) + (i1_1 * 2)) + 1]);
              }
              {  // block matmul
                C_local[2] = C_local[2] + (A_shared[((i0_1 * 8) + k0_1) + 4] * B_shared[(k0_1 * 8) + (i1_1 * 2)]);
              }
              {  // block matmul
                C_local[3] = C_local[3] + (A_shared[((i0_1 * 8) + k0_1) + 4] * B_shared[((k0_1 * 8) + (i1_1 * 2)) + 1]);
              }
            }
          }
        }
      }
      {  // threadIdx.y
        const int ax0_0 = (int)threadIdx.y;
        {  // threadIdx.x
          const int ax1_0 = (int)threadIdx.x;
          {  // block C_local
            C[(((i0_0 * 64) + (ax0_0 * 32)) + (i1_0 * 8)) + (ax1_0 * 2)] = C_local[0];
          }
          {  // block C_local
            C[((((i0_0 * 64) + (ax0_0 * 32)) + (i1_0 * 8)) + (ax1_0 * 2)) + 1] = C_local[1];
          }
          {  // block C_local
            C[((((i0_0 * 64) + (ax0_0 * 32)) + (i1_0 * 8)) + (ax1_0 * 2)) + 16] = C_local[2];
          }
          {  // block C_local
            C[((((i0_0 * 64) + (ax0_0 * 32)) + (i1_0 * 8)) + (ax1_0 * 2)) + 17] = C_local[3];
          }
        }
      }
    }
  }
}
