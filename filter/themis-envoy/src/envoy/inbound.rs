//! The responder: the network filter on the listener peers call, in front of Envoy's
//! HTTP connection manager. It opens the stream, decides the policy once the caller
//! proved its id, and hands the verified id and service to the connection manager
//! as filter state (`wasm.themis_peer_id`, `wasm.themis_peer_service`), which the
//! route copies into request headers. Until the policy allowed the caller, nothing
//! of its bytes reaches the connection manager.
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
use themis_core::guard::Admission;
use themis_core::stream::{self, Established, StreamResponder, HTTP2_PREFACE};
use themis_core::{HandshakeConfig, PeerId};

use super::{
    call_agent, call_agent_for_identity, call_agent_to_sign, call_response, now_ms, signature,
    Deadline, Root, Shared,
};
use crate::policy::{decide_with, endorsement_lists, Verdict};

enum Gate {
    /// The workload's public identity is being fetched (the sidecar just started);
    /// `raw` waits.
    Keyless {
        call: u32,
        raw: Vec<u8>,
    },
    /// Message 1 verified; the agent is signing message 2. The app is fed the
    /// preface (which prompts the write that carries message 2) once it is signed.
    Signing {
        call: u32,
    },
    /// The caller has not proved itself yet.
    Unknown,
    /// Waiting for the agent to resolve the caller's claimed service.
    Verifying {
        call: u32,
        claim: String,
    },
    Allowed,
    Closed,
}

pub struct Inbound {
    worker: Shared,
    /// Envoy's id of this connection's context (the root closes it by this id).
    context_id: u32,
    stream: StreamResponder,
    gate: Gate,
    /// Plaintext held while the policy is decided.
    held: Vec<u8>,
    counted: bool,
    /// The source's handshake budget was charged (on the connection's first bytes).
    admitted: bool,
    /// The connection's source address, as Envoy reports it.
    source: Option<IpAddr>,
    /// Message 1 so far, until it is complete and the worker's budget was consulted
    /// (at most one handshake message: longer is not a Hello). `None` after that.
    first: Option<Vec<u8>>,
}

impl Inbound {
    pub fn new(worker: Shared, context_id: u32) -> Self {
        {
            let mut w = worker.borrow_mut();
            w.metrics.count("connections");
            w.metrics.gauge("active", 1);
            let deadline = now_ms() + w.config.handshake_timeout.as_millis() as u64;
            w.handshaking.insert(context_id, Deadline::At(deadline));
        }
        Inbound {
            worker,
            context_id,
            stream: StreamResponder::new(HTTP2_PREFACE),
            gate: Gate::Unknown,
            held: Vec::new(),
            counted: false,
            admitted: false,
            source: None,
            first: Some(Vec::new()),
        }
    }

    fn close(&mut self, reason: &str, detail: &str) {
        {
            let mut w = self.worker.borrow_mut();
            w.metrics.count(&format!("refused.{reason}"));
            w.handshaking.remove(&self.context_id);
        }
        if matches!(reason, "rate_limited" | "stale" | "replay" | "busy") {
            // What floods are refused for: counted, not logged one line each.
            debug!("themis inbound: closing the connection ({reason}): {detail}");
        } else {
            warn!("themis inbound: closing the connection ({reason}): {detail}");
        }
        self.gate = Gate::Closed;
        self.held.clear();
        self.close_downstream();
    }

    /// Charges the connection's source one handshake from its bucket, before any
    /// work for its bytes; `false` (closed, `refused.rate_limited`) if it has none.
    /// A source Envoy does not report (not an IP) is not limited.
    fn admit(&mut self) -> bool {
        let source = self
            .get_property(vec!["source", "address"])
            .and_then(|bytes| source_ip(&bytes));
        self.source = source;
        let Some(source) = source else {
            return true;
        };
        let allowed = self.worker.borrow_mut().sources.allow(source, now_ms());
        if !allowed {
            self.close(
                "rate_limited",
                &format!("{source} started more handshakes than hellos_per_source allows"),
            );
        }
        allowed
    }

