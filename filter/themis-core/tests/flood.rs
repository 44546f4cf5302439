//! Floods of message 1 (issue 13): a responder refuses a stale or replayed Hello
//! before any public-key work, remembers only Hellos whose signature verified, stays
//! bounded, limits handshakes per source, and ("under load") answers at most its
//! handshake budget of fresh Hellos, with a share reserved for known-good sources. No key generation is observable as a
//! draw from the random number generator: the responder draws 64 bytes (its
//! ephemeral key and nonce) before it signs message 2, so a call given a generator
//! with nothing in it, which returns a refusal instead of panicking, generated no key
//! and signed nothing.

mod common;

use std::net::{IpAddr, Ipv4Addr};

use common::{identity, with_lenient_rng, with_rng, NOW_MS};
use themis_core::guard::{
    Admission, BudgetConfig, HandshakeBudget, Peek, Rate, SourceLimiter, MAX_KNOWN_GOOD_PERCENT,
};
use themis_core::handshake::{self, Initiator};
use themis_core::stream::{StreamResponder, HTTP2_PREFACE};
use themis_core::wire::{Hello, Signature};
use themis_core::{AwaitingConfirm, HandshakeConfig, HandshakeError, HelloGuard, Identity};

const WINDOW: u64 = 60_000;

fn alice() -> Identity {
    identity("flood", 0xa1)
}

fn bob() -> Identity {
    identity("flood", 0xb0)
}

/// Alice's message 1 to Bob sent at `at`, deterministic for a salt.
fn hello_at(at: u64, salt: u8) -> Vec<u8> {
    with_rng(&[&[salt; 32], &[salt ^ 0x11; 32]], |rng| {
        Initiator::start(&alice(), bob().id(), &HandshakeConfig::default(), at, rng)
    })
    .unwrap()
    .1
}

/// Bob answers with the randomness a full answer draws.
fn respond(
    guard: &mut HelloGuard,
    hello: &[u8],
    now: u64,
) -> Result<(AwaitingConfirm, Vec<u8>), HandshakeError> {
    with_lenient_rng(&[&[0x22; 32], &[0x33; 32]], |rng| {
        handshake::respond(&bob(), hello, &HandshakeConfig::default(), guard, now, rng)
    })
}

/// Bob answers with a generator that has nothing in it: a refusal proves no key was
/// generated and nothing signed (a draw would panic).
fn respond_without_work(
    guard: &mut HelloGuard,
    hello: &[u8],
    now: u64,
) -> Result<(AwaitingConfirm, Vec<u8>), HandshakeError> {
    with_lenient_rng(&[], |rng| {
        handshake::respond(&bob(), hello, &HandshakeConfig::default(), guard, now, rng)
    })
}

#[test]
fn a_replayed_hello_is_refused_at_message_1_without_any_key_work() {
    let mut guard = HelloGuard::new(WINDOW, 16);
    let hello = hello_at(NOW_MS, 1);
    assert!(respond(&mut guard, &hello, NOW_MS).is_ok());
    assert_eq!(guard.len(), 1);
    // The same bytes again, at once and later within the window.
    for later in [0, 1, 30_000, WINDOW] {
        assert_eq!(
            respond_without_work(&mut guard, &hello, NOW_MS + later).err(),
            Some(HandshakeError::Replayed),
            "{later} ms later"
        );
    }
    // Once its timestamp has left the window the Hello is stale (and forgotten).
    assert_eq!(
        respond_without_work(&mut guard, &hello, NOW_MS + WINDOW + 1).err(),
        Some(HandshakeError::Stale)
    );
    assert!(guard.is_empty(), "expired entries are dropped");
}

