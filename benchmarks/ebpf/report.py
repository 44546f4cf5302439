#!/usr/bin/env python3
"""Checks and tables for benchmarks/ebpf/run.sh.

  report.py check BASE MODE "CX RQ" "CX RQ"   one Fortio run of part A: BASE.json (Fortio),
                                              BASE.counters.json (capture or iptables),
                                              Envoy's counters before and after
  report.py check-fp BASE on|off              one fastpath_bench run of part B
  report.py report RESULTS_DIR                the Markdown tables (exit 1 if a check failed)

The check commands print one line `name<TAB>OK|FAILED<TAB>details` for checks.tsv.
"""
import json
import os
import statistics
import sys


def fortio(path):
    d = json.load(open(path))
    codes = {str(k): v for k, v in (d.get("RetCodes") or {}).items()}
    hist = d["DurationHistogram"]
    seconds = d["ActualDuration"] / 1e9
    return {
        "requests": hist["Count"],
        "ok": codes.get("200", 0),
        "errors": hist["Count"] - codes.get("200", 0),
        "sockets": d.get("SocketCount", 0),
        "conn_per_s": d.get("SocketCount", 0) / seconds if seconds else 0.0,
        "qps": d["ActualQPS"],
        "p": {int(x["Percentile"]): x["Value"] * 1e3 for x in hist.get("Percentiles") or []},
        "connect_us": (d.get("ConnectionStats") or {}).get("Avg", 0) * 1e6,
    }


def check(base, mode, before, after):
    f = fortio(base + ".json")
    counters = json.load(open(base + ".counters.json"))
    cx0, rq0, ucx0 = (int(x) for x in before.split())
    cx1, rq1, ucx1 = (int(x) for x in after.split())
    cx, rq, ucx = cx1 - cx0, rq1 - rq0, ucx1 - ucx0
    n, s = f["requests"], f["sockets"]
    problems = []
    if n == 0 or f["errors"]:
        problems.append("%d of %d requests not answered 200" % (f["errors"], n))
    if mode == "direct":
        if cx or rq:
            problems.append("Envoy saw %d connections / %d requests: not direct" % (cx, rq))
    else:
        if cx < s or rq < n:
            problems.append("Envoy saw %d connections / %d requests for %d sockets / %d requests" % (cx, rq, s, n))
    if mode == "iptables" and counters.get("redirect_packets", 0) < s:
        problems.append("REDIRECT matched %d packets for %d sockets" % (counters.get("redirect_packets", 0), s))
    if mode in ("ebpf", "ebpf-fp"):
        c = counters
        if c.get("captured", 0) < s or c.get("original_dst_answered", 0) < s:
            problems.append("capture counters too low for %d sockets" % s)
        if c.get("original_dst_missed", 0):
            problems.append("original_dst_missed %d" % c["original_dst_missed"])
        fp = c.get("fast_path_sockets", 0)
        if (mode == "ebpf-fp") != (fp > 0):
            problems.append("fast_path_sockets %d in mode %s" % (fp, mode))
    where = {
        "direct": "",
        "iptables": ", REDIRECT packets %d" % counters.get("redirect_packets", 0),
    }.get(mode, ", capture %s" % " ".join("%s=%s" % kv for kv in sorted(counters.items()) if kv[1]))
    detail = "%s %s: %.0f conn/s, %.0f req/s, p50 %.3f ms, p99 %.3f ms, %d sockets, Envoy +%d cx +%d rq +%d upstream cx%s" % (
        os.path.basename(base), mode, f["conn_per_s"], f["qps"], f["p"].get(50, 0), f["p"].get(99, 0),
        s, cx, rq, ucx, where)
    if problems:
        detail += " -- " + "; ".join(problems)
    print("%s\t%s\t%s" % (os.path.basename(base), "FAILED" if problems else "OK", detail))


def fp_lines(base):
    return [json.loads(line) for line in open(base + ".jsonl") if line.startswith("{")]


