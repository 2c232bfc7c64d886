// Decode attention on the CPU over host KV pages: one query token per request.
//
// Layout (per layer, K and V alike): pages[num_pages][kv_heads][page_size][head_dim], bf16 or
// fp32, each (page, kv_head) tile of page_size x head_dim contiguous; the page and head
// strides are free, so K and V may be views of one buffer. Request b's token t lives in page
// block_table[b][t / page_size], row t % page_size.
//
// Work: items of (request, KV-head group, page range) so that all threads are busy even for one
// request. By default an item owns every KV head and walks its pages head-inner: in a
// page-first pool a page's tiles of all heads are one contiguous span, which the hardware
// prefetchers stream, where one head's tiles alone are 4 KiB islands. Each item reads its K and
// V rows once for all G = Hq / Hkv query heads of each group, accumulates in fp32 and writes an
// unnormalized partial (acc, running max, running sum); a second pass merges the splits of
// each (request, head group) by log-sum-exp. Scores are kept in base 2 (scaled by
// scale * log2(e)) so the exponentials are exp2.
//
// Per row the costs are the dot products, the softmax and the weighted V sum. The dot products
// run 16 rows against one query head per pass and sum the 16 results with one transpose tree
// instead of a horizontal reduction a row and head; with AVX512-BF16, bf16 K rows go straight
// into vdpbf16ps (exact bf16 products, fp32 sums) against q written as exact bf16 terms. The
// softmax rescales the accumulators only when a tile raises the running max.
//
// The Python wrapper (kvtier/kernels/cpu_attention.py) checks shapes, dtypes and strides and
// passes data pointers; this file validates what only it reads: block ids and context lengths.

#include <pybind11/pybind11.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include "cpu_amx.h"
#include "cpu_simd.h"

namespace py = pybind11;

