//! The responder: the network filter on the listener peers call, in front of Envoy's
//! HTTP connection manager. It opens the stream, decides the policy once the caller
//! proved its id, and hands the verified id and service to the connection manager
//! as filter state (`wasm.themis_peer_id`, `wasm.themis_peer_service`), which the
//! route copies into request headers. Until the policy allowed the caller, nothing
//! of its bytes reaches the connection manager. What to do is decided by
//! [`themis_sidecar::conn::callee::Callee`], the machine the native runtime's inbound socket runs
//! too; this file moves bytes and makes the agent calls it asks for.
//!
//! Before any public-key work for a connection's message 1, in this order: the
//! source's bucket (`refused.rate_limited`), the freshness window and replay cache
//! (`refused.stale`, `refused.replay`), then the worker's handshake budget
//! (`refused.busy`), which keeps a share for known-good sources (`docs/FILTER.md`,
//! "Floods of message 1").

use std::net::{IpAddr, SocketAddr};

use log::{debug, info, warn};
use proxy_wasm::hostcalls;
use proxy_wasm::traits::{Context, StreamContext};
use proxy_wasm::types::{Action, PeerType};
use themis_core::stream::HTTP2_PREFACE;
use themis_core::{HandshakeConfig, HandshakeSigner, PeerId};
use themis_trust::Verifier;

use super::{ask_agent, now_ms, take_answer, Answer, Call, Deadline, Shared};
use themis_sidecar::conn::callee::{self, Callee};
use themis_sidecar::conn::{Close, Event, Step};

pub struct Inbound {
    worker: Shared,
    /// Envoy's id of this connection's context (the root closes it by this id).
    context_id: u32,
    /// Made at the first bytes, when Envoy reports the source address.
    callee: Option<Callee>,
    /// The agent call in flight, by its token.
    call: Option<(u32, Call)>,
}

impl Inbound {
    pub fn new(worker: Shared, context_id: u32) -> Self {
        {
            let mut w = worker.borrow_mut();
            w.metrics.count("connections");
            w.metrics.gauge("active", 1);
            let deadline = Deadline::starting(now_ms(), w.config.handshake_timeout);
            w.handshaking.insert(context_id, deadline);
        }
        Inbound {
            worker,
            context_id,
            callee: None,
            call: None,
        }
    }

    fn callee(&mut self) -> &mut Callee {
        if self.callee.is_none() {
            let source = self
                .get_property(vec!["source", "address"])
                .and_then(|bytes| source_ip(&bytes));
            self.callee = Some(Callee::new(HTTP2_PREFACE, source));
        }
        self.callee.as_mut().expect("made above")
    }

