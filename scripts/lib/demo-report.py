#!/usr/bin/env python3
"""The report lines of scripts/demo.sh, from the agents' JSON answers, the apps' answers
and a packet capture. Every id is labelled (node id, workload id, mesh id) and shortened
to a prefix that is unique among the ids the demo has seen, the way git shortens
hashes; DEMO_FULL_IDS=1 prints them whole.

  demo-report.py ring STATUS.json...             the agents: node ids and addresses
  demo-report.py resolve RESOLVE.json [WHERE]     a service's instances
  demo-report.py answer ANSWER.json MARKER        what the apps saw of one request
  demo-report.py wire PCAP MARKER PATH            what a capture of that request holds
  demo-report.py calls ANSWER.json...             which check instance answered each call
  demo-report.py ids-in < TEXT                    TEXT, each id shortened and named

Environment: DEMO_IDS, a file with a line per id the demo knows, saying what it is:
"ID mesh NAME", "ID node N", "ID workload NAME SERVICE N"; DEMO_FULL_IDS.
"""
import collections
import json
import math
import os
import struct
import sys

MIN_DATA_CHARS = 8  # after "<mesh>1": 40 bits, more than git's 7 hex digits


def known_ids():
    """id -> its line's words after the id: ["node", "3"], ["workload", name, service, node]."""
    labels = {}
    path = os.environ.get("DEMO_IDS")
    if path and os.path.exists(path):
        for line in open(path):
            words = line.split()
            if words:
                labels[words[0]] = words[1:]
    return labels


LABELS = known_ids()


def prefix_len(ids):
    """The shortest prefix length (at least the mesh name, "1" and MIN_DATA_CHARS) at
    which all ids differ."""
    ids = sorted(set(ids))
    if not ids:
        return 0
    head = ids[0].index("1", 1) + 1 if "1" in ids[0][1:] else 0
    n = head + MIN_DATA_CHARS
    while len({i[:n] for i in ids}) < len(ids) and n < max(map(len, ids)):
        n += 1
    return n


PREFIX = prefix_len(LABELS)


def describe(ident):
    """What an id is, in words: "client on node 2", "node 3's agent"."""
    kind = LABELS.get(ident, ["?"])
    if kind[0] == "workload":
        return f"{kind[1]} on node {kind[3]}"
    if kind[0] == "node":
        return f"node {kind[1]}'s agent"
    if kind[0] == "mesh":
        return f"mesh {kind[1]}'s root"
    return "unknown to the demo"


def short(ident):
    if not ident:
        return "(none)"
    if os.environ.get("DEMO_FULL_IDS") == "1" or not PREFIX or len(ident) <= PREFIX:
        return ident
    return ident[:PREFIX] + "…"


def node_of(addr):
    """ "10.77.0.3:15006" -> "node 3" """
    host = addr.rsplit(":", 1)[0]
    return f"node {host.rsplit('.', 1)[1]}" if host.startswith("10.77.0.") else host


def ring(paths):
    for n, path in enumerate(paths, 1):
        v = json.load(open(path))
        state = "in the ring" if v.get("joined") else "NOT joined"
        print(f"node {n}  node id {short(v['id'])}  listens on {v['listen']}  ({state})")


def resolve(path, where="node 1"):
    v = json.load(open(path))
    instances = v["instances"]
    source = (
        f"from {where}'s resolution cache (answers stay there for a few seconds; --fresh asks the ring)"
        if v.get("cached")
        else f"fresh from the ring: {v.get('answered', '?')} of {v.get('replicas', '?')} replica holders answered"
    )
    print(f"{v['service']}: {len(instances)} instance{'' if len(instances) == 1 else 's'}, {source}")
    for i in instances:
        signer = f", its record signed by {describe(i['endorser'])} (node id {short(i['endorser'])})" if i.get("endorser") else ""
        print(f"  workload id {short(i['id'])} at {i['endpoint']}: {describe(i['id'])}{signer}")


