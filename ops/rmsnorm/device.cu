// Float64 reference for RMSNorm forward on the device, one CTA per row (checked against the numpy
// reference in tests/gpu). Lets the worker verify every element of large cells at GPU speed.
#include <cuda_fp16.h>
#include <cuda_bf16.h>

namespace {
__device__ __forceinline__ double to_double(float v) { return v; }
__device__ __forceinline__ double to_double(__half v) { return __half2float(v); }
__device__ __forceinline__ double to_double(__nv_bfloat16 v) { return __bfloat162float(v); }

template <typename X, typename W>
__device__ void ref(const X* x, const W* w, double* y, int N, double eps) {
  __shared__ double part[32];
  const long long row = blockIdx.x;
  const X* xr = x + row * N;
  double s = 0.0;
  for (int i = threadIdx.x; i < N; i += blockDim.x) { const double v = to_double(xr[i]); s += v * v; }
  for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
  if ((threadIdx.x & 31) == 0) part[threadIdx.x >> 5] = s;
  __syncthreads();
  double tot = 0.0;
  for (int i = 0; i < (int)(blockDim.x >> 5); ++i) tot += part[i];
  const double r = 1.0 / sqrt(tot / N + eps);
  for (int i = threadIdx.x; i < N; i += blockDim.x) y[row * N + i] = to_double(xr[i]) * r * to_double(w[i]);
}
}  // namespace

#define KF_REF(XN, XT, WN, WT) \
  extern "C" __global__ void rmsnorm_ref_##XN##_##WN(const XT* x, const WT* w, double* y, int M, int N, double eps) { ref(x, w, y, N, eps); }
KF_REF(f32, float, f32, float)
KF_REF(f16, __half, f16, __half)
KF_REF(bf16, __nv_bfloat16, bf16, __nv_bfloat16)
KF_REF(f16, __half, f32, float)
KF_REF(bf16, __nv_bfloat16, f32, float)
