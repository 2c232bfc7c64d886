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

inline uint16_t to_bf16(float x) {  // round to nearest even (NaN stays NaN)
  uint32_t u;
  __builtin_memcpy(&u, &x, sizeof u);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

}  // namespace kvtier_cpu
