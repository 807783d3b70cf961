// The CQ bridge (compcntr_fi_bridge_*): open and bind rules with exact errno values, reading CQs
// of every format (the common-prefix reader, batched reads with the format given, detection of
// FI_CQ_FORMAT_CONTEXT), byte counting, statistics, max_entries, progress from several threads
// at once (exact totals, exact return values), and the bridge as a drive function of compcntr's
// waits (C and C++: compcntr::fabric::bind + progress_options). Real libfabric endpoints.
#include <compcntr/fabric.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

#include <doctest/doctest.h>

#include "fabric_fixture.hpp"

import compcntr;

#include <compcntr/fabric.hpp>

using namespace std::chrono_literals;
using fabtest::env;

namespace {

std::unique_ptr<env> any_provider(fi_cq_format format = FI_CQ_FORMAT_DATA,
                                  std::size_t cq_size = 1024) {
  fabtest::options o;
  o.provider_counters = false;
  o.format = format;
  o.cq_size = cq_size;
  std::string why, all;
  for (const char* p : {"shm", "tcp;ofi_rxm", "udp;ofi_rxd"}) {
    if (auto e = env::open(p, o, why)) return e;
    all += std::string(p) + ": " + why + "; ";
  }
  MESSAGE("skipped: no libfabric provider opens here: ", all);
  return nullptr;
}

struct soft {
  compcntr_device* dev = compcntr_open_device("soft");
  std::vector<compcntr_comp_cntr*> made;
  compcntr_comp_cntr* counter(compcntr_comp_cntr_type t = COMPCNTR_COMP_CNTR_TYPE_WRS) {
    compcntr_comp_cntr_init_attr a{};
    a.type = t;
    compcntr_comp_cntr* c = compcntr_create_comp_cntr(dev, &a);
    REQUIRE(c);
    made.push_back(c);
    return c;
  }
  ~soft() {
    for (auto* c : made) CHECK(compcntr_destroy_comp_cntr(c) == 0);
    CHECK(compcntr_close_device(dev) == 0);
  }
};

std::uint64_t val(compcntr_comp_cntr* c) {
  std::uint64_t v = 0;
  compcntr_read_comp_cntr(c, &v);
  return v;
}
std::uint64_t err(compcntr_comp_cntr* c) {
  std::uint64_t v = 0;
  compcntr_read_err_comp_cntr(c, &v);
  return v;
}
compcntr_fi_bridge_stats stats(compcntr_fi_bridge* br) {
  compcntr_fi_bridge_stats s{};
  REQUIRE(compcntr_fi_bridge_query_stats(br, &s) == 0);
  return s;
}
std::string fi_last() { return compcntr_fi_last_error(); }

// Posts n receives on B and n sends A -> B of lengths 1 + i % 64; `pump` is called while the
// provider pushes back (-FI_EAGAIN). Returns the total length sent.
template <class Pump>
std::uint64_t traffic(env& e, int n, Pump pump) {
  std::uint64_t total = 0;
  for (int i = 0; i < n; ++i)
    REQUIRE(fabtest::post(
                [&] {
                  return fi_recv(e.b.ep, e.b.buf + 64 * (i % 512), 64, e.b.desc, e.a.addr, e.ctx());
                },
                pump) == 0);
  for (int i = 0; i < n; ++i) {
    const std::size_t len = 1 + i % 64;
    total += len;
    REQUIRE(fabtest::post(
                [&] { return fi_send(e.a.ep, e.a.buf, len, e.a.desc, e.b.addr, e.ctx()); }, pump) ==
            0);
  }
  return total;
}

} // namespace

