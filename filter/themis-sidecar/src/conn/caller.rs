//! The caller's connection, for both runtimes' seal side (the Wasm network filter of
//! the internal listener, the native upstream transport socket). It starts the key
//! agreement with the one id the pick promised (signed here, or by the agent), holds
//! the app's bytes until the session opens, and refuses a peer that speaks out of
//! turn, is revoked, or proves another id.

use ring::rand::SecureRandom;
use themis_core::identity::PublicIdentity;
use themis_core::stream::{self, Meta, StreamInitiator};
use themis_core::{HandshakeConfig, HandshakeSigner, PeerId, SessionInfo};
use themis_trust::Revocations;

use super::{Ask, Close, Event, Step};
use crate::reason::Reason;

/// What starting the key agreement needs of the worker, lent for the call.
pub struct Start<'a> {
    pub now_ms: u64,
    pub rng: &'a dyn SecureRandom,
    /// What this side offers: the protocols the stream may carry and the options.
    pub handshake: &'a HandshakeConfig,
    /// The workload's public identity (`None`: not fetched yet).
    pub identity: Option<&'a PublicIdentity>,
    /// Signs message 1 here (a delegated key); `None`: the agent signs it.
    pub signer: Option<&'a dyn HandshakeSigner>,
    /// The id that must answer, as the pick promised it (or why there is none).
    pub peer: Result<PeerId, Close>,
    /// What the caller says of itself in its first record.
    pub meta: Meta,
    pub revoked: &'a Revocations,
}

#[allow(clippy::large_enum_variant)] // the stream is the state for most of a connection's life
enum Phase {
    /// Nothing started (the app's first bytes, or the TCP connection, start it).
    New,
    /// The workload's identity is being fetched; `held` waits.
    Keyless {
        held: Vec<u8>,
    },
    /// Message 1 is made; the agent is signing it.
    Signing(StreamInitiator),
    /// Message 1 went out.
    Handshaking(StreamInitiator),
    Open(StreamInitiator, PeerId),
    Closed,
}

/// One outbound connection.
pub struct Caller {
    phase: Phase,
}

impl Default for Caller {
    fn default() -> Self {
        Caller::new()
    }
}

impl Caller {
    pub fn new() -> Self {
        Caller { phase: Phase::New }
    }

    /// The peer, once it proved its id.
    pub fn peer(&self) -> Option<PeerId> {
        match &self.phase {
            Phase::Open(_, peer) => Some(*peer),
            _ => None,
        }
    }

    /// What the handshake agreed (the protocol carried, the options), once open.
    pub fn agreed(&self) -> Option<&SessionInfo> {
        match &self.phase {
            Phase::Open(stream, _) => stream.info(),
            _ => None,
        }
    }

    pub fn is_new(&self) -> bool {
        matches!(self.phase, Phase::New)
    }

    pub fn is_closed(&self) -> bool {
        matches!(self.phase, Phase::Closed)
    }

    /// Ends the connection from outside (an agent call that failed).
    pub fn abort(&mut self) {
        self.phase = Phase::Closed;
    }

    /// True if the peer's bytes stop inside a message: at the end of the stream, a
    /// truncation (nothing of the partial message was delivered).
    pub fn is_mid_message(&self) -> bool {
        match &self.phase {
            Phase::Handshaking(stream) | Phase::Open(stream, _) => stream.is_mid_message(),
            _ => false,
        }
    }

    /// The peer's stream ended: inside a message, that is a truncation.
    pub fn end_of_stream(&mut self) -> Option<Close> {
        self.is_mid_message().then(|| {
            self.abort();
            Close::new(Reason::Truncated, "the peer's stream ends inside a message")
        })
    }

    /// A peer revoked since it proved its id: the connection ends, whichever way its
    /// bytes flow.
    pub fn check_revoked(&mut self, revoked: &Revocations) -> Option<Close> {
        let peer = self.peer()?;
        revoked.contains(&peer).then(|| {
            self.abort();
            Close::new(Reason::Revoked, "the peer's id was revoked")
        })
    }

    /// Starts the key agreement; message 1 is in the step's `to_peer` when it is
    /// signed here.
    pub fn start(&mut self, w: Start<'_>) -> Step {
        self.start_holding(Vec::new(), w)
    }

