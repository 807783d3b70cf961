// A fake "device" for tests: a backend whose counter values live in its own memory (one heap
// cell per counter), not in the counters' slots, like a device that does not write values into
// host memory. Updates go to the device; the slot (mirror) changes only when refreshed.
// Include after `import compcntr;`.
#ifndef COMPCNTR_TESTS_FAKE_DEVICE_HPP
#define COMPCNTR_TESTS_FAKE_DEVICE_HPP

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <set>
#include <span>
#include <string_view>
#include <system_error>
#include <thread>

namespace fake {

/// The device's copy of one counter.
struct cell {
  std::atomic<std::uint64_t> comp{0};
  std::atomic<std::uint64_t> err{0};
};

inline cell& cell_of(compcntr::plugin::slot& s) { return *static_cast<cell*>(s.backend_data); }

inline const compcntr::plugin::hw_counter_ops ops = {
    .add = [](compcntr::plugin::slot& s, std::uint64_t n) noexcept { cell_of(s).comp += n; },
    .add_error = [](compcntr::plugin::slot& s, std::uint64_t n) noexcept { cell_of(s).err += n; },
    .set = [](compcntr::plugin::slot& s, std::uint64_t v) noexcept { cell_of(s).comp = v; },
    .set_error = [](compcntr::plugin::slot& s, std::uint64_t v) noexcept { cell_of(s).err = v; },
    .refresh = nullptr,  // only through asynchronous queries
};

/// Statistics the tests look at, shared with the backend (which the device owns).
struct stats {
  std::atomic<std::uint64_t> query_calls{0};   ///< backend::query_values calls (device commands)
  std::atomic<std::uint64_t> queried{0};       ///< slots answered
  std::atomic<std::uint64_t> bound{0};         ///< counters bound minus unbound
  std::mutex mu;
  std::set<std::thread::id> answering_threads; ///< threads that ran query_values
};

class backend final : public compcntr::plugin::backend {
 public:
  explicit backend(std::shared_ptr<stats> st) : st_(std::move(st)) {}
  std::string_view name() const noexcept override { return "fake"; }
  compcntr::counter_caps caps() const noexcept override {
    return {.max_value = UINT64_MAX, .max_counters = 0, .supported_qp_attach_ops = 0};
  }
  std::error_code bind_counter(compcntr::plugin::slot& s) noexcept override {
    s.backend_data = new cell;
    s.hw = &ops;
    ++st_->bound;
    return {};
  }
  void unbind_counter(compcntr::plugin::slot& s) noexcept override {
    delete static_cast<cell*>(s.backend_data);
    s.backend_data = nullptr;
    --st_->bound;
  }
  void query_values(std::span<compcntr::plugin::slot* const> slots,
                    compcntr::counter_values* out) noexcept override {
    ++st_->query_calls;
    st_->queried += slots.size();
    {
      std::lock_guard lock(st_->mu);
      st_->answering_threads.insert(std::this_thread::get_id());
    }
    for (std::size_t i = 0; i < slots.size(); ++i) {
      cell& c = cell_of(*slots[i]);
      out[i] = {c.comp.load(), c.err.load()};
    }
  }

 private:
  std::shared_ptr<stats> st_;
};

/// Opens a fake device; `st` receives its statistics.
inline compcntr::device open(std::shared_ptr<stats> st) {
  std::error_code ec;
  auto dev = compcntr::device::from_backend(std::make_unique<backend>(std::move(st)), ec);
  return dev;
}

} // namespace fake

/// Waits (without sleeping for synchronisation: this only guards against hangs) until pred().
template <class Pred>
bool eventually(Pred pred, std::chrono::seconds limit = std::chrono::seconds(30)) {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  while (!pred()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::yield();
  }
  return true;
}

#endif
