//! The DHT's Chord node (host-agent/themis-dht, `Node`) under a hostile script: messages
//! of any shape from any contact (including answers to the node's real outstanding
//! requests, from the peer asked or another), time moving on, timeouts, and the user
//! operations (`create`, `join`, `find`, `store`, `unstore`, `resolve`, `leave`, and
//! `set_members`, which switches it to one-hop routing), with
//! a fuzzer-chosen configuration and value policy. The wire decoding of these messages
//! (postcard `Frame`s) is `agent_decoders`; here they are built directly.
//!
//! After every step, with everything queued drained:
//! * draining ends within a bound; the node never sends to itself, and everything it
//!   sends passes `Message::check` (a peer would not refuse it as over a limit);
//! * every request the node takes gets exactly one response, to its sender, echoing
//!   its id; a refused input (not running, from ourselves, over a limit) gets none;
//! * the routing state stays within the configured bounds: at most `successors`
//!   successors (sorted clockwise, distinct, never ourselves), no finger or
//!   predecessor that is ourselves;
//! * the store stays within `store_capacity` values, `MAX_VALUES_PER_KEY` per key and
//!   `MAX_VALUE_LEN` per value;
//! * events are for operations that were issued, each reported once, with consistent
//!   counts (`stored`/`answered` at most `replicas` = `k + 1`, resolved values
//!   distinct and sorted, `Found` for the key asked).
//!
//! At the end, with nobody answering any more, time runs on until every operation
//! issued has completed (unless the node left): each lookup is bounded by `max_hops`
//! and every request by its timeout, so none may hang.
#![no_main]

use std::collections::{BTreeMap, BTreeSet};

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use themis_dht::message::{
    MAX_AVOID, MAX_HANDOVER_OBJECTS, MAX_SUCCESSORS, MAX_VALUES_PER_KEY, MAX_VALUE_LEN,
};
use themis_dht::{
    distance, AnyValue, Config, Contact, Event, Key, Message, Node, Object, OpId, Placement,
    Rejection, Request, Response, ValuePolicy,
};

type Addr = u16;

/// Our node's id.
const ME: Key = Key([0x80; 32]);
/// Most steps of one script.
const MAX_STEPS: usize = 200;
/// Most messages or events one step may queue (a hand-over of a full store is split
/// into `store_capacity / MAX_HANDOVER_OBJECTS` requests; the capacity is at most
/// `MAX_CAPACITY` here).
const MAX_CAPACITY: usize = 512;

/// The peers the fuzzer names by number: spread over the ring, right next to us on
/// either side, and the two ends of the key space.
fn pool_key(i: u8) -> Key {
    match i % 20 {
        i @ 0..=15 => Key([i * 16 + 3; 32]),
        16 => ME.wrapping_add(Key::from_low(1)),
        17 => ME.wrapping_add(Key([0xff; 32])),
        18 => Key::ZERO,
        _ => Key([0xff; 32]),
    }
}

#[derive(Arbitrary, Debug, Clone)]
enum KeyIn {
    Pool(u8),
    Me,
    Object(Vec<u8>, u8),
    Own([u8; 32]),
    /// Just after / before a pool key.
    After(u8, u8),
    Before(u8, u8),
}

impl KeyIn {
    fn get(&self) -> Key {
        match self {
            KeyIn::Pool(i) => pool_key(*i),
            KeyIn::Me => ME,
            KeyIn::Object(name, r) => Key::object(name, *r),
            KeyIn::Own(k) => Key(*k),
            KeyIn::After(i, d) => pool_key(*i).wrapping_add(Key::from_low(u64::from(*d) + 1)),
            KeyIn::Before(i, d) => {
                pool_key(*i).wrapping_add(distance(&Key::from_low(u64::from(*d) + 1), &Key::ZERO))
            }
        }
    }
}

