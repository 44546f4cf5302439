//! The initiator: the network filter of the internal listener between Envoy's router
//! (downstream: the HTTP/2 codec of the connection pool) and `tcp_proxy` to the
//! instance (upstream). The router's first bytes are held while the key agreement
//! runs; message 1 replaces them, signed here with the worker's delegated key (and
//! carrying the workload's endorsement), or, without one, once the agent signed it;
//! message 3 and the held bytes leave through the read buffer retained by pausing (a
//! Wasm network filter cannot write toward the upstream otherwise). What to do is
//! decided by [`themis_sidecar::conn::caller::Caller`], the machine the native runtime's
//! upstream socket runs too.

use log::{info, warn};
use proxy_wasm::hostcalls;
use proxy_wasm::traits::{Context, StreamContext};
use proxy_wasm::types::{Action, PeerType};
use themis_core::stream::Meta;
use themis_core::{HandshakeConfig, HandshakeSigner, PeerId};

use super::{ask_agent, now_ms, take_answer, Answer, Call, Shared};
use themis_sidecar::conn::caller::{Caller, Start};
use themis_sidecar::conn::{Close, Event, Step};
use themis_sidecar::reason::Reason;

/// The filter state key the router's `set_filter_state` puts the expected id in.
const EXPECTED_PEER: &str = "envoy.network.upstream_server_name";

pub struct Seal {
    worker: Shared,
    caller: Caller,
    /// The agent call in flight, by its token.
    call: Option<(u32, Call)>,
}

impl Seal {
    pub fn new(worker: Shared) -> Self {
        worker.borrow().metrics.count("connections");
        worker.borrow().metrics.gauge("active", 1);
        Seal {
            worker,
            caller: Caller::new(),
            call: None,
        }
    }

    fn close(&mut self, close: Close) {
        let (reason, detail) = (close.reason, close.detail);
        self.worker.borrow().metrics.count(&reason.counter());
        warn!("themis seal: closing the connection ({reason}): {detail}");
        self.caller.abort();
        self.call = None;
        self.close_downstream();
        self.close_upstream();
    }

    /// The id the router's pick says must answer.
    fn expected_peer() -> Result<PeerId, Close> {
        let raw = hostcalls::get_property(vec!["filter_state", EXPECTED_PEER])
            .ok()
            .flatten();
        let bytes = raw.and_then(|raw| <[u8; 32]>::try_from(hex::decode(raw).ok()?).ok());
        bytes
            .map(PeerId)
            .ok_or_else(|| Close::new(Reason::NoPeer, "the connection names no expected peer"))
    }

