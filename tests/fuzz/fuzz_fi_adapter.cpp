// Fuzz harness: the fi_cntr adapter (compcntr_fi_cntr_open, include/compcntr/fabric.h,
// docs/fabric.md), its CQ bridges and provider-counter mirrors, on real shm traffic
// (fuzz_fabric.hpp: the world), against a reference model of fabric.h and fi_cntr(3) / fi_trigger(3)
// as compcntr serves them.
//
// Calls: compcntr_fi_cntr_open with any attribute (events, wait object, flags, NULL attr),
// fi_cntr_read/readerr/add/adderr/set/seterr, fi_cntr_wait with timeouts of 0-2 ms,
// fi_control(FI_GETWAIT / FI_GETWAITOBJ / others), fi_bind, fi_open_ops, compcntr_fi_trywait on
// any set of fids (the FI_GETWAIT fd polled afterwards), fi_close in any order; triggered
// operations on the counters (compcntr_trigger_arm / arm_add / arm_set on
// compcntr_fi_cntr_comp_cntr(cntr), inline and deferred, cancel, flush, progress, destroy);
// bridges on A's and B's CQs (open with any attribute, bind any flags, progress, stats, close);
// mirrors of A's provider counter (any value_bits); n sends A->B, truncated ones too (an error
// entry on B's CQ).
//
// Model: per counter its values, wait object, type, fd state (armed by trywait, touched by an
// update), trywait's last values, bridge bindings; the triggers (as fuzz_trigger.cpp: inline
// chains through the trampoline, the deferred queue); per CQ the entries not yet consumed (kind,
// class, length); per bridge its class table, batch size and statistics; per mirror its last
// provider values. A bridge's progress is modelled batch by batch as bridge_progress.cpp reads
// (a known format: fi_cq_read of up to 64 entries, stopping at an error entry; an unknown one:
// one entry per read, counted at the end), a wait check by check (each drives the counter's
// bridges).
// Checked after every call: return values, every counter's values, triggers' states, actions
// run, bridge statistics, fds readable after an update that followed an arm.
#include "fuzz_fabric.hpp"
#include "trigger_model.hpp"

#include <algorithm>
#include <array>
#include <deque>
#include <utility>

