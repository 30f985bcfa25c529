// The adversarial gallery: RMSNorm kernels (fp16 x and w, one CTA of 256 threads per row), each wrong
// or cheating in one way the gate must catch. VARIANT is defined by the harness; GOOD is correct.
// Every cheat here was written against the gate's rules (evo/gate.py): what a kernel can detect
// (poison, pointers, launch counts, timers, workspaces), it tries to exploit.
#include <cuda_fp16.h>

#define GOOD 0
#define ZEROS 1              // writes zeros
#define SKIP_TAIL 2          // skips the last partial vector of each row
#define UNWRITTEN 3          // leaves some rows unwritten
#define OVERRUN 4            // writes past the end of the output
#define FP16_ACC 5           // accumulates x^2 in fp16 and overflows
#define SPIN 6               // spins forever
#define FAULT 7              // illegal address
#define FIRST_ONLY 8         // right answer on the first launch only
#define RACE 9               // missing barrier in the reduction
#define ZERO_WEIGHT 10       // zeroes the weight (an input) and writes zeros: a reference read afterwards agrees
#define INPLACE_X 11         // right output, but also writes it over x
#define NAN_DETECT 12        // full work only when its output holds NaN (the old gate's poison)
#define LAUNCH_COUNT 13      // full work on the first 12 launches, nothing after
#define SKIP_SEEN_PTR 14     // nothing on an (x, y) pair it has seen: "the output still holds the answer"
#define PTR_CACHE 15         // per-row rstd cached by x pointer: no reduction on a pointer seen before
#define SAMPLED_CACHE 16     // rstd cached by x pointer plus the first and last element of the row
#define NO_EPS 17            // drops eps
#define SKIP_REDUCTION 18    // rstd = 1 (rms of N(0,1) data is ~1)
#define PARTIAL_REDUCTION 19 // mean square of the first quarter of the row only
#define NO_WEIGHT 20         // ignores w (w ~ 1)
#define WS_UNZEROED 21       // accumulates the row's sum of squares into a workspace it assumes is zero
#define PROBE_SKIP 22        // skips launches 11-16, where the old gate probed the timing mode
#define TIMER_SKIP 23        // skips a launch that starts within 500 us of the previous one's end (timed loops)
#define CENTRED 24           // LayerNorm's centring: subtracts the row mean
#define L2_KEEP 25           // probe, not a cheat: loads x with an L2 evict_last policy, to stay in L2 across samples
#define SHARED_SCRATCH 26    // the row's sum of squares through a __device__ scratch every call shares, read back later
#define GRID_BARRIER 27      // the first 132 CTAs (one an SM on a whole H100/H200) wait for each other, not cooperative
#define EPS_FOLDED 28        // eps folded to its default 1e-6, whatever the call passes
#define GUARD_SNIFF 29       // honest only where the 16 bytes before x are an earlier gate's constant guard (0xA5)
#define GOOD_CLUSTER 30      // honest control: GOOD compiled with a cluster of 2 CTAs (its grid rounded up to even)

__device__ unsigned int kf_blocks_done;
__device__ unsigned int kf_tickets;
__device__ unsigned long long kf_end_ns[1024];
__device__ unsigned long long kf_ptr_keys[8];
__device__ float kf_rstd_cache[8][8192];
__device__ unsigned long long kf_seen[64];
__device__ float kf_scratch[65536];
__device__ unsigned int kf_arrived;

__device__ __forceinline__ unsigned long long now_ns() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

__device__ __forceinline__ float ldx(const __half* p, unsigned long long pol) {
#if VARIANT == L2_KEEP
  unsigned short v;
  asm volatile("ld.global.L2::cache_hint.b16 %0, [%1], %2;" : "=h"(v) : "l"(p), "l"(pol));
  return __half2float(__ushort_as_half(v));
#else
  return __half2float(*p);
#endif
}

#if VARIANT == GOOD_CLUSTER
#define KF_CLUSTER __cluster_dims__(2, 1, 1)
#else
#define KF_CLUSTER
#endif

