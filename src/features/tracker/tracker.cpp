// compcntr::completion_tracker (modules/features/tracker.cppm): creation, error reporting and
// the waiting half of quiet. Built from the public counter, counter_ref and wait API only (plus
// detail::wait_slot's distance goal, as the credit tracker).
module;
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <memory>
#include <new>
#include <system_error>
module compcntr;

namespace compcntr {
namespace {

using clock = std::chrono::steady_clock;

// The caller's timeout over several waits; the clock is read only once a wait is needed.
// Timeouts above 2^40 ms (~34.8 years) are forever, as in compcntr::wait.
class budget {
 public:
  explicit budget(std::int64_t ms) noexcept : ms_(ms > (std::int64_t{1} << 40) ? -1 : ms) {}
  // The timeout of the next wait: what is left, rounded up to whole ms (never early).
  std::chrono::milliseconds next() noexcept {
    if (ms_ < 0) return wait_forever;
    if (ms_ == 0) return std::chrono::milliseconds(0);
    const clock::time_point now = clock::now();
    if (!started_) {
      started_ = true;
      end_ = now + std::chrono::milliseconds(ms_);
    }
    return now >= end_ ? std::chrono::milliseconds(0)
                       : std::chrono::ceil<std::chrono::milliseconds>(end_ - now);
  }
  bool expired() const noexcept { return ms_ == 0 || (ms_ > 0 && clock::now() >= end_); }

 private:
  std::int64_t ms_;
  bool started_ = false;
  clock::time_point end_{};
};

} // namespace

completion_tracker completion_tracker::create(const device& dev, counter_view c,
                                              std::error_code& ec) noexcept {
  using detail::fail_into;
  if (!dev)
    return fail_into(ec, EINVAL, "tracker_create: the device is empty"), completion_tracker{};
  if (!c)
    return fail_into(ec, EINVAL, "tracker_create: the counter is empty (moved from or destroyed)"),
           completion_tracker{};
  if (c.native_slot()->dev != dev.core())
    return fail_into(ec, EINVAL, "tracker_create: counter %u belongs to another device", c.index()),
           completion_tracker{};
  if (c.type() != counter_type::wrs)
    return fail_into(ec, EINVAL,
                     "tracker_create: counter %u counts bytes: a completion tracker "
                     "needs a WRS counter (one completion or error per operation)",
                     c.index()),
           completion_tracker{};
  const std::uint64_t mask = dev.caps().max_value;
  if (mask == 0 || (mask & (mask + 1)) != 0)
    return fail_into(ec, ENOTSUP,
                     "tracker_create: the device's counters wrap at max_value "
                     "%llu + 1, not a power of two: tracker arithmetic needs one",
                     static_cast<unsigned long long>(mask)),
           completion_tracker{};
  std::unique_ptr<detail::tracker_state> s(new (std::nothrow) detail::tracker_state);
  if (!s) return fail_into(ec, ENOMEM, "tracker_create: out of memory"), completion_tracker{};
  s->ref = dev.resolve(c.id(), ec);
  if (ec) return {};
  s->mask = mask;
  // One read of each value: the baseline and the first report's reference are the same
  // error value, so an error counted after this read is both accounted for and reported.
  const std::uint64_t e = s->ref.errors();
  const std::uint64_t v = s->ref.value();
  s->base = (v + e) & mask;
  // Relaxed: the tracker is published to other threads by whatever hands it over.
  s->reported->store(e, std::memory_order_relaxed);
  s->issued->store(0, std::memory_order_relaxed);
  completion_tracker t;
  t.s_ = std::move(s);
  ec.clear();
  return t;
}

std::errc completion_tracker::bad_issue(std::uint64_t n) const noexcept {
  using detail::fail;
  if (s_ == nullptr)
    return std::errc(fail(EINVAL, "tracker: the completion tracker is empty").value());
  return std::errc(fail(EINVAL,
                        "tracker_issue: n = %llu is above a quarter of the counter range "
                        "(%llu): outstanding counts could not be told from wrapped ones",
                        static_cast<unsigned long long>(n),
                        static_cast<unsigned long long>((s_->mask >> 2) + 1))
                       .value());
}

std::errc completion_tracker::report(std::uint64_t e) noexcept {
  // One winner per growth: the quiet whose CAS moves `reported` up to what it saw reports it;
  // a quiet that saw an older (smaller) or the same value reports nothing.
  // Memory ordering: acq_rel CAS (a later quiet's load sees the winner's value).
  std::uint64_t r = s_->reported->load(std::memory_order_acquire);
  for (;;) {
    const std::uint64_t grew = (e - r) & s_->mask;
    if (grew == 0 || grew > (s_->mask >> 1)) return std::errc{};
    if (s_->reported->compare_exchange_weak(r, e, std::memory_order_acq_rel,
                                            std::memory_order_acquire))
      return std::errc::io_error;
  }
}

std::errc completion_tracker::quiet_slow(std::uint64_t target, std::uint64_t v, std::uint64_t e,
                                         std::int64_t timeout_ms,
                                         const wait_options& opts) noexcept {
  detail::slot* s = s_->ref.native_slot();
  const std::uint64_t mask = s_->mask;
  budget b(timeout_ms);
  for (bool last = false;;) {
    // Operations still to account for, counted from the target; "negative" (above half the
    // range) means completions passed it (operations issued after the call completed too).
    const std::uint64_t rem = (target - (v + e - s_->base)) & mask;
    if (rem == 0 || rem > (mask >> 1)) return report(e);
    if (last) return std::errc::timed_out;
    // Wait for rem more completions than v, the error value staying e: an error wakes the
    // wait (io_error) and is then counted like a completion by the next round.
    const std::errc w = detail::wait_slot(
        *s, {.base = v, .need = rem, .mask = mask, .errors_seen = e, .sample_errors = false},
        b.next().count(), opts);
    last = w == std::errc::timed_out && b.expired();
    v = s_->ref.value();
    e = s_->ref.errors();
  }
}

} // namespace compcntr
