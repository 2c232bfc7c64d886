// SIMD layer of the CPU kernels: a vector of kWidth fp32 lanes, chosen at compile time from
// the flags -march=native enables (AVX-512, else AVX2 + FMA, else scalar), and the few
// operations the decode-attention kernel needs. Included by cpu_attention.cpp only.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>

#if defined(__AVX512F__) || defined(__AVX2__)
#include <immintrin.h>
#endif

namespace kvtier_cpu {

// bf16 is the upper half of an fp32, so widening is a zero-extension and a shift (no
// rounding, two instructions a vector).
#if defined(__AVX512F__)
constexpr int kWidth = 16;
constexpr const char* kIsa = "avx512";
using vec = __m512;
inline vec vzero() { return _mm512_setzero_ps(); }
inline vec vset(float x) { return _mm512_set1_ps(x); }
inline vec vload(const float* p) { return _mm512_loadu_ps(p); }
inline vec vload(const uint16_t* p) {
  __m512i w = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  return _mm512_castsi512_ps(_mm512_slli_epi32(w, 16));
}
inline void vstore(float* p, vec v) { _mm512_storeu_ps(p, v); }
inline vec vfma(vec a, vec b, vec c) { return _mm512_fmadd_ps(a, b, c); }
inline vec vmul(vec a, vec b) { return _mm512_mul_ps(a, b); }
inline vec vadd(vec a, vec b) { return _mm512_add_ps(a, b); }
inline float vsum(vec v) { return _mm512_reduce_add_ps(v); }
inline float vhmax(vec v) { return _mm512_reduce_max_ps(v); }
inline bool vany_gt(vec v, float x) { return _mm512_cmp_ps_mask(v, _mm512_set1_ps(x), _CMP_GT_OQ) != 0; }
inline vec vround(vec x) { return _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
inline vec vmax(vec a, vec b) { return _mm512_max_ps(a, b); }
inline vec vscale2(vec p, vec n) { return _mm512_scalef_ps(p, n); }  // p * 2^n
#elif defined(__AVX2__) && defined(__FMA__)
constexpr int kWidth = 8;
constexpr const char* kIsa = "avx2";
using vec = __m256;
inline vec vzero() { return _mm256_setzero_ps(); }
inline vec vset(float x) { return _mm256_set1_ps(x); }
inline vec vload(const float* p) { return _mm256_loadu_ps(p); }
inline vec vload(const uint16_t* p) {
  __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  return _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
}
inline void vstore(float* p, vec v) { _mm256_storeu_ps(p, v); }
inline vec vfma(vec a, vec b, vec c) { return _mm256_fmadd_ps(a, b, c); }
inline vec vmul(vec a, vec b) { return _mm256_mul_ps(a, b); }
inline vec vadd(vec a, vec b) { return _mm256_add_ps(a, b); }
inline float vsum(vec v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_hadd_ps(s, s);
  return _mm_cvtss_f32(_mm_hadd_ps(s, s));
}
inline float vhmax(vec v) {
  __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  m = _mm_max_ps(m, _mm_movehl_ps(m, m));
  return _mm_cvtss_f32(_mm_max_ss(m, _mm_shuffle_ps(m, m, 1)));
}
inline bool vany_gt(vec v, float x) {
  return _mm256_movemask_ps(_mm256_cmp_ps(v, _mm256_set1_ps(x), _CMP_GT_OQ)) != 0;
}
inline vec vround(vec x) { return _mm256_round_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
inline vec vmax(vec a, vec b) { return _mm256_max_ps(a, b); }
inline vec vscale2(vec p, vec n) {  // p * 2^n by adding n to the exponent (n >= -126 here)
  __m256i e = _mm256_slli_epi32(_mm256_cvtps_epi32(n), 23);
  return _mm256_castsi256_ps(_mm256_add_epi32(_mm256_castps_si256(p), e));
}
#else
constexpr int kWidth = 1;
constexpr const char* kIsa = "scalar";
using vec = float;
inline vec vzero() { return 0.0f; }
inline vec vset(float x) { return x; }
inline vec vload(const float* p) { return *p; }
inline vec vload(const uint16_t* p) {
  uint32_t bits = static_cast<uint32_t>(*p) << 16;
  float f;
  __builtin_memcpy(&f, &bits, sizeof f);
  return f;
}
inline void vstore(float* p, vec v) { *p = v; }
inline vec vfma(vec a, vec b, vec c) { return a * b + c; }
inline vec vmul(vec a, vec b) { return a * b; }
inline vec vadd(vec a, vec b) { return a + b; }
inline float vsum(vec v) { return v; }
inline float vhmax(vec v) { return v; }
inline bool vany_gt(vec v, float x) { return v > x; }
inline vec vround(vec x) { return std::nearbyint(x); }
inline vec vmax(vec a, vec b) { return std::max(a, b); }
inline vec vscale2(vec p, vec n) { return std::ldexp(p, static_cast<int>(n)); }
#endif

// 2^x for x <= 0: 2^n * 2^f with n = round(x), f in [-1/2, 1/2], 2^f by its degree-7 Taylor
// polynomial (truncation error < 6e-9, below fp32 rounding). x is clamped at -126: weights
// that small are zero next to the running maximum's weight of 1.
inline vec vexp2(vec x) {
  x = vmax(x, vset(-126.0f));
  vec n = vround(x);
  vec f = vadd(x, vmul(n, vset(-1.0f)));
  vec p = vset(1.525273380405984e-05f);
  p = vfma(p, f, vset(1.540353039338161e-04f));
  p = vfma(p, f, vset(1.333355814642844e-03f));
  p = vfma(p, f, vset(9.618129107628477e-03f));
  p = vfma(p, f, vset(5.550410866482158e-02f));
  p = vfma(p, f, vset(2.402265069591007e-01f));
  p = vfma(p, f, vset(6.931471805599453e-01f));
  p = vfma(p, f, vset(1.0f));
  return vscale2(p, n);
}

#if defined(__AVX512F__)
// Sums of 16 vectors in one: lane r = the horizontal sum of a[r]. A transpose-and-add tree,
// 45 instructions for 16 sums instead of 16 separate reductions of 8 or more each.
__attribute__((always_inline)) inline __m512 vsum16(const __m512 (&a)[16]) {
  __m512 s[8], u[4], v[2];
#pragma GCC unroll 8
  for (int i = 0; i < 8; ++i)  // per 128-bit lane: [a0+a2, b0+b2, a1+a3, b1+b3]
    s[i] = _mm512_add_ps(_mm512_unpacklo_ps(a[2 * i], a[2 * i + 1]),
                         _mm512_unpackhi_ps(a[2 * i], a[2 * i + 1]));
#pragma GCC unroll 4
  for (int i = 0; i < 4; ++i) {  // per 128-bit lane: partial sums of rows 4i .. 4i + 3
    const __m512d x = _mm512_castps_pd(s[2 * i]), y = _mm512_castps_pd(s[2 * i + 1]);
    u[i] = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(x, y)),
                         _mm512_castpd_ps(_mm512_unpackhi_pd(x, y)));
  }
#pragma GCC unroll 2
  for (int i = 0; i < 2; ++i)  // lanes (L0 + L1, L2 + L3) of two rows-quads
    v[i] = _mm512_add_ps(_mm512_shuffle_f32x4(u[2 * i], u[2 * i + 1], 0x88),
                         _mm512_shuffle_f32x4(u[2 * i], u[2 * i + 1], 0xDD));
  return _mm512_add_ps(_mm512_shuffle_f32x4(v[0], v[1], 0x88),
                       _mm512_shuffle_f32x4(v[0], v[1], 0xDD));
}

// q . k_r for 16 fp32 rows k against one fp32 query row. D is a template argument so that
// every row's address is the base plus a constant (no register a row) and the 16
// accumulators stay in registers.
template <int D>
__attribute__((always_inline)) inline __m512 vdot16(const float* k, const float* q) {
  __m512 a[16];
#pragma GCC unroll 16
  for (int r = 0; r < 16; ++r) a[r] = _mm512_setzero_ps();
#pragma GCC unroll 8
  for (int c = 0; c < D; c += 16) {
    const __m512 qv = _mm512_loadu_ps(q + c);
#pragma GCC unroll 16
    for (int r = 0; r < 16; ++r) a[r] = _mm512_fmadd_ps(qv, _mm512_loadu_ps(k + r * D + c), a[r]);
  }
  return vsum16(a);
}
#endif

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512BF16__)
constexpr bool kBf16Dot = true;
// q . k_r for 16 bf16 rows k against q given as PARTS bf16 terms (part stride
// q_part_stride): vdpbf16ps multiplies bf16 pairs exactly and accumulates in fp32, with no
// widening of k. D % 32 == 0.
template <int D, int PARTS>
__attribute__((always_inline)) inline __m512 vdot16_bf16(const uint16_t* k, const uint16_t* q,
                                                         int64_t q_part_stride) {
  __m512 a[16];
#pragma GCC unroll 16
  for (int r = 0; r < 16; ++r) a[r] = _mm512_setzero_ps();
#pragma GCC unroll 4
  for (int c = 0; c < D; c += 32) {
    __m512bh qv[PARTS];
#pragma GCC unroll 3
    for (int p = 0; p < PARTS; ++p) qv[p] = (__m512bh)_mm512_loadu_si512(q + p * q_part_stride + c);
#pragma GCC unroll 16
    for (int r = 0; r < 16; ++r) {
      const __m512bh kv = (__m512bh)_mm512_loadu_si512(k + r * D + c);
#pragma GCC unroll 3
      for (int p = 0; p < PARTS; ++p) a[r] = _mm512_dpbf16_ps(a[r], qv[p], kv);
    }
  }
  return vsum16(a);
}

