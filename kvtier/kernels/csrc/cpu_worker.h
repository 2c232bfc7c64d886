// One native thread that runs jobs in submission order (CPU attention of host rows, a layer a job).
//
// Why not a Python thread: a Python worker must take the GIL to start each call, which the
// main thread holds while it launches the other sub-batch's GPU work, and a Python future's
// hand-over costs a condition variable, a queue and two GIL transfers a layer. Here a submit
// copies the job under a mutex and the caller waits (without the GIL) on a condition
// variable; the thread is the OpenMP master of every call it runs, so one thread team serves
// every layer.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <map>
#include <mutex>
#include <stdexcept>
#include <thread>
#include <utility>

#ifdef __linux__
#include <sys/syscall.h>
#include <unistd.h>
#endif

namespace kvtier_cpu {

class JobThread {
 public:
  JobThread() : thread_([this] { loop(); }) {}
  ~JobThread() { stop(); }
  JobThread(const JobThread&) = delete;
  JobThread& operator=(const JobThread&) = delete;

  // Queues the job; returns its ticket (1, 2, ... in submission order).
  int64_t submit(std::function<void()> job) {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_) throw std::runtime_error("the CPU attention worker is closed");
    jobs_.push_back(std::move(job));
    work_.notify_one();
    return ++submitted_;
  }

  // Blocks until job `ticket` has run; rethrows what it threw.
  void wait(int64_t ticket) {
    std::unique_lock<std::mutex> lock(mu_);
    if (ticket < 1 || ticket > submitted_) throw std::invalid_argument("no such CPU attention job");
    done_.wait(lock, [&] { return finished_ >= ticket; });
    const auto it = errors_.find(ticket);
    if (it == errors_.end()) return;
    const std::exception_ptr error = it->second;
    errors_.erase(it);
    std::rethrow_exception(error);
  }

  // The OS id of the thread (Python's threading.get_native_id() there; -1 off Linux).
  int64_t native_id() {
    std::unique_lock<std::mutex> lock(mu_);
    done_.wait(lock, [&] { return native_id_ != 0; });
    return native_id_;
  }

  int64_t jobs_run() {
    std::lock_guard<std::mutex> lock(mu_);
    return finished_;
  }

  // Runs what was queued, then ends the thread; later submits throw.
  void stop() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stopping_ = true;
    }
    work_.notify_one();
    if (thread_.joinable()) thread_.join();
  }

 private:
  void loop() {
    {
      std::lock_guard<std::mutex> lock(mu_);
#ifdef __linux__
      native_id_ = static_cast<int64_t>(syscall(SYS_gettid));
#else
      native_id_ = -1;
#endif
    }
    done_.notify_all();
    for (;;) {
      std::function<void()> job;
      {
        std::unique_lock<std::mutex> lock(mu_);
        work_.wait(lock, [&] { return stopping_ || !jobs_.empty(); });
        if (jobs_.empty()) return;
        job = std::move(jobs_.front());
        jobs_.pop_front();
      }
      std::exception_ptr error;
      try {
        job();
      } catch (...) {
        error = std::current_exception();
      }
      {
        std::lock_guard<std::mutex> lock(mu_);
        ++finished_;
        if (error) errors_[finished_] = error;
      }
      done_.notify_all();
    }
  }

  std::mutex mu_;
  std::condition_variable work_, done_;
  std::deque<std::function<void()>> jobs_;
  std::map<int64_t, std::exception_ptr> errors_;
  int64_t submitted_ = 0, finished_ = 0, native_id_ = 0;
  bool stopping_ = false;
  std::thread thread_;  // last: it starts once the members above exist
};

}  // namespace kvtier_cpu
