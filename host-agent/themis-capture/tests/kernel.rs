//! Capture on the real kernel: cgroup v2, bpffs, real sockets, processes placed in
//! cgroups. Each test makes its own cgroups and pin directory and removes them.
//! Needs root (CAP_BPF, CAP_NET_ADMIN, CAP_SYS_ADMIN), as the agent does, and a
//! kernel with BTF: skipped without them; scripts/test.sh runs them.

use std::time::Duration;

use themis_capture::{Capture, CaptureSpec};
use themis_testkit::netns::Net;
use themis_testkit::pods::{client, Pod, DIRECT, PROXY};
use themis_testkit::require;

/// The gates of every test here: eBPF programs on the real kernel, attached to
/// cgroups the test creates.
fn kernel(why: &str) -> bool {
    require::root(why) && require::kernel_btf(why)
}

#[test]
fn connects_in_the_pod_reach_the_proxy_with_their_original_destination() {
    if !kernel("attaches capture to a cgroup") {
        return;
    }
    let mut pod = Pod::new("orig");
    let proxy_port: u16 = pod.run("pod/proxy", PROXY).parse().unwrap();
    let mut capture = Capture::start(&pod.pins, false).unwrap_or_else(|e| panic!("{e}"));
    let spec = CaptureSpec {
        proxy_cgroup: Some(pod.cgroup("pod/proxy")),
        outbound: format!("127.0.0.1:{proxy_port}").parse().unwrap(),
        exclude_cidrs: vec![], // the test's service addresses are on loopback
        ..CaptureSpec::new(pod.cgroup("pod"))
    };
    let status = capture.attach("app", &spec).unwrap();
    assert_eq!(status.attachments.len(), 5, "{status:?}");
    assert!(status.missing.is_empty());
    assert_eq!(status.cgroup.as_deref(), Some(pod.cgroup("pod").as_path()));

    // A real server at the "service address", so a connect that is not captured
    // shows up as such (everything stays on loopback).
    let direct = pod.run("outside", DIRECT);
    let answer = pod.run("pod/app", &client(&direct));
    assert_eq!(answer, format!("proxied {direct}"));
    let answer = pod.run("pod/app", &client("127.0.0.78:8443"));
    assert_eq!(answer, "proxied 127.0.0.78:8443");

    // Outside the pod's cgroup nothing changes.
    let answer = pod.run("outside", &client(&direct));
    assert_eq!(answer, "direct");

    let counters = capture.status().unwrap().counters;
    assert_eq!(counters["captured"], 2, "{counters:?}");
    assert_eq!(counters["original_dst_answered"], 2, "{counters:?}");
    assert!(capture.detach("app").unwrap());
    assert!(!pod.pins.join("workloads/app").exists());
    drop(capture);
    std::thread::sleep(Duration::from_millis(10));
}

#[test]
fn excluded_ports_cidrs_and_the_proxy_are_left_alone() {
    if !kernel("attaches capture to a cgroup") {
        return;
    }
    let mut pod = Pod::new("excl");
    let proxy_port: u16 = pod.run("pod/proxy", PROXY).parse().unwrap();
    let direct = pod.run("outside", DIRECT);
    let direct_port: u16 = direct.rsplit_once(':').unwrap().1.parse().unwrap();
    let mut capture = Capture::start(&pod.pins, false).unwrap_or_else(|e| panic!("{e}"));
    let spec = CaptureSpec {
        proxy_cgroup: Some(pod.cgroup("pod/proxy")),
        outbound: format!("127.0.0.1:{proxy_port}").parse().unwrap(),
        exclude_ports: vec![direct_port],
        exclude_cidrs: vec!["127.0.0.90/31".parse().unwrap()],
        ..CaptureSpec::new(pod.cgroup("pod"))
    };
    capture.attach("app", &spec).unwrap();

    // An excluded port and an excluded CIDR go where the app meant.
    assert_eq!(pod.run("pod/app", &client(&direct)), "direct");
    let answer = pod.run("pod/app", &client("127.0.0.91:9"));
    assert!(answer.starts_with("failed"), "{answer}");
    // Anything else is captured.
    assert_eq!(
        pod.run("pod/app", &client("127.0.0.92:9")),
        "proxied 127.0.0.92:9"
    );
    // The proxy's own connects never are, even inside the pod's cgroup.
    assert_eq!(
        pod.run("pod/proxy", &client("127.0.0.92:9")),
        "failed ECONNREFUSED"
    );
    let counters = capture.status().unwrap().counters;
    assert_eq!(counters["captured"], 1, "{counters:?}");
    assert_eq!(counters["excluded"], 2, "{counters:?}");
    assert_eq!(counters["proxy_exempt"], 1, "{counters:?}");
    capture.detach("app").unwrap();
}

