// compcntr_soak: many threads of mixed operations over hundreds of counters, with invariants
// checked while it runs (issue 15). `./dev soak [minutes]` runs it long; the `soak` suite runs a
// short form in CI. Only the public C API is used, as a runtime would.
//
// Threads (each counts its operations and the invariant checks it made):
//   inc workers   increment random counters of the 256 "inc" counters (and the error counts of
//                 every fourth) and remember what they added: at the end every counter must
//                 equal the sum of what was added to it (no lost increment). One in eight of
//                 them (and of the set counters) is striped: every thread below uses those too.
//   reader        reads the inc counters: a value never moves backwards (they are never set).
//   setter/seq    32 counters incremented and set by one thread that brackets every set with a
//                 sequence number (seqlock); a reader checks a value moves backwards only
//                 across a set.
//   waiters       wait_comp_cntr (or wait_comp_cntr_since with the error count read before the
//                 threshold was chosen) with thresholds just ahead and timeouts 0..20 ms: 0 only with
//                 the value reached, ETIMEDOUT never early (nor more than 2 s late), EIO only on
//                 counters whose error count changed during the wait.
//   poller        poll_comp_cntrs over random sets of 1..40 counters: the index returned has
//                 reached its threshold, EIO only with errors, ETIMEDOUT never early.
//   fd watcher    arms the pollable fds of 8 counters (arm_fd, or arm_fd_threshold a little
//                 ahead): an update after the arm (a threshold reached) always makes the fd
//                 readable (poll/epoll), never missed.
//   churn         creates and destroys counters (some with fds): new counters start at 0/0.
//   cmd_comp      batches of async queries of inc counters: every wr_id answered once, in order,
//                 each answer between the values read before the issue and after the collection.
//   tracker       an issuer, a completer (1 in 16 batches with an error) and a quieter: quiet
//                 never succeeds before everything issued before it is accounted for, EIO only
//                 after an error growth (when <compcntr/tracker.h> exists).
//   QP + credits  a sender (credit-controlled: at most 8 sends in flight, the credit counter is
//                 attached to its QP's SEND op) and a receiver on a loopback QP pair, plus RDMA
//                 writes: every byte checked, exact counts at the end.
//   main          every second: open fds (bounded while running, exactly the starting number at
//                 the end) and RSS (bounded growth in uninstrumented builds).
#include <compcntr/compcntr.h>
#if __has_include(<compcntr/tracker.h>)
#include <compcntr/tracker.h>
#define SOAK_TRACKER 1
#else
#define SOAK_TRACKER 0
#endif

#include <fcntl.h>
#include <poll.h>
#include <sys/epoll.h>
#include <unistd.h>

#include <dirent.h>
#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cinttypes>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#if defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define SOAK_INSTRUMENTED 1
#endif
#endif
#ifndef SOAK_INSTRUMENTED
#define SOAK_INSTRUMENTED 0
#endif

