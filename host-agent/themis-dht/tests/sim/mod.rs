//! A deterministic, single-threaded simulation of a Themis ring: `N` nodes addressed by
//! index, a virtual millisecond clock, a message queue with a seeded random delay, and
//! the ability to kill nodes (messages to a dead node are dropped, so its peers see
//! timeouts). Same seed, same run. Nodes under the adversary's control answer some
//! requests as the test tells them ([`Adversary`]) and everything else honestly.

// Each test binary uses a different part of the harness.
#![allow(dead_code)]

pub mod records;

use std::cmp::Ordering;
use std::collections::{BTreeMap, BinaryHeap};
use std::sync::atomic::{AtomicU64, Ordering as AtomicOrdering};
use std::sync::Arc;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use themis_core::PeerId;
use themis_dht::{
    in_half_open, Config, Contact, Event, Key, Members, Message, Node, OpId, Request, Response,
    ValuePolicy,
};

/// What a node under the adversary's control does differently; every other request it
/// handles honestly, so it stays in the ring.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Adversary {
    /// How it answers `FindStep`s.
    pub find: Option<FindLie>,
    /// How it answers `Get`s.
    pub get: Option<GetLie>,
    /// Answers `Store` with `Rejected` (and keeps nothing).
    pub refuse_stores: bool,
    /// Answers nothing at all (a member that stays in the membership, up but mute).
    pub silent: bool,
}

impl Adversary {
    pub fn find(lie: FindLie) -> Adversary {
        Adversary {
            find: Some(lie),
            ..Adversary::default()
        }
    }

    pub fn get(lie: GetLie) -> Adversary {
        Adversary {
            get: Some(lie),
            ..Adversary::default()
        }
    }
}

/// Wrong answers to `FindStep`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FindLie {
    /// `Closer` naming itself: no progress.
    PointsAtItself,
    /// `Closer` naming its predecessor: backwards.
    PointsBackwards,
    /// `Responsible` naming its predecessor: a node before the key (or the answerer
    /// itself when it has none).
    ResponsibleBeforeKey,
    /// `Responsible` naming itself: a ring-of-one claim, for any key.
    ClaimsItself,
    /// Collusion with full knowledge of the ring: `Responsible` naming the first
    /// adversary at or after the key — an answer no local check can tell from the truth.
    Hijack,
}

/// Wrong answers to `Get`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GetLie {
    /// `Values` with nothing.
    Withhold,
    /// `Values` with these (say, junk or stale records), whatever the key.
    Answer(Vec<Vec<u8>>),
    /// `Values` with this many fresh random 64-byte strings (junk).
    Junk(usize),
    /// `Values` with every value any adversary saw stored under the key while
    /// [`Sim::record_seen`] was on (old versions, once the owners have moved on).
    Replay,
}

enum What {
    Deliver {
        from: usize,
        to: usize,
        msg: Message<usize>,
    },
    Timer {
        node: usize,
    },
}

struct Scheduled {
    at: u64,
    seq: u64,
    what: What,
}

impl PartialEq for Scheduled {
    fn eq(&self, o: &Self) -> bool {
        (self.at, self.seq) == (o.at, o.seq)
    }
}
impl Eq for Scheduled {}
impl PartialOrd for Scheduled {
    fn partial_cmp(&self, o: &Self) -> Option<Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Scheduled {
    // Reversed: BinaryHeap is a max-heap and we want the earliest first.
    fn cmp(&self, o: &Self) -> Ordering {
        (o.at, o.seq).cmp(&(self.at, self.seq))
    }
}

/// Makes the value policy of each node the harness adds.
pub type PolicyFactory = Box<dyn Fn() -> Box<dyn ValuePolicy>>;

pub struct Sim {
    pub nodes: Vec<Node<usize>>,
    pub alive: Vec<bool>,
    pub adversaries: BTreeMap<usize, Adversary>,
    /// Values adversaries saw in `Store`s they refused, by key (for [`GetLie::Replay`]).
    pub seen: BTreeMap<Key, Vec<Vec<u8>>>,
    /// Whether adversaries record what they see.
    pub record_seen: bool,
    /// The policy of nodes added from now on (`None`: the default, `AnyValue`).
    pub policy: Option<PolicyFactory>,
    /// The virtual clock, shared with policies that need the time.
    pub clock: Arc<AtomicU64>,
    pub now: u64,
    pub config: Config,
    /// Events reported by each node, in order.
    pub events: Vec<Vec<Event<usize>>>,
    pub delivered: u64,
    pub dropped: u64,
    queue: BinaryHeap<Scheduled>,
    timer_at: Vec<Option<u64>>,
    /// Bootstrap node and joins left to try, per node: like a driver, the harness
    /// retries a failed join.
    joining: Vec<(usize, u32)>,
    seq: u64,
    rng: ChaCha8Rng,
    /// Message delay range in ms (inclusive); `(0, 0)` delivers at once, in order.
    delay: (u64, u64),
    sorted: Option<Vec<(Key, usize)>>,
}

impl Sim {
    pub fn new(seed: u64, config: Config, delay: (u64, u64)) -> Sim {
        Sim {
            nodes: Vec::new(),
            alive: Vec::new(),
            adversaries: BTreeMap::new(),
            seen: BTreeMap::new(),
            record_seen: true,
            policy: None,
            clock: Arc::new(AtomicU64::new(0)),
            now: 0,
            config,
            events: Vec::new(),
            delivered: 0,
            dropped: 0,
            queue: BinaryHeap::new(),
            timer_at: Vec::new(),
            joining: Vec::new(),
            seq: 0,
            rng: ChaCha8Rng::seed_from_u64(seed),
            delay,
            sorted: None,
        }
    }

