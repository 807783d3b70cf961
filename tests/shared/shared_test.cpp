// Shared devices (compcntr:shared, include/compcntr/shared.h, docs/shared.md): counters created,
// resolved, updated and waited on across forked and exec'ed processes, exact totals from many
// processes, the open checks (names, flags, modes, owner, corrupt and truncated segments), stale
// segments replaced, peer death (SIGKILL at random points, pid reuse, zombies), and counter ids on
// private devices.
#include <doctest/doctest.h>

#include <compcntr/compcntr.h>
#include <fcntl.h>
#include <grp.h>
#include <poll.h>
#include <pwd.h>
#include <signal.h>
#include <spawn.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <linux/futex.h>
#include <sys/syscall.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <climits>
#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

import compcntr;

#include "shared_support.hpp"

using namespace shared_test;

namespace {

compcntr_device* open_or_fail(const seg_name& n) {
  compcntr_device* d = compcntr_open_device(n.dev().c_str());
  INFO(compcntr_last_error_message());
  REQUIRE(d != nullptr);
  return d;
}

compcntr_comp_cntr* create(compcntr_device* d) {
  compcntr_comp_cntr_init_attr a{};
  compcntr_comp_cntr* c = compcntr_create_comp_cntr(d, &a);
  INFO(compcntr_last_error_message());
  REQUIRE(c != nullptr);
  return c;
}

std::uint64_t value(compcntr_comp_cntr* c) {
  std::uint64_t v = ~0ull;
  REQUIRE(compcntr_read_comp_cntr(c, &v) == 0);
  return v;
}
std::uint64_t errors(compcntr_comp_cntr* c) {
  std::uint64_t v = ~0ull;
  REQUIRE(compcntr_read_err_comp_cntr(c, &v) == 0);
  return v;
}

compcntr_counter_id id_of(compcntr_comp_cntr* c) {
  compcntr_counter_id id{};
  REQUIRE(compcntr_comp_cntr_id(c, &id) == 0);
  return id;
}

// In a child: open, resolve, or exit with the line.
compcntr_device* child_open(const seg_name& n) {
  compcntr_device* d = compcntr_open_device(n.dev().c_str());
  if (d == nullptr) std::fprintf(stderr, "child open: %s\n", compcntr_last_error_message());
  CHILD_CHECK(d != nullptr);
  return d;
}

bool contains(const char* hay, const char* needle) { return std::strstr(hay, needle) != nullptr; }

// In a child: open the device, create a counter there, add `n`; its id, or exit with the line.
compcntr_counter_id child_create_counting(const seg_name& n, std::uint64_t value) {
  compcntr_device* cd = child_open(n);
  compcntr_comp_cntr_init_attr a{};
  compcntr_comp_cntr* c = compcntr_create_comp_cntr(cd, &a);
  CHILD_CHECK(c != nullptr);
  CHILD_CHECK(compcntr_inc_comp_cntr(c, value) == 0);
  compcntr_counter_id id{};
  CHILD_CHECK(compcntr_comp_cntr_id(c, &id) == 0);
  return id;
}

// A child that creates a counter on the segment, adds `value` and waits to be killed; its
// pid, the counter resolved in `d` and its id.
struct paused_creator {
  pid_t pid;
  compcntr_comp_cntr* counter;
  compcntr_counter_id id;
};
paused_creator spawn_paused_creator(const seg_name& n, compcntr_device* d, std::uint64_t value) {
  channel idc;
  const pid_t pid = spawn([&] {
    idc.send(child_create_counting(n, value));
    for (;;) ::pause(); // killed here
  });
  compcntr_counter_id id{};
  REQUIRE(idc.recv(id));
  compcntr_comp_cntr* r = compcntr_comp_cntr_resolve(d, &id);
  REQUIRE(r != nullptr);
  return {pid, r, id};
}

// The preamble of most cases: a segment of the case's own, one counter on it, and its id (the
// counter and the device are closed by the case itself, with its checks).
struct one_counter {
  seg_name n;
  compcntr_device* d;
  compcntr_comp_cntr* c;
  compcntr_counter_id id;
  explicit one_counter(const char* what)
      : n(what), d(open_or_fail(n)), c(create(d)), id(id_of(c)) {}
};

// ---- skips -----------------------------------------------------------------------------------
// A case that cannot run here (the cases that run a child as another uid need root) says
// "SKIP: reason" and returns. Those cases are in doctest test suite "other_uid", which
// tests/shared/meson.build runs as a test of its own (shared_other_uid): a run in which every
// case that ran skipped itself exits with status 77, meson's SKIP (as tests/runtime and
// tests/fi_apps report theirs), so a skipped case never counts as passed. In a run with other
// cases (the binary run by hand) a skip is the SKIP line only.
int skipped_cases = 0;
void skip(const char* reason) {
  std::printf("SKIP: %s: %s\n", doctest::getContextOptions()->currentTest->m_name, reason);
  ++skipped_cases;
}
struct skip_listener : doctest::IReporter {
  const doctest::ContextOptions& opt;
  bool only_skips = false;
  explicit skip_listener(const doctest::ContextOptions& o) : opt(o) {}
  void test_run_end(const doctest::TestRunStats& st) override {
    only_skips = skipped_cases > 0 && st.numTestCasesFailed == 0 &&
                 st.numTestCasesPassingFilters == static_cast<unsigned>(skipped_cases);
  }
  // Deleted after every reporter's test_run_end: the console summary is out.
  ~skip_listener() override {
    if (!only_skips) return;
    opt.cout->flush();
    std::fflush(nullptr);
    std::_Exit(77);
  }
  void report_query(const doctest::QueryData&) override {}
  void test_run_start() override {}
  void test_case_start(const doctest::TestCaseData&) override {}
  void test_case_reenter(const doctest::TestCaseData&) override {}
  void test_case_end(const doctest::CurrentTestCaseStats&) override {}
  void test_case_exception(const doctest::TestCaseException&) override {}
  void subcase_start(const doctest::SubcaseSignature&) override {}
  void subcase_end() override {}
  void log_assert(const doctest::AssertData&) override {}
  void log_message(const doctest::MessageData&) override {}
  void test_case_skipped(const doctest::TestCaseData&) override {}
};
REGISTER_LISTENER("skips", 1, skip_listener);

// In a child: become nobody (groups, gid, uid), or exit with the line. `gid`: the group to keep
// (a member of the creator's group), or nobody's own.
void become_nobody(gid_t keep_gid = static_cast<gid_t>(-1)) {
  const passwd* pw = ::getpwnam("nobody");
  const uid_t uid = pw ? pw->pw_uid : 65534;
  const gid_t gid = keep_gid != static_cast<gid_t>(-1) ? keep_gid : pw ? pw->pw_gid : 65534;
  CHILD_CHECK(::setgroups(0, nullptr) == 0);
  CHILD_CHECK(::setgid(gid) == 0);
  CHILD_CHECK(::setuid(uid) == 0);
  CHILD_CHECK(::geteuid() == uid);
}

} // namespace

TEST_CASE("open_shared_device: names, flags and modes are checked, nothing is created on refusal") {
  seg_name n("args");
  errno = 0;
  CHECK(compcntr_open_shared_device(nullptr, COMPCNTR_SHARED_CREATE, 0) == nullptr);
  CHECK(errno == EINVAL);
  for (const char* bad : {"", "a/b", "../x", "sp ace", "x\n"}) {
    errno = 0;
    CHECK(compcntr_open_shared_device(bad, COMPCNTR_SHARED_CREATE, 0) == nullptr);
    CHECK(errno == EINVAL);
    CHECK(contains(compcntr_last_error_message(), "[A-Za-z0-9._-]"));
  }
  const std::string long_name(201, 'a');
  errno = 0;
  CHECK(compcntr_open_shared_device(long_name.c_str(), COMPCNTR_SHARED_CREATE, 0) == nullptr);
  CHECK(errno == EINVAL);
  errno = 0;
  CHECK(compcntr_open_shared_device(n.name.c_str(), 4, 0) == nullptr);
  CHECK(errno == EINVAL);
  for (mode_t m : {0666, 0606, 0400, 01600, 0200}) {
    errno = 0;
    CHECK(compcntr_open_shared_device(n.name.c_str(), COMPCNTR_SHARED_CREATE, m) == nullptr);
    CHECK(errno == EINVAL);
  }
  errno = 0;
  CHECK(compcntr_open_shared_device(n.name.c_str(), 0, 0) == nullptr);  // absent, no CREATE
  CHECK(errno == ENOENT);
  struct stat st{};
  CHECK(::stat(("/dev/shm" + n.path).c_str(), &st) != 0);  // nothing was created

  compcntr_device* d =
      compcntr_open_shared_device(n.name.c_str(), COMPCNTR_SHARED_CREATE | COMPCNTR_SHARED_EXCL, 0);
  REQUIRE(d != nullptr);
  CHECK(std::string(compcntr_device_name(d)) == n.dev());
  REQUIRE(::stat(("/dev/shm" + n.path).c_str(), &st) == 0);
  CHECK((st.st_mode & 0777) == 0600);  // owner-only, whatever the umask
  errno = 0;  // in use: EXCL refuses, from this process as from any
  CHECK(compcntr_open_shared_device(n.name.c_str(), COMPCNTR_SHARED_CREATE | COMPCNTR_SHARED_EXCL,
                                    0) == nullptr);
  CHECK(errno == EEXIST);
  compcntr_device* d2 = compcntr_open_shared_device(n.name.c_str(), 0, 0);  // opens it
  REQUIRE(d2 != nullptr);
  compcntr_comp_cntr_caps caps{};
  REQUIRE(compcntr_query_comp_cntr_caps(d2, &caps) == 0);
  CHECK(caps.max_counters == shm::default_cells);
  CHECK(caps.max_value == UINT64_MAX);
  CHECK(compcntr_close_device(d2) == 0);
  CHECK(compcntr_close_device(d) == 0);
  // The last process to close it removed its name.
  CHECK(::stat(("/dev/shm" + n.path).c_str(), &st) != 0);

  // A group mode is kept exactly.
  compcntr_device* g = compcntr_open_shared_device(n.name.c_str(), COMPCNTR_SHARED_CREATE, 0660);
  REQUIRE(g != nullptr);
  REQUIRE(::stat(("/dev/shm" + n.path).c_str(), &st) == 0);
  CHECK((st.st_mode & 0777) == 0660);
  CHECK(compcntr_close_device(g) == 0);
}

TEST_CASE("shared counters: create here, resolve and update in a forked child, exact values") {
  seg_name n("fork");
  compcntr_device* d = open_or_fail(n);
  compcntr_comp_cntr* c = create(d);
  REQUIRE(compcntr_inc_comp_cntr(c, 7) == 0);
  const compcntr_counter_id id = id_of(c);
  channel back;  // child -> parent: the id of a counter the child created
  channel go;    // parent -> child: done reading, you may exit
  const pid_t pid = spawn([&] {
    compcntr_device* cd = child_open(n);
    compcntr_comp_cntr* r = compcntr_comp_cntr_resolve(cd, &id);
    CHILD_CHECK(r != nullptr);
    std::uint64_t v = 0;
    CHILD_CHECK(compcntr_read_comp_cntr(r, &v) == 0 && v == 7);
    CHILD_CHECK(compcntr_inc_comp_cntr(r, 5) == 0);
    CHILD_CHECK(compcntr_inc_err_comp_cntr(r, 2) == 0);
    compcntr_comp_cntr_init_attr a{};
    a.type = COMPCNTR_COMP_CNTR_TYPE_BYTES;
    compcntr_comp_cntr* mine = compcntr_create_comp_cntr(cd, &a);
    CHILD_CHECK(mine != nullptr);
    CHILD_CHECK(compcntr_set_comp_cntr(mine, 1000) == 0);
    CHILD_CHECK(compcntr_set_err_comp_cntr(mine, 3) == 0);
    compcntr_counter_id mid{};
    CHILD_CHECK(compcntr_comp_cntr_id(mine, &mid) == 0);
    back.send(mid);
    char ok = 0;
    CHILD_CHECK(go.recv(ok));
    // The parent added 11 to ours meanwhile.
    CHILD_CHECK(compcntr_read_comp_cntr(mine, &v) == 0 && v == 1011);
    CHILD_CHECK(compcntr_comp_cntr_release(r) == 0);
    CHILD_CHECK(compcntr_destroy_comp_cntr(mine) == 0);
    CHILD_CHECK(compcntr_close_device(cd) == 0);
  });
  compcntr_counter_id mid{};
  REQUIRE(back.recv(mid));
  CHECK(value(c) == 12);
  CHECK(errors(c) == 2);
  compcntr_comp_cntr* theirs = compcntr_comp_cntr_resolve(d, &mid);
  INFO(compcntr_last_error_message());
  REQUIRE(theirs != nullptr);
  CHECK(value(theirs) == 1000);
  CHECK(errors(theirs) == 3);
  compcntr_comp_cntr_type t{};
  REQUIRE(compcntr_comp_cntr_get_type(theirs, &t) == 0);
  CHECK(t == COMPCNTR_COMP_CNTR_TYPE_BYTES);
  REQUIRE(compcntr_inc_comp_cntr(theirs, 11) == 0);
  go.send('g');
  CHECK(reap(pid) == 0);
  // Its creator destroyed it while we hold it: still ours to read, no longer resolvable.
  CHECK(value(theirs) == 1011);
  errno = 0;
  CHECK(compcntr_comp_cntr_resolve(d, &mid) == nullptr);
  CHECK(errno == ENOENT);
  CHECK(contains(compcntr_last_error_message(), "destroyed"));
  CHECK(compcntr_comp_cntr_release(theirs) == 0);
  errno = 0;  // freed with our release: its generation is gone
  CHECK(compcntr_comp_cntr_resolve(d, &mid) == nullptr);
  CHECK(errno == ESTALE);
  {
    seg_view v(n);
    REQUIRE(v);
    CHECK(v.cells_in_use() == 1);  // only c
    CHECK(v.procs_in_use() == 1);  // only us
  }
  // Resolving in the creating process gives this process's counter (destroy then EBUSY).
  compcntr_comp_cntr* self = compcntr_comp_cntr_resolve(d, &id);
  REQUIRE(self != nullptr);
  CHECK(compcntr_destroy_comp_cntr(self) == EBUSY);  // a reference is not destroyed
  CHECK(compcntr_destroy_comp_cntr(c) == EBUSY);     // held by it
  CHECK(compcntr_comp_cntr_release(c) == EINVAL);    // the owner is not a reference
  CHECK(compcntr_comp_cntr_release(self) == 0);
  CHECK(compcntr_destroy_comp_cntr(c) == 0);
  errno = 0;
  CHECK(compcntr_comp_cntr_resolve(d, &id) == nullptr);
  CHECK(errno == ESTALE);
  compcntr_counter_id never{0, shm::default_cells - 1};
  errno = 0;
  CHECK(compcntr_comp_cntr_resolve(d, &never) == nullptr);
  CHECK(errno == ENOENT);
  compcntr_counter_id out{0, shm::default_cells};
  errno = 0;
  CHECK(compcntr_comp_cntr_resolve(d, &out) == nullptr);
  CHECK(errno == ENOENT);
  CHECK(compcntr_close_device(d) == 0);
}

