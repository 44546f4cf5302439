#!/usr/bin/env python3
"""Prints the RESULTS.md tables from criterion's estimates (medians).

    python3 benchmarks/summarize.py [target/criterion]
"""
import json
import sys
from pathlib import Path

root = Path(sys.argv[1] if len(sys.argv) > 1 else "target/criterion")
SIZES = ["1KB", "10KB", "100KB", "1000KB"]
RECORDS = ["themis_in_place", "themis_chacha_in_place", "ring_aes256gcm_raw",
           "ring_chacha20poly1305_raw", "rustls", "snow_transport"]
HANDSHAKES = ["themis", "primitive_sum", "rustls_tls13_mtls", "snow_noise_xx"]


def median_ns(*path):
    estimates = json.loads((root.joinpath(*path) / "new" / "estimates.json").read_text())
    return estimates["median"]["point_estimate"], estimates["median_abs_dev"]["point_estimate"]


def fmt_time(ns):
    return f"{ns / 1e6:.3f} ms" if ns >= 1e6 else f"{ns / 1e3:.2f} µs" if ns >= 1e3 else f"{ns:.0f} ns"


def gib_s(size_label, ns):
    return int(size_label[:-2]) * 1024 / ns * 1e9 / 2**30


hs = {name: median_ns("handshake", name) for name in HANDSHAKES}
print("| handshake | median | median abs. dev. |\n|---|---:|---:|")
for name, (med, mad) in hs.items():
    print(f"| {name} | {fmt_time(med)} | {fmt_time(mad)} |")
themis = hs["themis"][0]
print(f"\nthemis / primitive_sum = {themis / hs['primitive_sum'][0]:.3f}")
print(f"themis / rustls_tls13_mtls = {themis / hs['rustls_tls13_mtls'][0]:.3f}")
print(f"themis / snow_noise_xx = {themis / hs['snow_noise_xx'][0]:.3f}\n")

rec = {(n, s): median_ns("seal_open", n, s)[0] for n in RECORDS for s in SIZES}
print("| seal + open (median time, throughput) | " + " | ".join(SIZES) + " |")
print("|---|" + "---:|" * len(SIZES))
for n in RECORDS:
    cells = [f"{fmt_time(rec[n, s])}, {gib_s(s, rec[n, s]):.2f} GiB/s" for s in SIZES]
    print(f"| {n} | " + " | ".join(cells) + " |")
print()
for themis_name, raw in [("themis_in_place", "ring_aes256gcm_raw"),
                         ("themis_chacha_in_place", "ring_chacha20poly1305_raw")]:
    ratios = ", ".join(f"{s}: {rec[raw, s] / rec[themis_name, s]:.1%}" for s in SIZES)
    print(f"{themis_name} throughput / {raw}: {ratios}")
