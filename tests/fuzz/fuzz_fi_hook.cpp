// Fuzz harness: the hook provider (FI_HOOK=compcntr, fabric_integration/hook, docs/hook.md) over
// shm, against a reference model of what an application observes: fi_cntr(3) as libfabric 1.17's
// shm answers it (the hook promises exactly that: "the provider decides"), plus what the hook
// adds (waits that time out, compcntr_fi_cntr_comp_cntr and compcntr's inline triggers on the
// counter behind a hook counter).
//
// COMPCNTR_FUZZ_PLAIN=1 runs the same inputs without the hook, against the same model minus what
// the hook adds: that checks the model's picture of shm itself (every provider answer below was
// learned that way), and it avoids what crashes or hangs libfabric 1.17 without the hook
// (fi_trywait on a counter without a wait object; a wait that should time out: shm's ignores
// its timeout).
//
// Calls: fi_cntr_open (any events / wait object / flags, NULL attr), read, readerr, add, adderr,
// set, seterr, wait (0-2 ms), fi_control (FI_GETWAIT, FI_GETWAITOBJ, others), fi_trywait,
// fi_close in any order; per-input endpoints: open, fi_ep_bind of counters with any flags,
// fi_enable (rare: ~10 ms), close; sends A->B (fi_send, and fi_sendmsg with FI_TRIGGER and a
// threshold context: shm has no triggered operations and sends at once), counted by the counters
// bound to A and B; fi_control(domain, FI_QUEUE_WORK / FI_CANCEL_WORK / FI_FLUSH_WORK) with
// counter work (shm: -FI_ENOSYS); compcntr_trigger_arm / arm_add / arm_set (inline) on the
// compcntr counters behind hook counters, cancel, flush, destroy.
//
// What the harness never does because libfabric itself crashes (with or without the hook): read,
// readerr or wait on a counter bound to an endpoint that is not enabled (shm progresses it), or on
// a counter whose bind to an endpoint was refused as a duplicate (util links the endpoint into
// the counter first, and nothing unlinks it: after the endpoint closes, a read walks it); and a
// bind with flags 0 (it succeeds, links the endpoint the same way, and leaks the link).
#include "fuzz_fabric.hpp"
#include "trigger_model.hpp"

#include <algorithm>
#include <array>

