//! `themis-core` driven from both ends in memory.

use ring::rand::SecureRandom;
use themis_core::handshake::{respond, Initiator};
use themis_core::{HandshakeConfig, HelloGuard, Identity, MeshName, Session, Suite};

/// The wall clock, Unix milliseconds (message 1's timestamp and its check).
pub fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// The mesh every benchmark identity lives in.
pub const MESH: &str = "bench";

/// A handshake config that offers only `suite`.
pub fn config_for(suite: Suite) -> HandshakeConfig {
    HandshakeConfig {
        suites: suite.only(),
        ..HandshakeConfig::default()
    }
}

/// The two identities of a benchmark, created once.
pub struct Peers {
    /// Sends message 1 (and 3).
    pub initiator: Identity,
    /// Answers with message 2.
    pub responder: Identity,
}

/// What one handshake produced: both sessions and the messages on the wire.
pub struct Completed {
    /// The initiator's session.
    pub initiator: Session,
    /// The responder's session.
    pub responder: Session,
    /// Message 1.
    pub hello: Vec<u8>,
    /// Message 2.
    pub reply: Vec<u8>,
    /// Message 3.
    pub confirm: Vec<u8>,
}

impl Peers {
    /// Two fresh identities in [`MESH`].
    pub fn generate(rng: &dyn SecureRandom) -> Self {
        let identity = || {
            Identity::generate(MeshName::new(MESH).expect("valid mesh name"), rng)
                .expect("the system RNG works")
        };
        Peers {
            initiator: identity(),
            responder: identity(),
        }
    }

    /// One full handshake, both sides in memory: `Initiator::start` → `respond` →
    /// `read_hello_reply` → `read_confirm` (the responder's freshness check and replay
    /// cache included, with a fresh cache).
    pub fn handshake(&self, config: &HandshakeConfig, rng: &dyn SecureRandom) -> Completed {
        let now = now_ms();
        let (awaiting_reply, hello) =
            Initiator::start(&self.initiator, self.responder.id(), config, now, rng)
                .expect("start");
        let mut guard = HelloGuard::default();
        let (awaiting_confirm, reply) =
            respond(&self.responder, &hello, config, &mut guard, now, rng).expect("respond");
        let (initiator, confirm) = awaiting_reply
            .read_hello_reply(&reply)
            .expect("hello reply");
        let responder = awaiting_confirm.read_confirm(&confirm).expect("confirm");
        Completed {
            initiator,
            responder,
            hello,
            reply,
            confirm,
        }
    }

    /// A session pair (initiator, responder) from a real handshake.
    pub fn sessions(&self, config: &HandshakeConfig, rng: &dyn SecureRandom) -> (Session, Session) {
        let done = self.handshake(config, rng);
        (done.initiator, done.responder)
    }
}

/// One record of a stream channel: `buf` (payload plus
/// [`themis_core::wire::RECORD_OVERHEAD`]) is sealed in place by `sender` and opened in
/// place by `receiver`. Stream mode accepts each record once and in order, so every
/// seal is followed by its open. Returns the payload length that opened.
pub fn seal_open_in_place(sender: &mut Session, receiver: &mut Session, buf: &mut [u8]) -> usize {
    sender.seal_in_place(buf, None).expect("seal");
    receiver.open_in_place(buf).expect("open").payload.len()
}