    /// The workload's identity was fetched (in `w.identity`): the key agreement starts
    /// with the bytes held for it.
    pub fn identity_arrived(&mut self, w: Start<'_>) -> Step {
        match std::mem::replace(&mut self.phase, Phase::New) {
            Phase::Keyless { held } => match w.identity {
                Some(_) => self.start_holding(held, w),
                None => self.refuse(Close::new(
                    Reason::NoIdentity,
                    "the agent has no identity for the workload",
                )),
            },
            other => {
                self.phase = other;
                Step::default()
            }
        }
    }

    fn start_holding(&mut self, held: Vec<u8>, w: Start<'_>) -> Step {
        let Some(identity) = w.identity else {
            self.phase = Phase::Keyless { held };
            return Step {
                ask: Some(Ask::Identity),
                ..Step::default()
            };
        };
        let peer = match w.peer {
            Ok(peer) if w.revoked.contains(&peer) => {
                return self.refuse(Close::new(Reason::Revoked, "the peer's id is revoked"))
            }
            Ok(peer) => peer,
            Err(close) => return self.refuse(close),
        };
        let config = w.handshake;
        let started = match w.signer {
            Some(signer) => StreamInitiator::start(signer, peer, w.meta, config, w.now_ms, w.rng)
                .map(|(stream, hello)| (stream, Some(hello))),
            None => {
                StreamInitiator::start_unsigned(identity, peer, w.meta, config, w.now_ms, w.rng)
                    .map(|stream| (stream, None))
            }
        };
        let (mut stream, hello) = match started {
            Ok(started) => started,
            Err(e) => return self.refuse(Close::new(Reason::Handshake, e.to_string())),
        };
        if let Err(refusal) = stream.from_app(&held) {
            return self.refuse(refusal.into());
        }
        let mut step = Step {
            events: vec![Event::Handshake],
            ..Step::default()
        };
        match (hello, stream.to_sign()) {
            (Some(hello), _) => {
                step.to_peer = hello;
                self.phase = Phase::Handshaking(stream);
            }
            (None, Some(to_sign)) => {
                step.ask = Some(Ask::Sign(to_sign));
                self.phase = Phase::Signing(stream);
            }
            (None, None) => unreachable!("an unsigned message 1 waits for its signature"),
        }
        step
    }

    /// The agent's signature of message 1, or why there is none: message 1 goes out.
    pub fn signed(&mut self, signature: Result<[u8; 64], Close>) -> Step {
        let Phase::Signing(mut stream) = std::mem::replace(&mut self.phase, Phase::Closed) else {
            self.phase = Phase::Closed;
            return Step::default();
        };
        // Not our own key's signature: the agent is confused or lying; nothing was sent.
        let hello = signature.and_then(|s| {
            stream
                .signed(&s)
                .map_err(|r| Close::new(Reason::SignFailed, r.to_string()))
        });
        match hello {
            Ok(hello) => {
                self.phase = Phase::Handshaking(stream);
                Step {
                    to_peer: hello,
                    ..Step::default()
                }
            }
            Err(close) => self.refuse(close),
        }
    }

    /// Bytes the app wrote: held until the session opens, then sealed.
    pub fn from_app(&mut self, data: &[u8]) -> Step {
        let sealed = match &mut self.phase {
            Phase::Keyless { held } => stream::hold(held, data).map(|()| Vec::new()),
            Phase::Signing(stream) | Phase::Handshaking(stream) | Phase::Open(stream, _) => {
                stream.from_app(data)
            }
            // Not started: the driver starts the key agreement first.
            Phase::New | Phase::Closed => Ok(Vec::new()),
        };
        match sealed {
            Ok(sealed) => Step {
                to_peer: sealed,
                ..Step::default()
            },
            Err(refusal) => self.refuse(refusal.into()),
        }
    }

