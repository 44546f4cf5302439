//! The agent port under a flood of self-made keys (issue 21): what an admitted agent
//! and the node's sidecars see, with and without the flood, in one run.
//!
//! Everything runs in a network namespace made for the run (`th-bench-admit-<pid>`,
//! loopback only, with the /64 `fd00:64::/64` on it), so that one IPv6 /64 can send
//! from many addresses without touching the host. Agent A listens on `[::]` (IPv4
//! and IPv6). Per phase:
//!
//! * flood (second phase only): 20 IPv4 sources (127.0.0.2–21) and 20 addresses of
//!   one IPv6 /64 (fd00:64::2–15), each completing key agreements with keys of its
//!   own as fast as A lets it, sending a DHT frame whose admission credential is no
//!   credential, and holding up to 32 connections (the per-source cap: 40 sources
//!   could hold 1280, over the agent's 1024);
//! * a sidecar of A gets 100 handshake messages signed (`POST /v1/workloads/check/
//!   sign`, one after another): p50 and p99;
//! * a newly admitted agent joins through A (time to `joined`), registers `web`
//!   (time of the call), and A resolves it (time until it answers).
//!
//! Every process started is stopped by its pid; the namespace is deleted at the end.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use themis_agent_client::ApiClient;
use themis_agent_client::Method;
use themis_core::PeerId;
use themis_testkit::intruder;
use tokio::io::AsyncWriteExt;

const MESH: &str = "bench";
const PORT: u16 = 7400;
const METRICS: &str = "127.0.0.1:9464";

/// A child process stopped (SIGTERM, then SIGKILL) when dropped.
pub struct Stopped(pub Child);

impl Drop for Stopped {
    fn drop(&mut self) {
        // SAFETY: kill(2) on the pid of our own child.
        unsafe { libc::kill(self.0.id() as i32, libc::SIGTERM) };
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.0.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The run's network namespace; deleted when dropped.
struct Namespace(String);

impl Namespace {
    /// Creates it and moves the calling thread into it: call before any other thread
    /// exists, so that every thread and process started afterwards is in it.
    fn enter() -> Namespace {
        let ns = Namespace(format!("th-bench-admit-{}", std::process::id()));
        ip(&["netns", "add", &ns.0]);
        ip(&["-n", &ns.0, "link", "set", "lo", "up"]);
        for i in 1..=0x15 {
            let address = format!("fd00:64::{i:x}/64");
            ip(&["-n", &ns.0, "addr", "add", &address, "dev", "lo", "nodad"]);
        }
        let path = format!("/var/run/netns/{}", ns.0);
        let file = std::fs::File::open(&path).expect("the namespace's file");
        // SAFETY: setns(2) on a descriptor we own; it changes only this thread.
        let done =
            unsafe { libc::setns(std::os::fd::AsRawFd::as_raw_fd(&file), libc::CLONE_NEWNET) };
        assert_eq!(done, 0, "setns: {}", std::io::Error::last_os_error());
        ns
    }
}

impl Drop for Namespace {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["netns", "del", &self.0]).status();
    }
}

fn ip(args: &[&str]) {
    let ok = Command::new("ip")
        .args(args)
        .status()
        .is_ok_and(|s| s.success());
    assert!(ok, "ip {}", args.join(" "));
}