namespace {

using fuzz::edgy_u64;
using namespace fuzz::fab;

constexpr int max_counters = 6;   // slots 0..5 per input; 6 = A's, 7 = B's (the world's)
constexpr int n_slots = max_counters + 2;
constexpr int max_eps = 3;
constexpr int max_triggers = 24;
constexpr std::uint64_t bindable =
    FI_SEND | FI_RECV | FI_READ | FI_WRITE | FI_REMOTE_READ | FI_REMOTE_WRITE;
constexpr std::uint64_t classes[6] = {FI_SEND,  FI_RECV,        FI_READ,
                                      FI_WRITE, FI_REMOTE_READ, FI_REMOTE_WRITE};

world w;
bool plain = false;  // COMPCNTR_FUZZ_PLAIN=1: no hook

enum class tstate { armed, fired, cancelled };
enum class kind { log, add, set };

struct mtrigger {
  compcntr_trigger* t = nullptr;
  bool live = false;
  int counter = 0;
  std::uint64_t thr = 0, seq = 0;
  kind k = kind::log;
  int target = -1;
  std::uint64_t operand = 0;
  tstate st = tstate::armed;
};

struct mcounter {
  fid_cntr* c = nullptr;
  compcntr_comp_cntr* cc = nullptr;
  bool live = false;
  bool world = false;   // A's or B's: never closed by an input (bound: -FI_EBUSY)
  int wait_obj = FI_WAIT_NONE;
  std::uint64_t comp = 0, err = 0;
  int refs = 0;         // classes bound on endpoints (fi_close: -FI_EBUSY while > 0)
  int unenabled = 0;    // of those, on endpoints not enabled (reading would crash shm)
  bool tainted = false; // a refused duplicate bind linked an endpoint (never read again)
  bool hidden_gone = false;  // fi_close closed the provider's counter, compcntr's refused
  bool pending = false;
};

struct mep {
  fid_ep* ep = nullptr;
  bool live = false;
  bool enabled = false;
  std::array<int, 6> bound{-1, -1, -1, -1, -1, -1};  // counter slot per class
};

struct state {
  std::array<mcounter, n_slots> c;
  std::array<mep, max_eps> ep;
  std::vector<mtrigger> t;
  std::vector<int> queue;  // the trigger model's deferred queue: always empty (inline only here)
  std::vector<std::pair<int, int>> want;
  std::vector<int> stack;
  int depth = 0;
  std::uint64_t seq = 0;
  bool enabled_once = false;  // fi_enable costs ~10 ms: at most one per input
};

std::vector<std::pair<int, int>> ran;
struct ctx {
  int index;
};
std::array<ctx, max_triggers> ctxs;
void log_action(void* p, int status) { ran.emplace_back(static_cast<ctx*>(p)->index, status); }

// ---- compcntr's inline triggers on the counters behind hook counters --------------------------

void evaluate(state& s, int ci);

void model_run(state& s, int ti, int status) {
  mtrigger& m = s.t[ti];
  if (m.k == kind::log) s.want.emplace_back(ti, status);
  m.st = status == 0 ? tstate::fired : tstate::cancelled;
  if (status != 0 || m.k == kind::log) return;
  mcounter& tc = s.c[m.target];
  tc.comp = m.k == kind::add ? tc.comp + m.operand : m.operand;
  evaluate(s, m.target);
}

// The trigger model (tests/fuzz/trigger_model.hpp) on this harness's records.
bool is_armed(const mtrigger& m) { return m.st == tstate::armed; }
bool is_deferred(const mtrigger&) { return false; }
void mark_queued(mtrigger& m) { (void)m; }
void mark_running(mtrigger& m) { m.st = tstate::fired; }
std::vector<int> due(const state& s, int ci) { return fuzz::trig::due(s, ci); }
void evaluate(state& s, int ci) { fuzz::trig::evaluate(s, ci); }
int cancel_all(state& s, int ci) { return fuzz::trig::cancel_all(s, ci); }

bool is_target(const state& s, int ci) {
  for (const mtrigger& m : s.t)
    if (m.live && m.target == ci) return true;
  return false;
}

void check(state& s) {
  FUZZ_EQ(ran.size(), s.want.size(), "number of actions run");
  for (std::size_t i = 0; i < ran.size(); ++i) {
    FUZZ_EQ(ran[i].first, s.want[i].first, "which action ran");
    FUZZ_EQ(ran[i].second, s.want[i].second, "its status");
  }
  if (plain) return;
  // compcntr's values behind each hook counter (a load: no provider call, safe on any counter).
  for (mcounter& m : s.c) {
    if (!m.live) continue;
    std::uint64_t v = 0, e = 0;
    FUZZ_RC("read_comp_cntr", compcntr_read_comp_cntr(m.cc, &v), 0);
    FUZZ_RC("read_err_comp_cntr", compcntr_read_err_comp_cntr(m.cc, &e), 0);
    FUZZ_EQ(v, m.comp, "completion value behind the hook counter");
    FUZZ_EQ(e, m.err, "error value behind the hook counter");
  }
  for (const mtrigger& m : s.t)
    if (m.live) {
      const int want = m.st == tstate::fired ? 1 : m.st == tstate::cancelled ? 2 : 0;
      FUZZ_EQ(compcntr_trigger_state(m.t), want, "trigger state");
    }
}

int pick_live(FuzzedDataProvider& in, const state& s) {
  const int i = in.ConsumeIntegralInRange<int>(0, n_slots - 1);
  return s.c[i].live ? i : -1;
}
// A counter the provider may be asked to progress (see the file comment).
bool readable(const mcounter& m) { return m.unenabled == 0 && !m.tainted; }

// ---- counter calls ----------------------------------------------------------------------------

// shm's fi_cntr_open (util counters, libfabric 1.17): the wait object first (FI_WAIT_NONE,
// FI_WAIT_UNSPEC, FI_WAIT_YIELD; anything else -FI_ENOSYS: shm has no wait sets, so no fd), then
// flags != 0 -FI_EINVAL; events are not checked.
void op_open(FuzzedDataProvider& in, state& s) {
  const int i = in.ConsumeIntegralInRange<int>(0, max_counters - 1);
  if (s.c[i].live) return;
  raw_attr ra;
  static const int waits[] = {FI_WAIT_NONE, FI_WAIT_UNSPEC, FI_WAIT_YIELD, FI_WAIT_NONE};
  ra.wait_obj = waits[in.ConsumeIntegralInRange<int>(0, 3)];
  switch (in.ConsumeIntegralInRange<int>(0, 15)) {
    case 0: ra.null_attr = true; break;
    case 1: ra.flags = in.ConsumeIntegralInRange<std::uint64_t>(1, ~std::uint64_t{0}); break;
    case 2: ra.events = in.ConsumeIntegralInRange<int>(0, 2); break;
    case 3: ra.wait_obj = in.ConsumeIntegralInRange<int>(FI_WAIT_SET, FI_WAIT_POLLFD); break;
    case 4: ra.wait_obj = in.ConsumeIntegralInRange<int>(-3, 20); break;
    default: break;
  }
  if (ra.null_attr) ra.events = 0, ra.wait_obj = FI_WAIT_NONE, ra.flags = 0;
  long want = 0;
  if (ra.wait_obj != FI_WAIT_NONE && ra.wait_obj != FI_WAIT_UNSPEC && ra.wait_obj != FI_WAIT_YIELD)
    want = -FI_ENOSYS;
  else if (ra.flags != 0)
    want = -FI_EINVAL;
  if (ra.null_attr && plain) return;  // libfabric dereferences a NULL attr; the hook defaults it
  fi_cntr_attr a = ra.get();
  fid_cntr* c = nullptr;
  FUZZ_TRACE("fi_cntr_open(%s events %d wait %d flags %#llx) -> c%d",
             ra.null_attr ? "NULL" : "attr", ra.events, ra.wait_obj, (unsigned long long)ra.flags,
             i);
  FUZZ_FI("fi_cntr_open", fi_cntr_open(w.domain, ra.null_attr ? nullptr : &a, &c, &s.c[i]), want);
  if (want) return;
  mcounter& m = s.c[i];
  m = mcounter{};
  m.c = c;
  m.live = true;
  m.wait_obj = ra.wait_obj;
  FUZZ_TRUE(c->fid.context == &s.c[i], "fid.context is the open's context");
  errno = 0;
  m.cc = compcntr_fi_cntr_comp_cntr(c);
  if (plain)
    FUZZ_TRUE(m.cc == nullptr && errno == EINVAL, "compcntr_fi_cntr_comp_cntr without the hook");
  else
    FUZZ_TRUE(m.cc != nullptr, "compcntr_fi_cntr_comp_cntr of a hook counter");
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
      m.comp += v;
      evaluate(s, i);
      break;
    case 1:
      FUZZ_TRACE("fi_cntr_set c%d %llu", i, (unsigned long long)v);
      FUZZ_FI("fi_cntr_set", fi_cntr_set(m.c, v), 0);
      m.comp = v;
      evaluate(s, i);
      break;
    case 2:
      FUZZ_TRACE("fi_cntr_adderr c%d %llu", i, (unsigned long long)v);
      FUZZ_FI("fi_cntr_adderr", fi_cntr_adderr(m.c, v), 0);
      m.err += v;
      break;
    default:
      FUZZ_TRACE("fi_cntr_seterr c%d %llu", i, (unsigned long long)v);
      FUZZ_FI("fi_cntr_seterr", fi_cntr_seterr(m.c, v), 0);
      m.err = v;
      break;
  }
}

