// Float64 reference for row-wise softmax on the device, one CTA per row.
#include <cuda_fp16.h>
#include <cuda_bf16.h>

namespace {
__device__ __forceinline__ double to_double(float v) { return v; }
__device__ __forceinline__ double to_double(__half v) { return __half2float(v); }
__device__ __forceinline__ double to_double(__nv_bfloat16 v) { return __bfloat162float(v); }

__device__ double block_reduce(double v, bool is_max) {
  __shared__ double part[32];
  for (int o = 16; o > 0; o >>= 1) {
    const double u = __shfl_xor_sync(0xffffffffu, v, o);
    v = is_max ? fmax(v, u) : v + u;
  }
  __syncthreads();
  if ((threadIdx.x & 31) == 0) part[threadIdx.x >> 5] = v;
  __syncthreads();
  double t = part[0];
  for (int i = 1; i < (int)(blockDim.x >> 5); ++i) t = is_max ? fmax(t, part[i]) : t + part[i];
  return t;
}

template <typename X>
__device__ void ref(const X* x, double* y, int N) {
  const long long row = blockIdx.x;
  const X* xr = x + row * N;
  double m = __longlong_as_double(0xfff0000000000000ull);  // -inf (NVRTC has no INFINITY)
  for (int i = threadIdx.x; i < N; i += blockDim.x) m = fmax(m, to_double(xr[i]));
  m = block_reduce(m, true);
  double s = 0.0;
  for (int i = threadIdx.x; i < N; i += blockDim.x) s += exp(to_double(xr[i]) - m);
  s = block_reduce(s, false);
  for (int i = threadIdx.x; i < N; i += blockDim.x) y[row * N + i] = exp(to_double(xr[i]) - m) / s;
}
}  // namespace

extern "C" __global__ void softmax_ref_f32(const float* x, double* y, int M, int N) { ref(x, y, N); }
extern "C" __global__ void softmax_ref_f16(const __half* x, double* y, int M, int N) { ref(x, y, N); }
extern "C" __global__ void softmax_ref_bf16(const __nv_bfloat16* x, double* y, int M, int N) { ref(x, y, N); }
