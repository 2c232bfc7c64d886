// AMX tile scores for the CPU decode-attention kernel: q . k of 16 K rows against all G query
// heads of their KV head in a few tile instructions (TDPBF16PS multiplies bf16 pairs exactly
// and sums in fp32, as vdpbf16ps does), where the AVX-512 path runs G passes of 16 vdpbf16ps
// rows each and a transpose-and-add tree a pass. Built where the compiler targets AMX-BF16
// (-march=native on a CPU that has it); used where the OS also grants the tile state, else
// the AVX-512 path runs. Included by cpu_attention.cpp only.
#pragma once

#include <cstdint>

#if defined(__AMX_TILE__) && defined(__AMX_BF16__) && defined(__AVX512BF16__) && defined(__linux__)
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>
#define KVTIER_AMX 1
#endif

namespace kvtier_cpu {

constexpr int kAmxRows = 16;      // K rows of one tile product (a tile's row count)
constexpr int kAmxChunk = 32;     // head_dim elements of one tile product (64 bytes of bf16)
constexpr int kAmxMaxGroup = 16;  // query heads in a score tile's columns (64 bytes of fp32)

// q of one KV head's G query heads, as `parts` bf16 terms, in the order a tile product's
// second operand wants (pairs of head_dim elements outer, heads inner): element e of pair i
// of chunk c of term p for head g sits at ((p * chunks + c) * 16 + i) * 2G + 2g + e.
// `q`: term p of head g at q + p * part_stride + g * row_stride.
inline void amx_pack_queries(const uint16_t* q, int64_t part_stride, int64_t row_stride, int G,
                             int D, int parts, uint16_t* out) {
  const int chunks = D / kAmxChunk;
  for (int p = 0; p < parts; ++p)
    for (int c = 0; c < chunks; ++c)
      for (int i = 0; i < kAmxChunk / 2; ++i)
        for (int g = 0; g < G; ++g)
          for (int e = 0; e < 2; ++e)
            out[((static_cast<int64_t>(p) * chunks + c) * 16 + i) * 2 * G + 2 * g + e] =
                q[p * part_stride + g * row_stride + c * kAmxChunk + 2 * i + e];
}

inline int64_t amx_packed_size(int G, int D) { return 3LL * (D / kAmxChunk) * 16 * 2 * G; }

#if defined(KVTIER_AMX)
constexpr bool kAmxBuilt = true;

// Linux grants a process the tile state only on request; without it the first tile
// instruction faults.
inline bool amx_permitted() {
  static const bool ok = [] {
    constexpr long kGetPerm = 0x1022, kReqPerm = 0x1023, kXtileData = 18;
    unsigned long mask = 0;
    return syscall(SYS_arch_prctl, kReqPerm, kXtileData) == 0 &&
           syscall(SYS_arch_prctl, kGetPerm, &mask) == 0 && ((mask >> kXtileData) & 1) != 0;
  }();
  return ok;
}

struct alignas(64) TileConfig {
  uint8_t palette = 1, start_row = 0, reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

// Tiles 0 and 1: scores, 16 rows x G fp32, of the even and of the odd head_dim chunks (two
// independent accumulations, so one product need not wait for the last); 2 and 3: 16 K rows
// x 32 bf16; 4 and 5: a chunk of packed q, 16 pairs x G heads. The calling thread's state.
inline void amx_configure(int G) {
  TileConfig cfg;
  for (int t = 0; t < 6; ++t) {
    cfg.rows[t] = kAmxRows;
    cfg.colsb[t] = static_cast<uint16_t>(t == 2 || t == 3 ? 2 * kAmxChunk : 4 * G);
  }
  _tile_loadconfig(&cfg);
}

inline void amx_release() { _tile_release(); }

// even[t * G + g] + odd[t * G + g] = q_g . k_t (unscaled) for the 16 rows at k (row stride D
// elements) against q packed by amx_pack_queries.
inline void amx_scores16(const uint16_t* k, int D, const uint16_t* q_packed, int G, int parts,
                         float* even, float* odd) {
  const int chunks = D / kAmxChunk;
  const int64_t q_chunk = 16 * 2 * G;  // elements of one packed chunk
  _tile_zero(0);
  _tile_zero(1);
  for (int c = 0; c < chunks; ++c) {
    const uint16_t* kc = k + c * kAmxChunk;
    for (int p = 0; p < parts; ++p) {
      const uint16_t* qc = q_packed + (static_cast<int64_t>(p) * chunks + c) * q_chunk;
      if (c % 2 == 0) {
        if (p == 0) _tile_loadd(2, kc, 2 * D);
        _tile_loadd(4, qc, 4 * G);
        _tile_dpbf16ps(0, 2, 4);
      } else {
        if (p == 0) _tile_loadd(3, kc, 2 * D);
        _tile_loadd(5, qc, 4 * G);
        _tile_dpbf16ps(1, 3, 5);
      }
    }
  }
  _tile_stored(0, even, 4 * G);
  _tile_stored(1, odd, 4 * G);
}
#else
constexpr bool kAmxBuilt = false;
inline bool amx_permitted() { return false; }
inline void amx_configure(int) {}
inline void amx_release() {}
inline void amx_scores16(const uint16_t*, int, const uint16_t*, int, int, float*, float*) {}
#endif

}  // namespace kvtier_cpu
