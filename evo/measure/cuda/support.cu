// Kernels the GPU worker uses around every candidate: random inputs, poison, comparison against a
// float64 reference, guard-zone checks. Compiled once per worker with NVRTC.
#include <cuda_fp16.h>
#include <cuda_bf16.h>

namespace {

__device__ __forceinline__ unsigned long long mix(unsigned long long z) {
  z += 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// Standard normal from a counter-based hash (Box-Muller), so any element is reproducible.
__device__ __forceinline__ float normal(unsigned long long seed, long long i) {
  const unsigned long long u = mix(seed ^ mix((unsigned long long)i));
  const float u1 = ((float)(u >> 40) + 0.5f) * 5.9604645e-8f;
  const float u2 = ((float)(u & 0xFFFFFFull) + 0.5f) * 5.9604645e-8f;
  return sqrtf(-2.0f * logf(u1)) * cospif(2.0f * u2);
}

__device__ __forceinline__ double to_double(float v) { return v; }
__device__ __forceinline__ double to_double(__half v) { return __half2float(v); }
__device__ __forceinline__ double to_double(__nv_bfloat16 v) { return __bfloat162float(v); }
template <typename T> __device__ __forceinline__ T from_float(float v);
template <> __device__ __forceinline__ float from_float<float>(float v) { return v; }
template <> __device__ __forceinline__ __half from_float<__half>(float v) { return __float2half_rn(v); }
template <> __device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }

// One input kind (ops.spec.FillSpec): v = mean + std * N(0,1) + row_shift * (+-1 per row); with
// constant_rows one draw per row; with outlier != 0 one element per row (at a hashed column) set to
// +-outlier; then the transform (ops.spec.TRANSFORMS: 1 -exp(v), 2 sigmoid(v); 3, unit rows, is a
// second pass, kf_l2norm_rows); last, a zero_rows fraction of rows all zero.
template <typename T>
__device__ void fill(T* out, long long n, unsigned long long seed, float mean, float stdev, int row_len,
                     float row_shift, float zero_rows, int constant_rows, float outlier, int transform) {
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) {
    const long long row = i / row_len;
    const unsigned long long h = mix(seed + 0x5151ull + (unsigned long long)row);
    const float sign = (h & 1ull) ? 1.0f : -1.0f;
    float v = mean + stdev * normal(seed, constant_rows ? -1 - row : i) + sign * row_shift;
    if (outlier != 0.0f && (i % row_len) == (long long)((h >> 24) % (unsigned long long)row_len)) v = sign * outlier;
    if (transform == 1) v = -expf(v);
    else if (transform == 2) v = 1.0f / (1.0f + expf(-v));  // expf(-v) = inf gives 0, never NaN
    if ((float)((h >> 8) & 0xFFFFull) < zero_rows * 65536.0f) v = 0.0f;
    out[i] = from_float<T>(v);
  }
}

// Each row divided by its L2 norm (of the stored values), one warp per row; an all-zero row stays zero.
template <typename T>
__device__ void l2norm_rows(T* p, long long rows, int row_len) {
  const int lane = threadIdx.x & 31;
  const long long warps = (long long)gridDim.x * (blockDim.x >> 5);
  for (long long r = blockIdx.x * (long long)(blockDim.x >> 5) + (threadIdx.x >> 5); r < rows; r += warps) {
    T* x = p + r * row_len;
    float ss = 0.0f;
    for (int c = lane; c < row_len; c += 32) { const float f = (float)to_double(x[c]); ss += f * f; }
    for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
    const float inv = ss > 0.0f ? rsqrtf(ss) : 0.0f;
    for (int c = lane; c < row_len; c += 32) x[c] = from_float<T>((float)to_double(x[c]) * inv);
  }
}

// Move about one element in `every` far from where it was (by +-amount), so a result cached from the
// old values (keyed by pointer and a few sampled elements) goes stale.
template <typename T>
__device__ void perturb(T* p, long long n, unsigned long long seed, int every, float amount) {
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) {
    const unsigned long long h = mix(seed ^ mix((unsigned long long)i));
    if (h % (unsigned long long)every == 0ull) {
      const float old = (float)to_double(p[i]);
      p[i] = from_float<T>(-old + ((h >> 40) & 1ull ? amount : -amount));
    }
  }
}

