// The C API (compcntr/compcntr.h): every errno rule of the core counter calls.
#include <doctest/doctest.h>

#include <compcntr/compcntr.h>

#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

namespace {

struct soft_device {
  compcntr_device* dev = compcntr_open_device("soft");
  soft_device() { REQUIRE(dev != nullptr); }
  ~soft_device() { CHECK(compcntr_close_device(dev) == 0); }
};

compcntr_comp_cntr_init_attr attr_of(uint32_t type, uint32_t comp_mask = 0, uint32_t flags = 0,
                                     int32_t numa = 0) {
  compcntr_comp_cntr_init_attr a{};
  a.comp_mask = comp_mask;
  std::memcpy(&a.type, &type, sizeof type);  // out-of-range values are tested too
  a.flags = flags;
  a.numa_node = numa;
  return a;
}

compcntr_comp_cntr* create(compcntr_device* dev, uint32_t type = COMPCNTR_COMP_CNTR_TYPE_WRS) {
  auto a = attr_of(type);
  compcntr_comp_cntr* cc = compcntr_create_comp_cntr(dev, &a);
  REQUIRE(cc != nullptr);
  return cc;
}

uint64_t read(compcntr_comp_cntr* cc) {
  uint64_t v = 12345;
  REQUIRE(compcntr_read_comp_cntr(cc, &v) == 0);
  return v;
}
uint64_t read_err(compcntr_comp_cntr* cc) {
  uint64_t v = 12345;
  REQUIRE(compcntr_read_err_comp_cntr(cc, &v) == 0);
  return v;
}

std::string last_message() { return compcntr_last_error_message(); }

} // namespace

TEST_CASE("open_device: soft, NULL and auto, unknown names") {
  compcntr_device* soft = compcntr_open_device("soft");
  REQUIRE(soft);
  CHECK(std::string(compcntr_device_name(soft)) == "soft");
  compcntr_device* dflt = compcntr_open_device(nullptr);
  REQUIRE(dflt);
  compcntr_device* autod = compcntr_open_device("auto");
  REQUIRE(autod);
  CHECK(std::string(compcntr_device_name(dflt)) == compcntr_device_name(autod));

  errno = 0;
  CHECK(compcntr_open_device("no_such_rdma_dev") == nullptr);
  CHECK(errno == ENODEV);
  CHECK(last_message().find("no_such_rdma_dev") != std::string::npos);

  CHECK(compcntr_close_device(soft) == 0);
  CHECK(compcntr_close_device(dflt) == 0);
  CHECK(compcntr_close_device(autod) == 0);
}

TEST_CASE("NULL arguments are EINVAL, never a crash") {
  soft_device d;
  compcntr_comp_cntr* cc = create(d.dev);
  uint64_t v = 0;
  compcntr_comp_cntr_caps caps{};
  auto a = attr_of(COMPCNTR_COMP_CNTR_TYPE_WRS);

  CHECK(compcntr_close_device(nullptr) == EINVAL);
  CHECK(compcntr_device_name(nullptr) == nullptr);
  CHECK(compcntr_query_comp_cntr_caps(nullptr, &caps) == EINVAL);
  CHECK(compcntr_query_comp_cntr_caps(d.dev, nullptr) == EINVAL);
  errno = 0;
  CHECK(compcntr_create_comp_cntr(nullptr, &a) == nullptr);
  CHECK(errno == EINVAL);
  errno = 0;
  CHECK(compcntr_create_comp_cntr(d.dev, nullptr) == nullptr);
  CHECK(errno == EINVAL);
  CHECK(compcntr_destroy_comp_cntr(nullptr) == EINVAL);
  CHECK(compcntr_set_comp_cntr(nullptr, 1) == EINVAL);
  CHECK(compcntr_set_err_comp_cntr(nullptr, 1) == EINVAL);
  CHECK(compcntr_inc_comp_cntr(nullptr, 1) == EINVAL);
  CHECK(compcntr_inc_err_comp_cntr(nullptr, 1) == EINVAL);
  CHECK(compcntr_read_comp_cntr(nullptr, &v) == EINVAL);
  CHECK(compcntr_read_err_comp_cntr(nullptr, &v) == EINVAL);
  CHECK(compcntr_read_comp_cntr(cc, nullptr) == EINVAL);
  CHECK(compcntr_read_err_comp_cntr(cc, nullptr) == EINVAL);
  CHECK(last_message().find("NULL") != std::string::npos);
  CHECK(read(cc) == 0);  // nothing changed
  CHECK(read_err(cc) == 0);
  CHECK(compcntr_destroy_comp_cntr(cc) == 0);
}

