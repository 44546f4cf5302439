//! A sealed byte stream over one transport connection, the way TLS sits under HTTP:
//! the key agreement at its start, then stream-mode records in both directions.
//!
//! Sans-IO and shaped for proxies that can only rewrite bytes as they pass (Envoy's
//! Wasm network filters): every call takes the bytes that arrived from one side and
//! returns what goes on to each side. Neither end ever has to send unprompted except
//! the initiator, which holds the app's first bytes until the key agreement is done:
//!
//! ```text
//!  initiator                                           responder
//!  app bytes ─▶ hold, send Hello ──────── 1 ─────────▶ respond, feed `preface` to the app
//!                                                      app's answer ─▶ hold, send Reply
//!  ◀─────────────────────────────────────── 2 ───────── (the app's first bytes wait)
//!  send Confirm, Meta and the held bytes ─ 3 ─────────▶ confirm; Meta; strip `preface`
//!  ◀═══════════════ records both ways (the responder's held bytes first) ══════════▶
//! ```
//!
//! The responder feeds its app `preface` (the HTTP/2 connection preface between
//! Themis sidecars) so that the app answers — with its SETTINGS frame — and gives the
//! responder a write to carry message 2 on. The initiator's app sends the same
//! preface first; the responder drops it, so the app sees it exactly once.
//!
//! A replayed message 1 is refused by the responder's [`HelloGuard`] before any
//! public-key work (`stale` outside the freshness window, `replay` within it); a
//! replay the guard does not remember (another worker's guard, or one forgotten when
//! full) gets a fresh message 2 and fails at message 3: nothing of it reaches the app. Any record that does not open ends the
//! stream ([`Refusal`]); the driver closes the connection.

use alloc::string::String;
use alloc::vec::Vec;

use ring::rand::SecureRandom;
use serde::{Deserialize, Serialize};

use crate::channel::{ChannelError, Session, SessionInfo};
use crate::delegation::HandshakeSigner;
use crate::guard::HelloGuard;
use crate::handshake::{
    self, AwaitingConfirm, AwaitingHelloReply, HandshakeConfig, HandshakeError, PendingHello,
    PendingReply, ToSign,
};
use crate::identity::{PeerId, PublicIdentity};
use crate::params::{Carries, RECORD_PAYLOAD};
use crate::wire::{
    frame_len, peek_kind, Kind, WireError, RECORD_HEADER_LEN, RECORD_OVERHEAD, TAG_LEN,
};

/// Plaintext per record without options, like TLS: a stream is sealed as it flows,
/// never buffered whole. Both sides may take larger records in the handshake
/// ([`crate::params::StreamOptions::LARGE_RECORDS`]); the [`Meta`] record is always this small.
pub const MAX_CHUNK: usize = RECORD_PAYLOAD;

/// The largest record a stream accepts without options: [`MAX_CHUNK`] of payload.
pub const MAX_RECORD_LEN: usize = MAX_CHUNK + RECORD_OVERHEAD;

/// The largest record a session's stream accepts, as its handshake agreed.
fn max_record_len(session: &Session) -> usize {
    session.info().options.record_payload() + RECORD_OVERHEAD
}

/// The HTTP/2 client connection preface: what a responder in front of an HTTP/2
/// server feeds it when message 1 arrives.
pub const HTTP2_PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// The most of its app's bytes a side holds before the session opens (the agent is
/// signing, or the peer has not answered): HTTP/2's first windows and a first
/// request fit; an app writing on past it while the peer stays silent would
/// otherwise be buffered whole ([`Refusal::Overflow`]).
pub const MAX_HELD: usize = 4 << 20;

/// The longest service name a [`Meta`] may claim.
pub const MAX_SERVICE_LEN: usize = 253;

/// What the initiator tells the responder about itself in its first record.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Meta {
    /// The service the initiator claims to be an instance of; the responder checks
    /// the claim (the DHT must list the initiator's id for it) before believing it.
    pub service: Option<String>,
}