#[test]
fn a_replayed_hello_on_a_stream_is_refused_with_reason_replay_and_nothing_for_the_app() {
    let mut guard = HelloGuard::default();
    let hello = hello_at(NOW_MS, 2);
    let config = HandshakeConfig::default();
    let mut genuine = StreamResponder::new(HTTP2_PREFACE);
    let out = with_lenient_rng(&[&[0x22; 32], &[0x33; 32]], |rng| {
        genuine.from_peer(&hello, &bob(), &config, &mut guard, NOW_MS, rng)
    })
    .unwrap();
    assert_eq!(out.to_app, HTTP2_PREFACE);
    // The recorded Hello on a new connection, one byte at a time.
    let mut replayed = StreamResponder::new(HTTP2_PREFACE);
    let mut refusal = None;
    for byte in hello.chunks(1) {
        let step = with_lenient_rng(&[], |rng| {
            replayed.from_peer(byte, &bob(), &config, &mut guard, NOW_MS + 5, rng)
        });
        match step {
            Ok(out) => assert!(out.to_app.is_empty() && out.to_peer.is_empty()),
            Err(r) => {
                refusal = Some(r);
                break;
            }
        }
    }
    let refusal = refusal.expect("the replay is refused");
    assert_eq!(refusal.reason(), "replay", "{refusal}");
    assert!(
        replayed.from_app(b"SETTINGS").is_err(),
        "closed: no message 2"
    );
}

#[test]
fn a_stale_hello_is_refused_before_its_signature_is_checked() {
    let mut guard = HelloGuard::new(WINDOW, 16);
    let old = hello_at(NOW_MS - WINDOW - 1, 3);
    assert_eq!(
        respond_without_work(&mut guard, &old, NOW_MS).err(),
        Some(HandshakeError::Stale)
    );
    // A forged signature on a stale Hello: still `Stale`, so the signature was never
    // looked at (it is checked after the window).
    let mut forged = old.clone();
    let last = forged.len() - 1;
    forged[last] ^= 0x01;
    assert_eq!(
        respond_without_work(&mut guard, &forged, NOW_MS).err(),
        Some(HandshakeError::Stale)
    );
    // From the future too.
    let early = hello_at(NOW_MS + WINDOW + 1, 4);
    assert_eq!(
        respond_without_work(&mut guard, &early, NOW_MS).err(),
        Some(HandshakeError::Stale)
    );
    assert!(guard.is_empty(), "nothing refused is remembered");
}

#[test]
fn the_window_edges_are_inclusive() {
    for (offset, fresh) in [
        (-(WINDOW as i64) - 1, false),
        (-(WINDOW as i64), true),
        (0, true),
        (WINDOW as i64, true),
        (WINDOW as i64 + 1, false),
    ] {
        let mut guard = HelloGuard::new(WINDOW, 16);
        let at = NOW_MS.checked_add_signed(offset).unwrap();
        let got = respond(&mut guard, &hello_at(at, 5), NOW_MS).err();
        let want = (!fresh).then_some(HandshakeError::Stale);
        assert_eq!(got, want, "timestamp {offset:+} ms");
    }
    // A responder whose clock is at 0 (unset) does not underflow.
    let mut guard = HelloGuard::new(WINDOW, 16);
    assert_eq!(
        respond_without_work(&mut guard, &hello_at(NOW_MS, 5), 0).err(),
        Some(HandshakeError::Stale)
    );
}

#[test]
fn junk_cannot_fill_the_cache() {
    let mut guard = HelloGuard::new(WINDOW, 4);
    let hello = hello_at(NOW_MS, 6);
    let signed = Hello::decode(&hello).unwrap();
    let body_len = signed.body_bytes.len();
    // Fresh timestamp, bad signature: refused by the signature check, not remembered,
    // and refused the same way when sent again (not as a replay).
    let mut forged = hello[..body_len].to_vec();
    forged.extend(postcard::to_allocvec(&Signature([7; 64])).unwrap());
    for _ in 0..3 {
        assert_eq!(
            respond_without_work(&mut guard, &forged, NOW_MS).err(),
            Some(HandshakeError::BadSignature)
        );
    }
    assert!(guard.is_empty());
    // A Hello for another responder is refused (NotForMe) and not remembered either.
    let carol = identity("flood", 0xc0);
    let elsewhere = with_rng(&[&[8; 32], &[9; 32]], |rng| {
        Initiator::start(
            &alice(),
            carol.id(),
            &HandshakeConfig::default(),
            NOW_MS,
            rng,
        )
    })
    .unwrap()
    .1;
    assert_eq!(
        respond_without_work(&mut guard, &elsewhere, NOW_MS).err(),
        Some(HandshakeError::NotForMe)
    );
    assert!(guard.is_empty());
    // The genuine Hello is still answered.
    assert!(respond(&mut guard, &hello, NOW_MS).is_ok());
}

