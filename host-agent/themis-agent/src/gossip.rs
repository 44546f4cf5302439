//! Gossip among the agents (issue 23, docs/PROTOCOL.md §6.14): the membership that
//! one-hop routing needs, and the trust log's growth, spread push-pull.
//!
//! Every exchange is one [`Frame::Roster`] request and its answer. Both say how large
//! a log the sender holds and summarise its roster; a request also carries the
//! sender's own credentials (admission, address announcement, address range), an answer every
//! member's when the rosters differ. Who to tell and when, and whose larger log to
//! fetch, is the sans-IO [`Gossip`] of `themis-dht`: news is pushed to 3 random members
//! at once, one random member is pulled every period, the smallest claim above ours is
//! fetched first (through the trust log's own verified exchange, `log_sync`). Peers
//! come from the verified roster, never from what a peer names. Roster changes are
//! pushed the same way, and feed the DHT node's membership ([`Overlay::set_members`]).

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ring::rand::{SecureRandom, SystemRandom};
use serde::{Deserialize, Serialize};
use themis_core::{Identity, PeerId};
use themis_dht::gossip::{Action, Gossip, GossipConfig, Have};
use themis_dht::{Key, Members};
use themis_net::Client;
use themis_trust::{Announcement, Signed, ANNOUNCEMENT_LABEL};
use tokio::sync::{mpsc, Notify};
use tokio::task::JoinSet;
use tracing::{debug, info};

use crate::log_sync::{exchange, Synced};
use crate::metrics::Metrics;
use crate::overlay::{Frame, Overlay, Peer};
use crate::roster::{Credentials, Roster, MAX_MEMBERS};
use crate::trust::{unix_millis, MeshTrust};

/// Haves from members queued for the driver at most.
const HEARD_QUEUE: usize = 256;

/// How long a log fetch may take before the next claim is taken (the fetch reports
/// its result before that, unless it hangs).
const FETCH_TIMEOUT_MS: u64 = 10_000;

/// What a gossip request or answer carries.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RosterFrame {
    /// The sender's admission credential (its frames are checked like any other).
    pub admission: Vec<u8>,
    /// Where the sender accepts agent connections.
    pub listen: SocketAddr,
    /// The size of the sender's verified trust log.
    pub log_size: u64,
    /// The sender's [`Roster::digest`].
    pub digest: [u8; 32],
    /// Members' credentials: the sender's own in a request, every member's in an
    /// answer to a peer whose digest differs; at most [`MAX_MEMBERS`].
    pub members: Vec<Credentials>,
}

/// The state gossip shares between the agent's server (answers) and its driver. The
/// roster itself is the trust state's ([`MeshTrust::enable_roster`]): records are
/// checked against it too.
pub struct GossipState {
    trust: Arc<MeshTrust>,
    /// This node's admission and newest announcement (a farewell replaces it).
    own: Mutex<Credentials>,
    listen: SocketAddr,
    /// What members said in their requests, for the driver (bounded: a Have is a
    /// hint, and pulls repair what is dropped).
    heard: mpsc::Sender<(Peer, u64)>,
    /// The roster changed: news to push and a membership to hand the node.
    changed: Notify,
}

impl GossipState {
    /// The state of the agent `node`, listening on `listen`: its roster starts with
    /// itself, under an announcement signed now. The receiver gets what peers say.
    pub fn new(
        node: &Identity,
        listen: SocketAddr,
        trust: Arc<MeshTrust>,
    ) -> (Arc<GossipState>, mpsc::Receiver<(Peer, u64)>) {
        let own = announce(node, listen, &trust, false);
        trust.enable_roster();
        let (heard, heard_rx) = mpsc::channel(HEARD_QUEUE);
        let state = GossipState {
            trust,
            own: Mutex::new(own),
            listen,
            heard,
            changed: Notify::new(),
        };
        (Arc::new(state), heard_rx)
    }