void op_read(FuzzedDataProvider& in, state& s) {
  const int i = pick_live(in, s);
  if (i < 0 || !readable(s.c[i])) return;
  const bool err = in.ConsumeBool();
  FUZZ_TRACE("fi_cntr_read%s c%d", err ? "err" : "", i);
  const std::uint64_t got = err ? fi_cntr_readerr(s.c[i].c) : fi_cntr_read(s.c[i].c);
  FUZZ_EQ(got, err ? s.c[i].err : s.c[i].comp, err ? "fi_cntr_readerr" : "fi_cntr_read");
}

// Nothing moves during a wait (traffic is settled when it is sent): the answer is the values'.
// FI_WAIT_NONE: shm's counter cannot be waited on (-FI_ENOSYS), and the hook answers the same.
void op_wait(FuzzedDataProvider& in, state& s) {
  const int i = pick_live(in, s);
  if (i < 0 || !readable(s.c[i])) return;
  mcounter& m = s.c[i];
  const std::uint64_t thr =
      in.ConsumeBool() ? m.comp + in.ConsumeIntegralInRange<std::uint64_t>(0, 4) - 2 : edgy_u64(in);
  const int timeout = small_timeout(in);
  long want = m.comp >= thr ? 0 : -FI_ETIMEDOUT;
  // (The hook probes the provider's answer at open and keeps it, also once fi_close has closed
  // the provider's counter and left compcntr's.)
  if (m.wait_obj == FI_WAIT_NONE) want = -FI_ENOSYS;
  if (plain && want == -FI_ETIMEDOUT) return;  // shm's wait ignores its timeout
  FUZZ_TRACE("fi_cntr_wait c%d thr %llu timeout %d", i, (unsigned long long)thr, timeout);
  FUZZ_FI("fi_cntr_wait", fi_cntr_wait(m.c, thr, timeout), want);
}

