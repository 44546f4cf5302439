//! The secure channel: the paper's Fig. 3 records.
//!
//! ```text
//! record = header ‖ AEAD(key_epoch, nonce(seq), aad = header ‖ receiver id, payload) ‖ tag
//! header = version, kind, session id, seq, reply_to, len        (30 bytes, clear)
//! ```
//!
//! The receiver's id is bound as associated data: a record made for another id fails
//! authentication. Sequence numbers start at 1 and strictly increase per direction;
//! a stream channel accepts exactly the next one (so a dropped, replayed or reordered
//! record is detected), a datagram channel accepts each number once within a sliding
//! window. `reply_to` binds a response to the request it answers. Every
//! `records_per_key` records the direction's key ratchets forward (rekeying), long
//! before a nonce could repeat.
//!
//! Sealing and opening work in place on the caller's buffer and allocate nothing.

use alloc::vec::Vec;

use ring::aead;

use crate::identity::{MeshName, PeerId};
use crate::keys::{nonce, DirectionKey, SessionKeys};
pub use crate::params::ChannelMode;
use crate::params::{Carries, HandshakeConfig, Role, StreamOptions};
use crate::suite::Suite;
use crate::wire::{
    RecordHeader, WireError, MAX_RECORD_PAYLOAD, RECORD_HEADER_LEN, RECORD_OVERHEAD, TAG_LEN,
};

/// How far behind the highest sequence number a datagram may arrive.
pub const REPLAY_WINDOW: u64 = 128;
/// How many epochs ahead of its current key a datagram receiver ratchets to open a
/// record (after losing every record of the epochs between). Bounded so that a forged
/// sequence number cannot make the receiver derive keys without end.
pub const MAX_EPOCHS_AHEAD: u64 = 4;

/// Why a record was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ChannelError {
    /// The record does not decode.
    #[error("bad record: {0}")]
    Wire(#[from] WireError),
    /// The buffer length disagrees with the header's payload length.
    #[error("the record is {got} bytes but its header says {expected}")]
    LengthMismatch {
        /// From the header.
        expected: usize,
        /// Received.
        got: usize,
    },
    /// The payload is larger than [`MAX_RECORD_PAYLOAD`].
    #[error("a payload of {0} bytes is larger than the {MAX_RECORD_PAYLOAD} allowed")]
    PayloadTooLarge(usize),
    /// A sealing buffer smaller than the record overhead.
    #[error("the buffer is smaller than the {RECORD_OVERHEAD}-byte record overhead")]
    BufferTooSmall,
    /// The record belongs to another session.
    #[error("the record belongs to another session")]
    WrongSession,
    /// Tampered with, reflected back, made for another receiver, or forged.
    #[error("the record failed authentication")]
    Authentication,
    /// A record more than [`MAX_EPOCHS_AHEAD`] key epochs ahead: so many records were
    /// lost that the session cannot catch up. Handshake again.
    #[error(
        "record {0} is too many key epochs ahead (records were lost); a new handshake is needed"
    )]
    TooFarAhead(u64),
    /// A sequence number already seen (replay) or too old for the window.
    #[error("record {0} was already received or is too old (replay)")]
    Replay(u64),
    /// A stream record that is not the next one (a record was dropped or reordered).
    #[error("expected record {expected}, got {got} (dropped or reordered)")]
    OutOfOrder {
        /// The next sequence number.
        expected: u64,
        /// The one received.
        got: u64,
    },
    /// `Some(0)` as `reply_to`: sequence numbers start at 1, and 0 means "none".
    #[error("reply_to must name a sequence number (they start at 1)")]
    InvalidReplyTo,
    /// A response that answers another request than the one expected.
    #[error("the response answers request {got:?}, not {expected}")]
    UnexpectedReply {
        /// The request sent.
        expected: u64,
        /// What the response says it answers.
        got: Option<u64>,
    },
    /// The direction has used every sequence number; handshake again.
    #[error("the session has used every sequence number; a new handshake is needed")]
    SequenceExhausted,
}

/// What both sides know about an established session.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SessionInfo {
    /// The id records carry in clear.
    pub session_id: u64,
    /// The negotiated AEAD.
    pub suite: Suite,
    /// Which end of the handshake this side was.
    pub role: Role,
    /// Our id.
    pub local_id: PeerId,
    /// The authenticated peer's id.
    pub peer_id: PeerId,
    /// The peer's Ed25519 public key (it hashes to `peer_id`).
    pub peer_public_key: [u8; 32],
    /// The mesh both belong to.
    pub mesh: MeshName,
    /// What the stream carries, as agreed in the handshake.
    pub carries: Carries,
    /// The stream options both sides took in the handshake.
    pub options: StreamOptions,
    /// The endorsement the peer sent with its handshake message (opaque here: the
    /// driver verifies it against the mesh root); empty for none.
    pub peer_endorsement: Vec<u8>,
}

