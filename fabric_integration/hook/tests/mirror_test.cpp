// Suite `hook`, test `mirror`: compcntr_fi_mirror_* (compcntr/fabric.h, semantics.md section 6).
//
// * On real providers (tcp;ofi_rxm, udp;ofi_rxd, shm, sockets over 127.0.0.1, libfabric's own
//   counters bound by the application, no hook): the mirrored compcntr counter equals the
//   provider's counter exactly -- operations without CQ entries (FI_SELECTIVE_COMPLETION),
//   remote RMA events, errors -- also while several threads mirror concurrently.
// * On a counter of this test (a struct fid_cntr whose value is an atomic the test moves): the
//   exactly-once guarantee under concurrent progress calls, reads that come back out of order,
//   wrap-around at 2^64 and at 2^32 (sockets' int32 counters). These run under ThreadSanitizer;
//   the provider cases do not (libfabric is not instrumented: its synchronisation is invisible to
//   TSan).
#include <doctest/doctest.h>

#include <compcntr/fabric.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <latch>
#include <random>
#include <thread>
#include <vector>

#include "fi_pair.hpp"

#if defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define MIRROR_TSAN 1
#endif
#endif
#ifndef MIRROR_TSAN
#define MIRROR_TSAN 0
#endif

using namespace fipair;

namespace {

compcntr_device* dev() {
  static compcntr_device* d = compcntr_open_device("soft");
  REQUIRE(d != nullptr);
  return d;
}

struct cc_holder {
  compcntr_comp_cntr* cc = nullptr;
  cc_holder() {
    compcntr_comp_cntr_init_attr ia{};
    cc = compcntr_create_comp_cntr(dev(), &ia);
    REQUIRE(cc != nullptr);
  }
  ~cc_holder() { compcntr_destroy_comp_cntr(cc); }
  std::uint64_t value() const {
    std::uint64_t v = 0;
    compcntr_read_comp_cntr(cc, &v);
    return v;
  }
  std::uint64_t errors() const {
    std::uint64_t v = 0;
    compcntr_read_err_comp_cntr(cc, &v);
    return v;
  }
};

// ---- a counter of the test's own ----------------------------------------------------------------
//
// fi_cntr_read returns `value` as a provider of `bits` width would: 64-bit as is, 32-bit as
// sockets does (an int32 converted to uint64_t: sign-extended). `stale` makes some reads return
// an older value (what a reader pre-empted between its provider read and its commit sees).
struct test_cntr {
  fid_cntr cntr{};
  std::atomic<std::uint64_t> value{0}, errors{0};
  unsigned bits = 64;
  std::atomic<std::uint64_t> reads{0};
};
std::uint64_t as_provider(const test_cntr* t, std::uint64_t v) {
  if (t->bits == 64) return v;
  return static_cast<std::uint64_t>(
      static_cast<std::int64_t>(static_cast<std::int32_t>(static_cast<std::uint32_t>(v))));
}
uint64_t t_read(fid_cntr* c) {
  auto* t = reinterpret_cast<test_cntr*>(c);
  t->reads.fetch_add(1, std::memory_order_relaxed);
  return as_provider(t, t->value.load(std::memory_order_acquire));
}
uint64_t t_readerr(fid_cntr* c) {
  auto* t = reinterpret_cast<test_cntr*>(c);
  return as_provider(t, t->errors.load(std::memory_order_acquire));
}
fi_ops_cntr t_ops = {
    sizeof(fi_ops_cntr), t_read, t_readerr, nullptr, nullptr, nullptr, nullptr, nullptr};
fi_ops t_fid_ops = {sizeof(fi_ops), nullptr, nullptr, nullptr, nullptr, nullptr, nullptr};

std::unique_ptr<test_cntr> make_test_cntr(unsigned bits, std::uint64_t start,
                                          std::uint64_t err_start = 0) {
  auto t = std::make_unique<test_cntr>();
  t->cntr.fid.fclass = FI_CLASS_CNTR;
  t->cntr.fid.ops = &t_fid_ops;
  t->cntr.ops = &t_ops;
  t->bits = bits;
  t->value = start;
  t->errors = err_start;
  return t;
}

compcntr_fi_mirror* open_bits(fid_cntr* pc, compcntr_comp_cntr* cc, unsigned bits) {
  compcntr_fi_mirror_attr a{};
  a.comp_mask = COMPCNTR_FI_MIRROR_ATTR_VALUE_BITS;
  a.value_bits = bits;
  return compcntr_fi_mirror_open_ex(pc, cc, &a);
}

} // namespace