#[derive(Arbitrary, Debug, Clone)]
enum ContactIn {
    /// Pool peer `i` at its own address, or at another (`Some`).
    Pool(u8, Option<Addr>),
    /// Ourselves.
    Me,
    Own(KeyIn, Addr),
    /// The pool peer that follows / precedes the key of the request being answered
    /// (what an honest `Responsible` / `Closer` would name), else pool peer 0.
    SuccessorOfKey,
    PredecessorOfKey,
}

impl ContactIn {
    fn get(&self, key: Option<&Key>) -> Contact<Addr> {
        let pool = |i: u8| Contact { id: pool_key(i), addr: Addr::from(i % 20) };
        match self {
            ContactIn::Pool(i, addr) => {
                let mut c = pool(*i);
                if let Some(a) = addr {
                    c.addr = *a;
                }
                c
            }
            ContactIn::Me => Contact { id: ME, addr: 999 },
            ContactIn::Own(k, addr) => Contact { id: k.get(), addr: *addr },
            ContactIn::SuccessorOfKey | ContactIn::PredecessorOfKey => {
                let Some(key) = key else { return pool(0) };
                let all = (0..20u8).map(pool);
                let best = if matches!(self, ContactIn::SuccessorOfKey) {
                    all.min_by_key(|c| distance(key, &c.id))
                } else {
                    all.filter(|c| c.id != *key).min_by_key(|c| distance(&c.id, key))
                };
                best.unwrap()
            }
        }
    }
}

/// A value: bytes of the fuzzer's own, or `len` copies of `fill` (to reach the limits).
#[derive(Arbitrary, Debug, Clone)]
enum ValueIn {
    Bytes(Vec<u8>),
    Long { len: u16, head: [u8; 5] },
}

impl ValueIn {
    fn get(&self) -> Vec<u8> {
        match self {
            ValueIn::Bytes(b) => b.clone(),
            ValueIn::Long { len, head } => {
                let mut v = vec![0x5a; usize::from(*len) % (MAX_VALUE_LEN + 64)];
                let n = head.len().min(v.len());
                v[..n].copy_from_slice(&head[..n]);
                v
            }
        }
    }
}

#[derive(Arbitrary, Debug)]
enum RequestIn {
    FindStep { key: KeyIn, avoid: Vec<KeyIn> },
    Get { key: KeyIn },
    Store { key: KeyIn, value: ValueIn, ttl_ms: u64 },
    GetNeighbours,
    Notify,
    Handover { objects: Vec<(KeyIn, ValueIn, u64)>, repeat: u8 },
    Leaving { predecessor: Option<ContactIn>, successors: Vec<ContactIn> },
    Ping,
}

#[derive(Arbitrary, Debug)]
enum ResponseIn {
    Responsible(ContactIn),
    Closer(ContactIn),
    Values { values: Vec<ValueIn>, repeat: u16 },
    Neighbours { predecessor: Option<ContactIn>, successors: Vec<ContactIn> },
    Ack,
    Rejected,
}

impl ResponseIn {
    fn get(&self, key: Option<&Key>) -> Response<Addr> {
        match self {
            ResponseIn::Responsible(c) => Response::Responsible { node: c.get(key) },
            ResponseIn::Closer(c) => Response::Closer { node: c.get(key) },
            ResponseIn::Values { values, repeat } => {
                let mut out: Vec<Vec<u8>> = values.iter().map(ValueIn::get).collect();
                // Past MAX_VALUES_PER_KEY without a megabyte of input.
                if let Some(last) = out.last().cloned() {
                    out.extend(std::iter::repeat_n(last, usize::from(*repeat) % 300));
                }
                Response::Values { values: out }
            }
            ResponseIn::Neighbours { predecessor, successors } => Response::Neighbours {
                predecessor: predecessor.as_ref().map(|c| c.get(key)),
                successors: successors.iter().map(|c| c.get(key)).collect(),
            },
            ResponseIn::Ack => Response::Ack,
            ResponseIn::Rejected => Response::Rejected,
        }
    }
}

