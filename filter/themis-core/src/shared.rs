//! A responder session served by threads that share no memory.
//!
//! Envoy runs one Wasm VM per worker thread, and the requests of one session reach
//! whichever worker accepted their connection; the only state the workers share is a
//! key-value store with compare-and-swap. So the responder splits its session:
//!
//! * a [`Ticket`]: the session's secrets and who it is with, written to the store
//!   once, right after message 2, and never changed; every worker rebuilds a
//!   [`SharedResponder`] from it (and checks message 3 with it);
//! * a [`ReplayWindow`]: 24 bytes that every worker updates with compare-and-swap
//!   when a request opens, so a request is accepted once across all workers.
//!
//! Responses are sealed with the sequence number of the request they answer (and
//! name it in `reply_to`). A request number is accepted at most once, so a response
//! nonce is never used twice, without a send counter to share. The initiator opens
//! them with an ordinary [`crate::Session`] in [`crate::ChannelMode::Datagram`] mode.
//!
//! ```
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! use ring::rand::SystemRandom;
//! use themis_core::shared::{SharedResponder, Ticket};
//! use themis_core::{handshake::{self, Initiator}, ChannelMode, HandshakeConfig, Identity, MeshName, ReplayWindow};
//!
//! let rng = SystemRandom::new();
//! let mesh = MeshName::new("demo")?;
//! let (alice, bob) = (Identity::generate(mesh.clone(), &rng)?, Identity::generate(mesh, &rng)?);
//! let config = HandshakeConfig { mode: ChannelMode::Datagram, ..HandshakeConfig::default() };
//!
//! let (waiting, hello) = Initiator::start(&alice, bob.id(), &config, &rng)?;
//! let (pending, reply) = handshake::respond(&bob, &hello, &config, &rng)?;
//! let stored = Ticket::from(&pending).encode();          // → the shared store
//! let (mut a, confirm) = waiting.read_hello_reply(&reply)?;
//!
//! // Any worker: rebuild from the store, check message 3, open, answer.
//! let ticket = Ticket::decode(&stored)?;
//! ticket.check_confirm(&confirm)?;
//! let mut b = SharedResponder::new(&ticket);
//! let mut window = ReplayWindow::new();                   // ← compare-and-swap in the store
//! let (seq, mut request) = a.seal(b"GET /check", None)?;
//! let opened = b.open_request(&mut request, &mut window)?;
//! assert_eq!(opened.payload, b"GET /check");
//! let mut response = b.seal_reply(seq, b"200 OK")?;
//! let answer = a.open_in_place(&mut response)?;
//! answer.expect_reply_to(seq)?;
//! # Ok(())
//! # }
//! ```

use alloc::vec::Vec;

use serde::{Deserialize, Serialize};
use zeroize::{Zeroize, Zeroizing};

use crate::channel::{
    aad, check_header, open_with, ChannelError, EpochKeys, Opened, ReplayWindow, SessionInfo,
};
use crate::handshake::{check_confirm, AwaitingConfirm, HandshakeError, Role};
use crate::identity::{MeshName, PeerId};
use crate::keys::{nonce, DirectionKey};
use crate::suite::Suite;
use crate::wire::{RecordHeader, WireError, MAX_RECORD_PAYLOAD, RECORD_HEADER_LEN, TAG_LEN};

/// The version of the ticket encoding (tickets never leave the host, but a host may
/// keep them across a filter upgrade).
const TICKET_VERSION: u8 = 1;
/// The longest encoded ticket accepted (a ticket is about 270 bytes).
pub const MAX_TICKET_LEN: usize = 512;

/// Everything a responder needs to serve a session: exported right after message 2.
/// It holds the session's secrets: keep it in memory the host protects as it does
/// the private key, never on disk or on the wire.
pub struct Ticket {
    info: SessionInfo,
    records_per_key: u64,
    initiator_to_responder: Zeroizing<[u8; 32]>,
    responder_to_initiator: Zeroizing<[u8; 32]>,
    confirm_key: Zeroizing<[u8; 32]>,
    transcript_hash: [u8; 32],
}