TEST_CASE("mirror: refused arguments change nothing") {
  cc_holder c;
  auto t = make_test_cntr(64, 5);
  errno = 0;
  CHECK(compcntr_fi_mirror_open(nullptr, c.cc) == nullptr);
  CHECK(errno == EINVAL);
  errno = 0;
  CHECK(compcntr_fi_mirror_open(&t->cntr, nullptr) == nullptr);
  CHECK(errno == EINVAL);
  fid_cntr not_a_cntr{};
  not_a_cntr.fid.fclass = FI_CLASS_CQ;
  errno = 0;
  CHECK(compcntr_fi_mirror_open(&not_a_cntr, c.cc) == nullptr);
  CHECK(errno == EINVAL);
  compcntr_fi_mirror_attr a{};
  a.comp_mask = 1u << 7;
  errno = 0;
  CHECK(compcntr_fi_mirror_open_ex(&t->cntr, c.cc, &a) == nullptr);
  CHECK(errno == EINVAL);
  a.comp_mask = COMPCNTR_FI_MIRROR_ATTR_VALUE_BITS;
  for (std::uint32_t bad : {0u, 7u, 65u}) {
    a.value_bits = bad;
    errno = 0;
    CHECK(compcntr_fi_mirror_open_ex(&t->cntr, c.cc, &a) == nullptr);
    CHECK(errno == EINVAL);
  }
  CHECK(std::strlen(compcntr_fi_last_error()) > 0);
  CHECK(compcntr_fi_mirror_progress(nullptr) == -FI_EINVAL);
  CHECK(compcntr_fi_mirror_close(nullptr) == EINVAL);
  compcntr_fi_mirror_progress_fn(nullptr); // a no-op, not a crash
  CHECK(c.value() == 0);
  CHECK(t->reads == 0); // no refused open touched the provider counter
}

TEST_CASE("mirror: gains since open, completion and error values separately") {
  cc_holder c;
  auto t = make_test_cntr(64, 100, 7); // what the provider counted before: the baseline
  compcntr_fi_mirror* m = compcntr_fi_mirror_open(&t->cntr, c.cc);
  REQUIRE(m != nullptr);
  CHECK(compcntr_fi_mirror_progress(m) == 0);
  CHECK(c.value() == 0);
  CHECK(c.errors() == 0);
  t->value += 5;
  t->errors += 2;
  CHECK(compcntr_fi_mirror_progress(m) == 0);
  CHECK(c.value() == 5);
  CHECK(c.errors() == 2);
  CHECK(compcntr_fi_mirror_progress(m) == 0); // nothing new: nothing added
  CHECK(c.value() == 5);
  CHECK(c.errors() == 2);
  // The compcntr counter keeps its own updates; the mirror adds on top.
  CHECK(compcntr_inc_comp_cntr(c.cc, 1000) == 0);
  t->value += 1;
  compcntr_fi_mirror_progress_fn(m);
  CHECK(c.value() == 1006);
  CHECK(compcntr_fi_mirror_close(m) == 0);
  CHECK(t->value == 106); // the provider counter is only read
}

