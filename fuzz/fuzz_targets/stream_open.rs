//! The sealed stream past a genuine handshake, which the `stream` target cannot reach:
//! the initiator's `Meta` (a fuzzed claimed service), message 3 and the records of both
//! apps, cut arbitrarily, with the fuzzer's edits on the caller's bytes. Nothing panics;
//! delivered as sent, every byte reaches the other app in order and the claim arrives
//! as made; edited, what reaches the callee's app is a prefix of what the caller's app
//! wrote, and once refused, the responder stays refused.
#![no_main]

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use ring::rand::SystemRandom;
use themis_core::stream::{Meta, StreamInitiator, StreamResponder, MAX_SERVICE_LEN};
use themis_core::{HandshakeConfig, HelloGuard};
use themis_fuzz::{peers, Edit, NOW_MS};

#[derive(Arbitrary, Debug)]
struct Input {
    /// The service the caller claims.
    service: Option<String>,
    /// What each app writes, in turn.
    caller_writes: Vec<Vec<u8>>,
    callee_writes: Vec<Vec<u8>>,
    /// Edits of the caller's bytes after message 2 (message 3, the Meta, the records).
    edits: Vec<Edit>,
    /// Where those bytes are cut on the way (offsets, wrapped).
    cuts: Vec<u16>,
}

fuzz_target!(|input: Input| {
    let rng = SystemRandom::new();
    let config = HandshakeConfig::default();
    let peers = peers();
    let meta = Meta {
        service: input.service.clone(),
    };
    let Ok((mut caller, hello)) = StreamInitiator::start(
        &peers.initiator,
        peers.responder.id(),
        meta,
        &config,
        NOW_MS,
        &rng,
    ) else {
        return; // a claim the initiator itself refuses to send
    };
    let mut callee = StreamResponder::new(b"");
    let mut guard = HelloGuard::default();
    let opened = callee
        .from_peer(&hello, &peers.responder, &config, &mut guard, NOW_MS, &rng)
        .expect("a genuine message 1");
    assert!(opened.to_app.is_empty());
    let reply = callee.from_app(&[]).expect("message 2");
    let confirmed = caller.from_peer(&reply).expect("a genuine message 2");
    assert!(caller.is_open());

    // The caller's side of the wire after message 2, genuine, then as delivered.
    let mut genuine = confirmed.to_peer;
    for write in &input.caller_writes {
        genuine.extend(caller.from_app(write).expect("an open caller seals"));
    }
    let mut wire = genuine.clone();
    input.edits.iter().for_each(|edit| edit.apply(&mut wire));

    let mut cuts: Vec<usize> = input
        .cuts
        .iter()
        .map(|&c| usize::from(c) % (wire.len() + 1))
        .collect();
    cuts.sort_unstable();
    cuts.push(wire.len());
    let (mut at, mut to_app, mut refused) = (0, Vec::new(), false);
    for cut in cuts {
        let piece = &wire[at..cut];
        at = cut;
        match callee.from_peer(piece, &peers.responder, &config, &mut guard, NOW_MS, &rng) {
            Ok(out) => {
                assert!(!refused, "accepted bytes after a refusal");
                to_app.extend_from_slice(&out.to_app);
            }
            Err(_) => refused = true,
        }
    }
    let sent = input.caller_writes.concat();
    // The responder refuses a claim that is empty or too long, and only that.
    let claim_ok = input
        .service
        .as_ref()
        .is_none_or(|s| !s.is_empty() && s.len() <= MAX_SERVICE_LEN);
    if wire == genuine && !claim_ok {
        assert!(refused, "a claim of {:?} was accepted", input.service);
        assert!(to_app.is_empty());
        return;
    }
    if wire == genuine {
        assert!(!refused, "the genuine stream was refused");
        assert_eq!(to_app, sent, "the caller's bytes changed on the way");
        let established = callee.established().expect("a genuine handshake completed");
        assert_eq!(established.peer_id, peers.initiator.id());
        assert_eq!(established.meta.service, input.service);
    } else {
        assert!(sent.starts_with(&to_app), "bytes the caller never wrote reached the app");
    }
    if wire != genuine {
        return;
    }

    // The other way, as sent: every byte of the callee's app reaches the caller's.
    let mut back = Vec::new();
    for write in &input.callee_writes {
        let sealed = callee.from_app(write).expect("an open callee seals");
        back.extend(caller.from_peer(&sealed).expect("a genuine record").to_app);
    }
    assert_eq!(back, input.callee_writes.concat());
});
