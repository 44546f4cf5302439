//! Capture on the real kernel: cgroup v2, bpffs, real sockets, processes placed in
//! cgroups. Each test makes its own cgroups and pin directory and removes them.
//! Needs root (CAP_BPF, CAP_NET_ADMIN, CAP_SYS_ADMIN), as the agent does.
use std::{
    io::{BufRead, BufReader},
    path::PathBuf,
    process::{Child, Command, Stdio},
    time::Duration,
};

use themis_capture::{Capture, CaptureSpec};

/// A pod: `<root>/pod` with `app` and `proxy` children, and a pin directory.
struct Pod {
    root: PathBuf,
    pins: PathBuf,
    children: Vec<Child>,
}

impl Pod {
    fn new(name: &str) -> Pod {
        ensure_bpffs();
        let mount = themis_capture::cgroup2_mount().expect("cgroup v2 is mounted");
        let root = mount.join(format!("themis-test-{name}-{}", std::process::id()));
        for dir in ["pod/app", "pod/proxy", "outside"] {
            std::fs::create_dir_all(root.join(dir)).unwrap();
        }
        let pins = PathBuf::from(format!(
            "/sys/fs/bpf/themis-test-{name}-{}",
            std::process::id()
        ));
        Pod {
            root,
            pins,
            children: Vec::new(),
        }
    }

    fn cgroup(&self, which: &str) -> PathBuf {
        self.root.join(which)
    }

    /// Runs a Python snippet in `cgroup` (relative to the pod root); returns its child,
    /// after it printed its first line (returned too).
    fn run(&mut self, cgroup: &str, code: &str) -> String {
        let procs = self.cgroup(cgroup).join("cgroup.procs");
        let mut child = Command::new("sh")
            .arg("-c")
            .arg(format!(
                "echo $$ > {} && exec python3 -u -c \"$0\"",
                procs.display()
            ))
            .arg(code)
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        self.children.push(child);
        line.trim().to_string()
    }
}

impl Drop for Pod {
    fn drop(&mut self) {
        for child in &mut self.children {
            let _ = child.kill();
            let _ = child.wait();
        }
        let _ = std::fs::remove_dir_all(&self.pins);
        for dir in ["pod/app", "pod/proxy", "pod", "outside", ""] {
            let _ = std::fs::remove_dir(self.root.join(dir));
        }
    }
}

fn ensure_bpffs() {
    let mounted = Command::new("mountpoint")
        .args(["-q", "/sys/fs/bpf"])
        .status()
        .unwrap();
    if !mounted.success() {
        let status = Command::new("mount")
            .args(["-t", "bpf", "bpf", "/sys/fs/bpf"])
            .status()
            .unwrap();
        assert!(status.success(), "cannot mount bpffs");
    }
}

/// A "proxy": listens on 127.0.0.1:0, prints its port, then for each connection prints
/// the SO_ORIGINAL_DST answer (or the error) and what the client sent.
const PROXY: &str = r#"
import socket, struct, sys
s = socket.socket(); s.bind(("127.0.0.1", 0)); s.listen(16)
print(s.getsockname()[1], flush=True)
while True:
    c, peer = s.accept()
    try:
        raw = c.getsockopt(socket.SOL_IP, 80, 16)
        port, addr = struct.unpack("!2xH4s8x", raw)
        orig = "%s:%d" % (socket.inet_ntoa(addr), port)
    except OSError as e:
        orig = "error %d" % e.errno
    data = c.recv(100).decode()
    print("proxy:", orig, data, file=sys.stderr, flush=True)
    c.sendall(b"proxied " + orig.encode())
    c.close()
"#;

/// A server that is not the proxy: prints its address, answers "direct".
const DIRECT: &str = r#"
import socket
s = socket.socket(); s.bind(("127.0.0.77", 0)); s.listen(16)
print("127.0.0.77:%d" % s.getsockname()[1], flush=True)
while True:
    c, _ = s.accept(); c.recv(100); c.sendall(b"direct"); c.close()
"#;

/// A client: connects to sys.argv-like `ADDR`, sends a word, prints what came back.
fn client(addr: &str) -> String {
    format!(
        r#"
import socket
s = socket.create_connection(("{}", {}), timeout=3)
s.sendall(b"hello")
print(s.recv(100).decode() or "closed", flush=True)
"#,
        addr.rsplit_once(':').unwrap().0,
        addr.rsplit_once(':').unwrap().1
    )
}

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