TEST_CASE("mirror: wraps at 2^64 and, for 32-bit provider counters, at 2^32") {
  {
    cc_holder c;
    auto t = make_test_cntr(64, ~std::uint64_t{0} - 3);
    compcntr_fi_mirror* m = compcntr_fi_mirror_open(&t->cntr, c.cc);
    REQUIRE(m != nullptr);
    t->value += 10; // wraps past 2^64 - 1 to 6
    CHECK(t->value == 6);
    CHECK(compcntr_fi_mirror_progress(m) == 0);
    CHECK(c.value() == 10);
    compcntr_fi_mirror_close(m);
  }
  {
    // sockets: int32 values, read as sign-extended uint64. Past INT32_MAX they turn "negative"
    // (0xffffffff8000xxxx), past UINT32_MAX they wrap to small values.
    cc_holder c;
    auto t = make_test_cntr(32, 0x7ffffffe);
    compcntr_fi_mirror* m = open_bits(&t->cntr, c.cc, 32);
    REQUIRE(m != nullptr);
    t->value += 4;
    CHECK(t_read(&t->cntr) == 0xffffffff80000002ull);
    CHECK(compcntr_fi_mirror_progress(m) == 0);
    CHECK(c.value() == 4);
    t->value = 0xfffffffeull;
    CHECK(compcntr_fi_mirror_progress(m) == 0);
    t->value = 0x100000003ull; // 32-bit value 3
    CHECK(compcntr_fi_mirror_progress(m) == 0);
    CHECK(c.value() == 0x100000003ull - 0x7ffffffe);
    compcntr_fi_mirror_close(m);
  }
  {
    // The same sockets-style counter mirrored as 64-bit: the sign extension looks like a jump
    // of ~2^64 (read as "older", nothing added) -- why value_bits exists.
    cc_holder c;
    auto t = make_test_cntr(32, 0x7ffffffe);
    compcntr_fi_mirror* m = compcntr_fi_mirror_open(&t->cntr, c.cc);
    REQUIRE(m != nullptr);
    t->value += 4;
    CHECK(compcntr_fi_mirror_progress(m) == 0);
    CHECK(c.value() != 4);
    compcntr_fi_mirror_close(m);
  }
}

TEST_CASE("mirror: exactly once under concurrent progress calls (stress; run under TSan)") {
  for (unsigned bits : {64u, 32u}) {
    INFO("value bits " << bits);
    cc_holder c;
    const std::uint64_t start =
        bits == 64 ? ~std::uint64_t{0} - 1000 : 0x7fffff00ull; // wraps on the way
    auto t = make_test_cntr(bits, start, start);
    compcntr_fi_mirror* m = open_bits(&t->cntr, c.cc, bits);
    REQUIRE(m != nullptr);
    constexpr int pullers = 3;
    constexpr std::uint64_t steps = MIRROR_TSAN ? 100'000 : 400'000;
    std::atomic<bool> done{false};
    std::atomic<std::uint64_t> added{0}, err_added{0};
    // Each puller also checks that the values it sees never decrease (an addition is never
    // taken back) and never pass what the "provider" has counted so far.
    std::atomic<int> monotonic_violations{0}, excess{0};
    std::vector<std::thread> th;
    for (int i = 0; i < pullers; ++i)
      th.emplace_back([&] {
        std::uint64_t prev = 0;
        while (!done.load(std::memory_order_acquire)) {
          compcntr_fi_mirror_progress(m);
          const std::uint64_t v = c.value();
          if (v < prev) ++monotonic_violations;
          if (v > added.load(std::memory_order_acquire)) ++excess;
          prev = v;
        }
      });
    std::mt19937_64 rng(42 + bits);
    for (std::uint64_t s = 0; s < steps; ++s) {
      const std::uint64_t d = 1 + rng() % 7;
      // The tally first, then the provider value: a puller never sees a value beyond the tally.
      added.fetch_add(d, std::memory_order_acq_rel);
      t->value.fetch_add(d, std::memory_order_release);
      if (s % 16 == 0) {
        err_added.fetch_add(1, std::memory_order_acq_rel);
        t->errors.fetch_add(1, std::memory_order_release);
      }
    }
    done = true;
    for (auto& x : th) x.join();
    CHECK(compcntr_fi_mirror_progress(m) == 0); // catch up with the last steps
    CHECK(c.value() == added.load());
    CHECK(c.errors() == err_added.load());
    CHECK(monotonic_violations == 0);
    CHECK(excess == 0);
    compcntr_fi_mirror_close(m);
  }
}

