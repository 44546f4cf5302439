//! The callee's connection, for both runtimes' inbound side (the Wasm network
//! filter, the native transport socket). It admits the caller's source, charges
//! message 1 to the worker's handshake budget, answers it (signed here, or by the
//! agent), decides the policy once the caller proved its id (asking for a
//! resolution of a claim it cannot check offline), and holds every byte of the
//! caller's until then.

use std::net::IpAddr;

use ring::rand::SecureRandom;
use themis_core::guard::{Admission, HandshakeBudget, HelloGuard, SourceLimiter};
use themis_core::identity::PublicIdentity;
use themis_core::stream::{self, StreamResponder};
use themis_core::wire::MAX_HANDSHAKE_LEN;
use themis_core::{Carries, HandshakeConfig, HandshakeSigner, PeerId};
use themis_trust::{Revocations, Verifier};

use super::{Ask, Close, Event, Step};
use crate::config::{Config, Policy};
use crate::policy::{decide_with, endorsement_lists, Verdict};
use crate::reason::Reason;

/// A worker's gates in front of the public-key work of message 1 (per worker, shared
/// by its connections): the source's bucket, the freshness window and replay cache,
/// and the handshake budget with its share for known-good sources.
pub struct Gates {
    pub guard: HelloGuard,
    pub sources: SourceLimiter,
    pub budget: HandshakeBudget,
}

impl Gates {
    pub fn new(config: &Config) -> Self {
        Gates {
            guard: HelloGuard::new(
                config.hello_window.as_millis() as u64,
                config.replay_cache_entries,
            ),
            sources: SourceLimiter::new(
                config.hellos_per_source,
                themis_core::guard::DEFAULT_SOURCE_ENTRIES,
            ),
            budget: HandshakeBudget::new(config.handshake_budget),
        }
    }
}

/// What a call needs of the worker, lent for the call.
pub struct Worker<'a> {
    pub now_ms: u64,
    pub rng: &'a dyn SecureRandom,
    /// What this side takes: the protocols the stream may carry and the options.
    pub handshake: &'a HandshakeConfig,
    /// The workload's public identity (`None`: not fetched yet).
    pub identity: Option<&'a PublicIdentity>,
    /// Signs message 2 here (a delegated key); `None`: the agent signs it.
    pub signer: Option<&'a dyn HandshakeSigner>,
    pub gates: &'a mut Gates,
    pub policy: Option<&'a Policy>,
    /// The mesh root and the revocations in force, at `now_ms`.
    pub trust: Verifier<'a>,
    /// `Some(age in ms)` when the revocations were last read longer ago than
    /// `revocations_max_age_secs` ([`crate::upkeep::revocations_stale`]): a new
    /// caller is refused, since a revocation may be missing.
    pub revocations_stale: Option<u64>,
    /// Whether a verified resolution of a service lists a peer: `None` when the
    /// worker does not know (the callee then asks for a resolution).
    pub lists: &'a dyn Fn(&str, &PeerId) -> Option<bool>,
}

enum Phase {
    /// The caller's source is not admitted yet (no byte has arrived).
    New,
    /// The workload's identity is being fetched; `raw` (message 1 so far) waits.
    Keyless {
        raw: Vec<u8>,
    },
    /// The caller has not proved itself yet.
    Handshaking,
    /// Message 1 verified; the agent is signing message 2.
    Signing,
    /// The caller proved its id; its claimed service is being resolved.
    Verifying,
    Allowed(PeerId),
    Closed,
}

/// One inbound connection.
pub struct Callee {
    phase: Phase,
    stream: StreamResponder,
    /// Message 2 rides on the app's first write (the app answers `preface`); without
    /// a preface the machine hands it out itself.
    preface: bool,
    source: Option<IpAddr>,
    /// Message 1 so far, until it is complete and charged to the budget (`None` after).
    first: Option<Vec<u8>>,
    /// The caller's plaintext while the policy is decided.
    held: Vec<u8>,
}

impl Callee {
    /// A connection from `source` (`None`: not an IP, not limited per source) whose
    /// app is fed `preface` when message 1 arrives (empty: message 2 goes out at once).
    pub fn new(preface: &'static [u8], source: Option<IpAddr>) -> Self {
        Callee {
            phase: Phase::New,
            stream: StreamResponder::new(preface),
            preface: !preface.is_empty(),
            source,
            first: Some(Vec::new()),
            held: Vec::new(),
        }
    }

