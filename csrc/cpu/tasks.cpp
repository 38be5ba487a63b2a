// The helper threads of run_tasks (tasks.h).
#include "tasks.h"

#include <pthread.h>
#include <unistd.h>

#include <deque>
#include <thread>

namespace sol_ext {
namespace {

// Threads that wait for jobs, started as needed and never stopped: joining them at exit would race with
// the interpreter's shutdown, and a waiting thread holds nothing.
class HelperThreads {
 public:
  void launch(std::function<void()> job, int64_t threads) {
    std::lock_guard<std::mutex> lock(mutex_);
    jobs_.push_back(std::move(job));
    // idle_ counts the threads still waiting, not yet woken: more jobs than that need another thread
    if (static_cast<int64_t>(jobs_.size()) > idle_ && started_ < threads) {
      std::thread thread([this] { serve(); });
      pthread_setname_np(thread.native_handle(), "sol_ext helper");  // as top, gdb and /proc show it
      thread.detach();
      ++started_;
    }
    ready_.notify_one();
  }

  const pid_t pid = getpid();

 private:
  void serve() {
    for (;;) {
      std::function<void()> job;
      {
        std::unique_lock<std::mutex> lock(mutex_);
        ++idle_;
        ready_.wait(lock, [&] { return !jobs_.empty(); });
        --idle_;
        job = std::move(jobs_.front());
        jobs_.pop_front();
      }
      job();  // run_tasks' jobs catch their own exceptions
    }
  }

  std::mutex mutex_;
  std::condition_variable ready_;
  std::deque<std::function<void()>> jobs_;
  int64_t started_ = 0, idle_ = 0;
};

std::atomic<HelperThreads*> helper_threads{nullptr};

} // namespace

void launch_helper(std::function<void()> job, int64_t threads) {
  HelperThreads* helpers = helper_threads.load();
  // In a forked child the parent's helpers did not come along: start afresh (the old object is left as is,
  // since its mutex may have been held at the fork).
  if (helpers == nullptr || helpers->pid != getpid()) {
    auto* fresh = new HelperThreads();
    if (helper_threads.compare_exchange_strong(helpers, fresh)) {
      helpers = fresh;
    } else {
      delete fresh;  // another thread started them first; helpers now holds theirs
    }
  }
  helpers->launch(std::move(job), threads);
}

} // namespace sol_ext
