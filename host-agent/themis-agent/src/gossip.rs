//! Gossip among the agents (issue 23, docs/PROTOCOL.md §6.14): the membership that
//! one-hop routing needs, and the trust log's growth, spread push-pull.
//!
//! Every exchange is one [`Frame::Roster`] request and its answer. Both say how large
//! a log the sender holds and summarise its roster; a request also carries the
//! sender's own credentials (admission, address announcement, address range), an
//! answer the members' when the rosters differ, a page of [`PAGE`] at a time (the asker
//! asks for the next page after the last key it got, up to [`MAX_PAGES`]). Who to tell and when, and whose larger log to
//! fetch, is the sans-IO [`Gossip`] of `themis-dht`: news is pushed to 3 random members
//! at once, one random member is pulled every period, the smallest claim above ours is
//! fetched first (through the trust log's own verified exchange, `log_sync`). Peers
//! come from the verified roster, never from what a peer names. Roster changes are
//! pushed the same way, and feed the DHT node's membership ([`Overlay::set_members`]).

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ring::rand::{SecureRandom, SystemRandom};
use serde::{Deserialize, Serialize};
use themis_core::{Identity, PeerId};
use themis_dht::gossip::{Action, Gossip, GossipConfig, Have};
use themis_dht::{Key, Members};
use themis_net::Client;
use themis_trust::{grant_digest, Announcement, Signed, TrustError, ANNOUNCEMENT_LABEL};
use tokio::sync::{mpsc, Notify};
use tokio::task::JoinSet;
use tracing::{debug, info};

use crate::log_sync::{exchange, Synced};
use crate::metrics::Metrics;
use crate::overlay::{Frame, Overlay, Peer};
use crate::roster::{Credentials, Roster, MAX_MEMBERS, PAGE};
use crate::trust::{unix_millis, MeshTrust};

/// Haves from members queued for the driver at most.
const HEARD_QUEUE: usize = 256;

/// The most pages one exchange asks for: a whole roster of [`MAX_MEMBERS`], however
/// many further pages a peer says there are.
pub const MAX_PAGES: usize = MAX_MEMBERS.div_ceil(PAGE);
const _: () = assert!(MAX_PAGES * PAGE >= MAX_MEMBERS);

/// Members of one frame that may fail their checks for reasons an honest peer can
/// give (revoked or expired here first, a clock ahead) before the rest is dropped.
const MAX_FAILURES_PER_FRAME: usize = 16;

/// How long a log fetch may take before the next claim is taken (the fetch reports
/// its result before that, unless it hangs).
const FETCH_TIMEOUT_MS: u64 = 10_000;

/// What a member said in its request: its log's size and root hash.
type Heard = (Peer, u64, [u8; 32]);

