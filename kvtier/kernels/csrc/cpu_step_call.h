// A whole step's CPU attention as one job, handed its layers through flags in pinned host
// memory (included by cpu_attention.cpp, after cpu_layer_call.h).
//
// Why: a step replayed as one CUDA graph has no Python between its layers to copy q/k/v
// down and wait for the output. Instead the graph's kernels write layer l's q/k/v rows into
// pinned memory and then `ready[l] = epoch`; this job, started before the replay, waits for
// that, runs the layer (run_layer: new K/V into the pages, attention into the layer's own
// output rows) and sets `done[l] = epoch`, which the graph's next kernel waits for before it
// reads the output back. A failed layer (or a wait past the timeout) sets every remaining
// `done` to -epoch, so the GPU never waits for a layer that will not come; the error is
// rethrown to whoever waits on the job's ticket. The host may cancel a job whose replay
// never started by setting `ready[l] = -epoch`.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include <time.h>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define KVTIER_SPIN_PAUSE() _mm_pause()
#else
#define KVTIER_SPIN_PAUSE() std::atomic_signal_fence(std::memory_order_seq_cst)
#endif

namespace {

constexpr int kLayerPointerCount = 9;  // the fields of LayerPointers, in order

int32_t load_flag(const int32_t* flag) { return __atomic_load_n(flag, __ATOMIC_ACQUIRE); }

void store_flag(int32_t* flag, int32_t value) { __atomic_store_n(flag, value, __ATOMIC_RELEASE); }

// Spins until *flag is epoch (the layer's inputs are in place); throws on -epoch (cancelled)
// or past the deadline.
void wait_ready(const int32_t* flag, int32_t epoch, double timeout_s, size_t layer) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  for (uint32_t spins = 0;; ++spins) {
    const int32_t seen = load_flag(flag);
    if (seen == epoch) return;
    if (seen == -epoch) throw std::runtime_error("the step was cancelled before layer " +
                                                 std::to_string(layer) + "'s inputs came");
    if ((spins & 1023u) == 0 && std::chrono::steady_clock::now() > deadline)
      throw std::runtime_error("layer " + std::to_string(layer) + "'s inputs did not come within " +
                               std::to_string(timeout_s) + " s");
    KVTIER_SPIN_PAUSE();
  }
}

int64_t monotonic_ns() {  // CLOCK_MONOTONIC, as Python's time.monotonic_ns()
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}

// `times` (or null): per layer, when its inputs were seen and when its done flag was set
// ([num_layers, 2] int64 ns): what the step's CPU side and the waits between cost.
void run_step(const LayerTemplate& t, const std::vector<LayerPointers>& layers, int32_t* ready,
              int32_t* done, int32_t epoch, double timeout_s, int64_t* times) {
  for (size_t l = 0; l < layers.size(); ++l) {
    try {
      wait_ready(ready + l, epoch, timeout_s, l);
      if (times) times[2 * l] = monotonic_ns();
      run_layer(t, layers[l]);
    } catch (...) {
      for (size_t j = l; j < layers.size(); ++j) store_flag(done + j, -epoch);
      throw;
    }
    store_flag(done + l, epoch);
    if (times) times[2 * l + 1] = monotonic_ns();
  }
}

// `pointers`: the address of a contiguous int64 [num_layers, 9] array of LayerPointers
// (copied here: the caller's array may go once this returns).
std::vector<LayerPointers> read_pointers(uintptr_t pointers, int64_t num_layers) {
  if (num_layers < 1) throw std::invalid_argument("a step has at least one layer");
  const int64_t* p = reinterpret_cast<const int64_t*>(pointers);
  std::vector<LayerPointers> layers(static_cast<size_t>(num_layers));
  for (int64_t l = 0; l < num_layers; ++l) {
    const int64_t* r = p + l * kLayerPointerCount;
    layers[l] = LayerPointers{static_cast<uintptr_t>(r[0]), static_cast<uintptr_t>(r[1]),
                              static_cast<uintptr_t>(r[2]), static_cast<uintptr_t>(r[3]),
                              static_cast<uintptr_t>(r[4]), static_cast<uintptr_t>(r[5]),
                              static_cast<uintptr_t>(r[6]), static_cast<uintptr_t>(r[7]),
                              static_cast<uintptr_t>(r[8])};
  }
  return layers;
}

}  // namespace

void bind_step_calls(py::module& m) {
  m.attr("layer_pointer_fields") = kLayerPointerCount;
  m.def(
      "submit_step",
      [](JobThread& w, const LayerTemplate& t, uintptr_t pointers, int64_t num_layers,
         uintptr_t ready, uintptr_t done, int32_t epoch, double timeout_s, uintptr_t times) {
        if (epoch <= 0) throw std::invalid_argument("the epoch must be > 0");
        auto layers = read_pointers(pointers, num_layers);
        int32_t* r = reinterpret_cast<int32_t*>(ready);
        int32_t* d = reinterpret_cast<int32_t*>(done);
        int64_t* ts = reinterpret_cast<int64_t*>(times);
        return w.submit([t, layers = std::move(layers), r, d, epoch, timeout_s, ts] {
          run_step(t, layers, r, d, epoch, timeout_s, ts);
        });
      },
      py::arg("worker"), py::arg("template"), py::arg("pointers"), py::arg("num_layers"),
      py::arg("ready"), py::arg("done"), py::arg("epoch"), py::arg("timeout_s"),
      py::arg("times") = 0);
}
