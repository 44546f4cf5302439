//! The Chord node: routing, maintenance, storage and the user operations, as a
//! sans-IO state machine (see the crate documentation for the driver contract).

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::fmt::Debug;
use std::hash::Hash;

use crate::key::{in_half_open, in_open, Key, KEY_BITS};
use crate::lookup::{Lookup, Purpose};
use crate::membership::{Liveness, Members};
use crate::message::{
    Contact, Message, Request, Response, MAX_HANDOVER_OBJECTS, MAX_NAME_LEN, MAX_REPLICAS,
    MAX_SUCCESSORS, MAX_VALUE_LEN,
};
use crate::policy::{AnyValue, ValuePolicy};
use crate::store::Store;
use crate::{Millis, OpId, Rejection};

mod one_hop;

/// Tunables. The defaults suit a LAN/datacentre mesh.
#[derive(Debug, Clone)]
pub struct Config {
    /// Successor list length `r` (1..=[`MAX_SUCCESSORS`]); the ring survives `r - 1`
    /// adjacent failures.
    pub successors: usize,
    /// A request not answered within this is a failure of the peer.
    pub request_timeout: Millis,
    /// Period of stabilisation (ask the successor for its neighbours, notify).
    pub stabilise_every: Millis,
    /// Period of fixing one finger.
    pub fix_finger_every: Millis,
    /// Period of the predecessor liveness check (and the expiry sweep).
    pub check_predecessor_every: Millis,
    /// Period at which owners re-store their objects; keep it well under their TTL.
    pub republish_every: Millis,
    /// Longest lifetime a node grants a stored value.
    pub max_ttl: Millis,
    /// Most `FindStep`s one lookup may send, so that every lookup terminates. The
    /// default, twice the key bits, is far above the `O(log N)` a healthy ring needs
    /// and still covers walking successor lists while fingers are being built.
    pub max_hops: u32,
    /// Most values the node stores for others.
    pub store_capacity: usize,
    /// One-hop routing ([`Node::set_members`]): how long a member whose request timed
    /// out (or that said goodbye) is passed over as a holder.
    pub down_for: Millis,
    /// One-hop routing: how many more holders a `Store` or `Get` whose holder timed out
    /// tries, each the next member clockwise.
    pub retries: u8,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            successors: 8,
            request_timeout: 1_000,
            stabilise_every: 1_000,
            fix_finger_every: 500,
            check_predecessor_every: 2_000,
            republish_every: 60_000,
            max_ttl: 3_600_000,
            max_hops: 2 * KEY_BITS as u32,
            store_capacity: 100_000,
            down_for: 30_000,
            retries: 2,
        }
    }
}

/// What the node reports to its driver.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event<A> {
    /// The join lookup found our successor; maintenance has started. Also reported
    /// after a node that lost every contact has joined again through its bootstrap.
    Joined {
        /// Our first successor.
        successor: Contact<A>,
    },
    /// The join lookup failed; the node is idle again and `join` may be retried.
    JoinFailed,
    /// A `find` completed.
    Found {
        /// The operation.
        op: OpId,
        /// The key looked up.
        key: Key,
        /// The node responsible for it.
        node: Contact<A>,
        /// Remote `FindStep`s it took (0: answered from our own table).
        hops: u32,
    },
    /// A `find` failed (every candidate dropped, or the hop bound reached).
    NotFound {
        /// The operation.
        op: OpId,
        /// The key looked up.
        key: Key,
        /// `FindStep`s sent before giving up.
        hops: u32,
    },
    /// A `store` completed.
    Stored {
        /// The operation.
        op: OpId,
        /// Replicas acknowledged.
        stored: u8,
        /// Replicas attempted (`k + 1`).
        replicas: u8,
    },
    /// A `resolve` completed: every replica was asked. The values are *unverified*:
    /// any replica holder may have answered anything (see [`Node::resolve`]).
    Resolved {
        /// The operation.
        op: OpId,
        /// The union of the values every replica that answered returned, without
        /// duplicates (in byte order). Empty: no replica that answered had any.
        values: Vec<Vec<u8>>,
        /// Replicas whose `Get` was answered (a failed lookup or a timed-out `Get`
        /// does not count).
        answered: u8,
        /// Replicas asked (`k + 1`).
        replicas: u8,
        /// `FindStep`s over all replicas' lookups.
        hops: u32,
    },
}

/// Counters for metrics and tests.
#[derive(Debug, Clone, Default)]
pub struct Stats {
    /// Inputs refused, by reason.
    pub rejections: BTreeMap<Rejection, u64>,
    /// Requests that timed out (each also removed the peer from the routing state).
    pub timeouts: u64,
    /// Lookups that found a node.
    pub lookups_done: u64,
    /// Lookups that failed.
    pub lookups_failed: u64,
    /// `FindStep`s sent by successful lookups (mean hops = this / `lookups_done`).
    pub lookup_hops: u64,
    /// Owned objects re-stored by the periodic republish (each to its `k + 1` replicas),
    /// and replicas re-stored at once because their holder left the membership.
    pub republished: u64,
    /// One-hop routing: `Store`s and `Get`s sent again to the next holder after a timeout.
    pub retries: u64,
}