impl Meta {
    fn encode(&self) -> Vec<u8> {
        postcard::to_allocvec(self).unwrap_or_default()
    }

    fn decode(bytes: &[u8]) -> Result<Meta, Refusal> {
        let meta: Meta = postcard::from_bytes(bytes).map_err(|_| Refusal::Meta)?;
        match &meta.service {
            Some(s) if s.is_empty() || s.len() > MAX_SERVICE_LEN => Err(Refusal::Meta),
            _ => Ok(meta),
        }
    }
}

/// Why a stream was ended. Every one closes the connection; [`Refusal::reason`] is
/// the label it is counted by.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    /// The bytes are not this protocol (plaintext, garbage, a message too large).
    #[error("not a Themis stream: {0}")]
    Malformed(WireError),
    /// A handshake message was refused (bad signature, wrong peer, a stale or replayed
    /// Hello, a replayed connection's message 3, ...).
    #[error("handshake refused: {0}")]
    Handshake(HandshakeError),
    /// A record was tampered with, replayed, reordered or forged.
    #[error("record refused: {0}")]
    Record(ChannelError),
    /// A message out of turn (data before the handshake finished, a second Hello).
    #[error("a {0} arrived out of turn")]
    OutOfTurn(&'static str),
    /// The initiator's first record is not a valid [`Meta`].
    #[error("the connection's first record is not valid metadata")]
    Meta,
    /// The initiator's app did not start with the expected preface.
    #[error("the stream does not start with the expected preface")]
    Preface,
    /// The app wrote more than [`MAX_HELD`] before the session opened.
    #[error("the app wrote more than {MAX_HELD} bytes before the session opened")]
    Overflow,
}

impl Refusal {
    /// A short label for metrics and logs.
    pub fn reason(&self) -> &'static str {
        match self {
            Refusal::Malformed(_) => "malformed",
            Refusal::Handshake(HandshakeError::Stale) => "stale",
            Refusal::Handshake(HandshakeError::Replayed) => "replay",
            Refusal::Handshake(_) => "handshake",
            Refusal::Record(ChannelError::OutOfOrder { .. } | ChannelError::Replay(_)) => "replay",
            Refusal::Record(_) => "tampered",
            Refusal::OutOfTurn(_) => "out_of_turn",
            Refusal::Meta => "meta",
            Refusal::Preface => "preface",
            Refusal::Overflow => "overflow",
        }
    }
}

/// Bytes for each side after one call.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Output {
    /// Toward the peer (sealed).
    pub to_peer: Vec<u8>,
    /// Toward the local app (plaintext).
    pub to_app: Vec<u8>,
}

/// Whole protocol messages out of a byte stream that arrives in arbitrary pieces.
#[derive(Default)]
struct Inbox {
    buf: Vec<u8>,
}

impl Inbox {
    /// Appends `data` and takes the next whole message, if there is one.
    fn push(&mut self, data: &[u8]) {
        self.buf.extend_from_slice(data);
    }

    /// The next message, which must be a `kind` handshake message: anything else is
    /// refused by its first two bytes, before an unauthenticated peer can make us
    /// buffer a record-sized frame.
    fn next_handshake(&mut self, kind: Kind) -> Result<Option<Vec<u8>>, Refusal> {
        if self.buf.len() >= 2 {
            let got = peek_kind(&self.buf[..2]).map_err(Refusal::Malformed)?;
            if got != kind {
                return Err(Refusal::Malformed(WireError::UnexpectedKind {
                    expected: kind,
                    got,
                }));
            }
        }
        self.next()
    }

    /// The next whole record, refused by its header if it is longer than a stream
    /// record may be ([`MAX_RECORD_LEN`]): a peer cannot make us hold more.
    fn next_record(&mut self) -> Result<Option<Vec<u8>>, Refusal> {
        if let Some(len) = frame_len(&self.buf).map_err(Refusal::Malformed)? {
            if len > MAX_RECORD_LEN {
                return Err(Refusal::Malformed(WireError::TooLarge {
                    len,
                    max: MAX_RECORD_LEN,
                }));
            }
        }
        self.next()
    }

