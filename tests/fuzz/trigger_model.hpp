// The reference model of compcntr's trigger semantics (docs/trigger.md) that the harnesses whose
// inputs arm triggers share: fuzz_trigger (compcntr counters), fuzz_fi_adapter (adapter
// counters), fuzz_fi_hook (the counters behind hook counters) and fuzz_fi_ofi (with the layer's
// operations as deferred actions). Which triggers are due, firing in threshold order (equal
// thresholds in arming order), the trampoline that runs chains iteratively, and cancelling
// every trigger of a counter (destroy, flush).
//
// A harness supplies its own state and trigger record, with these members and free functions
// (found by argument-dependent lookup, so they live beside the record's type):
//   s.t            the trigger records, indexed by trigger number; each has counter, thr, seq
//   s.c[ci]        the model counters: comp (completion value), live, pending
//   s.queue        due deferred triggers, in the order they became due
//   s.stack, s.depth   the trampoline (counters updated inside actions, nesting depth)
//   is_armed(rec), is_deferred(rec), mark_queued(rec), mark_running(rec)
//   model_run(s, ti, status)   runs trigger ti's action in the model (0 or ECANCELED)
// Nothing here knows what an action does: model_run does it (and calls evaluate for a counter
// it changed).
#ifndef COMPCNTR_TESTS_FUZZ_TRIGGER_MODEL_HPP
#define COMPCNTR_TESTS_FUZZ_TRIGGER_MODEL_HPP

#include <compcntr/trigger.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <vector>

namespace fuzz::trig {

/// The trigger record of the harnesses that arm compcntr's own triggers only (fuzz_trigger,
/// fuzz_fi_adapter), with the model's hooks; fuzz_fi_hook and fuzz_fi_ofi have records of
/// their own (no deferred triggers; the layer's operations).
enum class tstate { armed, queued, fired, cancelled };
enum class kind { log, add, set };
struct record {
  compcntr_trigger* t = nullptr;
  bool live = false;  // handle not destroyed
  int counter = 0;    // model index of the triggering counter
  std::uint64_t thr = 0, seq = 0;
  bool deferred = false;
  kind k = kind::log;
  int target = -1;  // add/set: model index of the target counter
  std::uint64_t operand = 0;
  tstate st = tstate::armed;
};
inline bool is_armed(const record& m) { return m.st == tstate::armed; }
inline bool is_deferred(const record& m) { return m.deferred; }
inline void mark_queued(record& m) { m.st = tstate::queued; }
inline void mark_running(record& m) { m.st = tstate::fired; }  // no longer armed

/// Sorts trigger numbers into the order compcntr runs them: threshold, then arming order.
template <class State>
void sort_by_threshold(const State& s, std::vector<int>& v) {
  std::sort(v.begin(), v.end(), [&](int a, int b) {
    return s.t[a].thr != s.t[b].thr ? s.t[a].thr < s.t[b].thr : s.t[a].seq < s.t[b].seq;
  });
}

/// The armed triggers of counter ci, in run order; with `due_only` those at or below its value.
template <class State>
std::vector<int> armed_of(const State& s, int ci, bool due_only) {
  std::vector<int> d;
  for (int i = 0; i < static_cast<int>(s.t.size()); ++i)
    if (s.t[i].counter == ci && is_armed(s.t[i]) && (!due_only || s.t[i].thr <= s.c[ci].comp))
      d.push_back(i);
  sort_by_threshold(s, d);
  return d;
}

template <class State>
std::vector<int> due(const State& s, int ci) {
  return armed_of(s, ci, true);
}

/// Runs (inline) or queues (deferred) what is due on ci, until nothing more is.
template <class State>
void fire(State& s, int ci) {
  for (;;) {
    std::vector<int> inl;
    for (int ti : due(s, ci)) {
      if (is_deferred(s.t[ti])) {
        mark_queued(s.t[ti]);
        s.queue.push_back(ti);
      } else {
        inl.push_back(ti);
        mark_running(s.t[ti]);  // no longer armed
      }
    }
    if (inl.empty()) return;
    for (int ti : inl) model_run(s, ti, 0);
  }
}

/// After counter ci changed: fire it, or, inside an action, put it on the trampoline (only when
/// something is due: the library compares the lowest armed threshold with the value first).
template <class State>
void evaluate(State& s, int ci) {
  if (!s.c[ci].live) return;
  if (s.depth > 0) {
    if (due(s, ci).empty()) return;
    if (!s.c[ci].pending) {
      s.c[ci].pending = true;
      s.stack.push_back(ci);
    }
    return;
  }
  ++s.depth;
  fire(s, ci);
  while (!s.stack.empty()) {
    const int next = s.stack.back();
    s.stack.pop_back();
    s.c[next].pending = false;
    if (s.c[next].live) fire(s, next);
  }
  --s.depth;
}

/// Cancels every trigger of ci not run (destroy, flush): the armed ones in threshold order,
/// then its queued ones in queue order. Returns how many.
template <class State>
int cancel_all(State& s, int ci) {
  int n = 0;
  for (int ti : armed_of(s, ci, false)) model_run(s, ti, ECANCELED), ++n;
  std::vector<int> rest;
  for (int ti : s.queue) {
    if (s.t[ti].counter == ci)
      model_run(s, ti, ECANCELED), ++n;
    else
      rest.push_back(ti);
  }
  s.queue = rest;
  return n;
}

} // namespace fuzz::trig

#endif
