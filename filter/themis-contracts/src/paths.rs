//! The agent's local API paths. Clients build them with the functions here; the
//! agent's router declares the same paths from [`route`], and a test checks that each
//! builder, given the route's parameter names, spells its route.
//!
//! Builders take any `AsRef<str>` (a [`ServiceName`](crate::ServiceName), a
//! [`WorkloadName`](crate::WorkloadName), or text the agent is to judge) and put it in
//! the path as is: checked names never need escaping; a caller passing unchecked text
//! refuses `/`, `?`, `#` and `%` first (the `themis` tool does).

use alloc::format;
use alloc::string::String;

/// `GET`: this node (an [`api::Status`](crate::api::Status)).
pub const STATUS: &str = "/v1/status";
/// `GET`: successor list, predecessor, fingers, objects held.
pub const RING: &str = "/v1/ring";
/// `GET`: the revocations this node knows ([`api::Revocations`](crate::api::Revocations));
/// `POST`: publish one ([`api::PublishRevocation`](crate::api::PublishRevocation)).
pub const REVOCATIONS: &str = "/v1/revocations";
/// [`REVOCATIONS`] as a long poll: answered at once if the node knows another number
/// of revocations than `known`, else when it learns one, or after `wait_ms` (at most
/// [`MAX_REVOCATIONS_WAIT_MS`]). A filter that holds `known` hears of a new revocation
/// as soon as its agent does.
pub fn revocations_after(known: usize, wait_ms: u64) -> String {
    format!("{REVOCATIONS}?known={known}&wait_ms={wait_ms}")
}

/// [`REVOCATIONS`] by page, the way a filter follows its agent: at most
/// [`MAX_REVOCATIONS_PAGE`] revocations from position `from` of the agent's list
/// `list` ([`api::Revocations::list`](crate::api::Revocations::list)), in the order
/// the agent learnt them. When there are none past `from`, held until one is learnt or
/// for `wait_ms` (at most [`MAX_REVOCATIONS_WAIT_MS`]; 0: answered at once). An agent
/// whose list is not `list` (it restarted) answers from its first.
pub fn revocations_since(list: u64, from: usize, wait_ms: u64) -> String {
    format!("{REVOCATIONS}?list={list}&from={from}&wait_ms={wait_ms}")
}

/// The most revocations one [`revocations_since`] answer carries (about 1.5 KB each
/// with a log proof: some 400 KB, well under any client's answer limit, however many
/// the mesh holds).
pub const MAX_REVOCATIONS_PAGE: usize = 256;

/// The longest an agent holds a [`revocations_after`] request: under the idle
/// timeout of the agent's TCP resolve listener (30 s), which serves it too.
pub const MAX_REVOCATIONS_WAIT_MS: u64 = 25_000;

/// `GET`: the trust log this node holds ([`api::LogStatus`](crate::api::LogStatus));
/// `POST`: the operator's whole copy of it (`application/octet-stream`, as
/// `<mesh dir>/trust-log.bin`), answered with [`api::LogPublished`](crate::api::LogPublished).
pub const LOG: &str = "/v1/log";
/// `GET`: this node's whole copy of the trust log (`application/octet-stream`).
pub const LOG_COPY: &str = "/v1/log/copy";
/// `GET`: local registrations ([`api::Workloads`](crate::api::Workloads)).
pub const WORKLOADS: &str = "/v1/workloads";
/// `GET`: eBPF capture on this node.
pub const CAPTURE: &str = "/v1/capture";
/// `POST`: raw `store`.
pub const DEBUG_STORE: &str = "/v1/debug/store";

/// `GET`: resolve `service` ([`api::Resolution`](crate::api::Resolution)).
pub fn service(service: impl AsRef<str>) -> String {
    format!("/v1/services/{}", service.as_ref())
}

/// [`service`], with `?fresh=true` (skip the agent's cache) or `?fresh=false`.
pub fn resolve(service: impl AsRef<str>, fresh: bool) -> String {
    format!("/v1/services/{}?fresh={fresh}", service.as_ref())
}

/// `GET`: every stored value of `service` and its verdict
/// ([`api::Explanation`](crate::api::Explanation)).
pub fn explain(service: impl AsRef<str>) -> String {
    format!("/v1/services/{}/explain", service.as_ref())
}

/// `PUT`: register ([`api::Register`](crate::api::Register) →
/// [`api::Registered`](crate::api::Registered)); `DELETE`: deregister
/// ([`api::Deregistered`](crate::api::Deregistered)).
pub fn instance(service: impl AsRef<str>, workload: impl AsRef<str>) -> String {
    format!(
        "/v1/services/{}/instances/{}",
        service.as_ref(),
        workload.as_ref()
    )
}

/// `PUT`: create the workload's identity if it has none
/// ([`api::WorkloadIdentity`](crate::api::WorkloadIdentity)).
pub fn workload(workload: impl AsRef<str>) -> String {
    format!("/v1/workloads/{}", workload.as_ref())
}