#[test]
fn ipv6_connects_are_captured_to_the_ipv6_listener() {
    if !kernel("attaches capture to a cgroup") {
        return;
    }
    let mut pod = Pod::new("ipv6");
    let proxy6 = r#"
import socket, struct, sys
s = socket.socket(socket.AF_INET6); s.bind(("::1", 0)); s.listen(16)
print(s.getsockname()[1], flush=True)
while True:
    c, _ = s.accept()
    raw = c.getsockopt(41, 80, 28)  # SOL_IPV6, IP6T_SO_ORIGINAL_DST
    port = struct.unpack("!H", raw[2:4])[0]
    addr = socket.inet_ntop(socket.AF_INET6, raw[8:24])
    c.recv(100); c.sendall(("proxied [%s]:%d" % (addr, port)).encode()); c.close()
"#;
    let proxy_port: u16 = pod.run("pod/proxy", proxy6).parse().unwrap();
    let mut capture = Capture::start(&pod.pins, false).unwrap_or_else(|e| panic!("{e}"));
    let spec = CaptureSpec {
        proxy_cgroup: Some(pod.cgroup("pod/proxy")),
        outbound: format!("127.0.0.1:{proxy_port}").parse().unwrap(),
        outbound6: Some(format!("[::1]:{proxy_port}").parse().unwrap()),
        exclude_cidrs: vec![],
        ..CaptureSpec::new(pod.cgroup("pod"))
    };
    capture.attach("app", &spec).unwrap();
    let client6 = r#"
import socket
s = socket.create_connection(("::1", 7), timeout=2); s.sendall(b"x")
print(s.recv(100).decode(), flush=True)
"#;
    let answer = pod.run("pod/app", client6);
    let counters = capture.status().unwrap().counters;
    assert_eq!(answer, "proxied [::1]:7", "{counters:?}");
    // The IPv6 listener is guarded too: a process in no pod is refused.
    let answer = pod.run("outside", &client(&format!("::1:{proxy_port}")));
    assert_eq!(answer, "failed EPERM");
    capture.detach("app").unwrap();
}

/// Both ends in the pod: 4 MiB through a loopback connection and back, checked.
const ECHO_PAIR: &str = r#"
import hashlib, os, socket, threading
srv = socket.socket(); srv.bind(("127.0.0.1", 0)); srv.listen(1)
def echo():
    c, _ = srv.accept()
    while True:
        d = c.recv(65536)
        if not d: break
        c.sendall(d)
    c.close()
threading.Thread(target=echo, daemon=True).start()
data = os.urandom(4 << 20)
cl = socket.create_connection(srv.getsockname())
got = bytearray()
def reader():
    while len(got) < len(data):
        d = cl.recv(65536)
        if not d: break
        got.extend(d)
t = threading.Thread(target=reader); t.start()
for i in range(0, len(data), 65536): cl.sendall(data[i:i + 65536])
t.join(20)
print("intact" if hashlib.sha256(got).digest() == hashlib.sha256(data).digest() else "corrupt %d" % len(got), flush=True)
"#;

#[test]
fn the_fast_path_carries_local_traffic_intact_and_only_when_on() {
    if !kernel("attaches capture to a cgroup") {
        return;
    }
    for fast_path in [true, false] {
        let mut pod = Pod::new(if fast_path { "fast-on" } else { "fast-off" });
        let mut capture = Capture::start(&pod.pins, fast_path).unwrap_or_else(|e| panic!("{e}"));
        capture
            .attach("app", &CaptureSpec::new(pod.cgroup("pod")))
            .unwrap();
        assert_eq!(
            pod.run("pod/app", ECHO_PAIR),
            "intact",
            "fast path {fast_path}"
        );
        let status = capture.status().unwrap();
        assert_eq!(status.fast_path, fast_path);
        let sockets = status.counters["fast_path_sockets"];
        if fast_path {
            assert_eq!(sockets, 2, "both ends join the sockhash");
        } else {
            assert_eq!(sockets, 0);
        }
        capture.detach("app").unwrap();
    }
}

#[test]
fn a_missing_bpffs_or_cgroup_is_named() {
    if !kernel("creates a cgroup and a bpffs pin directory") {
        return;
    }
    let dir = tempfile_dir();
    let err = Capture::start(&dir.join("themis"), false)
        .err()
        .unwrap()
        .to_string();
    assert!(
        err.contains("is not on a bpffs") && err.contains("mount -t bpf"),
        "{err}"
    );

    let pod = Pod::new("bad-cgroup");
    let mut capture = Capture::start(&pod.pins, false).unwrap_or_else(|e| panic!("{e}"));
    let err = capture
        .attach("app", &CaptureSpec::new(&dir))
        .unwrap_err()
        .to_string();
    assert!(err.contains("is not a cgroup v2 directory"), "{err}");
    let err = capture
        .attach("../x", &CaptureSpec::new(pod.cgroup("pod")))
        .unwrap_err()
        .to_string();
    assert!(err.contains("not a workload name"), "{err}");
    assert!(!capture.detach("app").unwrap(), "nothing attached");
    std::fs::remove_dir_all(&dir).unwrap();
}

