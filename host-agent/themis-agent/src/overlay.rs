//! The DHT driver: one tokio task owns the sans-IO [`Node`], feeds it what peers send
//! and the clock, and carries what it emits over a [`Transport`] (the Themis secure
//! channel in the agent). [`Overlay`] is the cloneable handle the rest of the agent
//! uses.
//!
//! Between agents every DHT message travels in a [`Frame`] inside one record: a
//! request is a record, its response the record that answers it (`themis-net`
//! matches them). The frame names the address the sender *listens* on, because the
//! connection's source port is ephemeral; the id comes from the authenticated
//! session, never from the frame. Every frame, request or response, carries the
//! sender's admission credential: a peer the mesh root did not admit is refused
//! before anything reaches the DHT, and its answers are dropped (see [`crate::trust`]).

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::BytesMut;
use futures_util::future::{join_all, BoxFuture};
use serde::{Deserialize, Serialize};
use themis_core::{MeshName, PeerId};
use themis_dht::{Contact, Event, Key, Message, Node, OpId, Rejection};
use themis_net::{Answer, Client, NetError, Standing};
use tokio::sync::{mpsc, oneshot, watch};
use tracing::{debug, info, warn};

use crate::metrics::Metrics;
pub use crate::metrics::Snapshot;
use crate::trust::{MeshTrust, TrustPolicy};

/// A peer agent: its ring id and the address it listens on.
pub type Peer = Contact<SocketAddr>;

/// Carries a frame to a peer and brings back its answer.
pub trait Transport: Send + Sync + 'static {
    /// Sends `frame` to the agent `peer` at `addr` and returns its answer.
    fn request(
        &self,
        peer: PeerId,
        addr: SocketAddr,
        frame: Vec<u8>,
    ) -> BoxFuture<'static, Result<BytesMut, NetError>>;
}

/// The production transport: the Themis secure channel over pooled TCP connections.
impl Transport for Arc<Client> {
    fn request(
        &self,
        peer: PeerId,
        addr: SocketAddr,
        frame: Vec<u8>,
    ) -> BoxFuture<'static, Result<BytesMut, NetError>> {
        let client = self.clone();
        Box::pin(async move { Client::request(&client, peer, addr, &frame).await })
    }
}

/// What one record between agents carries.
#[derive(Debug, Serialize, Deserialize)]
pub enum Frame {
    /// A DHT message from the agent listening on `listen`.
    Dht {
        /// Where the sender accepts agent connections.
        listen: SocketAddr,
        /// The sender's admission credential (an encoded, root-signed `Admission`).
        admission: Vec<u8>,
        /// The message.
        message: Message<SocketAddr>,
    },
    /// The request was refused, and why (for the sender's logs).
    Refused {
        /// A short reason.
        reason: String,
    },
    /// A request for the trust log: the checkpoint the answering agent holds and up
    /// to `max` leaves from index `from` (docs/PROTOCOL.md §6.13).
    LogRequest {
        /// The sender's admission credential.
        admission: Vec<u8>,
        /// The first leaf wanted.
        from: u64,
        /// The most leaves wanted (the answer holds at most [`MAX_LOG_LEAVES`]).
        max: u32,
    },
    /// The answer to a [`Frame::LogRequest`].
    LogAnswer {
        /// The checkpoint held (signed bytes; empty if none).
        checkpoint: Vec<u8>,
        /// Leaves from the index asked for.
        leaves: Vec<Vec<u8>>,
    },
    /// Gossip (docs/PROTOCOL.md §6.14), as a request and as its answer: what the sender
    /// holds of the trust log and of the membership. A request carries roster news
    /// or asks for buckets of the peer's roster; an answer carries the bucket digests
    /// or the members asked for ([`crate::gossip`]).
    Roster(crate::gossip::RosterFrame),
}

/// The most leaves one [`Frame::LogAnswer`] carries: 256 leaves of the largest size
/// fit a record (1 MiB) with room to spare.
pub const MAX_LOG_LEAVES: u32 = 256;