namespace {

using namespace kvtier_cpu;

constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// ---------------------------------------------------------------------------------------------
struct Problem {
  const float* q;  // [B, Hq, D] fp32
  int64_t q_stride_b, q_stride_h;
  const void* k;  // [num_pages, Hkv, page_size, D]
  const void* v;
  int64_t k_stride_page, k_stride_head, v_stride_page, v_stride_head;  // in elements
  const int32_t* block_table;  // [B, max_pages]
  int64_t bt_stride;
  const int32_t* context_lens;  // [B]
  void* out;  // [B, Hq, D] fp32 or bf16
  bool out_bf16;
  int64_t out_stride_b, out_stride_h;
  float* lse;  // [B, Hq] fp32 contiguous, natural log
  int batch, num_heads, num_kv_heads, head_dim, page_size, num_pages, max_pages;
  float scale;
  int heads_per_item;  // KV heads an item owns (a divisor of num_kv_heads)
  int prefetch_tiles;  // how many (page, head) tiles ahead software prefetch reads
  int prefetch_hint;   // 0 none, 1 non-temporal, 2 all cache levels (T0), 3 outer levels (T2)
  bool amx;            // bf16 pages' scores by AMX tiles (cpu_amx.h) instead of vdpbf16ps
  bool pair_acc;       // accumulators in pair order (block_values_pairs), put back on output
  int group() const { return num_heads / num_kv_heads; }
  int item_heads() const { return heads_per_item * group(); }  // query heads of an item
};

struct Item {
  int b, head_group, page_lo, page_hi;  // KV heads [head_group * heads_per_item, ...)
  int partial;  // slot in the partial buffers, or -1: the only split, written to out directly
};

constexpr int kRowBlock = 16;  // K rows whose scores one pass computes (one vector of them)

// A view of n elements of per-thread storage that lives across calls: it grows, never
// shrinks and is never re-initialised (every element is written before it is read), so a call
// neither allocates nor page-faults fresh memory once the thread has seen a problem that size.
template <typename T>
struct Span {
  T* p;
  size_t n;
  T* data() const { return p; }
  T* begin() const { return p; }
  T* end() const { return p + n; }
  T& operator[](size_t i) const { return p[i]; }
};

template <typename T>
Span<T> carve(std::vector<T>& store, size_t& used, size_t n) {
  Span<T> out{store.data() + used, n};
  used += n;
  return out;
}

template <typename T>
void reserve_for(std::vector<T>& store, size_t n) {
  if (store.size() < n) store.resize(n);
}

// Per-thread scratch, sized for one item (its query heads are "local" heads 0..item_heads).
struct Scratch {
  int stride;  // of scores: page_size rounded up to whole vectors and row blocks
  int dpad;    // head_dim rounded up to 32 (one vector of bf16 pairs)
  int qparts = 1;  // bf16 terms whose sum is q exactly (1 when q is bf16 already)
  Span<float> q, acc, scores, m, l;
  Span<float> lanes;  // [item_heads][kWidth]: each head's softmax sum, lane by lane
  Span<uint16_t> qbf;  // [3][item_heads][dpad]: q as a sum of bf16 terms, unscaled
  Span<uint16_t> q_tiles;  // [heads_per_item][...]: qbf packed for AMX (amx_pack_queries)
  Span<float> amx_even, amx_odd;  // [16][G]: one AMX score block, before the transpose
  explicit Scratch(const Problem& pb)
      : stride((pb.page_size + kRowBlock - 1) / kRowBlock * kRowBlock),
        dpad((pb.head_dim + 31) / 32 * 32) {
    static thread_local std::vector<float> floats;
    static thread_local std::vector<uint16_t> halves;
    const size_t QH = pb.item_heads(), D = pb.head_dim, G = pb.group();
    const size_t packed = pb.amx ? pb.heads_per_item * amx_packed_size(G, dpad) : 0;
    const size_t block = pb.amx ? kAmxRows * G : 0;
    reserve_for(floats, QH * (2 * D + stride + 2 + kWidth) + 2 * block);
    reserve_for(halves, 3 * QH * dpad + packed);
    size_t used = 0;
    q = carve(floats, used, QH * D);
    acc = carve(floats, used, QH * D);
    scores = carve(floats, used, QH * stride);
    m = carve(floats, used, QH);
    l = carve(floats, used, QH);
    lanes = carve(floats, used, QH * kWidth);
    amx_even = carve(floats, used, block);
    amx_odd = carve(floats, used, block);
    used = 0;
    qbf = carve(halves, used, 3 * QH * dpad);
    q_tiles = carve(halves, used, packed);
  }
};

// Tiles are 4 KiB and scattered, so the hardware prefetchers stop at each one; software
// prefetch reads the tile `prefetch_tiles` ahead in the item's (page, head) order. Which
// hint and distance suit a machine is measured (benchmarks/kernels/bench_cpu_attention.py).
inline void prefetch_tile(const char* p, int64_t bytes, int hint) {
#if defined(__AVX512F__) || defined(__AVX2__)
  switch (hint) {
    case 1: for (int64_t off = 0; off < bytes; off += 64) _mm_prefetch(p + off, _MM_HINT_NTA); break;
    case 2: for (int64_t off = 0; off < bytes; off += 64) _mm_prefetch(p + off, _MM_HINT_T0); break;
    case 3: for (int64_t off = 0; off < bytes; off += 64) _mm_prefetch(p + off, _MM_HINT_T2); break;
    default: break;
  }
#else
  (void)p;
  (void)bytes;
  (void)hint;
#endif
}

// Online-softmax step for head g: fold the tile's n scores into (m, l), turn them into weights
// 2^(s - m), and rescale acc only when the running max grows past a finite one (rarely after
// the first tiles). Neither sum is reduced a tile: the max only when a lane passes m, and l
// is kept lane by lane (s.lanes) until the item ends (sum_lanes), so a tile's softmax has no
// horizontal reduction, whose shuffles the score pass's transposes need too.
inline void tile_softmax(const Problem& pb, int g, int n, Scratch& s) {
  const int D = pb.head_dim, stride = s.stride;
  float* sc = s.scores.data() + g * stride;
  float* lanes = s.lanes.data() + g * kWidth;
  for (int t = n; t < stride; ++t) sc[t] = kNegInf;  // padding lanes: weight 0 below
  vec mx = vset(kNegInf);
  for (int t = 0; t < stride; t += kWidth) mx = vmax(mx, vload(sc + t));
  const float m_old = s.m[g];
  if (vany_gt(mx, m_old)) {
    const float tile_max = vhmax(mx);
    if (m_old != kNegInf) {  // before the first tile acc and l are zero: nothing to rescale
      const vec alpha = vset(std::exp2(m_old - tile_max));
      vstore(lanes, vmul(vload(lanes), alpha));
      float* acc = s.acc.data() + g * D;
      for (int j = 0; j < D; j += kWidth) vstore(acc + j, vmul(vload(acc + j), alpha));
    }
    s.m[g] = tile_max;
  }
  const vec neg_m = vset(-s.m[g]);
  vec sum = vload(lanes);
  for (int t = 0; t < stride; t += kWidth) {
    const vec p = vexp2(vadd(vload(sc + t), neg_m));
    vstore(sc + t, p);
    sum = vadd(sum, p);
  }
  vstore(lanes, sum);
  for (int t = n; t < stride; ++t) lanes[t % kWidth] -= sc[t];  // vexp2 floors at 2^-126, not 0
}

// The item's softmax sums, from their lanes.
inline void sum_lanes(const Problem& pb, Scratch& s) {
  for (int lh = 0; lh < pb.item_heads(); ++lh) s.l[lh] = vsum(vload(s.lanes.data() + lh * kWidth));
}

// Query heads are processed in blocks of up to kHeadBlock: a K or V row chunk is widened once
// and used for the whole block from registers, the block's accumulators stay in registers
// (2 x 4 x 4 vectors at most), and the rows stay in L1 for the next block of a larger group.
constexpr int kHeadBlock = 4;
constexpr int kValueChunks = 4;  // vectors of head_dim per register block of the V pass

// scores[g][t] = q_g . k_t (base-2 units) for heads [g0, g0 + GB) and rows [t_begin, n) of a
// K tile, one row at a time (the path of rows that do not fill a row block, and of narrower
// ISAs): 2 x GB horizontal sums a row.
template <int GB, typename T>
inline void block_scores(const Problem& pb, const T* k, int t_begin, int n, int g0, Scratch& s) {
  const int D = pb.head_dim, stride = s.stride;
  const float* q = s.q.data() + g0 * D;
  for (int t = t_begin; t < n; ++t) {
    const T* row = k + static_cast<int64_t>(t) * D;
    vec a[GB][2];
    for (int g = 0; g < GB; ++g) a[g][0] = a[g][1] = vzero();
    int j = 0;
    for (; j + 2 * kWidth <= D; j += 2 * kWidth) {
      const vec x0 = vload(row + j), x1 = vload(row + j + kWidth);
      for (int g = 0; g < GB; ++g) {
        a[g][0] = vfma(vload(q + g * D + j), x0, a[g][0]);
        a[g][1] = vfma(vload(q + g * D + j + kWidth), x1, a[g][1]);
      }
    }
    for (; j < D; j += kWidth) {
      const vec x = vload(row + j);
      for (int g = 0; g < GB; ++g) a[g][0] = vfma(vload(q + g * D + j), x, a[g][0]);
    }
    for (int g = 0; g < GB; ++g) s.scores[(g0 + g) * stride + t] = vsum(vadd(a[g][0], a[g][1]));
  }
}

// acc[g] += sum_t w[g][t] * v_t for heads [g0, g0 + GB), head_dim columns [j0, j0 + NJ * kWidth)
// and the n valid rows of a V tile: the accumulators stay in registers across the rows.
template <int GB, int NJ, typename T>
inline void block_values(const Problem& pb, const T* v, int n, int g0, int j0, Scratch& s) {
  const int D = pb.head_dim, stride = s.stride;
  vec a[GB][NJ];
  for (int g = 0; g < GB; ++g)
    for (int c = 0; c < NJ; ++c) a[g][c] = vload(s.acc.data() + (g0 + g) * D + j0 + c * kWidth);
  for (int t = 0; t < n; ++t) {
    const T* row = v + static_cast<int64_t>(t) * D + j0;
    vec x[NJ];
    for (int c = 0; c < NJ; ++c) x[c] = vload(row + c * kWidth);
    for (int g = 0; g < GB; ++g) {
      const vec w = vset(s.scores[(g0 + g) * stride + t]);
      for (int c = 0; c < NJ; ++c) a[g][c] = vfma(w, x[c], a[g][c]);
    }
  }
  for (int g = 0; g < GB; ++g)
    for (int c = 0; c < NJ; ++c) vstore(s.acc.data() + (g0 + g) * D + j0 + c * kWidth, a[g][c]);
}

#if defined(__AVX512F__)
// The V pass of bf16 pages without a shuffle: a vector of 32 bf16 is 16 pairs, and each pair
// as a 32-bit lane gives its even element by a shift and its odd one by a mask, both exact.
// So acc keeps, per 32 columns, the 16 even ones then the 16 odd ones ("pair order"), which
// the softmax rescale and the split merge never notice (they work column by column) and
// write_output puts back. The widening by vpmovzxwd it replaces is a shuffle, a port that
// the score pass's transposes also need.
template <int GB, int NW>
inline void block_values_pairs(const Problem& pb, const uint16_t* v, int n, int g0, int w0,
                               Scratch& s) {
  const int D = pb.head_dim, stride = s.stride;
  const __m512i high = _mm512_set1_epi32(static_cast<int>(0xFFFF0000u));
  vec a[GB][2 * NW];
  for (int g = 0; g < GB; ++g)
    for (int c = 0; c < 2 * NW; ++c) a[g][c] = vload(s.acc.data() + (g0 + g) * D + w0 * 32 + c * kWidth);
  for (int t = 0; t < n; ++t) {
    const uint16_t* row = v + static_cast<int64_t>(t) * D + w0 * 32;
    vec x[2 * NW];
    for (int w = 0; w < NW; ++w) {
      const __m512i pairs = _mm512_loadu_si512(row + w * 32);
      x[2 * w] = _mm512_castsi512_ps(_mm512_slli_epi32(pairs, 16));
      x[2 * w + 1] = _mm512_castsi512_ps(_mm512_and_si512(pairs, high));
    }
    for (int g = 0; g < GB; ++g) {
      const vec wt = vset(s.scores[(g0 + g) * stride + t]);
      for (int c = 0; c < 2 * NW; ++c) a[g][c] = vfma(wt, x[c], a[g][c]);
    }
  }
  for (int g = 0; g < GB; ++g)
    for (int c = 0; c < 2 * NW; ++c) vstore(s.acc.data() + (g0 + g) * D + w0 * 32 + c * kWidth, a[g][c]);
}
#endif

// Whether bf16 pages' V pass runs in pair order (block_values_pairs).
inline bool pair_order(int head_dim) {
#if defined(__AVX512F__)
  return head_dim % 64 == 0;
#else
  (void)head_dim;
  return false;
#endif
}

// Column j's place in pair order: 32 columns a group, its even columns first.
inline int pair_index(int j) { return (j & ~31) | ((j & 1) << 4) | ((j & 31) >> 1); }

// Scores of whole blocks of kRowBlock rows: one query head against 16 rows at a time, the 16
// dot products summed by one transpose tree (vsum16) and stored as one vector. Compiled for
// the usual head dims (64, 128); returns the rows done, the caller finishes the rest (and
// other head dims) row by row.
template <int D>
inline int row_blocks_f32(const float* k, int n, int g0, int heads, Scratch& s) {
#if defined(__AVX512F__)
  const int full = n / kRowBlock * kRowBlock;
  for (int t0 = 0; t0 < full; t0 += kRowBlock)
    for (int g = g0; g < g0 + heads; ++g)
      _mm512_storeu_ps(s.scores.data() + g * s.stride + t0, vdot16<D>(k + t0 * D, s.q.data() + g * D));
  return full;
#else
  (void)k, (void)n, (void)g0, (void)heads, (void)s;
  return 0;
#endif
}

inline int row_block_scores(const Problem& pb, const float* k, int n, int g0, int heads, Scratch& s) {
  switch (pb.head_dim) {
    case 128: return row_blocks_f32<128>(k, n, g0, heads, s);
    case 64: return row_blocks_f32<64>(k, n, g0, heads, s);
    default: return 0;
  }
}

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512BF16__)
template <int D, int PARTS>
inline int row_blocks_bf16(const Problem& pb, const uint16_t* k, int n, int g0, int heads, Scratch& s) {
  const int full = n / kRowBlock * kRowBlock;
  const int64_t part_stride = static_cast<int64_t>(pb.item_heads()) * s.dpad;
  const __m512 qscale = _mm512_set1_ps(pb.scale * kLog2e);  // q's terms are unscaled
  for (int t0 = 0; t0 < full; t0 += kRowBlock)
    for (int g = g0; g < g0 + heads; ++g)
      _mm512_storeu_ps(s.scores.data() + g * s.stride + t0,
                       _mm512_mul_ps(qscale, vdot16_bf16<D, PARTS>(k + t0 * D, s.qbf.data() + g * s.dpad,
                                                                    part_stride)));
  return full;
}

