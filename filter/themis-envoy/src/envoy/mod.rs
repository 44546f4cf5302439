//! The proxy-wasm driver: Envoy's callbacks in, bytes and calls out. Every decision is
//! made by the sans-IO parts ([`themis_sidecar::route`], [`themis_sidecar::policy`],
//! [`themis_core::stream`]); these modules only move bytes between them and Envoy.
//!
//! * [`outbound`]: HTTP filter on the app-facing listener (pick an instance).
//! * [`seal`]: network filter of the internal listener (initiator: seal the stream).
//! * [`inbound`]: network filter on the peer-facing listener (responder: open it).

mod inbound;
mod outbound;
mod seal;

use std::cell::{Cell, RefCell};
use std::collections::{BTreeMap, HashMap};
use std::rc::Rc;
use std::time::{Duration, UNIX_EPOCH};

use log::{error, info, warn};
use proxy_wasm::hostcalls;
use proxy_wasm::traits::{Context, HttpContext, RootContext, StreamContext};
use proxy_wasm::types::{ContextType, LogLevel, MetricType};
use ring::rand::SystemRandom;
use themis_core::delegation::{Credential, HandshakeSigner};
use themis_core::handshake::ToSign;
use themis_core::identity::PublicIdentity;
use themis_core::wire::Kind;
use themis_trust::{Revocations, Verifier};

use themis_sidecar::agent::{self, Instance};
use themis_sidecar::config::{Config, Policy, Role, Transport};
use themis_sidecar::conn::callee::Gates;
use themis_sidecar::conn::deadline::Deadline;
use themis_sidecar::conn::{Ask, Close};
use themis_sidecar::policy::Callers;
use themis_sidecar::reason::Reason;
use themis_sidecar::route::{kept_for, PickRandom, Routes};
use themis_sidecar::upkeep::{self, Lane, Learned, Upkeep};

proxy_wasm::main! {{
    proxy_wasm::set_log_level(LogLevel::Info);
    proxy_wasm::set_root_context(|_| Box::new(Root::default()));
}}

/// What one plugin's VM holds on one worker, shared by its root and stream contexts.
struct Worker {
    config: Config,
    /// The workload's public identity; its private key stays in the agent.
    identity: Option<Rc<PublicIdentity>>,
    /// A handshake key the agent delegated to this worker, with the workload's
    /// endorsement: handshakes are signed here and carry it. Without one (not yet, or
    /// an agent that cannot delegate), the agent signs each handshake message
    /// ([`call_agent_to_sign`]).
    credential: Option<Rc<Credential>>,
    /// The agent answered the first request for a delegation (granted or not): until
    /// then the worker does not count as ready (the `identity` gauge), so that a
    /// sidecar's first connections sign as all later ones do.
    delegation_answered: bool,
    /// Counted in the `identity` gauge: the identity is known and the delegation
    /// answered.
    ready: bool,
    /// Inbound: the source buckets, the freshness window and replay cache of
    /// message 1, and the handshake budget (per worker).
    gates: Gates,
    /// Outbound: resolutions and health marks.
    routes: Routes,
    /// Inbound: callers' services, verified.
    callers: Callers,
    /// Root-signed revocations, kept by the upkeep's revocations lane.
    revoked: Revocations,
    /// What is kept from the agent between connections, and when it is asked again.
    upkeep: Upkeep,
    /// Inbound: the connections whose caller is not allowed yet, by context id, with
    /// their deadline (`handshake_timeout`; the root closes them on a tick).
    handshaking: BTreeMap<u32, Deadline>,
    metrics: Metrics,
    rng: SystemRandom,
    /// Outbound: the picks' random numbers (no system draw per request).
    pick_random: Cell<PickRandom>,
    /// Unix ms at the root's last tick (0.1 s apart for the outbound role, which
    /// never loads an identity): the clock of the picks, which need no finer one,
    /// without a host call per request.
    tick_ms: u64,
    /// Outbound: the services being resolved, each by one agent call, with the
    /// requests waiting on it.
    resolving: HashMap<String, outbound::Resolving>,
}