    /// Runs `f` (a start of the key agreement) with the worker's state lent to it.
    fn starting(&mut self, f: impl FnOnce(&mut Caller, Start<'_>) -> Step) -> Step {
        let shared = self.worker.clone();
        let w = shared.borrow();
        let now = now_ms();
        let credential = w.credential(now);
        let start = Start {
            now_ms: now,
            rng: &w.rng,
            // HTTP/2, what the cluster into the internal listener speaks.
            handshake: &HandshakeConfig::default(),
            identity: w.identity.as_deref(),
            signer: credential.as_deref().map(|c| c as &dyn HandshakeSigner),
            peer: Self::expected_peer(),
            meta: Meta {
                service: w.config.service.clone(),
            },
            revoked: &w.revoked,
        };
        f(&mut self.caller, start)
    }

    /// Does what a step asks (counts, agent calls, a close); returns its bytes for
    /// the app and for the peer.
    fn apply(&mut self, step: Step) -> (Vec<u8>, Vec<u8>) {
        for event in &step.events {
            self.worker.borrow().metrics.count(event.counter());
            if let Event::Established(peer) = event {
                info!("themis seal: session with {}", hex::encode(peer.0));
            }
        }
        if let Some(close) = step.close {
            self.close(close);
            return (Vec::new(), Vec::new());
        }
        if let Some(ask) = step.ask {
            match ask_agent(self, &self.worker, ask) {
                Ok(call) => self.call = Some(call),
                Err(close) => self.close(close),
            }
        }
        if self.caller.is_closed() {
            return (Vec::new(), Vec::new());
        }
        (step.to_app, step.to_peer)
    }

    /// Sends bytes toward the peer through the read buffer Envoy kept for this filter
    /// when it paused (a Wasm network filter cannot write toward the upstream
    /// otherwise). Also from within `on_downstream_data`: the host carries the resume
    /// out once the callback has returned `Pause`.
    fn send(&mut self, bytes: &[u8]) {
        if !bytes.is_empty() {
            self.set_downstream_data(0, 0, bytes);
            self.resume_downstream();
        }
    }

    fn revoked(&mut self) -> bool {
        let close = self.caller.check_revoked(&self.worker.borrow().revoked);
        close.map(|close| self.close(close)).is_some()
    }
}

impl Context for Seal {
    fn on_http_call_response(&mut self, token: u32, _: usize, body_size: usize, _: usize) {
        let Some((_, call)) = self.call.take_if(|(t, _)| *t == token) else {
            return;
        };
        let worker = self.worker.clone();
        let step = match take_answer(self, &worker, call, body_size) {
            Answer::Identity => self.starting(|caller, start| caller.identity_arrived(start)),
            Answer::Signature(signature) => self.caller.signed(signature),
            // A caller asks for no resolution.
            Answer::Resolution => Step::default(),
        };
        // Message 1, through the read buffer Envoy kept when it paused.
        let (_, hello) = self.apply(step);
        self.send(&hello);
    }
}

impl StreamContext for Seal {
    fn on_downstream_data(&mut self, size: usize, _end_of_stream: bool) -> Action {
        let data = self.get_downstream_data(0, size).unwrap_or_default();
        // A revocation ends open connections too, at their next bytes.
        let was_open = self.caller.peer().is_some();
        if self.revoked() {
            self.set_downstream_data(0, size, &[]);
            return Action::Pause;
        }
        let mut hello = Vec::new();
        if self.caller.is_new() {
            // The first bytes start the key agreement (or the fetch of the identity).
            let step = self.starting(|caller, start| caller.start(start));
            hello = self.apply(step).1;
        }
        let step = self.caller.from_app(&data);
        let sealed = self.apply(step).1;
        if was_open && !self.caller.is_closed() {
            self.set_downstream_data(0, size, &sealed);
            return Action::Continue;
        }
        // Paused, Envoy keeps the read buffer for this filter: message 1, and later
        // message 3 with the held bytes, leave through it (not if the first bytes
        // were already too many to hold).
        self.set_downstream_data(0, size, &[]);
        if !self.caller.is_closed() {
            self.send(&hello);
        }
        Action::Pause
    }

    fn on_upstream_data(&mut self, size: usize, end_of_stream: bool) -> Action {
        let data = self.get_upstream_data(0, size).unwrap_or_default();
        // A revoked peer that only sends (a stream to our app, no more requests) is
        // cut at its next bytes too, not only at the app's.
        if self.revoked() {
            self.set_upstream_data(0, size, &[]);
            return Action::Continue;
        }
        let step = {
            let shared = self.worker.clone();
            let w = shared.borrow();
            self.caller
                .from_peer(&data, &|peer| w.revoked.contains(peer))
        };
        if end_of_stream && step.close.is_none() {
            if let Some(close) = self.caller.end_of_stream() {
                // Cut inside a record: nothing of it was delivered; say so.
                self.set_upstream_data(0, size, &[]);
                self.close(close);
                return Action::Continue;
            }
        }
        let (to_app, to_peer) = self.apply(step);
        self.set_upstream_data(0, size, &to_app);
        // Message 3 and the held bytes, through the retained read buffer.
        self.send(&to_peer);
        Action::Continue
    }

    fn on_downstream_close(&mut self, _: PeerType) {}
}

impl Drop for Seal {
    fn drop(&mut self) {
        self.worker.borrow().metrics.gauge("active", -1);
    }
}
