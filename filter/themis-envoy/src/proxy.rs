//! The proxy-wasm driver: Envoy's callbacks in, calls out. Both roles answer every
//! request locally (`send_http_response`) after calling out with
//! `dispatch_http_call`: the outbound role to the agent and to the peer's inbound
//! listener (through an `ORIGINAL_DST` cluster routed by header), the inbound role to
//! the agent and to the local app. Nothing of a request reaches Envoy's router, so
//! nothing unsealed can leave by accident: the filter fails closed.

use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;
use std::time::{Duration, UNIX_EPOCH};

use log::{error, info, warn};
use proxy_wasm::hostcalls;
use proxy_wasm::traits::{Context, HttpContext, RootContext};
use proxy_wasm::types::{Action, ContextType, LogLevel, MetricType};
use ring::rand::{SecureRandom, SystemRandom};
use themis_core::handshake::{AwaitingHelloReply, Initiator};
use themis_core::{Identity, PeerId};

use crate::agent::{self, Instance};
use crate::config::{is_name, Config, Role};
use crate::envelope::{self, is_forwarded};
use crate::inbound::{self, CasConflict, InboundSessions, Reject, SharedStore};
use crate::outbound::{attempt_order, PeerSession, Peers, SharedSession};
use crate::protocol::{self, header, path, CONTENT_TYPE};
use themis_trust::{Revocations, Verifier};

proxy_wasm::main! {{
    proxy_wasm::set_log_level(LogLevel::Info);
    proxy_wasm::set_root_context(|_| Box::new(Root::default()));
}}

/// What one worker's VM holds, shared by its root and request contexts (one thread).
struct Worker {
    config: Config,
    identity: Option<Identity>,
    peers: Peers,
    inbound: InboundSessions,
    /// Inbound: services verified through the agent, with their instances' ids.
    callers: HashMap<String, (Vec<PeerId>, u64)>,
    /// Root-signed revocations, fetched from the agent every `revocation_poll`.
    revoked: Revocations,
    metrics: Metrics,
    rng: SystemRandom,
}

type Shared = Rc<RefCell<Worker>>;

impl Worker {
    /// The instances of `service` whose records verified; the others are logged and
    /// counted (`rejected.not_endorsed`).
    fn keep_endorsed(
        &self,
        service: &str,
        all: Vec<Result<Instance, agent::AgentError>>,
    ) -> Vec<Instance> {
        let (good, bad) = agent::endorsed(all);
        for error in &bad {
            self.metrics.count("rejected.not_endorsed");
            warn!("themis: skipping an instance of {service}: {error}");
        }
        good
    }

    /// A verifier for now, this mesh's root and the revocations in force.
    fn verifier(&self) -> Verifier<'_> {
        Verifier {
            root: &self.config.mesh_root,
            now_ms: now_ms(),
            revoked: &self.revoked,
        }
    }
}

fn now_ms() -> u64 {
    hostcalls::get_current_time()
        .ok()
        .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
        .map_or(0, |d| d.as_millis() as u64)
}

/// Envoy's shared data: per VM id, shared by every worker.
struct EnvoyStore;

impl SharedStore for EnvoyStore {
    fn get(&self, key: &str) -> Option<(Vec<u8>, u32)> {
        match hostcalls::get_shared_data(key) {
            Ok((Some(value), Some(cas))) if !value.is_empty() => Some((value, cas)),
            _ => None,
        }
    }

    fn set(&self, key: &str, value: &[u8], cas: Option<u32>) -> Result<(), CasConflict> {
        hostcalls::set_shared_data(key, Some(value), cas).map_err(|_| CasConflict)
    }
}

/// Counters and the sessions gauge, named `themis.<role>.<name>` in Envoy's stats.
struct Metrics {
    ids: HashMap<&'static str, u32>,
}

const COUNTERS: &[&str] = &[
    "requests",
    "handshakes",
    "sealed",
    "opened",
    "rejected.not_a_service",
    "rejected.no_identity",
    "rejected.resolve_failed",
    "rejected.no_instance",
    "rejected.peer_unreachable",
    "rejected.handshake_failed",
    "rejected.peer_rejected",
    "rejected.bad_response",
    "rejected.plaintext",
    "rejected.handshake",
    "rejected.unknown_session",
    "rejected.unconfirmed",
    "rejected.replay",
    "rejected.tampered",
    "rejected.contended",
    "rejected.malformed_envelope",
    "rejected.policy",
    "rejected.revoked",
    "rejected.not_endorsed",
];