/// An established, authenticated session: a [`Sealer`] for what we send and an
/// [`Opener`] for what we receive.
pub struct Session {
    info: SessionInfo,
    sealer: Sealer,
    opener: Opener,
}

impl Session {
    pub(crate) fn new(info: SessionInfo, keys: &SessionKeys, config: &HandshakeConfig) -> Self {
        let (send, recv) = match info.role {
            Role::Initiator => (&keys.initiator_to_responder, &keys.responder_to_initiator),
            Role::Responder => (&keys.responder_to_initiator, &keys.initiator_to_responder),
        };
        let records_per_key = config.records_per_key;
        Session {
            sealer: Sealer {
                session_id: info.session_id,
                receiver: info.peer_id,
                next_seq: 1,
                key: DirectionKey::new(info.suite, send),
                records_per_key,
            },
            opener: Opener {
                session_id: info.session_id,
                receiver: info.local_id,
                window: Ordering::new(config.mode),
                keys: EpochKeys::new(
                    DirectionKey::new(info.suite, recv),
                    config.mode == ChannelMode::Datagram,
                ),
                records_per_key,
            },
            info,
        }
    }

    /// Who the session is with, and how.
    pub fn info(&self) -> &SessionInfo {
        &self.info
    }

    /// Seals a record in place; see [`Sealer::seal_in_place`].
    pub fn seal_in_place(
        &mut self,
        record: &mut [u8],
        reply_to: Option<u64>,
    ) -> Result<u64, ChannelError> {
        self.sealer.seal_in_place(record, reply_to)
    }

    /// Seals `payload` into a new record; see [`Sealer::seal`].
    pub fn seal(
        &mut self,
        payload: &[u8],
        reply_to: Option<u64>,
    ) -> Result<(u64, Vec<u8>), ChannelError> {
        self.sealer.seal(payload, reply_to)
    }

    /// Opens a record in place; see [`Opener::open_in_place`].
    pub fn open_in_place<'r>(&mut self, record: &'r mut [u8]) -> Result<Opened<'r>, ChannelError> {
        self.opener.open_in_place(record)
    }

    /// Splits the session into its halves, e.g. for a reader and a writer task.
    pub fn into_split(self) -> (SessionInfo, Sealer, Opener) {
        (self.info, self.sealer, self.opener)
    }
}

/// The sending half of a session.
pub struct Sealer {
    session_id: u64,
    receiver: PeerId,
    next_seq: u64,
    key: DirectionKey,
    records_per_key: u64,
}

impl Sealer {
    /// Seals a record in place. `record` is the whole record buffer: the first
    /// [`RECORD_HEADER_LEN`] bytes are overwritten by the header, the payload sits
    /// after them, and the last [`TAG_LEN`] bytes are overwritten by the tag. Returns
    /// the record's sequence number (to match the response's `reply_to`).
    pub fn seal_in_place(
        &mut self,
        record: &mut [u8],
        reply_to: Option<u64>,
    ) -> Result<u64, ChannelError> {
        let payload_len = record
            .len()
            .checked_sub(RECORD_OVERHEAD)
            .ok_or(ChannelError::BufferTooSmall)?;
        if payload_len > MAX_RECORD_PAYLOAD {
            return Err(ChannelError::PayloadTooLarge(payload_len));
        }
        if reply_to == Some(0) {
            return Err(ChannelError::InvalidReplyTo);
        }
        let seq = self.next_seq;
        if seq == u64::MAX {
            return Err(ChannelError::SequenceExhausted);
        }
        let epoch = seq / self.records_per_key;
        if epoch > self.key.epoch {
            self.key = self.key.ratchet_to(epoch).1;
        }
        let header = RecordHeader::new(self.session_id, seq, reply_to.unwrap_or(0), payload_len);
        let (head, rest) = record.split_at_mut(RECORD_HEADER_LEN);
        head.copy_from_slice(&header.encode());
        let (payload, tag_out) = rest.split_at_mut(payload_len);
        let tag = self
            .key
            .key
            .seal_in_place_separate_tag(nonce(seq), aad(head, &self.receiver), payload)
            .map_err(|_| ChannelError::PayloadTooLarge(payload_len))?;
        tag_out.copy_from_slice(tag.as_ref());
        self.next_seq += 1;
        Ok(seq)
    }