fn tempfile_dir() -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("themis-capture-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

// Inbound protection ("no bypass"): a peer in another network namespace sends to a
// workload whose cgroup is protected (inbound ports 8080 and 8081 below, or 8080
// alone), and the same packets go to an unprotected cgroup or a port that is not an
// app port as the control. Each case passed the ingress program before it walked
// IPv6 extension headers and had a rule for non-TCP traffic.

/// A dual-stack TCP server on `port` that answers "app".
fn tcp_app(port: u16) -> String {
    format!(
        r#"
import socket
s = socket.socket(socket.AF_INET6); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
s.bind(("::", {port})); s.listen(16)
print("listening", flush=True)
while True:
    c, _ = s.accept(); c.recv(100); c.sendall(b"app"); c.close()
"#
    )
}

/// An IPv6 TCP client that puts an extension header (`hop`: hop-by-hop, `dst`:
/// destination options, each with one PadN option; `none`) on its packets through
/// the socket's sticky options, so the kernel sends a real handshake with it.
fn tcp6_client(ext: &str, host: &str, port: u16) -> String {
    format!(
        r#"
import errno, socket
option = {{"none": None, "hop": socket.IPV6_HOPOPTS, "dst": socket.IPV6_DSTOPTS}}["{ext}"]
try:
    s = socket.socket(socket.AF_INET6)
    if option is not None:
        # next header (the kernel fills it), length 0 (8 bytes), PadN of 4 zero bytes
        s.setsockopt(socket.IPPROTO_IPV6, option, bytes([0, 0, 1, 4, 0, 0, 0, 0]))
    s.settimeout(2); s.connect(("{host}", {port})); s.sendall(b"hello")
    print(s.recv(100).decode() or "closed", flush=True)
except OSError as e:
    print("failed", errno.errorcode.get(e.errno, "timeout"), flush=True)
"#
    )
}

/// Dual-stack UDP sockets on `ports` that echo each datagram back.
fn udp_echo(ports: &[u16]) -> String {
    format!(
        r#"
import select, socket
socks = []
for port in {ports:?}:
    s = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)
    s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
    s.bind(("::", port)); socks.append(s)
print("listening", flush=True)
while True:
    for s in select.select(socks, [], [])[0]:
        data, peer = s.recvfrom(2000); s.sendto(b"echo " + data, peer)
"#
    )
}

/// Sends one UDP datagram to `host:port` and prints the echo, or `failed timeout`.
fn udp_client(host: &str, port: u16) -> String {
    format!(
        r#"
import socket
family = socket.AF_INET6 if ":" in "{host}" else socket.AF_INET
s = socket.socket(family, socket.SOCK_DGRAM); s.settimeout(1)
s.sendto(b"hi", ("{host}", {port}))
try:
    print(s.recv(100).decode(), flush=True)
except socket.timeout:
    print("failed timeout", flush=True)
"#
    )
}

fn protect(pod: &Pod, capture: &mut Capture, ports: &[u16]) {
    let spec = CaptureSpec {
        inbound_ports: ports.to_vec(),
        ..CaptureSpec::new(pod.cgroup("pod"))
    };
    capture.attach("app", &spec).unwrap();
}

#[test]
fn tcp_behind_ipv6_extension_headers_does_not_reach_an_app_port() {
    if !kernel("creates network namespaces and attaches capture") {
        return;
    }
    let net = Net::create("ext");
    let mut pod = Pod::new("ext");
    assert_eq!(
        pod.run_in(Some(&net.node), "pod/app", &tcp_app(8080)),
        "listening"
    );
    // The control: the same server in a cgroup that is not registered.
    assert_eq!(
        pod.run_in(Some(&net.node), "outside", &tcp_app(8081)),
        "listening"
    );
    // Before capture the network reaches the app, extension headers or not.
    for ext in ["none", "hop", "dst"] {
        let answer = pod.run_in(
            Some(&net.peer),
            "outside",
            &tcp6_client(ext, Net::NODE6, 8080),
        );
        assert_eq!(answer, "app", "{ext} before capture");
    }

    let mut capture = Capture::start(&pod.pins, false).unwrap_or_else(|e| panic!("{e}"));
    protect(&pod, &mut capture, &[8080, 8081]);
    for ext in ["none", "hop", "dst"] {
        // From the network: dropped, the SYN never reaches the app.
        let answer = pod.run_in(
            Some(&net.peer),
            "outside",
            &tcp6_client(ext, Net::NODE6, 8080),
        );
        assert!(answer.starts_with("failed"), "{ext}: {answer}");
        // The same packets to the unprotected cgroup pass.
        let answer = pod.run_in(
            Some(&net.peer),
            "outside",
            &tcp6_client(ext, Net::NODE6, 8081),
        );
        assert_eq!(answer, "app", "{ext} to an unprotected cgroup");
        // From the node's loopback, where the local proxy forwards from: accepted.
        let answer = pod.run_in(Some(&net.node), "outside", &tcp6_client(ext, "::1", 8080));
        assert_eq!(answer, "app", "{ext} from loopback");
    }
    let counters = capture.status().unwrap().counters;
    // Three connects, each SYN possibly retransmitted.
    assert!(counters["inbound_dropped"] >= 3, "{counters:?}");
    assert_eq!(counters["inbound_malformed_dropped"], 0, "{counters:?}");
    assert!(capture.detach("app").unwrap());
}

