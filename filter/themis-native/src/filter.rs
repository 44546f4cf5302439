//! The inbound network filter, first on the listener's chain: it hands the caller the
//! transport socket proved (and the policy allowed) to the connection manager as
//! filter state, from which the route sets `x-themis-peer-id` and
//! `x-themis-peer-service` (after every caller-supplied `x-themis-*` header is gone).
//!
//! Behind Envoy's TLS socket (configuration `tls`), the caller is what the module's
//! validator proved in the handshake, read back from the certificate's SANs, which
//! the validator held to the proof: the DNS SAN names the id, the URI SAN
//! `spiffe://<mesh>/svc/<service>` the service its endorsement proved.

use themis_core::identity::id_of_sni_name;

use crate::socket::{proven_peer, ProvenPeer};

/// The filter state keys (`%FILTER_STATE(themis.peer_id:PLAIN)%`).
pub const PEER_ID_KEY: &str = "themis.peer_id";
pub const PEER_SERVICE_KEY: &str = "themis.peer_service";

/// The filter's configuration: where the peer comes from.
pub struct InboundFilterConfig {
    tls: bool,
}

impl InboundFilterConfig {
    /// `config` is empty (the `inbound` transport socket proves the peer) or `tls`
    /// (Envoy's TLS socket with the module's `inbound` validator).
    pub fn new(name: &[u8], config: &[u8]) -> Result<Self, String> {
        if name != b"peer" {
            return Err(format!(
                "filter_name {:?}: the module's network filter is `peer` (beside the `inbound` transport socket or validator)",
                String::from_utf8_lossy(name)
            ));
        }
        match config {
            b"" => Ok(InboundFilterConfig { tls: false }),
            b"tls" => Ok(InboundFilterConfig { tls: true }),
            other => Err(format!(
                "filter_config {:?}: none (the Themis channel) or \"tls\"",
                String::from_utf8_lossy(other)
            )),
        }
    }

    pub fn filter(&self, connection_id: u64) -> InboundFilter {
        InboundFilter {
            connection_id,
            tls: self.tls,
            handed: false,
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
pub fn peer_of_sans(sans: &Sans) -> Option<ProvenPeer> {
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
    Some(ProvenPeer {
        id: id.printable(&mesh),
        service,
    })
}

/// One connection's filter.
pub struct InboundFilter {
    connection_id: u64,
    tls: bool,
    handed: bool,
}

impl InboundFilter {
    /// Data arrived: the transport socket delivers none before the caller is allowed,
    /// so the peer is known by now; `set` puts one filter state entry.
    pub fn on_read(&mut self, sans: &dyn Fn() -> Sans, set: &mut dyn FnMut(&str, &str) -> bool) {
        if self.handed {
            return;
        }
        self.handed = true;
        let peer = match self.tls {
            true => peer_of_sans(&sans()),
            false => proven_peer(self.connection_id),
        };
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
    }
}
