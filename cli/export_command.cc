// `cohort export`: a run's model for PyTorch (train/export.h), read-only.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <memory>
#include <optional>

#include "cli/command.h"
#include "common/logging.h"
#include "proto/config_io.h"
#include "store/run_reader.h"
#include "train/export.h"

namespace cohort::cli {
namespace {

struct ExportFlags {
  std::string run_dir, format = "torch", out;
  int64_t round = -1;  // -1: the last committed.
};

Status RunExport(const ExportFlags& f) {
  std::optional<uint32_t> round;
  if (f.round >= 0) round = static_cast<uint32_t>(f.round);
  // Read-only: beside a running coordinator, and nothing in RUN_DIR changes.
  COHORT_ASSIGN_OR_RETURN(store::RunCheckpoint read, store::ReadRunCheckpoint(f.run_dir, round));
  COHORT_ASSIGN_OR_RETURN(
      config::RunConfig config,
      config::ParseRunConfig(read.info.config_text, f.run_dir + "/run.db's config"));
  StatusOr<std::vector<train::NamedTensor>> tensors =
      train::TorchStateDict(config.model(), read.checkpoint.model);
  if (!tensors.ok()) {
    return tensors.status().WithContext(f.run_dir + ": round " +
                                        std::to_string(read.checkpoint.round));
  }
  if (f.format == "onnx") {
    COHORT_RETURN_IF_ERROR(train::WriteOnnx(f.out, config.model(), read.checkpoint.model));
  } else {
    COHORT_RETURN_IF_ERROR(f.format == "npz" ? train::WriteNpz(f.out, *tensors)
                                             : train::WriteTorchStateDict(f.out, *tensors));
  }
  uint64_t values = 0;
  for (const auto& t : *tensors) values += t.values.size();
  std::printf("wrote %s: round %u of %s, %zu tensors, %llu values (%s)\n", f.out.c_str(),
              read.checkpoint.round, f.run_dir.c_str(), tensors->size(),
              static_cast<unsigned long long>(values),
              f.format == "npz"    ? "numpy.load"
              : f.format == "onnx" ? "onnx.load; input [N, ...], output logits"
                                   : "torch.load, then load_state_dict");
  return OkStatus();
}

}  // namespace

Command AddExportCommand(CLI::App& app, const std::string& log_level) {
  auto* exp = app.add_subcommand(
      "export",
      "Write a run's model for PyTorch: its state_dict under PyTorch's names and layouts");
  auto f = std::make_shared<ExportFlags>();
  exp->add_option("--run-dir", f->run_dir, "Run directory")->required();
  exp->add_option("--round", f->round,
                  "A committed round whose checkpoint is kept (default: the last)")
      ->check(CLI::Range(int64_t{0}, int64_t{UINT32_MAX}));
  exp->add_option("--format", f->format,
                  "torch (torch.load, then nn.Module.load_state_dict), npz (numpy.load) or onnx "
                  "(inference: Cohort's own models)")
      ->check(CLI::IsMember({"torch", "npz", "onnx"}))
      ->capture_default_str();
  exp->add_option("-o,--out", f->out, "The file to write")->required();
  return {exp, [f, &log_level] {
            InitLogging("export", "", log_level);
            return Report(RunExport(*f), "export");
          }};
}

}  // namespace cohort::cli
