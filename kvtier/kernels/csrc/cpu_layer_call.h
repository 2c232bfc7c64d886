// The CPU attention's call a layer (included by cpu_attention.cpp, after make_problem and
// run_validated): the step's rows' new K and V written into their host pages, then decode
// attention over the pages, as one job on a JobThread (cpu_worker.h).
//
// A step makes one LayerTemplate (the geometry, strides and settings every layer shares,
// checked once); each layer submits only its pointers: q and the new K/V rows (bf16 or fp32,
// q converted to fp32 here, off the caller's thread), the layer's K and V pages, its block
// table and slots, the output and LSE. The caller keeps every buffer alive until it waits.
#pragma once

#include "cpu_worker.h"

namespace {

using kvtier_cpu::from_bf16;
using kvtier_cpu::JobThread;

struct LayerTemplate {
  Problem pb;  // pointers unset
  bool kv_bf16 = false, q_bf16 = false;
  int num_threads = 1, pages_per_split = 0;
  int64_t new_stride_b = 0, new_stride_h = 0;  // of the new K and V rows, in elements
};

struct LayerPointers {
  uintptr_t q, k_pages, v_pages, block_table, slots, new_k, new_v, out, lse;
};

// Writes row b's new K/V ([Hkv, D] each, strided) at its slot (-1: none) of the layer's pages;
// every slot is checked before the first write, so a bad one changes no page.
template <typename T>
void write_new_kv(const LayerTemplate& t, const LayerPointers& p) {
  const Problem& pb = t.pb;
  const int64_t* slots = reinterpret_cast<const int64_t*>(p.slots);
  const int64_t capacity = static_cast<int64_t>(pb.num_pages) * pb.page_size;
  for (int b = 0; b < pb.batch; ++b)
    if (slots[b] >= capacity)
      throw std::invalid_argument("slots[" + std::to_string(b) + "] = " + std::to_string(slots[b]) +
                                  " outside the " + std::to_string(capacity) + " page rows");
  for (int b = 0; b < pb.batch; ++b) {
    const int64_t slot = slots[b];
    if (slot < 0) continue;
    const int64_t page = slot / pb.page_size, row = slot % pb.page_size;
    for (int h = 0; h < pb.num_kv_heads; ++h) {
      const int64_t src = b * t.new_stride_b + h * t.new_stride_h;
      T* k = reinterpret_cast<T*>(p.k_pages) + page * pb.k_stride_page + h * pb.k_stride_head;
      T* v = reinterpret_cast<T*>(p.v_pages) + page * pb.v_stride_page + h * pb.v_stride_head;
      std::copy_n(reinterpret_cast<const T*>(p.new_k) + src, pb.head_dim, k + row * pb.head_dim);
      std::copy_n(reinterpret_cast<const T*>(p.new_v) + src, pb.head_dim, v + row * pb.head_dim);
    }
  }
}

// q as the kernel reads it: fp32 [B, Hq, D], contiguous (converted into `buf` if bf16).
const float* fp32_q(const LayerTemplate& t, uintptr_t q, std::vector<float>& buf) {
  const Problem& pb = t.pb;
  if (!t.q_bf16) return reinterpret_cast<const float*>(q);
  buf.resize(static_cast<size_t>(pb.batch) * pb.num_heads * pb.head_dim);
  const uint16_t* src = reinterpret_cast<const uint16_t*>(q);
  for (int b = 0; b < pb.batch; ++b)
    for (int h = 0; h < pb.num_heads; ++h)
      for (int d = 0; d < pb.head_dim; ++d)
        buf[(static_cast<size_t>(b) * pb.num_heads + h) * pb.head_dim + d] =
            from_bf16(src[b * pb.q_stride_b + h * pb.q_stride_h + d]);
  return buf.data();
}

// Block ids and slots are checked before the first write: a bad one changes no page.
void run_layer(const LayerTemplate& t, const LayerPointers& p) {
  thread_local std::vector<float> q_buf;  // the job thread's, reused a layer after another
  Problem pb = t.pb;
  pb.q = fp32_q(t, p.q, q_buf);
  if (t.q_bf16) {  // the converted copy is contiguous
    pb.q_stride_b = static_cast<int64_t>(pb.num_heads) * pb.head_dim;
    pb.q_stride_h = pb.head_dim;
  }
  pb.k = reinterpret_cast<const void*>(p.k_pages);
  pb.v = reinterpret_cast<const void*>(p.v_pages);
  pb.block_table = reinterpret_cast<const int32_t*>(p.block_table);
  pb.out = reinterpret_cast<void*>(p.out);
  pb.lse = reinterpret_cast<float*>(p.lse);
  validate(pb);
  if (t.kv_bf16)
    write_new_kv<uint16_t>(t, p);
  else
    write_new_kv<float>(t, p);
  run_validated(pb, t.kv_bf16, t.num_threads, t.pages_per_split);
}

LayerTemplate make_template(bool q_bf16, int64_t q_stride_b, int64_t q_stride_h, bool kv_bf16,
                            int64_t k_stride_page, int64_t k_stride_head, int64_t v_stride_page,
                            int64_t v_stride_head, int64_t bt_stride, uintptr_t context_lens,
                            bool out_bf16, int64_t out_stride_b, int64_t out_stride_h,
                            int64_t new_stride_b, int64_t new_stride_h, int batch, int num_heads,
                            int num_kv_heads, int head_dim, int page_size, int num_pages,
                            int max_pages, float scale, int num_threads, int pages_per_split,
                            int heads_per_item, int prefetch_tiles, int prefetch_hint,
                            bool use_amx) {
  LayerTemplate t;
  t.pb = make_problem(0, q_stride_b, q_stride_h, 0, 0, kv_bf16, k_stride_page, k_stride_head,
                      v_stride_page, v_stride_head, 0, bt_stride, context_lens, 0, out_bf16,
                      out_stride_b, out_stride_h, 0, batch, num_heads, num_kv_heads, head_dim,
                      page_size, num_pages, max_pages, scale, num_threads, heads_per_item,
                      prefetch_tiles, prefetch_hint, use_amx);
  t.kv_bf16 = kv_bf16, t.q_bf16 = q_bf16, t.num_threads = num_threads;
  t.pages_per_split = pages_per_split, t.new_stride_b = new_stride_b, t.new_stride_h = new_stride_h;
  return t;
}

}  // namespace

