//! The agent port's attacker: a party with a key of its own, valid in the mesh but
//! admitted by nobody, talking Themis from the source address of its choice. The
//! admission tests and the admission-flood benchmark make the same moves with it.

use std::net::{IpAddr, SocketAddr};

use ring::rand::SystemRandom;
use themis_agent::overlay::Frame;
use themis_core::handshake::Initiator;
use themis_core::{wire, AwaitingHelloReply, HandshakeConfig, Identity, MeshName, PeerId, Session};
use themis_dht::message::{Message, Request};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// A key pair anyone can make: a valid id in `mesh`, no admission.
pub fn self_made_key(mesh: &str) -> Identity {
    Identity::generate(MeshName::new(mesh).unwrap(), &SystemRandom::new()).unwrap()
}

/// A TCP connection from `from` (any port) to `to`.
pub async fn tcp_from(from: IpAddr, to: SocketAddr) -> std::io::Result<TcpStream> {
    let socket = match from {
        IpAddr::V4(_) => TcpSocket::new_v4()?,
        IpAddr::V6(_) => TcpSocket::new_v6()?,
    };
    socket.bind(SocketAddr::new(from, 0))?;
    socket.connect(to).await
}

/// Reads one whole Themis message (handshake message or record); `None` if the
/// connection closes first.
pub async fn read_message(tcp: &mut TcpStream) -> Option<Vec<u8>> {
    let mut buf = Vec::new();
    loop {
        if let Ok(Some(len)) = wire::frame_len(&buf) {
            if buf.len() >= len {
                return Some(buf[..len].to_vec());
            }
        }
        let mut chunk = [0u8; 4096];
        match tcp.read(&mut chunk).await {
            Ok(0) | Err(_) => return None,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    }
}

/// A connection from `from` to the agent `peer` at `to` on which a Hello with a
/// self-made key was sent, and the handshake state that reads its answer.
async fn send_hello(
    mesh: &str,
    from: IpAddr,
    to: SocketAddr,
    peer: PeerId,
) -> Option<(TcpStream, AwaitingHelloReply)> {
    let me = self_made_key(mesh);
    let (waiting, hello) = Initiator::start(
        &me,
        peer,
        &HandshakeConfig::default(),
        now_ms(),
        &SystemRandom::new(),
    )
    .ok()?;
    let mut tcp = tcp_from(from, to).await.ok()?;
    tcp.write_all(&hello).await.ok()?;
    Some((tcp, waiting))
}

/// A Hello with a self-made key from `from` to the agent `peer` at `to`: the open
/// connection and whether it was answered with message 2.
pub async fn hello_from(
    mesh: &str,
    from: IpAddr,
    to: SocketAddr,
    peer: PeerId,
) -> Option<(TcpStream, bool)> {
    let (mut tcp, _) = send_hello(mesh, from, to, peer).await?;
    let answered = read_message(&mut tcp).await.is_some();
    Some((tcp, answered))
}

/// A flood of `count` fresh, validly signed Hellos to the printable id `peer` at
/// `to`, each from a new self-made key (every key pair is a valid id), sent from the
/// loopback sources 127.0.0.40, .41, … (`sources` of them) in turn; each connection
/// goes away after its Hello. For the sidecars' handshake budget.
pub fn flood_fresh_hellos(peer: &str, to: SocketAddr, sources: u64, count: u64) {
    let (mesh, peer) = PeerId::parse(peer).unwrap();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .build()
        .unwrap();
    runtime.block_on(async {
        for n in 0..count {
            let from: IpAddr = format!("127.0.0.{}", 40 + n % sources).parse().unwrap();
            let (_tcp, _) = send_hello(mesh.as_str(), from, to, peer).await.unwrap();
        }
    });
}

/// A complete key agreement with a self-made key from `from`: authenticated, not
/// admitted. `None` if the agent refused or closed it.
pub async fn handshake_from(
    mesh: &str,
    from: IpAddr,
    to: SocketAddr,
    peer: PeerId,
) -> Option<(TcpStream, Session)> {
    let (mut tcp, waiting) = send_hello(mesh, from, to, peer).await?;
    let reply = read_message(&mut tcp).await?;
    let (session, confirm) = waiting.read_hello_reply(&reply).ok()?;
    tcp.write_all(&confirm).await.ok()?;
    Some((tcp, session))
}

/// A well-formed DHT request whose admission credential is no credential.
pub fn unadmitted_frame() -> Vec<u8> {
    postcard::to_allocvec(&Frame::Dht {
        listen: "127.0.0.1:9".parse().unwrap(),
        admission: vec![0x5a; 64],
        message: Message::Request {
            id: 1,
            body: Request::Ping,
        },
    })
    .unwrap()
}