    fn next(&mut self) -> Result<Option<Vec<u8>>, Refusal> {
        match frame_len(&self.buf).map_err(Refusal::Malformed)? {
            Some(len) if len <= self.buf.len() => {
                let rest = self.buf.split_off(len);
                Ok(Some(core::mem::replace(&mut self.buf, rest)))
            }
            _ => Ok(None),
        }
    }

    fn is_empty(&self) -> bool {
        self.buf.is_empty()
    }
}

/// Holds `data` for after the handshake (or a decision), at most [`MAX_HELD`] in all;
/// `held` is left as it was when `data` would go past it. Drivers that hold bytes
/// outside a stream (before it exists, or after it opened) bound them with this too.
pub fn hold(held: &mut Vec<u8>, data: &[u8]) -> Result<(), Refusal> {
    if held.len() + data.len() > MAX_HELD {
        return Err(Refusal::Overflow);
    }
    held.extend_from_slice(data);
    Ok(())
}

/// Seals `data` into records of at most the session's record payload, appended to
/// `out` and sealed where they lie (no intermediate buffers).
fn seal_into(session: &mut Session, data: &[u8], out: &mut Vec<u8>) -> Result<(), Refusal> {
    let chunk_len = session.info().options.record_payload();
    out.reserve(data.len() + data.len().div_ceil(chunk_len) * RECORD_OVERHEAD);
    for chunk in data.chunks(chunk_len) {
        let start = out.len();
        out.resize(start + RECORD_HEADER_LEN, 0);
        out.extend_from_slice(chunk);
        out.resize(out.len() + TAG_LEN, 0);
        session
            .seal_in_place(&mut out[start..], None)
            .map_err(Refusal::Record)?;
    }
    Ok(())
}

/// Opens every whole record in `inbox` where it lies, appending the plaintext to
/// `out`; what is left is the start of the next record.
fn open_all(session: &mut Session, inbox: &mut Inbox, out: &mut Vec<u8>) -> Result<(), Refusal> {
    let max = max_record_len(session);
    let mut at = 0;
    let result = loop {
        let len = match frame_len(&inbox.buf[at..]) {
            // Records carry at most the agreed payload: a peer cannot make us hold more.
            Ok(Some(len)) if len > max => {
                break Err(Refusal::Malformed(WireError::TooLarge { len, max }))
            }
            Ok(Some(len)) if at + len <= inbox.buf.len() => len,
            Ok(_) => break Ok(()),
            Err(e) => break Err(Refusal::Malformed(e)),
        };
        match session.open_in_place(&mut inbox.buf[at..at + len]) {
            Ok(opened) => out.extend_from_slice(opened.payload),
            Err(e) => break Err(Refusal::Record(e)),
        }
        at += len;
    };
    inbox.buf.drain(..at);
    result
}

// The session is the state for most of a connection's life: boxing it would only add
// an allocation per connection.
#[allow(clippy::large_enum_variant)]
enum InitiatorState {
    /// Message 1 is made; its signature is being asked for (delegated signing).
    AwaitingSignature(PendingHello),
    AwaitingReply(AwaitingHelloReply),
    Open(Session),
    Closed,
}

/// The connecting end: its app writes first.
pub struct StreamInitiator {
    state: InitiatorState,
    inbox: Inbox,
    /// The app's bytes while the key agreement runs, with the [`Meta`] record's
    /// plaintext in front.
    held: Vec<u8>,
    meta: Meta,
}

impl StreamInitiator {
    /// Starts the key agreement with `peer`; returns the stream and message 1, to
    /// send when the app's first bytes are held ([`StreamInitiator::from_app`]).
    pub fn start(
        me: &dyn HandshakeSigner,
        peer: PeerId,
        meta: Meta,
        config: &HandshakeConfig,
        now_ms: u64,
        rng: &dyn SecureRandom,
    ) -> Result<(Self, Vec<u8>), HandshakeError> {
        let (waiting, hello) = handshake::Initiator::start(me, peer, config, now_ms, rng)?;
        let stream = StreamInitiator {
            state: InitiatorState::AwaitingReply(waiting),
            inbox: Inbox::default(),
            held: Vec::new(),
            meta,
        };
        Ok((stream, hello))
    }