/// The longest frame an agent sends as a request, in bytes: a `Handover` of
/// [`MAX_HANDOVER_OBJECTS`](themis_dht::message::MAX_HANDOVER_OBJECTS) maximal values
/// with a maximal admission credential, and room for the rest. Any request can be the
/// first on a new connection, so this is what a connection not admitted yet may send
/// (`max_unadmitted_frame`): about 140 KiB, where an admitted one may send 1 MiB.
pub const MAX_REQUEST_FRAME: usize = {
    use themis_dht::message::{MAX_HANDOVER_OBJECTS, MAX_VALUE_LEN};
    // Per object: key, value with its length, ttl (postcard varints, at most 10 bytes).
    let object = 32 + MAX_VALUE_LEN + 10 + 10;
    MAX_HANDOVER_OBJECTS * object + themis_trust::MAX_ENCODED_LEN + 10 + 1024
};

impl Frame {
    /// Its bytes on the wire.
    pub fn encode(&self) -> Vec<u8> {
        postcard::to_allocvec(self).expect("frames always encode")
    }

    fn refused(reason: &str) -> Vec<u8> {
        Frame::Refused {
            reason: reason.to_owned(),
        }
        .encode()
    }
}

/// Settings of the overlay.
#[derive(Debug, Clone)]
pub struct OverlayConfig {
    /// The Chord node's timers and limits.
    pub dht: themis_dht::Config,
    /// How long an operation (find, store, resolve) may take before the caller gets
    /// [`OverlayError::Timeout`].
    pub op_timeout: Duration,
    /// Pause between attempts to join when the bootstrap nodes do not answer.
    pub join_retry: Duration,
}

impl Default for OverlayConfig {
    fn default() -> Self {
        OverlayConfig {
            dht: themis_dht::Config::default(),
            op_timeout: Duration::from_secs(10),
            join_retry: Duration::from_secs(1),
        }
    }
}

/// Why an overlay operation failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OverlayError {
    /// The node refused the operation.
    #[error("{0}")]
    Rejected(#[from] Rejection),
    /// The lookup found no node (every candidate failed or the hop bound was reached).
    #[error("lookup failed after {hops} hops")]
    NotFound {
        /// Steps taken.
        hops: u32,
    },
    /// No answer within the operation timeout.
    #[error("the operation timed out")]
    Timeout,
    /// The agent is shutting down.
    #[error("the agent is shutting down")]
    Stopped,
}

impl OverlayError {
    /// A short, stable name for metrics labels and API errors.
    pub fn reason(&self) -> &'static str {
        match self {
            OverlayError::Rejected(Rejection::NotJoined) => "not_joined",
            OverlayError::Rejected(_) => "rejected",
            OverlayError::NotFound { .. } => "not_found",
            OverlayError::Timeout => "timeout",
            OverlayError::Stopped => "stopped",
        }
    }
}

/// A completed `find`.
#[derive(Debug, Clone, Serialize)]
pub struct Found {
    /// The node responsible for the key.
    pub node: PeerView,
    /// Remote steps taken.
    pub hops: u32,
}

/// A completed `store`.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Stored {
    /// Replicas that acknowledged.
    pub stored: u8,
    /// Replicas attempted (`k + 1`).
    pub replicas: u8,
}

/// A completed `resolve`.
#[derive(Debug, Clone, Serialize)]
pub struct Resolved {
    /// The union of the values every replica that answered returned (unverified).
    pub values: Vec<Vec<u8>>,
    /// Replicas whose holder answered.
    pub answered: u8,
    /// Replicas asked (`k + 1`).
    pub replicas: u8,
    /// Remote steps over every replica tried.
    pub hops: u32,
}

/// A peer as people read it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PeerView {
    /// Printable id.
    pub id: String,
    /// Listening address.
    pub addr: SocketAddr,
}

/// The node's view of the ring, for `themis ring` and the debug API.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RingView {
    /// This node.
    pub me: PeerView,
    /// Whether it is in a ring.
    pub joined: bool,
    /// Its predecessor.
    pub predecessor: Option<PeerView>,
    /// Its successor list, nearest first.
    pub successors: Vec<PeerView>,
    /// Finger table entries: `(i, peer)` for the finger `me + 2^i`, distinct peers only.
    pub fingers: Vec<(usize, PeerView)>,
    /// Objects held for the ring: hex object id and number of values.
    pub objects: Vec<(String, usize)>,
    /// With one-hop routing, how many members the node routes over (`None`: it routes
    /// the Chord way).
    #[serde(default)]
    pub members: Option<usize>,
}