namespace {

using clk = std::chrono::steady_clock;

std::atomic<bool> stop{false};
std::atomic<std::uint64_t> failures{0};
std::mutex print_mu;

void fail(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
void fail(const char* fmt, ...) {
  if (failures.fetch_add(1) < 20) {
    std::lock_guard<std::mutex> g(print_mu);
    va_list ap;
    va_start(ap, fmt);
    std::fprintf(stderr, "soak: FAILED: ");
    std::vfprintf(stderr, fmt, ap);
    std::fprintf(stderr, " (last error: %s)\n", compcntr_last_error_message());
    va_end(ap);
  }
}

#define REQ(cond, ...)              \
  do {                              \
    if (!(cond)) fail(__VA_ARGS__); \
  } while (0)

// One named invariant: how often it was checked (and failures go through fail()).
struct invariant {
  const char* name;
  std::atomic<std::uint64_t> checks{0};
};

invariant st_ops{"operations"};
invariant st_lost{"no lost increment (final sums, per counter)"};
invariant st_mono{"no value moving backwards (reads of inc counters)"};
invariant st_seq{"backwards only across a set (seqlock reads)"};
invariant st_wait{"waits ending with the right code by their timeout"};
invariant st_poll{"polls returning a ready index or by their timeout"};
invariant st_fd{"armed fds readable after an update"};
invariant st_churn{"new counters starting at 0/0"};
invariant st_query{"query answers in order and in range"};
invariant st_qp{"messages received byte-exact, within the credit window"};
invariant st_fds{"open fds bounded (samples)"};
invariant st_quiet{"tracker quiets never early, EIO only after errors"};

constexpr int n_inc = 256, n_set = 32, n_fd = 8;

compcntr_device* dev;
compcntr_comp_cntr* inc_c[n_inc];
compcntr_comp_cntr* set_c[n_set];
std::atomic<std::uint64_t> set_seq[n_set]; // odd while a set is in progress

bool takes_errors(int i) { return i % 4 == 0; }

std::uint64_t rd(compcntr_comp_cntr* c) {
  std::uint64_t v = 0;
  const int r = compcntr_read_comp_cntr(c, &v);
  REQ(r == 0, "read_comp_cntr = %d", r);
  return v;
}
std::uint64_t rd_err(compcntr_comp_cntr* c) {
  std::uint64_t v = 0;
  const int r = compcntr_read_err_comp_cntr(c, &v);
  REQ(r == 0, "read_err_comp_cntr = %d", r);
  return v;
}

// Striped counters among the inc and set counters: one in eight (index % 8 == 5), per CPU or 4.
bool striped(int i) { return i % 8 == 5; }
std::uint32_t stripes_of(int i) {
  return !striped(i) ? 0 : (i % 16 == 5 ? COMPCNTR_COMP_CNTR_STRIPES_PER_CPU : 4);
}

compcntr_comp_cntr* make_counter(compcntr_comp_cntr_type type = COMPCNTR_COMP_CNTR_TYPE_WRS,
                                 std::uint32_t stripes = 0) {
  compcntr_comp_cntr_init_attr a{};
  a.type = type;
  if (stripes) {
    a.comp_mask = COMPCNTR_COMP_CNTR_INIT_ATTR_STRIPES;
    a.stripes = stripes;
  }
  compcntr_comp_cntr* c = compcntr_create_comp_cntr(dev, &a);
  if (!c) {
    std::fprintf(stderr, "soak: create_comp_cntr: %s\n", compcntr_last_error_message());
    std::exit(1);
  }
  return c;
}

int open_fds() {
  int n = 0;
  if (DIR* d = opendir("/proc/self/fd")) {
    while (dirent* e = readdir(d)) n += e->d_name[0] != '.';
    closedir(d);
    --n; // the directory stream's own fd
  }
  return n;
}

long rss_kib() {
  long pages = 0, resident = 0;
  if (FILE* f = std::fopen("/proc/self/statm", "r")) {
    if (std::fscanf(f, "%ld %ld", &pages, &resident) != 2) resident = 0;
    std::fclose(f);
  }
  return resident * (sysconf(_SC_PAGESIZE) / 1024);
}

// ---- threads ----

struct inc_worker {
  std::vector<std::uint64_t> added = std::vector<std::uint64_t>(n_inc);
  std::vector<std::uint64_t> added_err = std::vector<std::uint64_t>(n_inc);
  void run(unsigned seed) {
    std::mt19937_64 rng(seed);
    std::uint64_t ops = 0;
    while (!stop.load(std::memory_order_relaxed)) {
      for (int k = 0; k < 64; ++k) {
        const int i = static_cast<int>(rng() % n_inc);
        const std::uint64_t amount = 1 + rng() % 16;
        if (takes_errors(i) && rng() % 8 == 0) {
          REQ(compcntr_inc_err_comp_cntr(inc_c[i], 1) == 0, "inc_err");
          ++added_err[static_cast<std::size_t>(i)];
        } else {
          REQ(compcntr_inc_comp_cntr(inc_c[i], amount) == 0, "inc");
          added[static_cast<std::size_t>(i)] += amount;
        }
        ++ops;
      }
    }
    st_ops.checks += ops;
  }
};

void reader() {
  std::vector<std::uint64_t> last(n_inc), last_e(n_inc);
  std::vector<std::uint64_t> last_set(n_set), last_set_seq(n_set, ~std::uint64_t{0});
  std::uint64_t mono = 0, seq = 0;
  while (!stop.load(std::memory_order_relaxed)) {
    for (int i = 0; i < n_inc; ++i) {
      const std::uint64_t v = rd(inc_c[i]), e = rd_err(inc_c[i]);
      REQ(v >= last[static_cast<std::size_t>(i)],
          "inc counter %d moved backwards: %" PRIu64 " after %" PRIu64, i, v,
          last[static_cast<std::size_t>(i)]);
      REQ(e >= last_e[static_cast<std::size_t>(i)], "inc counter %d's errors moved backwards", i);
      last[static_cast<std::size_t>(i)] = v;
      last_e[static_cast<std::size_t>(i)] = e;
      ++mono;
    }
    for (int i = 0; i < n_set; ++i) {
      // Seqlock read: a value read between two equal even sequence numbers saw no set; if the
      // number is also the previous read's, no set happened in between either.
      const std::uint64_t s1 = set_seq[i].load(std::memory_order_acquire);
      const std::uint64_t v = rd(set_c[i]); // acquire load: the next load stays after it
      const std::uint64_t s2 = set_seq[i].load(std::memory_order_acquire);
      if (s1 == s2 && (s1 & 1) == 0) {
        if (s1 == last_set_seq[static_cast<std::size_t>(i)])
          REQ(v >= last_set[static_cast<std::size_t>(i)],
              "set counter %d moved backwards without a set: %" PRIu64 " after %" PRIu64, i, v,
              last_set[static_cast<std::size_t>(i)]);
        last_set[static_cast<std::size_t>(i)] = v;
        last_set_seq[static_cast<std::size_t>(i)] = s1;
        ++seq;
      }
    }
  }
  st_mono.checks += mono;
  st_seq.checks += seq;
}

void setter(unsigned seed) {
  std::mt19937_64 rng(seed);
  std::uint64_t ops = 0;
  while (!stop.load(std::memory_order_relaxed)) {
    const int i = static_cast<int>(rng() % n_set);
    if (rng() % 16 == 0) {
      set_seq[i].fetch_add(1, std::memory_order_relaxed); // odd: a set is in progress
      std::atomic_thread_fence(std::memory_order_release);
      REQ(compcntr_set_comp_cntr(set_c[i], rng() % 1000) == 0, "set");
      set_seq[i].fetch_add(1, std::memory_order_release);
    } else {
      REQ(compcntr_inc_comp_cntr(set_c[i], 1 + rng() % 4) == 0, "inc");
    }
    ++ops;
  }
  st_ops.checks += ops;
}

void waiter(unsigned seed) {
  std::mt19937_64 rng(seed);
  static const int timeouts[] = {0, 0, 1, 2, 5, 20};
  std::uint64_t n = 0;
  while (!stop.load(std::memory_order_relaxed)) {
    const int i = static_cast<int>(rng() % n_inc);
    const int t = timeouts[rng() % 6];
    const std::uint64_t e0 = rd_err(inc_c[i]);
    const std::uint64_t thr = rd(inc_c[i]) + 1 + rng() % 64;
    const auto t0 = clk::now();
    const bool since = rng() % 2 == 0;
    const int r = since ? compcntr_wait_comp_cntr_since(inc_c[i], thr, e0, t, nullptr)
                        : compcntr_wait_comp_cntr(inc_c[i], thr, t);
    const auto ms = std::chrono::duration<double, std::milli>(clk::now() - t0).count();
    if (r == 0) {
      REQ(rd(inc_c[i]) >= thr, "wait returned 0 below its threshold");
    } else if (r == ETIMEDOUT) {
      REQ(ms >= t, "wait timed out early: %.3f ms of %d", ms, t);
      REQ(ms <= t + 2000.0, "wait timed out %.1f ms late (timeout %d ms)", ms - t, t);
    } else if (r == EIO) {
      REQ(takes_errors(i) && rd_err(inc_c[i]) != e0, "EIO without an error change (counter %d)", i);
    } else {
      fail("wait_comp_cntr returned %d", r);
    }
    ++n;
  }
  st_wait.checks += n;
}

void poller(unsigned seed) {
  std::mt19937_64 rng(seed);
  std::uint64_t n = 0;
  compcntr_comp_cntr* ccs[40];
  std::uint64_t thr[40];
  int idx[40];
  while (!stop.load(std::memory_order_relaxed)) {
    const std::size_t k = 1 + rng() % 40;
    for (std::size_t j = 0; j < k; ++j) {
      idx[j] = static_cast<int>(rng() % n_inc);
      ccs[j] = inc_c[idx[j]];
      thr[j] = rd(ccs[j]) + 1 + rng() % 256;
    }
    const int t = static_cast<int>(rng() % 11);
    std::size_t which = 999;
    const auto t0 = clk::now();
    const int r = compcntr_poll_comp_cntrs(ccs, thr, k, t, &which);
    const auto ms = std::chrono::duration<double, std::milli>(clk::now() - t0).count();
    if (r == 0) {
      REQ(which < k && rd(ccs[which]) >= thr[which], "poll gave index %zu below its threshold",
          which);
    } else if (r == EIO) {
      REQ(which < k && takes_errors(idx[which]), "poll EIO on counter %zu without errors", which);
    } else if (r == ETIMEDOUT) {
      REQ(ms >= t && ms <= t + 2000.0, "poll timed out after %.3f ms (timeout %d)", ms, t);
      REQ(which == 999, "poll changed *which on ETIMEDOUT");
    } else {
      fail("poll_comp_cntrs returned %d", r);
    }
    ++n;
  }
  st_poll.checks += n;
}

void fd_watcher() {
  int fds[n_fd];
  for (int i = 0; i < n_fd; ++i)
    REQ(compcntr_comp_cntr_get_fd(inc_c[i * 3 + 1], &fds[i]) == 0, "get_fd");
  const int ep = epoll_create1(EPOLL_CLOEXEC);
  REQ(ep >= 0, "epoll_create1");
  std::uint64_t n = 0;
  for (unsigned round = 0; !stop.load(std::memory_order_relaxed); ++round) {
    const int i = static_cast<int>(round % n_fd);
    compcntr_comp_cntr* c = inc_c[i * 3 + 1];
    // Odd rounds of four: a threshold arm a little ahead of the value (readable once it is
    // reached or the error count changes); else a plain arm (readable after any update).
    const bool thr_arm = round % 4 >= 2;
    const std::uint64_t e0 = rd_err(c);
    const std::uint64_t thr = rd(c) + 1 + round % 32;
    REQ((thr_arm ? compcntr_comp_cntr_arm_fd_threshold(c, thr) : compcntr_comp_cntr_arm_fd(c)) == 0,
        "arm_fd");
    const std::uint64_t v0 = rd(c);
    // The arm's condition met after it (the inc workers update all the time).
    auto met = [&] { return thr_arm ? rd(c) >= thr || rd_err(c) != e0 : rd(c) != v0; };
    const auto until = clk::now() + std::chrono::seconds(5);
    while (!met() && clk::now() < until && !stop.load(std::memory_order_relaxed))
      std::this_thread::yield();
    if (!met()) continue; // stopping
    bool ready;
    if (round % 2 == 0) {
      pollfd p{fds[i], POLLIN, 0};
      ready = poll(&p, 1, 5000) == 1;
    } else {
      epoll_event ev{};
      ev.events = EPOLLIN;
      epoll_ctl(ep, EPOLL_CTL_ADD, fds[i], &ev);
      epoll_event out;
      ready = epoll_wait(ep, &out, 1, 5000) == 1;
      epoll_ctl(ep, EPOLL_CTL_DEL, fds[i], nullptr);
    }
    REQ(ready, "counter fd %d not readable within 5 s of an update after its arm", i);
    ++n;
  }
  close(ep);
  st_fd.checks += n;
}

void churn(unsigned seed) {
  std::mt19937_64 rng(seed);
  std::vector<compcntr_comp_cntr*> live;
  std::uint64_t n = 0, ops = 0;
  while (!stop.load(std::memory_order_relaxed)) {
    if (live.size() < 64 && (live.empty() || rng() % 2)) {
      compcntr_comp_cntr* c =
          make_counter(rng() % 2 ? COMPCNTR_COMP_CNTR_TYPE_BYTES : COMPCNTR_COMP_CNTR_TYPE_WRS);
      REQ(rd(c) == 0 && rd_err(c) == 0, "a new counter does not start at 0/0");
      ++n;
      if (rng() % 4 == 0) {
        int fd;
        REQ(compcntr_comp_cntr_get_fd(c, &fd) == 0, "get_fd on a new counter");
      }
      REQ(compcntr_inc_comp_cntr(c, 5) == 0 && rd(c) == 5, "inc on a new counter");
      live.push_back(c);
    } else {
      const std::size_t j = rng() % live.size();
      REQ(compcntr_destroy_comp_cntr(live[j]) == 0, "destroy_comp_cntr");
      live[j] = live.back();
      live.pop_back();
    }
    ops += 3;
  }
  for (auto* c : live) REQ(compcntr_destroy_comp_cntr(c) == 0, "destroy_comp_cntr");
  st_churn.checks += n;
  st_ops.checks += ops;
}

void querier(unsigned seed) {
  std::mt19937_64 rng(seed);
  compcntr_devx_cmd_comp* cmd = compcntr_devx_create_cmd_comp(dev);
  REQ(cmd != nullptr, "create_cmd_comp");
  if (!cmd) return;
  std::uint64_t n = 0, wr = 0;
  struct issued {
    std::uint64_t wr_id;
    int i;
    std::uint64_t before;
  };
  std::vector<issued> q;
  while (!stop.load(std::memory_order_relaxed)) {
    q.clear();
    const int batch = 1 + static_cast<int>(rng() % 64);
    for (int b = 0; b < batch; ++b) {
      const int i = static_cast<int>(rng() % n_inc);
      const std::uint64_t before = rd(inc_c[i]);
      const int r = compcntr_query_comp_cntr_async(inc_c[i], wr, cmd);
      REQ(r == 0, "query_comp_cntr_async = %d", r);
      if (r == 0) q.push_back({wr++, i, before});
    }
    for (const issued& x : q) {
      std::uint8_t buf[COMPCNTR_COMP_CNTR_ASYNC_RESP_LEN];
      auto* h = reinterpret_cast<compcntr_devx_async_cmd_hdr*>(buf);
      const int r = compcntr_devx_get_async_cmd_comp(cmd, h, sizeof buf); // blocking
      REQ(r == 0, "get_async_cmd_comp = %d", r);
      compcntr_comp_cntr_values v;
      std::memcpy(&v, buf + 8, sizeof v);
      const std::uint64_t after = rd(inc_c[x.i]);
      REQ(h->wr_id == x.wr_id, "response %" PRIu64 " where %" PRIu64 " was next", h->wr_id,
          x.wr_id);
      REQ(v.comp >= x.before && v.comp <= after,
          "query answer %" PRIu64 " outside [%" PRIu64 ", %" PRIu64 "]", v.comp, x.before, after);
      ++n;
    }
    st_ops.checks += static_cast<std::uint64_t>(batch) * 2;
  }
  compcntr_devx_destroy_cmd_comp(cmd);
  st_query.checks += n;
}

// ---- QP traffic under credits ----

constexpr int window = 8, max_len = 64;
struct qp_side {
  compcntr_qp *tx, *rx;
  compcntr_credits* cr;
  compcntr_comp_cntr *recv_wrs, *rdma_src_bytes, *rdma_dst_bytes;
  std::uint8_t sbuf[window][max_len], rbuf[window][max_len], rdma_src[64], rdma_dst[64];
  compcntr_mr *smr, *rmr, *srcmr, *dstmr;
  std::atomic<std::uint64_t> sent{0};
  std::atomic<bool> sender_done{false};
  std::uint64_t bytes = 0, rdma = 0;
} qps;

std::size_t msg_len(std::uint64_t k) { return 1 + (k * 7) % max_len; }
std::uint8_t msg_byte(std::uint64_t k, std::size_t j) {
  return static_cast<std::uint8_t>(k * 31 + j);
}

void setup_qps() {
  qp_side& s = qps;
  s.tx = compcntr_create_qp(dev);
  s.rx = compcntr_create_qp(dev);
  s.cr = compcntr_credits_create(dev, 1, window);
  s.recv_wrs = make_counter();
  s.rdma_src_bytes = make_counter(COMPCNTR_COMP_CNTR_TYPE_BYTES);
  s.rdma_dst_bytes = make_counter(COMPCNTR_COMP_CNTR_TYPE_BYTES);
  if (!s.tx || !s.rx || !s.cr) {
    std::fprintf(stderr, "soak: QP setup: %s\n", compcntr_last_error_message());
    std::exit(1);
  }
  compcntr_qp_attach_comp_cntr_attr a{0, COMPCNTR_QP_ATTACH_COMP_CNTR_OP_SEND};
  int r = compcntr_qp_attach_comp_cntr(s.tx, compcntr_credits_counter(s.cr, 0), &a);
  a.op_mask = COMPCNTR_QP_ATTACH_COMP_CNTR_OP_RDMA_WRITE;
  r |= compcntr_qp_attach_comp_cntr(s.tx, s.rdma_src_bytes, &a);
  a.op_mask = COMPCNTR_QP_ATTACH_COMP_CNTR_OP_RECV;
  r |= compcntr_qp_attach_comp_cntr(s.rx, s.recv_wrs, &a);
  a.op_mask = COMPCNTR_QP_ATTACH_COMP_CNTR_OP_REMOTE_RDMA_WRITE;
  r |= compcntr_qp_attach_comp_cntr(s.rx, s.rdma_dst_bytes, &a);
  r |= compcntr_modify_qp(s.tx, COMPCNTR_QPS_INIT) | compcntr_modify_qp(s.rx, COMPCNTR_QPS_INIT);
  r |= compcntr_connect_qp(s.tx, s.rx);
  s.smr = compcntr_reg_mr(dev, s.sbuf, sizeof s.sbuf, 0);
  s.rmr = compcntr_reg_mr(dev, s.rbuf, sizeof s.rbuf, COMPCNTR_ACCESS_LOCAL_WRITE);
  s.srcmr = compcntr_reg_mr(dev, s.rdma_src, sizeof s.rdma_src, 0);
  s.dstmr = compcntr_reg_mr(dev, s.rdma_dst, sizeof s.rdma_dst,
                            COMPCNTR_ACCESS_LOCAL_WRITE | COMPCNTR_ACCESS_REMOTE_WRITE);
  if (r != 0 || !s.smr || !s.rmr || !s.srcmr || !s.dstmr) {
    std::fprintf(stderr, "soak: QP setup: %s\n", compcntr_last_error_message());
    std::exit(1);
  }
  std::memset(s.rdma_src, 0x5a, sizeof s.rdma_src);
}

void qp_sender() {
  qp_side& s = qps;
  std::uint64_t k = 0;
  while (!stop.load(std::memory_order_relaxed)) {
    const int r = compcntr_credits_acquire(s.cr, 0, 1, 2000);
    if (r != 0) {
      REQ(stop.load(), "credits_acquire = %d while the receiver runs", r);
      break;
    }
    std::uint64_t out = 0;
    REQ(compcntr_credits_outstanding(s.cr, 0, &out) == 0 && out <= window,
        "credit window exceeded: %" PRIu64, out);
    std::uint8_t* b = s.sbuf[k % window];
    const std::size_t len = msg_len(k);
    for (std::size_t j = 0; j < len; ++j) b[j] = msg_byte(k, j);
    REQ(compcntr_post_send(s.tx, k, b, len, s.smr->lkey) == 0, "post_send");
    s.bytes += len;
    ++k;
    s.sent.store(k, std::memory_order_release);
    if (k % 16 == 0) {
      REQ(compcntr_post_rdma_write(s.tx, k, s.rdma_src, sizeof s.rdma_src, s.srcmr->lkey,
                                   reinterpret_cast<std::uintptr_t>(s.rdma_dst),
                                   s.dstmr->rkey) == 0,
          "post_rdma_write");
      ++s.rdma;
    }
  }
  s.sender_done.store(true, std::memory_order_release);
  st_ops.checks += k * 2;
}

void qp_receiver() {
  qp_side& s = qps;
  for (int j = 0; j < window; ++j)
    REQ(compcntr_post_recv(s.rx, static_cast<std::uint64_t>(j), s.rbuf[j], max_len, s.rmr->lkey) ==
            0,
        "post_recv");
  std::uint64_t k = 0;
  for (;;) {
    const std::uint64_t sent = s.sent.load(std::memory_order_acquire);
    if (k == sent) {
      if (s.sender_done.load(std::memory_order_acquire) && k == s.sent.load()) break;
      std::this_thread::yield();
      continue;
    }
    // Message k was posted: its receive (posted before) completed inside that post.
    const int r = compcntr_wait_comp_cntr(s.recv_wrs, k + 1, 5000);
    REQ(r == 0, "message %" PRIu64 " not received: wait = %d", k, r);
    const std::uint8_t* b = s.rbuf[k % window];
    bool ok = true;
    for (std::size_t j = 0; j < msg_len(k); ++j) ok &= b[j] == msg_byte(k, j);
    REQ(ok, "message %" PRIu64 " corrupted", k);
    REQ(compcntr_post_recv(s.rx, k + window, s.rbuf[k % window], max_len, s.rmr->lkey) == 0,
        "post_recv");
    ++k;
  }
  st_qp.checks += k;
}

void finish_qps() {
  qp_side& s = qps;
  const std::uint64_t n = s.sent.load();
  REQ(compcntr_credits_flush(s.cr, 0, 0) == 0, "credits_flush after the last message");
  REQ(rd(compcntr_credits_counter(s.cr, 0)) == n && rd(s.recv_wrs) == n,
      "SEND/RECV counts %" PRIu64 "/%" PRIu64 " for %" PRIu64 " messages",
      rd(compcntr_credits_counter(s.cr, 0)), rd(s.recv_wrs), n);
  REQ(rd(s.rdma_src_bytes) == s.rdma * 64 && rd(s.rdma_dst_bytes) == s.rdma * 64,
      "RDMA byte counts");
  REQ(rd_err(s.recv_wrs) == 0 && rd_err(compcntr_credits_counter(s.cr, 0)) == 0,
      "error completions in the QP traffic");
  bool ok = true;
  for (std::uint8_t x : s.rdma_dst) ok &= x == 0x5a;
  REQ(s.rdma == 0 || ok, "RDMA write target bytes");
  REQ(compcntr_destroy_qp(s.tx) == 0 && compcntr_destroy_qp(s.rx) == 0, "destroy_qp");
  REQ(compcntr_dereg_mr(s.smr) == 0 && compcntr_dereg_mr(s.rmr) == 0 &&
          compcntr_dereg_mr(s.srcmr) == 0 && compcntr_dereg_mr(s.dstmr) == 0,
      "dereg_mr");
  REQ(compcntr_credits_destroy(s.cr) == 0, "credits_destroy");
  for (auto* c : {s.recv_wrs, s.rdma_src_bytes, s.rdma_dst_bytes})
    REQ(compcntr_destroy_comp_cntr(c) == 0, "destroy");
}

#if SOAK_TRACKER
// ---- completion tracker: an issuer, a completer, a quieter ----

compcntr_comp_cntr* track_c;
compcntr_tracker* track_t;
std::atomic<std::uint64_t> to_complete{0};
std::atomic<bool> issuer_done{false};

void track_issuer(unsigned seed) {
  std::mt19937_64 rng(seed);
  std::uint64_t ops = 0;
  while (!stop.load(std::memory_order_relaxed)) {
    const std::uint64_t n = 1 + rng() % 8;
    REQ(compcntr_tracker_issue(track_t, n) == 0, "tracker_issue");
    to_complete.fetch_add(n, std::memory_order_release);
    ++ops;
    if (ops % 64 == 0) std::this_thread::yield();
  }
  issuer_done.store(true, std::memory_order_release);
  st_ops.checks += ops;
}

void track_completer(unsigned seed) {
  std::mt19937_64 rng(seed);
  std::uint64_t ops = 0;
  for (;;) {
    const std::uint64_t x = to_complete.exchange(0, std::memory_order_acquire);
    if (x == 0) {
      if (issuer_done.load(std::memory_order_acquire) && to_complete.load() == 0) break;
      std::this_thread::yield();
      continue;
    }
    if (rng() % 16 == 0) { // one of them failed
      REQ(compcntr_inc_err_comp_cntr(track_c, 1) == 0, "inc_err");
      if (x > 1) REQ(compcntr_inc_comp_cntr(track_c, x - 1) == 0, "inc");
    } else {
      REQ(compcntr_inc_comp_cntr(track_c, x) == 0, "inc");
    }
    ops += 2;
  }
  st_ops.checks += ops;
}

void track_quieter() {
  // The tracker reports the error value e_i it read inside quiet i, which lies between what
  // this thread reads just before (lo) and just after (hi) the call. With the previous EIO's
  // bounds [plo, phi] (0, 0 at creation): EIO needs e_i > e_prev, so hi > plo; a 0 needs
  // e_i == e_prev, so lo <= phi (an error surely counted since the last report is not lost).
  std::uint64_t n = 0, plo = 0, phi = 0;
  while (!stop.load(std::memory_order_relaxed)) {
    const std::uint64_t target = compcntr_tracker_issued(track_t);
    std::uint64_t lo = 0, hi = 0;
    compcntr_read_err_comp_cntr(track_c, &lo);
    const int r = compcntr_tracker_quiet(track_t, 200);
    compcntr_read_err_comp_cntr(track_c, &hi);
    if (r == 0 || r == EIO) {
      const std::uint64_t done = compcntr_tracker_completed(track_t);
      REQ(done - target < (std::uint64_t{1} << 62),
          "quiet returned %d with %" PRIu64 " of %" PRIu64 " done", r, done, target);
      if (r == EIO) {
        REQ(hi > plo,
            "quiet EIO without an error growth (%" PRIu64 " after, %" PRIu64
            " before the previous EIO)",
            hi, plo);
        plo = lo;
        phi = hi;
      } else {
        REQ(lo <= phi,
            "quiet 0 after errors grew (%" PRIu64 " before, %" PRIu64 " after the previous EIO)",
            lo, phi);
      }
    } else {
      REQ(r == ETIMEDOUT, "tracker_quiet = %d", r);
    }
    ++n;
    std::this_thread::yield(); // let the issuer and completer make progress between quiets
  }
  st_quiet.checks += n;
}
#endif

} // namespace

int main(int argc, char** argv) {
  double seconds = 10;
  int workers = 4;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--seconds") && i + 1 < argc)
      seconds = std::atof(argv[++i]);
    else if (!std::strcmp(argv[i], "--workers") && i + 1 < argc)
      workers = std::atoi(argv[++i]);
    else {
      std::fprintf(stderr, "usage: %s [--seconds S] [--workers N]\n", argv[0]);
      return 2;
    }
  }
  const int fds0 = open_fds();
  dev = compcntr_open_device("soft");
  if (!dev) {
    std::fprintf(stderr, "soak: open_device: %s\n", compcntr_last_error_message());
    return 1;
  }
  for (int i = 0; i < n_inc; ++i)
    inc_c[i] = make_counter(COMPCNTR_COMP_CNTR_TYPE_WRS, stripes_of(i));
  for (int i = 0; i < n_set; ++i)
    set_c[i] = make_counter(COMPCNTR_COMP_CNTR_TYPE_WRS, stripes_of(i));
  setup_qps();

