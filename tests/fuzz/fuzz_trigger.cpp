// Fuzz harness: triggered operations (compcntr/trigger.h) against a reference model of
// docs/trigger.md: arm (inline and deferred, thresholds at the 64-bit edges), arm_add / arm_set
// chains (including set() below armed thresholds and wraps), updates, cancel, flush, progress,
// destroying counters with armed triggers (EBUSY while a trigger holds one as its target) and
// destroying triggers.
//
// Model: per counter its completion and error values, per trigger its threshold, mode, arming
// sequence, state (armed, queued, fired, cancelled) and action; the device's deferred queue.
// Firing is modelled single-threaded as docs/trigger.md states it: an update evaluates its
// counter, due triggers go in (threshold, arming order); inline ones run at once, deferred ones
// are queued; an update made inside an action evaluates its counter after the current counter's
// evaluation ends (chains: the library's trampoline, a stack of counters waiting for it).
// Checked after every call: return values, counter values, every trigger's state, and the exact
// sequence of actions run (trigger, status).
#include "fuzz_common.hpp"
#include "trigger_model.hpp"

#include <algorithm>
#include <array>
#include <utility>

namespace {

using fuzz::edgy_u64;

constexpr int max_counters = 6;
constexpr int max_triggers = 48;
fuzz::shared_device device;

using fuzz::trig::kind;
using fuzz::trig::tstate;
using mtrigger = fuzz::trig::record;

struct mcounter {
  compcntr_comp_cntr* cc = nullptr;
  bool live = false;
  std::uint64_t comp = 0, err = 0;
  bool pending = false;  // on the model's trampoline stack
};

struct state {
  std::array<mcounter, max_counters> c;
  std::vector<mtrigger> t;
  std::vector<int> queue;                   // due deferred triggers, in the order they became due
  std::vector<std::pair<int, int>> want;    // the model's sequence of actions run
  std::vector<int> stack;                   // trampoline
  int depth = 0;
  std::uint64_t seq = 0;
};

// What the library ran (the actions' own record).
std::vector<std::pair<int, int>> ran;
struct ctx {
  int index;
};
std::array<ctx, max_triggers> ctxs;
void log_action(void* p, int status) { ran.emplace_back(static_cast<ctx*>(p)->index, status); }

void evaluate(state& s, int ci);

// Runs trigger ti's action in the model (status 0): record, then the counter action's effect.
void model_run(state& s, int ti, int status) {
  mtrigger& m = s.t[ti];
  if (m.k == kind::log) s.want.emplace_back(ti, status);
  m.st = status == 0 ? tstate::fired : tstate::cancelled;
  if (status != 0 || m.k == kind::log) return;
  mcounter& tc = s.c[m.target];
  tc.comp = m.k == kind::add ? tc.comp + m.operand : m.operand;
  evaluate(s, m.target);
}

// The trigger model (tests/fuzz/trigger_model.hpp; its record's hooks are there too).
std::vector<int> due(const state& s, int ci) { return fuzz::trig::due(s, ci); }
void evaluate(state& s, int ci) { fuzz::trig::evaluate(s, ci); }
int cancel_all(state& s, int ci) { return fuzz::trig::cancel_all(s, ci); }

void check(const state& s) {
  FUZZ_EQ(ran.size(), s.want.size(), "number of actions run");
  for (std::size_t i = 0; i < ran.size(); ++i) {
    FUZZ_EQ(ran[i].first, s.want[i].first, "which action ran");
    FUZZ_EQ(ran[i].second, s.want[i].second, "its status");
  }
  for (const mcounter& m : s.c) {
    if (!m.live) continue;
    std::uint64_t v = 0, e = 0;
    FUZZ_RC("read_comp_cntr", compcntr_read_comp_cntr(m.cc, &v), 0);
    FUZZ_RC("read_err_comp_cntr", compcntr_read_err_comp_cntr(m.cc, &e), 0);
    FUZZ_EQ(v, m.comp, "completion value");
    FUZZ_EQ(e, m.err, "error value");
  }
  for (const mtrigger& m : s.t) {
    if (!m.live) continue;
    const int want = m.st == tstate::fired ? 1 : m.st == tstate::cancelled ? 2 : 0;
    FUZZ_EQ(compcntr_trigger_state(m.t), want, "trigger state");
    FUZZ_EQ(compcntr_trigger_threshold(m.t), m.thr, "trigger threshold");
  }
}

int pick_counter(FuzzedDataProvider& in, const state& s) {
  const int i = in.ConsumeIntegralInRange<int>(0, max_counters - 1);
  return s.c[i].live ? i : -1;
}

void op_create(FuzzedDataProvider& in, state& s) {
  const int i = in.ConsumeIntegralInRange<int>(0, max_counters - 1);
  if (s.c[i].live) return;
  compcntr_comp_cntr_init_attr a{};
  fuzz::maybe_striped(in, a);
  FUZZ_TRACE("create_comp_cntr -> c%d (stripes %u)", i, a.stripes);
  errno = 0;
  s.c[i].cc = compcntr_create_comp_cntr(device.dev, &a);
  FUZZ_PTR("create_comp_cntr", s.c[i].cc, errno, 0);
  s.c[i].live = true;
  s.c[i].comp = s.c[i].err = 0;
}

void op_update(FuzzedDataProvider& in, state& s) {
  const int i = pick_counter(in, s);
  if (i < 0) return;
  const std::uint64_t v = edgy_u64(in);
  mcounter& m = s.c[i];
  switch (in.ConsumeIntegralInRange<int>(0, 3)) {
    case 0:
      FUZZ_TRACE("inc c%d %llu", i, (unsigned long long)v);
      FUZZ_RC("inc_comp_cntr", compcntr_inc_comp_cntr(m.cc, v), 0);
      m.comp += v;
      evaluate(s, i);
      break;
    case 1:
      FUZZ_TRACE("set c%d %llu", i, (unsigned long long)v);
      FUZZ_RC("set_comp_cntr", compcntr_set_comp_cntr(m.cc, v), 0);
      m.comp = v;
      evaluate(s, i);
      break;
    case 2:  // errors fire nothing
      FUZZ_TRACE("inc_err c%d %llu", i, (unsigned long long)v);
      FUZZ_RC("inc_err_comp_cntr", compcntr_inc_err_comp_cntr(m.cc, v), 0);
      m.err += v;
      evaluate(s, i);
      break;
    default:
      FUZZ_TRACE("set_err c%d %llu", i, (unsigned long long)v);
      FUZZ_RC("set_err_comp_cntr", compcntr_set_err_comp_cntr(m.cc, v), 0);
      m.err = v;
      evaluate(s, i);
      break;
  }
}

void op_arm(FuzzedDataProvider& in, state& s) {
  if (static_cast<int>(s.t.size()) >= max_triggers) return;
  const int i = pick_counter(in, s);
  if (i < 0) return;
  mtrigger m;
  m.counter = i;
  // Near the counter's value (due or nearly due) or at the edges.
  m.thr = in.ConsumeBool() ? s.c[i].comp + in.ConsumeIntegralInRange<std::uint64_t>(0, 8) - 2
                           : edgy_u64(in);
  const int ti = static_cast<int>(s.t.size());
  const int how = in.ConsumeIntegralInRange<int>(0, 4);
  ctxs[ti].index = ti;
  errno = 0;
  if (how <= 2) {
    m.deferred = how == 2;
    uint32_t flags = m.deferred ? COMPCNTR_TRIGGER_DEFERRED : COMPCNTR_TRIGGER_INLINE;
    int want = 0;
    if (in.ConsumeIntegralInRange<int>(0, 15) == 0) {  // bad flags: EINVAL, nothing armed
      flags = in.ConsumeBool() ? 0u : 3u;
      want = EINVAL;
    }
    FUZZ_TRACE("arm c%d thr %llu flags %u -> t%d", i, (unsigned long long)m.thr, flags, ti);
    m.t = compcntr_trigger_arm(s.c[i].cc, m.thr, log_action, &ctxs[ti], flags);
    FUZZ_PTR("trigger_arm", m.t, errno, want);
    if (want) return;
  } else {
    const int tgt = pick_counter(in, s);
    if (tgt < 0) return;
    m.k = how == 3 ? kind::add : kind::set;
    m.target = tgt;
    m.operand = edgy_u64(in);
    FUZZ_TRACE("arm_%s c%d thr %llu -> c%d %llu -> t%d", how == 3 ? "add" : "set", i,
               (unsigned long long)m.thr, tgt, (unsigned long long)m.operand, ti);
    m.t = how == 3 ? compcntr_trigger_arm_add(s.c[i].cc, m.thr, s.c[tgt].cc, m.operand)
                   : compcntr_trigger_arm_set(s.c[i].cc, m.thr, s.c[tgt].cc, m.operand);
    FUZZ_PTR("trigger_arm_add/set", m.t, errno, 0);
  }
  m.live = true;
  m.seq = s.seq++;
  s.t.push_back(m);
  if (s.c[i].comp >= m.thr) evaluate(s, i);  // already reached: fires at once
}

void op_cancel(FuzzedDataProvider& in, state& s) {
  if (s.t.empty()) return;
  const int ti = in.ConsumeIntegralInRange<int>(0, static_cast<int>(s.t.size()) - 1);
  mtrigger& m = s.t[ti];
  if (!m.live) return;
  FUZZ_TRACE("cancel t%d", ti);
  int want = EALREADY;
  if (m.st == tstate::armed || m.st == tstate::queued) {
    if (m.st == tstate::queued) s.queue.erase(std::find(s.queue.begin(), s.queue.end(), ti));
    model_run(s, ti, ECANCELED);
    want = 0;
  }
  FUZZ_RC("trigger_cancel", compcntr_trigger_cancel(m.t), want);
}

void op_destroy_trigger(FuzzedDataProvider& in, state& s) {
  if (s.t.empty()) return;
  const int ti = in.ConsumeIntegralInRange<int>(0, static_cast<int>(s.t.size()) - 1);
  mtrigger& m = s.t[ti];
  if (!m.live) return;
  FUZZ_TRACE("trigger_destroy t%d", ti);
  if (m.st == tstate::queued) s.queue.erase(std::find(s.queue.begin(), s.queue.end(), ti));
  if (m.st == tstate::armed || m.st == tstate::queued) model_run(s, ti, ECANCELED);
  FUZZ_RC("trigger_destroy", compcntr_trigger_destroy(m.t), 0);
  m.live = false;
}

void op_flush(FuzzedDataProvider& in, state& s) {
  const int i = pick_counter(in, s);
  if (i < 0) return;
  FUZZ_TRACE("flush c%d", i);
  const int want = cancel_all(s, i);
  FUZZ_EQ(compcntr_trigger_flush(s.c[i].cc), want, "flushed count");
}

void op_progress(state& s) {
  FUZZ_TRACE("progress");
  int n = 0;
  // Actions that run may queue more (none here: deferred actions only record), so run the
  // queue as it is.
  std::vector<int> q;
  q.swap(s.queue);
  for (int ti : q) model_run(s, ti, 0), ++n;
  FUZZ_EQ(compcntr_trigger_progress(device.dev), n, "deferred actions run");
}

bool is_target(const state& s, int ci) {
  for (const mtrigger& m : s.t)
    if (m.live && m.target == ci) return true;
  return false;
}

void op_destroy_counter(FuzzedDataProvider& in, state& s) {
  const int i = pick_counter(in, s);
  if (i < 0) return;
  FUZZ_TRACE("destroy_comp_cntr c%d", i);
  if (is_target(s, i)) {
    FUZZ_RC("destroy_comp_cntr (a trigger's target)", compcntr_destroy_comp_cntr(s.c[i].cc), EBUSY);
    return;
  }
  cancel_all(s, i);
  FUZZ_RC("destroy_comp_cntr", compcntr_destroy_comp_cntr(s.c[i].cc), 0);
  s.c[i].live = false;
}

} // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (!device.dev) device.open(nullptr);
  fuzz::trace::get().clear();
  ran.clear();
  FuzzedDataProvider in(data, size);
  state s;
  for (int steps = 0; steps < 300 && in.remaining_bytes() > 0; ++steps) {
    switch (in.ConsumeIntegralInRange<int>(0, 13)) {
      case 0:
      case 1: op_create(in, s); break;
      case 2:
      case 3:
      case 4:
      case 5: op_update(in, s); break;
      case 6:
      case 7:
      case 8: op_arm(in, s); break;
      case 9: op_cancel(in, s); break;
      case 10: op_destroy_trigger(in, s); break;
      case 11: op_flush(in, s); break;
      case 12: op_progress(s); break;
      default: op_destroy_counter(in, s); break;
    }
    check(s);
  }
  FUZZ_TRACE("end of input: destroy every trigger, then every counter");
  for (std::size_t ti = 0; ti < s.t.size(); ++ti) {
    mtrigger& m = s.t[ti];
    if (!m.live) continue;
    if (m.st == tstate::queued) s.queue.erase(std::find(s.queue.begin(), s.queue.end(), ti));
    if (m.st == tstate::armed || m.st == tstate::queued)
      model_run(s, static_cast<int>(ti), ECANCELED);
    FUZZ_RC("trigger_destroy", compcntr_trigger_destroy(m.t), 0);
    m.live = false;
  }
  for (auto& m : s.c) {
    if (m.live) FUZZ_RC("destroy_comp_cntr", compcntr_destroy_comp_cntr(m.cc), 0);
    m.live = false;
  }
  check(s);
  // Every action ran exactly once over the input (fired or cancelled).
  std::vector<int> times(s.t.size(), 0);
  for (auto& r : ran)
    if (r.first >= 0 && r.first < static_cast<int>(times.size())) ++times[r.first];
  for (std::size_t ti = 0; ti < s.t.size(); ++ti)
    if (s.t[ti].k == kind::log) FUZZ_EQ(times[ti], 1, "runs of one action");
  return 0;
}