impl Stats {
    /// How many inputs were refused for `reason`.
    pub fn rejected(&self, reason: Rejection) -> u64 {
        self.rejections.get(&reason).copied().unwrap_or(0)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Idle,
    Joining,
    Joined,
    Left,
}

/// What an outstanding request was for.
#[derive(Debug)]
enum Pend {
    Find(u64),
    Get {
        op: OpId,
        hops: u32,
    },
    Store(Option<OpId>),
    Neighbours,
    /// Answered with `Ack`; only its failure matters.
    Ack,
    /// One-hop routing: a `Store` or `Get` sent straight to the holder of `key`, tried
    /// `tries` times so far.
    Direct {
        key: Key,
        purpose: Purpose,
        tries: u8,
    },
}

#[derive(Debug)]
struct Pending<A> {
    to: Contact<A>,
    deadline: Millis,
    kind: Pend,
}

#[derive(Debug)]
enum Op {
    Store {
        remaining: u8,
        stored: u8,
        replicas: u8,
    },
    Resolve {
        /// The union so far, deduplicated.
        values: BTreeSet<Vec<u8>>,
        /// Replicas whose lookup and `Get` have not finished yet.
        remaining: u8,
        answered: u8,
        replicas: u8,
        hops: u32,
    },
}

/// The value policy, boxed (a wrapper only so that [`Node`] can derive `Debug`).
struct Policy(Box<dyn ValuePolicy>);

impl Debug for Policy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ValuePolicy")
    }
}

#[derive(Debug)]
struct Owned {
    k: u8,
    ttl: Millis,
}

#[derive(Debug, Default)]
struct Timers {
    stabilise: Millis,
    fix_finger: Millis,
    check_predecessor: Millis,
    republish: Millis,
}

/// A Chord node over addresses of type `A`.
#[derive(Debug)]
pub struct Node<A> {
    me: Contact<A>,
    config: Config,
    state: State,
    table: crate::routing::RoutingTable<A>,
    store: Store,
    policy: Policy,
    /// Our predecessor that announced it was leaving, and until when its hand-over is
    /// still welcome (its `Handover` may arrive after its `Leaving`).
    departed: Option<(Key, Millis)>,
    /// Objects this node published, re-stored every `republish_every`, by (name, value).
    owned: BTreeMap<(Vec<u8>, Vec<u8>), Owned>,
    pending: BTreeMap<u64, Pending<A>>,
    lookups: BTreeMap<u64, Lookup<A>>,
    ops: BTreeMap<OpId, Op>,
    next_id: u64,
    /// Where we joined through; used again if we lose every contact.
    bootstrap: Option<Contact<A>>,
    timers: Timers,
    next_finger: usize,
    fixing_finger: bool,
    stabilising: bool,
    transmits: VecDeque<(Contact<A>, Message<A>)>,
    events: VecDeque<Event<A>>,
    stats: Stats,
    /// One-hop routing: the verified membership, once the driver has given one.
    members: Option<Members<A>>,
    /// One-hop routing: the members seen down by this node itself.
    liveness: Liveness,
}

impl<A: Clone + Eq + Hash + Debug> Node<A> {
    /// A node that is not yet part of a ring; call [`Node::create`] or [`Node::join`].
    /// It keeps any value offered ([`AnyValue`]); see [`Node::with_policy`].
    pub fn new(me: Contact<A>, config: Config) -> Self {
        Node::with_policy(me, config, Box::new(AnyValue))
    }

    /// Like [`Node::new`], with `policy` deciding which values the node keeps and how
    /// (see [`ValuePolicy`]).
    pub fn with_policy(me: Contact<A>, mut config: Config, policy: Box<dyn ValuePolicy>) -> Self {
        config.successors = config.successors.clamp(1, MAX_SUCCESSORS);
        Node {
            table: crate::routing::RoutingTable::new(me.clone(), config.successors),
            store: Store::new(config.store_capacity),
            policy: Policy(policy),
            departed: None,
            me,
            config,
            state: State::Idle,
            owned: BTreeMap::new(),
            pending: BTreeMap::new(),
            lookups: BTreeMap::new(),
            ops: BTreeMap::new(),
            next_id: 1,
            bootstrap: None,
            timers: Timers::default(),
            next_finger: 0,
            fixing_finger: false,
            stabilising: false,
            transmits: VecDeque::new(),
            events: VecDeque::new(),
            stats: Stats::default(),
            members: None,
            liveness: Liveness::default(),
        }
    }

    // ---- driver API -------------------------------------------------------------

    /// Starts a new ring with this node alone in it.
    pub fn create(&mut self, now: Millis) -> Result<(), Rejection> {
        self.expect_state(State::Idle, Rejection::AlreadyJoined)?;
        self.start_maintenance(now);
        Ok(())
    }

    /// Joins the ring `bootstrap` belongs to: looks up our own id through it; the
    /// successor found is ours. Completes with [`Event::Joined`] or [`Event::JoinFailed`].
    pub fn join(&mut self, now: Millis, bootstrap: Contact<A>) -> Result<(), Rejection> {
        self.expect_state(State::Idle, Rejection::AlreadyJoined)?;
        if bootstrap.id == self.me.id {
            return Err(self.reject(Rejection::FromSelf));
        }
        self.bootstrap = Some(bootstrap.clone());
        self.start_join(now, bootstrap);
        Ok(())
    }

    fn start_join(&mut self, now: Millis, bootstrap: Contact<A>) {
        self.state = State::Joining;
        let lid = self.fresh_id();
        self.lookups
            .insert(lid, Lookup::new(self.me.id, Purpose::Join, vec![bootstrap]));
        self.advance(now, lid);
    }

