// `cohort keygen`: an identity key pair (crypto/key_files.h).
#include <CLI/CLI.hpp>
#include <cstdio>
#include <memory>

#include "cli/command.h"
#include "common/logging.h"
#include "crypto/key_files.h"

namespace cohort::cli {
namespace {

struct KeygenFlags {
  std::string dir, name;
};

int RunKeygenCommand(const KeygenFlags& f, const std::string& log_level) {
  InitLogging("keygen", "", log_level);
  Status st = crypto::WriteIdentity(f.dir, f.name);
  if (st.ok())
    std::printf("%s/%s.key (secret) and %s/%s.pub written\n", f.dir.c_str(), f.name.c_str(),
                f.dir.c_str(), f.name.c_str());
  return Report(st, "keygen");
}

}  // namespace

Command AddKeygenCommand(CLI::App& app, const std::string& log_level) {
  auto* keygen = app.add_subcommand("keygen", "Write an identity key pair (NAME.key, NAME.pub)");
  auto f = std::make_shared<KeygenFlags>();
  keygen->add_option("--out", f->dir, "Directory for the key files")->required();
  keygen->add_option("--name", f->name, "Key name, e.g. coordinator or client-000")->required();
  return {keygen, [f, &log_level] { return RunKeygenCommand(*f, log_level); }};
}

}  // namespace cohort::cli