fn themis(binary: &Path, args: &[&str]) {
    let out = Command::new(binary).args(args).output().expect("themis");
    assert!(
        out.status.success(),
        "themis {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Fast timers, as the tests' agents use.
const FAST: &[&str] = &[
    "--stabilise-ms",
    "200",
    "--request-timeout-ms",
    "500",
    "--resolve-cache-ms",
    "0",
    "--record-ttl-secs",
    "10",
    "--republish-secs",
    "2",
];

fn spawn_agent(binary: &Path, dir: &Path, args: &[&str]) -> Stopped {
    let child = Command::new(binary)
        .args(["agent", "--mesh", MESH, "--state-dir"])
        .arg(dir)
        .args(FAST)
        .args(args)
        .env("RUST_LOG", "error")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("starting an agent");
    Stopped(child)
}

async fn call(api: &ApiClient, method: Method, path: &str, body: Option<&Value>) -> (u16, Value) {
    match api.call(method, path, body).await {
        Ok((status, value)) => (status.as_u16(), value),
        Err(_) => (0, Value::Null),
    }
}

/// Polls `check` every 20 ms for at most 60 s; the time it took, or `None`.
async fn time_until(mut check: impl AsyncFnMut() -> bool) -> Option<Duration> {
    let started = Instant::now();
    while started.elapsed() < Duration::from_secs(60) {
        if check().await {
            return Some(started.elapsed());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    None
}

/// One flooding source: handshakes with keys of its own, a frame with no valid
/// admission on each, up to 32 connections held.
async fn flood_source(
    from: IpAddr,
    to: SocketAddr,
    peer: PeerId,
    stop: Arc<AtomicBool>,
    counts: Arc<[AtomicU64; 2]>,
) {
    let frame = intruder::unadmitted_frame();
    let mut held = std::collections::VecDeque::new();
    while !stop.load(Ordering::Relaxed) {
        counts[0].fetch_add(1, Ordering::Relaxed);
        let attempt = async {
            let (mut tcp, mut session) = intruder::handshake_from(MESH, from, to, peer).await?;
            let (_, record) = session.seal(&frame, None).ok()?;
            tcp.write_all(&record).await.ok()?;
            Some(tcp)
        };
        if let Some(tcp) = attempt.await {
            counts[1].fetch_add(1, Ordering::Relaxed);
            held.push_back(tcp);
            while held.len() > 32 {
                held.pop_front();
            }
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn scrape() -> String {
    use std::io::{Read, Write};
    let Ok(mut s) = std::net::TcpStream::connect(METRICS) else {
        return String::new();
    };
    let _ = s.set_read_timeout(Some(Duration::from_secs(10)));
    let _ = s.write_all(b"GET /metrics HTTP/1.0\r\n\r\n");
    let mut text = String::new();
    let _ = s.read_to_string(&mut text);
    text.split_once("\r\n\r\n")
        .map(|(_, b)| b.to_owned())
        .unwrap_or_default()
}

/// The agent listener's `themis_connections_limited_total` samples, as
/// `reason=count` words.
pub fn limited(text: &str) -> String {
    let mut out = Vec::new();
    for line in text.lines() {
        if let Some(rest) =
            line.strip_prefix("themis_connections_limited_total{listener=\"agent\",reason=\"")
        {
            if let Some((reason, n)) = rest.split_once("\"} ") {
                out.push(format!("{reason}={n}"));
            }
        }
    }
    out.join(" ")
}

fn ms(d: Option<Duration>) -> String {
    d.map_or("–".into(), |d| format!("{:.1}", d.as_secs_f64() * 1000.0))
}

/// Runs both phases and prints the table. Needs root (a network namespace).
pub fn run(binary: &Path) {
    let ns = Namespace::enter();
    let tmp = std::env::temp_dir().join(format!("themis-admission-flood-{}", std::process::id()));
    let mesh = tmp.join("mesh");
    std::fs::create_dir_all(&tmp).unwrap();
    let path = |p: &PathBuf| p.to_str().unwrap().to_owned();
    themis(binary, &["mesh", "create", MESH, "--out", &path(&mesh)]);
    let node = |name: &str| {
        let dir = tmp.join(name);
        std::fs::create_dir_all(&dir).unwrap();
        themis(
            binary,
            &[
                "node",
                "admit",
                "--mesh-dir",
                &path(&mesh),
                "--out",
                &path(&dir),
            ],
        );
        dir
    };
    let a_dir = node("a");
    let a = spawn_agent(
        binary,
        &a_dir,
        &[
            "--listen",
            &format!("[::]:{PORT}"),
            "--advertise",
            &format!("[fd00:64::1]:{PORT}"),
            "--metrics",
            METRICS,
        ],
    );
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let a_api = ApiClient::new(a_dir.join("agent.sock"));
    let (a_id, workload) = rt.block_on(async {
        time_until(async || call(&a_api, Method::GET, "/v1/status", None).await.0 == 200)
            .await
            .expect("agent A starts");
        let (_, status) = call(&a_api, Method::GET, "/v1/status", None).await;
        call(&a_api, Method::PUT, "/v1/workloads/check", None).await;
        let (_, identity) = call(&a_api, Method::GET, "/v1/workloads/check/identity", None).await;
        (status["id"].as_str().unwrap().to_owned(), identity)
    });
    let a_peer = PeerId::parse(&a_id).unwrap().1;
    let contact = format!("{a_id}@[fd00:64::1]:{PORT}");
    println!(
        "agent A pid {}, listening on [::]:{PORT} in namespace {}; defaults otherwise",
        a.0.id(),
        ns.0
    );
    println!(
        "| phase | sign p50 ms | sign p99 ms | join ms | register ms | resolved ms | flood handshakes (done / tried) | A's closes so far |\n|---|---:|---:|---:|---:|---:|---|---|"
    );
    for (phase, flood) in [("no flood", false), ("flood", true)] {
        let stop = Arc::new(AtomicBool::new(false));
        let counts: Arc<[AtomicU64; 2]> = Arc::new([AtomicU64::new(0), AtomicU64::new(0)]);
        let mut tasks = Vec::new();
        if flood {
            for i in 0..20u8 {
                let v4 = IpAddr::V4(Ipv4Addr::new(127, 0, 0, 2 + i));
                let v6 = IpAddr::V6(Ipv6Addr::new(0xfd00, 0x64, 0, 0, 0, 0, 0, 2 + u16::from(i)));
                for (from, to) in [
                    (v4, SocketAddr::from(([127, 0, 0, 1], PORT))),
                    (v6, SocketAddr::new("fd00:64::1".parse().unwrap(), PORT)),
                ] {
                    tasks.push(rt.spawn(flood_source(
                        from,
                        to,
                        a_peer,
                        stop.clone(),
                        counts.clone(),
                    )));
                }
            }
            std::thread::sleep(Duration::from_secs(2));
        }
        let joiner_dir = node(&format!("joiner-{}", u8::from(flood)));
        themis(
            binary,
            &[
                "service",
                "grant",
                "web",
                "--mesh-dir",
                &path(&mesh),
                "--node",
                &path(&joiner_dir),
            ],
        );
        let row = rt.block_on(async {
            let mut signs = Vec::new();
            for _ in 0..100 {
                let body = themis_testkit::agent::hello_sign_request(&workload, MESH);
                let started = Instant::now();
                let (code, answer) = call(
                    &a_api,
                    Method::POST,
                    "/v1/workloads/check/sign",
                    Some(&body),
                )
                .await;
                assert_eq!(code, 200, "{answer}");
                signs.push(started.elapsed());
            }
            signs.sort();
            let joiner = spawn_agent(
                binary,
                &joiner_dir,
                &[
                    "--listen",
                    "127.0.0.1:0",
                    "--join",
                    &contact,
                    "--metrics",
                    "off",
                ],
            );
            let api = ApiClient::new(joiner_dir.join("agent.sock"));
            let join = time_until(async || {
                call(&api, Method::GET, "/v1/status", None).await.1["joined"] == true
            })
            .await;
            let started = Instant::now();
            let body = json!({ "endpoint": "127.0.0.1:8080" });
            let (code, answer) = call(
                &api,
                Method::PUT,
                "/v1/services/web/instances/web-1",
                Some(&body),
            )
            .await;
            let register = (code == 200).then(|| started.elapsed());
            if code != 200 {
                eprintln!("{phase}: register: {code} {answer}");
            }
            let resolved = time_until(async || {
                let (code, answer) =
                    call(&a_api, Method::GET, "/v1/services/web?fresh=true", None).await;
                code == 200
                    && answer["instances"]
                        .as_array()
                        .is_some_and(|i| !i.is_empty())
            })
            .await;
            drop(joiner);
            (signs[49], signs[98], join, register, resolved)
        });
        stop.store(true, Ordering::Relaxed);
        for task in tasks {
            let _ = rt.block_on(task);
        }
        let (p50, p99, join, register, resolved) = row;
        println!(
            "| {phase} | {} | {} | {} | {} | {} | {} / {} | {} |",
            ms(Some(p50)),
            ms(Some(p99)),
            ms(join),
            ms(register),
            ms(resolved),
            counts[1].load(Ordering::Relaxed),
            counts[0].load(Ordering::Relaxed),
            limited(&scrape())
        );
    }
    drop(a);
    drop(rt);
    let _ = std::fs::remove_dir_all(&tmp);
    drop(ns);
}