/// The encoding of a [`Ticket`].
#[derive(Serialize, Deserialize)]
struct TicketWire<'a> {
    version: u8,
    session_id: u64,
    suite: Suite,
    local_id: [u8; 32],
    peer_id: [u8; 32],
    peer_public_key: [u8; 32],
    mesh: &'a str,
    records_per_key: u64,
    initiator_to_responder: [u8; 32],
    responder_to_initiator: [u8; 32],
    confirm_key: [u8; 32],
    transcript_hash: [u8; 32],
}

impl Drop for TicketWire<'_> {
    fn drop(&mut self) {
        self.initiator_to_responder.zeroize();
        self.responder_to_initiator.zeroize();
        self.confirm_key.zeroize();
    }
}

impl From<&AwaitingConfirm> for Ticket {
    fn from(pending: &AwaitingConfirm) -> Self {
        Ticket {
            info: pending.info.clone(),
            records_per_key: pending.config.records_per_key,
            initiator_to_responder: pending.keys.initiator_to_responder.clone(),
            responder_to_initiator: pending.keys.responder_to_initiator.clone(),
            confirm_key: pending.keys.confirm_key.clone(),
            transcript_hash: pending.transcript_hash,
        }
    }
}

impl Ticket {
    /// The session id every record of the session carries.
    pub fn session_id(&self) -> u64 {
        self.info.session_id
    }

    /// Who the session is with (authenticated by its handshake signature).
    pub fn info(&self) -> &SessionInfo {
        &self.info
    }

    /// Checks message 3 against the ticket: the initiator holds the session keys.
    pub fn check_confirm(&self, confirm: &[u8]) -> Result<(), HandshakeError> {
        check_confirm(
            confirm,
            self.info.session_id,
            &self.confirm_key,
            &self.transcript_hash,
        )
    }

    /// The bytes to put in the shared store (zeroed when dropped).
    pub fn encode(&self) -> Zeroizing<Vec<u8>> {
        let wire = TicketWire {
            version: TICKET_VERSION,
            session_id: self.info.session_id,
            suite: self.info.suite,
            local_id: self.info.local_id.0,
            peer_id: self.info.peer_id.0,
            peer_public_key: self.info.peer_public_key,
            mesh: self.info.mesh.as_str(),
            records_per_key: self.records_per_key,
            initiator_to_responder: *self.initiator_to_responder,
            responder_to_initiator: *self.responder_to_initiator,
            confirm_key: *self.confirm_key,
            transcript_hash: self.transcript_hash,
        };
        Zeroizing::new(postcard::to_allocvec(&wire).expect("tickets serialize"))
    }

    /// Reads [`Ticket::encode`]. Total: any bytes give a ticket or an error.
    pub fn decode(bytes: &[u8]) -> Result<Ticket, WireError> {
        if bytes.len() > MAX_TICKET_LEN {
            return Err(WireError::TooLarge {
                len: bytes.len(),
                max: MAX_TICKET_LEN,
            });
        }
        let (wire, rest) = postcard::take_from_bytes::<TicketWire>(bytes)?;
        if !rest.is_empty() {
            return Err(WireError::TrailingBytes(rest.len()));
        }
        if wire.version != TICKET_VERSION {
            return Err(WireError::UnsupportedVersion(wire.version));
        }
        let mesh = MeshName::new(wire.mesh).map_err(|_| WireError::Malformed)?;
        // Rebuilding the session from a corrupted store must not yield a session with
        // a peer id its key does not hash to.
        if PeerId::derive(&wire.peer_public_key, mesh.as_str()) != PeerId(wire.peer_id) {
            return Err(WireError::Malformed);
        }
        if wire.records_per_key < 2 {
            return Err(WireError::Malformed);
        }
        Ok(Ticket {
            info: SessionInfo {
                session_id: wire.session_id,
                suite: wire.suite,
                role: Role::Responder,
                local_id: PeerId(wire.local_id),
                peer_id: PeerId(wire.peer_id),
                peer_public_key: wire.peer_public_key,
                mesh,
            },
            records_per_key: wire.records_per_key,
            initiator_to_responder: Zeroizing::new(wire.initiator_to_responder),
            responder_to_initiator: Zeroizing::new(wire.responder_to_initiator),
            confirm_key: Zeroizing::new(wire.confirm_key),
            transcript_hash: wire.transcript_hash,
        })
    }
}

