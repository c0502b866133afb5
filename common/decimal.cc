#include "common/decimal.h"

#include <charconv>
#include <string_view>

namespace cohort {

uint64_t FloorOfDecimalTimes(float fraction, uint32_t n) {
  if (!(fraction >= 1e-15f) || n == 0) return 0;
  if (fraction >= 1) return n;
  // The shortest round-trip form in fixed notation: "0.45", "0.000001";
  // at most 15 + 9 digits after the point.
  char buf[96];
  const auto [end, error] =
      std::to_chars(buf, buf + sizeof(buf), fraction, std::chars_format::fixed);
  if (error != std::errc()) return 0;
  using u128 = unsigned __int128;
  u128 num = 0, den = 1;
  bool after_point = false;
  for (char c : std::string_view(buf, static_cast<size_t>(end - buf))) {
    if (c == '.') {
      after_point = true;
      continue;
    }
    if (after_point) {  // (Before it: the 0.)
      num = num * 10 + static_cast<unsigned>(c - '0');
      den *= 10;
    }
  }
  // n < 2^32 and num, den < 10^24 (a float below 1 has at most 9
  // significant digits after its first 15 zeros): no overflow.
  return static_cast<uint64_t>(num * n / den);
}

}  // namespace cohort
