//! Floods a Themis inbound sidecar with message 1 (issue 13): each connection sends
//! one Hello and waits briefly for the sidecar to answer or close, as fast as it can,
//! from one or more 127.x source addresses.
//!
//! * `fresh`: a new, validly signed Hello per connection (from a throwaway identity:
//!   every key pair is a valid id), which costs the responder a signature check and a
//!   full answer unless it is refused first (`rate_limited`).
//! * `replay`: one Hello, signed once, sent again and again (a captured Hello).
//! * `mixed`: every other connection.
//!
//! Prints one JSON object: Hellos sent, per second, how many connections the sidecar
//! closed unanswered (refused) or answered (message 2), and connection errors.

use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::{Parser, ValueEnum};
use ring::rand::SystemRandom;
use themis_benchmarks::themis::now_ms;
use themis_core::handshake::Initiator;
use themis_core::{HandshakeConfig, Identity, MeshName, PeerId};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum Mode {
    Fresh,
    Replay,
    Mixed,
}

#[derive(Parser, Debug)]
#[command(about = "Floods a Themis inbound listener with Hellos (message 1)")]
struct Args {
    /// The inbound listener, e.g. 127.0.0.12:15006.
    #[arg(long)]
    target: SocketAddr,
    /// The printable id of the workload behind it (the Hellos are addressed to it).
    #[arg(long)]
    responder: String,
    /// What each connection sends.
    #[arg(long, value_enum, default_value = "mixed")]
    mode: Mode,
    /// How long to flood, in seconds.
    #[arg(long, default_value_t = 30)]
    seconds: u64,
    /// Connections in flight at once.
    #[arg(long, default_value_t = 64)]
    concurrency: usize,
    /// First source address (127.x).
    #[arg(long, default_value = "127.0.0.50")]
    source: IpAddr,
    /// Source addresses to spread over, counting up from --source.
    #[arg(long, default_value_t = 1)]
    sources: u8,
    /// How long a connection waits for an answer or a close, in milliseconds.
    #[arg(long, default_value_t = 200)]
    wait_ms: u64,
}

#[derive(Default)]
struct Counts {
    sent: AtomicU64,
    refused: AtomicU64,
    answered: AtomicU64,
    silent: AtomicU64,
    errors: AtomicU64,
}

fn main() {
    let args = Args::parse();
    let (mesh, responder) = PeerId::parse(&args.responder).expect("--responder: a printable id");
    let mesh = MeshName::new(mesh.as_str()).expect("the id's mesh");
    let rng = SystemRandom::new();
    let me = Arc::new(Identity::generate(mesh, &rng).expect("an identity"));
    let captured = Initiator::start(&me, responder, &HandshakeConfig::default(), now_ms(), &rng)
        .expect("a Hello")
        .1;
    let IpAddr::V4(first) = args.source else {
        panic!("--source: an IPv4 127.x address")
    };
    assert!(first.is_loopback(), "--source must be on 127.0.0.0/8");
    let sources: Vec<SocketAddr> = (0..args.sources.max(1))
        .map(|i| {
            let mut octets = first.octets();
            octets[3] = octets[3].wrapping_add(i);
            SocketAddr::new(IpAddr::from(octets), 0)
        })
        .collect();
    let counts = Arc::new(Counts::default());
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("a runtime");
    let started = Instant::now();
    let deadline = started + Duration::from_secs(args.seconds);
    runtime.block_on(async {
        let tasks: Vec<_> = (0..args.concurrency)
            .map(|task| {
                let (counts, me, captured) = (counts.clone(), me.clone(), captured.clone());
                let source = sources[task % sources.len()];
                let (target, mode, wait) =
                    (args.target, args.mode, Duration::from_millis(args.wait_ms));
                tokio::spawn(async move {
                    let rng = SystemRandom::new();
                    let mut n = 0u64;
                    while Instant::now() < deadline {
                        n += 1;
                        let fresh = match mode {
                            Mode::Fresh => true,
                            Mode::Replay => false,
                            Mode::Mixed => n.is_multiple_of(2),
                        };
                        let hello = if fresh {
                            Initiator::start(
                                &me,
                                responder,
                                &HandshakeConfig::default(),
                                now_ms(),
                                &rng,
                            )
                            .expect("a Hello")
                            .1
                        } else {
                            captured.clone()
                        };
                        one(source, target, &hello, wait, &counts).await;
                    }
                })
            })
            .collect();
        for t in tasks {
            let _ = t.await;
        }
    });
    let secs = started.elapsed().as_secs_f64();
    let sent = counts.sent.load(Ordering::Relaxed);
    println!(
        "{}",
        serde_json::json!({
            "mode": format!("{:?}", args.mode).to_lowercase(),
            "sources": sources.len(),
            "seconds": secs,
            "hellos_sent": sent,
            "hellos_per_sec": (sent as f64 / secs).round(),
            "closed_unanswered": counts.refused.load(Ordering::Relaxed),
            "answered": counts.answered.load(Ordering::Relaxed),
            "no_answer_within_wait": counts.silent.load(Ordering::Relaxed),
            "connect_errors": counts.errors.load(Ordering::Relaxed),
        })
    );
}

/// One connection: the Hello, then the sidecar's answer or close (or `wait`).
async fn one(source: SocketAddr, target: SocketAddr, hello: &[u8], wait: Duration, c: &Counts) {
    let connected = async {
        let socket = tokio::net::TcpSocket::new_v4()?;
        socket.bind(source)?;
        socket.connect(target).await
    };
    let mut stream = match tokio::time::timeout(wait, connected).await {
        Ok(Ok(stream)) => stream,
        _ => {
            c.errors.fetch_add(1, Ordering::Relaxed);
            return;
        }
    };
    if stream.write_all(hello).await.is_err() {
        c.errors.fetch_add(1, Ordering::Relaxed);
        return;
    }
    c.sent.fetch_add(1, Ordering::Relaxed);
    let mut buf = [0u8; 1024];
    match tokio::time::timeout(wait, stream.read(&mut buf)).await {
        Ok(Ok(0)) | Ok(Err(_)) => c.refused.fetch_add(1, Ordering::Relaxed),
        Ok(Ok(_)) => c.answered.fetch_add(1, Ordering::Relaxed),
        Err(_) => c.silent.fetch_add(1, Ordering::Relaxed),
    };
}
