// Fuzz harness: software QPs, attach, memory registration and the loopback data path (qp.h),
// against a reference model of semantics.md section 1 ("Attaching") and 3, and docs/qp.md
// (states, attach rules, the completion rules table, flush on error, destroy).
//
// Model: QPs (state, peer, queued receives and sends, which counter serves each op), memory
// regions (range, access, keys; per device), counters (type, values, attachments), and a
// shadow copy of the two data buffers every registration lies in. Checked after every call:
// return values, errno of constructors, every live counter's values, every QP's state, and
// the buffers byte for byte (a copy that should not happen, or a wrong one, is seen at once;
// a copy outside the buffers is an ASan report).
#include "fuzz_common.hpp"

#include <array>
#include <deque>

extern "C" int fuzz_modify_qp_raw(compcntr_qp* qp, std::uint32_t raw);  // raw_enum.c

namespace {

using fuzz::edgy_u64;

constexpr int nops = 6;  // SEND RECV RDMA_READ REMOTE_RDMA_READ RDMA_WRITE REMOTE_RDMA_WRITE
enum op_bit { SEND = 0, RECV = 1, RREAD = 2, REMOTE_RREAD = 3, RWRITE = 4, REMOTE_RWRITE = 5 };
constexpr std::size_t buf_size = 512;
constexpr int ndev = 2;

fuzz::shared_device devices[ndev];

struct model_counter {
  compcntr_comp_cntr* cc;
  int dev;
  bool bytes;
  std::uint64_t comp = 0, err = 0;
  int attached = 0;  // live QPs holding an attachment
};

struct model_mr {
  compcntr_mr* mr;  // freed once deregistered: use the copies below
  int dev;
  std::uintptr_t addr;
  std::size_t len;
  int access;
  std::uint32_t lkey, rkey;
};

struct wr {
  std::uintptr_t addr;
  std::size_t len;
  std::uint32_t lkey;
};

struct model_qp {
  compcntr_qp* qp;
  int dev;
  int state = COMPCNTR_QPS_RESET;
  int peer = -1;           // index of the connected peer while it lives
  std::array<int, nops> served{-1, -1, -1, -1, -1, -1};  // counter ids
  std::vector<int> attached;                            // distinct counter ids
  std::deque<wr> recvs, sends;
};

struct state {
  // Stable ids: slots are never reused within an input (destroyed entries become empty).
  std::vector<model_counter> c;
  std::vector<bool> c_live;
  std::vector<model_mr> m;
  std::vector<bool> m_live;
  std::vector<model_qp> q;
  std::vector<bool> q_live;
  std::uint8_t* buf[2];        // the library's buffers
  std::uint8_t shadow[2][buf_size];  // what the model says they hold
};

// ---- the model's completion machinery (docs/qp.md, "Completion rules") ----

void complete(state& s, int qi, int op, bool ok, std::uint64_t len) {
  const int ci = s.q[static_cast<std::size_t>(qi)].served[static_cast<std::size_t>(op)];
  if (ci < 0) return;
  model_counter& c = s.c[static_cast<std::size_t>(ci)];
  if (ok)
    c.comp += c.bytes ? len : 1;
  else
    c.err += 1;
}

// The QP enters ERR: its queued work completes in error; the peer's sends waiting for it can
// never be received, which fails the peer too.
void fail_qp(state& s, int qi) {
  model_qp& q = s.q[static_cast<std::size_t>(qi)];
  if (q.state == COMPCNTR_QPS_ERR) return;
  q.state = COMPCNTR_QPS_ERR;
  for (std::size_t k = 0; k < q.recvs.size(); ++k) complete(s, qi, RECV, false, 0);
  for (std::size_t k = 0; k < q.sends.size(); ++k) complete(s, qi, SEND, false, 0);
  q.recvs.clear();
  q.sends.clear();
  if (q.peer >= 0 && !s.q[static_cast<std::size_t>(q.peer)].sends.empty()) fail_qp(s, q.peer);
}

void fail_request(state& s, int qi, int op) {
  complete(s, qi, op, false, 0);
  fail_qp(s, qi);
}

// Resolves a key of device `dev`: the registration whose lkey (local) or rkey (remote) it is,
// with the access `need`, covering [addr, addr + len). Zero-length local ranges are always valid.
bool resolve(const state& s, int dev, std::uint32_t key, bool remote, std::uintptr_t addr,
             std::size_t len, int need, const model_mr** out = nullptr) {
  for (std::size_t i = 0; i < s.m.size(); ++i) {
    if (!s.m_live[i] || s.m[i].dev != dev) continue;
    const model_mr& r = s.m[i];
    if (key != r.lkey && key != r.rkey) continue;
    if (remote != (key == r.rkey)) return false;
    if ((need & ~r.access) != 0) return false;
    if (addr < r.addr || len > r.len || addr - r.addr > r.len - len) return false;
    if (out) *out = &r;
    return true;
  }
  return false;
}

bool local_ok(const state& s, int dev, const wr& w, int need) {
  return w.len == 0 || resolve(s, dev, w.lkey, false, w.addr, w.len, need);
}

// Which of the two buffers (and offset) an address of ours lies in.
std::uint8_t* shadow_of(state& s, std::uintptr_t a) {
  for (int b = 0; b < 2; ++b) {
    const auto base = reinterpret_cast<std::uintptr_t>(s.buf[b]);
    if (a >= base && a < base + buf_size) return &s.shadow[b][a - base];
  }
  return nullptr;
}

void shadow_copy(state& s, std::uintptr_t dst, std::uintptr_t src, std::size_t len) {
  if (len == 0) return;
  std::uint8_t* d = shadow_of(s, dst);
  std::uint8_t* from = shadow_of(s, src);
  FUZZ_TRUE(d && from && shadow_of(s, dst + len - 1) && shadow_of(s, src + len - 1),
            "the model only copies inside the buffers");
  std::memmove(d, from, len);
}

// A send of `snd` meets receive `r` of `rcv`. Returns false if the receive was not consumed
// (the sender's buffer went away while it waited: a local error of the sender only).
bool deliver(state& s, int snd, const wr& sw, int rcv, const wr& rw) {
  const int dev = s.q[static_cast<std::size_t>(snd)].dev;
  if (!local_ok(s, dev, sw, 0)) {
    fail_request(s, snd, SEND);
    return false;
  }
  const wr dst{rw.addr, sw.len <= rw.len ? sw.len : rw.len, rw.lkey};
  if (!local_ok(s, dev, dst, COMPCNTR_ACCESS_LOCAL_WRITE) || sw.len > rw.len) {
    complete(s, rcv, RECV, false, 0);
    complete(s, snd, SEND, false, 0);
    fail_qp(s, rcv);
    fail_qp(s, snd);
    return true;
  }
  shadow_copy(s, rw.addr, sw.addr, sw.len);
  complete(s, snd, SEND, true, sw.len);
  complete(s, rcv, RECV, true, sw.len);
  return true;
}

// ---- checks ----

void check_all(state& s) {
  for (std::size_t i = 0; i < s.c.size(); ++i) {
    if (!s.c_live[i]) continue;
    std::uint64_t v = 0, e = 0;
    FUZZ_RC("read_comp_cntr", compcntr_read_comp_cntr(s.c[i].cc, &v), 0);
    FUZZ_RC("read_err_comp_cntr", compcntr_read_err_comp_cntr(s.c[i].cc, &e), 0);
    if (v != s.c[i].comp || e != s.c[i].err) {
      FUZZ_TRACE("counter c%zu: library %" PRIu64 "/%" PRIu64 ", model %" PRIu64 "/%" PRIu64, i, v,
                 e, s.c[i].comp, s.c[i].err);
      FUZZ_EQ(v, s.c[i].comp, "completion value");
      FUZZ_EQ(e, s.c[i].err, "error value");
    }
  }
  for (std::size_t i = 0; i < s.q.size(); ++i)
    if (s.q_live[i])
      FUZZ_EQ(static_cast<int>(compcntr_qp_state(s.q[i].qp)), s.q[i].state, "QP state");
  for (int b = 0; b < 2; ++b)
    if (std::memcmp(s.buf[b], s.shadow[b], buf_size) != 0) {
      std::size_t at = 0;
      while (s.buf[b][at] == s.shadow[b][at]) ++at;
      fuzz::mismatch(__FILE__, __LINE__, "data buffers", "buffer %d byte %zu is %u, model %u", b,
                     at, s.buf[b][at], s.shadow[b][at]);
    }
}

// ---- picking arguments ----

int pick_live(FuzzedDataProvider& in, const std::vector<bool>& live) {
  if (live.empty()) return -1;
  const int i = in.ConsumeIntegralInRange<int>(0, static_cast<int>(live.size()) - 1);
  return live[static_cast<std::size_t>(i)] ? i : -1;
}

std::uintptr_t pick_addr(FuzzedDataProvider& in, state& s) {
  const int b = in.ConsumeIntegralInRange<int>(0, 1);
  return reinterpret_cast<std::uintptr_t>(s.buf[b]) +
         in.ConsumeIntegralInRange<std::size_t>(0, buf_size - 1);
}

// A key: usually one of a live registration's (either kind), sometimes junk.
std::uint32_t pick_key(FuzzedDataProvider& in, const state& s) {
  if (!s.m.empty() && in.ConsumeIntegralInRange<int>(0, 7) != 0) {
    const model_mr& r = s.m[in.ConsumeIntegralInRange<std::size_t>(0, s.m.size() - 1)];
    // Dead registrations' keys too: they must be refused (keys are not reused so soon).
    return in.ConsumeIntegralInRange<int>(0, 3) == 0 ? r.rkey : r.lkey;
  }
  return in.ConsumeIntegral<std::uint32_t>();
}

// ---- operations ----

constexpr std::size_t max_objects = 24;  // per kind and input

void op_counter(FuzzedDataProvider& in, state& s) {
  const int kind = in.ConsumeIntegralInRange<int>(0, 3);
  if (kind == 0) {
    if (s.c.size() >= max_objects) return;
    const int d = in.ConsumeIntegralInRange<int>(0, ndev - 1);
    const bool bytes = in.ConsumeBool();
    compcntr_comp_cntr_init_attr a{};
    a.type = bytes ? COMPCNTR_COMP_CNTR_TYPE_BYTES : COMPCNTR_COMP_CNTR_TYPE_WRS;
    const std::uint32_t stripes = fuzz::maybe_striped(in, a);
    FUZZ_TRACE("c%zu = create_comp_cntr(dev%d, %s, stripes %u)", s.c.size(), d,
               bytes ? "BYTES" : "WRS", stripes);
    errno = 0;
    compcntr_comp_cntr* cc = compcntr_create_comp_cntr(devices[d].dev, &a);
    FUZZ_PTR("create_comp_cntr", cc, errno, 0);
    s.c.push_back(model_counter{cc, d, bytes});
    s.c_live.push_back(true);
    return;
  }
  const int i = pick_live(in, s.c_live);
  if (i < 0) return;
  model_counter& c = s.c[static_cast<std::size_t>(i)];
  if (kind == 1) {
    FUZZ_TRACE("destroy_comp_cntr(c%d) attached to %d QP(s)", i, c.attached);
    FUZZ_RC("destroy_comp_cntr", compcntr_destroy_comp_cntr(c.cc), c.attached ? EBUSY : 0);
    if (!c.attached) s.c_live[static_cast<std::size_t>(i)] = false;
  } else if (kind == 2) {
    const std::uint64_t v = edgy_u64(in);
    FUZZ_TRACE("inc_comp_cntr(c%d, %" PRIu64 ")", i, v);
    FUZZ_RC("inc_comp_cntr", compcntr_inc_comp_cntr(c.cc, v), 0);
    c.comp += v;
  } else {
    const std::uint64_t v = edgy_u64(in);
    FUZZ_TRACE("set_err_comp_cntr(c%d, %" PRIu64 ")", i, v);
    FUZZ_RC("set_err_comp_cntr", compcntr_set_err_comp_cntr(c.cc, v), 0);
    c.err = v;
  }
}

void op_create_qp(FuzzedDataProvider& in, state& s) {
  if (s.q.size() >= max_objects) return;
  const int d = in.ConsumeIntegralInRange<int>(0, ndev - 1);
  const bool null_dev = in.ConsumeIntegralInRange<int>(0, 15) == 0;
  FUZZ_TRACE("q%zu = create_qp(dev%d%s)", s.q.size(), d, null_dev ? "=NULL" : "");
  errno = 0;
  compcntr_qp* qp = compcntr_create_qp(null_dev ? nullptr : devices[d].dev);
  FUZZ_PTR("create_qp", qp, errno, null_dev ? EINVAL : 0);
  if (!qp) return;
  model_qp m;
  m.qp = qp;
  m.dev = d;
  s.q.push_back(m);
  s.q_live.push_back(true);
}

void destroy_qp_model(state& s, int i) {
  model_qp& q = s.q[static_cast<std::size_t>(i)];
  if (q.peer >= 0) {
    const int p = q.peer;
    s.q[static_cast<std::size_t>(p)].peer = -1;  // before the flush: it cannot reach back here
    q.peer = -1;
    if (!s.q[static_cast<std::size_t>(p)].sends.empty()) fail_qp(s, p);
  }
  q.recvs.clear();  // destroyed: its own work completes nothing
  q.sends.clear();
  for (int ci : q.attached) --s.c[static_cast<std::size_t>(ci)].attached;
  q.attached.clear();
  s.q_live[static_cast<std::size_t>(i)] = false;
}

void op_destroy_qp(FuzzedDataProvider& in, state& s) {
  if (in.ConsumeIntegralInRange<int>(0, 15) == 0) {
    FUZZ_TRACE("destroy_qp(NULL)");
    FUZZ_RC("destroy_qp", compcntr_destroy_qp(nullptr), EINVAL);
    return;
  }
  const int i = pick_live(in, s.q_live);
  if (i < 0) return;
  FUZZ_TRACE("destroy_qp(q%d)", i);
  FUZZ_RC("destroy_qp", compcntr_destroy_qp(s.q[static_cast<std::size_t>(i)].qp), 0);
  destroy_qp_model(s, i);
}

void op_modify(FuzzedDataProvider& in, state& s) {
  const int i = pick_live(in, s.q_live);
  const std::uint32_t to = in.ConsumeIntegralInRange<int>(0, 15) == 0
                               ? in.ConsumeIntegral<std::uint32_t>()
                               : in.ConsumeIntegralInRange<std::uint32_t>(0, 3);
  FUZZ_TRACE("modify_qp(q%d, %u)", i, to);
  if (i < 0) {
    FUZZ_RC("modify_qp", fuzz_modify_qp_raw(nullptr, to), EINVAL);
    FUZZ_EQ(static_cast<int>(compcntr_qp_state(nullptr)), COMPCNTR_QPS_ERR, "qp_state(NULL)");
    return;
  }
  model_qp& q = s.q[static_cast<std::size_t>(i)];
  int want = EINVAL;
  if (to == COMPCNTR_QPS_ERR) {
    want = 0;
  } else if (to == COMPCNTR_QPS_INIT && q.state == COMPCNTR_QPS_RESET) {
    want = 0;
  }
  FUZZ_RC("modify_qp", fuzz_modify_qp_raw(q.qp, to), want);
  if (want != 0) return;
  if (to == COMPCNTR_QPS_ERR)
    fail_qp(s, i);
  else
    q.state = COMPCNTR_QPS_INIT;
}

void op_connect(FuzzedDataProvider& in, state& s) {
  const int a = pick_live(in, s.q_live), b = pick_live(in, s.q_live);
  FUZZ_TRACE("connect_qp(q%d, q%d)", a, b);
  compcntr_qp* qa = a >= 0 ? s.q[static_cast<std::size_t>(a)].qp : nullptr;
  compcntr_qp* qb = b >= 0 ? s.q[static_cast<std::size_t>(b)].qp : nullptr;
  int want = EINVAL;
  if (a >= 0 && b >= 0 && a != b) {
    model_qp& x = s.q[static_cast<std::size_t>(a)];
    model_qp& y = s.q[static_cast<std::size_t>(b)];
    if (x.dev == y.dev && x.state == COMPCNTR_QPS_INIT && y.state == COMPCNTR_QPS_INIT) want = 0;
  }
  FUZZ_RC("connect_qp", compcntr_connect_qp(qa, qb), want);
  if (want != 0) return;
  model_qp& x = s.q[static_cast<std::size_t>(a)];
  model_qp& y = s.q[static_cast<std::size_t>(b)];
  x.state = y.state = COMPCNTR_QPS_RTS;
  x.peer = b;
  y.peer = a;
}

void op_attach(FuzzedDataProvider& in, state& s) {
  const int qi = pick_live(in, s.q_live);
  const int ci = pick_live(in, s.c_live);
  compcntr_qp_attach_comp_cntr_attr attr{};
  attr.comp_mask =
      in.ConsumeIntegralInRange<int>(0, 15) == 0 ? in.ConsumeIntegral<std::uint32_t>() : 0;
  attr.op_mask = in.ConsumeIntegralInRange<int>(0, 15) == 0
                     ? in.ConsumeIntegral<std::uint32_t>()
                     : in.ConsumeIntegralInRange<std::uint32_t>(0, 63);
  const bool null_attr = in.ConsumeIntegralInRange<int>(0, 31) == 0;
  FUZZ_TRACE("qp_attach_comp_cntr(q%d, c%d, %s{mask 0x%x ops 0x%x})", qi, ci,
             null_attr ? "NULL " : "", attr.comp_mask, attr.op_mask);
  compcntr_qp* qp = qi >= 0 ? s.q[static_cast<std::size_t>(qi)].qp : nullptr;
  compcntr_comp_cntr* cc = ci >= 0 ? s.c[static_cast<std::size_t>(ci)].cc : nullptr;
  int want = 0;
  if (qi < 0 || ci < 0 || null_attr || attr.comp_mask != 0 || attr.op_mask == 0) {
    want = EINVAL;
  } else if (attr.op_mask & ~0x3fu) {
    want = ENOTSUP;
  } else {
    model_qp& q = s.q[static_cast<std::size_t>(qi)];
    if (s.c[static_cast<std::size_t>(ci)].dev != q.dev ||
        (q.state != COMPCNTR_QPS_RESET && q.state != COMPCNTR_QPS_INIT)) {
      want = EINVAL;
    } else {
      for (int op = 0; op < nops; ++op)
        if ((attr.op_mask >> op & 1u) && q.served[static_cast<std::size_t>(op)] >= 0) want = EBUSY;
    }
  }
  FUZZ_RC("qp_attach_comp_cntr", compcntr_qp_attach_comp_cntr(qp, cc, null_attr ? nullptr : &attr),
          want);
  if (want != 0) return;
  model_qp& q = s.q[static_cast<std::size_t>(qi)];
  for (int op = 0; op < nops; ++op)
    if (attr.op_mask >> op & 1u) q.served[static_cast<std::size_t>(op)] = ci;
  bool have = false;
  for (int x : q.attached) have |= x == ci;
  if (!have) {
    q.attached.push_back(ci);
    ++s.c[static_cast<std::size_t>(ci)].attached;
  }
}

void op_reg_mr(FuzzedDataProvider& in, state& s) {
  if (s.m.size() >= max_objects) return;
  const int d = in.ConsumeIntegralInRange<int>(0, ndev - 1);
  const bool null_dev = in.ConsumeIntegralInRange<int>(0, 31) == 0;
  std::uintptr_t addr;
  std::size_t len;
  const int shape = in.ConsumeIntegralInRange<int>(0, 15);
  if (shape == 0) {  // NULL address
    addr = 0;
    len = in.ConsumeIntegralInRange<std::size_t>(0, 64);
  } else if (shape == 1) {  // a range wrapping the address space (never registered)
    const std::size_t k = in.ConsumeIntegralInRange<std::size_t>(0, 64);
    addr = UINTPTR_MAX - k;
    len = k + 1 + in.ConsumeIntegralInRange<std::size_t>(0, 64);
  } else {  // inside one buffer (length 0 sometimes)
    addr = pick_addr(in, s);
    const int b = addr >= reinterpret_cast<std::uintptr_t>(s.buf[1]) &&
                  addr < reinterpret_cast<std::uintptr_t>(s.buf[1]) + buf_size;
    const std::size_t room = reinterpret_cast<std::uintptr_t>(s.buf[b]) + buf_size - addr;
    len = in.ConsumeIntegralInRange<std::size_t>(0, room);
  }
  const int access = in.ConsumeIntegralInRange<int>(0, 15) == 0
                         ? in.ConsumeIntegral<int>()
                         : in.ConsumeIntegralInRange<int>(0, 7);
  FUZZ_TRACE("m%zu = reg_mr(dev%d%s, %#lx, %zu, 0x%x)", s.m.size(), d, null_dev ? "=NULL" : "",
             static_cast<unsigned long>(addr), len, static_cast<unsigned>(access));
  int want = 0;
  if (null_dev || access < 0 || addr == 0 || len == 0 || addr + len < addr || (access & ~7) ||
      ((access & COMPCNTR_ACCESS_REMOTE_WRITE) && !(access & COMPCNTR_ACCESS_LOCAL_WRITE)))
    want = EINVAL;
  errno = 0;
  compcntr_mr* mr = compcntr_reg_mr(null_dev ? nullptr : devices[d].dev,
                                    reinterpret_cast<void*>(addr), len, access);
  FUZZ_PTR("reg_mr", mr, errno, want);
  if (!mr) return;
  FUZZ_TRUE(mr->addr == reinterpret_cast<void*>(addr) && mr->length == len, "reg_mr's range");
  FUZZ_TRUE(mr->lkey != 0 && mr->rkey != 0 && mr->lkey != mr->rkey,
            "keys are never 0, lkey != rkey");
  for (std::size_t i = 0; i < s.m.size(); ++i)
    if (s.m[i].dev == d)  // dead ones too: keys are not reused within 2^31 registrations
      FUZZ_TRUE(s.m[i].lkey != mr->lkey && s.m[i].lkey != mr->rkey && s.m[i].rkey != mr->lkey &&
                    s.m[i].rkey != mr->rkey,
                "keys are unique on a device");
  FUZZ_TRACE("  -> lkey %u rkey %u", mr->lkey, mr->rkey);
  s.m.push_back(model_mr{mr, d, addr, len, access, mr->lkey, mr->rkey});
  s.m_live.push_back(true);
}

void op_dereg_mr(FuzzedDataProvider& in, state& s) {
  if (in.ConsumeIntegralInRange<int>(0, 15) == 0) {
    FUZZ_TRACE("dereg_mr(NULL)");
    FUZZ_RC("dereg_mr", compcntr_dereg_mr(nullptr), EINVAL);
    return;
  }
  const int i = pick_live(in, s.m_live);
  if (i < 0) return;
  FUZZ_TRACE("dereg_mr(m%d)", i);
  FUZZ_RC("dereg_mr", compcntr_dereg_mr(s.m[static_cast<std::size_t>(i)].mr), 0);
  s.m_live[static_cast<std::size_t>(i)] = false;
}

// A local buffer argument: usually inside a live registration, sometimes anywhere in the
// buffers, sometimes NULL; lengths that fit or overrun.
wr pick_wr(FuzzedDataProvider& in, state& s) {
  wr w{};
  const int shape = in.ConsumeIntegralInRange<int>(0, 15);
  const int mi = pick_live(in, s.m_live);
  if (shape < 10 && mi >= 0) {
    const model_mr& r = s.m[static_cast<std::size_t>(mi)];
    const std::size_t off = in.ConsumeIntegralInRange<std::size_t>(0, r.len);
    w.addr = r.addr + off;
    w.len = in.ConsumeIntegralInRange<int>(0, 7) == 0
                ? in.ConsumeIntegralInRange<std::size_t>(0, buf_size)
                : in.ConsumeIntegralInRange<std::size_t>(0, r.len - off);
    w.lkey = in.ConsumeIntegralInRange<int>(0, 7) == 0 ? pick_key(in, s) : r.lkey;
  } else if (shape == 15) {
    w.addr = 0;
    w.len = in.ConsumeIntegralInRange<std::size_t>(0, 2);
    w.lkey = pick_key(in, s);
  } else {
    w.addr = pick_addr(in, s);
    w.len = in.ConsumeIntegralInRange<std::size_t>(0, 64);
    w.lkey = pick_key(in, s);
  }
  return w;
}

// Common entry checks of every post: NULL addr with len > 0, then RTS.
int post_entry(const state& s, int qi, const wr& w) {
  if (qi < 0) return EINVAL;
  if (w.addr == 0 && w.len != 0) return EINVAL;
  if (s.q[static_cast<std::size_t>(qi)].state != COMPCNTR_QPS_RTS) return EINVAL;
  return 0;
}

void op_post_recv(FuzzedDataProvider& in, state& s) {
  const int qi = pick_live(in, s.q_live);
  const wr r = pick_wr(in, s);
  const std::uint64_t wr_id = in.ConsumeIntegral<std::uint64_t>();
  FUZZ_TRACE("post_recv(q%d, %#lx, %zu, lkey %u)", qi, static_cast<unsigned long>(r.addr), r.len,
             r.lkey);
  const int want = post_entry(s, qi, r);
  FUZZ_RC("post_recv",
          compcntr_post_recv(qi >= 0 ? s.q[static_cast<std::size_t>(qi)].qp : nullptr, wr_id,
                             reinterpret_cast<void*>(r.addr), r.len, r.lkey),
          want);
  if (want != 0) return;
  model_qp& q = s.q[static_cast<std::size_t>(qi)];
  if (!local_ok(s, q.dev, r, COMPCNTR_ACCESS_LOCAL_WRITE)) {
    fail_request(s, qi, RECV);
    return;
  }
  if (q.peer >= 0 && !s.q[static_cast<std::size_t>(q.peer)].sends.empty()) {
    const int p = q.peer;
    const wr snd = s.q[static_cast<std::size_t>(p)].sends.front();
    s.q[static_cast<std::size_t>(p)].sends.pop_front();
    if (deliver(s, p, snd, qi, r)) return;
    if (s.q[static_cast<std::size_t>(qi)].state != COMPCNTR_QPS_RTS) {
      complete(s, qi, RECV, false, 0);  // the sender's failure reached this QP: flushed
      return;
    }
  }
  s.q[static_cast<std::size_t>(qi)].recvs.push_back(r);
}

void op_post_send(FuzzedDataProvider& in, state& s) {
  const int qi = pick_live(in, s.q_live);
  const wr w = pick_wr(in, s);
  const std::uint64_t wr_id = in.ConsumeIntegral<std::uint64_t>();
  FUZZ_TRACE("post_send(q%d, %#lx, %zu, lkey %u)", qi, static_cast<unsigned long>(w.addr), w.len,
             w.lkey);
  const int want = post_entry(s, qi, w);
  FUZZ_RC("post_send",
          compcntr_post_send(qi >= 0 ? s.q[static_cast<std::size_t>(qi)].qp : nullptr, wr_id,
                             reinterpret_cast<const void*>(w.addr), w.len, w.lkey),
          want);
  if (want != 0) return;
  model_qp& q = s.q[static_cast<std::size_t>(qi)];
  if (!local_ok(s, q.dev, w, 0) || q.peer < 0 ||
      s.q[static_cast<std::size_t>(q.peer)].state != COMPCNTR_QPS_RTS) {
    fail_request(s, qi, SEND);
    return;
  }
  model_qp& p = s.q[static_cast<std::size_t>(q.peer)];
  if (!p.recvs.empty()) {
    const wr r = p.recvs.front();
    p.recvs.pop_front();
    deliver(s, qi, w, q.peer, r);
    return;
  }
  q.sends.push_back(w);
}

void op_rdma(FuzzedDataProvider& in, state& s, bool write) {
  const int qi = pick_live(in, s.q_live);
  const wr w = pick_wr(in, s);
  std::uintptr_t raddr;
  std::uint32_t rkey;
  const int mi = pick_live(in, s.m_live);
  if (mi >= 0 && in.ConsumeIntegralInRange<int>(0, 7) != 0) {
    const model_mr& r = s.m[static_cast<std::size_t>(mi)];
    raddr = r.addr + in.ConsumeIntegralInRange<std::size_t>(0, r.len);
    rkey = in.ConsumeIntegralInRange<int>(0, 7) == 0 ? pick_key(in, s) : r.rkey;
  } else {
    raddr = in.ConsumeBool() ? pick_addr(in, s) : in.ConsumeIntegral<std::uint64_t>();
    rkey = pick_key(in, s);
  }
  const char* call = write ? "post_rdma_write" : "post_rdma_read";
  FUZZ_TRACE("%s(q%d, %#lx, %zu, lkey %u, remote %#lx, rkey %u)", call, qi,
             static_cast<unsigned long>(w.addr), w.len, w.lkey, static_cast<unsigned long>(raddr),
             rkey);
  const int want = post_entry(s, qi, w);
  compcntr_qp* qp = qi >= 0 ? s.q[static_cast<std::size_t>(qi)].qp : nullptr;
  const int r = write ? compcntr_post_rdma_write(qp, 7, reinterpret_cast<const void*>(w.addr),
                                                 w.len, w.lkey, raddr, rkey)
                      : compcntr_post_rdma_read(qp, 7, reinterpret_cast<void*>(w.addr), w.len,
                                                w.lkey, raddr, rkey);
  FUZZ_RC(call, r, want);
  if (want != 0) return;
  model_qp& q = s.q[static_cast<std::size_t>(qi)];
  bool ok = local_ok(s, q.dev, w, write ? 0 : COMPCNTR_ACCESS_LOCAL_WRITE);
  if (ok) {
    if (q.peer < 0 || s.q[static_cast<std::size_t>(q.peer)].state != COMPCNTR_QPS_RTS)
      ok = false;
    else if (w.len != 0)
      ok = resolve(s, q.dev, rkey, true, raddr, w.len,
                   write ? COMPCNTR_ACCESS_REMOTE_WRITE : COMPCNTR_ACCESS_REMOTE_READ);
  }
  const int op = write ? RWRITE : RREAD;
  if (!ok) {
    fail_request(s, qi, op);
    return;
  }
  if (write)
    shadow_copy(s, raddr, w.addr, w.len);
  else
    shadow_copy(s, w.addr, raddr, w.len);
  complete(s, qi, op, true, w.len);
  complete(s, q.peer, write ? REMOTE_RWRITE : REMOTE_RREAD, true, w.len);
}

// A ready-made connected pair, so that posts usually meet a working data path: two QPs of one
// device, a counter (WRS or BYTES, chosen by the input) attached to each op of each side,
// INIT, connect, and one registration per buffer with every access right.
void op_setup_pair(FuzzedDataProvider& in, state& s) {
  if (s.q.size() + 2 > max_objects || s.c.size() + 4 > max_objects || s.m.size() + 2 > max_objects)
    return;
  const int d = in.ConsumeIntegralInRange<int>(0, ndev - 1);
  const std::uint8_t bytes_mask = in.ConsumeIntegral<std::uint8_t>();
  FUZZ_TRACE("setup pair on dev%d (BYTES mask 0x%x)", d, bytes_mask);
  int qs[2];
  for (int k = 0; k < 2; ++k) {
    errno = 0;
    compcntr_qp* qp = compcntr_create_qp(devices[d].dev);
    FUZZ_PTR("create_qp", qp, errno, 0);
    model_qp m;
    m.qp = qp;
    m.dev = d;
    qs[k] = static_cast<int>(s.q.size());
    s.q.push_back(m);
    s.q_live.push_back(true);
  }
  // Counters: side k, local ops (SEND|RECV|RDMA_READ|RDMA_WRITE) and remote ops.
  const std::uint32_t masks[2] = {0x17u, 0x28u};
  for (int k = 0; k < 2; ++k)
    for (int j = 0; j < 2; ++j) {
      const bool bytes = bytes_mask >> (k * 2 + j) & 1u;
      compcntr_comp_cntr_init_attr a{};
      a.type = bytes ? COMPCNTR_COMP_CNTR_TYPE_BYTES : COMPCNTR_COMP_CNTR_TYPE_WRS;
      errno = 0;
      compcntr_comp_cntr* cc = compcntr_create_comp_cntr(devices[d].dev, &a);
      FUZZ_PTR("create_comp_cntr", cc, errno, 0);
      const int ci = static_cast<int>(s.c.size());
      s.c.push_back(model_counter{cc, d, bytes});
      s.c_live.push_back(true);
      compcntr_qp_attach_comp_cntr_attr at{0, masks[j]};
      FUZZ_RC("qp_attach_comp_cntr",
              compcntr_qp_attach_comp_cntr(s.q[static_cast<std::size_t>(qs[k])].qp, cc, &at), 0);
      model_qp& q = s.q[static_cast<std::size_t>(qs[k])];
      for (int op = 0; op < nops; ++op)
        if (masks[j] >> op & 1u) q.served[static_cast<std::size_t>(op)] = ci;
      q.attached.push_back(ci);
      ++s.c[static_cast<std::size_t>(ci)].attached;
    }
  for (int k = 0; k < 2; ++k) {
    FUZZ_RC("modify_qp",
            compcntr_modify_qp(s.q[static_cast<std::size_t>(qs[k])].qp, COMPCNTR_QPS_INIT), 0);
    s.q[static_cast<std::size_t>(qs[k])].state = COMPCNTR_QPS_INIT;
  }
  FUZZ_RC("connect_qp",
          compcntr_connect_qp(s.q[static_cast<std::size_t>(qs[0])].qp,
                              s.q[static_cast<std::size_t>(qs[1])].qp),
          0);
  for (int k = 0; k < 2; ++k) {
    s.q[static_cast<std::size_t>(qs[k])].state = COMPCNTR_QPS_RTS;
    s.q[static_cast<std::size_t>(qs[k])].peer = qs[1 - k];
  }
  for (int b = 0; b < 2; ++b) {
    errno = 0;
    compcntr_mr* mr = compcntr_reg_mr(devices[d].dev, s.buf[b], buf_size, 7);
    FUZZ_PTR("reg_mr", mr, errno, 0);
    s.m.push_back(model_mr{mr, d, reinterpret_cast<std::uintptr_t>(s.buf[b]), buf_size, 7, mr->lkey,
                           mr->rkey});
    s.m_live.push_back(true);
  }
}

void op_misc(FuzzedDataProvider& in, state& s) {
  switch (in.ConsumeIntegralInRange<int>(0, 2)) {
    case 0: {
      const int d = in.ConsumeIntegralInRange<int>(0, ndev - 1);
      int live = 0;
      for (std::size_t i = 0; i < s.q.size(); ++i) live += s.q_live[i] && s.q[i].dev == d;
      for (std::size_t i = 0; i < s.m.size(); ++i) live += s.m_live[i] && s.m[i].dev == d;
      for (std::size_t i = 0; i < s.c.size(); ++i) live += s.c_live[i] && s.c[i].dev == d;
      FUZZ_TRACE("close_device(dev%d) with %d object(s)", d, live);
      if (live) FUZZ_RC("close_device", compcntr_close_device(devices[d].dev), EBUSY);
      break;
    }
    case 1: {
      std::size_t n = 99;
      FUZZ_TRACE("progress(dev)");
      FUZZ_RC("progress", compcntr_progress(devices[0].dev, &n), 0);
      FUZZ_EQ(n, 0u, "software progress drains nothing");
      FUZZ_RC("progress", compcntr_progress(nullptr, &n), EINVAL);
      break;
    }
    default: {
      FUZZ_TRACE("null QP arguments");
      FUZZ_RC("connect_qp", compcntr_connect_qp(nullptr, nullptr), EINVAL);
      FUZZ_RC("post_send", compcntr_post_send(nullptr, 0, nullptr, 0, 0), EINVAL);
      FUZZ_RC("post_recv", compcntr_post_recv(nullptr, 0, nullptr, 0, 0), EINVAL);
      FUZZ_RC("post_rdma_write", compcntr_post_rdma_write(nullptr, 0, nullptr, 0, 0, 0, 0), EINVAL);
      FUZZ_RC("post_rdma_read", compcntr_post_rdma_read(nullptr, 0, nullptr, 0, 0, 0, 0), EINVAL);
      errno = 0;
      FUZZ_EQ(static_cast<int>(compcntr_qp_state(nullptr)), COMPCNTR_QPS_ERR, "qp_state(NULL)");
      FUZZ_EQ(errno, EINVAL, "qp_state(NULL) sets errno");
      break;
    }
  }
}

} // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static std::uint8_t* buffers[2];
  if (!devices[0].dev) {
    devices[0].open(nullptr);
    devices[1].open(nullptr);
    buffers[0] = new std::uint8_t[buf_size];  // heap: ASan redzones around each
    buffers[1] = new std::uint8_t[buf_size];
  }
  fuzz::trace::get().clear();
  FuzzedDataProvider in(data, size);
  state s;
  for (int b = 0; b < 2; ++b) {
    s.buf[b] = buffers[b];
    for (std::size_t i = 0; i < buf_size; ++i)
      s.buf[b][i] = s.shadow[b][i] = static_cast<std::uint8_t>(i * 7 + b * 101 + 1);
  }
  for (int steps = 0; steps < 300 && in.remaining_bytes() > 0; ++steps) {
    switch (in.ConsumeIntegralInRange<int>(0, 15)) {
      case 0: op_counter(in, s); break;
      case 1: op_create_qp(in, s); break;
      case 2: op_destroy_qp(in, s); break;
      case 3: op_modify(in, s); break;
      case 4: op_connect(in, s); break;
      case 5: op_attach(in, s); break;
      case 6: op_reg_mr(in, s); break;
      case 7: op_dereg_mr(in, s); break;
      case 8:
      case 9: op_post_recv(in, s); break;
      case 10:
      case 11: op_post_send(in, s); break;
      case 12: op_rdma(in, s, true); break;
      case 13: op_rdma(in, s, false); break;
      case 14: op_misc(in, s); break;
      default: op_setup_pair(in, s); break;
    }
    check_all(s);
  }
  FUZZ_TRACE("end of input: destroy everything");
  for (std::size_t i = 0; i < s.q.size(); ++i)
    if (s.q_live[i]) {
      FUZZ_RC("destroy_qp", compcntr_destroy_qp(s.q[i].qp), 0);
      destroy_qp_model(s, static_cast<int>(i));
      check_all(s);
    }
  for (std::size_t i = 0; i < s.m.size(); ++i)
    if (s.m_live[i]) FUZZ_RC("dereg_mr", compcntr_dereg_mr(s.m[i].mr), 0);
  for (std::size_t i = 0; i < s.c.size(); ++i)
    if (s.c_live[i]) FUZZ_RC("destroy_comp_cntr", compcntr_destroy_comp_cntr(s.c[i].cc), 0);
  return 0;
}