    /// Decides for the established caller; `true` once it is allowed.
    fn authorize(&mut self, established: &Established) -> bool {
        // Whether the claim was verified by the endorsement the caller carried.
        let mut endorsed = false;
        let (verdict, mesh) = {
            let w = self.worker.borrow();
            if w.revoked.contains(&established.peer_id) {
                drop(w);
                self.close("revoked", "the caller's id is revoked");
                return false;
            }
            // A claim counts when the endorsement the caller carried (a v3 caller: the
            // native runtime) names it for this very id, checked offline against the
            // root as the native callee does; else (none carried, or one for another
            // of its services, or lapsed) when a verified resolution lists it.
            let carried = &established.peer_endorsement;
            let now = now_ms();
            let lists = |claim: &str, peer: &PeerId| {
                endorsed =
                    !carried.is_empty() && endorsement_lists(&w.verifier(), carried, claim, peer);
                match endorsed {
                    true => Some(true),
                    false => w.callers.lists(claim, peer, now),
                }
            };
            let verdict = decide_with(w.config.policy.as_ref(), established, lists);
            (verdict, w.config.mesh.clone())
        };
        let peer = established.peer_id.printable(&mesh);
        match verdict {
            Verdict::Allow { service } => {
                let _ = hostcalls::set_property(vec!["themis_peer_id"], Some(peer.as_bytes()));
                if let Some(service) = &service {
                    let _ = hostcalls::set_property(
                        vec!["themis_peer_service"],
                        Some(service.as_bytes()),
                    );
                }
                {
                    let mut w = self.worker.borrow_mut();
                    w.metrics.count("allowed");
                    w.handshaking.remove(&self.context_id);
                    if let Some(source) = self.source {
                        // Known good: its new connections draw on the reserved share.
                        w.budget.confirmed(source, now_ms());
                    }
                }
                let by = match endorsed {
                    true => ", by the endorsement it carried",
                    false => "",
                };
                info!("themis inbound: {peer} (service {service:?}{by}) connected");
                self.gate = Gate::Allowed;
                true
            }
            Verdict::Deny { service, denial } => {
                self.close(
                    denial.reason(),
                    &format!(
                        "{peer} (verified service {service:?}): {}",
                        denial.explain()
                    ),
                );
                false
            }
            Verdict::Verify(claim) => {
                let path = themis_contracts::paths::service(&claim);
                let call = call_agent(self, &self.worker.borrow().config, &path);
                match call {
                    Some(call) => self.gate = Gate::Verifying { call, claim },
                    None => self.close("resolve_failed", "the agent cannot be called"),
                }
                false
            }
        }
    }
}

impl Context for Inbound {
    fn on_http_call_response(&mut self, token: u32, _: usize, body_size: usize, _: usize) {
        if self.closed_late() {
            return;
        }
        if let Gate::Keyless { call, .. } = &self.gate {
            if *call != token {
                return;
            }
            let Gate::Keyless { raw, .. } = std::mem::replace(&mut self.gate, Gate::Unknown) else {
                return;
            };
            let (status, body) = call_response(self, body_size);
            Root::install_identity(&self.worker, status, &body);
            if self.worker.borrow().identity.is_none() {
                return self.close("no_identity", "the agent has no identity for the workload");
            }
            if let Flow::Pass(bytes) = self.feed(&raw) {
                self.release(&bytes);
            }
            return;
        }
        if let Gate::Signing { call } = self.gate {
            if call != token {
                return;
            }
            self.gate = Gate::Unknown;
            let (status, body) = call_response(self, body_size);
            let signed = match signature(status, &body) {
                Ok(signature) => self.stream.signed(&signature),
                Err((reason, detail)) => return self.close(reason, &detail),
            };
            match signed {
                // The preface, through the read buffer Envoy kept when it paused.
                Ok(out) => self.release(&out.to_app),
                // Not our own key's signature: the agent is confused or lying.
                Err(refusal) => self.close("sign_failed", &refusal.to_string()),
            }
            return;
        }
        let Gate::Verifying { call, claim } = std::mem::replace(&mut self.gate, Gate::Unknown)
        else {
            return;
        };
        if call != token {
            self.gate = Gate::Verifying { call, claim };
            return;
        }
        let (status, body) = call_response(self, body_size);
        {
            let mut w = self.worker.borrow_mut();
            let ids: Vec<PeerId> = w
                .verified_instances(&claim, status, &body)
                .unwrap_or_default()
                .iter()
                .map(|i| i.id)
                .collect();
            let expires = w.expires(ids.is_empty());
            w.callers.insert(claim, ids, expires);
        }
        let Some(established) = self.stream.established().cloned() else {
            return;
        };
        if self.authorize(&established) {
            let held = std::mem::take(&mut self.held);
            self.release(&held);
        }
    }
}

/// What the worker's budget said about message 1.
enum Charge {
    /// Message 1 is not complete: its bytes are held here.
    More,
    /// Over the budget: closed (`refused.busy`).
    Busy,
    /// Answer it (or let the handshake refuse it cheaply).
    Go,
}

