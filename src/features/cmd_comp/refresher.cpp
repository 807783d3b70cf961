// compcntr::mirror_refresher (compcntr:refresher): one round of batched asynchronous queries in
// flight at a time; answers are matched to watched counters by (entry index, entry epoch).
module;
#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <new>
#include <span>
#include <system_error>
#include <unordered_map>
#include <utility>
#include <vector>
module compcntr;

namespace compcntr {

class mirror_refresher::state {
 public:
  struct entry {
    detail::slot* s = nullptr;  ///< pinned while watched; nullptr: free entry
    std::uint32_t epoch = 0;    ///< bumped on unwatch, so late answers are ignored
  };

  explicit state(cmd_completion c, std::chrono::nanoseconds interval) noexcept
      : cmd(std::move(c)), min_interval(interval) {}

  // All below guarded by mu.
  std::mutex mu;
  cmd_completion cmd;
  std::chrono::nanoseconds min_interval;
  std::chrono::steady_clock::time_point round_start{};
  std::vector<entry> entries;
  std::vector<std::uint32_t> free_entries;
  std::unordered_map<detail::slot*, std::uint32_t> by_slot;
  std::vector<detail::slot_query> batch;  ///< reused round buffer
  std::size_t outstanding = 0;            ///< queries of the current round not yet answered
  std::size_t cursor = 0;                 ///< first entry of the next round (> 65,536 watched)
  std::atomic<std::uint64_t> rounds{0};

  static std::uint64_t wr_id_of(std::uint32_t index, std::uint32_t epoch) noexcept {
    return (std::uint64_t{epoch} << 32) | index;
  }

  void drop(std::uint32_t index) {
    entry& e = entries[index];
    by_slot.erase(e.s);
    detail::slot* s = e.s;
    e.s = nullptr;
    ++e.epoch;
    free_entries.push_back(index);
    detail::unpin_slot(*s);  // may finish a destroyed counter
  }

  std::size_t collect() noexcept {
    std::size_t written = 0;
    query_response buf[64];
    for (;;) {
      std::error_code ec;
      const std::size_t n = cmd.try_get(buf, ec);
      for (std::size_t i = 0; i < n; ++i) {
        const auto index = static_cast<std::uint32_t>(buf[i].wr_id);
        const auto epoch = static_cast<std::uint32_t>(buf[i].wr_id >> 32);
        if (index < entries.size() && entries[index].s && entries[index].epoch == epoch) {
          detail::store_mirror(*entries[index].s, buf[i].values);
          ++written;
        }
      }
      std::size_t answered = n + (ec ? 1 : 0);  // a failed query (EIO) is answered too
      outstanding -= std::min(outstanding, answered);
      if (answered == 0) break;
    }
    return written;
  }

  void start_round() noexcept {
    const auto now = std::chrono::steady_clock::now();
    if (min_interval.count() > 0 && rounds.load(std::memory_order_relaxed) > 0 &&
        now - round_start < min_interval)
      return;
    batch.clear();
    const std::size_t n = entries.size();
    std::size_t visited = 0;
    for (; visited < n && batch.size() < detail::max_outstanding_queries; ++visited) {
      const auto index = static_cast<std::uint32_t>((cursor + visited) % n);
      entry& e = entries[index];
      if (!e.s) continue;
      if (detail::counter_gone(*e.s)) {
        drop(index);  // the counter was destroyed: let its slot go
        continue;
      }
      batch.push_back(detail::slot_query{e.s, wr_id_of(index, e.epoch)});
    }
    if (batch.empty()) return;
    std::error_code ec;
    outstanding = cmd.core()->issue(batch, ec);
    if (outstanding == 0) batch.clear();  // nothing accepted: no round in flight
    cursor = n ? (cursor + visited) % n : 0;
    round_start = now;
  }
};

mirror_refresher mirror_refresher::create(const device& dev, std::error_code& ec,
                                          std::chrono::nanoseconds min_interval) noexcept {
  cmd_completion cmd = cmd_completion::create(dev, ec);
  if (ec) return {};
  auto* st = new (std::nothrow) state(std::move(cmd), min_interval);
  if (!st) {
    detail::fail_into(ec, ENOMEM, "mirror_refresher: out of memory");
    return {};
  }
  return mirror_refresher(st);
}

std::error_code mirror_refresher::watch(counter_view c) noexcept {
  if (!c) return detail::fail(EINVAL, "mirror_refresher::watch: the counter is empty");
  detail::slot* s = c.native_slot();
  if (s->dev != &st_->cmd.core()->device())
    return detail::fail(EINVAL, "mirror_refresher::watch: counter %u belongs to another device",
                        s->index);
  if (s->hw == nullptr || s->striped())
    return detail::fail(EINVAL,
                        "mirror_refresher::watch: counter %u is a software counter (plain "
                        "or striped): its memory is the value itself, there is no device copy "
                        "to refresh",
                        s->index);
  std::lock_guard lock(st_->mu);
  if (st_->by_slot.count(s))
    return detail::fail(EEXIST, "mirror_refresher::watch: counter %u is already watched", s->index);
  try {
    std::uint32_t index;
    if (!st_->free_entries.empty()) {
      index = st_->free_entries.back();
      st_->free_entries.pop_back();
    } else {
      index = static_cast<std::uint32_t>(st_->entries.size());
      st_->entries.emplace_back();
      st_->free_entries.reserve(st_->entries.size());  // drop() must not allocate
    }
    st_->by_slot.emplace(s, index);
    st_->entries[index].s = s;
    detail::pin_slot(*s);
  } catch (const std::bad_alloc&) {
    return detail::fail(ENOMEM, "mirror_refresher::watch: out of memory");
  }
  return {};
}

std::error_code mirror_refresher::unwatch(counter_view c) noexcept {
  if (!c) return detail::fail(EINVAL, "mirror_refresher::unwatch: the counter is empty");
  std::lock_guard lock(st_->mu);
  auto it = st_->by_slot.find(c.native_slot());
  if (it == st_->by_slot.end())
    return detail::fail(ENOENT, "mirror_refresher::unwatch: counter %u is not watched", c.index());
  st_->drop(it->second);
  return {};
}

std::size_t mirror_refresher::refresh() noexcept {
  std::unique_lock lock(st_->mu, std::try_to_lock);
  if (!lock.owns_lock()) return 0;
  const std::size_t written = st_->collect();
  if (st_->outstanding == 0) {
    if (!st_->batch.empty()) {  // the round just finished (batch holds its queries)
      st_->rounds.fetch_add(1, std::memory_order_relaxed);
      st_->batch.clear();
    }
    st_->start_round();
  }
  return written;
}

int mirror_refresher::fd() const noexcept { return st_->cmd.fd(); }

std::size_t mirror_refresher::watched() const noexcept {
  std::lock_guard lock(st_->mu);
  return st_->by_slot.size();
}

std::uint64_t mirror_refresher::rounds() const noexcept {
  return st_->rounds.load(std::memory_order_relaxed);
}

void mirror_refresher::reset() noexcept {
  state* st = std::exchange(st_, nullptr);
  if (!st) return;
  {
    std::lock_guard lock(st->mu);
    st->cmd.reset();  // discards the round in flight (its pins are gone when this returns)
    for (std::uint32_t i = 0; i < st->entries.size(); ++i)
      if (st->entries[i].s) st->drop(i);
  }
  delete st;
}

} // namespace compcntr