    /// Says goodbye before the agent stops: a leaving announcement (the one liveness
    /// report peers believe, since only this node can sign it) taken into the roster
    /// and told to a few members at once, each within a second; the others learn it
    /// by their pulls. They stop choosing this node as a holder, rather than each
    /// finding out by a timeout.
    pub async fn farewell(&self, node: &Identity, client: &Client) {
        *self.own.lock().expect("never poisoned") = announce(node, self.listen, &self.trust, true);
        let request = Frame::Roster(self.frame(None)).encode();
        let me = Key(node.id().0);
        let members = self.members();
        let told = members.random_others(&me, 3, unix_millis());
        let asks = told.iter().map(|peer| {
            let wait = tokio::time::timeout(
                Duration::from_secs(1),
                client.request(PeerId(peer.id.0), peer.addr, &request),
            );
            async move { wait.await.is_ok_and(|answer| answer.is_ok()) }
        });
        let answered = futures_util::future::join_all(asks).await;
        let took = answered.iter().filter(|ok| **ok).count();
        info!(
            told = took,
            of = told.len(),
            "said goodbye to the membership"
        );
    }

    fn roster(&self) -> std::sync::MutexGuard<'_, Roster> {
        self.trust
            .roster()
            .expect("enabled when the state was made")
    }

    /// Takes the members' credentials a peer sent; counts what does not verify. The
    /// signatures are checked without the roster's lock (records are checked against
    /// the roster too), and only for announcements newer than the ones held.
    fn take(&self, metrics: &Metrics, members: &[Credentials]) {
        let mut changed = false;
        for credentials in members.iter().take(MAX_MEMBERS) {
            let wanted = self.roster().wants(&credentials.announcement);
            let taken = wanted.and_then(|wanted| match wanted {
                false => Ok(false),
                true => self
                    .trust
                    .verify(|v| Roster::check(v, credentials))
                    .and_then(|entry| self.roster().insert(entry)),
            });
            match taken {
                Ok(grew) => changed |= grew,
                Err(error) => metrics.frame_refused(&format!("roster_{}", error.reason())),
            }
        }
        if changed {
            self.changed.notify_one();
        }
    }

    /// Signs a fresh announcement (announcements count for
    /// [`crate::roster::ANNOUNCEMENT_LIFETIME_MS`]; the driver renews at half).
    fn reannounce(&self, node: &Identity) {
        *self.own.lock().expect("never poisoned") = announce(node, self.listen, &self.trust, false);
        self.changed.notify_one();
    }

    /// What this agent holds, as a frame: its own credentials (a request) or every
    /// member's if `their_digest` differs from ours (an answer).
    fn frame(&self, their_digest: Option<[u8; 32]>) -> RosterFrame {
        let roster = self.roster();
        let (digest, members) = self.trust.verify(|v| {
            let digest = roster.digest(v);
            let members = match their_digest {
                None => vec![self.own.lock().expect("never poisoned").clone()],
                Some(theirs) if theirs != digest => roster.credentials(v),
                Some(_) => Vec::new(),
            };
            (digest, members)
        });
        RosterFrame {
            admission: self.trust.own_admission().to_vec(),
            listen: self.listen,
            log_size: self.trust.log().size(),
            digest,
            members,
        }
    }

    /// The server side: a request from the admitted `peer`. A request carries the
    /// sender's own credentials only (anything else in it is ignored), and what it
    /// says of its log is heard only from a member, at the address the member signed
    /// (never at one the frame names).
    pub fn answer(&self, metrics: &Metrics, peer: PeerId, request: RosterFrame) -> RosterFrame {
        let mesh = self.trust.root().mesh.as_str();
        let own: Vec<Credentials> = request
            .members
            .into_iter()
            .filter(|c| {
                Signed::decode(&c.announcement)
                    .is_ok_and(|s| PeerId::derive(&s.signer, mesh) == peer)
            })
            .take(1)
            .collect();
        self.take(metrics, &own);
        let member = self.trust.verify(|v| self.roster().contact(&peer, v));
        if let Some(from) = member {
            // Full: the driver is behind, and a Have is only a hint (pulls repair).
            let _ = self.heard.try_send((from, request.log_size));
        }
        self.frame(Some(request.digest))
    }

    /// The membership one-hop routing uses now (what no longer counts is forgotten
    /// on the way).
    pub fn members(&self) -> Members<SocketAddr> {
        let mut roster = self.roster();
        self.trust.verify(|v| {
            roster.prune(v);
            roster.members(v)
        })
    }
}