def answer(path, marker):
    """The client's curl got handler's answer, which holds check's answer."""
    a = json.load(open(path))
    c = a["check"]
    ch = c["answer"]
    who = lambda ident: f"workload id {short(ident)} ({describe(ident)})"
    print(f"client's curl sent a body of {len(marker)} bytes: {marker!r}")
    print(f"handler's app got {a['method']} {a['path']} with body {a['body']!r}")
    print(f"    from {who(a['peer_id'])}, service {a['peer_service']}: its sidecar verified the caller")
    print(f"handler's app called {c['url']}; its sidecar authenticated {who(c['peer_id'])}, service {c['peer_service']}")
    print(f"check's app got {ch['method']} {ch['path']} with body {ch['body']!r}")
    print(f"    from {who(ch['peer_id'])}, service {ch['peer_service']}; it answered n={ch.get('n')} prime={ch.get('prime')}")
    expected = {"client": a["peer_id"], "check": c["peer_id"], "handler": ch["peer_id"]}
    ok = (a["peer_service"], c["peer_service"], ch["peer_service"]) == ("client", "check", "handler")
    for service, ident in expected.items():
        kind = LABELS.get(ident, [])
        ok &= len(kind) == 4 and kind[0] == "workload" and kind[2] == service
    ok &= a["body"] == marker and ch["body"] == marker
    print("every peer id is one the ring resolves for that service" if ok else "MISMATCH: see above")
    return 0 if ok else 1


def packets(path):
    """(src, sport, dst, dport, seq, payload) of the IPv4 TCP packets of a pcap file
    (Ethernet link type)."""
    data = open(path, "rb").read()
    magic = data[:4]
    endian = "<" if magic in (b"\xd4\xc3\xb2\xa1", b"\x4d\x3c\xb2\xa1") else ">"
    linktype = struct.unpack(endian + "I", data[20:24])[0]
    if linktype != 1:
        raise SystemExit(f"pcap link type {linktype}, expected Ethernet")
    off = 24
    while off + 16 <= len(data):
        incl = struct.unpack(endian + "I", data[off + 8:off + 12])[0]
        frame = data[off + 16:off + 16 + incl]
        off += 16 + incl
        if len(frame) < 34 or frame[12:14] != b"\x08\x00":
            continue
        ip = frame[14:]
        ihl = (ip[0] & 0x0F) * 4
        total = struct.unpack("!H", ip[2:4])[0]
        if ip[9] != 6:
            continue
        src, dst = ".".join(map(str, ip[12:16])), ".".join(map(str, ip[16:20]))
        tcp = ip[ihl:total]
        sport, dport, seq = struct.unpack("!HHI", tcp[:8])
        yield src, sport, dst, dport, seq, tcp[(tcp[12] >> 4) * 4:]


def entropy(data):
    counts = collections.Counter(data)
    return -sum(c / len(data) * math.log2(c / len(data)) for c in counts.values())


def http_messages(stream):
    """Splits an HTTP/1.1 byte stream into (start line, headers, body)."""
    while stream:
        head, sep, rest = stream.partition(b"\r\n\r\n")
        if not sep:
            return
        lines = head.decode("latin-1").split("\r\n")
        headers = dict(l.split(":", 1) for l in lines[1:] if ":" in l)
        headers = {k.strip().lower(): v.strip() for k, v in headers.items()}
        length = int(headers.get("content-length", 0) or 0)
        yield lines[0], headers, rest[:length]
        stream = rest[length:]


# themis_core::wire: the version (PROTOCOL_VERSION, read from the source so the two
# never disagree), then the kind (1 Hello, 2 HelloReply, 3 Confirm, 4 Record). A
# record's header is 30 bytes: version, kind, session id (8), sequence number (8),
# reply-to (8), payload length (u32 LE); a 16-byte tag follows the payload.
def protocol_version():
    wire_rs = os.path.join(os.path.dirname(__file__), "../../filter/themis-core/src/wire.rs")
    for line in open(wire_rs):
        if line.startswith("pub const PROTOCOL_VERSION: u8 ="):
            return int(line.split("=")[1].strip(" ;\n"))
    raise SystemExit(f"no PROTOCOL_VERSION in {wire_rs}")


VERSION = protocol_version()
KINDS = {1: "hello", 2: "hello-reply", 3: "confirm", 4: "record"}


def themis_frames(stream):
    """The frames at the start of one direction of a sidecar-to-sidecar stream, as
    (kind, length): handshake messages are sized by what follows them (a record or the
    end), records by their header."""
    frames, at = [], 0
    while at + 2 <= len(stream) and stream[at] == VERSION and stream[at + 1] in KINDS:
        kind = KINDS[stream[at + 1]]
        if kind == "record":
            if at + 30 > len(stream):
                break
            length = 30 + struct.unpack_from("<I", stream, at + 26)[0] + 16
        else:
            # Up to the next message: a Confirm after a Hello, else the first record.
            starts = [i for i in (stream.find(bytes([VERSION, k]), at + 2) for k in (3, 4)) if i > 0]
            length = (min(starts) if starts else len(stream)) - at
        frames.append((kind, length))
        at += length
    return frames