    /// [`StreamInitiator::start`] without the private key: message 1 waits for its
    /// signature ([`StreamInitiator::to_sign`], then [`StreamInitiator::signed`]).
    /// Meanwhile the app's bytes are held as usual; the peer may not speak yet.
    pub fn start_unsigned(
        me: &PublicIdentity,
        peer: PeerId,
        meta: Meta,
        config: &HandshakeConfig,
        now_ms: u64,
        rng: &dyn SecureRandom,
    ) -> Result<Self, HandshakeError> {
        let pending = handshake::Initiator::start_unsigned(me, peer, config, now_ms, rng)?;
        Ok(StreamInitiator {
            state: InitiatorState::AwaitingSignature(pending),
            inbox: Inbox::default(),
            held: Vec::new(),
            meta,
        })
    }

    /// What the delegated signer must sign, while message 1 waits for it.
    pub fn to_sign(&self) -> Option<ToSign> {
        match &self.state {
            InitiatorState::AwaitingSignature(pending) => Some(pending.to_sign()),
            _ => None,
        }
    }

    /// The signer's answer: checked under our own key, it completes message 1, which
    /// is returned (to send now). A bad signature ends the stream.
    pub fn signed(&mut self, signature: &[u8; 64]) -> Result<Vec<u8>, Refusal> {
        let InitiatorState::AwaitingSignature(pending) =
            core::mem::replace(&mut self.state, InitiatorState::Closed)
        else {
            return Err(Refusal::OutOfTurn("signature"));
        };
        let (waiting, hello) = pending.finish(signature).map_err(Refusal::Handshake)?;
        self.state = InitiatorState::AwaitingReply(waiting);
        Ok(hello)
    }

    /// True if the peer's bytes stop inside a message: at the end of the stream,
    /// a truncation (nothing of the partial message was delivered).
    pub fn is_mid_message(&self) -> bool {
        !self.inbox.is_empty()
    }

    /// The authenticated peer, once message 2 verified.
    pub fn peer_id(&self) -> Option<PeerId> {
        match &self.state {
            InitiatorState::Open(s) => Some(s.info().peer_id),
            _ => None,
        }
    }

    /// True once the key agreement finished.
    pub fn is_open(&self) -> bool {
        matches!(self.state, InitiatorState::Open(_))
    }

    /// The session, once message 2 verified: the peer, what the stream carries and
    /// the endorsement the peer sent.
    pub fn info(&self) -> Option<&SessionInfo> {
        match &self.state {
            InitiatorState::Open(s) => Some(s.info()),
            _ => None,
        }
    }

    /// Bytes the app wrote: held until the session exists, then sealed.
    pub fn from_app(&mut self, data: &[u8]) -> Result<Vec<u8>, Refusal> {
        let mut to_peer = Vec::new();
        match &mut self.state {
            InitiatorState::AwaitingSignature(_) | InitiatorState::AwaitingReply(_) => {
                if let Err(refusal) = hold(&mut self.held, data) {
                    self.state = InitiatorState::Closed;
                    return Err(refusal);
                }
            }
            InitiatorState::Open(session) => seal_into(session, data, &mut to_peer)?,
            InitiatorState::Closed => return Err(Refusal::OutOfTurn("write after close")),
        }
        Ok(to_peer)
    }

    /// Bytes from the peer: message 2 (answered with message 3, the metadata and the
    /// held bytes, sealed), then records.
    pub fn from_peer(&mut self, data: &[u8]) -> Result<Output, Refusal> {
        let result = self.step(data);
        if result.is_err() {
            self.state = InitiatorState::Closed;
        }
        result
    }