/// What the driver needs.
pub struct Driver {
    /// Shared with the server.
    pub state: Arc<GossipState>,
    /// What members said.
    pub heard: mpsc::Receiver<(Peer, u64)>,
    /// This node's key (it signs the announcements it renews).
    pub node: Arc<Identity>,
    /// The DHT node's handle (its membership is set from the roster).
    pub overlay: Overlay,
    /// The agents' secure channel.
    pub client: Arc<Client>,
    /// Counters.
    pub metrics: Arc<Metrics>,
    /// Asked first, while the roster knows nobody else.
    pub bootstrap: Vec<Peer>,
    /// The pull period.
    pub period: Duration,
}

enum Done {
    /// A gossip exchange: the peer, and its answer if it gave one.
    Exchanged(Peer, Option<RosterFrame>),
    /// A log fetch from a peer: the size it claimed, and what the fetch came to.
    Fetched(u64, Synced),
}

impl Driver {
    /// Runs gossip until the task is aborted.
    pub async fn run(mut self) {
        let started = Instant::now();
        let now = move || u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
        let me = Key(self.node.id().0);
        let config = GossipConfig {
            period: u64::try_from(self.period.as_millis()).unwrap_or(u64::MAX),
            fetch_timeout: FETCH_TIMEOUT_MS,
            ..GossipConfig::default()
        };
        let mut gossip = Gossip::new(me, config, self.state.trust.log().size(), now());
        let mut tasks: JoinSet<Done> = JoinSet::new();
        let mut members = self.state.members();
        let mut generation = self.state.trust.generation();
        let random = SystemRandom::new();
        let draw = || {
            let mut b = [0u8; 8];
            random.fill(&mut b).expect("the system RNG works");
            u64::from_le_bytes(b)
        };
        let mut handed = None;
        self.hand_members(&members, &mut handed).await;
        let mut next_bootstrap = Instant::now();
        let mut log_grew = self.state.trust.log().watch_size();
        let renew_every = Duration::from_millis(crate::roster::ANNOUNCEMENT_LIFETIME_MS / 2);
        let mut next_renewal = Instant::now() + renew_every;
        loop {
            // Nobody else known yet: ask the bootstrap nodes for the roster, once a
            // period.
            if members.len() < 2 && next_bootstrap <= Instant::now() {
                next_bootstrap = Instant::now() + self.period;
                for peer in self.bootstrap.clone() {
                    self.spawn_exchange(&mut tasks, peer);
                }
            }
            let mut wake = started + Duration::from_millis(gossip.poll_timeout());
            if members.len() < 2 {
                wake = wake.min(next_bootstrap);
            }
            wake = wake.min(next_renewal);
            tokio::select! {
                Some((peer, size)) = self.heard.recv() => {
                    gossip.on_have(now(), peer, Have { version: size });
                }
                () = self.state.changed.notified() => {
                    members = self.state.members();
                    self.hand_members(&members, &mut handed).await;
                    // Roster news: tell a few members at once (their answers carry theirs).
                    for peer in members.random_others(&me, 3, draw()) {
                        self.spawn_exchange(&mut tasks, peer);
                    }
                }
                Some(done) = tasks.join_next(), if !tasks.is_empty() => match done {
                    Ok(Done::Exchanged(peer, Some(answer))) => {
                        self.state.take(&self.metrics, &answer.members);
                        gossip.on_have(now(), peer, Have { version: answer.log_size });
                    }
                    Ok(Done::Exchanged(peer, None)) => {
                        debug!(peer = %peer.addr, "gossip exchange failed");
                    }
                    // Holding at least what was claimed settles the fetch (below: the
                    // log grew); a peer that could not be reached is no liar; one
                    // that served less than it claimed, or what does not verify, is.
                    Ok(Done::Fetched(claimed, synced)) if self.state.trust.log().size() < claimed => {
                        debug!(?synced, claimed, "log fetch brought less than claimed");
                        match synced {
                            Synced::Unreachable => gossip.fetch_done(now()),
                            _ => gossip.fetch_failed(now()),
                        }
                    }
                    Ok(Done::Fetched(..)) => {}
                    Err(_) => {}
                },
                // Handled below, as any growth is.
                Ok(()) = log_grew.changed() => {}
                () = tokio::time::sleep_until(wake.into()) => {
                    if next_renewal <= Instant::now() {
                        next_renewal = Instant::now() + renew_every;
                        self.state.reannounce(&self.node);
                    }
                    // Announcements age and admissions expire: the membership is
                    // recomputed every period, not only when the roster changes.
                    members = self.state.members();
                    self.hand_members(&members, &mut handed).await;
                    gossip.handle_timeout(now(), &members, draw());
                }
            }
            // The log grew (a fetch, the operator, the backstop sync): news.
            let size = self.state.trust.log().size();
            if size > gossip.version() {
                gossip.learned(now(), size, &members, draw());
            }
            // Revocations change who is a member.
            if self.state.trust.generation() != generation {
                generation = self.state.trust.generation();
                members = self.state.members();
                self.hand_members(&members, &mut handed).await;
            }
            while let Some(action) = gossip.poll_action() {
                match action {
                    Action::Send(peer, _) => self.spawn_exchange(&mut tasks, peer),
                    Action::Fetch(peer, claimed) => {
                        let (client, trust, metrics) = (
                            self.client.clone(),
                            self.state.trust.clone(),
                            self.metrics.clone(),
                        );
                        tasks.spawn(async move {
                            let id = PeerId(peer.id.0);
                            let synced = exchange(&client, &trust, &metrics, id, peer.addr).await;
                            Done::Fetched(claimed, synced)
                        });
                    }
                }
            }
        }
    }