type Reply<T> = oneshot::Sender<T>;

enum Command {
    /// A message from an authenticated peer; requests wait for their response.
    Deliver {
        from: Peer,
        message: Message<SocketAddr>,
        answer: Option<Reply<Message<SocketAddr>>>,
    },
    Op {
        op: UserOp,
        reply: Reply<Result<Event<SocketAddr>, Rejection>>,
    },
    Unstore {
        name: Vec<u8>,
        value: Vec<u8>,
    },
    View(Reply<RingView>),
    Leave(Reply<()>),
    SetMembers(themis_dht::Members<SocketAddr>),
}

enum UserOp {
    Find(Key),
    Store {
        name: Vec<u8>,
        value: Vec<u8>,
        k: u8,
        ttl: Duration,
    },
    Resolve {
        name: Vec<u8>,
        k: u8,
    },
}

/// A handle on the running overlay; cheap to clone.
#[derive(Clone)]
pub struct Overlay {
    commands: mpsc::Sender<Command>,
    me: Peer,
    mesh: MeshName,
    op_timeout: Duration,
    joined: watch::Receiver<bool>,
    snapshot: Arc<Mutex<Snapshot>>,
    metrics: Arc<Metrics>,
    trust: Arc<MeshTrust>,
    /// The gossip this agent answers, once it runs one.
    gossip: Arc<std::sync::OnceLock<Arc<crate::gossip::GossipState>>>,
}

/// Longest time a graceful leave waits for its farewell messages to be acknowledged.
const LEAVE_FLUSH_TIMEOUT: Duration = Duration::from_secs(3);

impl Overlay {
    /// Starts the node `me` (its id and advertised listening address): it creates a
    /// ring if `bootstrap` is empty, else joins through the first bootstrap node that
    /// answers, retrying until one does.
    pub fn start(
        me: Peer,
        mesh: MeshName,
        bootstrap: Vec<Peer>,
        transport: Arc<dyn Transport>,
        config: OverlayConfig,
        metrics: Arc<Metrics>,
        trust: Arc<MeshTrust>,
    ) -> Overlay {
        let (commands, commands_rx) = mpsc::channel(4096);
        let (joined_tx, joined) = watch::channel(false);
        let snapshot = Arc::new(Mutex::new(Snapshot::default()));
        let (responses, responses_rx) = mpsc::unbounded_channel();
        let mut driver = Driver {
            node: Node::with_policy(
                me.clone(),
                config.dht.clone(),
                Box::new(TrustPolicy(trust.clone())),
            ),
            trust: trust.clone(),
            metrics: metrics.clone(),
            start: Instant::now(),
            mesh: mesh.clone(),
            transport,
            responses,
            answers: HashMap::new(),
            ops: HashMap::new(),
            bootstrap,
            attempts: 0,
            join_retry: config.join_retry,
            retry_join_at: None,
            joined: joined_tx,
            snapshot: snapshot.clone(),
        };
        driver.begin();
        tokio::spawn(driver.run(commands_rx, responses_rx));
        Overlay {
            commands,
            me,
            mesh,
            op_timeout: config.op_timeout,
            joined,
            snapshot,
            metrics,
            trust,
            gossip: Arc::default(),
        }
    }

    /// This node.
    pub fn me(&self) -> &Peer {
        &self.me
    }

    /// The mesh.
    pub fn mesh(&self) -> &MeshName {
        &self.mesh
    }

    /// Watches whether the node is in a ring.
    pub fn joined(&self) -> watch::Receiver<bool> {
        self.joined.clone()
    }

    /// The node's counters as of the last refresh (about a second old at most).
    pub fn snapshot(&self) -> Snapshot {
        self.snapshot.lock().expect("never poisoned").clone()
    }

    /// The printable form of a peer.
    pub fn view_of(&self, peer: &Peer) -> PeerView {
        view_of(&self.mesh, peer)
    }

