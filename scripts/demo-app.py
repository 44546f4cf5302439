#!/usr/bin/env python3
"""The demo's apps, plain HTTP with no idea of the mesh:

* `check` (the default role): answers every request with what it received (method,
  path, body and the headers its sidecar added, x-themis-peer-id among them) as JSON,
  and whether the query's n is prime.
* `handler`: answers every request by calling check itself, by plain URL
  (`--upstream http://check`, the path and query passed on), and returns check's answer
  with the peer identity headers its own sidecar put on check's response
  (`x-themis-peer-id`, `x-themis-peer-service`), besides who called it.

usage: demo-app.py [--role check|handler] [--upstream URL] ADDRESS PORT
"""
import argparse
import http.server
import json
import socket
import urllib.error
import urllib.parse
import urllib.request

PEER_ID, PEER_SERVICE = "x-themis-peer-id", "x-themis-peer-service"
XFCC = "x-forwarded-client-cert"


def is_prime(n):
    return n > 1 and all(n % d for d in range(2, int(n ** 0.5) + 1))


class App(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    role = "check"
    upstream = "http://check"

    def answer(self):
        length = int(self.headers.get("content-length") or 0)
        body = self.rfile.read(length) if length else b""
        reply = {
            "app": self.role,
            "method": self.command,
            "path": self.path,
            "body": body.decode(errors="replace"),
            # Who called, as the sidecar verified it (it drops any x-themis-* the
            # caller sent itself).
            "peer_id": self.headers.get(PEER_ID),
            "peer_service": self.headers.get(PEER_SERVICE),
            # Which instance answered (a pod's name on Kubernetes).
            "host": socket.gethostname(),
        }
        # Under Istio's TLS the sidecar names the caller's certificate here instead.
        if XFCC in self.headers:
            reply["forwarded_client_cert"] = self.headers[XFCC]
        status = 200
        if self.role == "check":
            n = urllib.parse.parse_qs(urllib.parse.urlsplit(self.path).query).get("n", [None])[0]
            if n is not None and n.lstrip("-").isdigit():
                reply["n"], reply["prime"] = int(n), is_prime(int(n))
        else:
            status, reply["check"] = self.call_check(body)
        self.reply(status, reply)

    def call_check(self, body):
        """Calls check by name, as any app would: the capture takes the connection to
        the local sidecar, which finds check, authenticates it and seals the request."""
        request = urllib.request.Request(self.upstream + self.path, data=body or None, method=self.command)
        try:
            with urllib.request.urlopen(request, timeout=10) as response:
                status, headers, text = response.status, response.headers, response.read()
        except urllib.error.HTTPError as e:
            status, headers, text = e.code, e.headers, e.read()
        except OSError as e:
            return 502, {"url": request.full_url, "error": str(e)}
        try:
            answer = json.loads(text)
        except ValueError:
            answer = text.decode(errors="replace")
        return (200 if status == 200 else 502), {
            "url": request.full_url,
            "status": status,
            # Whom handler's sidecar reached: check's id as it authenticated it.
            "peer_id": headers.get(PEER_ID),
            "peer_service": headers.get(PEER_SERVICE),
            "answer": answer,
        }

    def reply(self, status, value):
        data = json.dumps(value).encode()
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    do_GET = do_POST = do_PUT = do_DELETE = answer

    def log_message(self, *args):
        pass


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--role", choices=["check", "handler"], default="check")
    p.add_argument("--upstream", default="http://check", help="where handler calls check (default http://check)")
    p.add_argument("address")
    p.add_argument("port", type=int)
    args = p.parse_args()
    App.role, App.upstream = args.role, args.upstream.rstrip("/")
    server = http.server.ThreadingHTTPServer((args.address, args.port), App)
    print(f"{args.role} app listening on {args.address}:{args.port}", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
