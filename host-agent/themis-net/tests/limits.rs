//! What an unauthenticated peer can make a server hold, on real sockets on 127.0.0.0/8:
//! connection caps (in all and per source address), the handshake deadline, the
//! pre-handshake frame limit and the idle timeout, each counted by reason.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use bytes::BytesMut;
use themis_core::wire::{Kind, RecordHeader, MAX_RECORD_PAYLOAD};
use themis_core::{SessionInfo, PROTOCOL_VERSION};
use themis_net::{connect, source_of, Answer, Config, Limits, NetError, NetStats, Standing};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};

/// How long a test waits for something that must happen (not a speed requirement).
const PATIENCE: Duration = Duration::from_secs(20);

mod common;

use common::{hello, identity, Server};

async fn start(config: Config, limits: Limits) -> Server {
    let echo = |_: Arc<SessionInfo>, request: BytesMut| async move {
        let mut answer = b"echo: ".to_vec();
        answer.extend_from_slice(&request);
        answer
    };
    Server::start(config, limits, echo).await
}

/// Waits until the server closes `stream` (or refuses what it sends); panics with
/// `what` if it stays open.
async fn assert_closed(stream: &mut themis_net::SecureStream, what: &str) {
    match tokio::time::timeout(PATIENCE, stream.recv()).await {
        Ok(Ok(None) | Err(_)) => {}
        other => panic!("{what}: {other:?}"),
    }
}

/// A connection to `to` from the loopback address `127.0.0.<last>`.
/// Sends `hello` from 127.0.0.`last` and reads the first answer: its length (message
/// 2), or 0 for a close with nothing. Then the caller goes away.
async fn hello_answer_len(last: u8, to: SocketAddr, hello: &[u8]) -> usize {
    let mut tcp = connect_from(last, to).await.unwrap();
    tcp.write_all(hello).await.unwrap();
    let mut reply = [0u8; 1024];
    tokio::time::timeout(PATIENCE, tcp.read(&mut reply))
        .await
        .expect("message 2 or a close in time")
        .unwrap_or(0)
}

async fn connect_from(last: u8, to: SocketAddr) -> std::io::Result<TcpStream> {
    let socket = TcpSocket::new_v4()?;
    socket.bind(SocketAddr::new(
        IpAddr::V4(Ipv4Addr::new(127, 0, 0, last)),
        0,
    ))?;
    socket.connect(to).await
}

/// Waits until the server closes `tcp`; returns the bytes it sent first (none
/// expected). Panics if it stays open for [`PATIENCE`].
async fn closed(tcp: &mut TcpStream, what: &str) -> Vec<u8> {
    let mut got = Vec::new();
    let read = tokio::time::timeout(PATIENCE, async {
        let mut buf = [0u8; 1024];
        loop {
            match tcp.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => got.extend_from_slice(&buf[..n]),
            }
        }
    })
    .await;
    assert!(read.is_ok(), "{what}: the server kept the connection open");
    got
}