    /// Runs `f` on the machine with the worker's state lent to it.
    fn with_worker(
        &mut self,
        f: impl FnOnce(&mut Callee, &mut callee::Worker<'_>) -> Step,
    ) -> Step {
        let shared = self.worker.clone();
        let callee = self.callee();
        let mut w = shared.borrow_mut();
        let w = &mut *w;
        let now = now_ms();
        let credential = w.credential(now);
        let callers = &w.callers;
        let lists = |claim: &str, peer: &PeerId| callers.lists(claim, peer, now);
        let mut lent = callee::Worker {
            now_ms: now,
            rng: &w.rng,
            // HTTP/2 only: message 2 rides on the server's first write, and of the
            // protocols only an HTTP/2 server writes before it is asked.
            handshake: &HandshakeConfig::default(),
            identity: w.identity.as_deref(),
            signer: credential.as_deref().map(|c| c as &dyn HandshakeSigner),
            gates: &mut w.gates,
            policy: w.config.policy.as_ref(),
            trust: Verifier {
                root: &w.config.mesh_root,
                now_ms: now,
                revoked: &w.revoked,
            },
            revocations_stale: themis_sidecar::upkeep::revocations_stale(
                w.upkeep.revocations_fresh_since(),
                now,
                w.config.revocations_max_age,
            ),
            lists: &lists,
        };
        f(callee, &mut lent)
    }

    /// Counts and logs a refusal (the connection is closed, or closing).
    fn report(&self, close: &Close) {
        let mut w = self.worker.borrow_mut();
        w.metrics.count(&close.reason.counter());
        w.handshaking.remove(&self.context_id);
        let (reason, detail) = (close.reason, &close.detail);
        if close.is_flood() {
            // What floods are refused for: counted, not logged one line each.
            debug!("themis inbound: closing the connection ({reason}): {detail}");
        } else {
            warn!("themis inbound: closing the connection ({reason}): {detail}");
        }
    }

    fn close(&mut self, close: Close) {
        self.report(&close);
        if let Some(callee) = &mut self.callee {
            callee.abort();
        }
        self.call = None;
        self.close_downstream();
    }

    /// Does what a step asks (counts, agent calls, a close) and returns the
    /// plaintext for the connection manager.
    fn apply(&mut self, step: Step) -> Vec<u8> {
        for event in &step.events {
            self.worker.borrow().metrics.count(event.counter());
            if let Event::Allowed {
                peer,
                service,
                by_endorsement,
            } = event
            {
                self.allowed(peer, service.as_deref(), *by_endorsement);
            }
        }
        if let Some(close) = step.close {
            self.close(close);
            return Vec::new();
        }
        if let Some(ask) = step.ask {
            match ask_agent(self, &self.worker, ask) {
                Ok(call) => self.call = Some(call),
                Err(close) => self.close(close),
            }
        }
        if self.callee.as_ref().is_some_and(Callee::is_closed) {
            return Vec::new();
        }
        step.to_app
    }

    /// Hands the verified id and service to the connection manager as filter state.
    fn allowed(&self, peer: &PeerId, service: Option<&str>, by_endorsement: bool) {
        let peer = peer.printable(&self.worker.borrow().config.mesh);
        let _ = hostcalls::set_property(vec!["themis_peer_id"], Some(peer.as_bytes()));
        if let Some(service) = service {
            let _ = hostcalls::set_property(vec!["themis_peer_service"], Some(service.as_bytes()));
        }
        self.worker
            .borrow_mut()
            .handshaking
            .remove(&self.context_id);
        let by = match by_endorsement {
            true => ", by the endorsement it carried",
            false => "",
        };
        info!("themis inbound: {peer} (service {service:?}{by}) connected");
    }

    /// Whether the root closed this connection at its deadline: then it is closed
    /// here too, whatever the agent answers or the peer sends from now on.
    fn closed_late(&mut self) -> bool {
        let late = (self.worker.borrow().handshaking.get(&self.context_id))
            .is_some_and(Deadline::is_passed);
        if late {
            self.call = None;
            if let Some(callee) = &mut self.callee {
                callee.abort();
            }
        }
        late
    }

    /// An allowed caller revoked since is closed, whichever way its bytes flow.
    fn revoked(&mut self) -> bool {
        let shared = self.worker.clone();
        let close = match &mut self.callee {
            Some(callee) => callee.check_revoked(&shared.borrow().revoked),
            None => None,
        };
        close.map(|close| self.close(close)).is_some()
    }

    /// Hands bytes decided later to the connection manager, through the read buffer
    /// Envoy kept for this filter when it paused.
    fn release(&mut self, bytes: &[u8]) {
        if !bytes.is_empty() {
            self.set_downstream_data(0, 0, bytes);
            self.resume_downstream();
        }
    }
}

impl Context for Inbound {
    fn on_http_call_response(&mut self, token: u32, _: usize, body_size: usize, _: usize) {
        if self.closed_late() {
            return;
        }
        let Some((_, call)) = self.call.take_if(|(t, _)| *t == token) else {
            return;
        };
        let worker = self.worker.clone();
        let step = match take_answer(self, &worker, call, body_size) {
            Answer::Identity => self.with_worker(|callee, w| callee.identity_arrived(w)),
            Answer::Signature(signature) => self.callee().signed(signature),
            Answer::Resolution => self.with_worker(|callee, w| callee.resolved(w)),
        };
        let to_app = self.apply(step);
        self.release(&to_app);
    }
}

impl StreamContext for Inbound {
    fn on_downstream_data(&mut self, size: usize, end_of_stream: bool) -> Action {
        let data = self.get_downstream_data(0, size).unwrap_or_default();
        let mut to_app = Vec::new();
        if !self.closed_late() && !self.revoked() {
            let step = self.with_worker(|callee, w| callee.from_peer(&data, w));
            to_app = self.apply(step);
        }
        if end_of_stream {
            if let Some(close) = self.callee().end_of_stream() {
                // Cut inside a record: nothing of it was delivered; say so.
                self.close(close);
                to_app.clear();
            }
        }
        self.set_downstream_data(0, size, &to_app);
        // Paused, Envoy keeps the read buffer for this filter: what is decided later
        // (a signature, a resolution) goes on through it.
        match to_app.is_empty() {
            true => Action::Pause,
            false => Action::Continue,
        }
    }

    fn on_upstream_data(&mut self, size: usize, _end_of_stream: bool) -> Action {
        // A revoked caller that only listens (a stream of responses, no more requests)
        // is cut at the app's next bytes too, not only at its own.
        if self.revoked() {
            self.set_upstream_data(0, size, &[]);
            return Action::Continue;
        }
        let data = self.get_upstream_data(0, size).unwrap_or_default();
        let mut step = self.callee().from_app(&data);
        let sealed = std::mem::take(&mut step.to_peer);
        self.apply(step);
        self.set_upstream_data(0, size, &sealed);
        Action::Continue
    }

    fn on_downstream_close(&mut self, peer: PeerType) {
        // The peer closed inside a message (without a half-close, Envoy reports the
        // end of the stream as a close): nothing of the partial message was delivered.
        if peer == PeerType::Remote {
            if let Some(close) = self.callee.as_mut().and_then(|c| c.end_of_stream()) {
                self.report(&close);
            }
        }
    }
}

impl Drop for Inbound {
    fn drop(&mut self) {
        let mut w = self.worker.borrow_mut();
        w.metrics.gauge("active", -1);
        w.handshaking.remove(&self.context_id);
    }
}

/// Closes the connection of context `context_id`, whose caller was not allowed by
/// its deadline (`handshake_timeout`): silent, stalled inside a message, or waiting
/// on an agent that does not answer. Called by the root, acting as that context.
pub(super) fn close_late(worker: &Shared, context_id: u32, close: &Close) {
    worker.borrow().metrics.count(&close.reason.counter());
    warn!(
        "themis inbound: closing the connection ({}): {}",
        close.reason, close.detail
    );
    if hostcalls::set_effective_context(context_id).is_ok() {
        let _ = hostcalls::close_downstream();
    }
}

/// The IP of Envoy's `source.address` property (`ip:port`, or a bare IP).
fn source_ip(bytes: &[u8]) -> Option<IpAddr> {
    let text = std::str::from_utf8(bytes).ok()?;
    text.parse::<SocketAddr>()
        .map(|a| a.ip())
        .or_else(|_| text.parse::<IpAddr>())
        .ok()
}