  std::vector<inc_worker> incs(static_cast<std::size_t>(workers));
  std::vector<std::thread> th;
  for (int w = 0; w < workers; ++w)
    th.emplace_back(
        [&, w] { incs[static_cast<std::size_t>(w)].run(100 + static_cast<unsigned>(w)); });
  th.emplace_back(reader);
  th.emplace_back(setter, 1u);
  th.emplace_back(waiter, 2u);
  th.emplace_back(waiter, 3u);
  th.emplace_back(poller, 4u);
  th.emplace_back(fd_watcher);
  th.emplace_back(churn, 5u);
  th.emplace_back(querier, 6u);
  th.emplace_back(qp_sender);
  th.emplace_back(qp_receiver);
#if SOAK_TRACKER
  track_c = make_counter();
  track_t = compcntr_tracker_create(track_c);
  if (!track_t) {
    std::fprintf(stderr, "soak: tracker_create: %s\n", compcntr_last_error_message());
    return 1;
  }
  th.emplace_back(track_issuer, 7u);
  th.emplace_back(track_completer, 8u);
  th.emplace_back(track_quieter);
#endif
  const int nthreads = static_cast<int>(th.size());

  // Fds while running: the device's (engine eventfd), 8 watched counters, up to 64 churned
  // ones, a cmd_comp, an epoll: bounded. RSS: measured after a warm-up, compared at the end.
  const int fd_bound = fds0 + n_fd + 64 + 16;
  const auto t0 = clk::now();
  long rss_warm = 0, rss_max = 0;
  int max_fds = 0;
  for (int sec = 1;; ++sec) {
    const auto next =
        t0 + std::chrono::milliseconds(static_cast<long>(std::min<double>(sec, seconds) * 1000));
    while (clk::now() < next && failures.load() == 0)
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    const int fds = open_fds();
    max_fds = std::max(max_fds, fds);
    REQ(fds <= fd_bound, "%d fds open (bound %d)", fds, fd_bound);
    ++st_fds.checks;
    const long rss = rss_kib();
    rss_max = std::max(rss_max, rss);
    if (rss_warm == 0 && sec >= std::max(1.0, seconds / 4)) rss_warm = rss;
    if (sec >= seconds || failures.load() != 0) break;
    if (seconds > 30 && sec % 30 == 0)
      std::printf("soak: %d s: %" PRIu64 " failures, %d fds, RSS %ld KiB\n", sec, failures.load(),
                  fds, rss);
  }
  stop.store(true);
  for (auto& t : th) t.join();
  const double elapsed = std::chrono::duration<double>(clk::now() - t0).count();
  const long rss_end = rss_kib();