def check_fp(base, fp):
    lines = fp_lines(base)
    counters = json.load(open(base + ".counters.json"))
    sockets = counters.get("fast_path_sockets", 0)
    problems = []
    if not lines:
        problems.append("no results")
    if not all(x["intact"] for x in lines):
        problems.append("data not intact")
    if fp == "on":
        if sockets == 0:
            problems.append("fast_path_sockets is 0")
        if any(x["tcp_bytes_in"] > 64 for x in lines):
            problems.append("TCP carried data: %s" % [x["tcp_bytes_in"] for x in lines])
    else:
        if sockets:
            problems.append("fast_path_sockets %d with the fast path off" % sockets)
        if any(x["tcp_bytes_in"] < x["payload_bytes"] for x in lines):
            problems.append("TCP carried less than the payload")
    detail = "%s: fast_path_sockets=%d, TCP bytes in %s, %s" % (
        os.path.basename(base), sockets, [x["tcp_bytes_in"] for x in lines],
        ", ".join("%s %d B %s" % (x["test"], x["size"], "p50 %.1f us" % x["p50_us"] if "p50_us" in x
                                 else "%.0f MB/s" % x["mb_per_s"]) for x in lines))
    if problems:
        detail += " -- " + "; ".join(problems)
    print("%s\t%s\t%s" % (os.path.basename(base), "FAILED" if problems else "OK", detail))


def spread(xs, fmt):
    """median, and min-max when there is more than one value."""
    if not xs:
        return "–"
    m = fmt % statistics.median(xs)
    return m if len(xs) == 1 else "%s (%s–%s)" % (m, fmt % min(xs), fmt % max(xs))


