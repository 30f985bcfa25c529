// Float64 reference for KDA forward on the device (checked against ops/kda/reference.py in tests/gpu):
// o and the final state of the recurrence, token by token, for every variant fla's surface has.
// CTA (column tile, value head, sequence); each thread owns one value column c of the state, S[:, c]
// in a local array, since every column evolves on its own:
//   S[:, c] *= exp(a_t);  u = b_t (v_t[c] - k_t . S[:, c]);  S[:, c] += u k_t;  o_t[c] = scale q_t . S[:, c]
// The per-token vectors (q, k and the decays, of length K) are computed once per CTA in shared memory.
// Null pointers: no initial_state (zeros), no final_state (not written), no cu_seqlens (B sequences of
// T tokens), no A_log (rate 1), no dt_bias (0). A_log and dt_bias are read by the raw gates only.
#include <cuda_fp16.h>
#include <cuda_bf16.h>

#define KDA_REF_KMAX 256
#define KDA_REF_THREADS 64

namespace {
__device__ __forceinline__ double to_double(float v) { return v; }
__device__ __forceinline__ double to_double(__half v) { return __half2float(v); }
__device__ __forceinline__ double to_double(__nv_bfloat16 v) { return __bfloat162float(v); }

// As ops/kda/reference.py: softplus = logaddexp(0, x); sigmoid without overflow for any finite x.
__device__ __forceinline__ double softplus(double x) { return fmax(x, 0.0) + log1p(exp(-fabs(x))); }
__device__ __forceinline__ double sigmoid(double x) {
  const double e = exp(-fabs(x));
  return x >= 0.0 ? 1.0 / (1.0 + e) : e / (1.0 + e);
}

__device__ __forceinline__ double block_sum(double v, double* red) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  __syncthreads();
  if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = v;
  __syncthreads();
  double t = 0.0;
  for (int w = 0; w < KDA_REF_THREADS / 32; ++w) t += red[w];
  return t;
}

template <typename X, typename G, typename S>
__device__ void ref(const X* q, const X* k, const X* v, const G* g, const X* beta, const float* A_log,
                    const float* dt_bias, const S* h0, const int* cu, double* o, double* ht, int T, int H, int HV,
                    int K, int V, double scale, double lower_bound, int gate, int beta_act, int qk_l2norm,
                    int v_first) {
  __shared__ double qs[KDA_REF_KMAX], ks[KDA_REF_KMAX], ds[KDA_REF_KMAX], red[KDA_REF_THREADS / 32];
  const int c = blockIdx.x * KDA_REF_THREADS + threadIdx.x;
  const int hv = blockIdx.y, n = blockIdx.z, h = hv / (HV / H);
  const bool active = c < V;
  long long row, bos, eos;  // batch row and token range of sequence n
  if (cu != nullptr) { row = 0; bos = cu[n]; eos = cu[n + 1]; }
  else { row = n; bos = 0; eos = T; }
  const long long head = (long long)n * HV + hv;
  double s[KDA_REF_KMAX];
  for (int i = 0; i < K; ++i) {
    const long long at = v_first ? (head * V + c) * K + i : (head * K + i) * V + c;
    s[i] = (active && h0 != nullptr) ? to_double(h0[at]) : 0.0;
  }
  const double rate = A_log != nullptr ? exp((double)A_log[hv]) : 1.0;
  for (long long t = bos; t < eos; ++t) {
    const long long tok = row * T + t;
    double sq = 0.0, sk = 0.0;
    for (int i = threadIdx.x; i < K; i += KDA_REF_THREADS) {
      const double qi = to_double(q[(tok * H + h) * K + i]), ki = to_double(k[(tok * H + h) * K + i]);
      qs[i] = qi;
      ks[i] = ki;
      sq += qi * qi;
      sk += ki * ki;
      double a = to_double(g[(tok * HV + hv) * K + i]);
      if (gate != 0) {
        if (dt_bias != nullptr) a += (double)dt_bias[(long long)hv * K + i];
        a = gate == 1 ? -rate * softplus(a) : lower_bound * sigmoid(rate * a);
      }
      ds[i] = exp(a);
    }
    const double nq = qk_l2norm ? 1.0 / sqrt(block_sum(sq, red) + 1e-6) : 1.0;
    const double nk = qk_l2norm ? 1.0 / sqrt(block_sum(sk, red) + 1e-6) : 1.0;
    __syncthreads();
    double b = to_double(beta[tok * HV + hv]);
    if (beta_act != 0) b = sigmoid(b) * (beta_act == 2 ? 2.0 : 1.0);
    if (active) {
      double pred = 0.0;
      for (int i = 0; i < K; ++i) { s[i] *= ds[i]; pred += ks[i] * nk * s[i]; }
      const double u = b * (to_double(v[(tok * HV + hv) * V + c]) - pred);
      double out = 0.0;
      for (int i = 0; i < K; ++i) { s[i] += ks[i] * nk * u; out += scale * qs[i] * nq * s[i]; }
      o[(tok * HV + hv) * V + c] = out;
    }
    __syncthreads();  // qs, ks, ds are rewritten for the next token
  }
  if (active && ht != nullptr)
    for (int i = 0; i < K; ++i) ht[v_first ? (head * V + c) * K + i : (head * K + i) * V + c] = s[i];
}
}  // namespace

#define KF_KDA_REF(XN, XT, GN, GT, SN, ST)                                                                        \
  extern "C" __global__ void __launch_bounds__(KDA_REF_THREADS) kda_ref_##XN##_##GN##_##SN(                       \
      const XT* q, const XT* k, const XT* v, const GT* g, const XT* beta, const float* A_log, const float* dt_bias, \
      const ST* h0, const int* cu, double* o, double* ht, int T, int H, int HV, int K, int V, double scale,        \
      double lower_bound, int gate, int beta_act, int qk_l2norm, int v_first) {                                   \
    ref(q, k, v, g, beta, A_log, dt_bias, h0, cu, o, ht, T, H, HV, K, V, scale, lower_bound, gate, beta_act,     \
        qk_l2norm, v_first);                                                                                      \
  }
#define KF_KDA_REF_G(XN, XT, SN, ST)                 \
  KF_KDA_REF(XN, XT, f32, float, SN, ST)             \
  KF_KDA_REF(XN, XT, f16, __half, SN, ST)            \
  KF_KDA_REF(XN, XT, bf16, __nv_bfloat16, SN, ST)
#define KF_KDA_REF_X(SN, ST)                         \
  KF_KDA_REF_G(f32, float, SN, ST)                   \
  KF_KDA_REF_G(f16, __half, SN, ST)                  \
  KF_KDA_REF_G(bf16, __nv_bfloat16, SN, ST)
KF_KDA_REF_X(f32, float)
KF_KDA_REF_X(bf16, __nv_bfloat16)