    /// The caller, once allowed.
    pub fn peer(&self) -> Option<PeerId> {
        match self.phase {
            Phase::Allowed(peer) => Some(peer),
            _ => None,
        }
    }

    /// What the stream carries, as agreed, once the caller is allowed (for the
    /// server's codec).
    pub fn carries(&self) -> Option<Carries> {
        self.peer()?;
        self.stream.established().map(|e| e.carries)
    }

    pub fn is_closed(&self) -> bool {
        matches!(self.phase, Phase::Closed)
    }

    /// True if the caller's bytes stop inside a message: at the end of the stream, a
    /// truncation (nothing of the partial message was delivered).
    pub fn is_mid_message(&self) -> bool {
        let keyless = matches!(&self.phase, Phase::Keyless { raw } if !raw.is_empty());
        keyless
            || self.stream.is_mid_message()
            || self.first.as_ref().is_some_and(|f| !f.is_empty())
    }

    /// The caller's stream ended: inside a message, that is a truncation.
    pub fn end_of_stream(&mut self) -> Option<Close> {
        (!self.is_closed() && self.is_mid_message()).then(|| {
            self.abort();
            Close::new(Reason::Truncated, "the peer's stream ends inside a message")
        })
    }

    /// Ends the connection from outside (a deadline, an agent call that failed):
    /// nothing more is decided or passed on.
    pub fn abort(&mut self) {
        self.phase = Phase::Closed;
        self.held = Vec::new();
    }

    /// An allowed caller revoked since: its connection ends, whichever way its bytes
    /// flow.
    pub fn check_revoked(&mut self, revoked: &Revocations) -> Option<Close> {
        let peer = self.peer()?;
        revoked.contains(&peer).then(|| {
            self.abort();
            Close::new(Reason::Revoked, "the caller's id was revoked")
        })
    }

    /// Bytes from the caller.
    pub fn from_peer(&mut self, data: &[u8], w: &mut Worker<'_>) -> Step {
        let mut step = Step::default();
        self.feed(data, w, &mut step);
        self.finish(step)
    }

    /// The workload's identity was fetched (`w.identity`): the bytes held for it go on.
    pub fn identity_arrived(&mut self, w: &mut Worker<'_>) -> Step {
        let mut step = Step::default();
        if let Phase::Keyless { raw } = &mut self.phase {
            let raw = std::mem::take(raw);
            // Admitted already: the source was charged before the identity was asked for.
            self.phase = Phase::Handshaking;
            match w.identity {
                Some(_) => self.feed(&raw, w, &mut step),
                None => self.refuse(
                    &mut step,
                    Close::new(
                        Reason::NoIdentity,
                        "the agent has no identity for the workload",
                    ),
                ),
            }
        }
        self.finish(step)
    }

    /// The agent's signature of message 2, or why there is none.
    pub fn signed(&mut self, signature: Result<[u8; 64], Close>) -> Step {
        let mut step = Step::default();
        if !matches!(self.phase, Phase::Signing) {
            return step;
        }
        self.phase = Phase::Handshaking;
        match signature.and_then(|s| {
            // Not our own key's signature: the agent is confused or lying.
            self.stream
                .signed(&s)
                .map_err(|r| Close::new(Reason::SignFailed, r.to_string()))
        }) {
            // Message 2 rides on the app's first write: on this step's, if the app
            // wrote while the agent was signing.
            Ok(out) => (step.to_app, step.to_peer) = (out.to_app, out.to_peer),
            Err(close) => self.refuse(&mut step, close),
        }
        self.finish(step)
    }

    /// The resolution asked for is in `w.lists` (or failed, and is not): the policy
    /// is decided, and the held bytes go on if the caller is allowed.
    pub fn resolved(&mut self, w: &mut Worker<'_>) -> Step {
        let mut step = Step::default();
        if matches!(self.phase, Phase::Verifying) {
            self.phase = Phase::Handshaking;
            if self.decide(w, &mut step) {
                step.to_app = std::mem::take(&mut self.held);
            }
        }
        self.finish(step)
    }