impl Metrics {
    fn define(role: Role) -> Self {
        let role = match role {
            Role::Outbound => "outbound",
            Role::Inbound => "inbound",
        };
        let mut ids = HashMap::new();
        for &name in COUNTERS {
            if let Ok(id) =
                hostcalls::define_metric(MetricType::Counter, &format!("themis.{role}.{name}"))
            {
                ids.insert(name, id);
            }
        }
        if let Ok(id) =
            hostcalls::define_metric(MetricType::Gauge, &format!("themis.{role}.sessions"))
        {
            ids.insert("sessions", id);
        }
        Metrics { ids }
    }

    fn add(&self, name: &str, delta: i64) {
        if let Some(&id) = self.ids.get(name) {
            let _ = hostcalls::increment_metric(id, delta);
        }
    }

    fn count(&self, name: &str) {
        self.add(name, 1);
    }
}

#[derive(Default)]
struct Root {
    worker: Option<Shared>,
    key_call: Option<u32>,
    revocations_call: Option<u32>,
    /// When the revocations were last asked for (ms).
    revocations_asked: u64,
}

impl Root {
    fn fetch_key(&mut self) {
        let Some(worker) = &self.worker else { return };
        if self.key_call.is_some() || worker.borrow().identity.is_some() {
            return;
        }
        self.key_call = dispatch_key_request(self, &worker.borrow().config);
    }

    /// Asks the agent for the revocations it knows, every `revocation_poll`.
    fn poll_revocations(&mut self) {
        let Some(worker) = &self.worker else { return };
        let now = now_ms();
        let every = worker.borrow().config.revocation_poll.as_millis() as u64;
        if self.revocations_call.is_some() || now < self.revocations_asked + every {
            return;
        }
        self.revocations_asked = now;
        self.revocations_call = call_agent(self, &worker.borrow().config, "/v1/revocations");
    }

    /// Installs a fresh revocation list; a new revocation drops cached resolutions
    /// and caller checks, so the revoked key is not used from a cache either.
    fn install_revocations(worker: &Shared, status: Option<u16>, body: &[u8]) {
        let mut w = worker.borrow_mut();
        let parsed = match status {
            Some(200) => agent::parse_revocations(body, &w.config.mesh_root),
            _ => return,
        };
        match parsed {
            Ok(revocations) => {
                if revocations.len() != w.revoked.len() {
                    info!("themis: {} revocation(s) in force", revocations.len());
                    w.peers.forget_resolutions();
                    w.callers.clear();
                }
                w.revoked = revocations;
            }
            Err(e) => warn!("themis: unusable revocations from the agent: {e}"),
        }
    }
}

impl Context for Root {
    fn on_http_call_response(&mut self, token: u32, _: usize, body_size: usize, _: usize) {
        let Some(worker) = self.worker.clone() else {
            return;
        };
        if self.key_call == Some(token) {
            self.key_call = None;
            let (status, body) = call_response(self, body_size);
            install_key(&worker, status, &body);
        } else if self.revocations_call == Some(token) {
            self.revocations_call = None;
            let (status, body) = call_response(self, body_size);
            Root::install_revocations(&worker, status, &body);
        }
    }
}

impl RootContext for Root {
    fn on_configure(&mut self, _: usize) -> bool {
        let bytes = self.get_plugin_configuration().unwrap_or_default();
        let config = match Config::parse(&bytes) {
            Ok(config) => config,
            Err(e) => {
                error!("{e}");
                return false;
            }
        };
        info!(
            "themis {:?} filter for workload {} in mesh {}: configured",
            config.role,
            config.workload,
            config.mesh.as_str()
        );
        let metrics = Metrics::define(config.role);
        self.worker = Some(Rc::new(RefCell::new(Worker {
            config,
            identity: None,
            peers: Peers::default(),
            inbound: InboundSessions::default(),
            callers: HashMap::new(),
            revoked: Revocations::new(),
            metrics,
            rng: SystemRandom::new(),
        })));
        self.set_tick_period(Duration::from_secs(1));
        true
    }

    fn on_tick(&mut self) {
        self.fetch_key();
        self.poll_revocations();
        if let Some(worker) = &self.worker {
            let mut w = worker.borrow_mut();
            let now = now_ms();
            let dropped = match w.config.role {
                Role::Outbound => w.peers.expire(now),
                Role::Inbound => w.inbound.expire(&EnvoyStore, now),
            };
            w.metrics.add("sessions", -(dropped as i64));
            w.callers.retain(|_, (_, expires)| *expires > now);
        }
    }

    fn create_http_context(&self, _: u32) -> Option<Box<dyn HttpContext>> {
        let worker = self.worker.clone()?;
        let role = worker.borrow().config.role;
        Some(match role {
            Role::Outbound => Box::new(Outbound::new(worker)),
            Role::Inbound => Box::new(Inbound::new(worker)),
        })
    }