#[test]
fn a_full_cache_forgets_the_first_to_expire_and_never_refuses_a_new_hello() {
    let mut guard = HelloGuard::new(WINDOW, 2);
    // Three Hellos, the first the oldest (it expires first).
    let hellos: Vec<Vec<u8>> = (0..3u8)
        .map(|i| hello_at(NOW_MS + u64::from(i) * 10, 10 + i))
        .collect();
    for h in &hellos {
        assert!(respond(&mut guard, h, NOW_MS + 20).is_ok(), "never busy");
    }
    assert_eq!(guard.len(), 2, "bounded");
    assert_eq!(guard.evicted(), 1);
    // The forgotten one is answered again (it would fail at message 3: the core's
    // guarantee does not depend on the cache); the remembered ones are cheap refusals.
    assert_eq!(
        respond_without_work(&mut guard, &hellos[2], NOW_MS + 20).err(),
        Some(HandshakeError::Replayed)
    );
    assert_eq!(
        respond_without_work(&mut guard, &hellos[1], NOW_MS + 20).err(),
        Some(HandshakeError::Replayed)
    );
    assert!(respond(&mut guard, &hellos[0], NOW_MS + 20).is_ok());
    // Entries leave with their window: later, new Hellos fill an empty cache.
    let later = NOW_MS + 10 * WINDOW;
    assert!(respond(&mut guard, &hello_at(later, 20), later).is_ok());
    assert_eq!(guard.len(), 1, "the expired ones are gone");
    // A capacity of 0 keeps the window and no cache.
    let mut window_only = HelloGuard::new(WINDOW, 0);
    assert!(respond(&mut window_only, &hellos[0], NOW_MS).is_ok());
    assert!(respond(&mut window_only, &hellos[0], NOW_MS).is_ok());
    assert!(window_only.is_empty());
}

fn ip(last: u8) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(127, 0, 0, last))
}

#[test]
fn a_source_gets_its_burst_then_its_rate_and_other_sources_are_unaffected() {
    let rate = Rate {
        per_second: 10,
        burst: 5,
    };
    let mut limiter = SourceLimiter::new(rate, 16);
    let t = NOW_MS;
    let allowed = (0..20).filter(|_| limiter.allow(ip(1), t)).count();
    assert_eq!(allowed, 5, "the burst");
    assert!(limiter.allow(ip(2), t), "another source has its own bucket");
    // 10 per second: one token every 100 ms, none before.
    assert!(!limiter.allow(ip(1), t + 99));
    assert!(limiter.allow(ip(1), t + 100));
    assert!(!limiter.allow(ip(1), t + 100));
    // Quiet for a long time: the burst again, no more.
    let later = t + 3_600_000;
    let allowed = (0..20).filter(|_| limiter.allow(ip(1), later)).count();
    assert_eq!(allowed, 5);
    // A clock that goes back does not mint tokens.
    assert!(!limiter.allow(ip(1), t));
}

#[test]
fn the_source_table_is_bounded_and_forgets_the_least_recently_refilled() {
    let rate = Rate {
        per_second: 1,
        burst: 1,
    };
    let mut limiter = SourceLimiter::new(rate, 3);
    for last in 1..=3 {
        assert!(limiter.allow(ip(last), NOW_MS + u64::from(last)));
    }
    // .1 is refilled again (and refused): now .2 is the least recently refilled.
    assert!(!limiter.allow(ip(1), NOW_MS + 10));
    assert!(limiter.allow(ip(4), NOW_MS + 11), "a new source");
    assert_eq!(limiter.len(), 3, "bounded");
    // .1 and .3 are still limited; .2 was forgotten, so it starts with a full bucket.
    assert!(!limiter.allow(ip(1), NOW_MS + 12));
    assert!(limiter.allow(ip(2), NOW_MS + 12));
    assert_eq!(limiter.len(), 3);
}