TEST_CASE("open: argument checks") {
  errno = 0;
  CHECK(compcntr_fi_bridge_open(nullptr) == nullptr);
  CHECK(errno == EINVAL);
  auto e = any_provider();
  if (!e) return;
  errno = 0;
  CHECK(compcntr_fi_bridge_open(reinterpret_cast<fid_cq*>(&e->domain->fid)) == nullptr); // not a CQ
  CHECK(errno == EINVAL);
  CHECK(fi_last().find("not a CQ") != std::string::npos);
  struct bad {
    std::uint32_t mask;
    int format; // raw: a C caller may store any int (written with memcpy)
    std::size_t max;
    const char* what;
  };
  for (const bad& b :
       {bad{COMPCNTR_FI_BRIDGE_ATTR_FORMAT, FI_CQ_FORMAT_CONTEXT, 0, "format"},
        bad{COMPCNTR_FI_BRIDGE_ATTR_FORMAT, FI_CQ_FORMAT_UNSPEC, 0, "format"},
        bad{COMPCNTR_FI_BRIDGE_ATTR_FORMAT, 42, 0, "format"},
        bad{COMPCNTR_FI_BRIDGE_ATTR_MAX_ENTRIES, FI_CQ_FORMAT_UNSPEC, 0, "max_entries"},
        bad{1u << 7, FI_CQ_FORMAT_MSG, 1, "comp_mask"}}) {
    compcntr_fi_bridge_attr a{};
    a.comp_mask = b.mask;
    std::memcpy(&a.format, &b.format, sizeof(int));
    a.max_entries = b.max;
    errno = 0;
    CHECK_MESSAGE(compcntr_fi_bridge_open_ex(e->a.cq, &a) == nullptr, b.what);
    CHECK(errno == EINVAL);
    CHECK_MESSAGE(fi_last().find(b.what) != std::string::npos, fi_last());
  }
  compcntr_fi_bridge* br = compcntr_fi_bridge_open_ex(e->a.cq, nullptr); // == open
  REQUIRE(br);
  CHECK(compcntr_fi_bridge_progress(br) == 0); // empty CQ
  CHECK(compcntr_fi_bridge_close(br) == 0);
  CHECK(compcntr_fi_bridge_progress(nullptr) == -FI_EINVAL);
  CHECK(compcntr_fi_bridge_close(nullptr) == EINVAL);
  compcntr_fi_bridge_stats s{};
  CHECK(compcntr_fi_bridge_query_stats(nullptr, &s) == EINVAL);
}

TEST_CASE("bind: flags, one counter per class, BYTES only where the CQ reports a length") {
  auto e = any_provider();
  if (!e) return;
  soft s;
  compcntr_fi_bridge* br = compcntr_fi_bridge_open(e->b.cq);
  REQUIRE(br);
  compcntr_comp_cntr* wrs = s.counter();
  compcntr_comp_cntr* other = s.counter();
  compcntr_comp_cntr* bytes = s.counter(COMPCNTR_COMP_CNTR_TYPE_BYTES);
  CHECK(compcntr_fi_bridge_bind(nullptr, wrs, FI_SEND) == EINVAL);
  CHECK(compcntr_fi_bridge_bind(br, nullptr, FI_SEND) == EINVAL);
  CHECK(compcntr_fi_bridge_bind(br, wrs, 0) == EINVAL);
  CHECK(compcntr_fi_bridge_bind(br, wrs, FI_MSG) == EINVAL);
  CHECK(compcntr_fi_bridge_bind(br, wrs, FI_RECV | FI_MULTI_RECV) == EINVAL);
  CHECK(fi_last().find("outside") != std::string::npos);
  for (std::uint64_t f : {std::uint64_t{FI_SEND}, std::uint64_t{FI_READ}, std::uint64_t{FI_WRITE},
                          std::uint64_t{FI_REMOTE_READ}, std::uint64_t{FI_REMOTE_WRITE},
                          std::uint64_t{FI_RECV | FI_SEND}})
    CHECK(compcntr_fi_bridge_bind(br, bytes, f) == ENOTSUP);

  CHECK(compcntr_fi_bridge_bind(br, wrs, FI_SEND | FI_READ) == 0);
  // Overlap: refused as a whole (FI_RECV is not bound by the failed call).
  CHECK(compcntr_fi_bridge_bind(br, other, FI_RECV | FI_READ) == EBUSY);
  CHECK(compcntr_fi_bridge_bind(br, other, FI_SEND) == EBUSY);
  CHECK(compcntr_fi_bridge_bind(br, wrs, FI_SEND) == EBUSY); // also for the same counter
  CHECK(compcntr_fi_bridge_bind(br, bytes, FI_RECV) == 0);
  CHECK(compcntr_fi_bridge_bind(br, other, FI_RECV) == EBUSY);
  CHECK(compcntr_fi_bridge_bind(br, other, FI_WRITE) == 0);

  // The receives land in the BYTES counter (not in `other`, whose FI_RECV bind failed).
  compcntr_fi_bridge* ba = compcntr_fi_bridge_open(e->a.cq);
  REQUIRE(ba);
  auto pump = [&] {
    compcntr_fi_bridge_progress(ba);
    compcntr_fi_bridge_progress(br);
  };
  const std::uint64_t total = traffic(*e, 40, pump);
  REQUIRE(fabtest::until([&] { return val(bytes) == total && stats(ba).entries == 40; }, pump));
  CHECK(val(other) == 0);
  CHECK(val(wrs) == 0);
  CHECK(stats(br).entries == 40);
  CHECK(stats(ba).unbound == 40); // A's sends: no counter bound on A's bridge
  CHECK(compcntr_fi_bridge_close(ba) == 0);
  CHECK(compcntr_fi_bridge_close(br) == 0);
}

