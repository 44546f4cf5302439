//! The Themis overlay: a Chord DHT over self-certifying ids, as a sans-IO state
//! machine.
//!
//! # Driver contract
//!
//! In the style of `quinn-proto`, a [`Node`] owns no socket, clock, thread or random
//! number generator. Its driver (the tokio agent, or the deterministic simulation in
//! `tests/sim`) feeds it input and drains its output:
//!
//! * input: [`Node::handle`] for each message received (with the sender's contact,
//!   whose id the driver has authenticated through the secure channel),
//!   [`Node::handle_timeout`] when the time given by [`Node::poll_timeout`] has come,
//!   and the user operations ([`Node::create`], [`Node::join`], [`Node::find`],
//!   [`Node::store`], [`Node::resolve`], [`Node::leave`]);
//! * policy: the [`ValuePolicy`] given to [`Node::with_policy`] decides which values
//!   the node keeps and how ([`Node::new`] keeps anything: [`AnyValue`]);
//! * output: [`Node::poll_transmit`] (a message and its destination) and
//!   [`Node::poll_event`] (completions, reported with the [`OpId`] the operation
//!   returned).
//!
//! Time is a `u64` millisecond count from any monotonic origin the driver likes. The
//! node keeps nothing random; request ids are a counter, and a response is accepted
//! only from the peer the request went to.
//!
//! # The paper's operations (Themis, ARES 2022, Table 1, §6.1)
//!
//! | paper | here | message flow |
//! |---|---|---|
//! | `find(id)` | [`Node::find`] | the initiator asks the closest preceding node it knows for a [`Request::FindStep`]; each answer is [`Response::Closer`] (ask that node next) or [`Response::Responsible`] (done). The initiator drives every step, so it can check each one. |
//! | `store(name, k)` | [`Node::store`], [`Node::resolve`] | for `r` in `0..=k`, a lookup of `h(name ‖ r)` then [`Request::Store`] to the node found, whose [`ValuePolicy`] places the value in its owner's slot or refuses it; the owner re-stores every `republish_every`, and values expire after their TTL (at the latest when the policy says the value does). `resolve` looks up all `k + 1` replicas at once, sends each holder a [`Request::Get`] and reports the union of the answers, unverified: the caller verifies and merges. |
//! | `join` | [`Node::join`] | a lookup of our own id through a bootstrap node gives our successor; stabilisation does the rest. |
//! | `update` | maintenance timers | stabilise: [`Request::GetNeighbours`] to the successor, adopt its predecessor if closer, take its successor list, [`Request::Notify`] it. A node that adopts a new predecessor sends it a [`Request::Handover`] of the objects it is now responsible for. One finger is fixed per tick, the predecessor is pinged, stored values expire. |
//! | `leave` | [`Node::leave`] | [`Request::Handover`] of every object and [`Request::Leaving`] (our predecessor) to the successor; [`Request::Leaving`] (our successor list) to the predecessor. A node takes a `Handover` or `Leaving` only from its predecessor or a node in its successor list ([`Rejection::NotNeighbour`] otherwise), and a `Leaving`'s predecessor only from its predecessor, its successors only from a successor. |
//!
//! # Eclipse defence
//!
//! A [`Response::Closer`] must name a node strictly closer (clockwise) to the key than
//! the peer that answered, and a [`Response::Responsible`] a node at or past the key
//! other than the peer itself (a peer naming itself claims to be alone in the ring,
//! which only a joining node may believe). A peer that breaks this, or times out, is
//! dropped from the lookup and named in the
//! `avoid` list of the lookup's later steps; the lookup goes on with the best candidate
//! left, and the peer that referred us to the dropped one is asked again. Honest peers
//! route around the peers in `avoid`, using their successor lists when a dropped peer
//! is the key's predecessor. Timeouts also remove the peer from the routing state. A
//! lookup never asks a dropped peer again and sends at most `max_hops` steps, so it
//! terminates.
//!
//! The defence catches lies that break these rules. It cannot catch a plausible one:
//! colluding peers that answer `Responsible` with one of their own at or past the key
//! capture every lookup that meets one of them, stores and resolves alike. Nodes are
//! admitted by the operator, whose keys place them at random positions, so colluders
//! cannot choose where they sit; but a path of ten hops meets one of a fifth of the
//! nodes most of the time, and in the 10,000-node simulation such colluders leave only
//! a quarter of the resolves complete even with `k = 4` (see the crate's README).
//! Values stay safe (a captured resolve returns less, never a forged record); what a
//! lookup needs against this is more than the replicas' redundancy, which is the open
//! limit of this defence.
//!
//! # Values: who may store what
//!
//! Routing is not the last word either: the node that really is responsible for a key
//! can answer `Get` with anything. So
//!
//! * every value offered to a node goes through its [`ValuePolicy`] (the agent verifies
//!   the record's signature and endorsement there). The policy gives the value's owner,
//!   slot and version; the store keeps one value per `(owner, slot)` under each key,
//!   newest version only ([`Rejection::Stale`] for older ones, also while a newer
//!   version, such as a tombstone, lives), at most [`Placement::owner_limit`] slots per
//!   owner and key ([`Rejection::OwnerFull`]: one owner's junk cannot crowd out another
//!   owner's values) and [`message::MAX_VALUES_PER_KEY`] in all; a value lives no
//!   longer than the policy's [`Placement::ttl_cap`] (its signed not-after);
//! * `Handover` and `Leaving` are taken from neighbours only, so a stranger can neither
//!   plant objects nor rewire our routing;
//! * [`Node::resolve`] asks every replica and returns the union of their answers, so one
//!   honest replica holder is enough for a complete answer, whatever the others say.
//!   The union is *unverified*: the caller must verify every value and keep the newest
//!   per slot itself. With a fifth of the nodes adversarial and lookups intact, a
//!   resolve fails only when all `k + 1` replica holders are adversaries (`0.2^(k+1)`:
//!   0.03 % for `k = 4`, 0.8 % for `k = 2`).
//!
//! # Failure handling
//!
//! Failure detection is by request timeouts only. A successor list of `r` nodes keeps
//! the ring connected through `r - 1` adjacent failures; each object is stored under
//! `k + 1` independent ids, so it survives until its owner re-stores it as long as one
//! replica holder lives. A node that loses every contact joins again through the
//! bootstrap node it first joined through (and reports [`Event::Joined`] again, or
//! [`Event::JoinFailed`]: it is then idle, and the operations it had in flight complete
//! as their requests time out).
//!
//! # Notes for drivers
//!
//! * The `from` contact given to [`Node::handle`] must carry the address the peer
//!   *listens* on (learnt in the handshake), not an ephemeral source port: the node
//!   stores it in its routing state and hands it to others.
//! * Request ids are a per-node counter; a response is matched on id *and* sender id,
//!   so the driver must not let one peer speak for another.
//! * Every request gets exactly one response. The node never retransmits: over UDP,
//!   a lost datagram is a timeout, which drops the peer from the routing state (it is
//!   learnt again through stabilisation). Use `request_timeout` well above the RTT.
//! * [`Node::leave`] queues its farewell messages; flush [`Node::poll_transmit`] before
//!   closing sockets. A node that has left ignores all input.
//! * Ops are reported once, by [`OpId`], through [`Node::poll_event`]; the driver
//!   retries a [`Event::NotFound`] or a [`Event::JoinFailed`] as it sees fit.