void op_control(FuzzedDataProvider& in, state& s) {
  const int i = pick_live(in, s);
  if (i < 0) return;
  mcounter& m = s.c[i];
  int cmd = FI_GETWAIT;
  switch (in.ConsumeIntegralInRange<int>(0, 3)) {
    case 0: cmd = FI_GETWAIT; break;
    case 1: cmd = FI_GETWAITOBJ; break;
    default: cmd = in.ConsumeIntegralInRange<int>(FI_GETFIDFLAG, FI_FLUSH_WORK + 2); break;
  }
  std::uint64_t arg[8] = {};
  const bool null_arg = in.ConsumeIntegralInRange<int>(0, 7) == 0;
  FUZZ_TRACE("fi_control(c%d, %d, %s)", i, cmd, null_arg ? "NULL" : "arg");
  // shm's counters answer every command with -FI_ENOSYS (no wait object to hand out); the hook
  // passes them on (its own FI_GETWAIT is for FI_WAIT_FD counters, which shm refuses).
  FUZZ_FI("fi_control(cntr)", fi_control(&m.c->fid, cmd, null_arg ? nullptr : arg), -FI_ENOSYS);
}

void op_trywait(FuzzedDataProvider& in, state& s) {
  if (plain) return;  // libfabric 1.17 crashes on a counter without a wait object
  const int n = in.ConsumeIntegralInRange<int>(1, 3);
  fid* fids[3] = {};
  bool any_cntr = false;
  for (int k = 0; k < n; ++k) {
    const int i = pick_live(in, s);
    if (i >= 0) {
      fids[k] = &s.c[i].c->fid;
      any_cntr = true;
    } else {
      fids[k] = nullptr;
    }
  }
  if (!any_cntr) return;  // only NULLs: the provider's trywait (a NULL fid crashes it)
  // Hook counters not opened with FI_WAIT_FD (none is on shm): -FI_EINVAL; a NULL fid too.
  FUZZ_TRACE("fi_trywait(fabric, %d fids)", n);
  FUZZ_FI("fi_trywait", fi_trywait(w.fabric, fids, n), -FI_EINVAL);
}

void op_close(FuzzedDataProvider& in, state& s) {
  const int i = pick_live(in, s);
  if (i < 0) return;
  mcounter& m = s.c[i];
  FUZZ_TRACE("fi_close c%d", i);
  long want = 0;
  if (!m.hidden_gone && m.refs > 0) {
    want = -FI_EBUSY;  // the provider's answer
  } else if (!plain && is_target(s, i)) {
    // The provider's counter closed; compcntr's is held by a trigger: -FI_EBUSY, and the
    // counter stays usable as a plain compcntr counter (docs/hook.md).
    want = -FI_EBUSY;
    m.hidden_gone = true;
  } else {
    cancel_all(s, i);
  }
  FUZZ_FI("fi_close(hook counter)", fi_close(&m.c->fid), want);
  if (want == 0) m.live = false;
}

