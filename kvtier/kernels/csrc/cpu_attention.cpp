// Decode attention on the CPU over host KV pages: one query token per request.
//
// Layout (per layer, K and V alike): pages[num_pages][kv_heads][page_size][head_dim], bf16 or
// fp32, each (page, kv_head) tile of page_size x head_dim contiguous; the page and head
// strides are free, so K and V may be views of one buffer. Request b's token t lives in page
// block_table[b][t / page_size], row t % page_size.
//
// Work: items of (request, kv_head, page range) so that all threads are busy even for one
// request; each item reads its K and V rows once for all G = Hq / Hkv query heads of the group,
// accumulates in fp32 and writes an unnormalized partial (acc, running max, running sum);
// a second pass merges the splits of each (request, kv_head) by log-sum-exp. Scores are kept in
// base 2 (q is pre-multiplied by scale * log2(e)) so the exponentials are exp2.
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
  int group() const { return num_heads / num_kv_heads; }
};

struct Item {
  int b, h, page_lo, page_hi;
  int partial;  // slot in the partial buffers, or -1: the only split, written to out directly
};

// Per-thread scratch, sized for one item.
struct Scratch {
  int stride;  // of scores: page_size rounded up to whole vectors
  std::vector<float> q, acc, scores, m, l;
  explicit Scratch(const Problem& pb)
      : stride((pb.page_size + kWidth - 1) / kWidth * kWidth),
        q(pb.group() * pb.head_dim),
        acc(pb.group() * pb.head_dim),
        scores(pb.group() * stride),
        m(pb.group()),
        l(pb.group()) {}
};

// Tiles are 4 KiB and scattered, so the hardware prefetchers stop at each one; software
// prefetch fetches the tiles kPrefetchPages ahead. Non-temporal: the KV is read once a step.
// (-DKVTIER_PREFETCH_PAGES=n through KVTIER_CPU_ATTENTION_CFLAGS tries another distance.)
#ifndef KVTIER_PREFETCH_PAGES
#define KVTIER_PREFETCH_PAGES 2
#endif
constexpr int kPrefetchPages = KVTIER_PREFETCH_PAGES;

inline void prefetch_tile(const char* p, int64_t bytes) {
#if defined(__AVX512F__) || defined(__AVX2__)
  for (int64_t off = 0; off < bytes; off += 64) _mm_prefetch(p + off, _MM_HINT_NTA);
#else
  (void)p;
  (void)bytes;
#endif
}

// Online-softmax step for head g: fold the tile's n scores into (m, l), rescale acc, and turn
// the scores into weights 2^(s - m).
inline void tile_softmax(const Problem& pb, int g, int n, Scratch& s) {
  const int D = pb.head_dim, stride = s.stride;
  float* sc = s.scores.data() + g * stride;
  float tile_max = kNegInf;
  for (int t = 0; t < n; ++t) tile_max = std::max(tile_max, sc[t]);
  const float m_new = std::max(s.m[g], tile_max);
  const float alpha = s.m[g] == kNegInf ? 0.0f : std::exp2(s.m[g] - m_new);
  for (int t = n; t < stride; ++t) sc[t] = kNegInf;  // padding lanes weigh ~0 and are not summed
  for (int t = 0; t < stride; t += kWidth) vstore(sc + t, vexp2(vadd(vload(sc + t), vset(-m_new))));
  float sum = 0.0f;
  for (int t = 0; t < n; ++t) sum += sc[t];
  s.l[g] = s.l[g] * alpha + sum;
  s.m[g] = m_new;
  if (alpha != 1.0f) {
    float* acc = s.acc.data() + g * D;
    for (int j = 0; j < D; j += kWidth) vstore(acc + j, vmul(vload(acc + j), vset(alpha)));
  }
}

// Query heads are processed in blocks of up to kHeadBlock: a K or V row chunk is widened once
// and used for the whole block from registers, the block's accumulators stay in registers
// (2 x 4 x 4 vectors at most), and the rows stay in L1 for the next block of a larger group.
constexpr int kHeadBlock = 4;
constexpr int kValueChunks = 4;  // vectors of head_dim per register block of the V pass

