//! The wire format: every message is a `postcard` encoding of a struct that starts
//! with the protocol version and the message kind. Decoding is total (bytes in, a
//! value or a [`WireError`] out) and bounded: a message longer than its kind's limit
//! is refused before it is parsed.
//!
//! Messages are self-delimiting, so the same bytes travel over a stream or in a
//! datagram; [`frame_len`] tells a stream driver how long the next message is.

use alloc::vec::Vec;

use serde::{Deserialize, Serialize};
use serde_big_array::BigArray;

use crate::delegation::Delegation;

/// The protocol version every message carries first.
/// Version 2: message 1 carries `timestamp_ms`. Version 3: messages 1 and 2 may be
/// signed by a delegated key ([`crate::delegation`]) and carry the sender's
/// endorsement and what the stream carries.
pub const PROTOCOL_VERSION: u8 = 3;
/// The longest endorsement a handshake message carries (a mesh record with its grant
/// chain is at most 2 KiB).
pub const MAX_ENDORSEMENT_LEN: usize = 2048;
/// The longest handshake message accepted: an endorsement and about 450 bytes.
pub const MAX_HANDSHAKE_LEN: usize = 3072;
/// The largest record payload: 1 MiB.
pub const MAX_RECORD_PAYLOAD: usize = 1 << 20;
/// The bytes of a record header on the wire.
pub const RECORD_HEADER_LEN: usize = 30;
/// The bytes of an AEAD tag.
pub const TAG_LEN: usize = 16;
/// What a record adds to its payload.
pub const RECORD_OVERHEAD: usize = RECORD_HEADER_LEN + TAG_LEN;
/// The longest record accepted.
pub const MAX_RECORD_LEN: usize = MAX_RECORD_PAYLOAD + RECORD_OVERHEAD;

/// The kind of a message, its second byte.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Kind {
    /// Handshake message 1, initiator to responder.
    Hello = 1,
    /// Handshake message 2, responder to initiator.
    HelloReply = 2,
    /// Handshake message 3: key confirmation, initiator to responder.
    Confirm = 3,
    /// A secure channel record.
    Record = 4,
}

impl Kind {
    fn from_byte(b: u8) -> Option<Kind> {
        Some(match b {
            1 => Kind::Hello,
            2 => Kind::HelloReply,
            3 => Kind::Confirm,
            4 => Kind::Record,
            _ => return None,
        })
    }

    fn max_len(self) -> usize {
        match self {
            Kind::Record => MAX_RECORD_LEN,
            _ => MAX_HANDSHAKE_LEN,
        }
    }
}

/// Why bytes did not decode. The peer is never told which: it only sees a rejection.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum WireError {
    /// The input ends before the message does.
    #[error("the message is truncated")]
    Truncated,
    /// The input is longer than any message of its kind may be.
    #[error("the message is {len} bytes, more than the {max} allowed")]
    TooLarge {
        /// Bytes received.
        len: usize,
        /// The limit for this kind.
        max: usize,
    },
    /// A version this implementation does not speak.
    #[error("unsupported protocol version {0} (this build speaks {PROTOCOL_VERSION})")]
    UnsupportedVersion(u8),
    /// A kind byte that names no message.
    #[error("unknown message kind {0}")]
    UnknownKind(u8),
    /// A valid message, but not the one expected at this point.
    #[error("expected a {expected:?} message, got a {got:?}")]
    UnexpectedKind {
        /// What the state machine waits for.
        expected: Kind,
        /// What arrived.
        got: Kind,
    },
    /// The fields do not decode.
    #[error("the message is malformed")]
    Malformed,
    /// Bytes are left over after the message.
    #[error("{0} unexpected bytes after the message")]
    TrailingBytes(usize),
}

impl From<postcard::Error> for WireError {
    fn from(e: postcard::Error) -> Self {
        match e {
            postcard::Error::DeserializeUnexpectedEnd => WireError::Truncated,
            _ => WireError::Malformed,
        }
    }
}

/// The two bytes every message starts with.
#[derive(Serialize, Deserialize)]
struct Preamble {
    version: u8,
    kind: u8,
}

