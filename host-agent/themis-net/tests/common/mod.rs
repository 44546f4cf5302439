//! What the themis-net test files share: a fresh identity, and a running server that
//! stops when dropped.

use std::net::SocketAddr;
use std::sync::Arc;

use ring::rand::SystemRandom;
use themis_core::{Identity, MeshName};
use themis_net::NetStats;
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

impl Drop for Server {
    fn drop(&mut self) {
        self.task.abort();
    }
}
