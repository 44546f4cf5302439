//! What delegated signing costs the agent (issue 13): per signature, in process
//! (`signing::sign`: decode, checks, digest, Ed25519; and loading the workload's key
//! file, which the handler does per call) and, with `--socket`, through a running
//! agent's API (`POST /v1/workloads/{workload}/sign` over its Unix socket), with that
//! agent's CPU time per signature when `--pid` names it.
//!
//! ```text
//! cargo run --release -p themis-agent --example sign_cost -- [N]
//! cargo run --release -p themis-agent --example sign_cost -- N SOCKET WORKLOAD AGENT_PID
//! ```

use std::time::{Duration, Instant};

use ring::rand::SystemRandom;
use themis_agent::keystore::KeyStore;
use themis_agent::names::WorkloadName;
use themis_agent::signing::{self, SignRequest};
use themis_core::handshake::Initiator;
use themis_core::identity::PublicIdentity;
use themis_core::{HandshakeConfig, Identity, MeshName};

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn request(me: &PublicIdentity, peer: &Identity, rng: &SystemRandom) -> SignRequest {
    let pending =
        Initiator::start_unsigned(me, peer.id(), &HandshakeConfig::default(), now_ms(), rng)
            .unwrap();
    SignRequest {
        kind: "hello".into(),
        body: hex::encode(pending.to_sign().body),
        hello_hash: None,
    }
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

/// utime + stime of `pid`, from /proc (clock ticks of 10 ms on Linux).
fn cpu(pid: &str) -> Duration {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .unwrap()
        .1
        .split_whitespace()
        .collect();
    let ticks: u64 = fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap();
    Duration::from_millis(ticks * 10)
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let n: usize = args.first().map_or(2000, |a| a.parse().unwrap());
    let rng = SystemRandom::new();
    let mesh = MeshName::new("bench").unwrap();
    let dir = tempfile_dir();
    let keys = KeyStore::open(&dir, mesh.clone()).unwrap();
    let workload = WorkloadName::new("check").unwrap();
    let (me, _) = keys.workload(&workload).unwrap();
    let peer = Identity::generate(mesh, &rng).unwrap();
    let req = request(me.public(), &peer, &rng);

    let mut sign = Vec::with_capacity(n);
    let mut load = Vec::with_capacity(n);
    for _ in 0..n {
        let t = Instant::now();
        let signature = signing::sign(&me, &req).unwrap();
        sign.push(t.elapsed());
        std::hint::black_box(signature);
        let t = Instant::now();
        let loaded = keys.existing_workload(&workload).unwrap().unwrap();
        load.push(t.elapsed());
        std::hint::black_box(loaded);
    }
    println!(
        "in process, median of {n}: signing::sign {:?}, key file load {:?}",
        median(sign),
        median(load)
    );
    let _ = std::fs::remove_dir_all(&dir);

    let [_, socket, workload, pid] = args.as_slice() else {
        return;
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let api = themis_agent_client::ApiClient::new(socket);
    let path = format!("/v1/workloads/{workload}/identity");
    let (_, identity) = runtime
        .block_on(api.call(themis_agent_client::Method::GET, &path, None))
        .unwrap();
    let mut key = [0u8; 32];
    hex::decode_to_slice(identity["public_key"].as_str().unwrap(), &mut key).unwrap();
    let mesh = MeshName::new(identity["mesh"].as_str().unwrap()).unwrap();
    let me = PublicIdentity::new(key, mesh);
    let path = format!("/v1/workloads/{workload}/sign");
    let body = serde_json::to_value(request(&me, &peer, &rng)).unwrap();
    let mut rtt = Vec::with_capacity(n);
    let before = cpu(pid);
    for _ in 0..n {
        let t = Instant::now();
        let (status, _) = runtime
            .block_on(api.call(themis_agent_client::Method::POST, &path, Some(&body)))
            .unwrap();
        rtt.push(t.elapsed());
        assert_eq!(status, 200);
    }
    let used = cpu(pid) - before;
    println!(
        "through the agent's API, median of {n}: {:?} per signature; agent CPU {:?} per signature",
        median(rtt),
        used / n as u32
    );
}

fn tempfile_dir() -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("themis-sign-cost-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}