    /// Seals `payload` into a newly allocated record.
    pub fn seal(
        &mut self,
        payload: &[u8],
        reply_to: Option<u64>,
    ) -> Result<(u64, Vec<u8>), ChannelError> {
        let mut record = Vec::with_capacity(payload.len() + RECORD_OVERHEAD);
        record.resize(RECORD_HEADER_LEN, 0);
        record.extend_from_slice(payload);
        record.resize(record.len() + TAG_LEN, 0);
        let seq = self.seal_in_place(&mut record, reply_to)?;
        Ok((seq, record))
    }
}

/// A record that opened: its sequence number, what it answers, and the plaintext
/// (decrypted in place inside the caller's buffer).
#[derive(Debug)]
pub struct Opened<'r> {
    /// The sender's sequence number.
    pub seq: u64,
    /// The request this record answers, if it is a response.
    pub reply_to: Option<u64>,
    /// The plaintext.
    pub payload: &'r mut [u8],
}

impl Opened<'_> {
    /// Checks that this record is the response to request `request_seq`.
    pub fn expect_reply_to(&self, request_seq: u64) -> Result<(), ChannelError> {
        if self.reply_to == Some(request_seq) {
            Ok(())
        } else {
            Err(ChannelError::UnexpectedReply {
                expected: request_seq,
                got: self.reply_to,
            })
        }
    }
}

/// The receiving half of a session.
pub struct Opener {
    session_id: u64,
    receiver: PeerId,
    window: Ordering,
    keys: EpochKeys,
    records_per_key: u64,
}

impl Opener {
    /// Opens a whole record in place and returns its plaintext, a sub-slice of
    /// `record`. Nothing changes unless the record authenticates.
    pub fn open_in_place<'r>(&mut self, record: &'r mut [u8]) -> Result<Opened<'r>, ChannelError> {
        let header = RecordHeader::decode(record)?;
        check_header(&header, record, self.session_id)?;
        // Cheap rejection of replays before any cryptography; `accept` below only
        // records the number once the record has authenticated.
        self.window.check(header.seq)?;
        let found = self.keys.find(header.seq, self.records_per_key)?;
        let payload = open_with(self.keys.get(&found), &header, self.receiver, record)?;
        self.keys.adopt(found);
        self.window.accept(header.seq);
        Ok(Opened {
            seq: header.seq,
            reply_to: (header.reply_to != 0).then_some(header.reply_to),
            payload,
        })
    }
}

/// Checks a record's length and session against its decoded header.
pub(crate) fn check_header(
    header: &RecordHeader,
    record: &[u8],
    session_id: u64,
) -> Result<(), ChannelError> {
    if record.len() != header.record_len() {
        return Err(ChannelError::LengthMismatch {
            expected: header.record_len(),
            got: record.len(),
        });
    }
    if header.session_id != session_id {
        return Err(ChannelError::WrongSession);
    }
    Ok(())
}

/// Decrypts and authenticates `record` in place under `key`.
pub(crate) fn open_with<'r>(
    key: &DirectionKey,
    header: &RecordHeader,
    receiver: PeerId,
    record: &'r mut [u8],
) -> Result<&'r mut [u8], ChannelError> {
    let (head, body) = record.split_at_mut(RECORD_HEADER_LEN);
    key.key
        .open_in_place(nonce(header.seq), aad(head, &receiver), body)
        .map_err(|_| ChannelError::Authentication)
}

/// The keys of one direction a receiver may still need: the current epoch's and, for
/// datagrams (which may arrive late), the one before.
pub(crate) struct EpochKeys {
    current: DirectionKey,
    previous: Option<DirectionKey>,
    keep_previous: bool,
}

/// Where the key of a record's epoch is: found by [`EpochKeys::find`], used by
/// [`EpochKeys::get`], and made current by [`EpochKeys::adopt`] once the record
/// authenticated (so a forged sequence number moves nothing). Short-lived, on the
/// stack, and `Ahead` only at a rekey: not worth a box.
#[allow(clippy::large_enum_variant)]
pub(crate) enum Found {
    Current,
    Previous,
    Ahead {
        before: Option<DirectionKey>,
        at: DirectionKey,
    },
}

impl EpochKeys {
    pub(crate) fn new(key: DirectionKey, keep_previous: bool) -> Self {
        EpochKeys {
            current: key,
            previous: None,
            keep_previous,
        }
    }