/// Reads the version and kind of a message without decoding the rest.
pub fn peek_kind(bytes: &[u8]) -> Result<Kind, WireError> {
    let (pre, _) = postcard::take_from_bytes::<Preamble>(bytes)?;
    if pre.version != PROTOCOL_VERSION {
        return Err(WireError::UnsupportedVersion(pre.version));
    }
    let kind = Kind::from_byte(pre.kind).ok_or(WireError::UnknownKind(pre.kind))?;
    if bytes.len() > kind.max_len() {
        return Err(WireError::TooLarge {
            len: bytes.len(),
            max: kind.max_len(),
        });
    }
    Ok(kind)
}

fn expect_kind(bytes: &[u8], expected: Kind) -> Result<(), WireError> {
    match peek_kind(bytes)? {
        got if got == expected => Ok(()),
        got => Err(WireError::UnexpectedKind { expected, got }),
    }
}

/// For a stream driver: the length of the message at the start of `buf`, once enough
/// of it has arrived to tell (`Ok(None)`: read more). An error means the stream is
/// not speaking this protocol and must be closed.
pub fn frame_len(buf: &[u8]) -> Result<Option<usize>, WireError> {
    if buf.len() < 2 {
        return Ok(None);
    }
    let kind = peek_kind(&buf[..2])?;
    let decoded = match kind {
        Kind::Record => {
            if buf.len() < RECORD_HEADER_LEN {
                return Ok(None);
            }
            RecordHeader::decode(&buf[..RECORD_HEADER_LEN]).map(|h| h.record_len())
        }
        // Handshake messages are small and self-delimiting: try to decode them.
        Kind::Hello => take_len::<Hello>(buf),
        Kind::HelloReply => take_len::<HelloReply>(buf),
        Kind::Confirm => take_len::<Confirm>(buf),
    };
    match decoded {
        Ok(len) if len > kind.max_len() => Err(WireError::TooLarge {
            len,
            max: kind.max_len(),
        }),
        Ok(len) => Ok(Some(len)),
        Err(WireError::Truncated) if buf.len() < kind.max_len() => Ok(None),
        Err(WireError::Truncated) => Err(WireError::TooLarge {
            len: buf.len(),
            max: kind.max_len(),
        }),
        Err(e) => Err(e),
    }
}

fn take_len<'a, T: Deserialize<'a>>(buf: &'a [u8]) -> Result<usize, WireError> {
    let (_, rest) = postcard::take_from_bytes::<T>(buf)?;
    Ok(buf.len() - rest.len())
}

/// Decodes exactly one `T` of `kind` from `bytes`, with nothing left over.
fn decode_exact<'a, T: Deserialize<'a>>(bytes: &'a [u8], kind: Kind) -> Result<T, WireError> {
    expect_kind(bytes, kind)?;
    let (value, rest) = postcard::take_from_bytes::<T>(bytes)?;
    if !rest.is_empty() {
        return Err(WireError::TrailingBytes(rest.len()));
    }
    Ok(value)
}

/// An Ed25519 signature.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Signature(#[serde(with = "BigArray")] pub [u8; 64]);

/// Message 1 (paper Fig. 2, A → B): the initiator's signed ephemeral share, nonce,
/// public key, mesh, its own id and the id it means to reach.
#[derive(Clone, Serialize, Deserialize)]
pub struct HelloBody<'a> {
    /// [`PROTOCOL_VERSION`].
    pub version: u8,
    /// [`Kind::Hello`].
    pub kind: u8,
    /// The AEAD suites offered, as a bitmask.
    pub suites: u8,
    /// The initiator's rekey interval: records per traffic key (at least 2).
    pub records_per_key: u64,
    /// The mesh name (net id).
    #[serde(borrow)]
    pub mesh: &'a str,
    /// The initiator's id, `SHA-256(initiator_key || mesh)`.
    pub initiator_id: [u8; 32],
    /// The initiator's Ed25519 public key.
    pub initiator_key: [u8; 32],
    /// The id the initiator means to reach.
    pub responder_id: [u8; 32],
    /// The initiator's X25519 ephemeral public share.
    pub ephemeral: [u8; 32],
    /// The initiator's fresh nonce.
    pub nonce: [u8; 32],
    /// When the initiator sent it, Unix milliseconds: the responder refuses a Hello
    /// outside its freshness window before any public-key work ([`crate::guard`]).
    pub timestamp_ms: u64,
    /// What the sealed stream may carry, as a bitmask ([`crate::params::Carries`]).
    pub carries: u8,
    /// If a delegated key signed the message: the initiator key's delegation to it.
    pub delegation: Option<Delegation>,
    /// The initiator's endorsement (opaque here: its record and grant chain), at
    /// most [`MAX_ENDORSEMENT_LEN`] bytes; empty for none.
    #[serde(borrow)]
    pub endorsement: &'a [u8],
}