    /// Looks up the node responsible for `key` (paper `find`).
    pub async fn find(&self, key: Key) -> Result<Found, OverlayError> {
        let started = Instant::now();
        let result = match self.op(UserOp::Find(key)).await {
            Ok(Event::Found { node, hops, .. }) => Ok(Found {
                node: self.view_of(&node),
                hops,
            }),
            Ok(Event::NotFound { hops, .. }) => Err(OverlayError::NotFound { hops }),
            Ok(_) => unreachable!("a find completes with Found or NotFound"),
            Err(e) => Err(e),
        };
        let hops = result.as_ref().ok().map(|f| f.hops);
        self.metrics
            .operation("find", outcome(&result), hops, started.elapsed());
        result
    }

    /// Stores `value` under `name` with `k` extra replicas and keeps re-storing it
    /// (paper `store`) until [`Overlay::unstore`].
    pub async fn store(
        &self,
        name: &[u8],
        value: Vec<u8>,
        k: u8,
        ttl: Duration,
    ) -> Result<Stored, OverlayError> {
        let started = Instant::now();
        let op = UserOp::Store {
            name: name.to_vec(),
            value,
            k,
            ttl,
        };
        let result = match self.op(op).await {
            Ok(Event::Stored {
                stored, replicas, ..
            }) => Ok(Stored { stored, replicas }),
            Ok(_) => unreachable!("a store completes with Stored"),
            Err(e) => Err(e),
        };
        self.metrics
            .operation("store", outcome(&result), None, started.elapsed());
        result
    }

    /// Stops re-storing `value` under `name`; the stored copies expire with their TTL.
    pub async fn unstore(&self, name: &[u8], value: Vec<u8>) {
        let name = name.to_vec();
        let _ = self.commands.send(Command::Unstore { name, value }).await;
    }

    /// The values stored under `name` with up to `k` extra replicas.
    pub async fn resolve(&self, name: &[u8], k: u8) -> Result<Resolved, OverlayError> {
        let started = Instant::now();
        let op = UserOp::Resolve {
            name: name.to_vec(),
            k,
        };
        let result = match self.op(op).await {
            Ok(Event::Resolved {
                values,
                answered,
                replicas,
                hops,
                ..
            }) => Ok(Resolved {
                values,
                answered,
                replicas,
                hops,
            }),
            Ok(_) => unreachable!("a resolve completes with Resolved"),
            Err(e) => Err(e),
        };
        let hops = result.as_ref().ok().map(|r| r.hops);
        self.metrics
            .operation("resolve", outcome(&result), hops, started.elapsed());
        result
    }

    /// The node's routing state and the objects it holds.
    pub async fn view(&self) -> Result<RingView, OverlayError> {
        let (reply, answer) = oneshot::channel();
        self.commands
            .send(Command::View(reply))
            .await
            .map_err(|_| OverlayError::Stopped)?;
        answer.await.map_err(|_| OverlayError::Stopped)
    }

    /// Leaves the ring gracefully (paper `leave`): hands every object and the
    /// predecessor to the successor and waits (a few seconds at most) until they are
    /// acknowledged. The overlay stops afterwards.
    pub async fn leave(&self) {
        let (reply, done) = oneshot::channel();
        if self.commands.send(Command::Leave(reply)).await.is_ok() {
            let _ = done.await;
        }
    }

    /// Answers one frame from the authenticated agent `peer`: the server side of the
    /// transport. Anything that is not a well-formed DHT request is refused with a
    /// reason and counted. The answer says what the frame proved: a valid admission
    /// credential admits the connection ([`Standing::Admitted`]); a frame refused for
    /// its admission closes it ([`Standing::Refused`]); a frame refused before its
    /// admission could be checked proves nothing ([`Standing::Unproven`]: the server
    /// closes a connection that has not been admitted yet).
    pub async fn handle_frame(&self, peer: PeerId, frame: &[u8]) -> Answer {
        let unproven = |payload| Answer {
            payload,
            standing: Standing::Unproven,
        };
        let (listen, admission, message) = match postcard::from_bytes::<Frame>(frame) {
            Ok(Frame::Dht {
                listen,
                admission,
                message,
            }) => (listen, admission, message),
            Ok(Frame::LogRequest {
                admission,
                from,
                max,
            }) => return self.answer_log(peer, &admission, from, max),
            Ok(Frame::Roster(request)) => return self.answer_roster(peer, request),
            Ok(Frame::Refused { .. }) => return unproven(self.refuse("unexpected_refusal")),
            Ok(Frame::LogAnswer { .. }) => return unproven(self.refuse("unexpected_answer")),
            Err(_) => return unproven(self.refuse("malformed")),
        };
        if let Err(error) = self.trust.check_peer(&peer, &admission) {
            debug!(peer = %peer.printable(&self.mesh), %error, "refused a frame from an unadmitted peer");
            // Counted by reason here; the peer learns no more than "rejected".
            self.metrics.frame_refused(&not_admitted(&error));
            return Answer {
                payload: Frame::refused("rejected"),
                standing: Standing::Refused,
            };
        }
        Answer {
            payload: self.answer_admitted(peer, listen, message).await,
            standing: Standing::Admitted,
        }
    }