#[test]
fn with_every_tcp_port_protected_only_the_proxy_and_exempted_ports_take_connections() {
    if !kernel("creates network namespaces and attaches capture") {
        return;
    }
    let net = Net::create("all");
    let mut pod = Pod::new("all");
    // An app port no one declared, an exempted one, and the proxy's inbound listener
    // (its uid, in the pod's cgroup like a sidecar container's).
    for port in [9090, 9091] {
        assert_eq!(
            pod.run_in(Some(&net.node), "pod/app", &tcp_app(port)),
            "listening"
        );
    }
    // (Imported before the uid drops: the interpreter's modules are root's here.)
    let as_proxy = format!("import os, socket; os.setuid(1337)\n{}", tcp_app(15006));
    assert_eq!(
        pod.run_in(Some(&net.node), "pod/proxy", &as_proxy),
        "listening"
    );
    // A server outside the pod, which the app calls: its replies must come back.
    assert_eq!(
        pod.run_in(Some(&net.peer), "outside", &tcp_app(7070)),
        "listening"
    );
    let from_peer = |pod: &mut Pod, port: u16| {
        pod.run_in(
            Some(&net.peer),
            "outside",
            &tcp6_client("none", Net::NODE6, port),
        )
    };
    for port in [9090, 9091, 15006] {
        assert_eq!(from_peer(&mut pod, port), "app", "{port} before capture");
    }

    let mut capture = Capture::start(&pod.pins, false).unwrap_or_else(|e| panic!("{e}"));
    let spec = CaptureSpec {
        proxy_uid: Some(1337),
        inbound_all_tcp_except: Some(vec![9091]),
        ..CaptureSpec::new(pod.cgroup("pod"))
    };
    capture.attach("app", &spec).unwrap();
    let answer = from_peer(&mut pod, 9090);
    assert!(
        answer.starts_with("failed"),
        "an undeclared port took a connection: {answer}"
    );
    assert_eq!(from_peer(&mut pod, 9091), "app", "the exempted port");
    assert_eq!(from_peer(&mut pod, 15006), "app", "the proxy's listener");
    // From loopback, where the proxy forwards from: the undeclared port answers.
    let local = pod.run_in(
        Some(&net.node),
        "outside",
        &tcp6_client("none", "::1", 9090),
    );
    assert_eq!(local, "app");
    // The app's own connection out: its SYN-ACK and data come back in.
    let out = pod.run_in(
        Some(&net.node),
        "pod/app",
        &tcp6_client("none", Net::PEER6, 7070),
    );
    assert_eq!(out, "app", "the reply to the app's own connection");
    let counters = capture.status().unwrap().counters;
    assert!(counters["inbound_dropped"] >= 1, "{counters:?}");
    assert!(capture.detach("app").unwrap());
    assert_eq!(from_peer(&mut pod, 9090), "app", "detached: open again");
}

#[test]
fn udp_to_an_app_port_is_dropped_over_ipv4_and_ipv6() {
    if !kernel("creates network namespaces and attaches capture") {
        return;
    }
    let net = Net::create("udp");
    let mut pod = Pod::new("udp");
    // 8080 is the app port; 8081 is not (the control: replies to the workload's own
    // UDP clients, DNS answers, arrive on such ports).
    assert_eq!(
        pod.run_in(Some(&net.node), "pod/app", &udp_echo(&[8080, 8081])),
        "listening"
    );
    let mut capture = Capture::start(&pod.pins, false).unwrap_or_else(|e| panic!("{e}"));
    protect(&pod, &mut capture, &[8080]);

    for host in [Net::NODE4, Net::NODE6] {
        let answer = pod.run_in(Some(&net.peer), "outside", &udp_client(host, 8080));
        assert_eq!(answer, "failed timeout", "{host}:8080 from the network");
        let answer = pod.run_in(Some(&net.peer), "outside", &udp_client(host, 8081));
        assert_eq!(answer, "echo hi", "{host}:8081 is not an app port");
    }
    for host in ["127.0.0.1", "::1"] {
        let answer = pod.run_in(Some(&net.node), "outside", &udp_client(host, 8080));
        assert_eq!(answer, "echo hi", "{host}:8080 from loopback");
    }
    let counters = capture.status().unwrap().counters;
    assert_eq!(counters["inbound_udp_dropped"], 2, "{counters:?}");
    assert!(capture.detach("app").unwrap());
}

