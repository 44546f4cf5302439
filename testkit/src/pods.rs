//! Pods for capture tests on the real kernel: a cgroup v2 tree `<root>/pod/{app,proxy}`
//! plus `<root>/outside` ([`crate::cgroup::Tree`]), a bpffs pin directory, and small
//! Python programs placed in those cgroups (optionally in a network namespace of
//! [`crate::netns`]). Everything is removed on drop. Needs root.

use std::{
    io::{BufRead, BufReader},
    path::PathBuf,
    process::{Child, ChildStdout, Command, Stdio},
};

use crate::cgroup::{ensure_bpffs, Tree};

pub struct Pod {
    pub root: PathBuf,
    pub pins: PathBuf,
    children: Vec<Child>,
    /// Removed after the children are stopped (fields drop after `drop`).
    _tree: Tree,
}

impl Pod {
    pub fn new(name: &str) -> Pod {
        ensure_bpffs();
        let tree = Tree::new(name, &["pod/app", "pod/proxy", "outside"]);
        let pins = PathBuf::from(format!(
            "/sys/fs/bpf/themis-test-{name}-{}",
            std::process::id()
        ));
        Pod {
            root: tree.root.clone(),
            pins,
            children: Vec::new(),
            _tree: tree,
        }
    }

    pub fn cgroup(&self, which: &str) -> PathBuf {
        self.root.join(which)
    }

    /// Runs a Python program in `cgroup` (relative to the pod root); returns the first
    /// line it prints. Later lines should go to stderr.
    pub fn run(&mut self, cgroup: &str, code: &str) -> String {
        self.run_in(None, cgroup, code)
    }

    /// The same, inside network namespace `netns`.
    pub fn run_in(&mut self, netns: Option<&str>, cgroup: &str, code: &str) -> String {
        let procs = self.cgroup(cgroup).join("cgroup.procs");
        // Into the cgroup first: `ip netns exec` remounts /sys, hiding the cgroup tree.
        let netns = netns.map_or(String::new(), |ns| format!("ip netns exec {ns} "));
        let mut child = Command::new("sh")
            .arg("-c")
            .arg(format!(
                "echo $$ > {} && exec {netns}python3 -u -c \"$0\"",
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

    /// Starts a Python program in `cgroup` inside network namespace `netns` and gives
    /// its output line by line (it is stopped with the pod).
    pub fn start_in(&mut self, netns: &str, cgroup: &str, code: &str) -> Lines {
        let procs = self.cgroup(cgroup).join("cgroup.procs");
        let mut child = Command::new("sh")
            .arg("-c")
            .arg(format!(
                "echo $$ > {} && exec ip netns exec {netns} python3 -u -c \"$0\"",
                procs.display()
            ))
            .arg(code)
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let lines = Lines(BufReader::new(child.stdout.take().unwrap()));
        self.children.push(child);
        lines
    }

    /// Starts a long-running process (e.g. Envoy) in `cgroup`.
    pub fn spawn(&mut self, cgroup: &str, program: &str, args: &[&str], log: &std::path::Path) {
        let procs = self.cgroup(cgroup).join("cgroup.procs");
        let log = std::fs::File::create(log).unwrap();
        let child = Command::new("sh")
            .arg("-c")
            .arg(format!(
                "echo $$ > {} && exec \"$0\" \"$@\"",
                procs.display()
            ))
            .arg(program)
            .args(args)
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap();
        self.children.push(child);
    }
}

impl Drop for Pod {
    fn drop(&mut self) {
        for child in &mut self.children {
            let _ = child.kill();
            let _ = child.wait();
        }
        let _ = std::fs::remove_dir_all(&self.pins);
    }
}

/// A started program's output.
pub struct Lines(BufReader<ChildStdout>);

impl Lines {
    /// The next line (empty once the program has exited).
    pub fn next_line(&mut self) -> String {
        let mut line = String::new();
        self.0.read_line(&mut line).unwrap();
        line.trim().to_string()
    }
}

/// A "proxy": listens on 127.0.0.1:0, prints its port, then for each connection asks
/// SO_ORIGINAL_DST and answers `proxied <original destination>`.
pub const PROXY: &str = r#"
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
pub const DIRECT: &str = r#"
import socket
s = socket.socket(); s.bind(("127.0.0.77", 0)); s.listen(16)
print("127.0.0.77:%d" % s.getsockname()[1], flush=True)
while True:
    c, _ = s.accept(); c.recv(100); c.sendall(b"direct"); c.close()
"#;

/// A client: connects to `addr` (ip:port), sends a word, prints the answer, or
/// `failed <errno name>`.
pub fn client(addr: &str) -> String {
    let (host, port) = addr.rsplit_once(':').unwrap();
    format!(
        r#"
import errno, socket
try:
    s = socket.create_connection(("{host}", {port}), timeout=2)
    s.sendall(b"hello")
    print(s.recv(100).decode() or "closed", flush=True)
except OSError as e:
    print("failed", errno.errorcode.get(e.errno, "timeout"), flush=True)
"#
    )
}