TEST_CASE("create: flags, comp_mask and type are checked; refusals create nothing") {
  soft_device d;
  struct bad_case {
    uint32_t type, comp_mask, flags;
    int32_t numa;
    const char* what;
  };
  const bad_case cases[] = {
      {COMPCNTR_COMP_CNTR_TYPE_WRS, 0, 1, 0, "flags"},
      {COMPCNTR_COMP_CNTR_TYPE_BYTES, 0, 0x80000000u, 0, "flags"},
      {COMPCNTR_COMP_CNTR_TYPE_WRS, 1u << 2, 0, 0, "comp_mask"},  // 1 << 1: stripes
      {COMPCNTR_COMP_CNTR_TYPE_WRS, 0x80000000u, 0, 0, "comp_mask"},
      {2, 0, 0, 0, "type"},
      {0xffffffffu, 0, 0, 0, "type"},
      {COMPCNTR_COMP_CNTR_TYPE_WRS, COMPCNTR_COMP_CNTR_INIT_ATTR_NUMA_NODE, 0, -1, "NUMA node"},
      {COMPCNTR_COMP_CNTR_TYPE_WRS, COMPCNTR_COMP_CNTR_INIT_ATTR_NUMA_NODE, 0, 1 << 20,
       "NUMA node"},
  };
  for (const auto& bc : cases) {
    auto a = attr_of(bc.type, bc.comp_mask, bc.flags, bc.numa);
    errno = 0;
    CHECK_MESSAGE(compcntr_create_comp_cntr(d.dev, &a) == nullptr, bc.what);
    CHECK_MESSAGE(errno == EINVAL, bc.what);
    CHECK_MESSAGE(last_message().find(bc.what) != std::string::npos, last_message());
  }
  // Nothing was created: the device closes at once.
  CHECK(compcntr_close_device(d.dev) == 0);
  d.dev = compcntr_open_device("soft");
  REQUIRE(d.dev);

  // numa_node is ignored without its comp_mask bit, used with it.
  auto ignored = attr_of(COMPCNTR_COMP_CNTR_TYPE_WRS, 0, 0, -77);
  compcntr_comp_cntr* a = compcntr_create_comp_cntr(d.dev, &ignored);
  CHECK(a != nullptr);
  auto node0 = attr_of(COMPCNTR_COMP_CNTR_TYPE_BYTES, COMPCNTR_COMP_CNTR_INIT_ATTR_NUMA_NODE, 0, 0);
  compcntr_comp_cntr* b = compcntr_create_comp_cntr(d.dev, &node0);
  CHECK(b != nullptr);
  CHECK(compcntr_destroy_comp_cntr(a) == 0);
  CHECK(compcntr_destroy_comp_cntr(b) == 0);
}

TEST_CASE("get_type reports the type the counter was created with") {
  soft_device d;
  compcntr_comp_cntr* w = create(d.dev, COMPCNTR_COMP_CNTR_TYPE_WRS);
  compcntr_comp_cntr* b = create(d.dev, COMPCNTR_COMP_CNTR_TYPE_BYTES);
  compcntr_comp_cntr_type t = COMPCNTR_COMP_CNTR_TYPE_BYTES;
  CHECK(compcntr_comp_cntr_get_type(w, &t) == 0);
  CHECK(t == COMPCNTR_COMP_CNTR_TYPE_WRS);
  CHECK(compcntr_comp_cntr_get_type(b, &t) == 0);
  CHECK(t == COMPCNTR_COMP_CNTR_TYPE_BYTES);
  CHECK(compcntr_comp_cntr_get_type(nullptr, &t) == EINVAL);
  CHECK(compcntr_comp_cntr_get_type(w, nullptr) == EINVAL);
  CHECK(t == COMPCNTR_COMP_CNTR_TYPE_BYTES);
  CHECK(compcntr_destroy_comp_cntr(w) == 0);
  CHECK(compcntr_destroy_comp_cntr(b) == 0);
}

TEST_CASE("caps query") {
  soft_device d;
  compcntr_comp_cntr_caps caps{};
  REQUIRE(compcntr_query_comp_cntr_caps(d.dev, &caps) == 0);
  CHECK(caps.max_value == UINT64_MAX);
  CHECK(caps.max_counters >= 1048576u);
  CHECK(caps.supported_qp_attach_ops == 0x3fu);
}

