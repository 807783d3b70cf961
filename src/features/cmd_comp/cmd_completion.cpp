// compcntr::cmd_completion: argument checks, batching of issues, and the blocking rules of get
// (the fd's own O_NONBLOCK flag, read at call time) over any cmd_comp_core.
module;
#include <fcntl.h>
#include <poll.h>
#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <system_error>
module compcntr;

namespace compcntr {

namespace {

/// Queries handed to the core per issue() call: one queue push and one engine wake-up each.
constexpr std::size_t issue_chunk = 256;

/// How long a blocking get spins before it sleeps in poll(): an engine answers a batch within a
/// few microseconds, while a sleep-and-wake round trip through the scheduler costs tens of
/// microseconds (measured ~60 us per batch on the project's 2-vCPU VMs); 20 us of spinning
/// keeps an issue-then-collect loop out of the kernel without burning a core when idle.
constexpr auto get_spin = std::chrono::microseconds(20);

/// Waits until a response is probably queued (spinning briefly first) or the fd polls
/// readable, or fails with EAGAIN when the application made the fd non-blocking.
/// false + ec on failure.
bool wait_readable(const detail::cmd_comp_core& core, const char* call,
                   std::error_code& ec) noexcept {
  if (core.orphaned()) {  // a forked child: nothing will ever arrive (try_get names the cause)
    query_response r;
    const_cast<detail::cmd_comp_core&>(core).try_get(std::span<query_response>(&r, 1), ec);
    return false;
  }
  const int fd = core.fd();
  const int flags = ::fcntl(fd, F_GETFL);
  if (flags < 0) {
    const int err = errno;
    return detail::fail_into(ec, err, "%s: fcntl(F_GETFL) on the cmd_comp fd failed: %s", call,
                             std::strerror(err));
  }
  if (flags & O_NONBLOCK)
    return detail::fail_into(ec, EAGAIN,
                             "%s: no response is queued and the cmd_comp fd is "
                             "O_NONBLOCK",
                             call);
  const auto spin_end = std::chrono::steady_clock::now() + get_spin;
  for (unsigned i = 1;; ++i) {
    if (core.probably_ready()) return true;
    cpu_relax();
    if (i % 64 == 0 && std::chrono::steady_clock::now() > spin_end) break;
  }
  pollfd p{fd, POLLIN, 0};
  if (::poll(&p, 1, -1) < 0 && errno != EINTR) {
    const int err = errno;
    return detail::fail_into(ec, err, "%s: poll on the cmd_comp fd failed: %s", call,
                             std::strerror(err));
  }
  return true;
}

} // namespace

cmd_completion cmd_completion::create(const device& dev, std::error_code& ec) noexcept {
  if (!dev) {
    detail::fail_into(ec, EINVAL, "create_cmd_comp: the device is empty");
    return {};
  }
  detail::device_core* core = dev.core();
  // The device's own asynchronous commands if it has them (mlx5 DEVX), else the software engine.
  detail::command_capability* cap = core->be().commands();
  detail::cmd_comp_core* c =
      cap != nullptr ? cap->create_cmd_comp(*core, ec) : detail::make_engine_cmd_comp(*core, ec);
  if (!c) {
    if (!ec) detail::fail_into(ec, ENOMEM, "create_cmd_comp: out of memory");
    return {};
  }
  ec.clear();
  return cmd_completion(c);
}

std::error_code cmd_completion::query(counter_view c, std::uint64_t wr_id) noexcept {
  std::error_code ec;
  const query_request r{c, wr_id};
  query(std::span<const query_request>(&r, 1), ec);
  return ec;
}

std::size_t cmd_completion::query(std::span<const query_request> reqs,
                                  std::error_code& ec) noexcept {
  ec.clear();
  detail::slot_query chunk[issue_chunk];
  std::size_t done = 0;
  while (done < reqs.size()) {
    std::size_t m = 0;
    std::size_t bad = SIZE_MAX;
    for (; m < issue_chunk && done + m < reqs.size(); ++m) {
      const query_request& r = reqs[done + m];
      detail::slot* s = r.c.native_slot();
      if (s == nullptr || s->dev != &core_->device()) {
        bad = done + m;
        break;
      }
      chunk[m] = detail::slot_query{s, r.wr_id};
    }
    const std::size_t accepted =
        m ? core_->issue(std::span<const detail::slot_query>(chunk, m), ec) : 0;
    done += accepted;
    if (ec) return done;
    if (bad != SIZE_MAX) {
      const query_request& r = reqs[bad];
      if (!r.c)
        detail::fail_into(ec, EINVAL, "query_comp_cntr_async: request %zu has no counter", bad);
      else
        detail::fail_into(ec, EINVAL,
                          "query_comp_cntr_async: counter %u belongs to another device "
                          "than the cmd_comp",
                          r.c.index());
      return done;
    }
  }
  return done;
}

std::size_t cmd_completion::try_get(std::span<query_response> out, std::error_code& ec) noexcept {
  return core_->try_get(out, ec);
}

std::size_t cmd_completion::get(std::span<query_response> out, std::error_code& ec) noexcept {
  ec.clear();
  if (out.empty()) return 0;
  for (;;) {
    const std::size_t n = core_->try_get(out, ec);
    if (n != 0 || ec) return n;
    if (!wait_readable(*core_, "get_async_cmd_comp", ec)) return 0;
  }
}

query_response cmd_completion::get(std::error_code& ec) noexcept {
  query_response r;
  get(std::span<query_response>(&r, 1), ec);
  return r;
}

int cmd_completion::get_raw(void* buf, std::size_t len) noexcept {
  constexpr std::size_t full = detail::async_cmd_header_bytes + detail::counter_query_out_bytes;
  if (len < detail::async_cmd_header_bytes)
    return detail::fail(EINVAL,
                        "get_async_cmd_comp: cmd_resp_len %zu is smaller than the response "
                        "header (%zu bytes)",
                        len, detail::async_cmd_header_bytes)
        .value();
  std::error_code ec;
  if (core_->orphaned()) [[unlikely]] {
    // A forked child: what try_get says (EOWNERDEAD, naming the cause), before any size check.
    query_response r;
    core_->try_get(std::span<query_response>(&r, 1), ec);
    return ec.value();
  }
  for (;;) {
    if (len < full) {
      // Checked against a queued response without taking it: it stays queued, fd unchanged.
      if (core_->ready())
        return detail::fail(ENOSPC,
                            "get_async_cmd_comp: cmd_resp_len %zu is too small for the "
                            "queued response (%zu bytes); it stays queued",
                            len, full)
            .value();
    } else {
      query_response r;
      const std::size_t n = core_->try_get(std::span<query_response>(&r, 1), ec);
      if (ec && ec.value() != EIO) return ec.value();  // EOWNERDEAD (fork): nothing written
      if (n != 0 || ec) {
        auto* out = static_cast<unsigned char*>(buf);
        std::memcpy(out, &r.wr_id, sizeof r.wr_id);  // also on EIO: names the failed query
        if (!ec) {
          const std::uint64_t v[2] = {r.values.completions, r.values.errors};
          std::memcpy(out + detail::async_cmd_header_bytes, v, sizeof v);
        }
        return ec.value();
      }
    }
    if (!wait_readable(*core_, "get_async_cmd_comp", ec)) return ec.value();
  }
}

} // namespace compcntr
