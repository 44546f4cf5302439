//! The agent's file descriptors and memory under a connection flood on its agent port.
//!
//! Starts a real `themis agent` on loopback (a fresh mesh in a temporary directory),
//! then for each scenario opens connections from many loopback sources (127.0.0.2 and
//! up) and reads the agent's `/proc/<pid>/status` VmRSS and `/proc/<pid>/fd` count
//! before, at the peak (all connections open) and after the handshake deadline, with
//! the agent's own counters. Scenarios: connections that send nothing, that send half
//! a Hello, and that send a record header announcing 1 MiB. Every process started is
//! stopped by its pid.
//!
//! ```text
//! cargo build --release -p themis-cli -p themis-benchmarks --bin themis --bin agent_conn_flood
//! target/release/agent_conn_flood --connections 4000 --sources 200
//! ```
//!
//! With `--admission-flood` it runs the issue 21 scenario instead
//! ([`themis_benchmarks::admission_flood`]): self-made keys from many sources (IPv4
//! and one IPv6 /64) against an admitted agent joining and the node's sidecars
//! getting signatures, beside the same without the flood. Needs root.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};
use themis_benchmarks::admission_flood::{limited, Stopped};

use clap::Parser;
use tokio::io::AsyncWriteExt;

#[derive(Parser)]
struct Args {
    /// The `themis` binary [default: next to this one].
    #[arg(long)]
    themis: Option<PathBuf>,
    /// Connections opened per scenario.
    #[arg(long, default_value_t = 4000)]
    connections: usize,
    /// Source addresses they come from (127.0.0.2 and up).
    #[arg(long, default_value_t = 200)]
    sources: u8,
    /// The agent's handshake deadline, milliseconds.
    #[arg(long, default_value_t = 2000)]
    handshake_timeout_ms: u64,
    /// Run the issue 21 scenario (self-made keys; see the module doc) instead.
    #[arg(long)]
    admission_flood: bool,
    /// Extra flags for the agent (e.g. "--max-inbound-connections 4096").
    #[arg(long, allow_hyphen_values = true, num_args = 1..)]
    agent_args: Vec<String>,
}

fn run(themis: &PathBuf, args: &[&str]) {
    let out = Command::new(themis)
        .args(args)
        .output()
        .expect("running themis");
    assert!(
        out.status.success(),
        "themis {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

#[derive(Clone, Copy)]
struct Sample {
    rss_kib: u64,
    fds: usize,
    held: u64,
}

fn sample(pid: u32, metrics: SocketAddr) -> (Sample, String) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let rss_kib = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0);
    let fds = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|d| d.count())
        .unwrap_or(0);
    let text = scrape(metrics).unwrap_or_default();
    let held = value(&text, "themis_connections{listener=\"agent\"}");
    (Sample { rss_kib, fds, held }, text)
}

fn scrape(addr: SocketAddr) -> std::io::Result<String> {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(5))?;
    s.set_read_timeout(Some(Duration::from_secs(10)))?;
    s.write_all(b"GET /metrics HTTP/1.0\r\n\r\n")?;
    let mut text = String::new();
    s.read_to_string(&mut text)?;
    Ok(text
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_owned())
        .unwrap_or_default())
}

fn value(text: &str, series: &str) -> u64 {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.trim().parse::<f64>().ok())
        .map_or(0, |v| v as u64)
}