type Shared = Rc<RefCell<Worker>>;

impl Worker {
    /// The delegated credential, while it is valid at `now`.
    fn credential(&self, now: u64) -> Option<Rc<Credential>> {
        self.credential
            .clone()
            .filter(|c| now < c.delegation().not_after_ms)
    }

    /// Takes the workload's public identity (from the agent's identity answer or a
    /// delegation).
    fn learn_identity(&mut self, identity: &PublicIdentity) {
        if self.identity.is_none() {
            info!(
                "themis: workload {} has id {}",
                self.config.workload,
                identity.printable_id()
            );
            self.identity = Some(Rc::new(identity.clone()));
        }
        self.count_if_ready();
    }

    /// Counts this worker in the `identity` gauge once it can sign its handshakes as
    /// it will from then on: the identity known and the delegation answered. Per
    /// VM: the sidecar is ready once the gauge equals the number of VMs (each worker's and
    /// the main thread's).
    fn count_if_ready(&mut self) {
        if !self.ready && self.identity.is_some() && self.delegation_answered {
            self.ready = true;
            self.metrics.gauge("identity", 1);
        }
    }

    /// A verifier for now, this mesh's root and the revocations in force.
    fn verifier(&self) -> Verifier<'_> {
        Verifier {
            root: &self.config.mesh_root,
            now_ms: now_ms(),
            revoked: &self.revoked,
        }
    }

    /// Reads an agent resolution of `service`: the instances whose records verified;
    /// the others are logged and counted (`not_endorsed`).
    fn verified_instances(
        &self,
        service: &str,
        status: Option<u16>,
        body: &[u8],
    ) -> Option<Vec<Instance>> {
        if status != Some(200) {
            return None;
        }
        let all = match agent::parse_instances(body, service, &self.verifier()) {
            Ok(all) => all,
            Err(e) => {
                warn!("themis: unusable resolution of {service}: {e}");
                return None;
            }
        };
        // The Wasm filter speaks the Themis channel alone.
        let (good, bad) = agent::endorsed(all, &[Transport::Themis], &self.config.mesh);
        for e in &bad {
            self.metrics.count("not_endorsed");
            warn!("themis: skipping an instance of {service}: {e}");
        }
        Some(good)
    }

    fn random(&self) -> u32 {
        let mut random = self.pick_random.get();
        let n = random.next_u32();
        self.pick_random.set(random);
        n
    }

    /// When a resolution made now expires (`route::kept_for`).
    fn expires(&self, empty: bool) -> u64 {
        now_ms() + kept_for(self.config.resolve_ttl, empty).as_millis() as u64
    }

    /// The connections still handshaking at their deadline, marked as passed it
    /// (Envoy may not carry the close out at once), each with its close.
    fn handshakes_past_deadline(&mut self, now: u64) -> Vec<(u32, Close)> {
        self.handshaking
            .iter_mut()
            .filter_map(|(id, deadline)| Some((*id, deadline.handle_timeout(now)?)))
            .collect()
    }
}

fn now_ms() -> u64 {
    hostcalls::get_current_time()
        .ok()
        .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
        .map_or(0, |d| d.as_millis() as u64)
}

/// Counters and gauges, `themis.<role>.<name>` (Envoy adds `wasmcustom.`), defined on
/// first use.
struct Metrics {
    role: &'static str,
    ids: RefCell<HashMap<String, u32>>,
    /// Outbound `requests` not yet given to Envoy: handed over on the tick, one host
    /// call a second instead of one a request.
    requests: Cell<u64>,
}

impl Metrics {
    fn new(role: Role) -> Self {
        Metrics {
            role: role.as_str(),
            ids: RefCell::default(),
            requests: Cell::new(0),
        }
    }

    fn id(&self, name: &str, kind: MetricType) -> Option<u32> {
        if let Some(&id) = self.ids.borrow().get(name) {
            return Some(id);
        }
        let id = hostcalls::define_metric(kind, &format!("themis.{}.{name}", self.role)).ok()?;
        self.ids.borrow_mut().insert(name.to_string(), id);
        Some(id)
    }