TEST_CASE("shared counters: N processes x M increments give the exact total") {
  one_counter f("many");
  auto& [n, d, c, id] = f;
  constexpr int procs = 4;
  constexpr std::uint64_t per = 50'000;
  channel start;
  std::vector<pid_t> kids;
  for (int k = 0; k < procs; ++k)
    kids.push_back(spawn([&, k] {
      compcntr_device* cd = child_open(n);
      compcntr_comp_cntr* r = compcntr_comp_cntr_resolve(cd, &id);
      CHILD_CHECK(r != nullptr);
      char go = 0;
      CHILD_CHECK(start.recv(go));
      for (std::uint64_t i = 0; i < per; ++i) {
        CHILD_CHECK(compcntr_inc_comp_cntr(r, 1) == 0);
        if (i % 1000 == 0) CHILD_CHECK(compcntr_inc_err_comp_cntr(r, k + 1) == 0);
      }
      CHILD_CHECK(compcntr_comp_cntr_release(r) == 0);
      CHILD_CHECK(compcntr_close_device(cd) == 0);
    }));
  for (int k = 0; k < procs; ++k) start.send('g');
  for (std::uint64_t i = 0; i < per; ++i) REQUIRE(compcntr_inc_comp_cntr(c, 1) == 0);
  for (pid_t p : kids) CHECK(reap(p) == 0);
  CHECK(value(c) == per * (procs + 1));
  CHECK(errors(c) == (per / 1000) * (1 + 2 + 3 + 4));
  CHECK(compcntr_destroy_comp_cntr(c) == 0);
  CHECK(compcntr_close_device(d) == 0);
}

TEST_CASE("shared counters: a waiter asleep in the kernel is woken by another process") {
  one_counter f("sleep");
  auto& [n, d, c, id] = f;
  seg_view view(n);
  REQUIRE(view);
  // A wait that times out in another process: ETIMEDOUT, exactly.
  const pid_t t = spawn([&] {
    compcntr_device* cd = child_open(n);
    compcntr_comp_cntr* r = compcntr_comp_cntr_resolve(cd, &id);
    CHILD_CHECK(r != nullptr);
    CHILD_CHECK(compcntr_wait_comp_cntr(r, 1, 30) == ETIMEDOUT);
    CHILD_CHECK(compcntr_wait_comp_cntr(r, 1, 0) == ETIMEDOUT);
    CHILD_CHECK(compcntr_comp_cntr_release(r) == 0);
    CHILD_CHECK(compcntr_close_device(cd) == 0);
  });
  CHECK(reap(t) == 0);
  const pid_t w = spawn([&] {
    compcntr_device* cd = child_open(n);
    compcntr_comp_cntr* r = compcntr_comp_cntr_resolve(cd, &id);
    CHILD_CHECK(r != nullptr);
    compcntr_wait_attr a{};
    a.comp_mask = COMPCNTR_WAIT_ATTR_SPIN;
    a.spin_ns = 0;  // straight to the kernel
    CHILD_CHECK(compcntr_wait_comp_cntr_ex(r, 3, -1, &a) == 0);
    std::uint64_t v = 0;
    CHILD_CHECK(compcntr_read_comp_cntr(r, &v) == 0 && v == 3);
    CHILD_CHECK(compcntr_comp_cntr_release(r) == 0);
    CHILD_CHECK(compcntr_close_device(cd) == 0);
  });
  // The child registers in the segment's sleeper count right before FUTEX_WAIT.
  REQUIRE(eventually([&] { return view.hdr().sleepers.load() == 1; }));
  REQUIRE(compcntr_inc_comp_cntr(c, 2) == 0);  // below its threshold: it sleeps on
  REQUIRE(compcntr_inc_comp_cntr(c, 1) == 0);
  CHECK(reap(w) == 0);
  CHECK(view.hdr().sleepers.load() == 0);
  CHECK(compcntr_destroy_comp_cntr(c) == 0);
  CHECK(compcntr_close_device(d) == 0);
}

TEST_CASE("shared counters: the C++ API (open, open_shared, id, resolve, wait) across fork") {
  seg_name n("cxx");
  std::error_code ec;
  auto dev = compcntr::device::open(n.dev(), ec);
  INFO(compcntr::last_error_message());
  REQUIRE_FALSE(ec);
  auto c = dev.create_counter(compcntr::counter_type::wrs, ec);
  REQUIRE_FALSE(ec);
  const compcntr::counter_id id = c.id();
  CHECK(id.index < shm::default_cells);
  const pid_t pid = spawn([&] {
    std::error_code e;
    auto cd = compcntr::device::open_shared(n.name, compcntr::shared_create, 0600, e);
    CHILD_CHECK(!e);
    auto r = cd.resolve(id, e);
    CHILD_CHECK(!e && r);
    CHILD_CHECK(r.id() == id);
    r.add(40);
    r.add_error(1);
  });
  CHECK(reap(pid) == 0);
  CHECK(c.value() == 40);
  CHECK(c.errors() == 1);
  CHECK(compcntr::wait(c, 40, std::chrono::milliseconds(0)) == std::errc{});
  auto self = dev.resolve(id, ec);
  REQUIRE_FALSE(ec);
  CHECK(self.native_slot() == c.native_slot());  // one local slot per counter per process
  self.reset();
  const int cfd = compcntr::pollable_fd(c, ec);  // shared counters have fds (tests below)
  CHECK(cfd >= 0);
  CHECK_FALSE(ec);
  CHECK(compcntr::pollable_fd(c, ec) == cfd);
  CHECK(dev.sweep(ec) == 0);  // the child closed: nobody dead
  CHECK_FALSE(ec);
  auto soft = compcntr::device::open("soft", ec);
  REQUIRE_FALSE(ec);
  CHECK(soft.sweep(ec) == 0);
  CHECK(ec == std::errc::invalid_argument);
}

#ifdef COMPCNTR_SHARED_CHILD
TEST_CASE("shared counters: an exec'ed program resolves, updates and waits") {
  one_counter f("exec");
  auto& [n, d, c, id] = f;
  seg_view view(n);
  REQUIRE(view);
  const std::string gen = std::to_string(id.generation), idx = std::to_string(id.index);
  std::vector<std::string> args = {COMPCNTR_SHARED_CHILD, n.name, gen, idx, "25"};
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  pid_t pid = 0;
  REQUIRE(::posix_spawn(&pid, COMPCNTR_SHARED_CHILD, nullptr, nullptr, argv.data(), environ) == 0);
  // It adds 25, then sleeps until the value reaches 100 (we add 75 once it sleeps).
  REQUIRE(eventually([&] { return value(c) == 25 && view.hdr().sleepers.load() == 1; }));
  REQUIRE(compcntr_inc_comp_cntr(c, 75) == 0);
  CHECK(reap(pid) == 0);
  CHECK(value(c) == 100);
  CHECK(errors(c) == 0);
  CHECK(compcntr_destroy_comp_cntr(c) == 0);
  CHECK(compcntr_close_device(d) == 0);
}
#endif

TEST_CASE("shared devices: another user is refused (a child running as nobody)" *
          doctest::test_suite("other_uid")) {
  if (::geteuid() != 0) return skip("needs root to run a child as nobody");
  seg_name n("nobody");
  compcntr_device* d = open_or_fail(n);
  const pid_t pid = spawn([&] {
    become_nobody();
    errno = 0;
    CHILD_CHECK(compcntr_open_device(n.dev().c_str()) == nullptr);
    CHILD_CHECK(errno == EACCES);
    CHILD_CHECK(contains(compcntr_last_error_message(), "another user"));
    errno = 0;
    CHILD_CHECK(compcntr_open_shared_device(n.name.c_str(), 0, 0) == nullptr);
    CHILD_CHECK(errno == EACCES);
  });
  CHECK(reap(pid) == 0);
  CHECK(compcntr_close_device(d) == 0);

  // The other way: a segment nobody created (0600) is refused to us although root may open it.
  seg_name m("nobodys");
  channel made, done;
  const pid_t owner = spawn([&] {
    become_nobody();
    compcntr_device* nd = compcntr_open_device(m.dev().c_str());
    CHILD_CHECK(nd != nullptr);
    made.send('m');
    char x = 0;
    CHILD_CHECK(done.recv(x));
    CHILD_CHECK(compcntr_close_device(nd) == 0);
  });
  char x = 0;
  REQUIRE(made.recv(x));
  errno = 0;
  CHECK(compcntr_open_device(m.dev().c_str()) == nullptr);
  CHECK(errno == EACCES);
  CHECK(contains(compcntr_last_error_message(), "belongs to uid"));
  done.send('d');
  CHECK(reap(owner) == 0);
}

TEST_CASE("shared devices: a group segment (mode 0660) is used by another uid of its group, "
          "refused to uids outside it; 0600 is refused to the group" *
          doctest::test_suite("other_uid")) {
  if (::geteuid() != 0) return skip("needs root to run a child as nobody");
  seg_name g("group"), o("owneronly");
  compcntr_device* d = compcntr_open_shared_device(g.name.c_str(), COMPCNTR_SHARED_CREATE, 0660);
  INFO(compcntr_last_error_message());
  REQUIRE(d != nullptr);
  compcntr_device* od = open_or_fail(o);  // the default, owner only
  struct stat st{};
  REQUIRE(::stat(("/dev/shm" + g.path).c_str(), &st) == 0);
  CHECK((st.st_mode & 0777) == 0660);
  compcntr_comp_cntr* c = create(d);
  REQUIRE(compcntr_inc_comp_cntr(c, 40) == 0);
  const compcntr_counter_id id = id_of(c);
  const gid_t group = st.st_gid;
  // nobody, in the segment's group: opens it, resolves the counter, adds; the 0600 one refused.
  const pid_t member = spawn([&] {
    become_nobody(group);
    compcntr_device* cd = child_open(g);
    compcntr_comp_cntr* r = compcntr_comp_cntr_resolve(cd, &id);
    CHILD_CHECK(r != nullptr);
    CHILD_CHECK(compcntr_inc_comp_cntr(r, 2) == 0);
    CHILD_CHECK(compcntr_comp_cntr_release(r) == 0);
    CHILD_CHECK(compcntr_close_device(cd) == 0);
    errno = 0;
    CHILD_CHECK(compcntr_open_device(o.dev().c_str()) == nullptr);
    CHILD_CHECK(errno == EACCES);
  });
  CHECK(reap(member) == 0);
  CHECK(value(c) == 42);
  // nobody in its own group: refused, and the counter unchanged.
  const pid_t outsider = spawn([&] {
    become_nobody();
    errno = 0;
    CHILD_CHECK(compcntr_open_device(g.dev().c_str()) == nullptr);
    CHILD_CHECK(errno == EACCES);
    CHILD_CHECK(contains(compcntr_last_error_message(), "group"));
  });
  CHECK(reap(outsider) == 0);
  CHECK(value(c) == 42);
  CHECK(compcntr_destroy_comp_cntr(c) == 0);
  CHECK(compcntr_close_device(d) == 0);
  CHECK(compcntr_close_device(od) == 0);
}

TEST_CASE("shared devices: truncated and crafted segments are refused with EBADMSG / EINVAL") {
  seg_name n("trunc");
  // A real header (what this library writes) to cut short or bend; its process table names a
  // live process (us), so the segment is not stale.
  std::vector<unsigned char> good(shm::total_size(shm::default_cells), 0);
  {
    compcntr_device* d = open_or_fail(n);
    seg_view v(n);
    REQUIRE(v);
    REQUIRE(v.size == good.size());
    std::memcpy(good.data(), v.base, shm::page);
    CHECK(compcntr_close_device(d) == 0);
  }
  auto write_file = [&](const std::vector<unsigned char>& bytes, std::size_t len, mode_t mode) {
    ::shm_unlink(n.path.c_str());
    const int fd = ::shm_open(n.path.c_str(), O_RDWR | O_CREAT | O_EXCL, mode);
    REQUIRE(fd >= 0);
    REQUIRE(::fchmod(fd, mode) == 0);
    REQUIRE(::ftruncate(fd, static_cast<off_t>(len)) == 0);
    const std::size_t head = std::min(len, shm::page);
    REQUIRE(::pwrite(fd, bytes.data(), head, 0) == static_cast<ssize_t>(head));
    ::close(fd);
  };
  auto expect = [&](int err, const char* what) {
    errno = 0;
    compcntr_device* d = compcntr_open_device(n.dev().c_str());
    INFO(what << ": " << compcntr_last_error_message());
    CHECK(d == nullptr);
    CHECK(errno == err);
    if (d) compcntr_close_device(d);
  };
  // Live: entry 0 is this process (pid + start time as the library reads them).
  auto* h = reinterpret_cast<shm::header*>(good.data());
  {
    std::error_code ec;
    auto probe = compcntr::device::open(n.dev(), ec);  // registers us: copy our word
    REQUIRE_FALSE(ec);
    seg_view v(n);
    REQUIRE(v);
    h->procs[0].store(v.hdr().procs[0].load());
  }
  for (std::size_t len : {std::size_t{1}, std::size_t{100}, shm::page - 1}) {
    write_file(good, len, 0600);
    expect(EBADMSG, "shorter than the header");
  }
  for (std::size_t len : {shm::page, good.size() - 1, good.size() / 2, good.size() + shm::page}) {
    write_file(good, len, 0600);
    expect(EBADMSG, "size differs from the header's");
  }
  std::vector<unsigned char> bad = good;
  reinterpret_cast<shm::header*>(bad.data())->magic ^= 1;
  write_file(bad, good.size(), 0600);
  expect(EBADMSG, "magic");
  bad = good;
  reinterpret_cast<shm::header*>(bad.data())->version = shm::version + 1;
  write_file(bad, good.size(), 0600);
  expect(EINVAL, "version");
  bad = good;
  reinterpret_cast<shm::header*>(bad.data())->cell_count = shm::max_cells + 1;
  write_file(bad, good.size(), 0600);
  expect(EBADMSG, "cell count");
  bad = good;
  reinterpret_cast<shm::header*>(bad.data())->records_offset += 64;
  write_file(bad, good.size(), 0600);
  expect(EBADMSG, "offset");
  bad = good;
  reinterpret_cast<shm::header*>(bad.data())->state.store(77);
  write_file(bad, good.size(), 0600);
  expect(EBADMSG, "state");
  bad = good;
  reinterpret_cast<shm::header*>(bad.data())->creator_uid += 1;
  write_file(bad, good.size(), 0600);
  expect(EBADMSG, "creator uid");
  write_file(good, good.size(), 0606);
  expect(EACCES, "open to every user");
  // The intact copy opens (the checks above refused only what they name).
  write_file(good, good.size(), 0600);
  compcntr_device* d = compcntr_open_device(n.dev().c_str());
  INFO(compcntr_last_error_message());
  REQUIRE(d != nullptr);
  compcntr_comp_cntr* c = create(d);
  CHECK(compcntr_inc_comp_cntr(c, 1) == 0);
  CHECK(value(c) == 1);
  CHECK(compcntr_destroy_comp_cntr(c) == 0);
  CHECK(compcntr_close_device(d) == 0);
}