#[derive(Arbitrary, Debug)]
enum Step {
    /// A request from `from`, with id `id`.
    Request {
        from: ContactIn,
        id: u64,
        body: RequestIn,
    },
    /// An answer to the node's outstanding request number `which` (mod their count),
    /// from the peer asked, or from `impostor`.
    Answer {
        which: u8,
        impostor: Option<ContactIn>,
        body: ResponseIn,
    },
    /// A response to a request id of the fuzzer's choosing.
    StrayResponse {
        from: ContactIn,
        id: u64,
        body: ResponseIn,
    },
    /// Time moves on by `ms` (at most about 16 minutes), then `handle_timeout`.
    Advance(u16, u8),
    /// Time moves to `poll_timeout`, then `handle_timeout`.
    UntilTimeout,
    /// `handle_timeout` without moving time.
    Timeout,
    Create,
    Join(ContactIn),
    Find(KeyIn),
    Store {
        name: Vec<u8>,
        value: ValueIn,
        k: u8,
        ttl_ms: u32,
    },
    /// Stop re-storing owned value number `which`.
    Unstore(u8),
    Resolve {
        name: Vec<u8>,
        k: u8,
    },
    Leave,
    /// One-hop routing over these members (ourselves among them or not).
    SetMembers(Vec<ContactIn>),
}

/// The node's configuration, within operator-sane bounds (periods up to a day: the
/// node adds them to the clock unchecked, as any driver's configuration would be).
#[derive(Arbitrary, Debug)]
struct ConfigIn {
    successors: u8,
    request_timeout: u16,
    stabilise_every: u16,
    fix_finger_every: u16,
    check_predecessor_every: u16,
    republish_every: u32,
    max_ttl: u32,
    max_hops: Option<u8>,
    store_capacity: u16,
    down_for: u16,
    retries: u8,
}

impl ConfigIn {
    fn get(&self) -> Config {
        Config {
            successors: usize::from(self.successors % 40),
            request_timeout: u64::from(self.request_timeout),
            stabilise_every: u64::from(self.stabilise_every),
            fix_finger_every: u64::from(self.fix_finger_every),
            check_predecessor_every: u64::from(self.check_predecessor_every),
            republish_every: u64::from(self.republish_every % 86_400_000),
            max_ttl: u64::from(self.max_ttl),
            max_hops: self.max_hops.map_or(Config::default().max_hops, u32::from),
            store_capacity: usize::from(self.store_capacity) % (MAX_CAPACITY + 1),
            down_for: u64::from(self.down_for),
            retries: self.retries % 8,
        }
    }
}

#[derive(Arbitrary, Debug)]
struct Script {
    config: ConfigIn,
    /// The value policy: `AnyValue`, or one that reads the placement from the value's
    /// first bytes (owners, slots, versions, owner limits and TTL caps of its choosing).
    bytes_policy: bool,
    start: u32,
    steps: Vec<Step>,
}

/// Placement from the value's first bytes; refuses the empty value.
struct BytesPolicy;

impl ValuePolicy for BytesPolicy {
    fn place(&self, _key: &Key, value: &[u8]) -> Result<Placement, Rejection> {
        let b = |i: usize| value.get(i).copied().unwrap_or(0);
        if value.is_empty() {
            return Err(Rejection::InvalidValue);
        }
        Ok(Placement {
            owner: [b(0) % 3; 32],
            slot: [b(1) % 8; 32],
            version: u64::from(b(2) % 4),
            owner_limit: usize::from(b(3) % 5),
            ttl_cap: (b(4) >= 128).then(|| u64::from(b(4) - 128) * 500),
        })
    }
}

/// What the node has been asked and has promised.
#[derive(Default)]
struct Model {
    running: bool,
    left: bool,
    /// Ops issued and not yet reported: find key, or replicas of a store/resolve.
    finds: BTreeMap<OpId, Key>,
    stores: BTreeMap<OpId, u8>,
    resolves: BTreeMap<OpId, u8>,
    joining: bool,
    reported: BTreeSet<OpId>,
    /// Requests the node sent: (id, to, the key it was about).
    sent: Vec<(u64, Contact<Addr>, Option<Key>)>,
    owned: Vec<(Vec<u8>, Vec<u8>)>,
}

