#include "train/device.h"

#include <dlfcn.h>
#include <unistd.h>

#include <cctype>
#include <cstdlib>
#include <filesystem>
#include <mutex>
#include <vector>

#if COHORT_HAVE_CUDA
#include "train/cuda/cuda_backend.h"
#endif

namespace cohort::train {

bool CudaBuilt() { return COHORT_HAVE_CUDA != 0; }

namespace {

// The N of "cuda" (0) or "cuda:N"; -1 when `device` is neither.
int CudaIndex(const std::string& device) {
  if (device == "cuda") return 0;
  if (device.rfind("cuda:", 0) != 0 || device.size() == 5 || device.size() > 8) return -1;
  int n = 0;
  for (size_t i = 5; i < device.size(); ++i) {
    if (!std::isdigit(static_cast<unsigned char>(device[i]))) return -1;
    n = n * 10 + (device[i] - '0');
  }
  return n;
}

#if COHORT_HAVE_CUDA
// Where the plugin may be: $COHORT_CUDA_PLUGIN, beside the executable, or
// in the build tree's train/ next to the executable's folder.
std::vector<std::string> PluginCandidates() {
  std::vector<std::string> paths;
  if (const char* env = std::getenv("COHORT_CUDA_PLUGIN")) paths.push_back(env);
  std::error_code ec;
  const std::filesystem::path exe = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (!ec) {
    paths.push_back(exe.parent_path() / kCudaPluginFile);
    paths.push_back(exe.parent_path().parent_path() / "train" / kCudaPluginFile);
  }
  return paths;
}

// The plugin's entry points, loaded once; never unloaded (its backends'
// code lives there).
struct Plugin {
  NewCudaBackendFn make = nullptr;
  CudaDeviceCountFn count = nullptr;
};
StatusOr<Plugin> LoadPlugin() {
  static std::mutex mu;
  static Plugin plugin;
  static std::string error;
  std::lock_guard<std::mutex> lock(mu);
  if (plugin.make != nullptr) return plugin;
  // No driver, no GPU: say so without loading cudart and cuBLAS at all.
  if (void* driver = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_LOCAL)) {
    dlclose(driver);
  } else {
    return UnavailableError("no usable GPU: no CUDA driver (libcuda.so.1 not found)");
  }
  error.clear();
  for (const std::string& path : PluginCandidates()) {
    void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (handle == nullptr) {
      error += std::string(error.empty() ? "" : "; ") + dlerror();
      continue;
    }
    Plugin p{reinterpret_cast<NewCudaBackendFn>(dlsym(handle, kCudaPluginEntry)),
             reinterpret_cast<CudaDeviceCountFn>(dlsym(handle, kCudaCountEntry))};
    if (p.make != nullptr && p.count != nullptr) return plugin = p;
    error += "; " + path + ": no " + kCudaPluginEntry + " or " + kCudaCountEntry;
  }
  return UnavailableError("the CUDA backend plugin did not load: " + error);
}
#endif

// `local_rank` >= 0 (with "cuda" or "auto"): that rank's GPU among the
// host's instead of `index`.
StatusOr<std::unique_ptr<Backend>> NewCuda(int index, bool tf32, int local_rank = -1) {
#if COHORT_HAVE_CUDA
  COHORT_ASSIGN_OR_RETURN(Plugin plugin, LoadPlugin());
  if (local_rank >= 0) {
    StatusOr<int> count = UnavailableError("not counted");
    plugin.count(&count);
    COHORT_RETURN_IF_ERROR(count.status());
    index = GpuForLocalRank(local_rank, *count);
  }
  StatusOr<std::unique_ptr<Backend>> backend = UnavailableError("not created");
  plugin.make(index, tf32, &backend);
  return backend;
#else
  (void)index;
  (void)tf32;
  (void)local_rank;
  return FailedPreconditionError(
      "this build has no CUDA backend (nvcc was not found, or -Dcuda=disabled)");
#endif
}

}  // namespace

StatusOr<std::unique_ptr<Backend>> NewBackend(const DeviceOptions& options, std::string* note) {
  const std::string& d = options.device;
  if (d == "cpu") return NewCpuBackend(options.threads);
  if (d == "auto") {
    StatusOr<std::unique_ptr<Backend>> gpu = NewCuda(0, options.tf32, options.local_rank);
    if (gpu.ok()) return gpu;
    if (note != nullptr) *note = gpu.status().message() + "; training on the CPU";
    return NewCpuBackend(options.threads);
  }
  const int index = CudaIndex(d);
  if (index < 0) {
    return InvalidArgumentError("--device " + d + ": must be cpu, cuda, cuda:N or auto");
  }
  StatusOr<std::unique_ptr<Backend>> gpu =
      NewCuda(index, options.tf32, d == "cuda" ? options.local_rank : -1);
  if (!gpu.ok()) return gpu.status().WithContext("--device " + d);
  return gpu;
}

}  // namespace cohort::train
