// Fuzz harness: the layered provider ofi_compcntr (fabric_integration/ofi, docs/ofi_compcntr.md)
// over shm ("shm;ofi_compcntr"), against a reference model of fi_cntr(3) / fi_trigger(3) as the
// layer documents them: deferred work (fi_control FI_QUEUE_WORK / FI_CANCEL_WORK /
// FI_FLUSH_WORK) with FI_OP_CNTR_ADD / FI_OP_CNTR_SET and FI_OP_SEND, FI_TRIGGER sends, the
// counter calls, waits, binds and closes in any order, compcntr's own triggers on the counters
// behind the layer's.
//
// Model (docs/ofi_compcntr.md, "Progress"): while any operation is armed, due or in flight, every
// fi_cntr_read / readerr / add / adderr / set / seterr, every wait check and every fi_cq_read of
// the layer's objects runs one progress round, after the call's own update (a wait: before its
// comparison): (2) compcntr_trigger_progress runs the due deferred triggers in the order they
// became due (the layer's operations become "due": queued in that order; compcntr's own deferred
// actions run), (3) the due operations are posted in that order (counter work updates its target
// and then its completion counter; an update that makes more operations due queues them for the
// next round), (4) completions of posted sends are read (their completion counters count). An
// operation armed on a counter is a deferred compcntr trigger of that counter: per counter,
// threshold order, equal thresholds in arming order, the same trampoline as compcntr's inline
// triggers (the model of fuzz_trigger.cpp, with the layer's operations as its deferred ones).
//
// Traffic (sends A->B: FI_TRIGGER sends, deferred FI_OP_SEND, plain fi_send) is counted by the
// world's two counters, bound to A (FI_SEND) and B (FI_RECV), and by the completion counters of
// deferred sends, which are always one of those two: the "observers". When the provider makes
// those counts visible is the provider's business, so observers are never triggering counters
// or FI_OP_CNTR_SET targets, and every call on an observer is preceded by a settle: rounds (reads
// of the observers, reads of both CQs), counted by the model, until the observers show every
// send posted and nothing is left to post. Every CQ entry read is checked against the contexts
// the model expects.
#include "fuzz_fabric.hpp"
#include "trigger_model.hpp"

#include <algorithm>
#include <array>
#include <deque>
#include <set>