struct Run {
    node: Node<Addr>,
    model: Model,
    now: u64,
    successors: usize,
    capacity: usize,
    request_timeout: u64,
}

impl Run {
    /// Drains everything queued and checks it. `asked`: the request just delivered
    /// (its sender and id), which must get exactly one response.
    fn drain(&mut self, asked: Option<(&Contact<Addr>, u64)>) {
        let bound = 64
            + 4 * self.model.sent.len().min(4096)
            + 8 * (self.capacity / MAX_HANDOVER_OBJECTS + 1)
            + 16 * self.model.owned.len() * 8;
        let mut responses = 0;
        let mut count = 0;
        while let Some((to, msg)) = self.node.poll_transmit() {
            count += 1;
            assert!(count <= bound, "poll_transmit does not run dry ({bound} messages)");
            assert_ne!(to.id, ME, "the node sends to itself: {msg:?}");
            assert_eq!(msg.check(), Ok(()), "the node sends what peers refuse: {msg:?}");
            match msg {
                Message::Request { id, body } => {
                    if let Request::FindStep { avoid, .. } = &body {
                        assert!(avoid.len() <= MAX_AVOID);
                    }
                    let key = match &body {
                        Request::FindStep { key, .. }
                        | Request::Get { key }
                        | Request::Store { key, .. } => Some(*key),
                        _ => None,
                    };
                    assert!(
                        self.model.sent.iter().all(|(i, _, _)| *i != id),
                        "request id {id} reused"
                    );
                    self.model.sent.push((id, to, key));
                    if self.model.sent.len() > 4096 {
                        self.model.sent.drain(..2048);
                    }
                }
                Message::Response { id, .. } => {
                    let (from, asked_id) = asked.expect("a response nobody asked for");
                    assert_eq!((&to, id), (from, asked_id), "a response to the wrong request");
                    responses += 1;
                }
            }
        }
        if let Some((_, id)) = asked {
            assert_eq!(responses, 1, "request {id} got {responses} responses");
        }
        let mut count = 0;
        while let Some(event) = self.node.poll_event() {
            count += 1;
            assert!(count <= bound, "poll_event does not run dry");
            self.event(event);
        }
        self.invariants();
    }

    fn event(&mut self, event: Event<Addr>) {
        let m = &mut self.model;
        let mut once = |op: OpId| assert!(m.reported.insert(op), "{op:?} reported twice");
        match event {
            Event::Joined { successor } => {
                assert_ne!(successor.id, ME);
                assert!(m.joining || self.node.is_joined(), "joined without a join");
                m.joining = false;
            }
            Event::JoinFailed => {
                m.joining = false;
                m.running = false;
            }
            Event::Found { op, key, .. } | Event::NotFound { op, key, .. } => {
                once(op);
                assert_eq!(m.finds.remove(&op), Some(key), "find {op:?} for another key");
            }
            Event::Stored { op, stored, replicas } => {
                once(op);
                assert_eq!(m.stores.remove(&op), Some(replicas), "store {op:?}");
                assert!(stored <= replicas);
            }
            Event::Resolved { op, values, answered, replicas, .. } => {
                once(op);
                assert_eq!(m.resolves.remove(&op), Some(replicas), "resolve {op:?}");
                assert!(answered <= replicas);
                assert!(values.windows(2).all(|w| w[0] < w[1]), "values sorted, distinct");
            }
        }
    }

