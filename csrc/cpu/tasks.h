// run_tasks: the CPU kernels' parallelism, one that a busy machine does not stall.
//
// An at::parallel_for team ends at a barrier that waits for every thread of the team; on a machine whose
// cores are busy with another process (a DataLoader worker, another job) a thread the OS has descheduled
// costs each region a scheduler time slice. Here the calling thread and up to `helpers` helper threads
// take the next task from a shared counter: a helper that starts late finds no task left and the call
// does not wait for it, only for the tasks helpers have taken.
//
// A thread claims a task before it touches anything of the caller's, so a helper that the OS starts after
// the last task was claimed (possibly after the call returned) touches only the shared queue. Each task
// runs under SerialRegions (sol_ext.h): an ATen operation or MKL product inside a task stays on its
// thread. Results are the caller's to make deterministic: a task writes its own slots, and the caller
// combines slots in task order, so the result does not depend on which thread ran what.
//
// The helpers are the library's own threads (tasks.cpp), not torch's inter-op pool: at::launch carries
// the caller's thread-local state, Python's included, into the helper, and a helper that starts while
// the interpreter shuts down then aborts the process. Ours carry none; a task runs its ATen operations
// below autograd.
#pragma once

#include <ATen/Parallel.h>
#include <ATen/core/LegacyTypeDispatch.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>

#include "../sol_ext.h"

namespace sol_ext {

struct TaskQueue {
  explicit TaskQueue(int64_t count) : count(count) {}

  const int64_t count;
  std::atomic<int64_t> next{0};
  std::atomic<bool> failed{false};
  std::mutex mutex;
  std::condition_variable all_done;
  int64_t done = 0;
  std::exception_ptr error;  // the first failure, raised by the caller

  void finish(std::exception_ptr failure) {
    std::lock_guard<std::mutex> lock(mutex);
    if (failure && !error) {
      error = failure;
      failed = true;
    }
    if (++done == count) all_done.notify_all();
  }
};

// Runs job on one of the library's helper threads, starting up to `threads` of them (they live as long
// as the process; a child process forked after helpers started starts its own). Throws when a thread
// cannot be started.
void launch_helper(std::function<void()> job, int64_t threads);

// The number of helpers for `count` tasks: one fewer than torch's intra-op threads (outside a SerialRegions
// scope), none inside an OpenMP parallel region or for a single task.
inline int64_t task_helpers(int64_t count) {
  if (count < 2 || at::in_parallel_region()) return 0;
  return std::min<int64_t>(SerialRegions::threads(), count) - 1;
}

// Runs tasks 0 … count-1. make_worker() builds one thread's worker (its buffers), a callable
// worker(task); a failure (of a worker's construction, out of memory, or of a task) ends the call with
// that exception once every claimed task is done. A helper destroys its worker after its last task, when
// the caller may have returned: a worker's destructor must not touch the caller's data. With helpers,
// every thread runs its tasks under SerialRegions (no thread team inside a task); alone, the caller
// runs them under its own settings.
template <typename MakeWorker>
void run_tasks(int64_t count, int64_t helpers, const MakeWorker& make_worker) {
  if (count <= 0) return;
  auto queue = std::make_shared<TaskQueue>(count);
  auto drain = [queue, &make_worker](bool serial_regions) {
    int64_t task = queue->next++;
    if (task >= queue->count) return;  // nothing claimed: make_worker may be gone already
    std::optional<SerialRegions> serial;
    if (serial_regions) serial.emplace();
    const at::AutoDispatchBelowADInplaceOrView below_autograd;  // what the caller's kernel runs under
    try {
      auto worker = make_worker();
      for (; task < queue->count; task = queue->next++) {
        std::exception_ptr failure;
        if (!queue->failed) {
          try {
            worker(task);
          } catch (...) {
            failure = std::current_exception();
          }
        }
        queue->finish(failure);
      }
    } catch (...) {  // no worker: this task fails, and the tasks left are given up
      queue->finish(std::current_exception());
      for (task = queue->next++; task < queue->count; task = queue->next++) queue->finish(nullptr);
    }
  };
  int64_t launched = 0;
  try {
    for (; launched < helpers; ++launched) launch_helper([drain] { drain(true); }, helpers);
  } catch (...) {  // no thread to be had: the tasks are the caller's (a queued helper finds none left)
  }
  drain(launched > 0);
  std::unique_lock<std::mutex> lock(queue->mutex);
  queue->all_done.wait(lock, [&] { return queue->done == count; });
  if (queue->error) std::rethrow_exception(queue->error);
}

} // namespace sol_ext