    /// Bytes the app wrote toward the caller: sealed (the first carries message 2).
    pub fn from_app(&mut self, data: &[u8]) -> Step {
        let mut step = Step::default();
        if self.is_closed() {
            return step;
        }
        match self.stream.from_app(data) {
            Ok(sealed) => step.to_peer = sealed,
            Err(refusal) => self.refuse(&mut step, refusal.into()),
        }
        step
    }

    fn refuse(&mut self, step: &mut Step, close: Close) {
        self.abort();
        step.to_app.clear();
        step.close = Some(close);
    }

    /// Message 2 goes out at once when no app is prompted to carry it (only ever
    /// while the caller has not proved itself: not on every read of an open stream).
    fn finish(&mut self, mut step: Step) -> Step {
        if !self.preface && matches!(self.phase, Phase::Handshaking) {
            match self.stream.from_app(&[]) {
                Ok(reply) => step.to_peer.extend_from_slice(&reply),
                Err(refusal) => self.refuse(&mut step, refusal.into()),
            }
        }
        step
    }

    fn feed(&mut self, data: &[u8], w: &mut Worker<'_>, step: &mut Step) {
        match &mut self.phase {
            Phase::Closed => return,
            Phase::Keyless { raw } => {
                // Before message 2 an initiator sends message 1 and nothing else.
                if raw.len() + data.len() > MAX_HANDSHAKE_LEN {
                    return self.refuse(
                        step,
                        Close::new(Reason::Overflow, "more than message 1 before message 2"),
                    );
                }
                return raw.extend_from_slice(data);
            }
            Phase::New => {
                if let Some(source) = self.source {
                    if !w.gates.sources.allow(source, w.now_ms) {
                        let detail = format!(
                            "{source} started more handshakes than hellos_per_source allows"
                        );
                        return self.refuse(step, Close::new(Reason::RateLimited, detail));
                    }
                }
                if let Some(age_ms) = w.revocations_stale {
                    return self.refuse(step, Close::revocations_stale(age_ms));
                }
                self.phase = Phase::Handshaking;
            }
            _ => {}
        }
        let Some(identity) = w.identity else {
            // Just started: the identity is fetched for this connection; its bytes wait.
            self.phase = Phase::Keyless { raw: data.to_vec() };
            step.ask = Some(Ask::Identity);
            return;
        };
        let charged;
        let data = match self.first.take() {
            None => data,
            Some(mut first) => {
                first.extend_from_slice(data);
                let gates = &mut *w.gates;
                match gates.budget.charge_first(
                    &mut gates.guard,
                    &first,
                    identity,
                    self.source,
                    w.now_ms,
                ) {
                    None => {
                        self.first = Some(first);
                        return;
                    }
                    Some(Admission::Busy) => {
                        let source = self.source.map_or("-".into(), |s| s.to_string());
                        let detail = format!(
                            "the worker's handshake budget is spent (a Hello from {source})"
                        );
                        return self.refuse(step, Close::new(Reason::Busy, detail));
                    }
                    Some(Admission::Reserved) => step.events.push(Event::KnownGoodHandshake),
                    Some(Admission::Open) => {}
                }
                charged = first;
                &charged[..]
            }
        };
        let guard = &mut w.gates.guard;
        let evicted = guard.evicted();
        let config = w.handshake;
        let out = match w.signer {
            Some(signer) => self
                .stream
                .from_peer(data, signer, config, guard, w.now_ms, w.rng),
            None => self
                .stream
                .from_peer_unsigned(data, identity, config, guard, w.now_ms, w.rng),
        };
        if guard.evicted() > evicted {
            // Full of live Hellos: the first to expire was forgotten (a replay of it
            // costs a full answer again, and still fails at message 3).
            step.events.push(Event::ReplayCacheEvicted);
        }
        let out = match out {
            Ok(out) => out,
            Err(refusal) => return self.refuse(step, refusal.into()),
        };
        match self.phase {
            Phase::Allowed(_) => step.to_app = out.to_app,
            Phase::Handshaking => {
                if let Some(to_sign) = self.stream.to_sign() {
                    // Message 1 verified: the agent signs message 2 before anything moves.
                    self.phase = Phase::Signing;
                    step.ask = Some(Ask::Sign(to_sign));
                    return;
                }
                let Some(established) = self.stream.established() else {
                    // Before message 3 the only bytes for the app are our preface.
                    step.to_app = out.to_app;
                    return;
                };
                step.events.push(Event::Established(established.peer_id));
                match self.decide(w, step) {
                    true => step.to_app = out.to_app,
                    false => self.hold(&out.to_app, step),
                }
            }
            Phase::Verifying => self.hold(&out.to_app, step),
            Phase::New | Phase::Keyless { .. } | Phase::Signing | Phase::Closed => {}
        }
    }

