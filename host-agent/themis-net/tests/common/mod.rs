//! What the themis-net test files share: a fresh identity, a fresh Hello, and a
//! running server that stops when dropped. Each test file uses a part of it.
#![allow(dead_code)]

use std::net::SocketAddr;
use std::sync::Arc;

use ring::rand::SystemRandom;
use themis_core::handshake::Initiator;
use themis_core::{HandshakeConfig, Identity, MeshName, PeerId};
use themis_net::{serve_with, Config, Handler, Limits, NetStats};
use tokio::net::TcpListener;
use tokio::task::JoinHandle;

pub fn identity() -> Arc<Identity> {
    Arc::new(Identity::generate(MeshName::new("net-test").unwrap(), &SystemRandom::new()).unwrap())
}

pub struct Server {
    pub identity: Arc<Identity>,
    pub addr: SocketAddr,
    pub stats: Arc<NetStats>,
    pub task: JoinHandle<std::io::Result<()>>,
}

impl Server {
    /// Serves `handler` on a new loopback listener within `config` and `limits`.
    pub async fn start<H: Handler>(config: Config, limits: Limits, handler: H) -> Server {
        let identity = identity();
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let stats = Arc::new(NetStats::default());
        let task = tokio::spawn(serve_with(
            listener,
            identity.clone(),
            config,
            limits,
            Arc::new(handler),
            stats.clone(),
        ));
        Server {
            identity,
            addr,
            stats,
            task,
        }
    }
}

/// Message 1 from `from` to `to`, dated now.
pub fn hello(from: &Identity, to: PeerId) -> Vec<u8> {
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64;
    Initiator::start(
        from,
        to,
        &HandshakeConfig::default(),
        now_ms,
        &SystemRandom::new(),
    )
    .unwrap()
    .1
}

impl Drop for Server {
    fn drop(&mut self) {
        self.task.abort();
    }
}