    fn step(&mut self, data: &[u8]) -> Result<Output, Refusal> {
        self.inbox.push(data);
        let mut out = Output::default();
        if let InitiatorState::AwaitingSignature(_) = self.state {
            // Message 1 has not left yet: the peer has nothing to answer.
            return match self.inbox.is_empty() {
                true => Ok(out),
                false => Err(Refusal::OutOfTurn("message before the hello")),
            };
        }
        if let InitiatorState::AwaitingReply(_) = self.state {
            let Some(reply) = self.inbox.next_handshake(Kind::HelloReply)? else {
                return Ok(out);
            };
            let InitiatorState::AwaitingReply(waiting) =
                core::mem::replace(&mut self.state, InitiatorState::Closed)
            else {
                unreachable!("checked above")
            };
            let (mut session, confirm) = waiting
                .read_hello_reply(&reply)
                .map_err(Refusal::Handshake)?;
            out.to_peer = confirm;
            seal_into(&mut session, &self.meta.encode(), &mut out.to_peer)?;
            let held = core::mem::take(&mut self.held);
            seal_into(&mut session, &held, &mut out.to_peer)?;
            self.state = InitiatorState::Open(session);
        }
        match &mut self.state {
            InitiatorState::Open(session) => open_all(session, &mut self.inbox, &mut out.to_app)?,
            _ => return Err(Refusal::OutOfTurn("record after close")),
        }
        Ok(out)
    }
}

#[allow(clippy::large_enum_variant)] // as InitiatorState
enum ResponderState {
    AwaitingHello,
    /// Message 1 verified and message 2 made; its signature is being asked for
    /// (delegated signing). The app is fed the preface only once it is signed.
    AwaitingSignature(PendingReply),
    /// Message 2 is made; `reply` is `Some` until it rides on the app's first write.
    AwaitingConfirm {
        pending: AwaitingConfirm,
        reply: Option<Vec<u8>>,
    },
    /// Confirmed; the first record (the [`Meta`]) not yet read.
    AwaitingMeta(Session),
    Open {
        session: Session,
        /// Bytes of the preface still to strip from the initiator's plaintext.
        strip: usize,
    },
    Closed,
}

/// Who signs the responder's message 2: its own key, or a delegated signer asked
/// through [`StreamResponder::to_sign`].
#[derive(Clone, Copy)]
enum Signer<'a> {
    Own(&'a dyn HandshakeSigner),
    Delegated(&'a PublicIdentity),
}

/// What the responder learnt when the initiator proved itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Established {
    /// The authenticated initiator.
    pub peer_id: PeerId,
    /// What it says about itself (unverified claims).
    pub meta: Meta,
    /// The endorsement it carried in message 1 (opaque: the driver verifies it
    /// against the mesh root); empty for none.
    pub peer_endorsement: Vec<u8>,
    /// What the stream carries, as agreed (for the server's codec).
    pub carries: Carries,
}

/// The accepting end: its app answers the preface, and that write carries message 2.
pub struct StreamResponder {
    state: ResponderState,
    inbox: Inbox,
    /// The app's bytes while message 3 is awaited (sent sealed on its next write).
    held: Vec<u8>,
    preface: &'static [u8],
    established: Option<Established>,
}

impl StreamResponder {
    /// A responder that feeds its app `preface` when message 1 arrives.
    pub fn new(preface: &'static [u8]) -> Self {
        StreamResponder {
            state: ResponderState::AwaitingHello,
            inbox: Inbox::default(),
            held: Vec::new(),
            preface,
            established: None,
        }
    }

    /// True if the peer's bytes stop inside a message: at the end of the stream,
    /// a truncation (nothing of the partial message was delivered).
    pub fn is_mid_message(&self) -> bool {
        !self.inbox.is_empty()
    }

    /// The initiator, once it proved itself (message 3 and its metadata record).
    pub fn established(&self) -> Option<&Established> {
        self.established.as_ref()
    }

