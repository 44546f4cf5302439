//! The inbound network filter, first on the listener's chain: it hands the caller the
//! transport socket proved (and the policy allowed) to the connection manager as
//! filter state, from which the route sets `x-themis-peer-id` and
//! `x-themis-peer-service` (after every caller-supplied `x-themis-*` header is gone).
//!
//! Behind Envoy's TLS socket (configuration `tls`), the caller is what the module's
//! validator proved in the handshake, read back from the certificate's SANs, which
//! the validator held to the proof: the DNS SAN names the id, the URI SAN
//! `spiffe://<mesh>/svc/<service>` the service its endorsement proved.

use std::sync::Arc;

use themis_core::identity::id_of_sni_name;
use themis_core::PeerId;
use themis_sidecar::config::{Config, Role, Transport};
use themis_sidecar::reason::Reason;

use crate::metrics;
use crate::runtime::Runtime;
use crate::socket::{proven_peer, ProvenPeer};

/// The filter state keys (`%FILTER_STATE(themis.peer_id:PLAIN)%`).
pub const PEER_ID_KEY: &str = "themis.peer_id";
pub const PEER_SERVICE_KEY: &str = "themis.peer_service";

/// The filter's configuration: where the peer comes from.
pub struct InboundFilterConfig {
    /// Behind Envoy's TLS: the workload's runtime, whose revocations end a revoked
    /// caller's established connection on its next bytes.
    tls: Option<Arc<Runtime>>,
}

impl InboundFilterConfig {
    /// `config` is empty (the `inbound` transport socket proves the peer) or the
    /// inbound role's JSON with `"transport": "tls"` (Envoy's TLS socket with the
    /// module's `inbound` validator).
    pub fn new(name: &[u8], config: &[u8]) -> Result<Self, String> {
        if name != b"peer" {
            return Err(format!(
                "filter_name {:?}: the module's network filter is `peer` (beside the `inbound` transport socket or validator)",
                String::from_utf8_lossy(name)
            ));
        }
        if config.is_empty() {
            return Ok(InboundFilterConfig { tls: None });
        }
        let config = Config::parse(config).map_err(|e| e.to_string())?;
        if config.role != Role::Inbound || config.transport != Transport::Tls {
            return Err(
                "filter_config: none (the Themis channel), or the inbound role's configuration with \"transport\": \"tls\"".into(),
            );
        }
        Ok(InboundFilterConfig {
            tls: Some(Runtime::of(&config)?),
        })
    }

    pub fn filter(&self, connection_id: u64) -> InboundFilter {
        InboundFilter {
            connection_id,
            tls: self.tls.clone(),
            handed: None,
            generation: 0,
        }
    }
}

/// The peer certificate's SANs, as Envoy's connection has them.
pub struct Sans {
    pub dns: Vec<String>,
    pub uri: Vec<String>,
}

/// The caller a TLS handshake proved, from its certificate's SANs (one DNS SAN naming
/// an id, at most one URI SAN of the service form).
pub fn peer_of_sans(sans: &Sans) -> Option<(PeerId, ProvenPeer)> {
    let [dns] = sans.dns.as_slice() else {
        return None;
    };
    let (mesh, id) = id_of_sni_name(dns)?;
    let service = match sans.uri.as_slice() {
        [uri] => uri
            .strip_prefix(&format!("spiffe://{mesh}/svc/"))
            .map(str::to_owned),
        _ => return None,
    };
    let peer = ProvenPeer {
        id: id.printable(&mesh),
        service,
    };
    Some((id, peer))
}

/// What the filter does with the bytes that arrived.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Read {
    Continue,
    /// The caller was revoked since its handshake: the connection ends.
    Close,
}

/// One connection's filter.
pub struct InboundFilter {
    connection_id: u64,
    tls: Option<Arc<Runtime>>,
    /// The TLS caller, once handed on (`Some(None)`: the Themis channel's, or none).
    handed: Option<Option<PeerId>>,
    /// The revocations' generation the TLS caller was last checked against.
    generation: u64,
}

impl InboundFilter {
    /// Data arrived: the transport socket (or Envoy's TLS with the validator) lets none
    /// through before the caller is allowed, so the peer is known by now; `set` puts
    /// one filter state entry. Behind TLS, a caller revoked since is cut on its next
    /// bytes (the Themis channel's socket does that itself).
    pub fn on_read(
        &mut self,
        sans: &dyn Fn() -> Sans,
        set: &mut dyn FnMut(&str, &str) -> bool,
    ) -> Read {
        match self.handed {
            None => {
                let (id, peer) = match &self.tls {
                    Some(_) => match peer_of_sans(&sans()) {
                        Some((id, peer)) => (Some(id), Some(peer)),
                        None => (None, None),
                    },
                    None => (None, proven_peer(self.connection_id)),
                };
                self.handed = Some(id);
                match peer {
                    Some(peer) => {
                        set(PEER_ID_KEY, &peer.id);
                        if let Some(service) = &peer.service {
                            set(PEER_SERVICE_KEY, service);
                        }
                    }
                    None => crate::ffi::log(
                        4,
                        "themis native: data on a connection with no proven peer (is the `inbound` transport socket, or Envoy's TLS with the `inbound` validator, on this listener?)",
                    ),
                }
                match (self.tls.clone(), id) {
                    // This first look covers a handshake that did not run the
                    // validator (a resumed session, were resumption ever turned on);
                    // after it, only a revocation learnt since is looked up.
                    (Some(runtime), Some(id)) => self.check(&id, &runtime.snapshot()),
                    _ => Read::Continue,
                }
            }
            Some(Some(id)) => self.recheck(&id),
            Some(None) => Read::Continue,
        }
    }

    /// Bytes go to the caller: behind TLS, a caller revoked since is cut here too, so
    /// that one that only listens (a stream the app pushes) stops receiving.
    pub fn on_write(&mut self) -> Read {
        match self.handed {
            Some(Some(id)) => self.recheck(&id),
            _ => Read::Continue,
        }
    }

    /// A revocation arrived since the caller was last checked: a revoked one's
    /// connection ends.
    fn recheck(&mut self, id: &PeerId) -> Read {
        let Some(runtime) = &self.tls else {
            return Read::Continue;
        };
        let snapshot = runtime.snapshot();
        if snapshot.revocation_generation == self.generation {
            return Read::Continue;
        }
        self.check(id, &snapshot)
    }

    /// Whether the caller is revoked in `snapshot` (remembered as checked): a revoked
    /// one's connection ends, counted and logged.
    fn check(&mut self, id: &PeerId, snapshot: &crate::runtime::Snapshot) -> Read {
        self.generation = snapshot.revocation_generation;
        if !snapshot.revocations.contains(id) {
            return Read::Continue;
        }
        metrics::count(Role::Inbound.as_str(), &Reason::Revoked.counter());
        let mesh = self.tls.as_ref().map(|runtime| &runtime.root.mesh);
        crate::ffi::log(
            3,
            &format!(
                "themis native inbound (tls): refused.revoked: peer {} was revoked; its connection ends",
                mesh.map_or_else(|| id.to_string(), |mesh| id.printable(mesh))
            ),
        );
        Read::Close
    }
}
