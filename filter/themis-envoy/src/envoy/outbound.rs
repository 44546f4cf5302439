//! The app-facing HTTP filter: `http://<service>/…` → an instance, named to Envoy's
//! router in two request headers that `set_filter_state` turns into the connection's
//! destination and the id it must prove (the router's pool is split by both, so a
//! connection only ever carries calls to one instance). The bytes are sealed by the
//! internal listener's [`super::seal`] filter.

use log::warn;
use proxy_wasm::traits::{Context, HttpContext};
use proxy_wasm::types::Action;

use super::{call_agent, call_response, now_ms, Shared};
use crate::agent::Instance;
use crate::config::is_name;
use crate::route::{Pick, DESTINATION_HEADER, PEER_HEADER};

pub struct Outbound {
    worker: Shared,
    service: String,
    picked: Option<Instance>,
    call: Option<u32>,
}

impl Outbound {
    pub fn new(worker: Shared) -> Self {
        Outbound {
            worker,
            service: String::new(),
            picked: None,
            call: None,
        }
    }

    fn refuse(&self, status: u32, reason: &str, message: &str) {
        self.worker
            .borrow()
            .metrics
            .count(&format!("rejected.{reason}"));
        self.send_http_response(
            status,
            vec![("x-themis-reject", reason), ("content-type", "text/plain")],
            Some(format!("themis: {message}\n").as_bytes()),
        );
    }

    /// Picks an instance; `true` if the request may go on now.
    fn route(&mut self) -> bool {
        let pick = {
            let w = self.worker.borrow();
            w.routes.pick(&self.service, now_ms(), w.random())
        };
        match pick {
            Pick::Instance(instance) => {
                self.set_http_request_header(
                    DESTINATION_HEADER,
                    Some(&instance.endpoint.to_string()),
                );
                self.set_http_request_header(PEER_HEADER, Some(&hex::encode(instance.id.0)));
                self.picked = Some(instance);
                true
            }
            Pick::NoInstance => {
                self.refuse(
                    503,
                    "no_instance",
                    &format!("{} has no instance the mesh vouches for", self.service),
                );
                false
            }
            Pick::Resolve => {
                let path = themis_contracts::paths::service(&self.service);
                let token = call_agent(self, &self.worker.borrow().config, &path);
                match token {
                    Some(token) => self.call = Some(token),
                    None => self.refuse(503, "resolve_failed", "the agent cannot be called"),
                }
                false
            }
        }
    }
}

impl Context for Outbound {
    fn on_http_call_response(&mut self, token: u32, _: usize, body_size: usize, _: usize) {
        if self.call != Some(token) {
            return;
        }
        self.call = None;
        let (status, body) = call_response(self, body_size);
        let resolved = {
            let mut w = self.worker.borrow_mut();
            let instances = w.verified_instances(&self.service, status, &body);
            if let Some(instances) = &instances {
                let expires = w.expires();
                w.routes.cache(&self.service, instances.clone(), expires);
            }
            instances.is_some()
        };
        if !resolved {
            warn!(
                "themis: cannot resolve {} (agent status {status:?})",
                self.service
            );
            return self.refuse(
                503,
                "resolve_failed",
                &format!("cannot resolve {}", self.service),
            );
        }
        if self.route() {
            self.resume_http_request();
        }
    }
}

impl HttpContext for Outbound {
    fn on_http_request_headers(&mut self, _: usize, _: bool) -> Action {
        self.worker.borrow().metrics.count("requests");
        let authority = self
            .get_http_request_header(":authority")
            .unwrap_or_default();
        // `service` or `service:port`: the port is the app's business, not routing's.
        let name = authority
            .rsplit_once(':')
            .map_or(authority.as_str(), |(h, _)| h);
        if !is_name(name) {
            self.refuse(
                400,
                "not_a_service",
                &format!("{authority:?} does not name a mesh service"),
            );
            return Action::Pause;
        }
        self.service = name.to_string();
        match self.route() {
            true => Action::Continue,
            false => Action::Pause,
        }
    }

    fn on_http_response_headers(&mut self, _: usize, _: bool) -> Action {
        // Who answered: the instance picked, whose id the sealed connection proved
        // (anything the peer's app claimed in these headers is overwritten).
        if let Some(instance) = &self.picked {
            let mesh = self.worker.borrow().config.mesh.clone();
            self.set_http_response_header("x-themis-peer-id", Some(&instance.id.printable(&mesh)));
            self.set_http_response_header("x-themis-peer-service", Some(&self.service));
        }
        // The connection to the instance failed or was refused: avoid it for a while
        // (the next calls go to another instance). Envoy's response flags: UR 0x10,
        // UF 0x20, UC 0x40.
        let flags = self
            .get_property(vec!["response", "flags"])
            .and_then(|b| {
                b.get(..8)
                    .map(|b| u64::from_le_bytes(b.try_into().unwrap_or_default()))
            })
            .unwrap_or(0);
        if flags & 0x70 != 0 {
            if let Some(instance) = &self.picked {
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