    pub fn rng(&mut self) -> &mut ChaCha8Rng {
        &mut self.rng
    }

    pub fn contact(&self, i: usize) -> Contact<usize> {
        self.nodes[i].contact().clone()
    }

    /// Adds a node with a random id; it is not in the ring until `create` or `join`.
    pub fn add_node(&mut self) -> usize {
        let id = Key::from(PeerId(self.rng.random()));
        let i = self.nodes.len();
        let me = Contact { id, addr: i };
        self.nodes.push(match &self.policy {
            Some(policy) => Node::with_policy(me, self.config.clone(), policy()),
            None => Node::new(me, self.config.clone()),
        });
        self.alive.push(true);
        self.events.push(Vec::new());
        self.timer_at.push(None);
        self.joining.push((0, 0));
        self.sorted = None;
        i
    }

    /// A ring of one.
    pub fn create(&mut self, i: usize) {
        self.nodes[i].create(self.now).expect("create");
        self.after(i);
    }

    pub fn join(&mut self, i: usize, bootstrap: usize) {
        self.joining[i] = (bootstrap, 3);
        let b = self.contact(bootstrap);
        self.nodes[i].join(self.now, b).expect("join");
        self.after(i);
    }

    /// Stops a node without a word: its peers find out by timeouts.
    pub fn kill(&mut self, i: usize) {
        self.alive[i] = false;
        self.sorted = None;
    }

    /// Leaves gracefully: the node's farewell messages are queued, then it is gone.
    pub fn leave(&mut self, i: usize) {
        let now = self.now;
        self.nodes[i].leave(now);
        self.after(i);
        self.kill(i);
    }

    pub fn live(&self) -> impl Iterator<Item = usize> + '_ {
        (0..self.nodes.len()).filter(|&i| self.alive[i])
    }

    /// Runs a user operation on node `i` and processes its output.
    pub fn op<T>(&mut self, i: usize, f: impl FnOnce(&mut Node<usize>, u64) -> T) -> T {
        let now = self.now;
        let out = f(&mut self.nodes[i], now);
        self.after(i);
        out
    }

    /// Queues a hand-made message, as if `from` had sent it.
    pub fn inject(&mut self, from: usize, to: usize, msg: Message<usize>) {
        self.push(self.now, What::Deliver { from, to, msg });
    }

    /// Removes the first queued message sent by `from` and returns it with its
    /// destination, so a test can tamper with the exchange.
    pub fn take_queued(&mut self, from: usize) -> Option<(usize, Message<usize>)> {
        let mut all = std::mem::take(&mut self.queue).into_sorted_vec();
        // into_sorted_vec is ascending by our reversed order: the earliest is last.
        let at = all
            .iter()
            .rposition(|s| matches!(s.what, What::Deliver { from: f, .. } if f == from))?;
        let taken = all.remove(at);
        self.queue = all.into_iter().collect();
        match taken.what {
            What::Deliver { to, msg, .. } => Some((to, msg)),
            What::Timer { .. } => unreachable!("matched a delivery"),
        }
    }

