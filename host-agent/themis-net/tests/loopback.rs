//! Real TCP on 127.0.0.1: servers, clients, and hostile peers speaking raw bytes.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::BytesMut;
use ring::rand::SystemRandom;
use themis_core::{Identity, PeerId, SessionInfo};
use themis_net::{connect, Client, ClientConfig, Config, Limits, NetError};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

mod common;

use common::{identity, Server};

/// A server answering "<peer id> asked: <request>", after a delay the request may
/// name ("sleep N ms"), so that concurrent responses come back out of order.
async fn start_server() -> Server {
    let handler = |peer: Arc<SessionInfo>, request: BytesMut| async move {
        let text = String::from_utf8_lossy(&request).into_owned();
        if let Some(ms) = text
            .strip_prefix("sleep ")
            .and_then(|t| t.split(' ').next()?.parse().ok())
        {
            tokio::time::sleep(Duration::from_millis(ms)).await;
        }
        format!("{} asked: {text}", peer.peer_id).into_bytes()
    };
    Server::start(Config::default(), Limits::default(), handler).await
}

#[tokio::test]
async fn a_request_reaches_the_authenticated_server_and_back() {
    let server = start_server().await;
    let me = identity();
    let mut stream = connect(&me, server.addr, server.identity.id(), &Config::default())
        .await
        .unwrap();
    assert_eq!(stream.info().peer_id, server.identity.id());
    let response = stream.request(b"hello").await.unwrap();
    assert_eq!(
        &response[..],
        format!("{} asked: hello", me.id()).as_bytes()
    );
    assert_eq!((server.stats.handshakes(), server.stats.requests()), (1, 1));
}

#[tokio::test]
async fn concurrent_requests_share_one_connection_and_match_out_of_order() {
    let server = start_server().await;
    let me = identity();
    let client = Client::new(me.clone(), ClientConfig::default());
    let (client, server, me) = (&client, &server, &me);
    let requests = (0..40u64).map(|i| {
        async move {
            // Later requests sleep less, so their responses overtake earlier ones.
            let request = format!("sleep {} ms, request {i}", (40 - i) * 2);
            let response = client
                .request(server.identity.id(), server.addr, request.as_bytes())
                .await
                .unwrap();
            assert_eq!(
                String::from_utf8(response.to_vec()).unwrap(),
                format!("{} asked: {request}", me.id())
            );
        }
    });
    futures_util::future::join_all(requests).await;
    assert_eq!(client.connections().await, 1);
    assert_eq!(
        (server.stats.handshakes(), server.stats.requests()),
        (1, 40)
    );
}

#[tokio::test]
async fn a_server_that_is_not_the_expected_id_is_refused() {
    let server = start_server().await;
    let someone_else = identity().id();
    let result = connect(&identity(), server.addr, someone_else, &Config::default()).await;
    // The server sees a hello for another id and hangs up; the client learns nothing else.
    assert!(
        matches!(result, Err(NetError::Closed)),
        "{:?}",
        result.err()
    );
    assert_eq!(server.stats.failures().get("not_for_me"), Some(&1));
}

/// Sends raw bytes to the server and reads until it closes the connection.
async fn raw_exchange(addr: SocketAddr, bytes: &[u8]) {
    let mut tcp = TcpStream::connect(addr).await.unwrap();
    tcp.write_all(bytes).await.unwrap();
    // Closing with our bytes unread resets the connection: that is a close too.
    let _ = read_until_closed(&mut tcp).await;
}

#[tokio::test]
async fn hostile_bytes_are_refused_counted_and_the_server_keeps_serving() {
    let server = start_server().await;
    // Not Themis at all.
    raw_exchange(server.addr, b"GET / HTTP/1.1\r\nhost: x\r\n\r\n").await;
    // A record header claiming 4 GiB before any handshake: refused before buffering.
    let mut huge = vec![1u8, 4];
    huge.extend([0; 24]);
    huge.extend(u32::MAX.to_le_bytes());
    raw_exchange(server.addr, &huge).await;
    // A hello from an unknown version.
    raw_exchange(server.addr, &[9, 1, 0, 0]).await;
    let failures = server.stats.failures();
    assert_eq!(failures.get("malformed"), Some(&3), "{failures:?}");
    // A genuine client still gets through.
    let mut stream = connect(
        &identity(),
        server.addr,
        server.identity.id(),
        &Config::default(),
    )
    .await
    .unwrap();
    assert!(stream.request(b"still there?").await.is_ok());
}