def report(results):
    meta = json.load(open(os.path.join(results, "meta.json")))
    checks = {}
    if os.path.exists(os.path.join(results, "checks.tsv")):
        for line in open(os.path.join(results, "checks.tsv")):
            name, verdict, detail = line.rstrip("\n").split("\t", 2)
            checks[name] = (verdict, detail)
    failed = [d for v, d in checks.values() if v != "OK"]
    files = sorted(os.listdir(results))

    # Part A: r<round>-<test>-<mode>.json
    runs = {}
    for name in files:
        if name.startswith("r") and name.endswith(".json") and not name.endswith(".counters.json"):
            stem = name[:-5]
            _, test, mode = stem.split("-", 2)
            runs.setdefault((test, mode), []).append((fortio(os.path.join(results, name)), checks.get(stem, ("?", ""))[0]))
    if runs:
        modes = [m for m in ["direct", "iptables", "ebpf", "ebpf-fp"] if any(k[1] == m for k in runs)]
        cps = sorted({int(t[3:]) for t, _ in runs if t.startswith("cps")})
        rounds = meta["rounds"]
        note = " (median over %d rounds, min–max)" % rounds if rounds > 1 else ""
        print("### eBPF capture vs iptables REDIRECT: new connections per second%s" % note)
        print()
        print("| mode | " + " | ".join("c=%d conn/s" % c for c in cps)
              + " | connect() mean, c=%d | errors | checks |" % (cps[0] if cps else 0))
        print("|---|" + "---:|" * len(cps) + "---:|---:|---|")
        for mode in modes:
            cells, errors, verdicts = [], 0, []
            for c in cps:
                rs = runs.get(("cps%d" % c, mode), [])
                cells.append(spread([r["conn_per_s"] for r, _ in rs], "%.0f"))
                errors += sum(r["errors"] for r, _ in rs)
                verdicts += [v for _, v in rs]
            first = runs.get(("cps%d" % cps[0], mode), []) if cps else []
            connect = spread([r["connect_us"] for r, _ in first], "%.0f µs")
            ok = "all OK" if verdicts and all(v == "OK" for v in verdicts) else "**FAILED**"
            print("| %s | %s | %s | %d | %s |" % (mode, " | ".join(cells), connect, errors, ok))
        print()
        median = {(m, c): statistics.median([r["conn_per_s"] for r, _ in runs[("cps%d" % c, m)]])
                  for m in modes for c in cps if ("cps%d" % c, m) in runs}
        for m in ("ebpf", "ebpf-fp", "direct"):
            if m in modes and "iptables" in modes:
                print("- %s ÷ iptables, conn/s: %s" % (m, ", ".join(
                    "c=%d %.2f" % (c, median[(m, c)] / median[("iptables", c)])
                    for c in cps if (m, c) in median and median.get(("iptables", c)))))
        print()
        print("### Request latency with keep-alive, %d requests/s (-uniform), %d connections%s"
              % (meta["qps"], meta["lat_connections"], note))
        print()
        print("| mode | p50 ms | p90 ms | p99 ms | achieved req/s | errors | checks |")
        print("|---|---:|---:|---:|---:|---:|---|")
        for mode in modes:
            rs = runs.get(("lat", mode), [])
            if not rs:
                continue
            cells = [spread([r["p"].get(q, 0) for r, _ in rs], "%.3f") for q in (50, 90, 99)]
            ok = "all OK" if all(v == "OK" for _, v in rs) else "**FAILED**"
            print("| %s | %s | %s | %d | %s |" % (mode, " | ".join(cells), spread([r["qps"] for r, _ in rs], "%.1f"),
                                               sum(r["errors"] for r, _ in rs), ok))
        print()

    # Part B: fp-<placement>-r<round>-<on|off>.jsonl
    fp = {}
    for name in files:
        if name.startswith("fp-") and name.endswith(".jsonl"):
            _, place, _, mode = name[:-6].split("-")
            for x in fp_lines(os.path.join(results, name[:-6])):
                fp.setdefault(place, {}).setdefault((x["test"], x["size"], mode), []).append(x)
    for place, runs_fp in sorted(fp.items()):
        sizes = sorted({k[1] for k in runs_fp})
        where = "scheduler's choice of CPUs" if place == "any" else "both processes pinned to CPU %s" % place[3:]
        print("### Same-node fast path (sk_msg) vs loopback TCP, %s (median over %d rounds, min–max)"
              % (where, meta["fp_rounds"]))
        print()
        print("| message | metric | fast path off (TCP) | fast path on (sk_msg) | on ÷ off (medians) |")
        print("|---|---|---:|---:|---:|")
        for size in sizes:
            label = "%d KiB" % (size // 1024) if size % 1024 == 0 else "%d B" % size
            for test, key, what in [("pingpong", "p50_us", "ping-pong p50 µs"), ("pingpong", "p99_us", "ping-pong p99 µs"),
                                    ("throughput", "mb_per_s", "one-way MB/s")]:
                off = [x[key] for x in runs_fp.get((test, size, "off"), [])]
                on = [x[key] for x in runs_fp.get((test, size, "on"), [])]
                ratio = "%.2f" % (statistics.median(on) / statistics.median(off)) if on and off and statistics.median(off) else "–"
                print("| %s | %s | %s | %s | %s |" % (label, what, spread(off, "%.1f"), spread(on, "%.1f"), ratio))
        print()
        tcp = {m: sorted({x["tcp_bytes_in"] for k, xs in runs_fp.items() if k[2] == m for x in xs}) for m in ("off", "on")}
        sockets = {m: sorted({json.load(open(os.path.join(results, n)))["fast_path_sockets"] for n in files
                              if n.startswith("fp-%s-" % place) and n.endswith("-%s.counters.json" % m)})
                   for m in ("off", "on")}
        print("- verification: every byte checked on arrival (%s); bytes the two sockets received through "
              "TCP (TCP_INFO): fast path off from %s (≥ the payload), on %s; fast_path_sockets: off %s, on %s"
              % ("all intact" if all(x["intact"] for xs in runs_fp.values() for x in xs) else "**NOT intact**",
                 tcp["off"][0] if tcp["off"] else "–", tcp["on"], sockets["off"], sockets["on"]))
        print()

    print("- command: `%s`" % meta["command"])
    print("- started %s; %d cores, kernel %s; load average %s before, %s after" % (
        meta["started"], meta["cores"], meta["kernel"], meta["load_before"], meta["load_after"]))
    if runs:
        print("- part A: Fortio %s (`-r 0.0001`: percentiles interpolated in 0.1 ms buckets), runs of %s after a %s "
              "warm-up; Envoy %s, --concurrency 2, uid 1337"
              % (meta["fortio"], meta["duration"], meta["warmup"], meta["envoy"]))
    if fp:
        print("- part B: fastpath_bench %s" % (meta["fp_args"] or "(defaults: 10000 round trips after 1000 warm-up, 256 MiB one-way)"))
    if failed:
        print()
        print("**Checks failed:**")
        for d in failed:
            print("- " + d)
        return 1
    return 0


if __name__ == "__main__":
    cmd = sys.argv[1] if len(sys.argv) > 1 else ""
    if cmd == "check" and len(sys.argv) == 6:
        check(*sys.argv[2:6])
    elif cmd == "check-fp" and len(sys.argv) == 4:
        check_fp(*sys.argv[2:4])
    elif cmd == "report" and len(sys.argv) == 3:
        sys.exit(report(sys.argv[2]))
    else:
        sys.exit(__doc__)
