//! Capture on the real kernel: cgroup v2, bpffs, real sockets, processes placed in
//! cgroups. Each test makes its own cgroups and pin directory and removes them.
//! Needs root (CAP_BPF, CAP_NET_ADMIN, CAP_SYS_ADMIN), as the agent does.
mod support;

use std::time::Duration;

use support::{client, Pod, DIRECT, PROXY};
use themis_capture::{Capture, CaptureSpec};

#[test]
fn connects_in_the_pod_reach_the_proxy_with_their_original_destination() {
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