    /// Bytes from the peer: message 2 (answered with message 3, the metadata and the
    /// held bytes), then records for the app. `is_revoked` is asked once, of the
    /// peer that proved its id.
    pub fn from_peer(&mut self, data: &[u8], is_revoked: &dyn Fn(&PeerId) -> bool) -> Step {
        let stream = match &mut self.phase {
            Phase::Handshaking(stream) | Phase::Open(stream, _) => stream,
            Phase::Closed => return Step::default(),
            Phase::New | Phase::Keyless { .. } | Phase::Signing(_) => {
                return self.refuse(Close::new(Reason::OutOfTurn, "the peer spoke first"))
            }
        };
        let out = match stream.from_peer(data) {
            Ok(out) => out,
            Err(refusal) => return self.refuse(refusal.into()),
        };
        let mut step = Step {
            to_app: out.to_app,
            to_peer: out.to_peer,
            ..Step::default()
        };
        if let Phase::Handshaking(stream) = &self.phase {
            if let Some(peer) = stream.peer_id() {
                // Counted as established, then refused, as the callee counts it.
                step.events.push(Event::Established(peer));
                if is_revoked(&peer) {
                    let mut refused =
                        self.refuse(Close::new(Reason::Revoked, "the peer's id is revoked"));
                    refused.events = step.events;
                    return refused;
                }
                let Phase::Handshaking(stream) = std::mem::replace(&mut self.phase, Phase::Closed)
                else {
                    unreachable!("matched above")
                };
                self.phase = Phase::Open(stream, peer);
            }
        }
        step
    }

    fn refuse(&mut self, close: Close) -> Step {
        self.abort();
        Step {
            close: Some(close),
            ..Step::default()
        }
    }
}

#[cfg(test)]
mod tests {
    //! The caller's decisions, driven in memory against a real responder.

    use super::super::testing::Root;
    use ring::rand::SystemRandom;
    use themis_core::guard::HelloGuard;
    use themis_core::handshake::{sign_message, signing_digest};
    use themis_core::identity::{Identity, MeshName};
    use themis_core::stream::{StreamResponder, MAX_HELD};

    use super::*;

    const REQUEST: &[u8] = b"the app's first request";
    const NOW: u64 = 1_900_000_000_000;

    struct World {
        rng: SystemRandom,
        me: Identity,
        callee: Identity,
        trust: Root,
        keyless: bool,
        delegated: bool,
        handshake: HandshakeConfig,
    }

    impl World {
        fn new() -> Self {
            let rng = SystemRandom::new();
            let mesh = MeshName::new("caller-test").unwrap();
            World {
                me: Identity::generate(mesh.clone(), &rng).unwrap(),
                callee: Identity::generate(mesh.clone(), &rng).unwrap(),
                trust: Root::new(&mesh, &rng),
                keyless: false,
                delegated: true,
                handshake: HandshakeConfig::default(),
                rng,
            }
        }

        /// What the seal side lends a start, the pick having promised the callee.
        fn start(&self) -> Start<'_> {
            Start {
                now_ms: NOW,
                rng: &self.rng,
                handshake: &self.handshake,
                identity: (!self.keyless).then(|| self.me.public()),
                signer: self.delegated.then_some(&self.me as &dyn HandshakeSigner),
                peer: Ok(self.callee.public().id()),
                meta: Meta {
                    service: Some("web".into()),
                },
                revoked: &self.trust.revoked,
            }
        }

        /// The callee's answer to message 1: message 2.
        fn answer(&self, callee: &mut StreamResponder, hello: &[u8]) -> Vec<u8> {
            self.answer_as(&HandshakeConfig::default(), callee, hello)
                .unwrap()
        }

        /// The answer of a callee that takes what `config` says.
        fn answer_as(
            &self,
            config: &HandshakeConfig,
            callee: &mut StreamResponder,
            hello: &[u8],
        ) -> Result<Vec<u8>, themis_core::stream::Refusal> {
            let mut guard = HelloGuard::new(60_000, 64);
            callee.from_peer(hello, &self.callee, config, &mut guard, NOW, &self.rng)?;
            callee.from_app(&[])
        }

