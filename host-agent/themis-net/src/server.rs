//! Answering requests from authenticated peers, admitting connections (see
//! [`crate::limits`]) only once a request proved the peer belongs.

use std::collections::BTreeMap;
use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use bytes::BytesMut;
use themis_core::guard::DEFAULT_SOURCE_ENTRIES;
use themis_core::{
    Admission, HandshakeBudget, HelloGuard, Identity, SessionInfo, SourceLimiter, WireError,
};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Notify, Semaphore};
use tracing::{debug, warn};

use crate::limits::{Gate, Limits, Permit};
use crate::stream::{accept_charged, now_ms};
use crate::{Config, NetError, SecureReader, SecureWriter};

/// Requests handled at once on one connection; more wait (back-pressure on the peer).
const MAX_IN_FLIGHT_PER_CONNECTION: usize = 64;

/// What a request proved about the peer that sent it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Standing {
    /// The peer belongs (for the agent: the request carried a valid admission from
    /// the mesh root): the connection is admitted.
    Admitted,
    /// Nothing either way (e.g. the request was malformed): an admitted connection
    /// stays open; one not admitted yet is closed after the answer.
    Unproven,
    /// The peer does not belong: answered, then closed.
    Refused,
}

/// A handler's response to one request and what the request proved.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Answer {
    /// The response payload.
    pub payload: Vec<u8>,
    /// What the request proved about its sender.
    pub standing: Standing,
}

/// A bare payload: for servers where holding a key is all it takes to belong (any
/// authenticated peer is admitted).
impl From<Vec<u8>> for Answer {
    fn from(payload: Vec<u8>) -> Self {
        Answer {
            payload,
            standing: Standing::Admitted,
        }
    }
}

/// Answers one request from an authenticated peer.
pub trait Handler: Send + Sync + 'static {
    /// The response to `request` from `peer`, and what the request proved.
    fn handle(
        &self,
        peer: Arc<SessionInfo>,
        request: BytesMut,
    ) -> impl Future<Output = Answer> + Send;
}

impl<F, Fut, R> Handler for F
where
    F: Fn(Arc<SessionInfo>, BytesMut) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = R> + Send,
    R: Into<Answer>,
{
    fn handle(
        &self,
        peer: Arc<SessionInfo>,
        request: BytesMut,
    ) -> impl Future<Output = Answer> + Send {
        let answer = self(peer, request);
        async move { answer.await.into() }
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

    /// Admitted connections a server has open now.
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
/// What a peer that is not admitted can make the server hold or do is bounded (see
/// [`crate::limits`]): connections by `limits` (in all and per source), the time to
/// complete the key agreement by `config.handshake_timeout`, the bytes buffered before
/// it by the size of a handshake message; the public-key work of a handshake by a
/// token bucket per source and the listener's budget (with a reserve for sources
/// admitted recently), charged only for fresh Hellos; after the handshake, one request
/// at a time of at most `limits.max_unadmitted_frame` bytes, within
/// `limits.admission_timeout`, until the handler answers one with
/// [`Standing::Admitted`]. Anything else before that closes the connection. An
/// admitted connection silent for `limits.idle_timeout` is closed. Each of these is
/// counted by reason in [`NetStats::limits`]. One [`HelloGuard`] serves the whole
/// listener: a Hello replayed to it, on any connection, is refused at message 1
/// before any public-key work (counted as a `handshake` failure), as is one outside
/// the freshness window.
pub async fn serve_with<H: Handler>(
    listener: TcpListener,
    me: Arc<Identity>,
    config: Config,
    limits: Limits,
    handler: Arc<H>,
    stats: Arc<NetStats>,
) -> std::io::Result<()> {
    let gate = Gate::new(limits, stats.clone());
    let guard = Arc::new(Mutex::new(HelloGuard::default()));
    let budget = Arc::new(Mutex::new(Budget::new(gate.limits())));
    loop {
        let (tcp, from, permit) = gate.accept(&listener).await;
        let connection = Connection {
            me: me.clone(),
            config: config.clone(),
            limits: gate.limits().clone(),
            handler: handler.clone(),
            stats: stats.clone(),
            guard: guard.clone(),
            budget: budget.clone(),
            from,
            permit,
        };
        tokio::spawn(connection.run(tcp));
    }
}

/// The listener's handshake budgets: a bucket per source and the shared budget.
struct Budget {
    sources: SourceLimiter,
    shared: HandshakeBudget,
}

impl Budget {
    fn new(limits: &Limits) -> Self {
        Budget {
            sources: SourceLimiter::new(limits.hellos_per_source, DEFAULT_SOURCE_ENTRIES),
            shared: HandshakeBudget::new(limits.handshake_budget),
        }
    }

    /// Charges a fresh Hello from `source`: its own bucket first (so that one source
    /// cannot drain the shared budget), then the listener's.
    fn charge(&mut self, source: IpAddr, now_ms: u64) -> Result<Admission, NetError> {
        if !self.sources.allow(source, now_ms) {
            return Err(NetError::Busy("over_source_rate"));
        }
        match self.shared.allow(source, now_ms) {
            Admission::Busy => Err(NetError::Busy("handshake_budget")),
            admission => Ok(admission),
        }
    }
}

/// One accepted connection and what it shares with the listener.
struct Connection<H> {
    me: Arc<Identity>,
    config: Config,
    limits: Limits,
    handler: Arc<H>,
    stats: Arc<NetStats>,
    guard: Arc<Mutex<HelloGuard>>,
    budget: Arc<Mutex<Budget>>,
    from: SocketAddr,
    permit: Permit,
}

impl<H: Handler> Connection<H> {
    async fn run(self, tcp: TcpStream) {
        let Connection {
            me,
            config,
            limits,
            handler,
            stats,
            guard,
            budget,
            from,
            permit,
        } = self;
        let source = permit.source();
        let charge = || {
            budget
                .lock()
                .expect("never poisoned: no panics under the lock")
                .charge(source, now_ms())
                .map(drop)
        };
        let accepted = tokio::select! {
            accepted = accept_charged(&me, tcp, &config, &guard, charge) => accepted,
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
                    NetError::Busy(reason) => stats.limited(reason),
                    _ => {}
                }
                return;
            }
        };
        stats.handshake_done();
        let (info, mut reader, mut writer) = stream.into_split();
        let info = Arc::new(info);
        debug!(%from, peer = %info.peer_id, "authenticated");

        // Until admitted: one small request at a time, within the admission deadline,
        // evictable; the first answer that is not `Admitted` closes the connection.
        reader.limit_payload(limits.max_unadmitted_frame);
        let admitted = tokio::select! {
            admitted = prove_admission(&mut reader, &mut writer, &info, &*handler, &limits, &stats, from) => admitted,
            () = permit.evicted() => {
                debug!(%from, peer = %info.peer_id, "closed a connection not admitted yet to admit a new one");
                false
            }
        };
        if !admitted || !permit.admitted_as(info.peer_id) {
            return;
        }
        budget
            .lock()
            .expect("never poisoned: no panics under the lock")
            .shared
            .confirmed(source, now_ms());
        reader.unlimit_payload();
        stats.open.fetch_add(1, Ordering::Relaxed);
        serve_admitted(reader, writer, info, handler, &limits, &stats, from).await;
        stats.open.fetch_sub(1, Ordering::Relaxed);
        drop(permit);
    }
}

