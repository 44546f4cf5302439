//! The transport sockets: the Themis stream between the raw socket and Envoy, the way
//! TLS sits there. Inbound (a listener's socket) is the responder and lets no byte
//! of the caller's reach the connection manager before the caller is proven and
//! allowed; outbound (a sealing cluster's socket) is the initiator and tells Envoy
//! the connection is up only once the peer has proved it is an endorsed instance of
//! the cluster's service at the address connected to.
//!
//! The stream itself is `themis_core::stream` (the same machine as the Wasm filter's,
//! so the two runtimes share one wire); this file moves bytes and decides.

use std::cell::RefCell;
use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::sync::Arc;

use ring::rand::SystemRandom;
use themis_core::stream::Meta;
use themis_core::{Carries, HandshakeConfig, HandshakeSigner, PeerId, StreamOptions};
use themis_sidecar::config::{Config, Policy, Role};
use themis_sidecar::conn::callee::{self, Callee, Gates};
use themis_sidecar::conn::caller::{Caller, Start};
use themis_sidecar::conn::deadline::Deadline;
use themis_sidecar::conn::{Close, Event, Step};
use themis_sidecar::reason::Reason;
use themis_sidecar::upkeep::revocations_stale;
use themis_trust::Verifier;

use crate::metrics;
use crate::runtime::{now_ms, Runtime, Snapshot};

/// What a socket asks of Envoy (the FFI implements it on Envoy's socket).
pub trait Io {
    /// Reads from the socket.
    fn read(&mut self, buf: &mut [u8]) -> (IoStatus, usize);
    /// Writes to the socket; may write part.
    fn write(&mut self, data: &[u8]) -> (IoStatus, usize);
    fn shutdown_write(&mut self);
    /// Hands plaintext to Envoy's read buffer (inside `do_read` only).
    fn deliver(&mut self, plaintext: &[u8]);
    /// Gives the write buffer's slices to `take` until it returns false, then drains
    /// the slices it was given; returns their length.
    fn with_write_buffer(&mut self, take: &mut dyn FnMut(&[u8]) -> bool) -> usize;
    /// Raises `Connected`.
    fn connected(&mut self);
    /// Schedules a `do_read` (which closes a failed connection).
    fn wake(&mut self);
    /// True if Envoy's read buffer is full: reading stops and resumes later.
    fn should_yield_reads(&mut self) -> bool;
    fn remote(&mut self) -> Option<SocketAddr>;
    fn connection_id(&mut self) -> Option<u64>;
}

/// The outcome of one socket call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IoStatus {
    Done,
    Again,
    Failed,
}

/// What `do_read`/`do_write` report to Envoy.
pub struct Outcome {
    pub close: bool,
    pub bytes: usize,
    pub end_stream: bool,
}

impl Outcome {
    fn close() -> Self {
        Outcome {
            close: true,
            bytes: 0,
            end_stream: false,
        }
    }
}

/// Sealed bytes a connection keeps when the socket pushes back, at most: past it the
/// connection stops taking plaintext from Envoy until the socket drains.
const MAX_PENDING: usize = 256 * 1024;

/// Per worker: the inbound guards, and the peers proven on this worker's connections
/// by connection id: inbound for the network filter to hand to the connection manager,
/// upstream for the outbound HTTP filter to tell the app who answered (Envoy's pools
/// are per worker, so a request and its upstream connection share the thread).
#[derive(Default)]
struct Worker {
    gates: Option<Gates>,
    peers: HashMap<u64, ProvenPeer>,
    /// Callees whose signed message 2 said they take HTTP/1.1 as is (for the
    /// outbound HTTP filter, which runs on the same worker as its pool).
    takes_http1: HashSet<PeerId>,
}

/// Callees remembered as taking HTTP/1.1, per worker, at most: past it the set starts
/// again (an id is learnt anew on its next new HTTP/2 connection, which a long-lived
/// pooled one may delay: until then its HTTP/1.1 calls go over HTTP/2).
const MAX_TAKES_HTTP1: usize = 4096;

