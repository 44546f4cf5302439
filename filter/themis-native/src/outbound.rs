//! The app-facing HTTP filter: `http://<service>/…` → an instance of the service, named
//! to Envoy's router in two request headers that `set_filter_state` turns into the
//! upstream connection's destination and the id it must prove (the router keeps one
//! pool per pair). The pick reads the runtime's verified resolution, so a request
//! never waits on the agent; the sealing cluster's transport socket then proves that
//! the one id listed at the address answers. Back on the response, the app is told the
//! id the upstream connection actually authenticated, looked up by its connection id.

use std::cell::Cell;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ring::rand::SystemRandom;
use themis_core::PeerId;
use themis_sidecar::config::{Config, Role, Takes, Transport};
use themis_sidecar::outbound::{pick_headers, service_of, upstream_failed, Refusal, CARRY_HEADER};
use themis_sidecar::reason::Rejection;
use themis_sidecar::route::{Pick, PickRandom, Routes, TRANSPORT_HEADER};

use crate::runtime::{now_ms, Runtime};
use crate::socket::{proven_peer, takes_http1, ProvenPeer};

/// Where a request goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Route {
    /// The destination and peer headers ([`pick_headers`]).
    pub pick: [(&'static str, String); 2],
    pub picked: PeerId,
    /// The transport: the first this sidecar speaks that the pick's record names.
    pub transport: Transport,
    /// Carried as the app wrote it, HTTP/1.1 (the Themis channel): the request is,
    /// and the picked instance said (signed, on an earlier connection) that it takes
    /// HTTP/1.1.
    pub carries_http1: bool,
}

impl Route {
    /// The request headers that name the pick to `set_filter_state`, its transport
    /// and the carry header to the outbound route (`None`: removed, whatever the app
    /// wrote).
    pub fn headers(&self) -> [(&'static str, Option<&str>); 4] {
        let [(destination, address), (peer, id)] = &self.pick;
        [
            (destination, Some(address)),
            (peer, Some(id)),
            (TRANSPORT_HEADER, Some(self.transport.as_str())),
            (CARRY_HEADER, self.carries_http1.then_some("http/1.1")),
        ]
    }
}

/// One `outbound` filter configuration (per listener; shared by the workers).
pub struct Outbound {
    /// How long an instance whose connection failed is avoided.
    down: Duration,
    runtime: Arc<Runtime>,
    /// The transports it has clusters for, by preference (a pick takes the first
    /// its record names): the pick is named by its SNI name on TLS.
    speaks: Vec<Transport>,
    routes: Mutex<Routes>,
    rng: SystemRandom,
}

impl Outbound {
    /// From the filter configuration JSON (role outbound, with `agent_socket`).
    pub fn new(config: &[u8]) -> Result<Outbound, String> {
        let config = Config::parse(config).map_err(|e| e.to_string())?;
        if config.role != Role::Outbound {
            return Err(format!(
                "the HTTP filter `outbound` takes role outbound, not {}",
                config.role.as_str()
            ));
        }
        let runtime = Runtime::of(&config)?;
        for service in &config.calls {
            runtime.want(service);
        }
        Ok(Outbound {
            routes: Mutex::new(Routes::new(config.canary.clone())),
            down: config.down,
            speaks: config.speaks.clone(),
            runtime,
            rng: SystemRandom::new(),
        })
    }

    /// Picks an instance for a request to `authority` (`service` or `service:port`);
    /// `http1`: the app's request is HTTP/1.1.
    pub fn on_request(&self, authority: &str, http1: bool) -> Result<Route, Refusal> {
        let name = service_of(authority)?;
        let snapshot = self.runtime.snapshot();
        let Some(instances) = snapshot.resolutions.get(name) else {
            return Err(match self.runtime.wants(name) {
                true => {
                    self.runtime.refresh();
                    Refusal::resolve_failed(format!("{name} is not resolved yet"))
                }
                false => Refusal::new(
                    503,
                    Rejection::NotRouted,
                    format!("this sidecar has no sealing cluster for {name} (themis sidecar render --calls {name})"),
                ),
            });
        };
        let pick = self
            .routes
            .lock()
            .map_err(|_| Refusal::resolve_failed("routes poisoned"))?
            .pick_from(name, instances, &self.speaks, now_ms(), self.random());
        let Pick::Instance(instance) = pick else {
            return Err(match instances.is_empty() {
                true => Refusal::no_instance(name),
                false => Refusal::new(
                    503,
                    Rejection::NoInstance,
                    format!(
                        "no instance of {name} takes a transport this sidecar speaks ({}): their records name others",
                        Takes::label(&self.speaks)
                    ),
                ),
            });
        };
        let transport = instance
            .takes()
            .first_of(&self.speaks)
            .unwrap_or(Transport::Themis); // the pick takes one of them
        Ok(Route {
            pick: pick_headers(&instance, transport, &self.runtime.root.mesh),
            picked: instance.id,
            transport,
            carries_http1: transport == Transport::Themis && http1 && takes_http1(&instance.id),
        })
    }

    /// Whether it speaks more than one transport: the route is chosen by the pick's.
    pub fn speaks_several(&self) -> bool {
        self.speaks.len() > 1
    }

    /// A number for the pick, from this worker's [`PickRandom`].
    fn random(&self) -> u32 {
        thread_local! {
            static STATE: Cell<Option<PickRandom>> = const { Cell::new(None) };
        }
        STATE.with(|state| {
            let mut random = state.get().unwrap_or_else(|| PickRandom::seeded(&self.rng));
            let n = random.next_u32();
            state.set(Some(random));
            n
        })
    }

    /// The response came back for a request routed to `picked`: who answered, by the
    /// upstream connection's id (none when Envoy answered itself), and
    /// whether the connection failed (Envoy's response flags UF, UC, UR: the next
    /// calls avoid the instance for a while).
    pub fn on_response(
        &self,
        picked: PeerId,
        transport: Transport,
        upstream_connection: Option<u64>,
        flags: u64,
    ) -> Answered {
        let unreachable = upstream_failed(flags);
        if unreachable {
            if let Ok(mut routes) = self.routes.lock() {
                let now = now_ms();
                routes.expire(now);
                routes.mark_down(picked, now + self.down.as_millis() as u64);
            }
        }
        let peer = match transport {
            Transport::Themis => upstream_connection.and_then(proven_peer),
            // The connection's SNI named the pick, and the validator held the callee
            // to it: who answered over it is the pick.
            Transport::Tls => upstream_connection
                .and_then(|_| crate::validator::proven_service(&picked))
                .map(|service| ProvenPeer {
                    id: picked.printable(&self.runtime.root.mesh),
                    service,
                }),
        };
        Answered { peer, unreachable }
    }
}

/// What the response says of the upstream.
#[derive(Debug, Clone)]
pub struct Answered {
    /// The id (printable) and service the upstream connection proved.
    pub peer: Option<ProvenPeer>,
    /// The connection failed or was refused (counted as `peer_unreachable`).
    pub unreachable: bool,
}
