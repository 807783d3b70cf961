// Fuzz harness: completion tracking (tracker.h) against a reference model of semantics.md
// section 7 ("Completion tracker") and c-api.md: create (WRS only, baseline = the counter's
// values then), issue (at most a quarter of the range per call), issued/completed, quiet and
// quiet_ex with timeout 0 (EIO once per growth of the error count), the counter held (destroy
// EBUSY) until the tracker goes. Built only once <compcntr/tracker.h> exists (tests/fuzz/meson.build).
//
// Model per tracker: baseline, issued (mod 2^64), the error value at the last quiet that said EIO.
// The counter is only incremented (completions and errors) here, so "grew" is unambiguous; the
// model keeps issued - completed below 2^62 (the spec's arithmetic holds below half the range).
#include "fuzz_common.hpp"

#include <compcntr/tracker.h>

namespace {

using fuzz::edgy_u64;

fuzz::shared_device device;
constexpr std::uint64_t quarter = std::uint64_t{1} << 62;

struct model_counter {
  compcntr_comp_cntr* cc;
  bool bytes;
  std::uint64_t comp = 0, err = 0;
  int trackers = 0; // live trackers over it
};

struct model_tracker {
  compcntr_tracker* t;
  int counter;
  std::uint64_t baseline, issued = 0, err_mark;
  bool live = true;
};

struct state {
  std::vector<model_counter> c;
  std::vector<bool> c_live;
  std::vector<model_tracker> t;
};

std::uint64_t completed(const state& s, const model_tracker& t) {
  const model_counter& c = s.c[static_cast<std::size_t>(t.counter)];
  return c.comp + c.err - t.baseline;
}

int pick_counter(FuzzedDataProvider& in, const state& s) {
  if (s.c.empty() || in.ConsumeIntegralInRange<int>(0, 31) == 0) return -1;
  const int i = in.ConsumeIntegralInRange<int>(0, static_cast<int>(s.c.size()) - 1);
  return s.c_live[static_cast<std::size_t>(i)] ? i : -1;
}

int pick_tracker(FuzzedDataProvider& in, const state& s) {
  if (s.t.empty() || in.ConsumeIntegralInRange<int>(0, 31) == 0) return -1;
  const int i = in.ConsumeIntegralInRange<int>(0, static_cast<int>(s.t.size()) - 1);
  return s.t[static_cast<std::size_t>(i)].live ? i : -1;
}

void check(const state& s) {
  for (const auto& t : s.t) {
    if (!t.live) continue;
    FUZZ_EQ(compcntr_tracker_issued(t.t), t.issued, "tracker_issued");
    FUZZ_EQ(compcntr_tracker_completed(t.t), completed(s, t), "tracker_completed");
  }
}

void op_counter(FuzzedDataProvider& in, state& s) {
  const int kind = in.ConsumeIntegralInRange<int>(0, 3);
  if (kind == 0) {
    if (s.c.size() >= 12) return;
    const bool bytes = in.ConsumeIntegralInRange<int>(0, 7) == 0;
    compcntr_comp_cntr_init_attr a{};
    a.type = bytes ? COMPCNTR_COMP_CNTR_TYPE_BYTES : COMPCNTR_COMP_CNTR_TYPE_WRS;
    const std::uint32_t stripes = fuzz::maybe_striped(in, a);
    FUZZ_TRACE("c%zu = create_comp_cntr(%s, stripes %u)", s.c.size(), bytes ? "BYTES" : "WRS",
               stripes);
    errno = 0;
    compcntr_comp_cntr* cc = compcntr_create_comp_cntr(device.dev, &a);
    FUZZ_PTR("create_comp_cntr", cc, errno, 0);
    s.c.push_back(model_counter{cc, bytes});
    s.c_live.push_back(true);
    return;
  }
  const int i = pick_counter(in, s);
  if (i < 0) return;
  model_counter& c = s.c[static_cast<std::size_t>(i)];
  if (kind == 1) {
    FUZZ_TRACE("destroy_comp_cntr(c%d) with %d tracker(s)", i, c.trackers);
    FUZZ_RC("destroy_comp_cntr", compcntr_destroy_comp_cntr(c.cc), c.trackers ? EBUSY : 0);
    if (!c.trackers) s.c_live[static_cast<std::size_t>(i)] = false;
    return;
  }
  // Completions and errors arrive: small steps mostly, now and then a jump (still far below
  // the wrap: the model's arithmetic is the spec's, valid below half the range).
  const std::uint64_t v = in.ConsumeIntegralInRange<int>(0, 15) == 0
                              ? in.ConsumeIntegralInRange<std::uint64_t>(0, quarter / 4)
                              : in.ConsumeIntegralInRange<std::uint64_t>(0, 4);
  if (kind == 2) {
    FUZZ_TRACE("inc_comp_cntr(c%d, %" PRIu64 ")", i, v);
    FUZZ_RC("inc_comp_cntr", compcntr_inc_comp_cntr(c.cc, v), 0);
    c.comp += v;
  } else {
    FUZZ_TRACE("inc_err_comp_cntr(c%d, %" PRIu64 ")", i, v);
    FUZZ_RC("inc_err_comp_cntr", compcntr_inc_err_comp_cntr(c.cc, v), 0);
    c.err += v;
  }
}

void op_create(FuzzedDataProvider& in, state& s) {
  if (s.t.size() >= 16) return;
  const int ci = pick_counter(in, s);
  FUZZ_TRACE("t%zu = tracker_create(c%d)", s.t.size(), ci);
  const int want = ci < 0 || s.c[static_cast<std::size_t>(ci)].bytes ? EINVAL : 0;
  errno = 0;
  compcntr_tracker* t =
      compcntr_tracker_create(ci >= 0 ? s.c[static_cast<std::size_t>(ci)].cc : nullptr);
  FUZZ_PTR("tracker_create", t, errno, want);
  if (!t) return;
  model_counter& c = s.c[static_cast<std::size_t>(ci)];
  ++c.trackers;
  s.t.push_back(model_tracker{t, ci, c.comp + c.err, 0, c.err});
}

void op_issue(FuzzedDataProvider& in, state& s) {
  const int ti = pick_tracker(in, s);
  std::uint64_t n;
  switch (in.ConsumeIntegralInRange<int>(0, 5)) {
    case 0: n = quarter + in.ConsumeIntegralInRange<int>(-1, 1); break;
    case 1: n = edgy_u64(in); break;
    default: n = in.ConsumeIntegralInRange<std::uint64_t>(0, 6); break;
  }
  FUZZ_TRACE("tracker_issue(t%d, %" PRIu64 ")", ti, n);
  if (ti < 0) {
    FUZZ_RC("tracker_issue", compcntr_tracker_issue(nullptr, n), EINVAL);
    return;
  }
  model_tracker& t = s.t[static_cast<std::size_t>(ti)];
  if (n > quarter) {
    FUZZ_RC("tracker_issue above a quarter of the range", compcntr_tracker_issue(t.t, n), EINVAL);
    return;
  }
  // Keep issued - completed below 2^62 (see the file comment): such a call is not made.
  const std::uint64_t rem = t.issued - completed(s, t);
  if (rem <= quarter && rem + n > quarter) return;
  FUZZ_RC("tracker_issue", compcntr_tracker_issue(t.t, n), 0);
  t.issued += n;
}

void op_quiet(FuzzedDataProvider& in, state& s) {
  const int ti = pick_tracker(in, s);
  const int form = in.ConsumeIntegralInRange<int>(0, 2);
  compcntr_wait_attr a{};
  bool attr_ok = true;
  if (form == 2) {
    a.comp_mask = in.ConsumeIntegralInRange<int>(0, 7) == 0
                      ? in.ConsumeIntegral<std::uint32_t>()
                      : in.ConsumeIntegralInRange<std::uint32_t>(0, 3);
    a.spin_ns = in.ConsumeIntegralInRange<std::int64_t>(-2, 2000);
    a.progress_interval_us = in.ConsumeIntegralInRange<std::uint32_t>(0, 2);
    attr_ok =
        (a.comp_mask & ~3u) == 0 && !((a.comp_mask & COMPCNTR_WAIT_ATTR_SPIN) && a.spin_ns < 0) &&
        !((a.comp_mask & COMPCNTR_WAIT_ATTR_PROGRESS_INTERVAL) && a.progress_interval_us == 0);
  }
  FUZZ_TRACE("tracker_quiet%s(t%d, 0)", form ? "_ex" : "", ti);
  compcntr_tracker* tt = ti >= 0 ? s.t[static_cast<std::size_t>(ti)].t : nullptr;
  const int r = form == 0 ? compcntr_tracker_quiet(tt, 0)
                          : compcntr_tracker_quiet_ex(tt, 0, form == 1 ? nullptr : &a);
  if (ti < 0 || !attr_ok) {
    FUZZ_RC("tracker_quiet", r, EINVAL);
    return;
  }
  model_tracker& t = s.t[static_cast<std::size_t>(ti)];
  const std::uint64_t rem = t.issued - completed(s, t);
  const bool done = rem == 0 || rem > (UINT64_MAX >> 1); // accounted for, or completed past it
  int want = ETIMEDOUT;
  if (done) {
    const std::uint64_t err = s.c[static_cast<std::size_t>(t.counter)].err;
    want = err != t.err_mark ? EIO : 0;
    t.err_mark = err;
  }
  FUZZ_RC("tracker_quiet", r, want);
}

void op_destroy(FuzzedDataProvider& in, state& s) {
  const int ti = pick_tracker(in, s);
  FUZZ_TRACE("tracker_destroy(t%d)", ti);
  FUZZ_RC("tracker_destroy",
          compcntr_tracker_destroy(ti >= 0 ? s.t[static_cast<std::size_t>(ti)].t : nullptr),
          ti >= 0 ? 0 : EINVAL);
  if (ti < 0) {
    errno = 0;
    FUZZ_EQ(compcntr_tracker_issued(nullptr), 0u, "tracker_issued(NULL)");
    FUZZ_EQ(errno, EINVAL, "tracker_issued(NULL) sets errno");
    errno = 0;
    FUZZ_EQ(compcntr_tracker_completed(nullptr), 0u, "tracker_completed(NULL)");
    FUZZ_EQ(errno, EINVAL, "tracker_completed(NULL) sets errno");
    return;
  }
  model_tracker& t = s.t[static_cast<std::size_t>(ti)];
  t.live = false;
  --s.c[static_cast<std::size_t>(t.counter)].trackers;
}

} // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (!device.dev) device.open(nullptr);
  fuzz::trace::get().clear();
  FuzzedDataProvider in(data, size);
  state s;
  for (int steps = 0; steps < 300 && in.remaining_bytes() > 0; ++steps) {
    switch (in.ConsumeIntegralInRange<int>(0, 11)) {
      case 0:
      case 1: op_create(in, s); break;
      case 2:
      case 3:
      case 4: op_issue(in, s); break;
      case 5:
      case 6:
      case 7: op_quiet(in, s); break;
      case 8: op_destroy(in, s); break;
      default: op_counter(in, s); break;
    }
    check(s);
  }
  FUZZ_TRACE("end of input: destroy everything");
  for (auto& t : s.t)
    if (t.live) FUZZ_RC("tracker_destroy", compcntr_tracker_destroy(t.t), 0);
  for (std::size_t i = 0; i < s.c.size(); ++i)
    if (s.c_live[i]) FUZZ_RC("destroy_comp_cntr", compcntr_destroy_comp_cntr(s.c[i].cc), 0);
  return 0;
}
