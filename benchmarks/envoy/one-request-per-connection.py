#!/usr/bin/env python3
"""Edits an Envoy YAML bootstrap in place for the handshake-rate benchmark
(`run.sh --one-request-per-connection`): the clusters whose name matches a regex take
one request per upstream connection (`max_requests_per_connection: 1` in their HTTP
protocol options), and no TLS context of the file resumes a session (upstream
`max_session_keys: 0`; downstream, tickets and session ids off), as the Themis TLS
pair never does. Line-based: the bootstraps here are written one key per line.

    one-request-per-connection.py CLUSTER_REGEX FILE
"""
import re
import sys

PROTOCOL = re.compile(r"^(\s*)(use_downstream_protocol_config|explicit_http_config):")
CLUSTER = re.compile(r"^(\s*)- name: (\S+)\s*$")
UPSTREAM_TLS = "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext"
DOWNSTREAM_TLS = "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.DownstreamTlsContext"


def edit(lines, wanted):
    out, in_clusters, cluster, limited = [], False, None, set()
    for i, line in enumerate(lines):
        if re.match(r"^\s*clusters:\s*$", line):
            in_clusters = True
        m = CLUSTER.match(line)
        if in_clusters and m and len(m.group(1)) == 2:
            cluster = m.group(2).strip('"')
        m = PROTOCOL.match(line)
        if cluster and wanted.match(cluster) and m:
            # A sibling before it: the protocol's own options may follow on more lines.
            out.append(f"{m.group(1)}common_http_protocol_options: {{max_requests_per_connection: 1}}\n")
            limited.add(cluster)
        out.append(line)
        indent = re.match(r"^(\s*)", line).group(1)
        following = "".join(lines[i + 1 : i + 6])
        if UPSTREAM_TLS in line and "max_session_keys" not in following:
            out.append(f"{indent}max_session_keys: 0\n")
        if DOWNSTREAM_TLS in line and "disable_stateless_session_resumption" not in following:
            out.append(f"{indent}disable_stateless_session_resumption: true\n")
            out.append(f"{indent}disable_stateful_session_resumption: true\n")
    return out, limited


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    wanted, path = re.compile(sys.argv[1]), sys.argv[2]
    with open(path) as f:
        lines = f.readlines()
    out, limited = edit(lines, wanted)
    with open(path, "w") as f:
        f.writelines(out)
    print(f"{path}: one request per connection on {sorted(limited) or 'no cluster'}", file=sys.stderr)


if __name__ == "__main__":
    main()