/// Message 1 with its signature over the body.
#[derive(Clone, Serialize, Deserialize)]
pub struct Hello<'a> {
    /// The signed fields.
    #[serde(borrow)]
    pub body: HelloBody<'a>,
    /// Ed25519 by `initiator_key` over [`crate::handshake`]'s message-1 digest.
    pub signature: Signature,
}

/// Message 2 (B → A): the responder's signed ephemeral share, nonce and public key,
/// bound to the initiator's id and, through the signature, to all of message 1.
#[derive(Clone, Serialize, Deserialize)]
pub struct HelloReplyBody {
    /// [`PROTOCOL_VERSION`].
    pub version: u8,
    /// [`Kind::HelloReply`].
    pub kind: u8,
    /// The chosen suite's bit.
    pub suite: u8,
    /// The agreed rekey interval: the smaller of both sides' settings.
    pub records_per_key: u64,
    /// The initiator's id, as the responder understood it.
    pub initiator_id: [u8; 32],
    /// The responder's Ed25519 public key.
    pub responder_key: [u8; 32],
    /// The responder's X25519 ephemeral public share.
    pub ephemeral: [u8; 32],
    /// The responder's fresh nonce.
    pub nonce: [u8; 32],
    /// What the stream carries: one bit of the initiator's offer.
    pub carries: u8,
    /// If a delegated key signed the message: the responder key's delegation to it.
    pub delegation: Option<Delegation>,
    /// The responder's endorsement, at most [`MAX_ENDORSEMENT_LEN`]; empty for none.
    pub endorsement: Vec<u8>,
}

/// Message 2 with its signature.
#[derive(Clone, Serialize, Deserialize)]
pub struct HelloReply {
    /// The signed fields.
    pub body: HelloReplyBody,
    /// Ed25519 by `responder_key` over the digest of message 1 and this body.
    pub signature: Signature,
}

/// Message 3 (A → B): key confirmation.
#[derive(Clone, Serialize, Deserialize)]
pub struct Confirm {
    /// [`PROTOCOL_VERSION`].
    pub version: u8,
    /// [`Kind::Confirm`].
    pub kind: u8,
    /// The session id both sides derived.
    #[serde(with = "postcard::fixint::le")]
    pub session_id: u64,
    /// HMAC-SHA256 under the confirmation key over the transcript hash.
    pub mac: [u8; 32],
}

/// The clear header of a secure channel record (paper Fig. 3). The header is
/// authenticated as associated data together with the receiver's id.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RecordHeader {
    /// [`PROTOCOL_VERSION`].
    pub version: u8,
    /// [`Kind::Record`].
    pub kind: u8,
    /// Which session (and so which keys) the record belongs to.
    #[serde(with = "postcard::fixint::le")]
    pub session_id: u64,
    /// The sender's sequence number; the AEAD nonce is made from it.
    #[serde(with = "postcard::fixint::le")]
    pub seq: u64,
    /// The sequence number of the request this record answers, 0 for none.
    #[serde(with = "postcard::fixint::le")]
    pub reply_to: u64,
    /// Payload bytes (the ciphertext is as long, and the tag follows).
    #[serde(with = "postcard::fixint::le")]
    pub len: u32,
}

