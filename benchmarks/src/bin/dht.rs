//! The host agents' DHT against the Themis paper (ARES 2022, §7, Fig. 4):
//!
//! * `find` and `store` throughput resolved on the receiving node (one remote request
//!   each), and with random ids across 8 and 32 nodes, with Chord lookups and with
//!   one-hop routing (every node given the full membership: a find is computed, a
//!   store is one request), with the secure channel on and (benchmark only,
//!   `plaintext.rs`) off;
//! * joining 100 nodes one after another and all at once;
//! * leaving.
//!
//! Every node is a real `Overlay` with its own TCP listener on 127.0.0.1, all in this
//! process (one tokio runtime on the machine's cores), so the figures include the
//! driver, the codec, the sockets and, when on, the key agreement and sealing.
//!
//! Mesh trust is on in every case, as in the agent (it cannot be turned off): the run
//! creates a mesh root in memory, admits every node (an `Admission` per node key, sent
//! with every DHT frame and checked once per peer), and stores only endorsed instance
//! values (a root grant to the storing node for the name plus a record it signed), so
//! every store is verified by the policy of the storing node and of each holder. The
//! values are signed before any timed loop, one per name and storing node, and each
//! timed store cycles through them (storing a held value again refreshes it, and is
//! verified again). The run starts with the per-call cost of those checks.
//!
//! `cargo run --release -p themis-benchmarks --bin dht [-- --secs 3] [--costs-only | --joins-only]`

use std::hint::black_box;
use std::net::{Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use ring::rand::{SecureRandom, SystemRandom};
use themis_agent::metrics::Metrics;
use themis_agent::overlay::{Frame, Overlay, OverlayConfig, Peer, Transport};
use themis_agent::trust::{unix_millis, MeshTrust, TrustPolicy};
use themis_benchmarks::plaintext;
use themis_core::identity::verify_statement;
use themis_core::{Identity, MeshName, PeerId, SessionInfo};
use themis_dht::{in_half_open, Contact, Key, Message, Request, ValuePolicy};
use themis_net::{Client, ClientConfig, NetStats};
use themis_trust::{
    Admission, Grant, InstanceValue, MeshRoot, Record, Revocations, Signed, Verifier,
    ADMISSION_LABEL, GRANT_LABEL, RECORD_LABEL,
};
use tokio::net::TcpListener;

const CONCURRENCY: usize = 64;
/// Endorsed values signed per name pool (one-hop names; names per node of a ring).
const POOL: usize = 256;
/// How long the benchmark's records are valid (within the 24 h the policy allows).
const RECORD_LIFETIME_MS: u64 = 3600 * 1000;
/// The DHT lifetime asked for at each store.
const STORE_TTL: Duration = Duration::from_secs(600);

/// The benchmark's mesh: its root key (the operator's, here in memory) and what it
/// signs.
struct Mesh {
    name: MeshName,
    operator: Identity,
    root: MeshRoot,
}

/// The mesh every node of the run belongs to.
fn mesh() -> &'static Mesh {
    static MESH: OnceLock<Mesh> = OnceLock::new();
    MESH.get_or_init(|| {
        let name = MeshName::new("bench").unwrap();
        let operator = Identity::generate(name.clone(), &SystemRandom::new()).unwrap();
        let root = MeshRoot {
            mesh: name.clone(),
            key: *operator.public_key(),
        };
        Mesh {
            name,
            operator,
            root,
        }
    })
}

impl Mesh {
    /// The encoded admission of `node` (what `themis node admit` writes).
    fn admission(&self, node: &Identity) -> Vec<u8> {
        let admission = Admission {
            mesh: self.name.as_str().to_owned(),
            node_key: *node.public_key(),
            issued_at: unix_millis(),
            not_after: None,
        };
        Signed::sign(&self.operator, ADMISSION_LABEL, &admission).encode()
    }

    /// The trust state of an admitted `node` (no grant files: it only stores what the
    /// benchmark hands it).
    fn trust(&self, node: &Identity) -> Arc<MeshTrust> {
        let trust = MeshTrust::new(
            self.root.clone(),
            self.admission(node),
            PathBuf::new(),
            node,
            Arc::new(Metrics::new()),
        )
        .expect("the node's own admission verifies");
        Arc::new(trust)
    }