    /// Holds plaintext until the policy is decided, at most [`stream::MAX_HELD`] (the
    /// caller's first request and HTTP/2's windows fit).
    fn hold(&mut self, bytes: &[u8], step: &mut Step) {
        if !self.is_closed() && stream::hold(&mut self.held, bytes).is_err() {
            self.refuse(
                step,
                Close::new(
                    Reason::Overflow,
                    "too much data while the caller is verified",
                ),
            );
        }
    }

    /// Decides for the established caller; `true` once it is allowed.
    fn decide(&mut self, w: &mut Worker<'_>, step: &mut Step) -> bool {
        let Some(established) = self.stream.established().cloned() else {
            return false;
        };
        let established = &established;
        let mesh = &w.trust.root.mesh;
        let peer = established.peer_id;
        if w.trust.revoked.contains(&peer) {
            self.refuse(
                step,
                Close::new(
                    Reason::Revoked,
                    format!("caller {} is revoked", peer.printable(mesh)),
                ),
            );
            return false;
        }
        // A claim counts when the endorsement the caller carried names it for this
        // very id, checked offline against the root; else (none carried, one for
        // another of its services, or lapsed) when a verified resolution lists it.
        let carried = &established.peer_endorsement;
        let mut by_endorsement = false;
        let verdict = decide_with(w.policy, established, |claim, peer| {
            by_endorsement =
                !carried.is_empty() && endorsement_lists(&w.trust, carried, claim, peer);
            match by_endorsement {
                true => Some(true),
                false => (w.lists)(claim, peer),
            }
        });
        match verdict {
            Verdict::Allow { service } => {
                if let Some(source) = self.source {
                    // Known good: its next handshakes draw on the reserved share.
                    w.gates.budget.confirmed(source, w.now_ms);
                }
                self.phase = Phase::Allowed(peer);
                step.events.push(Event::Allowed {
                    peer,
                    service,
                    by_endorsement,
                });
                true
            }
            Verdict::Deny { service, denial } => {
                let detail = format!(
                    "caller {} (verified service {service:?}): {}",
                    peer.printable(mesh),
                    denial.explain()
                );
                self.refuse(step, Close::new(denial.reason(), detail));
                false
            }
            Verdict::Verify(claim) => {
                self.phase = Phase::Verifying;
                step.ask = Some(Ask::Resolve(claim));
                false
            }
        }
    }
}

#[cfg(test)]
mod tests {
    //! The callee's decisions, driven in memory against a real initiator: what the
    //! Wasm filter and the native socket could only be tested for in a real Envoy.

    use std::net::Ipv4Addr;

    use super::super::testing::Root;
    use ring::rand::SystemRandom;
    use themis_core::guard::{BudgetConfig, Rate};
    use themis_core::handshake::{sign_message, signing_digest};
    use themis_core::identity::{Identity, MeshName};
    use themis_core::stream::{Meta, StreamInitiator, HTTP2_PREFACE};

    use super::*;
    use crate::config::Rule;

    const REQUEST: &[u8] = b"the caller's first request";

    /// One worker of the callee's sidecar, and a caller.
    struct World {
        rng: SystemRandom,
        me: Identity,
        caller: Identity,
        gates: Gates,
        trust: Root,
        policy: Option<Policy>,
        /// What a verified resolution says of the claim (`None`: not resolved).
        listed: Option<bool>,
        keyless: bool,
        delegated: bool,
        revocations_stale: Option<u64>,
        now_ms: u64,
        handshake: HandshakeConfig,
    }