TEST_CASE("every CQ format: batched reads with the format, prefix reads without it") {
  for (fi_cq_format f : {FI_CQ_FORMAT_MSG, FI_CQ_FORMAT_DATA, FI_CQ_FORMAT_TAGGED}) {
    for (bool given : {true, false}) {
      INFO("format ", static_cast<int>(f), given ? ", given" : ", not given");
      auto e = any_provider(f);
      if (!e) return;
      soft s;
      compcntr_fi_bridge_attr a{};
      a.comp_mask = COMPCNTR_FI_BRIDGE_ATTR_FORMAT;
      a.format = f;
      compcntr_fi_bridge* ba =
          given ? compcntr_fi_bridge_open_ex(e->a.cq, &a) : compcntr_fi_bridge_open(e->a.cq);
      compcntr_fi_bridge* bb =
          given ? compcntr_fi_bridge_open_ex(e->b.cq, &a) : compcntr_fi_bridge_open(e->b.cq);
      REQUIRE(ba);
      REQUIRE(bb);
      compcntr_comp_cntr* sent = s.counter();
      compcntr_comp_cntr* recvd = s.counter();
      compcntr_comp_cntr* rbytes = s.counter(COMPCNTR_COMP_CNTR_TYPE_BYTES);
      compcntr_comp_cntr* other = s.counter();
      REQUIRE(compcntr_fi_bridge_bind(ba, sent, FI_SEND) == 0);
      REQUIRE(compcntr_fi_bridge_bind(
                  ba, other, FI_RECV | FI_READ | FI_WRITE | FI_REMOTE_READ | FI_REMOTE_WRITE) == 0);
      REQUIRE(compcntr_fi_bridge_bind(bb, rbytes, FI_RECV) == 0);
      REQUIRE(compcntr_fi_bridge_bind(bb, recvd, FI_SEND) == 0); // B sends nothing: stays 0
      auto pump = [&] {
        compcntr_fi_bridge_progress(ba);
        compcntr_fi_bridge_progress(bb);
      };
      constexpr int n = 300; // > the batch of 64, several batches and a partial one
      const std::uint64_t total = traffic(*e, n, pump);
      REQUIRE(fabtest::until([&] { return val(sent) == n && val(rbytes) == total; }, pump));
      CHECK(val(recvd) == 0);
      CHECK(val(other) == 0);
      CHECK(err(sent) + err(rbytes) == 0);
      const auto sa = stats(ba), sb = stats(bb);
      CHECK(sa.entries == n);
      CHECK(sb.entries == n);
      CHECK(sa.errors + sb.errors + sa.unclassified + sb.unclassified + sa.unbound + sb.unbound ==
            0);
      CHECK(compcntr_fi_bridge_close(ba) == 0);
      CHECK(compcntr_fi_bridge_close(bb) == 0);
    }
  }
}