  // No lost increment: each inc counter is what the workers added to it.
  for (int i = 0; i < n_inc; ++i) {
    std::uint64_t want = 0, want_e = 0;
    for (const auto& w : incs) {
      want += w.added[static_cast<std::size_t>(i)];
      want_e += w.added_err[static_cast<std::size_t>(i)];
    }
    REQ(rd(inc_c[i]) == want, "counter %d lost increments: %" PRIu64 " of %" PRIu64, i,
        rd(inc_c[i]), want);
    REQ(rd_err(inc_c[i]) == want_e, "counter %d lost error increments", i);
    ++st_lost.checks;
  }
  finish_qps();
#if SOAK_TRACKER
  REQ(compcntr_tracker_quiet(track_t, 0) == 0 || compcntr_tracker_quiet(track_t, 0) == 0,
      "everything issued is accounted for at the end");
  REQ(compcntr_destroy_comp_cntr(track_c) == EBUSY, "the tracker holds its counter");
  REQ(compcntr_tracker_destroy(track_t) == 0 && compcntr_destroy_comp_cntr(track_c) == 0,
      "tracker teardown");
#endif
  for (auto* c : inc_c) REQ(compcntr_destroy_comp_cntr(c) == 0, "destroy");
  for (auto* c : set_c) REQ(compcntr_destroy_comp_cntr(c) == 0, "destroy");
  REQ(compcntr_close_device(dev) == 0, "close_device: %s", compcntr_last_error_message());
  const int fds_end = open_fds();
  REQ(fds_end == fds0, "fds: %d at the start, %d at the end (a leak)", fds0, fds_end);
  // 32 MiB of growth after the warm-up would be a leak of ~250 bytes per query in a short run;
  // sanitizer builds keep freed memory in quarantine (or shadow it), so only reported there.
  const long growth = rss_end - rss_warm;
  if (!SOAK_INSTRUMENTED) REQ(growth < 32 * 1024, "RSS grew by %ld KiB after the warm-up", growth);

