// The adversarial gallery: RMSNorm kernels (fp16 x and w, one CTA of 256 threads per row) that are
// each wrong in one way the gate must catch. VARIANT is defined by the harness; GOOD is correct.
#include <cuda_fp16.h>

#define GOOD 0
#define ZEROS 1          // (a) writes zeros
#define SKIP_TAIL 2      // (b) skips the last partial vector of each row
#define UNWRITTEN 3      // (c) leaves some rows unwritten
#define OVERRUN 4        // (d) writes past the end of the output
#define FP16_ACC 5       // (e) accumulates x^2 in fp16 and overflows
#define SPIN 6           // (f) spins forever
#define FAULT 7          // (g) illegal address
#define FIRST_ONLY 8     // (h) right answer on the first launch only
#define RACE 9           // (i) missing barrier in the reduction

__device__ unsigned int kf_blocks_done;

extern "C" __global__ void __launch_bounds__(256) gallery(const __half* x, const __half* w, __half* y, int M, int N, float eps) {
  __shared__ float part[8];
  __shared__ float rstd_s;
  const int row = blockIdx.x;
#if VARIANT == FIRST_ONLY
  if (kf_blocks_done >= gridDim.x) return;  // every later launch skips the work
#endif
#if VARIANT == UNWRITTEN
  if (row % 7 == 3) return;
#endif
#if VARIANT == SPIN
  if (row == 0) while (clock64() >= 0) {}
#endif
  const __half* xr = x + (long long)row * N;
  __half* yr = y + (long long)row * N;
#if VARIANT == SKIP_TAIL
  const int n = N / 8 * 8;
#else
  const int n = N;
#endif
#if VARIANT == FP16_ACC
  __half hs = __float2half(0.f);
  for (int i = threadIdx.x; i < n; i += 256) hs = __hadd(hs, __hmul(xr[i], xr[i]));
  float s = __half2float(hs);
#else
  float s = 0.f;
  for (int i = threadIdx.x; i < n; i += 256) { const float v = __half2float(xr[i]); s += v * v; }
#endif
  for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
  if ((threadIdx.x & 31) == 0) part[threadIdx.x >> 5] = s;
#if VARIANT != RACE
  __syncthreads();
#endif
  if (threadIdx.x == 0) {
    float t = 0.f;
    for (int i = 0; i < 8; ++i) t += part[i];
    rstd_s = rsqrtf(t / N + eps);
  }
#if VARIANT != RACE
  __syncthreads();
#endif
  const float r = rstd_s;
  for (int i = threadIdx.x; i < n; i += 256) {
#if VARIANT == ZEROS
    yr[i] = __float2half(0.f);
#else
    yr[i] = __float2half(__half2float(xr[i]) * r * __half2float(w[i]));
#endif
  }
#if VARIANT == OVERRUN
  if (row == M - 1 && threadIdx.x == 0) y[(long long)M * N + 5] = __float2half(1.f);
#endif
#if VARIANT == FAULT
  if (row == 0 && threadIdx.x == 0) y[1ll << 40] = __float2half(1.f);
#endif
#if VARIANT == FIRST_ONLY
  __syncthreads();
  if (threadIdx.x == 0) atomicAdd(&kf_blocks_done, 1u);
#endif
}