template <int D>
inline int row_blocks_bf16(const Problem& pb, const uint16_t* k, int n, int g0, int heads, Scratch& s) {
  switch (s.qparts) {
    case 1: return row_blocks_bf16<D, 1>(pb, k, n, g0, heads, s);
    case 2: return row_blocks_bf16<D, 2>(pb, k, n, g0, heads, s);
    default: return row_blocks_bf16<D, 3>(pb, k, n, g0, heads, s);
  }
}
#endif

inline int row_block_scores(const Problem& pb, const uint16_t* k, int n, int g0, int heads, Scratch& s) {
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512BF16__)
  switch (pb.head_dim) {
    case 128: return row_blocks_bf16<128>(pb, k, n, g0, heads, s);
    case 64: return row_blocks_bf16<64>(pb, k, n, g0, heads, s);
    default: return 0;
  }
#else
  (void)pb, (void)k, (void)n, (void)g0, (void)heads, (void)s;
  return 0;
#endif
}

template <int GB, typename T>
inline void block_tile(const Problem& pb, const T* k, const T* v, int n, int g0, int scored,
                       Scratch& s) {
  const int done = scored > 0 ? scored : row_block_scores(pb, k, n, g0, GB, s);
  block_scores<GB>(pb, k, done, n, g0, s);
  for (int g = g0; g < g0 + GB; ++g) tile_softmax(pb, g, n, s);
#if defined(__AVX512F__)
  if constexpr (sizeof(T) == 2) {
    if (pb.pair_acc) {  // 64 columns a pass: 4 accumulators a head, as below
      for (int w = 0; w < pb.head_dim / 32; w += 2) block_values_pairs<GB, 2>(pb, v, n, g0, w, s);
      return;
    }
  }
#endif
  const int D = pb.head_dim, full = D / (kValueChunks * kWidth) * kValueChunks * kWidth;
  for (int j = 0; j < full; j += kValueChunks * kWidth) block_values<GB, kValueChunks>(pb, v, n, g0, j, s);
  for (int j = full; j < D; j += kWidth) block_values<GB, 1>(pb, v, n, g0, j, s);
}

