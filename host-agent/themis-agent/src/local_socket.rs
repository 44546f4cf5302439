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

/// What counts against the per-caller cap: the caller's cgroup, or its uid where the
/// cgroup is unknown (a caller that exited at once, say), so that unknown callers do
/// not share one share.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
enum Key {
    Cgroup(PathBuf),
    Uid(Option<u32>),
}

#[derive(Default)]
struct Held {
    total: usize,
    by_caller: HashMap<Key, usize>,
}

/// The caps, apart from any socket.
struct Caps {
    held: Arc<Mutex<Held>>,
    total: usize,
    per_caller: usize,
    /// The agent's own cgroup: its callers (the operator's shell, the readiness probe)
    /// are held to their own share, not to the total, so pods filling the total
    /// cannot lock the operator out.
    own_cgroup: Option<PathBuf>,
}

impl Caps {
    fn admit(&self, caller: &Option<Caller>) -> Option<Slot> {
        let cgroup = caller.as_ref().and_then(|c| c.cgroup.clone());
        let own = cgroup.is_some() && cgroup == self.own_cgroup;
        let key = match cgroup {
            Some(cgroup) => Key::Cgroup(cgroup),
            None => Key::Uid(caller.as_ref().map(|c| c.uid)),
        };
        let mut held = self.held.lock().unwrap_or_else(|p| p.into_inner());
        let mine = held.by_caller.get(&key).copied().unwrap_or(0);
        if (held.total >= self.total && !own) || mine >= self.per_caller {
            return None;
        }
        held.total += 1;
        *held.by_caller.entry(key.clone()).or_default() += 1;
        Some(Slot {
            held: self.held.clone(),
            key,
        })
    }
}

/// The local API's listener, for `axum::serve`.
pub struct AttestedListener {
    listener: UnixListener,
    caps: Caps,
    metrics: Arc<Metrics>,
}

impl AttestedListener {
    /// Wraps `listener` with the default caps; callers in exactly `own_cgroup` (the
    /// agent's) are not held to the total.
    pub fn new(listener: UnixListener, metrics: Arc<Metrics>, own_cgroup: Option<PathBuf>) -> Self {
        AttestedListener {
            listener,
            caps: Caps {
                held: Arc::default(),
                total: MAX_CONNECTIONS,
                per_caller: MAX_PER_CGROUP,
                own_cgroup,
            },
            metrics,
        }
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
        if let Some(n) = held.by_caller.get_mut(&self.key) {
            *n -= 1;
            if *n == 0 {
                held.by_caller.remove(&self.key);
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
                    match self.caps.admit(&caller) {
                        Some(slot) => {
                            let attested = Attested {
                                io,
                                caller,
                                _slot: slot,
                            };
                            return (attested, addr);
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

#[cfg(test)]
mod tests {
    use super::*;

    fn caller(uid: u32, cgroup: Option<&str>) -> Option<Caller> {
        Some(Caller {
            pid: Some(42),
            uid,
            gid: uid,
            cgroup: cgroup.map(PathBuf::from),
        })
    }

    /// Pods filling the total (each container its own cgroup, each at its own cap) do
    /// not lock the operator out; unknown callers are counted by uid, not all together.
    #[test]
    fn the_operator_gets_in_when_pods_hold_the_total() {
        let caps = Caps {
            held: Arc::default(),
            total: 4,
            per_caller: 2,
            own_cgroup: Some("/sys/fs/cgroup/themis-agent".into()),
        };
        let mut slots = Vec::new();
        for container in ["c1", "c2"] {
            let pod = caller(
                0,
                Some(&format!("/sys/fs/cgroup/kubepods/pod-x/{container}")),
            );
            for _ in 0..2 {
                slots.push(caps.admit(&pod).expect("within its share"));
            }
            assert!(caps.admit(&pod).is_none(), "over its share");
        }
        let other_pod = caller(1337, Some("/sys/fs/cgroup/kubepods/pod-y/proxy"));
        assert!(caps.admit(&other_pod).is_none(), "the total is full");
        let operator = caller(0, Some("/sys/fs/cgroup/themis-agent"));
        slots.push(caps.admit(&operator).expect("the agent's own cgroup"));
        slots.push(caps.admit(&operator).expect("within its own share"));
        assert!(caps.admit(&operator).is_none(), "still held to its share");

        // Unknown cgroups: one share per uid.
        slots.clear();
        let gone = |uid| caller(uid, None);
        slots.push(caps.admit(&gone(1000)).unwrap());
        slots.push(caps.admit(&gone(1000)).unwrap());
        assert!(caps.admit(&gone(1000)).is_none());
        assert!(
            caps.admit(&gone(1001)).is_some(),
            "another uid has its own share"
        );
    }
}
