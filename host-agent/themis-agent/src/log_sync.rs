//! The trust log's gossip (docs/PROTOCOL.md §6.13): every `log_sync_ms`, ask two
//! neighbours in the ring (successors, predecessor and fingers, in turn) for the
//! checkpoint they hold. A consistent one is done with; a newer one brings its leaves,
//! asked for in batches and verified by the copy itself; a contradicting one is a
//! fork, kept as evidence. Any peer serves the log and none is trusted: what it
//! sends either hashes to a root-signed checkpoint on top of what this node holds, or
//! is refused and counted.

use std::net::SocketAddr;
use std::sync::Arc;

use themis_core::PeerId;
use themis_log::{Audit, LogError};
use themis_net::Client;
use tracing::{debug, warn};

use crate::metrics::Metrics;
use crate::overlay::{Frame, Overlay, MAX_LOG_LEAVES};
use crate::trust::MeshTrust;

/// Peers asked per round.
const FANOUT: usize = 2;
/// The most leaves taken from one peer in one round (a log this long takes a few
/// rounds to copy; a peer cannot make a round hold more).
const MAX_LEAVES_PER_ROUND: u64 = 1 << 20;

/// What one exchange with a peer came to (the metrics label).
#[derive(Debug, PartialEq, Eq)]
pub enum Synced {
    /// It had more; the copy grew.
    Grew(u64),
    /// It holds this log or a prefix of it.
    Consistent,
    /// It holds nothing yet, or less.
    Behind,
    /// Could not be asked.
    Unreachable,
    /// Its checkpoint contradicts this copy: the root forked the log.
    Fork,
    /// What it sent does not verify.
    Refused(&'static str),
}

impl Synced {
    fn label(&self) -> String {
        match self {
            Synced::Grew(_) => "grew".into(),
            Synced::Consistent => "consistent".into(),
            Synced::Behind => "behind".into(),
            Synced::Unreachable => "unreachable".into(),
            Synced::Fork => "fork".into(),
            Synced::Refused(reason) => format!("refused_{reason}"),
        }
    }
}

/// The sync's state: who to ask next.
pub struct LogSync {
    client: Arc<Client>,
    overlay: Overlay,
    trust: Arc<MeshTrust>,
    metrics: Arc<Metrics>,
    round: usize,
}

impl LogSync {
    /// The sync of `trust`'s log over `client`, with peers from `overlay`.
    pub fn new(
        client: Arc<Client>,
        overlay: Overlay,
        trust: Arc<MeshTrust>,
        metrics: Arc<Metrics>,
    ) -> LogSync {
        LogSync {
            client,
            overlay,
            trust,
            metrics,
            round: 0,
        }
    }

    /// One round: [`FANOUT`] peers, in turn.
    pub async fn round(&mut self) {
        let Ok(view) = self.overlay.view().await else {
            return;
        };
        let mesh = &self.trust.root().mesh;
        let mut peers: Vec<(PeerId, SocketAddr)> = Vec::new();
        let candidates = view
            .successors
            .iter()
            .chain(view.predecessor.iter())
            .chain(view.fingers.iter().map(|(_, p)| p));
        for peer in candidates {
            let Ok(id) = PeerId::parse_in(&peer.id, mesh) else {
                continue;
            };
            if peer.id != view.me.id && !peers.iter().any(|(p, _)| *p == id) {
                peers.push((id, peer.addr));
            }
        }
        if peers.is_empty() {
            return;
        }
        for n in 0..FANOUT.min(peers.len()) {
            let (peer, addr) = peers[(self.round * FANOUT + n) % peers.len()];
            let synced = exchange(&self.client, &self.trust, &self.metrics, peer, addr).await;
            debug!(peer = %peer.printable(mesh), ?synced, "trust log exchange");
        }
        self.round = self.round.wrapping_add(1);
        let log = self.trust.log();
        self.metrics.trust_log(log.size(), log.forks().len());
    }
}

/// One exchange with `peer` at `addr`: its checkpoint audited against the copy
/// `trust` holds, and what it has more taken if it verifies (what a round does with
/// each peer it asks); counted in `metrics` by its result.
pub async fn exchange(
    client: &Client,
    trust: &MeshTrust,
    metrics: &Metrics,
    peer: PeerId,
    addr: SocketAddr,
) -> Synced {
    let synced = Exchange { client, trust }.with(peer, addr).await;
    metrics.trust_log_sync(&synced.label());
    synced
}

struct Exchange<'a> {
    client: &'a Client,
    trust: &'a MeshTrust,
}