// Scores of the whole 16-row blocks of a bf16 K tile for all G query heads of its KV head by
// AMX tiles, base-2 scaled into s.scores; returns the rows done (0 where AMX is off).
inline int amx_tile_scores(const Problem& pb, const uint16_t* k, int n, int g_begin, Scratch& s) {
  if (!pb.amx) return 0;
  const int G = pb.group(), D = pb.head_dim, full = n / kAmxRows * kAmxRows;
  const float qscale = pb.scale * kLog2e;
  const uint16_t* q = s.q_tiles.data() + (g_begin / G) * amx_packed_size(G, s.dpad);
  for (int t0 = 0; t0 < full; t0 += kAmxRows) {
    amx_scores16(k + static_cast<int64_t>(t0) * D, D, q, G, s.qparts, s.amx_even.data(),
                 s.amx_odd.data());
    for (int g = 0; g < G; ++g) {
      float* sc = s.scores.data() + (g_begin + g) * s.stride + t0;
      for (int t = 0; t < kAmxRows; ++t) sc[t] = qscale * (s.amx_even[t * G + g] + s.amx_odd[t * G + g]);
    }
  }
  return full;
}

inline int amx_tile_scores(const Problem&, const float*, int, int, Scratch&) { return 0; }

// One K tile and its V tile for the query heads [g_begin, g_begin + G) of one KV head.
template <typename T>
inline void attend_tile(const Problem& pb, const T* k, const T* v, int n, int g_begin, Scratch& s) {
  const int G = pb.group(), scored = amx_tile_scores(pb, k, n, g_begin, s);
  for (int g0 = 0; g0 < G; g0 += kHeadBlock) {
    switch (std::min(kHeadBlock, G - g0)) {
      case 1: block_tile<1>(pb, k, v, n, g_begin + g0, scored, s); break;
      case 2: block_tile<2>(pb, k, v, n, g_begin + g0, scored, s); break;
      case 3: block_tile<3>(pb, k, v, n, g_begin + g0, scored, s); break;
      default: block_tile<4>(pb, k, v, n, g_begin + g0, scored, s); break;
    }
  }
}

