//! The app-facing HTTP filter: `http://<service>/…` → an instance, named to Envoy's
//! router in two request headers that `set_filter_state` turns into the connection's
//! destination and the id it must prove (the router's pool is split by both, so a
//! connection only ever carries calls to one instance). The bytes are sealed by the
//! internal listener's [`super::seal`] filter.
//!
//! A service is resolved by one agent call per worker at a time: the requests that
//! find its resolution missing or expired while the call is out wait for it, and are
//! routed and resumed when it answers. (One call per waiting request sent 64 calls at
//! once when a resolution expired under 64 connections, past the agent's cap on one
//! caller's connections: the calls it closed became 503s.)

use std::cell::RefCell;
use std::rc::Rc;

use log::{info, warn};
use proxy_wasm::hostcalls;
use proxy_wasm::traits::{Context, HttpContext};
use proxy_wasm::types::{Action, MapType};

use super::{call_agent, call_response, now_ms, Shared};
use themis_sidecar::agent::Instance;
use themis_sidecar::config::Transport;
use themis_sidecar::outbound::{pick_headers, service_of, upstream_failed, Refusal};
use themis_sidecar::route::Pick;

/// The instance a request was routed to, set by whoever routed it: the request's
/// own context, or the resolution it waited on.
type Picked = Rc<RefCell<Option<Instance>>>;

/// The agent call resolving one service, and the requests waiting on it.
pub(super) struct Resolving {
    /// Whether a call is out: the one the request that found the resolution missing
    /// made, or the root's. `false` once that request ended first, and its call with
    /// it: the root asks again on its next tick.
    asked: bool,
    waiters: Vec<Waiter>,
}

struct Waiter {
    context_id: u32,
    picked: Picked,
}

/// What routing a request came to.
enum Routed {
    /// An instance is picked and named in the request headers: let it go on.
    Go,
    /// Answered here (no instance).
    Refused,
    /// The resolution is missing or expired.
    Resolve,
}

pub struct Outbound {
    worker: Shared,
    context_id: u32,
    service: String,
    picked: Picked,
    /// The resolution call this request made, if it made one.
    call: Option<u32>,
}

impl Outbound {
    pub fn new(worker: Shared, context_id: u32) -> Self {
        Outbound {
            worker,
            context_id,
            service: String::new(),
            picked: Picked::default(),
            call: None,
        }
    }

    /// Waits for the service's resolution: joins the call already out, or makes it.
    fn wait_for_resolution(&mut self) {
        let waiter = Waiter {
            context_id: self.context_id,
            picked: self.picked.clone(),
        };
        let mut w = self.worker.borrow_mut();
        if let Some(resolving) = w.resolving.get_mut(&self.service) {
            resolving.waiters.push(waiter);
            return;
        }
        let path = themis_contracts::paths::service(&self.service);
        match call_agent(self, &w.config, &path) {
            Some(token) => {
                self.call = Some(token);
                let resolving = Resolving {
                    asked: true,
                    waiters: vec![waiter],
                };
                w.resolving.insert(self.service.clone(), resolving);
            }
            None => {
                drop(w);
                refuse(
                    &self.worker,
                    &Refusal::resolve_failed("the agent cannot be called"),
                );
            }
        }
    }
}

/// Routes the request of the effective context to an instance of `service`.
fn route(worker: &Shared, service: &str, picked: &Picked) -> Routed {
    let pick = {
        let w = worker.borrow();
        w.routes
            .pick(service, &[Transport::Themis], w.tick_ms, w.random())
    };
    match pick {
        Pick::Instance(instance) => {
            // The Wasm filter speaks the Themis channel only.
            let mesh = worker.borrow().config.mesh.clone();
            for (key, value) in pick_headers(&instance, Transport::Themis, &mesh) {
                let _ = hostcalls::set_map_value(MapType::HttpRequestHeaders, key, Some(&value));
            }
            *picked.borrow_mut() = Some(instance);
            Routed::Go
        }
        Pick::NoInstance => {
            refuse(worker, &Refusal::no_instance(service));
            Routed::Refused
        }
        Pick::Resolve => Routed::Resolve,
    }
}

/// Answers the request of the effective context here, with `x-themis-reject: reason`.
fn refuse(worker: &Shared, refusal: &Refusal) {
    worker.borrow().metrics.count(&refusal.reason.counter());
    let headers = refusal.headers().to_vec();
    let body = refusal.body();
    let _ = hostcalls::send_http_response(refusal.status, headers, Some(body.as_bytes()));
}

