//! What peers that are not admitted can make a server hold: a cap on connections in
//! all, a cap per source (an IPv4 address, an IPv6 /64), and room made for newcomers
//! by dropping the oldest connection that has not been *admitted* yet.
//!
//! Authenticated is not admitted: a key agreement proves only that the peer holds
//! the key of its id, and anyone can make a key. A connection is admitted once its
//! [`Handler`](crate::Handler) says a request proved the peer belongs
//! ([`Standing::Admitted`](crate::Standing)); until then it is evictable exactly like
//! one still in its handshake, its frames are limited to
//! [`Limits::max_unadmitted_frame`], and it must prove itself within
//! [`Limits::admission_timeout`]. Admitted connections are what the caps protect.
//!
//! Every refusal and every close a limit causes is counted by reason in
//! [`NetStats::limited`]:
//!
//! | reason | what happened |
//! |---|---|
//! | `over_source_cap` | a new connection from a source that already holds [`Limits::max_per_source`] |
//! | `over_total_cap` | a new connection while [`Limits::max_connections`] admitted connections are open |
//! | `evicted_before_handshake` | the oldest connection in its handshake, closed to admit a new one at the total cap |
//! | `evicted_unadmitted` | the oldest authenticated but not admitted connection, closed likewise |
//! | `handshake_timeout` | no completed key agreement within the handshake deadline |
//! | `oversize_before_handshake` | a frame longer than a handshake message before the key agreement |
//! | `over_source_rate` | a fresh Hello from a source whose bucket ([`Limits::hellos_per_source`]) is empty: closed before any public-key work |
//! | `handshake_budget` | a fresh Hello while the listener's [`Limits::handshake_budget`] is spent (its reserve is for recently admitted sources): closed likewise |
//! | `oversize_unadmitted` | a frame longer than [`Limits::max_unadmitted_frame`] before admission |
//! | `admission_timeout` | no request proved admission within [`Limits::admission_timeout`] of the handshake |
//! | `over_peer_cap` | an admitted connection of a peer that already holds [`Limits::max_per_peer`] admitted ones: closed |
//! | `unadmitted` | a request that did not prove admission (before it), or that the handler refused (after): answered, then closed |
//! | `idle_timeout` | an admitted connection that sent nothing for [`Limits::idle_timeout`] |
//! | `accept_error` | the listener failed to accept (e.g. out of file descriptors); it retries |

use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::net::{IpAddr, Ipv6Addr};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use themis_core::{BudgetConfig, Rate};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Notify;
use tokio::time::{Instant, Sleep};
use tracing::warn;

use crate::NetStats;

/// Bounds on the connections a server holds.
#[derive(Clone, Debug)]
pub struct Limits {
    /// Connections held at once, admitted or not. At the cap a new connection replaces
    /// the oldest one not admitted yet, or is refused if there is none.
    pub max_connections: usize,
    /// Connections held at once from one source ([`source_of`]: an IPv4 address, an
    /// IPv6 /64).
    pub max_per_source: usize,
    /// Admitted connections held at once from one peer id: an admitted node cannot
    /// hold the whole port from many addresses (agents keep one connection to each
    /// peer; the rest is room for reconnects).
    pub max_per_peer: usize,
    /// An admitted connection that sends nothing this long is closed.
    pub idle_timeout: Duration,
    /// An authenticated connection must prove admission (its first request) within
    /// this after its handshake.
    pub admission_timeout: Duration,
    /// Longest request payload before admission, in bytes (the first request must
    /// fit: a server sets it to its protocol's largest request); records up to the
    /// record limit after.
    pub max_unadmitted_frame: usize,
    /// Fresh Hellos (those that would cost a full answer) one source may send.
    pub hellos_per_source: Rate,
    /// Fresh Hellos the listener answers, every source together, with a share
    /// reserved for sources admitted recently.
    pub handshake_budget: BudgetConfig,
}

/// The default [`Limits::max_per_peer`].
pub const DEFAULT_MAX_PER_PEER: usize = 4;

/// The default [`Limits::max_unadmitted_frame`]: 64 KiB.
pub const DEFAULT_MAX_UNADMITTED_FRAME: usize = 64 << 10;

/// The default [`Limits::hellos_per_source`], the sidecar's: far above what pooled
/// connections from one node need (an agent opens about one per peer), far below
/// what a flood sends.
pub const DEFAULT_HELLOS_PER_SOURCE: Rate = Rate {
    per_second: 50,
    burst: 100,
};

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_connections: 1024,
            max_per_source: 32,
            max_per_peer: DEFAULT_MAX_PER_PEER,
            idle_timeout: Duration::from_secs(120),
            admission_timeout: Duration::from_secs(5),
            max_unadmitted_frame: DEFAULT_MAX_UNADMITTED_FRAME,
            hellos_per_source: DEFAULT_HELLOS_PER_SOURCE,
            handshake_budget: BudgetConfig::default(),
        }
    }
}

