//! **Benchmark only, never in the agent:** the overlay's transport without the secure
//! channel, to measure what security costs. It keeps the shape of `themis_net` (one
//! pooled TCP connection per peer carrying concurrent requests, responses matched by
//! request number, one write per message) and drops the key agreement and the
//! sealing: the peer's id is whatever the first frame claims.
//!
//! Mesh trust stays on: the frames are the overlay's own (`Frame::Dht`, built by the
//! node's driver with its admission), carried unchanged, and the server side answers
//! them with [`Overlay::handle_frame`] as the agent does, which checks the sender's
//! admission against the claimed id (once per peer, then cached) and runs every stored
//! value through the trust policy. Only the channel's authentication and sealing are
//! gone, so with security off a peer could claim an admitted node's id: acceptable
//! here only because the benchmark is alone on 127.0.0.1.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use bytes::{Buf, BufMut, Bytes, BytesMut};
use futures_util::future::BoxFuture;
use futures_util::{SinkExt, StreamExt};
use themis_agent::overlay::{Overlay, Transport};
use themis_core::PeerId;
use themis_net::NetError;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::oneshot;
use tokio_util::codec::{FramedRead, FramedWrite, LengthDelimitedCodec};

type Writer = FramedWrite<tokio::net::tcp::OwnedWriteHalf, LengthDelimitedCodec>;

/// Answers plaintext requests with `overlay` until the listener fails.
pub async fn serve(listener: TcpListener, overlay: Overlay) {
    while let Ok((tcp, _)) = listener.accept().await {
        let overlay = overlay.clone();
        tokio::spawn(async move {
            tcp.set_nodelay(true).ok();
            let (read, write) = tcp.into_split();
            let mut frames = FramedRead::new(read, LengthDelimitedCodec::new());
            let writer = Arc::new(tokio::sync::Mutex::new(FramedWrite::new(
                write,
                LengthDelimitedCodec::new(),
            )));
            let Some(Ok(hello)) = frames.next().await else {
                return;
            };
            let Ok(peer) = <[u8; 32]>::try_from(&hello[..]) else {
                return;
            };
            while let Some(Ok(mut frame)) = frames.next().await {
                if frame.len() < 8 {
                    return;
                }
                let number = frame.get_u64();
                let (overlay, writer) = (overlay.clone(), writer.clone());
                tokio::spawn(async move {
                    let answer = overlay.handle_frame(PeerId(peer), &frame).await.payload;
                    let mut out = BytesMut::with_capacity(8 + answer.len());
                    out.put_u64(number);
                    out.extend_from_slice(&answer);
                    let _ = writer.lock().await.send(out.freeze()).await;
                });
            }
        });
    }
}

struct Connection {
    writer: tokio::sync::Mutex<Writer>,
    pending: Arc<Mutex<HashMap<u64, oneshot::Sender<BytesMut>>>>,
    next: AtomicU64,
}

/// The client side: one connection per peer, opened on first use.
#[derive(Clone)]
pub struct PlainClient(Arc<Pool>);

struct Pool {
    me: PeerId,
    pool: tokio::sync::Mutex<HashMap<PeerId, Arc<Connection>>>,
}

impl PlainClient {
    /// A client claiming to be `me`.
    pub fn new(me: PeerId) -> Self {
        PlainClient(Arc::new(Pool {
            me,
            pool: Default::default(),
        }))
    }
}

impl Pool {
    async fn connection(
        &self,
        peer: PeerId,
        addr: SocketAddr,
    ) -> Result<Arc<Connection>, NetError> {
        let mut pool = self.pool.lock().await;
        if let Some(c) = pool.get(&peer) {
            return Ok(c.clone());
        }
        let tcp = TcpStream::connect(addr).await?;
        tcp.set_nodelay(true)?;
        let (read, write) = tcp.into_split();
        let mut writer = FramedWrite::new(write, LengthDelimitedCodec::new());
        writer.send(Bytes::copy_from_slice(&self.me.0)).await?;
        let pending: Arc<Mutex<HashMap<u64, oneshot::Sender<BytesMut>>>> = Default::default();
        let waiting = pending.clone();
        tokio::spawn(async move {
            let mut frames = FramedRead::new(read, LengthDelimitedCodec::new());
            while let Some(Ok(mut frame)) = frames.next().await {
                if frame.len() < 8 {
                    break;
                }
                let number = frame.get_u64();
                if let Some(tx) = waiting.lock().unwrap().remove(&number) {
                    let _ = tx.send(frame);
                }
            }
            waiting.lock().unwrap().clear();
        });
        let connection = Arc::new(Connection {
            writer: tokio::sync::Mutex::new(writer),
            pending,
            next: AtomicU64::new(1),
        });
        pool.insert(peer, connection.clone());
        Ok(connection)
    }
}

impl Transport for PlainClient {
    fn request(
        &self,
        peer: PeerId,
        addr: SocketAddr,
        frame: Vec<u8>,
    ) -> BoxFuture<'static, Result<BytesMut, NetError>> {
        let client = self.0.clone();
        Box::pin(async move {
            let connection = client.connection(peer, addr).await?;
            let number = connection.next.fetch_add(1, Ordering::Relaxed);
            let (tx, rx) = oneshot::channel();
            connection.pending.lock().unwrap().insert(number, tx);
            let mut out = BytesMut::with_capacity(8 + frame.len());
            out.put_u64(number);
            out.extend_from_slice(&frame);
            connection.writer.lock().await.send(out.freeze()).await?;
            rx.await.map_err(|_| NetError::Closed)
        })
    }
}