    /// A peer asks for the trust log: an admitted node gets the checkpoint held and
    /// the leaves it asked for (it verifies them itself).
    fn answer_log(&self, peer: PeerId, admission: &[u8], from: u64, max: u32) -> Answer {
        if let Err(error) = self.trust.check_peer(&peer, admission) {
            self.metrics.frame_refused(&not_admitted(&error));
            return Answer {
                payload: Frame::refused("rejected"),
                standing: Standing::Refused,
            };
        }
        let (checkpoint, leaves) = self
            .trust
            .log()
            .answer(from, max.min(MAX_LOG_LEAVES) as usize);
        Answer {
            payload: Frame::LogAnswer { checkpoint, leaves }.encode(),
            standing: Standing::Admitted,
        }
    }

    /// A peer's gossip: an admitted node gets what this one holds (see
    /// [`crate::gossip`]); an agent that runs no gossip refuses it.
    fn answer_roster(&self, peer: PeerId, request: crate::gossip::RosterFrame) -> Answer {
        // A current member needs no admission; anyone else shows one.
        let gossip = self.gossip.get();
        match &request.admission {
            Some(admission) => {
                if let Err(error) = self.trust.check_peer(&peer, admission) {
                    self.metrics.frame_refused(&not_admitted(&error));
                    return Answer {
                        payload: Frame::refused("rejected"),
                        standing: Standing::Refused,
                    };
                }
            }
            None if gossip.is_some_and(|g| g.member(&peer).is_some()) => {}
            None => {
                return Answer {
                    payload: self.refuse(crate::gossip::ADMISSION_WANTED),
                    standing: Standing::Unproven,
                }
            }
        }
        let Some(gossip) = gossip else {
            return Answer {
                payload: self.refuse("no_gossip"),
                standing: Standing::Admitted,
            };
        };
        let answer = Frame::Roster(gossip.answer(&self.metrics, peer, request)).encode();
        self.metrics.gossip_sent("answer", answer.len());
        Answer {
            payload: answer,
            standing: Standing::Admitted,
        }
    }

    /// Serves gossip frames with `state` from now on.
    pub fn serve_gossip(&self, state: Arc<crate::gossip::GossipState>) {
        let _ = self.gossip.set(state);
    }

    /// Switches the node to one-hop routing over `members`, or gives it a newer list.
    pub async fn set_members(&self, members: themis_dht::Members<SocketAddr>) {
        let _ = self.commands.send(Command::SetMembers(members)).await;
    }

    /// The answer to a frame from `peer`, whose admission was checked.
    async fn answer_admitted(
        &self,
        peer: PeerId,
        listen: SocketAddr,
        message: Message<SocketAddr>,
    ) -> Vec<u8> {
        if listen.ip().is_unspecified() || listen.port() == 0 {
            return self.refuse("bad_listen_address");
        }
        let Message::Request { .. } = message else {
            return self.refuse("response_without_request");
        };
        let from = Contact {
            id: Key(peer.0),
            addr: listen,
        };
        let (answer, response) = oneshot::channel();
        let command = Command::Deliver {
            from,
            message,
            answer: Some(answer),
        };
        if self.commands.send(command).await.is_err() {
            return self.refuse("stopped");
        }
        match response.await {
            Ok(message) => Frame::Dht {
                listen: self.me.addr,
                admission: self.trust.own_admission().to_vec(),
                message,
            }
            .encode(),
            // The node refused the request; its counters say why.
            Err(_) => Frame::refused("rejected"),
        }
    }

