#include "common/logging.h"

#include <spdlog/sinks/stdout_sinks.h>

#include <string>

namespace cohort {

void InitLogging(std::string_view role, std::string_view id, std::string_view level) {
  auto logger = spdlog::stderr_logger_mt("cohort");
  std::string tag(role);
  if (!id.empty()) tag += " " + std::string(id);
  // Role and id are fixed per process, so they go into the pattern.
  logger->set_pattern("[%Y-%m-%d %H:%M:%S.%e] [" + tag + "] [%l] %v");
  logger->set_level(spdlog::level::from_str(std::string(level)));
  logger->flush_on(spdlog::level::info);
  spdlog::set_default_logger(logger);
}

}  // namespace cohort
