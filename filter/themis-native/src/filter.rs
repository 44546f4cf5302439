//! The inbound network filter, first on the listener's chain: it hands the caller the
//! transport socket proved (and the policy allowed) to the connection manager as
//! filter state, from which the route sets `x-themis-peer-id` and
//! `x-themis-peer-service` (after every caller-supplied `x-themis-*` header is gone).

use crate::socket::proven_peer;

/// The filter state keys (`%FILTER_STATE(themis.peer_id:PLAIN)%`).
pub const PEER_ID_KEY: &str = "themis.peer_id";
pub const PEER_SERVICE_KEY: &str = "themis.peer_service";

/// The filter's configuration: it has none beyond its name.
pub struct InboundFilterConfig;

impl InboundFilterConfig {
    pub fn new(name: &[u8], _config: &[u8]) -> Result<Self, String> {
        match name {
            b"peer" => Ok(InboundFilterConfig),
            other => Err(format!(
                "filter_name {:?}: the module's network filter is `peer` (beside the `inbound` transport socket)",
                String::from_utf8_lossy(other)
            )),
        }
    }

    pub fn filter(&self, connection_id: u64) -> InboundFilter {
        InboundFilter {
            connection_id,
            handed: false,
        }
    }
}

/// One connection's filter.
pub struct InboundFilter {
    connection_id: u64,
    handed: bool,
}

impl InboundFilter {
    /// Data arrived: the transport socket delivers none before the caller is allowed,
    /// so the peer is known by now; `set` puts one filter state entry.
    pub fn on_read(&mut self, set: &mut dyn FnMut(&str, &str) -> bool) {
        if self.handed {
            return;
        }
        self.handed = true;
        match proven_peer(self.connection_id) {
            Some(peer) => {
                set(PEER_ID_KEY, &peer.id);
                if let Some(service) = &peer.service {
                    set(PEER_SERVICE_KEY, service);
                }
            }
            None => crate::ffi::log(
                4,
                "themis native: data on a connection with no proven peer (is the `inbound` transport socket on this listener?)",
            ),
        }
    }
}