    fn count(&self, name: &str) {
        self.count_by(name, 1);
    }

    fn count_by(&self, name: &str, n: u64) {
        if let Some(id) = self.id(name, MetricType::Counter) {
            let _ = hostcalls::increment_metric(id, n.try_into().unwrap_or(i64::MAX));
        }
    }

    /// Counts an outbound request (given to Envoy on the next tick).
    fn count_request(&self) {
        self.requests.set(self.requests.get() + 1);
    }

    /// Gives Envoy what was counted since the last tick.
    fn flush(&self) {
        let requests = self.requests.replace(0);
        if requests > 0 {
            self.count_by("requests", requests);
        }
    }

    fn gauge(&self, name: &str, delta: i64) {
        if let Some(id) = self.id(name, MetricType::Gauge) {
            let _ = hostcalls::increment_metric(id, delta);
        }
    }
}

#[derive(Default)]
struct Root {
    worker: Option<Shared>,
    /// The resolutions this root asks for (of requests whose own call ended with
    /// them), by call token.
    resolve_calls: HashMap<u32, String>,
    /// The upkeep's calls in flight, by token.
    upkeep_calls: HashMap<u32, Lane>,
    /// Ticking once a second (the identity is known).
    slow_ticks: bool,
}

impl Root {
    /// Makes `lane`'s call to the agent if it is due.
    fn ask(&mut self, worker: &Shared, lane: Lane) {
        let now = now_ms();
        let mut w = worker.borrow_mut();
        let w = &mut *w;
        let Some(request) = w.upkeep.poll_request(lane, now, &w.rng) else {
            return;
        };
        let json = request.json.as_deref();
        match call_agent_with(self, &w.config, &request.path, json, request.timeout) {
            Some(token) => {
                self.upkeep_calls.insert(token, lane);
            }
            None => {
                let learned = w
                    .upkeep
                    .handle_answer(lane, None, b"Envoy refused the call", now);
                take_in(w, lane, learned);
            }
        }
    }

    /// Makes every lane's call that is due.
    fn keep_up(&mut self, worker: &Shared) {
        for lane in [Lane::Delegation, Lane::Identity, Lane::Revocations] {
            self.ask(worker, lane);
        }
        if !self.slow_ticks && worker.borrow().identity.is_some() {
            self.slow_ticks = true;
            self.set_tick_period(Duration::from_secs(1));
        }
    }
}

/// Acts on what the upkeep learned from one of `lane`'s answers.
fn take_in(w: &mut Worker, lane: Lane, learned: Learned) {
    if lane == Lane::Delegation {
        // Answered (granted or not): the worker may count as ready, the agent
        // signing each handshake until a delegation comes.
        w.delegation_answered = true;
    }
    match learned {
        Learned::Nothing => {}
        Learned::Identity(identity) => w.learn_identity(&identity),
        Learned::Credential {
            credential,
            renew_at,
            news,
        } => {
            w.learn_identity(credential.identity());
            // Logged when it starts and when its endorsement comes or goes (a caller
            // of no service is delegated a key again every few seconds).
            let level = match news {
                true => log::Level::Info,
                false => log::Level::Debug,
            };
            let line = upkeep::credential_line(&w.config.workload, &credential, renew_at);
            log::log!(level, "themis: {line}");
            w.credential = Some(Rc::new(*credential));
        }
        Learned::NoCredential { refused, why } => {
            if refused {
                // The workload revoked, or this proxy no longer its owner: the key
                // delegated before stops speaking for the workload here too.
                w.credential = None;
            }
            warn!("themis: {why}; it signs each handshake");
        }
        Learned::Revocations(list) => {
            let (read, proven) = (list.revocations.len(), list.proven);
            // A new revocation withdraws the instances it revokes from the cached
            // resolutions and drops the caller checks: the revoked key is not used
            // from a cache either. Merged: a revocation held is never taken back.
            w.revoked.merge(list.revocations);
            info!(
                "themis: {} revocation(s) in force ({read} read, {proven} of them proven by the trust log's checkpoint)",
                w.revoked.len()
            );
            let root = &w.config.mesh_root;
            let revoked = &w.revoked;
            w.routes.withdraw(|i| i.is_revoked(root, revoked));
            w.callers.clear();
        }
        Learned::Failed(why) => warn!("themis: {why}"),
    }
    w.count_if_ready();
}

