//! An authenticated, encrypted TCP connection.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use bytes::BytesMut;
use futures_util::StreamExt;
use ring::rand::SystemRandom;
use themis_core::handshake::{self, Initiator};
use themis_core::wire::{MAX_HANDSHAKE_LEN, RECORD_HEADER_LEN, RECORD_OVERHEAD};
use themis_core::{HelloGuard, Identity, Opener, Peek, PeerId, Sealer, SessionInfo};
use tokio::io::AsyncWriteExt;
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::TcpStream;
use tokio_util::codec::FramedRead;

use crate::{codec::FrameCodec, Config, NetError};

type Frames = FramedRead<OwnedReadHalf, FrameCodec>;

/// A connection whose peer is authenticated and whose records are sealed.
pub struct SecureStream {
    info: SessionInfo,
    reader: SecureReader,
    writer: SecureWriter,
}

/// The receiving half of a [`SecureStream`].
pub struct SecureReader {
    frames: Frames,
    opener: Opener,
}

/// The sending half of a [`SecureStream`].
pub struct SecureWriter {
    io: OwnedWriteHalf,
    sealer: Sealer,
    /// Reused for every record: sealing is in place, so sending allocates nothing
    /// once the buffer has grown to the largest payload.
    buf: Vec<u8>,
}

/// A record that was received and opened.
#[derive(Debug)]
pub struct Received {
    /// The sender's sequence number (what a response's `reply_to` names).
    pub seq: u64,
    /// The request this record answers, if it is a response.
    pub reply_to: Option<u64>,
    /// The plaintext.
    pub payload: BytesMut,
}

/// Frames of a connection whose key agreement is not done: the buffer starts at one
/// handshake message and the codec refuses anything longer, so an unauthenticated
/// peer makes us hold at most about a kilobyte.
fn handshake_frames(read: OwnedReadHalf) -> Frames {
    FramedRead::with_capacity(read, FrameCodec::handshake(), MAX_HANDSHAKE_LEN)
}

/// The wall clock, Unix milliseconds (handshake freshness, the handshake budgets).
pub(crate) fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

async fn next_frame(frames: &mut Frames) -> Result<BytesMut, NetError> {
    frames.next().await.unwrap_or(Err(NetError::Closed))
}

/// Connects to `addr`, expecting the peer with id `peer`, and runs the key agreement
/// as the initiator. Fails if the peer there is not `peer`.
pub async fn connect(
    me: &Identity,
    addr: SocketAddr,
    peer: PeerId,
    config: &Config,
) -> Result<SecureStream, NetError> {
    let handshake = async {
        let tcp = TcpStream::connect(addr).await?;
        tcp.set_nodelay(true)?;
        let (read, mut write) = tcp.into_split();
        let mut frames = handshake_frames(read);
        let (waiting, hello) =
            Initiator::start(me, peer, &config.handshake, now_ms(), &SystemRandom::new())?;
        write.write_all(&hello).await?;
        let reply = next_frame(&mut frames).await?;
        let (session, confirm) = waiting.read_hello_reply(&reply)?;
        write.write_all(&confirm).await?;
        Ok(SecureStream::new(session, frames, write))
    };
    tokio::time::timeout(config.handshake_timeout, handshake)
        .await
        .map_err(|_| NetError::Timeout("in the handshake"))?
}

/// Runs the key agreement as the responder on an accepted connection.
///
/// `guard` is the listener's: one [`HelloGuard`] shared by every connection it
/// accepts ([`crate::serve_with`] keeps one per listener), so a Hello seen on one
/// connection is refused on the next (`Replayed`) before any public-key work, and a
/// Hello outside the freshness window (`Stale`) too. The guard is locked only for
/// those cheap checks and for remembering the Hello afterwards, never across the
/// public-key work (see [`accept_charged`]).
pub async fn accept(
    me: &Arc<Identity>,
    tcp: TcpStream,
    config: &Config,
    guard: &Mutex<HelloGuard>,
) -> Result<SecureStream, NetError> {
    accept_charged(me, tcp, config, guard, || Ok(())).await
}

/// [`accept`], calling `charge` for a Hello that passes every cheap check (it would
/// cost a full answer) before any public-key work; an error from `charge` refuses
/// the connection with no message 2.
///
/// The public-key work (checking message 1's signature, making the ephemeral key,
/// signing message 2) runs on the blocking pool, off the async workers and off the
/// guard's lock: a flood of Hellos neither stalls the other tasks of the process nor
/// serialises every handshake of the listener behind one lock. The Hello is then
/// claimed in the guard ([`HelloGuard::claim`]): of two copies racing on two
/// connections, one is answered.
pub(crate) async fn accept_charged(
    me: &Arc<Identity>,
    tcp: TcpStream,
    config: &Config,
    guard: &Mutex<HelloGuard>,
    charge: impl FnOnce() -> Result<(), NetError>,
) -> Result<SecureStream, NetError> {
    let handshake = async {
        tcp.set_nodelay(true)?;
        let (read, mut write) = tcp.into_split();
        let mut frames = handshake_frames(read);
        let hello = next_frame(&mut frames).await?;
        let (pending, reply) = respond_off_lock(me, hello, config, guard, charge).await?;
        write.write_all(&reply).await?;
        let confirm = next_frame(&mut frames).await?;
        let session = pending.read_confirm(&confirm)?;
        Ok(SecureStream::new(session, frames, write))
    };
    tokio::time::timeout(config.handshake_timeout, handshake)
        .await
        .map_err(|_| NetError::Timeout("in the handshake"))?
}