/// Raw ICMP and ICMPv6 sockets: prints "ready", then for 3 seconds (or until all
/// four are in) collects the types of marked messages, and prints them ("4:8 6:128").
const ICMP_WATCH: &str = r#"
import select, socket, time
r4 = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP)
r6 = socket.socket(socket.AF_INET6, socket.SOCK_RAW, socket.IPPROTO_ICMPV6)
print("ready", flush=True)
seen = set()
deadline = time.monotonic() + 3
while len(seen) < 4 and time.monotonic() < deadline:
    for s in select.select([r4, r6], [], [], max(0, deadline - time.monotonic()))[0]:
        data = s.recv(2000)
        if b"themis-mark" in data:
            # IPv4 raw sockets get the IP header, IPv6 ones the ICMPv6 header.
            seen.add("4:%d" % data[(data[0] & 15) * 4] if s is r4 else "6:%d" % data[0])
print(" ".join(sorted(seen)) or "none", flush=True)
"#;

/// Sends marked ICMP echo requests and destination-unreachable errors, IPv4 and IPv6.
fn icmp_send(host4: &str, host6: &str) -> String {
    format!(
        r#"
import socket, struct
def checksum(b):
    b += b"\0" * (len(b) % 2)
    s = sum(struct.unpack("!%dH" % (len(b) // 2), b))
    s = (s >> 16) + (s & 0xffff)
    return ~(s + (s >> 16)) & 0xffff
s4 = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP)
s6 = socket.socket(socket.AF_INET6, socket.SOCK_RAW, socket.IPPROTO_ICMPV6)
for kind in (8, 3):
    body = struct.pack("!HH", 0x7e7e, 1) + b"themis-mark"
    message = struct.pack("!BBH", kind, 0, 0) + body
    s4.sendto(struct.pack("!BBH", kind, 0, checksum(message)) + body, ("{host4}", 0))
for kind in (128, 1):
    # the kernel computes ICMPv6 checksums
    s6.sendto(struct.pack("!BBHHH", kind, 0, 0, 0x7e7e, 1) + b"themis-mark", ("{host6}", 0))
print("sent", flush=True)
"#
    )
}

#[test]
fn icmp_echo_does_not_reach_a_protected_workload_but_errors_do() {
    if !kernel("creates network namespaces and attaches capture") {
        return;
    }
    let net = Net::create("icmp");
    let mut pod = Pod::new("icmp");
    let mut capture = Capture::start(&pod.pins, false).unwrap_or_else(|e| panic!("{e}"));
    protect(&pod, &mut capture, &[8080]);
    let mut protected = pod.start_in(&net.node, "pod/app", ICMP_WATCH);
    let mut unprotected = pod.start_in(&net.node, "outside", ICMP_WATCH);
    assert_eq!(protected.next_line(), "ready");
    assert_eq!(unprotected.next_line(), "ready");
    let sent = pod.run_in(
        Some(&net.peer),
        "outside",
        &icmp_send(Net::NODE4, Net::NODE6),
    );
    assert_eq!(sent, "sent");
    // Errors (destination unreachable) reach the workload, echo requests do not; the
    // unprotected cgroup gets both.
    assert_eq!(protected.next_line(), "4:3 6:1");
    assert_eq!(unprotected.next_line(), "4:3 4:8 6:1 6:128");
    let counters = capture.status().unwrap().counters;
    assert!(counters["inbound_icmp_dropped"] >= 2, "{counters:?}");
    assert!(capture.detach("app").unwrap());
}

/// Sends one UDP datagram over IPv6 with a hand-made header chain (`headers`: "dst"
/// for a destination options header, "frag" for an atomic fragment header) from a
/// raw socket, and prints the echo that comes back to its source port, or
/// `failed timeout`.
fn udp6_chain(headers: &[&str], src: &str, dst: &str, port: u16) -> String {
    format!(
        r#"
import socket, struct
def checksum(b):
    b += b"\0" * (len(b) % 2)
    s = sum(struct.unpack("!%dH" % (len(b) // 2), b))
    s = (s >> 16) + (s & 0xffff)
    return ~(s + (s >> 16)) & 0xffff
src = socket.inet_pton(socket.AF_INET6, "{src}")
dst = socket.inet_pton(socket.AF_INET6, "{dst}")
rx = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM); rx.bind(("{src}", 0)); rx.settimeout(1)
sport = rx.getsockname()[1]
payload = b"hi"
udp = struct.pack("!HHHH", sport, {port}, 8 + len(payload), 0) + payload
pseudo = src + dst + struct.pack("!IxxxB", len(udp), 17)
udp = udp[:6] + struct.pack("!H", checksum(pseudo + udp) or 0xffff) + udp[8:]
chain, nexthdr = b"", 17
for kind in reversed({headers:?}):
    if kind == "dst":
        chain = struct.pack("!BB", nexthdr, 0) + bytes([1, 4, 0, 0, 0, 0]) + chain; nexthdr = 60
    else:
        chain = struct.pack("!BBHI", nexthdr, 0, 0, 0x7e7e) + chain; nexthdr = 44
body = chain + udp
header = struct.pack("!IHBB", 6 << 28, len(body), nexthdr, 64) + src + dst
raw = socket.socket(socket.AF_INET6, socket.SOCK_RAW, socket.IPPROTO_RAW)
raw.sendto(header + body, ("{dst}", 0))
try:
    print(rx.recv(100).decode(), flush=True)
except socket.timeout:
    print("failed timeout", flush=True)
"#
    )
}

#[test]
fn long_extension_header_chains_are_dropped_and_atomic_fragments_judged() {
    if !kernel("creates network namespaces and attaches capture") {
        return;
    }
    let net = Net::create("chain");
    let mut pod = Pod::new("chain");
    assert_eq!(
        pod.run_in(Some(&net.node), "pod/app", &udp_echo(&[8080, 8081])),
        "listening"
    );
    let send = |pod: &mut Pod, headers: &[&str], port| {
        pod.run_in(
            Some(&net.peer),
            "outside",
            &udp6_chain(headers, Net::PEER6, Net::NODE6, port),
        )
    };
    let eight = ["dst"; 8];
    let nine = ["dst"; 9];
    // Before capture the kernel takes all of them.
    for headers in [&eight[..], &nine[..], &["frag"][..]] {
        assert_eq!(send(&mut pod, headers, 8081), "echo hi", "{headers:?}");
    }

    let mut capture = Capture::start(&pod.pins, false).unwrap_or_else(|e| panic!("{e}"));
    protect(&pod, &mut capture, &[8080]);
    // Eight extension headers are walked: UDP to a port that is not an app port passes.
    assert_eq!(send(&mut pod, &eight, 8081), "echo hi");
    // Nine are more than the program follows: dropped, whatever the port.
    assert_eq!(send(&mut pod, &nine, 8081), "failed timeout");
    // An atomic fragment is a whole packet: judged by the UDP header behind it.
    assert_eq!(send(&mut pod, &["frag", "dst"], 8081), "echo hi");
    assert_eq!(send(&mut pod, &["frag", "dst"], 8080), "failed timeout");
    let counters = capture.status().unwrap().counters;
    assert_eq!(counters["inbound_malformed_dropped"], 1, "{counters:?}");
    assert_eq!(counters["inbound_udp_dropped"], 1, "{counters:?}");
    assert!(capture.detach("app").unwrap());
}

#[test]
fn a_stats_map_pinned_by_an_older_agent_is_replaced() {
    if !(kernel("pins maps in bpffs") && require::tool("bpftool", "pins an old map")) {
        return;
    }
    let pod = Pod::new("old-stats");
    std::fs::create_dir_all(&pod.pins).unwrap();
    // What an agent from before the ingress rule's counters left pinned: 7 counters.
    let stats = pod.pins.join("STATS");
    let out = std::process::Command::new("bpftool")
        .args(["map", "create"])
        .arg(&stats)
        .args([
            "type",
            "percpu_array",
            "key",
            "4",
            "value",
            "8",
            "entries",
            "7",
        ])
        .args(["name", "STATS"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut capture = Capture::start(&pod.pins, false).unwrap_or_else(|e| panic!("{e}"));
    let counters = capture.status().unwrap().counters;
    assert_eq!(counters["inbound_malformed_dropped"], 0, "{counters:?}");
    assert_eq!(counters["captured"], 0, "{counters:?}");
}

// A pod's outbound listener signs for its workload, so it must take connections from
// that pod alone. Pods on one node share its network namespace (scripts/demo.sh), and
// loopback is never captured: without the guard, another pod's process or a plain
// host process reaches 127.0.0.1:<listener> and calls the mesh as the workload.

/// Runs `code` as a plain process of this test (in no pod's cgroup); its first line.
fn run_here(code: &str) -> String {
    let out = std::process::Command::new("python3")
        .args(["-c", code])
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .next()
        .unwrap_or_default()
        .to_string()
}

#[test]
fn only_its_own_pod_connects_to_a_workloads_outbound_listener() {
    if !kernel("attaches capture to cgroups and to the top cgroup") {
        return;
    }
    let mut pod_a = Pod::new("guard-a");
    let mut pod_b = Pod::new("guard-b");
    let port_a: u16 = pod_a.run("pod/proxy", PROXY).parse().unwrap();
    let port_b: u16 = pod_b.run("pod/proxy", PROXY).parse().unwrap();
    let listener_a = format!("127.0.0.1:{port_a}");
    let mut capture = Capture::start(&pod_a.pins, false).unwrap_or_else(|e| panic!("{e}"));
    for (workload, pod, port) in [("a", &pod_a, port_a), ("b", &pod_b, port_b)] {
        // The default exclusions: loopback destinations are not captured.
        let spec = CaptureSpec {
            proxy_cgroup: Some(pod.cgroup("pod/proxy")),
            outbound: format!("127.0.0.1:{port}").parse().unwrap(),
            ..CaptureSpec::new(pod.cgroup("pod"))
        };
        capture.attach(workload, &spec).unwrap();
    }

    // The attack: pod b's app, a process outside any pod, this test's own process.
    let from_b = pod_b.run("pod/app", &client(&listener_a));
    assert_eq!(from_b, "failed EPERM", "pod b's app reached a's listener");
    let from_outside = pod_a.run("outside", &client(&listener_a));
    assert_eq!(from_outside, "failed EPERM", "a process in no pod");
    assert_eq!(
        run_here(&client(&listener_a)),
        "failed EPERM",
        "a host process"
    );
    // The same listener as an IPv4-mapped address, from an IPv6 socket (connect6).
    let mapped = format!("::ffff:{listener_a}");
    assert_eq!(run_here(&client(&mapped)), "failed EPERM", "{mapped}");
    // The unspecified address, which the kernel sends to this host: 0.0.0.0 reaches
    // the loopback listener, and so does [::] from a socket bound to a mapped loopback
    // address. Both are judged as connects to the loopback listener.
    let unspecified = format!("0.0.0.0:{port_a}");
    assert_eq!(
        pod_a.run("outside", &client(&unspecified)),
        "failed EPERM",
        "{unspecified}"
    );
    let via_any6 = format!(
        r#"
import errno, socket
try:
    s = socket.socket(socket.AF_INET6); s.settimeout(2)
    s.bind(("::ffff:127.0.0.1", 0)); s.connect(("::", {port_a}))
    s.sendall(b"hello"); print(s.recv(100).decode() or "closed", flush=True)
except OSError as e:
    print("failed", errno.errorcode.get(e.errno, "timeout"), flush=True)
"#
    );
    assert_eq!(
        pod_a.run("outside", &via_any6),
        "failed EPERM",
        "[::] from a socket bound to ::ffff:127.0.0.1"
    );

    // The controls: pod a's app reaches its listener, directly and captured (judged
    // after capture rewrote the connect), and pod b's captured connect its own.
    let direct = pod_a.run("pod/app", &client(&listener_a));
    assert!(direct.starts_with("proxied"), "{direct}");
    let captured = pod_a.run("pod/app", &client("10.96.0.10:80"));
    assert_eq!(captured, "proxied 10.96.0.10:80");
    let captured = pod_b.run("pod/app", &client("10.96.0.11:80"));
    assert_eq!(captured, "proxied 10.96.0.11:80");
    let counters = capture.status().unwrap().counters;
    assert_eq!(
        counters.get("outbound_listener_refused"),
        Some(&6),
        "{counters:?}"
    );

    // Deregistered, the listener is a plain socket again; the guard stays while any
    // workload is captured and goes with the last one.
    let guard = pod_a.pins.join("top");
    assert!(capture.detach("a").unwrap());
    let from_outside = pod_a.run("outside", &client(&listener_a));
    assert!(from_outside.starts_with("proxied"), "{from_outside}");
    assert!(guard.join("listener_guard4").exists());
    assert!(capture.detach("b").unwrap());
    assert!(!guard.exists(), "the guard's links are unpinned");
}

#[test]
fn a_listener_is_guarded_in_the_network_namespace_its_spec_names() {
    if !kernel("creates network namespaces and attaches capture") {
        return;
    }
    // The pod shares the node's namespace; the agent (this test) runs elsewhere.
    let net = Net::create("guard-ns");
    let mut pod = Pod::new("guard-ns");
    let port: u16 = pod
        .run_in(Some(&net.node), "pod/proxy", PROXY)
        .parse()
        .unwrap();
    let listener = format!("127.0.0.1:{port}");
    let mut capture = Capture::start(&pod.pins, false).unwrap_or_else(|e| panic!("{e}"));
    let spec = CaptureSpec {
        proxy_cgroup: Some(pod.cgroup("pod/proxy")),
        outbound: listener.parse().unwrap(),
        netns: Some(format!("/run/netns/{}", net.node).into()),
        ..CaptureSpec::new(pod.cgroup("pod"))
    };
    capture.attach("app", &spec).unwrap();

    let answer = pod.run_in(Some(&net.node), "outside", &client(&listener));
    assert_eq!(
        answer, "failed EPERM",
        "a process in no pod, in the pod's namespace"
    );
    let answer = pod.run_in(Some(&net.node), "pod/app", &client(&listener));
    assert!(answer.starts_with("proxied"), "{answer}");
    // The same address in the agent's namespace is some other socket, or none.
    assert_ne!(run_here(&client(&listener)), "failed EPERM");
    // A namespace that cannot be entered is named, and the registration stays.
    let err = capture
        .attach(
            "app",
            &CaptureSpec {
                netns: Some("/nonexistent/netns".into()),
                ..spec.clone()
            },
        )
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("network namespace /nonexistent/netns"),
        "{err}"
    );
    let answer = pod.run_in(Some(&net.node), "outside", &client(&listener));
    assert_eq!(answer, "failed EPERM");
    assert!(capture.detach("app").unwrap());
}

/// UDP sockets on `ports` (dual-stack): prints "ready", then for 3 seconds (or until
/// every port has one) collects the ports marked datagrams arrived on, and prints them.
fn udp_watch(ports: &[u16]) -> String {
    format!(
        r#"
import select, socket, time
socks = {{}}
for port in {ports:?}:
    s = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)
    s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
    s.bind(("::", port)); socks[s] = port
print("ready", flush=True)
seen = set()
deadline = time.monotonic() + 3
while len(seen) < len(socks) and time.monotonic() < deadline:
    for s in select.select(list(socks), [], [], max(0, deadline - time.monotonic()))[0]:
        if b"themis-mark" in s.recv(2000):
            seen.add(socks[s])
print(" ".join(str(p) for p in sorted(seen)) or "none", flush=True)
"#
    )
}

/// Sends a marked UDP datagram with the forged source 127.0.0.1 to each of `ports`
/// at `dst`, as an Ethernet frame to `mac` on the peer's end of the veth (the peer's
/// kernel would not route a loopback source out of it).
fn udp_from_forged_loopback(mac: &str, dst: &str, ports: &[u16]) -> String {
    format!(
        r#"
import socket, struct
def checksum(b):
    s = sum(struct.unpack("!%dH" % (len(b) // 2), b))
    s = (s >> 16) + (s & 0xffff)
    return ~(s + (s >> 16)) & 0xffff
link = socket.socket(socket.AF_PACKET, socket.SOCK_RAW); link.bind(("{dev}", 0))
ethernet = bytes.fromhex("{mac}".replace(":", "")) + link.getsockname()[4] + b"\x08\x00"
src, dst = socket.inet_aton("127.0.0.1"), socket.inet_aton("{dst}")
for port in {ports:?}:
    payload = b"themis-mark"
    udp = struct.pack("!HHHH", 40000, port, 8 + len(payload), 0) + payload  # no checksum
    ip = struct.pack("!BBHHHBBH4s4s", 0x45, 0, 20 + len(udp), 0, 0, 64, 17, 0, src, dst)
    ip = ip[:10] + struct.pack("!H", checksum(ip)) + ip[12:]
    link.send(ethernet + ip + udp)
print("sent", flush=True)
"#,
        dev = Net::PEER_DEV,
    )
}

#[test]
fn udp_with_a_forged_loopback_source_does_not_reach_an_app_port() {
    if !kernel("creates network namespaces and attaches capture") {
        return;
    }
    let net = Net::create("spoof");
    let mut pod = Pod::new("spoof");
    // What lets forged loopback sources in from the veth: route_localnet (as some
    // kube-proxy set-ups have it), and accept_local for 127.0.0.1 itself (an address
    // of the namespace; other 127/8 sources need route_localnet alone).
    for dev in ["all", Net::NODE_DEV] {
        for setting in ["route_localnet=1", "accept_local=1", "rp_filter=0"] {
            let status = std::process::Command::new("ip")
                .args(["netns", "exec", &net.node, "sysctl", "-qw"])
                .arg(format!("net.ipv4.conf.{dev}.{setting}"))
                .status()
                .unwrap();
            assert!(status.success(), "sysctl {dev}.{setting}");
        }
    }
    let mac = std::process::Command::new("ip")
        .args(["netns", "exec", &net.node, "cat"])
        .arg(format!("/sys/class/net/{}/address", Net::NODE_DEV))
        .output()
        .unwrap();
    let mac = String::from_utf8(mac.stdout).unwrap().trim().to_string();
    // 8080 is the app port of a protected workload; 8082 a socket in no workload.
    let forge = |pod: &mut Pod| -> (String, String) {
        let mut protected = pod.start_in(&net.node, "pod/app", &udp_watch(&[8080]));
        let mut unprotected = pod.start_in(&net.node, "outside", &udp_watch(&[8082]));
        assert_eq!(protected.next_line(), "ready");
        assert_eq!(unprotected.next_line(), "ready");
        let sent = pod.run_in(
            Some(&net.peer),
            "outside",
            &udp_from_forged_loopback(&mac, Net::NODE4, &[8080, 8082]),
        );
        assert_eq!(sent, "sent");
        (protected.next_line(), unprotected.next_line())
    };
    // Before capture the kernel delivers them: the forgery works in this namespace.
    assert_eq!(forge(&mut pod), ("8080".into(), "8082".into()));

    let mut capture = Capture::start(&pod.pins, false).unwrap_or_else(|e| panic!("{e}"));
    protect(&pod, &mut capture, &[8080]);
    let (protected, unprotected) = forge(&mut pod);
    assert_eq!(
        protected, "none",
        "a forged loopback source reached the app port"
    );
    assert_eq!(
        unprotected, "8082",
        "the same datagram to a socket in no workload"
    );
    // Real loopback traffic, as from the local proxy, still reaches the app.
    assert_eq!(
        pod.run_in(Some(&net.node), "pod/app", &udp_echo(&[8080])),
        "listening"
    );
    let answer = pod.run_in(Some(&net.node), "outside", &udp_client("127.0.0.1", 8080));
    assert_eq!(answer, "echo hi", "from loopback");
    let counters = capture.status().unwrap().counters;
    assert_eq!(
        counters.get("inbound_spoofed_loopback_dropped"),
        Some(&1),
        "{counters:?}"
    );
    assert!(capture.detach("app").unwrap());
}