    fn invariants(&self) {
        let node = &self.node;
        let succ = node.successors();
        assert!(succ.len() <= self.successors, "{} successors", succ.len());
        assert!(succ.iter().all(|c| c.id != ME), "we are our own successor");
        assert!(
            succ.windows(2).all(|w| distance(&ME, &w[0].id) < distance(&ME, &w[1].id)),
            "successors not sorted clockwise and distinct: {succ:?}"
        );
        assert!(node.predecessor().is_none_or(|p| p.id != ME), "we are our own predecessor");
        let fingers = node.fingers();
        assert!(fingers.len() <= 256);
        assert!(fingers.iter().all(|(i, c)| *i < 256 && c.id != ME));
        let objects = node.objects(self.now);
        let held: usize = objects.iter().map(|(_, n)| n).sum();
        assert!(held <= self.capacity, "{held} values held, capacity {}", self.capacity);
        for (key, n) in &objects {
            assert!(*n <= MAX_VALUES_PER_KEY);
            let values = node.values(key, self.now);
            assert_eq!(values.len(), *n);
            assert!(values.iter().all(|v| v.len() <= MAX_VALUE_LEN));
        }
    }

    fn deliver(&mut self, from: Contact<Addr>, msg: Message<Addr>) {
        let answered = self.model.running && from.id != ME && msg.check().is_ok();
        let asked = match &msg {
            Message::Request { id, .. } if answered => Some(*id),
            _ => None,
        };
        self.node.handle(self.now, from.clone(), msg);
        self.drain(asked.map(|id| (&from, id)));
    }

    fn timeout(&mut self) {
        self.node.handle_timeout(self.now);
        self.drain(None);
    }

    fn step(&mut self, step: &Step) {
        let now = self.now;
        match step {
            Step::Request { from, id, body } => {
                let body = match body {
                    RequestIn::FindStep { key, avoid } => Request::FindStep {
                        key: key.get(),
                        avoid: avoid.iter().map(KeyIn::get).collect(),
                    },
                    RequestIn::Get { key } => Request::Get { key: key.get() },
                    RequestIn::Store { key, value, ttl_ms } => {
                        Request::Store { key: key.get(), value: value.get(), ttl_ms: *ttl_ms }
                    }
                    RequestIn::GetNeighbours => Request::GetNeighbours,
                    RequestIn::Notify => Request::Notify,
                    RequestIn::Handover { objects, repeat } => {
                        let mut objects: Vec<Object> = objects
                            .iter()
                            .map(|(k, v, ttl)| Object {
                                key: k.get(),
                                value: v.get(),
                                ttl_ms: *ttl,
                            })
                            .collect();
                        if let Some(last) = objects.last().cloned() {
                            objects.extend(std::iter::repeat_n(last, usize::from(*repeat) % 80));
                        }
                        Request::Handover { objects }
                    }
                    RequestIn::Leaving { predecessor, successors } => Request::Leaving {
                        predecessor: predecessor.as_ref().map(|c| c.get(None)),
                        successors: successors.iter().map(|c| c.get(None)).collect(),
                    },
                    RequestIn::Ping => Request::Ping,
                };
                self.deliver(from.get(None), Message::Request { id: *id, body });
            }
            Step::Answer { which, impostor, body } => {
                if self.model.sent.is_empty() {
                    return;
                }
                let (id, to, key) =
                    self.model.sent[usize::from(*which) % self.model.sent.len()].clone();
                let from = impostor.as_ref().map_or(to, |c| c.get(key.as_ref()));
                let body = body.get(key.as_ref());
                self.deliver(from, Message::Response { id, body });
            }
            Step::StrayResponse { from, id, body } => {
                let msg = Message::Response { id: *id, body: body.get(None) };
                self.deliver(from.get(None), msg);
            }
            Step::Advance(ms, scale) => {
                self.now += u64::from(*ms) << (scale % 5);
                self.timeout();
            }
            Step::UntilTimeout => {
                if let Some(t) = self.node.poll_timeout() {
                    self.now = self.now.max(t);
                }
                self.timeout();
            }
            Step::Timeout => self.timeout(),
            Step::Create => {
                let ok = self.node.create(now).is_ok();
                assert_eq!(ok, !self.model.running && !self.model.left);
                if ok {
                    self.model.running = true;
                }
                self.drain(None);
            }
            Step::Join(bootstrap) => {
                let b = bootstrap.get(None);
                let ok = self.node.join(now, b.clone()).is_ok();
                assert_eq!(ok, !self.model.running && !self.model.left && b.id != ME);
                if ok {
                    self.model.running = true;
                    self.model.joining = true;
                }
                self.drain(None);
            }
            Step::Find(key) => {
                let key = key.get();
                let joined = self.node.is_joined();
                let result = self.node.find(now, key);
                assert_eq!(result.is_ok(), joined, "find works exactly in a ring");
                if let Ok(op) = result {
                    self.model.finds.insert(op, key);
                }
                self.drain(None);
            }
            Step::Store { name, value, k, ttl_ms } => {
                let value = value.get();
                let k = k % 10;
                if let Ok(op) = self.node.store(now, name, value.clone(), k, u64::from(*ttl_ms)) {
                    self.model.stores.insert(op, k + 1);
                    self.model.owned.push((name.clone(), value));
                }
                self.drain(None);
            }
            Step::Unstore(which) => {
                if !self.model.owned.is_empty() {
                    let i = usize::from(*which) % self.model.owned.len();
                    let (name, value) = self.model.owned.remove(i);
                    // The same (name, value) may have been stored twice: one entry.
                    let again =
                        self.model.owned.iter().any(|o| o == &(name.clone(), value.clone()));
                    let was = self.node.unstore(&name, &value);
                    assert!(was || again || self.model.left, "an owned value was not owned");
                    self.model.owned.retain(|o| o != &(name.clone(), value.clone()));
                }
            }
            Step::Resolve { name, k } => {
                let k = k % 10;
                if let Ok(op) = self.node.resolve(now, name, k) {
                    self.model.resolves.insert(op, k + 1);
                }
                self.drain(None);
            }
            Step::SetMembers(members) => {
                let members = themis_dht::Members::new(members.iter().take(64).map(|c| c.get(None)));
                self.node.set_members(now, members);
                if !self.model.left {
                    self.model.running = true;
                    // The membership decides: a join in flight completes silently.
                    self.model.joining = false;
                }
                self.drain(None);
            }
            Step::Leave => {
                self.node.leave(now);
                self.model.running = false;
                self.model.left = true;
                self.model.finds.clear();
                self.model.stores.clear();
                self.model.resolves.clear();
                self.model.joining = false;
                self.drain(None);
            }
        }
    }

