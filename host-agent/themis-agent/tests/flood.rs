//! Floods do not starve real traffic (issue 13, the agent side), on real agents on
//! 127.0.0.0/8: connection floods on the agent port are capped and counted while a
//! second agent still joins and resolves through it; connections that never finish a
//! handshake are closed and counted; a flood of distinct names cannot evict a name in
//! use from the resolution cache; fresh resolutions over their budget are answered
//! from the cache or refused with 429.

use themis_testkit::agent as common;

use std::collections::VecDeque;
use std::io::{Read, Write};
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::{first_rate_limited, free_port, resolve_listener_get, sample, workdir, Metered};
use serde_json::Value;
use themis_core::wire::{Kind, RecordHeader, MAX_RECORD_PAYLOAD};
use themis_core::PROTOCOL_VERSION;
use themis_testkit::process::wait_until_or;

const LIMITED: &str = "themis_connections_limited_total";
const CONNECTIONS: &str = "themis_connections";

/// A metered agent with `FAST` timers whose flags in `set` get new values, then `more`.
fn spawn(root: &std::path::Path, name: &str, set: &[(&str, &str)], more: &[&str]) -> Metered {
    Metered::spawn_setting(root, name, None, set, more)
}

fn agent_limited(a: &Metered, reason: &str) -> u64 {
    a.value(LIMITED, &[("listener", "agent"), ("reason", reason)])
}

/// Polls until `check` holds, for at most 30 s (patience, not a speed requirement).
fn eventually(a: &Metered, what: &str, mut check: impl FnMut(&Metered) -> bool) {
    wait_until_or(
        what,
        Duration::from_secs(30),
        || check(a).then_some(()),
        || format!("metrics:\n{}", a.scrape()),
    );
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap()
}