// An element is bad when |out - ref| > atol * scale + rtol * |ref|: scale is 1, or where the op's reference
// gives one, that element's data scale (a sum's rms term: its rounding grows with its terms, not its value).
template <typename T>
__device__ void compare(const T* out, const double* ref, const double* scale, long long n, int row_len, int tail,
                        double atol, double rtol, double* dstats, unsigned long long* ustats) {
  unsigned long long nonfinite = 0, bad = 0, bad_last = 0, bad_tail = 0, first = ~0ull, maxbits = 0;
  double sdiff = 0.0, sref = 0.0;
  const long long last_row_start = n - row_len;
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) {
    const double a = to_double(out[i]);
    const double b = ref[i];
    const double d = fabs(a - b);
    sref += b * b;
    if (!isfinite(a)) {
      ++nonfinite;
      ++bad;
      if (i >= last_row_start) ++bad_last;
      if ((int)(i % row_len) >= row_len - tail) ++bad_tail;
      if ((unsigned long long)i < first) first = i;
      continue;
    }
    sdiff += d * d;
    const unsigned long long bits = __double_as_longlong(d);
    if (bits > maxbits) maxbits = bits;
    if (d > atol * (scale ? scale[i] : 1.0) + rtol * fabs(b)) {
      ++bad;
      if (i >= last_row_start) ++bad_last;
      if ((int)(i % row_len) >= row_len - tail) ++bad_tail;
      if ((unsigned long long)i < first) first = i;
    }
  }
  for (int o = 16; o > 0; o >>= 1) {
    nonfinite += __shfl_xor_sync(0xffffffffu, nonfinite, o);
    bad += __shfl_xor_sync(0xffffffffu, bad, o);
    bad_last += __shfl_xor_sync(0xffffffffu, bad_last, o);
    bad_tail += __shfl_xor_sync(0xffffffffu, bad_tail, o);
    first = min(first, __shfl_xor_sync(0xffffffffu, first, o));
    maxbits = max(maxbits, __shfl_xor_sync(0xffffffffu, maxbits, o));
    sdiff += __shfl_xor_sync(0xffffffffu, sdiff, o);
    sref += __shfl_xor_sync(0xffffffffu, sref, o);
  }
  if ((threadIdx.x & 31) == 0) {
    atomicAdd(&ustats[0], nonfinite);
    atomicAdd(&ustats[1], bad);
    atomicAdd(&ustats[2], bad_last);
    atomicAdd(&ustats[3], bad_tail);
    atomicMin(&ustats[4], first);
    atomicMax(&ustats[5], maxbits);
    atomicAdd(&dstats[0], sdiff);
    atomicAdd(&dstats[1], sref);
  }
}

}  // namespace

#define KF_FILL(S, T) \
  extern "C" __global__ void kf_fill_##S(T* o, long long n, unsigned long long s, float m, float sd, int r, float sh, \
                                         float z, int c, float ol, int tf) { fill(o, n, s, m, sd, r, sh, z, c, ol, tf); } \
  extern "C" __global__ void kf_l2norm_rows_##S(T* p, long long rows, int row_len) { l2norm_rows(p, rows, row_len); } \
  extern "C" __global__ void kf_perturb_##S(T* p, long long n, unsigned long long s, int every, float amount) { \
    perturb(p, n, s, every, amount); }
KF_FILL(f32, float)
KF_FILL(f16, __half)
KF_FILL(bf16, __nv_bfloat16)

// n1 = n + 1 int32 offsets 0 = c_0 < ... < c_n = end (ops.spec.FillSpec offsets, as cu_seqlens):
// c_i = i + floor((end - n) * W_i / W_n), W the running sum of squared exponential weights. One
// thread walks them twice (sum, then offsets); n is a batch's sequence count, small.
extern "C" __global__ void kf_offsets_i32(int* o, long long n1, long long end, unsigned long long seed) {
  if (blockIdx.x != 0 || threadIdx.x != 0) return;
  const long long n = n1 - 1;
  double total = 0.0;
  for (long long i = 0; i < n; ++i) {
    const double u = ((double)(mix(seed ^ mix((unsigned long long)i)) >> 11) + 0.5) * 0x1.0p-53;
    total += log(u) * log(u);
  }
  double acc = 0.0;
  o[0] = 0;
  for (long long i = 1; i < n; ++i) {
    const double u = ((double)(mix(seed ^ mix((unsigned long long)(i - 1))) >> 11) + 0.5) * 0x1.0p-53;
    acc += log(u) * log(u);
    o[i] = (int)(i + (long long)floor((double)(end - n) * fmin(acc / total, 1.0)));
  }
  if (n >= 1) o[n] = (int)end;
}

// A fresh random pattern (not a fixed NaN) over a buffer: a kernel cannot tell a poisoned output
// from one it wrote, nor a checked launch from a timed one.
extern "C" __global__ void kf_poison(unsigned int* p, long long words, unsigned long long seed) {
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < words; i += (long long)gridDim.x * blockDim.x)
    p[i] = (unsigned int)mix(seed ^ mix((unsigned long long)i));
}

