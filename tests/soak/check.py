"""Judge a soak run: read each participant's JSON report and check that no key
was admitted more than the policy allows, that no call failed, and that each
process's memory stayed flat. Prints a summary table for the README.

    python check.py LIMIT BUCKET_CAPACITY REPORT...
"""

import json
import sys


def main() -> int:
    limit, capacity = int(sys.argv[1]), int(sys.argv[2])
    reports = [json.load(open(p)) for p in sys.argv[3:]]
    totals: dict[str, int] = {}
    failures = []
    print("| process | calls | errors | admitted | RSS after 10 s (MiB) | RSS at the end (MiB) |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    for r in reports:
        for user, n in r["admitted"].items():
            totals[user] = totals.get(user, 0) + n
        rss = r["rss_kib"]
        early = rss[min(9, len(rss) - 1)] if rss else 0
        late = rss[-1] if rss else 0
        print(f"| {r['lang']} | {r['calls']} | {r['errors']} | {sum(r['admitted'].values())} "
              f"| {early / 1024:.1f} | {late / 1024:.1f} |")
        if r["errors"]:
            failures.append(f"{r['lang']}: {r['errors']} calls failed")
        # Flat memory: after warm-up, growth stays within 25% + 16 MiB.
        if early and late > early * 1.25 + 16 * 1024:
            failures.append(f"{r['lang']}: RSS grew from {early} KiB to {late} KiB")
    bound = min(limit, capacity)
    over = {u: n for u, n in totals.items() if n > bound}
    if over:
        failures.append(f"{len(over)} keys admitted more than {bound}: {sorted(over.items())[:5]}")
    full = sum(1 for n in totals.values() if n == bound)
    print(f"\n{len(totals)} keys, {sum(totals.values())} admissions in all; "
          f"{full} keys reached their limit of {bound} exactly, none exceeded it"
          if not over else "")
    for f in failures:
        print(f"FAILED: {f}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