// Whether bf16 pages take the vdpbf16ps row-block path (row_block_scores).
inline bool bf16_dot(const Problem& pb) {
  return kBf16Dot && (pb.head_dim == 64 || pb.head_dim == 128);
}

// The item's queries: fp32 pre-scaled to base 2 (row-by-row and fp32 paths), and for the bf16
// dot path q itself as a sum of up to three bf16 terms (exact for an fp32 q; one term, and one
// pass, for a q that is bf16 already), scaled after the dot product.
void load_queries(const Problem& pb, const Item& it, bool bf16_pages, Scratch& s) {
  const int QH = pb.item_heads(), D = pb.head_dim;
  const float qscale = pb.scale * kLog2e;
  s.qparts = 1;
  for (int lh = 0; lh < QH; ++lh) {
    const float* src = pb.q + it.b * pb.q_stride_b + (it.head_group * QH + lh) * pb.q_stride_h;
    for (int j = 0; j < D; ++j) s.q[lh * D + j] = src[j] * qscale;
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512BF16__)
    if (bf16_pages && bf16_dot(pb))
      s.qparts = std::max(s.qparts, split_bf16(src, s.qbf.data() + static_cast<int64_t>(lh) * s.dpad,
                                               static_cast<int64_t>(QH) * s.dpad, D));
#else
    (void)bf16_pages;
#endif
    s.m[lh] = kNegInf;
    vstore(s.lanes.data() + lh * kWidth, vzero());  // s.l comes from these (sum_lanes)
  }
  std::fill(s.acc.begin(), s.acc.end(), 0.0f);
  if (pb.amx) {
    const int G = pb.group();
    for (int hh = 0; hh < pb.heads_per_item; ++hh)
      amx_pack_queries(s.qbf.data() + static_cast<int64_t>(hh) * G * s.dpad,
                       static_cast<int64_t>(QH) * s.dpad, s.dpad, G, s.dpad, s.qparts,
                       s.q_tiles.data() + hh * amx_packed_size(G, s.dpad));
  }
}

// One item: attention of its query heads over pages [page_lo, page_hi) of request b, left in s.
// Page outer, KV head inner: with the usual page-first pool a page's tiles of all heads are one
// contiguous span, so an item that owns every head streams whole spans.
template <typename T>
void attend(const Problem& pb, const Item& it, Scratch& s) {
  const int G = pb.group(), D = pb.head_dim, P = pb.page_size, H = pb.heads_per_item;
  load_queries(pb, it, sizeof(T) == 2, s);
  const T* k = static_cast<const T*>(pb.k);
  const T* v = static_cast<const T*>(pb.v);
  const int32_t* table = pb.block_table + it.b * pb.bt_stride;
  const int len = pb.context_lens[it.b], h0 = it.head_group * H;
  const int64_t tile_bytes = static_cast<int64_t>(P) * D * sizeof(T);
  const int64_t tiles = static_cast<int64_t>(it.page_hi - it.page_lo) * H;
  if (pb.amx) amx_configure(G);  // per item: other code on this thread may have used the tiles
  for (int64_t i = 0; i < tiles; ++i) {
    const int64_t page = table[it.page_lo + i / H];
    const int h = h0 + static_cast<int>(i % H);
    if (pb.prefetch_hint != 0 && i + pb.prefetch_tiles < tiles) {
      const int64_t j = i + pb.prefetch_tiles;  // a later tile streams in while this one is computed
      const int64_t next = table[it.page_lo + j / H], hn = h0 + j % H;
      prefetch_tile(reinterpret_cast<const char*>(k + next * pb.k_stride_page + hn * pb.k_stride_head), tile_bytes, pb.prefetch_hint);
      prefetch_tile(reinterpret_cast<const char*>(v + next * pb.v_stride_page + hn * pb.v_stride_head), tile_bytes, pb.prefetch_hint);
    }
    const int n = std::min(P, len - (it.page_lo + static_cast<int>(i / H)) * P);
    attend_tile(pb, k + page * pb.k_stride_page + h * pb.k_stride_head,
                v + page * pb.v_stride_page + h * pb.v_stride_head, n, (h - h0) * G, s);
  }
  if (pb.amx) amx_release();
  sum_lanes(pb, s);
}

