// A config's float fraction as the decimal it was written as.
#ifndef COHORT_COMMON_DECIMAL_H_
#define COHORT_COMMON_DECIMAL_H_

#include <cstdint>

namespace cohort {

// floor(d x n), exactly, where d is the shortest decimal that rounds to
// `fraction` (the "0.45" a config wrote, not the float's 0.449999988...,
// whose product with 100 rounds down to 44). 0 for a fraction below 1e-15
// (d x n < 1 for every n here) or NaN; n for one of 1 or more.
uint64_t FloorOfDecimalTimes(float fraction, uint32_t n);

}  // namespace cohort

#endif  // COHORT_COMMON_DECIMAL_H_
