//! One connection's machines (`themis_sidecar::conn`), the callee and the caller, under
//! hostile peers and a confused agent: arbitrary bytes cut arbitrarily, app writes,
//! and agent answers (the identity, a signature, a resolution) in any order and at
//! any time. Nothing panics; nothing but the callee's own preface reaches its app
//! before a genuine handshake (which the fuzzer cannot forge); no caller opens; once
//! closed, a machine passes nothing either way.
#![no_main]

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use ring::rand::SystemRandom;
use themis_core::guard::{BudgetConfig, HandshakeBudget, HelloGuard, Rate, SourceLimiter};
use themis_core::stream::{Meta, HTTP2_PREFACE};
use themis_core::{Carries, HandshakeConfig, HandshakeSigner, PeerId, StreamOptions};
use themis_sidecar::config::Policy;
use themis_sidecar::conn::callee::{self, Callee, Gates};
use themis_sidecar::conn::caller::{Caller, Start};
use themis_sidecar::conn::Step;
use themis_fuzz::{peers, NOW_MS};
use themis_trust::{MeshRoot, Revocations, Verifier};

#[derive(Arbitrary, Debug)]
enum Event {
    FromPeer(Vec<u8>),
    FromApp(Vec<u8>),
    IdentityArrived,
    Signed([u8; 64]),
    SignFailed,
    Resolved(Option<bool>),
    EndOfStream,
}

#[derive(Arbitrary, Debug)]
struct Input {
    keyless: bool,
    delegated: bool,
    /// No preface: message 2 goes out at once (the native socket).
    preface: bool,
    /// What each side offers or takes: protocols in the low three bits, stream
    /// options above (a raw byte, so nonsense sets are tried too).
    callee_takes: u8,
    caller_offers: u8,
    to_callee: Vec<Event>,
    to_caller: Vec<Event>,
}

fn handshake(byte: u8) -> HandshakeConfig {
    HandshakeConfig {
        carries: Carries(byte & 0b111),
        options: StreamOptions(byte & !0b111),
        ..HandshakeConfig::default()
    }
}

fn check_closed(step: &Step, closed: bool) {
    if closed {
        assert!(step.to_app.is_empty() && step.to_peer.is_empty(), "bytes after a close");
    }
}

fuzz_target!(|input: Input| {
    let rng = SystemRandom::new();
    let peers = peers();
    let me = &peers.responder;
    let root = MeshRoot { mesh: me.public().mesh().clone(), key: [9; 32] };
    let revoked = Revocations::new();
    let rate = Rate { per_second: 1000, burst: 1000 };
    let mut gates = Gates {
        guard: HelloGuard::new(60_000, 64),
        sources: SourceLimiter::new(rate, 16),
        budget: HandshakeBudget::new(BudgetConfig { rate, ..BudgetConfig::default() }),
    };
    let policy = Policy::AnyCaller;
    let (callee_takes, caller_offers) = (handshake(input.callee_takes), handshake(input.caller_offers));

    let preface: &'static [u8] = if input.preface { HTTP2_PREFACE } else { b"" };
    let mut callee = Callee::new(preface, Some([10, 0, 0, 1].into()));
    let mut has_identity = !input.keyless;
    let mut to_app = Vec::new();
    for event in input.to_callee {
        let mut listed = None;
        if let Event::Resolved(answer) = &event {
            listed = *answer;
        }
        let lists = move |_: &str, _: &PeerId| listed;
        let closed = callee.is_closed();
        let mut w = callee::Worker {
            now_ms: NOW_MS,
            rng: &rng,
            handshake: &callee_takes,
            identity: has_identity.then(|| me.public()),
            signer: input.delegated.then_some(me as &dyn HandshakeSigner),
            gates: &mut gates,
            policy: Some(&policy),
            trust: Verifier { root: &root, now_ms: NOW_MS, revoked: &revoked },
            // A stale feed refuses before any byte is read: nothing more to fuzz.
            revocations_stale: None,
            lists: &lists,
        };
        let step = match event {
            Event::FromPeer(bytes) => callee.from_peer(&bytes, &mut w),
            Event::FromApp(bytes) => callee.from_app(&bytes),
            Event::IdentityArrived => {
                has_identity = true;
                w.identity = Some(me.public());
                callee.identity_arrived(&mut w)
            }
            Event::Signed(signature) => callee.signed(Ok(signature)),
            Event::SignFailed => callee.signed(Err(themis_sidecar::conn::Close::new(
                themis_sidecar::reason::Reason::SignFailed,
                "",
            ))),
            Event::Resolved(_) => callee.resolved(&mut w),
            Event::EndOfStream => {
                callee.end_of_stream();
                Step::default()
            }
        };
        check_closed(&step, closed);
        to_app.extend_from_slice(&step.to_app);
    }
    assert!(callee.peer().is_none(), "a forged handshake was allowed");
    assert!(to_app.is_empty() || to_app == preface, "bytes reached the app: {to_app:?}");

    let mut caller = Caller::new();
    let start = |identity: bool| Start {
        now_ms: NOW_MS,
        rng: &rng,
        handshake: &caller_offers,
        identity: identity.then(|| peers.initiator.public()),
        signer: input.delegated.then_some(&peers.initiator as &dyn HandshakeSigner),
        peer: Ok(me.id()),
        meta: Meta::default(),
        revoked: &revoked,
    };
    let step = caller.start(start(!input.keyless));
    assert!(step.close.is_none());
    for event in input.to_caller {
        let closed = caller.is_closed();
        let step = match event {
            Event::FromPeer(bytes) => caller.from_peer(&bytes, &|_| false),
            Event::FromApp(bytes) => caller.from_app(&bytes),
            Event::IdentityArrived => caller.identity_arrived(start(true)),
            Event::Signed(signature) => caller.signed(Ok(signature)),
            Event::SignFailed | Event::Resolved(_) => Step::default(),
            Event::EndOfStream => {
                caller.end_of_stream();
                Step::default()
            }
        };
        check_closed(&step, closed);
        // Message 2 is signed by the callee over the caller's fresh key: the fuzzer
        // cannot make one, so nothing reaches the app.
        assert!(step.to_app.is_empty());
    }
    assert!(caller.peer().is_none(), "a forged answer opened the session");
});