TEST_CASE("FI_CQ_FORMAT_CONTEXT is detected at its first entry, never misparsed") {
  auto e = any_provider(FI_CQ_FORMAT_CONTEXT);
  if (!e) return;
  soft s;
  compcntr_fi_bridge* ba = compcntr_fi_bridge_open(e->a.cq);
  REQUIRE(ba);
  compcntr_comp_cntr* sent = s.counter();
  REQUIRE(compcntr_fi_bridge_bind(
              ba, sent,
              FI_SEND | FI_RECV | FI_READ | FI_WRITE | FI_REMOTE_READ | FI_REMOTE_WRITE) == 0);
  // B's CQ is read by the test itself, as an application would.
  fi_context* ctxs[3];
  int got_b = 0;
  auto drain_b = [&] {
    fi_cq_entry ent[4];
    const ssize_t n = fi_cq_read(e->b.cq, ent, 4);
    if (n > 0) got_b += static_cast<int>(n);
  };
  for (int i = 0; i < 3; ++i)
    REQUIRE(
        fabtest::post(
            [&] { return fi_recv(e->b.ep, e->b.buf + 64 * i, 64, e->b.desc, e->a.addr, e->ctx()); },
            drain_b) == 0);
  for (int i = 0; i < 3; ++i) {
    ctxs[i] = e->ctx();
    REQUIRE(
        fabtest::post([&] { return fi_send(e->a.ep, e->a.buf, 8, e->a.desc, e->b.addr, ctxs[i]); },
                      drain_b) == 0);
  }
  ssize_t r = 0;
  REQUIRE(fabtest::until([&] { return (r = compcntr_fi_bridge_progress(ba)) != 0; }, drain_b));
  CHECK(r == -FI_EOPNOTSUPP);
  CHECK(fi_last().find("FI_CQ_FORMAT_CONTEXT") != std::string::npos);
  CHECK(val(sent) == 0); // nothing counted from a misread entry
  const auto st = stats(ba);
  CHECK(st.entries == 1);
  CHECK(st.unclassified == 1);
  // The bridge stops reading: the other two completions stay in the CQ for the application.
  CHECK(compcntr_fi_bridge_progress(ba) == -FI_EOPNOTSUPP);
  int left = 0;
  REQUIRE(fabtest::until(
      [&] {
        fi_cq_entry ent[4];
        const ssize_t n = fi_cq_read(e->a.cq, ent, 4);
        for (ssize_t i = 0; i < n; ++i) {
          CHECK((ent[i].op_context == ctxs[1] || ent[i].op_context == ctxs[2]));
          ++left;
        }
        return left == 2;
      },
      drain_b));
  REQUIRE(fabtest::until([&] { return got_b == 3; }, drain_b));
  CHECK(compcntr_fi_bridge_close(ba) == 0);
}

TEST_CASE("max_entries bounds one progress call; the rest is read by the next ones") {
  auto e = any_provider();
  if (!e) return;
  soft s;
  for (bool given : {false, true}) {
    compcntr_fi_bridge_attr a{};
    a.comp_mask =
        COMPCNTR_FI_BRIDGE_ATTR_MAX_ENTRIES | (given ? COMPCNTR_FI_BRIDGE_ATTR_FORMAT : 0u);
    a.format = FI_CQ_FORMAT_DATA;
    a.max_entries = 5;
    compcntr_fi_bridge* ba = compcntr_fi_bridge_open_ex(e->a.cq, &a);
    compcntr_fi_bridge* bb = compcntr_fi_bridge_open(e->b.cq);
    REQUIRE(ba);
    REQUIRE(bb);
    compcntr_comp_cntr* sent = s.counter();
    REQUIRE(compcntr_fi_bridge_bind(ba, sent, FI_SEND) == 0);
    // Drive B only until every receive is there: A's send completions pile up in A's CQ.
    compcntr_comp_cntr* recvd = s.counter();
    REQUIRE(compcntr_fi_bridge_bind(bb, recvd, FI_RECV) == 0);
    auto only_b = [&] { compcntr_fi_bridge_progress(bb); };
    const std::uint64_t before = val(sent);
    traffic(*e, 23, only_b);
    REQUIRE(fabtest::until([&] { return val(recvd) == 23; }, only_b));
    ssize_t r;
    std::uint64_t got = 0;
    int calls = 0;
    while (got < 23 && calls < 100000) {
      r = compcntr_fi_bridge_progress(ba);
      REQUIRE(r >= 0);
      CHECK(r <= 5);
      got += static_cast<std::uint64_t>(r);
      ++calls;
    }
    CHECK(got == 23);
    CHECK(val(sent) - before == 23);
    CHECK(compcntr_fi_bridge_close(ba) == 0);
    CHECK(compcntr_fi_bridge_close(bb) == 0);
  }
}