    fn get_type(&self) -> Option<ContextType> {
        Some(ContextType::HttpContext)
    }
}

/// A GET to the local agent's API; `None` (logged) if Envoy refuses the call.
fn call_agent(ctx: &dyn Context, config: &Config, path: &str) -> Option<u32> {
    let headers = vec![
        (":method", "GET"),
        (":path", path),
        (":authority", "themis-agent"),
    ];
    match ctx.dispatch_http_call(&config.agent_cluster, headers, None, vec![], config.timeout) {
        Ok(token) => Some(token),
        Err(status) => {
            warn!(
                "themis: cannot call the agent cluster {}: {status:?}",
                config.agent_cluster
            );
            None
        }
    }
}

fn dispatch_key_request(ctx: &dyn Context, config: &Config) -> Option<u32> {
    call_agent(
        ctx,
        config,
        &format!("/v1/workloads/{}/key", config.workload),
    )
}

fn install_key(worker: &Shared, status: Option<u16>, body: &[u8]) -> bool {
    let mut w = worker.borrow_mut();
    if w.identity.is_some() {
        return true;
    }
    if status != Some(200) {
        warn!(
            "themis: the agent has no key for workload {} (status {status:?}: {})",
            w.config.workload,
            String::from_utf8_lossy(body)
        );
        return false;
    }
    match agent::parse_identity(body, &w.config.workload, &w.config.mesh) {
        Ok(identity) => {
            info!(
                "themis: workload {} has id {}",
                w.config.workload,
                identity.printable_id()
            );
            w.identity = Some(identity);
            true
        }
        Err(e) => {
            error!("themis: {e}");
            false
        }
    }
}

/// The status and body of the call that just answered.
fn call_response(ctx: &dyn Context, body_size: usize) -> (Option<u16>, Vec<u8>) {
    let status = ctx
        .get_http_call_response_header(":status")
        .and_then(|s| s.parse().ok());
    let body = ctx
        .get_http_call_response_body(0, body_size)
        .unwrap_or_default();
    (status, body)
}

/// Whether a call's answer came from a Themis filter (and not from Envoy about a
/// connection that failed).
fn is_themis(ctx: &dyn Context) -> bool {
    ctx.get_http_call_response_header("content-type").as_deref() == Some(CONTENT_TYPE)
}

/// A local reply that explains itself.
fn reply_error(ctx: &dyn HttpContext, status: u32, reason: &str, message: &str) {
    ctx.send_http_response(
        status,
        vec![("content-type", "text/plain"), (header::ERROR, reason)],
        Some(format!("themis: {message}\n").as_bytes()),
    );
}

// ---------------------------------------------------------------------------------
// Outbound
// ---------------------------------------------------------------------------------

enum OutboundStep {
    Collecting,
    Key,
    Resolve,
    Hello(AwaitingHelloReply),
    Send { seq: u64 },
    Done,
}

struct Outbound {
    worker: Shared,
    service: String,
    envelope: Vec<u8>,
    order: Vec<Instance>,
    attempt: usize,
    renewed: bool,
    /// The session the request was sealed with (the response opens with it).
    session: Option<SharedSession>,
    step: OutboundStep,
    call: Option<u32>,
}

impl Outbound {
    fn new(worker: Shared) -> Self {
        Outbound {
            worker,
            service: String::new(),
            envelope: Vec::new(),
            order: Vec::new(),
            attempt: 0,
            renewed: false,
            session: None,
            step: OutboundStep::Collecting,
            call: None,
        }
    }

    fn fail(&mut self, status: u32, metric: &str, message: &str) {
        self.worker.borrow().metrics.count(metric);
        let reason = metric.trim_start_matches("rejected.");
        warn!("themis outbound to {}: {message}", self.service);
        reply_error(self, status, reason, message);
        self.step = OutboundStep::Done;
    }

    fn begin(&mut self, body: &[u8]) {
        let headers = self.get_http_request_headers();
        let get = |name: &str| {
            headers
                .iter()
                .find(|(n, _)| n == name)
                .map_or("", |(_, v)| v.as_str())
        };
        let w = self.worker.borrow();
        self.envelope = envelope::Request::new(
            w.config.service.as_deref(),
            get(":method"),
            get(":path"),
            get(":authority"),
            &headers,
            body,
        )
        .encode();
        drop(w);
        self.advance();
    }

