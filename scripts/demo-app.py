#!/usr/bin/env python3
"""The demo's `check` app: answers every request with what it received (method, path,
body and the headers its sidecar added, x-themis-peer-id among them) as JSON.

usage: demo-app.py ADDRESS PORT
"""
import http.server
import json
import sys


class Check(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def answer(self):
        length = int(self.headers.get("content-length") or 0)
        body = self.rfile.read(length) if length else b""
        reply = json.dumps({
            "app": "check",
            "method": self.command,
            "path": self.path,
            "body": body.decode(errors="replace"),
            "peer_id": self.headers.get("x-themis-peer-id"),
            "peer_service": self.headers.get("x-themis-peer-service"),
        }).encode()
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(reply)))
        self.end_headers()
        self.wfile.write(reply)

    do_GET = do_POST = do_PUT = do_DELETE = answer

    def log_message(self, *args):
        pass


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    server = http.server.ThreadingHTTPServer((sys.argv[1], int(sys.argv[2])), Check)
    print(f"check app listening on {sys.argv[1]}:{sys.argv[2]}", flush=True)
    server.serve_forever()