fn main() {
    let args = Args::parse();
    let themis = args
        .themis
        .clone()
        .unwrap_or_else(|| std::env::current_exe().unwrap().with_file_name("themis"));
    if args.admission_flood {
        themis_benchmarks::admission_flood::run(&themis);
        return;
    }
    let tmp = std::env::temp_dir().join(format!("themis-conn-flood-{}", std::process::id()));
    let (mesh, node) = (tmp.join("mesh"), tmp.join("node"));
    std::fs::create_dir_all(&node).unwrap();
    run(
        &themis,
        &["mesh", "create", "bench", "--out", mesh.to_str().unwrap()],
    );
    run(
        &themis,
        &[
            "node",
            "admit",
            "--mesh-dir",
            mesh.to_str().unwrap(),
            "--out",
            node.to_str().unwrap(),
        ],
    );
    let listen = SocketAddr::from(([127, 0, 0, 1], free_port()));
    let metrics = SocketAddr::from(([127, 0, 0, 1], free_port()));
    let deadline = args.handshake_timeout_ms.to_string();
    let mut command = Command::new(&themis);
    command
        .args([
            "agent",
            "--listen",
            &listen.to_string(),
            "--metrics",
            &metrics.to_string(),
        ])
        .arg("--state-dir")
        .arg(&node)
        .args(["--handshake-timeout-ms", &deadline])
        .args(&args.agent_args)
        .env("RUST_LOG", "error")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    let agent = Stopped(command.spawn().expect("starting the agent"));
    let pid = agent.0.id();
    let started = Instant::now();
    while scrape(metrics).is_err() {
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "the agent did not start"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let mut nofile = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/prlimit with a valid pointer.
    unsafe {
        libc::prlimit(
            pid as i32,
            libc::RLIMIT_NOFILE,
            std::ptr::null(),
            &mut nofile,
        )
    };
    println!(
        "agent pid {pid}, RLIMIT_NOFILE {} (hard {}), handshake deadline {deadline} ms, \
         {} connections per scenario from {} sources, extra flags {:?}",
        nofile.rlim_cur, nofile.rlim_max, args.connections, args.sources, args.agent_args
    );
    println!(
        "| scenario | phase | VmRSS KiB | fds | held (gauge) | counted so far |\n|---|---|---|---|---|---|"
    );
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let header = {
        use themis_core::wire::{Kind, RecordHeader, MAX_RECORD_PAYLOAD};
        RecordHeader {
            version: themis_core::PROTOCOL_VERSION,
            kind: Kind::Record as u8,
            session_id: 1,
            seq: 0,
            reply_to: 0,
            len: MAX_RECORD_PAYLOAD as u32,
        }
        .encode()
        .to_vec()
    };
    // Half a Hello: a version, the kind, then bytes that never complete it.
    let partial = {
        let mut p = vec![
            themis_core::PROTOCOL_VERSION,
            themis_core::wire::Kind::Hello as u8,
        ];
        p.extend([1u8; 100]);
        p
    };
    let print = |scenario: &str, phase: &str| {
        let (s, text) = sample(pid, metrics);
        println!(
            "| {scenario} | {phase} | {} | {} | {} | {} |",
            s.rss_kib,
            s.fds,
            s.held,
            limited(&text)
        );
    };
    print("-", "idle agent");
    for (scenario, bytes) in [
        ("silent", Vec::new()),
        ("half a Hello", partial),
        ("1 MiB record header", header),
    ] {
        let held = rt.block_on(async {
            let mut held = Vec::with_capacity(args.connections);
            for i in 0..args.connections {
                let last = 2 + (i % usize::from(args.sources.max(1))) as u8;
                let socket = tokio::net::TcpSocket::new_v4().unwrap();
                socket
                    .bind(SocketAddr::new(
                        IpAddr::V4(Ipv4Addr::new(127, 0, 0, last)),
                        0,
                    ))
                    .unwrap();
                if let Ok(Ok(mut tcp)) =
                    tokio::time::timeout(Duration::from_secs(2), socket.connect(listen)).await
                {
                    if !bytes.is_empty() {
                        let _ = tcp.write_all(&bytes).await;
                    }
                    held.push(tcp);
                }
            }
            // Let the agent accept what the backlog holds.
            tokio::time::sleep(Duration::from_millis(500)).await;
            held
        });
        print(scenario, &format!("peak ({} open here)", held.len()));
        std::thread::sleep(Duration::from_millis(args.handshake_timeout_ms + 1000));
        print(scenario, "after the deadline");
        drop(held);
        std::thread::sleep(Duration::from_millis(500));
    }
    drop(agent);
    let _ = std::fs::remove_dir_all(&tmp);
}