// ---- endpoints --------------------------------------------------------------------------------

fid_cq* cq_of_ep[max_eps] = {};  // the CQ of an enabled per-input endpoint (closed after it)

void op_ep(FuzzedDataProvider& in, state& s) {
  const int e = in.ConsumeIntegralInRange<int>(0, max_eps - 1);
  mep& E = s.ep[e];
  if (!E.live) {
    FUZZ_TRACE("fi_endpoint -> ep%d", e);
    FUZZ_FI("fi_endpoint", fi_endpoint(w.domain, w.info, &E.ep, nullptr), 0);
    E = mep{E.ep, true, false, {-1, -1, -1, -1, -1, -1}};
    return;
  }
  switch (in.ConsumeIntegralInRange<int>(0, 15)) {
    case 0: {
      if (E.enabled || s.enabled_once) return;
      s.enabled_once = true;
      FUZZ_TRACE("fi_ep_bind(ep%d, av, cq); fi_enable", e);
      // A CQ of its own: the world's CQs are A's and B's.
      fid_cq* cq = nullptr;
      fi_cq_attr ca{};
      ca.format = FI_CQ_FORMAT_TAGGED;
      FUZZ_FI("fi_cq_open", fi_cq_open(w.domain, &ca, &cq, nullptr), 0);
      FUZZ_FI("fi_ep_bind(av)", fi_ep_bind(E.ep, &w.av->fid, 0), 0);
      FUZZ_FI("fi_ep_bind(cq)", fi_ep_bind(E.ep, &cq->fid, FI_TRANSMIT | FI_RECV), 0);
      FUZZ_FI("fi_enable", fi_enable(E.ep), 0);
      E.enabled = true;
      for (int c : E.bound)
        if (c >= 0) --s.c[c].unenabled;
      // The CQ goes with the endpoint (closed right after it, below).
      cq_of_ep[e] = cq;
      return;
    }
    case 1:
    case 2: {
      FUZZ_TRACE("fi_close(ep%d)", e);
      FUZZ_FI("fi_close(ep)", fi_close(&E.ep->fid), 0);
      for (int c : E.bound)
        if (c >= 0) {
          --s.c[c].refs;
          if (!E.enabled) --s.c[c].unenabled;
        }
      if (cq_of_ep[e])
        FUZZ_FI("fi_close(cq)", fi_close(&cq_of_ep[e]->fid), 0), cq_of_ep[e] = nullptr;
      E.live = false;
      return;
    }
    default: {
      const int i = pick_live(in, s);
      if (i < 0) return;
      mcounter& m = s.c[i];
      std::uint64_t flags = 0;
      switch (in.ConsumeIntegralInRange<int>(0, 7)) {
        case 0: flags = FI_SEND | FI_RECV; break;  // (never 0: see the file comment)
        case 1: flags = in.ConsumeIntegral<std::uint64_t>() | FI_MSG; break;
        case 2:
          flags = classes[in.ConsumeIntegralInRange<int>(0, 5)] |
                  classes[in.ConsumeIntegralInRange<int>(0, 5)];
          break;
        default: flags = classes[in.ConsumeIntegralInRange<int>(0, 5)]; break;
      }
      long want = 0;
      if (flags & ~bindable) {
        want = -FI_EBADFLAGS;
      } else {  // (an enabled endpoint takes counters too)
        for (int k = 0; k < 6; ++k)
          if ((flags & classes[k]) && E.bound[k] >= 0) want = -FI_EINVAL;
      }
      if (m.hidden_gone) want = -FI_EINVAL;  // the hook has no provider counter to bind
      // A refused duplicate would link the endpoint into the world's counter for good (see the
      // file comment): the world outlives the input, so its counters are never offered one.
      // A bind with flags 0 succeeds and links the endpoint the same way (and nothing unlinks
      // it when the endpoint closes).
      if (m.world && (want == -FI_EINVAL || (want == 0 && flags == 0))) return;
      FUZZ_TRACE("fi_ep_bind(ep%d, c%d, %#llx)", e, i, (unsigned long long)flags);
      FUZZ_FI("fi_ep_bind(cntr)", fi_ep_bind(E.ep, &m.c->fid, flags), want);
      if ((want == -FI_EINVAL && !m.hidden_gone) || (want == 0 && flags == 0)) m.tainted = true;
      if (want) return;
      for (int k = 0; k < 6; ++k)
        if (flags & classes[k]) {
          E.bound[k] = i;
          ++m.refs;
          if (!E.enabled) ++m.unenabled;
        }
      return;
    }
  }
}