TEST_CASE("set, inc and read both values; handle and context") {
  soft_device d;
  compcntr_comp_cntr* cc = create(d.dev, COMPCNTR_COMP_CNTR_TYPE_BYTES);
  compcntr_comp_cntr* other = create(d.dev);
  CHECK(cc->context == d.dev);
  CHECK(cc->handle != other->handle);
  CHECK(read(cc) == 0);
  CHECK(read_err(cc) == 0);
  CHECK(compcntr_inc_comp_cntr(cc, 4096) == 0);
  CHECK(compcntr_inc_comp_cntr(cc, 1) == 0);
  CHECK(compcntr_inc_err_comp_cntr(cc, 3) == 0);
  CHECK(read(cc) == 4097);
  CHECK(read_err(cc) == 3);
  CHECK(compcntr_set_comp_cntr(cc, 10) == 0);
  CHECK(compcntr_set_err_comp_cntr(cc, 20) == 0);
  CHECK(read(cc) == 10);
  CHECK(read_err(cc) == 20);
  CHECK(read(other) == 0);
  CHECK(read_err(other) == 0);

  // Wrap to 0 past max_value (UINT64_MAX).
  CHECK(compcntr_set_comp_cntr(cc, UINT64_MAX) == 0);
  CHECK(compcntr_inc_comp_cntr(cc, 1) == 0);
  CHECK(read(cc) == 0);
  CHECK(compcntr_set_err_comp_cntr(cc, UINT64_MAX - 2) == 0);
  CHECK(compcntr_inc_err_comp_cntr(cc, 4) == 0);
  CHECK(read_err(cc) == 1);

  CHECK(compcntr_destroy_comp_cntr(cc) == 0);
  CHECK(compcntr_destroy_comp_cntr(other) == 0);
}

TEST_CASE("close_device is EBUSY while counters live, and changes nothing") {
  compcntr_device* dev = compcntr_open_device("soft");
  REQUIRE(dev);
  compcntr_comp_cntr* cc = create(dev);
  CHECK(compcntr_inc_comp_cntr(cc, 2) == 0);
  CHECK(compcntr_close_device(dev) == EBUSY);
  CHECK(last_message().find("live") != std::string::npos);
  CHECK(compcntr_inc_comp_cntr(cc, 2) == 0);
  CHECK(read(cc) == 4);
  compcntr_comp_cntr* cc2 = create(dev);  // the device is still fully usable
  CHECK(compcntr_destroy_comp_cntr(cc2) == 0);
  CHECK(compcntr_destroy_comp_cntr(cc) == 0);
  CHECK(compcntr_close_device(dev) == 0);
}

TEST_CASE("ENOMEM at max_counters; nothing lost; destroy makes room") {
  ::setenv("COMPCNTR_MAX_COUNTERS", "3", 1);
  compcntr_device* dev = compcntr_open_device("soft");
  ::unsetenv("COMPCNTR_MAX_COUNTERS");
  REQUIRE(dev);
  compcntr_comp_cntr_caps caps{};
  REQUIRE(compcntr_query_comp_cntr_caps(dev, &caps) == 0);
  CHECK(caps.max_counters == 3);
  std::vector<compcntr_comp_cntr*> cs;
  for (int i = 0; i < 3; ++i) {
    cs.push_back(create(dev));
    CHECK(compcntr_inc_comp_cntr(cs.back(), 100 + i) == 0);
  }
  auto a = attr_of(COMPCNTR_COMP_CNTR_TYPE_WRS);
  errno = 0;
  CHECK(compcntr_create_comp_cntr(dev, &a) == nullptr);
  CHECK(errno == ENOMEM);
  for (int i = 0; i < 3; ++i) CHECK(read(cs[i]) == 100u + i);
  CHECK(compcntr_destroy_comp_cntr(cs[0]) == 0);
  cs[0] = create(dev);
  CHECK(read(cs[0]) == 0);
  for (auto* c : cs) CHECK(compcntr_destroy_comp_cntr(c) == 0);
  CHECK(compcntr_close_device(dev) == 0);
}

TEST_CASE("concurrent C increments are exact") {
  soft_device d;
  compcntr_comp_cntr* cc = create(d.dev);
  constexpr int threads = 3;
  constexpr int per = 100000;
  std::vector<std::thread> ts;
  std::atomic<int> failures{0};
  for (int t = 0; t < threads; ++t)
    ts.emplace_back([&] {
      for (int i = 0; i < per; ++i)
        if (compcntr_inc_comp_cntr(cc, 1) != 0 || compcntr_inc_err_comp_cntr(cc, 2) != 0)
          failures++;
    });
  for (auto& t : ts) t.join();
  CHECK(failures.load() == 0);
  CHECK(read(cc) == uint64_t{threads} * per);
  CHECK(read_err(cc) == 2ull * threads * per);
  CHECK(compcntr_destroy_comp_cntr(cc) == 0);
}