impl Inbound {
    /// Charges a complete, fresh message 1 to the worker's handshake budget, after the
    /// cheap checks (the source's bucket, the window, the replay cache) and before any
    /// public-key work; closes the connection (`refused.busy`) if it is spent. What
    /// the handshake refuses cheaply anyway (not a Hello, stale, replayed, for another
    /// id) is not charged.
    fn charge(&mut self, first: &[u8], identity: &themis_core::identity::PublicIdentity) -> Charge {
        let admission = {
            let w = &mut *self.worker.borrow_mut();
            let charged =
                w.budget
                    .charge_first(&mut w.guard, first, identity, self.source, now_ms());
            match charged {
                None => return Charge::More,
                Some(admission) => admission,
            }
        };
        match admission {
            Admission::Busy => {
                let source = self.source.map_or("-".into(), |s| s.to_string());
                self.close(
                    "busy",
                    &format!("the worker's handshake budget is spent (a Hello from {source})"),
                );
                Charge::Busy
            }
            Admission::Reserved => {
                self.worker.borrow().metrics.count("known_good_handshakes");
                Charge::Go
            }
            Admission::Open => Charge::Go,
        }
    }

    /// Bytes of message 1 held here or in the stream: a close now cuts a message.
    fn is_mid_message(&self) -> bool {
        self.stream.is_mid_message() || self.first.as_ref().is_some_and(|f| !f.is_empty())
    }
}

/// What became of the bytes of one read.
enum Flow {
    /// These go on to the connection manager.
    Pass(Vec<u8>),
    /// Held (a decision, a signature or the workload's identity is awaited) or
    /// dropped (closed).
    Hold,
}

impl Inbound {
    /// Whether the root closed this connection at its deadline: then it is closed
    /// here too, whatever the agent answers or the peer sends from now on.
    fn closed_late(&mut self) -> bool {
        let late =
            self.worker.borrow().handshaking.get(&self.context_id) == Some(&Deadline::Passed);
        if late {
            self.gate = Gate::Closed;
            self.held.clear();
        }
        late
    }

    /// Runs bytes from the peer through the stream and the gate.
    fn feed(&mut self, data: &[u8]) -> Flow {
        if self.closed_late() {
            return Flow::Hold;
        }
        if let Gate::Keyless { raw, .. } = &mut self.gate {
            // Before message 2 an initiator sends message 1 and nothing else.
            if raw.len() + data.len() > themis_core::wire::MAX_HANDSHAKE_LEN {
                self.close("overflow", "more than message 1 before message 2");
                return Flow::Hold;
            }
            raw.extend_from_slice(data);
            return Flow::Hold;
        }
        if matches!(self.gate, Gate::Closed) {
            return Flow::Hold;
        }
        if !self.admitted {
            self.admitted = true;
            if !self.admit() {
                return Flow::Hold;
            }
        }
        let identity = self.worker.borrow().identity.clone();
        let Some(identity) = identity else {
            // Just started: fetch the identity for this connection and hold its bytes.
            let call = call_agent_for_identity(self, &self.worker.borrow().config);
            match call {
                Some(call) => {
                    self.gate = Gate::Keyless {
                        call,
                        raw: data.to_vec(),
                    }
                }
                None => self.close("no_identity", "the workload's identity cannot be fetched"),
            }
            return Flow::Hold;
        };
        let held_first;
        let data = match self.first.take() {
            None => data,
            Some(mut first) => {
                first.extend_from_slice(data);
                match self.charge(&first, &identity) {
                    Charge::More => {
                        self.first = Some(first);
                        return Flow::Hold;
                    }
                    Charge::Busy => return Flow::Hold,
                    Charge::Go => {
                        held_first = first;
                        &held_first[..]
                    }
                }
            }
        };
        let result = {
            let w = &mut *self.worker.borrow_mut();
            let evicted = w.guard.evicted();
            let (now, config) = (now_ms(), HandshakeConfig::default());
            // Message 2 signed here with the worker's delegated key, or by the agent.
            let stream = &mut self.stream;
            let result = match w.credential(now) {
                Some(credential) => {
                    stream.from_peer(data, &*credential, &config, &mut w.guard, now, &w.rng)
                }
                None => {
                    stream.from_peer_unsigned(data, &identity, &config, &mut w.guard, now, &w.rng)
                }
            };
            if w.guard.evicted() > evicted {
                // Full of live Hellos: the first to expire was forgotten (a replay of
                // it costs a full answer again, and still fails at message 3).
                w.metrics.count("replay_cache_evicted");
            }
            result
        };
        let out = match result {
            Ok(out) => out,
            Err(refusal) => {
                self.close(refusal.reason(), &refusal.to_string());
                return Flow::Hold;
            }
        };
        match &self.gate {
            Gate::Allowed => {
                // A revocation ends open connections too, at their next bytes.
                let revoked = self
                    .stream
                    .established()
                    .is_some_and(|e| self.worker.borrow().revoked.contains(&e.peer_id));
                if revoked {
                    self.close("revoked", "the caller's id was revoked");
                    return Flow::Hold;
                }
                Flow::Pass(out.to_app)
            }
            Gate::Unknown if self.stream.to_sign().is_some() => {
                // Message 1 verified: the agent signs message 2 before anything moves.
                let to_sign = self.stream.to_sign().expect("checked in the guard");
                let call = call_agent_to_sign(self, &self.worker.borrow().config, &to_sign);
                match call {
                    Some(call) => {
                        self.worker.borrow().metrics.count("agent_signed");
                        self.gate = Gate::Signing { call };
                    }
                    None => self.close("sign_failed", "the agent cannot be asked to sign"),
                }
                Flow::Hold
            }
            Gate::Unknown => {
                let Some(established) = self.stream.established().cloned() else {
                    // Before message 3 the only bytes for the app are our preface.
                    return Flow::Pass(out.to_app);
                };
                if !self.counted {
                    self.counted = true;
                    self.worker.borrow().metrics.count("established");
                }
                if self.authorize(&established) {
                    Flow::Pass(out.to_app)
                } else {
                    self.hold(&out.to_app);
                    Flow::Hold
                }
            }
            Gate::Verifying { .. } => {
                self.hold(&out.to_app);
                Flow::Hold
            }
            Gate::Keyless { .. } | Gate::Signing { .. } | Gate::Closed => Flow::Hold,
        }
    }