// ---- traffic and deferred work ----------------------------------------------------------------

fi_triggered_context tctx[8];

void op_send(FuzzedDataProvider& in, state& s) {
  mcounter &A = s.c[max_counters], &B = s.c[max_counters + 1];
  if (!readable(A) || !readable(B)) return; // the settling reads below would progress them
  const int n = in.ConsumeIntegralInRange<int>(1, 6);
  const bool trig = in.ConsumeBool();
  const std::size_t len = in.ConsumeIntegralInRange<std::size_t>(1, msg_max);
  FUZZ_TRACE("%d %s A->B of %zu bytes", n, trig ? "fi_sendmsg(FI_TRIGGER)" : "fi_send", len);
  if (!trig) {
    FUZZ_FI("fi_send", w.send(n, len), 0);
  } else {
    w.post_recvs(static_cast<std::size_t>(n) + 1);
    for (int k = 0; k < n; ++k) {
      const int tc = in.ConsumeIntegralInRange<int>(0, n_slots - 1);
      fi_triggered_context& t = tctx[k];
      t = fi_triggered_context{};
      t.event_type = FI_TRIGGER_THRESHOLD;
      if (in.ConsumeIntegralInRange<int>(0, 7) == 0) // any int a C caller may store there
        fuzz::set_raw(t.event_type, in.ConsumeIntegralInRange<std::uint32_t>(1, 40));
      t.trigger.threshold.cntr = s.c[tc].live && !s.c[tc].hidden_gone ? s.c[tc].c : w.a_send;
      t.trigger.threshold.threshold = in.ConsumeIntegralInRange<std::uint64_t>(0, 1000);
      iovec iov{w.sbuf, len};
      fi_msg msg{&iov, nullptr, 1, w.b.addr, &t, 0};
      // shm has no FI_TRIGGER: it posts the send at once (so does the hook, on its behalf).
      FUZZ_FI("fi_sendmsg(FI_TRIGGER)", fi_sendmsg(w.a.ep, &msg, FI_TRIGGER), 0);
      --w.posted;
    }
  }
  // Settle: A's counter counted the sends when they were posted (inject), B's receives complete
  // at B's next progress, which the read of B's counter runs. One read each: one gain each.
  A.comp += static_cast<std::uint64_t>(n);
  evaluate(s, max_counters);
  FUZZ_EQ(fi_cntr_read(A.c), A.comp, "A's send counter after the sends");
  B.comp += static_cast<std::uint64_t>(n);
  evaluate(s, max_counters + 1);
  FUZZ_EQ(fi_cntr_read(B.c), B.comp, "B's receive counter after the sends");
  // Every send and receive wrote its CQ entry.
  for (side* sd : {&w.a, &w.b}) {
    fi_cq_tagged_entry e[8];
    ssize_t got = 0;
    for (;;) {
      const ssize_t r = fi_cq_read(sd->cq, e, 8);
      if (r <= 0) {
        FUZZ_TRUE(r == -FI_EAGAIN, "fi_cq_read of the world's CQ: no error entry");
        break;
      }
      got += r;
    }
    FUZZ_EQ(got, n, sd == &w.a ? "send entries on A's CQ" : "receive entries on B's CQ");
  }
}

fi_deferred_work work;
fi_op_cntr work_op;