/// One worker's view of a shared responder session: it opens requests against a
/// replay window kept elsewhere and seals each response under its request's number.
pub struct SharedResponder {
    info: SessionInfo,
    records_per_key: u64,
    requests: EpochKeys,
    responses: EpochKeys,
}

impl SharedResponder {
    /// Rebuilds the session from its ticket. The caller checks message 3 first
    /// ([`Ticket::check_confirm`]) unless the store says it was checked already.
    pub fn new(ticket: &Ticket) -> Self {
        let key = |secret| DirectionKey::new(ticket.info.suite, secret);
        SharedResponder {
            info: ticket.info.clone(),
            records_per_key: ticket.records_per_key,
            requests: EpochKeys::new(key(&ticket.initiator_to_responder), true),
            responses: EpochKeys::new(key(&ticket.responder_to_initiator), true),
        }
    }

    /// Who the session is with.
    pub fn info(&self) -> &SessionInfo {
        &self.info
    }

    /// Opens a request in place. `window` is the session's shared replay window:
    /// it is checked before any cryptography and updated only if the record
    /// authenticates; the caller then writes it back with compare-and-swap (and, on
    /// a conflict, retries with the fresh window and the original record bytes).
    pub fn open_request<'r>(
        &mut self,
        record: &'r mut [u8],
        window: &mut ReplayWindow,
    ) -> Result<Opened<'r>, ChannelError> {
        let header = RecordHeader::decode(record)?;
        check_header(&header, record, self.info.session_id)?;
        if header.reply_to != 0 {
            // Requests answer nothing; a response reflected back fails here (and
            // would fail authentication anyway: responses use the other key).
            return Err(ChannelError::Authentication);
        }
        window.check(header.seq)?;
        let found = self.requests.find(header.seq, self.records_per_key)?;
        let payload = open_with(
            self.requests.get(&found),
            &header,
            self.info.local_id,
            record,
        )?;
        self.requests.adopt(found);
        window.accept(header.seq);
        Ok(Opened {
            seq: header.seq,
            reply_to: None,
            payload,
        })
    }

    /// Seals the response to request `request_seq` (which [`Self::open_request`]
    /// accepted): its sequence number and `reply_to` are both `request_seq`.
    pub fn seal_reply(
        &mut self,
        request_seq: u64,
        payload: &[u8],
    ) -> Result<Vec<u8>, ChannelError> {
        if payload.len() > MAX_RECORD_PAYLOAD {
            return Err(ChannelError::PayloadTooLarge(payload.len()));
        }
        if request_seq == 0 {
            return Err(ChannelError::InvalidReplyTo);
        }
        let found = self.responses.find(request_seq, self.records_per_key)?;
        let header = RecordHeader::new(
            self.info.session_id,
            request_seq,
            request_seq,
            payload.len(),
        );
        let mut record = Vec::with_capacity(payload.len() + RECORD_HEADER_LEN + TAG_LEN);
        record.extend_from_slice(&header.encode());
        record.extend_from_slice(payload);
        let (head, body) = record.split_at_mut(RECORD_HEADER_LEN);
        let tag = self
            .responses
            .get(&found)
            .key
            .seal_in_place_separate_tag(nonce(request_seq), aad(head, &self.info.peer_id), body)
            .map_err(|_| ChannelError::PayloadTooLarge(payload.len()))?;
        record.extend_from_slice(tag.as_ref());
        self.responses.adopt(found);
        Ok(record)
    }
}
