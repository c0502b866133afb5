// Force-included (-include) into every file of the clang fuzzing build
// (`make fuzz`, build-fuzz/) only. clang 14, Debian 12's clang, rejects
// __builtin_cpu_supports("vaes"), which crypto/prg.cc uses to pick its AES
// kernel ("invalid cpu feature string for builtin"). This answers "vaes"
// from CPUID leaf 7 (ECX bit 9) and passes every other feature to the
// builtin. The ordinary GCC builds do not use this file.
#ifndef COHORT_TESTS_FUZZ_CLANG_CPU_SUPPORTS_H_
#define COHORT_TESTS_FUZZ_CLANG_CPU_SUPPORTS_H_

#if defined(__clang__) && defined(__x86_64__) && defined(__cplusplus)
#include <cpuid.h>

#include <cstring>

static inline bool CohortFuzzCpuSupports(const char* feature) {
  if (std::strcmp(feature, "vaes") == 0) {
    unsigned a, b, c, d;
    return __get_cpuid_count(7, 0, &a, &b, &c, &d) != 0 && (c & (1u << 9)) != 0;
  }
  if (std::strcmp(feature, "avx2") == 0) return __builtin_cpu_supports("avx2");
  if (std::strcmp(feature, "aes") == 0) return __builtin_cpu_supports("aes");
  if (std::strcmp(feature, "sse4.1") == 0) return __builtin_cpu_supports("sse4.1");
  return false;  // A feature this shim does not know: the code falls back.
}
#define __builtin_cpu_supports(feature) CohortFuzzCpuSupports(feature)
#endif

#endif  // COHORT_TESTS_FUZZ_CLANG_CPU_SUPPORTS_H_