    /// Takes the next step towards sending the sealed request.
    fn advance(&mut self) {
        let now = now_ms();
        let (has_identity, cached) = {
            let w = self.worker.borrow();
            (
                w.identity.is_some(),
                w.peers.resolved(&self.service, now).map(<[_]>::to_vec),
            )
        };
        if !has_identity {
            let config = self.worker.borrow().config.clone();
            return match dispatch_key_request(self, &config) {
                Some(token) => self.wait(token, OutboundStep::Key),
                None => self.fail(
                    503,
                    "rejected.no_identity",
                    "the local agent is unreachable",
                ),
            };
        }
        if self.order.is_empty() && self.attempt == 0 {
            match cached {
                Some(instances) => self.order = attempt_order(&instances, self.random()),
                None => return self.resolve(),
            }
        }
        self.try_instance();
    }

    fn random(&self) -> u32 {
        let mut bytes = [0u8; 4];
        let _ = self.worker.borrow().rng.fill(&mut bytes);
        u32::from_le_bytes(bytes)
    }

    fn wait(&mut self, token: u32, step: OutboundStep) {
        self.call = Some(token);
        self.step = step;
    }

    fn resolve(&mut self) {
        let path = format!("/v1/services/{}", self.service);
        let token = call_agent(self, &self.worker.borrow().config, &path);
        match token {
            Some(token) => self.wait(token, OutboundStep::Resolve),
            None => self.fail(
                503,
                "rejected.resolve_failed",
                "the local agent is unreachable",
            ),
        }
    }

    fn try_instance(&mut self) {
        let Some(instance) = self.order.get(self.attempt).cloned() else {
            let tried = self.order.len();
            self.worker
                .borrow_mut()
                .peers
                .forget_resolution(&self.service);
            return self.fail(
                503,
                "rejected.peer_unreachable",
                &format!("no instance of {} answered ({tried} tried)", self.service),
            );
        };
        let now = now_ms();
        let live = self.worker.borrow_mut().peers.session(&instance.id, now);
        if let Some(session) = live {
            self.session = Some(session);
            return self.send(&instance);
        }
        let started = {
            let w = self.worker.borrow();
            let me = w.identity.as_ref().expect("checked in advance");
            Initiator::start(me, instance.id, &inbound::channel_config(), &w.rng)
        };
        match started {
            Ok((waiting, hello)) => match self.call_peer(&instance, path::HELLO, None, &hello) {
                Ok(token) => self.wait(token, OutboundStep::Hello(waiting)),
                Err(()) => self.next_instance(),
            },
            Err(e) => self.fail(
                500,
                "rejected.handshake_failed",
                &format!("cannot start a handshake: {e}"),
            ),
        }
    }

    fn next_instance(&mut self) {
        self.attempt += 1;
        self.renewed = false;
        self.try_instance();
    }

    fn call_peer(
        &self,
        instance: &Instance,
        path: &str,
        confirm: Option<&str>,
        body: &[u8],
    ) -> Result<u32, ()> {
        let (cluster, dst_header, timeout) = {
            let w = self.worker.borrow();
            (
                w.config.peer_cluster.clone(),
                w.config.destination_header.clone(),
                w.config.timeout,
            )
        };
        let destination = instance.endpoint.to_string();
        let mut headers = vec![
            (":method", "POST"),
            (":path", path),
            (":authority", "themis"),
            ("content-type", CONTENT_TYPE),
            (dst_header.as_str(), destination.as_str()),
        ];
        if let Some(confirm) = confirm {
            headers.push((header::CONFIRM, confirm));
        }
        self.dispatch_http_call(&cluster, headers, Some(body), vec![], timeout)
            .map_err(|e| warn!("themis: cannot call the peer cluster {cluster}: {e:?}"))
    }

    fn send(&mut self, instance: &Instance) {
        let session = self.session.clone().expect("set before sending");
        let sealed = {
            let mut peer = session.borrow_mut();
            let confirm = peer.confirm.as_ref().map(hex::encode);
            peer.session
                .seal(&self.envelope, None)
                .map(|(seq, record)| (seq, record, confirm))
        };
        match sealed {
            Ok((seq, record, confirm)) => {
                self.worker.borrow().metrics.count("sealed");
                match self.call_peer(instance, path::REQUEST, confirm.as_deref(), &record) {
                    Ok(token) => self.wait(token, OutboundStep::Send { seq }),
                    Err(()) => self.next_instance(),
                }
            }
            Err(e) => {
                // Too large, or the session used up: a fresh session cannot fix size.
                self.forget_session(&instance.id);
                self.fail(
                    413,
                    "rejected.bad_response",
                    &format!("cannot seal the request: {e}"),
                );
            }
        }
    }