    impl World {
        fn new(policy: Option<Policy>) -> Self {
            let rng = SystemRandom::new();
            let mesh = MeshName::new("callee-test").unwrap();
            World {
                me: Identity::generate(mesh.clone(), &rng).unwrap(),
                caller: Identity::generate(mesh.clone(), &rng).unwrap(),
                gates: Gates {
                    guard: HelloGuard::new(60_000, 64),
                    sources: SourceLimiter::new(
                        Rate {
                            per_second: 1,
                            burst: 1,
                        },
                        16,
                    ),
                    budget: HandshakeBudget::new(BudgetConfig::default()),
                },
                trust: Root::new(&mesh, &rng),
                policy,
                listed: Some(false),
                keyless: false,
                delegated: true,
                revocations_stale: None,
                now_ms: 1_900_000_000_000,
                handshake: HandshakeConfig::default(),
                rng,
            }
        }

        fn calling_by_id() -> Self {
            let mut world = World::new(None);
            world.policy = Some(Policy::Allow(vec![Rule::Id(world.caller.public().id())]));
            world
        }

        /// Runs `f` with the worker lent as the drivers lend it.
        fn with<R>(&mut self, f: impl FnOnce(&mut Worker<'_>) -> R) -> R {
            let listed = self.listed;
            let lists = move |_: &str, _: &PeerId| listed;
            let mut w = Worker {
                now_ms: self.now_ms,
                rng: &self.rng,
                handshake: &self.handshake,
                identity: (!self.keyless).then(|| self.me.public()),
                signer: self.delegated.then_some(&self.me as &dyn HandshakeSigner),
                gates: &mut self.gates,
                policy: self.policy.as_ref(),
                trust: Verifier {
                    root: &self.trust.root,
                    now_ms: self.now_ms,
                    revoked: &self.trust.revoked,
                },
                revocations_stale: self.revocations_stale,
                lists: &lists,
            };
            f(&mut w)
        }

        /// A caller claiming `service`, its first request written: message 1.
        fn caller(&self, service: Option<&str>) -> (StreamInitiator, Vec<u8>) {
            let meta = Meta {
                service: service.map(str::to_string),
            };
            let config = HandshakeConfig::default();
            let (mut stream, hello) = StreamInitiator::start(
                &self.caller,
                self.me.public().id(),
                meta,
                &config,
                self.now_ms,
                &self.rng,
            )
            .unwrap();
            stream.from_app(HTTP2_PREFACE).unwrap();
            stream.from_app(REQUEST).unwrap();
            (stream, hello)
        }
    }

    fn source() -> Option<IpAddr> {
        Some(IpAddr::V4(Ipv4Addr::new(10, 0, 0, 9)))
    }

    /// Message 1 through message 3 against `callee`; the step of message 3.
    fn handshake(world: &mut World, callee: &mut Callee, service: Option<&str>) -> Step {
        let (mut caller, hello) = world.caller(service);
        let step = world.with(|w| callee.from_peer(&hello, w));
        assert_eq!(step.to_app, HTTP2_PREFACE, "the app is prompted to answer");
        assert!(step.close.is_none() && step.ask.is_none());
        // The app's answer carries message 2.
        let reply = callee.from_app(b"SETTINGS").to_peer;
        let confirm = caller.from_peer(&reply).unwrap().to_peer;
        world.with(|w| callee.from_peer(&confirm, w))
    }

    fn refused(step: &Step) -> &'static str {
        step.close
            .as_ref()
            .map_or("(not closed)", |c| c.reason.as_str())
    }

    #[test]
    fn a_caller_the_policy_names_is_allowed_and_only_then_its_bytes_pass() {
        let mut world = World::calling_by_id();
        let mut callee = Callee::new(HTTP2_PREFACE, source());
        let step = handshake(&mut world, &mut callee, None);
        assert_eq!(
            step.to_app, REQUEST,
            "the preface is stripped, the request passes"
        );
        let caller = world.caller.public().id();
        assert_eq!(
            step.events,
            vec![
                Event::Established(caller),
                Event::Allowed {
                    peer: caller,
                    service: None,
                    by_endorsement: false
                }
            ]
        );
        assert_eq!(callee.peer(), Some(caller));
        // The app's answer is sealed for the caller.
        assert!(!callee.from_app(b"response").to_peer.is_empty());
    }

