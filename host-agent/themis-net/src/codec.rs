//! Message boundaries on a byte stream, as the wire format defines them.

use bytes::BytesMut;
use themis_core::wire::{self, MAX_HANDSHAKE_LEN, MAX_RECORD_LEN, RECORD_OVERHEAD};
use themis_core::WireError;
use tokio_util::codec::Decoder;

use crate::NetError;

/// Splits a stream into whole Themis messages (handshake messages and records), using
/// [`wire::frame_len`]: a record's header says its length, and a handshake message is
/// self-delimiting. Lengths are bounded before anything is buffered for them, so a peer
/// cannot make us reserve more than one frame of the current limit: a handshake
/// message ([`MAX_HANDSHAKE_LEN`], 3072 bytes) until the key agreement is done, then a
/// maximal record.
#[derive(Debug, Clone, Copy)]
pub struct FrameCodec {
    max_len: usize,
}

impl Default for FrameCodec {
    /// The codec of an established session: records up to the record limit.
    fn default() -> Self {
        FrameCodec {
            max_len: MAX_RECORD_LEN,
        }
    }
}

impl FrameCodec {
    /// The codec of a connection whose key agreement is not done: any frame longer
    /// than a handshake message ([`MAX_HANDSHAKE_LEN`]) is refused at its header,
    /// whatever kind it claims, before anything is buffered for it.
    pub fn handshake() -> Self {
        FrameCodec {
            max_len: MAX_HANDSHAKE_LEN,
        }
    }

    /// The largest frame this codec accepts.
    pub fn max_len(&self) -> usize {
        self.max_len
    }

    /// Lifts the limit to a maximal record, once the peer is authenticated.
    pub(crate) fn established(&mut self) {
        self.max_len = MAX_RECORD_LEN;
    }

    /// Limits records to `max_payload` bytes of plaintext (at most a maximal record).
    pub(crate) fn limit_payload(&mut self, max_payload: usize) {
        self.max_len = max_payload
            .saturating_add(RECORD_OVERHEAD)
            .min(MAX_RECORD_LEN);
    }
}

impl Decoder for FrameCodec {
    type Item = BytesMut;
    type Error = NetError;

    fn decode(&mut self, src: &mut BytesMut) -> Result<Option<BytesMut>, NetError> {
        match wire::frame_len(src)? {
            Some(len) if len > self.max_len => Err(WireError::TooLarge {
                len,
                max: self.max_len,
            }
            .into()),
            Some(len) if src.len() >= len => Ok(Some(src.split_to(len))),
            Some(len) => {
                src.reserve(len - src.len());
                Ok(None)
            }
            None if src.len() >= self.max_len => Err(WireError::TooLarge {
                len: src.len(),
                max: self.max_len,
            }
            .into()),
            None => Ok(None),
        }
    }
}
