// Fuzz harness: devices and counters (compcntr.h), waits with timeout 0, poll over random
// counter sets, pollable fds (wait.h), against a reference model of semantics.md section 1/5,
// docs/counters.md, docs/devices.md and docs/wait.md. Striped counters (the STRIPES comp_mask
// bit) go through every call a plain counter does; wait_comp_cntr_since and
// comp_cntr_arm_fd_threshold are modelled too.
//
// Model: per counter its completion and error values (mod 2^64), type, device, fd state.
// Checked after every call: return value, errno of constructors, every live counter's values,
// the thread's poll cursor (poll fairness: the scan starts just after the index last returned).
#include "fuzz_common.hpp"

#include <fcntl.h>
#include <poll.h>
#include <unistd.h>

#include <array>
#include <set>

namespace {

using fuzz::edgy_u64;

struct model_counter {
  compcntr_comp_cntr* cc = nullptr;
  int dev = 0;
  std::uint32_t type = 0;
  std::uint64_t comp = 0, err = 0;
  int fd = -1;
  bool armed = false;    // arm_fd / arm_fd_threshold since the last read of the fd
  bool touched = false;  // plain arm: an update since it; threshold arm: its condition was met
  bool thr_arm = false;  // the arm was arm_fd_threshold(thr), with err0 the error count then
  std::uint64_t thr = 0, err0 = 0;
  std::uint32_t stripes = 0;  // as requested (0: a plain counter)
};

constexpr int max_counters_model = 40;
constexpr int ndev = 2;
fuzz::shared_device devices[ndev];
std::size_t poll_cursor = 0;  // the model of the library's per-thread poll cursor

struct state {
  std::vector<model_counter> c;
  bool reopened = false;  // at most one close + open per input (an open costs ~5 ms: hwloc)

