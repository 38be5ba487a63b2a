// LargeVector: a std::vector for buffers as long as the batch that a CPU kernel fills once per call (the
// grouped op's sorting buffers and gradient columns). Memory fresh from the system costs a page fault on
// first touch, per 4 kB page; at 10^6 samples those faults were a tenth of the grouped op's time. Buffers
// of 2 MB and more are therefore aligned to 2 MB and marked for transparent huge pages, a fault per 2 MB
// where Linux gives them (enabled = madvise or always). Elements are default-initialized (resize writes
// no zeros): a buffer's first writes are the kernel's own.
#pragma once

#include <cstddef>
#include <cstdlib>
#include <new>
#include <vector>

#if defined(__linux__)
#include <sys/mman.h>
#endif

namespace sol_ext {

template <typename T>
struct LargeAllocator {
  using value_type = T;
  static constexpr std::size_t kHugePage = std::size_t(1) << 21;

  LargeAllocator() = default;
  template <typename U>
  LargeAllocator(const LargeAllocator<U>&) {}

  T* allocate(std::size_t count) {
    const std::size_t bytes = count * sizeof(T);
    void* p = nullptr;
#if defined(__linux__) && defined(MADV_HUGEPAGE)
    if (bytes >= kHugePage) {
      const std::size_t rounded = (bytes + kHugePage - 1) / kHugePage * kHugePage;
      p = std::aligned_alloc(kHugePage, rounded);
      if (p != nullptr) madvise(p, rounded, MADV_HUGEPAGE);  // advice: where it is refused nothing changes
    }
#endif
    if (p == nullptr) p = std::malloc(bytes > 0 ? bytes : 1);
    if (p == nullptr) throw std::bad_alloc();
    return static_cast<T*>(p);
  }
  void deallocate(T* p, std::size_t) { std::free(p); }

  // Without arguments: default-initialized (with them std::allocator_traits constructs as usual).
  template <typename U>
  void construct(U* p) noexcept {
    ::new (static_cast<void*>(p)) U;
  }
};

template <typename T, typename U>
bool operator==(const LargeAllocator<T>&, const LargeAllocator<U>&) {
  return true;
}

template <typename T>
using LargeVector = std::vector<T, LargeAllocator<T>>;

} // namespace sol_ext