    /// Drops the request's session from the worker's table (if it is still there).
    fn forget_session(&mut self, peer: &PeerId) {
        let Some(session) = self.session.take() else {
            return;
        };
        let mut w = self.worker.borrow_mut();
        let current = w.peers.session(peer, now_ms());
        if current.is_some_and(|c| Rc::ptr_eq(&c, &session)) && w.peers.remove(peer) {
            w.metrics.add("sessions", -1);
        }
    }

    fn on_hello_reply(&mut self, waiting: AwaitingHelloReply, status: Option<u16>, body: &[u8]) {
        let instance = self.order[self.attempt].clone();
        if status != Some(200) || !is_themis(self) {
            self.worker
                .borrow()
                .metrics
                .count("rejected.handshake_failed");
            warn!(
                "themis: handshake with {} failed (status {status:?})",
                instance.endpoint
            );
            return self.next_instance();
        }
        match waiting.read_hello_reply(body) {
            Ok((session, confirm)) => {
                let mut w = self.worker.borrow_mut();
                let renew_at_ms = now_ms() + w.config.session_ttl.as_millis() as u64;
                w.metrics.count("handshakes");
                let session = Rc::new(RefCell::new(PeerSession {
                    session,
                    confirm: Some(confirm),
                    renew_at_ms,
                }));
                if w.peers.insert(instance.id, session.clone()) {
                    w.metrics.add("sessions", 1);
                }
                drop(w);
                self.session = Some(session);
                self.send(&instance);
            }
            Err(e) => {
                // The peer at that address is not the instance the DHT names.
                self.worker
                    .borrow()
                    .metrics
                    .count("rejected.handshake_failed");
                warn!("themis: handshake with {} refused: {e}", instance.endpoint);
                self.next_instance();
            }
        }
    }

    fn on_response(&mut self, seq: u64, status: Option<u16>, mut body: Vec<u8>) {
        let instance = self.order[self.attempt].clone();
        if !is_themis(self) {
            self.worker
                .borrow()
                .metrics
                .count("rejected.peer_unreachable");
            warn!(
                "themis: {} did not answer (status {status:?})",
                instance.endpoint
            );
            return self.next_instance();
        }
        if status != Some(200) {
            let reason = self
                .get_http_call_response_header(header::REJECT)
                .unwrap_or_default();
            self.forget_session(&instance.id);
            if protocol::needs_new_session(&reason) && !self.renewed {
                self.renewed = true;
                return self.try_instance();
            }
            return self.fail(
                502,
                "rejected.peer_rejected",
                &format!(
                    "the instance at {} refused the request ({reason})",
                    instance.endpoint
                ),
            );
        }
        let opened = match &self.session {
            Some(session) => {
                let mut peer = session.borrow_mut();
                let opened = peer
                    .session
                    .open_in_place(&mut body)
                    .and_then(|o| o.expect_reply_to(seq).map(|()| o.payload.to_vec()));
                if opened.is_ok() {
                    peer.confirm = None;
                }
                opened.map_err(|e| e.to_string())
            }
            None => Err("no session".into()),
        };
        let payload = match opened {
            Ok(payload) => payload,
            Err(e) => {
                return self.fail(
                    502,
                    "rejected.bad_response",
                    &format!("the response was refused: {e}"),
                )
            }
        };
        let Ok(response) = envelope::Response::decode(&payload) else {
            return self.fail(
                502,
                "rejected.bad_response",
                "the response envelope is malformed",
            );
        };
        self.worker.borrow().metrics.count("opened");
        let peer_id = instance.id.printable(&self.worker.borrow().config.mesh);
        let mut headers: Vec<(&str, &str)> = response
            .headers
            .iter()
            .copied()
            .filter(|(n, _)| is_forwarded(n))
            .collect();
        headers.push((header::PEER_ID, &peer_id));
        headers.push((header::PEER_SERVICE, &self.service));
        self.send_http_response(u32::from(response.status), headers, Some(response.body));
        self.step = OutboundStep::Done;
    }
}