impl RecordHeader {
    pub(crate) fn new(session_id: u64, seq: u64, reply_to: u64, len: usize) -> Self {
        debug_assert!(len <= MAX_RECORD_PAYLOAD);
        RecordHeader {
            version: PROTOCOL_VERSION,
            kind: Kind::Record as u8,
            session_id,
            seq,
            reply_to,
            len: len as u32,
        }
    }

    /// Decodes a header from the first [`RECORD_HEADER_LEN`] bytes of a record.
    pub fn decode(bytes: &[u8]) -> Result<RecordHeader, WireError> {
        expect_kind(bytes, Kind::Record)?;
        let (header, _) = postcard::take_from_bytes::<RecordHeader>(bytes)?;
        if header.len as usize > MAX_RECORD_PAYLOAD {
            // Saturating: on 32-bit targets (Wasm) a hostile length must not overflow.
            return Err(WireError::TooLarge {
                len: (header.len as usize).saturating_add(RECORD_OVERHEAD),
                max: MAX_RECORD_LEN,
            });
        }
        Ok(header)
    }

    /// Encodes the header into exactly [`RECORD_HEADER_LEN`] bytes.
    pub fn encode(&self) -> [u8; RECORD_HEADER_LEN] {
        let mut out = [0u8; RECORD_HEADER_LEN];
        let used = postcard::to_slice(self, &mut out)
            .expect("fixed-size header fits")
            .len();
        debug_assert_eq!(used, RECORD_HEADER_LEN);
        out
    }

    /// The whole record's length on the wire (saturating, for headers not made by
    /// [`RecordHeader::decode`], which bounds `len`).
    pub fn record_len(&self) -> usize {
        (self.len as usize).saturating_add(RECORD_OVERHEAD)
    }
}

/// A decoded handshake message together with the raw bytes its signature covers.
pub struct Signed<'a, T> {
    /// The decoded message.
    pub message: T,
    /// The encoded body, exactly as received.
    pub body_bytes: &'a [u8],
}

impl<'a> Hello<'a> {
    /// Decodes message 1.
    pub fn decode(bytes: &'a [u8]) -> Result<Signed<'a, Hello<'a>>, WireError> {
        let message: Hello<'a> = decode_exact(bytes, Kind::Hello)?;
        Ok(Signed {
            message,
            body_bytes: &bytes[..bytes.len() - 64],
        })
    }
}

impl HelloReply {
    /// Decodes message 2.
    pub fn decode(bytes: &[u8]) -> Result<Signed<'_, HelloReply>, WireError> {
        let message: HelloReply = decode_exact(bytes, Kind::HelloReply)?;
        Ok(Signed {
            message,
            body_bytes: &bytes[..bytes.len() - 64],
        })
    }
}

impl Confirm {
    /// Decodes message 3.
    pub fn decode(bytes: &[u8]) -> Result<Confirm, WireError> {
        decode_exact(bytes, Kind::Confirm)
    }
}

/// Encodes a handshake message body (postcard) into a fresh buffer.
pub(crate) fn encode<T: Serialize>(value: &T) -> alloc::vec::Vec<u8> {
    postcard::to_allocvec(value).expect("encoding into a Vec cannot fail")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn record_header_has_its_fixed_length() {
        let h = RecordHeader::new(u64::MAX, u64::MAX, u64::MAX, MAX_RECORD_PAYLOAD);
        assert_eq!(h.encode().len(), RECORD_HEADER_LEN);
        assert_eq!(RecordHeader::decode(&h.encode()), Ok(h));
    }

    #[test]
    fn peek_rejects_unknown_versions_and_kinds() {
        assert_eq!(peek_kind(&[1, 1]), Err(WireError::UnsupportedVersion(1)));
        assert_eq!(peek_kind(&[2, 1]), Err(WireError::UnsupportedVersion(2)));
        assert_eq!(peek_kind(&[4, 1]), Err(WireError::UnsupportedVersion(4)));
        assert_eq!(peek_kind(&[3, 9]), Err(WireError::UnknownKind(9)));
        assert_eq!(peek_kind(&[1]), Err(WireError::Truncated));
        assert_eq!(peek_kind(&[]), Err(WireError::Truncated));
    }
}