TEST_CASE("shared devices: a stale segment is replaced, never reused half-initialised") {
  seg_name n("stale");
  // 1. Every process that used it died (a child _exits without closing): replaced on open.
  channel idc;
  const pid_t pid = spawn([&] {
    idc.send(child_create_counting(n, 9));
    ::_exit(0);  // no close: its entry and its cell stay behind
  });
  compcntr_counter_id id{};
  REQUIRE(idc.recv(id));
  CHECK(reap(pid) == 0);
  {
    seg_view v(n);
    REQUIRE(v);
    CHECK(v.cells_in_use() == 1);
    CHECK(v.procs_in_use() == 1);
  }
  errno = 0;  // without CREATE a stale segment is not taken over
  CHECK(compcntr_open_shared_device(n.name.c_str(), 0, 0) == nullptr);
  CHECK(errno == ENOENT);
  CHECK(contains(compcntr_last_error_message(), "stale"));
  compcntr_device* d = open_or_fail(n);
  {
    seg_view v(n);
    REQUIRE(v);
    CHECK(v.cells_in_use() == 0);  // re-initialised: the dead child's cell is gone
    CHECK(v.procs_in_use() == 1);  // only us
  }
  errno = 0;
  CHECK(compcntr_comp_cntr_resolve(d, &id) == nullptr);
  CHECK(errno == ENOENT);
  CHECK(compcntr_close_device(d) == 0);

  // 2. A creator that died initialising it (state still "initializing", its table naming a
  //    live process: us) is stale too.
  {
    compcntr_device* e = open_or_fail(n);
    seg_view v(n);
    REQUIRE(v);
    compcntr_comp_cntr* c = create(e);
    (void)c;
    v.hdr().state.store(shm::seg_initializing);
    compcntr_device* f = compcntr_open_device(n.dev().c_str());
    INFO(compcntr_last_error_message());
    REQUIRE(f != nullptr);  // replaced
    CHECK(v.hdr().state.load() == shm::seg_ready);
    CHECK(compcntr_close_device(f) == 0);
    // e's mapping is of the same file: its counter was wiped by the re-initialisation, which
    // is what a creator that died mid-init leaves to its successor (documented). Tidy up.
    CHECK(compcntr_destroy_comp_cntr(c) == 0);
    CHECK(compcntr_close_device(e) == 0);
  }
  // 3. Size 0 (the creator died between shm_open and ftruncate): initialised by the opener.
  ::shm_unlink(n.path.c_str());
  const int fd = ::shm_open(n.path.c_str(), O_RDWR | O_CREAT | O_EXCL, 0600);
  REQUIRE(fd >= 0);
  ::close(fd);
  errno = 0;
  CHECK(compcntr_open_shared_device(n.name.c_str(), 0, 0) == nullptr);
  CHECK(errno == ENOENT);
  compcntr_device* g = open_or_fail(n);
  compcntr_comp_cntr* c = create(g);
  CHECK(compcntr_inc_comp_cntr(c, 2) == 0);
  CHECK(value(c) == 2);
  CHECK(compcntr_destroy_comp_cntr(c) == 0);
  CHECK(compcntr_close_device(g) == 0);

  // 4. Retired but still linked (its last process marked it retired and could not remove its
  //    name): stale, even while its table still names a live process (here a child that marks
  //    it and stays alive, as a pid reused by another program would look); replaced by an open
  //    with CREATE, ENOENT without.
  channel made;
  const pid_t last = spawn([&] {
    const compcntr_counter_id cid = child_create_counting(n, 5);
    seg_view v(n);
    CHILD_CHECK(v);
    v.hdr().state.store(shm::seg_retired);
    made.send(cid);
    for (;;) ::pause();  // killed below: alive while the parent opens
  });
  struct kill_on_exit {  // a failed REQUIRE must not leave the paused child behind
    pid_t pid;
    ~kill_on_exit() {
      if (pid > 0) ::kill(pid, SIGKILL), reap(pid);
    }
  } guard{last};
  compcntr_counter_id rid{};
  REQUIRE(made.recv(rid));
  {
    seg_view v(n);
    REQUIRE(v);
    CHECK(v.hdr().state.load() == shm::seg_retired);
    CHECK(v.cells_in_use() == 1);
  }
  errno = 0;
  CHECK(compcntr_open_shared_device(n.name.c_str(), 0, 0) == nullptr);
  CHECK(errno == ENOENT);
  CHECK(contains(compcntr_last_error_message(), "stale"));
  compcntr_device* h = open_or_fail(n);
  {
    seg_view v(n);
    REQUIRE(v);
    CHECK(v.hdr().state.load() == shm::seg_ready);
    CHECK(v.cells_in_use() == 0);
    CHECK(v.procs_in_use() == 1);
  }
  errno = 0;
  CHECK(compcntr_comp_cntr_resolve(h, &rid) == nullptr);
  CHECK(errno == ENOENT);
  compcntr_comp_cntr* fresh = create(h);
  CHECK(value(fresh) == 0);
  CHECK(compcntr_destroy_comp_cntr(fresh) == 0);
  CHECK(compcntr_close_device(h) == 0);
  REQUIRE(::kill(last, SIGKILL) == 0);
  CHECK(reap(last) == 1000 + SIGKILL);
  guard.pid = 0;
}

TEST_CASE("shared devices: the 57th live process is refused with EUSERS, and gets in once one "
          "closes") {
  seg_name n("users");
  compcntr_device* d = open_or_fail(n);  // process 1 of shm::max_procs
  compcntr_comp_cntr* c = create(d);
  const compcntr_counter_id id = id_of(c);
  struct holder {
    pid_t pid;
    channel opened, go;
  };
  std::vector<std::unique_ptr<holder>> hs;
  for (std::uint32_t i = 1; i < shm::max_procs; ++i) {  // processes 2 .. max_procs
    auto h = std::make_unique<holder>();
    holder* hp = h.get();
    h->pid = spawn([hp, &n, &id] {
      compcntr_device* cd = child_open(n);
      compcntr_comp_cntr* r = compcntr_comp_cntr_resolve(cd, &id);
      CHILD_CHECK(r != nullptr);
      CHILD_CHECK(compcntr_inc_comp_cntr(r, 1) == 0);
      hp->opened.send('o');
      char x = 0;
      CHILD_CHECK(hp->go.recv(x));
      CHILD_CHECK(compcntr_comp_cntr_release(r) == 0);
      CHILD_CHECK(compcntr_close_device(cd) == 0);
    });
    char x = 0;
    REQUIRE(h->opened.recv(x));
    hs.push_back(std::move(h));
  }
  CHECK(value(c) == shm::max_procs - 1);
  const pid_t refused = spawn([&] {
    errno = 0;
    CHILD_CHECK(compcntr_open_device(n.dev().c_str()) == nullptr);
    CHILD_CHECK(errno == EUSERS);
    CHILD_CHECK(contains(compcntr_last_error_message(), "live processes"));
  });
  CHECK(reap(refused) == 0);
  CHECK(value(c) == shm::max_procs - 1);  // the refusal changed nothing
  hs.back()->go.send('g');
  CHECK(reap(hs.back()->pid) == 0);
  hs.pop_back();
  const pid_t admitted = spawn([&] {
    compcntr_device* cd = child_open(n);
    compcntr_comp_cntr* r = compcntr_comp_cntr_resolve(cd, &id);
    CHILD_CHECK(r != nullptr);
    CHILD_CHECK(compcntr_inc_comp_cntr(r, 100) == 0);
    CHILD_CHECK(compcntr_comp_cntr_release(r) == 0);
    CHILD_CHECK(compcntr_close_device(cd) == 0);
  });
  CHECK(reap(admitted) == 0);
  CHECK(value(c) == shm::max_procs - 1 + 100);
  for (auto& h : hs) {
    h->go.send('g');
    CHECK(reap(h->pid) == 0);
  }
  CHECK(compcntr_destroy_comp_cntr(c) == 0);
  CHECK(compcntr_close_device(d) == 0);
}

TEST_CASE("shared counters: a creator's death ends a forever-wait with EIO; values stay exact") {
  seg_name n("death");
  compcntr_device* d = open_or_fail(n);
  const auto [pid, r, id] = spawn_paused_creator(n, d, 3);
  REQUIRE(::kill(pid, SIGKILL) == 0);
  CHECK(reap(pid) == 1000 + SIGKILL);
  // Nobody sweeps for us: the sleeping wait itself finds the creator dead (within ~1 s).
  CHECK(compcntr_wait_comp_cntr(r, 4, -1) == EIO);
  CHECK(value(r) == 3);
  CHECK(errors(r) == 0);
  REQUIRE(compcntr_inc_comp_cntr(r, 1) == 0);  // still a counter for its holders
  CHECK(value(r) == 4);
  errno = 0;
  CHECK(compcntr_comp_cntr_resolve(d, &id) == nullptr);
  CHECK(errno == ENOENT);
  CHECK(contains(compcntr_last_error_message(), "creator died"));
  CHECK(compcntr_comp_cntr_release(r) == 0);
  {
    seg_view v(n);
    REQUIRE(v);
    CHECK(v.cells_in_use() == 0);
    CHECK(v.procs_in_use() == 1);
  }
  CHECK(compcntr_close_device(d) == 0);
}

// A spin-only waiter (never sleeps, so it never sweeps) polls in blocks over the counter's two
// halves and looks at the cell's "creator died" state once per block: when another wait's sweep
// marks the creator dead, the spinner ends with EIO too (without that look it would spin for ever).
TEST_CASE(
    "shared counters: a spin-only forever-wait ends with EIO once the creator is found dead") {
  seg_name n("spindeath");
  compcntr_device* d = open_or_fail(n);
  const auto [pid, r, id] = spawn_paused_creator(n, d, 3);
  std::atomic<bool> started{false};
  int spun = -1;
  std::thread spinner([&, r = r] {
    compcntr_wait_attr a{};
    a.comp_mask = COMPCNTR_WAIT_ATTR_SPIN;
    a.spin_ns = COMPCNTR_WAIT_SPIN_FOREVER;
    started.store(true);
    spun = compcntr_wait_comp_cntr_ex(r, 4, -1, &a);
  });
  while (!started.load()) std::this_thread::yield();
  REQUIRE(::kill(pid, SIGKILL) == 0);
  CHECK(reap(pid) == 1000 + SIGKILL);
  CHECK(compcntr_wait_comp_cntr(r, 4, -1) == EIO); // sleeps, sweeps, finds the creator dead
  spinner.join();
  CHECK(spun == EIO);
  CHECK(value(r) == 3);
  CHECK(compcntr_comp_cntr_release(r) == 0);
  CHECK(compcntr_close_device(d) == 0);
}