    /// Drains a node's output into the queue and reschedules its timer.
    fn after(&mut self, i: usize) {
        while let Some((to, msg)) = self.nodes[i].poll_transmit() {
            let d = if self.delay.1 == 0 {
                0
            } else {
                self.rng.random_range(self.delay.0..=self.delay.1)
            };
            self.push(
                self.now + d,
                What::Deliver {
                    from: i,
                    to: to.addr,
                    msg,
                },
            );
        }
        let mut rejoin = false;
        while let Some(e) = self.nodes[i].poll_event() {
            rejoin |= e == Event::JoinFailed;
            self.events[i].push(e);
        }
        if rejoin && self.joining[i].1 > 0 {
            self.joining[i].1 -= 1;
            let b = self.contact(self.joining[i].0);
            self.nodes[i]
                .join(self.now, b)
                .expect("idle after a failed join");
            return self.after(i);
        }
        let t = self.nodes[i].poll_timeout().map(|t| t.max(self.now));
        if t != self.timer_at[i] {
            self.timer_at[i] = t;
            if let Some(t) = t {
                self.push(t, What::Timer { node: i });
            }
        }
    }

    fn push(&mut self, at: u64, what: What) {
        self.seq += 1;
        self.queue.push(Scheduled {
            at,
            seq: self.seq,
            what,
        });
    }

    /// Processes everything scheduled up to `t`, then sets the clock to `t`.
    pub fn run_until(&mut self, t: u64) {
        while self.queue.peek().is_some_and(|s| s.at <= t) {
            let s = self.queue.pop().expect("peeked");
            self.set_now(s.at);
            match s.what {
                What::Timer { node } => {
                    // A stale entry: the node's deadline moved since it was queued.
                    if self.timer_at[node] != Some(s.at) || !self.alive[node] {
                        continue;
                    }
                    self.timer_at[node] = None;
                    self.nodes[node].handle_timeout(self.now);
                    self.after(node);
                }
                What::Deliver { from, to, msg } => {
                    let mute = self.adversaries.get(&to).is_some_and(|a| a.silent);
                    if !self.alive[to] || mute {
                        self.dropped += 1;
                        continue;
                    }
                    self.delivered += 1;
                    match self.adversary_reply(to, &msg) {
                        Some(reply) => {
                            let d = self.delay.0;
                            self.push(
                                self.now + d,
                                What::Deliver {
                                    from: to,
                                    to: from,
                                    msg: reply,
                                },
                            );
                        }
                        None => {
                            let f = self.contact(from);
                            self.nodes[to].handle(self.now, f, msg);
                            self.after(to);
                        }
                    }
                }
            }
        }
        self.set_now(t);
    }

    fn set_now(&mut self, t: u64) {
        self.now = t;
        self.clock.store(t, AtomicOrdering::Relaxed);
    }

    /// The answer of adversary `to` to `msg`, if it lies about it.
    fn adversary_reply(&mut self, to: usize, msg: &Message<usize>) -> Option<Message<usize>> {
        let adv = self.adversaries.get(&to)?;
        let Message::Request { id, body } = msg else {
            return None;
        };
        let body = match body {
            Request::FindStep { key, .. } => {
                let lie = adv.find?;
                let me = self.contact(to);
                let pred = self.nodes[to].predecessor().cloned();
                match lie {
                    FindLie::PointsAtItself => Response::Closer { node: me },
                    FindLie::PointsBackwards => Response::Closer {
                        node: pred.unwrap_or(me),
                    },
                    FindLie::ResponsibleBeforeKey => Response::Responsible {
                        node: pred
                            .filter(|p| !in_half_open(key, &me.id, &p.id))
                            .unwrap_or(me),
                    },
                    FindLie::ClaimsItself => Response::Responsible { node: me },
                    FindLie::Hijack => {
                        let colluder = self.first_adversary_from(key);
                        Response::Responsible {
                            node: self.contact(colluder),
                        }
                    }
                }
            }
            Request::Get { key } => {
                let values = match adv.get.as_ref()? {
                    GetLie::Withhold => Vec::new(),
                    GetLie::Answer(values) => values.clone(),
                    &GetLie::Junk(n) => (0..n)
                        .map(|_| (0..64).map(|_| self.rng.random()).collect())
                        .collect(),
                    GetLie::Replay => self.seen.get(key).cloned().unwrap_or_default(),
                };
                Response::Values { values }
            }
            Request::Store { key, value, .. } if adv.refuse_stores => {
                if self.record_seen {
                    let seen = self.seen.entry(*key).or_default();
                    if !seen.contains(value) {
                        seen.push(value.clone());
                    }
                }
                Response::Rejected
            }
            _ => return None,
        };
        Some(Message::Response { id: *id, body })
    }