/// The source a connection from `ip` is counted under: an IPv4 address (an
/// IPv4-mapped IPv6 one too), or the /64 an IPv6 address is in. One IPv6 host
/// commonly holds a whole /64, so counting its addresses one by one would give it
/// 2^64 sources.
pub fn source_of(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V4(_) => ip,
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => IpAddr::V6(Ipv6Addr::from(u128::from(v6) & !((1u128 << 64) - 1))),
        },
    }
}

/// One connection's standing in the [`Gate`], shared between the gate (which may
/// evict it) and the connection's [`Permit`].
struct Slot {
    source: IpAddr,
    released: AtomicBool,
    /// Past its handshake (for the eviction's reason label).
    authenticated: AtomicBool,
    /// The peer it was admitted as (counted in `Held::by_peer`).
    peer: std::sync::OnceLock<themis_core::PeerId>,
    evicted: Notify,
}

#[derive(Default)]
struct Held {
    total: usize,
    by_source: HashMap<IpAddr, usize>,
    by_peer: HashMap<themis_core::PeerId, usize>,
    /// Connections not admitted yet (in their handshake or after it), oldest first.
    unadmitted: BTreeMap<u64, Arc<Slot>>,
    next: u64,
}

impl Held {
    fn release(&mut self, slot: &Slot) {
        if slot.released.swap(true, Ordering::Relaxed) {
            return;
        }
        self.total -= 1;
        if let Some(n) = self.by_source.get_mut(&slot.source) {
            *n -= 1;
            if *n == 0 {
                self.by_source.remove(&slot.source);
            }
        }
        if let Some(peer) = slot.peer.get() {
            if let Some(n) = self.by_peer.get_mut(peer) {
                *n -= 1;
                if *n == 0 {
                    self.by_peer.remove(peer);
                }
            }
        }
    }
}

/// Admits connections within [`Limits`], counting what it refuses in a [`NetStats`].
pub struct Gate {
    limits: Limits,
    stats: Arc<NetStats>,
    held: Mutex<Held>,
}

/// A connection's place within the limits; dropping it frees the place.
pub struct Permit {
    gate: Arc<Gate>,
    seq: u64,
    slot: Arc<Slot>,
}

impl Gate {
    /// A gate enforcing `limits`, counting in `stats`.
    pub fn new(limits: Limits, stats: Arc<NetStats>) -> Arc<Gate> {
        Arc::new(Gate {
            limits,
            stats,
            held: Mutex::default(),
        })
    }

    /// The limits enforced.
    pub fn limits(&self) -> &Limits {
        &self.limits
    }

    /// The counters refusals are counted in.
    pub fn stats(&self) -> &Arc<NetStats> {
        &self.stats
    }

    /// A place for a new connection from `ip`, or `None` (counted) if it must be
    /// refused. At the total cap, the oldest connection not admitted yet is told to
    /// close ([`Permit::evicted`]) and the new one takes its place.
    pub fn admit(self: &Arc<Self>, ip: IpAddr) -> Option<Permit> {
        let source = source_of(ip);
        let mut held = self.held.lock().expect("never poisoned");
        if held.by_source.get(&source).copied().unwrap_or(0) >= self.limits.max_per_source {
            drop(held);
            self.stats.limited("over_source_cap");
            return None;
        }
        if held.total >= self.limits.max_connections.max(1) {
            let Some((_, oldest)) = held.unadmitted.pop_first() else {
                drop(held);
                self.stats.limited("over_total_cap");
                return None;
            };
            held.release(&oldest);
            oldest.evicted.notify_one();
            self.stats
                .limited(match oldest.authenticated.load(Ordering::Relaxed) {
                    true => "evicted_unadmitted",
                    false => "evicted_before_handshake",
                });
        }
        held.total += 1;
        *held.by_source.entry(source).or_default() += 1;
        let seq = held.next;
        held.next += 1;
        let slot = Arc::new(Slot {
            source,
            released: AtomicBool::new(false),
            authenticated: AtomicBool::new(false),
            peer: std::sync::OnceLock::new(),
            evicted: Notify::new(),
        });
        held.unadmitted.insert(seq, slot.clone());
        self.stats.set_connections(held.total as u64);
        Some(Permit {
            gate: self.clone(),
            seq,
            slot,
        })
    }