    /// Nobody answers any more: every operation must still complete.
    fn quiesce(&mut self) {
        let step = self.request_timeout.max(1);
        for _ in 0..2_000 {
            if self.model.finds.is_empty()
                && self.model.stores.is_empty()
                && self.model.resolves.is_empty()
                && !self.model.joining
            {
                return;
            }
            self.now += step;
            self.timeout();
        }
        panic!(
            "operations never completed: finds {:?}, stores {:?}, resolves {:?}, joining {}; \
             running {}, joined {}, next timeout {:?}, now {}",
            self.model.finds,
            self.model.stores,
            self.model.resolves,
            self.model.joining,
            self.model.running,
            self.node.is_joined(),
            self.node.poll_timeout(),
            self.now,
        );
    }
}

fuzz_target!(|script: Script| {
    let config = script.config.get();
    let me = Contact { id: ME, addr: 999 };
    let policy: Box<dyn ValuePolicy> =
        if script.bytes_policy { Box::new(BytesPolicy) } else { Box::new(AnyValue) };
    let mut run = Run {
        successors: config.successors.clamp(1, MAX_SUCCESSORS),
        capacity: config.store_capacity,
        request_timeout: config.request_timeout,
        node: Node::with_policy(me, config, policy),
        model: Model::default(),
        now: u64::from(script.start),
    };
    for step in script.steps.iter().take(MAX_STEPS) {
        run.step(step);
    }
    run.quiesce();
});