TLS_TYPES = {20: "change-cipher-spec", 21: "alert", 22: "tls-handshake", 23: "tls-record"}


def tls_records(stream):
    """The TLS records at the start of one direction of a stream (the TLS binding,
    `--transport tls`), as (kind, length): 5-byte header (type, version 3.x, length).
    In TLS 1.3 everything after the ServerHello is an encrypted record (type 23)."""
    records, at = [], 0
    while at + 5 <= len(stream) and stream[at] in TLS_TYPES and stream[at + 1] == 3:
        length = 5 + struct.unpack_from("!H", stream, at + 3)[0]
        records.append((TLS_TYPES[stream[at]], length))
        at += length
    return records


def wire(pcap, marker, path):
    raw = open(pcap, "rb").read()
    flows = collections.defaultdict(dict)  # (src, sport, dst, dport) -> {seq: payload}
    count = 0
    for src, sport, dst, dport, seq, payload in packets(pcap):
        count += 1
        if payload:
            flows[(src, sport, dst, dport)].setdefault(seq, payload)
    by_port = collections.Counter()
    for (src, sport, dst, dport), segments in flows.items():
        port = min(sport, dport)
        by_port[port] += sum(map(len, segments.values()))
    total = sum(by_port.values())
    parts = ", ".join(
        f"{n} B {'between sidecars (port 15006)' if p == 15006 else 'between agents (port 7000, the DHT)' if p == 7000 else f'port {p}'}"
        for p, n in sorted(by_port.items())
    )
    print(f"{count} packets, {total} bytes of TCP payload: {parts}")
    hits = 0
    for secret in (marker, path):
        found = raw.count(secret.encode())
        hits += found
        print(f"{secret!r} occurs {found} times in the capture (the apps above saw it in plain)")
    sealed = 0
    for (src, sport, dst, dport), segments in sorted(flows.items()):
        if 15006 not in (sport, dport):
            continue
        stream = b"".join(segments[s] for s in sorted(segments))
        hop = f"{node_of(src)} → {node_of(dst + ':' + str(dport))}"
        kinds = themis_frames(stream) or tls_records(stream)
        if not kinds:
            continue
        records = [n for k, n in kinds if k in ("record", "tls-record")]
        sealed += len(records)
        names = ", ".join(f"{k} ({n} B)" for k, n in kinds[:3])
        print(f"{hop}: {len(stream)} B: {names}{', …' if len(kinds) > 3 else ''}; "
              f"{len(records)} sealed records ({sum(records)} B)")
        if records:
            body = stream[-min(len(stream), 4096):]
            printable = sum(32 <= b < 127 for b in body) / len(body)
            noise = os.urandom(len(body))
            print(f"    its last {len(body)} bytes: {entropy(body):.1f} bits of entropy per byte, {printable:.0%} printable "
                  f"(as many bytes from /dev/urandom: {entropy(noise):.1f} and "
                  f"{sum(32 <= b < 127 for b in noise) / len(noise):.0%})")
    if not sealed:
        print("no sealed record between the sidecars in the capture")
        return 1
    return 1 if hits else 0


def calls(paths):
    spread = collections.Counter()
    failed = 0
    for path in paths:
        try:
            a = json.load(open(path))
            spread[a["check"]["peer_id"]] += 1
        except (OSError, ValueError, KeyError, TypeError):
            failed += 1
    for ident, n in spread.most_common():
        print(f"  {n:3} answered by workload id {short(ident)} ({describe(ident)})")
    if failed:
        print(f"  {failed:3} failed")
    return 0 if spread else 1


def ids_in():
    """stdin to stdout, each id the demo knows shortened and named."""
    for line in sys.stdin:
        for ident in LABELS:
            if ident in line:
                line = line.replace(ident, f"{short(ident)} ({describe(ident)})")
        sys.stdout.write(line)


def main(argv):
    command, args = argv[1], argv[2:]
    if command == "ring":
        return ring(args)
    if command == "resolve":
        return resolve(*args)
    if command == "answer":
        return answer(*args)
    if command == "wire":
        return wire(*args)
    if command == "calls":
        return calls(args)
    if command == "ids-in":
        return ids_in()
    if command == "short":
        print(short(args[0]))
        return 0
    raise SystemExit(__doc__)


if __name__ == "__main__":
    sys.exit(main(sys.argv) or 0)