// The kill points: while it opens the segment, creates, adds, destroys (mid-create, mid-add,
// holding references), polls (timeout 0), and asleep in the kernel in a wait on the counter the
// parent created (or entering or leaving that sleep). After each: the sweep reclaims it, the
// parent's counters are exact, nothing of the child's is left (cells, entry, sweep lock, its
// share of the sleeper count), and the sleeper count is at most 1 above the shares per kill (the
// order shared_sleeper_enter documents: never below them, so a wake is never lost).
TEST_CASE("shared counters: a child SIGKILLed at random points, 200 runs, invariants after each") {
  seg_name n("kill");
  compcntr_device* d = open_or_fail(n);
  compcntr_comp_cntr* mine = create(d); // only the parent updates it
  compcntr_comp_cntr* target = create(d); // the children increment it
  const compcntr_counter_id tid = id_of(target);
  seg_view view(n);
  REQUIRE(view);
  std::mt19937 rng(12345);
  std::uint64_t expect_mine = 0;
  std::uint32_t sleepers = 0; // the count after the last run's sweep
  int asleep = 0; // kills that found the child registered as a sleeper
  for (int run = 0; run < 200; ++run) {
    channel ready;
    const unsigned spins = rng() % 200'000;
    const pid_t pid = spawn([&] {
      ready.send('r'); // started: the parent kills after a random spin from here
      compcntr_device* cd = compcntr_open_device(n.dev().c_str());
      if (!cd) ::_exit(0);
      compcntr_comp_cntr* r = compcntr_comp_cntr_resolve(cd, &tid);
      compcntr_comp_cntr_init_attr a{};
      compcntr_wait_attr sleep_now{};
      sleep_now.comp_mask = COMPCNTR_WAIT_ATTR_SPIN;
      sleep_now.spin_ns = 0; // into the kernel at once
      for (std::uint64_t i = 0;; ++i) {
        compcntr_comp_cntr* c = compcntr_create_comp_cntr(cd, &a);
        if (c) compcntr_inc_comp_cntr(c, 1);
        if (r) compcntr_inc_comp_cntr(r, 1);
        if (r && i % 16 == 0) compcntr_wait_comp_cntr(r, ~0ull, 0);
        if (r && i % 4096 == 512)
          compcntr_wait_comp_cntr_ex(r, ~0ull, 1, &sleep_now); // 1 ms asleep
        if (c && i % 2 == 0) compcntr_destroy_comp_cntr(c); // half are left alive
      }
    });
    char x = 0;
    REQUIRE(ready.recv(x));
    for (unsigned k = 0; k < spins; ++k) compcntr::cpu_relax();
    asleep += view.sleeper_shares() != 0; // we never sleep: the child's share
    REQUIRE(::kill(pid, SIGKILL) == 0);
    REQUIRE(reap(pid) == 1000 + SIGKILL);
    std::uint32_t dead = 0;
    REQUIRE(compcntr_sweep_shared_device(d, &dead) == 0);
    CHECK(dead <= 1);
    REQUIRE(view.sleeper_shares() == 0);
    const std::uint32_t now_sleepers = view.hdr().sleepers.load();
    REQUIRE(now_sleepers >= sleepers);
    REQUIRE(now_sleepers <= sleepers + 1);
    sleepers = now_sleepers;
    // Invariants: our counters exact and ours; nothing of the child's left in the segment.
    REQUIRE(compcntr_inc_comp_cntr(mine, run) == 0);
    expect_mine += static_cast<std::uint64_t>(run);
    REQUIRE(value(mine) == expect_mine);
    REQUIRE(errors(mine) == 0);
    REQUIRE(view.cells_in_use() == 2);
    REQUIRE(view.procs_in_use() == 1);
    REQUIRE(view.hdr().sweep_lock.load() == 0);
  }
  MESSAGE(asleep << " of 200 kills found the child asleep in a wait (or entering or leaving it); "
                    "sleeper count left above the shares: "
                 << sleepers);
  CHECK(asleep > 0);
  // Still usable: a sleeper of ours is woken by our add; resolve, create, destroy.
  std::atomic<int> woke{-1};
  std::thread t([&] { woke.store(compcntr_wait_comp_cntr(target, 1'000'000'000, -1)); });
  REQUIRE(eventually([&] { return view.sleeper_shares() == 1; }));
  REQUIRE(compcntr_set_comp_cntr(target, 1'000'000'000) == 0);
  t.join();
  CHECK(woke.load() == 0);
  compcntr_comp_cntr* r = compcntr_comp_cntr_resolve(d, &tid);
  REQUIRE(r != nullptr);
  CHECK(compcntr_comp_cntr_release(r) == 0);
  compcntr_comp_cntr* c = create(d);
  CHECK(compcntr_destroy_comp_cntr(c) == 0);
  CHECK(compcntr_destroy_comp_cntr(target) == 0);
  CHECK(compcntr_destroy_comp_cntr(mine) == 0);
  CHECK(compcntr_close_device(d) == 0);
}

TEST_CASE("shared devices: random bytes over the header, cells and records never crash") {
  seg_name n("fuzz");
  std::mt19937_64 rng(777);
  for (int run = 0; run < 80; ++run) {
    compcntr_device* d = open_or_fail(n);
    compcntr_comp_cntr* a = create(d);
    compcntr_comp_cntr* b = create(d);
    REQUIRE(compcntr_inc_comp_cntr(a, 1) == 0);
    const compcntr_counter_id ida = id_of(a);
    {
      seg_view v(n);
      REQUIRE(v);
      auto* bytes = static_cast<unsigned char*>(v.base);
      const std::size_t header_end = sizeof(shm::header);
      const std::size_t recs = shm::records_offset(shm::default_cells);
      // header, the cells in use, the records in use, or anywhere past the header (cells and
      // records nobody uses yet: the create's scan for a free cell and the sweep read them all)
      const int region = run % 4;
      const std::size_t total = shm::total_size(shm::default_cells);
      const int n_bytes = 1 + static_cast<int>(rng() % 64);
      for (int k = 0; k < n_bytes; ++k) {
        std::size_t off = region == 0   ? rng() % header_end
                          : region == 1 ? shm::cells_offset() + rng() % (2 * sizeof(shm::cell))
                          : region == 2
                              ? recs + rng() % (4 * sizeof(shm::record))
                              : shm::cells_offset() + rng() % (total - shm::cells_offset());
        if (region == 0 && off < 8 && run % 6 != 0) off = 8 + rng() % (header_end - 8);
        bytes[off] = static_cast<unsigned char>(rng());
      }
    }
    // Another process opens it and uses it: errors are errno values, never a signal.
    const pid_t pid = spawn([&] {
      errno = 0;
      compcntr_device* cd = compcntr_open_device(n.dev().c_str());
      if (!cd) {
        CHILD_CHECK(errno == EBADMSG || errno == EINVAL || errno == EACCES || errno == EUSERS ||
                    errno == ENOENT);
        return;
      }
      for (std::uint32_t k = 0; k < 8; ++k) {
        // the first cells, then any index, out of range ones included (EINVAL or ENOENT)
        const std::uint32_t i =
            k < 4 ? k : static_cast<std::uint32_t>(rng() % (shm::default_cells + 16));
        compcntr_counter_id id{static_cast<std::uint64_t>(rng() % 3), i};
        errno = 0;
        compcntr_comp_cntr* r = compcntr_comp_cntr_resolve(cd, &id);
        if (!r) {
          CHILD_CHECK(errno == ENOENT || errno == ESTALE || errno == EBADMSG || errno == EINVAL);
          continue;
        }
        std::uint64_t v = 0;
        CHILD_CHECK(compcntr_inc_comp_cntr(r, 1) == 0);
        CHILD_CHECK(compcntr_read_comp_cntr(r, &v) == 0);
        const int w = compcntr_wait_comp_cntr(r, ~0ull, 1);
        CHILD_CHECK(w == ETIMEDOUT || w == EIO);
        CHILD_CHECK(compcntr_comp_cntr_release(r) == 0);
      }
      compcntr_comp_cntr_init_attr at{};
      compcntr_comp_cntr* c = compcntr_create_comp_cntr(cd, &at);
      if (c) CHILD_CHECK(compcntr_destroy_comp_cntr(c) == 0);
      CHILD_CHECK(compcntr_sweep_shared_device(cd, nullptr) == 0);
      CHILD_CHECK(compcntr_close_device(cd) == 0);
    });
    CHECK(reap(pid) == 0);
    // This process keeps using its own mapping of the scribbled segment: no crash either.
    std::uint64_t v = 0;
    CHECK(compcntr_inc_comp_cntr(a, 1) == 0);
    CHECK(compcntr_read_comp_cntr(a, &v) == 0);
    CHECK(compcntr_wait_comp_cntr(b, ~0ull, 1) != 0);
    compcntr_comp_cntr* r = compcntr_comp_cntr_resolve(d, &ida);
    if (r) CHECK(compcntr_comp_cntr_release(r) == 0);
    CHECK(compcntr_sweep_shared_device(d, nullptr) == 0);
    CHECK(compcntr_destroy_comp_cntr(a) == 0);
    CHECK(compcntr_destroy_comp_cntr(b) == 0);
    CHECK(compcntr_close_device(d) == 0);
    ::shm_unlink(n.path.c_str()); // a scribbled state word may have kept it from retiring
  }
}

TEST_CASE("counter ids on a private device: id, resolve, release") {
  compcntr_device* d = compcntr_open_device("soft");
  REQUIRE(d != nullptr);
  compcntr_comp_cntr* c = create(d);
  REQUIRE(compcntr_inc_comp_cntr(c, 4) == 0);
  const compcntr_counter_id id = id_of(c);
  CHECK(id.index == c->handle);
  CHECK(compcntr_comp_cntr_id(nullptr, nullptr) == EINVAL);
  compcntr_counter_id tmp{};
  CHECK(compcntr_comp_cntr_id(c, nullptr) == EINVAL);
  CHECK(compcntr_comp_cntr_id(nullptr, &tmp) == EINVAL);
  errno = 0;
  CHECK(compcntr_comp_cntr_resolve(nullptr, &id) == nullptr);
  CHECK(errno == EINVAL);
  errno = 0;
  CHECK(compcntr_comp_cntr_resolve(d, nullptr) == nullptr);
  CHECK(errno == EINVAL);
  compcntr_comp_cntr* r = compcntr_comp_cntr_resolve(d, &id);
  REQUIRE(r != nullptr);
  CHECK(value(r) == 4);
  REQUIRE(compcntr_inc_comp_cntr(r, 1) == 0);
  CHECK(value(c) == 5);
  CHECK(compcntr_destroy_comp_cntr(c) == EBUSY); // held by the reference
  CHECK(compcntr_destroy_comp_cntr(r) == EBUSY); // a reference is released, not destroyed
  CHECK(contains(compcntr_last_error_message(), "compcntr_comp_cntr_release"));
  CHECK(compcntr_comp_cntr_set_owner(r, nullptr) == EINVAL);
  CHECK(compcntr_comp_cntr_release(c) == EINVAL);
  CHECK(compcntr_comp_cntr_release(nullptr) == EINVAL);
  CHECK(compcntr_comp_cntr_release(r) == 0);
  CHECK(compcntr_destroy_comp_cntr(c) == 0);
  errno = 0;
  CHECK(compcntr_comp_cntr_resolve(d, &id) == nullptr);
  CHECK(errno == ESTALE);
  compcntr_counter_id none{0, 0xfffffff0u};
  errno = 0;
  CHECK(compcntr_comp_cntr_resolve(d, &none) == nullptr);
  CHECK(errno == ENOENT);
  CHECK(compcntr_close_device(d) == 0);
}

TEST_CASE("shared counters: credits, completion tracker and poll work across processes") {
  seg_name n("helpers");
  compcntr_device* d = open_or_fail(n);
  // Credits: 2 per peer; the peer process returns them by incrementing the peer counter.
  compcntr_credits* cr = compcntr_credits_create(d, 1, 2);
  INFO(compcntr_last_error_message());
  REQUIRE(cr != nullptr);
  const compcntr_counter_id credits_id = id_of(compcntr_credits_counter(cr, 0));
  // Tracker over a shared counter the peer completes into.
  compcntr_comp_cntr* done = create(d);
  compcntr_tracker* t = compcntr_tracker_create(done);
  REQUIRE(t != nullptr);
  const compcntr_counter_id done_id = id_of(done);
  compcntr_comp_cntr* a = create(d);
  compcntr_comp_cntr* b = create(d);
  const compcntr_counter_id b_id = id_of(b);
  channel go;
  const pid_t pid = spawn([&] {
    compcntr_device* cd = child_open(n);
    compcntr_comp_cntr* c = compcntr_comp_cntr_resolve(cd, &credits_id);
    compcntr_comp_cntr* k = compcntr_comp_cntr_resolve(cd, &done_id);
    compcntr_comp_cntr* pb = compcntr_comp_cntr_resolve(cd, &b_id);
    CHILD_CHECK(c && k && pb);
    char x = 0;
    CHILD_CHECK(go.recv(x));
    CHILD_CHECK(compcntr_inc_comp_cntr(c, 2) == 0); // two credits back
    CHILD_CHECK(compcntr_inc_comp_cntr(k, 3) == 0); // three completions
    CHILD_CHECK(compcntr_inc_comp_cntr(pb, 1) == 0); // wakes the poll
    CHILD_CHECK(compcntr_comp_cntr_release(c) == 0);
    CHILD_CHECK(compcntr_comp_cntr_release(k) == 0);
    CHILD_CHECK(compcntr_comp_cntr_release(pb) == 0);
    CHILD_CHECK(compcntr_close_device(cd) == 0);
  });
  REQUIRE(compcntr_credits_acquire(cr, 0, 2, 0) == 0); // the window
  CHECK(compcntr_credits_acquire(cr, 0, 1, 0) == ETIMEDOUT); // empty until the peer returns
  REQUIRE(compcntr_tracker_issue(t, 3) == 0);
  CHECK(compcntr_tracker_quiet(t, 0) == ETIMEDOUT);
  go.send('g');
  CHECK(compcntr_credits_acquire(cr, 0, 2, -1) == 0); // returned by the other process
  CHECK(compcntr_tracker_quiet(t, -1) == 0);
  compcntr_comp_cntr* const ccs[2] = {a, b};
  const std::uint64_t thresholds[2] = {1, 1};
  std::size_t which = 9;
  CHECK(compcntr_poll_comp_cntrs(ccs, thresholds, 2, -1, &which) == 0);
  CHECK(which == 1);
  CHECK(reap(pid) == 0);
  CHECK(compcntr_tracker_destroy(t) == 0);
  CHECK(compcntr_credits_destroy(cr) == 0);
  CHECK(compcntr_destroy_comp_cntr(done) == 0);
  CHECK(compcntr_destroy_comp_cntr(a) == 0);
  CHECK(compcntr_destroy_comp_cntr(b) == 0);
  CHECK(compcntr_close_device(d) == 0);
}

TEST_CASE("shared devices: the name removed once every process opened it (docs/shared.md)") {
  // What examples/runtime does: all processes open the segment, one removes its name; they
  // keep resolving, updating and waiting; nothing is left in /dev/shm; a later segment of the
  // same name is a new one, and the old segment's last close leaves it alone.
  one_counter f("unlink");
  auto& [n, d, c, id] = f;
  channel opened, go;
  const pid_t pid = spawn([&] {
    compcntr_device* cd = child_open(n);
    opened.send('o');
    char x = 0;
    CHILD_CHECK(go.recv(x)); // the name is gone now
    compcntr_comp_cntr* r = compcntr_comp_cntr_resolve(cd, &id);
    CHILD_CHECK(r != nullptr);
    CHILD_CHECK(compcntr_inc_comp_cntr(r, 5) == 0); // wakes the parent's wait
    CHILD_CHECK(compcntr_wait_comp_cntr(r, 6, 10000) == 0);
    CHILD_CHECK(compcntr_comp_cntr_release(r) == 0);
    CHILD_CHECK(compcntr_close_device(cd) == 0);
  });
  char x = 0;
  REQUIRE(opened.recv(x));
  REQUIRE(::shm_unlink(n.path.c_str()) == 0);
  struct stat st{};
  CHECK(::stat(("/dev/shm" + n.path).c_str(), &st) != 0);
  errno = 0; // no longer opened by name
  CHECK(compcntr_open_shared_device(n.name.c_str(), 0, 0) == nullptr);
  CHECK(errno == ENOENT);
  compcntr_device* fresh = open_or_fail(n); // a new segment of the same name
  CHECK(compcntr_comp_cntr_resolve(fresh, &id) == nullptr); // not the old one's counters
  go.send('g');
  CHECK(compcntr_wait_comp_cntr(c, 5, 10000) == 0);
  CHECK(compcntr_inc_comp_cntr(c, 1) == 0);
  CHECK(reap(pid) == 0);
  CHECK(value(c) == 6);
  CHECK(compcntr_destroy_comp_cntr(c) == 0);
  CHECK(compcntr_close_device(d) == 0); // the last of the unlinked one: the new name stays
  CHECK(::stat(("/dev/shm" + n.path).c_str(), &st) == 0);
  compcntr_device* again = compcntr_open_shared_device(n.name.c_str(), 0, 0);
  INFO(compcntr_last_error_message());
  CHECK(again != nullptr);
  if (again) CHECK(compcntr_close_device(again) == 0);
  CHECK(compcntr_close_device(fresh) == 0); // its last process: removed
  CHECK(::stat(("/dev/shm" + n.path).c_str(), &st) != 0);
}

// ---- pollable fds of shared counters (docs/shared.md, "Pollable fds") ----------------------

namespace {

int get_fd(compcntr_comp_cntr* c) {
  int fd = -1;
  const int rc = compcntr_comp_cntr_get_fd(c, &fd);
  INFO(compcntr_last_error_message());
  REQUIRE(rc == 0);
  REQUIRE(fd >= 0);
  return fd;
}

// poll(2) of one fd for at most `ms` (-1: no limit): 1 readable, 0 not (timed out).
int readable(int fd, int ms) {
  pollfd p{fd, POLLIN, 0};
  int r = 0;
  while ((r = ::poll(&p, 1, ms)) < 0 && errno == EINTR) {
  }
  return r;
}

// In a child: open, resolve id, or exit with the line.
compcntr_comp_cntr* child_resolve(compcntr_device* cd, const compcntr_counter_id& id) {
  compcntr_comp_cntr* r = compcntr_comp_cntr_resolve(cd, &id);
  if (r == nullptr) std::fprintf(stderr, "child resolve: %s\n", compcntr_last_error_message());
  CHILD_CHECK(r != nullptr);
  return r;
}

} // namespace

TEST_CASE("shared fds: a threshold-armed fd is readable exactly when another process reaches it") {
  seg_name n("fdthr");
  const int fds0 = proc_self_entries("fd");
  CHECK(eventually([] { return watcher_threads() == 0; }, 200000));
  {
    compcntr_device* d = open_or_fail(n);
    compcntr_comp_cntr* c = create(d);
    const compcntr_counter_id id = id_of(c);
    seg_view view(n);
    REQUIRE(view);
    const int fd = get_fd(c);
    channel step, ack;
    const pid_t pid = spawn([&] {
      compcntr_device* cd = child_open(n);
      compcntr_comp_cntr* r = child_resolve(cd, id);
      for (int k = 0; k < 4; ++k) {
        char go = 0;
        CHILD_CHECK(step.recv(go));
        CHILD_CHECK(compcntr_inc_comp_cntr(r, 3) == 0);
        ack.send('a');
      }
      CHILD_CHECK(compcntr_comp_cntr_release(r) == 0);
      CHILD_CHECK(compcntr_close_device(cd) == 0);
    });
    REQUIRE(compcntr_comp_cntr_arm_fd_threshold(c, 10) == 0);
    CHECK(eventually([] { return watcher_threads() == 1; }, 200000)); // the device's fd watcher
    // The watcher sleeps on the segment as a waiter: one sleeper.
    REQUIRE(eventually([&] { return view.hdr().sleepers.load() == 1; }));
    char a = 0;
    for (std::uint64_t k = 1; k <= 3; ++k) { // 3, 6, 9: below the threshold, not readable
      step.send('g');
      REQUIRE(ack.recv(a));
      CHECK(value(c) == 3 * k);
      CHECK(readable(fd, 50) == 0);
    }
    step.send('g'); // 12 >= 10
    REQUIRE(ack.recv(a));
    CHECK(readable(fd, 10000) == 1);
    CHECK(value(c) == 12);
    std::uint64_t ticks = 0;
    CHECK(::read(fd, &ticks, sizeof ticks) == 8);
    CHECK(ticks == 1); // one-shot: one signal
    // Disarmed: nothing armed, the watcher parks and stops being a sleeper (updates pay nothing).
    CHECK(eventually([&] { return view.hdr().sleepers.load() == 0; }));
    CHECK(reap(pid) == 0);
    // Already reached at the arm: readable at once, by the arm itself.
    REQUIRE(compcntr_comp_cntr_arm_fd_threshold(c, 12) == 0);
    CHECK(readable(fd, 0) == 1);
    CHECK(compcntr_destroy_comp_cntr(c) == 0);
    CHECK(compcntr_close_device(d) == 0);
  }
  // The eventfd went with the counter, the watcher thread with the device.
  CHECK(eventually([] { return watcher_threads() == 0; }, 200000));
  CHECK(proc_self_entries("fd") == fds0);
}

TEST_CASE("shared fds: a plain arm hears another process's update; own updates signal inline") {
  one_counter f("fdplain");
  auto& [n, d, c, id] = f;
  const int fd = get_fd(c);
  REQUIRE(compcntr_comp_cntr_arm_fd(c) == 0);
  CHECK(readable(fd, 0) == 0);
  channel go, done;
  const pid_t pid = spawn([&] {
    compcntr_device* cd = child_open(n);
    compcntr_comp_cntr* r = child_resolve(cd, id);
    char x = 0;
    CHILD_CHECK(go.recv(x));
    CHILD_CHECK(compcntr_inc_err_comp_cntr(r, 1) == 0); // an error count moving is a change too
    done.send('d');
    CHILD_CHECK(go.recv(x));
    CHILD_CHECK(compcntr_inc_comp_cntr(r, 4) == 0);
    done.send('d');
    // Sets that leave the value and the error count as they were are updates too.
    CHILD_CHECK(go.recv(x));
    CHILD_CHECK(compcntr_set_comp_cntr(r, 4) == 0);
    done.send('d');
    CHILD_CHECK(go.recv(x));
    CHILD_CHECK(compcntr_set_err_comp_cntr(r, 1) == 0);
    CHILD_CHECK(compcntr_comp_cntr_release(r) == 0);
    CHILD_CHECK(compcntr_close_device(cd) == 0);
  });
  go.send('g');
  char x = 0;
  REQUIRE(done.recv(x));
  CHECK(readable(fd, 10000) == 1);
  CHECK(errors(c) == 1);
  CHECK(value(c) == 0);
  // Re-armed with nothing new: not readable (the arm drained the last readiness).
  REQUIRE(compcntr_comp_cntr_arm_fd(c) == 0);
  CHECK(readable(fd, 50) == 0);
  go.send('g');
  REQUIRE(done.recv(x));
  CHECK(readable(fd, 10000) == 1);
  CHECK(value(c) == 4);
  // Another process's set to the same value: heard (the cell's count of sets moved). Before,
  // the watcher compared only value and errors and this fd stayed unreadable.
  REQUIRE(compcntr_comp_cntr_arm_fd(c) == 0);
  CHECK(readable(fd, 0) == 0);
  go.send('g');
  REQUIRE(done.recv(x));
  CHECK(readable(fd, 10000) == 1);
  REQUIRE(compcntr_comp_cntr_arm_fd(c) == 0);
  go.send('g');
  CHECK(reap(pid) == 0);
  CHECK(readable(fd, 10000) == 1); // set_err to the same error count
  CHECK(value(c) == 4);
  CHECK(errors(c) == 1);
  // This process's own update signals inline, as on a private counter.
  REQUIRE(compcntr_comp_cntr_arm_fd(c) == 0);
  CHECK(readable(fd, 0) == 0);
  REQUIRE(compcntr_inc_comp_cntr(c, 1) == 0);
  CHECK(readable(fd, 0) == 1);
  CHECK(compcntr_destroy_comp_cntr(c) == 0);
  CHECK(compcntr_close_device(d) == 0);
}

#ifdef COMPCNTR_SHARED_CHILD
TEST_CASE("shared fds: an exec'ed program's update makes the parent's armed fd readable") {
  one_counter f("fdexec");
  auto& [n, d, c, id] = f;
  const int fd = get_fd(c);
  REQUIRE(compcntr_comp_cntr_arm_fd_threshold(c, 25) == 0);
  const std::string gen = std::to_string(id.generation), idx = std::to_string(id.index);
  std::vector<std::string> args = {COMPCNTR_SHARED_CHILD, n.name, gen, idx, "25"};
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  pid_t pid = 0;
  REQUIRE(::posix_spawn(&pid, COMPCNTR_SHARED_CHILD, nullptr, nullptr, argv.data(), environ) == 0);
  CHECK(readable(fd, 10000) == 1); // it adds 25, then sleeps until 100
  CHECK(value(c) == 25);
  REQUIRE(compcntr_inc_comp_cntr(c, 75) == 0);
  CHECK(reap(pid) == 0);
  CHECK(value(c) == 100);
  CHECK(compcntr_destroy_comp_cntr(c) == 0);
  CHECK(compcntr_close_device(d) == 0);
}
#endif

TEST_CASE(
    "shared fds: 4 updating processes, 3 arming processes, every readiness at its threshold") {
  one_counter f("fdmany");
  auto& [n, d, c, id] = f;
  constexpr int updaters = 4, armers = 2;
  constexpr std::uint64_t per = 2000, total = per * updaters;
  channel start, ready;
  std::vector<pid_t> kids;
  for (int k = 0; k < armers; ++k)
    kids.push_back(spawn([&, k] {
      compcntr_device* cd = child_open(n);
      compcntr_comp_cntr* r = child_resolve(cd, id);
      int fd = -1;
      CHILD_CHECK(compcntr_comp_cntr_get_fd(r, &fd) == 0);
      ready.send('r');
      const std::uint64_t stepsz = 250 + 150 * static_cast<std::uint64_t>(k);
      for (std::uint64_t thr = stepsz; thr <= total; thr += stepsz) {
        CHILD_CHECK(compcntr_comp_cntr_arm_fd_threshold(r, thr) == 0);
        CHILD_CHECK(readable(fd, 20000) == 1);
        std::uint64_t v = 0;
        CHILD_CHECK(compcntr_read_comp_cntr(r, &v) == 0 && v >= thr);
      }
      CHILD_CHECK(compcntr_comp_cntr_release(r) == 0); // closes its fd
      CHILD_CHECK(compcntr_close_device(cd) == 0);
    }));
  for (int k = 0; k < updaters; ++k)
    kids.push_back(spawn([&] {
      compcntr_device* cd = child_open(n);
      compcntr_comp_cntr* r = child_resolve(cd, id);
      char go = 0;
      CHILD_CHECK(start.recv(go));
      for (std::uint64_t i = 0; i < per; ++i) CHILD_CHECK(compcntr_inc_comp_cntr(r, 1) == 0);
      CHILD_CHECK(compcntr_comp_cntr_release(r) == 0);
      CHILD_CHECK(compcntr_close_device(cd) == 0);
    }));
  char x = 0;
  for (int k = 0; k < armers; ++k) REQUIRE(ready.recv(x));
  const int fd = get_fd(c);
  for (int k = 0; k < updaters; ++k) start.send('g');
  int rounds = 0;
  for (std::uint64_t thr = 100; thr <= total; thr += 100, ++rounds) {
    REQUIRE(compcntr_comp_cntr_arm_fd_threshold(c, thr) == 0);
    REQUIRE(readable(fd, 20000) == 1);
    const std::uint64_t v = value(c);
    INFO("threshold " << thr << " value " << v);
    CHECK(v >= thr);
  }
  CHECK(rounds == static_cast<int>(total / 100));
  for (pid_t p : kids) CHECK(reap(p) == 0);
  CHECK(value(c) == total);
  CHECK(compcntr_destroy_comp_cntr(c) == 0);
  CHECK(compcntr_close_device(d) == 0);
}

TEST_CASE("shared fds: an updater killed between its update and its wake-up cannot hide it") {
  one_counter f("fdkill");
  auto& [n, d, c, id] = f;
  seg_view view(n);
  REQUIRE(view);
  const int fd = get_fd(c);
  REQUIRE(compcntr_comp_cntr_arm_fd_threshold(c, 7) == 0);
  REQUIRE(eventually([&] { return view.hdr().sleepers.load() == 1; }));
  const pid_t pid = spawn([&] {
    compcntr_device* cd = child_open(n);
    (void)child_resolve(cd, id);
    // The cell's RMW an update does, then death before it looks at the sleeper count (no wake).
    seg_view v(n);
    CHILD_CHECK(v);
    v.cell(id.index).h[1].value.fetch_add(7, std::memory_order_seq_cst);
    ::raise(SIGKILL);
  });
  CHECK(reap(pid) == 1000 + SIGKILL);
  CHECK(readable(fd, 10000) == 1); // the watcher re-checks every 250 ms
  CHECK(value(c) == 7);
  std::uint32_t reclaimed = 99;
  CHECK(compcntr_sweep_shared_device(d, &reclaimed) == 0); // (the watcher may have swept it)
  CHECK(view.procs_in_use() == 1);
  CHECK(view.cells_in_use() == 1);
  CHECK(compcntr_destroy_comp_cntr(c) == 0);
  CHECK(compcntr_close_device(d) == 0);
}

TEST_CASE("shared fds: the counter's creator dies: the armed fd becomes readable, waits say EIO") {
  seg_name n("fdcreator");
  compcntr_device* d = open_or_fail(n);
  const auto [pid, r, id] = spawn_paused_creator(n, d, 3);
  const int fd = get_fd(r);
  REQUIRE(compcntr_comp_cntr_arm_fd_threshold(r, 100) == 0);
  CHECK(readable(fd, 50) == 0);
  REQUIRE(::kill(pid, SIGKILL) == 0);
  CHECK(reap(pid) == 1000 + SIGKILL);
  CHECK(readable(fd, 10000) == 1); // the watcher's sweep (every second) finds the death
  CHECK(value(r) == 3);
  CHECK(compcntr_wait_comp_cntr(r, 100, 0) == EIO);
  CHECK(compcntr_comp_cntr_release(r) == 0);
  CHECK(compcntr_close_device(d) == 0);
}

TEST_CASE("shared fds: a process killed while armed leaves the others working, nothing held") {
  one_counter f("fdwaiter");
  auto& [n, d, c, id] = f;
  seg_view view(n);
  REQUIRE(view);
  channel ready;
  const pid_t pid = spawn([&] {
    compcntr_device* cd = child_open(n);
    compcntr_comp_cntr* r = child_resolve(cd, id);
    int fd = -1;
    CHILD_CHECK(compcntr_comp_cntr_get_fd(r, &fd) == 0);
    CHILD_CHECK(compcntr_comp_cntr_arm_fd_threshold(r, 1000) == 0);
    ready.send('r');
    for (;;) ::pause(); // killed here, armed
  });
  char x = 0;
  REQUIRE(ready.recv(x));
  REQUIRE(eventually([&] { return view.hdr().sleepers.load() == 1; })); // its watcher
  REQUIRE(::kill(pid, SIGKILL) == 0);
  CHECK(reap(pid) == 1000 + SIGKILL);
  std::uint32_t reclaimed = 99;
  CHECK(compcntr_sweep_shared_device(d, &reclaimed) == 0);
  CHECK(reclaimed == 1);
  CHECK(view.procs_in_use() == 1);
  CHECK(view.cells_in_use() == 1); // its hold on c is gone, c stays
  // Its watcher's registration left the sleeper count with its entry (its share; it stayed
  // there before per-process shares, and every later update paid a needless FUTEX_WAKE).
  CHECK(view.hdr().sleepers.load() == 0);
  CHECK(view.sleeper_shares() == 0);
  // Our fd on c, fed by another process, works as before.
  const int fd = get_fd(c);
  REQUIRE(compcntr_comp_cntr_arm_fd_threshold(c, 2) == 0);
  const pid_t up = spawn([&] {
    compcntr_device* cd = child_open(n);
    compcntr_comp_cntr* r = child_resolve(cd, id);
    CHILD_CHECK(compcntr_inc_comp_cntr(r, 2) == 0);
    CHILD_CHECK(compcntr_comp_cntr_release(r) == 0);
    CHILD_CHECK(compcntr_close_device(cd) == 0);
  });
  CHECK(readable(fd, 10000) == 1);
  CHECK(value(c) == 2);
  CHECK(reap(up) == 0);
  CHECK(compcntr_destroy_comp_cntr(c) == 0);
  CHECK(compcntr_close_device(d) == 0);
}

TEST_CASE("shared fds: close is EBUSY while armed counters live; destroy closes the fd; no leaks") {
  seg_name n("fdclose");
  const int fds0 = proc_self_entries("fd");
  CHECK(eventually([] { return watcher_threads() == 0; }, 200000));
  compcntr_device* d = open_or_fail(n);
  compcntr_comp_cntr* c = create(d);
  const compcntr_counter_id id = id_of(c);
  const int fd = get_fd(c);
  REQUIRE(compcntr_comp_cntr_arm_fd_threshold(c, 5) == 0);
  CHECK(eventually([] { return watcher_threads() == 1; }, 200000));
  CHECK(compcntr_close_device(d) == EBUSY); // refused: the counter and its armed fd go on
  const pid_t up = spawn([&] {
    compcntr_device* cd = child_open(n);
    compcntr_comp_cntr* r = child_resolve(cd, id);
    CHILD_CHECK(compcntr_inc_comp_cntr(r, 5) == 0);
    CHILD_CHECK(compcntr_comp_cntr_release(r) == 0);
    CHILD_CHECK(compcntr_close_device(cd) == 0);
  });
  CHECK(readable(fd, 10000) == 1);
  CHECK(reap(up) == 0);
  // Armed again, then destroyed: the counter owns its fd, which is closed (never signalled).
  REQUIRE(compcntr_comp_cntr_arm_fd_threshold(c, 100) == 0);
  CHECK(readable(fd, 0) == 0);
  CHECK(compcntr_destroy_comp_cntr(c) == 0);
  errno = 0;
  CHECK(::fcntl(fd, F_GETFD) == -1);
  CHECK(errno == EBADF);
  // Destroyed while another process still holds the counter: our fd is closed all the same.
  compcntr_comp_cntr* c2 = create(d);
  const compcntr_counter_id id2 = id_of(c2);
  {
    channel held, go; // (their fds are closed before the count below)
    const pid_t holder = spawn([&] { // keeps c2 alive after our destroy
      compcntr_device* cd = child_open(n);
      compcntr_comp_cntr* r = child_resolve(cd, id2);
      held.send('h');
      char x = 0;
      CHILD_CHECK(go.recv(x));
      CHILD_CHECK(compcntr_comp_cntr_release(r) == 0);
      CHILD_CHECK(compcntr_close_device(cd) == 0);
    });
    char x = 0;
    REQUIRE(held.recv(x));
    const int fd2 = get_fd(c2);
    REQUIRE(compcntr_comp_cntr_arm_fd(c2) == 0);
    CHECK(compcntr_destroy_comp_cntr(c2) == 0);
    errno = 0;
    CHECK(::fcntl(fd2, F_GETFD) == -1);
    CHECK(errno == EBADF);
    go.send('g');
    CHECK(reap(holder) == 0);
  }
  CHECK(compcntr_close_device(d) == 0); // joins the watcher
  CHECK(eventually([] { return watcher_threads() == 0; }, 200000));
  CHECK(proc_self_entries("fd") == fds0);
}

TEST_CASE("shared fds: a forked child cannot arm a parent's device's fd (EOWNERDEAD), named") {
  seg_name n("fdfork");
  compcntr_device* d = open_or_fail(n);
  compcntr_comp_cntr* c = create(d);
  const int fd = get_fd(c);
  const pid_t before = spawn([&] { // forked before any arm: no watcher anywhere yet
    CHILD_CHECK(compcntr_comp_cntr_arm_fd(c) == EOWNERDEAD);
  });
  CHECK(reap(before) == 0);
  REQUIRE(compcntr_comp_cntr_arm_fd(c) == 0); // starts the watcher
  const pid_t after = spawn([&] {
    CHILD_CHECK(compcntr_comp_cntr_arm_fd_threshold(c, 1) == EOWNERDEAD);
    CHILD_CHECK(contains(compcntr_last_error_message(), "fork()"));
    CHILD_CHECK(contains(compcntr_last_error_message(), "open the device in the child"));
  });
  CHECK(reap(after) == 0);
  CHECK(readable(fd, 0) == 0); // the refused arms changed nothing here
  REQUIRE(compcntr_inc_comp_cntr(c, 1) == 0);
  CHECK(readable(fd, 0) == 1);
  CHECK(compcntr_destroy_comp_cntr(c) == 0);
  CHECK(compcntr_close_device(d) == 0);
}

TEST_CASE(
    "shared fds: stress (TSan): foreign updates, re-arms and armed counters coming and going") {
  // A thread plays another process: it adds to the cell through a separate mapping of the
  // segment and wakes sleepers as notify_shared does, so only the watcher can hear it.
  one_counter f("fdstress");
  auto& [n, d, c, id] = f;
  seg_view view(n);
  REQUIRE(view);
  const int fd = get_fd(c);
  std::atomic<bool> stop{false};
  std::thread foreign([&] {
    shm::header& h = view.hdr();
    shm::cell& cell = view.cell(id.index);
    for (unsigned k = 0; !stop.load(std::memory_order_relaxed); ++k) {
      cell.h[k & 1].value.fetch_add(1, std::memory_order_seq_cst);
      if (h.sleepers.load(std::memory_order_seq_cst) != 0) {
        h.wake_seq.fetch_add(1, std::memory_order_release);
        ::syscall(SYS_futex, reinterpret_cast<std::uint32_t*>(&h.wake_seq), FUTEX_WAKE, INT_MAX,
                  nullptr, nullptr, 0);
      }
      if (k % 64 == 0) std::this_thread::yield();
    }
  });
  std::atomic<int> churn_errors{0};
  std::thread churn([&] { // armed counters registered and unregistered under the scans
    for (int k = 0; k < 300 && !stop.load(std::memory_order_relaxed); ++k) {
      compcntr_comp_cntr_init_attr a{};
      compcntr_comp_cntr* x = compcntr_create_comp_cntr(d, &a);
      int xfd = -1;
      if (x == nullptr || compcntr_comp_cntr_get_fd(x, &xfd) != 0 ||
          (k % 2 ? compcntr_comp_cntr_arm_fd(x) : compcntr_comp_cntr_arm_fd_threshold(x, 1)) != 0)
        churn_errors.fetch_add(1);
      if (k % 3 == 0 && x != nullptr) compcntr_inc_comp_cntr(x, 1);
      if (x == nullptr || compcntr_destroy_comp_cntr(x) != 0) churn_errors.fetch_add(1);
    }
  });
  int bad = 0;
  for (int round = 0; round < 400; ++round) {
    const std::uint64_t thr = value(c) + 1 + static_cast<std::uint64_t>(round % 50);
    REQUIRE(compcntr_comp_cntr_arm_fd_threshold(c, thr) == 0);
    if (readable(fd, 20000) != 1 || value(c) < thr) ++bad;
  }
  stop.store(true);
  foreign.join();
  churn.join();
  CHECK(bad == 0);
  CHECK(churn_errors.load() == 0);
  CHECK(compcntr_destroy_comp_cntr(c) == 0);
  CHECK(compcntr_close_device(d) == 0);
}

// ---- triggers on shared counters (docs/shared.md, "Triggers") ------------------------------

namespace {

// What a trigger's action saw: it runs once with a status; the eventfd tells the test.
struct fired_rec {
  compcntr_comp_cntr* c = nullptr;
  int efd = -1;
  std::atomic<int> runs{0};
  std::atomic<int> status{-1};
  std::atomic<std::uint64_t> seen{0};
  std::atomic<bool> on_main{false};
  std::thread::id main = std::this_thread::get_id();
};

void record_fire(void* p, int status) {
  auto* r = static_cast<fired_rec*>(p);
  std::uint64_t v = 0;
  if (status == 0) compcntr_read_comp_cntr(r->c, &v);
  r->seen.store(v);
  r->status.store(status);
  r->on_main.store(std::this_thread::get_id() == r->main);
  r->runs.fetch_add(1);
  const std::uint64_t one = 1;
  if (::write(r->efd, &one, sizeof one) != 8) std::abort();
}

} // namespace

TEST_CASE("shared triggers: another process's update crossing the threshold fires it, once") {
  seg_name n("trig");
  CHECK(eventually([] { return watcher_threads() == 0; }, 200000));
  compcntr_device* d = open_or_fail(n);
  compcntr_comp_cntr* c = create(d);
  const compcntr_counter_id id = id_of(c);
  fired_rec rec;
  rec.c = c;
  rec.efd = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  REQUIRE(rec.efd >= 0);
  compcntr_trigger* t = compcntr_trigger_arm(c, 5, record_fire, &rec, COMPCNTR_TRIGGER_INLINE);
  INFO(compcntr_last_error_message());
  REQUIRE(t != nullptr);
  CHECK(eventually([] { return watcher_threads() == 1; }, 200000)); // the device's watcher
  channel step, ack;
  const pid_t pid = spawn([&] {
    compcntr_device* cd = child_open(n);
    compcntr_comp_cntr* r = child_resolve(cd, id);
    char x = 0;
    for (int k = 0; k < 2; ++k) {
      CHILD_CHECK(step.recv(x));
      CHILD_CHECK(compcntr_inc_comp_cntr(r, 3) == 0);
      ack.send('a');
    }
    CHILD_CHECK(compcntr_comp_cntr_release(r) == 0);
    CHILD_CHECK(compcntr_close_device(cd) == 0);
  });
  char a = 0;
  step.send('g'); // 3: below
  REQUIRE(ack.recv(a));
  CHECK(readable(rec.efd, 50) == 0);
  CHECK(rec.runs.load() == 0);
  step.send('g'); // 6: crosses 5
  REQUIRE(ack.recv(a));
  CHECK(readable(rec.efd, 10000) == 1);
  CHECK(rec.runs.load() == 1);
  CHECK(rec.status.load() == 0);
  CHECK(rec.seen.load() == 6);
  CHECK_FALSE(rec.on_main.load()); // on the watcher thread: our thread did not update
  CHECK(eventually([&] { return compcntr_trigger_state(t) == 1; })); // set once fn returned
  CHECK(reap(pid) == 0);
  CHECK(compcntr_trigger_destroy(t) == 0);
  std::uint64_t drained = 0;
  REQUIRE(::read(rec.efd, &drained, 8) == 8);
  // This process's own update: inline, in the updating thread or on the watcher (woken by the
  // same update), whichever reaches the counter's triggers first (combined firing).
  fired_rec own;
  own.c = c;
  own.efd = rec.efd;
  compcntr_trigger* t2 = compcntr_trigger_arm(c, 7, record_fire, &own, COMPCNTR_TRIGGER_INLINE);
  REQUIRE(t2 != nullptr);
  CHECK(readable(rec.efd, 50) == 0);
  CHECK(own.runs.load() == 0);
  REQUIRE(compcntr_inc_comp_cntr(c, 1) == 0);
  CHECK(readable(rec.efd, 10000) == 1);
  CHECK(own.runs.load() == 1);
  CHECK(own.status.load() == 0);
  CHECK(own.seen.load() == 7);
  CHECK(eventually([&] { return compcntr_trigger_state(t2) == 1; }));
  CHECK(compcntr_trigger_destroy(t2) == 0);
  // Armed at destroy: cancelled (ECANCELED), as on a private counter.
  fired_rec late;
  late.c = c;
  late.efd = rec.efd;
  compcntr_trigger* t3 = compcntr_trigger_arm(c, 100, record_fire, &late, COMPCNTR_TRIGGER_INLINE);
  REQUIRE(t3 != nullptr);
  CHECK(compcntr_destroy_comp_cntr(c) == 0);
  CHECK(late.runs.load() == 1);
  CHECK(late.status.load() == ECANCELED);
  CHECK(compcntr_trigger_destroy(t3) == 0);
  ::close(rec.efd);
  CHECK(compcntr_close_device(d) == 0);
  CHECK(eventually([] { return watcher_threads() == 0; }, 200000));
}

TEST_CASE("shared triggers: a chain of 40 thresholds crossed by 4 processes, deferred too") {
  one_counter f("trigmany");
  auto& [n, d, c, id] = f;
  constexpr int updaters = 4, chain = 40;
  constexpr std::uint64_t per = 1000, total = per * updaters, step = total / chain;
  const int efd = ::eventfd(0, EFD_CLOEXEC);
  REQUIRE(efd >= 0);
  std::vector<std::unique_ptr<fired_rec>> recs;
  std::vector<compcntr_trigger*> ts;
  for (int k = 0; k < chain; ++k) {
    recs.push_back(std::make_unique<fired_rec>());
    recs.back()->c = c;
    recs.back()->efd = efd;
    const std::uint32_t mode = k % 2 ? COMPCNTR_TRIGGER_DEFERRED : COMPCNTR_TRIGGER_INLINE;
    ts.push_back(compcntr_trigger_arm(c, step * (k + 1), record_fire, recs.back().get(), mode));
    REQUIRE(ts.back() != nullptr);
  }
  REQUIRE(compcntr_trigger_service_start(d) == 0); // runs the deferred ones
  channel start;
  std::vector<pid_t> kids;
  for (int k = 0; k < updaters; ++k)
    kids.push_back(spawn([&] {
      compcntr_device* cd = child_open(n);
      compcntr_comp_cntr* r = child_resolve(cd, id);
      char go = 0;
      CHILD_CHECK(start.recv(go));
      for (std::uint64_t i = 0; i < per; ++i) CHILD_CHECK(compcntr_inc_comp_cntr(r, 1) == 0);
      CHILD_CHECK(compcntr_comp_cntr_release(r) == 0);
      CHILD_CHECK(compcntr_close_device(cd) == 0);
    }));
  for (int k = 0; k < updaters; ++k) start.send('g');
  std::uint64_t got = 0;
  while (got < chain) {
    std::uint64_t v = 0;
    REQUIRE(readable(efd, 20000) == 1);
    REQUIRE(::read(efd, &v, 8) == 8);
    got += v;
  }
  for (pid_t p : kids) CHECK(reap(p) == 0);
  CHECK(got == chain);
  for (int k = 0; k < chain; ++k) {
    INFO("trigger " << k);
    CHECK(recs[k]->runs.load() == 1);
    CHECK(recs[k]->status.load() == 0);
    CHECK(recs[k]->seen.load() >= step * (k + 1));
    CHECK(eventually([&] { return compcntr_trigger_state(ts[k]) == 1; })); // once fn returned
    CHECK(compcntr_trigger_destroy(ts[k]) == 0);
  }
  CHECK(value(c) == total);
  CHECK(compcntr_trigger_service_stop(d) == 0);
  ::close(efd);
  CHECK(compcntr_destroy_comp_cntr(c) == 0);
  CHECK(compcntr_close_device(d) == 0);
}

TEST_CASE("shared triggers: a forked child cannot arm on a parent's device (EOWNERDEAD)") {
  seg_name n("trigfork");
  compcntr_device* d = open_or_fail(n);
  compcntr_comp_cntr* c = create(d);
  const pid_t pid = spawn([&] {
    errno = 0;
    CHILD_CHECK(
        compcntr_trigger_arm(c, 1, [](void*, int) {}, nullptr, COMPCNTR_TRIGGER_INLINE) == nullptr);
    CHILD_CHECK(errno == EOWNERDEAD);
    CHILD_CHECK(contains(compcntr_last_error_message(), "trigger_arm"));
  });
  CHECK(reap(pid) == 0);
  CHECK(compcntr_destroy_comp_cntr(c) == 0);
  CHECK(compcntr_close_device(d) == 0);
}

TEST_CASE("shared triggers: stress (TSan): foreign updates fire triggers re-armed 300 times") {
  one_counter f("trigstress");
  auto& [n, d, c, id] = f;
  seg_view view(n);
  REQUIRE(view);
  std::atomic<bool> stop{false};
  std::thread foreign([&] {
    shm::header& h = view.hdr();
    shm::cell& cell = view.cell(id.index);
    for (unsigned k = 0; !stop.load(std::memory_order_relaxed); ++k) {
      cell.h[k & 1].value.fetch_add(1, std::memory_order_seq_cst);
      if (h.sleepers.load(std::memory_order_seq_cst) != 0) {
        h.wake_seq.fetch_add(1, std::memory_order_release);
        ::syscall(SYS_futex, reinterpret_cast<std::uint32_t*>(&h.wake_seq), FUTEX_WAKE, INT_MAX,
                  nullptr, nullptr, 0);
      }
      if (k % 64 == 0) std::this_thread::yield();
    }
  });
  const int efd = ::eventfd(0, EFD_CLOEXEC);
  REQUIRE(efd >= 0);
  int bad = 0;
  for (int round = 0; round < 300; ++round) {
    fired_rec r;
    r.c = c;
    r.efd = efd;
    const std::uint64_t thr = value(c) + 1 + static_cast<std::uint64_t>(round % 40);
    compcntr_trigger* t = compcntr_trigger_arm(c, thr, record_fire, &r, COMPCNTR_TRIGGER_INLINE);
    REQUIRE(t != nullptr);
    std::uint64_t v = 0;
    if (readable(efd, 20000) != 1 || ::read(efd, &v, 8) != 8) ++bad;
    if (r.runs.load() != 1 || r.status.load() != 0 || r.seen.load() < thr) ++bad;
    CHECK(compcntr_trigger_destroy(t) == 0);
  }
  stop.store(true);
  foreign.join();
  CHECK(bad == 0);
  ::close(efd);
  CHECK(compcntr_destroy_comp_cntr(c) == 0);
  CHECK(compcntr_close_device(d) == 0);
}

// A process killed asleep in a wait left its +1 in the segment's one sleeper count: every update
// of any process then made a FUTEX_WAKE syscall for nobody, until the segment was re-created.
// The sweep takes a dead process's share out now; sleepers of live processes stay counted (and
// are woken as before).
TEST_CASE("shared waits: a process killed asleep gives its sleeper count back at the sweep") {
  one_counter f("sleepkill");
  auto& [n, d, c, id] = f;
  seg_view view(n);
  REQUIRE(view);
  channel ready;
  const pid_t pid = spawn([&] {
    compcntr_device* cd = child_open(n);
    compcntr_comp_cntr* r = child_resolve(cd, id);
    ready.send('r');
    (void)compcntr_wait_comp_cntr(r, 1000, -1); // killed asleep here
  });
  char x = 0;
  REQUIRE(ready.recv(x));
  REQUIRE(eventually([&] { return view.hdr().sleepers.load() == 1; }));
  CHECK(view.sleeper_shares() == 1);
  REQUIRE(::kill(pid, SIGKILL) == 0);
  CHECK(reap(pid) == 1000 + SIGKILL);
  // A live sleeper of ours beside the dead one's registration.
  std::atomic<int> woke{-1};
  std::thread t([&] { woke.store(compcntr_wait_comp_cntr(c, 5, -1)); });
  REQUIRE(eventually([&] { return view.hdr().sleepers.load() == 2; }));
  std::uint32_t reclaimed = 99;
  CHECK(compcntr_sweep_shared_device(d, &reclaimed) == 0);
  CHECK(reclaimed == 1);
  CHECK(view.hdr().sleepers.load() == 1); // ours only
  CHECK(view.sleeper_shares() == 1);
  CHECK(woke.load() == -1);
  CHECK(compcntr_inc_comp_cntr(c, 5) == 0); // still woken through the count
  t.join();
  CHECK(woke.load() == 0);
  CHECK(eventually([&] { return view.hdr().sleepers.load() == 0; }));
  CHECK(view.sleeper_shares() == 0);
  // A second sweep finds nothing and takes nothing.
  CHECK(compcntr_sweep_shared_device(d, &reclaimed) == 0);
  CHECK(reclaimed == 0);
  CHECK(view.hdr().sleepers.load() == 0);
  CHECK(compcntr_destroy_comp_cntr(c) == 0);
  CHECK(compcntr_close_device(d) == 0);
}

// The epoll loop of a runtime whose peers are other processes (issue 21: "pollable fds work for
// waiters in another process"; the poll(2) cases above): one fd armed for a threshold per batch
// in an epoll set, two processes adding. Each batch wakes epoll_wait exactly once, when its
// last add reaches the threshold, with one signal; a fresh arm below the threshold is not readable.
TEST_CASE("shared fds: an epoll loop wakes once per batch of two other processes' updates") {
  one_counter f("fdepoll");
  auto& [n, d, c, id] = f;
  const int fd = get_fd(c);
  const int ep = ::epoll_create1(EPOLL_CLOEXEC);
  REQUIRE(ep >= 0);
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.fd = fd;
  REQUIRE(::epoll_ctl(ep, EPOLL_CTL_ADD, fd, &ev) == 0);
  constexpr int batches = 40, per_child = 5; // each batch: both children add 5 in steps of 1
  channel go_a, go_b;
  auto child = [&](const channel& go) {
    compcntr_device* cd = child_open(n);
    compcntr_comp_cntr* r = child_resolve(cd, id);
    char x = 0;
    for (int b = 0; b < batches; ++b) {
      CHILD_CHECK(go.recv(x));
      for (int k = 0; k < per_child; ++k) CHILD_CHECK(compcntr_inc_comp_cntr(r, 1) == 0);
    }
    CHILD_CHECK(compcntr_comp_cntr_release(r) == 0);
    CHILD_CHECK(compcntr_close_device(cd) == 0);
  };
  const pid_t a = spawn([&] { child(go_a); });
  const pid_t b = spawn([&] { child(go_b); });
  int wakeups = 0;
  for (int k = 1; k <= batches; ++k) {
    const std::uint64_t threshold = std::uint64_t{2 * per_child} * k;
    REQUIRE(compcntr_comp_cntr_arm_fd_threshold(c, threshold) == 0);
    epoll_event got[4];
    CHECK(::epoll_wait(ep, got, 4, 0) == 0); // not reached yet: not readable after the arm
    go_a.send('g');
    go_b.send('g');
    int r = 0;
    while ((r = ::epoll_wait(ep, got, 4, 10000)) < 0 && errno == EINTR) {
    }
    REQUIRE(r == 1);
    ++wakeups;
    CHECK(got[0].data.fd == fd);
    CHECK(value(c) == threshold); // the batch's last add reached it (no batch runs ahead)
    std::uint64_t ticks = 0;
    CHECK(::read(fd, &ticks, sizeof ticks) == 8);
    CHECK(ticks == 1);
  }
  CHECK(wakeups == batches);
  CHECK(reap(a) == 0);
  CHECK(reap(b) == 0);
  CHECK(value(c) == std::uint64_t{2 * per_child} * batches);
  epoll_event got[4];
  CHECK(::epoll_wait(ep, got, 4, 0) == 0); // nothing armed, nothing left to read
  ::close(ep);
  CHECK(compcntr_destroy_comp_cntr(c) == 0);
  CHECK(compcntr_close_device(d) == 0);
}

// ---- peer death: who is dead (docs/shared.md, "Peer death and the reclaim rule") -------------

namespace {

// The holder bits of cell `i` (bit p: process entry p holds it) and its state.
std::uint64_t holders(const seg_view& v, std::uint32_t i) {
  return v.rec(i).ctl.load(std::memory_order_acquire) & shm::holders_mask;
}
std::uint64_t cell_state(const seg_view& v, std::uint32_t i) {
  return shm::cell_state(v.rec(i).ctl.load(std::memory_order_acquire));
}
std::uint64_t bit_of(std::uint32_t entry) { return std::uint64_t{1} << entry; }

// After a fork: the parent closes its copy of the channel's write end, so that its reads end
// (false) when every child that writes has exited, instead of waiting for ever.
void parent_reads(channel& ch) {
  ::close(ch.fd[1]);
  ch.fd[1] = -1;
}

// A child that opens the segment, holds the parent's counter `c_id` (resolved, +10), creates a
// counter that the parent will hold too (+5) and one only it holds (+7), reports the two ids,
// then waits for `go` and runs `after` (its checks: CHILD_CHECK).
struct holding_peer {
  pid_t pid = -1;
  channel up, go;
  compcntr_counter_id shared_id{}, alone_id{};
  template <class After>
  void start(const seg_name& n, const compcntr_counter_id& c_id, After after) {
    pid = spawn([&, after] {
      compcntr_device* cd = child_open(n);
      compcntr_comp_cntr* r = child_resolve(cd, c_id);
      CHILD_CHECK(compcntr_inc_comp_cntr(r, 10) == 0);
      compcntr_comp_cntr_init_attr a{};
      compcntr_comp_cntr* mine = compcntr_create_comp_cntr(cd, &a);
      compcntr_comp_cntr* alone = compcntr_create_comp_cntr(cd, &a);
      CHILD_CHECK(mine != nullptr && alone != nullptr);
      CHILD_CHECK(compcntr_inc_comp_cntr(mine, 5) == 0);
      CHILD_CHECK(compcntr_inc_comp_cntr(alone, 7) == 0);
      compcntr_counter_id ids[2]{};
      CHILD_CHECK(compcntr_comp_cntr_id(mine, &ids[0]) == 0);
      CHILD_CHECK(compcntr_comp_cntr_id(alone, &ids[1]) == 0);
      up.send(ids);
      char x = 0;
      CHILD_CHECK(go.recv(x));
      after(cd, r, mine, alone);
    });
    parent_reads(up); // a child that fails before it reports: EOF, not a hang
    compcntr_counter_id ids[2]{};
    REQUIRE(up.recv(ids));
    shared_id = ids[0];
    alone_id = ids[1];
  }
};

} // namespace

// Issue 21: the dead process is "detected by pid and start time, not by pid alone". A pid the
// kernel gave to a new process after the registered one died is alive with another start time:
// made here by rewriting the start time in a live child's process entry (the child stays alive,
// so only the start time can tell). The sweep must treat that entry as dead and reclaim it like
// any dead process's (holder bits, cells only it held, counters it created: dead, its entry),
// while the untouched live child beside it keeps everything.
// The child whose entry was taken is alive and goes on (the "scribbling peer" case of the
// safety model): its calls return normally or with errors, never crash; it no longer holds
// anything, so its releases give nothing back, and its updates still land in the cells its
// counters are bound to (the parent's counter counts them; a cell only it held was freed).
TEST_CASE("shared devices: an entry whose pid lives with another start time is swept as dead "
          "(pid reuse); live processes keep theirs") {
  one_counter f("pidreuse");
  auto& [n, d, c, id] = f;
  seg_view view(n);
  REQUIRE(view);
  REQUIRE(compcntr_inc_comp_cntr(c, 1) == 0);
  holding_peer kept, stolen;
  kept.start(n, id,
             [](compcntr_device* cd, compcntr_comp_cntr* r, compcntr_comp_cntr* mine,
                compcntr_comp_cntr* alone) {
               // Untouched: everything it held is still its own.
               CHILD_CHECK(compcntr_inc_comp_cntr(r, 1) == 0);
               CHILD_CHECK(compcntr_comp_cntr_release(r) == 0);
               CHILD_CHECK(compcntr_destroy_comp_cntr(mine) == 0);
               CHILD_CHECK(compcntr_destroy_comp_cntr(alone) == 0);
               CHILD_CHECK(compcntr_close_device(cd) == 0);
             });
  stolen.start(
      n, id,
      [id](compcntr_device* cd, compcntr_comp_cntr* r, compcntr_comp_cntr* mine,
           compcntr_comp_cntr* alone) {
        // Swept as dead while alive (and run after the kept child: +1): no crash; the calls below
        // are what it gets.
        std::uint64_t v = 0;
        CHILD_CHECK(compcntr_inc_comp_cntr(r, 100) == 0); // still lands in the parent's counter
        CHILD_CHECK(compcntr_read_comp_cntr(r, &v) == 0 && v == 1 + 10 + 10 + 1 + 100);
        CHILD_CHECK(compcntr_wait_comp_cntr(r, ~0ull, 0) == ETIMEDOUT);
        compcntr_wait_attr at{};
        at.comp_mask = COMPCNTR_WAIT_ATTR_SPIN;
        at.spin_ns = 0; // a sleeping wait (it also sweeps: it finds nobody dead)
        CHILD_CHECK(compcntr_wait_comp_cntr_ex(r, ~0ull, 1, &at) == ETIMEDOUT);
        CHILD_CHECK(compcntr_wait_comp_cntr(mine, ~0ull, 0) == EIO); // "its creator died"
        CHILD_CHECK(compcntr_inc_comp_cntr(alone, 1) == 0); // a freed cell: counts for nobody
        compcntr_comp_cntr* again = compcntr_comp_cntr_resolve(cd, &id); // still resolvable
        CHILD_CHECK(again != nullptr);
        CHILD_CHECK(compcntr_read_comp_cntr(again, &v) == 0 && v == 1 + 10 + 10 + 1 + 100);
        CHILD_CHECK(compcntr_comp_cntr_release(again) == 0);
        CHILD_CHECK(compcntr_comp_cntr_release(r) == 0); // nothing held: nothing given back
        CHILD_CHECK(compcntr_destroy_comp_cntr(mine) == 0);
        CHILD_CHECK(compcntr_destroy_comp_cntr(alone) == 0);
        CHILD_CHECK(compcntr_close_device(cd) == 0);
      });
  struct kill_on_exit { // a failed REQUIRE must not leave a waiting child behind
    pid_t pids[2];
    ~kill_on_exit() {
      for (pid_t p : pids)
        if (p > 0) ::kill(p, SIGKILL), reap(p);
    }
  } guard{{kept.pid, stolen.pid}};
  compcntr_comp_cntr* kept_c = compcntr_comp_cntr_resolve(d, &kept.shared_id);
  compcntr_comp_cntr* stolen_c = compcntr_comp_cntr_resolve(d, &stolen.shared_id);
  REQUIRE(kept_c != nullptr);
  REQUIRE(stolen_c != nullptr);
  const std::uint32_t me = proc_entry(view, ::getpid()), jk = proc_entry(view, kept.pid),
                      js = proc_entry(view, stolen.pid);
  REQUIRE(me < shm::max_procs);
  REQUIRE(jk < shm::max_procs);
  REQUIRE(js < shm::max_procs);
  const std::uint64_t kept_word = view.hdr().procs[jk].load();
  CHECK(holders(view, id.index) == (bit_of(me) | bit_of(jk) | bit_of(js)));

  // Both alive and registered as they are: a sweep finds nobody dead.
  std::uint32_t reclaimed = 99;
  REQUIRE(compcntr_sweep_shared_device(d, &reclaimed) == 0);
  CHECK(reclaimed == 0);
  CHECK(view.procs_in_use() == 3);
  CHECK(view.cells_in_use() == 5);

  // The stolen child's entry now says: same pid, another start time.
  const std::uint64_t w = view.hdr().procs[js].load();
  const std::uint64_t reused = shm::proc_word(shm::proc_pid(w), shm::proc_start(w) + 1);
  REQUIRE(shm::proc_pid(reused) == static_cast<std::uint32_t>(stolen.pid));
  view.hdr().procs[js].store(reused);
  REQUIRE(::kill(stolen.pid, 0) == 0); // the pid is alive
  REQUIRE(compcntr_sweep_shared_device(d, &reclaimed) == 0);
  CHECK(reclaimed == 1);
  CHECK(view.hdr().procs[js].load() == 0); // its entry freed
  CHECK(view.hdr().procs[jk].load() == kept_word); // the other child's kept
  CHECK(holders(view, id.index) == (bit_of(me) | bit_of(jk)));
  CHECK(cell_state(view, id.index) == shm::cell_live);
  CHECK(cell_state(view, stolen.shared_id.index) == shm::cell_dead); // its creator "died"
  CHECK(holders(view, stolen.shared_id.index) == bit_of(me));
  CHECK(view.rec(stolen.alone_id.index).ctl.load() == 0); // only it held it: freed
  CHECK(view.rec(stolen.alone_id.index).generation.load() == stolen.alone_id.generation + 1);
  CHECK(cell_state(view, kept.shared_id.index) == shm::cell_live); // the kept child's: intact
  CHECK(holders(view, kept.shared_id.index) == (bit_of(me) | bit_of(jk)));
  CHECK(holders(view, kept.alone_id.index) == bit_of(jk));
  CHECK(value(c) == 1 + 10 + 10); // the counters exact
  CHECK(value(kept_c) == 5);
  CHECK(value(stolen_c) == 5);
  CHECK(compcntr_wait_comp_cntr(stolen_c, ~0ull, 0) == EIO);
  errno = 0;
  CHECK(compcntr_comp_cntr_resolve(d, &stolen.alone_id) == nullptr);
  CHECK(errno == ESTALE);
  REQUIRE(compcntr_sweep_shared_device(d, &reclaimed) == 0);
  CHECK(reclaimed == 0); // the kept child stays alive to every sweep

  kept.go.send('g');
  CHECK(reap(kept.pid) == 0);
  guard.pids[0] = 0;
  stolen.go.send('g');
  CHECK(reap(stolen.pid) == 0); // its calls after the steal: see its lambda
  guard.pids[1] = 0;
  CHECK(value(c) == 1 + 10 + 10 + 1 + 100);
  CHECK(compcntr_comp_cntr_release(kept_c) == 0);
  CHECK(compcntr_comp_cntr_release(stolen_c) == 0);
  CHECK(view.cells_in_use() == 1); // c only
  CHECK(view.procs_in_use() == 1);
  CHECK(compcntr_destroy_comp_cntr(c) == 0);
  CHECK(compcntr_close_device(d) == 0);
}

// A process killed and not yet reaped by its parent (a zombie: its pid and start time still in
// /proc, state Z) has no mappings left and can never touch the segment again: the sweep treats
// it as dead. A process whose main thread has exited while another thread runs shows the same
// state Z on its pid, but is alive and may still use the segment: the sweep keeps it (its
// /proc/<pid>/stat counts more than one thread).
TEST_CASE("shared devices: a killed child not yet reaped (zombie) is swept as dead; a process "
          "whose main thread exited is not") {
  one_counter f("zombie");
  auto& [n, d, c, id] = f;
  seg_view view(n);
  REQUIRE(view);
  const std::uint32_t me = proc_entry(view, ::getpid());
  REQUIRE(me < shm::max_procs);

  // 1. A zombie holding a reference on our counter and the only other hold on one it created.
  holding_peer z;
  z.start(n, id,
          [](compcntr_device*, compcntr_comp_cntr*, compcntr_comp_cntr*, compcntr_comp_cntr*) {
            std::abort();
          }); // killed before its go
  compcntr_comp_cntr* zc = compcntr_comp_cntr_resolve(d, &z.shared_id);
  REQUIRE(zc != nullptr);
  const std::uint32_t jz = proc_entry(view, z.pid);
  REQUIRE(jz < shm::max_procs);
  REQUIRE(::kill(z.pid, SIGKILL) == 0);
  siginfo_t si{}; // wait until it has exited, and leave it unreaped (WNOWAIT)
  REQUIRE(::waitid(P_PID, static_cast<id_t>(z.pid), &si, WEXITED | WNOWAIT) == 0);
  REQUIRE(proc_state(z.pid) == 'Z'); // the pid is in /proc, with its start time
  CHECK(view.hdr().procs[jz].load() != 0);
  CHECK(holders(view, id.index) == (bit_of(me) | bit_of(jz)));
  std::uint32_t reclaimed = 99;
  REQUIRE(compcntr_sweep_shared_device(d, &reclaimed) == 0);
  CHECK(reclaimed == 1);
  CHECK(view.hdr().procs[jz].load() == 0);
  CHECK(holders(view, id.index) == bit_of(me));
  CHECK(cell_state(view, z.shared_id.index) == shm::cell_dead);
  CHECK(view.rec(z.alone_id.index).ctl.load() == 0);
  CHECK(compcntr_wait_comp_cntr(zc, ~0ull, 0) == EIO);
  CHECK(value(zc) == 5);
  CHECK(value(c) == 10);
  CHECK(proc_state(z.pid) == 'Z'); // still unreaped: the sweep did not need it gone
  CHECK(reap(z.pid) == 1000 + SIGKILL);
  CHECK(compcntr_comp_cntr_release(zc) == 0);

  // 2. A child whose main thread exits once a thread of its own is running: that
  //    thread uses the segment after the sweep.
  channel up, go, done;
  const pid_t mt = spawn([&] {
    compcntr_device* cd = child_open(n);
    compcntr_comp_cntr* r = child_resolve(cd, id);
    // Its captures stay valid: the exit of the main thread below frees no memory.
    std::thread([r, &go, &done] {
      char x = 0;
      CHILD_CHECK(go.recv(x));
      CHILD_CHECK(compcntr_inc_comp_cntr(r, 100) == 0);
      done.send('d');
      for (;;) ::pause(); // killed here
    }).detach();
    up.send('u');
    // Only this thread ends (the exit system call, not exit_group; no unwinding through the
    // test framework's frames, which pthread_exit would do).
    ::syscall(SYS_exit, 0);
  });
  parent_reads(up);
  parent_reads(done);
  struct kill_on_exit {
    pid_t pid;
    ~kill_on_exit() {
      if (pid > 0) ::kill(pid, SIGKILL), reap(pid);
    }
  } guard{mt};
  char x = 0;
  REQUIRE(up.recv(x));
  REQUIRE(eventually([&] { return proc_state(mt) == 'Z'; })); // its main thread is gone
  const std::uint32_t jm = proc_entry(view, mt);
  REQUIRE(jm < shm::max_procs);
  REQUIRE(compcntr_sweep_shared_device(d, &reclaimed) == 0);
  CHECK(reclaimed == 0);
  CHECK(view.hdr().procs[jm].load() != 0);
  CHECK(holders(view, id.index) == (bit_of(me) | bit_of(jm)));
  go.send('g');
  REQUIRE(done.recv(x));
  CHECK(value(c) == 110);
  REQUIRE(::kill(mt, SIGKILL) == 0);
  CHECK(reap(mt) == 1000 + SIGKILL);
  guard.pid = 0;
  REQUIRE(compcntr_sweep_shared_device(d, &reclaimed) == 0);
  CHECK(reclaimed == 1);
  CHECK(holders(view, id.index) == bit_of(me));
  CHECK(view.procs_in_use() == 1);
  CHECK(view.cells_in_use() == 1);
  CHECK(compcntr_destroy_comp_cntr(c) == 0);
  CHECK(compcntr_close_device(d) == 0);
}

// Issue 21: "a process killed by SIGKILL at any point (mid-create ...)"; "a segment whose
// processes are all gone is recognised as stale and replaced, not reused half-initialised". A
// child alone with the segment loops open (which creates and initialises it: the name is gone
// after each close) -> create a counter -> add -> destroy -> close (the last one out retires and
// unlinks it), and is SIGKILLed after a random spin: in shm_open, before or after sizing, mid-
// header, before "ready", mid-create, mid-close. After each kill the leftover (none, size 0, a
// blank or partial header, initialising, ready with a dead table, retired) must be: refused
// without COMPCNTR_SHARED_CREATE with ENOENT (never EBADMSG: it is not corrupt, its creator
// died), replaced with it by a fresh segment (ready, only us registered, no cell in use) that
// works, and unlinked by our close.
TEST_CASE("shared devices: a child SIGKILLed creating, initialising or closing the segment, "
          "200 runs: replaced, never half-initialised") {
  seg_name n("killinit");
  std::mt19937 rng(2021);
  enum { none, size0, blank, initialising, ready, retired, other, kinds };
  const char* const kind_names[kinds] = {"no file",       "size 0",  "blank header", "initialising",
                                         "ready (stale)", "retired", "other"};
  int seen[kinds] = {};
  for (int run = 0; run < 200; ++run) {
    channel ready_ch;
    const unsigned spins = rng() % 60'000;
    const pid_t pid = spawn([&] {
      ready_ch.send('r'); // the parent kills after a random spin from here
      compcntr_comp_cntr_init_attr a{};
      for (;;) {
        compcntr_device* cd = compcntr_open_device(n.dev().c_str());
        if (cd == nullptr) std::fprintf(stderr, "child open: %s\n", compcntr_last_error_message());
        CHILD_CHECK(cd != nullptr); // alone with it: always opens (creating it)
        compcntr_comp_cntr* c = compcntr_create_comp_cntr(cd, &a);
        CHILD_CHECK(c != nullptr);
        CHILD_CHECK(compcntr_inc_comp_cntr(c, 1) == 0);
        CHILD_CHECK(compcntr_destroy_comp_cntr(c) == 0);
        CHILD_CHECK(compcntr_close_device(cd) == 0);
      }
    });
    char x = 0;
    REQUIRE(ready_ch.recv(x));
    for (unsigned k = 0; k < spins; ++k) compcntr::cpu_relax();
    REQUIRE(::kill(pid, SIGKILL) == 0);
    REQUIRE(reap(pid) == 1000 + SIGKILL); // not a failed check (exit code 20..219)
    {
      int kind = none;
      seg_view v(n);
      if (v.fd >= 0) {
        struct stat st{};
        REQUIRE(::fstat(v.fd, &st) == 0);
        if (st.st_size == 0)
          kind = size0;
        else if (!v || v.size < shm::page)
          kind = other;
        else if (v.hdr().magic == 0)
          kind = blank;
        else if (v.hdr().state.load() == shm::seg_initializing)
          kind = initialising;
        else if (v.hdr().state.load() == shm::seg_ready)
          kind = ready;
        else if (v.hdr().state.load() == shm::seg_retired)
          kind = retired;
        else
          kind = other;
      }
      ++seen[kind];
      INFO("run " << run << ": left " << std::string(kind_names[kind]));
      errno = 0;
      compcntr_device* no = compcntr_open_shared_device(n.name.c_str(), 0, 0);
      INFO(std::string(compcntr_last_error_message()));
      REQUIRE(no == nullptr);
      REQUIRE(errno == ENOENT);
      compcntr_device* d = compcntr_open_device(n.dev().c_str());
      REQUIRE(d != nullptr);
      seg_view w(n);
      REQUIRE(w);
      CHECK(w.hdr().magic == shm::magic);
      CHECK(w.hdr().state.load() == shm::seg_ready);
      CHECK(w.procs_in_use() == 1);
      CHECK(w.cells_in_use() == 0);
      compcntr_comp_cntr* c = create(d);
      CHECK(value(c) == 0);
      REQUIRE(compcntr_inc_comp_cntr(c, 3) == 0);
      CHECK(value(c) == 3);
      CHECK(errors(c) == 0);
      CHECK(compcntr_destroy_comp_cntr(c) == 0);
      CHECK(compcntr_close_device(d) == 0);
    }
    errno = 0;
    CHECK(::shm_open(n.path.c_str(), O_RDONLY, 0) < 0); // our close removed the name
    CHECK(errno == ENOENT);
  }
  std::string mix;
  for (int k = 0; k < kinds; ++k)
    mix += std::string(k ? ", " : "") + kind_names[k] + " " + std::to_string(seen[k]);
  MESSAGE("left behind by the killed child: " << mix);
  CHECK(seen[other] == 0);
}
