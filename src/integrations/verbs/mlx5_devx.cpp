// mlx5 DEVX: the cmd_comp of mlx5 devices (mlx5dv_devx_create_cmd_comp, _obj_query_async,
// _get_async_cmd_comp) and DEVX flow counters as device-held counters.
//
// UNTESTED: no mlx5 hardware exists where this was written; it is compiled whenever libmlx5
// provides DEVX (COMPCNTR_HAVE_MLX5_DEVX). Command layouts follow the ConnectX PRM as used by
// rdma-core and DPDK (mlx5_ifc.h): ALLOC_FLOW_COUNTER 0x939, QUERY_FLOW_COUNTER 0x93b, every
// field a big-endian dword.
//
// Kernel semantics the software cmd_comp mirrors and this one inherits (mlx5 devx.c): read()
// with a buffer smaller than the event is -ENOSPC and the event stays queued; O_NONBLOCK is
// -EAGAIN; an async command is refused with -EAGAIN once 1 MiB (MAX_ASYNC_BYTES_IN_USE) of
// out_data is in use. Here each DEVX query has 32 bytes of out_data, so the kernel admits 32,768
// of them; host-memory counters keep the engine's own 65,536 bound.
module;
#include <atomic>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <new>
#include <span>
#include <system_error>
#include <vector>
#include "compcntr_config.h"
#if COMPCNTR_HAVE_MLX5_DEVX
#include <endian.h>
#include <fcntl.h>
#include <infiniband/mlx5dv.h>
#include <infiniband/verbs.h>
#include <poll.h>
#include <sys/epoll.h>
#include <unistd.h>
#endif
module compcntr;

#if COMPCNTR_HAVE_MLX5_DEVX
#include "mlx5_devx.hpp"

namespace compcntr::detail {

namespace {

constexpr std::uint32_t op_alloc_flow_counter = 0x939;
constexpr std::uint32_t op_query_flow_counter = 0x93b;
/// query_flow_counter_out: status/syndrome/reserved (16 bytes) + traffic_counter {packets, octets}.
constexpr std::size_t query_out_bytes = 32;

void set_dw(std::uint32_t* cmd, std::size_t dw, std::uint32_t v) noexcept { cmd[dw] = htobe32(v); }
std::uint32_t get_dw(const unsigned char* out, std::size_t dw) noexcept {
  std::uint32_t v;
  std::memcpy(&v, out + 4 * dw, sizeof v);
  return be32toh(v);
}
std::uint64_t get_qw(const unsigned char* out, std::size_t byte) noexcept {
  std::uint64_t v;
  std::memcpy(&v, out + byte, sizeof v);
  return be64toh(v);
}

/// A counter slot backed by a DEVX flow counter. Software adjustments (add/set) are offsets
/// applied on top of the device count.
struct flow_counter {
  mlx5dv_devx_obj* obj = nullptr;
  std::uint32_t id = 0;
  std::atomic<std::uint64_t> comp_offset{0};
  std::atomic<std::uint64_t> err_offset{0};
};

flow_counter& fc_of(slot& s) noexcept { return *static_cast<flow_counter*>(s.backend_data); }

/// query_flow_counter_in for one counter (no dump to memory, no clear): 8 dwords.
void build_query(std::uint32_t (&in)[8], std::uint32_t id) noexcept {
  std::memset(in, 0, sizeof in);
  set_dw(in, 0, op_query_flow_counter << 16);
  set_dw(in, 7, id);
}

/// The device count out of a successful query_flow_counter_out, for the slot's type.
std::uint64_t device_count(const slot& s, const unsigned char* out) noexcept {
  return s.type == counter_type::bytes ? get_qw(out, 24) : get_qw(out, 16);
}

/// Blocking query (set/refresh only). false if the command failed.
bool query_sync(slot& s, std::uint64_t& count) noexcept {
  std::uint32_t in[8];
  build_query(in, fc_of(s).id);
  unsigned char out[query_out_bytes] = {};
  if (mlx5dv_devx_obj_query(fc_of(s).obj, in, sizeof in, out, sizeof out) != 0) return false;
  if (out[0] != 0) return false; // status
  count = device_count(s, out);
  return true;
}

const hw_counter_ops flow_counter_ops = {
    .add = [](slot& s, std::uint64_t n) noexcept { fc_of(s).comp_offset.fetch_add(n); },
    .add_error = [](slot& s, std::uint64_t n) noexcept { fc_of(s).err_offset.fetch_add(n); },
    .set =
        [](slot& s, std::uint64_t v) noexcept {
          std::uint64_t count = 0;
          if (query_sync(s, count)) fc_of(s).comp_offset.store(v - count); // wraps like a counter
        },
    .set_error = [](slot& s, std::uint64_t v) noexcept { fc_of(s).err_offset.store(v); },
    .refresh =
        [](slot& s) noexcept {
          std::uint64_t count = 0;
          if (!query_sync(s, count)) return;
          s.value.store(count + fc_of(s).comp_offset.load(), std::memory_order_seq_cst);
          s.errors.store(fc_of(s).err_offset.load(), std::memory_order_seq_cst);
          s.notify();
        },
};

bool is_flow_counter(const slot& s) noexcept { return s.hw == &flow_counter_ops; }

class devx_cmd_comp final : public cmd_comp_core {
 public:
  devx_cmd_comp(device_core& dev, mlx5dv_devx_cmd_comp* devx, cmd_comp_core* host,
                int epfd) noexcept
      : cmd_comp_core(dev), devx_(devx), host_(host), epfd_(epfd) {}