impl Context for Outbound {
    fn on_http_call_response(&mut self, token: u32, _: usize, body_size: usize, _: usize) {
        if self.call != Some(token) {
            return;
        }
        self.call = None;
        let (status, body) = call_response(self, body_size);
        match std::mem::replace(&mut self.step, OutboundStep::Done) {
            OutboundStep::Key => {
                if install_key(&self.worker, status, &body) {
                    self.advance();
                } else {
                    let workload = self.worker.borrow().config.workload.clone();
                    self.fail(
                        503,
                        "rejected.no_identity",
                        &format!("the local agent has no key for workload {workload}"),
                    );
                }
            }
            OutboundStep::Resolve => {
                let parsed = match status {
                    Some(200) => {
                        let w = self.worker.borrow();
                        agent::parse_instances(&body, &self.service, &w.verifier())
                            .map(|all| w.keep_endorsed(&self.service, all))
                            .map_err(|e| e.to_string())
                    }
                    _ => Err(format!(
                        "the agent could not resolve it (status {status:?}: {})",
                        String::from_utf8_lossy(&body).trim()
                    )),
                };
                match parsed {
                    Ok(instances) if instances.is_empty() => self.fail(
                        503,
                        "rejected.no_instance",
                        &format!("service {} has no instances", self.service),
                    ),
                    Ok(instances) => {
                        {
                            let mut w = self.worker.borrow_mut();
                            let expires = now_ms() + w.config.resolve_ttl.as_millis() as u64;
                            w.peers
                                .cache_resolution(&self.service, instances.clone(), expires);
                        }
                        self.order = attempt_order(&instances, self.random());
                        self.try_instance();
                    }
                    Err(e) => self.fail(503, "rejected.resolve_failed", &e),
                }
            }
            OutboundStep::Hello(waiting) => self.on_hello_reply(waiting, status, &body),
            OutboundStep::Send { seq } => self.on_response(seq, status, body),
            OutboundStep::Collecting | OutboundStep::Done => {}
        }
    }
}

impl HttpContext for Outbound {
    fn on_http_request_headers(&mut self, _: usize, end_of_stream: bool) -> Action {
        self.worker.borrow().metrics.count("requests");
        let authority = self
            .get_http_request_header(":authority")
            .unwrap_or_default();
        // The service is the host part; a port the app wrote is irrelevant.
        let host = authority
            .rsplit_once(':')
            .map_or(authority.as_str(), |(h, _)| h);
        if !is_name(host) {
            self.service = authority.clone();
            self.fail(
                400,
                "rejected.not_a_service",
                &format!("{authority:?} is not a mesh service name"),
            );
            return Action::Pause;
        }
        self.service = host.to_string();
        if end_of_stream {
            self.begin(&[]);
        }
        Action::Pause
    }

    fn on_http_request_body(&mut self, body_size: usize, end_of_stream: bool) -> Action {
        if end_of_stream && matches!(self.step, OutboundStep::Collecting) {
            let body = self.get_http_request_body(0, body_size).unwrap_or_default();
            self.begin(&body);
        }
        Action::Pause
    }
}

// ---------------------------------------------------------------------------------
// Inbound
// ---------------------------------------------------------------------------------

#[derive(Clone, Copy, PartialEq, Eq)]
enum Exchange {
    Hello,
    Request,
}

enum InboundStep {
    Collecting,
    Key,
    /// Waiting for the agent to list the claimed service's instances.
    Caller(Opened, String),
    App(Opened),
    Done,
}

/// A request that opened, on its way to the app.
struct Opened {
    session_id: u64,
    seq: u64,
    peer: PeerId,
    payload: Vec<u8>,
}

struct Inbound {
    worker: Shared,
    exchange: Exchange,
    confirm: Option<Vec<u8>>,
    body: Vec<u8>,
    step: InboundStep,
    call: Option<u32>,
}

impl Inbound {
    fn new(worker: Shared) -> Self {
        Inbound {
            worker,
            exchange: Exchange::Request,
            confirm: None,
            body: Vec::new(),
            step: InboundStep::Collecting,
            call: None,
        }
    }

    /// Refuses unsealed: the peer learns the class of failure, the log the reason.
    fn refuse(&mut self, status: u32, reason: &str, detail: &str) {
        self.worker
            .borrow()
            .metrics
            .count(&format!("rejected.{reason}"));
        warn!("themis inbound: refused ({reason}): {detail}");
        self.send_http_response(
            status,
            vec![("content-type", CONTENT_TYPE), (header::REJECT, reason)],
            Some(b"themis: rejected\n"),
        );
        self.step = InboundStep::Done;
    }

    fn process(&mut self) {
        if self.worker.borrow().identity.is_none() {
            let config = self.worker.borrow().config.clone();
            return match dispatch_key_request(self, &config) {
                Some(token) => {
                    self.call = Some(token);
                    self.step = InboundStep::Key;
                }
                None => self.refuse(503, "no_identity", "the local agent is unreachable"),
            };
        }
        match self.exchange {
            Exchange::Hello => self.hello(),
            Exchange::Request => self.open(),
        }
    }