void op_work(FuzzedDataProvider& in, state& s) {
  const int cmd = in.ConsumeIntegralInRange<int>(0, 3);
  const int a = pick_live(in, s), b = pick_live(in, s);
  work = fi_deferred_work{};
  work.threshold = in.ConsumeIntegralInRange<std::uint64_t>(0, 10);
  work.triggering_cntr = a >= 0 && !s.c[a].hidden_gone ? s.c[a].c : nullptr;
  work.completion_cntr = b >= 0 && !s.c[b].hidden_gone && in.ConsumeBool() ? s.c[b].c : nullptr;
  work.op_type = in.ConsumeBool() ? FI_OP_CNTR_ADD : FI_OP_CNTR_SET;
  work_op.cntr = b >= 0 && !s.c[b].hidden_gone ? s.c[b].c : nullptr;
  work_op.value = in.ConsumeIntegralInRange<std::uint64_t>(0, 10);
  work.op.cntr = &work_op;
  static const int cmds[] = {FI_QUEUE_WORK, FI_CANCEL_WORK, FI_FLUSH_WORK, FI_QUEUE_WORK};
  const bool null_arg = in.ConsumeIntegralInRange<int>(0, 7) == 0;
  FUZZ_TRACE("fi_control(domain, %d, %s)", cmds[cmd], null_arg ? "NULL" : "counter work");
  // shm has no deferred work: -FI_ENOSYS, with the hook's translation of the counters too.
  FUZZ_FI("fi_control(domain, work)",
          fi_control(&w.domain->fid, cmds[cmd], null_arg ? nullptr : &work), -FI_ENOSYS);
  FUZZ_TRUE(work.triggering_cntr == (a >= 0 && !s.c[a].hidden_gone ? s.c[a].c : nullptr),
            "FI_QUEUE_WORK gives the application's counters back");
}

// ---- triggers (compcntr's, inline, on the counters behind hook counters) ----------------------

// Not on the world's counters: a trigger's bookkeeping hangs off the counter's pool slot, which
// LeakSanitizer does not scan (hwloc-allocated memory), so on a counter that outlives the input
// it would be reported as a leak; per-input counters free it when they close.
int pick_input(FuzzedDataProvider& in, const state& s) {
  const int i = in.ConsumeIntegralInRange<int>(0, max_counters - 1);
  return s.c[i].live ? i : -1;
}

void op_arm(FuzzedDataProvider& in, state& s) {
  if (plain || static_cast<int>(s.t.size()) >= max_triggers) return;
  const int i = pick_input(in, s);
  if (i < 0) return;
  mtrigger m;
  m.counter = i;
  m.thr = in.ConsumeBool() ? s.c[i].comp + in.ConsumeIntegralInRange<std::uint64_t>(0, 8) - 2
                           : edgy_u64(in);
  const int ti = static_cast<int>(s.t.size());
  const int how = in.ConsumeIntegralInRange<int>(0, 2);
  ctxs[ti].index = ti;
  errno = 0;
  if (how == 0) {
    FUZZ_TRACE("trigger_arm c%d thr %llu inline -> t%d", i, (unsigned long long)m.thr, ti);
    m.t = compcntr_trigger_arm(s.c[i].cc, m.thr, log_action, &ctxs[ti], COMPCNTR_TRIGGER_INLINE);
  } else {
    const int tgt = pick_input(in, s);
    if (tgt < 0) return;
    m.k = how == 1 ? kind::add : kind::set;
    m.target = tgt;
    m.operand = edgy_u64(in);
    FUZZ_TRACE("trigger_arm_%s c%d thr %llu -> c%d %llu -> t%d", how == 1 ? "add" : "set", i,
               (unsigned long long)m.thr, tgt, (unsigned long long)m.operand, ti);
    m.t = how == 1 ? compcntr_trigger_arm_add(s.c[i].cc, m.thr, s.c[tgt].cc, m.operand)
                   : compcntr_trigger_arm_set(s.c[i].cc, m.thr, s.c[tgt].cc, m.operand);
  }
  FUZZ_PTR("trigger_arm", m.t, errno, 0);
  m.live = true;
  m.seq = s.seq++;
  s.t.push_back(m);
  if (s.c[i].comp >= m.thr) evaluate(s, i);
}