    /// Bytes from the peer at `now_ms` (Unix milliseconds). Message 1 is checked
    /// against `guard` (freshness window, replay cache: before any public-key work)
    /// and answered (as `me`) by feeding the app the preface; message 3 confirms;
    /// records are opened for the app.
    pub fn from_peer(
        &mut self,
        data: &[u8],
        me: &dyn HandshakeSigner,
        config: &HandshakeConfig,
        guard: &mut HelloGuard,
        now_ms: u64,
        rng: &dyn SecureRandom,
    ) -> Result<Output, Refusal> {
        let result = self.step(data, Signer::Own(me), config, guard, now_ms, rng);
        if result.is_err() {
            self.state = ResponderState::Closed;
        }
        result
    }

    /// [`StreamResponder::from_peer`] without the private key: when message 1 has
    /// verified, message 2 waits for its signature ([`StreamResponder::to_sign`],
    /// then [`StreamResponder::signed`], which feeds the app the preface). Meanwhile
    /// the peer may not speak (it has nothing to answer yet).
    pub fn from_peer_unsigned(
        &mut self,
        data: &[u8],
        me: &PublicIdentity,
        config: &HandshakeConfig,
        guard: &mut HelloGuard,
        now_ms: u64,
        rng: &dyn SecureRandom,
    ) -> Result<Output, Refusal> {
        let result = self.step(data, Signer::Delegated(me), config, guard, now_ms, rng);
        if result.is_err() {
            self.state = ResponderState::Closed;
        }
        result
    }

    /// What the delegated signer must sign, while message 2 waits for it.
    pub fn to_sign(&self) -> Option<ToSign> {
        match &self.state {
            ResponderState::AwaitingSignature(pending) => Some(pending.to_sign()),
            _ => None,
        }
    }

    /// The signer's answer: checked under our own key, it completes message 2, which
    /// rides on the app's first write; the app is fed the preface (in the output) so
    /// that it writes. (If the app wrote already while the signature was awaited,
    /// message 2 is in the output's `to_peer` instead.) A bad signature ends the
    /// stream.
    pub fn signed(&mut self, signature: &[u8; 64]) -> Result<Output, Refusal> {
        let ResponderState::AwaitingSignature(pending) =
            core::mem::replace(&mut self.state, ResponderState::Closed)
        else {
            return Err(Refusal::OutOfTurn("signature"));
        };
        let (pending, reply) = pending.finish(signature).map_err(Refusal::Handshake)?;
        let mut out = self.replied(pending, reply);
        if !self.held.is_empty() {
            out.to_peer = self.from_app(&[])?;
        }
        Ok(out)
    }

    /// Message 2 is ready: it waits for the app's first write, which the preface
    /// prompts.
    fn replied(&mut self, pending: AwaitingConfirm, reply: Vec<u8>) -> Output {
        self.state = ResponderState::AwaitingConfirm {
            pending,
            reply: Some(reply),
        };
        Output {
            to_app: self.preface.to_vec(),
            ..Output::default()
        }
    }