// Keyed, order-independent checksum of a buffer (the key is random per job, so no kernel can aim
// for a collision): sum over 4-byte words of mix(key, index, word).
// Exactly nbytes: the bytes of a last partial word past the data (its guard zone, a pattern drawn per buffer) are
// masked off, so a buffer and its private copy of an odd size checksum alike.
extern "C" __global__ void kf_checksum(const unsigned int* p, long long nbytes, unsigned long long key,
                                       unsigned long long* out) {
  const long long words = (nbytes + 3) / 4;
  unsigned long long c = 0;
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < words; i += (long long)gridDim.x * blockDim.x) {
    const long long left = nbytes - 4 * i;
    const unsigned int v = left >= 4 ? p[i] : p[i] & ((1u << (8 * left)) - 1u);
    c += mix(key ^ mix(((unsigned long long)i << 32) | v));
  }
  for (int o = 16; o > 0; o >>= 1) c += __shfl_xor_sync(0xffffffffu, c, o);
  if ((threadIdx.x & 31) == 0) atomicAdd(out, c);
}

extern "C" __global__ void kf_compare_f32(const float* o, const double* r, const double* s, long long n, int rl, int t, double a, double rt, double* d, unsigned long long* u) { compare(o, r, s, n, rl, t, a, rt, d, u); }
extern "C" __global__ void kf_compare_f16(const __half* o, const double* r, const double* s, long long n, int rl, int t, double a, double rt, double* d, unsigned long long* u) { compare(o, r, s, n, rl, t, a, rt, d, u); }
extern "C" __global__ void kf_compare_bf16(const __nv_bfloat16* o, const double* r, const double* s, long long n, int rl, int t, double a, double rt, double* d, unsigned long long* u) { compare(o, r, s, n, rl, t, a, rt, d, u); }

// Guard zones (evo.measure.jobs.Guard): byte i of a zone holds the low byte of mix(seed ^ mix(i)), a pattern
// drawn per buffer and job, so no kernel can tell a gate buffer by the bytes around it.
__device__ __forceinline__ unsigned char guard_byte(unsigned long long seed, long long i) {
  return (unsigned char)mix(seed ^ mix((unsigned long long)i));
}

extern "C" __global__ void kf_guard_fill(unsigned char* p, long long n, unsigned long long seed) {
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x)
    p[i] = guard_byte(seed, i);
}

// Count bytes of a guard zone that no longer hold its pattern.
extern "C" __global__ void kf_guard_check(const unsigned char* p, long long n, unsigned long long seed,
                                          unsigned long long* count) {
  unsigned long long c = 0;
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x)
    c += (p[i] != guard_byte(seed, i));
  for (int o = 16; o > 0; o >>= 1) c += __shfl_xor_sync(0xffffffffu, c, o);
  if ((threadIdx.x & 31) == 0 && c) atomicAdd(count, c);
}

// Keeps the stream busy for `ns` nanoseconds (one warp reading the global timer): launches queued behind
// it start when it ends, so the host-side cost of launching the next timed call (a Python peer's
// dispatch) is not inside the timed interval (evo/measure/gate.py HOLD_US).
extern "C" __global__ void kf_hold(unsigned long long ns) {
  unsigned long long t0, t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
  do {
    __nanosleep(256);
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  } while (t - t0 < ns);
}

// Holds one SM while release[0] is 0 (host-mapped memory the worker writes), at most max_ns: launched with all of an
// SM's shared memory (less the block's reserved share), so no other CTA fits beside it and a grid of them holds that
// many SMs (evo/measure/worker.py crowded). started[i] = 1 once CTA i runs.
extern "C" __global__ void kf_occupy(const volatile unsigned* release, volatile unsigned* started,
                                     unsigned long long max_ns) {
  extern __shared__ unsigned char held[];
  if (threadIdx.x == 0) {
    held[0] = 0;
    started[blockIdx.x] = 1u;
    __threadfence_system();
    unsigned long long t0, t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
    do {
      __nanosleep(2000);
      asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    } while (release[0] == 0u && t - t0 < max_ns);
  }
}

// The L2 flush by reads (KF_L2_FLUSH=read, evo/measure/worker.py): n 16-byte words read once, so every line
// the L2 held (dirty ones written back during this launch, not during the next) makes way for clean lines
// of this buffer, which a later miss evicts without a write. The XOR feeds a store no real buffer matches
// (the compiler cannot drop the loads).
extern "C" __global__ void kf_read_flush(uint4* p, long long n) {
  unsigned acc = 0;
  const long long stride = (long long)gridDim.x * blockDim.x;
  long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
  for (; i + 3 * stride < n; i += 4 * stride) {
    const uint4 a = p[i], b = p[i + stride], c = p[i + 2 * stride], d = p[i + 3 * stride];
    acc ^= a.x ^ a.y ^ a.z ^ a.w ^ b.x ^ b.y ^ b.z ^ b.w ^ c.x ^ c.y ^ c.z ^ c.w ^ d.x ^ d.y ^ d.z ^ d.w;
  }
  for (; i < n; i += stride) {
    const uint4 a = p[i];
    acc ^= a.x ^ a.y ^ a.z ^ a.w;
  }
  if (acc == 0x9e3779b9u) p[0].x = acc;  // the buffer is all zeros (memset at the worker's start)
}