void op_trigger_misc(FuzzedDataProvider& in, state& s) {
  if (plain || s.t.empty()) return;
  if (in.ConsumeBool()) {
    const int i = pick_input(in, s);
    if (i < 0) return;
    FUZZ_TRACE("trigger_flush c%d", i);
    const int want = cancel_all(s, i);
    FUZZ_EQ(compcntr_trigger_flush(s.c[i].cc), want, "flushed count");
    return;
  }
  const int ti = in.ConsumeIntegralInRange<int>(0, static_cast<int>(s.t.size()) - 1);
  mtrigger& m = s.t[ti];
  if (!m.live) return;
  const bool destroy = in.ConsumeBool();
  FUZZ_TRACE("trigger_%s t%d", destroy ? "destroy" : "cancel", ti);
  int want = destroy ? 0 : EALREADY;
  if (m.st == tstate::armed) {
    model_run(s, ti, ECANCELED);
    want = 0;
  }
  if (destroy) {
    FUZZ_RC("trigger_destroy", compcntr_trigger_destroy(m.t), 0);
    m.live = false;
  } else {
    FUZZ_RC("trigger_cancel", compcntr_trigger_cancel(m.t), want);
  }
}

void teardown(state& s) {
  FUZZ_TRACE("end of input: endpoints, triggers, then counters");
  for (int e = 0; e < max_eps; ++e) {
    mep& E = s.ep[e];
    if (!E.live) continue;
    FUZZ_FI("fi_close(ep)", fi_close(&E.ep->fid), 0);
    for (int c : E.bound)
      if (c >= 0) --s.c[c].refs;
    if (cq_of_ep[e]) FUZZ_FI("fi_close(cq)", fi_close(&cq_of_ep[e]->fid), 0), cq_of_ep[e] = nullptr;
    E.live = false;
  }
  for (std::size_t ti = 0; ti < s.t.size(); ++ti) {
    mtrigger& m = s.t[ti];
    if (!m.live) continue;
    if (m.st == tstate::armed) model_run(s, static_cast<int>(ti), ECANCELED);
    FUZZ_RC("trigger_destroy", compcntr_trigger_destroy(m.t), 0);
    m.live = false;
  }
  for (int i = 0; i < max_counters; ++i) {
    mcounter& m = s.c[i];
    if (m.live) FUZZ_FI("fi_close(hook counter)", fi_close(&m.c->fid), 0);
    m.live = false;
  }
  check(s);
  // The world for the next input.
  w.progress_raw();
  for (fid_cntr* c : {w.a_send, w.b_recv}) {
    fi_cntr_set(c, 0);
    fi_cntr_seterr(c, 0);
  }
}

void init_once() {
  static bool done = false;
  if (done) return;
  done = true;
  const char* p = std::getenv("COMPCNTR_FUZZ_PLAIN");
  plain = p && *p == '1';
  if (plain) {
    unsetenv("FI_HOOK");
  } else {
    // Before libfabric initialises (the first fi_getinfo): only the hook on the provider path.
    setenv("FI_PROVIDER_PATH", FUZZ_HOOK_DIR, 1);
    setenv("FI_HOOK", "compcntr", 1);
  }
  unsetenv("COMPCNTR_FI_PROGRESS_THREAD");
  unsetenv("COMPCNTR_FI_WAIT_SPIN_US");
  w.open("shm", 0, true);
}

} // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  init_once();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  init_once();
  fuzz::trace::get().clear();
  ran.clear();
  FuzzedDataProvider in(data, size);
  state s;
  for (int k = 0; k < 2; ++k) {
    mcounter& m = s.c[max_counters + k];
    m.c = k == 0 ? w.a_send : w.b_recv;
    m.live = m.world = true;
    m.wait_obj = FI_WAIT_UNSPEC;
    m.refs = 1;
    m.cc = plain ? nullptr : compcntr_fi_cntr_comp_cntr(m.c);
  }
  for (int steps = 0; steps < 200 && in.remaining_bytes() > 0; ++steps) {
    switch (in.ConsumeIntegralInRange<int>(0, 15)) {
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
      case 10:
      case 11: op_ep(in, s); break;
      case 12: op_send(in, s); break;
      case 13: op_work(in, s); break;
      case 14: op_arm(in, s); break;
      default: op_trigger_misc(in, s); break;
    }
    check(s);
  }
  teardown(s);
  return 0;
}