// scores[g][t] = q_g . k_t (base-2 units) for heads [g0, g0 + GB) and the n valid rows of a
// K tile.
template <int GB, typename T>
inline void block_scores(const Problem& pb, const T* k, int n, int g0, Scratch& s) {
  const int D = pb.head_dim, stride = s.stride;
  const float* q = s.q.data() + g0 * D;
  for (int t = 0; t < n; ++t) {
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

template <int GB, typename T>
inline void block_tile(const Problem& pb, const T* k, const T* v, int n, int g0, Scratch& s) {
  block_scores<GB>(pb, k, n, g0, s);
  for (int g = g0; g < g0 + GB; ++g) tile_softmax(pb, g, n, s);
  const int D = pb.head_dim, full = D / (kValueChunks * kWidth) * kValueChunks * kWidth;
  for (int j = 0; j < full; j += kValueChunks * kWidth) block_values<GB, kValueChunks>(pb, v, n, g0, j, s);
  for (int j = full; j < D; j += kWidth) block_values<GB, 1>(pb, v, n, g0, j, s);
}

// One K tile and its V tile for all heads of the group.
template <typename T>
inline void attend_tile(const Problem& pb, const T* k, const T* v, int n, Scratch& s) {
  const int G = pb.group();
  for (int g0 = 0; g0 < G; g0 += kHeadBlock) {
    switch (std::min(kHeadBlock, G - g0)) {
      case 1: block_tile<1>(pb, k, v, n, g0, s); break;
      case 2: block_tile<2>(pb, k, v, n, g0, s); break;
      case 3: block_tile<3>(pb, k, v, n, g0, s); break;
      default: block_tile<4>(pb, k, v, n, g0, s); break;
    }
  }
}

// One item: the group's attention over pages [page_lo, page_hi) of request b, left in s.
template <typename T>
void attend(const Problem& pb, const Item& it, Scratch& s) {
  const int G = pb.group(), D = pb.head_dim, P = pb.page_size;
  const float qscale = pb.scale * kLog2e;
  for (int g = 0; g < G; ++g) {
    const float* src = pb.q + it.b * pb.q_stride_b + (it.h * G + g) * pb.q_stride_h;
    for (int j = 0; j < D; ++j) s.q[g * D + j] = src[j] * qscale;
    s.m[g] = kNegInf;
    s.l[g] = 0.0f;
  }
  std::fill(s.acc.begin(), s.acc.end(), 0.0f);
  const T* k = static_cast<const T*>(pb.k);
  const T* v = static_cast<const T*>(pb.v);
  const int32_t* table = pb.block_table + it.b * pb.bt_stride;
  const int len = pb.context_lens[it.b];
  const int64_t tile_bytes = static_cast<int64_t>(P) * D * sizeof(T);
  for (int p = it.page_lo; p < it.page_hi; ++p) {
    const int64_t page = table[p];
    const T* kt = k + page * pb.k_stride_page + it.h * pb.k_stride_head;
    const T* vt = v + page * pb.v_stride_page + it.h * pb.v_stride_head;
    if (p + kPrefetchPages < it.page_hi) {  // later tiles stream in while this one is computed
      const int64_t next = table[p + kPrefetchPages];
      prefetch_tile(reinterpret_cast<const char*>(k + next * pb.k_stride_page + it.h * pb.k_stride_head), tile_bytes);
      prefetch_tile(reinterpret_cast<const char*>(v + next * pb.v_stride_page + it.h * pb.v_stride_head), tile_bytes);
    }
    const int n = std::min(P, len - p * P);
    attend_tile(pb, kt, vt, n, s);
  }
}

void write_output(const Problem& pb, int b, int head, const float* acc, float inv_l, float lse) {
  const int D = pb.head_dim;
  const int64_t off = b * pb.out_stride_b + head * pb.out_stride_h;
  if (pb.out_bf16) {
    uint16_t* o = static_cast<uint16_t*>(pb.out) + off;
    for (int j = 0; j < D; ++j) o[j] = to_bf16(acc[j] * inv_l);
  } else {
    float* o = static_cast<float*>(pb.out) + off;
    for (int j = 0; j < D; ++j) o[j] = acc[j] * inv_l;
  }
  pb.lse[static_cast<int64_t>(b) * pb.num_heads + head] = lse;
}

// Natural-log LSE from base-2 running max m and sum l; an empty context gives -inf.
inline float natural_lse(float m, float l) { return l > 0.0f ? (m + std::log2(l)) * kLn2 : kNegInf; }

struct Partials {
  std::vector<float> acc, m, l;  // [slots, G, D], [slots, G], [slots, G]
};

void finish_item(const Problem& pb, const Item& it, const Scratch& s, Partials& parts) {
  const int G = pb.group(), D = pb.head_dim;
  if (it.partial < 0) {
    for (int g = 0; g < G; ++g) {
      const float inv = s.l[g] > 0.0f ? 1.0f / s.l[g] : 0.0f;
      write_output(pb, it.b, it.h * G + g, s.acc.data() + g * D, inv, natural_lse(s.m[g], s.l[g]));
    }
    return;
  }
  std::copy(s.acc.begin(), s.acc.end(), parts.acc.begin() + static_cast<int64_t>(it.partial) * G * D);
  std::copy(s.m.begin(), s.m.end(), parts.m.begin() + static_cast<int64_t>(it.partial) * G);
  std::copy(s.l.begin(), s.l.end(), parts.l.begin() + static_cast<int64_t>(it.partial) * G);
}

// Log-sum-exp merge of splits [first, first + count) of one (request, kv_head).
void merge_splits(const Problem& pb, const Item& it, int first, int count, const Partials& parts,
                  std::vector<float>& acc) {
  const int G = pb.group(), D = pb.head_dim;
  for (int g = 0; g < G; ++g) {
    float m = kNegInf;
    for (int i = 0; i < count; ++i) m = std::max(m, parts.m[(first + i) * G + g]);
    float l = 0.0f;
    std::fill(acc.begin(), acc.begin() + D, 0.0f);
    for (int i = 0; i < count; ++i) {
      const int slot = first + i;
      const float mi = parts.m[slot * G + g];
      if (mi == kNegInf) continue;  // an empty split
      const float w = std::exp2(mi - m);
      l += parts.l[slot * G + g] * w;
      const float* a = parts.acc.data() + (static_cast<int64_t>(slot) * G + g) * D;
      for (int j = 0; j < D; j += kWidth) vstore(acc.data() + j, vfma(vset(w), vload(a + j), vload(acc.data() + j)));
    }
    write_output(pb, it.b, it.h * G + g, acc.data(), l > 0.0f ? 1.0f / l : 0.0f, natural_lse(m, l));
  }
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

// Cut every (request, kv_head) into splits of `pages_per_split` pages (0: about four items per
// thread, at least kMinPagesPerSplit pages each, so the merge stays negligible).
constexpr int kMinPagesPerSplit = 4;
constexpr int kItemsPerThread = 4;

std::vector<Item> plan(const Problem& pb, int threads, int pages_per_split, std::vector<int>& first) {
  int64_t total = 0;
  for (int b = 0; b < pb.batch; ++b) total += (pb.context_lens[b] + pb.page_size - 1) / pb.page_size;
  total *= pb.num_kv_heads;
  int chunk = pages_per_split;
  if (chunk <= 0) {
    const int64_t target = static_cast<int64_t>(threads) * kItemsPerThread;
    chunk = static_cast<int>(std::max<int64_t>(kMinPagesPerSplit, (total + target - 1) / target));
  }
  std::vector<Item> items;
  first.assign(static_cast<size_t>(pb.batch) * pb.num_kv_heads + 1, 0);
  int slots = 0;
  for (int b = 0; b < pb.batch; ++b) {
    const int n = (pb.context_lens[b] + pb.page_size - 1) / pb.page_size;
    const int splits = std::max(1, (n + chunk - 1) / chunk);
    for (int h = 0; h < pb.num_kv_heads; ++h) {
      first[b * pb.num_kv_heads + h] = static_cast<int>(items.size());
      for (int sp = 0; sp < splits; ++sp)
        items.push_back({b, h, sp * chunk, std::min(n, (sp + 1) * chunk), splits > 1 ? slots++ : -1});
    }
  }
  first.back() = static_cast<int>(items.size());
  return items;
}

template <typename T>
void run(const Problem& pb, int threads, int pages_per_split) {
  validate(pb);
  std::vector<int> first;
  const std::vector<Item> items = plan(pb, threads, pages_per_split, first);
  const int G = pb.group(), D = pb.head_dim;
  int slots = 0;
  for (const Item& it : items) slots += it.partial >= 0;
  Partials parts{std::vector<float>(static_cast<size_t>(slots) * G * D),
                 std::vector<float>(static_cast<size_t>(slots) * G),
                 std::vector<float>(static_cast<size_t>(slots) * G)};
  const int num_items = static_cast<int>(items.size());
  const int num_pairs = pb.batch * pb.num_kv_heads;
#pragma omp parallel num_threads(threads)
  {
    Scratch s(pb);
#pragma omp for schedule(dynamic, 1)
    for (int i = 0; i < num_items; ++i) {
      attend<T>(pb, items[i], s);
      finish_item(pb, items[i], s, parts);
    }
#pragma omp for schedule(static)
    for (int pair = 0; pair < num_pairs; ++pair) {
      const int lo = first[pair], count = first[pair + 1] - lo;
      if (count > 1) merge_splits(pb, items[lo], items[lo].partial, count, parts, s.acc);
    }
  }
}

}  // namespace

void decode_attention(uintptr_t q, int64_t q_stride_b, int64_t q_stride_h, uintptr_t k, uintptr_t v,
                      bool kv_bf16, int64_t k_stride_page, int64_t k_stride_head, int64_t v_stride_page,
                      int64_t v_stride_head, uintptr_t block_table, int64_t bt_stride,
                      uintptr_t context_lens, uintptr_t out, bool out_bf16, int64_t out_stride_b,
                      int64_t out_stride_h, uintptr_t lse, int batch, int num_heads, int num_kv_heads,
                      int head_dim, int page_size, int num_pages, int max_pages, float scale,
                      int num_threads, int pages_per_split) {
  if (num_heads % num_kv_heads != 0 || head_dim % kWidth != 0 || num_threads < 1)
    throw std::invalid_argument("cpu decode attention: bad geometry");
  const Problem pb{reinterpret_cast<const float*>(q), q_stride_b, q_stride_h,
                   reinterpret_cast<const void*>(k), reinterpret_cast<const void*>(v),
                   k_stride_page, k_stride_head, v_stride_page, v_stride_head,
                   reinterpret_cast<const int32_t*>(block_table), bt_stride,
                   reinterpret_cast<const int32_t*>(context_lens), reinterpret_cast<void*>(out),
                   out_bf16, out_stride_b, out_stride_h, reinterpret_cast<float*>(lse), batch,
                   num_heads, num_kv_heads, head_dim, page_size, num_pages, max_pages, scale};
  if (kv_bf16)
    run<uint16_t>(pb, num_threads, pages_per_split);
  else
    run<float>(pb, num_threads, pages_per_split);
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "Decode attention over host KV pages (split-KV, OpenMP, fp32 accumulation)";
  m.attr("isa") = kIsa;
  m.attr("vector_width") = kWidth;
  // The GIL is released for the whole call: a Python thread may run it while the main thread works.
  m.def("decode_attention", &decode_attention, py::call_guard<py::gil_scoped_release>(),
        py::arg("q"), py::arg("q_stride_b"), py::arg("q_stride_h"), py::arg("k"), py::arg("v"),
        py::arg("kv_bf16"), py::arg("k_stride_page"), py::arg("k_stride_head"),
        py::arg("v_stride_page"), py::arg("v_stride_head"), py::arg("block_table"),
        py::arg("bt_stride"), py::arg("context_lens"), py::arg("out"), py::arg("out_bf16"),
        py::arg("out_stride_b"), py::arg("out_stride_h"), py::arg("lse"), py::arg("batch"),
        py::arg("num_heads"), py::arg("num_kv_heads"), py::arg("head_dim"), py::arg("page_size"),
        py::arg("num_pages"), py::arg("max_pages"), py::arg("scale"), py::arg("num_threads"),
        py::arg("pages_per_split"));
}