/// A session with `server` made by hand on a raw socket, so that the test can send
/// whatever bytes it likes inside it.
async fn raw_session(server: &Server, me: &Identity) -> (TcpStream, themis_core::Session, Vec<u8>) {
    let mut tcp = TcpStream::connect(server.addr).await.unwrap();
    let config = themis_core::HandshakeConfig::default();
    let (waiting, hello) = themis_core::handshake::Initiator::start(
        me,
        server.identity.id(),
        &config,
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis() as u64,
        &SystemRandom::new(),
    )
    .unwrap();
    tcp.write_all(&hello).await.unwrap();
    let mut buf = vec![0u8; 512];
    let mut got = 0;
    let reply_len = loop {
        got += tcp.read(&mut buf[got..]).await.unwrap();
        if let Some(n) = themis_core::wire::frame_len(&buf[..got]).unwrap() {
            break n;
        }
    };
    let (session, confirm) = waiting.read_hello_reply(&buf[..reply_len]).unwrap();
    tcp.write_all(&confirm).await.unwrap();
    (tcp, session, hello)
}

/// Reads until the server closes the connection (it must, within 10 s), and returns
/// what it sent.
async fn read_until_closed(tcp: &mut TcpStream) -> std::io::Result<Vec<u8>> {
    let mut sink = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), tcp.read_to_end(&mut sink))
        .await
        .expect("the server kept the connection open")?;
    Ok(sink)
}

#[tokio::test]
async fn a_handshake_message_inside_a_session_ends_it() {
    let server = start_server().await;
    let (mut tcp, _, hello) = raw_session(&server, &identity()).await;
    tcp.write_all(&hello).await.unwrap();
    assert!(read_until_closed(&mut tcp).await.unwrap().is_empty());
    assert_eq!(
        server.stats.failures().get("unexpected_handshake"),
        Some(&1)
    );
}

#[tokio::test]
async fn a_tampered_record_ends_the_connection_and_is_counted() {
    let server = start_server().await;
    let (mut tcp, mut session, _) = raw_session(&server, &identity()).await;
    let (_, mut record) = session.seal(b"transfer 10 coins", None).unwrap();
    let last = record.len() - 1;
    record[last] ^= 1;
    tcp.write_all(&record).await.unwrap();
    assert!(
        read_until_closed(&mut tcp).await.unwrap().is_empty(),
        "the tampered request got a response"
    );
    assert_eq!(server.stats.failures().get("authentication"), Some(&1));
    assert_eq!(server.stats.requests(), 0);
}

#[tokio::test]
async fn a_replayed_record_ends_the_connection_after_one_answer() {
    let server = start_server().await;
    let (mut tcp, mut session, _) = raw_session(&server, &identity()).await;
    let (_, record) = session.seal(b"once", None).unwrap();
    tcp.write_all(&record).await.unwrap();
    tcp.write_all(&record).await.unwrap();
    let answered = read_until_closed(&mut tcp).await.unwrap();
    let mut response = answered.clone();
    let opened = session.open_in_place(&mut response).unwrap();
    assert!(opened.payload.ends_with(b"asked: once"));
    assert_eq!(server.stats.failures().get("replay"), Some(&1));
    assert_eq!(server.stats.requests(), 1);
}

#[tokio::test]
async fn the_pool_is_bounded_and_idle_connections_close() {
    let servers = [
        start_server().await,
        start_server().await,
        start_server().await,
    ];
    let bounded = Client::new(
        identity(),
        ClientConfig {
            max_connections: 2,
            ..ClientConfig::default()
        },
    );
    for server in servers.iter().chain(&servers) {
        bounded
            .request(server.identity.id(), server.addr, b"x")
            .await
            .unwrap();
    }
    assert_eq!(bounded.connections().await, 2);
    // With no idle time allowed, each request finds the others' connections expired.
    let eager = Client::new(
        identity(),
        ClientConfig {
            idle_timeout: Duration::ZERO,
            ..ClientConfig::default()
        },
    );
    for server in &servers {
        eager
            .request(server.identity.id(), server.addr, b"x")
            .await
            .unwrap();
    }
    assert_eq!(eager.connections().await, 1);
}

#[tokio::test]
async fn nobody_listening_is_an_io_error() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    drop(listener);
    let result = connect(&identity(), addr, PeerId([0; 32]), &Config::default()).await;
    assert!(matches!(result, Err(NetError::Io(_))), "{:?}", result.err());
}