  std::uint64_t ops = st_ops.checks.load();
  for (invariant* s :
       {&st_mono, &st_seq, &st_wait, &st_poll, &st_fd, &st_churn, &st_query, &st_qp, &st_quiet})
    ops += s->checks.load();
  int n_striped = 0;
  for (int i = 0; i < n_inc; ++i) n_striped += striped(i);
  for (int i = 0; i < n_set; ++i) n_striped += striped(i);
  std::printf("soak: %.1f s, %d threads, %d counters (%d striped; + churn): %" PRIu64
              " operations (%.0f ops/s), %" PRIu64 " failures\n",
              elapsed, nthreads, n_inc + n_set + n_fd, n_striped, ops, ops / elapsed,
              failures.load());
  std::printf("soak: invariants checked:\n");
  for (invariant* s : {&st_lost, &st_mono, &st_seq, &st_wait, &st_poll, &st_fd, &st_churn,
                       &st_query, &st_qp, &st_quiet, &st_fds})
    std::printf("  %-58s %" PRIu64 "\n", s->name, s->checks.load());
  std::printf(
      "soak: fds %d at start, at most %d while running, %d at the end; RSS %ld KiB after warm-up, "
      "%ld KiB max, %ld KiB at the end%s\n",
      fds0, max_fds, fds_end, rss_warm, rss_max, rss_end,
      SOAK_INSTRUMENTED ? " (sanitizer build: not judged)" : "");
  return failures.load() == 0 ? 0 : 1;
}