/// True if `peer` said, on a connection of this worker, that it takes HTTP/1.1 as is.
pub fn takes_http1(peer: &PeerId) -> bool {
    WORKER.with(|w| w.borrow().takes_http1.contains(peer))
}

/// Remembers what `peer` said of HTTP/1.1 in its last handshake on this worker.
fn learn_takes_http1(peer: PeerId, takes: bool) {
    WORKER.with(|w| {
        let set = &mut w.borrow_mut().takes_http1;
        if !takes {
            set.remove(&peer);
            return;
        }
        if !set.contains(&peer) && set.len() >= MAX_TAKES_HTTP1 {
            set.clear();
        }
        set.insert(peer);
    });
}

thread_local! {
    static WORKER: RefCell<Worker> = RefCell::new(Worker::default());
    /// The worker's read buffer, reused by every `do_read` (allocating and zeroing
    /// 64 KiB per read showed in the benchmark).
    static READ_BUFFER: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

/// Bytes read from the socket at a time.
const READ_CHUNK: usize = 64 * 1024;

/// The caller of one inbound connection, once allowed.
#[derive(Debug, Clone)]
pub struct ProvenPeer {
    pub id: String,
    pub service: Option<String>,
}

/// The peer proven on connection `id` of this worker, if any.
pub fn proven_peer(id: u64) -> Option<ProvenPeer> {
    WORKER.with(|w| w.borrow().peers.get(&id).cloned())
}

/// A transport socket configuration: one listener's or one cluster's.
pub struct Factory {
    config: Arc<Config>,
    runtime: Arc<Runtime>,
    handshake: HandshakeConfig,
}

impl Factory {
    /// `name` is `inbound` (a listener) or `outbound` (a sealing cluster); `config`
    /// the filter configuration JSON (the inbound or seal role).
    pub fn new(name: &[u8], config: &[u8], is_upstream: bool) -> Result<Factory, String> {
        let config = Config::parse(config).map_err(|e| e.to_string())?;
        match (name, is_upstream, config.role) {
            (b"inbound", false, Role::Inbound) => {
                if matches!(config.policy, Some(Policy::AnyCaller)) {
                    crate::ffi::log(3, "themis native: allow_any_caller: every member of the mesh may call");
                }
            }
            (b"outbound", true, Role::Seal) => {
                if config.peer_service.is_none() {
                    return Err("peer_service: a sealing cluster names the service it reaches".into());
                }
            }
            _ => {
                return Err(format!(
                    "transport_socket_name {:?} with role {}: use `inbound` (role inbound) on a listener and `outbound` (role seal, peer_service) on a cluster",
                    String::from_utf8_lossy(name),
                    config.role.as_str()
                ))
            }
        }
        let runtime = Runtime::of(&config)?;
        if let Some(service) = &config.peer_service {
            runtime.want(service);
        }
        // A caller that carries no endorsement (the Wasm runtime's) has its claim
        // checked against the services the policy names, resolved here.
        if let Some(Policy::Allow(rules)) = &config.policy {
            for rule in rules {
                if let themis_sidecar::config::Rule::Service(service) = rule {
                    runtime.want(service);
                }
            }
        }
        let handshake = handshake_for(&config);
        Ok(Factory {
            config: Arc::new(config),
            runtime,
            handshake,
        })
    }

    /// A new connection's socket.
    pub fn connection(&self) -> Connection {
        let side = match self.config.role {
            // Made again once attached, when the caller's address is known.
            Role::Inbound => Side::Inbound(Callee::new(b"", None)),
            _ => Side::Outbound(Caller::new()),
        };
        Connection {
            config: self.config.clone(),
            runtime: self.runtime.clone(),
            handshake: self.handshake.clone(),
            promised: None,
            side,
            pending: Vec::new(),
            peer: None,
            generation: 0,
            failure: None,
            id: None,
            remote: None,
            active: false,
            deadline: None,
            rng: SystemRandom::new(),
        }
    }
}

enum Side {
    Inbound(Callee),
    Outbound(Caller),
}

/// One connection's socket.
pub struct Connection {
    config: Arc<Config>,
    runtime: Arc<Runtime>,
    handshake: HandshakeConfig,
    /// Outbound: the id message 1 went to.
    promised: Option<PeerId>,
    side: Side,
    /// Sealed bytes the socket has not taken yet.
    pending: Vec<u8>,
    /// The proven peer, once the handshake (and, inbound, the policy) passed.
    peer: Option<PeerId>,
    /// The revocation generation the peer was last checked at.
    generation: u64,
    failure: Option<String>,
    id: Option<u64>,
    remote: Option<SocketAddr>,
    /// Counted in the role's `active` gauge (taken back when it closes).
    active: bool,
    /// Inbound, until the caller is allowed or refused: its handshake deadline.
    deadline: Option<Deadline>,
    rng: SystemRandom,
}

impl Drop for Connection {
    fn drop(&mut self) {
        self.closed(false);
    }
}

impl Connection {
    pub fn attached(&mut self, io: &mut dyn Io) {
        self.id = io.connection_id();
        self.remote = io.remote();
        if let Side::Inbound(callee) = &mut self.side {
            *callee = Callee::new(b"", self.remote.map(|r| r.ip()));
            self.deadline = Some(Deadline::starting(now_ms(), self.config.handshake_timeout));
        }
        let role = self.config.role.as_str();
        metrics::count(role, "connections");
        self.active = metrics::gauge(role, "active", 1);
    }

    /// True once the stream is open (Envoy may then flush and close).
    pub fn is_open(&self) -> bool {
        self.peer.is_some()
    }

    /// What the stream carries, for the inbound HCM's codec (`codec_type: AUTO` takes
    /// it as ALPN); a cluster's protocol is its configuration's.
    pub fn protocol(&self) -> &'static str {
        match &self.side {
            Side::Inbound(callee) => callee.carries().map_or("", Carries::name),
            Side::Outbound(_) => "",
        }
    }

    pub fn failure_reason(&self) -> &str {
        self.failure.as_deref().unwrap_or("")
    }

    /// The role's name, for counters and logs (`seal`, `inbound`).
    pub fn role(&self) -> &'static str {
        self.config.role.as_str()
    }

    /// Envoy closed the connection (`by_envoy`: on its own, not asked by a hook's
    /// answer). A caller still not allowed near its deadline was closed by the
    /// listener's `transport_socket_connect_timeout`: counted as the deadline's.
    pub fn closed(&mut self, by_envoy: bool) {
        let deadline = self.deadline.take().filter(|_| by_envoy);
        if let Some(close) = deadline.and_then(|mut d| d.closed_by_host(now_ms())) {
            self.fail(close);
        }
        if std::mem::take(&mut self.active) {
            metrics::gauge(self.config.role.as_str(), "active", -1);
        }
        if let Some(id) = self.id.take() {
            WORKER.with(|w| w.borrow_mut().peers.remove(&id));
        }
        // An HTTP/1.1 connection that never opened: the callee may no longer take it
        // (its sidecar changed runtime); the next calls go over HTTP/2 and ask again.
        // (`promised` is the id listed at the address when it started, the pick's
        // unless the resolution changed in between.)
        if self.handshake.carries == Carries::HTTP1 && self.peer.is_none() {
            if let Some(promised) = self.promised.take() {
                learn_takes_http1(promised, false);
            }
        }
    }

    fn fail(&mut self, Close { reason, detail }: Close) -> Outcome {
        self.deadline = None;
        let role = self.config.role.as_str();
        metrics::count(role, &reason.counter());
        crate::ffi::log(
            3,
            &format!(
                "themis native {role}: refused.{reason}: {detail} (from {})",
                self.remote.map_or("-".into(), |r| r.to_string())
            ),
        );
        self.failure = Some(format!("themis {reason}: {detail}"));
        Outcome::close()
    }

    /// Outbound: the TCP connection is up; message 1 goes to the one id the verified
    /// resolution lists at this address for the cluster's service.
    pub fn on_connected(&mut self, io: &mut dyn Io) {
        match self.side {
            // Raised once the caller is proven and allowed: until then the listener's
            // `transport_socket_connect_timeout` runs, so a caller that stalls inside
            // the handshake (or never starts it) is closed by Envoy.
            Side::Inbound(_) => {}
            Side::Outbound(_) => {
                if let Err(close) = self.start(io) {
                    self.fail(close);
                    // Nothing else would wake the connection (the pool waits for
                    // Connected): the next read closes it.
                    io.wake();
                }
            }
        }
    }

    fn start(&mut self, io: &mut dyn Io) -> Result<(), Close> {
        let remote = self
            .remote
            .or_else(|| io.remote())
            .ok_or_else(|| Close::new(Reason::Address, "no peer address"))?;
        self.remote = Some(remote);
        let service = self.config.peer_service.clone().unwrap_or_default();
        let snapshot = self.runtime.snapshot();
        let credential = snapshot
            .credential
            .clone()
            .ok_or_else(|| Close::new(Reason::NoIdentity, "no delegated key from the agent yet"))?;
        let peer =
            expected_peer(&snapshot, &service, remote).inspect_err(|_| self.runtime.refresh());
        let Side::Outbound(caller) = &mut self.side else {
            unreachable!("started on the outbound side")
        };
        self.promised = peer.as_ref().ok().copied();
        let step = caller.start(Start {
            now_ms: now_ms(),
            rng: &self.rng,
            handshake: &self.handshake,
            identity: Some(credential.identity()),
            signer: Some(&*credential),
            peer,
            meta: Meta {
                service: self.config.service.clone(),
            },
            revoked: &snapshot.revocations,
        });
        self.apply(step, None, io)?;
        self.flush(io)
            .map_err(|()| Close::new(Reason::Io, "writing message 1 failed"))?;
        Ok(())
    }

    /// Does what a connection machine asks: counts, bytes for the peer, and once the
    /// peer is proven (outbound) or allowed (inbound), the connection is up. It never
    /// asks the agent here (the delegated key signs; resolutions are kept ahead).
    /// `generation` is that of the revocations the peer was checked against.
    fn apply(
        &mut self,
        step: Step,
        generation: Option<u64>,
        io: &mut dyn Io,
    ) -> Result<Vec<u8>, Close> {
        let role = self.config.role.as_str();
        for event in &step.events {
            metrics::count(role, event.counter());
        }
        if let Some(close) = step.close {
            return Err(close);
        }
        if let Some(ask) = step.ask {
            let detail = format!("the native {role} cannot make {ask:?}");
            return Err(Close::new(Reason::Internal, detail));
        }
        // Before Connected is raised: Envoy may write (and so seal) at once, and
        // message 3 goes first.
        self.pending.extend_from_slice(&step.to_peer);
        let proven = step.events.into_iter().find_map(|event| match event {
            Event::Established(peer) if self.config.role == Role::Seal => {
                Some((peer, self.config.peer_service.clone()))
            }
            Event::Allowed { peer, service, .. } => Some((peer, service)),
            _ => None,
        });
        if let Some((peer, service)) = proven {
            if let Side::Outbound(caller) = &self.side {
                let agreed = caller.agreed().map(|a| a.options);
                learn_takes_http1(
                    peer,
                    agreed.is_some_and(|o| o.contains(StreamOptions::TAKES_HTTP1)),
                );
            }
            self.peer = Some(peer);
            self.deadline = None;
            self.generation = generation.unwrap_or_default();
            if let Some(id) = self.id {
                let proven = ProvenPeer {
                    id: peer.printable(&self.runtime.root.mesh),
                    service,
                };
                WORKER.with(|w| w.borrow_mut().peers.insert(id, proven));
            }
            io.connected();
        }
        Ok(step.to_app)
    }

    pub fn do_read(&mut self, io: &mut dyn Io) -> Outcome {
        if self.failure.is_some() {
            return Outcome::close();
        }
        if let Some(outcome) = self.recheck_revocation() {
            return outcome;
        }
        let mut buf = READ_BUFFER.with(|b| std::mem::take(&mut *b.borrow_mut()));
        buf.resize(READ_CHUNK, 0);
        let outcome = self.read_into(io, &mut buf);
        READ_BUFFER.with(|b| *b.borrow_mut() = buf);
        outcome
    }

    fn read_into(&mut self, io: &mut dyn Io, buf: &mut [u8]) -> Outcome {
        let mut delivered = 0;
        loop {
            let (status, n) = io.read(buf);
            match status {
                IoStatus::Again => break,
                IoStatus::Failed => return Outcome::close(),
                IoStatus::Done if n == 0 => {
                    // The peer ended inside a record: nothing of it was delivered
                    // (the Wasm filter's `refused.truncated`).
                    if self.ends_mid_message() {
                        return self.fail(Close::new(
                            Reason::Truncated,
                            "the peer's stream ended inside a message",
                        ));
                    }
                    return Outcome {
                        close: false,
                        bytes: delivered,
                        end_stream: true,
                    };
                }
                IoStatus::Done => {}
            }
            #[cfg(feature = "fault-injection")]
            crate::faults::maybe_panic(crate::faults::Point::DoRead(&buf[..n]));
            let plaintext = match self.open_from_peer(&buf[..n], io) {
                Ok(p) => p,
                Err(close) => return self.fail(close),
            };
            if !plaintext.is_empty() {
                io.deliver(&plaintext);
                delivered += plaintext.len();
            }
            if self.flush(io).is_err() {
                return Outcome::close();
            }
            if io.should_yield_reads() {
                break;
            }
        }
        Outcome {
            close: false,
            bytes: delivered,
            end_stream: false,
        }
    }

    fn ends_mid_message(&self) -> bool {
        match &self.side {
            Side::Inbound(callee) => callee.is_mid_message(),
            Side::Outbound(caller) => caller.is_mid_message(),
        }
    }

    /// The peer's bytes through the stream; returns the plaintext for Envoy.
    fn open_from_peer(&mut self, data: &[u8], io: &mut dyn Io) -> Result<Vec<u8>, Close> {
        let now = now_ms();
        // Envoy's listener closes a caller late to be allowed; should its timeout be
        // longer than the configuration's, the caller's next bytes find it late here.
        if let Some(close) = self.deadline.as_mut().and_then(|d| d.handle_timeout(now)) {
            return Err(close);
        }
        match &mut self.side {
            Side::Inbound(_) => self.open_inbound(data, now, io),
            Side::Outbound(caller) => {
                // The revocations the proven peer is checked against, once.
                let generation = std::cell::Cell::new(None);
                let runtime = &self.runtime;
                let step = caller.from_peer(data, &|peer| {
                    let snapshot = runtime.snapshot();
                    generation.set(Some(snapshot.revocation_generation));
                    snapshot.revocations.contains(peer)
                });
                self.apply(step, generation.get(), io)
            }
        }
    }

    /// Inbound: the caller's bytes through the callee's machine, which never asks
    /// the agent here (the delegated key signs; the runtime's resolutions answer).
    fn open_inbound(&mut self, data: &[u8], now: u64, io: &mut dyn Io) -> Result<Vec<u8>, Close> {
        let Side::Inbound(callee) = &mut self.side else {
            unreachable!("called for the inbound side")
        };
        let snapshot = self.runtime.snapshot();
        let credential = snapshot
            .credential
            .clone()
            .ok_or_else(|| Close::new(Reason::NoIdentity, "no delegated key from the agent yet"))?;
        let runtime = &self.runtime;
        // A caller that carries no endorsement (the Wasm runtime's before v3) has its
        // claim checked against the services the policy names, resolved ahead.
        let lists = |claim: &str, peer: &PeerId| {
            let listed = snapshot
                .resolutions
                .get(claim)
                .is_some_and(|all| all.iter().any(|i| i.id == *peer));
            if !listed {
                runtime.refresh();
            }
            Some(listed)
        };
        let config = &self.config;
        let step = WORKER.with(|w| {
            let w = &mut *w.borrow_mut();
            let mut lent = callee::Worker {
                now_ms: now,
                rng: &self.rng,
                handshake: &self.handshake,
                identity: Some(credential.identity()),
                signer: Some(&*credential),
                gates: w.gates.get_or_insert_with(|| Gates::new(config)),
                policy: config.policy.as_ref(),
                trust: Verifier {
                    root: &runtime.root,
                    now_ms: now,
                    revoked: &snapshot.revocations,
                },
                revocations_stale: revocations_stale(
                    runtime.revocations_fresh_since(),
                    now,
                    config.revocations_max_age,
                ),
                lists: &lists,
            };
            callee.from_peer(data, &mut lent)
        });
        self.apply(step, Some(snapshot.revocation_generation), io)
    }

    pub fn do_write(&mut self, io: &mut dyn Io, end_stream: bool) -> Outcome {
        if self.failure.is_some() {
            return Outcome::close();
        }
        if let Some(outcome) = self.recheck_revocation() {
            return outcome;
        }
        if self.flush(io).is_err() {
            return Outcome::close();
        }
        let mut consumed = 0;
        loop {
            if !self.pending.is_empty() {
                break;
            }
            let mut error = None;
            let (side, pending) = (&mut self.side, &mut self.pending);
            let taken = io.with_write_buffer(&mut |slice| {
                let step = match side {
                    Side::Inbound(callee) => callee.from_app(slice),
                    Side::Outbound(caller) => caller.from_app(slice),
                };
                match step.close {
                    None => pending.extend_from_slice(&step.to_peer),
                    Some(close) => error = Some(close),
                }
                error.is_none() && pending.len() < MAX_PENDING
            });
            if let Some(e) = error {
                return self.fail(e);
            }
            consumed += taken;
            if self.flush(io).is_err() {
                return Outcome::close();
            }
            if taken == 0 {
                break;
            }
        }
        if end_stream && self.pending.is_empty() {
            io.shutdown_write();
        }
        Outcome {
            close: false,
            bytes: consumed,
            end_stream: false,
        }
    }

    /// Writes what is pending until done or the socket pushes back.
    fn flush(&mut self, io: &mut dyn Io) -> Result<(), ()> {
        let mut written = 0;
        while written < self.pending.len() {
            match io.write(&self.pending[written..]) {
                (IoStatus::Done, 0) => break,
                (IoStatus::Done, n) => written += n,
                (IoStatus::Again, n) => {
                    written += n;
                    break;
                }
                (IoStatus::Failed, _) => return Err(()),
            }
        }
        self.pending.drain(..written);
        Ok(())
    }

    /// A revocation arrived since the peer was last checked: a revoked peer's
    /// connection ends, whichever way its bytes flow.
    fn recheck_revocation(&mut self) -> Option<Outcome> {
        let peer = self.peer?;
        let snapshot = self.runtime.snapshot();
        if snapshot.revocation_generation == self.generation {
            return None;
        }
        self.generation = snapshot.revocation_generation;
        snapshot.revocations.contains(&peer).then(|| {
            let who = peer.printable(&self.runtime.root.mesh);
            self.fail(Close::new(
                Reason::Revoked,
                format!("peer {who} was revoked"),
            ))
        })
    }
}

