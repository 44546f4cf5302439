#!/usr/bin/env python3
"""A real gRPC server and client (grpcio) for tests/protocols.rs, without generated
code: the messages are raw bytes (identity serializers), the service is
`themis.test.Echo` with four methods:

  Unary         answers "unary:<request>|<x-req-marker metadata>", trailing metadata
                x-trailer-marker: <marker>
  ServerStream  answers "stream <i>:<request>" for i in 0..4, STREAM_GAP seconds apart,
                same trailing metadata (the client records when each arrived)
  Bidi          answers "bidi:<message>" to each message, as it comes
  Fail          aborts with FAILED_PRECONDITION, details "failed <request>", trailing
                metadata x-fail-marker: <marker>

  grpc_echo.py server --listen IP --marker M      prints "listening <port>", serves
  grpc_echo.py client --target IP:PORT --authority check --marker M --out FILE
                                                   writes what came back as JSON
"""
import argparse
import json
import queue
import sys
import threading
import time
from concurrent import futures

import grpc

SERVICE = "themis.test.Echo"
TIMEOUT = 20
# Between two messages of ServerStream: the client sees them arrive this far apart
# only if every hop streams them.
STREAM_GAP = 0.2


def server(args):
    trailer = (("x-trailer-marker", args.marker),)

    def unary(request, context):
        seen = dict(context.invocation_metadata()).get("x-req-marker", "")
        peer = dict(context.invocation_metadata()).get("x-themis-peer-service", "")
        context.set_trailing_metadata(trailer)
        return b"unary:" + request + b"|" + seen.encode() + b"|" + peer.encode()

    def server_stream(request, context):
        context.set_trailing_metadata(trailer)
        for i in range(5):
            if i:
                time.sleep(STREAM_GAP)
            yield f"stream {i}:".encode() + request

    def bidi(requests, context):
        for message in requests:
            yield b"bidi:" + message

    def fail(request, context):
        context.set_trailing_metadata((("x-fail-marker", args.marker),))
        context.abort(grpc.StatusCode.FAILED_PRECONDITION, "failed " + request.decode())

    handlers = {
        "Unary": grpc.unary_unary_rpc_method_handler(unary),
        "ServerStream": grpc.unary_stream_rpc_method_handler(server_stream),
        "Bidi": grpc.stream_stream_rpc_method_handler(bidi),
        "Fail": grpc.unary_unary_rpc_method_handler(fail),
    }
    s = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
    s.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, handlers),))
    port = s.add_insecure_port(f"{args.listen}:0")
    s.start()
    print(f"listening {port}", flush=True)
    s.wait_for_termination()


def client(args):
    options = [("grpc.default_authority", args.authority)]
    out = {}
    with grpc.insecure_channel(args.target, options=options) as channel:
        grpc.channel_ready_future(channel).result(timeout=TIMEOUT)
        unary = channel.unary_unary(f"/{SERVICE}/Unary")
        response, call = unary.with_call(
            f"hello {args.marker}".encode(),
            metadata=(("x-req-marker", args.marker),),
            timeout=TIMEOUT,
        )
        out["unary"] = {
            "response": response.decode(),
            "code": call.code().name,
            "trailing": dict(call.trailing_metadata()),
        }

        stream = channel.unary_stream(f"/{SERVICE}/ServerStream")
        began = time.monotonic()
        call = stream(f"s-{args.marker}".encode(), timeout=TIMEOUT)
        responses, arrivals = [], []
        for message in call:
            arrivals.append(round(time.monotonic() - began, 3))
            responses.append(message.decode())
        out["server_stream"] = {
            "responses": responses,
            "arrivals": arrivals,
            "code": call.code().name,
            "trailing": dict(call.trailing_metadata()),
        }

        # Each message goes out only after the answer to the previous one came back:
        # both directions stream at once.
        bidi = channel.stream_stream(f"/{SERVICE}/Bidi")
        outgoing = queue.Queue()
        n = 6

        def requests():
            while True:
                item = outgoing.get()
                if item is None:
                    return
                yield item

        outgoing.put(f"b0-{args.marker}".encode())
        call = bidi(requests(), timeout=TIMEOUT)
        answers = []
        for message in call:
            answers.append(message.decode())
            if len(answers) < n:
                outgoing.put(f"b{len(answers)}-{args.marker}".encode())
            else:
                outgoing.put(None)
        out["bidi"] = {
            "responses": answers,
            "code": call.code().name,
            "trailing": dict(call.trailing_metadata() or ()),
        }

        fail = channel.unary_unary(f"/{SERVICE}/Fail")
        try:
            fail(f"f-{args.marker}".encode(), timeout=TIMEOUT)
            out["fail"] = {"code": "OK"}
        except grpc.RpcError as error:
            out["fail"] = {
                "code": error.code().name,
                "details": error.details(),
                "trailing": dict(error.trailing_metadata() or ()),
            }
    with open(args.out, "w") as f:
        json.dump(out, f)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="mode", required=True)
    s = sub.add_parser("server")
    s.add_argument("--listen", required=True)
    s.add_argument("--marker", required=True)
    c = sub.add_parser("client")
    c.add_argument("--target", required=True)
    c.add_argument("--authority", required=True)
    c.add_argument("--marker", required=True)
    c.add_argument("--out", required=True)
    args = p.parse_args()
    {"server": server, "client": client}[args.mode](args)


if __name__ == "__main__":
    sys.exit(main())