/// The agent answered a resolution of `service` (`status` `None`: it could not be
/// asked): caches what verified, then routes and resumes every request waiting on it,
/// each as its own context (a request that ended meanwhile is skipped).
pub(super) fn resolved(worker: &Shared, service: &str, status: Option<u16>, body: &[u8]) {
    let (resolved, waiters) = {
        let mut w = worker.borrow_mut();
        let instances = w.verified_instances(service, status, body);
        if let Some(instances) = &instances {
            // Per thread, once a resolution (`resolve_ttl_secs`): which instances this
            // worker's calls pick from now on (the native module logs the same).
            let at: Vec<String> = instances
                .iter()
                .map(|i| format!("{} at {}", i.id.printable(&w.config.mesh), i.endpoint))
                .collect();
            info!("themis: {service} resolves to [{}]", at.join(", "));
            let expires = w.expires(instances.is_empty());
            w.routes.cache(service, instances.clone(), expires);
        }
        let waiters = w.resolving.remove(service).map(|r| r.waiters);
        (instances.is_some(), waiters.unwrap_or_default())
    };
    if !resolved {
        warn!("themis: cannot resolve {service} (agent status {status:?})");
    }
    for waiter in waiters {
        if hostcalls::set_effective_context(waiter.context_id).is_err() {
            continue;
        }
        let routed = match resolved {
            true => route(worker, service, &waiter.picked),
            false => Routed::Resolve,
        };
        match routed {
            Routed::Go => {
                let _ = hostcalls::resume_http_request();
            }
            Routed::Refused => {}
            Routed::Resolve => {
                refuse(
                    worker,
                    &Refusal::resolve_failed(format!("cannot resolve {service}")),
                );
            }
        }
    }
}

/// The services whose resolving request ended before the answer: the root asks for
/// them again (its own calls outlive any request). Marked as asked by the root.
pub(super) fn orphaned(worker: &Shared) -> Vec<String> {
    let mut w = worker.borrow_mut();
    let mut orphans = Vec::new();
    for (service, resolving) in w.resolving.iter_mut() {
        if !resolving.asked {
            resolving.asked = true;
            orphans.push(service.clone());
        }
    }
    orphans
}

impl Context for Outbound {
    fn on_http_call_response(&mut self, token: u32, _: usize, body_size: usize, _: usize) {
        if self.call != Some(token) {
            return;
        }
        self.call = None;
        let (status, body) = call_response(self, body_size);
        resolved(&self.worker, &self.service, status, &body);
    }

    fn on_done(&mut self) -> bool {
        // Our call ends with us; whoever waits on it is not left waiting.
        if self.call.take().is_some() {
            let mut w = self.worker.borrow_mut();
            if let Some(resolving) = w.resolving.get_mut(&self.service) {
                resolving.asked = false;
            }
        }
        true
    }
}

impl HttpContext for Outbound {
    fn on_http_request_headers(&mut self, _: usize, _: bool) -> Action {
        self.worker.borrow().metrics.count_request();
        let authority = self
            .get_http_request_header(":authority")
            .unwrap_or_default();
        match service_of(&authority) {
            Ok(name) => self.service = name.to_string(),
            Err(refusal) => {
                refuse(&self.worker, &refusal);
                return Action::Pause;
            }
        }
        match route(&self.worker, &self.service, &self.picked) {
            Routed::Go => Action::Continue,
            Routed::Refused => Action::Pause,
            Routed::Resolve => {
                self.wait_for_resolution();
                Action::Pause
            }
        }
    }

    fn on_http_response_headers(&mut self, _: usize, _: bool) -> Action {
        let picked = self.picked.borrow().clone();
        // Who answered: the instance picked, whose id the sealed connection proved
        // (anything the peer's app claimed in these headers is overwritten).
        if let Some(instance) = &picked {
            let mesh = self.worker.borrow().config.mesh.clone();
            self.set_http_response_header("x-themis-peer-id", Some(&instance.id.printable(&mesh)));
            self.set_http_response_header("x-themis-peer-service", Some(&self.service));
        }
        // The connection to the instance failed or was refused: avoid it for a while
        // (the next calls go to another instance).
        let flags = self
            .get_property(vec!["response", "flags"])
            .and_then(|b| {
                b.get(..8)
                    .map(|b| u64::from_le_bytes(b.try_into().unwrap_or_default()))
            })
            .unwrap_or(0);
        if upstream_failed(flags) {
            if let Some(instance) = &picked {
                let mut w = self.worker.borrow_mut();
                let until = now_ms() + w.config.down.as_millis() as u64;
                w.routes.mark_down(instance.id, until);
                w.metrics.count("peer_unreachable");
                warn!(
                    "themis: {} at {} failed; avoiding it for now",
                    self.service, instance.endpoint
                );
            }
        }
        Action::Continue
    }
}