impl Exchange<'_> {
    async fn with(&self, peer: PeerId, addr: SocketAddr) -> Synced {
        let log = self.trust.log();
        let held = log.size();
        let (checkpoint, first) = match self.ask(peer, addr, held).await {
            Ok(answer) => answer,
            Err(synced) => return synced,
        };
        if checkpoint.is_empty() {
            return Synced::Behind;
        }
        let from = peer.printable(&self.trust.root().mesh);
        let size = match log.audit(&checkpoint, &from) {
            Ok((_, Audit::Consistent)) => return Synced::Consistent,
            Ok((_, Audit::Fork(_))) => return Synced::Fork,
            Ok((verified, Audit::Ahead)) => verified.size(),
            Err(e) => return refused(&e),
        };
        let wanted = size.saturating_sub(held);
        if wanted > MAX_LEAVES_PER_ROUND {
            return Synced::Refused("too_far_ahead");
        }
        let leaves = match self
            .collect(peer, addr, &checkpoint, held, wanted, first)
            .await
        {
            Ok(leaves) => leaves,
            Err(synced) => return synced,
        };
        match self.trust.offer_log(&checkpoint, &leaves) {
            Ok(offered) => Synced::Grew(offered.added),
            Err(LogError::RootMismatch) => {
                // Either the peer changed the leaves, or the root signed a log that
                // does not extend this one: its whole copy tells which.
                let whole = match self
                    .collect(peer, addr, &checkpoint, 0, size, Vec::new())
                    .await
                {
                    Ok(leaves) => leaves,
                    Err(synced) => return synced,
                };
                match log.check_fork(&checkpoint, &whole, &from) {
                    Ok(Some(_)) => Synced::Fork,
                    Ok(None) | Err(_) => {
                        warn!(peer = %from, "a peer served trust log leaves that are not its checkpoint's");
                        Synced::Refused("root_mismatch")
                    }
                }
            }
            Err(e) => refused(&e),
        }
    }

    /// Leaves `from..from + wanted` of the log `checkpoint` describes, `first` being
    /// the start of them, asked for in batches (the same checkpoint each time).
    async fn collect(
        &self,
        peer: PeerId,
        addr: SocketAddr,
        checkpoint: &[u8],
        from: u64,
        wanted: u64,
        first: Vec<Vec<u8>>,
    ) -> Result<Vec<Vec<u8>>, Synced> {
        let mut leaves = first;
        // Bounded: each answer brings at least one leaf or ends the loop.
        while (leaves.len() as u64) < wanted {
            let (again, more) = self.ask(peer, addr, from + leaves.len() as u64).await?;
            if again != checkpoint || more.is_empty() {
                // It moved on, or withholds the rest: refused this round.
                return Err(Synced::Refused("incomplete"));
            }
            leaves.extend(more);
        }
        leaves.truncate(wanted as usize);
        Ok(leaves)
    }

    /// Asks `peer` for its checkpoint and the leaves from `from`.
    async fn ask(
        &self,
        peer: PeerId,
        addr: SocketAddr,
        from: u64,
    ) -> Result<(Vec<u8>, Vec<Vec<u8>>), Synced> {
        let request = Frame::LogRequest {
            admission: self.trust.own_admission().to_vec(),
            from,
            max: MAX_LOG_LEAVES,
        }
        .encode();
        let answer = self
            .client
            .request(peer, addr, &request)
            .await
            .map_err(|_| Synced::Unreachable)?;
        match postcard::from_bytes::<Frame>(&answer) {
            Ok(Frame::LogAnswer { checkpoint, leaves })
                if leaves.len() <= MAX_LOG_LEAVES as usize =>
            {
                Ok((checkpoint, leaves))
            }
            Ok(Frame::Refused { .. }) => Err(Synced::Refused("by_peer")),
            _ => Err(Synced::Refused("malformed")),
        }
    }
}

fn refused(error: &LogError) -> Synced {
    Synced::Refused(error.reason())
}