TEST_CASE("mirror: a value read before a newer one was committed is not counted again") {
  // Progress calls whose provider reads come back out of order: the reads are scripted.
  struct scripted {
    fid_cntr cntr{};
    std::vector<std::uint64_t> script;
    std::size_t next = 0;
  };
  static scripted s;
  s = {};
  static fi_ops_cntr ops = {
      sizeof(fi_ops_cntr),
      [](fid_cntr*) -> uint64_t {
        return s.script[s.next < s.script.size() ? s.next++ : s.script.size() - 1];
      },
      [](fid_cntr*) -> uint64_t { return 0; },
      nullptr,
      nullptr,
      nullptr,
      nullptr,
      nullptr};
  s.cntr.fid.fclass = FI_CLASS_CNTR;
  s.cntr.fid.ops = &t_fid_ops;
  s.cntr.ops = &ops;
  // open reads 10 (baseline), then: 15 (+5), 12 (stale: older than 15), 15 (nothing), 20 (+5).
  s.script = {10, 15, 12, 15, 20};
  cc_holder c;
  compcntr_fi_mirror* m = compcntr_fi_mirror_open(&s.cntr, c.cc);
  REQUIRE(m != nullptr);
  compcntr_fi_mirror_progress(m);
  CHECK(c.value() == 5);
  compcntr_fi_mirror_progress(m);
  CHECK(c.value() == 5);
  compcntr_fi_mirror_progress(m);
  CHECK(c.value() == 5);
  compcntr_fi_mirror_progress(m);
  CHECK(c.value() == 10);
  compcntr_fi_mirror_close(m);
}

TEST_CASE("mirror: two progress calls that read the same new value add it once") {
  // Both calls' provider reads return only once both have been made (a latch inside the test
  // counter's read): the two calls then decide about the same value at the same time.
  struct gated {
    fid_cntr cntr{};
    std::atomic<std::uint64_t> value{10};
    std::latch* gate = nullptr;
  };
  static gated g;
  static fi_ops_cntr ops = {sizeof(fi_ops_cntr),
                            [](fid_cntr*) -> uint64_t {
                              const std::uint64_t v = g.value.load();
                              if (g.gate) g.gate->arrive_and_wait();
                              return v;
                            },
                            [](fid_cntr*) -> uint64_t { return 0; },
                            nullptr,
                            nullptr,
                            nullptr,
                            nullptr,
                            nullptr};
  g.cntr.fid.fclass = FI_CLASS_CNTR;
  g.cntr.fid.ops = &t_fid_ops;
  g.cntr.ops = &ops;
  for (int round = 0; round < 50; ++round) {
    g.gate = nullptr;
    g.value = 10;
    cc_holder c;
    compcntr_fi_mirror* m = compcntr_fi_mirror_open(&g.cntr, c.cc);
    REQUIRE(m != nullptr);
    g.value = 15;
    std::latch gate(2);
    g.gate = &gate;
    std::thread other([&] { compcntr_fi_mirror_progress(m); });
    compcntr_fi_mirror_progress(m);
    other.join();
    g.gate = nullptr;
    CHECK(c.value() == 5);
    compcntr_fi_mirror_close(m);
  }
}

