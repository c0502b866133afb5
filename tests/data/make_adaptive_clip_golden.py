#!/usr/bin/python3
"""Writes adaptive_clip_golden.txt: Andrew et al. 2021's geometric clip update on fixed inputs.

Plain Python (math only), independent of coordinator/adaptive_clip.cc:

    C <- C * exp(-eta * (noisy_count / cohort - gamma))     (clamped to [1e-9, max_clip])
    z_delta = (z^-2 - (2 sigma_b)^-2)^-1/2

Each "run" line gives the settings and the noisy counts of successive
rounds; each "clip" line the clip after that round. Each "zdelta" line a
noise multiplier pair and z_delta. Run: /usr/bin/python3
tests/data/make_adaptive_clip_golden.py; deterministic. With --check it
writes nothing and fails when the file differs from a fresh computation.
"""
import math
import os
import sys

# gamma, eta, cohort, initial clip, max clip (0: none), noisy counts per round.
RUNS = [
    (0.5, 0.2, 5, 1.0, 0.0, [5.0, 5.0, 2.5, 0.0, -1.3, 3.7, 6.2]),
    (0.9, 0.2, 100, 0.1, 0.0, [100.0, 97.3, 88.0, 91.5, 120.4, 60.0]),
    (0.1, 1.0, 20, 3.0, 4.0, [0.0, 0.0, 0.0, 1.0, 2.0, 20.0]),
    (0.5, 10.0, 3, 1e-8, 0.0, [3.0, 3.0, 3.0]),  # Down to the 1e-9 floor.
]
ZS = [(1.0, 2.5), (1.1, 0.6), (0.5, 10.0), (4.0, 2.0001)]


def main():
    lines = ["# Written by make_adaptive_clip_golden.py. Do not edit: run the script again.",
             "# run GAMMA ETA COHORT C0 MAX_CLIP / clip ROUND NOISY_COUNT CLIP_AFTER",
             "# zdelta Z SIGMA_B Z_DELTA"]
    for gamma, eta, cohort, c, max_clip, counts in RUNS:
        lines.append(f"run {gamma!r} {eta!r} {cohort} {c!r} {max_clip!r}")
        for r, count in enumerate(counts, 1):
            c = c * math.exp(-eta * (count / cohort - gamma))
            if max_clip > 0:
                c = min(c, max_clip)
            c = max(c, 1e-9)
            lines.append(f"clip {r} {count!r} {c!r}")
    for z, sb in ZS:
        lines.append(f"zdelta {z!r} {sb!r} {(z ** -2 - (2 * sb) ** -2) ** -0.5!r}")
    out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "adaptive_clip_golden.txt")
    if "--check" in sys.argv[1:]:
        with open(out) as f:
            ok = f.read().splitlines() == lines
        print(f"{out}: {'matches' if ok else 'differs from'} a fresh computation")
        sys.exit(0 if ok else 1)
    with open(out, "w") as f:
        f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