  int fd() const noexcept override { return epfd_; }

  std::size_t issue(std::span<const slot_query> q, std::error_code& ec) noexcept override {
    ec.clear();
    std::size_t done = 0;
    while (done < q.size()) {
      // A run of host-memory counters goes to the engine in one batch.
      std::size_t run = 0;
      while (done + run < q.size() && !is_flow_counter(*q[done + run].s)) ++run;
      if (run) {
        const std::size_t got = host_->issue(q.subspan(done, run), ec);
        done += got;
        if (ec) return done;
        continue;
      }
      if (!issue_devx(q[done], ec)) return done;
      ++done;
    }
    return done;
  }

  std::size_t try_get(std::span<query_response> out, std::error_code& ec) noexcept override {
    std::size_t n = host_->try_get(out, ec);
    if (ec || n == out.size()) return n;
    while (n < out.size()) {
      alignas(8) unsigned char buf[sizeof(mlx5dv_devx_async_cmd_hdr) + query_out_bytes];
      auto* hdr = reinterpret_cast<mlx5dv_devx_async_cmd_hdr*>(buf);
      const int err = mlx5dv_devx_get_async_cmd_comp(devx_, hdr, sizeof buf);
      if (err == EAGAIN || err == EWOULDBLOCK) break; // our DEVX fd is O_NONBLOCK
      if (err != 0) {
        fail_into(ec, err, "get_async_cmd_comp: mlx5dv_devx_get_async_cmd_comp failed: %s",
                  std::strerror(err));
        break;
      }
      const token t = take_token(static_cast<std::uint32_t>(hdr->wr_id));
      const unsigned char* data = buf + sizeof(mlx5dv_devx_async_cmd_hdr);
      if (data[0] != 0) { // the firmware refused the command
        out[n].wr_id = t.wr_id;
        fail_into(ec, EIO,
                  "get_async_cmd_comp: QUERY_FLOW_COUNTER failed on the device (status "
                  "0x%x, syndrome 0x%x)",
                  data[0], get_dw(data, 1));
        unpin_slot(*t.s);
        break;
      }
      flow_counter& fc = fc_of(*t.s);
      out[n++] = query_response{
          t.wr_id,
          counter_values{device_count(*t.s, data) + fc.comp_offset.load(), fc.err_offset.load()}};
      unpin_slot(*t.s);
    }
    return n;
  }

  bool ready() const noexcept override { return host_->ready() || devx_readable(); }
  bool probably_ready() const noexcept override { return host_->probably_ready(); }
  // After fork() the host engine's thread is gone; the DEVX side is rdma-core's fork rules.
  bool orphaned() const noexcept override { return host_->orphaned(); }
  std::size_t queued() const noexcept override {
    return host_->queued() + (devx_readable() ? 1 : 0); // the kernel does not say how many
  }

  void destroy() noexcept override {
    host_->destroy();
    mlx5dv_devx_destroy_cmd_comp(devx_); // the kernel discards queued and in-flight responses
    {
      std::lock_guard lock(tokens_mu_);
      for (token& t : tokens_)
        if (t.s) unpin_slot(*t.s);
    }
    ::close(epfd_);
    device_core* dev = dev_;
    delete this;
    dev->release();
  }

 private:
  struct token {
    slot* s = nullptr; ///< pinned while the command is in flight; nullptr: free
    std::uint64_t wr_id = 0; ///< the application's
    std::uint32_t next_free = 0;
  };

  bool issue_devx(const slot_query& q, std::error_code& ec) noexcept {
    std::uint32_t index;
    {
      std::lock_guard lock(tokens_mu_);
      if (free_head_ != 0) {
        index = free_head_ - 1;
        free_head_ = tokens_[index].next_free;
      } else {
        try {
          tokens_.emplace_back();
        } catch (...) {
          return fail_into(ec, ENOMEM, "query_comp_cntr_async: out of memory");
        }
        index = static_cast<std::uint32_t>(tokens_.size() - 1);
      }
      tokens_[index].s = q.s;
      tokens_[index].wr_id = q.wr_id;
    }
    pin_slot(*q.s);
    std::uint32_t in[8];
    build_query(in, fc_of(*q.s).id);
    const int err =
        mlx5dv_devx_obj_query_async(fc_of(*q.s).obj, in, sizeof in, query_out_bytes, index, devx_);
    if (err != 0) {
      take_token(index);
      unpin_slot(*q.s);
      if (err == EAGAIN)
        return fail_into(ec, EAGAIN,
                         "query_comp_cntr_async: the mlx5 driver refuses more than 1 MiB "
                         "of outstanding responses on this cmd_comp");
      return fail_into(ec, err, "query_comp_cntr_async: mlx5dv_devx_obj_query_async failed: %s",
                       std::strerror(err));
    }
    return true;
  }