#if !MIRROR_TSAN
TEST_CASE(
    "mirror: equals the provider's counters on real traffic (no CQ entries, RMA events, errors)") {
  for (const std::string& prov : providers()) {
    INFO("provider " << prov);
    fid_cntr *tx = nullptr, *rx = nullptr, *rwr = nullptr;
    options o;
    o.selective = true;
    o.rma_event = prov != "tcp;ofi_rxm"; // tcp;ofi_rxm has no FI_RMA_EVENT in 1.17
    std::string why;
    auto p = pair::open(prov, o, why, [&](pair& p) {
      if (int r = p.open_cntr(&tx)) return r;
      if (int r = p.open_cntr(&rx)) return r;
      if (int r = fi_ep_bind(p.a.ep, &tx->fid, FI_SEND | FI_WRITE)) return r;
      if (int r = fi_ep_bind(p.b.ep, &rx->fid, FI_RECV)) return r;
      if (o.rma_event) {
        if (int r = p.open_cntr(&rwr)) return r;
        return fi_ep_bind(p.b.ep, &rwr->fid, FI_REMOTE_WRITE);
      }
      return 0;
    });
    REQUIRE_MESSAGE(p != nullptr, why);
    cc_holder ctx, crx, crwr;
    compcntr_fi_mirror* mtx = compcntr_fi_mirror_open(tx, ctx.cc);
    compcntr_fi_mirror* mrx = compcntr_fi_mirror_open(rx, crx.cc);
    compcntr_fi_mirror* mrwr = rwr ? compcntr_fi_mirror_open(rwr, crwr.cc) : nullptr;
    REQUIRE(mtx != nullptr);
    REQUIRE(mrx != nullptr);
    // Three threads mirror the receive counter while the traffic flows (driving the provider
    // through fi_cntr_read); this thread posts and mirrors the others.
    std::atomic<bool> done{false};
    std::vector<std::thread> th;
    for (int i = 0; i < 3; ++i)
      th.emplace_back([&] {
        while (!done.load()) compcntr_fi_mirror_progress(mrx);
      });
    constexpr int n = 40;
    for (int i = 0; i < n; ++i) {
      REQUIRE(p->post([&] {
        return fi_recv(p->b.ep, p->b.buf + (i % 8) * 64, 64, p->b.desc, FI_ADDR_UNSPEC, p->ctx());
      }) == 0);
      REQUIRE(p->post([&] {
        return fi_send(p->a.ep, p->a.buf, 48, p->a.desc, p->b.addr, p->ctx());
      }) == 0);
      compcntr_fi_mirror_progress(mtx);
    }
    const int writes = rwr ? 6 : 0;
    for (int i = 0; i < writes; ++i)
      REQUIRE(p->post([&] {
        return fi_write(p->a.ep, p->a.buf, 64, p->a.desc, p->b.addr, p->remote(p->b, 8192 + i * 64),
                        p->b.key, p->ctx());
      }) == 0);
    // Everything arrives: the provider counters get there (reading them drives progress).
    p->until(
        [&] {
          return fi_cntr_read(rx) >= n && fi_cntr_read(tx) >= std::uint64_t(n + writes) &&
                 (!rwr || fi_cntr_read(rwr) >= std::uint64_t(writes));
        },
        10'000);
    done = true;
    for (auto& x : th) x.join();
    compcntr_fi_mirror_progress(mtx);
    compcntr_fi_mirror_progress(mrx);
    if (mrwr) compcntr_fi_mirror_progress(mrwr);
    CHECK(fi_cntr_read(rx) == n);
    CHECK(crx.value() == n); // never twice, under four concurrent mirrors
    CHECK(fi_cntr_read(tx) == std::uint64_t(n + writes));
    CHECK(ctx.value() == std::uint64_t(n + writes));
    if (rwr) {
      CHECK(fi_cntr_read(rwr) == std::uint64_t(writes));
      CHECK(crwr.value() == std::uint64_t(writes));
    }
    fi_cq_data_entry e;
    CHECK(fi_cq_read(p->b.cq, &e, 1) == -FI_EAGAIN); // none of it wrote a CQ entry

    // Errors: a too-small receive (tcp;ofi_rxm and sockets count it in the error value).
    if (prov == "tcp;ofi_rxm" || prov == "sockets") {
      REQUIRE(p->post([&] {
        return fi_recv(p->b.ep, p->b.buf, 8, p->b.desc, FI_ADDR_UNSPEC, p->ctx());
      }) == 0);
      REQUIRE(p->post([&] {
        return fi_send(p->a.ep, p->a.buf, 64, p->a.desc, p->b.addr, p->ctx());
      }) == 0);
      // The mirror's own progress drives the provider (as a compcntr wait's hook would).
      compcntr_wait_attr wa{};
      wa.progress = compcntr_fi_mirror_progress_fn;
      wa.progress_ctx = mrx;
      // The sender must be driven too (its CQ): the error completes at the receiver once the
      // message is there.
      std::thread drive_a([&] {
        const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(10);
        while (crx.errors() == 0 && std::chrono::steady_clock::now() < end) {
          fi_cq_data_entry x;
          fi_cq_read(p->a.cq, &x, 1);
        }
      });
      std::uint64_t e0 = crx.errors();
      const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(10);
      while (crx.errors() == e0 && std::chrono::steady_clock::now() < end) {
        compcntr_fi_mirror_progress(mrx);
        fi_cq_err_entry ee{};
        if (fi_cq_read(p->b.cq, &e, 1) == -FI_EAVAIL) fi_cq_readerr(p->b.cq, &ee, 0);
      }
      drive_a.join();
      CHECK(fi_cntr_readerr(rx) == 1);
      compcntr_fi_mirror_progress(mrx);
      CHECK(crx.errors() == 1);
      CHECK(crx.value() == n);
    }
    compcntr_fi_mirror_close(mtx);
    compcntr_fi_mirror_close(mrx);
    if (mrwr) compcntr_fi_mirror_close(mrwr);
  }
}
#endif
