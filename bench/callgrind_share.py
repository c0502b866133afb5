"""The share of the coordinator's instructions that issue 33's observability
code takes, from `callgrind_annotate --inclusive=yes` output
(bench/observability_share.sh).

  callgrind_share.py INCLUSIVE.txt SCRAPES ROUNDS.jsonl

Each part is named by entry points that do not call one another (the
RoundTimings methods and EncodedBytes; PutTimings, the stage and rank rows
of the commit; RecordMetrics, the per-round metric update with its read of
the round's client rows; CivetServer::requestHandler, everything a scrape
costs inside the coordinator's process). Under valgrind the coordinator runs
~50x slower while Prometheus keeps its wall-clock interval, so it serves far
more scrapes per round than natively: the scrapes' share is given as
measured, and scaled to NATIVE_SCRAPES_PER_ROUND (default 2: a 1 s scrape
interval, shorter than Prometheus's default of 1 min, against a native
secagg-round of about 2 s).
"""
import json
import os
import re
import sys

PARTS = {
    "stage clocks and byte counts (per message)": [r"cohort::coordinator::RoundTimings::",
                                                   r"cohort::coordinator::EncodedBytes\("],
    "stage and rank rows in the commit": [r"::PutTimings\("],
    "per-round metric update": [r"::RecordMetrics\("],
}
SCRAPE = r"CivetServer::requestHandler\("


def rows_of(text):
    """(inclusive instructions, function) per row; the file part ("???:",
    "path/x.cc:") is cut off at the first ':' that is not part of a '::'."""
    rows = []
    for line in text.splitlines():
        m = re.match(r"^\s*([\d,]+) \(\s*[\d.]+%\)\s+(.+?)(?: \[[^\]]*\])?$", line)
        if not m or "PROGRAM TOTALS" in line:
            continue
        name = re.sub(r"^(?:[^:]|::)*?:(?!:)", "", m.group(2), count=1)
        rows.append((int(m.group(1).replace(",", "")), name))
    return rows


def main():
    text = open(sys.argv[1]).read()
    total = int(re.search(r"^([\d,]+) \(100\.0%\)\s+PROGRAM TOTALS", text, re.M)
                .group(1).replace(",", ""))
    rows = rows_of(text)
    rounds = [json.loads(line) for line in open(sys.argv[3])]
    n_rounds = rounds[0]["rounds"] if rounds and "rounds" in rounds[0] else 3
    served = int(os.environ.get("SCRAPES_SERVED", "0"))
    native_per_round = float(os.environ.get("NATIVE_SCRAPES_PER_ROUND", "2"))
    scrape_ir = max((ir for ir, fn in rows if re.search(SCRAPE, fn)), default=0)
    work = total - scrape_ir  # The coordinator's own work, scrapes left out.
    if not any(re.search(SCRAPE, fn) for _, fn in rows) and served:
        sys.exit("callgrind_share: no CivetServer::requestHandler row, though scrapes were served")
    per_round = work / n_rounds
    print(f"coordinator instructions (callgrind): {total:,}; without the scrapes {work:,}, "
          f"{per_round:,.0f} a round over {n_rounds} rounds (start-up included)")
    print("| part | instructions (inclusive) | a round | share of the coordinator's work |")
    print("|---|---|---|---|")
    share_all = 0.0
    for name, pats in PARTS.items():
        n = sum(ir for ir, fn in rows if any(re.search(p, fn) for p in pats))
        share_all += n / work
        print(f"| {name} | {n:,} | {n / n_rounds:,.0f} | {100 * n / work:.4f} % |")
    if served:
        per_scrape = scrape_ir / served
        native = native_per_round * per_scrape
        share_all += native / per_round
        print(f"| scrapes as measured ({served} served under valgrind) | {scrape_ir:,} | "
              f"{scrape_ir / n_rounds:,.0f} | {100 * scrape_ir / work:.4f} % |")
        print(f"| scrapes at {native_per_round:g} a round ({per_scrape:,.0f} each) | | "
              f"{native:,.0f} | {100 * native / per_round:.4f} % |")
    print(f"| all (scrapes at the native rate) | | | {100 * share_all:.4f} % |")
    print("successful prometheus scrapes (under valgrind many time out):", sys.argv[2])
    for r in rounds:
        print(f"rounds 2+ (coordinator under valgrind): median {r['median_round_s']:.1f} s a round,"
              f" the coordinator's part {r['median_coordinator_s']:.1f} s")


if __name__ == "__main__":
    main()