    pub(crate) fn find(&self, seq: u64, records_per_key: u64) -> Result<Found, ChannelError> {
        let epoch = seq / records_per_key;
        match epoch.checked_sub(self.current.epoch) {
            Some(0) => Ok(Found::Current),
            Some(ahead) if ahead <= MAX_EPOCHS_AHEAD => {
                let (before, at) = self.current.ratchet_to(epoch);
                Ok(Found::Ahead { before, at })
            }
            Some(_) => Err(ChannelError::TooFarAhead(seq)),
            None => match &self.previous {
                Some(previous) if previous.epoch == epoch => Ok(Found::Previous),
                _ => Err(ChannelError::Replay(seq)),
            },
        }
    }

    pub(crate) fn get<'k>(&'k self, found: &'k Found) -> &'k DirectionKey {
        match found {
            Found::Current => &self.current,
            Found::Previous => self.previous.as_ref().expect("found only if kept"),
            Found::Ahead { at, .. } => at,
        }
    }

    pub(crate) fn adopt(&mut self, found: Found) {
        if let Found::Ahead { before, at } = found {
            let current = core::mem::replace(&mut self.current, at);
            // Streams never look back, so the old key goes (forward secrecy).
            self.previous = self.keep_previous.then(|| before.unwrap_or(current));
        }
    }
}

/// The associated data of a record: its header and the receiver's id.
pub(crate) fn aad(header: &[u8], receiver: &PeerId) -> aead::Aad<[u8; RECORD_HEADER_LEN + 32]> {
    let mut bytes = [0u8; RECORD_HEADER_LEN + 32];
    bytes[..RECORD_HEADER_LEN].copy_from_slice(header);
    bytes[RECORD_HEADER_LEN..].copy_from_slice(&receiver.0);
    aead::Aad::from(bytes)
}

/// Which sequence numbers a receiver may still accept.
#[derive(Clone, Debug)]
enum Ordering {
    /// Exactly `next` is acceptable.
    Stream { next: u64 },
    /// Each number once, within a window.
    Datagram(ReplayWindow),
}

impl Ordering {
    fn new(mode: ChannelMode) -> Self {
        match mode {
            ChannelMode::Stream => Ordering::Stream { next: 1 },
            ChannelMode::Datagram => Ordering::Datagram(ReplayWindow::new()),
        }
    }

    fn check(&self, seq: u64) -> Result<(), ChannelError> {
        match *self {
            Ordering::Stream { next } if seq == next => Ok(()),
            Ordering::Stream { next } if seq < next => Err(ChannelError::Replay(seq)),
            Ordering::Stream { next } => Err(ChannelError::OutOfOrder {
                expected: next,
                got: seq,
            }),
            Ordering::Datagram(ref window) => window.check(seq),
        }
    }

    fn accept(&mut self, seq: u64) {
        match self {
            Ordering::Stream { next } => *next = seq + 1,
            Ordering::Datagram(window) => window.accept(seq),
        }
    }
}

/// The sliding anti-replay window of a datagram receiver: any number above the
/// highest seen, or one within [`REPLAY_WINDOW`] below it that was not seen yet.
/// Public so that a host can keep it outside the session (fixed-size encoding).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReplayWindow {
    highest: u64,
    /// Bit i is `highest - i`. Bit 0 starts set: sequence number 0 is never valid.
    seen: u128,
}

impl Default for ReplayWindow {
    fn default() -> Self {
        Self::new()
    }
}

impl ReplayWindow {
    /// The bytes of [`ReplayWindow::to_bytes`].
    pub const LEN: usize = 24;

    /// A window that has seen nothing yet.
    pub const fn new() -> Self {
        ReplayWindow {
            highest: 0,
            seen: 1,
        }
    }

    /// Refuses a number already seen or too old.
    pub fn check(&self, seq: u64) -> Result<(), ChannelError> {
        if seq > self.highest {
            return Ok(());
        }
        let age = self.highest - seq;
        if age >= REPLAY_WINDOW || self.seen & (1 << age) != 0 {
            Err(ChannelError::Replay(seq))
        } else {
            Ok(())
        }
    }

    /// Records `seq` as seen (after its record authenticated).
    pub fn accept(&mut self, seq: u64) {
        if seq > self.highest {
            let shift = seq - self.highest;
            self.seen = if shift >= REPLAY_WINDOW {
                0
            } else {
                self.seen << shift
            };
            self.seen |= 1;
            self.highest = seq;
        } else {
            self.seen |= 1 << (self.highest - seq);
        }
    }

    /// A fixed-size encoding, for a host's shared store.
    pub fn to_bytes(&self) -> [u8; Self::LEN] {
        let mut out = [0u8; Self::LEN];
        out[..8].copy_from_slice(&self.highest.to_le_bytes());
        out[8..].copy_from_slice(&self.seen.to_le_bytes());
        out
    }

