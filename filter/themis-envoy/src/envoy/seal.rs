//! The initiator: the network filter of the internal listener between Envoy's router
//! (downstream: the HTTP/2 codec of the connection pool) and `tcp_proxy` to the
//! instance (upstream). The router's first bytes are held while the key agreement
//! runs; message 1 replaces them, signed here with the worker's delegated key (and
//! carrying the workload's endorsement), or, without one, once the agent signed it;
//! message 3 and the held bytes leave through the read buffer retained by pausing (a
//! Wasm network filter cannot write toward the upstream otherwise).

use log::{info, warn};
use proxy_wasm::hostcalls;
use proxy_wasm::traits::{Context, StreamContext};
use proxy_wasm::types::{Action, PeerType};
use themis_core::stream::{self, Meta, Refusal, StreamInitiator};
use themis_core::{HandshakeConfig, PeerId};

use super::{
    call_agent_for_identity, call_agent_to_sign, call_response, now_ms, signature, Root, Shared,
};

/// The filter state key the router's `set_filter_state` puts the expected id in.
const EXPECTED_PEER: &str = "envoy.network.upstream_server_name";

enum State {
    /// Set up on the first bytes (needs the identity and the expected peer).
    New,
    /// The workload's public identity is being fetched (the sidecar just started);
    /// `held` waits.
    Keyless {
        call: u32,
        held: Vec<u8>,
    },
    /// Message 1 is made; the agent is signing it (the stream holds the app's bytes).
    Signing {
        call: u32,
        stream: StreamInitiator,
    },
    /// Message 1 went out.
    Handshaking(StreamInitiator),
    Open(StreamInitiator),
    Closed,
}

pub struct Seal {
    worker: Shared,
    state: State,
}

impl Seal {
    pub fn new(worker: Shared) -> Self {
        worker.borrow().metrics.count("connections");
        worker.borrow().metrics.gauge("active", 1);
        Seal {
            worker,
            state: State::New,
        }
    }

    fn close(&mut self, reason: &str, detail: &str) {
        self.worker
            .borrow()
            .metrics
            .count(&format!("refused.{reason}"));
        warn!("themis seal: closing the connection ({reason}): {detail}");
        self.state = State::Closed;
        self.close_downstream();
        self.close_upstream();
    }

    fn refused(&mut self, refusal: Refusal) {
        self.close(refusal.reason(), &refusal.to_string());
    }

    /// The id the router's pick says must answer.
    fn expected_peer() -> Option<PeerId> {
        let raw = hostcalls::get_property(vec!["filter_state", EXPECTED_PEER]).ok()??;
        let bytes: [u8; 32] = hex::decode(raw).ok()?.try_into().ok()?;
        Some(PeerId(bytes))
    }

    /// Starts the key agreement: message 1 signed with the delegated key, or, without
    /// one, waiting for the agent's signature.
    fn start(&mut self) -> Result<Started, (&'static str, String)> {
        let w = self.worker.borrow();
        let now = now_ms();
        let identity = w.identity.clone().ok_or((
            "no_identity",
            "the workload's identity is not loaded yet".to_string(),
        ))?;
        let peer = Self::expected_peer().ok_or((
            "no_peer",
            "the connection names no expected peer".to_string(),
        ))?;
        if w.revoked.contains(&peer) {
            return Err(("revoked", "the peer's id is revoked".to_string()));
        }
        let meta = Meta {
            service: w.config.service.clone(),
        };
        let config = HandshakeConfig::default();
        match w.credential(now) {
            Some(credential) => {
                StreamInitiator::start(&*credential, peer, meta, &config, now, &w.rng)
                    .map(|(stream, hello)| Started::Signed(stream, hello))
            }
            None => StreamInitiator::start_unsigned(&identity, peer, meta, &config, now, &w.rng)
                .map(Started::Unsigned),
        }
        .map_err(|e| ("handshake", e.to_string()))
    }
}

/// A key agreement just started.
enum Started {
    /// Message 1, signed here.
    Signed(StreamInitiator, Vec<u8>),
    /// Message 1 waits for the agent's signature.
    Unsigned(StreamInitiator),
}

