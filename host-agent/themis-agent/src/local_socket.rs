//! The local API's Unix listener: each connection's caller is read from the kernel
//! once, when it is accepted ([`Caller::of`]), and connections are capped in all and
//! per caller cgroup, so that no pod can hold every connection the agent will take
//! (and with them its file descriptors) while the operator and other pods' sidecars
//! still get in. A connection over a cap is closed at once and counted
//! (`themis_api_refused_total{reason="over_connection_cap"}`).

use std::collections::HashMap;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use axum::extract::connect_info::Connected;
use axum::serve::IncomingStream;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{UnixListener, UnixStream};
use tracing::{debug, warn};

use crate::caller::{Caller, Peer};
use crate::metrics::Metrics;

/// Connections the local API holds at once, from all callers.
pub const MAX_CONNECTIONS: usize = 512;
/// Connections the local API holds at once from one cgroup (a pod's container, the
/// operator's shell): a sidecar needs a handful.
pub const MAX_PER_CGROUP: usize = 64;

/// What counts against the per-caller cap: the caller's cgroup (`None`: unknown).
type Key = Option<PathBuf>;

#[derive(Default)]
struct Held {
    total: usize,
    by_cgroup: HashMap<Key, usize>,
}

/// The local API's listener, for `axum::serve`.
pub struct AttestedListener {
    listener: UnixListener,
    held: Arc<Mutex<Held>>,
    metrics: Arc<Metrics>,
    caps: (usize, usize),
}

impl AttestedListener {
    /// Wraps `listener` with the default caps.
    pub fn new(listener: UnixListener, metrics: Arc<Metrics>) -> Self {
        Self::with_caps(listener, metrics, MAX_CONNECTIONS, MAX_PER_CGROUP)
    }

    /// Wraps `listener`, holding at most `total` connections, `per_cgroup` from one
    /// cgroup.
    pub fn with_caps(
        listener: UnixListener,
        metrics: Arc<Metrics>,
        total: usize,
        per_cgroup: usize,
    ) -> Self {
        AttestedListener {
            listener,
            held: Arc::default(),
            metrics,
            caps: (total, per_cgroup),
        }
    }

    fn admit(&self, caller: &Option<Caller>) -> Option<Slot> {
        let key: Key = caller.as_ref().and_then(|c| c.cgroup.clone());
        let mut held = self.held.lock().unwrap_or_else(|p| p.into_inner());
        let mine = held.by_cgroup.get(&key).copied().unwrap_or(0);
        if held.total >= self.caps.0 || mine >= self.caps.1 {
            return None;
        }
        held.total += 1;
        *held.by_cgroup.entry(key.clone()).or_default() += 1;
        Some(Slot {
            held: self.held.clone(),
            key,
        })
    }
}

/// A connection's place within the caps; freed on drop.
struct Slot {
    held: Arc<Mutex<Held>>,
    key: Key,
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut held = self.held.lock().unwrap_or_else(|p| p.into_inner());
        held.total -= 1;
        if let Some(n) = held.by_cgroup.get_mut(&self.key) {
            *n -= 1;
            if *n == 0 {
                held.by_cgroup.remove(&self.key);
            }
        }
    }
}

/// An accepted connection with its caller, as the kernel identified it.
pub struct Attested {
    io: UnixStream,
    caller: Option<Caller>,
    _slot: Slot,
}

impl axum::serve::Listener for AttestedListener {
    type Io = Attested;
    type Addr = tokio::net::unix::SocketAddr;

    async fn accept(&mut self) -> (Attested, Self::Addr) {
        loop {
            match self.listener.accept().await {
                Ok((io, addr)) => {
                    let caller = Caller::of(&io);
                    match self.admit(&caller) {
                        Some(slot) => {
                            let _ = addr;
                            return (
                                Attested {
                                    io,
                                    caller,
                                    _slot: slot,
                                },
                                self.listener.local_addr().unwrap_or(addr),
                            );
                        }
                        None => {
                            debug!(?caller, "refused a local API connection over its cap");
                            self.metrics.api_refused("over_connection_cap");
                        }
                    }
                }
                Err(error) => {
                    // Out of file descriptors, say: keep serving those we hold.
                    warn!(%error, "accepting a local API connection failed; retrying");
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                }
            }
        }
    }

    fn local_addr(&self) -> std::io::Result<Self::Addr> {
        self.listener.local_addr()
    }
}

impl Connected<IncomingStream<'_, AttestedListener>> for Peer {
    fn connect_info(stream: IncomingStream<'_, AttestedListener>) -> Self {
        Peer(stream.io().caller.clone())
    }
}

impl AsyncRead for Attested {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_read(cx, buf)
    }
}

impl AsyncWrite for Attested {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_shutdown(cx)
    }
}