    fn hello(&mut self) {
        let result = {
            let mut guard = self.worker.borrow_mut();
            let w = &mut *guard;
            let me = w.identity.as_ref().expect("checked in process");
            let ttl = w.config.session_ttl.as_millis() as u64 * 2;
            w.inbound
                .accept_hello(&EnvoyStore, me, &self.body, &w.rng, now_ms(), ttl)
        };
        if let Ok((peer, _)) = &result {
            if self.worker.borrow().revoked.contains(&peer.peer_id) {
                return self.refuse(403, "revoked", "the mesh root revoked this key");
            }
        }
        match result {
            Ok((peer, reply)) => {
                {
                    let w = self.worker.borrow();
                    w.metrics.count("handshakes");
                    w.metrics.add("sessions", 1);
                    info!(
                        "themis inbound: new session with {}",
                        peer.peer_id.printable(&peer.mesh)
                    );
                }
                self.send_http_response(200, vec![("content-type", CONTENT_TYPE)], Some(&reply));
                self.step = InboundStep::Done;
            }
            Err(e) => self.refuse(401, e.reason(), &e.to_string()),
        }
    }

    fn open(&mut self) {
        let result = self.worker.borrow_mut().inbound.open_request(
            &EnvoyStore,
            &self.body,
            self.confirm.as_deref(),
            now_ms(),
        );
        let opened = match result {
            Ok(opened) => opened,
            Err(e) => {
                let status = if e.needs_new_session() || matches!(e, Reject::Handshake(_)) {
                    401
                } else {
                    400
                };
                return self.refuse(status, e.reason(), &e.to_string());
            }
        };
        if self.worker.borrow().revoked.contains(&opened.peer.peer_id) {
            return self.refuse(403, "revoked", "the mesh root revoked this key");
        }
        self.worker.borrow().metrics.count("opened");
        let opened = Opened {
            session_id: opened.session_id,
            seq: opened.seq,
            peer: opened.peer.peer_id,
            payload: opened.payload,
        };
        let claim = match envelope::Request::decode(&opened.payload) {
            Ok(request) => request.caller_service.map(str::to_string),
            Err(e) => {
                self.worker
                    .borrow()
                    .metrics
                    .count("rejected.malformed_envelope");
                return self.answer_locally(&opened, 400, "malformed_envelope", &format!("{e}"));
            }
        };
        match claim {
            None => self.authorize(opened, None),
            Some(service) => {
                let now = now_ms();
                let known = self
                    .worker
                    .borrow()
                    .callers
                    .get(&service)
                    .filter(|(_, expires)| *expires > now)
                    .map(|(ids, _)| ids.contains(&opened.peer));
                match known {
                    Some(true) => self.authorize(opened, Some(service)),
                    Some(false) => self.authorize(opened, None),
                    None => self.verify_caller(opened, service),
                }
            }
        }
    }

    /// Asks the agent whether the peer is an instance of the service it claims.
    fn verify_caller(&mut self, opened: Opened, claim: String) {
        if !is_name(&claim) {
            return self.authorize(opened, None);
        }
        let path = format!("/v1/services/{claim}");
        let token = call_agent(self, &self.worker.borrow().config, &path);
        match token {
            Some(token) => {
                self.call = Some(token);
                self.step = InboundStep::Caller(opened, claim);
            }
            None => self.authorize(opened, None),
        }
    }

    fn on_caller_verified(
        &mut self,
        opened: Opened,
        claim: String,
        status: Option<u16>,
        body: &[u8],
    ) {
        let member = {
            let mut w = self.worker.borrow_mut();
            let instances = match status {
                Some(200) => agent::parse_instances(body, &claim, &w.verifier())
                    .map(|all| w.keep_endorsed(&claim, all))
                    .unwrap_or_default(),
                _ => Vec::new(),
            };
            let ids: Vec<PeerId> = instances.iter().map(|i| i.id).collect();
            let member = ids.contains(&opened.peer);
            let expires = now_ms() + w.config.resolve_ttl.as_millis() as u64;
            w.callers.insert(claim.clone(), (ids, expires));
            member
        };
        self.authorize(opened, member.then_some(claim));
    }