/// What a socket offers (a caller) or takes (a callee) in the handshake. A callee whose
/// HCM detects its codec (`takes_http1`: `codec_type: AUTO`, told by `protocol`) takes
/// HTTP/1.1 as is and says so; a caller carries what its cluster speaks, and asks
/// whether the callee would take HTTP/1.1.
fn handshake_for(config: &Config) -> HandshakeConfig {
    let (carries, http1_option) = match config.role {
        Role::Inbound if config.takes_http1 => (Carries::HTTP2.or(Carries::HTTP1), true),
        Role::Inbound => (Carries::HTTP2, false),
        _ => (config.carries, true),
    };
    let mut options = StreamOptions::LARGE_RECORDS;
    if http1_option {
        options = options.or(StreamOptions::TAKES_HTTP1);
    }
    HandshakeConfig {
        carries,
        options,
        ..HandshakeConfig::default()
    }
}

/// The id that must answer at `remote` for `service`: the one the verified
/// resolution lists there. None listed, or two ids at one address (which one the
/// app was promised cannot be told), refuses the connection.
fn expected_peer(snapshot: &Snapshot, service: &str, remote: SocketAddr) -> Result<PeerId, Close> {
    let instances = snapshot
        .resolutions
        .get(service)
        .ok_or_else(|| Close::new(Reason::Unresolved, format!("{service} is not resolved yet")))?;
    let mut ids: Vec<PeerId> = instances
        .iter()
        .filter(|i| i.endpoint == remote)
        .map(|i| i.id)
        .collect();
    ids.sort_by_key(|id| id.0);
    ids.dedup();
    match ids.as_slice() {
        [one] => Ok(*one),
        [] => Err(Close::new(
            Reason::NotEndorsed,
            format!("no endorsed instance of {service} at {remote}"),
        )),
        _ => Err(Close::new(
            Reason::Ambiguous,
            format!(
                "{} ids of {service} at {remote}: which one was meant cannot be told",
                ids.len()
            ),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use themis_sidecar::agent::Instance;

    fn at(id: u8, endpoint: &str) -> Instance {
        Instance {
            id: PeerId([id; 32]),
            endpoint: endpoint.parse().unwrap(),
            metadata: Default::default(),
            vouched_by: Vec::new(),
        }
    }

    #[test]
    fn only_a_callee_configured_for_http1_takes_it_and_says_so() {
        let config = |role_and_more: &str| {
            Config::parse(format!(r#"{{"mesh_root":"demo:{}","workload":"w","agent_socket":"/a",{role_and_more}}}"#, "11".repeat(32)).as_bytes()).unwrap()
        };
        let takes = |h: &HandshakeConfig| {
            (
                h.carries.contains(Carries::HTTP1),
                h.options.contains(StreamOptions::TAKES_HTTP1),
            )
        };
        let plain = handshake_for(&config(r#""role":"inbound""#));
        assert_eq!(
            (plain.carries, takes(&plain)),
            (Carries::HTTP2, (false, false))
        );
        let auto = handshake_for(&config(r#""role":"inbound","takes_http1":true"#));
        assert_eq!(takes(&auto), (true, true));
        assert!(auto.carries.contains(Carries::HTTP2));
        // Callers offer what their cluster speaks, and always ask.
        let h2 = handshake_for(&config(r#""role":"seal","peer_service":"s""#));
        assert_eq!((h2.carries, takes(&h2)), (Carries::HTTP2, (false, true)));
        let h1 = handshake_for(&config(
            r#""role":"seal","peer_service":"s","carries":"http/1.1""#,
        ));
        assert_eq!((h1.carries, takes(&h1)), (Carries::HTTP1, (true, true)));
        assert!(h1.options.contains(StreamOptions::LARGE_RECORDS));
    }

    #[test]
    fn the_expected_peer_is_the_one_id_listed_at_the_address() {
        let mut snapshot = Snapshot::default();
        let remote: SocketAddr = "10.0.0.2:15006".parse().unwrap();
        let refused = |s: &Snapshot| {
            expected_peer(s, "check", remote)
                .unwrap_err()
                .reason
                .as_str()
        };
        assert_eq!(refused(&snapshot), "unresolved");
        snapshot.resolutions.insert(
            "check".into(),
            vec![at(1, "10.0.0.1:15006"), at(2, "10.0.0.2:15006")],
        );
        assert_eq!(
            expected_peer(&snapshot, "check", remote).unwrap(),
            PeerId([2; 32])
        );
        // Listed for another service only: not this cluster's.
        assert_eq!(
            expected_peer(&snapshot, "other", remote)
                .unwrap_err()
                .reason
                .as_str(),
            "unresolved"
        );
        // The same id twice (two records) is still one id.
        snapshot
            .resolutions
            .get_mut("check")
            .unwrap()
            .push(at(2, "10.0.0.2:15006"));
        assert_eq!(
            expected_peer(&snapshot, "check", remote).unwrap(),
            PeerId([2; 32])
        );
        // A second id at the address: which one was meant cannot be told.
        snapshot
            .resolutions
            .get_mut("check")
            .unwrap()
            .push(at(3, "10.0.0.2:15006"));
        assert_eq!(refused(&snapshot), "ambiguous");
        // Nobody there.
        snapshot
            .resolutions
            .insert("check".into(), vec![at(1, "10.0.0.1:15006")]);
        assert_eq!(refused(&snapshot), "not_endorsed");
    }
}