    /// The first live adversary at or after `key`, clockwise.
    fn first_adversary_from(&mut self, key: &Key) -> usize {
        self.sorted();
        let s = self.sorted.as_deref().expect("just computed");
        let at = s.partition_point(|(id, _)| id < key);
        (0..s.len())
            .map(|i| s[(at + i) % s.len()].1)
            .find(|i| self.adversaries.contains_key(i))
            .expect("called by an adversary")
    }

    pub fn run_for(&mut self, ms: u64) {
        self.run_until(self.now + ms);
    }

    /// Live ids in ring order, with their node index.
    pub fn sorted(&mut self) -> &[(Key, usize)] {
        if self.sorted.is_none() {
            let mut v: Vec<(Key, usize)> = self
                .live()
                .map(|i| (self.nodes[i].contact().id, i))
                .collect();
            v.sort();
            self.sorted = Some(v);
        }
        self.sorted.as_deref().expect("just set")
    }

    /// The live node responsible for `key`: the first id at or after it, clockwise.
    pub fn responsible(&mut self, key: &Key) -> usize {
        let s = self.sorted();
        let at = s.partition_point(|(id, _)| id < key);
        s[at % s.len()].1
    }

    /// Live nodes whose successor or predecessor is not the true one. (A node alone is
    /// its own successor and has no predecessor.)
    pub fn ring_errors(&mut self) -> usize {
        let s = self.sorted().to_vec();
        let n = s.len();
        (0..n)
            .filter(|&p| {
                let node = &self.nodes[s[p].1];
                let succ = s[(p + 1) % n].0;
                let pred = (n > 1).then_some(s[(p + n - 1) % n].0);
                !node.is_joined()
                    || node.successor().id != succ
                    || node.predecessor().map(|c| c.id) != pred
            })
            .count()
    }

    /// Runs maintenance, checking every simulated second, until the ring is exact.
    /// Returns the simulated milliseconds it took.
    pub fn converge(&mut self, max_ms: u64) -> Result<u64, String> {
        let start = self.now;
        loop {
            let errors = self.ring_errors();
            if errors == 0 {
                return Ok(self.now - start);
            }
            if self.now - start >= max_ms {
                return Err(format!(
                    "ring did not converge within {max_ms} ms: {errors} of {} live nodes have a wrong successor or predecessor",
                    self.sorted().len()
                ));
            }
            self.run_for(1_000);
        }
    }

    /// Nodes 0..n: node 0 creates the ring, the others join through it one after
    /// another, `gap` ms apart; then maintenance runs until the ring is exact.
    pub fn ring(seed: u64, n: usize, config: Config, delay: (u64, u64), gap: u64) -> Sim {
        Sim::ring_with(seed, n, config, delay, gap, None)
    }

    /// [`Sim::ring`] with every node running the policy `policy` makes.
    pub fn ring_with(
        seed: u64,
        n: usize,
        config: Config,
        delay: (u64, u64),
        gap: u64,
        policy: Option<PolicyFactory>,
    ) -> Sim {
        let mut sim = Sim::new(seed, config, delay);
        sim.policy = policy;
        let first = sim.add_node();
        sim.create(first);
        for _ in 1..n {
            let i = sim.add_node();
            sim.join(i, first);
            sim.run_for(gap);
        }
        let took = sim.converge(600_000).unwrap_or_else(|e| panic!("{e}"));
        eprintln!(
            "ring of {n}: joined in {} ms, converged {took} ms later (simulated)",
            n as u64 * gap
        );
        sim
    }

    /// `n` idle nodes at random positions, each with the policy `policy` makes.
    fn with_nodes(
        seed: u64,
        n: usize,
        config: Config,
        delay: (u64, u64),
        policy: Option<PolicyFactory>,
    ) -> Sim {
        let mut sim = Sim::new(seed, config, delay);
        sim.policy = policy;
        for _ in 0..n {
            sim.add_node();
        }
        sim
    }