    /// Accepts the next connection on `listener` that the limits admit; refused ones
    /// are closed at once. Accept errors (such as running out of file descriptors)
    /// are logged, counted and retried after a pause, never returned.
    pub async fn accept(
        self: &Arc<Self>,
        listener: &TcpListener,
    ) -> (TcpStream, std::net::SocketAddr, Permit) {
        loop {
            match listener.accept().await {
                Ok((tcp, from)) => {
                    if let Some(permit) = self.admit(from.ip()) {
                        return (tcp, from, permit);
                    }
                    // Dropped: closed without a byte read.
                }
                Err(error) => {
                    warn!(%error, "accepting a connection failed; retrying");
                    self.stats.limited("accept_error");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
        }
    }
}

impl Permit {
    /// The connection completed its key agreement; it stays evictable until
    /// [`Permit::admitted`]. `false` if it was evicted meanwhile (then it must close).
    pub fn authenticated(&self) -> bool {
        let _held = self.gate.held.lock().expect("never poisoned");
        self.slot.authenticated.store(true, Ordering::Relaxed);
        !self.slot.released.load(Ordering::Relaxed)
    }

    /// The peer `peer` proved it belongs: the connection can no longer be evicted to
    /// make room. `false` if it was evicted meanwhile, or if `peer` already holds
    /// [`Limits::max_per_peer`] admitted connections (counted `over_peer_cap`): then
    /// it must close.
    pub fn admitted_as(&self, peer: themis_core::PeerId) -> bool {
        let mut held = self.gate.held.lock().expect("never poisoned");
        if self.slot.released.load(Ordering::Relaxed) {
            return false;
        }
        let n = held.by_peer.entry(peer).or_default();
        if *n >= self.gate.limits.max_per_peer.max(1) {
            drop(held);
            self.gate.stats.limited("over_peer_cap");
            return false;
        }
        *n += 1;
        let _ = self.slot.peer.set(peer);
        held.unadmitted.remove(&self.seq);
        true
    }

    /// The connection needs no proof (an HTTP server's): it can no longer be evicted
    /// to make room. `false` if it was evicted meanwhile (then it must close).
    pub fn admitted(&self) -> bool {
        let mut held = self.gate.held.lock().expect("never poisoned");
        held.unadmitted.remove(&self.seq);
        !self.slot.released.load(Ordering::Relaxed)
    }

    /// The source the connection counts under ([`source_of`]).
    pub fn source(&self) -> IpAddr {
        self.slot.source
    }

    /// Resolves when the gate evicts this connection to make room for a new one.
    pub async fn evicted(&self) {
        self.slot.evicted.notified().await;
    }
}

impl Drop for Permit {
    fn drop(&mut self) {
        let mut held = self.gate.held.lock().expect("never poisoned");
        held.unadmitted.remove(&self.seq);
        held.release(&self.slot);
        self.gate.stats.set_connections(held.total as u64);
    }
}

/// A connection that fails its reads with [`std::io::ErrorKind::TimedOut`] once
/// nothing has been read or written for `idle`, and holds its [`Permit`] while it
/// lives: for servers (such as an HTTP server) that own the reads themselves.
pub struct Guarded<S> {
    io: S,
    idle: Duration,
    timer: Pin<Box<Sleep>>,
    stats: Arc<NetStats>,
    _permit: Permit,
}

impl<S> Guarded<S> {
    /// Wraps `io`, idle-limited by the gate's [`Limits::idle_timeout`].
    pub fn new(io: S, permit: Permit) -> Self {
        let idle = permit.gate.limits.idle_timeout;
        let stats = permit.gate.stats.clone();
        // An HTTP server has no handshake and no admission: a connection counts as
        // admitted (and cannot be evicted) from the start; the idle timeout bounds it.
        permit.admitted();
        Guarded {
            io,
            idle,
            timer: Box::pin(tokio::time::sleep(idle)),
            stats,
            _permit: permit,
        }
    }

    fn active(&mut self) {
        self.timer.as_mut().reset(Instant::now() + self.idle);
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Guarded<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        match Pin::new(&mut this.io).poll_read(cx, buf) {
            Poll::Ready(result) => {
                this.active();
                Poll::Ready(result)
            }
            Poll::Pending => match this.timer.as_mut().poll(cx) {
                Poll::Ready(()) => {
                    this.stats.limited("idle_timeout");
                    // Counted once: the connection is over.
                    this.timer
                        .as_mut()
                        .reset(Instant::now() + Duration::from_secs(3600));
                    Poll::Ready(Err(std::io::ErrorKind::TimedOut.into()))
                }
                Poll::Pending => Poll::Pending,
            },
        }
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Guarded<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let this = self.get_mut();
        let result = Pin::new(&mut this.io).poll_write(cx, buf);
        if result.is_ready() {
            this.active();
        }
        result
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_shutdown(cx)
    }
}