    /// An endorsed instance of `service`, as an agent stores it: the root's grant of
    /// the service to `node`, and a record `node` signed for a new workload with an
    /// endpoint and one label. The workload key is 32 random bytes: nothing checks it
    /// at a store (the workload proves it at the handshake), so a real key would cost
    /// the same.
    fn endorsed(&self, node: &Identity, service: &str) -> Vec<u8> {
        let now = unix_millis();
        let grant = Grant {
            mesh: self.name.as_str().to_owned(),
            service: service.to_owned(),
            grantee: *node.public_key(),
            delegate: false,
            issued_at: now,
            not_after: None,
        };
        let mut workload_key = [0u8; 32];
        SystemRandom::new().fill(&mut workload_key).unwrap();
        let record = Record {
            mesh: self.name.as_str().to_owned(),
            service: service.to_owned(),
            workload_key,
            endpoint: Some(SocketAddr::from((
                Ipv4Addr::new(10, 0, workload_key[0], workload_key[1]),
                15006,
            ))),
            metadata: [("version".to_owned(), "v1".to_owned())].into(),
            issued_at: now,
            not_after: now + RECORD_LIFETIME_MS,
        };
        InstanceValue {
            grants: vec![Signed::sign(&self.operator, GRANT_LABEL, &grant)],
            record: Signed::sign(node, RECORD_LABEL, &record),
        }
        .encode()
    }

    /// One endorsed value per name, all endorsed by `node`.
    fn pool(&self, node: &Identity, names: &[String]) -> Vec<(String, Vec<u8>)> {
        names
            .iter()
            .map(|name| (name.clone(), self.endorsed(node, name)))
            .collect()
    }
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Security {
    On,
    Off,
}

struct Node {
    identity: Arc<Identity>,
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
    let mesh = mesh().name.clone();
    let identity = Arc::new(Identity::generate(mesh.clone(), &SystemRandom::new()).unwrap());
    let trust = crate::mesh().trust(&identity);
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
        trust,
    );
    let server = match security {
        Security::On => {
            let o = overlay.clone();
            let identity = identity.clone();
            let handler = move |peer: Arc<SessionInfo>, frame: bytes::BytesMut| {
                let o = o.clone();
                async move { o.handle_frame(peer.peer_id, &frame).await }
            };
            let stats = Arc::new(NetStats::default());
            // The agent's own listener settings (admission deadline, frame limit before
            // admission, Hello budgets), as `themis agent` runs them.
            let (net_config, limits) = themis_agent::config::Settings::default().inbound();
            // Every node here connects from 127.0.0.1, so to each listener all of them
            // are one source, where a deployment's nodes are one each: the per-source
            // caps (32 connections, 50 Hellos/s) would count the whole ring as one
            // node and turn joins into retries. The rest stays as the agent runs it.
            let limits = themis_net::Limits {
                max_per_source: usize::MAX,
                hellos_per_source: themis_core::Rate {
                    per_second: u32::MAX,
                    burst: u32::MAX,
                },
                ..limits
            };
            tokio::spawn(async move {
                let _ = themis_net::serve_with(
                    listener,
                    identity,
                    net_config,
                    limits,
                    Arc::new(handler),
                    stats,
                )
                .await;
            })
        }
        Security::Off => tokio::spawn(plaintext::serve(listener, overlay.clone())),
    };
    Node {
        identity,
        overlay,
        server,
    }
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

/// Stores one endorsed value under its name (k = 0); true if stored.
async fn store_one(overlay: &Overlay, (name, value): &(String, Vec<u8>)) -> bool {
    let stored = overlay
        .store(name.as_bytes(), value.clone(), 0, STORE_TTL)
        .await;
    stored.is_ok_and(|s| s.stored == 1)
}

/// Find and store where the initiator's one remote request goes to the node that
/// resolves it (the paper's "resolved on the receiving node").
async fn one_hop(security: Security, secs: f64) -> ((f64, u64), (f64, u64)) {
    let nodes = ring(security, 3).await;
    let initiator = nodes[0].overlay.clone();
    let initiator_identity = nodes[0].identity.clone();
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
        .take(POOL)
        .collect();
    let values = mesh().pool(&initiator_identity, &names);
    let (keys, values) = (Arc::new(keys), Arc::new(values));
    let o = initiator.clone();
    let find = throughput(secs, move |i| {
        let (o, key) = (o.clone(), keys[i as usize % 256]);
        async move { o.find(key).await.is_ok_and(|f| f.hops == 1) }
    })
    .await;
    let o = initiator.clone();
    let store = throughput(secs, move |i| {
        let (o, values) = (o.clone(), values.clone());
        async move { store_one(&o, &values[i as usize % POOL]).await }
    })
    .await;
    (find, store)
}

/// How the nodes of a run find holders.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Routing {
    /// Chord lookups through other nodes.
    Chord,
    /// One hop (issue 23): every node is given the full membership and computes
    /// holders itself; a find is answered locally, a store is one request.
    OneHop,
}

