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

use super::{call_agent, call_response, now_ms, Shared};
use crate::policy::{decide, Verdict};

enum Gate {
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
            // Release what was held into the read buffer kept by pausing.
            let held = std::mem::take(&mut self.held);
            self.set_downstream_data(0, 0, &held);
            self.resume_downstream();
        }
    }
}

impl StreamContext for Inbound {
    fn on_downstream_data(&mut self, size: usize, _end_of_stream: bool) -> Action {
        let data = self.get_downstream_data(0, size).unwrap_or_default();
        if matches!(self.gate, Gate::Closed) {
            self.set_downstream_data(0, size, &[]);
            return Action::Pause;
        }
        let identity = self.worker.borrow().identity.clone();
        let Some(identity) = identity else {
            self.set_downstream_data(0, size, &[]);
            self.close("no_identity", "the workload's key is not loaded yet");
            return Action::Pause;
        };
        let result = {
            let w = self.worker.borrow();
            self.stream
                .from_peer(&data, &identity, &HandshakeConfig::default(), &w.rng)
        };
        let out = match result {
            Ok(out) => out,
            Err(refusal) => {
                self.set_downstream_data(0, size, &[]);
                self.close(refusal.reason(), &refusal.to_string());
                return Action::Pause;
            }
        };
        match &self.gate {
            Gate::Allowed => {
                // A revocation ends open connections too, at their next bytes.
                let revoked = self.stream.established().is_some_and(|e| self.worker.borrow().revoked.contains(&e.peer_id));
                if revoked {
                    self.set_downstream_data(0, size, &[]);
                    self.close("revoked", "the caller's id was revoked");
                    return Action::Pause;
                }
                self.set_downstream_data(0, size, &out.to_app);
                Action::Continue
            }
            Gate::Unknown => {
                let Some(established) = self.stream.established().cloned() else {
                    // Before message 3 the only bytes for the app are our preface.
                    self.set_downstream_data(0, size, &out.to_app);
                    return Action::Continue;
                };
                if !self.counted {
                    self.counted = true;
                    self.worker.borrow().metrics.count("established");
                }
                if self.authorize(&established) {
                    self.set_downstream_data(0, size, &out.to_app);
                    Action::Continue
                } else {
                    self.held.extend_from_slice(&out.to_app);
                    self.set_downstream_data(0, size, &[]);
                    Action::Pause
                }
            }
            Gate::Verifying { .. } => {
                self.held.extend_from_slice(&out.to_app);
                self.set_downstream_data(0, size, &[]);
                Action::Pause
            }
            Gate::Closed => {
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

    fn on_downstream_close(&mut self, _: PeerType) {}
}

impl Drop for Inbound {
    fn drop(&mut self) {
        self.worker.borrow().metrics.gauge("active", -1);
    }
}
