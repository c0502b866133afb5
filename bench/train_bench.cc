// Local training throughput on Fashion-MNIST: 1 epoch, batch 32, SGD lr 0.05,
// the same protocol as ../shared/bench/peers/train_torch.py (samples/s =
// 60000 / wall time of the epoch, excluding loading and evaluation).
// Prints one JSON line per run: {"bench":"train","impl":"cohort",...}.
//
//   train_bench [--model mlp|logreg|lenet5] [--repeats N] [--seed S] [--threads T]
//               [--batch B] [--device cpu|cuda:N|auto]
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "datasets/idx.h"
#include "train/backend.h"
#include "train/device.h"
#include "train/model.h"
#include "train/train_progress.h"
#include "train/trainer.h"

using namespace cohort;

int main(int argc, char** argv) {
  std::string model_name = "mlp", device = "cpu", progress = "off";
  int repeats = 3, threads = 1, batch = 32;
  uint64_t seed = 0;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--model"))
      model_name = argv[i + 1];
    else if (!std::strcmp(argv[i], "--repeats"))
      repeats = std::atoi(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--seed"))
      seed = std::strtoull(argv[i + 1], nullptr, 10);
    else if (!std::strcmp(argv[i], "--threads"))
      threads = std::atoi(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--batch"))
      batch = std::atoi(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--device"))
      device = argv[i + 1];
    else if (!std::strcmp(argv[i], "--progress"))  // off, or bar: drawn to /dev/null
      progress = argv[i + 1];
    else {
      std::fprintf(stderr, "unknown flag %s\n", argv[i]);
      return 2;
    }
  }
  if (progress != "off" && progress != "bar") {
    std::fprintf(stderr, "train_bench: --progress %s: must be off or bar\n", progress.c_str());
    return 2;
  }
  const char* dir_env = std::getenv("FMNIST_DIR");
  const std::string dir = dir_env ? dir_env : "/usr/share/datasets/fashion-mnist";
  auto train =
      datasets::ReadIdx(dir + "/train-images-idx3-ubyte.gz", dir + "/train-labels-idx1-ubyte.gz");
  auto test =
      datasets::ReadIdx(dir + "/t10k-images-idx3-ubyte.gz", dir + "/t10k-labels-idx1-ubyte.gz");
  if (!train.ok() || !test.ok()) {
    std::fprintf(stderr, "%s\n", (!train.ok() ? train.status() : test.status()).ToString().c_str());
    return 1;
  }
  auto backend = train::NewBackend({.device = device, .threads = threads});
  if (!backend.ok()) {
    std::fprintf(stderr, "%s\n", backend.status().ToString().c_str());
    return 1;
  }
  // The presets as `model { arch: ... }` builds them (no config layer here,
  // so bench/gpu_check.sh builds this with a compiler, OpenBLAS and CUDA).
  const Shape input = model_name == "lenet5" ? Shape{1, 28, 28} : Shape{784, 1, 1};
  const std::vector<uint32_t> hidden =
      model_name == "mlp" ? std::vector<uint32_t>{200, 200} : std::vector<uint32_t>{};
  auto model =
      train::Model::Create({input, 10, PresetLayers(model_name, 10, hidden)}, backend->get());
  if (!model.ok()) {
    std::fprintf(stderr, "%s\n", model.status().ToString().c_str());
    return 2;
  }
  auto train_data = train::DeviceDataset::Upload(backend->get(), *train);
  auto test_data = train::DeviceDataset::Upload(backend->get(), *test);
  if (!train_data.ok() || !test_data.ok()) return 1;
  for (int r = 0; r < repeats; ++r) {
    std::vector<float> params((*model)->num_params());
    (*model)->Init(params, seed + r);
    train::TrainOptions opts;
    opts.epochs = 1;
    opts.batch_size = batch;
    opts.optimizer.learning_rate = 0.05f;
    opts.seed = seed + r;
    // The worst case of the client's progress bar: a bar redrawn as often as
    // it ever is, into a file that takes every byte.
    FILE* sink = progress == "bar" ? std::fopen("/dev/null", "w") : nullptr;
    if (sink != nullptr) opts.progress = train::EpochProgress("bench", 1, sink, ProgressMode::kBar);
    auto result = train::TrainLocal(**model, params, **train_data, opts);
    auto eval = train::Evaluate(**model, params, **test_data);
    if (sink != nullptr) std::fclose(sink);
    if (!result.ok() || !eval.ok()) return 1;
    std::printf(
        "{\"bench\":\"train\",\"impl\":\"cohort\",\"progress\":\"%s\",\"device\":\"%s\",\"model\":"
        "\"%s\",\"threads\":%"
        "d,"
        "\"batch\":%d,\"seed\":%lu,"
        "\"epoch_s\":%.4f,\"samples_per_s\":%.1f,\"test_acc\":%.4f,\"train_loss\":%.4f}\n",
        progress.c_str(), (*backend)->Name().c_str(), model_name.c_str(), threads, batch,
        static_cast<unsigned long>(seed + r), result->seconds, result->samples / result->seconds,
        eval->accuracy, result->mean_loss);
    std::fflush(stdout);
  }
  return 0;
}
