// compcntr:types -- the small value types shared by every layer: counter_type, attach_op,
// counter_caps, counter_values, counter_id, counter_options. Plain values: no requirements, no
// memory ordering (each type's comment says what its fields mean).
module;
#include <cstdint>
export module compcntr:types;

export namespace compcntr {

/// What a counter counts when completions feed it (verbs IBV_COMP_CNTR_TYPE_*).
enum class counter_type : std::uint32_t {
  wrs = 0,    ///< +1 per completed work request (the default)
  bytes = 1,  ///< +length of each completed operation
};

/// Operations whose completions a QP attachment counts (verbs IBV_QP_ATTACH_COMP_CNTR_OP_*).
enum class attach_op : std::uint32_t {
  send = 1u << 0,
  recv = 1u << 1,
  rdma_read = 1u << 2,
  remote_rdma_read = 1u << 3,
  rdma_write = 1u << 4,
  remote_rdma_write = 1u << 5,
};
inline constexpr std::uint32_t all_attach_ops = 0x3f;

/// Device capabilities for completion counters (verbs ibv_comp_cntr_caps).
struct counter_caps {
  std::uint64_t max_value = 0;              ///< values wrap to 0 past this
  std::uint32_t max_counters = 0;           ///< live counters the device can hold
  std::uint32_t supported_qp_attach_ops = 0;  ///< attach_op bits the device can count
};

/// Both values of a counter at one moment: the answer to an asynchronous counter query
/// (compcntr:cmd_comp). Same layout as the C struct compcntr_comp_cntr_values {comp, err}.
struct counter_values {
  std::uint64_t completions = 0;  ///< completion count
  std::uint64_t errors = 0;       ///< error count
};

/// A counter's name that can be kept after the counter is gone: its slot index and the slot's
/// generation when the id was taken (compcntr::counter::id()). Resolve it with
/// compcntr::device::resolve(): an id whose counter was destroyed is ESTALE, never the slot's
/// next owner. A default-constructed id names no counter (resolve() says EINVAL). Resolve an id
/// only with the device whose counter produced it: an id of another device, or one made up, may
/// name a slot that was never handed out (undefined behaviour), unless its index lies past the
/// device's arenas (EINVAL). (Not the C API's `handle`, which is the slot index alone.)
struct counter_id {
  std::uint64_t generation = 0;
  std::uint32_t index = UINT32_MAX;
  friend bool operator==(const counter_id&, const counter_id&) = default;
};
/// The former name of counter_id (until 0.2).
using counter_handle [[deprecated("use compcntr::counter_id")]] = counter_id;

/// Creation options for a counter.
struct counter_options {
  counter_type type = counter_type::wrs;
  /// NUMA node (OS index, as numactl and /sys/devices/system/node number them) for the
  /// counter's slot; negative: the node local to the CPU the creating thread runs on.
  int numa_node = -1;
  /// Striped counter (per-CPU stripes): 0 or 1: a plain counter (the default);
  /// compcntr::stripes_per_cpu: one stripe per CPU the system is configured for (rounded up to a
  /// power of two, at most 256); N: N stripes rounded up to a power of two (at most 256, else
  /// EINVAL). See docs/counters.md, "Striped counters", for when to choose it.
  std::uint32_t stripes = 0;
};

/// counter_options::stripes value: one stripe per CPU.
inline constexpr std::uint32_t stripes_per_cpu = UINT32_MAX;

} // namespace compcntr