    /// A feed of revocations that froze (an agent gone, or one withholding answers)
    /// lets no new caller in, and the ones allowed before keep their connection; a
    /// fresh feed lets them in again.
    #[test]
    fn no_new_caller_is_let_in_while_the_revocations_are_stale() {
        let mut world = World::calling_by_id();
        let mut allowed = Callee::new(HTTP2_PREFACE, source());
        handshake(&mut world, &mut allowed, None);
        world.revocations_stale = Some(301_000);
        world.now_ms += 1_000; // the source's bucket refills
        let mut late = Callee::new(HTTP2_PREFACE, source());
        let (_, hello) = world.caller(None);
        let step = world.with(|w| late.from_peer(&hello, w));
        assert_eq!(refused(&step), "revocations_stale");
        assert!(step.to_app.is_empty() && late.is_closed());
        assert!(
            !allowed.from_app(b"still served").to_peer.is_empty(),
            "an allowed caller's connection stays"
        );
        world.revocations_stale = None;
        world.now_ms += 1_000;
        let mut again = Callee::new(HTTP2_PREFACE, source());
        let step = handshake(&mut world, &mut again, None);
        assert_eq!(step.to_app, REQUEST);
    }

    #[test]
    fn a_caller_the_policy_does_not_name_gets_nothing_through() {
        for policy in [None, Some(Policy::Allow(vec![Rule::Id(PeerId([1; 32]))]))] {
            let denied = match policy {
                None => "no_policy",
                Some(_) => "policy",
            };
            let mut world = World::new(policy);
            let mut callee = Callee::new(HTTP2_PREFACE, source());
            let step = handshake(&mut world, &mut callee, None);
            assert_eq!(refused(&step), denied);
            assert!(step.to_app.is_empty() && callee.is_closed() && callee.peer().is_none());
            // Closed: what follows is dropped.
            let after = world.with(|w| callee.from_peer(b"more", w));
            assert!(after.to_app.is_empty() && after.close.is_none());
        }
    }

    #[test]
    fn a_claim_is_resolved_before_the_held_bytes_pass() {
        for listed in [true, false] {
            let mut world = World::new(Some(Policy::Allow(vec![Rule::Service("web".into())])));
            world.listed = None;
            let mut callee = Callee::new(HTTP2_PREFACE, source());
            let step = handshake(&mut world, &mut callee, Some("web"));
            assert_eq!(step.ask, Some(Ask::Resolve("web".into())));
            assert!(step.to_app.is_empty(), "held while the claim is resolved");
            world.listed = Some(listed);
            let step = world.with(|w| callee.resolved(w));
            match listed {
                true => {
                    assert_eq!(step.to_app, REQUEST);
                    assert!(
                        matches!(&step.events[..], [Event::Allowed { service: Some(s), .. }] if s == "web")
                    );
                }
                false => {
                    assert_eq!(refused(&step), "policy");
                    assert!(step.to_app.is_empty());
                }
            }
        }
    }

    #[test]
    fn a_keyless_callee_waits_for_its_identity_then_has_the_agent_sign() {
        let mut world = World::calling_by_id();
        world.keyless = true;
        world.delegated = false;
        let mut callee = Callee::new(HTTP2_PREFACE, source());
        let (mut caller, hello) = world.caller(None);
        let (one, two) = hello.split_at(10);
        assert_eq!(
            world.with(|w| callee.from_peer(one, w)).ask,
            Some(Ask::Identity)
        );
        let step = world.with(|w| callee.from_peer(two, w));
        assert!(step.ask.is_none() && step.to_app.is_empty());
        world.keyless = false;
        let step = world.with(|w| callee.identity_arrived(w));
        let Some(Ask::Sign(to_sign)) = step.ask else {
            panic!("the agent is asked to sign message 2: {step:?}");
        };
        // The right digest signed by another key is refused: the agent is confused
        // or lying, and nothing was sent.
        let mut wrong = Callee::new(HTTP2_PREFACE, None);
        world.gates.guard = HelloGuard::new(60_000, 64);
        world.with(|w| wrong.from_peer(&hello, w));
        let digest = signing_digest(world.me.public(), &to_sign).unwrap();
        let by_another = world.caller.sign_digest(&digest);
        let step = wrong.signed(Ok(by_another));
        assert_eq!(refused(&step), "sign_failed");
        assert!(step.to_app.is_empty() && step.to_peer.is_empty());
        // Our own key's signature completes message 2.
        let signature = sign_message(&world.me, &to_sign).unwrap();
        let step = callee.signed(Ok(signature));
        assert_eq!(step.to_app, HTTP2_PREFACE);
        assert!(
            step.to_peer.is_empty(),
            "message 2 waits for the app's write"
        );
        let reply = callee.from_app(b"SETTINGS").to_peer;
        let confirm = caller.from_peer(&reply).unwrap().to_peer;
        assert_eq!(
            world.with(|w| callee.from_peer(&confirm, w)).to_app,
            REQUEST
        );
    }