void bind_layer_calls(py::module& m) {
  py::class_<LayerTemplate>(m, "LayerTemplate", py::module_local());
  m.def("layer_template", &make_template, py::arg("q_bf16"), py::arg("q_stride_b"),
        py::arg("q_stride_h"), py::arg("kv_bf16"), py::arg("k_stride_page"),
        py::arg("k_stride_head"), py::arg("v_stride_page"), py::arg("v_stride_head"),
        py::arg("bt_stride"), py::arg("context_lens"), py::arg("out_bf16"),
        py::arg("out_stride_b"), py::arg("out_stride_h"), py::arg("new_stride_b"),
        py::arg("new_stride_h"), py::arg("batch"), py::arg("num_heads"),
        py::arg("num_kv_heads"), py::arg("head_dim"), py::arg("page_size"),
        py::arg("num_pages"), py::arg("max_pages"), py::arg("scale"), py::arg("num_threads"),
        py::arg("pages_per_split"), py::arg("heads_per_item"), py::arg("prefetch_tiles"),
        py::arg("prefetch_hint"), py::arg("use_amx"));
  py::class_<JobThread>(m, "JobThread", py::module_local())  // several builds may load at once
      .def(py::init<>())
      // Positional pointers: this runs once a layer, where keyword parsing would cost more.
      .def("submit_layer",
           [](JobThread& w, const LayerTemplate& t, uintptr_t q, uintptr_t k_pages,
              uintptr_t v_pages, uintptr_t block_table, uintptr_t slots, uintptr_t new_k,
              uintptr_t new_v, uintptr_t out, uintptr_t lse) {
             const LayerPointers p{q, k_pages, v_pages, block_table, slots, new_k, new_v, out, lse};
             return w.submit([t, p] { run_layer(t, p); });
           })
      .def("wait", &JobThread::wait, py::call_guard<py::gil_scoped_release>())
      .def("native_id", &JobThread::native_id, py::call_guard<py::gil_scoped_release>())
      .def("jobs_run", &JobThread::jobs_run)
      .def("close", &JobThread::stop, py::call_guard<py::gil_scoped_release>());
}
