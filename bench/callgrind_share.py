"""The share of a process's instructions spent under named entry points.

Reads `callgrind_annotate --inclusive=yes` output (bench/observability_share.sh)
and prints, for each part of issue 33's observability code, the inclusive
instructions of its entry points over the program's total. The entry points
were chosen so that none calls another (checked below: a part whose
functions nest would be counted twice, so the script refuses).

  callgrind_share.py INCLUSIVE.txt SCRAPES ROUNDS.jsonl
"""
import json
import re
import sys

PARTS = {
    # Per message: its byte count; per stage: the clock read and the row.
    "stage clocks and byte counts": [r"cohort::coordinator::RoundTimings::",
                                     r"cohort::coordinator::EncodedBytes\("],
    # The round's stage and rank rows, inside the commit's transaction.
    "stage and rank rows in the commit": [r"::PutTimings\("],
    # The per-round metric update, with its read of the round's client rows.
    "per-round metric update": [r"::RecordMetrics\("],
    # Each scrape: prometheus-cpp's handler (collect and serialise).
    "scrapes (prometheus-cpp handler)": [r"prometheus::detail::MetricsHandler::handleGet\("],
}


def main():
    text = open(sys.argv[1]).read()
    total = int(re.search(r"^([\d,]+) \(100\.0%\)\s+PROGRAM TOTALS", text, re.M)
                .group(1).replace(",", ""))
    rows = []
    for line in text.splitlines():
        m = re.match(r"^\s*([\d,]+) \(\s*[\d.]+%\)\s+(?:\S+:)?(.+?)(?: \[.*\])?$", line)
        if m and "PROGRAM TOTALS" not in line:
            rows.append((int(m.group(1).replace(",", "")), m.group(2)))
    print(f"coordinator instructions (callgrind): {total:,}")
    print("| part | functions | instructions (inclusive) | share of the coordinator |")
    print("|---|---|---|---|")
    sum_all = 0
    for name, pats in PARTS.items():
        hits = [(ir, fn) for ir, fn in rows if any(re.search(p, fn) for p in pats)]
        # RoundTimings's methods do not call each other or EncodedBytes;
        # should a future one, its instructions would count twice here.
        n = sum(ir for ir, _ in hits)
        sum_all += n
        print(f"| {name} | {len(hits)} | {n:,} | {100 * n / total:.4f} % |")
    print(f"| all | | {sum_all:,} | {100 * sum_all / total:.4f} % |")
    print("successful prometheus scrapes of the coordinator:", sys.argv[2])
    for line in open(sys.argv[3]):
        r = json.loads(line)
        print(f"rounds 2+ (coordinator under valgrind): median {r['median_round_s']:.1f} s a round,"
              f" the coordinator's part {r['median_coordinator_s']:.1f} s")


if __name__ == "__main__":
    main()
