//! The outbound HTTP role's decisions, the same in both runtimes: which service a
//! request names, what it is answered when it cannot go, how the pick is named to
//! Envoy's router, and whether the response says the connection to the instance
//! failed. The drivers own only the host calls and where the resolution comes from
//! (an agent call per worker on Wasm, the runtime's snapshot natively).

use crate::agent::Instance;
use crate::config::{is_name, Transport};
use crate::reason::Rejection;
use crate::route::{DESTINATION_HEADER, PEER_HEADER};
use themis_core::MeshName;

/// Set (to `http/1.1`) on a request carried as HTTP/1.1 (native): the outbound virtual
/// host routes it to the service's HTTP/1.1 sealing cluster, and removes it there.
pub const CARRY_HEADER: &str = "x-themis-carry";

/// The header that tells the app why the sidecar answered its request itself.
pub const REJECT_HEADER: &str = "x-themis-reject";

/// What the outbound role counts besides its rejections (`themis.outbound.<name>`).
pub const EVENTS: [&str; 2] = ["requests", "peer_unreachable"];

/// Every counter name of the outbound role (under `themis.outbound.`).
pub fn counter_names() -> Vec<String> {
    let events = EVENTS.iter().map(|e| e.to_string());
    events
        .chain(Rejection::ALL.iter().map(|r| r.counter()))
        .collect()
}

/// A request answered here, with `x-themis-reject: <reason>`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    pub status: u32,
    pub reason: Rejection,
    pub message: String,
}

impl Refusal {
    pub fn new(status: u32, reason: Rejection, message: impl Into<String>) -> Self {
        Refusal {
            status,
            reason,
            message: message.into(),
        }
    }

    /// The service has no instance the mesh vouches for.
    pub fn no_instance(service: &str) -> Self {
        let message = format!("{service} has no instance the mesh vouches for");
        Refusal::new(503, Rejection::NoInstance, message)
    }

    /// The service cannot be resolved (`why` says how).
    pub fn resolve_failed(why: impl Into<String>) -> Self {
        Refusal::new(503, Rejection::ResolveFailed, why)
    }

    /// The body the app reads.
    pub fn body(&self) -> String {
        format!("themis: {}\n", self.message)
    }

    /// The response's headers besides the status.
    pub fn headers(&self) -> [(&'static str, &'static str); 2] {
        [
            (REJECT_HEADER, self.reason.as_str()),
            ("content-type", "text/plain"),
        ]
    }
}

/// The service a request's `:authority` names: `service` or `service:port` (the port
/// is the app's business, not routing's).
pub fn service_of(authority: &str) -> Result<&str, Refusal> {
    let name = authority.rsplit_once(':').map_or(authority, |(h, _)| h);
    match is_name(name) {
        true => Ok(name),
        false => Err(Refusal::new(
            400,
            Rejection::NotAService,
            format!("{authority:?} does not name a mesh service"),
        )),
    }
}

/// The request headers that name the pick to the router's `set_filter_state`: the
/// destination `ip:port` and the id that must answer there — hex for the Themis
/// channel's socket, its SNI name for TLS (`envoy.network.upstream_server_name` is
/// the SNI then, and the validator holds the peer to the id it names).
pub fn pick_headers(
    instance: &Instance,
    transport: Transport,
    mesh: &MeshName,
) -> [(&'static str, String); 2] {
    let peer = match transport {
        Transport::Themis => hex::encode(instance.id.0),
        Transport::Tls => themis_core::identity::sni_name(&instance.id, mesh),
    };
    [
        (DESTINATION_HEADER, instance.endpoint.to_string()),
        (PEER_HEADER, peer),
    ]
}

/// Envoy's response flags say the connection to the instance failed or was refused
/// (UR 0x10, UF 0x20, UC 0x40): the next calls avoid it for a while.
pub fn upstream_failed(response_flags: u64) -> bool {
    response_flags & 0x70 != 0
}

#[cfg(test)]
mod tests {
    use super::*;
    use themis_core::PeerId;

    #[test]
    fn an_authority_names_a_service_with_or_without_its_port() {
        assert_eq!(service_of("handler"), Ok("handler"));
        assert_eq!(service_of("handler:8080"), Ok("handler"));
        for bad in ["", "Handler", "a/b", "-handler:80", "handler:80:80"] {
            let refusal = service_of(bad).unwrap_err();
            assert_eq!(
                (refusal.status, refusal.reason),
                (400, Rejection::NotAService)
            );
            assert_eq!(refusal.headers()[0], (REJECT_HEADER, "not_a_service"));
        }
    }

    #[test]
    fn the_pick_is_named_by_address_and_id() {
        let instance = Instance {
            id: PeerId([0xab; 32]),
            endpoint: "127.0.0.2:15006".parse().unwrap(),
            metadata: Default::default(),
            vouched_by: Vec::new(),
        };
        let mesh = MeshName::new("demo").unwrap();
        let [(d, destination), (p, peer)] = pick_headers(&instance, Transport::Themis, &mesh);
        assert_eq!(
            (d, destination.as_str()),
            (DESTINATION_HEADER, "127.0.0.2:15006")
        );
        assert_eq!((p, peer), (PEER_HEADER, "ab".repeat(32)));
        // TLS: the SNI name, which names the same id.
        let [_, (_, sni)] = pick_headers(&instance, Transport::Tls, &mesh);
        assert_eq!(
            themis_core::identity::id_of_sni_name(&sni),
            Some((mesh, instance.id))
        );
    }

    #[test]
    fn only_upstream_failures_mark_an_instance_down() {
        assert!(upstream_failed(0x10) && upstream_failed(0x20) && upstream_failed(0x40));
        assert!(!upstream_failed(0) && !upstream_failed(0x1) && !upstream_failed(0x80));
    }

    #[test]
    fn every_rejection_is_counted() {
        let names = counter_names();
        for rejection in Rejection::ALL {
            assert!(names.contains(&rejection.counter()), "{rejection}");
        }
        assert!(names.contains(&"requests".to_string()));
    }
}
