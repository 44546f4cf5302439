#!/usr/bin/env python3
"""Draws run.sh's summary (JSON) as an SVG chart: for every row (protocol, body size,
pacing, connections), the median max qps and the median Envoy CPU seconds per 10k
requests of each scenario, side by side. No plotting library: plain SVG.

  benchmarks/envoy/chart.py SUMMARY.json OUT.svg
"""
import collections
import html
import json
import statistics
import sys

COLOURS = {"direct": "#999999", "plaintext": "#bbbbbb", "mtls": "#4477aa",
           "mtls2": "#88aadd", "themis": "#ee6677", "themis-native": "#228833",
           "themis-tls": "#ccbb44"}


def medians(runs):
    """{(row, scenario): (max qps, cpu per 10k)} over the rounds' max runs."""
    groups = collections.defaultdict(list)
    for run in runs:
        if run.get("kind") != "max" or not run.get("qps"):
            continue
        row = (run["protocol"], run["body_bytes"], run["pacing"], run["connections"])
        groups[(row, run["scenario"])].append(run)
    out = {}
    for key, group in groups.items():
        cpu = [r["envoy_cpu_s_per_10k"] for r in group if r.get("envoy_cpu_s_per_10k") is not None]
        out[key] = (statistics.median(r["qps"] for r in group), statistics.median(cpu) if cpu else None)
    return out


def panel(x0, y0, width, height, title, rows, scenarios, value, unit):
    """One bar chart: groups of bars (one per scenario) per row."""
    values = [value(r, s) for r in rows for s in scenarios if value(r, s) is not None]
    top = max(values, default=1) * 1.1
    parts = [f'<text x="{x0}" y="{y0 - 8}" font-size="14" font-weight="bold">{html.escape(title)}</text>',
             f'<line x1="{x0}" y1="{y0 + height}" x2="{x0 + width}" y2="{y0 + height}" stroke="#333"/>']
    group_w = width / max(len(rows), 1)
    bar_w = group_w * 0.8 / max(len(scenarios), 1)
    for i, row in enumerate(rows):
        gx = x0 + i * group_w + group_w * 0.1
        for j, scen in enumerate(scenarios):
            v = value(row, scen)
            if v is None:
                continue
            h = height * v / top
            bx = gx + j * bar_w
            parts.append(f'<rect x="{bx:.1f}" y="{y0 + height - h:.1f}" width="{bar_w - 1:.1f}" height="{h:.1f}" '
                         f'fill="{COLOURS.get(scen, "#777")}"><title>{html.escape(scen)}: {v:.2f} {unit}</title></rect>')
            parts.append(f'<text x="{bx + bar_w / 2:.1f}" y="{y0 + height - h - 2:.1f}" font-size="8" '
                         f'text-anchor="middle">{v:.0f}</text>' if v >= 10 else
                         f'<text x="{bx + bar_w / 2:.1f}" y="{y0 + height - h - 2:.1f}" font-size="8" '
                         f'text-anchor="middle">{v:.1f}</text>')
        protocol, size, pacing, conns = row
        label = f"{protocol} {size // 1024} KB {pacing} c={conns}"
        parts.append(f'<text x="{x0 + i * group_w + group_w / 2:.1f}" y="{y0 + height + 14}" font-size="9" '
                     f'text-anchor="middle">{html.escape(label)}</text>')
    return parts


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    runs = json.load(open(sys.argv[1]))
    data = medians(runs)
    rows = sorted({row for row, _ in data})
    scenarios = [s for s in COLOURS if any(scen == s for _, scen in data)]
    scenarios += sorted({scen for _, scen in data} - set(scenarios))
    width, height = max(640, 150 * len(rows)), 200
    svg = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width + 80}" height="{2 * height + 150}" '
           'font-family="sans-serif"><rect width="100%" height="100%" fill="white"/>']
    svg += panel(40, 40, width, height, "max requests/s (median over rounds; higher is better)", rows, scenarios,
                 lambda r, s: data.get((r, s), (None, None))[0], "req/s")
    svg += panel(40, height + 100, width, height,
                 "Envoy CPU seconds per 10k requests, both Envoys (lower is better)", rows, scenarios,
                 lambda r, s: data.get((r, s), (None, None))[1], "s/10k")
    for k, scen in enumerate(scenarios):
        x = 40 + k * 120
        svg.append(f'<rect x="{x}" y="{2 * height + 130}" width="10" height="10" fill="{COLOURS.get(scen, "#777")}"/>'
                   f'<text x="{x + 14}" y="{2 * height + 139}" font-size="11">{html.escape(scen)}</text>')
    svg.append("</svg>")
    with open(sys.argv[2], "w") as out:
        out.write("\n".join(svg) + "\n")


if __name__ == "__main__":
    main()