/// Reads requests from a connection not admitted yet, one at a time, until one is
/// answered [`Standing::Admitted`] (`true`); anything else closes it (`false`),
/// counted.
async fn prove_admission<H: Handler>(
    reader: &mut SecureReader,
    writer: &mut SecureWriter,
    info: &Arc<SessionInfo>,
    handler: &H,
    limits: &Limits,
    stats: &NetStats,
    from: SocketAddr,
) -> bool {
    let request = match tokio::time::timeout(limits.admission_timeout, reader.recv()).await {
        Ok(Ok(Some(request))) => request,
        Ok(Ok(None)) => return false,
        Ok(Err(error)) => {
            warn!(%from, peer = %info.peer_id, %error, "dropped a connection not admitted yet");
            stats.failed(&error);
            if let NetError::Wire(WireError::TooLarge { .. }) = error {
                stats.limited("oversize_unadmitted");
            }
            return false;
        }
        Err(_) => {
            debug!(%from, peer = %info.peer_id, "no admission in time");
            stats.limited("admission_timeout");
            return false;
        }
    };
    stats.request_done();
    let answer = handler.handle(info.clone(), request.payload).await;
    // A failed write means the connection is gone.
    let sent = writer
        .send(&answer.payload, Some(request.seq))
        .await
        .is_ok();
    if answer.standing != Standing::Admitted {
        debug!(%from, peer = %info.peer_id, standing = ?answer.standing, "closed a connection that did not prove admission");
        stats.limited("unadmitted");
        return false;
    }
    sent
}

/// Answers an admitted connection's requests, concurrently, until it closes, goes
/// idle, or a request is answered [`Standing::Refused`].
async fn serve_admitted<H: Handler>(
    mut reader: SecureReader,
    writer: SecureWriter,
    info: Arc<SessionInfo>,
    handler: Arc<H>,
    limits: &Limits,
    stats: &Arc<NetStats>,
    from: SocketAddr,
) {
    let writer = Arc::new(tokio::sync::Mutex::new(writer));
    let in_flight = Arc::new(Semaphore::new(MAX_IN_FLIGHT_PER_CONNECTION));
    let refused = Arc::new(Notify::new());
    loop {
        let received = tokio::select! {
            received = tokio::time::timeout(limits.idle_timeout, reader.recv()) => received,
            () = refused.notified() => {
                debug!(%from, peer = %info.peer_id, "closed a connection whose peer was refused");
                stats.limited("unadmitted");
                break;
            }
        };
        let request = match received {
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
        let (info, writer, handler, refused) = (
            info.clone(),
            writer.clone(),
            handler.clone(),
            refused.clone(),
        );
        tokio::spawn(async move {
            let answer = handler.handle(info, request.payload).await;
            // A failed write means the connection is gone; its reader sees that.
            let _ = writer
                .lock()
                .await
                .send(&answer.payload, Some(request.seq))
                .await;
            if answer.standing == Standing::Refused {
                // Stored if the reader is not waiting: it sees it on its next turn.
                refused.notify_one();
            }
            drop(permit);
        });
    }
}