namespace {

using fuzz::edgy_u64;
using namespace fuzz::fab;

constexpr int max_counters = 6;  // per input; slot 6: A's send counter, 7: B's receive counter
constexpr int n_slots = max_counters + 2;
constexpr int obs_a = max_counters, obs_b = max_counters + 1;
constexpr int max_triggers = 40;
constexpr int n_works = 6;  // fi_deferred_work structs an input may queue (each more than once)
constexpr int max_eps = 2;
constexpr std::uint64_t classes[6] = {FI_SEND,  FI_RECV,        FI_READ,
                                      FI_WRITE, FI_REMOTE_READ, FI_REMOTE_WRITE};
constexpr std::uint64_t bindable =
    FI_SEND | FI_RECV | FI_READ | FI_WRITE | FI_REMOTE_READ | FI_REMOTE_WRITE;

world w;

bool observer(int ci) { return ci >= max_counters; }

// One armed thing on a counter: compcntr's own triggers (log inline or deferred, add, set) and
// the layer's operations (counter work, sends).
enum class kind { log, add, set, w_add, w_set, w_send, t_send };
enum class st { armed, queued, due, inflight, done, finished };

struct mtrig {
  kind k = kind::log;
  bool deferred = false;  // log: COMPCNTR_TRIGGER_DEFERRED
  int counter = 0;
  std::uint64_t thr = 0, seq = 0;
  int target = -1;             // add/set/w_add/w_set
  std::uint64_t operand = 0;
  int completion = -1;         // layer work: its completion counter
  int work = -1;               // FI_QUEUE_WORK's struct (FI_CANCEL_WORK finds it)
  void* app_ctx = nullptr;     // sends: the context of its CQ entry
  st s = st::armed;
  compcntr_trigger* t = nullptr;  // compcntr's own triggers only
  bool live = true;               // compcntr's own: the handle is not destroyed
};

struct mcounter {
  fid_cntr* c = nullptr;
  compcntr_comp_cntr* cc = nullptr;
  bool live = false;
  int wait_obj = FI_WAIT_NONE;
  std::uint64_t comp = 0, err = 0;
  int refs = 0, unenabled = 0;
  bool tainted = false, hidden_gone = false;
  bool pending = false;
};

struct mep {
  fid_ep* ep = nullptr;
  fid_cq* cq = nullptr;
  bool live = false, enabled = false;
  std::array<int, 6> bound{-1, -1, -1, -1, -1, -1};
};

struct state {
  std::array<mcounter, n_slots> c;
  std::array<mep, max_eps> ep;
  std::vector<mtrig> t;
  std::vector<int> queue;   // compcntr's deferred queue (due, not run)
  std::deque<int> ready;    // the layer's due operations, to post in this order
  std::vector<std::pair<int, int>> want;  // compcntr's own log actions run
  std::vector<int> stack;
  int depth = 0;
  std::uint64_t seq = 0;
  long active = 0;          // the layer's operations not finished (progress runs while > 0)
  long send_items = 0;      // triggered and deferred sends armed in this input
  long sends_fired = 0;     // of those, posted (each takes one of B's posted receives)
  long fired_counted = 0;   // of those, already taken off the world's count of posted receives
  std::multiset<void*> a_entries;  // contexts the application will read from A's CQ
  long b_entries = 0;              // receive entries on B's CQ
  bool enabled_once = false;
};

std::vector<std::pair<int, int>> ran;
struct ctx {
  int index;
};
std::array<ctx, max_triggers> ctxs;
void log_action(void* p, int status) { ran.emplace_back(static_cast<ctx*>(p)->index, status); }

bool layer_op(const mtrig& m) { return m.k >= kind::w_add; }

void evaluate(state& s, int ci);

void m_inc(state& s, int ci, std::uint64_t v) {
  if (!s.c[ci].live) return;
  s.c[ci].comp += v;
  evaluate(s, ci);
}
void m_set(state& s, int ci, std::uint64_t v) {
  if (!s.c[ci].live) return;
  s.c[ci].comp = v;
  evaluate(s, ci);
}

void finish(state& s, int ti) {
  s.t[ti].s = st::finished;
  --s.active;
}

// An action run by compcntr (status 0: fired; ECANCELED).
void model_run(state& s, int ti, int status) {
  mtrig& m = s.t[ti];
  if (layer_op(m)) {
    if (status != 0) {
      m.s = st::done;  // cancelled: stays in the layer's list until a cancel, flush or close
      return;
    }
    m.s = st::due;
    s.ready.push_back(ti);
    return;
  }
  // compcntr's own: done = fired (state 1), finished = cancelled (state 2).
  if (m.k == kind::log) s.want.emplace_back(ti, status);
  m.s = status == 0 ? st::done : st::finished;
  if (status != 0 || m.k == kind::log) return;
  mcounter& tc = s.c[m.target];
  tc.comp = m.k == kind::add ? tc.comp + m.operand : m.operand;
  evaluate(s, m.target);
}

// The trigger model (tests/fuzz/trigger_model.hpp) on this harness's records.
bool is_armed(const mtrig& m) { return m.s == st::armed; }
bool is_deferred(const mtrig& m) { return layer_op(m) || (m.k == kind::log && m.deferred); }
void mark_queued(mtrig& m) { m.s = st::queued; }
void mark_running(mtrig& m) { m.s = st::done; }
std::vector<int> due(const state& s, int ci) { return fuzz::trig::due(s, ci); }
void evaluate(state& s, int ci) { fuzz::trig::evaluate(s, ci); }
int cancel_all(state& s, int ci) { return fuzz::trig::cancel_all(s, ci); }

// compcntr_trigger_cancel of trigger ti (armed or queued): its action runs with ECANCELED.
void cancel_one(state& s, int ti) {
  if (s.t[ti].s == st::queued) s.queue.erase(std::find(s.queue.begin(), s.queue.end(), ti));
  model_run(s, ti, ECANCELED);
}

// One progress round of the layer (nothing while no operation of it is alive).
void round(state& s) {
  if (s.active == 0) return;
  // 2. compcntr_trigger_progress: the queue as it is now.
  std::vector<int> q;
  q.swap(s.queue);
  for (int ti : q) model_run(s, ti, 0);
  // 3. post the due operations in order.
  while (!s.ready.empty()) {
    const int ti = s.ready.front();
    s.ready.pop_front();
    mtrig& m = s.t[ti];
    switch (m.k) {
      case kind::w_add:
      case kind::w_set:
        if (m.k == kind::w_add)
          m_inc(s, m.target, m.operand);
        else
          m_set(s, m.target, m.operand);
        if (m.completion >= 0) m_inc(s, m.completion, 1);
        finish(s, ti);
        break;
      default:  // a send, A -> B (counted by the observers)
        ++s.sends_fired;
        m_inc(s, obs_a, 1);
        m_inc(s, obs_b, 1);
        ++s.b_entries;
        s.a_entries.insert(m.app_ctx);
        if (m.completion >= 0) {
          m.s = st::inflight;  // its entry comes back in step 4
        } else {
          finish(s, ti);
        }
        break;
    }
  }
  // 4. the completions of posted sends (shm writes a send's entry when it is posted).
  for (int i = 0; i < static_cast<int>(s.t.size()); ++i)
    if (s.t[i].s == st::inflight) {
      m_inc(s, s.t[i].completion, 1);
      finish(s, i);
    }
}

// Nothing a further round would change: nothing due, or no round at all (no operation of the
// layer alive: compcntr's own deferred actions then wait for a round that does not come).
bool quiet(const state& s) { return s.active == 0 || (s.queue.empty() && s.ready.empty()); }

void check(state& s) {
  FUZZ_EQ(ran.size(), s.want.size(), "number of compcntr actions run");
  for (std::size_t i = 0; i < ran.size(); ++i) {
    FUZZ_EQ(ran[i].first, s.want[i].first, "which action ran");
    FUZZ_EQ(ran[i].second, s.want[i].second, "its status");
  }
  // compcntr's values behind the layer's counters (loads; no round). Observers are checked
  // when settled.
  for (int i = 0; i < max_counters; ++i) {
    const mcounter& m = s.c[i];
    if (!m.live) continue;
    std::uint64_t v = 0, e = 0;
    FUZZ_RC("read_comp_cntr", compcntr_read_comp_cntr(m.cc, &v), 0);
    FUZZ_RC("read_err_comp_cntr", compcntr_read_err_comp_cntr(m.cc, &e), 0);
    FUZZ_EQ(v, m.comp, "completion value behind the layer's counter");
    FUZZ_EQ(e, m.err, "error value behind the layer's counter");
  }
  for (std::size_t ti = 0; ti < s.t.size(); ++ti) {
    const mtrig& m = s.t[ti];
    if (layer_op(m) || !m.live) continue;
    const int want = m.s == st::armed || m.s == st::queued ? 0 : m.s == st::done ? 1 : 2;
    FUZZ_EQ(compcntr_trigger_state(m.t), want, "compcntr trigger state");
  }
}

bool readable(const mcounter& m) { return m.unenabled == 0 && !m.tainted; }

// Reads A's and B's CQs empty (each read is a round), checking the entries.
void drain_cqs(state& s) {
  fi_cq_tagged_entry e[8];
  for (;;) {
    round(s);
    const ssize_t r = fi_cq_read(w.a.cq, e, 8);
    if (r == -FI_EAGAIN) break;
    FUZZ_TRUE(r > 0, "fi_cq_read(A's CQ) through the layer");
    for (ssize_t k = 0; k < r; ++k) {
      auto it = s.a_entries.find(e[k].op_context);
      FUZZ_TRUE(it != s.a_entries.end(), "an entry on A's CQ with a context the model expects");
      s.a_entries.erase(it);
      FUZZ_TRUE(e[k].flags & FI_SEND, "A's entry is a send's");
    }
  }
  for (;;) {
    round(s);
    const ssize_t r = fi_cq_read(w.b.cq, e, 8);
    if (r == -FI_EAGAIN) break;
    FUZZ_TRUE(r > 0, "fi_cq_read(B's CQ) through the layer");
    s.b_entries -= r;
    FUZZ_TRUE(s.b_entries >= 0, "no more receive entries on B's CQ than sends");
  }
}

// Until every send posted is visible on the observers and nothing is left to post: reads of the
// observers and of the CQs, each one round.
// false (nothing done): an observer is bound to an endpoint not enabled (reading it would crash
// shm), so a call on an observer cannot be made now.
bool settle(state& s) {
  mcounter &A = s.c[obs_a], &B = s.c[obs_b];
  if (!readable(A) || !readable(B)) return false;
  for (int k = 0; k < 400; ++k) {
    round(s);
    const std::uint64_t a = fi_cntr_read(A.c);
    round(s);
    const std::uint64_t b = fi_cntr_read(B.c);
    drain_cqs(s);
    if (a == A.comp && b == B.comp && quiet(s) && s.a_entries.empty() && s.b_entries == 0) {
      round(s);
      FUZZ_EQ(fi_cntr_readerr(A.c), A.err, "A's error value, settled");
      round(s);
      FUZZ_EQ(fi_cntr_readerr(B.c), B.err, "B's error value, settled");
      return true;
    }
    if (k > 100) {
      FUZZ_TRACE("settle: A %llu (model %llu) B %llu (model %llu) quiet %d entries A %zu B %ld",
                 (unsigned long long)a, (unsigned long long)A.comp, (unsigned long long)b,
                 (unsigned long long)B.comp, quiet(s), s.a_entries.size(), s.b_entries);
    }
  }
  FUZZ_TRUE(false, "the observers settle (every send posted is counted and its entries read)");
  return false;
}

int pick_live(FuzzedDataProvider& in, const state& s) {
  const int i = in.ConsumeIntegralInRange<int>(0, n_slots - 1);
  return s.c[i].live ? i : -1;
}
int pick_plain(FuzzedDataProvider& in, const state& s) {  // a live non-observer counter
  const int i = in.ConsumeIntegralInRange<int>(0, max_counters - 1);
  return s.c[i].live && !s.c[i].hidden_gone ? i : -1;
}

// ---- counter calls ----------------------------------------------------------------------------

void op_open(FuzzedDataProvider& in, state& s) {
  const int i = in.ConsumeIntegralInRange<int>(0, max_counters - 1);
  if (s.c[i].live) return;
  raw_attr ra;
  static const int waits[] = {FI_WAIT_NONE, FI_WAIT_UNSPEC, FI_WAIT_YIELD, FI_WAIT_NONE};
  ra.wait_obj = waits[in.ConsumeIntegralInRange<int>(0, 3)];
  switch (in.ConsumeIntegralInRange<int>(0, 15)) {
    case 0: ra.null_attr = true; break;
    case 1: ra.flags = in.ConsumeIntegralInRange<std::uint64_t>(1, ~std::uint64_t{0}); break;
    case 2: ra.wait_obj = in.ConsumeIntegralInRange<int>(-3, 20); break;
    default: break;
  }
  if (ra.null_attr) ra.events = 0, ra.wait_obj = FI_WAIT_NONE, ra.flags = 0;
  long want = 0;
  if (ra.wait_obj != FI_WAIT_NONE && ra.wait_obj != FI_WAIT_UNSPEC && ra.wait_obj != FI_WAIT_YIELD)
    want = -FI_ENOSYS;  // shm's answer (no wait sets, no fds)
  else if (ra.flags != 0)
    want = -FI_EINVAL;
  fi_cntr_attr a = ra.get();
  fid_cntr* c = nullptr;
  FUZZ_TRACE("fi_cntr_open(%s wait %d flags %#llx) -> c%d", ra.null_attr ? "NULL" : "attr",
             ra.wait_obj, (unsigned long long)ra.flags, i);
  FUZZ_FI("fi_cntr_open", fi_cntr_open(w.domain, ra.null_attr ? nullptr : &a, &c, &s.c[i]), want);
  if (want) return;
  mcounter& m = s.c[i];
  m = mcounter{};
  m.c = c;
  m.live = true;
  m.wait_obj = ra.wait_obj;
  m.cc = compcntr_fi_cntr_comp_cntr(c);
  FUZZ_TRUE(m.cc != nullptr, "compcntr_fi_cntr_comp_cntr of the layer's counter");
}

void op_update(FuzzedDataProvider& in, state& s) {
  const int i = pick_live(in, s);
  if (i < 0) return;
  const int how = in.ConsumeIntegralInRange<int>(0, 3);
  const std::uint64_t v =
      observer(i) ? in.ConsumeIntegralInRange<std::uint64_t>(0, 100) : edgy_u64(in);
  if (observer(i) && !settle(s)) return;
  mcounter& m = s.c[i];
  static const char* names[] = {"fi_cntr_add", "fi_cntr_set", "fi_cntr_adderr", "fi_cntr_seterr"};
  FUZZ_TRACE("%s c%d %llu", names[how], i, (unsigned long long)v);
  int r = 0;
  switch (how) {
    case 0:
      r = fi_cntr_add(m.c, v);
      m_inc(s, i, v);
      break;
    case 1:
      r = fi_cntr_set(m.c, v);
      m_set(s, i, v);
      break;
    case 2:
      r = fi_cntr_adderr(m.c, v);
      m.err += v;
      break;
    default:
      r = fi_cntr_seterr(m.c, v);
      m.err = v;
      break;
  }
  round(s);  // after the update, in the same call
  FUZZ_FI(names[how], r, 0);
}

void op_read(FuzzedDataProvider& in, state& s) {
  const int i = pick_live(in, s);
  if (i < 0 || !readable(s.c[i])) return;
  const bool err = in.ConsumeBool();
  if (observer(i) && !settle(s)) return;
  FUZZ_TRACE("fi_cntr_read%s c%d", err ? "err" : "", i);
  // The pull, then the round, then the value.
  round(s);
  const std::uint64_t got = err ? fi_cntr_readerr(s.c[i].c) : fi_cntr_read(s.c[i].c);
  FUZZ_EQ(got, err ? s.c[i].err : s.c[i].comp, err ? "fi_cntr_readerr" : "fi_cntr_read");
}

// Every check is a round, then the comparison (the threshold wins a tie with an error change).
// The layer's counters serve fi_cntr_wait whatever their wait object. A timeout of 0 is one
// check; longer ones check at least 3 times (the model asks for a long one when its answer needs
// more, for 0 when a timeout would need more than 3 rounds to reach its end state).
void op_wait(FuzzedDataProvider& in, state& s) {
  const int i = pick_live(in, s);
  if (i < 0 || !readable(s.c[i])) return;
  if (observer(i) && !settle(s)) return;
  mcounter& m = s.c[i];
  const std::uint64_t thr =
      in.ConsumeBool() ? m.comp + in.ConsumeIntegralInRange<std::uint64_t>(0, 6) - 2 : edgy_u64(in);
  int timeout = small_timeout(in);
  state probe = s;
  const std::uint64_t err0 = m.err;
  long want = -FI_ETIMEDOUT;
  int checks = 0;
  // Already reached: compcntr's wait returns after one load, before any check (no progress).
  if (probe.c[i].comp >= thr) want = 0;
  for (; want != 0;) {
    ++checks;
    round(probe);
    if (probe.c[i].comp >= thr) {
      want = 0;
      break;
    }
    if (probe.c[i].err != err0) {
      want = -FI_EAVAIL;
      break;
    }
    if (timeout == 0 || (quiet(probe) && checks > 1)) break;
    if (checks > 1000) break;
  }
  if (timeout > 0 && want != -FI_ETIMEDOUT) timeout = 10000;
  if (timeout > 0 && want == -FI_ETIMEDOUT && checks > 3) timeout = 0, checks = 1;
  FUZZ_TRACE("fi_cntr_wait c%d thr %llu timeout %d (model: %s after %d round(s))", i,
             (unsigned long long)thr, timeout, fi_name(want).c_str(), checks);
  want = checks == 0 ? 0 : -FI_ETIMEDOUT;
  for (int k = 0; k < checks; ++k) {
    round(s);
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
  const int cmd = in.ConsumeBool()
                      ? FI_GETWAIT
                      : in.ConsumeIntegralInRange<int>(FI_GETFIDFLAG, FI_FLUSH_WORK + 2);
  std::uint64_t arg[8] = {};
  FUZZ_TRACE("fi_control(c%d, %d)", i, cmd);
  FUZZ_FI("fi_control(cntr)", fi_control(&s.c[i].c->fid, cmd, arg), -FI_ENOSYS);
  if (in.ConsumeBool()) {
    fid* f = &s.c[i].c->fid;
    FUZZ_TRACE("fi_trywait(fabric, c%d)", i);
    FUZZ_FI("fi_trywait", fi_trywait(w.fabric, &f, 1), -FI_EINVAL);  // not FI_WAIT_FD
  }
}

bool referenced(const state& s, int ci) {  // compcntr's own add/set target
  for (const mtrig& m : s.t)
    if (!layer_op(m) && m.live && m.target == ci) return true;
  return false;
}

// Work that would still update it (armed, due or in flight, naming it as target or completion
// counter) keeps a counter: -FI_EBUSY, nothing closed (docs/ofi_compcntr.md).
bool work_names(const state& s, int ci) {
  for (const mtrig& m : s.t)
    if (layer_op(m) &&
        (m.s == st::armed || m.s == st::queued || m.s == st::due || m.s == st::inflight) &&
        (m.target == ci || m.completion == ci))
      return true;
  return false;
}

void op_close(FuzzedDataProvider& in, state& s) {
  const int i = in.ConsumeIntegralInRange<int>(0, max_counters - 1);
  mcounter& m = s.c[i];
  if (!m.live) return;
  FUZZ_TRACE("fi_close c%d", i);
  long want = 0;
  if (work_names(s, i)) {
    want = -FI_EBUSY;
  } else if (!m.hidden_gone && m.refs > 0) {
    want = -FI_EBUSY;
  } else if (referenced(s, i)) {
    want = -FI_EBUSY;
    m.hidden_gone = true;
  } else {
    cancel_all(s, i);
  }
  FUZZ_FI("fi_close(counter)", fi_close(&m.c->fid), want);
  if (want == 0) m.live = false;
}

// ---- per-input endpoints (binds) ----------------------------------------------------------------

void op_ep(FuzzedDataProvider& in, state& s) {
  const int e = in.ConsumeIntegralInRange<int>(0, max_eps - 1);
  mep& E = s.ep[e];
  if (!E.live) {
    FUZZ_TRACE("fi_endpoint -> ep%d", e);
    FUZZ_FI("fi_endpoint", fi_endpoint(w.domain, w.info, &E.ep, nullptr), 0);
    E.live = true;
    E.enabled = false;
    E.cq = nullptr;
    E.bound.fill(-1);
    return;
  }
  switch (in.ConsumeIntegralInRange<int>(0, 15)) {
    case 0: {
      if (E.enabled || s.enabled_once) return;
      s.enabled_once = true;
      FUZZ_TRACE("fi_ep_bind(ep%d, av, cq); fi_enable", e);
      fi_cq_attr ca{};
      ca.format = FI_CQ_FORMAT_TAGGED;
      FUZZ_FI("fi_cq_open", fi_cq_open(w.domain, &ca, &E.cq, nullptr), 0);
      FUZZ_FI("fi_ep_bind(av)", fi_ep_bind(E.ep, &w.av->fid, 0), 0);
      FUZZ_FI("fi_ep_bind(cq)", fi_ep_bind(E.ep, &E.cq->fid, FI_TRANSMIT | FI_RECV), 0);
      FUZZ_FI("fi_enable", fi_enable(E.ep), 0);
      E.enabled = true;
      for (int c : E.bound)
        if (c >= 0) --s.c[c].unenabled;
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
      if (E.cq) FUZZ_FI("fi_close(cq)", fi_close(&E.cq->fid), 0), E.cq = nullptr;
      E.live = false;
      return;
    }
    default: {
      const int i = pick_live(in, s);
      if (i < 0) return;
      mcounter& m = s.c[i];
      std::uint64_t flags = 0;
      switch (in.ConsumeIntegralInRange<int>(0, 7)) {
        case 0: flags = FI_SEND | FI_RECV; break; // (never 0: see the file comment)
        case 1: flags = in.ConsumeIntegral<std::uint64_t>() | FI_MSG; break;
        default: flags = classes[in.ConsumeIntegralInRange<int>(0, 5)]; break;
      }
      long want = 0;
      if (flags & ~bindable) {
        want = -FI_EBADFLAGS;
      } else { // (an enabled endpoint takes counters too)
        for (int k = 0; k < 6; ++k)
          if ((flags & classes[k]) && E.bound[k] >= 0) want = -FI_EINVAL;
      }
      if (m.hidden_gone) want = -FI_EINVAL;
      // See fuzz_fi_hook.cpp: a refused duplicate or a bind with flags 0 links the endpoint into
      // the counter for good; the world's counters outlive the input and stay clean.
      if (observer(i) && (want == -FI_EINVAL || (want == 0 && flags == 0))) return;
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

// ---- deferred work and triggered sends ---------------------------------------------------------

// B's posted receives: the world's count less what the sends fired so far took, then enough for
// `n` more sends plus every armed send of the input.
void recvs(state& s, int n) {
  w.posted -= static_cast<std::size_t>(s.sends_fired - s.fired_counted);
  s.fired_counted = s.sends_fired;
  w.post_recvs(static_cast<std::size_t>(n + 8 + s.send_items));
}

std::array<fi_deferred_work, n_works> works;
std::array<fi_op_cntr, n_works> work_cntr;
std::array<fi_op_msg, n_works> work_msg;
std::array<iovec, n_works> work_iov;
std::array<fi_context, n_works> work_ctx; // the application's context of a deferred send
std::array<fi_triggered_context, max_triggers> tctx;

void op_queue(FuzzedDataProvider& in, state& s) {
  if (static_cast<int>(s.t.size()) >= max_triggers) return;
  const int wi = in.ConsumeIntegralInRange<int>(0, n_works - 1);
  fi_deferred_work& wk = works[wi];
  wk = fi_deferred_work{};
  mtrig m;
  m.work = wi;
  const int trig = pick_plain(in, s);
  m.counter = trig;
  m.thr = trig >= 0 && in.ConsumeBool()
              ? s.c[trig].comp + in.ConsumeIntegralInRange<std::uint64_t>(0, 6) - 1
              : in.ConsumeIntegralInRange<std::uint64_t>(0, 12);
  wk.threshold = m.thr;
  wk.triggering_cntr = trig >= 0 ? s.c[trig].c : nullptr;
  long want = trig >= 0 ? 0 : -FI_EINVAL;
  const int how = in.ConsumeIntegralInRange<int>(0, 9);
  if (how < 6) { // counter work
    m.k = how < 3 ? kind::w_add : kind::w_set;
    wk.op_type = m.k == kind::w_add ? FI_OP_CNTR_ADD : FI_OP_CNTR_SET;
    int tgt = m.k == kind::w_add ? pick_live(in, s) : pick_plain(in, s);
    if (tgt >= 0 && s.c[tgt].hidden_gone) tgt = -1;
    m.target = tgt;
    m.operand = in.ConsumeBool() ? in.ConsumeIntegralInRange<std::uint64_t>(0, 5) : edgy_u64(in);
    if (m.k == kind::w_set && tgt >= 0 && in.ConsumeBool())
      m.operand = s.c[tgt].comp + in.ConsumeIntegralInRange<std::uint64_t>(0, 4) - 2;
    work_cntr[wi] = fi_op_cntr{tgt >= 0 ? s.c[tgt].c : nullptr, m.operand};
    const bool null_op = in.ConsumeIntegralInRange<int>(0, 15) == 0;
    wk.op.cntr = null_op ? nullptr : &work_cntr[wi];
    if (in.ConsumeBool()) {
      const int cc = pick_live(in, s);
      if (cc >= 0 && !s.c[cc].hidden_gone) {
        m.completion = cc;
        wk.completion_cntr = s.c[cc].c;
      }
    }
    if (want == 0 && (null_op || tgt < 0)) want = -FI_EINVAL;
  } else if (how < 9) { // a deferred send on A, completion counter an observer or none
    m.k = kind::w_send;
    wk.op_type = FI_OP_SEND;
    const std::size_t len = in.ConsumeIntegralInRange<std::size_t>(1, msg_max);
    work_iov[wi] = iovec{w.sbuf, len};
    work_msg[wi] =
        fi_op_msg{w.a.ep, fi_msg{&work_iov[wi], nullptr, 1, w.b.addr, &work_ctx[wi], 0}, 0};
    wk.op.msg = &work_msg[wi];
    m.app_ctx = &work_ctx[wi];
    const int comp = in.ConsumeIntegralInRange<int>(0, 2);
    if (comp > 0) {
      m.completion = comp == 1 ? obs_a : obs_b;
      wk.completion_cntr = s.c[m.completion].c;
    }
  } else { // an op type of nothing
    fuzz::set_raw(wk.op_type, in.ConsumeIntegralInRange<std::uint32_t>(FI_OP_CNTR_ADD + 1, 200));
    if (want == 0) want = -FI_ENOSYS;
  }
  if (m.k == kind::log) return; // (unused)
  const bool null_arg = in.ConsumeIntegralInRange<int>(0, 31) == 0;
  if (null_arg) want = -FI_EINVAL;
  if (want == 0) ++s.send_items, recvs(s, 0); // its receive, whenever it fires
  FUZZ_TRACE("fi_control(domain, FI_QUEUE_WORK, w%d: %s on c%d thr %llu -> target c%d %llu, "
             "completion c%d)%s",
             wi,
             m.k == kind::w_add    ? "CNTR_ADD"
             : m.k == kind::w_set  ? "CNTR_SET"
             : m.k == kind::w_send ? "SEND"
                                   : "?",
             trig, (unsigned long long)m.thr, m.target, (unsigned long long)m.operand, m.completion,
             null_arg ? " (NULL arg)" : "");
  const int r = fi_control(&w.domain->fid, FI_QUEUE_WORK, null_arg ? nullptr : &wk);
  FUZZ_FI("fi_control(FI_QUEUE_WORK)", r, want);
  if (want) return;
  m.seq = s.seq++;
  s.t.push_back(m);
  ++s.active;
  if (s.c[trig].comp >= m.thr) evaluate(s, trig);
}

void op_trigger_send(FuzzedDataProvider& in, state& s) {
  if (static_cast<int>(s.t.size()) >= max_triggers) return;
  const int ti = static_cast<int>(s.t.size());
  fi_triggered_context& tc = tctx[ti];
  tc = fi_triggered_context{};
  const int trig = pick_plain(in, s);
  mtrig m;
  m.k = kind::t_send;
  m.counter = trig;
  m.thr = trig >= 0 && in.ConsumeBool()
              ? s.c[trig].comp + in.ConsumeIntegralInRange<std::uint64_t>(0, 6) - 1
              : in.ConsumeIntegralInRange<std::uint64_t>(0, 12);
  m.app_ctx = &tc;
  long want = 0;
  tc.event_type = FI_TRIGGER_THRESHOLD;
  tc.trigger.threshold.cntr = trig >= 0 ? s.c[trig].c : nullptr;
  tc.trigger.threshold.threshold = m.thr;
  if (trig < 0) want = -FI_EINVAL;
  if (in.ConsumeIntegralInRange<int>(0, 15) == 0) {
    const std::uint32_t ev = in.ConsumeIntegralInRange<std::uint32_t>(1, 40); // FI_TRIGGER_XPU..
    fuzz::set_raw(tc.event_type, ev);
    want = -FI_ENOSYS; // checked before the counter
  }
  const std::size_t len = in.ConsumeIntegralInRange<std::size_t>(1, msg_max);
  iovec iov{w.sbuf, len};
  fi_msg msg{&iov, nullptr, 1, w.b.addr, &tc, 0};
  if (want == 0) ++s.send_items, recvs(s, 0);
  FUZZ_TRACE("fi_sendmsg(A, FI_TRIGGER on c%d thr %llu) -> t%d", trig, (unsigned long long)m.thr,
             ti);
  FUZZ_FI("fi_sendmsg(FI_TRIGGER)", fi_sendmsg(w.a.ep, &msg, FI_TRIGGER), want);
  if (want) return;
  m.seq = s.seq++;
  s.t.push_back(m);
  ++s.active;
  if (s.c[trig].comp >= m.thr) evaluate(s, trig);
}

void op_plain_send(FuzzedDataProvider& in, state& s) {
  if (!readable(s.c[obs_a]) || !readable(s.c[obs_b])) return;
  const int n = in.ConsumeIntegralInRange<int>(1, 4);
  const std::size_t len = in.ConsumeIntegralInRange<std::size_t>(1, msg_max);
  FUZZ_TRACE("%d fi_send A->B of %zu bytes", n, len);
  recvs(s, n);
  for (int k = 0; k < n; ++k) {
    FUZZ_FI("fi_send", fi_send(w.a.ep, w.sbuf, len, nullptr, w.b.addr, &w.sctx[k]), 0);
    --w.posted;
    s.a_entries.insert(&w.sctx[k]);
  }
  m_inc(s, obs_a, static_cast<std::uint64_t>(n));
  m_inc(s, obs_b, static_cast<std::uint64_t>(n));
  s.b_entries += n;
}

void op_cancel(FuzzedDataProvider& in, state& s) {
  const int wi = in.ConsumeIntegralInRange<int>(0, n_works - 1);
  if (in.ConsumeIntegralInRange<int>(0, 3) == 0) {
    FUZZ_TRACE("fi_control(domain, FI_FLUSH_WORK)");
    for (int ti = 0; ti < static_cast<int>(s.t.size()); ++ti) {
      mtrig& m = s.t[ti];
      if (!layer_op(m)) continue;
      if (m.s == st::armed || m.s == st::queued) cancel_one(s, ti);
      if (m.s == st::due) m.s = st::done;
      if (m.s == st::done) finish(s, ti);
    }
    s.ready.clear();
    FUZZ_FI("fi_control(FI_FLUSH_WORK)", fi_control(&w.domain->fid, FI_FLUSH_WORK, nullptr), 0);
    return;
  }
  const bool null_arg = in.ConsumeIntegralInRange<int>(0, 15) == 0;
  FUZZ_TRACE("fi_control(domain, FI_CANCEL_WORK, w%d)", wi);
  long want = -FI_EINVAL;
  if (!null_arg) {
    int found = 0, cancelled = 0;
    for (int ti = 0; ti < static_cast<int>(s.t.size()); ++ti) {
      mtrig& m = s.t[ti];
      if (!layer_op(m) || m.work != wi || m.s == st::finished) continue;
      ++found;
      if (m.s == st::armed || m.s == st::queued) {
        cancel_one(s, ti);
        ++cancelled;
      } else if (m.s == st::due) {
        s.ready.erase(std::find(s.ready.begin(), s.ready.end(), ti));
        m.s = st::done;
        ++cancelled;
      }
      if (m.s == st::done) finish(s, ti);
    }
    want = found == 0 ? -FI_ENOENT : cancelled ? 0 : -FI_EALREADY;
  }
  FUZZ_FI("fi_control(FI_CANCEL_WORK)",
          fi_control(&w.domain->fid, FI_CANCEL_WORK, null_arg ? nullptr : &works[wi]), want);
}

// compcntr's own triggers on the counters behind the layer's (not observers).
void op_arm(FuzzedDataProvider& in, state& s) {
  if (static_cast<int>(s.t.size()) >= max_triggers) return;
  const int i = pick_plain(in, s);
  if (i < 0) return;
  mtrig m;
  m.counter = i;
  m.thr = in.ConsumeBool() ? s.c[i].comp + in.ConsumeIntegralInRange<std::uint64_t>(0, 6) - 2
                           : edgy_u64(in);
  const int ti = static_cast<int>(s.t.size());
  ctxs[ti].index = ti;
  const int how = in.ConsumeIntegralInRange<int>(0, 3);
  errno = 0;
  if (how <= 1) {
    m.k = kind::log;
    m.deferred = how == 1;
    FUZZ_TRACE("trigger_arm c%d thr %llu %s -> t%d", i, (unsigned long long)m.thr,
               m.deferred ? "deferred" : "inline", ti);
    m.t = compcntr_trigger_arm(s.c[i].cc, m.thr, log_action, &ctxs[ti],
                               m.deferred ? COMPCNTR_TRIGGER_DEFERRED : COMPCNTR_TRIGGER_INLINE);
  } else {
    const int tgt = pick_plain(in, s);
    if (tgt < 0) return;
    m.k = how == 2 ? kind::add : kind::set;
    m.target = tgt;
    m.operand = in.ConsumeBool() ? in.ConsumeIntegralInRange<std::uint64_t>(0, 5) : edgy_u64(in);
    FUZZ_TRACE("trigger_arm_%s c%d thr %llu -> c%d %llu -> t%d", how == 2 ? "add" : "set", i,
               (unsigned long long)m.thr, tgt, (unsigned long long)m.operand, ti);
    m.t = how == 2 ? compcntr_trigger_arm_add(s.c[i].cc, m.thr, s.c[tgt].cc, m.operand)
                   : compcntr_trigger_arm_set(s.c[i].cc, m.thr, s.c[tgt].cc, m.operand);
  }
  FUZZ_PTR("trigger_arm", m.t, errno, 0);
  m.seq = s.seq++;
  s.t.push_back(m);
  if (s.c[i].comp >= m.thr) evaluate(s, i);
}

void op_trigger_misc(FuzzedDataProvider& in, state& s) {
  if (s.t.empty()) return;
  const int ti = in.ConsumeIntegralInRange<int>(0, static_cast<int>(s.t.size()) - 1);
  mtrig& m = s.t[ti];
  if (layer_op(m) || !m.live) {
    // compcntr_trigger_flush of a counter: every trigger on it, the layer's included.
    const int i = pick_plain(in, s);
    if (i < 0) return;
    FUZZ_TRACE("trigger_flush c%d", i);
    const int want = cancel_all(s, i);
    FUZZ_EQ(compcntr_trigger_flush(s.c[i].cc), want, "flushed count");
    return;
  }
  const bool destroy = in.ConsumeBool();
  FUZZ_TRACE("trigger_%s t%d", destroy ? "destroy" : "cancel", ti);
  int want = destroy ? 0 : EALREADY;
  if (m.s == st::armed || m.s == st::queued) {
    cancel_one(s, ti);
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
  FUZZ_TRACE("end of input: FI_FLUSH_WORK, settle, endpoints, triggers, counters");
  for (int ti = 0; ti < static_cast<int>(s.t.size()); ++ti) {
    mtrig& m = s.t[ti];
    if (!layer_op(m)) continue;
    if (m.s == st::armed || m.s == st::queued) cancel_one(s, ti);
    if (m.s == st::due) m.s = st::done;
    if (m.s == st::done) finish(s, ti);
  }
  s.ready.clear();
  FUZZ_FI("fi_control(FI_FLUSH_WORK)", fi_control(&w.domain->fid, FI_FLUSH_WORK, nullptr), 0);
  for (int e = 0; e < max_eps; ++e) {
    mep& E = s.ep[e];
    if (!E.live) continue;
    FUZZ_FI("fi_close(ep)", fi_close(&E.ep->fid), 0);
    for (int c : E.bound)
      if (c >= 0) {
        --s.c[c].refs;
        if (!E.enabled) --s.c[c].unenabled;
      }
    if (E.cq) FUZZ_FI("fi_close(cq)", fi_close(&E.cq->fid), 0), E.cq = nullptr;
    E.live = false;
  }
  settle(s);
  FUZZ_EQ(s.active, 0, "the layer's operations all finished");
  for (std::size_t ti = 0; ti < s.t.size(); ++ti) {
    mtrig& m = s.t[ti];
    if (layer_op(m) || !m.live) continue;
    if (m.s == st::armed || m.s == st::queued) cancel_one(s, static_cast<int>(ti));
    FUZZ_RC("trigger_destroy", compcntr_trigger_destroy(m.t), 0);
    m.live = false;
  }
  for (int i = 0; i < max_counters; ++i) {
    mcounter& m = s.c[i];
    if (m.live) FUZZ_FI("fi_close(counter)", fi_close(&m.c->fid), 0);
    m.live = false;
  }
  check(s);
  recvs(s, 0); // the receives the fired sends took
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
  // Only the layer on the provider path (the hook is not loaded), before libfabric initialises.
  setenv("FI_PROVIDER_PATH", FUZZ_OFI_DIR, 1);
  unsetenv("FI_HOOK");
  unsetenv("COMPCNTR_FI_PROGRESS_THREAD");
  unsetenv("COMPCNTR_FI_WAIT_SPIN_US");
  w.open("shm;ofi_compcntr", FI_TRIGGER, true);
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
    m.live = true;
    m.wait_obj = FI_WAIT_UNSPEC;
    m.refs = 1;
    m.cc = compcntr_fi_cntr_comp_cntr(m.c);
  }
  for (int steps = 0; steps < 200 && in.remaining_bytes() > 0; ++steps) {
    switch (in.ConsumeIntegralInRange<int>(0, 17)) {
      case 0: op_open(in, s); break;
      case 1:
      case 2:
      case 3: op_update(in, s); break;
      case 4: op_read(in, s); break;
      case 5: op_wait(in, s); break;
      case 6: op_control(in, s); break;
      case 7: op_close(in, s); break;
      case 8: op_ep(in, s); break;
      case 9:
      case 10:
      case 11: op_queue(in, s); break;
      case 12: op_trigger_send(in, s); break;
      case 13: op_plain_send(in, s); break;
      case 14: op_cancel(in, s); break;
      case 15: op_arm(in, s); break;
      default: op_trigger_misc(in, s); break;
    }
    check(s);
  }
  teardown(s);
  return 0;
}