    /// `n` nodes at random positions put straight into a converged ring: each gets its
    /// true predecessor, successor list and fingers from the sorted ids (through
    /// `Node::install_routing`) instead of joining, which would cost `O(n log² n)`
    /// simulated messages before the first measurement. Maintenance then runs as
    /// configured.
    pub fn converged(
        seed: u64,
        n: usize,
        config: Config,
        delay: (u64, u64),
        policy: Option<PolicyFactory>,
    ) -> Sim {
        let mut sim = Sim::with_nodes(seed, n, config, delay, policy);
        let s = sim.sorted().to_vec();
        let r = sim.config.successors;
        let succ_of = |key: &Key| s[s.partition_point(|(id, _)| id < key) % n].1;
        for (p, &(id, i)) in s.iter().enumerate() {
            let c = |j: usize| Contact {
                id: s[j].0,
                addr: s[j].1,
            };
            let predecessor = (n > 1).then(|| c((p + n - 1) % n));
            let successors = (1..n.min(r + 1)).map(|d| c((p + d) % n)).collect();
            let mut fingers = Vec::with_capacity(256);
            for f in 0..256 {
                let j = succ_of(&id.finger_target(f));
                fingers.push((
                    f,
                    Contact {
                        id: sim.nodes[j].contact().id,
                        addr: j,
                    },
                ));
            }
            sim.nodes[i]
                .install_routing(0, predecessor, successors, fingers)
                .expect("idle");
            sim.after(i);
        }
        sim
    }

    /// `n` nodes at random positions with one-hop routing: every node is given the same
    /// full membership (`Node::set_members`), as every agent derives it from the trust
    /// log. No node routes through another; maintenance runs as configured.
    pub fn one_hop(
        seed: u64,
        n: usize,
        config: Config,
        delay: (u64, u64),
        policy: Option<PolicyFactory>,
    ) -> Sim {
        let mut sim = Sim::with_nodes(seed, n, config, delay, policy);
        let members = Members::new((0..n).map(|i| sim.contact(i)));
        for i in 0..n {
            sim.nodes[i].set_members(0, members.clone());
            sim.after(i);
        }
        sim
    }

    /// Finds the event with this op id reported by node `i`, if any yet.
    pub fn event(&self, i: usize, op: OpId) -> Option<&Event<usize>> {
        self.events[i].iter().find(|e| match e {
            Event::Found { op: o, .. }
            | Event::NotFound { op: o, .. }
            | Event::Stored { op: o, .. }
            | Event::Resolved { op: o, .. } => *o == op,
            _ => false,
        })
    }

    /// Runs until every `(node, op)` has completed or `max_ms` passes.
    pub fn wait_all(&mut self, ops: &[(usize, OpId)], max_ms: u64) {
        let end = self.now + max_ms;
        while self.now < end && ops.iter().any(|&(i, op)| self.event(i, op).is_none()) {
            self.run_for(50);
        }
    }

    /// Resolves `name` from each of `from` at once; returns what each got.
    pub fn resolve_all(&mut self, from: &[usize], name: &[u8], k: u8) -> Vec<Event<usize>> {
        let ops: Vec<(usize, OpId)> = from
            .iter()
            .map(|&i| {
                (
                    i,
                    self.op(i, |n, now| n.resolve(now, name, k))
                        .expect("resolve"),
                )
            })
            .collect();
        self.wait_all(&ops, 60_000);
        ops.iter()
            .map(|&(i, op)| {
                self.event(i, op)
                    .cloned()
                    .unwrap_or_else(|| panic!("node {i}: resolve did not complete"))
            })
            .collect()
    }

    /// `count` distinct random live nodes other than those in `not`.
    pub fn sample(&mut self, count: usize, not: &[usize]) -> Vec<usize> {
        let mut out = Vec::new();
        while out.len() < count {
            let i = self.random_live();
            if !not.contains(&i) && !out.contains(&i) {
                out.push(i);
            }
        }
        out
    }

    /// Runs until one op completes; panics with the op if it does not within `max_ms`.
    pub fn wait(&mut self, i: usize, op: OpId, max_ms: u64) -> Event<usize> {
        self.wait_all(&[(i, op)], max_ms);
        self.event(i, op)
            .cloned()
            .unwrap_or_else(|| panic!("node {i}: op {op:?} did not complete in {max_ms} ms"))
    }

    /// A random live node.
    pub fn random_live(&mut self) -> usize {
        let n = self.sorted().len();
        let at = self.rng.random_range(0..n);
        self.sorted()[at].1
    }

    /// A random index below `n`.
    pub fn rng_index(&mut self, n: usize) -> usize {
        self.rng.random_range(0..n)
    }

    pub fn random_key(&mut self) -> Key {
        Key(self.rng.random())
    }
}