/// Find and store of random ids from random nodes of an `n`-node ring; also the
/// mean hops of the finds.
async fn random_ids(
    security: Security,
    routing: Routing,
    n: usize,
    secs: f64,
) -> ((f64, u64), (f64, u64), f64) {
    let nodes = ring(security, n).await;
    let overlays: Arc<Vec<Overlay>> = Arc::new(nodes.iter().map(|n| n.overlay.clone()).collect());
    if routing == Routing::OneHop {
        let members = themis_dht::Members::new(overlays.iter().map(|o| o.me().clone()));
        for overlay in overlays.iter() {
            overlay.set_members(members.clone()).await;
        }
    }
    // Per node, endorsed values for random names it stores.
    let pools: Arc<Vec<_>> = Arc::new(
        nodes
            .iter()
            .map(|node| {
                let names: Vec<String> = (0..POOL).map(|_| hex::encode(random_key().0)).collect();
                mesh().pool(&node.identity, &names)
            })
            .collect(),
    );
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
        let (o, pools) = (o.clone(), pools.clone());
        async move {
            let at = (i as usize).wrapping_mul(7919) % o.len();
            store_one(&o[at], &pools[at][(i as usize / o.len()) % POOL]).await
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
    let names: Vec<String> = (0..8).map(|i| format!("leave-{i}")).collect();
    // Stores that still failed after three tries: a lookup may name a node that has
    // just left until the ring has stabilised past it (not timed, only reported).
    let mut not_stored = 0;
    for node in nodes.iter().skip(1).step_by(3).take(10) {
        // Something to hand over.
        for value in mesh().pool(&node.identity, &names) {
            let mut stored = false;
            for _ in 0..3 {
                stored = store_one(&node.overlay, &value).await;
                if stored {
                    break;
                }
            }
            not_stored += usize::from(!stored);
        }
        let t = Instant::now();
        node.overlay.leave().await;
        each.push(t.elapsed().as_secs_f64() * 1e3);
    }
    println!(
        "| leave (10 of a 32-node ring, hand-over acknowledged) | {}{} |",
        stats(&mut each),
        match not_stored {
            0 => String::new(),
            n => format!(" ({n} of the 80 stores before the leaves failed)"),
        }
    );
}

/// Per-call time of `f`: the median over 7 batches of about 50 ms each, in µs.
fn per_call(mut f: impl FnMut()) -> f64 {
    let t = Instant::now();
    for _ in 0..100 {
        f();
    }
    let n = ((0.05 / (t.elapsed().as_secs_f64() / 100.0)) as usize).max(100);
    let mut batches: Vec<f64> = (0..7)
        .map(|_| {
            let t = Instant::now();
            for _ in 0..n {
                f();
            }
            t.elapsed().as_secs_f64() * 1e6 / n as f64
        })
        .collect();
    batches.sort_by(|a, b| a.partial_cmp(b).unwrap());
    batches[3]
}

/// The per-call cost of the trust checks the DHT now makes, on one core.
fn costs() {
    let mesh = mesh();
    let rng = SystemRandom::new();
    let node = Identity::generate(mesh.name.clone(), &rng).unwrap();
    let trust = mesh.trust(&node);
    let admission = mesh.admission(&node);
    let value = mesh.endorsed(&node, "check");
    let revoked = Revocations::new();
    let verifier = Verifier {
        root: &mesh.root,
        now_ms: unix_millis(),
        revoked: &revoked,
    };
    let parsed = InstanceValue::decode(&value).unwrap();
    let record = &parsed.record;
    // More admitted peers than the per-peer cache holds (4096, cleared when full):
    // visited in turn, every check misses.
    let peers: Vec<(PeerId, Vec<u8>)> = (0..5000)
        .map(|_| {
            let peer = Identity::generate(mesh.name.clone(), &rng).unwrap();
            (peer.id(), mesh.admission(&peer))
        })
        .collect();
    let policy = TrustPolicy(trust.clone());
    // What each DHT frame now carries and is checked for, on top of its message.
    let frame = |admission: &[u8]| {
        let frame = Frame::Dht {
            listen: SocketAddr::from(([127, 0, 0, 1], 40000)),
            admission: admission.to_vec(),
            message: Message::Request {
                id: 7,
                body: Request::FindStep {
                    key: Key::object(b"check", 0),
                    avoid: Vec::new(),
                },
            },
        };
        let bytes = postcard::to_allocvec(&frame).unwrap();
        match postcard::from_bytes::<Frame>(black_box(&bytes)).unwrap() {
            Frame::Dht { admission, .. } => admission,
            _ => unreachable!("a Dht frame was encoded"),
        }
    };
    let key = Key::object(b"check", 0);
    let mut next = 0;
    let rows = [
        (
            "one Ed25519 verification (`verify_statement`, the record's signature)",
            per_call(|| {
                let ok = verify_statement(
                    &record.signer,
                    RECORD_LABEL,
                    &record.body,
                    &record.signature,
                );
                assert!(black_box(ok));
            }),
        ),
        (
            "`Verifier::instance` (decode, 1 grant + 1 record verification)",
            per_call(|| {
                black_box(verifier.instance(black_box(&value), "check").unwrap());
            }),
        ),
        (
            "`TrustPolicy::place` (what the storing node and each holder run per store)",
            per_call(|| {
                black_box(policy.place(&key, black_box(&value)).unwrap());
            }),
        ),
        (
            "`Verifier::admission_of` (decode, id check, 1 verification)",
            per_call(|| {
                black_box(
                    verifier
                        .admission_of(black_box(&admission), &node.id())
                        .unwrap(),
                );
            }),
        ),
        (
            "a `FindStep` frame encoded and decoded, empty admission (as before)",
            per_call(|| {
                black_box(frame(&[]));
            }),
        ),
        (
            "the same frame carrying the admission",
            per_call(|| {
                black_box(frame(&admission));
            }),
        ),
        (
            "the same frame carrying the admission, then `check_peer` (cached)",
            per_call(|| {
                let admission = frame(&admission);
                trust.check_peer(&node.id(), &admission).unwrap();
            }),
        ),
        (
            "`MeshTrust::check_peer`, cached (every frame from a known peer)",
            per_call(|| {
                trust.check_peer(&node.id(), black_box(&admission)).unwrap();
            }),
        ),
        (
            "`MeshTrust::check_peer`, uncached (5,000 peers in turn)",
            per_call(|| {
                let (peer, admission) = &peers[next % peers.len()];
                next += 1;
                trust.check_peer(peer, admission).unwrap();
            }),
        ),
    ];
    println!("| check | µs per call |\n|---|---:|");
    for (what, us) in rows {
        println!("| {what} | {us:.2} |");
    }
    println!(
        "\nSizes: admission {} bytes (carried in every DHT frame, both ways); endorsed value {} bytes (grant chain of 1 + record).\n",
        admission.len(),
        value.len()
    );
}

fn main() {
    let secs: f64 = std::env::args()
        .skip_while(|a| a != "--secs")
        .nth(1)
        .map_or(3.0, |s| s.parse().expect("--secs takes a number"));
    let flag = |name: &str| std::env::args().any(|a| a == name);
    if !flag("--joins-only") {
        costs();
    }
    if flag("--costs-only") {
        return;
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    if flag("--joins-only") {
        runtime.block_on(async {
            println!("| membership | result |\n|---|---|");
            joins(100).await;
            leaves().await;
        });
        return;
    }
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
            for routing in [Routing::Chord, Routing::OneHop] {
                let (f_on, s_on, hops) = random_ids(Security::On, routing, n, secs).await;
                let (f_off, s_off, _) = random_ids(Security::Off, routing, n, secs).await;
                let how = match routing {
                    Routing::Chord => String::new(),
                    Routing::OneHop => ", one-hop routing".into(),
                };
                println!("| find, random ids, {n} nodes{how} (mean {hops:.2} hops) | {} | {} | {} |", fmt(f_on), fmt(f_off), overhead(f_on.0, f_off.0));
                println!("| store, random ids, {n} nodes{how} | {} | {} | {} |", fmt(s_on), fmt(s_off), overhead(s_on.0, s_off.0));
            }
        }
        println!("\n| membership | result |\n|---|---|");
        joins(100).await;
        leaves().await;
    });
}