async fn respond_off_lock(
    me: &Arc<Identity>,
    hello: BytesMut,
    config: &Config,
    guard: &Mutex<HelloGuard>,
    charge: impl FnOnce() -> Result<(), NetError>,
) -> Result<(handshake::AwaitingConfirm, Vec<u8>), NetError> {
    let lock = || {
        guard
            .lock()
            .expect("never poisoned: the core does not panic")
    };
    let window_ms = {
        let mut guard = lock();
        if guard.peek(&hello, me.public(), now_ms()) != Peek::Fresh {
            // Refused before any public-key work (stale, replayed, not for us,
            // malformed): cheap enough to run under the lock, with the right error.
            return Ok(handshake::respond(
                me,
                &hello,
                &config.handshake,
                &mut guard,
                now_ms(),
                &SystemRandom::new(),
            )?);
        }
        guard.window_ms()
    };
    charge()?;
    let (me_, config_) = (me.clone(), config.handshake.clone());
    let hello_ = hello.clone();
    let answered = tokio::task::spawn_blocking(move || {
        // The window alone: the shared guard remembers the Hello below.
        let mut window_only = HelloGuard::new(window_ms, 0);
        handshake::respond(
            &me_,
            &hello_,
            &config_,
            &mut window_only,
            now_ms(),
            &SystemRandom::new(),
        )
    })
    .await
    .map_err(|_| std::io::Error::other("the handshake's blocking task did not finish"))??;
    match lock().claim(&hello, now_ms()) {
        true => Ok(answered),
        false => Err(themis_core::HandshakeError::Replayed.into()),
    }
}

impl SecureStream {
    fn new(session: themis_core::Session, mut frames: Frames, io: OwnedWriteHalf) -> Self {
        // Authenticated: records up to the record limit from now on.
        frames.decoder_mut().established();
        let (info, sealer, opener) = session.into_split();
        SecureStream {
            info,
            reader: SecureReader { frames, opener },
            writer: SecureWriter {
                io,
                sealer,
                buf: Vec::new(),
            },
        }
    }

    /// The authenticated peer and the session's parameters.
    pub fn info(&self) -> &SessionInfo {
        &self.info
    }

    /// Sends one record; see [`SecureWriter::send`].
    pub async fn send(&mut self, payload: &[u8], reply_to: Option<u64>) -> Result<u64, NetError> {
        self.writer.send(payload, reply_to).await
    }

    /// Receives one record; see [`SecureReader::recv`].
    pub async fn recv(&mut self) -> Result<Option<Received>, NetError> {
        self.reader.recv().await
    }

    /// Sends a request and waits for its response (nothing else may be in flight).
    pub async fn request(&mut self, payload: &[u8]) -> Result<BytesMut, NetError> {
        let seq = self.send(payload, None).await?;
        let response = self.recv().await?.ok_or(NetError::Closed)?;
        if response.reply_to != Some(seq) {
            return Err(themis_core::ChannelError::UnexpectedReply {
                expected: seq,
                got: response.reply_to,
            }
            .into());
        }
        Ok(response.payload)
    }

    /// Splits the stream for a reader task and a writer.
    pub fn into_split(self) -> (SessionInfo, SecureReader, SecureWriter) {
        (self.info, self.reader, self.writer)
    }
}

impl SecureReader {
    /// Limits the records this reader takes to `max_payload` bytes of plaintext
    /// (at most the record limit); a longer one is refused at its header.
    pub fn limit_payload(&mut self, max_payload: usize) {
        self.frames.decoder_mut().limit_payload(max_payload);
    }

    /// Lifts the limit back to a maximal record.
    pub fn unlimit_payload(&mut self) {
        self.frames.decoder_mut().established();
    }

    /// The next record, opened; `None` when the peer closed the connection cleanly
    /// between records. Any refused record is an error after which the connection is
    /// unusable (on a stream, a missing or altered record cannot be skipped).
    pub async fn recv(&mut self) -> Result<Option<Received>, NetError> {
        let Some(frame) = self.frames.next().await else {
            return Ok(None);
        };
        let mut frame = frame?;
        let opened = self.opener.open_in_place(&mut frame).map_err(|e| match e {
            themis_core::ChannelError::Wire(themis_core::WireError::UnexpectedKind { .. }) => {
                NetError::UnexpectedHandshake
            }
            e => e.into(),
        })?;
        let (seq, reply_to, len) = (opened.seq, opened.reply_to, opened.payload.len());
        // The plaintext sits after the header in the same buffer: hand it out uncopied.
        let mut payload = frame.split_off(RECORD_HEADER_LEN);
        payload.truncate(len);
        Ok(Some(Received {
            seq,
            reply_to,
            payload,
        }))
    }
}

impl SecureWriter {
    /// Seals `payload` (answering record `reply_to`, if it is a response) and writes it.
    /// Returns the record's sequence number.
    pub async fn send(&mut self, payload: &[u8], reply_to: Option<u64>) -> Result<u64, NetError> {
        self.send_then(payload, reply_to, |_| {}).await
    }

    /// Like [`SecureWriter::send`], calling `sealed` with the sequence number before the
    /// record is written, so that a caller can expect the response before it can arrive.
    pub async fn send_then(
        &mut self,
        payload: &[u8],
        reply_to: Option<u64>,
        sealed: impl FnOnce(u64),
    ) -> Result<u64, NetError> {
        self.buf.clear();
        self.buf.resize(RECORD_HEADER_LEN, 0);
        self.buf.extend_from_slice(payload);
        self.buf.resize(payload.len() + RECORD_OVERHEAD, 0);
        let seq = self.sealer.seal_in_place(&mut self.buf, reply_to)?;
        sealed(seq);
        self.io.write_all(&self.buf).await?;
        Ok(seq)
    }
}