        fn is_revoked(&self) -> impl Fn(&PeerId) -> bool + '_ {
            |peer| self.trust.revoked.contains(peer)
        }
    }

    fn refused(step: &Step) -> &'static str {
        step.close
            .as_ref()
            .map_or("(not closed)", |c| c.reason.as_str())
    }

    #[test]
    fn the_app_waits_for_the_promised_peer_then_its_bytes_are_sealed() {
        let world = World::new();
        let mut caller = Caller::new();
        let step = caller.start(world.start());
        assert_eq!(step.events, vec![Event::Handshake]);
        let hello = step.to_peer;
        assert!(
            caller.from_app(REQUEST).to_peer.is_empty(),
            "held until the session opens"
        );
        let mut callee = StreamResponder::new(b"");
        let reply = world.answer(&mut callee, &hello);
        let step = caller.from_peer(&reply, &world.is_revoked());
        let peer = world.callee.public().id();
        assert_eq!(step.events, vec![Event::Established(peer)]);
        assert_eq!(caller.peer(), Some(peer));
        // Message 3, the metadata and the held request.
        let config = HandshakeConfig::default();
        let mut guard = HelloGuard::new(60_000, 64);
        let out = callee
            .from_peer(
                &step.to_peer,
                &world.callee,
                &config,
                &mut guard,
                NOW,
                &world.rng,
            )
            .unwrap();
        assert_eq!(out.to_app, REQUEST);
        assert_eq!(
            callee.established().unwrap().meta.service.as_deref(),
            Some("web")
        );
        // Open: sealed as it goes.
        let sealed = caller.from_app(b"more").to_peer;
        let out = callee
            .from_peer(&sealed, &world.callee, &config, &mut guard, NOW, &world.rng)
            .unwrap();
        assert_eq!(out.to_app, b"more");
    }

    #[test]
    fn an_http1_caller_learns_in_the_signed_reply_who_takes_http1_and_nobody_else_agrees_to_it() {
        use themis_core::{Carries, StreamOptions};
        let native = HandshakeConfig {
            carries: Carries::HTTP2.or(Carries::HTTP1),
            options: StreamOptions::LARGE_RECORDS.or(StreamOptions::TAKES_HTTP1),
            ..HandshakeConfig::default()
        };
        let mut world = World::new();
        // An HTTP/2 connection of a caller that asks: a native callee says it takes
        // HTTP/1.1, an HTTP/2-only one (the Wasm runtime's) does not.
        world.handshake = HandshakeConfig {
            carries: Carries::HTTP2,
            ..native.clone()
        };
        for (callee_config, takes_http1) in [(&native, true), (&HandshakeConfig::default(), false)]
        {
            let mut caller = Caller::new();
            let hello = caller.start(world.start()).to_peer;
            let mut callee = StreamResponder::new(b"");
            let reply = world.answer_as(callee_config, &mut callee, &hello).unwrap();
            caller.from_peer(&reply, &world.is_revoked());
            let agreed = caller.agreed().expect("open");
            assert_eq!(agreed.carries, Carries::HTTP2);
            assert_eq!(
                agreed.options.contains(StreamOptions::TAKES_HTTP1),
                takes_http1
            );
        }
        // An HTTP/1.1 connection: the native callee agrees to it; the HTTP/2-only one
        // refuses it before answering, so no HTTP/1.1 byte reaches its server.
        world.handshake = HandshakeConfig {
            carries: Carries::HTTP1,
            ..native.clone()
        };
        let mut caller = Caller::new();
        let hello = caller.start(world.start()).to_peer;
        let reply = world
            .answer_as(&native, &mut StreamResponder::new(b""), &hello)
            .unwrap();
        caller.from_peer(&reply, &world.is_revoked());
        assert_eq!(caller.agreed().unwrap().carries, Carries::HTTP1);
        let refused = world.answer_as(
            &HandshakeConfig::default(),
            &mut StreamResponder::new(b""),
            &hello,
        );
        assert!(refused.is_err(), "an HTTP/2-only callee took HTTP/1.1");
    }

    #[test]
    fn a_keyless_caller_holds_the_app_bytes_until_its_identity_arrives() {
        let mut world = World::new();
        world.keyless = true;
        let mut caller = Caller::new();
        assert_eq!(caller.start(world.start()).ask, Some(Ask::Identity));
        assert!(caller.from_app(REQUEST).to_peer.is_empty());
        world.keyless = false;
        let step = caller.identity_arrived(world.start());
        assert!(!step.to_peer.is_empty(), "message 1");
        let mut callee = StreamResponder::new(b"");
        let reply = world.answer(&mut callee, &step.to_peer);
        let step = caller.from_peer(&reply, &world.is_revoked());
        assert!(step.close.is_none() && caller.peer().is_some());
        // The agent has no identity for the workload.
        let mut world = World::new();
        world.keyless = true;
        let mut caller = Caller::new();
        caller.start(world.start());
        assert_eq!(
            refused(&caller.identity_arrived(world.start())),
            "no_identity"
        );
    }

    #[test]
    fn a_keyless_caller_holds_at_most_max_held() {
        let mut world = World::new();
        world.keyless = true;
        let mut caller = Caller::new();
        caller.start(world.start());
        assert!(caller.from_app(&vec![0; MAX_HELD]).close.is_none());
        assert_eq!(refused(&caller.from_app(b"!")), "overflow");
    }

    #[test]
    fn the_agent_signs_message_1_and_a_wrong_signature_sends_nothing() {
        let mut world = World::new();
        world.delegated = false;
        for honest in [true, false] {
            let mut caller = Caller::new();
            let step = caller.start(world.start());
            let Some(Ask::Sign(to_sign)) = step.ask else {
                panic!("the agent is asked to sign: {step:?}");
            };
            assert!(step.to_peer.is_empty());
            let signature = match honest {
                true => sign_message(&world.me, &to_sign).unwrap(),
                false => world
                    .callee
                    .sign_digest(&signing_digest(world.me.public(), &to_sign).unwrap()),
            };
            let step = caller.signed(Ok(signature));
            match honest {
                true => assert!(!step.to_peer.is_empty() && step.close.is_none()),
                false => {
                    assert_eq!(refused(&step), "sign_failed");
                    assert!(step.to_peer.is_empty());
                }
            }
        }
        let mut caller = Caller::new();
        caller.start(world.start());
        let timeout = Close::new(Reason::SignTimeout, "the agent did not sign in time");
        assert_eq!(refused(&caller.signed(Err(timeout))), "sign_timeout");
    }

    #[test]
    fn no_key_agreement_starts_with_a_revoked_or_unnamed_peer() {
        let mut world = World::new();
        let mut start = world.start();
        start.peer = Err(Close::new(
            Reason::NoPeer,
            "the connection names no expected peer",
        ));
        assert_eq!(refused(&Caller::new().start(start)), "no_peer");
        world.trust.revoke(world.callee.public().id());
        let step = Caller::new().start(world.start());
        assert_eq!(refused(&step), "revoked");
        assert!(step.to_peer.is_empty(), "no message 1 to a revoked id");
    }

    #[test]
    fn a_peer_revoked_by_the_time_it_answers_or_later_is_cut() {
        let mut world = World::new();
        let mut caller = Caller::new();
        let hello = caller.start(world.start()).to_peer;
        caller.from_app(REQUEST);
        let reply = world.answer(&mut StreamResponder::new(b""), &hello);
        world.trust.revoke(world.callee.public().id());
        let step = caller.from_peer(&reply, &world.is_revoked());
        assert_eq!(refused(&step), "revoked");
        assert!(step.to_peer.is_empty(), "the held request is not sent");

        let mut world = World::new();
        let mut caller = Caller::new();
        let hello = caller.start(world.start()).to_peer;
        let reply = world.answer(&mut StreamResponder::new(b""), &hello);
        caller.from_peer(&reply, &world.is_revoked());
        assert_eq!(caller.check_revoked(&world.trust.revoked), None);
        world.trust.revoke(world.callee.public().id());
        assert_eq!(
            caller
                .check_revoked(&world.trust.revoked)
                .map(|c| c.reason.as_str()),
            Some("revoked")
        );
        assert!(caller.from_app(b"more").to_peer.is_empty());
    }

    #[test]
    fn a_peer_that_speaks_first_or_cuts_a_message_is_refused() {
        let mut world = World::new();
        world.delegated = false;
        let mut caller = Caller::new();
        caller.start(world.start());
        assert_eq!(
            refused(&caller.from_peer(b"hi", &world.is_revoked())),
            "out_of_turn"
        );
        assert_eq!(
            refused(&Caller::new().from_peer(b"hi", &world.is_revoked())),
            "out_of_turn"
        );

        let world = World::new();
        let mut caller = Caller::new();
        let hello = caller.start(world.start()).to_peer;
        let reply = world.answer(&mut StreamResponder::new(b""), &hello);
        let step = caller.from_peer(&reply[..reply.len() - 1], &world.is_revoked());
        assert!(step.close.is_none() && step.events.is_empty());
        assert_eq!(
            caller.end_of_stream().map(|c| c.reason.as_str()),
            Some("truncated")
        );
        assert!(caller.is_closed());
    }
}
