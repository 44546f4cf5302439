//! What unauthenticated peers can make a server hold: a cap on connections in all, a
//! cap per source address, and room made for newcomers by dropping the connection
//! that has waited longest without completing its handshake.
//!
//! Every refusal and every close a limit causes is counted by reason in
//! [`NetStats::limited`]:
//!
//! | reason | what happened |
//! |---|---|
//! | `over_source_cap` | a new connection from an address that already holds [`Limits::max_per_source`] |
//! | `over_total_cap` | a new connection while [`Limits::max_connections`] authenticated connections are open |
//! | `evicted_before_handshake` | the oldest unauthenticated connection, closed to admit a new one at the total cap |
//! | `handshake_timeout` | no completed key agreement within the handshake deadline |
//! | `oversize_before_handshake` | a frame longer than a handshake message before the key agreement |
//! | `idle_timeout` | an authenticated connection that sent nothing for [`Limits::idle_timeout`] |
//! | `accept_error` | the listener failed to accept (e.g. out of file descriptors); it retries |

use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Notify;
use tokio::time::{Instant, Sleep};
use tracing::warn;

use crate::NetStats;

/// Bounds on the connections a server holds.
#[derive(Clone, Debug)]
pub struct Limits {
    /// Connections held at once, authenticated or not. At the cap a new connection
    /// replaces the oldest one still in its handshake, or is refused if there is none.
    pub max_connections: usize,
    /// Connections held at once from one source address.
    pub max_per_source: usize,
    /// An authenticated connection that sends nothing this long is closed.
    pub idle_timeout: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_connections: 1024,
            max_per_source: 32,
            idle_timeout: Duration::from_secs(120),
        }
    }
}

/// One connection's standing in the [`Gate`], shared between the gate (which may
/// evict it) and the connection's [`Permit`].
struct Slot {
    source: IpAddr,
    released: AtomicBool,
    evicted: Notify,
}

#[derive(Default)]
struct Held {
    total: usize,
    by_source: HashMap<IpAddr, usize>,
    /// Connections still in their handshake, oldest first.
    handshaking: BTreeMap<u64, Arc<Slot>>,
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

    /// A place for a new connection from `source`, or `None` (counted) if it must be
    /// refused. At the total cap, the oldest connection still in its handshake is told
    /// to close ([`Permit::evicted`]) and the new one takes its place.
    pub fn admit(self: &Arc<Self>, source: IpAddr) -> Option<Permit> {
        let mut held = self.held.lock().expect("never poisoned");
        if held.by_source.get(&source).copied().unwrap_or(0) >= self.limits.max_per_source {
            drop(held);
            self.stats.limited("over_source_cap");
            return None;
        }
        if held.total >= self.limits.max_connections.max(1) {
            let Some((_, oldest)) = held.handshaking.pop_first() else {
                drop(held);
                self.stats.limited("over_total_cap");
                return None;
            };
            held.release(&oldest);
            oldest.evicted.notify_one();
            self.stats.limited("evicted_before_handshake");
        }
        held.total += 1;
        *held.by_source.entry(source).or_default() += 1;
        let seq = held.next;
        held.next += 1;
        let slot = Arc::new(Slot {
            source,
            released: AtomicBool::new(false),
            evicted: Notify::new(),
        });
        held.handshaking.insert(seq, slot.clone());
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
    /// The connection is authenticated: it can no longer be evicted to make room.
    /// `false` if it was evicted meanwhile (then it must close).
    pub fn authenticated(&self) -> bool {
        let mut held = self.gate.held.lock().expect("never poisoned");
        held.handshaking.remove(&self.seq);
        !self.slot.released.load(Ordering::Relaxed)
    }

    /// Resolves when the gate evicts this connection to make room for a new one.
    pub async fn evicted(&self) {
        self.slot.evicted.notified().await;
    }
}

impl Drop for Permit {
    fn drop(&mut self) {
        let mut held = self.gate.held.lock().expect("never poisoned");
        held.handshaking.remove(&self.seq);
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
        // An HTTP server has no handshake: a connection counts as authenticated (and
        // cannot be evicted) from the start; the idle timeout bounds it instead.
        permit.authenticated();
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