void write_output(const Problem& pb, int b, int head, const float* acc, float inv_l, float lse) {
  const int D = pb.head_dim;
  const int64_t off = b * pb.out_stride_b + head * pb.out_stride_h;
  auto at = [&](int j) { return acc[pb.pair_acc ? pair_index(j) : j] * inv_l; };
  if (pb.out_bf16) {
    uint16_t* o = static_cast<uint16_t*>(pb.out) + off;
    for (int j = 0; j < D; ++j) o[j] = to_bf16(at(j));
  } else {
    float* o = static_cast<float*>(pb.out) + off;
    for (int j = 0; j < D; ++j) o[j] = at(j);
  }
  pb.lse[static_cast<int64_t>(b) * pb.num_heads + head] = lse;
}

// Natural-log LSE from base-2 running max m and sum l; an empty context gives -inf.
inline float natural_lse(float m, float l) { return l > 0.0f ? (m + std::log2(l)) * kLn2 : kNegInf; }

struct Partials {
  Span<float> acc, m, l;  // [slots, item_heads, D], [slots, item_heads] (twice)
  Partials(size_t slots, size_t QH, size_t D) {
    static thread_local std::vector<float> store;  // the calling thread's
    reserve_for(store, slots * QH * (D + 2));
    size_t used = 0;
    acc = carve(store, used, slots * QH * D);
    m = carve(store, used, slots * QH);
    l = carve(store, used, slots * QH);
  }
};

void finish_item(const Problem& pb, const Item& it, const Scratch& s, Partials& parts) {
  const int QH = pb.item_heads(), D = pb.head_dim;
  if (it.partial < 0) {
    for (int lh = 0; lh < QH; ++lh) {
      const float inv = s.l[lh] > 0.0f ? 1.0f / s.l[lh] : 0.0f;
      write_output(pb, it.b, it.head_group * QH + lh, s.acc.data() + lh * D, inv,
                   natural_lse(s.m[lh], s.l[lh]));
    }
    return;
  }
  std::copy(s.acc.begin(), s.acc.end(), parts.acc.begin() + static_cast<int64_t>(it.partial) * QH * D);
  std::copy(s.m.begin(), s.m.end(), parts.m.begin() + static_cast<int64_t>(it.partial) * QH);
  std::copy(s.l.begin(), s.l.end(), parts.l.begin() + static_cast<int64_t>(it.partial) * QH);
}

// Log-sum-exp merge of splits [first, first + count) of one (request, head group), for its
// local query head lh.
void merge_splits(const Problem& pb, const Item& it, int lh, int first, int count,
                  const Partials& parts, Span<float> acc) {
  const int QH = pb.item_heads(), D = pb.head_dim;
  float m = kNegInf;
  for (int i = 0; i < count; ++i) m = std::max(m, parts.m[(first + i) * QH + lh]);
  float l = 0.0f;
  std::fill(acc.begin(), acc.begin() + D, 0.0f);
  for (int i = 0; i < count; ++i) {
    const int slot = first + i;
    const float mi = parts.m[slot * QH + lh];
    if (mi == kNegInf) continue;  // an empty split
    const float w = std::exp2(mi - m);
    l += parts.l[slot * QH + lh] * w;
    const float* a = parts.acc.data() + (static_cast<int64_t>(slot) * QH + lh) * D;
    for (int j = 0; j < D; j += kWidth) vstore(acc.data() + j, vfma(vset(w), vload(a + j), vload(acc.data() + j)));
  }
  write_output(pb, it.b, it.head_group * QH + lh, acc.data(), l > 0.0f ? 1.0f / l : 0.0f,
               natural_lse(m, l));
}