namespace {

using fuzz::edgy_u64;
using namespace fuzz::fab;

constexpr int max_counters = 6;
constexpr int max_triggers = 32;
constexpr int n_classes = 6; // bridge.hpp's order: the first matching class of an entry
constexpr std::uint64_t class_flag[n_classes] = {FI_REMOTE_WRITE, FI_REMOTE_READ, FI_READ,
                                                 FI_WRITE,        FI_SEND,        FI_RECV};
constexpr std::uint64_t bindable =
    FI_SEND | FI_RECV | FI_READ | FI_WRITE | FI_REMOTE_READ | FI_REMOTE_WRITE;

fuzz::shared_device device;
world w;

using fuzz::trig::kind;
using fuzz::trig::tstate;
using mtrigger = fuzz::trig::record;

struct mcounter {
  fid_cntr* c = nullptr;
  compcntr_comp_cntr* cc = nullptr;
  bool live = false;
  int wait_obj = FI_WAIT_NONE;
  bool bytes = false;
  std::uint64_t comp = 0, err = 0;
  bool pending = false; // on the trigger model's trampoline stack
  int fd = -1; // FI_WAIT_FD: the fd FI_GETWAIT gave (-1: not asked yet)
  bool armed = false, touched = false;
  std::uint64_t seen_v = 0, seen_e = 0; // compcntr_fi_trywait's last values
  int bindings = 0; // bridge bindings (fi_close is -FI_EBUSY meanwhile)
  std::vector<int> sources; // bridges, in the order of their first binding
  int mirrors = 0; // live mirrors into it (the harness closes them first)
};

struct entry {
  bool error = false;
  int cls = 0; // index into class_flag
  std::uint64_t len = 0;
};

struct mbridge {
  compcntr_fi_bridge* br = nullptr;
  bool live = false;
  int cq = 0; // 0: A's CQ, 1: B's CQ
  bool known = false;
  std::size_t max = 1024;
  std::array<int, n_classes> table{-1, -1, -1, -1, -1, -1};
  std::vector<int> bound; // counter of each bind call (for close)
  compcntr_fi_bridge_stats st{};
};

struct mmirror {
  compcntr_fi_mirror* m = nullptr;
  bool live = false;
  int counter = 0;
  std::uint64_t mask = ~std::uint64_t{0};
  std::uint64_t last_v = 0, last_e = 0;
};

struct state {
  std::array<mcounter, max_counters> c;
  std::vector<mtrigger> t;
  std::vector<int> queue;
  std::vector<std::pair<int, int>> want;
  std::vector<int> stack;
  int depth = 0;
  std::uint64_t seq = 0;
  std::array<std::deque<entry>, 2> cq; // entries not consumed: A's CQ, B's CQ
  std::array<mbridge, 2> br; // at most one live bridge per CQ (its only reader)
  std::array<mmirror, 2> mir;
  std::uint64_t a_sent = 0; // A's provider counter (sends since the input began)
};

std::vector<std::pair<int, int>> ran;
struct ctx {
  int index;
};
std::array<ctx, max_triggers> ctxs;
void log_action(void* p, int status) { ran.emplace_back(static_cast<ctx*>(p)->index, status); }

// ---- the trigger model (fuzz_trigger.cpp's, on adapter counters) ------------------------------

void evaluate(state& s, int ci);

void touch(mcounter& m) {
  if (m.armed) m.touched = true;
}

void model_run(state& s, int ti, int status) {
  mtrigger& m = s.t[ti];
  if (m.k == kind::log) s.want.emplace_back(ti, status);
  m.st = status == 0 ? tstate::fired : tstate::cancelled;
  if (status != 0 || m.k == kind::log) return;
  mcounter& tc = s.c[m.target];
  tc.comp = m.k == kind::add ? tc.comp + m.operand : m.operand;
  touch(tc);
  evaluate(s, m.target);
}

// The trigger model (tests/fuzz/trigger_model.hpp; its record's hooks are there too).
std::vector<int> due(const state& s, int ci) { return fuzz::trig::due(s, ci); }
void evaluate(state& s, int ci) { fuzz::trig::evaluate(s, ci); }
int cancel_all(state& s, int ci) { return fuzz::trig::cancel_all(s, ci); }

bool is_target(const state& s, int ci) {
  for (const mtrigger& m : s.t)
    if (m.live && m.target == ci) return true;
  return false;
}

// Updates of a counter's compcntr values (any path: fi_cntr_*, a bridge, a mirror).
void m_inc(state& s, int ci, std::uint64_t v) {
  s.c[ci].comp += v;
  touch(s.c[ci]);
  evaluate(s, ci);
}
void m_set(state& s, int ci, std::uint64_t v) {
  s.c[ci].comp = v;
  touch(s.c[ci]);
  evaluate(s, ci);
}
void m_inc_err(state& s, int ci, std::uint64_t v) {
  s.c[ci].err += v;
  touch(s.c[ci]);
  evaluate(s, ci);
}
void m_set_err(state& s, int ci, std::uint64_t v) {
  s.c[ci].err = v;
  touch(s.c[ci]);
  evaluate(s, ci);
}

// ---- the bridge model -------------------------------------------------------------------------

// One compcntr_fi_bridge_progress on bridge bi: the number of entries consumed.
long model_bridge_progress(state& s, int bi) {
  mbridge& b = s.br[bi];
  std::deque<entry>& q = s.cq[b.cq];
  std::array<std::uint64_t, n_classes> done{}, bytes{}, failed{};
  compcntr_fi_bridge_stats t{};
  auto route = [&](const entry& e) -> int {
    if (b.table[e.cls] < 0) {
      ++t.unbound;
      return -1;
    }
    return e.cls;
  };
  auto flush = [&] {
    for (int c = 0; c < n_classes; ++c) {
      if (done[c] == 0 && failed[c] == 0) continue;
      const int ci = b.table[c];
      if (done[c]) m_inc(s, ci, s.c[ci].bytes ? bytes[c] : done[c]);
      if (failed[c]) m_inc_err(s, ci, failed[c]);
      done[c] = bytes[c] = failed[c] = 0;
    }
    b.st.entries += t.entries;
    b.st.errors += t.errors;
    b.st.unclassified += t.unclassified;
    b.st.unbound += t.unbound;
    t = {};
  };
  auto consume_ok = [&] {
    const entry e = q.front();
    q.pop_front();
    ++t.entries;
    if (const int c = route(e); c >= 0) {
      ++done[c];
      bytes[c] += e.len;
    }
  };
  auto consume_err = [&] {
    const entry e = q.front();
    q.pop_front();
    ++t.errors;
    if (const int c = route(e); c >= 0) ++failed[c];
  };
  long consumed = 0;
  const std::size_t max = b.max;
  if (b.known) {
    while (static_cast<std::size_t>(consumed) < max) {
      const std::size_t want = std::min<std::size_t>(64, max - static_cast<std::size_t>(consumed));
      // fi_cq_read returns the successful entries before the first error entry.
      std::size_t n = 0;
      while (n < want && n < q.size() && !q[n].error) ++n;
      if (n > 0) {
        for (std::size_t i = 0; i < n; ++i) consume_ok();
        consumed += static_cast<long>(n);
        flush();
        if (n < want) break;
      } else if (!q.empty()) { // -FI_EAVAIL: the error entry
        consume_err();
        ++consumed;
        flush();
      } else {
        break;
      }
    }
  } else {
    while (static_cast<std::size_t>(consumed) < max && !q.empty()) {
      if (q.front().error)
        consume_err();
      else
        consume_ok();
      ++consumed;
    }
    flush();
  }
  return consumed;
}

// An adapter counter's drive(): every bridge it is bound to, once, in binding order.
void model_drive(state& s, int ci) {
  const std::vector<int> src = s.c[ci].sources; // bridges do not close inside
  for (int bi : src) model_bridge_progress(s, bi);
}

void check(state& s) {
  FUZZ_EQ(ran.size(), s.want.size(), "number of actions run");
  for (std::size_t i = 0; i < ran.size(); ++i) {
    FUZZ_EQ(ran[i].first, s.want[i].first, "which action ran");
    FUZZ_EQ(ran[i].second, s.want[i].second, "its status");
  }
  for (mcounter& m : s.c) {
    if (!m.live) continue;
    std::uint64_t v = 0, e = 0;
    FUZZ_RC("read_comp_cntr", compcntr_read_comp_cntr(m.cc, &v), 0);
    FUZZ_RC("read_err_comp_cntr", compcntr_read_err_comp_cntr(m.cc, &e), 0);
    FUZZ_EQ(v, m.comp, "completion value (compcntr_read_comp_cntr of the adapter's counter)");
    FUZZ_EQ(e, m.err, "error value");
    if (m.fd >= 0 && m.armed && m.touched) {
      short rev = 0;
      const int r = fuzz::poll_in(m.fd, 0, &rev);
      FUZZ_TRUE(r == 1 && (rev & POLLIN),
                "an update after compcntr_fi_trywait makes the fd readable");
    }
  }
  for (const mtrigger& m : s.t) {
    if (!m.live) continue;
    const int want = m.st == tstate::fired ? 1 : m.st == tstate::cancelled ? 2 : 0;
    FUZZ_EQ(compcntr_trigger_state(m.t), want, "trigger state");
  }
  for (const mbridge& b : s.br) {
    if (!b.live) continue;
    compcntr_fi_bridge_stats st{};
    FUZZ_ERR("compcntr_fi_bridge_query_stats", compcntr_fi_bridge_query_stats(b.br, &st), 0);
    FUZZ_EQ(st.entries, b.st.entries, "bridge entries");
    FUZZ_EQ(st.errors, b.st.errors, "bridge error entries");
    FUZZ_EQ(st.unclassified, b.st.unclassified, "bridge unclassified entries");
    FUZZ_EQ(st.unbound, b.st.unbound, "bridge unbound entries");
  }
}

int pick_live(FuzzedDataProvider& in, const state& s) {
  const int i = in.ConsumeIntegralInRange<int>(0, max_counters - 1);
  return s.c[i].live ? i : -1;
}

// ---- counter calls ----------------------------------------------------------------------------

void op_open(FuzzedDataProvider& in, state& s) {
  const int i = in.ConsumeIntegralInRange<int>(0, max_counters - 1);
  if (s.c[i].live) return;
  raw_attr ra;
  static const int waits[] = {FI_WAIT_NONE, FI_WAIT_UNSPEC, FI_WAIT_YIELD, FI_WAIT_FD};
  ra.wait_obj = waits[in.ConsumeIntegralInRange<int>(0, 3)];
  ra.events = in.ConsumeIntegralInRange<int>(0, 7) == 0 ? 1 : 0; // COMPCNTR_FI_CNTR_EVENTS_BYTES
  long want = 0;
  switch (in.ConsumeIntegralInRange<int>(0, 15)) { // mostly valid
    case 0:
      ra.null_attr = true;
      ra.events = 0;
      ra.wait_obj = FI_WAIT_NONE;
      break;
    case 1: ra.flags = in.ConsumeIntegralInRange<std::uint64_t>(1, ~std::uint64_t{0}); break;
    case 2: ra.events = in.ConsumeIntegralInRange<int>(2, 100) * (in.ConsumeBool() ? 1 : -1); break;
    case 3:
      ra.wait_obj = FI_WAIT_SET;
      ra.wait_set = in.ConsumeBool();
      break;
    case 4: ra.wait_obj = in.ConsumeBool() ? FI_WAIT_MUTEX_COND : FI_WAIT_POLLFD; break;
    case 5:
      ra.wait_obj = in.ConsumeIntegralInRange<int>(7, 1000) * (in.ConsumeBool() ? 1 : -1);
      break;
    default: break;
  }
  if (ra.flags != 0)
    want = -FI_EINVAL;
  else if (ra.events != FI_CNTR_EVENTS_COMP && ra.events != 1)
    want = -FI_EINVAL;
  else if (ra.wait_obj == FI_WAIT_SET)
    want = ra.wait_set ? -FI_EOPNOTSUPP : -FI_EINVAL;
  else if (ra.wait_obj == FI_WAIT_MUTEX_COND || ra.wait_obj == FI_WAIT_POLLFD)
    want = -FI_EOPNOTSUPP;
  else if (ra.wait_obj != FI_WAIT_NONE && ra.wait_obj != FI_WAIT_UNSPEC &&
           ra.wait_obj != FI_WAIT_YIELD && ra.wait_obj != FI_WAIT_FD)
    want = -FI_EINVAL;
  fi_cntr_attr a = ra.get();
  fid_cntr* c = reinterpret_cast<fid_cntr*>(std::uintptr_t{0x5a5a});
  FUZZ_TRACE("compcntr_fi_cntr_open(%s events %d wait %d flags %#llx) -> c%d",
             ra.null_attr ? "NULL" : "attr", ra.events, ra.wait_obj, (unsigned long long)ra.flags,
             i);
  const int r = compcntr_fi_cntr_open(device.dev, ra.null_attr ? nullptr : &a, &c, &s.c[i]);
  FUZZ_FI("compcntr_fi_cntr_open", r, want);
  if (want != 0) {
    FUZZ_TRUE(c == reinterpret_cast<fid_cntr*>(std::uintptr_t{0x5a5a}),
              "a refused open writes *cntr");
    return;
  }
  FUZZ_TRUE(c != nullptr && c->fid.fclass == FI_CLASS_CNTR,
            "an adapter counter is an FI_CLASS_CNTR fid");
  FUZZ_TRUE(c->fid.context == &s.c[i], "fid.context is the open's context");
  mcounter& m = s.c[i];
  m = mcounter{};
  m.c = c;
  m.live = true;
  m.wait_obj = ra.wait_obj;
  m.bytes = ra.events == 1;
  errno = 0;
  m.cc = compcntr_fi_cntr_comp_cntr(c);
  FUZZ_TRUE(m.cc != nullptr, "compcntr_fi_cntr_comp_cntr of an adapter counter");
  compcntr_comp_cntr_type type{};
  FUZZ_RC("compcntr_comp_cntr_get_type", compcntr_comp_cntr_get_type(m.cc, &type), 0);
  FUZZ_EQ(type, m.bytes ? COMPCNTR_COMP_CNTR_TYPE_BYTES : COMPCNTR_COMP_CNTR_TYPE_WRS,
          "counter type");
}

void op_update(FuzzedDataProvider& in, state& s) {
  const int i = pick_live(in, s);
  if (i < 0) return;
  const std::uint64_t v = edgy_u64(in);
  mcounter& m = s.c[i];
  switch (in.ConsumeIntegralInRange<int>(0, 3)) {
    case 0:
      FUZZ_TRACE("fi_cntr_add c%d %llu", i, (unsigned long long)v);
      FUZZ_FI("fi_cntr_add", fi_cntr_add(m.c, v), 0);
      m_inc(s, i, v);
      break;
    case 1:
      FUZZ_TRACE("fi_cntr_set c%d %llu", i, (unsigned long long)v);
      FUZZ_FI("fi_cntr_set", fi_cntr_set(m.c, v), 0);
      m_set(s, i, v);
      break;
    case 2:
      FUZZ_TRACE("fi_cntr_adderr c%d %llu", i, (unsigned long long)v);
      FUZZ_FI("fi_cntr_adderr", fi_cntr_adderr(m.c, v), 0);
      m_inc_err(s, i, v);
      break;
    default:
      FUZZ_TRACE("fi_cntr_seterr c%d %llu", i, (unsigned long long)v);
      FUZZ_FI("fi_cntr_seterr", fi_cntr_seterr(m.c, v), 0);
      m_set_err(s, i, v);
      break;
  }
}

void op_read(FuzzedDataProvider& in, state& s) {
  const int i = pick_live(in, s);
  if (i < 0) return;
  mcounter& m = s.c[i];
  const bool err = in.ConsumeBool();
  FUZZ_TRACE("fi_cntr_read%s c%d", err ? "err" : "", i);
  model_drive(s, i); // read and readerr drive the bound bridges first
  const std::uint64_t got = err ? fi_cntr_readerr(m.c) : fi_cntr_read(m.c);
  FUZZ_EQ(got, err ? m.err : m.comp, err ? "fi_cntr_readerr" : "fi_cntr_read");
}

// fi_cntr_wait: a threshold already reached answers 0 at once (compcntr's wait: one load, no
// check, no progress); otherwise each check drives the counter's bridges, then compares (the
// threshold wins over an error change seen at the same check). A timeout of 0 is one check; otherwise the wait
// checks until its answer or until nothing is left to drive (more than the 3 checks any timed
// wait makes are needed only for answers the model then asks for with a long timeout).
void op_wait(FuzzedDataProvider& in, state& s) {
  const int i = pick_live(in, s);
  if (i < 0) return;
  mcounter& m = s.c[i];
  const std::uint64_t thr =
      in.ConsumeBool() ? m.comp + in.ConsumeIntegralInRange<std::uint64_t>(0, 6) - 2 : edgy_u64(in);
  int timeout = small_timeout(in);
  if (m.wait_obj == FI_WAIT_NONE) {
    FUZZ_TRACE("fi_cntr_wait c%d thr %llu timeout %d (FI_WAIT_NONE)", i, (unsigned long long)thr,
               timeout);
    FUZZ_FI("fi_cntr_wait", fi_cntr_wait(m.c, thr, timeout), -FI_ENOSYS);
    return;
  }
  // Predict on a copy: how many checks until the answer, and the answer.
  state probe = s;
  const std::uint64_t err0 = probe.c[i].err;
  long want = -FI_ETIMEDOUT;
  int checks = 0;
  // Already reached: compcntr's wait returns after one load, before any check (no progress).
  if (probe.c[i].comp >= thr) want = 0;
  for (; want != 0;) {
    ++checks;
    std::size_t before = probe.cq[0].size() + probe.cq[1].size();
    model_drive(probe, i);
    if (probe.c[i].comp >= thr) {
      want = 0;
      break;
    }
    if (probe.c[i].err != err0) {
      want = -FI_EAVAIL;
      break;
    }
    if (timeout == 0) break;
    if (probe.cq[0].size() + probe.cq[1].size() == before) break; // nothing more to drive
    if (checks > 10000) break;
  }
  if (timeout > 0 && want != -FI_ETIMEDOUT) timeout = 10000; // answered within the checks
  if (timeout > 0 && want == -FI_ETIMEDOUT && checks > 3) timeout = 0, checks = 1;
  FUZZ_TRACE("fi_cntr_wait c%d thr %llu timeout %d (model: %s after %d check(s))", i,
             (unsigned long long)thr, timeout, fi_name(want).c_str(), checks);
  // The model's state after exactly that many checks (timeout 0 may have been forced above).
  want = checks == 0 ? 0 : -FI_ETIMEDOUT;
  for (int k = 0; k < checks; ++k) {
    model_drive(s, i);
    if (s.c[i].comp >= thr) {
      want = 0;
      break;
    }
    if (s.c[i].err != err0) {
      want = -FI_EAVAIL;
      break;
    }
  }
  FUZZ_FI("fi_cntr_wait", fi_cntr_wait(m.c, thr, timeout), want);
}

void op_control(FuzzedDataProvider& in, state& s) {
  const int i = pick_live(in, s);
  if (i < 0) return;
  mcounter& m = s.c[i];
  switch (in.ConsumeIntegralInRange<int>(0, 5)) {
    case 0:
    case 1: {
      int fd = -7;
      FUZZ_TRACE("fi_control(c%d, FI_GETWAIT)", i);
      const int r = fi_control(&m.c->fid, FI_GETWAIT, &fd);
      if (m.wait_obj != FI_WAIT_FD) {
        FUZZ_FI("fi_control(FI_GETWAIT)", r, -FI_ENODATA);
        FUZZ_EQ(fd, -7, "a refused FI_GETWAIT writes its argument");
        return;
      }
      FUZZ_FI("fi_control(FI_GETWAIT)", r, 0);
      FUZZ_TRUE(fd >= 0, "FI_GETWAIT gives an fd");
      if (m.fd >= 0) FUZZ_EQ(fd, m.fd, "FI_GETWAIT gives the same fd every time");
      m.fd = fd;
      return;
    }
    case 2: {
      FUZZ_TRACE("fi_control(c%d, FI_GETWAIT / FI_GETWAITOBJ, NULL)", i);
      FUZZ_FI("fi_control(NULL)",
              fi_control(&m.c->fid, in.ConsumeBool() ? FI_GETWAIT : FI_GETWAITOBJ, nullptr),
              -FI_EINVAL);
      return;
    }
    case 3: {
      int wo = -7;
      FUZZ_TRACE("fi_control(c%d, FI_GETWAITOBJ)", i);
      FUZZ_FI("fi_control(FI_GETWAITOBJ)", fi_control(&m.c->fid, FI_GETWAITOBJ, &wo), 0);
      FUZZ_EQ(wo, m.wait_obj, "FI_GETWAITOBJ");
      return;
    }
    case 4: {
      const int cmd = in.ConsumeIntegralInRange<int>(FI_GETFIDFLAG, FI_FLUSH_WORK + 3);
      if (cmd == FI_GETWAIT || cmd == FI_GETWAITOBJ) return;
      std::uint64_t arg[4] = {};
      FUZZ_TRACE("fi_control(c%d, %d)", i, cmd);
      FUZZ_FI("fi_control(other)", fi_control(&m.c->fid, cmd, arg), -FI_ENOSYS);
      return;
    }
    default: {
      FUZZ_TRACE("fi_bind(c%d, A's endpoint) / fi_open_ops", i);
      if (in.ConsumeBool()) {
        FUZZ_FI("fid bind", m.c->fid.ops->bind(&m.c->fid, &w.a.ep->fid, FI_SEND), -FI_ENOSYS);
      } else {
        void* ops = nullptr;
        FUZZ_FI("fi_open_ops", fi_open_ops(&m.c->fid, "x", 0, &ops, nullptr), -FI_ENOSYS);
      }
      return;
    }
  }
}

void op_trywait(FuzzedDataProvider& in, state& s) {
  const int n = in.ConsumeIntegralInRange<int>(0, 4);
  fid* fids[4] = {};
  int who[4] = {};
  long want = 0;
  std::string desc;
  for (int k = 0; k < n; ++k) {
    const int pick = in.ConsumeIntegralInRange<int>(0, max_counters + 1);
    if (pick < max_counters && s.c[pick].live) {
      fids[k] = &s.c[pick].c->fid;
      who[k] = pick;
      if (s.c[pick].wait_obj != FI_WAIT_FD && want == 0) want = -FI_EINVAL;
      desc += " c" + std::to_string(pick);
    } else if (pick == max_counters) {
      fids[k] = &w.a_send->fid; // a provider's counter
      who[k] = -1;
      if (want == 0) want = -FI_EINVAL;
      desc += " provider-counter";
    } else {
      fids[k] = nullptr;
      who[k] = -1;
      if (want == 0) want = -FI_EINVAL;
      desc += " NULL";
    }
  }
  if (n == 0) want = -FI_EINVAL;
  const bool null_array = n > 0 && in.ConsumeIntegralInRange<int>(0, 15) == 0;
  if (null_array) want = -FI_EINVAL;
  FUZZ_TRACE("compcntr_fi_trywait(%s%s)", null_array ? "NULL array," : "", desc.c_str());
  if (want == 0) {
    for (int k = 0; k < n; ++k) {
      const int i = who[k];
      model_drive(s, i);
      mcounter& m = s.c[i];
      m.armed = true;
      m.touched = false;
      const bool changed = m.seen_v != m.comp || m.seen_e != m.err;
      m.seen_v = m.comp;
      m.seen_e = m.err;
      if (changed) want = -FI_EAGAIN;
    }
  }
  FUZZ_FI("compcntr_fi_trywait", compcntr_fi_trywait(null_array ? nullptr : fids, n), want);
  if (want == 0)
    for (int k = 0; k < n; ++k) {
      mcounter& m = s.c[who[k]];
      if (m.fd < 0) {
        FUZZ_FI("fi_control(FI_GETWAIT)", fi_control(&m.c->fid, FI_GETWAIT, &m.fd), 0);
      }
      // 0: every counter armed and unchanged since: nothing readable yet, unless a later
      // counter's drive updated it after its arm (then check() wants it readable).
      if (!m.touched)
        FUZZ_EQ(fuzz::poll_in(m.fd, 0), 0,
                "an fd readable right after compcntr_fi_trywait returned 0");
    }
}

void op_close(FuzzedDataProvider& in, state& s) {
  const int i = pick_live(in, s);
  if (i < 0) return;
  mcounter& m = s.c[i];
  if (m.mirrors > 0) return; // a mirror needs its counter: the application closes it first
  FUZZ_TRACE("fi_close c%d", i);
  long want = 0;
  if (m.bindings > 0 || is_target(s, i)) want = -FI_EBUSY;
  if (want == 0) cancel_all(s, i);
  FUZZ_FI("fi_close(adapter counter)", fi_close(&m.c->fid), want);
  if (want == 0) m.live = false;
}

void op_destroy_cc(FuzzedDataProvider& in, state& s) {
  const int i = pick_live(in, s);
  if (i < 0) return;
  FUZZ_TRACE("compcntr_destroy_comp_cntr(cc of c%d)", i);
  FUZZ_RC("compcntr_destroy_comp_cntr (owned by the adapter)",
          compcntr_destroy_comp_cntr(s.c[i].cc), EBUSY);
  errno = 0;
  FUZZ_TRUE(compcntr_fi_cntr_comp_cntr(w.a_send) == nullptr && errno == EINVAL,
            "compcntr_fi_cntr_comp_cntr of a provider's counter");
}

// ---- triggers ---------------------------------------------------------------------------------

void op_arm(FuzzedDataProvider& in, state& s) {
  if (static_cast<int>(s.t.size()) >= max_triggers) return;
  const int i = pick_live(in, s);
  if (i < 0) return;
  mtrigger m;
  m.counter = i;
  m.thr = in.ConsumeBool() ? s.c[i].comp + in.ConsumeIntegralInRange<std::uint64_t>(0, 8) - 2
                           : edgy_u64(in);
  const int ti = static_cast<int>(s.t.size());
  const int how = in.ConsumeIntegralInRange<int>(0, 4);
  ctxs[ti].index = ti;
  errno = 0;
  if (how <= 2) {
    m.deferred = how == 2;
    FUZZ_TRACE("trigger_arm c%d thr %llu %s -> t%d", i, (unsigned long long)m.thr,
               m.deferred ? "deferred" : "inline", ti);
    m.t = compcntr_trigger_arm(s.c[i].cc, m.thr, log_action, &ctxs[ti],
                               m.deferred ? COMPCNTR_TRIGGER_DEFERRED : COMPCNTR_TRIGGER_INLINE);
    FUZZ_PTR("trigger_arm", m.t, errno, 0);
  } else {
    const int tgt = pick_live(in, s);
    if (tgt < 0) return;
    m.k = how == 3 ? kind::add : kind::set;
    m.target = tgt;
    m.operand = edgy_u64(in);
    FUZZ_TRACE("trigger_arm_%s c%d thr %llu -> c%d %llu -> t%d", how == 3 ? "add" : "set", i,
               (unsigned long long)m.thr, tgt, (unsigned long long)m.operand, ti);
    m.t = how == 3 ? compcntr_trigger_arm_add(s.c[i].cc, m.thr, s.c[tgt].cc, m.operand)
                   : compcntr_trigger_arm_set(s.c[i].cc, m.thr, s.c[tgt].cc, m.operand);
    FUZZ_PTR("trigger_arm_add/set", m.t, errno, 0);
  }
  m.live = true;
  m.seq = s.seq++;
  s.t.push_back(m);
  if (s.c[i].comp >= m.thr) evaluate(s, i);
}

void op_trigger_misc(FuzzedDataProvider& in, state& s) {
  switch (in.ConsumeIntegralInRange<int>(0, 3)) {
    case 0: {
      FUZZ_TRACE("trigger_progress");
      int n = 0;
      std::vector<int> q;
      q.swap(s.queue);
      for (int ti : q) model_run(s, ti, 0), ++n;
      FUZZ_EQ(compcntr_trigger_progress(device.dev), n, "deferred actions run");
      return;
    }
    case 1: {
      const int i = pick_live(in, s);
      if (i < 0) return;
      FUZZ_TRACE("trigger_flush c%d", i);
      const int want = cancel_all(s, i);
      FUZZ_EQ(compcntr_trigger_flush(s.c[i].cc), want, "flushed count");
      return;
    }
    default: {
      if (s.t.empty()) return;
      const int ti = in.ConsumeIntegralInRange<int>(0, static_cast<int>(s.t.size()) - 1);
      mtrigger& m = s.t[ti];
      if (!m.live) return;
      const bool destroy = in.ConsumeBool();
      FUZZ_TRACE("trigger_%s t%d", destroy ? "destroy" : "cancel", ti);
      int want = destroy ? 0 : EALREADY;
      if (m.st == tstate::armed || m.st == tstate::queued) {
        if (m.st == tstate::queued) s.queue.erase(std::find(s.queue.begin(), s.queue.end(), ti));
        model_run(s, ti, ECANCELED);
        want = 0;
      }
      if (destroy) {
        FUZZ_RC("trigger_destroy", compcntr_trigger_destroy(m.t), 0);
        m.live = false;
      } else {
        FUZZ_RC("trigger_cancel", compcntr_trigger_cancel(m.t), want);
      }
      return;
    }
  }
}

// ---- traffic, bridges, mirrors ----------------------------------------------------------------

void op_send(FuzzedDataProvider& in, state& s) {
  const int n = in.ConsumeIntegralInRange<int>(1, 8);
  const bool trunc = in.ConsumeIntegralInRange<int>(0, 5) == 0;
  const std::size_t len = trunc ? msg_max + 1 + in.ConsumeIntegralInRange<std::size_t>(0, 100)
                                : in.ConsumeIntegralInRange<std::size_t>(1, msg_max);
  if (s.cq[0].size() + s.cq[1].size() > 2000) return;
  FUZZ_TRACE("%d send(s) A->B of %zu bytes%s", n, len, trunc ? " (truncated at B)" : "");
  FUZZ_FI("fi_send", w.send(n, len), 0);
  for (int k = 0; k < n; ++k) {
    s.cq[0].push_back(entry{false, 4, 0}); // FI_SEND
    s.cq[1].push_back(entry{trunc, 5, trunc ? 0 : len});
  }
  s.a_sent += static_cast<std::uint64_t>(n);
  // B's progress: one read of B's provider counter matches the receives (twice: to be sure).
  fi_cntr_read(w.b_recv);
  fi_cntr_read(w.b_recv);
}

void op_bridge_open(FuzzedDataProvider& in, state& s) {
  const int bi = in.ConsumeIntegralInRange<int>(0, 1);
  mbridge& b = s.br[bi];
  if (b.live) return;
  compcntr_fi_bridge_attr a{};
  bool use_attr = in.ConsumeBool();
  bool known = false;
  std::size_t max = 1024;
  int want = 0;
  if (use_attr) {
    if (in.ConsumeBool()) {
      a.comp_mask |= COMPCNTR_FI_BRIDGE_ATTR_FORMAT;
      switch (in.ConsumeIntegralInRange<int>(0, 5)) {
        case 0:
          a.format = FI_CQ_FORMAT_CONTEXT;
          want = EINVAL;
          break;
        case 1:
          a.format = FI_CQ_FORMAT_UNSPEC;
          want = EINVAL;
          break;
        case 2:
          fuzz::set_raw(a.format, 77u);
          want = EINVAL;
          break;
        default:
          a.format = FI_CQ_FORMAT_TAGGED;
          known = true;
          break; // the CQs' format
      }
    }
    if (in.ConsumeBool()) {
      a.comp_mask |= COMPCNTR_FI_BRIDGE_ATTR_MAX_ENTRIES;
      a.max_entries = in.ConsumeIntegralInRange<std::size_t>(0, 5);
      if (a.max_entries == 0 && want == 0) want = EINVAL;
      max = a.max_entries;
    }
    if (in.ConsumeIntegralInRange<int>(0, 15) == 0) {
      a.comp_mask |= 1u << in.ConsumeIntegralInRange<int>(2, 31);
      want = EINVAL; // checked first
    }
  }
  const bool not_cq = in.ConsumeIntegralInRange<int>(0, 31) == 0;
  if (not_cq) want = EINVAL;
  fid_cq* cq = bi == 0 ? w.a.cq : w.b.cq;
  int raw_format = 0;
  std::memcpy(&raw_format, &a.format, sizeof raw_format);
  FUZZ_TRACE("compcntr_fi_bridge_open%s(%s CQ, mask %#x format %d max %zu) -> br%d",
             use_attr ? "_ex" : "",
             not_cq    ? "not a"
             : bi == 0 ? "A's"
                       : "B's",
             a.comp_mask, raw_format, a.max_entries, bi);
  errno = 0;
  compcntr_fi_bridge* br =
      use_attr ? compcntr_fi_bridge_open_ex(not_cq ? reinterpret_cast<fid_cq*>(w.a_send) : cq, &a)
               : compcntr_fi_bridge_open(not_cq ? reinterpret_cast<fid_cq*>(w.a_send) : cq);
  const int err = errno;
  if (want) {
    FUZZ_TRUE(br == nullptr, "compcntr_fi_bridge_open refused");
    FUZZ_ERR("compcntr_fi_bridge_open errno", err, want);
    return;
  }
  FUZZ_TRUE(br != nullptr, "compcntr_fi_bridge_open");
  b = mbridge{};
  b.br = br;
  b.live = true;
  b.cq = bi;
  b.known = known;
  b.max = max;
}

void op_bridge_bind(FuzzedDataProvider& in, state& s) {
  const int bi = in.ConsumeIntegralInRange<int>(0, 1);
  mbridge& b = s.br[bi];
  if (!b.live) return;
  const int i = pick_live(in, s);
  if (i < 0) return;
  std::uint64_t flags = 0;
  switch (in.ConsumeIntegralInRange<int>(0, 7)) {
    case 0: flags = 0; break;
    case 1: flags = in.ConsumeIntegral<std::uint64_t>(); break;
    case 2: flags = FI_SEND | FI_RECV; break;
    default: flags = class_flag[in.ConsumeIntegralInRange<int>(0, n_classes - 1)]; break;
  }
  if (in.ConsumeIntegralInRange<int>(0, 7) == 0)
    flags |= class_flag[in.ConsumeIntegralInRange<int>(0, 5)];
  int want = 0;
  if (flags == 0 || (flags & ~bindable))
    want = EINVAL;
  else if (s.c[i].bytes && (flags & ~std::uint64_t{FI_RECV}))
    want = ENOTSUP;
  else
    for (int c = 0; c < n_classes; ++c)
      if ((flags & class_flag[c]) && b.table[c] >= 0) want = EBUSY;
  FUZZ_TRACE("compcntr_fi_bridge_bind(br%d, c%d, %#llx)", bi, i, (unsigned long long)flags);
  FUZZ_ERR("compcntr_fi_bridge_bind", compcntr_fi_bridge_bind(b.br, s.c[i].cc, flags), want);
  if (want) return;
  for (int c = 0; c < n_classes; ++c)
    if (flags & class_flag[c]) b.table[c] = i;
  b.bound.push_back(i);
  mcounter& m = s.c[i];
  ++m.bindings;
  if (std::find(m.sources.begin(), m.sources.end(), bi) == m.sources.end()) m.sources.push_back(bi);
}

void op_bridge_misc(FuzzedDataProvider& in, state& s) {
  const int bi = in.ConsumeIntegralInRange<int>(0, 1);
  mbridge& b = s.br[bi];
  switch (in.ConsumeIntegralInRange<int>(0, 3)) {
    case 0:
    case 1: {
      if (!b.live) return;
      FUZZ_TRACE("compcntr_fi_bridge_progress(br%d)", bi);
      const long want = model_bridge_progress(s, bi);
      FUZZ_FI("compcntr_fi_bridge_progress", compcntr_fi_bridge_progress(b.br), want);
      return;
    }
    case 2: {
      if (!b.live) {
        // No bridge on that CQ: the application reads it (entries gone, counted by nobody).
        if (s.cq[bi].empty()) return;
        FUZZ_TRACE("application drains %s CQ (%zu entries)", bi == 0 ? "A's" : "B's",
                   s.cq[bi].size());
        fid_cq* cq = bi == 0 ? w.a.cq : w.b.cq;
        std::size_t got = 0;
        fi_cq_tagged_entry e[16];
        for (;;) {
          const ssize_t n = fi_cq_read(cq, e, 16);
          if (n > 0) {
            got += static_cast<std::size_t>(n);
            continue;
          }
          if (n == -FI_EAVAIL) {
            fi_cq_err_entry ee{};
            if (fi_cq_readerr(cq, &ee, 0) == 1) {
              ++got;
              continue;
            }
          }
          break;
        }
        FUZZ_EQ(got, s.cq[bi].size(), "entries on the CQ");
        s.cq[bi].clear();
        return;
      }
      FUZZ_TRACE("compcntr_fi_bridge_close(br%d)", bi);
      FUZZ_ERR("compcntr_fi_bridge_close", compcntr_fi_bridge_close(b.br), 0);
      for (int ci : b.bound) {
        mcounter& m = s.c[ci];
        --m.bindings;
        m.sources.erase(std::remove(m.sources.begin(), m.sources.end(), bi), m.sources.end());
      }
      b.live = false;
      return;
    }
    default: {
      FUZZ_TRACE("bridge calls with NULL");
      FUZZ_FI("compcntr_fi_bridge_progress(NULL)", compcntr_fi_bridge_progress(nullptr),
              -FI_EINVAL);
      FUZZ_ERR("compcntr_fi_bridge_close(NULL)", compcntr_fi_bridge_close(nullptr), EINVAL);
      if (b.live) {
        FUZZ_ERR("compcntr_fi_bridge_bind(NULL cc)",
                 compcntr_fi_bridge_bind(b.br, nullptr, FI_SEND), EINVAL);
        FUZZ_ERR("compcntr_fi_bridge_query_stats(NULL)",
                 compcntr_fi_bridge_query_stats(b.br, nullptr), EINVAL);
      }
      return;
    }
  }
}

void op_mirror(FuzzedDataProvider& in, state& s) {
  const int mi = in.ConsumeIntegralInRange<int>(0, 1);
  mmirror& m = s.mir[mi];
  if (!m.live) {
    const int i = pick_live(in, s);
    if (i < 0) return;
    compcntr_fi_mirror_attr a{};
    const bool use_attr = in.ConsumeBool();
    int want = 0;
    unsigned bits = 64;
    if (use_attr) {
      if (in.ConsumeBool()) {
        a.comp_mask = COMPCNTR_FI_MIRROR_ATTR_VALUE_BITS;
        a.value_bits = in.ConsumeIntegralInRange<std::uint32_t>(0, 70);
        if (a.value_bits < 8 || a.value_bits > 64)
          want = EINVAL;
        else
          bits = a.value_bits;
      }
      if (in.ConsumeIntegralInRange<int>(0, 15) == 0) {
        a.comp_mask |= 2u;
        want = EINVAL;
      }
    }
    const bool not_cntr = in.ConsumeIntegralInRange<int>(0, 31) == 0;
    if (not_cntr) want = EINVAL;
    FUZZ_TRACE("compcntr_fi_mirror_open%s(A's provider counter, c%d, bits %u) -> m%d",
               use_attr ? "_ex" : "", i, a.value_bits, mi);
    errno = 0;
    fid_cntr* pc = not_cntr ? reinterpret_cast<fid_cntr*>(w.a.cq) : w.a_send;
    compcntr_fi_mirror* mm = use_attr ? compcntr_fi_mirror_open_ex(pc, s.c[i].cc, &a)
                                      : compcntr_fi_mirror_open(pc, s.c[i].cc);
    const int err = errno;
    if (want) {
      FUZZ_TRUE(mm == nullptr, "compcntr_fi_mirror_open refused");
      FUZZ_ERR("compcntr_fi_mirror_open errno", err, want);
      return;
    }
    FUZZ_TRUE(mm != nullptr, "compcntr_fi_mirror_open");
    m = mmirror{};
    m.m = mm;
    m.live = true;
    m.counter = i;
    m.mask = bits >= 64 ? ~std::uint64_t{0} : (std::uint64_t{1} << bits) - 1;
    m.last_v = s.a_sent & m.mask;
    m.last_e = 0;
    ++s.c[i].mirrors;
    return;
  }
  if (in.ConsumeIntegralInRange<int>(0, 3) == 0) {
    FUZZ_TRACE("compcntr_fi_mirror_close(m%d)", mi);
    FUZZ_ERR("compcntr_fi_mirror_close", compcntr_fi_mirror_close(m.m), 0);
    m.live = false;
    --s.c[m.counter].mirrors;
    return;
  }
  FUZZ_TRACE("compcntr_fi_mirror_progress(m%d)", mi);
  // What the provider counter gained modulo 2^bits; nothing for 0 or for a "gain" above half
  // the range (a value that moved backwards, docs/fabric.md).
  const std::uint64_t v = s.a_sent & m.mask, d = (v - m.last_v) & m.mask;
  if (d != 0 && d <= (m.mask >> 1)) {
    m_inc(s, m.counter, d);
    m.last_v = v;
  }
  FUZZ_FI("compcntr_fi_mirror_progress", compcntr_fi_mirror_progress(m.m), 0);
}

// ---- per input --------------------------------------------------------------------------------

void teardown(state& s) {
  FUZZ_TRACE("end of input: mirrors, bridges, triggers, then counters");
  for (mmirror& m : s.mir)
    if (m.live)
      FUZZ_ERR("compcntr_fi_mirror_close", compcntr_fi_mirror_close(m.m), 0), m.live = false;
  for (int bi = 0; bi < 2; ++bi) {
    mbridge& b = s.br[bi];
    if (!b.live) continue;
    FUZZ_ERR("compcntr_fi_bridge_close", compcntr_fi_bridge_close(b.br), 0);
    for (int ci : b.bound) {
      --s.c[ci].bindings;
      s.c[ci].sources.clear();
    }
    b.live = false;
  }
  for (std::size_t ti = 0; ti < s.t.size(); ++ti) {
    mtrigger& m = s.t[ti];
    if (!m.live) continue;
    if (m.st == tstate::queued) s.queue.erase(std::find(s.queue.begin(), s.queue.end(), ti));
    if (m.st == tstate::armed || m.st == tstate::queued)
      model_run(s, static_cast<int>(ti), ECANCELED);
    FUZZ_RC("trigger_destroy", compcntr_trigger_destroy(m.t), 0);
    m.live = false;
  }
  for (mcounter& m : s.c) {
    if (m.live) FUZZ_FI("fi_close(adapter counter)", fi_close(&m.c->fid), 0);
    m.live = false;
  }
  check(s);
  std::vector<int> times(s.t.size(), 0);
  for (auto& r : ran)
    if (r.first >= 0 && r.first < static_cast<int>(times.size())) ++times[r.first];
  for (std::size_t ti = 0; ti < s.t.size(); ++ti)
    if (s.t[ti].k == kind::log) FUZZ_EQ(times[ti], 1, "runs of one action");
  // The world for the next input: both CQs empty, A's provider counter at 0.
  w.progress_raw();
  fi_cntr_set(w.a_send, 0);
  fi_cntr_seterr(w.a_send, 0);
}

} // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  // The adapter needs no provider of its own; the traffic is plain shm (no hook, no layer).
  unsetenv("FI_HOOK");
  setenv("FI_PROVIDER", "shm", 1);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (!device.dev) {
    device.open(nullptr);
    w.open("shm", 0, true);
  }
  fuzz::trace::get().clear();
  ran.clear();
  FuzzedDataProvider in(data, size);
  state s;
  for (int steps = 0; steps < 200 && in.remaining_bytes() > 0; ++steps) {
    switch (in.ConsumeIntegralInRange<int>(0, 19)) {
      case 0:
      case 1: op_open(in, s); break;
      case 2:
      case 3:
      case 4: op_update(in, s); break;
      case 5: op_read(in, s); break;
      case 6: op_wait(in, s); break;
      case 7: op_control(in, s); break;
      case 8: op_trywait(in, s); break;
      case 9: op_close(in, s); break;
      case 10: op_destroy_cc(in, s); break;
      case 11:
      case 12: op_arm(in, s); break;
      case 13: op_trigger_misc(in, s); break;
      case 14: op_send(in, s); break;
      case 15: op_bridge_open(in, s); break;
      case 16: op_bridge_bind(in, s); break;
      case 17: op_bridge_misc(in, s); break;
      default: op_mirror(in, s); break;
    }
    check(s);
  }
  teardown(s);
  return 0;
}