#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod gossip;
pub mod key;
mod lookup;
pub mod membership;
pub mod message;
mod node;
pub mod policy;
mod routing;
mod store;

pub use key::{distance, in_half_open, in_open, Key};
pub use membership::Members;
pub use message::{Contact, Message, Object, Request, Response};
pub use node::{Config, Event, Node, Stats};
pub use policy::{AnyValue, Placement, ValuePolicy};

/// Milliseconds on the caller's monotonic clock. (At the crate root, as are [`OpId`]
/// and [`Rejection`]: the node, its lookups, its store and the value policy all use
/// them, and none of those modules imports the others for them.)
pub type Millis = u64;

/// Identifies a user operation; its completion [`Event`] carries it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct OpId(pub u64);

/// Why an input or an operation was refused. Each is counted in [`Stats::rejections`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, thiserror::Error)]
pub enum Rejection {
    /// A response whose request id we never issued (or that already completed).
    #[error("response to an unknown request")]
    UnknownRequest,
    /// A response from a peer other than the one the request went to.
    #[error("response from a peer we did not ask")]
    UnexpectedSender,
    /// A response of the wrong kind for its request.
    #[error("response of the wrong kind")]
    UnexpectedResponse,
    /// A lookup step that did not get closer to the key (eclipse defence).
    #[error("lookup answer makes no progress towards the key")]
    NoProgress,
    /// A `Responsible` answer naming a node before the key.
    #[error("lookup answer names a node that cannot be responsible for the key")]
    BadResponsible,
    /// A message field above its bound (see [`message`]).
    #[error("message exceeds a size limit")]
    OverLimit,
    /// A message claiming to come from ourselves.
    #[error("message from our own id")]
    FromSelf,
    /// Input while not in a ring (before joining or after leaving).
    #[error("the node is not running")]
    NotRunning,
    /// An operation that needs a ring before `create`/`join` completed.
    #[error("the node has not joined a ring yet")]
    NotJoined,
    /// `create`/`join` on a node already in (or joining) a ring.
    #[error("the node is already in a ring")]
    AlreadyJoined,
    /// A value longer than [`message::MAX_VALUE_LEN`].
    #[error("value longer than {} bytes", message::MAX_VALUE_LEN)]
    ValueTooLarge,
    /// A replica count above [`message::MAX_REPLICAS`].
    #[error("more than {} extra replicas", message::MAX_REPLICAS)]
    TooManyReplicas,
    /// A name longer than [`message::MAX_NAME_LEN`].
    #[error("name longer than {} bytes", message::MAX_NAME_LEN)]
    NameTooLong,
    /// The store holds its configured capacity.
    #[error("the store is full")]
    StoreFull,
    /// An object id already holds [`message::MAX_VALUES_PER_KEY`] values.
    #[error("too many values under one object id")]
    TooManyValues,
    /// A peer refused our `Store`.
    #[error("a peer refused to store")]
    Refused,
    /// The [`ValuePolicy`] refused the value (say, its signature does not verify).
    #[error("the value is not valid (refused by the value policy)")]
    InvalidValue,
    /// An older version of a value whose slot holds a newer one, or the same version
    /// with different bytes.
    #[error("an older or conflicting version of a value already held")]
    Stale,
    /// The value's owner already holds its `owner_limit` slots under that object id.
    #[error("the value's owner holds its limit of values under this object id")]
    OwnerFull,
    /// A `Handover` or `Leaving` from a peer that is neither our predecessor nor in our
    /// successor list.
    #[error("hand-over or leave notice from a peer that is not our neighbour")]
    NotNeighbour,
}