/// Waits until `stats.limits()[reason]` reaches `at_least`; returns it.
async fn limited(stats: &NetStats, reason: &str, at_least: u64) -> u64 {
    let wait = async {
        loop {
            let n = stats.limits().get(reason).copied().unwrap_or(0);
            if n >= at_least {
                return n;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    match tokio::time::timeout(PATIENCE, wait).await {
        Ok(n) => n,
        Err(_) => panic!("{reason}: {:?}, expected {at_least}", stats.limits()),
    }
}

#[tokio::test]
async fn a_silent_connection_is_closed_at_the_handshake_deadline() {
    let server = start(
        Config {
            handshake_timeout: Duration::from_millis(300),
            ..Config::default()
        },
        Limits::default(),
    )
    .await;
    let mut silent = TcpStream::connect(server.addr).await.unwrap();
    assert!(closed(&mut silent, "a silent connection").await.is_empty());
    assert_eq!(limited(&server.stats, "handshake_timeout", 1).await, 1);
    assert_eq!(server.stats.failures().get("timeout"), Some(&1));
    assert_eq!(server.stats.handshakes(), 0);
}

#[tokio::test]
async fn a_frame_header_announcing_a_mebibyte_before_the_handshake_is_refused_at_once() {
    // A handshake deadline far beyond the test's patience: only the frame limit can
    // close this connection.
    let server = start(
        Config {
            handshake_timeout: Duration::from_secs(600),
            ..Config::default()
        },
        Limits::default(),
    )
    .await;
    let header = RecordHeader {
        version: PROTOCOL_VERSION,
        kind: Kind::Record as u8,
        session_id: 1,
        seq: 0,
        reply_to: 0,
        len: u32::try_from(MAX_RECORD_PAYLOAD).unwrap(),
    };
    let mut tcp = TcpStream::connect(server.addr).await.unwrap();
    tcp.write_all(&header.encode()).await.unwrap();
    assert!(closed(&mut tcp, "a 1 MiB record header").await.is_empty());
    assert_eq!(
        limited(&server.stats, "oversize_before_handshake", 1).await,
        1
    );

    // A handshake-sized frame still gets through the codec (and is refused by the
    // handshake as a record where a Hello must come), and real peers still connect.
    let me = identity();
    let mut stream = connect(&me, server.addr, server.identity.id(), &Config::default())
        .await
        .unwrap();
    assert_eq!(&stream.request(b"hi").await.unwrap()[..], b"echo: hi");
    assert_eq!(
        server.stats.limits().get("oversize_before_handshake"),
        Some(&1)
    );
}

#[tokio::test]
async fn a_connection_flood_is_capped_per_source_and_in_all_and_real_peers_still_get_through() {
    let limits = Limits {
        max_connections: 16,
        max_per_source: 4,
        ..Limits::default()
    };
    let server = start(Config::default(), limits).await;

    // An authenticated peer connected before the flood.
    let me = identity();
    let mut before = connect(&me, server.addr, server.identity.id(), &Config::default())
        .await
        .unwrap();
    assert_eq!(&before.request(b"1").await.unwrap()[..], b"echo: 1");

    // One source opens 40 connections that say nothing: 4 are held, 36 refused.
    let mut one_source = Vec::new();
    for _ in 0..40 {
        one_source.push(connect_from(2, server.addr).await.unwrap());
    }
    assert_eq!(limited(&server.stats, "over_source_cap", 36).await, 36);
    assert!(server.stats.connections() <= 16);

    // Eight more sources, 4 each: 36 connections for 16 places. The total cap holds,
    // by closing the oldest connections still in their handshake.
    let mut many_sources = Vec::new();
    for last in 3..11 {
        for _ in 0..4 {
            many_sources.push(connect_from(last, server.addr).await.unwrap());
        }
    }
    let evicted = limited(&server.stats, "evicted_before_handshake", 1).await;
    assert!(
        server.stats.connections() <= 16,
        "{}",
        server.stats.connections()
    );

    // The established session still works, and a new peer still gets in.
    assert_eq!(&before.request(b"2").await.unwrap()[..], b"echo: 2");
    let other = identity();
    let mut during = connect(
        &other,
        server.addr,
        server.identity.id(),
        &Config::default(),
    )
    .await
    .unwrap();
    assert_eq!(&during.request(b"3").await.unwrap()[..], b"echo: 3");
    assert!(server.stats.limits()["evicted_before_handshake"] > evicted);
    assert_eq!(server.stats.handshakes(), 2);
    assert!(server.stats.connections() <= 16);

    // Refused and evicted connections were closed without a byte.
    for (i, tcp) in one_source.iter_mut().enumerate().skip(4) {
        assert!(closed(tcp, &format!("refused connection {i}"))
            .await
            .is_empty());
    }
    assert!(closed(&mut many_sources[0], "the oldest flood connection")
        .await
        .is_empty());

    // Once the flood is gone, its places are free again.
    drop((one_source, many_sources));
    let wait = async {
        while server.stats.connections() > 2 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    tokio::time::timeout(PATIENCE, wait).await.unwrap();
}

#[tokio::test]
async fn an_authenticated_connection_that_goes_silent_is_closed_after_the_idle_timeout() {
    let limits = Limits {
        idle_timeout: Duration::from_millis(300),
        ..Limits::default()
    };
    let server = start(Config::default(), limits).await;
    let me = identity();
    let mut stream = connect(&me, server.addr, server.identity.id(), &Config::default())
        .await
        .unwrap();
    assert_eq!(&stream.request(b"x").await.unwrap()[..], b"echo: x");
    let ended = tokio::time::timeout(PATIENCE, stream.recv()).await;
    match ended {
        Ok(Ok(None) | Err(NetError::Closed | NetError::Io(_))) => {}
        other => panic!("the idle connection was not closed: {other:?}"),
    }
    assert_eq!(limited(&server.stats, "idle_timeout", 1).await, 1);
}

/// The listener keeps one Hello guard for all its connections: a Hello captured from
/// one connection and sent again on another, from the same address or another, is
/// refused at message 1 (closed with no message 2), before any public-key work. With
/// a guard per connection, each replay got a fresh message 2.
#[tokio::test]
async fn a_replayed_hello_to_the_agent_port_is_refused_at_message_1() {
    let server = start(Config::default(), Limits::default()).await;
    let caller = identity();
    let hello = hello(&caller, server.identity.id());
    // The genuine connection is answered with message 2; then the caller goes away.
    let n = hello_answer_len(41, server.addr, &hello).await;
    assert!(n > 0, "the genuine Hello was not answered");
    for last in [41, 42] {
        let mut replay = connect_from(last, server.addr).await.unwrap();
        replay.write_all(&hello).await.unwrap();
        let answer = closed(&mut replay, "a replayed Hello").await;
        assert!(
            answer.is_empty(),
            "127.0.0.{last}: the replayed Hello got {} bytes (a message 2)",
            answer.len()
        );
    }
    // Counted as refused handshakes (the genuine one ends as `closed`).
    let refused = async {
        while server
            .stats
            .failures()
            .get("handshake")
            .copied()
            .unwrap_or(0)
            < 2
        {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    assert!(
        tokio::time::timeout(PATIENCE, refused).await.is_ok(),
        "failures: {:?}",
        server.stats.failures()
    );
    assert_eq!(server.stats.handshakes(), 0, "no handshake completed");
}

/// A server whose handler admits a peer only for the request `admit me` (standing in
/// for the agent's admission check); other requests prove nothing.
async fn start_admitting(config: Config, limits: Limits) -> Server {
    let admitting = |_: Arc<SessionInfo>, request: BytesMut| async move {
        let standing = match &request[..] {
            b"admit me" => Standing::Admitted,
            b"refuse me" => Standing::Refused,
            _ => Standing::Unproven,
        };
        Answer {
            payload: b"ok".to_vec(),
            standing,
        }
    };
    Server::start(config, limits, admitting).await
}

/// Authenticated is not admitted: connections that finished their handshake with
/// keys of their own but never proved admission are evicted, oldest first, to make
/// room, exactly like connections in their handshake; admitted ones are not.
#[tokio::test]
async fn authenticated_connections_that_are_not_admitted_are_evicted_to_make_room() {
    let limits = Limits {
        max_connections: 4,
        ..Limits::default()
    };
    let server = start_admitting(Config::default(), limits).await;
    let id = server.identity.id();
    let mut admitted = connect(&identity(), server.addr, id, &Config::default())
        .await
        .unwrap();
    assert_eq!(&admitted.request(b"admit me").await.unwrap()[..], b"ok");
    let mut squatters = Vec::new();
    for _ in 0..3 {
        squatters.push(
            connect(&identity(), server.addr, id, &Config::default())
                .await
                .unwrap(),
        );
    }
    // At the cap: a newcomer evicts the oldest squatter, and is admitted itself.
    let mut newcomer = connect(&identity(), server.addr, id, &Config::default())
        .await
        .unwrap();
    assert_eq!(&newcomer.request(b"admit me").await.unwrap()[..], b"ok");
    assert_eq!(limited(&server.stats, "evicted_unadmitted", 1).await, 1);
    assert_closed(&mut squatters[0], "the oldest squatter was not closed").await;
    // The admitted connections are untouched.
    assert_eq!(&admitted.request(b"1").await.unwrap()[..], b"ok");
    assert_eq!(&newcomer.request(b"2").await.unwrap()[..], b"ok");
    assert_eq!(server.stats.open_connections(), 2);
}

/// One admitted peer cannot hold the port: past `max_per_peer` admitted connections
/// of one id (from any sources), the next is closed once admitted, and counted; the
/// peer's first ones and other peers are unaffected. Before, an admitted node with
/// enough source addresses could hold every slot, and no other peer got in.
#[tokio::test]
async fn one_admitted_peer_holds_at_most_its_share() {
    let limits = Limits {
        max_per_peer: 2,
        ..Limits::default()
    };
    let server = start_admitting(Config::default(), limits).await;
    let id = server.identity.id();
    let rogue = identity();
    let mut held = Vec::new();
    for _ in 0..2 {
        let mut c = connect(&rogue, server.addr, id, &Config::default())
            .await
            .unwrap();
        assert_eq!(&c.request(b"admit me").await.unwrap()[..], b"ok");
        held.push(c);
    }
    let mut third = connect(&rogue, server.addr, id, &Config::default())
        .await
        .unwrap();
    // Answered, then closed: admitted, but over the peer's share.
    let _ = third.request(b"admit me").await;
    assert_closed(
        &mut third,
        "a third admitted connection of one peer stayed open",
    )
    .await;
    assert_eq!(limited(&server.stats, "over_peer_cap", 1).await, 1);
    for c in &mut held {
        assert_eq!(&c.request(b"still here").await.unwrap()[..], b"ok");
    }
    let mut other = connect(&identity(), server.addr, id, &Config::default())
        .await
        .unwrap();
    assert_eq!(&other.request(b"admit me").await.unwrap()[..], b"ok");
    assert_eq!(server.stats.open_connections(), 3);
}

/// Before admission a request that proves nothing is answered and the connection
/// closed; after admission such a request is answered and the connection stays; a
/// request answered `Refused` closes even an admitted connection.
#[tokio::test]
async fn a_request_that_does_not_prove_admission_closes_the_connection() {
    let server = start_admitting(Config::default(), Limits::default()).await;
    let id = server.identity.id();
    let mut unproven = connect(&identity(), server.addr, id, &Config::default())
        .await
        .unwrap();
    assert_eq!(&unproven.request(b"hi").await.unwrap()[..], b"ok");
    assert_closed(&mut unproven, "an unproven connection stayed open").await;
    assert_eq!(limited(&server.stats, "unadmitted", 1).await, 1);

    let mut admitted = connect(&identity(), server.addr, id, &Config::default())
        .await
        .unwrap();
    assert_eq!(&admitted.request(b"admit me").await.unwrap()[..], b"ok");
    assert_eq!(&admitted.request(b"hi").await.unwrap()[..], b"ok");
    assert_eq!(&admitted.request(b"refuse me").await.unwrap()[..], b"ok");
    assert_closed(&mut admitted, "a refused peer's connection stayed open").await;
    assert_eq!(limited(&server.stats, "unadmitted", 2).await, 2);
}

/// A connection that completes its handshake and then says nothing is closed at the
/// admission deadline, counted.
#[tokio::test]
async fn a_connection_that_never_proves_admission_is_closed_at_the_deadline() {
    let limits = Limits {
        admission_timeout: Duration::from_millis(300),
        ..Limits::default()
    };
    let server = start_admitting(Config::default(), limits).await;
    let mut silent = connect(
        &identity(),
        server.addr,
        server.identity.id(),
        &Config::default(),
    )
    .await
    .unwrap();
    assert_closed(&mut silent, "the silent connection stayed open").await;
    assert_eq!(limited(&server.stats, "admission_timeout", 1).await, 1);
}

/// Fresh Hellos from one source beyond its bucket are closed with no message 2,
/// before any public-key work (`over_source_rate`); those within it are answered.
#[tokio::test]
async fn fresh_hellos_beyond_the_source_bucket_are_refused_before_any_work() {
    let limits = Limits {
        hellos_per_source: themis_core::Rate {
            per_second: 1,
            burst: 3,
        },
        ..Limits::default()
    };
    let server = start(Config::default(), limits).await;
    let mut answered = 0;
    for _ in 0..10 {
        let caller = identity();
        let hello = hello(&caller, server.identity.id());
        answered += usize::from(hello_answer_len(43, server.addr, &hello).await > 0);
    }
    // The burst, and at most a token or two refilled meanwhile.
    assert!((3..=5).contains(&answered), "{answered} of 10 answered");
    assert_eq!(
        limited(&server.stats, "over_source_rate", 1).await,
        10 - answered as u64
    );
}

#[test]
fn an_ipv6_source_is_its_64_and_an_ipv4_source_its_address() {
    use std::net::Ipv6Addr;
    let a: Ipv6Addr = "2001:db8:1:2:aaaa::1".parse().unwrap();
    let b: Ipv6Addr = "2001:db8:1:2:ffff:ffff:ffff:ffff".parse().unwrap();
    let other: Ipv6Addr = "2001:db8:1:3::1".parse().unwrap();
    assert_eq!(source_of(IpAddr::V6(a)), source_of(IpAddr::V6(b)));
    assert_eq!(
        source_of(IpAddr::V6(a)),
        IpAddr::V6("2001:db8:1:2::".parse().unwrap())
    );
    assert_ne!(source_of(IpAddr::V6(a)), source_of(IpAddr::V6(other)));
    let v4 = IpAddr::V4(Ipv4Addr::new(127, 0, 0, 9));
    assert_eq!(source_of(v4), v4);
    let mapped = IpAddr::V6(Ipv4Addr::new(127, 0, 0, 9).to_ipv6_mapped());
    assert_eq!(source_of(mapped), v4);
    assert_ne!(
        source_of(IpAddr::V4(Ipv4Addr::new(127, 0, 0, 10))),
        source_of(v4)
    );
}

/// The listener's handshake budget: a flood of fresh Hellos from new sources takes the
/// open share and is then closed with no message 2 (`handshake_budget`), while a
/// source admitted recently still completes new handshakes from the reserved share.
#[tokio::test]
async fn a_hello_flood_spends_the_open_budget_and_admitted_sources_keep_the_reserve() {
    let limits = Limits {
        handshake_budget: themis_core::BudgetConfig {
            rate: themis_core::Rate {
                per_second: 1,
                burst: 4,
            },
            known_good_percent: 50,
            ..themis_core::BudgetConfig::default()
        },
        ..Limits::default()
    };
    let server = start_admitting(Config::default(), limits).await;
    let id = server.identity.id();
    let member = identity();
    let mut first = connect(&member, server.addr, id, &Config::default())
        .await
        .unwrap();
    assert_eq!(&first.request(b"admit me").await.unwrap()[..], b"ok");
    drop(first);

    // Ten fresh Hellos from ten new sources: the open share (2, then one every 2 s)
    // answers a few, the rest are closed unanswered.
    let mut answered = 0;
    for last in 60..70 {
        let hello = hello(&identity(), id);
        answered += usize::from(hello_answer_len(last, server.addr, &hello).await > 0);
    }
    assert!(answered < 10, "all ten answered");
    assert!(limited(&server.stats, "handshake_budget", 1).await >= 1);

    // The member, admitted a moment ago from 127.0.0.1, still gets in.
    let mut again = connect(&member, server.addr, id, &Config::default())
        .await
        .expect("the reserved share answers a recently admitted source");
    assert_eq!(&again.request(b"admit me").await.unwrap()[..], b"ok");
}
