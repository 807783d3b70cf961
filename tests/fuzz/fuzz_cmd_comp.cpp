// Fuzz harness: asynchronous command completion (cmd_comp.h) against a reference model of
// semantics.md section 2 and docs/cmd_comp.md: create/destroy, counter queries with random
// wr_ids, gets with random buffer sizes (NULL, < header, < response, larger: bytes past the
// response untouched), O_NONBLOCK on and off, back-pressure at 65,536 outstanding queries,
// counters destroyed and updated while queried, counters of another device.
//
// The answers come from the device's engine thread, so the model is a set of outcomes, not
// one: a query's answer must be one of the values its counter held between the issue and the
// collection (each update appends to the counter's history); responses of one issuing thread
// come in issue order; a get may find nothing yet (EAGAIN) only while queries are outstanding;
// ENOSPC means a response is queued (the fd must poll readable, the next large-enough get
// returns it); once every query is collected the fd must not poll readable. Every outstanding
// query must be answered within 10 s ("drain").
#include "fuzz_common.hpp"

#include <fcntl.h>
#include <poll.h>

#include <deque>

namespace {

using fuzz::edgy_u64;

constexpr int ndev = 2;
fuzz::shared_device devices[ndev];
constexpr std::uint32_t max_outstanding = 65536;  // 1 MiB of 16-byte out_data

struct values {
  std::uint64_t comp, err;
  bool operator==(const values&) const = default;
};

struct model_counter {
  compcntr_comp_cntr* cc;
  int dev;
  bool live = true;
  std::vector<values> hist{values{0, 0}};  // every value it held, oldest first
};

struct query {
  std::uint64_t wr_id;
  int counter;
  std::size_t from;  // history index at issue
};

struct model_cmd_comp {
  compcntr_devx_cmd_comp* cmd = nullptr;
  int dev = 0;
  bool live = true;
  bool nonblock = true;
  std::deque<query> outstanding;  // issued, not collected, in issue order
  bool known_queued = false;      // a get said ENOSPC: a response is queued for sure
};

struct state {
  std::vector<model_counter> c;
  std::vector<model_cmd_comp> q;
  bool filled = false;  // the back-pressure fill ran (once per input: 65,536 queries)
};

int pick(FuzzedDataProvider& in, std::size_t n, auto live) {
  if (n == 0 || in.ConsumeIntegralInRange<int>(0, 31) == 0) return -1;
  const int i = in.ConsumeIntegralInRange<int>(0, static_cast<int>(n) - 1);
  return live(static_cast<std::size_t>(i)) ? i : -1;
}

void set_nonblock(int fd, bool on) {
  const int fl = fcntl(fd, F_GETFL);
  FUZZ_TRUE(fl != -1, "fcntl(F_GETFL) on the cmd_comp fd");
  FUZZ_TRUE(fcntl(fd, F_SETFL, on ? (fl | O_NONBLOCK) : (fl & ~O_NONBLOCK)) == 0,
            "fcntl(F_SETFL) on the cmd_comp fd");
}

bool readable(int fd, int ms) {
  short revents = 0;
  const int r = fuzz::poll_in(fd, ms, &revents);
  FUZZ_TRUE(r >= 0, "poll on the cmd_comp fd");
  return r == 1 && (revents & POLLIN);
}

// The response just collected: the oldest outstanding query's wr_id, a value its counter held
// since the issue; nothing written past the response.
void check_response(state& s, model_cmd_comp& m, const std::uint8_t* buf, std::size_t len,
                    std::uint8_t fill) {
  FUZZ_TRUE(!m.outstanding.empty(), "a response only for an outstanding query");
  const query qu = m.outstanding.front();
  m.outstanding.pop_front();
  m.known_queued = false;
  compcntr_devx_async_cmd_hdr h;
  std::memcpy(&h, buf, sizeof h);
  FUZZ_EQ(h.wr_id, qu.wr_id, "responses come in issue order, with the query's wr_id");
  compcntr_comp_cntr_values v;
  std::memcpy(&v, buf + sizeof h, sizeof v);
  const auto& hist = s.c[static_cast<std::size_t>(qu.counter)].hist;
  bool found = false;
  for (std::size_t j = qu.from; j < hist.size() && !found; ++j)
    found = hist[j] == values{v.comp, v.err};
  if (!found)
    fuzz::mismatch(__FILE__, __LINE__, "query answer",
                   "answer {%" PRIu64 ", %" PRIu64
                   "} is not a value counter c%d held after the issue "
                   "(then {%" PRIu64 ", %" PRIu64 "}, now {%" PRIu64 ", %" PRIu64 "})",
                   v.comp, v.err, qu.counter, hist[qu.from].comp, hist[qu.from].err,
                   hist.back().comp, hist.back().err);
  for (std::size_t k = COMPCNTR_COMP_CNTR_ASYNC_RESP_LEN; k < len; ++k)
    FUZZ_EQ(buf[k], fill, "get writes nothing past the response");
}

void op_create(FuzzedDataProvider& in, state& s) {
  if (s.q.size() >= 6) return;
  const int d = in.ConsumeIntegralInRange<int>(0, ndev - 1);
  const bool null_dev = in.ConsumeIntegralInRange<int>(0, 15) == 0;
  FUZZ_TRACE("q%zu = create_cmd_comp(dev%d%s)", s.q.size(), d, null_dev ? "=NULL" : "");
  errno = 0;
  compcntr_devx_cmd_comp* cmd = compcntr_devx_create_cmd_comp(null_dev ? nullptr : devices[d].dev);
  FUZZ_PTR("create_cmd_comp", cmd, errno, null_dev ? EINVAL : 0);
  if (!cmd) return;
  const int fdfl = fcntl(cmd->fd, F_GETFD);
  FUZZ_TRUE(fdfl != -1 && (fdfl & FD_CLOEXEC), "the cmd_comp fd is a close-on-exec fd");
  FUZZ_TRUE(!readable(cmd->fd, 0), "a new cmd_comp's fd is not readable");
  set_nonblock(cmd->fd, true);  // gets never block unless the model knows a response is queued
  model_cmd_comp m;
  m.cmd = cmd;
  m.dev = d;
  s.q.push_back(std::move(m));
}

void op_destroy(FuzzedDataProvider& in, state& s) {
  if (in.ConsumeIntegralInRange<int>(0, 15) == 0) {
    FUZZ_TRACE("destroy_cmd_comp(NULL)");
    errno = 0;
    compcntr_devx_destroy_cmd_comp(nullptr);
    FUZZ_EQ(errno, EINVAL, "destroy_cmd_comp(NULL) sets errno");
    return;
  }
  const int i = pick(in, s.q.size(), [&](std::size_t k) { return s.q[k].live; });
  if (i < 0) return;
  model_cmd_comp& m = s.q[static_cast<std::size_t>(i)];
  FUZZ_TRACE("destroy_cmd_comp(q%d) with %zu outstanding", i, m.outstanding.size());
  const int fd = m.cmd->fd;
  compcntr_devx_destroy_cmd_comp(m.cmd);
  FUZZ_TRUE(fcntl(fd, F_GETFD) == -1 && errno == EBADF, "destroy closes the fd");
  m.live = false;
  m.outstanding.clear();
}

void op_counter(FuzzedDataProvider& in, state& s) {
  const int kind = in.ConsumeIntegralInRange<int>(0, 4);
  if (kind == 0) {
    if (s.c.size() >= 16) return;
    const int d = in.ConsumeIntegralInRange<int>(0, 7) == 0;
    compcntr_comp_cntr_init_attr a{};
    const std::uint32_t stripes = fuzz::maybe_striped(in, a);
    FUZZ_TRACE("c%zu = create_comp_cntr(dev%d, stripes %u)", s.c.size(), d, stripes);
    errno = 0;
    compcntr_comp_cntr* cc = compcntr_create_comp_cntr(devices[d].dev, &a);
    FUZZ_PTR("create_comp_cntr", cc, errno, 0);
    s.c.push_back(model_counter{cc, d});
    return;
  }
  const int i = pick(in, s.c.size(), [&](std::size_t k) { return s.c[k].live; });
  if (i < 0) return;
  model_counter& c = s.c[static_cast<std::size_t>(i)];
  if (kind == 1) {
    FUZZ_TRACE("destroy_comp_cntr(c%d)", i);
    // Never EBUSY because of a query in flight (docs/cmd_comp.md).
    FUZZ_RC("destroy_comp_cntr", compcntr_destroy_comp_cntr(c.cc), 0);
    c.live = false;
    return;
  }
  values v = c.hist.back();
  const std::uint64_t x = edgy_u64(in);
  int r;
  switch (kind) {
    case 2:
      FUZZ_TRACE("inc_comp_cntr(c%d, %" PRIu64 ")", i, x);
      r = compcntr_inc_comp_cntr(c.cc, x);
      v.comp += x;
      break;
    case 3:
      FUZZ_TRACE("inc_err_comp_cntr(c%d, %" PRIu64 ")", i, x);
      r = compcntr_inc_err_comp_cntr(c.cc, x);
      v.err += x;
      break;
    default:
      FUZZ_TRACE("set_comp_cntr(c%d, %" PRIu64 ")", i, x);
      r = compcntr_set_comp_cntr(c.cc, x);
      v.comp = x;
      break;
  }
  FUZZ_RC("update", r, 0);
  c.hist.push_back(v);
}

void op_query(FuzzedDataProvider& in, state& s) {
  const int qi = pick(in, s.q.size(), [&](std::size_t k) { return s.q[k].live; });
  const int ci = pick(in, s.c.size(), [&](std::size_t k) { return s.c[k].live; });
  const int burst = in.ConsumeBool() ? 1 : in.ConsumeIntegralInRange<int>(1, 300);
  std::uint64_t wr_id = in.ConsumeIntegral<std::uint64_t>();
  FUZZ_TRACE("%d x query_comp_cntr_async(c%d, wr_id %" PRIu64 "+k, q%d)", burst, ci, wr_id, qi);
  for (int k = 0; k < burst; ++k, ++wr_id) {
    int want = 0;
    if (qi < 0 || ci < 0)
      want = EINVAL;
    else if (s.c[static_cast<std::size_t>(ci)].dev != s.q[static_cast<std::size_t>(qi)].dev)
      want = EINVAL;
    else if (s.q[static_cast<std::size_t>(qi)].outstanding.size() >= max_outstanding)
      want = EAGAIN;
    FUZZ_RC("query_comp_cntr_async",
            compcntr_query_comp_cntr_async(
                ci >= 0 ? s.c[static_cast<std::size_t>(ci)].cc : nullptr, wr_id,
                qi >= 0 ? s.q[static_cast<std::size_t>(qi)].cmd : nullptr),
            want);
    if (want != 0) return;
    s.q[static_cast<std::size_t>(qi)].outstanding.push_back(
        query{wr_id, ci, s.c[static_cast<std::size_t>(ci)].hist.size() - 1});
  }
}

// Fills one cmd_comp to the back-pressure limit: exactly 65,536 outstanding, the next EAGAIN;
// one collected frees exactly one.
void op_fill(FuzzedDataProvider& in, state& s) {
  if (s.filled) return;
  const int qi = pick(in, s.q.size(), [&](std::size_t k) { return s.q[k].live; });
  const int ci = pick(in, s.c.size(), [&](std::size_t k) { return s.c[k].live; });
  if (qi < 0 || ci < 0) return;
  model_cmd_comp& m = s.q[static_cast<std::size_t>(qi)];
  model_counter& c = s.c[static_cast<std::size_t>(ci)];
  if (c.dev != m.dev) return;
  s.filled = true;
  FUZZ_TRACE("fill q%d to the limit with queries of c%d (%zu outstanding)", qi, ci,
             m.outstanding.size());
  std::uint64_t wr_id = 1u << 20;
  while (m.outstanding.size() < max_outstanding) {
    FUZZ_RC("query_comp_cntr_async", compcntr_query_comp_cntr_async(c.cc, wr_id, m.cmd), 0);
    m.outstanding.push_back(query{wr_id++, ci, c.hist.size() - 1});
  }
  FUZZ_RC("query_comp_cntr_async at the limit", compcntr_query_comp_cntr_async(c.cc, wr_id, m.cmd),
          EAGAIN);
  // Collect one (waiting for it), then exactly one more is accepted.
  FUZZ_TRUE(readable(m.cmd->fd, 10000), "a query is answered within 10 s");
  std::uint8_t buf[COMPCNTR_COMP_CNTR_ASYNC_RESP_LEN];
  FUZZ_RC("get_async_cmd_comp",
          compcntr_devx_get_async_cmd_comp(
              m.cmd, reinterpret_cast<compcntr_devx_async_cmd_hdr*>(buf), sizeof buf),
          0);
  check_response(s, m, buf, sizeof buf, 0);
  FUZZ_RC("query_comp_cntr_async after one collected",
          compcntr_query_comp_cntr_async(c.cc, wr_id, m.cmd), 0);
  m.outstanding.push_back(query{wr_id++, ci, c.hist.size() - 1});
  FUZZ_RC("query_comp_cntr_async at the limit again",
          compcntr_query_comp_cntr_async(c.cc, wr_id, m.cmd), EAGAIN);
}

void op_get(FuzzedDataProvider& in, state& s) {
  const int qi = pick(in, s.q.size(), [&](std::size_t k) { return s.q[k].live; });
  const std::size_t len = in.ConsumeIntegralInRange<int>(0, 3) == 0
                              ? in.ConsumeIntegralInRange<std::size_t>(0, 64)
                              : in.ConsumeIntegralInRange<std::size_t>(20, 28);
  const bool null_buf = in.ConsumeIntegralInRange<int>(0, 31) == 0;
  const std::uint8_t fill = in.ConsumeIntegral<std::uint8_t>();
  std::uint8_t buf[64];
  std::memset(buf, fill, sizeof buf);
  FUZZ_TRACE("get_async_cmd_comp(q%d, %s, %zu)", qi, null_buf ? "NULL" : "buf", len);
  compcntr_devx_cmd_comp* cmd = qi >= 0 ? s.q[static_cast<std::size_t>(qi)].cmd : nullptr;
  const int r = compcntr_devx_get_async_cmd_comp(
      cmd, null_buf ? nullptr : reinterpret_cast<compcntr_devx_async_cmd_hdr*>(buf), len);
  if (qi < 0 || null_buf || len < 8) {
    FUZZ_RC("get_async_cmd_comp", r, EINVAL);
    return;
  }
  model_cmd_comp& m = s.q[static_cast<std::size_t>(qi)];
  if (m.outstanding.empty()) {
    FUZZ_RC("get_async_cmd_comp with nothing outstanding", r, EAGAIN);
    return;
  }
  if (r == EAGAIN) {
    FUZZ_TRUE(!m.known_queued, "EAGAIN although a response is known to be queued");
    return;
  }
  if (len < COMPCNTR_COMP_CNTR_ASYNC_RESP_LEN) {
    FUZZ_RC("get_async_cmd_comp with a short buffer", r, ENOSPC);
    m.known_queued = true;
    FUZZ_TRUE(readable(m.cmd->fd, 0), "the fd stays readable after ENOSPC");
    for (std::size_t k = 8; k < sizeof buf; ++k) FUZZ_EQ(buf[k], fill, "ENOSPC writes no data");
    return;
  }
  FUZZ_RC("get_async_cmd_comp", r, 0);
  check_response(s, m, buf, len, fill);
}

// Waits for every outstanding answer of one cmd_comp and collects them, alternating blocking
// gets (O_NONBLOCK cleared, only once the fd says a response is there) and non-blocking ones.
void op_drain(FuzzedDataProvider& in, state& s) {
  const int qi = pick(in, s.q.size(), [&](std::size_t k) { return s.q[k].live; });
  if (qi < 0) return;
  model_cmd_comp& m = s.q[static_cast<std::size_t>(qi)];
  const bool blocking = in.ConsumeBool();
  FUZZ_TRACE("drain q%d (%zu outstanding, %s gets)", qi, m.outstanding.size(),
             blocking ? "blocking" : "non-blocking");
  while (!m.outstanding.empty()) {
    FUZZ_TRUE(readable(m.cmd->fd, 10000), "every outstanding query is answered within 10 s");
    if (blocking) set_nonblock(m.cmd->fd, false);
    std::uint8_t buf[COMPCNTR_COMP_CNTR_ASYNC_RESP_LEN];
    FUZZ_RC("get_async_cmd_comp after the fd polled readable",
            compcntr_devx_get_async_cmd_comp(
                m.cmd, reinterpret_cast<compcntr_devx_async_cmd_hdr*>(buf), sizeof buf),
            0);
    if (blocking) set_nonblock(m.cmd->fd, true);
    check_response(s, m, buf, sizeof buf, 0);
  }
  // Exactly while a response is queued: none is, none can come.
  FUZZ_TRUE(!readable(m.cmd->fd, 0), "the fd is not readable with every response collected");
  std::uint8_t buf[COMPCNTR_COMP_CNTR_ASYNC_RESP_LEN];
  FUZZ_RC("get_async_cmd_comp on an empty cmd_comp",
          compcntr_devx_get_async_cmd_comp(
              m.cmd, reinterpret_cast<compcntr_devx_async_cmd_hdr*>(buf), sizeof buf),
          EAGAIN);
}

void op_close(FuzzedDataProvider& in, state& s) {
  const int d = in.ConsumeIntegralInRange<int>(0, ndev - 1);
  int live = 0;
  for (const auto& c : s.c) live += c.live && c.dev == d;
  for (const auto& q : s.q) live += q.live && q.dev == d;
  FUZZ_TRACE("close_device(dev%d) with %d object(s)", d, live);
  if (live) FUZZ_RC("close_device", compcntr_close_device(devices[d].dev), EBUSY);
}

} // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (!devices[0].dev) {
    devices[0].open(nullptr);
    devices[1].open(nullptr);
  }
  fuzz::trace::get().clear();
  FuzzedDataProvider in(data, size);
  state s;
  for (int steps = 0; steps < 300 && in.remaining_bytes() > 0; ++steps) {
    switch (in.ConsumeIntegralInRange<int>(0, 15)) {
      case 0:
      case 1: op_create(in, s); break;
      case 2: op_destroy(in, s); break;
      case 3:
      case 4:
      case 5: op_counter(in, s); break;
      case 6:
      case 7:
      case 8: op_query(in, s); break;
      case 9:
      case 10:
      case 11: op_get(in, s); break;
      case 12: op_drain(in, s); break;
      case 13: op_close(in, s); break;
      case 14:
        if (in.ConsumeIntegralInRange<int>(0, 15) == 0) op_fill(in, s);
        break;
      default: op_get(in, s); break;
    }
  }
  FUZZ_TRACE("end of input: destroy everything");
  for (auto& m : s.q)
    if (m.live) compcntr_devx_destroy_cmd_comp(m.cmd);
  for (auto& c : s.c)
    if (c.live) FUZZ_RC("destroy_comp_cntr", compcntr_destroy_comp_cntr(c.cc), 0);
  return 0;
}