TEST_CASE("progress from several threads at once: exact totals and exact return values") {
  auto e = any_provider();
  if (!e) return;
  soft s;
  compcntr_fi_bridge* ba = compcntr_fi_bridge_open(e->a.cq);
  compcntr_fi_bridge_attr a{COMPCNTR_FI_BRIDGE_ATTR_FORMAT, FI_CQ_FORMAT_DATA, 0};
  compcntr_fi_bridge* bb = compcntr_fi_bridge_open_ex(e->b.cq, &a);
  REQUIRE(ba);
  REQUIRE(bb);
  compcntr_comp_cntr* sent = s.counter();
  compcntr_comp_cntr* rbytes = s.counter(COMPCNTR_COMP_CNTR_TYPE_BYTES);
  REQUIRE(compcntr_fi_bridge_bind(ba, sent, FI_SEND) == 0);
  REQUIRE(compcntr_fi_bridge_bind(bb, rbytes, FI_RECV) == 0);
  constexpr int n = 2000, pumps = 3;
  std::atomic<bool> stop{false};
  std::atomic<std::uint64_t> returned{0};
  std::atomic<int> bad{0};
  std::vector<std::thread> ts;
  for (int t = 0; t < pumps; ++t)
    ts.emplace_back([&] {
      while (!stop.load(std::memory_order_relaxed)) {
        for (compcntr_fi_bridge* br : {ba, bb}) {
          const ssize_t r = compcntr_fi_bridge_progress(br);
          if (r < 0)
            ++bad;
          else
            returned += static_cast<std::uint64_t>(r);
        }
        std::this_thread::yield();
      }
    });
  // Stops and joins the pumps however this scope is left (a failed REQUIRE throws).
  struct joiner {
    std::atomic<bool>& stop;
    std::vector<std::thread>& ts;
    ~joiner() {
      stop = true;
      for (auto& t : ts)
        if (t.joinable()) t.join();
    }
  } join_guard{stop, ts};
  auto yield = [] { std::this_thread::yield(); };
  // Windows of 250: receive queues are bounded (shm answers -FI_ENOMEM past its pool).
  std::uint64_t total = 0;
  for (int w = 0; w < n; w += 250) {
    std::uint64_t window = 0;
    for (int i = w; i < w + 250; ++i)
      REQUIRE(fabtest::post(
                  [&] {
                    return fi_recv(e->b.ep, e->b.buf + 64 * (i % 512), 64, e->b.desc, e->a.addr,
                                   e->ctx());
                  },
                  yield) == 0);
    for (int i = w; i < w + 250; ++i) {
      const std::size_t len = 1 + i % 64;
      window += len;
      REQUIRE(fabtest::post(
                  [&] { return fi_send(e->a.ep, e->a.buf, len, e->a.desc, e->b.addr, e->ctx()); },
                  yield) == 0);
    }
    total += window;
    REQUIRE(fabtest::until([&] { return val(rbytes) == total; }, yield));
  }
  const bool done = fabtest::until([&] { return val(sent) == n && val(rbytes) == total; }, yield);
  stop = true;
  for (auto& t : ts) t.join();
  CHECK(done);
  CHECK(bad == 0);
  CHECK(val(sent) == n);
  CHECK(val(rbytes) == total);
  CHECK(returned == 2u * n); // each entry was reported consumed by exactly one call
  CHECK(stats(ba).entries + stats(bb).entries == 2u * n);
  CHECK(compcntr_fi_bridge_close(ba) == 0);
  CHECK(compcntr_fi_bridge_close(bb) == 0);
}