#[test]
fn a_connection_flood_is_capped_and_counted_while_another_agent_joins_and_resolves() {
    let dir = workdir();
    let a = spawn(
        dir.path(),
        "a",
        &[],
        &[
            "--max-inbound-connections",
            "64",
            "--max-inbound-per-ip",
            "16",
        ],
    );
    let target = a.listen();

    // Twenty sources (127.0.0.2..21) keep opening connections that say nothing, one
    // a round each (after a first burst of 30 from one source), holding the newest
    // 800, until the test is done (bounded rounds).
    let rt = runtime();
    let stop = Arc::new(AtomicBool::new(false));
    let flood = rt.spawn({
        let stop = stop.clone();
        async move {
            let mut held = VecDeque::new();
            let mut opened = 0u64;
            for round in 0..3000 {
                if stop.load(Ordering::Relaxed) {
                    break;
                }
                // The first round starts with a burst of 30 from one source.
                let burst = if round == 0 { 30 } else { 0 };
                for last in std::iter::repeat_n(2u8, burst).chain(2..22u8) {
                    let socket = tokio::net::TcpSocket::new_v4().unwrap();
                    let from = SocketAddr::new(IpAddr::V4(Ipv4Addr::new(127, 0, 0, last)), 0);
                    socket.bind(from).unwrap();
                    if let Ok(tcp) = socket.connect(target).await {
                        held.push_back(tcp);
                        opened += 1;
                    }
                }
                while held.len() > 800 {
                    held.pop_front();
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            opened
        }
    });
    eventually(&a, "the flood met both caps", |a| {
        agent_limited(a, "over_source_cap") > 0 && agent_limited(a, "evicted_before_handshake") > 0
    });

    // During the flood, a second agent joins through the first, registers, and the
    // first resolves it.
    let _b = a
        .agent
        .a_newcomer_joins_registers_and_is_resolved(dir.path());
    let text = a.scrape();
    let held = sample(&text, CONNECTIONS, &[("listener", "agent")]);
    assert!(held <= 64, "{held} connections held over a cap of 64");
    assert!(
        !flood.is_finished(),
        "the flood stopped before the join was done"
    );

    stop.store(true, Ordering::Relaxed);
    let opened = rt.block_on(flood).unwrap();
    assert!(opened > 64, "the flood opened only {opened} connections");
    let refused = agent_limited(&a, "over_source_cap")
        + agent_limited(&a, "evicted_before_handshake")
        + agent_limited(&a, "over_total_cap");
    assert!(refused > 0);
}

/// Waits until the agent closes `s`, having sent nothing.
fn closed_unanswered(s: &mut TcpStream, what: &str) {
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let mut buf = [0u8; 64];
    match s.read(&mut buf) {
        Ok(0) => {}
        Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => {}
        other => panic!("{what}: not closed unanswered: {other:?}"),
    }
}

#[test]
fn silent_and_oversize_connections_are_closed_before_the_handshake_and_counted() {
    let dir = workdir();
    let a = spawn(dir.path(), "a", &[], &["--handshake-timeout-ms", "300"]);

    let mut silent = TcpStream::connect(a.listen()).unwrap();
    closed_unanswered(&mut silent, "a silent connection");
    eventually(&a, "the silent connection counted", |a| {
        agent_limited(a, "handshake_timeout") >= 1
    });

    // 30 bytes announcing a 1 MiB record, where a Hello must come: closed at the
    // header (before the deadline could matter, it is counted as oversize).
    let header = RecordHeader {
        version: PROTOCOL_VERSION,
        kind: Kind::Record as u8,
        session_id: 1,
        seq: 0,
        reply_to: 0,
        len: u32::try_from(MAX_RECORD_PAYLOAD).unwrap(),
    };
    let mut oversize = TcpStream::connect(a.listen()).unwrap();
    oversize.write_all(&header.encode()).unwrap();
    closed_unanswered(&mut oversize, "a 1 MiB record header");
    eventually(&a, "the oversize header counted", |a| {
        agent_limited(a, "oversize_before_handshake") == 1
    });
}

#[test]
fn a_name_in_use_stays_cached_through_a_flood_of_names_and_fresh_lookups_are_budgeted() {
    let dir = workdir();
    let resolve = SocketAddr::from(([127, 0, 0, 1], free_port()));
    let resolve_arg = resolve.to_string();
    let a = spawn(
        dir.path(),
        "a",
        &[("--resolve-cache-ms", "600000")],
        &[
            "--resolve-listen",
            &resolve_arg,
            "--resolve-fresh-per-sec",
            "1",
            "--resolve-fresh-burst",
            "3",
            // This test is about the cache: the budget of lookups missing it is
            // admission.rs's.
            "--resolve-lookups-per-sec",
            "100000",
            "--resolve-lookups-burst",
            "100000",
        ],
    );

    // The TCP listener serves resolution, status and revocations only: not the log
    // (every leaf with its proof, megabytes) nor its copy (up to 512 MiB), each for
    // a 74-byte request; those stay on the node's own socket.
    let (status, _, answer) = resolve_listener_get(resolve, "/v1/status");
    assert_eq!(status, 200, "{answer}");
    for path in ["/v1/log", "/v1/log/copy"] {
        let (status, _, _) = resolve_listener_get(resolve, path);
        assert_eq!(status, 404, "{path} on the TCP resolve listener");
    }
    // Revocations by page only: even a plain call is the first page, never the whole
    // list (thousands of revocations with their proofs).
    for path in ["/v1/revocations", "/v1/revocations?known=0&wait_ms=0"] {
        let (status, _, page) = resolve_listener_get(resolve, path);
        assert_eq!(status, 200, "{path}: {page}");
        assert_eq!(page["from"], 0, "{path}: not a page: {page}");
        assert!(
            page["total"].is_u64() && page["list"].is_u64(),
            "{path}: {page}"
        );
    }

    // `check` is in use: resolved now and again every 100 other names.
    let (status, _, first) = resolve_listener_get(resolve, "/v1/services/check");
    assert_eq!(
        (status, &first["cached"]),
        (200, &Value::Bool(false)),
        "{first}"
    );
    for i in 0..2000 {
        let (status, _, answer) = resolve_listener_get(resolve, &format!("/v1/services/flood-{i}"));
        assert_eq!(status, 200, "{answer}");
        if i % 100 == 99 {
            let (_, _, check) = resolve_listener_get(resolve, "/v1/services/check");
            assert_eq!(check["cached"], true, "check evicted after {} names", i + 1);
        }
    }
    let (_, _, check) = resolve_listener_get(resolve, "/v1/services/check");
    assert_eq!(check["cached"], true, "{check}");
    // The cache (1024 services) made room one service at a time.
    let evictions = a.value("themis_resolve_cache_evictions_total", &[]);
    assert!(evictions >= 2001 - 1024, "{evictions} evictions");

    // Fresh lookups beyond the budget (burst 3, then 1 a second): a cached service is
    // answered from the cache...
    let mut served_cached = false;
    for _ in 0..50 {
        let (status, _, answer) = resolve_listener_get(resolve, "/v1/services/check?fresh=true");
        assert_eq!(status, 200, "{answer}");
        if answer["cached"] == true {
            served_cached = true;
            break;
        }
    }
    assert!(
        served_cached,
        "fresh lookups of a cached service never hit the budget"
    );
    // ...and one never cached is refused with 429 rate_limited and Retry-After.
    let refused = first_rate_limited(
        resolve,
        (0..50).map(|i| format!("/v1/services/fresh-{i}?fresh=true")),
    );
    let (head, answer) = refused.expect("fresh lookups were never refused");
    assert_eq!(answer["reason"], "rate_limited", "{answer}");
    assert!(answer["error"].is_string(), "{answer}");
    assert!(head.contains("\r\nretry-after: "), "{head}");
    let limited = |outcome| {
        a.value(
            "themis_resolve_fresh_limited_total",
            &[("outcome", outcome)],
        )
    };
    assert!(limited("served_cached") >= 1);
    assert!(limited("refused") >= 1);
}