impl Seal {
    /// The first bytes: they wait while message 1 is made (and the agent signs it,
    /// without a delegated key); message 1 then goes out in their place, and they
    /// wait for message 2. Returns message 1 if it is ready now.
    fn begin(&mut self, first: &[u8]) -> Option<Vec<u8>> {
        let started = match self.start() {
            Ok(started) => started,
            Err((reason, detail)) => {
                self.close(reason, &detail);
                return None;
            }
        };
        let (mut stream, hello) = match started {
            Started::Signed(stream, hello) => (stream, Some(hello)),
            Started::Unsigned(stream) => (stream, None),
        };
        if let Err(refusal) = stream.from_app(first) {
            self.refused(refusal);
            return None;
        }
        self.worker.borrow().metrics.count("handshakes");
        if let Some(hello) = hello {
            self.state = State::Handshaking(stream);
            return Some(hello);
        }
        let call = stream
            .to_sign()
            .and_then(|to_sign| call_agent_to_sign(self, &self.worker.borrow().config, &to_sign));
        match call {
            Some(call) => {
                self.worker.borrow().metrics.count("agent_signed");
                self.state = State::Signing { call, stream };
            }
            None => self.close("sign_failed", "the agent cannot be asked to sign"),
        }
        None
    }

    /// Sends message 1 through the read buffer Envoy kept for this filter when it
    /// paused. Also from within `on_downstream_data` (signed here): the host carries
    /// the resume out once the callback has returned `Pause`.
    fn send_hello(&mut self, hello: &[u8]) {
        self.set_downstream_data(0, 0, hello);
        self.resume_downstream();
    }

    /// The agent's signature: message 1 goes out through the read buffer Envoy kept
    /// for this filter when it paused.
    fn signed(&mut self, mut stream: StreamInitiator, status: Option<u16>, body: &[u8]) {
        let hello = match signature(status, body) {
            Ok(signature) => stream.signed(&signature),
            Err((reason, detail)) => return self.close(reason, &detail),
        };
        match hello {
            Ok(hello) => {
                self.state = State::Handshaking(stream);
                self.send_hello(&hello);
            }
            // A signature that does not verify under our own key: the agent is
            // confused or lying; nothing was sent.
            Err(refusal) => self.close("sign_failed", &refusal.to_string()),
        }
    }
}

impl Context for Seal {
    fn on_http_call_response(&mut self, token: u32, _: usize, body_size: usize, _: usize) {
        match std::mem::replace(&mut self.state, State::Closed) {
            State::Keyless { call, held } if call == token => {
                let (status, body) = call_response(self, body_size);
                Root::install_identity(&self.worker, status, &body);
                if let Some(hello) = self.begin(&held) {
                    self.send_hello(&hello);
                }
            }
            State::Signing { call, stream } if call == token => {
                let (status, body) = call_response(self, body_size);
                self.signed(stream, status, &body);
            }
            other => self.state = other,
        }
    }
}

