//! Requests to peers by id, over a bounded pool of authenticated connections.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::BytesMut;
use themis_core::{Identity, PeerId};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tracing::debug;

use crate::{connect, Config, NetError, NetStats, SecureReader, SecureWriter};

/// Settings of a [`Client`].
#[derive(Clone, Debug)]
pub struct ClientConfig {
    /// Settings of each connection.
    pub connection: Config,
    /// Connections kept open at most; the least recently used goes first.
    pub max_connections: usize,
    /// A connection unused this long is closed.
    pub idle_timeout: Duration,
    /// How long a request waits for its response.
    pub request_timeout: Duration,
}

impl Default for ClientConfig {
    fn default() -> Self {
        ClientConfig {
            connection: Config::default(),
            max_connections: 256,
            idle_timeout: Duration::from_secs(60),
            request_timeout: Duration::from_secs(10),
        }
    }
}

/// Sends requests to peers by id. One connection per peer carries any number of
/// concurrent requests; responses are matched to requests by their sealed `reply_to`,
/// so they may come back in any order.
pub struct Client {
    me: Arc<Identity>,
    config: ClientConfig,
    pool: tokio::sync::Mutex<HashMap<PeerId, Arc<Connection>>>,
    stats: Arc<NetStats>,
}

type Pending = Mutex<HashMap<u64, oneshot::Sender<BytesMut>>>;

struct Connection {
    addr: SocketAddr,
    writer: tokio::sync::Mutex<SecureWriter>,
    pending: Arc<Pending>,
    alive: Arc<AtomicBool>,
    last_used: Mutex<Instant>,
    reader: JoinHandle<()>,
}

impl Drop for Connection {
    fn drop(&mut self) {
        self.reader.abort();
    }
}

impl Connection {
    fn idle_for(&self, now: Instant) -> Duration {
        now.saturating_duration_since(*self.last_used.lock().expect("never poisoned"))
    }
}

impl Client {
    /// A client sending as `me`.
    pub fn new(me: Arc<Identity>, config: ClientConfig) -> Self {
        Client {
            me,
            config,
            pool: Default::default(),
            stats: Default::default(),
        }
    }

    /// Handshakes made, requests sent and failures by reason, for metrics.
    pub fn stats(&self) -> &NetStats {
        &self.stats
    }

    /// Sends `payload` to the peer `peer` at `addr` and returns its response. Connects
    /// (and authenticates `peer`) if there is no live connection to it.
    pub async fn request(
        &self,
        peer: PeerId,
        addr: SocketAddr,
        payload: &[u8],
    ) -> Result<BytesMut, NetError> {
        let result = self.request_inner(peer, addr, payload).await;
        match &result {
            Ok(_) => self.stats.request_done(),
            Err(error) => self.stats.failed(error),
        }
        result
    }

    async fn request_inner(
        &self,
        peer: PeerId,
        addr: SocketAddr,
        payload: &[u8],
    ) -> Result<BytesMut, NetError> {
        let connection = self.connection(peer, addr).await?;
        let (tx, rx) = oneshot::channel();
        let seq = {
            let mut writer = connection.writer.lock().await;
            let pending = &connection.pending;
            writer
                .send_then(payload, None, |seq| {
                    pending.lock().expect("never poisoned").insert(seq, tx);
                })
                .await?
        };
        match tokio::time::timeout(self.config.request_timeout, rx).await {
            Ok(Ok(response)) => Ok(response),
            // The reader ended: the connection closed or carried a bad record.
            Ok(Err(_)) => Err(NetError::Closed),
            Err(_) => {
                connection
                    .pending
                    .lock()
                    .expect("never poisoned")
                    .remove(&seq);
                Err(NetError::Timeout("waiting for the response"))
            }
        }
    }

    /// Open connections.
    pub async fn connections(&self) -> usize {
        self.pool.lock().await.len()
    }

    async fn connection(
        &self,
        peer: PeerId,
        addr: SocketAddr,
    ) -> Result<Arc<Connection>, NetError> {
        // Held while connecting: one handshake per peer, never two racing.
        let mut pool = self.pool.lock().await;
        let now = Instant::now();
        pool.retain(|_, c| {
            c.alive.load(Ordering::Relaxed) && c.idle_for(now) < self.config.idle_timeout
        });
        if let Some(c) = pool.get(&peer).filter(|c| c.addr == addr) {
            *c.last_used.lock().expect("never poisoned") = now;
            return Ok(c.clone());
        }
        while pool.len() >= self.config.max_connections.max(1) {
            let oldest = *pool
                .iter()
                .max_by_key(|(_, c)| c.idle_for(now))
                .expect("not empty")
                .0;
            pool.remove(&oldest);
        }
        let stream = connect(&self.me, addr, peer, &self.config.connection).await?;
        self.stats.handshake_done();
        debug!(%peer, %addr, "connected");
        let (_, reader, writer) = stream.into_split();
        let (pending, alive) = (
            Arc::new(Pending::default()),
            Arc::new(AtomicBool::new(true)),
        );
        let connection = Arc::new(Connection {
            addr,
            writer: tokio::sync::Mutex::new(writer),
            pending: pending.clone(),
            alive: alive.clone(),
            last_used: Mutex::new(now),
            reader: tokio::spawn(read_responses(reader, pending, alive)),
        });
        pool.insert(peer, connection.clone());
        Ok(connection)
    }
}

/// Delivers each response to the request waiting for it, until the connection ends;
/// then fails every request still waiting.
async fn read_responses(mut reader: SecureReader, pending: Arc<Pending>, alive: Arc<AtomicBool>) {
    while let Ok(Some(response)) = reader.recv().await {
        let waiting = response
            .reply_to
            .and_then(|seq| pending.lock().expect("never poisoned").remove(&seq));
        match waiting {
            Some(tx) => {
                let _ = tx.send(response.payload);
            }
            None => debug!(reply_to = ?response.reply_to, "a response nobody waits for"),
        }
    }
    alive.store(false, Ordering::Relaxed);
    pending.lock().expect("never poisoned").clear();
}
