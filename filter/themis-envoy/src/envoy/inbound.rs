//! The responder: the network filter on the listener peers call, in front of Envoy's
//! HTTP connection manager. It opens the stream, decides the policy once the caller
//! proved its id, and hands the verified id and service to the connection manager
//! as filter state (`wasm.themis_peer_id`, `wasm.themis_peer_service`), which the
//! route copies into request headers. Until the policy allowed the caller, nothing
//! of its bytes reaches the connection manager.

use log::{info, warn};
use proxy_wasm::hostcalls;
use proxy_wasm::traits::{Context, StreamContext};
use proxy_wasm::types::{Action, PeerType};
use themis_core::stream::{Established, StreamResponder, HTTP2_PREFACE};
use themis_core::{HandshakeConfig, PeerId};

use super::{call_agent, call_agent_for_key, call_response, now_ms, Root, Shared};
use crate::policy::{decide, Verdict};

enum Gate {
    /// The workload's key is being fetched (the sidecar just started); `raw` waits.
    Keyless {
        call: u32,
        raw: Vec<u8>,
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
    stream: StreamResponder,
    gate: Gate,
    /// Plaintext held while the policy is decided.
    held: Vec<u8>,
    counted: bool,
}

impl Inbound {
    pub fn new(worker: Shared) -> Self {
        worker.borrow().metrics.count("connections");
        worker.borrow().metrics.gauge("active", 1);
        Inbound {
            worker,
            stream: StreamResponder::new(HTTP2_PREFACE),
            gate: Gate::Unknown,
            held: Vec::new(),
            counted: false,
        }
    }

    fn close(&mut self, reason: &str, detail: &str) {
        self.worker
            .borrow()
            .metrics
            .count(&format!("refused.{reason}"));
        warn!("themis inbound: closing the connection ({reason}): {detail}");
        self.gate = Gate::Closed;
        self.held.clear();
        self.close_downstream();
    }

    /// Decides for the established caller; `true` once it is allowed.
    fn authorize(&mut self, established: &Established) -> bool {
        let (verdict, mesh) = {
            let w = self.worker.borrow();
            if w.revoked.contains(&established.peer_id) {
                drop(w);
                self.close("revoked", "the caller's id is revoked");
                return false;
            }
            let verdict = decide(w.config.policy.as_ref(), &w.callers, established, now_ms());
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
                self.worker.borrow().metrics.count("allowed");
                info!("themis inbound: {peer} (service {service:?}) connected");
                self.gate = Gate::Allowed;
                true
            }
            Verdict::Deny { service } => {
                self.close(
                    "policy",
                    &format!("{peer} (verified service {service:?}) is not allowed"),
                );
                false
            }
            Verdict::Verify(claim) => {
                let path = format!("/v1/services/{claim}");
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
        if let Gate::Keyless { call, .. } = &self.gate {
            if *call != token {
                return;
            }
            let Gate::Keyless { raw, .. } = std::mem::replace(&mut self.gate, Gate::Unknown) else {
                return;
            };
            let (status, body) = call_response(self, body_size);
            Root::install_key(&self.worker, status, &body);
            if self.worker.borrow().identity.is_none() {
                return self.close("no_identity", "the agent has no key for the workload");
            }
            if let Flow::Pass(bytes) = self.feed(&raw) {
                self.release(&bytes);
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
            let expires = w.expires();
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

/// What became of the bytes of one read.
enum Flow {
    /// These go on to the connection manager.
    Pass(Vec<u8>),
    /// Held (a decision or the workload's key is awaited) or dropped (closed).
    Hold,
}

impl Inbound {
    /// Runs bytes from the peer through the stream and the gate.
    fn feed(&mut self, data: &[u8]) -> Flow {
        if let Gate::Keyless { raw, .. } = &mut self.gate {
            raw.extend_from_slice(data);
            return Flow::Hold;
        }
        if matches!(self.gate, Gate::Closed) {
            return Flow::Hold;
        }
        let identity = self.worker.borrow().identity.clone();
        let Some(identity) = identity else {
            // Just started: fetch the key for this connection and hold its bytes.
            let call = call_agent_for_key(self, &self.worker.borrow().config);
            match call {
                Some(call) => {
                    self.gate = Gate::Keyless {
                        call,
                        raw: data.to_vec(),
                    }
                }
                None => self.close("no_identity", "the workload's key cannot be fetched"),
            }
            return Flow::Hold;
        };
        let result = {
            let w = self.worker.borrow();
            self.stream
                .from_peer(data, &identity, &HandshakeConfig::default(), &w.rng)
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
                    self.held.extend_from_slice(&out.to_app);
                    Flow::Hold
                }
            }
            Gate::Verifying { .. } => {
                self.held.extend_from_slice(&out.to_app);
                Flow::Hold
            }
            Gate::Keyless { .. } | Gate::Closed => Flow::Hold,
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
        if end_of_stream && self.stream.is_mid_message() && !matches!(self.gate, Gate::Closed) {
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
        if peer == PeerType::Remote
            && self.stream.is_mid_message()
            && !matches!(self.gate, Gate::Closed)
        {
            self.worker.borrow().metrics.count("refused.truncated");
            warn!("themis inbound: the peer's stream ended inside a message (truncated)");
            self.gate = Gate::Closed;
        }
    }
}

impl Drop for Inbound {
    fn drop(&mut self) {
        self.worker.borrow().metrics.gauge("active", -1);
    }
}