    /// Reads [`ReplayWindow::to_bytes`]; any 24 bytes are a valid window.
    pub fn from_bytes(bytes: &[u8]) -> Result<Self, WireError> {
        let bytes: &[u8; Self::LEN] = bytes.try_into().map_err(|_| WireError::Malformed)?;
        let (highest, seen) = bytes.split_at(8);
        Ok(ReplayWindow {
            highest: u64::from_le_bytes(highest.try_into().expect("8 bytes")),
            seen: u128::from_le_bytes(seen.try_into().expect("16 bytes")),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::identity::MeshName;

    fn pair(config: &HandshakeConfig) -> (Session, Session) {
        let keys = SessionKeys::derive(&[7; 32], &[9; 32]);
        let info = |role, local: u8, peer: u8| SessionInfo {
            session_id: keys.session_id,
            suite: Suite::ChaCha20Poly1305,
            role,
            local_id: PeerId([local; 32]),
            peer_id: PeerId([peer; 32]),
            peer_public_key: [0; 32],
            mesh: MeshName::new("unit").unwrap(),
            carries: Carries::HTTP2,
            options: StreamOptions::NONE,
            peer_endorsement: Vec::new(),
        };
        (
            Session::new(info(Role::Initiator, 1, 2), &keys, config),
            Session::new(info(Role::Responder, 2, 1), &keys, config),
        )
    }

    #[test]
    fn the_last_sequence_number_is_never_used() {
        // One key for the whole sequence space, so jumping ahead needs no ratchet steps.
        let (mut a, mut b) = pair(&HandshakeConfig {
            records_per_key: u64::MAX,
            ..HandshakeConfig::default()
        });
        a.sealer.next_seq = u64::MAX - 1;
        b.opener.window = Ordering::Stream { next: u64::MAX - 1 };
        let (seq, mut record) = a.seal(b"last", None).unwrap();
        assert_eq!(seq, u64::MAX - 1);
        assert_eq!(b.open_in_place(&mut record).unwrap().payload, b"last");
        assert_eq!(
            a.seal(b"one more", None),
            Err(ChannelError::SequenceExhausted)
        );
    }

    #[test]
    fn streams_ratchet_and_forget_the_previous_key() {
        let (mut a, mut b) = pair(&HandshakeConfig {
            records_per_key: 2,
            ..HandshakeConfig::default()
        });
        for _ in 0..3 {
            let (_, mut record) = a.seal(b"x", None).unwrap();
            b.open_in_place(&mut record).unwrap();
        }
        // seq 1 is epoch 0; seqs 2 and 3 are epoch 1.
        assert_eq!((a.sealer.key.epoch, b.opener.keys.current.epoch), (1, 1));
        assert!(b.opener.keys.previous.is_none());
    }

    #[test]
    fn datagrams_catch_up_over_lost_epochs_within_a_bound() {
        let config = HandshakeConfig {
            records_per_key: 2,
            mode: ChannelMode::Datagram,
            ..HandshakeConfig::default()
        };
        let (mut a, mut b) = pair(&config);
        let records: alloc::vec::Vec<_> = (0..20).map(|_| a.seal(b"x", None).unwrap().1).collect();
        // seq 11 is epoch 5: more than MAX_EPOCHS_AHEAD from epoch 0.
        let mut far = records[10].clone();
        assert_eq!(
            b.open_in_place(&mut far).err(),
            Some(ChannelError::TooFarAhead(11))
        );
        // seq 9 is epoch 4, within reach although epochs 1 to 3 were all lost ...
        let mut ahead = records[8].clone();
        assert!(b.open_in_place(&mut ahead).is_ok());
        // ... and a late seq 7 (epoch 3) still opens with the kept previous key.
        let mut late = records[6].clone();
        assert!(b.open_in_place(&mut late).is_ok());
        // Older epochs' keys are gone.
        let mut older = records[4].clone();
        assert_eq!(
            b.open_in_place(&mut older).err(),
            Some(ChannelError::Replay(5))
        );
    }

    /// The receiver's id is bound as associated data: the same keys, but a record
    /// made for another receiver, does not open.
    #[test]
    fn records_are_bound_to_their_receiver() {
        let (mut a, _) = pair(&HandshakeConfig::default());
        let (_, mut b_elsewhere) = pair(&HandshakeConfig::default());
        b_elsewhere.opener.receiver = PeerId([9; 32]);
        let (_, mut record) = a.seal(b"for 2", None).unwrap();
        assert_eq!(
            b_elsewhere.open_in_place(&mut record).err(),
            Some(ChannelError::Authentication)
        );
    }
}