  token take_token(std::uint32_t index) noexcept {
    std::lock_guard lock(tokens_mu_);
    token t = tokens_[index];
    tokens_[index].s = nullptr;
    tokens_[index].next_free = free_head_;
    free_head_ = index + 1;
    return t;
  }

  bool devx_readable() const noexcept {
    pollfd p{devx_->fd, POLLIN, 0};
    return ::poll(&p, 1, 0) == 1;
  }

  ~devx_cmd_comp() = default;

  mlx5dv_devx_cmd_comp* devx_;
  cmd_comp_core* host_;
  int epfd_;
  std::mutex tokens_mu_;
  std::vector<token> tokens_; ///< in-flight DEVX queries by token (the kernel's wr_id)
  std::uint32_t free_head_ = 0;
};

} // namespace

cmd_comp_core* make_mlx5_devx_cmd_comp(device_core& dev, ibv_context* ctx,
                                       std::error_code& ec) noexcept {
  mlx5dv_devx_cmd_comp* devx = mlx5dv_devx_create_cmd_comp(ctx);
  if (!devx) {
    const int err = errno ? errno : EOPNOTSUPP;
    fail_into(ec, err, "create_cmd_comp: mlx5dv_devx_create_cmd_comp failed: %s",
              std::strerror(err));
    return nullptr;
  }
  // Our reads of the DEVX fd never block; the application's blocking is done on the epoll fd.
  const int fl = ::fcntl(devx->fd, F_GETFL);
  cmd_comp_core* host = fl >= 0 && ::fcntl(devx->fd, F_SETFL, fl | O_NONBLOCK) == 0
                            ? make_engine_cmd_comp(dev, ec)
                            : nullptr;
  if (!host) {
    if (!ec)
      fail_into(ec, errno, "create_cmd_comp: fcntl on the DEVX fd failed: %s",
                std::strerror(errno));
    mlx5dv_devx_destroy_cmd_comp(devx);
    return nullptr;
  }
  const int epfd = ::epoll_create1(EPOLL_CLOEXEC);
  epoll_event ev{};
  ev.events = EPOLLIN; // level-triggered: the epoll fd is readable while either source is
  if (epfd < 0 || ::epoll_ctl(epfd, EPOLL_CTL_ADD, host->fd(), &ev) != 0 ||
      ::epoll_ctl(epfd, EPOLL_CTL_ADD, devx->fd, &ev) != 0) {
    const int err = errno;
    if (epfd >= 0) ::close(epfd);
    host->destroy();
    mlx5dv_devx_destroy_cmd_comp(devx);
    fail_into(ec, err, "create_cmd_comp: epoll set-up failed: %s", std::strerror(err));
    return nullptr;
  }
  auto* cc = new (std::nothrow) devx_cmd_comp(dev, devx, host, epfd);
  if (!cc) {
    ::close(epfd);
    host->destroy();
    mlx5dv_devx_destroy_cmd_comp(devx);
    fail_into(ec, ENOMEM, "create_cmd_comp: out of memory");
    return nullptr;
  }
  dev.retain();
  ec.clear();
  return cc;
}

std::error_code mlx5_bind_flow_counter(ibv_context* ctx, slot& s) noexcept {
  std::uint32_t in[4] = {};
  std::uint32_t out[4] = {};
  set_dw(in, 0, op_alloc_flow_counter << 16);
  mlx5dv_devx_obj* obj = mlx5dv_devx_obj_create(ctx, in, sizeof in, out, sizeof out);
  if (!obj) {
    const int err = errno ? errno : EIO;
    const auto* o = reinterpret_cast<const unsigned char*>(out);
    return fail(err,
                "create_comp_cntr: ALLOC_FLOW_COUNTER through DEVX failed: %s (status 0x%x, "
                "syndrome 0x%x)",
                std::strerror(err), o[0], get_dw(o, 1));
  }
  auto* fc = new (std::nothrow) flow_counter;
  if (!fc) {
    mlx5dv_devx_obj_destroy(obj);
    return fail(ENOMEM, "create_comp_cntr: out of memory");
  }
  fc->obj = obj;
  fc->id = get_dw(reinterpret_cast<const unsigned char*>(out), 2);
  s.backend_data = fc;
  s.hw = &flow_counter_ops;
  return {};
}

void mlx5_unbind_flow_counter(slot& s) noexcept {
  if (!is_flow_counter(s)) return;
  flow_counter* fc = &fc_of(s);
  mlx5dv_devx_obj_destroy(fc->obj); // the kernel issues DEALLOC_FLOW_COUNTER
  delete fc;
  s.backend_data = nullptr;
  s.hw = nullptr;
}

} // namespace compcntr::detail

#endif // COMPCNTR_HAVE_MLX5_DEVX