TEST_CASE("the bridge as a drive function: a waiter drives the CQ (C API)") {
  auto e = any_provider();
  if (!e) return;
  soft s;
  compcntr_fi_bridge* ba = compcntr_fi_bridge_open(e->a.cq);
  compcntr_fi_bridge* bb = compcntr_fi_bridge_open(e->b.cq);
  REQUIRE(ba);
  REQUIRE(bb);
  compcntr_comp_cntr* recvd = s.counter();
  REQUIRE(compcntr_fi_bridge_bind(bb, recvd, FI_RECV) == 0);
  constexpr int n = 100;
  std::atomic<int> rc{-1};
  std::thread waiter([&] {
    compcntr_wait_attr wa{};
    wa.progress = compcntr_fi_bridge_progress_fn;
    wa.progress_ctx = bb;
    rc = compcntr_wait_comp_cntr_ex(recvd, n, 20000, &wa);
  });
  // This thread drives A's CQ only; B's is drained by the waiter's drive function alone.
  auto pump_a = [&] { compcntr_fi_bridge_progress(ba); };
  traffic(*e, n, pump_a);
  while (rc.load() == -1) pump_a();
  waiter.join();
  CHECK(rc == 0);
  CHECK(val(recvd) == n);
  CHECK(compcntr_fi_bridge_close(ba) == 0);
  CHECK(compcntr_fi_bridge_close(bb) == 0);
}

TEST_CASE("C++: compcntr::fabric::bind keeps the counter alive; compcntr::wait drives the CQ") {
  auto e = any_provider();
  if (!e) return;
  std::error_code ec;
  auto dev = compcntr::device::open("soft", ec);
  REQUIRE(!ec);
  auto other_dev = compcntr::device::open("soft", ec);
  REQUIRE(!ec);
  auto recvd = dev.create_counter(compcntr::counter_type::wrs, ec);
  auto bytes = dev.create_counter(compcntr::counter_type::bytes, ec);
  auto rwrites = dev.create_counter(compcntr::counter_type::wrs, ec);
  auto foreign = other_dev.create_counter(compcntr::counter_type::wrs, ec);
  REQUIRE(!ec);
  compcntr_fi_bridge* ba = compcntr_fi_bridge_open(e->a.cq);
  compcntr_fi_bridge* bb = compcntr_fi_bridge_open(e->b.cq);
  REQUIRE(ba);
  REQUIRE(bb);
  CHECK(compcntr::fabric::bind(bb, dev, foreign, FI_SEND) == EINVAL); // not dev's counter
  CHECK(compcntr::fabric::bind(bb, dev, compcntr::counter{}, FI_SEND) == EINVAL);
  CHECK(compcntr::fabric::bind(bb, compcntr::counter_ref{}, FI_SEND) == EINVAL);
  CHECK(compcntr::fabric::bind(bb, dev, bytes, FI_SEND) == ENOTSUP);
  CHECK(compcntr::fabric::bind(bb, dev, bytes, FI_REMOTE_WRITE) == ENOTSUP);
  REQUIRE(compcntr::fabric::bind(bb, dev, recvd, FI_RECV) == 0);
  REQUIRE(compcntr::fabric::bind(bb, dev, rwrites, FI_REMOTE_WRITE) == 0);
  CHECK(compcntr::fabric::bind(bb, dev, bytes, FI_RECV) == EBUSY);
  REQUIRE(compcntr::fabric::bind(ba, dev, bytes, FI_RECV) == 0); // A receives nothing here

  constexpr int n = 100;
  auto pump_a = [&] { compcntr_fi_bridge_progress(ba); };
  // The waiter starts first: its drive function is the only thing that drains B's CQ (senders
  // need the receiver's progress to go on: shm's queues are bounded).
  std::atomic<bool> waited{false};
  std::errc rc{};
  std::thread waiter([&] {
    rc = compcntr::wait(recvd, n, 20s, compcntr::fabric::progress_options(bb, {.spin = 0ns}));
    waited = true;
  });
  traffic(*e, n, pump_a);
  while (!waited) pump_a();
  waiter.join();
  CHECK(rc == std::errc{});
  CHECK(recvd.value() == n);

  // Writes with remote CQ data: a remote event each at the target.
  for (int i = 0; i < 10; ++i)
    REQUIRE(fabtest::post(
                [&] {
                  return fi_writedata(e->a.ep, e->a.buf, 100 + i, e->a.desc, i, e->b.addr,
                                      e->remote(e->b, 8192), e->b.key, e->ctx());
                },
                pump_a) == 0);
  CHECK(compcntr::wait(rwrites, 10, 20s, compcntr::fabric::progress_options(bb)) == std::errc{});
  CHECK(rwrites.value() == 10);
  CHECK(bytes.value() == 0);

  // The bridge holds a reference: the owner cannot destroy the counter while it is bound...
  recvd.destroy(ec);
  CHECK(ec == std::errc::device_or_resource_busy);
  CHECK(recvd.value() == n);
  // ...and an owner that lets go leaves the counter to the bridge until it closes.
  bytes.reset();
  CHECK(compcntr_fi_bridge_close(bb) == 0);
  CHECK(compcntr_fi_bridge_close(ba) == 0);
  recvd.destroy(ec);
  CHECK(!ec);
  foreign.reset();
  rwrites.reset();
  CHECK(dev.live_counters() == 0);
}

