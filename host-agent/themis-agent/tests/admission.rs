//! The agent port that any key can fill (issue 21, items 1–3), as attacks on real
//! agents: a handshake with a self-made key authenticates a peer but does not admit
//! it. Connections from many sources with self-made keys must not hold the slots an
//! admitted agent needs; a connection that has not proved its admission may not send
//! large frames and is closed by the first frame refused for its admission; one IPv6
//! /64 is one source; a Hello flood from one source is cut to its bucket while the
//! agent's Unix API keeps answering; lookups of ever-new names are budgeted.

use themis_testkit::agent as common;

use std::collections::VecDeque;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{
    first_rate_limited, free_port, metered, sample, scrape, workdir, Agent, Metered, Spawn, MESH,
};
use serde_json::Value;
use themis_core::wire::{Kind, RecordHeader, MAX_RECORD_PAYLOAD};
use themis_core::PROTOCOL_VERSION;
use themis_testkit::process::{poll_until, wait_until_or};
use themis_testkit::{intruder, require};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const LIMITED: &str = "themis_connections_limited_total";

fn agent_limited(text: &str, reason: &str) -> u64 {
    sample(text, LIMITED, &[("listener", "agent"), ("reason", reason)])
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap()
}

/// Waits (30 s at most) until the agent closes `tcp`; `false` if it stays open.
async fn closed(tcp: &mut TcpStream) -> bool {
    let wait = async {
        let mut buf = [0u8; 4096];
        loop {
            match tcp.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
        }
    };
    tokio::time::timeout(Duration::from_secs(30), wait)
        .await
        .is_ok()
}

/// Polls the metrics until `check` holds, for at most 30 s (patience, not a speed
/// requirement).
fn eventually(a: &Metered, what: &str, mut check: impl FnMut(&str) -> bool) {
    let mut text = String::new();
    let held = poll_until(Duration::from_secs(30), || {
        text = a.scrape();
        check(&text).then_some(())
    });
    assert!(held.is_some(), "{what}; metrics:\n{text}");
}

