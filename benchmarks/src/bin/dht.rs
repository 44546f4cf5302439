//! The host agents' DHT against the Themis paper (ARES 2022, §7, Fig. 4):
//!
//! * `find` and `store` throughput resolved on the receiving node (one remote request
//!   each), and with random ids across 8 and 32 nodes, with the secure channel on and
//!   (benchmark only, `plaintext.rs`) off;
//! * joining 100 nodes one after another and all at once;
//! * leaving.
//!
//! Every node is a real `Overlay` with its own TCP listener on 127.0.0.1, all in this
//! process (one tokio runtime on the machine's cores), so the figures include the
//! driver, the codec, the sockets and, when on, the key agreement and sealing.
//!
//! `cargo run --release -p themis-benchmarks --bin dht [-- --secs 3]`

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ring::rand::{SecureRandom, SystemRandom};
use themis_agent::metrics::Metrics;
use themis_agent::overlay::{Overlay, OverlayConfig, Peer, Transport};
use themis_benchmarks::plaintext;
use themis_core::{Identity, MeshName, SessionInfo};
use themis_dht::{in_half_open, Contact, Key};
use themis_net::{Client, ClientConfig, NetStats};
use tokio::net::TcpListener;

const CONCURRENCY: usize = 64;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Security {
    On,
    Off,
}

struct Node {
    overlay: Overlay,
    server: tokio::task::JoinHandle<()>,
}

impl Drop for Node {
    fn drop(&mut self) {
        self.server.abort();
    }
}

fn config() -> OverlayConfig {
    let mut config = OverlayConfig::default();
    // Owners would re-store every benchmark name; the benchmark measures single stores.
    config.dht.republish_every = 3_600_000;
    config.dht.store_capacity = 1_000_000;
    config.op_timeout = Duration::from_secs(30);
    config
}

async fn node(security: Security, bootstrap: Option<&Peer>) -> Node {
    let mesh = MeshName::new("bench").unwrap();
    let identity = Arc::new(Identity::generate(mesh.clone(), &SystemRandom::new()).unwrap());
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let me = Contact {
        id: Key(identity.id().0),
        addr: listener.local_addr().unwrap(),
    };
    let transport: Arc<dyn Transport> = match security {
        Security::On => Arc::new(Arc::new(Client::new(
            identity.clone(),
            ClientConfig::default(),
        ))),
        Security::Off => Arc::new(plaintext::PlainClient::new(identity.id())),
    };
    let bootstrap = bootstrap.into_iter().cloned().collect();
    let overlay = Overlay::start(
        me,
        mesh,
        bootstrap,
        transport,
        config(),
        Arc::new(Metrics::new()),
    );
    let server = match security {
        Security::On => {
            let o = overlay.clone();
            let handler = move |peer: Arc<SessionInfo>, frame: bytes::BytesMut| {
                let o = o.clone();
                async move { o.handle_frame(peer.peer_id, &frame).await }
            };
            let stats = Arc::new(NetStats::default());
            tokio::spawn(async move {
                let _ = themis_net::serve(
                    listener,
                    identity,
                    themis_net::Config::default(),
                    Arc::new(handler),
                    stats,
                )
                .await;
            })
        }
        Security::Off => tokio::spawn(plaintext::serve(listener, overlay.clone())),
    };
    Node { overlay, server }
}

async fn wait_joined(node: &Node) {
    let mut joined = node.overlay.joined();
    joined.wait_for(|j| *j).await.unwrap();
}

/// Starts `n` nodes one after another and waits until every successor pointer is
/// right.
async fn ring(security: Security, n: usize) -> Vec<Node> {
    let first = node(security, None).await;
    let bootstrap = first.overlay.me().clone();
    let mut nodes = vec![first];
    for _ in 1..n {
        let node = node(security, Some(&bootstrap)).await;
        wait_joined(&node).await;
        nodes.push(node);
    }
    wait_stable(&nodes).await;
    nodes
}