/// A Hello to Bob from a throwaway identity (every key pair is a valid id), as a
/// flood sends them: fresh, validly signed.
fn throwaway_hello(at: u64, n: u32) -> Vec<u8> {
    let mut seed = [0u8; 32];
    seed[..4].copy_from_slice(&n.to_le_bytes());
    seed[4] = 0xf1;
    let stranger = with_rng(&[&seed], |rng| {
        Identity::generate(themis_core::MeshName::new("flood").unwrap(), rng)
    })
    .unwrap();
    with_rng(&[&[n as u8; 32], &[0x5a; 32]], |rng| {
        Initiator::start(&stranger, bob().id(), &HandshakeConfig::default(), at, rng)
    })
    .unwrap()
    .1
}

fn budget(per_second: u32, burst: u32, known_good_percent: u8) -> HandshakeBudget {
    HandshakeBudget::new(BudgetConfig {
        rate: Rate { per_second, burst },
        known_good_percent,
        known_good_ms: 600_000,
        known_good_entries: 16,
    })
}

/// What the inbound driver does with a connection's first bytes: the cheap checks
/// (per-source bucket, window and replay through `peek`), then the budget, and only
/// then the handshake. `None`: refused as busy, before any key work.
fn drive(
    guard: &mut HelloGuard,
    sources: &mut SourceLimiter,
    budget: &mut HandshakeBudget,
    source: IpAddr,
    hello: &[u8],
    now: u64,
) -> Option<Result<(AwaitingConfirm, Vec<u8>), HandshakeError>> {
    assert!(
        sources.allow(source, now),
        "{source} is under its own bucket"
    );
    let charged = budget.charge_first(guard, hello, bob().public(), Some(source), now);
    if charged.is_some_and(|admission| !admission.admitted()) {
        // Busy: closed here. The generator is empty: no key work may follow.
        return None;
    }
    Some(respond(guard, hello, now))
}

#[test]
fn a_flood_of_fresh_hellos_from_many_sources_is_refused_busy_and_known_peers_keep_their_share() {
    // 10 handshakes a second, burst 10; half reserved for known-good sources.
    let mut guard = HelloGuard::new(WINDOW, 4096);
    let mut sources = SourceLimiter::new(
        Rate {
            per_second: 50,
            burst: 100,
        },
        4096,
    );
    let mut budget = budget(10, 10, 50);
    let peer = ip(1);
    let t = NOW_MS;

    // A peer connects and completes its handshake (the driver then marks its source).
    let first = drive(
        &mut guard,
        &mut sources,
        &mut budget,
        peer,
        &hello_at(t, 40),
        t,
    );
    assert!(first.unwrap().is_ok());
    budget.confirmed(peer, t);
    assert!(budget.is_known_good(peer, t));

    // 64 new sources, 3 fresh Hellos each in the same instant: every source is far
    // under its own bucket, but the open share holds 5 handshakes (10 − the peer's)
    // and a reserved one none of theirs.
    let (mut answered, mut busy) = (0, 0);
    for n in 0..192u32 {
        let source = IpAddr::V4(Ipv4Addr::new(127, 0, 1, (n % 64) as u8));
        match drive(
            &mut guard,
            &mut sources,
            &mut budget,
            source,
            &throwaway_hello(t, n),
            t,
        ) {
            Some(answer) => {
                assert!(answer.is_ok());
                answered += 1;
            }
            None => busy += 1,
        }
    }
    assert_eq!((answered, busy), (4, 188), "the open share, then busy");

    // Under the flood, the known peer's new connection is answered from its reserved
    // share (5 handshakes), a new source's is not.
    for n in 0..5u8 {
        let hello = hello_at(t, 50 + n);
        assert_eq!(guard.peek(&hello, bob().public(), t), Peek::Fresh);
        assert_eq!(budget.allow(peer, t), Admission::Reserved, "reserved {n}");
        assert!(respond(&mut guard, &hello, t).is_ok());
    }
    assert_eq!(
        budget.allow(peer, t),
        Admission::Busy,
        "the reserved share is 5"
    );
    assert_eq!(budget.allow(ip(2), t), Admission::Busy);

    // A replay of the peer's Hello costs no budget: `peek` calls it cheap, and the
    // handshake refuses it without key work.
    let replay = hello_at(t, 40);
    assert_eq!(guard.peek(&replay, bob().public(), t), Peek::Cheap);
    assert_eq!(
        respond_without_work(&mut guard, &replay, t).err(),
        Some(HandshakeError::Replayed)
    );

    // Time refills both shares at their rates: 5 a second each, one per 200 ms.
    assert_eq!(budget.allow(ip(2), t + 199), Admission::Busy);
    assert_eq!(budget.allow(ip(2), t + 200), Admission::Open);
    assert_eq!(budget.allow(ip(2), t + 200), Admission::Busy);
    assert_eq!(budget.allow(peer, t + 200), Admission::Reserved);
    assert_eq!(budget.allow(peer, t + 200), Admission::Busy);
    // A known-good source takes its reserved share first, then the open one.
    assert_eq!(budget.allow(peer, t + 400), Admission::Reserved);
    assert_eq!(budget.allow(peer, t + 400), Admission::Open);
    assert_eq!(budget.allow(peer, t + 400), Admission::Busy);
}