    fn refuse(&self, reason: &'static str) -> Vec<u8> {
        self.metrics.frame_refused(reason);
        Frame::refused(reason)
    }

    async fn op(&self, op: UserOp) -> Result<Event<SocketAddr>, OverlayError> {
        let (reply, answer) = oneshot::channel();
        self.commands
            .send(Command::Op { op, reply })
            .await
            .map_err(|_| OverlayError::Stopped)?;
        match tokio::time::timeout(self.op_timeout, answer).await {
            Ok(Ok(result)) => result.map_err(OverlayError::from),
            Ok(Err(_)) => Err(OverlayError::Stopped),
            Err(_) => Err(OverlayError::Timeout),
        }
    }
}

/// The metrics label of an operation's result: `ok` or the error's reason.
fn outcome<T>(result: &Result<T, OverlayError>) -> &'static str {
    result.as_ref().err().map_or("ok", OverlayError::reason)
}

/// The metrics label of a frame refused for its admission: `not_admitted_<reason>`.
fn not_admitted(error: &themis_trust::TrustError) -> String {
    format!("not_admitted_{}", error.reason())
}

fn view_of(mesh: &MeshName, peer: &Peer) -> PeerView {
    PeerView {
        id: PeerId(peer.id.0).printable(mesh),
        addr: peer.addr,
    }
}

struct Driver {
    node: Node<SocketAddr>,
    start: Instant,
    mesh: MeshName,
    transport: Arc<dyn Transport>,
    /// Responses to our requests, from the tasks that carried them.
    responses: mpsc::UnboundedSender<(Peer, Message<SocketAddr>)>,
    /// Inbound requests waiting for the node's response, by (peer, request id).
    answers: HashMap<(Key, u64), Reply<Message<SocketAddr>>>,
    ops: HashMap<OpId, Reply<Result<Event<SocketAddr>, Rejection>>>,
    bootstrap: Vec<Peer>,
    attempts: usize,
    join_retry: Duration,
    retry_join_at: Option<Instant>,
    joined: watch::Sender<bool>,
    snapshot: Arc<Mutex<Snapshot>>,
    trust: Arc<MeshTrust>,
    metrics: Arc<Metrics>,
}