void validate(const Problem& pb) {
  for (int b = 0; b < pb.batch; ++b) {
    const int len = pb.context_lens[b];
    if (len < 0 || static_cast<int64_t>(len) > static_cast<int64_t>(pb.max_pages) * pb.page_size)
      throw std::invalid_argument("context_lens[" + std::to_string(b) + "] = " + std::to_string(len) +
                                  " outside [0, max_pages * page_size = " +
                                  std::to_string(static_cast<int64_t>(pb.max_pages) * pb.page_size) + "]");
    const int n = (len + pb.page_size - 1) / pb.page_size;
    for (int p = 0; p < n; ++p) {
      const int32_t id = pb.block_table[b * pb.bt_stride + p];
      if (id < 0 || id >= pb.num_pages)
        throw std::invalid_argument("block_tables[" + std::to_string(b) + ", " + std::to_string(p) +
                                    "] = " + std::to_string(id) + " outside [0, " +
                                    std::to_string(pb.num_pages) + ")");
    }
  }
}

// Work items: (request, head group, page range). Every (request, head group) is cut into
// splits of `pages_per_split` pages (0: about kItemsPerThread items per thread, at least
// kMinPagesPerSplit pages each, so the merge stays negligible).
constexpr int kMinPagesPerSplit = 4;
constexpr int kItemsPerThread = 4;

int64_t total_pages(const Problem& pb) {
  int64_t total = 0;
  for (int b = 0; b < pb.batch; ++b) total += (pb.context_lens[b] + pb.page_size - 1) / pb.page_size;
  return total;
}

// KV heads an item owns (0 asks for the default): all of them, so that an item streams whole
// page spans, unless the problem is too small to give every thread its items that way.
int choose_heads_per_item(int64_t pages, int num_kv_heads, int threads, int requested) {
  if (requested > 0) return requested;
  return pages >= static_cast<int64_t>(threads) * kItemsPerThread * kMinPagesPerSplit ? num_kv_heads : 1;
}

std::vector<Item> plan(const Problem& pb, int threads, int pages_per_split, std::vector<int>& first) {
  const int groups = pb.num_kv_heads / pb.heads_per_item;
  const int64_t total = total_pages(pb) * groups;
  int chunk = pages_per_split;
  if (chunk <= 0) {
    const int64_t target = static_cast<int64_t>(threads) * kItemsPerThread;
    chunk = static_cast<int>(std::max<int64_t>(kMinPagesPerSplit, (total + target - 1) / target));
  }
  std::vector<Item> items;
  first.assign(static_cast<size_t>(pb.batch) * groups + 1, 0);
  int slots = 0;
  for (int b = 0; b < pb.batch; ++b) {
    const int n = (pb.context_lens[b] + pb.page_size - 1) / pb.page_size;
    const int splits = std::max(1, (n + chunk - 1) / chunk);
    for (int hg = 0; hg < groups; ++hg) {
      first[b * groups + hg] = static_cast<int>(items.size());
      for (int sp = 0; sp < splits; ++sp)
        items.push_back({b, hg, sp * chunk, std::min(n, (sp + 1) * chunk), splits > 1 ? slots++ : -1});
    }
  }
  first.back() = static_cast<int>(items.size());
  return items;
}

template <typename T>
void run(const Problem& pb, int threads, int pages_per_split) {
  std::vector<int> first;
  const std::vector<Item> items = plan(pb, threads, pages_per_split, first);
  const int QH = pb.item_heads(), D = pb.head_dim;
  int slots = 0;
  for (const Item& it : items) slots += it.partial >= 0;
  Partials parts(slots, QH, D);
  const int num_items = static_cast<int>(items.size());
  const int num_pairs = static_cast<int>(first.size()) - 1;
#pragma omp parallel num_threads(threads)
  {
    Scratch s(pb);
#pragma omp for schedule(dynamic, 1)
    for (int i = 0; i < num_items; ++i) {
      attend<T>(pb, items[i], s);
      finish_item(pb, items[i], s, parts);
    }
    // One merge per (request, head group, query head): a single long request's merge is
    // spread over the threads too.
#pragma omp for schedule(static)
    for (int64_t job = 0; job < static_cast<int64_t>(num_pairs) * QH; ++job) {
      const int pair = static_cast<int>(job / QH), lh = static_cast<int>(job % QH);
      const int lo = first[pair], count = first[pair + 1] - lo;
      if (count > 1) merge_splits(pb, items[lo], lh, items[lo].partial, count, parts, s.acc);
    }
  }
}

}  // namespace

