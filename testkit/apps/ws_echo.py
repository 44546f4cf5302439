#!/usr/bin/env python3
"""A WebSocket echo server and client (the `websockets` package) for
tests/protocols.rs.

  ws_echo.py server --listen IP        prints "listening <port>"; on each connection
                                       first sends "hello <path> <Host> <x-themis-peer-service>",
                                       then answers every message with "echo:<message>"
  ws_echo.py client --connect IP:PORT --host check --marker M --count N --out FILE
                                       opens ws://<host>/ws/<marker> over a TCP
                                       connection to IP:PORT, sends N messages one at a
                                       time, writes the greeting and the answers as JSON
"""
import argparse
import json
import socket
import sys

from websockets.sync.client import connect
from websockets.sync.server import serve

TIMEOUT = 20


def server(args):
    def handler(ws):
        request = ws.request
        ws.send(
            "hello {} {} {}".format(
                request.path,
                request.headers.get("Host", ""),
                request.headers.get("x-themis-peer-service", ""),
            )
        )
        for message in ws:
            ws.send("echo:" + message)

    with serve(handler, args.listen, 0) as s:
        print(f"listening {s.socket.getsockname()[1]}", flush=True)
        s.serve_forever()


def client(args):
    host, _, port = args.connect.rpartition(":")
    sock = socket.create_connection((host, int(port)), timeout=TIMEOUT)
    out = {"messages": []}
    with connect(f"ws://{args.host}/ws/{args.marker}", sock=sock, open_timeout=TIMEOUT,
                 close_timeout=TIMEOUT) as ws:
        out["greeting"] = ws.recv(timeout=TIMEOUT)
        for i in range(args.count):
            ws.send(f"message {i} {args.marker}")
            out["messages"].append(ws.recv(timeout=TIMEOUT))
    with open(args.out, "w") as f:
        json.dump(out, f)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="mode", required=True)
    s = sub.add_parser("server")
    s.add_argument("--listen", required=True)
    c = sub.add_parser("client")
    c.add_argument("--connect", required=True)
    c.add_argument("--host", required=True)
    c.add_argument("--marker", required=True)
    c.add_argument("--count", type=int, default=5)
    c.add_argument("--out", required=True)
    args = p.parse_args()
    {"server": server, "client": client}[args.mode](args)


if __name__ == "__main__":
    sys.exit(main())