impl Root {
    /// Asks again, as the root, for the resolutions whose asking request ended before
    /// the answer (its call ended with it), so that the requests waiting on them are
    /// answered.
    fn ask_for_orphaned_resolutions(&mut self, worker: &Shared) {
        let mut not_asked = Vec::new();
        for service in outbound::orphaned(worker) {
            let path = themis_contracts::paths::service(&service);
            let token = call_agent(self, &worker.borrow().config, &path);
            match token {
                Some(token) => {
                    self.resolve_calls.insert(token, service);
                }
                None => not_asked.push(service),
            }
        }
        // After every call: answering a waiter acts as its context.
        for service in not_asked {
            outbound::resolved(worker, &service, None, &[]);
        }
    }
}

impl Context for Root {
    fn on_done(&mut self) -> bool {
        if let Some(worker) = &self.worker {
            worker.borrow().metrics.flush();
        }
        true
    }

    fn on_http_call_response(&mut self, token: u32, _: usize, body_size: usize, _: usize) {
        let Some(worker) = self.worker.clone() else {
            return;
        };
        let (status, body) = call_response(self, body_size);
        if let Some(service) = self.resolve_calls.remove(&token) {
            outbound::resolved(&worker, &service, status, &body);
        } else if let Some(lane) = self.upkeep_calls.remove(&token) {
            let mut w = worker.borrow_mut();
            let learned = w.upkeep.handle_answer(lane, status, &body, now_ms());
            take_in(&mut w, lane, learned);
            drop(w);
            // Asked again at once where the lane says so (a long poll held, news).
            self.keep_up(&worker);
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
            "themis {} filter for workload {} in mesh {}: configured",
            config.role.as_str(),
            config.workload,
            config.mesh.as_str()
        );
        let metrics = Metrics::new(config.role);
        let rng = SystemRandom::new();
        if config.role == Role::Inbound {
            announce_policy(&config, &metrics);
        }
        let mut lanes = vec![Lane::Revocations];
        if config.role != Role::Outbound {
            lanes.push(Lane::Identity);
            if config.delegated_keys {
                lanes.push(Lane::Delegation);
            }
        }
        let upkeep = Upkeep::new(&config, &lanes);
        self.worker = Some(Rc::new(RefCell::new(Worker {
            // Kept keyless by configuration: the agent signs every message.
            delegation_answered: !upkeep.keeps(Lane::Delegation),
            upkeep,
            metrics,
            routes: Routes::new(config.canary.clone()),
            gates: Gates::new(&config),
            config,
            identity: None,
            credential: None,
            ready: false,
            callers: Callers::default(),
            revoked: Revocations::new(),
            handshaking: BTreeMap::new(),
            pick_random: Cell::new(PickRandom::seeded(&rng)),
            tick_ms: now_ms(),
            resolving: HashMap::new(),
            rng,
        })));
        // Quick ticks until the workload's identity is loaded, then one a second.
        self.set_tick_period(Duration::from_millis(100));
        true
    }

