//! Answering requests from authenticated peers.

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use bytes::BytesMut;
use themis_core::{HelloGuard, Identity, SessionInfo, WireError};
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tracing::{debug, warn};

use crate::limits::{Gate, Limits};
use crate::{accept, Config, NetError};

/// Requests handled at once on one connection; more wait (back-pressure on the peer).
const MAX_IN_FLIGHT_PER_CONNECTION: usize = 64;

/// Answers one request from an authenticated peer with the response payload.
pub trait Handler: Send + Sync + 'static {
    /// The response to `request` from `peer`.
    fn handle(
        &self,
        peer: Arc<SessionInfo>,
        request: BytesMut,
    ) -> impl Future<Output = Vec<u8>> + Send;
}

impl<F, Fut> Handler for F
where
    F: Fn(Arc<SessionInfo>, BytesMut) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Vec<u8>> + Send,
{
    fn handle(
        &self,
        peer: Arc<SessionInfo>,
        request: BytesMut,
    ) -> impl Future<Output = Vec<u8>> + Send {
        self(peer, request)
    }
}

/// What a server or a [`Client`](crate::Client) has seen, for metrics.
#[derive(Debug, Default)]
pub struct NetStats {
    handshakes: AtomicU64,
    requests: AtomicU64,
    open: AtomicU64,
    connections: AtomicU64,
    failures: Mutex<BTreeMap<&'static str, u64>>,
    limited: Mutex<BTreeMap<&'static str, u64>>,
}

impl NetStats {
    /// Completed key agreements (accepted by a server, initiated by a client).
    pub fn handshakes(&self) -> u64 {
        self.handshakes.load(Ordering::Relaxed)
    }

    /// Requests received (server) or sent (client) on authenticated connections.
    pub fn requests(&self) -> u64 {
        self.requests.load(Ordering::Relaxed)
    }

    /// Authenticated connections a server has open now.
    pub fn open_connections(&self) -> u64 {
        self.open.load(Ordering::Relaxed)
    }

    /// Connections a server holds now, authenticated or still in their handshake.
    pub fn connections(&self) -> u64 {
        self.connections.load(Ordering::Relaxed)
    }

    /// Connections refused or closed by a limit, by reason (see [`crate::Gate`]).
    pub fn limits(&self) -> BTreeMap<&'static str, u64> {
        self.limited
            .lock()
            .expect("never poisoned: no panics under the lock")
            .clone()
    }

    pub(crate) fn limited(&self, reason: &'static str) {
        *self
            .limited
            .lock()
            .expect("never poisoned")
            .entry(reason)
            .or_default() += 1;
    }

    pub(crate) fn set_connections(&self, n: u64) {
        self.connections.store(n, Ordering::Relaxed);
    }

    /// Rejected handshakes and records, by [`NetError::reason`].
    pub fn failures(&self) -> BTreeMap<&'static str, u64> {
        self.failures
            .lock()
            .expect("never poisoned: no panics under the lock")
            .clone()
    }

    pub(crate) fn handshake_done(&self) {
        self.handshakes.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn request_done(&self) {
        self.requests.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn failed(&self, error: &NetError) {
        *self
            .failures
            .lock()
            .expect("never poisoned")
            .entry(error.reason())
            .or_default() += 1;
    }
}

/// Accepts connections on `listener` forever within the default [`Limits`]; see
/// [`serve_with`].
pub async fn serve<H: Handler>(
    listener: TcpListener,
    me: Arc<Identity>,
    config: Config,
    handler: Arc<H>,
    stats: Arc<NetStats>,
) -> std::io::Result<()> {
    serve_with(listener, me, config, Limits::default(), handler, stats).await
}

/// Accepts connections on `listener` forever, authenticating each peer and answering
/// its requests with `handler`. A peer that fails the handshake or sends a bad record
/// is logged, counted in `stats` and disconnected; the server keeps serving. Stop it
/// by dropping (aborting) its task.
///
/// What an unauthenticated peer can make the server hold is bounded: connections by
/// `limits` (in all and per source address), the time to complete the key agreement
/// by `config.handshake_timeout`, and the bytes buffered before it by the size of a
/// handshake message. An authenticated connection silent for `limits.idle_timeout` is
/// closed. Each of these is counted by reason in [`NetStats::limits`]. One
/// [`HelloGuard`] serves the whole listener: a Hello replayed to it, on any
/// connection, is refused at message 1 before any public-key work (counted as a
/// `handshake` failure), as is one outside the freshness window.
pub async fn serve_with<H: Handler>(
    listener: TcpListener,
    me: Arc<Identity>,
    config: Config,
    limits: Limits,
    handler: Arc<H>,
    stats: Arc<NetStats>,
) -> std::io::Result<()> {
    let gate = Gate::new(limits, stats.clone());
    let idle_timeout = gate.limits().idle_timeout;
    let guard = Arc::new(Mutex::new(HelloGuard::default()));
    loop {
        let (tcp, from, permit) = gate.accept(&listener).await;
        let (me, config, handler, stats, guard) = (
            me.clone(),
            config.clone(),
            handler.clone(),
            stats.clone(),
            guard.clone(),
        );
        tokio::spawn(async move {
            let accepted = tokio::select! {
                accepted = accept(&me, tcp, &config, &guard) => accepted,
                () = permit.evicted() => {
                    debug!(%from, "closed a connection still in its handshake to admit a new one");
                    return;
                }
            };
            let stream = match accepted {
                Ok(stream) if permit.authenticated() => stream,
                Ok(_) => return,
                Err(error) => {
                    warn!(%from, %error, "rejected a connection");
                    stats.failed(&error);
                    match error {
                        NetError::Timeout(_) => stats.limited("handshake_timeout"),
                        NetError::Wire(WireError::TooLarge { .. }) => {
                            stats.limited("oversize_before_handshake")
                        }
                        _ => {}
                    }
                    return;
                }
            };
            stats.handshake_done();
            stats.open.fetch_add(1, Ordering::Relaxed);
            let (info, mut reader, writer) = stream.into_split();
            debug!(%from, peer = %info.peer_id, "authenticated");
            let (info, writer) = (Arc::new(info), Arc::new(tokio::sync::Mutex::new(writer)));
            let in_flight = Arc::new(Semaphore::new(MAX_IN_FLIGHT_PER_CONNECTION));
            loop {
                let request = match tokio::time::timeout(idle_timeout, reader.recv()).await {
                    Ok(Ok(Some(request))) => request,
                    Ok(Ok(None)) => break,
                    Ok(Err(error)) => {
                        warn!(%from, peer = %info.peer_id, %error, "dropped a connection");
                        stats.failed(&error);
                        break;
                    }
                    Err(_) => {
                        debug!(%from, peer = %info.peer_id, "closed an idle connection");
                        stats.limited("idle_timeout");
                        break;
                    }
                };
                stats.request_done();
                let permit = in_flight
                    .clone()
                    .acquire_owned()
                    .await
                    .expect("never closed");
                let (info, writer, handler) = (info.clone(), writer.clone(), handler.clone());
                tokio::spawn(async move {
                    let response = handler.handle(info, request.payload).await;
                    // A failed write means the connection is gone; its reader sees that.
                    let _ = writer.lock().await.send(&response, Some(request.seq)).await;
                    drop(permit);
                });
            }
            stats.open.fetch_sub(1, Ordering::Relaxed);
            drop(permit);
        });
    }
}