/// Item 1: twenty sources complete handshakes with self-made keys, four a second
/// each, half of them then sending a frame with no valid admission, half
/// saying nothing, and hold every connection. Before the fix they were authenticated,
/// hence never evicted, and their refused frames left them open: they held all 64
/// slots and the legitimate agent was refused (`over_total_cap`). Now they are
/// evictable until admitted, and a refused frame closes them: an admitted agent joins,
/// registers and is resolved during the flood.
#[test]
fn self_made_keys_from_many_sources_cannot_hold_the_slots_an_admitted_agent_needs() {
    let dir = workdir();
    let a = Metered::spawn(
        dir.path(),
        "a",
        None,
        &[
            "--max-inbound-connections",
            "64",
            "--max-inbound-per-ip",
            "16",
        ],
    );
    let (target, peer) = (a.listen(), a.peer_id());
    let rt = runtime();
    let stop = Arc::new(AtomicBool::new(false));
    let authenticated = Arc::new(AtomicU64::new(0));
    let mut flood = Vec::new();
    for last in 2..22u8 {
        let (stop, authenticated) = (stop.clone(), authenticated.clone());
        flood.push(rt.spawn(async move {
            let from = IpAddr::V4(Ipv4Addr::new(127, 0, 0, last));
            let mut held = VecDeque::new();
            for _ in 0..400 {
                if stop.load(Ordering::Relaxed) {
                    break;
                }
                if let Some((mut tcp, mut session)) =
                    intruder::handshake_from(MESH, from, target, peer).await
                {
                    authenticated.fetch_add(1, Ordering::Relaxed);
                    if last % 2 == 0 {
                        let (_, record) =
                            session.seal(&intruder::unadmitted_frame(), None).unwrap();
                        let _ = tcp.write_all(&record).await;
                    }
                    held.push_back(tcp);
                    while held.len() > 16 {
                        held.pop_front();
                    }
                }
                // 80 handshakes a second in all: within the listener's open budget,
                // so that this test is about the slots, not the budget.
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
        }));
    }
    // The flood holds what it can before the legitimate agent comes: every one of
    // the agent's 64 slots, after more handshakes than there are slots. Patience, not
    // a rate: at the flood's 80 handshakes a second this takes a second or two; 60 s
    // is for a busy host.
    wait_until_or(
        "the flood to hold all 64 of the agent's slots",
        Duration::from_secs(60),
        || {
            let held = a.value("themis_connections", &[("listener", "agent")]);
            (authenticated.load(Ordering::Relaxed) > 64 && held >= 64).then_some(())
        },
        || format!("metrics:\n{}", a.scrape()),
    );

    let _b = a
        .agent
        .a_newcomer_joins_registers_and_is_resolved(dir.path());
    assert!(
        flood.iter().all(|f| !f.is_finished()),
        "the flood stopped before the join was done"
    );
    stop.store(true, Ordering::Relaxed);
    for f in flood {
        rt.block_on(f).unwrap();
    }
    let text = a.scrape();
    assert!(agent_limited(&text, "unadmitted") > 0, "{text}");
    assert!(
        agent_limited(&text, "evicted_unadmitted") + agent_limited(&text, "admission_timeout") > 0,
        "{text}"
    );
}

/// Item 1: after its handshake, a peer with a self-made key announces a 1 MiB record:
/// refused at the header (before, it could send 1 MiB frames once authenticated). A
/// frame refused for its admission is answered and the connection closed (before, it
/// stayed open for the next one).
#[test]
fn a_peer_that_is_not_admitted_can_send_neither_a_large_frame_nor_a_second_frame() {
    let dir = workdir();
    // A long admission deadline: only the frame limit and the refusal may close these.
    let a = Metered::spawn(dir.path(), "a", None, &[]);
    let (target, peer) = (a.listen(), a.peer_id());
    let rt = runtime();
    let local = IpAddr::V4(Ipv4Addr::LOCALHOST);

    let (mut big, session) = rt
        .block_on(intruder::handshake_from(MESH, local, target, peer))
        .expect("a self-made key completes the handshake");
    let header = RecordHeader {
        version: PROTOCOL_VERSION,
        kind: Kind::Record as u8,
        session_id: session.info().session_id,
        seq: 0,
        reply_to: 0,
        len: u32::try_from(MAX_RECORD_PAYLOAD).unwrap(),
    };
    rt.block_on(big.write_all(&header.encode())).unwrap();
    assert!(
        rt.block_on(closed(&mut big)),
        "a 1 MiB record header from a peer that is not admitted kept the connection open"
    );
    eventually(&a, "the oversize frame counted", |text| {
        agent_limited(text, "oversize_unadmitted") == 1
    });

    let (mut refused, mut session) = rt
        .block_on(intruder::handshake_from(MESH, local, target, peer))
        .expect("a self-made key completes the handshake");
    let (_, record) = session.seal(&intruder::unadmitted_frame(), None).unwrap();
    rt.block_on(refused.write_all(&record)).unwrap();
    let answer = rt.block_on(intruder::read_message(&mut refused));
    assert!(answer.is_some(), "the refused frame was not answered");
    assert!(
        rt.block_on(closed(&mut refused)),
        "a frame refused for its admission left the connection open"
    );
    eventually(&a, "the refused frame counted", |text| {
        agent_limited(text, "unadmitted") == 1
    });
}

/// Item 1: forty addresses of one IPv6 /64 (one host can hold all of it) open
/// connections to an agent capped at 4 per source: 4 are held, 36 refused. Before,
/// each address counted as a source of its own. In a network namespace made here.
#[test]
fn one_ipv6_64_with_many_addresses_is_capped_as_one_source() {
    if !require::root("creates a network namespace with a /64 on its loopback") {
        return;
    }
    let addresses: Vec<String> = (1..=41).map(|i| format!("fd00:64::{i:x}/64")).collect();
    let ns = themis_testkit::netns::Alone::create("v6src", &addresses);
    let dir = workdir();
    let (args, metrics) = metered(&["--max-inbound-per-ip", "4"]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let listen = SocketAddr::new(IpAddr::V6("fd00:64::1".parse().unwrap()), 7400);
    let listen_arg = listen.to_string();
    let _a = Agent::spawn(
        dir.path(),
        "a",
        Spawn {
            listen: &listen_arg,
            extra: &args,
            netns: Some(&ns.name),
            ..Spawn::default()
        },
    );
    // Everything that talks to the agent runs in the namespace, on a thread of its own.
    let (refused, text) = std::thread::scope(|s| {
        s.spawn(|| {
            ns.enter();
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            let mut held = Vec::new();
            for i in 2..=41u16 {
                let from = IpAddr::V6(Ipv6Addr::new(0xfd00, 0x64, 0, 0, 0, 0, 0, i));
                held.push(rt.block_on(intruder::tcp_from(from, listen)).unwrap());
            }
            // What was counted within 30 s is checked below (with `refused`).
            let mut text = String::new();
            poll_until(Duration::from_secs(30), || {
                text = scrape(metrics).unwrap_or_default();
                (agent_limited(&text, "over_source_cap") >= 36).then_some(())
            });
            let mut refused = 0;
            for tcp in &mut held {
                let mut buf = [0u8; 1];
                let read = rt.block_on(async {
                    tokio::time::timeout(Duration::from_millis(500), tcp.read(&mut buf)).await
                });
                refused += usize::from(matches!(read, Ok(Ok(0) | Err(_))));
            }
            (refused, text)
        })
        .join()
        .unwrap()
    });
    assert_eq!(
        agent_limited(&text, "over_source_cap"),
        36,
        "40 addresses of one /64 against 4 per source:\n{text}"
    );
    assert_eq!(refused, 36, "connections closed at once");
}

/// Item 2: one source sends 300 Hellos, each fresh and validly signed by a new
/// self-made key, on 300 connections. Before, every one was answered with the full
/// public-key work (under one lock, on the async workers). Now the source's bucket
/// (burst 100, then 50 a second) cuts it before any public-key work, counted
/// `over_source_rate`, and the node's sidecars still get their handshakes signed.
#[test]
fn a_hello_flood_from_one_source_is_cut_to_its_bucket_and_sidecars_still_get_signatures() {
    let dir = workdir();
    let a = Metered::spawn(dir.path(), "a", None, &[]);
    let (target, peer) = (a.listen(), a.peer_id());
    let (code, _) = a
        .agent
        .call(
            themis_agent_client::Method::PUT,
            "/v1/workloads/check",
            None,
        )
        .unwrap();
    assert!(code == 200 || code == 201, "creating the workload: {code}");
    let (_, identity) = a.agent.get("/v1/workloads/check/identity").unwrap();

    let rt = runtime();
    let started = Instant::now();
    let flood = rt.spawn(async move {
        let from = IpAddr::V4(Ipv4Addr::new(127, 0, 0, 77));
        let mut answered = 0u32;
        // One connection at a time (closed after its answer): the per-source
        // connection cap plays no part, only the bucket.
        for _ in 0..300 {
            if let Some((_, yes)) = intruder::hello_from(MESH, from, target, peer).await {
                answered += u32::from(yes);
            }
        }
        answered
    });
    // During the flood, a sidecar's Hello is signed by the agent.
    let request = common::hello_sign_request(&identity, MESH);
    let (code, answer): (u16, Value) = a
        .agent
        .call(
            themis_agent_client::Method::POST,
            "/v1/workloads/check/sign",
            Some(&request),
        )
        .expect("the agent's API answers during the flood");
    assert_eq!(code, 200, "{answer}");
    let answered = rt.block_on(flood).unwrap();
    let elapsed = started.elapsed().as_secs_f64();
    // What the bucket allows over the flood's duration, plus one for rounding.
    let allowed = 100.0 + 50.0 * elapsed + 1.0;
    assert!(
        f64::from(answered) <= allowed,
        "{answered} of 300 Hellos from one source answered in {elapsed:.1} s (the bucket allows {allowed:.0})"
    );
    eventually(&a, "the refused Hellos counted", |text| {
        agent_limited(text, "over_source_rate") >= u64::from(300 - answered)
    });
}

/// Item 3: a caller on the resolve listener asks for ever-new names, each a miss of
/// the cache and `replicas + 1` DHT lookups. Before, none was ever refused. Now the
/// lookups beyond the budget (a burst of 200, then 50 a second, by default) are
/// refused with 429 `rate_limited` and Retry-After, counted, while the node's operator
/// (on the Unix socket) is not budgeted.
#[test]
fn ever_new_names_hit_the_lookup_budget_and_the_operator_is_exempt() {
    let dir = workdir();
    let resolve = SocketAddr::from(([127, 0, 0, 1], free_port()));
    let resolve_arg = resolve.to_string();
    let a = Metered::spawn(dir.path(), "a", None, &["--resolve-listen", &resolve_arg]);
    let refused = first_rate_limited(resolve, (0..1000).map(|i| format!("/v1/services/new-{i}")));
    let (head, answer) = refused.expect("1000 lookups of new names were never refused");
    assert_eq!(answer["reason"], "rate_limited", "{answer}");
    assert!(head.contains("\r\nretry-after: "), "{head}");
    // The operator resolves new names while the budget is spent.
    for i in 0..20 {
        let (code, answer) = a.agent.get(&format!("/v1/services/operator-{i}")).unwrap();
        assert_eq!(code, 200, "the operator was budgeted: {answer}");
    }
    assert!(
        a.value(
            "themis_resolve_lookups_limited_total",
            &[("outcome", "refused")]
        ) >= 1
    );
}