TEST_CASE("credits come back through a bridge: MPI-style flow control on real libfabric traffic") {
  auto e = any_provider();
  if (!e) return;
  compcntr_device* dev = compcntr_open_device("soft");
  REQUIRE(dev);
  constexpr std::uint64_t credits = 4;
  compcntr_credits* cr = compcntr_credits_create(dev, 1, credits);
  REQUIRE(cr);
  compcntr_fi_bridge* ba = compcntr_fi_bridge_open(e->a.cq);
  compcntr_fi_bridge* bb = compcntr_fi_bridge_open(e->b.cq);
  REQUIRE(ba);
  REQUIRE(bb);
  // Each completed send on A returns one credit of peer 0.
  REQUIRE(compcntr_fi_bridge_bind(ba, compcntr_credits_counter(cr, 0), FI_SEND) == 0);
  // The drive function of every wait drives both endpoints' CQs (manual-progress providers
  // move data only when their CQs are read).
  compcntr_fi_bridge* both[2] = {ba, bb};
  compcntr_wait_attr wa{};
  wa.progress = [](void* p) {
    for (auto* br : *static_cast<compcntr_fi_bridge*(*)[2]>(p)) compcntr_fi_bridge_progress(br);
  };
  wa.progress_ctx = &both;
  auto pump = [&] { wa.progress(&both); };

  constexpr int n = 200;
  for (int i = 0; i < n; ++i)
    REQUIRE(
        fabtest::post(
            [&] { return fi_recv(e->b.ep, e->b.buf + 64 * i, 64, e->b.desc, e->a.addr, e->ctx()); },
            pump) == 0);
  std::uint64_t most = 0;
  for (int i = 0; i < n; ++i) {
    REQUIRE(compcntr_credits_acquire_ex(cr, 0, 1, 20000, &wa) == 0);
    std::uint64_t out = 0;
    REQUIRE(compcntr_credits_outstanding(cr, 0, &out) == 0);
    most = std::max(most, out);
    REQUIRE(fabtest::post(
                [&] { return fi_send(e->a.ep, e->a.buf, 32, e->a.desc, e->b.addr, e->ctx()); },
                pump) == 0);
  }
  REQUIRE(compcntr_credits_flush_ex(cr, 0, 20000, &wa) == 0);
  std::uint64_t out = 99;
  CHECK(compcntr_credits_outstanding(cr, 0, &out) == 0);
  CHECK(out == 0);
  CHECK(most <= credits);
  CHECK(val(compcntr_credits_counter(cr, 0)) == n);
  CHECK(compcntr_fi_bridge_close(ba) == 0);
  CHECK(compcntr_fi_bridge_close(bb) == 0);
  CHECK(compcntr_credits_destroy(cr) == 0);
  CHECK(compcntr_close_device(dev) == 0);
}