    /// Leaves the ring gracefully (paper `leave`): hands every object and our
    /// predecessor to our successor and our successor list to our predecessor. The
    /// driver should flush [`Node::poll_transmit`] before closing its sockets; the node
    /// ignores all input afterwards.
    pub fn leave(&mut self, now: Millis) {
        if self.state == State::Joined {
            let succ = self.table.successor().clone();
            let pred = self.table.predecessor.clone();
            if succ.id != self.me.id {
                let objects = self.store.objects_outside(None, now);
                self.send_handover(now, &succ, objects);
                let body = Request::Leaving {
                    predecessor: pred.clone(),
                    successors: Vec::new(),
                };
                self.request(now, succ, body, Pend::Ack);
            }
            if let Some(p) = pred.filter(|p| p.id != self.me.id) {
                let body = Request::Leaving {
                    predecessor: None,
                    successors: self.table.successors().to_vec(),
                };
                self.request(now, p, body, Pend::Ack);
            }
        }
        self.state = State::Left;
        self.pending.clear();
        self.lookups.clear();
        self.ops.clear();
    }

    /// Looks up the node responsible for `key`; completes with [`Event::Found`] or
    /// [`Event::NotFound`].
    pub fn find(&mut self, now: Millis, key: Key) -> Result<OpId, Rejection> {
        self.expect_state(State::Joined, Rejection::NotJoined)?;
        let op = OpId(self.fresh_id());
        self.start_lookup(now, key, Purpose::Find(op));
        Ok(op)
    }

    /// Stores `value` under `h(name || r)` for `r` in `0..=k` (paper `store`) and keeps
    /// re-storing it every `republish_every` until [`Node::unstore`]. Completes with
    /// [`Event::Stored`]. The value must pass our own [`ValuePolicy`] (for `h(name || 0)`)
    /// first: what we would refuse, every replica holder running the same policy would.
    /// To move a slot to a new version, store the new value and [`Node::unstore`] the
    /// old one; otherwise the node keeps re-storing both and replica holders refuse the
    /// old one as [`Rejection::Stale`].
    pub fn store(
        &mut self,
        now: Millis,
        name: &[u8],
        value: Vec<u8>,
        k: u8,
        ttl: Millis,
    ) -> Result<OpId, Rejection> {
        self.expect_state(State::Joined, Rejection::NotJoined)?;
        self.check_name(name, k)?;
        if value.len() > MAX_VALUE_LEN {
            return Err(self.reject(Rejection::ValueTooLarge));
        }
        if let Err(r) = self.policy.0.place(&Key::object(name, 0), &value) {
            return Err(self.reject(r));
        }
        let op = OpId(self.fresh_id());
        self.ops.insert(
            op,
            Op::Store {
                remaining: k + 1,
                stored: 0,
                replicas: k + 1,
            },
        );
        self.owned
            .insert((name.to_vec(), value.clone()), Owned { k, ttl });
        self.store_replicas(now, name, &value, k, ttl, Some(op));
        Ok(op)
    }

    /// Stops re-storing `value` under `name`; the stored copies expire with their TTL.
    /// Returns whether it was being re-stored.
    pub fn unstore(&mut self, name: &[u8], value: &[u8]) -> bool {
        self.owned
            .remove(&(name.to_vec(), value.to_vec()))
            .is_some()
    }

    /// Resolves `name` stored with up to `k` extra replicas: looks up every replica
    /// `h(name || r)`, `r` in `0..=k`, at once, sends each holder a `Get`, and completes
    /// with [`Event::Resolved`] once every replica has answered or failed, carrying the
    /// union of what they returned.
    ///
    /// One replica is not enough: its holder may withhold values, return stale or forged
    /// ones, or the lookup may have been misled to the wrong node. Asking all `k + 1`
    /// means a single honest replica holder suffices for a complete answer. The price is
    /// that the union may hold anything a hostile holder sent, so **the caller must
    /// verify every value** (in the agent: the record's signature, its endorsement for
    /// this name, its validity period) **and merge** what is left: keep, per slot (the
    /// owner's instance), only the newest version, as the replica holders' stores do.
    pub fn resolve(&mut self, now: Millis, name: &[u8], k: u8) -> Result<OpId, Rejection> {
        self.expect_state(State::Joined, Rejection::NotJoined)?;
        self.check_name(name, k)?;
        let op = OpId(self.fresh_id());
        self.ops.insert(
            op,
            Op::Resolve {
                values: BTreeSet::new(),
                remaining: k + 1,
                answered: 0,
                replicas: k + 1,
                hops: 0,
            },
        );
        for r in 0..=k {
            self.start_lookup(now, Key::object(name, r), Purpose::Get(op));
        }
        Ok(op)
    }

    /// Takes a message from `from`, whose id the driver has authenticated.
    pub fn handle(&mut self, now: Millis, from: Contact<A>, msg: Message<A>) {
        if matches!(self.state, State::Left | State::Idle) {
            self.reject(Rejection::NotRunning);
            return;
        }
        if from.id == self.me.id {
            self.reject(Rejection::FromSelf);
            return;
        }
        if let Err(r) = msg.check() {
            self.reject(r);
            return;
        }
        if self.members.is_some() {
            // A message from a peer (authenticated by the driver) shows it is up.
            self.liveness.heard(&from.id);
        }
        match msg {
            Message::Request { id, body } => self.on_request(now, from, id, body),
            Message::Response { id, body } => self.on_response(now, from, id, body),
        }
    }

