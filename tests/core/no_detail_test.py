#!/usr/bin/env python3
"""`import compcntr;` exposes the public API and the backend plug-in interface, nothing of
compcntr::detail: each snippet below that names a detail entity must fail to compile, with
clang's message that the name is not visible; the control snippet (public API + plug-in
interface, the way an out-of-tree backend writes it) must compile.

Usage: no_detail_test.py CXX FLAG... (run in the build root: the -fmodule-file paths are
relative to it)."""
import os
import subprocess
import sys
import tempfile

CONTROL = r'''
#include <chrono>
#include <memory>
#include <span>
#include <string_view>
#include <system_error>
import compcntr;
struct my_backend final : compcntr::plugin::backend {
  std::string_view name() const noexcept override { return "mine"; }
  compcntr::counter_caps caps() const noexcept override { return {}; }
  std::error_code bind_counter(compcntr::plugin::slot& s) noexcept override {
    s.backend_data = this;
    return {};
  }
};
int main() {
  std::error_code ec;
  auto dev = compcntr::device::from_backend(std::make_unique<my_backend>(), ec);
  auto c = dev.create_counter(compcntr::counter_type::wrs, ec);
  c.add(2);
  compcntr::plugin::slot* s = c.native_slot();
  return s->load_value() == 2 && compcntr::wait(c, 2, std::chrono::milliseconds(0)) == std::errc{}
             ? 0 : 1;
}
'''

# Each names something every unit of the module uses, from a different partition.
DETAIL = {
    'slot_pool (compcntr:pool)': 'compcntr::detail::slot_pool* p = nullptr; (void)p;',
    'watch bits (compcntr:slot)': 'unsigned m = compcntr::detail::watch_sleepers_mask; (void)m;',
    'fail (compcntr:error)': 'compcntr::detail::fail(22, "x");',
    'device_core (compcntr:backend)': 'compcntr::detail::device_core* d = nullptr; (void)d;',
    'arm_trigger (compcntr:trigger)': 'auto f = &compcntr::detail::arm_trigger; (void)f;',
    'using-directive': 'using namespace compcntr::detail; slot_pool* p = nullptr; (void)p;',
}

NOT_VISIBLE = ('must be imported from module', 'no member named', 'no type named',
               'expected namespace name', 'undeclared identifier', 'unknown type name')


def compile_snippet(cxx, flags, text):
    with tempfile.TemporaryDirectory() as d:
        src = os.path.join(d, 't.cpp')
        with open(src, 'w') as f:
            f.write(text)
        r = subprocess.run([cxx] + flags + ['-fsyntax-only', src], capture_output=True, text=True)
        return r.returncode, r.stderr


def main():
    cxx, flags = sys.argv[1], sys.argv[2:]
    failures = 0
    rc, err = compile_snippet(cxx, flags, CONTROL)
    if rc != 0:
        print('FAIL control (public API + plug-in interface) does not compile:\n' + err)
        return 1
    print('ok   control: public API and compcntr::plugin compile from `import compcntr;`')
    for what, body in DETAIL.items():
        rc, err = compile_snippet(cxx, flags, 'import compcntr;\nint main() {\n' + body + '\n}\n')
        first = next((l for l in err.splitlines() if 'error:' in l), '')
        if rc == 0:
            print(f'FAIL {what}: compiled from outside the module')
            failures += 1
        elif not any(m in first for m in NOT_VISIBLE):
            print(f'FAIL {what}: failed for another reason: {first}')
            failures += 1
        else:
            print(f'ok   {what}: {first.split("error: ", 1)[-1]}')
    return 1 if failures else 0


if __name__ == '__main__':
    sys.exit(main())