    /// Holds plaintext for the app until the policy is decided, at most
    /// [`stream::MAX_HELD`] (the caller's first request and HTTP/2's windows fit; a
    /// peer that streams on past it is closed).
    fn hold(&mut self, bytes: &[u8]) {
        if stream::hold(&mut self.held, bytes).is_err() {
            self.close("overflow", "too much data while the caller is verified");
        }
    }

    /// Hands bytes decided later to the connection manager, through the read buffer
    /// Envoy kept for this filter when it paused.
    fn release(&mut self, bytes: &[u8]) {
        self.set_downstream_data(0, 0, bytes);
        self.resume_downstream();
    }
}

impl StreamContext for Inbound {
    fn on_downstream_data(&mut self, size: usize, end_of_stream: bool) -> Action {
        let data = self.get_downstream_data(0, size).unwrap_or_default();
        let flow = self.feed(&data);
        if end_of_stream && self.is_mid_message() && !matches!(self.gate, Gate::Closed) {
            // Cut inside a record: nothing of it was delivered; say so.
            self.close("truncated", "the peer's stream ends inside a message");
        }
        match flow {
            Flow::Pass(bytes) => {
                self.set_downstream_data(0, size, &bytes);
                Action::Continue
            }
            Flow::Hold => {
                self.set_downstream_data(0, size, &[]);
                Action::Pause
            }
        }
    }

    fn on_upstream_data(&mut self, size: usize, _end_of_stream: bool) -> Action {
        // A revoked caller that only listens (a stream of responses, no more requests)
        // is cut at the app's next bytes too, not only at its own.
        let revoked = matches!(self.gate, Gate::Allowed)
            && self
                .stream
                .established()
                .is_some_and(|e| self.worker.borrow().revoked.contains(&e.peer_id));
        if revoked {
            self.set_upstream_data(0, size, &[]);
            self.close("revoked", "the caller's id was revoked");
            return Action::Continue;
        }
        let data = self.get_upstream_data(0, size).unwrap_or_default();
        match self.stream.from_app(&data) {
            Ok(sealed) => self.set_upstream_data(0, size, &sealed),
            Err(refusal) => {
                self.set_upstream_data(0, size, &[]);
                self.close(refusal.reason(), &refusal.to_string());
            }
        }
        Action::Continue
    }

    fn on_downstream_close(&mut self, peer: PeerType) {
        // The peer closed inside a message (without a half-close, Envoy reports the
        // end of the stream as a close): nothing of the partial message was delivered.
        if peer == PeerType::Remote && self.is_mid_message() && !matches!(self.gate, Gate::Closed) {
            self.worker.borrow().metrics.count("refused.truncated");
            warn!("themis inbound: the peer's stream ended inside a message (truncated)");
            self.gate = Gate::Closed;
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
pub(super) fn close_late(worker: &Shared, context_id: u32) {
    {
        let w = worker.borrow();
        w.metrics.count("refused.handshake_timeout");
        warn!(
            "themis inbound: closing the connection (handshake_timeout): the caller was not allowed within {:?}",
            w.config.handshake_timeout
        );
    }
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