/// What a gossip request or answer carries.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RosterFrame {
    /// The sender's admission credential (its frames are checked like any other).
    pub admission: Vec<u8>,
    /// Where the sender accepts agent connections.
    pub listen: SocketAddr,
    /// The size of the sender's verified trust log.
    pub log_size: u64,
    /// Its tree's root hash at that size: two agents that hold as many leaves but
    /// different roots hold two histories of the root's (a fork, §6.13).
    pub log_root: [u8; 32],
    /// The sender's [`Roster::digest`].
    pub digest: [u8; 32],
    /// Members' credentials: the sender's own in a request; in an answer to a peer
    /// whose digest differs, a page of the members (at most [`PAGE`]).
    pub members: Vec<Credentials>,
    /// In a request, the page wanted: the members after this node key (`None`: from
    /// the first). Ignored in an answer.
    pub after: Option<[u8; 32]>,
    /// In an answer, where the next page starts, if there is one.
    pub next: Option<[u8; 32]>,
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
    heard: mpsc::Sender<Heard>,
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
    ) -> (Arc<GossipState>, mpsc::Receiver<Heard>) {
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
        let request = Frame::Roster(self.request(None)).encode();
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
    /// the roster too), and only for announcements newer than the ones held. The rest
    /// of a frame is dropped at its first forgery ([`forged`]): an honest peer sends
    /// only what it verified under the same root, so a peer that pads its answers
    /// with junk costs this agent one failed check per answer, not a page of them.
    fn take(&self, metrics: &Metrics, members: &[Credentials]) {
        let mut changed = false;
        let (mut last, mut failures) = (None, 0);
        for credentials in members.iter().take(PAGE) {
            // A page comes in node-key order, each member once: a peer cannot make
            // this agent check one member's credentials over and over.
            let signed = match Signed::decode(&credentials.announcement) {
                Ok(signed) => signed,
                Err(error) => {
                    metrics.frame_refused(&format!("roster_{}", error.reason()));
                    break;
                }
            };
            if last.is_some_and(|l| signed.signer <= l) {
                metrics.frame_refused("roster_out_of_order");
                break;
            }
            last = Some(signed.signer);
            let wanted = self.roster().wants(&signed);
            let taken = wanted.and_then(|wanted| match wanted {
                false => Ok(false),
                true => self
                    .trust
                    .verify(|v| Roster::check(v, credentials))
                    .and_then(|entry| self.roster().insert(entry)),
            });
            match taken {
                Ok(grew) => changed |= grew,
                Err(error) => {
                    metrics.frame_refused(&format!("roster_{}", error.reason()));
                    failures += 1;
                    if forged(&error) || failures > MAX_FAILURES_PER_FRAME {
                        break;
                    }
                }
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

    /// A request: this agent's own credentials, and the page of the peer's roster
    /// wanted (after this node key; `None`: the first).
    fn request(&self, after: Option<[u8; 32]>) -> RosterFrame {
        let own = self.own.lock().expect("never poisoned").clone();
        let digest = self.trust.verify(|v| self.roster().digest(v));
        self.frame(digest, vec![own], after, None)
    }

    /// An answer to a peer whose roster summarises to `their_digest`: nothing more
    /// if the rosters agree, else the page of members after `after`.
    fn answer_to(&self, their_digest: [u8; 32], after: Option<[u8; 32]>) -> RosterFrame {
        let roster = self.roster();
        let (digest, (members, next)) = self.trust.verify(|v| {
            let digest = roster.digest(v);
            match their_digest == digest {
                true => (digest, (Vec::new(), None)),
                false => (digest, roster.page(after.as_ref(), v)),
            }
        });
        drop(roster);
        self.frame(digest, members, None, next)
    }

    fn frame(
        &self,
        digest: [u8; 32],
        members: Vec<Credentials>,
        after: Option<[u8; 32]>,
        next: Option<[u8; 32]>,
    ) -> RosterFrame {
        let (log_size, log_root) = self.trust.log().head();
        RosterFrame {
            admission: self.trust.own_admission().to_vec(),
            listen: self.listen,
            log_size,
            log_root,
            digest,
            members,
            after,
            next,
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
            let _ = self
                .heard
                .try_send((from, request.log_size, request.log_root));
        }
        self.answer_to(request.digest, request.after)
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
    pub heard: mpsc::Receiver<Heard>,
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
    /// A gossip exchange: the peer, its answer if it gave one, and how many pages
    /// of its roster this exchange has had.
    Exchanged(Peer, Option<Box<RosterFrame>>, usize),
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
        // Members whose other history of a size we already fetched.
        let mut compared = HashMap::new();
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
                Some((peer, size, root)) = self.heard.recv() => {
                    self.compare_histories(&mut tasks, &mut compared, &peer, size, root);
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
                    Ok(Done::Exchanged(peer, Some(answer), pages)) => {
                        self.state.take(&self.metrics, &answer.members);
                        let (size, root) = (answer.log_size, answer.log_root);
                        self.compare_histories(&mut tasks, &mut compared, &peer, size, root);
                        gossip.on_have(now(), peer.clone(), Have { version: size });
                        if let Some(after) = next_page(&answer, pages) {
                            self.spawn_page(&mut tasks, peer, Some(after), pages + 1);
                        }
                    }
                    Ok(Done::Exchanged(peer, None, _)) => {
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
                    Action::Fetch(peer, claimed) => self.spawn_fetch(&mut tasks, peer, claimed),
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

    /// Fetches `peer`'s log through the trust log's verified exchange (`log_sync`),
    /// which takes what extends ours and keeps a contradicting checkpoint as evidence.
    fn spawn_fetch(&self, tasks: &mut JoinSet<Done>, peer: Peer, claimed: u64) {
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

    /// A member holds as many leaves as we do under another root: one of us holds
    /// another history. Its checkpoint is fetched and compared (a fork is kept as
    /// evidence, §6.13), once per member and size, so a member that keeps saying so
    /// costs one exchange per log growth. (Sizes alone, which the gossip compares,
    /// would never show two histories of one length.)
    fn compare_histories(
        &self,
        tasks: &mut JoinSet<Done>,
        compared: &mut HashMap<Key, u64>,
        peer: &Peer,
        size: u64,
        root: [u8; 32],
    ) {
        let (own_size, own_root) = self.state.trust.log().head();
        if size == 0 || size != own_size || root == own_root {
            return;
        }
        if compared.insert(peer.id, size) != Some(size) {
            debug!(peer = %peer.addr, size, "a member holds another history of this size");
            self.spawn_fetch(tasks, peer.clone(), size);
        }
    }

    fn spawn_exchange(&self, tasks: &mut JoinSet<Done>, peer: Peer) {
        self.spawn_page(tasks, peer, None, 1);
    }

    /// Asks `peer` for the page of its roster after `after`; `pages` counts this one.
    fn spawn_page(
        &self,
        tasks: &mut JoinSet<Done>,
        peer: Peer,
        after: Option<[u8; 32]>,
        pages: usize,
    ) {
        let request = Frame::Roster(self.state.request(after)).encode();
        let client = self.client.clone();
        tasks.spawn(async move {
            let answer = client.request(PeerId(peer.id.0), peer.addr, &request).await;
            let frame = answer
                .ok()
                .and_then(|bytes| postcard::from_bytes::<Frame>(&bytes).ok());
            match frame {
                Some(Frame::Roster(answer)) => Done::Exchanged(peer, Some(Box::new(answer)), pages),
                _ => Done::Exchanged(peer, None, pages),
            }
        });
    }
}

/// Whether a member's credentials failing with `error` were made up, as opposed to
/// merely no longer current here (revoked, expired: revocations reach agents at
/// different moments) or one too many.
fn forged(error: &TrustError) -> bool {
    use TrustError::*;
    matches!(
        error,
        Malformed | BadSignature | NotFromRoot | WrongKey | WrongMesh | NotAdmitted | UnboundRange
    )
}

/// Where the page after `answer` (the `pages`-th of an exchange) starts, if the
/// asker should ask for it: only after a full page whose last member is the node key
/// the answer names, and never past [`MAX_PAGES`], so a peer that always says there
/// is more cannot keep an agent asking.
fn next_page(answer: &RosterFrame, pages: usize) -> Option<[u8; 32]> {
    let next = answer.next?;
    let last = answer
        .members
        .get(PAGE - 1)
        .filter(|_| answer.members.len() == PAGE)?;
    let last_key = Signed::decode(&last.announcement).ok()?.signer;
    (pages < MAX_PAGES && last_key == next).then_some(next)
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
            address_range: trust.own_address_range().map(grant_digest),
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::operator::{self, MeshDir};
    use ring::rand::SystemRandom;
    use themis_trust::{Admission, ADMISSION_LABEL};

    struct Node {
        id: PeerId,
        state: Arc<GossipState>,
        // Kept: the state's channel closes without it.
        _heard: mpsc::Receiver<Heard>,
    }

    fn node(mesh: &MeshDir, dir: &std::path::Path, port: u16) -> Node {
        operator::admit_node(mesh, dir, None, false).unwrap();
        let key = crate::keystore::load(&dir.join("node.key"), &mesh.root.mesh).unwrap();
        let metrics = Arc::new(Metrics::new());
        let trust = Arc::new(MeshTrust::load(dir, mesh.root.clone(), &key, metrics).unwrap());
        let listen = SocketAddr::from(([127, 0, 0, 1], port));
        let (state, heard) = GossipState::new(&key, listen, trust);
        Node {
            id: key.id(),
            state,
            _heard: heard,
        }
    }

    /// Members the root admitted, each announcing itself (what a large mesh holds).
    fn members(mesh: &MeshDir, n: usize) -> Vec<Credentials> {
        let now = unix_millis();
        (0..n)
            .map(|i| {
                let key = Identity::generate(mesh.root.mesh.clone(), &SystemRandom::new()).unwrap();
                let admission = Admission {
                    mesh: mesh.root.mesh.to_string(),
                    node_key: *key.public_key(),
                    issued_at: now,
                    not_after: None,
                };
                let announcement = Announcement {
                    mesh: mesh.root.mesh.to_string(),
                    address: SocketAddr::from(([10, 1, (i / 250) as u8, (i % 250) as u8], 7946)),
                    issued_at: now,
                    leaving: false,
                    address_range: None,
                };
                Credentials {
                    admission: Signed::sign(&mesh.key, ADMISSION_LABEL, &admission).encode(),
                    announcement: Signed::sign(&key, ANNOUNCEMENT_LABEL, &announcement).encode(),
                    address_range: None,
                }
            })
            .collect()
    }

    fn digest(node: &Node) -> [u8; 32] {
        node.state.trust.verify(|v| node.state.roster().digest(v))
    }

    #[test]
    fn a_roster_larger_than_a_page_arrives_whole_page_by_page() {
        let dir = tempfile::tempdir().unwrap();
        operator::create_mesh("test", &dir.path().join("mesh")).unwrap();
        let mesh = MeshDir::open(&dir.path().join("mesh")).unwrap();
        let (big, new) = (
            node(&mesh, &dir.path().join("big"), 7001),
            node(&mesh, &dir.path().join("new"), 7002),
        );
        let metrics = Metrics::new();
        // In node-key order, as pages come.
        let mut many = members(&mesh, 2 * PAGE + 100);
        many.sort_by_key(|c| Signed::decode(&c.announcement).unwrap().signer);
        big.state.take(&metrics, &many[..PAGE]);
        big.state.take(&metrics, &many[PAGE..2 * PAGE]);
        big.state.take(&metrics, &many[2 * PAGE..]);
        assert_eq!(big.state.members().len(), 2 * PAGE + 101);

        // The newcomer asks; each answer is a page, and it asks for the next.
        let (mut after, mut pages) = (None, 1);
        loop {
            let answer = big.state.answer(&metrics, new.id, new.state.request(after));
            assert!(answer.members.len() <= PAGE);
            new.state.take(&metrics, &answer.members);
            match next_page(&answer, pages) {
                Some(next) => (after, pages) = (Some(next), pages + 1),
                None => break,
            }
        }
        assert_eq!(pages, 3, "2 full pages and the rest");
        // Both hold the same members now (the big one took the newcomer's own).
        assert_eq!(new.state.members().len(), 2 * PAGE + 102);
        assert_eq!(digest(&new), digest(&big));
        let again = big.state.answer(&metrics, new.id, new.state.request(None));
        assert!(
            again.members.is_empty() && again.next.is_none(),
            "agreeing rosters: nothing"
        );
    }

    #[test]
    fn an_answer_is_dropped_at_its_first_forged_member() {
        let dir = tempfile::tempdir().unwrap();
        operator::create_mesh("test", &dir.path().join("mesh")).unwrap();
        let mesh = MeshDir::open(&dir.path().join("mesh")).unwrap();
        let taker = node(&mesh, &dir.path().join("taker"), 7001);
        let metrics = Metrics::new();
        let mut genuine = members(&mesh, 6);
        genuine.sort_by_key(|c| Signed::decode(&c.announcement).unwrap().signer);
        let mut answer = genuine.clone();
        // The second: an announcement whose signature is another member's.
        answer[1].announcement = {
            let mut signed = Signed::decode(&answer[1].announcement).unwrap();
            signed.signature = Signed::decode(&answer[2].announcement).unwrap().signature;
            signed.encode()
        };
        taker.state.take(&metrics, &answer);
        // Itself and the one before the forgery; nothing after it was checked.
        assert_eq!(taker.state.members().len(), 2);
        // The same members from an honest peer are all taken.
        taker.state.take(&metrics, &genuine);
        assert_eq!(taker.state.members().len(), 7);
    }

    #[test]
    fn an_answer_out_of_key_order_is_dropped_where_it_turns_back() {
        let dir = tempfile::tempdir().unwrap();
        operator::create_mesh("test", &dir.path().join("mesh")).unwrap();
        let mesh = MeshDir::open(&dir.path().join("mesh")).unwrap();
        let taker = node(&mesh, &dir.path().join("taker"), 7001);
        let metrics = Metrics::new();
        let mut three = members(&mesh, 3);
        three.sort_by_key(|c| Signed::decode(&c.announcement).unwrap().signer);
        // One member again (a peer making this agent check it over and over), then
        // one it would take: nothing from the repeat on is looked at.
        let answer = [&three[0], &three[1], &three[0], &three[2]].map(Clone::clone);
        taker.state.take(&metrics, &answer);
        assert_eq!(taker.state.members().len(), 3, "itself and the first two");
        taker.state.take(&metrics, &three);
        assert_eq!(taker.state.members().len(), 4);
    }

    #[test]
    fn a_peer_that_always_says_there_is_more_is_asked_a_bounded_number_of_pages() {
        let dir = tempfile::tempdir().unwrap();
        operator::create_mesh("test", &dir.path().join("mesh")).unwrap();
        let mesh = MeshDir::open(&dir.path().join("mesh")).unwrap();
        let page = members(&mesh, PAGE);
        let last = Signed::decode(&page[PAGE - 1].announcement).unwrap().signer;
        let answer = |members: Vec<Credentials>, next| RosterFrame {
            admission: Vec::new(),
            listen: SocketAddr::from(([127, 0, 0, 1], 1)),
            log_size: 0,
            log_root: [0; 32],
            digest: [0; 32],
            members,
            after: None,
            next,
        };
        assert_eq!(next_page(&answer(page.clone(), Some(last)), 1), Some(last));
        // No more, a short page, a next that is not the page's last key, or past the
        // bound: the asker stops.
        assert_eq!(next_page(&answer(page.clone(), None), 1), None);
        assert_eq!(next_page(&answer(page[1..].to_vec(), Some(last)), 1), None);
        assert_eq!(next_page(&answer(page.clone(), Some([0xff; 32])), 1), None);
        assert_eq!(
            next_page(&answer(page.clone(), Some(last)), MAX_PAGES),
            None
        );
    }
}