    #[test]
    fn an_app_that_wrote_while_the_agent_signed_carries_message_2_at_once() {
        let mut world = World::calling_by_id();
        world.delegated = false;
        let mut callee = Callee::new(HTTP2_PREFACE, source());
        let (mut caller, hello) = world.caller(None);
        let Some(Ask::Sign(to_sign)) = world.with(|w| callee.from_peer(&hello, w)).ask else {
            panic!("the agent is asked to sign");
        };
        assert!(
            callee.from_app(b"SETTINGS").to_peer.is_empty(),
            "held: no message 2 yet"
        );
        let step = callee.signed(Ok(sign_message(&world.me, &to_sign).unwrap()));
        let confirm = caller.from_peer(&step.to_peer).unwrap().to_peer;
        assert_eq!(
            world.with(|w| callee.from_peer(&confirm, w)).to_app,
            REQUEST
        );
    }

    #[test]
    fn an_agent_that_cannot_sign_closes_the_connection() {
        let mut world = World::calling_by_id();
        world.delegated = false;
        let mut callee = Callee::new(HTTP2_PREFACE, source());
        let (_, hello) = world.caller(None);
        assert!(matches!(
            world.with(|w| callee.from_peer(&hello, w)).ask,
            Some(Ask::Sign(_))
        ));
        let timeout = Close::new(Reason::SignTimeout, "the agent did not sign in time");
        assert_eq!(refused(&callee.signed(Err(timeout))), "sign_timeout");
        assert!(callee.is_closed());
    }

    #[test]
    fn a_revoked_caller_is_refused_and_an_allowed_one_cut_when_revoked() {
        let mut world = World::calling_by_id();
        world.trust.revoke(world.caller.public().id());
        let mut callee = Callee::new(HTTP2_PREFACE, source());
        assert_eq!(
            refused(&handshake(&mut world, &mut callee, None)),
            "revoked"
        );

        let mut world = World::calling_by_id();
        let mut callee = Callee::new(HTTP2_PREFACE, source());
        handshake(&mut world, &mut callee, None);
        assert_eq!(callee.check_revoked(&world.trust.revoked), None);
        world.trust.revoke(world.caller.public().id());
        assert_eq!(
            callee
                .check_revoked(&world.trust.revoked)
                .map(|c| c.reason.as_str()),
            Some("revoked")
        );
        assert!(
            callee.from_app(b"response").to_peer.is_empty(),
            "nothing more is sealed"
        );
    }

    #[test]
    fn a_source_is_charged_once_per_connection_however_message_1_arrives() {
        let mut world = World::calling_by_id();
        let (_, hello) = world.caller(None);
        let mut callee = Callee::new(HTTP2_PREFACE, source());
        for piece in hello.chunks(7) {
            let step = world.with(|w| callee.from_peer(piece, w));
            assert!(step.close.is_none(), "{step:?}");
        }
        // The bucket holds one: the source's next connection is refused before any
        // public-key work, a connection of no IP is not limited per source.
        let (_, hello) = world.caller(None);
        let mut next = Callee::new(HTTP2_PREFACE, source());
        assert_eq!(
            refused(&world.with(|w| next.from_peer(&hello, w))),
            "rate_limited"
        );
        let mut unnamed = Callee::new(HTTP2_PREFACE, None);
        assert!(world.with(|w| unnamed.from_peer(&hello, w)).close.is_none());
    }

