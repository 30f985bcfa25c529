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

// The variants (QuACK's rmsnorm_fwd): h = x + residual, y = h * r * w + bias, residual_out = h,
// rstd = r, with r = 1 / sqrt(mean(h^2) + eps). A null pointer is a tensor the candidate's variant
// leaves out; `flags` is the cell's variant (1 residual, 2 bias, 4 store_rstd). Where the two disagree
// (a template that binds fewer or more tensors than the cell asks for) every reference written is NaN,
// so the candidate fails the gate instead of passing as another op.
namespace {
template <typename X, typename W, typename R>
__device__ void ref_variant(const X* x, const R* res, const W* w, const W* bias, double* y, double* res_out,
                            double* rstd, int N, double eps, int flags) {
  __shared__ double part[32];
  const long long row = blockIdx.x;
  const X* xr = x + row * N;
  const R* rr = res ? res + row * N : nullptr;
  const bool want_res = flags & 1, want_bias = flags & 2, want_rstd = flags & 4;
  const bool mismatch = (res != nullptr) != want_res || (res_out != nullptr) != want_res ||
                        (bias != nullptr) != want_bias || (rstd != nullptr) != want_rstd;
  double s = 0.0;
  for (int i = threadIdx.x; i < N; i += blockDim.x) {
    const double h = to_double(xr[i]) + (rr ? to_double(rr[i]) : 0.0);
    s += h * h;
  }
  for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
  if ((threadIdx.x & 31) == 0) part[threadIdx.x >> 5] = s;
  __syncthreads();
  double tot = 0.0;
  for (int i = 0; i < (int)(blockDim.x >> 5); ++i) tot += part[i];
  const double nan = __longlong_as_double(0x7ff8000000000000ll);
  const double r = mismatch ? nan : 1.0 / sqrt(tot / N + eps);
  for (int i = threadIdx.x; i < N; i += blockDim.x) {
    const double h = to_double(xr[i]) + (rr ? to_double(rr[i]) : 0.0);
    y[row * N + i] = h * r * to_double(w[i]) + (bias ? to_double(bias[i]) : 0.0);
    if (res_out) res_out[row * N + i] = mismatch ? nan : h;
  }
  if (rstd && threadIdx.x == 0) rstd[row] = r;
}
}  // namespace

#define KF_REF_VARIANT(XN, XT, WN, WT, RN, RT)                                                            \
  extern "C" __global__ void rmsnorm_ref_variant_##XN##_##WN##_##RN(                                       \
      const XT* x, const RT* res, const WT* w, const WT* bias, double* y, double* res_out, double* rstd, \
      int M, int N, double eps, int flags) {                                                              \
    ref_variant(x, res, w, bias, y, res_out, rstd, N, eps, flags);                                         \
  }
KF_REF_VARIANT(f32, float, f32, float, f32, float)
KF_REF_VARIANT(f16, __half, f16, __half, f16, __half)
KF_REF_VARIANT(f16, __half, f16, __half, f32, float)
KF_REF_VARIANT(f16, __half, f32, float, f16, __half)
KF_REF_VARIANT(f16, __half, f32, float, f32, float)
KF_REF_VARIANT(bf16, __nv_bfloat16, bf16, __nv_bfloat16, bf16, __nv_bfloat16)
KF_REF_VARIANT(bf16, __nv_bfloat16, bf16, __nv_bfloat16, f32, float)
KF_REF_VARIANT(bf16, __nv_bfloat16, f32, float, bf16, __nv_bfloat16)
KF_REF_VARIANT(bf16, __nv_bfloat16, f32, float, f32, float)
