// main() for the fuzz harnesses in builds without libFuzzer (the normal and TSan builds): runs
// LLVMFuzzerTestOneInput once on every file named on the command line or found (recursively)
// in a directory named there: the seed corpus as a regression suite. Prints how many inputs
// ran; a disagreement with the model aborts inside the harness.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size);

namespace {

void run_file(const std::filesystem::path& p, std::size_t& n) {
  std::ifstream f(p, std::ios::binary);
  if (!f) {
    std::fprintf(stderr, "replay: cannot read %s\n", p.c_str());
    std::exit(2);
  }
  std::vector<char> bytes((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  LLVMFuzzerTestOneInput(reinterpret_cast<const std::uint8_t*>(bytes.data()), bytes.size());
  ++n;
}

} // namespace

int main(int argc, char** argv) {
  std::size_t n = 0;
  for (int i = 1; i < argc; ++i) {
    const std::filesystem::path p(argv[i]);
    if (std::filesystem::is_directory(p)) {
      std::vector<std::filesystem::path> files;
      for (const auto& e : std::filesystem::recursive_directory_iterator(p))
        if (e.is_regular_file()) files.push_back(e.path());
      std::sort(files.begin(), files.end());  // the same order on every machine
      for (const auto& f : files) run_file(f, n);
    } else {
      run_file(p, n);
    }
  }
  // An empty input too: the harness must accept it.
  LLVMFuzzerTestOneInput(nullptr, 0);
  std::printf("replay: %zu input(s) ran, every call agreed with the model\n", n + 1);
  if (n == 0) {
    std::fprintf(stderr, "replay: no corpus input found\n");
    return 1;
  }
  return 0;
}