impl Driver {
    fn now(&self) -> u64 {
        u64::try_from(self.start.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    /// Creates a ring or makes one join attempt.
    fn begin(&mut self) {
        let now = self.now();
        if self.bootstrap.is_empty() {
            self.node
                .create(now)
                .expect("a fresh node can create a ring");
            info!(id = %view_of(&self.mesh, self.node.contact()).id, "created a ring");
            return;
        }
        let via = self.bootstrap[self.attempts % self.bootstrap.len()].clone();
        self.attempts += 1;
        info!(via = %via.addr, attempt = self.attempts, "joining the ring");
        if let Err(rejection) = self.node.join(now, via) {
            warn!(%rejection, "cannot join");
        }
    }

    async fn run(
        mut self,
        mut commands: mpsc::Receiver<Command>,
        mut responses: mpsc::UnboundedReceiver<(Peer, Message<SocketAddr>)>,
    ) {
        let mut refresh = tokio::time::interval(Duration::from_secs(1));
        self.flush();
        loop {
            let timer = self
                .node
                .poll_timeout()
                .map(|ms| self.start + Duration::from_millis(ms));
            let wake = [timer, self.retry_join_at]
                .into_iter()
                .flatten()
                .min()
                .unwrap_or_else(|| Instant::now() + Duration::from_secs(3600));
            tokio::select! {
                biased;
                Some((from, message)) = responses.recv() => {
                    let now = self.now();
                    self.node.handle(now, from, message);
                }
                command = commands.recv() => match command {
                    Some(Command::Leave(done)) => {
                        self.leave().await;
                        let _ = done.send(());
                        return;
                    }
                    Some(command) => self.command(command),
                    // Every handle dropped: leave as if asked to.
                    None => {
                        self.leave().await;
                        return;
                    }
                },
                _ = tokio::time::sleep_until(wake.into()) => {
                    let now = self.now();
                    self.node.handle_timeout(now);
                    if self.retry_join_at.is_some_and(|at| at <= Instant::now()) {
                        self.retry_join_at = None;
                        self.begin();
                    }
                }
                _ = refresh.tick() => self.refresh_snapshot(),
            }
            self.flush();
        }
    }

    fn command(&mut self, command: Command) {
        let now = self.now();
        match command {
            Command::Deliver {
                from,
                message,
                answer,
            } => {
                let waiting = match (&message, answer) {
                    (Message::Request { id, .. }, Some(answer)) => {
                        let key = (from.id, *id);
                        self.answers.insert(key, answer);
                        Some(key)
                    }
                    _ => None,
                };
                self.node.handle(now, from, message);
                self.flush();
                // A request the node refused gets no response: its waiter is dropped
                // and the peer hears `Refused`.
                if let Some(key) = waiting {
                    self.answers.remove(&key);
                }
            }
            Command::Op { op, reply } => {
                let started = match op {
                    UserOp::Find(key) => self.node.find(now, key),
                    UserOp::Store {
                        name,
                        value,
                        k,
                        ttl,
                    } => {
                        let ttl = u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX);
                        self.node.store(now, &name, value, k, ttl)
                    }
                    UserOp::Resolve { name, k } => self.node.resolve(now, &name, k),
                };
                match started {
                    Ok(op) => {
                        self.ops.insert(op, reply);
                    }
                    Err(rejection) => {
                        let _ = reply.send(Err(rejection));
                    }
                }
            }
            Command::Unstore { name, value } => {
                self.node.unstore(&name, &value);
            }
            Command::View(reply) => {
                let _ = reply.send(self.view());
            }
            Command::SetMembers(members) => {
                let (count, first) = (members.len(), self.node.members().is_none());
                self.node.set_members(now, members);
                if first {
                    info!(
                        members = count,
                        "one-hop routing: holders computed from the membership"
                    );
                }
            }
            Command::Leave(_) => unreachable!("handled by the loop"),
        }
    }

    /// Sends what the node emitted and hands out what it reported.
    fn flush(&mut self) {
        while let Some((to, message)) = self.node.poll_transmit() {
            match message {
                Message::Response { id, .. } => match self.answers.remove(&(to.id, id)) {
                    Some(answer) => {
                        let _ = answer.send(message);
                    }
                    None => debug!(id, "a response nobody waits for"),
                },
                Message::Request { .. } => {
                    drop(self.send(to, message));
                }
            }
        }
        while let Some(event) = self.node.poll_event() {
            self.event(event);
        }
        self.publish_membership();
    }

    /// Mirrors the node's membership into the `joined` watch: the node is the one
    /// source of truth (it also falls out of the ring when it loses every contact).
    fn publish_membership(&self) {
        let joined = self.node.is_joined();
        self.joined.send_if_modified(|published| {
            let changed = *published != joined;
            *published = joined;
            changed
        });
    }

    /// Carries one request on its own task; the response comes back through
    /// `responses`. A failure is left to the node, which times the request out.
    fn send(&self, to: Peer, message: Message<SocketAddr>) -> tokio::task::JoinHandle<()> {
        let frame = Frame::Dht {
            listen: self.node.contact().addr,
            admission: self.trust.own_admission().to_vec(),
            message,
        }
        .encode();
        let request = self.transport.request(PeerId(to.id.0), to.addr, frame);
        let responses = self.responses.clone();
        let (trust, metrics) = (self.trust.clone(), self.metrics.clone());
        tokio::spawn(async move {
            let answer = match request.await {
                Ok(answer) => answer,
                Err(error) => {
                    debug!(peer = %to.addr, %error, "request failed");
                    return;
                }
            };
            match postcard::from_bytes::<Frame>(&answer) {
                Ok(Frame::Dht {
                    message: message @ Message::Response { .. },
                    admission,
                    ..
                }) => match trust.check_peer(&PeerId(to.id.0), &admission) {
                    Ok(()) => {
                        let _ = responses.send((to, message));
                    }
                    // Dropped: the node times the request out and routes around.
                    Err(error) => {
                        debug!(peer = %to.addr, %error, "dropped an answer from an unadmitted peer");
                        metrics.frame_refused(&not_admitted(&error));
                    }
                },
                Ok(Frame::Refused { reason }) => debug!(peer = %to.addr, reason, "refused"),
                _ => debug!(peer = %to.addr, "malformed answer"),
            }
        })
    }

    fn event(&mut self, event: Event<SocketAddr>) {
        let op = match &event {
            Event::Joined { successor } => {
                info!(successor = %successor.addr, "joined the ring");
                return;
            }
            Event::JoinFailed => {
                warn!(retry_in = ?self.join_retry, "no bootstrap node answered; will retry");
                self.retry_join_at = Some(Instant::now() + self.join_retry);
                return;
            }
            Event::Found { op, .. }
            | Event::NotFound { op, .. }
            | Event::Stored { op, .. }
            | Event::Resolved { op, .. } => *op,
        };
        if let Some(reply) = self.ops.remove(&op) {
            let _ = reply.send(Ok(event));
        }
    }

    fn view(&self) -> RingView {
        let now = self.now();
        let mut fingers = self.node.fingers();
        fingers.dedup_by(|a, b| a.1.id == b.1.id);
        RingView {
            me: view_of(&self.mesh, self.node.contact()),
            joined: self.node.is_joined(),
            predecessor: self.node.predecessor().map(|p| view_of(&self.mesh, p)),
            successors: self
                .node
                .successors()
                .iter()
                .map(|p| view_of(&self.mesh, p))
                .collect(),
            fingers: fingers
                .iter()
                .map(|(i, p)| (*i, view_of(&self.mesh, p)))
                .collect(),
            objects: self
                .node
                .objects(now)
                .into_iter()
                .map(|(key, values)| (hex::encode(key.0), values))
                .collect(),
            members: self.node.members().map(themis_dht::Members::len),
        }
    }

    fn refresh_snapshot(&mut self) {
        let objects = self.node.objects(self.now());
        let snapshot = Snapshot {
            stats: self.node.stats().clone(),
            objects: objects.len(),
            values: objects.iter().map(|(_, n)| n).sum(),
        };
        *self.snapshot.lock().expect("never poisoned") = snapshot;
    }

    /// Paper `leave`: queue the farewell messages and wait for their answers.
    async fn leave(&mut self) {
        if !self.node.is_joined() {
            return;
        }
        let now = self.now();
        self.node.leave(now);
        let mut farewells = Vec::new();
        while let Some((to, message)) = self.node.poll_transmit() {
            if let Message::Request { .. } = message {
                farewells.push(self.send(to, message));
            }
        }
        let sent = farewells.len();
        let flushed = tokio::time::timeout(LEAVE_FLUSH_TIMEOUT, join_all(farewells)).await;
        info!(messages = sent, complete = flushed.is_ok(), "left the ring");
        self.publish_membership();
        self.refresh_snapshot();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use themis_dht::message::{Object, Request, MAX_HANDOVER_OBJECTS, MAX_VALUE_LEN};

    /// The largest request an agent can send fits what a connection not admitted yet
    /// may send: else a leaving node's first `Handover` on a new connection would be
    /// refused at its header.
    #[test]
    fn the_largest_request_fits_the_unadmitted_frame_limit() {
        let object = Object {
            key: Key([0xff; 32]),
            value: vec![0xff; MAX_VALUE_LEN],
            ttl_ms: u64::MAX,
        };
        let frame = Frame::Dht {
            listen: "[ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff]:65535"
                .parse()
                .unwrap(),
            admission: vec![0xff; themis_trust::MAX_ENCODED_LEN],
            message: Message::Request {
                id: u64::MAX,
                body: Request::Handover {
                    objects: vec![object; MAX_HANDOVER_OBJECTS],
                },
            },
        };
        let len = frame.encode().len();
        assert!(len <= MAX_REQUEST_FRAME, "{len} > {MAX_REQUEST_FRAME}");
        const { assert!(MAX_REQUEST_FRAME < themis_core::wire::MAX_RECORD_PAYLOAD / 4) };
    }
}