async fn wait_stable(nodes: &[Node]) {
    let mut ids: Vec<(Key, SocketAddr)> = nodes
        .iter()
        .map(|n| (n.overlay.me().id, n.overlay.me().addr))
        .collect();
    ids.sort();
    loop {
        let mut stable = true;
        for node in nodes {
            let me = node.overlay.me().id;
            let next = ids.iter().find(|(id, _)| *id > me).unwrap_or(&ids[0]).1;
            let view = node.overlay.view().await.unwrap();
            stable &= view.successors.first().map(|p| p.addr) == Some(next);
        }
        if stable {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn random_key() -> Key {
    let mut k = [0u8; 32];
    SystemRandom::new().fill(&mut k).unwrap();
    Key(k)
}

/// Runs `op` from `CONCURRENCY` tasks for `secs` (after a 0.5 s warm-up); returns
/// completed operations per second and the number of failures.
async fn throughput<F, Fut>(secs: f64, op: F) -> (f64, u64)
where
    F: Fn(u64) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = bool> + Send,
{
    let op = Arc::new(op);
    let (done, failed, counting, stop) = (
        Arc::new(AtomicU64::new(0)),
        Arc::new(AtomicU64::new(0)),
        Arc::new(AtomicBool::new(false)),
        Arc::new(AtomicBool::new(false)),
    );
    let workers: Vec<_> = (0..CONCURRENCY as u64)
        .map(|w| {
            let (op, done, failed, counting, stop) = (
                op.clone(),
                done.clone(),
                failed.clone(),
                counting.clone(),
                stop.clone(),
            );
            tokio::spawn(async move {
                let mut i = w * 1_000_000_007;
                while !stop.load(Ordering::Relaxed) {
                    let ok = op(i).await;
                    i += 1;
                    if counting.load(Ordering::Relaxed) {
                        if ok { &done } else { &failed }.fetch_add(1, Ordering::Relaxed);
                    }
                }
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(500)).await;
    counting.store(true, Ordering::Relaxed);
    let started = Instant::now();
    tokio::time::sleep(Duration::from_secs_f64(secs)).await;
    counting.store(false, Ordering::Relaxed);
    let elapsed = started.elapsed().as_secs_f64();
    stop.store(true, Ordering::Relaxed);
    for w in workers {
        let _ = w.await;
    }
    (
        done.load(Ordering::Relaxed) as f64 / elapsed,
        failed.load(Ordering::Relaxed),
    )
}

/// Stores one instance-record-sized value under `name` (k = 0); true if stored.
async fn store_one(overlay: &Overlay, name: &str) -> bool {
    let value = b"10.0.0.1:15006".to_vec();
    let stored = overlay
        .store(name.as_bytes(), value, 0, Duration::from_secs(600))
        .await;
    stored.is_ok_and(|s| s.stored == 1)
}

/// Find and store where the initiator's one remote request goes to the node that
/// resolves it (the paper's "resolved on the receiving node").
async fn one_hop(security: Security, secs: f64) -> ((f64, u64), (f64, u64)) {
    let nodes = ring(security, 3).await;
    let initiator = nodes[0].overlay.clone();
    // Keys whose lookup from node 0 is answered by the first node asked.
    let mut keys = Vec::new();
    while keys.len() < 256 {
        let key = random_key();
        if initiator.find(key).await.unwrap().hops == 1 {
            keys.push(key);
        }
    }
    // Names node 0 knows the holder of (its successor): one Store request each.
    let (me, successor) = (
        initiator.me().id,
        initiator.view().await.unwrap().successors[0].clone(),
    );
    let successor_id = Key(themis_core::PeerId::parse(&successor.id).unwrap().1 .0);
    let names: Vec<String> = (0..)
        .map(|i| format!("bench-{i}"))
        .filter(|n| in_half_open(&Key::object(n.as_bytes(), 0), &me, &successor_id))
        .take(256)
        .collect();
    let (keys, names) = (Arc::new(keys), Arc::new(names));
    let o = initiator.clone();
    let find = throughput(secs, move |i| {
        let (o, key) = (o.clone(), keys[i as usize % 256]);
        async move { o.find(key).await.is_ok_and(|f| f.hops == 1) }
    })
    .await;
    let o = initiator.clone();
    let store = throughput(secs, move |i| {
        let (o, name) = (o.clone(), names[i as usize % 256].clone());
        async move { store_one(&o, &name).await }
    })
    .await;
    (find, store)
}

/// Find and store of random ids from random nodes of an `n`-node ring; also the
/// mean hops of the finds.
async fn random_ids(security: Security, n: usize, secs: f64) -> ((f64, u64), (f64, u64), f64) {
    let nodes = ring(security, n).await;
    let overlays: Arc<Vec<Overlay>> = Arc::new(nodes.iter().map(|n| n.overlay.clone()).collect());
    let hops = Arc::new((AtomicU64::new(0), AtomicU64::new(0)));
    let (o, h) = (overlays.clone(), hops.clone());
    let find = throughput(secs, move |i| {
        let (o, h) = (o.clone(), h.clone());
        async move {
            let node = &o[(i as usize).wrapping_mul(7919) % o.len()];
            match node.find(random_key()).await {
                Ok(found) => {
                    h.0.fetch_add(u64::from(found.hops), Ordering::Relaxed);
                    h.1.fetch_add(1, Ordering::Relaxed);
                    true
                }
                Err(_) => false,
            }
        }
    })
    .await;
    let o = overlays.clone();
    let store = throughput(secs, move |i| {
        let o = o.clone();
        async move {
            let node = &o[(i as usize).wrapping_mul(7919) % o.len()];
            store_one(node, &hex::encode(random_key().0)).await
        }
    })
    .await;
    let mean_hops =
        hops.0.load(Ordering::Relaxed) as f64 / hops.1.load(Ordering::Relaxed).max(1) as f64;
    (find, store, mean_hops)
}

fn stats(ms: &mut [f64]) -> String {
    ms.sort_by(|a, b| a.partial_cmp(b).unwrap());
    let mean = ms.iter().sum::<f64>() / ms.len() as f64;
    let p = |q: f64| ms[((ms.len() - 1) as f64 * q).round() as usize];
    format!(
        "mean {mean:.2} ms, p50 {:.2}, p95 {:.2}, max {:.2}",
        p(0.5),
        p(0.95),
        p(1.0)
    )
}

async fn joins(n: usize) {
    // One after another: each joins through the first, and is timed until it has
    // found its successor (paper: "join").
    let first = node(Security::On, None).await;
    let bootstrap = first.overlay.me().clone();
    let mut nodes = vec![first];
    let mut each = Vec::new();
    let started = Instant::now();
    for _ in 1..n {
        let t = Instant::now();
        let node = node(Security::On, Some(&bootstrap)).await;
        wait_joined(&node).await;
        each.push(t.elapsed().as_secs_f64() * 1e3);
        nodes.push(node);
    }
    let total = started.elapsed();
    let t = Instant::now();
    wait_stable(&nodes).await;
    println!(
        "| join {n} nodes one after another | {} per node; all joined in {:.0} ms; every successor right {:.0} ms later |",
        stats(&mut each),
        total.as_secs_f64() * 1e3,
        t.elapsed().as_secs_f64() * 1e3
    );
    drop(nodes);

    // All at once.
    let first = node(Security::On, None).await;
    let bootstrap = first.overlay.me().clone();
    let started = Instant::now();
    let mut joining = Vec::new();
    for _ in 1..n {
        joining.push(node(Security::On, Some(&bootstrap)).await);
    }
    let mut each = Vec::new();
    for node in &joining {
        wait_joined(node).await;
        each.push(started.elapsed().as_secs_f64() * 1e3);
    }
    let total = started.elapsed();
    let mut nodes = vec![first];
    nodes.extend(joining);
    let t = Instant::now();
    wait_stable(&nodes).await;
    println!(
        "| join {n} nodes all at once | all joined in {:.0} ms = {:.2} ms per node; every successor right {:.0} ms later |",
        total.as_secs_f64() * 1e3,
        total.as_secs_f64() * 1e3 / (n - 1) as f64,
        t.elapsed().as_secs_f64() * 1e3
    );
}

async fn leaves() {
    let nodes = ring(Security::On, 32).await;
    let mut each = Vec::new();
    for node in nodes.iter().skip(1).step_by(3).take(10) {
        // Something to hand over.
        for i in 0..8 {
            node.overlay
                .store(
                    format!("leave-{i}").as_bytes(),
                    b"x".to_vec(),
                    0,
                    Duration::from_secs(600),
                )
                .await
                .unwrap();
        }
        let t = Instant::now();
        node.overlay.leave().await;
        each.push(t.elapsed().as_secs_f64() * 1e3);
    }
    println!(
        "| leave (10 of a 32-node ring, hand-over acknowledged) | {} |",
        stats(&mut each)
    );
}

fn main() {
    let secs: f64 = std::env::args()
        .skip_while(|a| a != "--secs")
        .nth(1)
        .map_or(3.0, |s| s.parse().expect("--secs takes a number"));
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        println!("Concurrency {CONCURRENCY}, {secs} s per measurement after 0.5 s warm-up; ops/s (failures).\n");
        println!("| workload | security on | security off | overhead of security |");
        println!("|---|---:|---:|---:|");
        let fmt = |(ops, failed): (f64, u64)| format!("{ops:.0} ({failed})");
        let overhead = |on: f64, off: f64| format!("{:.1} %", (off - on) / off * 100.0);
        let (find_on, store_on) = one_hop(Security::On, secs).await;
        let (find_off, store_off) = one_hop(Security::Off, secs).await;
        println!("| find, resolved by the receiving node | {} | {} | {} |", fmt(find_on), fmt(find_off), overhead(find_on.0, find_off.0));
        println!("| store, resolved by the receiving node | {} | {} | {} |", fmt(store_on), fmt(store_off), overhead(store_on.0, store_off.0));
        for n in [8, 32] {
            let (f_on, s_on, hops) = random_ids(Security::On, n, secs).await;
            let (f_off, s_off, _) = random_ids(Security::Off, n, secs).await;
            println!("| find, random ids, {n} nodes (mean {hops:.2} hops) | {} | {} | {} |", fmt(f_on), fmt(f_off), overhead(f_on.0, f_off.0));
            println!("| store, random ids, {n} nodes | {} | {} | {} |", fmt(s_on), fmt(s_off), overhead(s_on.0, s_off.0));
        }
        println!("\n| membership | result |\n|---|---|");
        joins(100).await;
        leaves().await;
    });
}