    /// Fires request timeouts and due maintenance.
    pub fn handle_timeout(&mut self, now: Millis) {
        // An idle node still times out what it has in flight: a node whose rejoin
        // failed may have operations waiting on requests, and each must complete.
        if self.state == State::Left {
            return;
        }
        let expired: Vec<u64> = self
            .pending
            .iter()
            .filter(|(_, p)| p.deadline <= now)
            .map(|(&id, _)| id)
            .collect();
        for id in expired {
            // An earlier failure in this loop may have cleared it.
            let Some(p) = self.pending.remove(&id) else {
                continue;
            };
            self.stats.timeouts += 1;
            self.peer_failed(now, &p.to.id);
            self.request_failed(now, p.to, p.kind, true);
        }
        if self.state != State::Joined {
            return;
        }
        // With one-hop routing the membership decides the neighbours: nothing a
        // neighbour says may rewire them, so Chord's stabilisation stays off.
        let chord = self.members.is_none();
        if self.timers.stabilise <= now {
            self.timers.stabilise = now + self.config.stabilise_every;
            if chord {
                self.stabilise(now);
            }
        }
        if self.timers.fix_finger <= now {
            self.timers.fix_finger = now + self.config.fix_finger_every;
            if chord {
                self.fix_finger(now);
            }
        }
        if self.timers.check_predecessor <= now {
            self.timers.check_predecessor = now + self.config.check_predecessor_every;
            self.store.expire(now);
            match &self.members {
                Some(members) => self.liveness.sweep(now, members),
                None => {
                    if let Some(p) = self.table.predecessor.clone() {
                        self.request(now, p, Request::Ping, Pend::Ack);
                    }
                }
            }
        }
        if self.timers.republish <= now {
            self.timers.republish = now + self.config.republish_every;
            self.republish(now);
        }
    }