// The problem of one call, checked; `q` is fp32 (the layer calls convert theirs first).
Problem make_problem(uintptr_t q, int64_t q_stride_b, int64_t q_stride_h, uintptr_t k, uintptr_t v,
                     bool kv_bf16, int64_t k_stride_page, int64_t k_stride_head,
                     int64_t v_stride_page, int64_t v_stride_head, uintptr_t block_table,
                     int64_t bt_stride, uintptr_t context_lens, uintptr_t out, bool out_bf16,
                     int64_t out_stride_b, int64_t out_stride_h, uintptr_t lse, int batch,
                     int num_heads, int num_kv_heads, int head_dim, int page_size, int num_pages,
                     int max_pages, float scale, int num_threads, int heads_per_item,
                     int prefetch_tiles, int prefetch_hint, bool use_amx) {
  if (num_heads % num_kv_heads != 0 || head_dim % kWidth != 0 || num_threads < 1 ||
      heads_per_item < 0 || (heads_per_item > 0 && num_kv_heads % heads_per_item != 0) ||
      prefetch_tiles < 0 || prefetch_hint < 0 || prefetch_hint > 3)
    throw std::invalid_argument("cpu decode attention: bad geometry or tuning");
  Problem pb{reinterpret_cast<const float*>(q), q_stride_b, q_stride_h,
             reinterpret_cast<const void*>(k), reinterpret_cast<const void*>(v),
             k_stride_page, k_stride_head, v_stride_page, v_stride_head,
             reinterpret_cast<const int32_t*>(block_table), bt_stride,
             reinterpret_cast<const int32_t*>(context_lens), reinterpret_cast<void*>(out),
             out_bf16, out_stride_b, out_stride_h, reinterpret_cast<float*>(lse), batch,
             num_heads, num_kv_heads, head_dim, page_size, num_pages, max_pages, scale,
             heads_per_item, prefetch_tiles, prefetch_hint, false, false};
  pb.amx = use_amx && kv_bf16 && bf16_dot(pb) && pb.group() <= kAmxMaxGroup && amx_permitted();
  pb.pair_acc = kv_bf16 && pair_order(head_dim);
  return pb;
}

// Runs a made and validated problem (its pointers set): `pb.heads_per_item` 0 picks the default.
void run_validated(Problem pb, bool kv_bf16, int num_threads, int pages_per_split) {
  pb.heads_per_item = choose_heads_per_item(total_pages(pb), pb.num_kv_heads, num_threads,
                                            pb.heads_per_item);
  if (kv_bf16)
    run<uint16_t>(pb, num_threads, pages_per_split);
  else
    run<float>(pb, num_threads, pages_per_split);
}

void run_problem(const Problem& pb, bool kv_bf16, int num_threads, int pages_per_split) {
  validate(pb);
  run_validated(pb, kv_bf16, num_threads, pages_per_split);
}

void decode_attention(uintptr_t q, int64_t q_stride_b, int64_t q_stride_h, uintptr_t k, uintptr_t v,
                      bool kv_bf16, int64_t k_stride_page, int64_t k_stride_head, int64_t v_stride_page,
                      int64_t v_stride_head, uintptr_t block_table, int64_t bt_stride,
                      uintptr_t context_lens, uintptr_t out, bool out_bf16, int64_t out_stride_b,
                      int64_t out_stride_h, uintptr_t lse, int batch, int num_heads, int num_kv_heads,
                      int head_dim, int page_size, int num_pages, int max_pages, float scale,
                      int num_threads, int pages_per_split, int heads_per_item, int prefetch_tiles,
                      int prefetch_hint, bool use_amx) {
  const Problem pb = make_problem(q, q_stride_b, q_stride_h, k, v, kv_bf16, k_stride_page,
                                  k_stride_head, v_stride_page, v_stride_head, block_table,
                                  bt_stride, context_lens, out, out_bf16, out_stride_b,
                                  out_stride_h, lse, batch, num_heads, num_kv_heads, head_dim,
                                  page_size, num_pages, max_pages, scale, num_threads,
                                  heads_per_item, prefetch_tiles, prefetch_hint, use_amx);
  run_problem(pb, kv_bf16, num_threads, pages_per_split);
}

#include "cpu_layer_call.h"
#include "cpu_step_call.h"

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "Decode attention over host KV pages (split-KV, OpenMP, fp32 accumulation)";
  m.attr("isa") = kIsa;
  m.attr("vector_width") = kWidth;
  m.attr("bf16_dot") = kBf16Dot;
  m.attr("amx_built") = kAmxBuilt;
  // Whether the tile path can run here: built for AMX and granted the tile state by the OS.
  m.def("amx_usable", [] { return kAmxBuilt && amx_permitted(); });
  // The GIL is released for the whole call: a Python thread may run it while the main thread works.
  m.def("decode_attention", &decode_attention, py::call_guard<py::gil_scoped_release>(),
        py::arg("q"), py::arg("q_stride_b"), py::arg("q_stride_h"), py::arg("k"), py::arg("v"),
        py::arg("kv_bf16"), py::arg("k_stride_page"), py::arg("k_stride_head"),
        py::arg("v_stride_page"), py::arg("v_stride_head"), py::arg("block_table"),
        py::arg("bt_stride"), py::arg("context_lens"), py::arg("out"), py::arg("out_bf16"),
        py::arg("out_stride_b"), py::arg("out_stride_h"), py::arg("lse"), py::arg("batch"),
        py::arg("num_heads"), py::arg("num_kv_heads"), py::arg("head_dim"), py::arg("page_size"),
        py::arg("num_pages"), py::arg("max_pages"), py::arg("scale"), py::arg("num_threads"),
        py::arg("pages_per_split"), py::arg("heads_per_item"), py::arg("prefetch_tiles"),
        py::arg("prefetch_hint"), py::arg("use_amx"));
  bind_layer_calls(m);
  bind_step_calls(m);
}