    #[test]
    fn a_spent_budget_refuses_a_fresh_hello() {
        let mut world = World::calling_by_id();
        world.gates.budget = HandshakeBudget::new(BudgetConfig {
            rate: Rate {
                per_second: 1,
                burst: 1,
            },
            known_good_percent: 0,
            ..BudgetConfig::default()
        });
        world.gates.sources = SourceLimiter::new(
            Rate {
                per_second: 100,
                burst: 100,
            },
            16,
        );
        let mut first = Callee::new(HTTP2_PREFACE, source());
        handshake(&mut world, &mut first, None);
        let (_, hello) = world.caller(None);
        let mut second = Callee::new(HTTP2_PREFACE, source());
        assert_eq!(
            refused(&world.with(|w| second.from_peer(&hello, w))),
            "busy"
        );
    }

    #[test]
    fn a_replayed_hello_is_refused() {
        let mut world = World::calling_by_id();
        world.gates.sources = SourceLimiter::new(
            Rate {
                per_second: 100,
                burst: 100,
            },
            16,
        );
        let (_, hello) = world.caller(None);
        let mut first = Callee::new(HTTP2_PREFACE, source());
        assert!(world.with(|w| first.from_peer(&hello, w)).close.is_none());
        let mut again = Callee::new(HTTP2_PREFACE, source());
        assert_eq!(
            refused(&world.with(|w| again.from_peer(&hello, w))),
            "replay"
        );
    }

    #[test]
    fn a_stream_cut_inside_a_message_is_a_truncation() {
        let mut world = World::calling_by_id();
        let (_, hello) = world.caller(None);
        let mut callee = Callee::new(HTTP2_PREFACE, source());
        world.with(|w| callee.from_peer(&hello[..20], w));
        assert_eq!(
            callee.end_of_stream().map(|c| c.reason.as_str()),
            Some("truncated")
        );
        // Once, and not for a stream that ended between messages.
        assert_eq!(callee.end_of_stream(), None);
        let mut whole = Callee::new(HTTP2_PREFACE, None);
        world.gates.guard = HelloGuard::new(60_000, 64);
        world.with(|w| whole.from_peer(&hello, w));
        assert_eq!(whole.end_of_stream(), None);
    }

    #[test]
    fn a_keyless_callee_holds_no_more_than_message_1() {
        let mut world = World::calling_by_id();
        world.keyless = true;
        let mut callee = Callee::new(HTTP2_PREFACE, source());
        let flood = vec![0u8; MAX_HANDSHAKE_LEN];
        assert_eq!(
            world.with(|w| callee.from_peer(&flood, w)).ask,
            Some(Ask::Identity)
        );
        assert!(callee.is_mid_message(), "cut here, message 1 is truncated");
        assert_eq!(
            refused(&world.with(|w| callee.from_peer(b"!", w))),
            "overflow"
        );
    }

    #[test]
    fn a_caller_streaming_on_while_its_claim_is_resolved_is_closed() {
        let mut world = World::new(Some(Policy::Allow(vec![Rule::Service("web".into())])));
        world.listed = None;
        let (mut caller, hello) = world.caller(Some("web"));
        let mut callee = Callee::new(HTTP2_PREFACE, source());
        world.with(|w| callee.from_peer(&hello, w));
        let reply = callee.from_app(b"SETTINGS").to_peer;
        let confirm = caller.from_peer(&reply).unwrap().to_peer;
        assert!(world.with(|w| callee.from_peer(&confirm, w)).ask.is_some());
        let chunk = vec![1u8; 1 << 20];
        let mut closed = None;
        for _ in 0..5 {
            let sealed = caller.from_app(&chunk).unwrap();
            let step = world.with(|w| callee.from_peer(&sealed, w));
            assert!(step.to_app.is_empty());
            if step.close.is_some() {
                closed = step.close;
                break;
            }
        }
        assert_eq!(closed.map(|c| c.reason.as_str()), Some("overflow"));
    }

    #[test]
    fn without_a_preface_message_2_goes_out_at_once() {
        let mut world = World::calling_by_id();
        let (mut caller, hello) = world.caller(None);
        let mut callee = Callee::new(b"", source());
        let step = world.with(|w| callee.from_peer(&hello, w));
        assert!(step.to_app.is_empty());
        let confirm = caller.from_peer(&step.to_peer).unwrap().to_peer;
        let step = world.with(|w| callee.from_peer(&confirm, w));
        // Without a preface to strip, the caller's app bytes pass whole.
        assert_eq!(step.to_app, [HTTP2_PREFACE, REQUEST].concat());
        assert!(step.to_peer.is_empty());
    }
}