  int live_on(int d) const {
    int n = 0;
    for (const auto& m : c) n += m.dev == d;
    return n;
  }
};

void check_values(const state& s) {
  for (std::size_t i = 0; i < s.c.size(); ++i) {
    std::uint64_t v = 0xdeadbeef, e = 0xdeadbeef;
    FUZZ_RC("read_comp_cntr", compcntr_read_comp_cntr(s.c[i].cc, &v), 0);
    FUZZ_RC("read_err_comp_cntr", compcntr_read_err_comp_cntr(s.c[i].cc, &e), 0);
    FUZZ_EQ(v, s.c[i].comp, "completion value");
    FUZZ_EQ(e, s.c[i].err, "error value");
  }
}

// After an update (the model's values already changed): a plain arm fires on any update; a
// threshold arm once the completion count is >= its threshold or the error count differs from
// its value at the arm (wait.h). Readiness, once due, stays until the fd is read or re-armed.
void touch(model_counter& m) {
  if (!m.armed) return;
  if (!m.thr_arm || m.comp >= m.thr || m.err != m.err0) m.touched = true;
}

// The fd must be readable when an update followed an arm ("readiness may be spurious, never
// missed": only that direction is checked).
void check_fd(const model_counter& m) {
  if (m.fd < 0) return;
  short revents = 0;
  const int r = fuzz::poll_in(m.fd, 0, &revents);
  FUZZ_TRUE(r >= 0, "poll on a counter fd");
  if (m.armed && m.touched)
    FUZZ_TRUE(r == 1 && (revents & POLLIN), "armed fd readable after an update");
}

compcntr_comp_cntr* pick(FuzzedDataProvider& in, state& s, int* index) {
  *index = -1;
  if (s.c.empty() || in.ConsumeIntegralInRange<int>(0, 31) == 0) return nullptr;
  *index = in.ConsumeIntegralInRange<int>(0, static_cast<int>(s.c.size()) - 1);
  return s.c[static_cast<std::size_t>(*index)].cc;
}

void op_create(FuzzedDataProvider& in, state& s) {
  const int d = in.ConsumeIntegralInRange<int>(0, ndev - 1);
  compcntr_device* dev = in.ConsumeIntegralInRange<int>(0, 31) == 0 ? nullptr : devices[d].dev;
  const bool null_attr = in.ConsumeIntegralInRange<int>(0, 31) == 0;
  compcntr_comp_cntr_init_attr a{};
  const int shape = in.ConsumeIntegralInRange<int>(0, 15);
  a.comp_mask = shape == 0 ? in.ConsumeIntegral<std::uint32_t>()
                           : (shape < 4 ? 1u : (shape < 7 ? 2u : (shape == 7 ? 3u : 0u)));
  const std::uint32_t type = in.ConsumeIntegralInRange<int>(0, 15) == 0
                                 ? in.ConsumeIntegral<std::uint32_t>()
                                 : in.ConsumeIntegralInRange<std::uint32_t>(0, 1);
  fuzz::set_raw(a.type, type);
  a.flags = in.ConsumeIntegralInRange<int>(0, 15) == 0 ? in.ConsumeIntegral<std::uint32_t>() : 0;
  a.numa_node = in.ConsumeIntegralInRange<int>(0, 3) == 0 ? in.ConsumeIntegral<std::int32_t>()
                                                          : in.ConsumeIntegralInRange<int>(-1, 1);
  static const std::uint32_t stripe_choice[] = {
      0, 1, 2, 3, 4, 8, 255, 256, 257, COMPCNTR_COMP_CNTR_STRIPES_PER_CPU};
  a.stripes = in.ConsumeIntegralInRange<int>(0, 7) == 0
                  ? in.ConsumeIntegral<std::uint32_t>()
                  : stripe_choice[in.ConsumeIntegralInRange<int>(0, 9)];
  const bool striped_bit = (a.comp_mask & COMPCNTR_COMP_CNTR_INIT_ATTR_STRIPES) != 0;
  FUZZ_TRACE("create_comp_cntr(dev%d%s, %s{mask 0x%x type %u flags 0x%x node %d stripes %u})", d,
             dev ? "" : "=NULL", null_attr ? "NULL " : "", a.comp_mask, type, a.flags, a.numa_node,
             a.stripes);
  int want = 0;
  if (!dev || null_attr || (a.comp_mask & ~3u) || a.flags != 0 || type > 1)
    want = EINVAL;
  else if (striped_bit && a.stripes > 256 && a.stripes != COMPCNTR_COMP_CNTR_STRIPES_PER_CPU)
    want = EINVAL;  // compcntr.h: at most 256 stripes (or one per CPU)
  else if ((a.comp_mask & 1u) && !fuzz::numa_node_exists(devices[0].dev, a.numa_node))
    want = EINVAL;
  else if (static_cast<std::uint32_t>(s.live_on(d)) >= devices[d].max_counters)
    want = ENOMEM;
  else if (static_cast<int>(s.c.size()) >= max_counters_model)
    return;  // the model's own limit: do not make the call
  errno = 0;
  compcntr_comp_cntr* cc = compcntr_create_comp_cntr(dev, null_attr ? nullptr : &a);
  FUZZ_PTR("create_comp_cntr", cc, errno, want);
  if (!cc) return;
  FUZZ_TRUE(cc->context == devices[d].dev, "a new counter's context is its device");
  for (const auto& m : s.c)
    if (m.dev == d) FUZZ_TRUE(m.cc->handle != cc->handle, "handles are unique among live counters");
  compcntr_comp_cntr_type t{};
  FUZZ_RC("comp_cntr_get_type", compcntr_comp_cntr_get_type(cc, &t), 0);
  FUZZ_EQ(static_cast<std::uint32_t>(t), type, "type of a new counter");
  const int node = compcntr_comp_cntr_numa_node(cc);
  if (a.comp_mask & 1u)
    FUZZ_EQ(node, a.numa_node, "NUMA node of a counter created with the NUMA bit");
  else
    FUZZ_TRUE(fuzz::numa_node_exists(devices[0].dev, node), "a new counter's node exists");
  model_counter m;
  m.cc = cc;
  m.dev = d;
  m.type = type;
  m.stripes = striped_bit ? a.stripes : 0;
  s.c.push_back(m);
}

void op_destroy(FuzzedDataProvider& in, state& s) {
  int i;
  compcntr_comp_cntr* cc = pick(in, s, &i);
  FUZZ_TRACE("destroy_comp_cntr(c%d)", i);
  FUZZ_RC("destroy_comp_cntr", compcntr_destroy_comp_cntr(cc), cc ? 0 : EINVAL);
  if (!cc) return;
  const int fd = s.c[static_cast<std::size_t>(i)].fd;
  s.c.erase(s.c.begin() + i);
  // The counter owned its fd: it is closed (nothing else in this thread made an fd since).
  if (fd >= 0)
    FUZZ_TRUE(fcntl(fd, F_GETFD) == -1 && errno == EBADF, "destroy closes the counter's fd");
}

void op_update(FuzzedDataProvider& in, state& s, int kind) {
  int i;
  compcntr_comp_cntr* cc = pick(in, s, &i);
  const std::uint64_t v = edgy_u64(in);
  static const char* const names[] = {"set_comp_cntr", "set_err_comp_cntr", "inc_comp_cntr",
                                      "inc_err_comp_cntr"};
  FUZZ_TRACE("%s(c%d, %" PRIu64 ")", names[kind], i, v);
  int r = 0;
  switch (kind) {
    case 0: r = compcntr_set_comp_cntr(cc, v); break;
    case 1: r = compcntr_set_err_comp_cntr(cc, v); break;
    case 2: r = compcntr_inc_comp_cntr(cc, v); break;
    default: r = compcntr_inc_err_comp_cntr(cc, v); break;
  }
  FUZZ_RC(names[kind], r, cc ? 0 : EINVAL);
  if (!cc) return;
  model_counter& m = s.c[static_cast<std::size_t>(i)];
  switch (kind) {
    case 0: m.comp = v; break;
    case 1: m.err = v; break;
    case 2: m.comp += v; break;
    default: m.err += v; break;
  }
  touch(m);
}

void op_read_nulls(FuzzedDataProvider& in, state& s) {
  int i;
  compcntr_comp_cntr* cc = pick(in, s, &i);
  FUZZ_TRACE("read/read_err/get_type/numa_node(c%d) with NULL outputs", i);
  FUZZ_RC("read_comp_cntr", compcntr_read_comp_cntr(cc, nullptr), EINVAL);
  FUZZ_RC("read_err_comp_cntr", compcntr_read_err_comp_cntr(cc, nullptr), EINVAL);
  FUZZ_RC("comp_cntr_get_type", compcntr_comp_cntr_get_type(cc, nullptr), EINVAL);
  FUZZ_RC("comp_cntr_get_fd", compcntr_comp_cntr_get_fd(cc, nullptr), EINVAL);
  if (!cc) {
    FUZZ_EQ(compcntr_comp_cntr_numa_node(nullptr), -EINVAL, "numa_node(NULL)");
    std::uint64_t v;
    FUZZ_RC("read_comp_cntr", compcntr_read_comp_cntr(nullptr, &v), EINVAL);
    FUZZ_RC("read_err_comp_cntr", compcntr_read_err_comp_cntr(nullptr, &v), EINVAL);
    FUZZ_RC("comp_cntr_arm_fd", compcntr_comp_cntr_arm_fd(nullptr), EINVAL);
  }
}

// Wait options: a zeroed struct means defaults; bits outside SPIN|PROGRESS_INTERVAL, spin_ns < 0
// and progress_interval_us == 0 (with their bits) are EINVAL.
bool random_wait_attr(FuzzedDataProvider& in, compcntr_wait_attr& a) {
  a = {};
  const int shape = in.ConsumeIntegralInRange<int>(0, 7);
  a.comp_mask = shape == 0 ? in.ConsumeIntegral<std::uint32_t>()
                           : in.ConsumeIntegralInRange<std::uint32_t>(0, 3);
  a.spin_ns = in.ConsumeBool() ? in.ConsumeIntegral<std::int64_t>()
                               : in.ConsumeIntegralInRange<std::int64_t>(-1, 1000);
  a.progress_interval_us = in.ConsumeIntegralInRange<std::uint32_t>(0, 2);
  bool bad = (a.comp_mask & ~3u) != 0;
  if (a.comp_mask & COMPCNTR_WAIT_ATTR_SPIN) bad |= a.spin_ns < 0;
  if (a.comp_mask & COMPCNTR_WAIT_ATTR_PROGRESS_INTERVAL) bad |= a.progress_interval_us == 0;
  return !bad;
}

void op_wait(FuzzedDataProvider& in, state& s) {
  int i;
  compcntr_comp_cntr* cc = pick(in, s, &i);
  const std::uint64_t thr = edgy_u64(in);
  const int form = in.ConsumeIntegralInRange<int>(0, 4);
  compcntr_wait_attr a;
  bool attr_ok = true;
  int r;
  if (form >= 3) {
    // wait_comp_cntr_since: EIO when the error count differs from errors_seen at the first
    // check, unless the threshold is reached (it wins); attr NULL or random.
    std::uint64_t seen = 0;
    if (cc) {
      const std::uint64_t e = s.c[static_cast<std::size_t>(i)].err;
      seen = in.ConsumeBool()
                 ? e
                 : (in.ConsumeBool() ? e + in.ConsumeIntegralInRange<int>(-1, 1) : edgy_u64(in));
    }
    const bool with_attr = form == 4;
    if (with_attr) attr_ok = random_wait_attr(in, a);
    FUZZ_TRACE("wait_comp_cntr_since(c%d, %" PRIu64 ", seen %" PRIu64 ", 0, %s)", i, thr, seen,
               with_attr ? "attr" : "NULL");
    r = compcntr_wait_comp_cntr_since(cc, thr, seen, 0, with_attr ? &a : nullptr);
    int want;
    if (!cc || !attr_ok)
      want = EINVAL;
    else {
      const model_counter& m = s.c[static_cast<std::size_t>(i)];
      want = m.comp >= thr ? 0 : (m.err != seen ? EIO : ETIMEDOUT);
    }
    FUZZ_RC("wait_comp_cntr_since", r, want);
    return;
  }
  if (form == 0) {
    FUZZ_TRACE("wait_comp_cntr(c%d, %" PRIu64 ", 0)", i, thr);
    r = compcntr_wait_comp_cntr(cc, thr, 0);
  } else if (form == 1) {
    FUZZ_TRACE("wait_comp_cntr_ex(c%d, %" PRIu64 ", 0, NULL)", i, thr);
    r = compcntr_wait_comp_cntr_ex(cc, thr, 0, nullptr);
  } else {
    attr_ok = random_wait_attr(in, a);
    FUZZ_TRACE("wait_comp_cntr_ex(c%d, %" PRIu64 ", 0, {mask 0x%x spin %lld interval %u})", i, thr,
               a.comp_mask, static_cast<long long>(a.spin_ns), a.progress_interval_us);
    r = compcntr_wait_comp_cntr_ex(cc, thr, 0, &a);
  }
  int want;
  if (!cc || !attr_ok)
    want = EINVAL;
  else
    want = s.c[static_cast<std::size_t>(i)].comp >= thr ? 0 : ETIMEDOUT;
  FUZZ_RC("wait_comp_cntr", r, want);
}

void op_poll(FuzzedDataProvider& in, state& s) {
  const std::size_t n = in.ConsumeIntegralInRange<std::size_t>(0, in.ConsumeBool() ? 4 : 40);
  std::vector<compcntr_comp_cntr*> ccs(n);
  std::vector<int> idx(n);
  std::vector<std::uint64_t> thr(n);
  bool null_elem = false;
  for (std::size_t k = 0; k < n; ++k) {
    ccs[k] = pick(in, s, &idx[k]);
    null_elem |= ccs[k] == nullptr;
    // Thresholds near the current value, so both outcomes are common.
    const std::uint64_t cur = idx[k] >= 0 ? s.c[static_cast<std::size_t>(idx[k])].comp : 0;
    thr[k] = in.ConsumeBool() ? cur + in.ConsumeIntegralInRange<int>(-1, 1) : edgy_u64(in);
  }
  const int nulls = in.ConsumeIntegralInRange<int>(0, 15);
  const bool null_ccs = nulls == 1, null_thr = nulls == 2, null_which = nulls == 3;
  const bool ex = in.ConsumeBool();
  compcntr_wait_attr a{};
  bool attr_ok = true;
  if (ex && in.ConsumeBool()) attr_ok = random_wait_attr(in, a);
  FUZZ_TRACE("poll_comp_cntrs%s(n=%zu%s%s%s, 0) cursor %zu", ex ? "_ex" : "", n,
             null_ccs ? " ccs=NULL" : "", null_thr ? " thresholds=NULL" : "",
             null_which ? " which=NULL" : "", poll_cursor);
  const std::size_t sentinel = 0xabcdef;
  std::size_t which = sentinel;
  const int r = ex ? compcntr_poll_comp_cntrs_ex(
                         null_ccs ? nullptr : ccs.data(), null_thr ? nullptr : thr.data(), n, 0,
                         null_which ? nullptr : &which,
                         attr_ok && a.comp_mask == 0 && !in.ConsumeBool() ? nullptr : &a)
                   : compcntr_poll_comp_cntrs(null_ccs ? nullptr : ccs.data(),
                                              null_thr ? nullptr : thr.data(), n, 0,
                                              null_which ? nullptr : &which);
  int want;
  std::size_t want_which = sentinel;
  if (null_ccs || null_thr || null_which || n == 0 || null_elem || !attr_ok) {
    want = EINVAL;
  } else {
    want = ETIMEDOUT;
    const std::size_t start = poll_cursor % n;
    for (std::size_t k = 0; k < n; ++k) {
      const std::size_t j = (start + k) % n;
      if (s.c[static_cast<std::size_t>(idx[j])].comp >= thr[j]) {
        want = 0;
        want_which = j;
        poll_cursor = j + 1;
        break;
      }
    }
  }
  FUZZ_RC("poll_comp_cntrs", r, want);
  FUZZ_EQ(which, want_which, "poll's *which (unchanged unless 0 or EIO)");
}

void op_get_fd(FuzzedDataProvider& in, state& s) {
  int i;
  compcntr_comp_cntr* cc = pick(in, s, &i);
  FUZZ_TRACE("comp_cntr_get_fd(c%d)", i);
  int fd = -7;
  FUZZ_RC("comp_cntr_get_fd", compcntr_comp_cntr_get_fd(cc, &fd), cc ? 0 : EINVAL);
  if (!cc) {
    FUZZ_EQ(fd, -7, "fd untouched on failure");
    return;
  }
  model_counter& m = s.c[static_cast<std::size_t>(i)];
  if (m.fd >= 0) FUZZ_EQ(fd, m.fd, "later get_fd calls give the same fd");
  FUZZ_TRUE(fd >= 0, "get_fd gives an fd");
  const int fl = fcntl(fd, F_GETFL), fdfl = fcntl(fd, F_GETFD);
  FUZZ_TRUE(fl != -1 && (fl & O_NONBLOCK), "the counter fd is non-blocking");
  FUZZ_TRUE(fdfl != -1 && (fdfl & FD_CLOEXEC), "the counter fd is close-on-exec");
  m.fd = fd;
}

void op_arm_fd(FuzzedDataProvider& in, state& s) {
  int i;
  compcntr_comp_cntr* cc = pick(in, s, &i);
  FUZZ_TRACE("comp_cntr_arm_fd(c%d)", i);
  const int want = !cc || s.c[static_cast<std::size_t>(i)].fd < 0 ? EINVAL : 0;
  FUZZ_RC("comp_cntr_arm_fd", compcntr_comp_cntr_arm_fd(cc), want);
  if (want == 0) {
    model_counter& m = s.c[static_cast<std::size_t>(i)];
    m.armed = true;
    m.touched = false;
    m.thr_arm = false;
  }
}

void op_arm_fd_threshold(FuzzedDataProvider& in, state& s) {
  int i;
  compcntr_comp_cntr* cc = pick(in, s, &i);
  std::uint64_t thr = edgy_u64(in);
  if (cc && in.ConsumeBool())  // near the value: reached at the arm, or by the next increment
    thr = s.c[static_cast<std::size_t>(i)].comp + in.ConsumeIntegralInRange<int>(-1, 2);
  FUZZ_TRACE("comp_cntr_arm_fd_threshold(c%d, %" PRIu64 ")", i, thr);
  const int want = !cc || s.c[static_cast<std::size_t>(i)].fd < 0 ? EINVAL : 0;
  FUZZ_RC("comp_cntr_arm_fd_threshold", compcntr_comp_cntr_arm_fd_threshold(cc, thr), want);
  if (want == 0) {
    model_counter& m = s.c[static_cast<std::size_t>(i)];
    m.armed = true;
    m.thr_arm = true;
    m.thr = thr;
    m.err0 = m.err;
    m.touched = m.comp >= thr;  // already reached: readable on return
  }
}

void op_read_fd(FuzzedDataProvider& in, state& s) {
  int i;
  if (!pick(in, s, &i)) return;
  model_counter& m = s.c[static_cast<std::size_t>(i)];
  if (m.fd < 0) return;
  FUZZ_TRACE("read(fd of c%d)", i);
  check_fd(m);
  std::uint64_t v;
  const ssize_t r = read(m.fd, &v, sizeof v);
  FUZZ_TRUE(r == 8 || (r == -1 && errno == EAGAIN), "reading a counter's eventfd");
  if (m.armed && m.touched) FUZZ_TRUE(r == 8, "an armed fd with an update has data");
  m.armed = false;  // one-shot: consumed; only a new arm makes the next update signal
  m.touched = false;
}

void op_device(FuzzedDataProvider& in, state& s) {
  const int d = in.ConsumeIntegralInRange<int>(0, ndev - 1);
  switch (in.ConsumeIntegralInRange<int>(0, 3)) {
    case 0: {
      FUZZ_TRACE("query_comp_cntr_caps(dev%d)", d);
      compcntr_comp_cntr_caps caps{};
      FUZZ_RC("query_comp_cntr_caps", compcntr_query_comp_cntr_caps(devices[d].dev, &caps), 0);
      FUZZ_EQ(caps.max_value, UINT64_MAX, "software max_value");
      FUZZ_EQ(caps.max_counters, devices[d].max_counters, "max_counters does not change");
      FUZZ_EQ(caps.supported_qp_attach_ops, 0x3fu, "software supported_qp_attach_ops");
      FUZZ_RC("query_comp_cntr_caps", compcntr_query_comp_cntr_caps(devices[d].dev, nullptr),
              EINVAL);
      FUZZ_RC("query_comp_cntr_caps", compcntr_query_comp_cntr_caps(nullptr, &caps), EINVAL);
      break;
    }
    case 1: {
      FUZZ_TRACE("device_name(dev%d)", d);
      const char* name = compcntr_device_name(devices[d].dev);
      FUZZ_TRUE(name && std::strcmp(name, "soft") == 0, "device_name is 'soft'");
      FUZZ_TRUE(compcntr_device_name(nullptr) == nullptr, "device_name(NULL) is NULL");
      break;
    }
    case 2: {
      const int live = s.live_on(d);
      FUZZ_TRACE("close_device(dev%d) with %d live counter(s)", d, live);
      if (live == 0) {
        if (s.reopened) break;
        s.reopened = true;
        devices[d].reopen();
      } else {
        FUZZ_RC("close_device", compcntr_close_device(devices[d].dev), EBUSY);
      }
      break;
    }
    default:
      FUZZ_TRACE("close_device(NULL)");
      FUZZ_RC("close_device", compcntr_close_device(nullptr), EINVAL);
      break;
  }
}

} // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (!devices[0].dev) {
    devices[0].open(nullptr);
    devices[1].open("12");  // a small pool: max_counters is reached often
  }
  fuzz::trace::get().clear();
  FuzzedDataProvider in(data, size);
  state s;
  for (int steps = 0; steps < 400 && in.remaining_bytes() > 0; ++steps) {
    switch (in.ConsumeIntegralInRange<int>(0, 17)) {
      case 0:
      case 1: op_create(in, s); break;
      case 16: op_arm_fd_threshold(in, s); break;
      case 17: op_read_fd(in, s); break;
      case 2: op_destroy(in, s); break;
      case 3: op_update(in, s, 0); break;
      case 4: op_update(in, s, 1); break;
      case 5: op_update(in, s, 2); break;
      case 6: op_update(in, s, 3); break;
      case 7: op_read_nulls(in, s); break;
      case 8:
      case 9: op_wait(in, s); break;
      case 10: op_poll(in, s); break;
      case 11: op_get_fd(in, s); break;
      case 12: op_arm_fd(in, s); break;
      case 13: op_read_fd(in, s); break;
      default: op_device(in, s); break;
    }
    check_values(s);
    for (const auto& m : s.c) check_fd(m);
  }
  FUZZ_TRACE("end of input: destroy the %zu live counter(s)", s.c.size());
  for (const auto& m : s.c) FUZZ_RC("destroy_comp_cntr", compcntr_destroy_comp_cntr(m.cc), 0);
  return 0;
}