    fn authorize(&mut self, opened: Opened, service: Option<String>) {
        let (allowed, peer_id, workload) = {
            let w = self.worker.borrow();
            let allowed = w
                .config
                .policy
                .as_ref()
                .is_none_or(|p| p.allows(&opened.peer, service.as_deref()));
            (
                allowed,
                opened.peer.printable(&w.config.mesh),
                w.config.workload.clone(),
            )
        };
        if !allowed {
            self.worker.borrow().metrics.count("rejected.policy");
            let who = match &service {
                Some(s) => format!("{peer_id} (service {s})"),
                None => format!("{peer_id} (no verified service)"),
            };
            return self.answer_locally(
                &opened,
                403,
                "policy",
                &format!("{who} is not allowed to call {workload}"),
            );
        }
        let request = envelope::Request::decode(&opened.payload).expect("decoded before");
        let mut headers: Vec<(&str, &str)> = vec![
            (":method", request.method),
            (":path", request.path),
            (":authority", request.authority),
        ];
        headers.extend(
            request
                .headers
                .iter()
                .copied()
                .filter(|(n, _)| is_forwarded(n)),
        );
        headers.push((header::PEER_ID, &peer_id));
        if let Some(service) = &service {
            headers.push((header::PEER_SERVICE, service));
        }
        let (cluster, timeout) = {
            let w = self.worker.borrow();
            (w.config.app_cluster.clone(), w.config.timeout)
        };
        let body = (!request.body.is_empty()).then_some(request.body);
        match self.dispatch_http_call(&cluster, headers, body, vec![], timeout) {
            Ok(token) => {
                self.call = Some(token);
                self.step = InboundStep::App(opened);
            }
            Err(e) => self.answer_locally(
                &opened,
                503,
                "app",
                &format!("cannot call the app cluster: {e:?}"),
            ),
        }
    }

    /// A sealed answer made by the filter itself (the peer can read and trust it).
    fn answer_locally(&mut self, opened: &Opened, status: u16, reason: &str, message: &str) {
        warn!("themis inbound: {message}");
        let body = format!("themis: {message}\n");
        let response = envelope::Response::local(
            status,
            vec![("content-type", "text/plain"), (header::ERROR, reason)],
            body.as_bytes(),
        );
        self.seal_and_send(opened, &response.encode());
    }

    fn seal_and_send(&mut self, opened: &Opened, payload: &[u8]) {
        let sealed =
            self.worker
                .borrow_mut()
                .inbound
                .seal_reply(opened.session_id, opened.seq, payload);
        match sealed {
            Ok(record) => {
                self.worker.borrow().metrics.count("sealed");
                self.send_http_response(200, vec![("content-type", CONTENT_TYPE)], Some(&record));
            }
            Err(e) => self.refuse(500, e.reason(), &e.to_string()),
        }
        self.step = InboundStep::Done;
    }

    fn on_app_response(&mut self, opened: Opened, status: Option<u16>, body: &[u8]) {
        let Some(status) = status else {
            return self.answer_locally(&opened, 502, "app", "the app did not answer");
        };
        let headers = self.get_http_call_response_headers();
        let response = envelope::Response::new(status, &headers, body);
        self.seal_and_send(&opened, &response.encode());
    }
}

impl Context for Inbound {
    fn on_http_call_response(&mut self, token: u32, _: usize, body_size: usize, _: usize) {
        if self.call != Some(token) {
            return;
        }
        self.call = None;
        let (status, body) = call_response(self, body_size);
        match std::mem::replace(&mut self.step, InboundStep::Done) {
            InboundStep::Key => {
                if install_key(&self.worker, status, &body) {
                    self.process();
                } else {
                    self.refuse(
                        503,
                        "no_identity",
                        "the local agent has no key for this workload",
                    );
                }
            }
            InboundStep::Caller(opened, claim) => {
                self.on_caller_verified(opened, claim, status, &body)
            }
            InboundStep::App(opened) => self.on_app_response(opened, status, &body),
            InboundStep::Collecting | InboundStep::Done => {}
        }
    }
}

impl HttpContext for Inbound {
    fn on_http_request_headers(&mut self, _: usize, end_of_stream: bool) -> Action {
        self.worker.borrow().metrics.count("requests");
        let method = self.get_http_request_header(":method").unwrap_or_default();
        let path = self.get_http_request_header(":path").unwrap_or_default();
        self.exchange = match (method.as_str(), path.as_str()) {
            ("POST", path::HELLO) => Exchange::Hello,
            ("POST", path::REQUEST) => Exchange::Request,
            _ => {
                self.refuse(
                    401,
                    "plaintext",
                    &format!("{method} {path} is not a Themis exchange; this listener takes sealed requests only"),
                );
                return Action::Pause;
            }
        };
        if let Some(confirm) = self.get_http_request_header(header::CONFIRM) {
            match hex::decode(confirm) {
                Ok(bytes) => self.confirm = Some(bytes),
                Err(_) => {
                    self.refuse(400, "tampered", "the key confirmation is not hex");
                    return Action::Pause;
                }
            }
        }
        if end_of_stream {
            self.process();
        }
        Action::Pause
    }

    fn on_http_request_body(&mut self, body_size: usize, end_of_stream: bool) -> Action {
        if end_of_stream && matches!(self.step, InboundStep::Collecting) {
            self.body = self.get_http_request_body(0, body_size).unwrap_or_default();
            self.process();
        }
        Action::Pause
    }
}