    fn on_tick(&mut self) {
        if let Some(worker) = self.worker.clone() {
            let worker = &worker;
            self.keep_up(worker);
            let mut w = worker.borrow_mut();
            let now = now_ms();
            w.tick_ms = now;
            if let Some(alarm) = w.upkeep.revocations_alarm(now) {
                match alarm.feed {
                    upkeep::Feed::Fresh => info!("themis: {alarm}"),
                    upkeep::Feed::Stale => warn!("themis: {alarm}"),
                    upkeep::Feed::Closed => error!("themis: {alarm}"),
                }
            }
            w.metrics.flush();
            w.routes.expire(now);
            w.callers.expire(now);
            let late = w.handshakes_past_deadline(now);
            drop(w);
            self.ask_for_orphaned_resolutions(worker);
            // Last in the tick: each close acts as that connection's context.
            for (context_id, close) in late {
                inbound::close_late(worker, context_id, &close);
            }
        }
    }

    fn create_http_context(&self, context_id: u32) -> Option<Box<dyn HttpContext>> {
        let worker = self.worker.clone()?;
        Some(Box::new(outbound::Outbound::new(worker, context_id)))
    }

    fn create_stream_context(&self, context_id: u32) -> Option<Box<dyn StreamContext>> {
        let worker = self.worker.clone()?;
        let role = worker.borrow().config.role;
        Some(match role {
            Role::Inbound => Box::new(inbound::Inbound::new(worker, context_id)),
            _ => Box::new(seal::Seal::new(worker)),
        })
    }

    fn get_type(&self) -> Option<ContextType> {
        let role = self.worker.as_ref()?.borrow().config.role;
        Some(match role {
            Role::Outbound => ContextType::HttpContext,
            Role::Seal | Role::Inbound => ContextType::StreamContext,
        })
    }
}

/// Says at start who the inbound side admits; the permissive choice loudly, and as
/// the gauge `themis.inbound.allow_any_caller` (1 per worker that admits anyone).
fn announce_policy(config: &Config, metrics: &Metrics) {
    let workload = &config.workload;
    match &config.policy {
        None => warn!(
            "themis inbound for workload {workload}: no policy configured, every caller is refused (no policy: deny by default)"
        ),
        Some(Policy::AnyCaller) => {
            warn!(
                "themis inbound for workload {workload}: policy allow_any_caller: EVERY authenticated member of mesh {} may call, unchecked by service or id",
                config.mesh.as_str()
            );
            metrics.gauge("allow_any_caller", 1);
        }
        Some(Policy::Allow(rules)) => info!(
            "themis inbound for workload {workload}: {} allow rule(s)",
            rules.len()
        ),
    }
}

/// A GET to the local agent's API; `None` (logged) if Envoy refuses the call.
fn call_agent(ctx: &dyn Context, config: &Config, path: &str) -> Option<u32> {
    call_agent_with(ctx, config, path, None, config.timeout)
}