/// `GET`: the workload's key material, for its proxy
/// ([`api::KeyMaterial`](crate::api::KeyMaterial)).
pub fn workload_key(workload: impl AsRef<str>) -> String {
    format!("/v1/workloads/{}/key", workload.as_ref())
}

/// `GET`: the workload's public identity, for its proxy.
pub fn workload_identity(workload: impl AsRef<str>) -> String {
    format!("/v1/workloads/{}/identity", workload.as_ref())
}

/// `POST`: the agent signs for the workload, for its proxy.
pub fn workload_sign(workload: impl AsRef<str>) -> String {
    format!("/v1/workloads/{}/sign", workload.as_ref())
}

/// `POST`: the agent delegates handshake signing to the proxy's own short-lived key
/// ([`api::DelegateRequest`](crate::api::DelegateRequest)).
pub fn workload_delegate(workload: impl AsRef<str>) -> String {
    format!("/v1/workloads/{}/delegate", workload.as_ref())
}

/// `POST`: the agent makes a TLS certificate for the workload's proxy: a fresh ECDSA
/// P-256 key and its certificate, the key delegated by the workload key
/// ([`api::CertificateRequest`](crate::api::CertificateRequest); docs/PROTOCOL.md §8).
pub fn workload_certificate(workload: impl AsRef<str>) -> String {
    format!("/v1/workloads/{}/certificate", workload.as_ref())
}

/// `GET`: raw `find` of a 64-hex-digit key.
pub fn debug_find(key: impl AsRef<str>) -> String {
    format!("/v1/debug/find/{}", key.as_ref())
}

/// `GET`: raw `resolve` of `name` over `replicas + 1` replicas.
pub fn debug_values(name: impl AsRef<str>, replicas: u8) -> String {
    format!("/v1/debug/values/{}?replicas={replicas}", name.as_ref())
}

/// The same paths as route templates, for the agent's router (`{param}` segments).
pub mod route {
    pub use super::{CAPTURE, DEBUG_STORE, REVOCATIONS, RING, STATUS, WORKLOADS};
    /// [`service`](super::service).
    pub const SERVICE: &str = "/v1/services/{service}";
    /// [`explain`](super::explain).
    pub const EXPLAIN: &str = "/v1/services/{service}/explain";
    /// [`instance`](super::instance).
    pub const INSTANCE: &str = "/v1/services/{service}/instances/{workload}";
    /// [`workload`](super::workload).
    pub const WORKLOAD: &str = "/v1/workloads/{workload}";
    /// [`workload_key`](super::workload_key).
    pub const WORKLOAD_KEY: &str = "/v1/workloads/{workload}/key";
    /// [`workload_identity`](super::workload_identity).
    pub const WORKLOAD_IDENTITY: &str = "/v1/workloads/{workload}/identity";
    /// [`workload_sign`](super::workload_sign).
    pub const WORKLOAD_SIGN: &str = "/v1/workloads/{workload}/sign";
    /// [`workload_delegate`](super::workload_delegate).
    pub const WORKLOAD_DELEGATE: &str = "/v1/workloads/{workload}/delegate";
    /// [`workload_certificate`](super::workload_certificate).
    pub const WORKLOAD_CERTIFICATE: &str = "/v1/workloads/{workload}/certificate";
    /// [`debug_find`](super::debug_find).
    pub const DEBUG_FIND: &str = "/v1/debug/find/{key}";
    /// [`debug_values`](super::debug_values).
    pub const DEBUG_VALUES: &str = "/v1/debug/values/{name}";
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{ServiceName, WorkloadName};

    #[test]
    fn builders_spell_the_routes() {
        assert_eq!(service("{service}"), route::SERVICE);
        assert_eq!(explain("{service}"), route::EXPLAIN);
        assert_eq!(instance("{service}", "{workload}"), route::INSTANCE);
        assert_eq!(workload("{workload}"), route::WORKLOAD);
        assert_eq!(workload_key("{workload}"), route::WORKLOAD_KEY);
        assert_eq!(workload_identity("{workload}"), route::WORKLOAD_IDENTITY);
        assert_eq!(workload_sign("{workload}"), route::WORKLOAD_SIGN);
        assert_eq!(workload_delegate("{workload}"), route::WORKLOAD_DELEGATE);
        assert_eq!(
            workload_certificate("{workload}"),
            route::WORKLOAD_CERTIFICATE
        );
        assert_eq!(debug_find("{key}"), route::DEBUG_FIND);
        assert_eq!(
            debug_values("{name}", 2),
            alloc::format!("{}?replicas=2", route::DEBUG_VALUES)
        );
        assert_eq!(
            resolve("{service}", true),
            alloc::format!("{}?fresh=true", route::SERVICE)
        );
    }

    #[test]
    fn checked_names_go_in_as_they_are() {
        let svc = ServiceName::new("check.default.svc").unwrap();
        let w = WorkloadName::new("web-1.prod").unwrap();
        assert_eq!(service(&svc), "/v1/services/check.default.svc");
        assert_eq!(
            instance(&svc, &w),
            "/v1/services/check.default.svc/instances/web-1.prod"
        );
        assert_eq!(workload_key(&w), "/v1/workloads/web-1.prod/key");
    }
}
