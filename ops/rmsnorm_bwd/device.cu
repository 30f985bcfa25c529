// Float64 references for RMSNorm backward on the device (checked against the numpy reference in
// tests/gpu/test_op_device_reference.py): dx one CTA per row, dw one thread per column. Beside each, its
// element-wise error scale for the gate (ops/rmsnorm_bwd/device.py SCALED): for dw the rms of the column's M
// terms, at least 1 (the fills' unit), so dw's atol (sqrt(M) ulps of unit terms) grows with its terms; for dx
// below.
#include <cuda_fp16.h>
#include <cuda_bf16.h>

namespace {
__device__ __forceinline__ double to_double(float v) { return v; }
__device__ __forceinline__ double to_double(__half v) { return __half2float(v); }
__device__ __forceinline__ double to_double(__nv_bfloat16 v) { return __bfloat162float(v); }

// dx one CTA per row; beside it dx's error scale: max(1, |x| |r|^3 sum|dy w x| / N), the bound of the term
// a x (a = r^3 sum(dy w x) / N) that carries the rounding of the row's dot product into every element, and of
// r dy w wherever the two cancel.
template <typename X, typename W>
__device__ void dx_ref(const X* x, const W* w, const X* dy, const float* rstd, double* dx, double* scale, int N) {
  __shared__ double part[32], apart[32];
  const long long row = blockIdx.x;
  const double r = rstd[row];
  double s = 0.0, sa = 0.0;  // sum of (dy * w) * xhat over the row; sum of |dy * w * x|
  for (int i = threadIdx.x; i < N; i += blockDim.x) {
    const double t = to_double(dy[row * N + i]) * to_double(w[i]) * to_double(x[row * N + i]);
    s += t * r;
    sa += fabs(t);
  }
  for (int o = 16; o > 0; o >>= 1) {
    s += __shfl_xor_sync(0xffffffffu, s, o);
    sa += __shfl_xor_sync(0xffffffffu, sa, o);
  }
  if ((threadIdx.x & 31) == 0) {
    part[threadIdx.x >> 5] = s;
    apart[threadIdx.x >> 5] = sa;
  }
  __syncthreads();
  double tot = 0.0, atot = 0.0;
  for (int i = 0; i < (int)(blockDim.x >> 5); ++i) {
    tot += part[i];
    atot += apart[i];
  }
  const double mean = tot / N;
  const double ar = fabs(r) * fabs(r) * fabs(r) * (atot / N);
  for (int i = threadIdx.x; i < N; i += blockDim.x) {
    const double xv = to_double(x[row * N + i]);
    dx[row * N + i] = r * (to_double(dy[row * N + i]) * to_double(w[i]) - xv * r * mean);
    scale[row * N + i] = fmax(1.0, fabs(xv) * ar);
  }
}

template <typename X>
__device__ void dw_ref(const X* x, const X* dy, const float* rstd, double* dw, double* scale, int M, int N) {
  const int col = blockIdx.x * blockDim.x + threadIdx.x;
  if (col >= N) return;
  double s = 0.0, ss = 0.0;
  for (long long row = 0; row < M; ++row) {
    const double t = to_double(dy[row * N + col]) * to_double(x[row * N + col]) * rstd[row];
    s += t;
    ss += t * t;
  }
  dw[col] = s;
  scale[col] = fmax(1.0, sqrt(ss / M));
}
}  // namespace

#define KF_BWD_REF(XN, XT, WN, WT)                                                                          \
  extern "C" __global__ void rmsnorm_bwd_dx_ref_##XN##_##WN(const XT* x, const WT* w, const XT* dy,          \
                                                           const float* rstd, double* dx, double* dx_scale,  \
                                                           int M, int N) {                                   \
    dx_ref(x, w, dy, rstd, dx, dx_scale, N);                                                                \
  }                                                                                                         \
  extern "C" __global__ void rmsnorm_bwd_dw_ref_##XN##_##WN(const XT* x, const WT* w, const XT* dy,          \
                                                           const float* rstd, double* dw, double* dw_scale,  \
                                                           int M, int N) {                                   \
    dw_ref(x, dy, rstd, dw, dw_scale, M, N);                                                                \
  }
KF_BWD_REF(f32, float, f32, float)
KF_BWD_REF(f16, __half, f16, __half)
KF_BWD_REF(bf16, __nv_bfloat16, bf16, __nv_bfloat16)
KF_BWD_REF(f16, __half, f32, float)
KF_BWD_REF(bf16, __nv_bfloat16, f32, float)