/// A call to the local agent's API: a GET, or with a JSON body a POST, answered
/// within `timeout` (the configured one, or longer for a long poll).
fn call_agent_with(
    ctx: &dyn Context,
    config: &Config,
    path: &str,
    json: Option<&[u8]>,
    timeout: Duration,
) -> Option<u32> {
    let mut headers = vec![(":path", path), (":authority", "themis-agent")];
    match json {
        Some(_) => headers.extend([(":method", "POST"), ("content-type", "application/json")]),
        None => headers.push((":method", "GET")),
    }
    match ctx.dispatch_http_call(&config.agent_cluster, headers, json, vec![], timeout) {
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

/// Asks the agent for the workload's public identity (answered by
/// [`Upkeep::identity_answered`]).
fn call_agent_for_identity(ctx: &dyn Context, config: &Config) -> Option<u32> {
    call_agent(
        ctx,
        config,
        &themis_contracts::paths::workload_identity(&config.workload),
    )
}

/// Asks the agent to sign a handshake message of the workload's (`POST
/// /v1/workloads/{workload}/sign`); the answer goes to [`signature`]. `None` (logged)
/// if Envoy refuses the call.
fn call_agent_to_sign(ctx: &dyn Context, config: &Config, to_sign: &ToSign) -> Option<u32> {
    let path = themis_contracts::paths::workload_sign(&config.workload);
    let kind = match to_sign.kind {
        Kind::Hello => "hello",
        _ => "hello_reply",
    };
    let body = serde_json::to_string(&themis_contracts::api::SignRequest {
        kind: kind.to_owned(),
        body: hex::encode(&to_sign.body),
        hello_hash: to_sign.hello_hash.map(hex::encode),
    })
    .expect("serialises");
    call_agent_with(ctx, config, &path, Some(body.as_bytes()), config.timeout)
}

/// The signature in the agent's answer to [`call_agent_to_sign`], or the reason to
/// close the connection with (`sign_timeout`: the call hit `timeout_ms`;
/// `sign_failed`: anything else) and a detail for the log.
fn signature(status: Option<u16>, body: &[u8]) -> Result<[u8; 64], Close> {
    match status {
        Some(200) => {
            agent::parse_signature(body).map_err(|e| Close::new(Reason::SignFailed, e.to_string()))
        }
        // Envoy answers a call that ran out of time with its own 504.
        Some(504) => Err(Close::new(
            Reason::SignTimeout,
            "the agent did not sign in time",
        )),
        status => Err(Close::new(
            Reason::SignFailed,
            format!(
                "the agent did not sign (status {status:?}: {})",
                String::from_utf8_lossy(body)
            ),
        )),
    }
}

/// The status and body of the call that just answered.
/// An agent call a connection machine asked for, in flight.
enum Call {
    Identity,
    Sign,
    Resolve(String),
}

/// Makes the agent call a connection machine asks for: its token, or why it cannot
/// be made.
fn ask_agent(ctx: &dyn Context, worker: &Shared, ask: Ask) -> Result<(u32, Call), Close> {
    let w = worker.borrow();
    let config = &w.config;
    match ask {
        Ask::Identity => call_agent_for_identity(ctx, config)
            .map(|token| (token, Call::Identity))
            .ok_or_else(|| {
                Close::new(
                    Reason::NoIdentity,
                    "the workload's identity cannot be fetched",
                )
            }),
        Ask::Sign(to_sign) => {
            let call = call_agent_to_sign(ctx, config, &to_sign)
                .map(|token| (token, Call::Sign))
                .ok_or_else(|| Close::new(Reason::SignFailed, "the agent cannot be asked to sign"));
            if call.is_ok() {
                w.metrics.count("agent_signed");
            }
            call
        }
        Ask::Resolve(claim) => call_agent(ctx, config, &themis_contracts::paths::service(&claim))
            .map(|token| (token, Call::Resolve(claim)))
            .ok_or_else(|| Close::new(Reason::ResolveFailed, "the agent cannot be called")),
    }
}

/// What an agent call answered, taken in for the machine that asked.
enum Answer {
    /// The identity is installed (if the agent had one).
    Identity,
    Signature(Result<[u8; 64], Close>),
    /// The verified instances of a caller's claimed service are cached.
    Resolution,
}

/// Reads the answer to `call` and takes it in.
fn take_answer(ctx: &dyn Context, worker: &Shared, call: Call, body_size: usize) -> Answer {
    let (status, body) = call_response(ctx, body_size);
    match call {
        Call::Identity => {
            let mut w = worker.borrow_mut();
            let learned = w.upkeep.identity_answered(status, &body, now_ms());
            take_in(&mut w, Lane::Identity, learned);
            Answer::Identity
        }
        Call::Sign => Answer::Signature(signature(status, &body)),
        Call::Resolve(claim) => {
            let mut w = worker.borrow_mut();
            let ids: Vec<_> = w
                .verified_instances(&claim, status, &body)
                .unwrap_or_default()
                .iter()
                .map(|i| i.id)
                .collect();
            let expires = w.expires(ids.is_empty());
            w.callers.insert(claim, ids, expires);
            Answer::Resolution
        }
    }
}

fn call_response(ctx: &dyn Context, body_size: usize) -> (Option<u16>, Vec<u8>) {
    let status = ctx
        .get_http_call_response_header(":status")
        .and_then(|s| s.parse().ok());
    let body = ctx
        .get_http_call_response_body(0, body_size)
        .unwrap_or_default();
    (status, body)
}
