//! The DHT's messages. Every request carries an id that its response echoes; the node
//! matches a response to the request *and* to the peer it was sent to.
//!
//! Encoding is the driver's business (the agent uses postcard over the secure channel);
//! every type here derives serde. Every `Vec` is bounded by a constant below, and
//! [`Message::check`] enforces the bounds on input, so a driver that decodes without
//! limits still cannot make the node hold more than they allow.

use serde::{Deserialize, Serialize};

use crate::key::Key;
use crate::Rejection;

/// Longest stored value (a signed service instance record), in bytes.
pub const MAX_VALUE_LEN: usize = 2048;
/// Most values one object id holds (over all owners; each owner is limited further by
/// its [`Placement::owner_limit`](crate::Placement::owner_limit)), and so the most a
/// `Values` answer carries: at most 256 × 2048 bytes, 512 KiB.
pub const MAX_VALUES_PER_KEY: usize = 256;
/// Most contacts in a successor list on the wire (the configured length is at most this).
pub const MAX_SUCCESSORS: usize = 32;
/// Most peers a lookup asks others to route around (see [`Request::FindStep`]).
pub const MAX_AVOID: usize = 8;
/// Most objects in one `Handover`; larger hand-overs are split.
pub const MAX_HANDOVER_OBJECTS: usize = 64;
/// Largest replica index: a name is stored under `h(name || r)` for `r` in `0..=k`,
/// `k <= MAX_REPLICAS`.
pub const MAX_REPLICAS: u8 = 7;
/// Longest service name, in bytes.
pub const MAX_NAME_LEN: usize = 255;

/// A peer: its ring id and the address the driver reaches it at.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Contact<A> {
    /// Ring position (the peer's themis id).
    pub id: Key,
    /// Driver address (a `SocketAddr` in the agent, an index in the simulation).
    pub addr: A,
}

/// A stored value in transit, with the time it has left to live (relative, because
/// clocks differ between nodes).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Object {
    /// Object id.
    pub key: Key,
    /// The value.
    pub value: Vec<u8>,
    /// Milliseconds left before it expires.
    pub ttl_ms: u64,
}

/// A DHT message.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Message<A> {
    /// A request; the response carries the same `id`.
    Request {
        /// Chosen by the requester, unique among its outstanding requests.
        id: u64,
        /// What is asked.
        body: Request<A>,
    },
    /// The response to request `id`.
    Response {
        /// The request's id.
        id: u64,
        /// The answer.
        body: Response<A>,
    },
}

/// What one node asks another.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Request<A> {
    /// One step of an iterative lookup (paper `find`): answered with
    /// [`Response::Responsible`] if `key ∈ (me, successor]`, else [`Response::Closer`]
    /// with the closest preceding node the answerer knows that is not in `avoid` (peers
    /// the initiator has dropped; at most [`MAX_AVOID`]).
    FindStep {
        /// The key looked up.
        key: Key,
        /// Peers to route around.
        avoid: Vec<Key>,
    },
    /// The values stored under `key` (answered with [`Response::Values`]).
    Get {
        /// Object id.
        key: Key,
    },
    /// Add `value` to the set stored under `key` for `ttl_ms` (paper `store`). The
    /// receiver's [`ValuePolicy`](crate::ValuePolicy) places it in its owner's slot
    /// (or refuses it, answering [`Response::Rejected`]).
    Store {
        /// Object id.
        key: Key,
        /// At most [`MAX_VALUE_LEN`] bytes.
        value: Vec<u8>,
        /// Lifetime; the receiver caps it at its configured maximum and at the
        /// value's own remaining lifetime ([`Placement::ttl_cap`](crate::Placement::ttl_cap)).
        ttl_ms: u64,
    },
    /// The receiver's predecessor and successor list (stabilisation, paper `update`).
    GetNeighbours,
    /// "I may be your predecessor." The candidate is the authenticated sender: a contact
    /// in the body would be a second, unchecked claim.
    Notify,
    /// Objects the receiver is now responsible for (join: from the successor to the
    /// newcomer; leave: from the leaving node to its successor). At most
    /// [`MAX_HANDOVER_OBJECTS`]. Accepted only from the receiver's predecessor (or the
    /// predecessor that has just left) or a node in its successor list; each object
    /// then goes through the receiver's policy like a `Store`.
    Handover {
        /// The objects.
        objects: Vec<Object>,
    },
    /// The sender leaves the ring (paper `leave`). To its successor it names its
    /// predecessor; to its predecessor its successor list (at most [`MAX_SUCCESSORS`]).
    /// The receiver takes the named predecessor only from its own predecessor and the
    /// successors only from a node in its successor list, and refuses the message from
    /// anyone else.
    Leaving {
        /// The leaving node's predecessor.
        predecessor: Option<Contact<A>>,
        /// The leaving node's successor list.
        successors: Vec<Contact<A>>,
    },
    /// Liveness check.
    Ping,
}

/// The answers.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Response<A> {
    /// `node` is responsible for the key (the answerer's successor).
    Responsible {
        /// The successor of the key.
        node: Contact<A>,
    },
    /// Ask `node` next: the closest preceding node the answerer knows.
    Closer {
        /// Next hop.
        node: Contact<A>,
    },
    /// The values stored under the key (at most [`MAX_VALUES_PER_KEY`]).
    Values {
        /// The values.
        values: Vec<Vec<u8>>,
    },
    /// Answer to `GetNeighbours`.
    Neighbours {
        /// The answerer's predecessor.
        predecessor: Option<Contact<A>>,
        /// The answerer's successor list (at most [`MAX_SUCCESSORS`]).
        successors: Vec<Contact<A>>,
    },
    /// Done (`Store`, `Notify`, `Handover`, `Leaving`, `Ping`).
    Ack,
    /// The request was refused; the wire says no more than that.
    Rejected,
}

impl<A> Message<A> {
    /// Checks the size bounds of every field.
    pub fn check(&self) -> Result<(), Rejection> {
        let ok = match self {
            Message::Request { body, .. } => match body {
                Request::FindStep { avoid, .. } => avoid.len() <= MAX_AVOID,
                Request::Store { value, .. } => value.len() <= MAX_VALUE_LEN,
                Request::Handover { objects } => {
                    objects.len() <= MAX_HANDOVER_OBJECTS
                        && objects.iter().all(|o| o.value.len() <= MAX_VALUE_LEN)
                }
                Request::Leaving { successors, .. } => successors.len() <= MAX_SUCCESSORS,
                Request::Get { .. } | Request::GetNeighbours | Request::Notify | Request::Ping => {
                    true
                }
            },
            Message::Response { body, .. } => match body {
                Response::Values { values } => {
                    values.len() <= MAX_VALUES_PER_KEY
                        && values.iter().all(|v| v.len() <= MAX_VALUE_LEN)
                }
                Response::Neighbours { successors, .. } => successors.len() <= MAX_SUCCESSORS,
                Response::Responsible { .. }
                | Response::Closer { .. }
                | Response::Ack
                | Response::Rejected => true,
            },
        };
        if ok {
            Ok(())
        } else {
            Err(Rejection::OverLimit)
        }
    }
}