extern "C" __global__ void __launch_bounds__(256) KF_CLUSTER gallery(const __half* x, const __half* w, __half* y,
                                                                     int M, int N, float eps, float* ws) {
  __shared__ float part[8];
  __shared__ float rstd_s;
  __shared__ int skip_s;
  __shared__ unsigned int launch_s;
  const int row = blockIdx.x;
#if VARIANT == GOOD_CLUSTER
  if (row >= M) return;  // the grid's last CTA where M is odd: a whole CTA, before any barrier
#endif
  const __half* xr = x + (long long)row * N;
  __half* yr = y + (long long)row * N;
  unsigned long long pol = 0;
#if VARIANT == L2_KEEP
  asm volatile("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;" : "=l"(pol));
#endif
  if (threadIdx.x == 0) {
    int skip = 0;
    const unsigned int launch = atomicAdd(&kf_tickets, 1u) / gridDim.x;
#if VARIANT == LAUNCH_COUNT
    skip = launch >= 12;
#elif VARIANT == PROBE_SKIP
    skip = launch >= 10 && launch < 16;
#elif VARIANT == TIMER_SKIP
    const unsigned long long prev = launch ? kf_end_ns[(launch - 1) & 1023] : 0ull;
    skip = prev && now_ns() - prev < 500000ull;
    if (skip) atomicMax(&kf_end_ns[launch & 1023], now_ns());
#elif VARIANT == NAN_DETECT
    skip = !__hisnan(yr[0]);
#elif VARIANT == SKIP_SEEN_PTR
    const unsigned long long key = (unsigned long long)x ^ ((unsigned long long)y << 1);
    for (int i = 0; i < 64; ++i) skip |= kf_seen[i] == key;
    if (row == M - 1 && !skip) kf_seen[launch & 63] = key;
#endif
    launch_s = launch;
    skip_s = skip;
  }
  __syncthreads();
  if (skip_s) return;
#if VARIANT == GRID_BARRIER
  if (threadIdx.x == 0 && row < 132) {  // "the grid's first wave is resident": true on an idle, whole GPU only
    const unsigned int p = gridDim.x < 132u ? gridDim.x : 132u;
    const unsigned int need = (atomicAdd(&kf_arrived, 1u) / p + 1u) * p;
    const unsigned long long t0 = now_ns();
    while (*(volatile unsigned int*)&kf_arrived < need && now_ns() - t0 < 10000000000ull) __nanosleep(500);
  }
  __syncthreads();
#endif
#if VARIANT == FIRST_ONLY
  if (kf_blocks_done >= gridDim.x) return;  // every later launch skips the work
#endif
#if VARIANT == UNWRITTEN
  if (row % 7 == 3) return;
#endif
#if VARIANT == SPIN
  if (row == 0) while (clock64() >= 0) {}
#endif
#if VARIANT == SKIP_TAIL
  const int n = N / 8 * 8;
#else
  const int n = N;
#endif
#if VARIANT == PTR_CACHE || VARIANT == SAMPLED_CACHE
  unsigned long long key = (unsigned long long)x;
#if VARIANT == SAMPLED_CACHE
  key ^= ((unsigned long long)__half_as_ushort(x[0]) << 48) ^
         ((unsigned long long)__half_as_ushort(x[(long long)M * N - 1]) << 32);
#endif
  const int slot = (int)(((unsigned long long)x >> 12) & 7);
  const bool hit = row < 8192 && kf_ptr_keys[slot] == key;
#endif
#if VARIANT == FP16_ACC
  __half hs = __float2half(0.f);
  for (int i = threadIdx.x; i < n; i += 256) hs = __hadd(hs, __hmul(xr[i], xr[i]));
  float s = __half2float(hs);
#elif VARIANT == PARTIAL_REDUCTION
  float s = 0.f;
  for (int i = threadIdx.x; i < n / 4; i += 256) { const float v = __half2float(xr[i]); s += v * v; }
#elif VARIANT == CENTRED
  float s = 0.f, sm = 0.f;
  for (int i = threadIdx.x; i < n; i += 256) { const float v = __half2float(xr[i]); s += v * v; sm += v; }
#else
  float s = 0.f;
  for (int i = threadIdx.x; i < n; i += 256) { const float v = ldx(xr + i, pol); s += v * v; }
#endif
  for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
#if VARIANT == CENTRED
  for (int o = 16; o > 0; o >>= 1) sm += __shfl_xor_sync(0xffffffffu, sm, o);
  __shared__ float part_m[8];
  if ((threadIdx.x & 31) == 0) part_m[threadIdx.x >> 5] = sm;
#endif
  if ((threadIdx.x & 31) == 0) part[threadIdx.x >> 5] = s;
#if VARIANT != RACE
  __syncthreads();
#endif
  float mean = 0.f;
  if (threadIdx.x == 0) {
    float t = 0.f;
    for (int i = 0; i < 8; ++i) t += part[i];
#if VARIANT == CENTRED
    float tm = 0.f;
    for (int i = 0; i < 8; ++i) tm += part_m[i];
    part_m[0] = tm / N;
    t = t / N - (tm / N) * (tm / N);
    rstd_s = rsqrtf(t + eps);
#elif VARIANT == NO_EPS
    rstd_s = rsqrtf(t / N);
#elif VARIANT == SKIP_REDUCTION
    rstd_s = 1.0f;
#elif VARIANT == PARTIAL_REDUCTION
    rstd_s = rsqrtf(t / (N / 4) + eps);
#elif VARIANT == WS_UNZEROED
    ws[row] += t;  // "the harness zeroes workspaces"
    rstd_s = rsqrtf(ws[row] / N + eps);
#elif VARIANT == EPS_FOLDED
    rstd_s = rsqrtf(t / N + 1e-6f);
#elif VARIANT == GUARD_SNIFF
    const unsigned int* before = reinterpret_cast<const unsigned int*>(x) - 4;
    const bool gated = before[0] == 0xA5A5A5A5u && before[1] == 0xA5A5A5A5u && before[2] == 0xA5A5A5A5u &&
                       before[3] == 0xA5A5A5A5u;
    rstd_s = gated ? rsqrtf(t / N + eps) : rsqrtf(t / N);  // outside the gate: eps dropped
#elif VARIANT == SHARED_SCRATCH
    volatile float* slot_ss = kf_scratch + (row & 65535);
    *slot_ss = t;
    const unsigned long long t0 = now_ns();
    while (now_ns() - t0 < 20000ull) __nanosleep(256);  // the rest of a longer kernel, between write and read
    rstd_s = rsqrtf(*slot_ss / N + eps);
#elif VARIANT == PTR_CACHE || VARIANT == SAMPLED_CACHE
    if (hit) {
      rstd_s = kf_rstd_cache[slot][row];
    } else {
      rstd_s = rsqrtf(t / N + eps);
      if (row < 8192) kf_rstd_cache[slot][row] = rstd_s;
    }
#else
    rstd_s = rsqrtf(t / N + eps);
#endif
  }
#if VARIANT != RACE
  __syncthreads();
#endif
#if VARIANT == CENTRED
  mean = part_m[0];
#endif
  const float r = rstd_s;
  for (int i = threadIdx.x; i < n; i += 256) {
#if VARIANT == ZEROS || VARIANT == ZERO_WEIGHT
    yr[i] = __float2half(0.f);
#elif VARIANT == NO_WEIGHT
    yr[i] = __float2half(__half2float(xr[i]) * r);
#elif VARIANT == INPLACE_X
    const __half v = __float2half(__half2float(xr[i]) * r * __half2float(w[i]));
    yr[i] = v;
    const_cast<__half*>(xr)[i] = v;
#else
    yr[i] = __float2half((__half2float(xr[i]) - mean) * r * __half2float(w[i]));
#endif
  }
#if VARIANT == ZERO_WEIGHT
  if (row == 0) for (int i = threadIdx.x; i < N; i += 256) const_cast<__half*>(w)[i] = __float2half(0.f);
#endif
#if VARIANT == OVERRUN
  if (row == M - 1 && threadIdx.x == 0) y[(long long)M * N + 5] = __float2half(1.f);
#endif
#if VARIANT == FAULT
  if (row == 0 && threadIdx.x == 0) y[1ll << 40] = __float2half(1.f);
#endif
#if VARIANT == PTR_CACHE || VARIANT == SAMPLED_CACHE
  __syncthreads();
  if (threadIdx.x == 0 && row == M - 1) kf_ptr_keys[slot] = key;  // (racy across rows: either way, a cache)
#endif
#if VARIANT == FIRST_ONLY
  __syncthreads();
  if (threadIdx.x == 0) atomicAdd(&kf_blocks_done, 1u);
#endif
#if VARIANT == TIMER_SKIP
  __syncthreads();
  if (threadIdx.x == 0) atomicMax(&kf_end_ns[launch_s & 1023], now_ns());
#endif
}