// x[0..n) (n % 32 == 0) as the sum of three bf16 terms, term p at out + p * part_stride
// (exact up to fp32 denormals, which the conversion flushes); returns how many terms are
// needed: 1 when x is bf16 already.
inline int split_bf16(const float* x, uint16_t* out, int64_t part_stride, int n) {
  __m512i used2 = _mm512_setzero_si512(), used3 = _mm512_setzero_si512();
  for (int j = 0; j < n; j += 32) {
    __m512 lo = _mm512_loadu_ps(x + j), hi = _mm512_loadu_ps(x + j + 16);
    for (int p = 0; p < 3; ++p) {
      const __m512i t = (__m512i)_mm512_cvtne2ps_pbh(hi, lo);  // elements j .. j + 31
      _mm512_storeu_si512(out + p * part_stride + j, t);
      if (p == 1) used2 = _mm512_or_si512(used2, t);
      if (p == 2) used3 = _mm512_or_si512(used3, t);
      lo = _mm512_sub_ps(lo, _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm512_castsi512_si256(t)), 16)));
      hi = _mm512_sub_ps(hi, _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm512_extracti64x4_epi64(t, 1)), 16)));
    }
  }
  if (_mm512_test_epi32_mask(used3, used3)) return 3;
  return _mm512_test_epi32_mask(used2, used2) ? 2 : 1;
}
#else
constexpr bool kBf16Dot = false;
#endif

inline uint16_t to_bf16(float x) {  // round to nearest even (NaN stays NaN)
  uint32_t u;
  __builtin_memcpy(&u, &x, sizeof u);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

inline float from_bf16(uint16_t x) {
  const uint32_t u = static_cast<uint32_t>(x) << 16;
  float f;
  __builtin_memcpy(&f, &u, sizeof f);
  return f;
}

}  // namespace kvtier_cpu