#[test]
fn peek_says_fresh_only_for_a_complete_hello_that_would_cost_a_full_answer() {
    let mut guard = HelloGuard::new(WINDOW, 16);
    let me = bob();
    let hello = hello_at(NOW_MS, 60);
    // Byte by byte: more until the last byte.
    for end in 0..hello.len() {
        assert_eq!(
            guard.peek(&hello[..end], me.public(), NOW_MS),
            Peek::More,
            "{end} bytes"
        );
    }
    assert_eq!(guard.peek(&hello, me.public(), NOW_MS), Peek::Fresh);
    // Bytes after it (message 3 does not come before message 2, but a driver may
    // hold more): still the Hello's verdict.
    let mut more = hello.clone();
    more.extend_from_slice(b"trailing");
    assert_eq!(guard.peek(&more, me.public(), NOW_MS), Peek::Fresh);
    // Once answered, it is remembered: the same key as the handshake's.
    assert!(respond(&mut guard, &hello, NOW_MS).is_ok());
    assert_eq!(guard.peek(&hello, me.public(), NOW_MS), Peek::Cheap);
    // Stale, future, for another responder, another mesh's, junk: cheap.
    let stale = hello_at(NOW_MS - WINDOW - 1, 61);
    assert_eq!(guard.peek(&stale, me.public(), NOW_MS), Peek::Cheap);
    let carol = identity("flood", 0xc0);
    assert_eq!(
        guard.peek(&hello_at(NOW_MS, 62), carol.public(), NOW_MS),
        Peek::Cheap,
        "for another id"
    );
    let other_mesh = identity("elsewhere", 0xb0);
    assert_eq!(
        guard.peek(&hello_at(NOW_MS, 63), other_mesh.public(), NOW_MS),
        Peek::Cheap
    );
    for junk in [&b"GET / HTTP/1.1\r\n\r\n"[..], &[2, 4, 0, 0], &[0xff; 600]] {
        assert_eq!(
            guard.peek(junk, me.public(), NOW_MS),
            Peek::Cheap,
            "{junk:?}"
        );
    }
    // A key that does not hash to the claimed id: cheap (refused before the
    // signature); the handshake agrees.
    let signed = Hello::decode(&hello).unwrap();
    let mut body = signed.message.body.clone();
    body.initiator_id = [9; 32];
    body.timestamp_ms += 1;
    let mut forged = postcard::to_allocvec(&body).unwrap();
    forged.extend(postcard::to_allocvec(&Signature([7; 64])).unwrap());
    assert_eq!(guard.peek(&forged, me.public(), NOW_MS), Peek::Cheap);
    assert_eq!(
        respond_without_work(&mut guard, &forged, NOW_MS).err(),
        Some(HandshakeError::KeyIdMismatch)
    );
    assert_eq!(guard.len(), 1, "peek remembers nothing");
}

