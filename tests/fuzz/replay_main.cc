// The main() of a fuzz harness in the ordinary (non-libFuzzer) build: runs
// LLVMFuzzerTestOneInput once on every file under the given paths (files or
// folders), in name order. Fails when it found no input at all, so an empty
// or misplaced corpus cannot pass unnoticed. A crash or a broken invariant
// aborts, which fails the test.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

namespace {

bool ReadFile(const std::filesystem::path& path, std::vector<uint8_t>& out) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return false;
  out.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  return !in.bad();
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::filesystem::path> files;
  for (int i = 1; i < argc; ++i) {
    const std::filesystem::path arg(argv[i]);
    std::error_code error;
    if (std::filesystem::is_directory(arg, error)) {
      for (const auto& entry : std::filesystem::recursive_directory_iterator(arg, error)) {
        if (entry.is_regular_file()) files.push_back(entry.path());
      }
    } else if (std::filesystem::is_regular_file(arg, error)) {
      files.push_back(arg);
    }
    if (error) {
      std::fprintf(stderr, "%s: %s\n", argv[i], error.message().c_str());
      return 1;
    }
  }
  std::sort(files.begin(), files.end());
  if (files.empty()) {
    std::fprintf(stderr, "no inputs found under the given paths\n");
    return 1;
  }
  std::vector<uint8_t> bytes;
  for (const auto& file : files) {
    if (!ReadFile(file, bytes)) {
      std::fprintf(stderr, "%s: cannot read\n", file.c_str());
      return 1;
    }
    std::fprintf(stderr, "replaying %s (%zu bytes)\n", file.c_str(), bytes.size());
    // Give the harness its own allocation, as libFuzzer does, so ASan sees
    // reads past the end of the input.
    std::vector<uint8_t> copy(bytes);
    copy.shrink_to_fit();
    LLVMFuzzerTestOneInput(copy.data(), copy.size());
  }
  std::printf("%zu inputs replayed\n", files.size());
  return 0;
}