    /// When [`Node::handle_timeout`] next needs calling.
    pub fn poll_timeout(&self) -> Option<Millis> {
        let requests = self.pending.values().map(|p| p.deadline).min();
        let t = &self.timers;
        let maintenance = (self.state == State::Joined).then(|| {
            t.stabilise
                .min(t.fix_finger)
                .min(t.check_predecessor)
                .min(t.republish)
        });
        match (requests, maintenance) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// The next message to send, and to whom.
    pub fn poll_transmit(&mut self) -> Option<(Contact<A>, Message<A>)> {
        self.transmits.pop_front()
    }

    /// The next event for the driver.
    pub fn poll_event(&mut self) -> Option<Event<A>> {
        self.events.pop_front()
    }

    /// Puts an idle node straight into a converged ring: the given predecessor,
    /// successor list and fingers (`(i, node)`: finger `i`, the successor of
    /// `me + 2^i`), as maintenance would have left them, and starts maintenance. For
    /// simulations too large to join node by node (`tests/sim` builds 10,000-node
    /// rings this way). Hidden from the documentation: a real node learns all of this
    /// through `join` and maintenance. It grants the driver nothing it could not fake
    /// anyway, as the driver owns the node and authenticates every message it feeds in.
    #[doc(hidden)]
    pub fn install_routing(
        &mut self,
        now: Millis,
        predecessor: Option<Contact<A>>,
        successors: Vec<Contact<A>>,
        fingers: impl IntoIterator<Item = (usize, Contact<A>)>,
    ) -> Result<(), Rejection> {
        self.expect_state(State::Idle, Rejection::AlreadyJoined)?;
        self.table.predecessor = predecessor.filter(|p| p.id != self.me.id);
        self.table.set_successors(successors);
        for (i, c) in fingers {
            if i < KEY_BITS && c.id != self.me.id {
                self.table.set_finger(i, c);
            }
        }
        self.start_maintenance(now);
        Ok(())
    }

    // ---- introspection ------------------------------------------------------------

    /// This node's contact.
    pub fn contact(&self) -> &Contact<A> {
        &self.me
    }

    /// Whether the node is in a ring.
    pub fn is_joined(&self) -> bool {
        self.state == State::Joined
    }

    /// The first successor (this node when alone).
    pub fn successor(&self) -> &Contact<A> {
        self.table.successor()
    }

    /// The successor list.
    pub fn successors(&self) -> &[Contact<A>] {
        self.table.successors()
    }

    /// The predecessor, if known.
    pub fn predecessor(&self) -> Option<&Contact<A>> {
        self.table.predecessor.as_ref()
    }

    /// The distinct fingers, each with the lowest index it fills.
    pub fn fingers(&self) -> Vec<(usize, Contact<A>)> {
        let mut out: Vec<(usize, Contact<A>)> = Vec::new();
        for (i, f) in self.table.fingers().iter().enumerate() {
            if let Some(c) = f {
                if out.last().is_none_or(|(_, l)| l.id != c.id) {
                    out.push((i, c.clone()));
                }
            }
        }
        out
    }

    /// The object ids held and their live value counts.
    pub fn objects(&self, now: Millis) -> Vec<(Key, usize)> {
        self.store.summary(now)
    }

    /// The live values held under `key` (what a `Get` would answer).
    pub fn values(&self, key: &Key, now: Millis) -> Vec<Vec<u8>> {
        self.store.get(key, now)
    }

    /// Counters.
    pub fn stats(&self) -> &Stats {
        &self.stats
    }

    // ---- plumbing ------------------------------------------------------------------

    fn fresh_id(&mut self) -> u64 {
        self.next_id += 1;
        self.next_id
    }

    fn reject(&mut self, r: Rejection) -> Rejection {
        *self.stats.rejections.entry(r).or_default() += 1;
        r
    }

    fn expect_state(&mut self, s: State, otherwise: Rejection) -> Result<(), Rejection> {
        if self.state == s {
            Ok(())
        } else {
            Err(self.reject(otherwise))
        }
    }

    fn check_name(&mut self, name: &[u8], k: u8) -> Result<(), Rejection> {
        if k > MAX_REPLICAS {
            return Err(self.reject(Rejection::TooManyReplicas));
        }
        if name.len() > MAX_NAME_LEN {
            return Err(self.reject(Rejection::NameTooLong));
        }
        Ok(())
    }

    fn request(&mut self, now: Millis, to: Contact<A>, body: Request<A>, kind: Pend) {
        let id = self.fresh_id();
        self.pending.insert(
            id,
            Pending {
                to: to.clone(),
                deadline: now + self.config.request_timeout,
                kind,
            },
        );
        self.transmits
            .push_back((to, Message::Request { id, body }));
    }

    fn send_handover(
        &mut self,
        now: Millis,
        to: &Contact<A>,
        objects: Vec<crate::message::Object>,
    ) {
        for chunk in objects.chunks(MAX_HANDOVER_OBJECTS) {
            self.request(
                now,
                to.clone(),
                Request::Handover {
                    objects: chunk.to_vec(),
                },
                Pend::Ack,
            );
        }
    }

    fn start_maintenance(&mut self, now: Millis) {
        self.state = State::Joined;
        self.timers = Timers {
            stabilise: now,
            fix_finger: now + self.config.fix_finger_every,
            check_predecessor: now + self.config.check_predecessor_every,
            republish: now + self.config.republish_every,
        };
    }

    /// A peer failed to answer: forget it, and keep a successor if any peer is left. A
    /// node that has lost every contact (say its join found a successor that died at
    /// once) joins again through its bootstrap node.
    fn peer_failed(&mut self, now: Millis, id: &Key) {
        if self.members.is_some() {
            // A member stays a member: it is only passed over for a while.
            self.liveness
                .failed(*id, now.saturating_add(self.config.down_for));
            return;
        }
        self.table.remove(id);
        if !self.table.successors().is_empty() {
            return;
        }
        let me = self.me.id;
        let fallback = self.table.candidates(&me, &[]);
        self.table.set_successors(fallback);
        let cut_off = self.table.successors().is_empty() && self.table.predecessor.is_none();
        if let Some(b) = self
            .bootstrap
            .clone()
            .filter(|_| cut_off && self.state == State::Joined)
        {
            self.start_join(now, b);
        }
    }

    // ---- requests -------------------------------------------------------------------

    fn on_request(&mut self, now: Millis, from: Contact<A>, id: u64, body: Request<A>) {
        let answer = match body {
            // A node still joining knows no ring yet: naming itself shows no progress,
            // so the asker moves on rather than trust it.
            Request::FindStep { .. } if self.state != State::Joined => Response::Closer {
                node: self.me.clone(),
            },
            Request::FindStep { key, avoid } => self.route(&key, &avoid),
            Request::Get { key } => Response::Values {
                values: self.store.get(&key, now),
            },
            Request::Store { key, value, ttl_ms } => match self.keep(now, key, value, ttl_ms) {
                Ok(()) => Response::Ack,
                Err(_) => Response::Rejected,
            },
            Request::GetNeighbours => Response::Neighbours {
                predecessor: self.table.predecessor.clone(),
                successors: self.table.successors().to_vec(),
            },
            // With one-hop routing the membership names our predecessor.
            Request::Notify if self.members.is_some() => Response::Ack,
            Request::Notify => {
                self.on_notify(now, &from);
                Response::Ack
            }
            Request::Handover { .. } | Request::Leaving { .. }
                if !self.is_neighbour(now, &from) =>
            {
                self.reject(Rejection::NotNeighbour);
                Response::Rejected
            }
            Request::Handover { objects } => {
                // Each object is refused or kept on its own (and counted if refused):
                // one bad object must not cost the others.
                for o in objects {
                    let _ = self.keep(now, o.key, o.value, o.ttl_ms);
                }
                Response::Ack
            }
            Request::Leaving {
                predecessor,
                successors,
            } => {
                self.on_leaving(now, &from, predecessor, successors);
                Response::Ack
            }
            Request::Ping => Response::Ack,
        };
        self.transmits
            .push_back((from, Message::Response { id, body: answer }));
    }

    /// Offers a value to our store through the policy; counts a refusal. The lifetime
    /// granted is the shortest of the one asked for, `max_ttl` and the policy's cap; a
    /// value granted none is refused as [`Rejection::InvalidValue`].
    fn keep(
        &mut self,
        now: Millis,
        key: Key,
        value: Vec<u8>,
        ttl_ms: Millis,
    ) -> Result<(), Rejection> {
        if self
            .store
            .refresh(&key, &value, now, ttl_ms.min(self.config.max_ttl))
        {
            return Ok(());
        }
        let placed = self.policy.0.place(&key, &value).and_then(|p| {
            let ttl = ttl_ms
                .min(self.config.max_ttl)
                .min(p.ttl_cap.unwrap_or(Millis::MAX));
            if ttl == 0 {
                return Err(Rejection::InvalidValue);
            }
            self.store
                .insert(key, &p, value, now.saturating_add(ttl), now)
        });
        placed.map_err(|r| self.reject(r))
    }

    /// Whether `from` may hand objects over to us or tell us it is leaving: our
    /// predecessor (or the one that has just announced its leave, whose hand-over may
    /// arrive after its `Leaving`), or a node in our successor list.
    fn is_neighbour(&self, now: Millis, from: &Contact<A>) -> bool {
        self.table
            .predecessor
            .as_ref()
            .is_some_and(|p| p.id == from.id)
            || self.table.successors().iter().any(|s| s.id == from.id)
            || self
                .departed
                .is_some_and(|(id, until)| id == from.id && now <= until)
    }

    /// One routing step for `key` (Chord's `find_successor` without the recursion),
    /// treating the peers in `avoid` as absent.
    fn route(&self, key: &Key, avoid: &[Key]) -> Response<A> {
        if self.table.successors().is_empty() {
            // Alone in the ring: every key is ours.
            return Response::Responsible {
                node: self.me.clone(),
            };
        }
        let succ = self
            .table
            .successors()
            .iter()
            .find(|c| !avoid.contains(&c.id));
        if let Some(succ) = succ.filter(|s| in_half_open(key, &self.me.id, &s.id)) {
            return Response::Responsible { node: succ.clone() };
        }
        // Knowing nobody closer, we name ourselves: the asker sees no progress.
        let next = self.table.closest_preceding(key, avoid).unwrap_or(&self.me);
        Response::Closer { node: next.clone() }
    }

    /// `from` thinks it may be our predecessor (paper `update`). If we adopt it, it takes
    /// over the keys in `(old predecessor, from]`, so we hand them over. We keep our
    /// copies until they expire: a hand-over lost in flight, or a newcomer that dies at
    /// once, then costs nothing.
    fn on_notify(&mut self, now: Millis, from: &Contact<A>) {
        let adopt = match &self.table.predecessor {
            None => true,
            Some(p) => in_open(&from.id, &p.id, &self.me.id),
        };
        if !adopt {
            return;
        }
        self.table.predecessor = Some(from.clone());
        if self.table.successors().is_empty() {
            // We were alone: the first node to notify us is also our successor.
            self.table.set_successors(vec![from.clone()]);
        }
        let objects = self
            .store
            .objects_outside(Some((&from.id, &self.me.id)), now);
        self.send_handover(now, from, objects);
    }

    fn on_leaving(
        &mut self,
        now: Millis,
        from: &Contact<A>,
        predecessor: Option<Contact<A>>,
        successors: Vec<Contact<A>>,
    ) {
        if self.members.is_some() {
            // Its own farewell: passed over for a while, still a member (the driver
            // removes members when the trust log does).
            self.liveness
                .failed(from.id, now.saturating_add(self.config.down_for));
            if self
                .table
                .predecessor
                .as_ref()
                .is_some_and(|p| p.id == from.id)
            {
                self.departed = Some((from.id, now + self.config.request_timeout));
            }
            return;
        }
        let was_predecessor = self
            .table
            .predecessor
            .as_ref()
            .is_some_and(|p| p.id == from.id);
        let was_successor = self.table.successors().iter().any(|s| s.id == from.id);
        self.table.remove(&from.id);
        if was_predecessor {
            self.table.predecessor = predecessor.filter(|p| p.id != self.me.id);
            self.departed = Some((from.id, now + self.config.request_timeout));
        }
        if was_successor && !successors.is_empty() {
            let mut list = self.table.successors().to_vec();
            list.extend(successors.into_iter().filter(|c| c.id != from.id));
            self.table.set_successors(list);
        }
        if self.table.successors().is_empty() {
            self.peer_failed(now, &from.id);
        }
    }

    // ---- responses ------------------------------------------------------------------

    fn on_response(&mut self, now: Millis, from: Contact<A>, id: u64, body: Response<A>) {
        let Some(p) = self.pending.remove(&id) else {
            self.reject(Rejection::UnknownRequest);
            return;
        };
        if p.to.id != from.id {
            // Not from the peer we asked: ignore it, keep waiting for the real answer.
            self.pending.insert(id, p);
            self.reject(Rejection::UnexpectedSender);
            return;
        }
        match (p.kind, body) {
            (Pend::Find(lid), answer) => {
                let Some(l) = self.lookups.get_mut(&lid) else {
                    return;
                };
                match l.on_answer(&from, answer) {
                    Ok(Some(node)) => self.complete(now, lid, Some(node)),
                    Ok(None) => self.advance(now, lid),
                    Err(r) => {
                        self.reject(r);
                        self.advance(now, lid);
                    }
                }
            }
            (Pend::Get { op, hops }, Response::Values { values }) => {
                self.resolve_step(op, Some(values), hops)
            }
            (Pend::Store(op), Response::Ack) => self.store_done(op, true),
            (Pend::Store(op), Response::Rejected) => {
                self.reject(Rejection::Refused);
                self.store_done(op, false);
            }
            (
                Pend::Neighbours,
                Response::Neighbours {
                    predecessor,
                    successors,
                },
            ) => self.on_neighbours(now, from, predecessor, successors),
            (Pend::Ack, Response::Ack) => {}
            (
                Pend::Direct {
                    key,
                    purpose,
                    tries,
                },
                answer,
            ) => self.direct_answered(now, key, purpose, tries, answer),
            (kind, _) => {
                self.reject(Rejection::UnexpectedResponse);
                self.request_failed(now, from, kind, false);
            }
        }
    }

    /// A request failed: timed out (the peer is then already forgotten) or answered
    /// with the wrong kind of response.
    fn request_failed(&mut self, now: Millis, to: Contact<A>, kind: Pend, timed_out: bool) {
        match kind {
            Pend::Find(lid) => {
                if let Some(l) = self.lookups.get_mut(&lid) {
                    l.drop_peer(to.id);
                    self.advance(now, lid);
                }
            }
            Pend::Get { op, hops } => self.resolve_step(op, None, hops),
            Pend::Store(op) => self.store_done(op, false),
            Pend::Neighbours => {
                self.stabilising = false;
                if timed_out {
                    // Our successor is gone: move to the next one at once.
                    self.stabilise(now);
                }
            }
            Pend::Ack => {}
            Pend::Direct {
                key,
                purpose,
                tries,
            } => self.direct_failed(now, key, purpose, tries, timed_out),
        }
    }

    // ---- lookups --------------------------------------------------------------------

    /// Starts a lookup from our own routing state.
    fn start_lookup(&mut self, now: Millis, key: Key, purpose: Purpose) {
        if self.members.is_some() {
            return self.direct(now, key, purpose, 0);
        }
        let lid = self.fresh_id();
        let me = self.me.clone();
        let local = if self
            .table
            .predecessor
            .as_ref()
            .is_some_and(|p| in_half_open(&key, &p.id, &me.id))
        {
            Some(me)
        } else if in_half_open(&key, &me.id, &self.table.successor().id) {
            Some(self.table.successor().clone())
        } else {
            None
        };
        let seeds = if local.is_some() {
            Vec::new()
        } else {
            self.table.candidates(&key, &[])
        };
        self.lookups.insert(lid, Lookup::new(key, purpose, seeds));
        match local {
            Some(node) => self.complete(now, lid, Some(node)),
            None => self.advance(now, lid),
        }
    }

    /// Sends the next `FindStep`, or finishes the lookup if no candidate is left.
    fn advance(&mut self, now: Millis, lid: u64) {
        loop {
            let Some(l) = self.lookups.get_mut(&lid) else {
                return;
            };
            if l.hops >= self.config.max_hops {
                return self.complete(now, lid, None);
            }
            let Some(c) = l.next_candidate() else {
                let (key, avoid) = (l.key, l.avoid().to_vec());
                let found = self.responsible_past(&key, &avoid);
                return self.complete(now, lid, found);
            };
            let (key, avoid) = (l.key, l.avoid().to_vec());
            if c.id != self.me.id {
                l.hops += 1;
                return self.request(now, c, Request::FindStep { key, avoid }, Pend::Find(lid));
            }
            // A peer pointed back at us: answer that step from our own table.
            let answer = self.route(&key, &avoid);
            let l = self.lookups.get_mut(&lid).expect("still running");
            if let Ok(Some(node)) = l.on_answer(&self.me, answer) {
                return self.complete(now, lid, Some(node));
            }
        }
    }

    /// When every candidate preceding `key` was dropped, our own successor list may
    /// still route around them: if the first successor not in `avoid` is at or past
    /// the key, and every successor before it was dropped, it is responsible.
    fn responsible_past(&self, key: &Key, avoid: &[Key]) -> Option<Contact<A>> {
        let live = self
            .table
            .successors()
            .iter()
            .find(|s| s.id != self.me.id && !avoid.contains(&s.id))?;
        in_half_open(key, &self.me.id, &live.id).then(|| live.clone())
    }

    fn complete(&mut self, now: Millis, lid: u64, found: Option<Contact<A>>) {
        let Some(l) = self.lookups.remove(&lid) else {
            return;
        };
        match &found {
            Some(_) => {
                self.stats.lookups_done += 1;
                self.stats.lookup_hops += u64::from(l.hops);
            }
            None => self.stats.lookups_failed += 1,
        }
        match (l.purpose, found) {
            // Given a membership while the join was in flight: it decides the table,
            // and the node runs whatever the join found.
            (Purpose::Join, _) if self.members.is_some() => {}
            (Purpose::Join, Some(successor)) => {
                self.table.set_successors(vec![successor.clone()]);
                self.start_maintenance(now);
                self.events.push_back(Event::Joined { successor });
            }
            (Purpose::Join, None) => {
                self.state = State::Idle;
                self.events.push_back(Event::JoinFailed);
            }
            (Purpose::Finger(i), found) => self.finger_found(i, found),
            (Purpose::Find(op), Some(node)) => self.events.push_back(Event::Found {
                op,
                key: l.key,
                node,
                hops: l.hops,
            }),
            (Purpose::Find(op), None) => self.events.push_back(Event::NotFound {
                op,
                key: l.key,
                hops: l.hops,
            }),
            (Purpose::Store { op, value, ttl_ms }, Some(node)) => {
                if node.id == self.me.id {
                    let ok = self.keep(now, l.key, value, ttl_ms).is_ok();
                    self.store_done(op, ok);
                } else {
                    self.request(
                        now,
                        node,
                        Request::Store {
                            key: l.key,
                            value,
                            ttl_ms,
                        },
                        Pend::Store(op),
                    );
                }
            }
            (Purpose::Store { op, .. }, None) => self.store_done(op, false),
            (Purpose::Get(op), Some(node)) => {
                if node.id == self.me.id {
                    let values = self.store.get(&l.key, now);
                    self.resolve_step(op, Some(values), l.hops);
                } else {
                    self.request(
                        now,
                        node,
                        Request::Get { key: l.key },
                        Pend::Get { op, hops: l.hops },
                    );
                }
            }
            (Purpose::Get(op), None) => self.resolve_step(op, None, l.hops),
        }
    }

    // ---- user operations --------------------------------------------------------------

    fn store_replicas(
        &mut self,
        now: Millis,
        name: &[u8],
        value: &[u8],
        k: u8,
        ttl_ms: Millis,
        op: Option<OpId>,
    ) {
        for r in 0..=k {
            let purpose = Purpose::Store {
                op,
                value: value.to_vec(),
                ttl_ms,
            };
            self.start_lookup(now, Key::object(name, r), purpose);
        }
    }

    fn store_done(&mut self, op: Option<OpId>, ok: bool) {
        let Some(op) = op else { return };
        let Some(Op::Store {
            remaining,
            stored,
            replicas,
        }) = self.ops.get_mut(&op)
        else {
            return;
        };
        *remaining -= 1;
        *stored += u8::from(ok);
        if *remaining == 0 {
            let (stored, replicas) = (*stored, *replicas);
            self.ops.remove(&op);
            self.events.push_back(Event::Stored {
                op,
                stored,
                replicas,
            });
        }
    }

    /// One replica of a resolve answered (`Some`) or failed (`None`: its lookup failed
    /// or its `Get` timed out or was answered wrongly); once all have, report.
    fn resolve_step(&mut self, op: OpId, values: Option<Vec<Vec<u8>>>, step_hops: u32) {
        let Some(Op::Resolve {
            values: union,
            remaining,
            answered,
            replicas,
            hops,
        }) = self.ops.get_mut(&op)
        else {
            return;
        };
        *hops += step_hops;
        *remaining -= 1;
        if let Some(values) = values {
            *answered += 1;
            union.extend(values);
        }
        if *remaining > 0 {
            return;
        }
        let (answered, replicas, hops) = (*answered, *replicas, *hops);
        let Some(Op::Resolve { values, .. }) = self.ops.remove(&op) else {
            unreachable!("matched above")
        };
        self.events.push_back(Event::Resolved {
            op,
            values: values.into_iter().collect(),
            answered,
            replicas,
            hops,
        });
    }

    fn republish(&mut self, now: Millis) {
        let owned: Vec<(Vec<u8>, Vec<u8>, u8, Millis)> = self
            .owned
            .iter()
            .map(|((n, v), o)| (n.clone(), v.clone(), o.k, o.ttl))
            .collect();
        for (name, value, k, ttl) in owned {
            self.stats.republished += 1;
            self.store_replicas(now, &name, &value, k, ttl, None);
        }
    }

    // ---- maintenance (paper `update`) -------------------------------------------------

    /// Asks our successor for its predecessor and successor list.
    fn stabilise(&mut self, now: Millis) {
        if self.stabilising {
            return;
        }
        let succ = self.table.successor().clone();
        if succ.id != self.me.id {
            self.stabilising = true;
            return self.request(now, succ, Request::GetNeighbours, Pend::Neighbours);
        }
        // Alone, but someone notified us: it is our successor too.
        if let Some(p) = self.table.predecessor.clone() {
            self.table.set_successors(vec![p.clone()]);
            self.request(now, p, Request::Notify, Pend::Ack);
        }
    }

    /// Adopts a closer successor if our successor's predecessor lies between us, takes
    /// its successor list, and notifies our successor. After adopting a closer one we
    /// ask it at once rather than a tick later: a newcomer whose join lookup landed too
    /// far round the ring (other joins were in flight) walks back in round trips, not
    /// in stabilisation periods. Each step gets strictly closer, so this ends.
    fn on_neighbours(
        &mut self,
        now: Millis,
        from: Contact<A>,
        predecessor: Option<Contact<A>>,
        successors: Vec<Contact<A>>,
    ) {
        self.stabilising = false;
        let mut list = successors;
        if let Some(x) = predecessor.filter(|x| in_open(&x.id, &self.me.id, &from.id)) {
            list.push(x);
        }
        list.push(from.clone());
        self.table.set_successors(list);
        let succ = self.table.successor().clone();
        if succ.id != from.id {
            self.stabilise(now);
        } else {
            self.request(now, succ, Request::Notify, Pend::Ack);
        }
    }

    /// Refreshes the next finger that is not simply our successor: fingers whose target
    /// lies in `(me, successor]` are filled without a lookup, so a full round takes about
    /// `log2 N` lookups rather than 256.
    fn fix_finger(&mut self, now: Millis) {
        if self.fixing_finger {
            return;
        }
        let succ = self.table.successor().clone();
        if succ.id == self.me.id {
            return;
        }
        let mut i = self.next_finger;
        while i < KEY_BITS && in_half_open(self.table.target(i), &self.me.id, &succ.id) {
            self.table.set_finger(i, succ.clone());
            i += 1;
        }
        if i == KEY_BITS {
            self.next_finger = 0;
            return;
        }
        self.fixing_finger = true;
        self.start_lookup(now, *self.table.target(i), Purpose::Finger(i));
    }

    /// Sets finger `i` and every following finger whose target the same node covers.
    fn finger_found(&mut self, i: usize, found: Option<Contact<A>>) {
        self.fixing_finger = false;
        let mut next = i + 1;
        if let Some(node) = found.filter(|n| n.id != self.me.id) {
            self.table.set_finger(i, node.clone());
            while next < KEY_BITS && in_half_open(self.table.target(next), &self.me.id, &node.id) {
                self.table.set_finger(next, node.clone());
                next += 1;
            }
        }
        self.next_finger = if next >= KEY_BITS { 0 } else { next };
    }
}