impl StreamContext for Seal {
    fn on_downstream_data(&mut self, size: usize, _end_of_stream: bool) -> Action {
        let data = self.get_downstream_data(0, size).unwrap_or_default();
        match std::mem::replace(&mut self.state, State::Closed) {
            State::New if self.worker.borrow().identity.is_none() => {
                // Just started: fetch the identity for this connection, hold its bytes.
                let call = call_agent_for_identity(self, &self.worker.borrow().config);
                self.set_downstream_data(0, size, &[]);
                match call {
                    Some(call) => self.state = State::Keyless { call, held: data },
                    None => self.close("no_identity", "the workload's identity cannot be fetched"),
                }
                Action::Pause
            }
            State::New => {
                // Paused, Envoy keeps the read buffer for this filter (message 3 and
                // the held bytes leave through it later); message 1 goes out through
                // it too, at once when signed here, else once the agent signed it.
                self.set_downstream_data(0, size, &[]);
                if let Some(hello) = self.begin(&data) {
                    self.send_hello(&hello);
                }
                Action::Pause
            }
            State::Keyless { call, mut held } => {
                self.set_downstream_data(0, size, &[]);
                // Bounded as the stream bounds what it holds.
                match stream::hold(&mut held, &data) {
                    Ok(()) => self.state = State::Keyless { call, held },
                    Err(refusal) => self.refused(refusal),
                }
                Action::Pause
            }
            State::Signing { call, mut stream } => {
                self.set_downstream_data(0, size, &[]);
                match stream.from_app(&data) {
                    Ok(_) => self.state = State::Signing { call, stream },
                    Err(refusal) => self.refused(refusal),
                }
                Action::Pause
            }
            State::Handshaking(mut stream) => {
                self.set_downstream_data(0, size, &[]);
                match stream.from_app(&data) {
                    Ok(_) => self.state = State::Handshaking(stream),
                    Err(refusal) => self.refused(refusal),
                }
                Action::Pause
            }
            State::Open(stream)
                if stream
                    .peer_id()
                    .is_some_and(|p| self.worker.borrow().revoked.contains(&p)) =>
            {
                // A revocation ends open connections too, at their next bytes.
                self.set_downstream_data(0, size, &[]);
                self.close("revoked", "the peer's id was revoked");
                Action::Pause
            }
            State::Open(mut stream) => match stream.from_app(&data) {
                Ok(sealed) => {
                    self.set_downstream_data(0, size, &sealed);
                    self.state = State::Open(stream);
                    Action::Continue
                }
                Err(refusal) => {
                    self.set_downstream_data(0, size, &[]);
                    self.refused(refusal);
                    Action::Pause
                }
            },
            State::Closed => {
                self.set_downstream_data(0, size, &[]);
                Action::Pause
            }
        }
    }

    fn on_upstream_data(&mut self, size: usize, end_of_stream: bool) -> Action {
        let data = self.get_upstream_data(0, size).unwrap_or_default();
        let mut stream = match std::mem::replace(&mut self.state, State::Closed) {
            State::Handshaking(stream) | State::Open(stream) => stream,
            State::New | State::Keyless { .. } | State::Signing { .. } | State::Closed => {
                self.set_upstream_data(0, size, &[]);
                self.close("out_of_turn", "the peer spoke first");
                return Action::Continue;
            }
        };
        // A revoked peer that only sends (a stream to our app, no more requests) is
        // cut at its next bytes too, not only at the app's.
        if stream
            .peer_id()
            .is_some_and(|p| self.worker.borrow().revoked.contains(&p))
        {
            self.set_upstream_data(0, size, &[]);
            self.close("revoked", "the peer's id was revoked");
            return Action::Continue;
        }
        let was_open = stream.is_open();
        match stream.from_peer(&data) {
            Ok(_) if end_of_stream && stream.is_mid_message() => {
                // Cut inside a record: nothing of it was delivered; say so.
                self.set_upstream_data(0, size, &[]);
                self.close("truncated", "the peer's stream ends inside a message");
                return Action::Continue;
            }
            Ok(out) => {
                self.set_upstream_data(0, size, &out.to_app);
                if !out.to_peer.is_empty() {
                    // Message 3 and the held bytes, through the retained read buffer.
                    self.set_downstream_data(0, 0, &out.to_peer);
                    self.resume_downstream();
                }
                if !was_open && stream.is_open() {
                    info!(
                        "themis seal: session with {}",
                        hex::encode(stream.peer_id().map(|p| p.0).unwrap_or_default())
                    );
                    self.worker.borrow().metrics.count("established");
                }
                self.state = match stream.is_open() {
                    true => State::Open(stream),
                    false => State::Handshaking(stream),
                };
            }
            Err(refusal) => {
                self.set_upstream_data(0, size, &[]);
                self.refused(refusal);
            }
        }
        Action::Continue
    }

    fn on_downstream_close(&mut self, _: PeerType) {}
}

impl Drop for Seal {
    fn drop(&mut self) {
        self.worker.borrow().metrics.gauge("active", -1);
    }
}
