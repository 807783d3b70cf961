// ofi_compcntr's CQs. The provider's CQ is opened with FI_CQ_FORMAT_TAGGED (every field) and
// the application's reads are served from it in the application's format (each format is a
// prefix of the tagged entry), with the layer's own entries taken out:
//   * at a target where the layer emulates FI_RMA_EVENT, the remote-CQ-data entries of the
//     writes it sent with k_rma_event_data (ep.cpp);
//   * the completions of deferred work posted with a completion counter (trigger.cpp): the
//     item is their context; the counter is counted and the entry goes on with the
//     application's context if the application would have had one.
// Error entries of operations the provider refused when a trigger posted them are the layer's
// own (cq_push_error). Entries read by progress (cq_drain) wait in the CQ's queue for the
// application's next read.
#include "ofi.hpp"

#include <rdma/fi_errno.h>
#include <rdma/providers/fi_log.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <new>
#include <unordered_set>

#include <sched.h>

namespace compcntr_ofi {

namespace {
// A queue whose room is reserved before the provider is read, so that an entry taken from the
// provider is never dropped for want of memory: reserve fails first, with nothing read. A
// reservation outlives the lock (the layer's sread reserves, reads the provider unlocked,
// then pushes): other pushers' reservations count against the same capacity.
template <class T>
class fifo {
 public:
  bool empty() const noexcept { return n_ == 0; }
  T& front() noexcept { return v_[head_]; }
  void pop_front() noexcept {
    v_[head_] = T{}; // an error's data goes now, not when the slot is reused
    head_ = (head_ + 1) % v_.size();
    --n_;
  }
  // Room for `k` more push_back calls that do not allocate; false (and nothing changed) when
  // memory is short.
  bool reserve(std::size_t k) noexcept {
    if (n_ + reserved_ + k > v_.size()) {
      try {
        // 16: one batch of the provider's reads; doubling keeps pushes amortised O(1)
        std::vector<T> w(std::max<std::size_t>({2 * v_.size(), n_ + reserved_ + k, 16}));
        for (std::size_t i = 0; i < n_; ++i) w[i] = std::move(v_[(head_ + i) % v_.size()]);
        v_.swap(w);
        head_ = 0;
      } catch (...) {
        return false;
      }
    }
    reserved_ += k;
    return true;
  }
  // Uses one reserved place.
  void push_back(T x) noexcept {
    v_[(head_ + n_) % v_.size()] = std::move(x);
    ++n_;
    --reserved_;
  }
  // Gives back `k` reserved places that were not used.
  void unreserve(std::size_t k) noexcept { reserved_ -= k; }