#[test]
fn the_budget_splits_exactly_and_the_known_good_table_expires_and_is_bounded() {
    let t = NOW_MS;
    // 0 % reserved: one open bucket of the whole rate; known-good sources use it too.
    let mut open_only = budget(3, 3, 0);
    open_only.confirmed(ip(1), t);
    let got: Vec<_> = (0..4).map(|_| open_only.allow(ip(1), t)).collect();
    assert_eq!(
        got,
        [
            Admission::Open,
            Admission::Open,
            Admission::Open,
            Admission::Busy
        ]
    );
    // 1 per second, 30 %: 0.3 and 0.7 a second; the shares refill exactly.
    let mut b = budget(1, 10, 30);
    b.confirmed(ip(1), t);
    assert_eq!((0..20).filter(|_| b.allow(ip(2), t).admitted()).count(), 7);
    assert_eq!((0..20).filter(|_| b.allow(ip(1), t).admitted()).count(), 3);
    assert_eq!(b.allow(ip(2), t + 1_428), Admission::Busy);
    assert_eq!(b.allow(ip(2), t + 1_429), Admission::Open, "1/0.7 s");
    while b.allow(ip(2), t + 3_333).admitted() {}
    assert_eq!(b.allow(ip(1), t + 3_333), Admission::Busy);
    assert_eq!(b.allow(ip(1), t + 3_334), Admission::Reserved, "1/0.3 s");
    // A clock that goes back mints nothing.
    assert_eq!(b.allow(ip(1), t), Admission::Busy);
    // The share is capped: 100 % would lock every new peer out for good.
    let mut capped = budget(10, 10, 100);
    assert_eq!(
        (0..20)
            .filter(|_| capped.allow(ip(3), t).admitted())
            .count(),
        10 - usize::from(MAX_KNOWN_GOOD_PERCENT) / 10
    );

    // Known good for known_good_ms after the last confirmed handshake, inclusive.
    let mut b = budget(10, 10, 50);
    b.confirmed(ip(1), t);
    assert!(b.is_known_good(ip(1), t + 600_000));
    assert!(!b.is_known_good(ip(1), t + 600_001));
    assert_eq!(b.known_good(), 0, "expired entries are dropped");
    assert!(!b.is_known_good(ip(2), t), "never confirmed");
    // Bounded: 16 entries; a new one replaces the least recently confirmed.
    for last in 1..=16u8 {
        b.confirmed(ip(last), t + u64::from(last));
    }
    b.confirmed(ip(1), t + 100); // .1 again: now .2 is the oldest
    b.confirmed(ip(17), t + 101);
    assert_eq!(b.known_good(), 16, "bounded");
    assert!(!b.is_known_good(ip(2), t + 101));
    assert!(b.is_known_good(ip(1), t + 101) && b.is_known_good(ip(17), t + 101));
    // A source the driver cannot name draws from the open share only.
    let mut b = budget(2, 2, 50);
    assert_eq!(b.allow_unknown(t), Admission::Open);
    assert_eq!(b.allow_unknown(t), Admission::Busy);
}

/// `claim` is the replay check for a driver that verified a Hello off the shared
/// guard: the first copy is remembered, a second (a replay that raced it on another
/// connection) is refused, as are a stale Hello and bytes that are not a Hello; and a
/// claimed Hello is then refused by the handshake as `Replayed`.
#[test]
fn a_claimed_hello_is_remembered_once_and_then_refused() {
    let mut guard = HelloGuard::default();
    let hello = hello_at(NOW_MS, 71);
    assert!(guard.claim(&hello, NOW_MS));
    assert!(!guard.claim(&hello, NOW_MS), "a second copy was claimed");
    assert!(matches!(
        respond(&mut guard, &hello, NOW_MS),
        Err(HandshakeError::Replayed)
    ));
    let stale = hello_at(NOW_MS - 3_600_000, 72);
    assert!(!guard.claim(&stale, NOW_MS));
    assert!(!guard.claim(b"not a hello", NOW_MS));
    assert_eq!(guard.len(), 1);
}