    fn step(
        &mut self,
        data: &[u8],
        me: Signer<'_>,
        config: &HandshakeConfig,
        guard: &mut HelloGuard,
        now_ms: u64,
        rng: &dyn SecureRandom,
    ) -> Result<Output, Refusal> {
        self.inbox.push(data);
        let mut out = Output::default();
        loop {
            match &mut self.state {
                ResponderState::AwaitingHello => {
                    let Some(hello) = self.inbox.next_handshake(Kind::Hello)? else {
                        return Ok(out);
                    };
                    let me = match me {
                        Signer::Own(me) => me,
                        Signer::Delegated(public) => {
                            let pending = handshake::respond_unsigned(
                                public, &hello, config, guard, now_ms, rng,
                            )
                            .map_err(Refusal::Handshake)?;
                            if !self.inbox.is_empty() {
                                return Err(Refusal::OutOfTurn("message before the reply"));
                            }
                            self.state = ResponderState::AwaitingSignature(pending);
                            return Ok(out);
                        }
                    };
                    let (pending, reply) =
                        handshake::respond(me, &hello, config, guard, now_ms, rng)
                            .map_err(Refusal::Handshake)?;
                    if !self.inbox.is_empty() {
                        return Err(Refusal::OutOfTurn("message before the reply"));
                    }
                    return Ok(self.replied(pending, reply));
                }
                ResponderState::AwaitingSignature(_) => {
                    // Message 2 has not left yet: nothing can be valid so early.
                    return match self.inbox.is_empty() {
                        true => Ok(out),
                        false => Err(Refusal::OutOfTurn("message before the reply")),
                    };
                }
                ResponderState::AwaitingConfirm { reply, .. } => {
                    if reply.is_some() {
                        // Message 2 has not left yet: nothing can be valid so early.
                        return match self.inbox.is_empty() {
                            true => Ok(out),
                            false => Err(Refusal::OutOfTurn("message before the reply")),
                        };
                    }
                    let Some(confirm) = self.inbox.next_handshake(Kind::Confirm)? else {
                        return Ok(out);
                    };
                    let ResponderState::AwaitingConfirm { pending, .. } =
                        core::mem::replace(&mut self.state, ResponderState::Closed)
                    else {
                        unreachable!("matched above")
                    };
                    let session = pending.read_confirm(&confirm).map_err(Refusal::Handshake)?;
                    self.state = ResponderState::AwaitingMeta(session);
                }
                ResponderState::AwaitingMeta(session) => {
                    let Some(mut record) = self.inbox.next_record()? else {
                        return Ok(out);
                    };
                    let opened = session
                        .open_in_place(&mut record)
                        .map_err(Refusal::Record)?;
                    let meta = Meta::decode(opened.payload)?;
                    let info = session.info();
                    self.established = Some(Established {
                        peer_id: info.peer_id,
                        meta,
                        peer_endorsement: info.peer_endorsement.clone(),
                        carries: info.carries,
                    });
                    let ResponderState::AwaitingMeta(session) =
                        core::mem::replace(&mut self.state, ResponderState::Closed)
                    else {
                        unreachable!("matched above")
                    };
                    self.state = ResponderState::Open {
                        session,
                        strip: self.preface.len(),
                    };
                }
                ResponderState::Open { session, strip } => {
                    let start = out.to_app.len();
                    open_all(session, &mut self.inbox, &mut out.to_app)?;
                    if *strip > 0 {
                        let got = &out.to_app[start..];
                        let offset = self.preface.len() - *strip;
                        let n = got.len().min(*strip);
                        if got[..n] != self.preface[offset..offset + n] {
                            return Err(Refusal::Preface);
                        }
                        out.to_app.drain(start..start + n);
                        *strip -= n;
                    }
                    return Ok(out);
                }
                ResponderState::Closed => return Err(Refusal::OutOfTurn("record after close")),
            }
        }
    }

    /// Bytes the app wrote. Its first write carries message 2 (the bytes themselves
    /// wait for message 3); once confirmed, everything is sealed.
    pub fn from_app(&mut self, data: &[u8]) -> Result<Vec<u8>, Refusal> {
        let held = match &mut self.state {
            ResponderState::Open { .. } | ResponderState::Closed => Ok(()),
            _ => hold(&mut self.held, data),
        };
        if let Err(refusal) = held {
            self.state = ResponderState::Closed;
            return Err(refusal);
        }
        match &mut self.state {
            ResponderState::AwaitingConfirm { reply, .. } => Ok(reply.take().unwrap_or_default()),
            ResponderState::AwaitingHello
            | ResponderState::AwaitingSignature(_)
            | ResponderState::AwaitingMeta(_) => Ok(Vec::new()),
            ResponderState::Open { session, .. } => {
                let mut to_peer = Vec::new();
                let held = core::mem::take(&mut self.held);
                seal_into(session, &held, &mut to_peer)?;
                seal_into(session, data, &mut to_peer)?;
                Ok(to_peer)
            }
            ResponderState::Closed => Err(Refusal::OutOfTurn("write after close")),
        }
    }
}