 private:
  std::vector<T> v_;
  std::size_t head_ = 0;
  std::size_t n_ = 0;
  std::size_t reserved_ = 0;
};
} // namespace

struct cq_st {
  fid_cq* cq = nullptr;
  std::size_t app_size = sizeof(fi_cq_entry); // the application's entry size
  domain_st* dom = nullptr;
  struct entry {
    fi_cq_tagged_entry e;
    fi_addr_t src;
  };
  struct error {
    fi_cq_err_entry e;
    std::vector<std::uint8_t> data;
  };
  fifo<entry> q;   // room for a batch is reserved before each read of the provider
  fifo<error> errs; // room for one before each fi_cq_readerr of the provider's
  std::vector<std::uint8_t> err_data; // what the last fi_cq_readerr handed out
  // fi_cq_signal's wake-up, kept by the layer: the provider's sread returns -FI_EAGAIN both
  // for a signal and for the end of a slice, so the layer's sread cannot tell them apart.
  std::atomic<bool> signalled{false};
  // The provider waits by yielding (shm's choice for FI_WAIT_UNSPEC): util's yield wait
  // ignores the timeout (v1.17.0 util_wait_yield_run returns only on a signal or an entry),
  // so the layer's sread yields itself between reads instead of calling the provider's.
  bool yield_wait = false;
};

namespace {

struct cq_tables { // same prefix as compcntr_hook::patched<fi_ops_cq>
  fi_ops_cq ops;
  const fi_ops_cq* orig;
  cq_st* st;
};
struct cq_fid_tables {
  fi_ops ops;
  const fi_ops* orig;
  cq_st* st;
};

std::unordered_set<void*>& inflight() noexcept {
  static auto* s = new std::unordered_set<void*>;
  return *s;
}
std::unordered_set<cq_st*>& cqs() noexcept {
  static auto* s = new std::unordered_set<cq_st*>;
  return *s;
}

cq_st* st_of(fid_cq* cq) noexcept { return reinterpret_cast<cq_tables*>(cq->ops)->st; }
const fi_ops_cq* orig_cq(fid_cq* cq) noexcept {
  return reinterpret_cast<cq_tables*>(cq->ops)->orig;
}

std::size_t entry_size(int format) noexcept {
  switch (format) {
    case FI_CQ_FORMAT_MSG: return sizeof(fi_cq_msg_entry);
    case FI_CQ_FORMAT_DATA: return sizeof(fi_cq_data_entry);
    case FI_CQ_FORMAT_TAGGED: return sizeof(fi_cq_tagged_entry);
    default: // FI_CQ_FORMAT_CONTEXT, and FI_CQ_FORMAT_UNSPEC (util's choice)
      return sizeof(fi_cq_entry);
  }
}

// Whether an entry the provider reported goes on to the application (under mu()).
bool keep(cq_st* s, fi_cq_tagged_entry& e, bool error) noexcept {
  if (!error && s->dom && s->dom->emulate_rma_event && (e.flags & FI_REMOTE_CQ_DATA) &&
      (e.flags & FI_REMOTE_WRITE) && is_rma_event_data(e.data) && e.op_context == nullptr) {
    remote_write_seen(s->dom, e.data);
    return false;
  }
  // A read the layer follows (rma_event.cpp): its own context back; a deferred read's is an item
  bool read_wants = true;
  const bool read = e.op_context != nullptr && s->dom && s->dom->emulate_rma_event &&
                    read_completed(e, error, &read_wants);
  if (e.op_context != nullptr && inflight().erase(e.op_context)) {
    bool wants = true;
    e.op_context = item_completed(static_cast<item*>(e.op_context), error, &wants);
    return wants;
  }
  return read ? read_wants : true;
}

// Reads one error entry from the provider into the CQ's error queue (under mu()).
// Without memory for the queue the provider is not read (false: the entry stays there); the
// provider's error data, when it cannot be copied, is left out (err_data_size 0), the entry
// is kept.
bool pull_error(cq_st* s) noexcept {
  if (!s->errs.reserve(1)) return false;
  fi_cq_err_entry ee{};
  const ssize_t r = orig_cq(s->cq)->readerr(s->cq, &ee, 0);
  if (r <= 0) {
    s->errs.unreserve(1);
    return false;
  }
  cq_st::error er{ee, {}};
  try {
    if (ee.err_data && ee.err_data_size)
      er.data.assign(static_cast<std::uint8_t*>(ee.err_data),
                     static_cast<std::uint8_t*>(ee.err_data) + ee.err_data_size);
  } catch (...) {
    er.e.err_data_size = 0;
  }
  er.e.err_data = nullptr;
  fi_cq_tagged_entry t{ee.op_context, ee.flags, ee.len, ee.buf, ee.data, ee.tag};
  keep(s, t, true);
  er.e.op_context = t.op_context;
  s->errs.push_back(std::move(er));
  return true;
}

// Pushes the entries of tmp[0..n) that go on to the application into `reserved` places made
// for them in the CQ's queue and gives back the rest (under mu()).
void queue_kept(cq_st* s, fi_cq_tagged_entry* tmp, const fi_addr_t* srcs, ssize_t n,
                std::size_t reserved) noexcept {
  std::size_t used = 0;
  for (ssize_t i = 0; i < n; ++i)
    if (keep(s, tmp[i], false)) {
      s->q.push_back({tmp[i], srcs[i]});
      ++used;
    }
  s->q.unreserve(reserved - used);
}

// One read of up to 16 of the provider's entries into the CQ's queue, in room reserved first
// (under mu()): -FI_ENOMEM when there is none (nothing read), else what the provider's read
// returned.
ssize_t fill_queue(cq_st* s) noexcept {
  if (!s->q.reserve(16)) return -FI_ENOMEM;
  fi_cq_tagged_entry tmp[16];
  fi_addr_t srcs[16];
  const ssize_t r = orig_cq(s->cq)->readfrom(s->cq, tmp, 16, srcs);
  queue_kept(s, tmp, srcs, r, 16);
  return r;
}

// Up to `count` entries into buf (and src); the provider read while the CQ's queue runs dry.
// count 0 is a peek (util's fi_poll reads a CQ so): 0 when an entry for the application is
// ready, -FI_EAVAIL for an error entry, -FI_EAGAIN for none; the provider's entries read to
// find out wait in the CQ's queue (the layer's own are taken out as for a read).
ssize_t take_entries(cq_st* s, void* buf, std::size_t count, fi_addr_t* src) noexcept {
  progress(); // the application's CQ read drives the layer's deferred work
  in_layer g;
  std::lock_guard lk(mu());
  if (!s->errs.empty()) return -FI_EAVAIL;
  if (count == 0) {
    while (s->q.empty()) {
      const ssize_t r = fill_queue(s); // -FI_ENOMEM: the provider's entries stay there
      if (r == -FI_EAVAIL) {
        pull_error(s); // or the application's fi_cq_readerr reads it
        return -FI_EAVAIL;
      }
      if (r <= 0) return r == 0 ? -FI_EAGAIN : r;
    }
    return 0;
  }
  auto* out = static_cast<std::uint8_t*>(buf);
  std::size_t n = 0;
  while (n < count && !s->q.empty()) {
    std::memcpy(out + n * s->app_size, &s->q.front().e, s->app_size);
    if (src) src[n] = s->q.front().src;
    s->q.pop_front();
    ++n;
  }
  const fi_ops_cq* o = orig_cq(s->cq);
  while (n < count) {
    fi_cq_tagged_entry tmp[16];
    fi_addr_t srcs[16];
    const std::size_t want = std::min<std::size_t>(16, count - n);
    // readfrom always: util's read is a call of fi_cq_readfrom through the table (ours)
    const ssize_t r = o->readfrom(s->cq, tmp, want, srcs);
    if (r == -FI_EAVAIL && n == 0 && pull_error(s)) return -FI_EAVAIL;
    if (r <= 0) {
      if (n == 0) return r;
      break;
    }
    for (ssize_t i = 0; i < r; ++i)
      if (keep(s, tmp[i], false)) {
        std::memcpy(out + n * s->app_size, &tmp[i], s->app_size);
        if (src) src[n] = srcs[i];
        ++n;
      }
    if (static_cast<std::size_t>(r) < want) break;
  }
  return n ? static_cast<ssize_t>(n) : -FI_EAGAIN;
}
ssize_t take(cq_st* s, void* buf, std::size_t count, fi_addr_t* src) noexcept {
  const ssize_t r = take_entries(s, buf, count, src);
  if (s->dom && s->dom->emulate_rma_event) rma_post_due(); // reads this call completed
  return r;
}

ssize_t cq_read(fid_cq* cq, void* buf, size_t count) {
  return take(st_of(cq), buf, count, nullptr);
}
ssize_t cq_readfrom(fid_cq* cq, void* buf, size_t count, fi_addr_t* src) {
  return take(st_of(cq), buf, count, src);
}

ssize_t cq_readerr(fid_cq* cq, fi_cq_err_entry* buf, std::uint64_t) {
  if (buf == nullptr) return -FI_EINVAL;
  cq_st* s = st_of(cq);
  progress();
  in_layer g;
  std::lock_guard lk(mu());
  if (s->errs.empty() && !pull_error(s)) return -FI_EAGAIN;
  cq_st::error& er = s->errs.front();
  void* app_data = buf->err_data;
  const std::size_t app_data_size = buf->err_data_size;
  *buf = er.e;
  if (app_data != nullptr && app_data_size > 0) { // the application's buffer (API >= 1.5)
    const std::size_t n = std::min(app_data_size, er.data.size());
    if (n) std::memcpy(app_data, er.data.data(), n);
    buf->err_data = app_data;
    buf->err_data_size = n;
  } else {
    s->err_data = std::move(er.data);
    buf->err_data = s->err_data.empty() ? nullptr : s->err_data.data();
    buf->err_data_size = s->err_data.size();
  }
  s->errs.pop_front();
  return 1;
}

// Blocking reads: the provider's wait in slices, progress and the CQ's queue between them (a
// due triggered operation is posted by the waiting thread, as a counter wait posts it). As
// fi_cq(3) and util's sread: -FI_EAGAIN when the timeout passes or fi_cq_signal was called
// (before or during the read) with nothing to read.
ssize_t sread_common(fid_cq* cq, void* buf, size_t count, fi_addr_t* src, const void* cond,
                     int timeout) {
  using clock = std::chrono::steady_clock;
  const auto deadline = clock::now() + std::chrono::milliseconds(timeout < 0 ? 0 : timeout);
  cq_st* s = st_of(cq);
  for (;;) {
    const ssize_t r = take(s, buf, count, src);
    if (r != -FI_EAGAIN) return r;
    if (s->signalled.exchange(false)) return -FI_EAGAIN;
    int slice = 10;
    if (timeout >= 0) {
      const auto left =
          std::chrono::ceil<std::chrono::milliseconds>(deadline - clock::now()).count();
      if (left <= 0) return -FI_EAGAIN;
      slice = static_cast<int>(std::min<long long>(left, 10));
    }
    if (s->yield_wait) {
      sched_yield();
      continue;
    }
    // the provider's blocking read for one slice; what it returns is filtered into the queue
    fi_cq_tagged_entry tmp[16];
    fi_addr_t srcs[16];
    const std::size_t want = std::min<std::size_t>(16, count);
    const fi_ops_cq* o = orig_cq(cq);
    {
      in_layer g;
      std::lock_guard lk(mu());
      if (!s->q.reserve(want)) return -FI_ENOMEM; // nothing read from the provider
    }
    // sreadfrom always: util's sread is a call of fi_cq_sreadfrom through the table (ours)
    const ssize_t got = o->sreadfrom(cq, tmp, want, srcs, cond, slice);
    {
      in_layer g;
      std::lock_guard lk(mu());
      queue_kept(s, tmp, srcs, got, want);
    }
    if (got <= 0 && got != -FI_EAGAIN && got != -FI_ETIMEDOUT && got != -FI_EAVAIL)
      return got; // a CQ without a wait object (-FI_ENOSYS), or another failure
  }
}
// The layer's flag first: a reader woken by the provider's signal then finds it set.
int cq_signal(fid_cq* cq) {
  cq_st* s = st_of(cq);
  s->signalled.store(true);
  const int r = orig_cq(cq)->signal(cq);
  if (r != 0) s->signalled.store(false); // e.g. -FI_ENOSYS: a CQ without a wait object
  return r;
}

ssize_t cq_sread(fid_cq* cq, void* buf, size_t count, const void* cond, int timeout) {
  return sread_common(cq, buf, count, nullptr, cond, timeout);
}
ssize_t cq_sreadfrom(fid_cq* cq, void* buf, size_t count, fi_addr_t* src, const void* cond,
                     int timeout) {
  return sread_common(cq, buf, count, src, cond, timeout);
}

int cq_close(fid* f) {
  auto* cq = reinterpret_cast<fid_cq*>(f);
  auto* ft = reinterpret_cast<cq_fid_tables*>(f->ops);
  auto* t = reinterpret_cast<cq_tables*>(cq->ops);
  cq_st* s = ft->st;
  const fi_ops* orig_fid = ft->orig;
  // the provider's close sees its own tables (a refused close restores ours)
  f->ops = const_cast<fi_ops*>(orig_fid);
  cq->ops = const_cast<fi_ops_cq*>(t->orig);
  const int r = orig_fid->close(f);
  if (r != 0) {
    f->ops = &ft->ops;
    cq->ops = &t->ops;
    return r;
  }
  std::lock_guard lk(mu());
  rma_cq_closed(cq); // no entry of a followed read can come any more
  cqs().erase(s);
  delete s;
  delete t;
  delete ft;
  return 0;
}

} // namespace

int cq_open(fid_domain* d, fi_cq_attr* attr, fid_cq** cq, void* context,
            const fi_ops_domain* orig) {
  if (attr == nullptr || cq == nullptr) return orig->cq_open(d, attr, cq, context);
  domain_st* ds = find_domain(d);
  fi_cq_attr a = *attr;
  a.format = FI_CQ_FORMAT_TAGGED;
  auto* s = new (std::nothrow) cq_st;
  auto* t = new (std::nothrow) cq_tables;
  auto* ft = new (std::nothrow) cq_fid_tables;
  if (ds == nullptr || s == nullptr || t == nullptr || ft == nullptr) {
    delete s;
    delete t;
    delete ft;
    return ds ? -FI_ENOMEM : orig->cq_open(d, attr, cq, context);
  }
  const int r = orig->cq_open(d, &a, cq, context);
  if (r != 0) {
    delete s;
    delete t;
    delete ft;
    return r;
  }
  s->cq = *cq;
  s->yield_wait = a.wait_obj == FI_WAIT_YIELD; // asked for, or the provider's choice (shm)
  s->app_size = entry_size(attr->format);
  s->dom = ds;
  std::memset(&t->ops, 0, sizeof t->ops);
  std::memcpy(&t->ops, (*cq)->ops, std::min(sizeof t->ops, (*cq)->ops->size));
  t->orig = (*cq)->ops;
  t->st = s;
  t->ops.read = cq_read;
  t->ops.readfrom = cq_readfrom;
  t->ops.readerr = cq_readerr;
  t->ops.sread = cq_sread;
  t->ops.sreadfrom = cq_sreadfrom;
  t->ops.signal = cq_signal;
  std::memset(&ft->ops, 0, sizeof ft->ops);
  std::memcpy(&ft->ops, (*cq)->fid.ops, std::min(sizeof ft->ops, (*cq)->fid.ops->size));
  ft->orig = (*cq)->fid.ops;
  ft->st = s;
  ft->ops.close = cq_close;
  {
    std::lock_guard lk(mu());
    try {
      cqs().insert(s);
    } catch (...) {
    }
  }
  (*cq)->ops = &t->ops;
  (*cq)->fid.ops = &ft->ops;
  return 0;
}

namespace {
cq_st* find_cq(fid_cq* cq) noexcept { // under mu()
  for (cq_st* s : cqs())
    if (s->cq == cq) return s;
  return nullptr;
}
} // namespace

void cq_drain(fid_cq* cq) noexcept {
  std::lock_guard lk(mu());
  cq_st* s = find_cq(cq);
  if (s == nullptr) return;
  for (;;) {
    const ssize_t r = fill_queue(s); // -FI_ENOMEM: the provider keeps them for a later read
    if (r == -FI_EAVAIL) {
      pull_error(s);
      return;
    }
    if (r < 16) return;
  }
}

bool cq_reserve_error(fid_cq* cq) noexcept {
  std::lock_guard lk(mu());
  cq_st* s = find_cq(cq);
  return s == nullptr || s->errs.reserve(1);
}

void cq_unreserve_error(fid_cq* cq) noexcept {
  std::lock_guard lk(mu());
  if (cq_st* s = find_cq(cq)) s->errs.unreserve(1);
}

void cq_push_error(fid_cq* cq, void* context, std::uint64_t flags, int err) noexcept {
  std::lock_guard lk(mu());
  if (cq_st* s = find_cq(cq)) {
    cq_st::error er{};
    er.e.op_context = context;
    er.e.flags = flags;
    er.e.err = err;
    er.e.prov_errno = -err;
    s->errs.push_back(std::move(er));
  }
}

bool inflight_add(item* it) noexcept {
  std::lock_guard lk(mu());
  try {
    inflight().insert(it);
  } catch (...) {
    return false;
  }
  return true;
}
void inflight_remove(item* it) noexcept {
  std::lock_guard lk(mu());
  inflight().erase(it);
}

} // namespace compcntr_ofi
