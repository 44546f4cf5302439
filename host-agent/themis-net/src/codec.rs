//! Message boundaries on a byte stream, as the wire format defines them.

use bytes::BytesMut;
use themis_core::wire;
use tokio_util::codec::Decoder;

use crate::NetError;

/// Splits a stream into whole Themis messages (handshake messages and records), using
/// [`wire::frame_len`]: a record's header says its length, and a handshake message is
/// self-delimiting. Lengths are bounded before anything is buffered for them, so a peer
/// cannot make us reserve more than one maximal record.
#[derive(Debug, Default)]
pub struct FrameCodec;

impl Decoder for FrameCodec {
    type Item = BytesMut;
    type Error = NetError;

    fn decode(&mut self, src: &mut BytesMut) -> Result<Option<BytesMut>, NetError> {
        match wire::frame_len(src)? {
            Some(len) if src.len() >= len => Ok(Some(src.split_to(len))),
            Some(len) => {
                src.reserve(len - src.len());
                Ok(None)
            }
            None => Ok(None),
        }
    }
}