    /// Gives the DHT node the membership when it differs from the one `handed` last:
    /// the first time once it holds more than this node (or when this node starts the
    /// mesh: no bootstrap), and from then on at every change — a membership that
    /// shrinks back to this node alone is one too.
    async fn hand_members(
        &self,
        members: &Members<SocketAddr>,
        handed: &mut Option<Members<SocketAddr>>,
    ) {
        let first = members.len() >= 2 || (self.bootstrap.is_empty() && !members.is_empty());
        let changed = match handed {
            Some(last) => last != members,
            None => first,
        };
        if changed {
            *handed = Some(members.clone());
            self.overlay.set_members(members.clone()).await;
        }
    }

    fn spawn_exchange(&self, tasks: &mut JoinSet<Done>, peer: Peer) {
        let request = Frame::Roster(self.state.frame(None)).encode();
        let client = self.client.clone();
        tasks.spawn(async move {
            let answer = client.request(PeerId(peer.id.0), peer.addr, &request).await;
            let frame = answer
                .ok()
                .and_then(|bytes| postcard::from_bytes::<Frame>(&bytes).ok());
            match frame {
                Some(Frame::Roster(answer)) => Done::Exchanged(peer, Some(answer)),
                _ => Done::Exchanged(peer, None),
            }
        });
    }
}

/// This node's credentials with an announcement signed now (taken into its own
/// roster): where it listens, and whether it is leaving.
fn announce(node: &Identity, listen: SocketAddr, trust: &MeshTrust, leaving: bool) -> Credentials {
    let announcement = Signed::sign(
        node,
        ANNOUNCEMENT_LABEL,
        &Announcement {
            mesh: trust.root().mesh.as_str().into(),
            address: listen,
            issued_at: unix_millis(),
            leaving,
        },
    )
    .encode();
    let own = Credentials {
        admission: trust.own_admission().to_vec(),
        announcement,
        address_range: trust.own_address_range().map(<[u8]>::to_vec),
    };
    let mut roster = trust.enable_roster().lock().expect("never poisoned");
    if let Err(error) = trust.verify(|v| roster.offer(v, &own)) {
        // Our own admission is checked at start; only a revocation gets here.
        info!(%error, "this node's own credentials do not verify: it is no member");
    }
    own
}
