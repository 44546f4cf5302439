#!/usr/bin/env python3
"""A WSGI app on the standard library's server (wsgiref), for the header-smuggling
tests: wsgiref maps every request header onto an `HTTP_*` environ key by upper-casing
it and turning `-` into `_`, as CGI, WSGI and Rack servers do, so `x_themis_peer_id`
and `x-themis-peer-id` both become `HTTP_X_THEMIS_PEER_ID`.

  wsgi_echo.py server --listen IP      prints "listening <port>"; answers every
                                       request with a JSON object of its environ's
                                       HTTP_* keys and their values
"""
import argparse
import json
import sys
from wsgiref.simple_server import WSGIRequestHandler, make_server


def app(environ, start_response):
    seen = {k: v for k, v in environ.items() if k.startswith("HTTP_")}
    body = json.dumps(seen, sort_keys=True).encode()
    start_response("200 OK", [("content-type", "application/json"), ("content-length", str(len(body)))])
    return [body]


class Quiet(WSGIRequestHandler):
    def log_message(self, format, *args):
        sys.stdout.write("request " + (format % args) + "\n")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("mode", choices=["server"])
    p.add_argument("--listen", required=True)
    args = p.parse_args()
    with make_server(args.listen, 0, app, handler_class=Quiet) as server:
        print(f"listening {server.server_port}", flush=True)
        server.serve_forever()


if __name__ == "__main__":
    main()
