// Logging set-up. Every process calls InitLogging once with its role
// ("coordinator", "client", ...) and, for clients, its name; every line then
// carries both. Logs go to stderr so stdout stays for user-facing output.
#ifndef COHORT_COMMON_LOGGING_H_
#define COHORT_COMMON_LOGGING_H_

#include <spdlog/spdlog.h>

#include <string_view>

namespace cohort {

// `level`: "trace", "debug", "info", "warn", "error". Unknown -> "info".
void InitLogging(std::string_view role, std::string_view id = {}, std::string_view level = "info");

}  // namespace cohort

#endif  // COHORT_COMMON_LOGGING_H_
