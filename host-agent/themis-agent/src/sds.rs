//! The proxies' TLS certificates over Envoy's secret discovery service (SDS): gRPC on
//! the local API's own socket, so a proxy needs no file and no hostPath, and the
//! certificate is renewed before it expires with nothing for the proxy to run.
//!
//! A secret's name is the workload's name. Its certificate is the TLS binding's
//! (docs/PROTOCOL.md §8, [`crate::signing::certificate_for`]): a fresh P-256 key the
//! workload key delegates, with the workload's endorsement. Who may ask is decided as
//! for `POST /v1/workloads/{workload}/certificate`: the workload's own proxy (the
//! cgroup and uid it is bound to) or the operator; anyone else's stream ends with
//! `PERMISSION_DENIED`, counted (`themis_api_refused_total{reason="not_owner"}`, …).
//!
//! Istio's name [`OWN_SECRET`] (`default`, what an Istio sidecar's Envoy asks for when
//! pilot-agent points it at this socket) stands for the caller's own workload: the one
//! workload bound to the caller's pod and uid; its secret is sent under that name.
//!
//! [`Subscription`] is the protocol (state of the world, one stream): what Envoy asked
//! for, its ACKs and NACKs; [`Sds`] drives it: it answers a new set of names at once,
//! and pushes a new certificate at the time the agent said to renew (half the
//! delegation's life, or soon after the workload's record is renewed).

use std::sync::Arc;
use std::time::Duration;

use axum::extract::{ConnectInfo, State};
use axum::response::{IntoResponse, Response};
use prost::Message;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Status, Streaming};

pub use xds::{Any, DataSource, DiscoveryRequest, DiscoveryResponse, Secret, TlsCertificate};

use crate::caller::{Caller, Need, Peer, Refusal};
use crate::names::WorkloadName;
use crate::registry::Registry;
use crate::trust::unix_millis;

/// The type of every resource this service serves.
pub const SECRET_TYPE: &str =
    "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.Secret";
/// The path Envoy's gRPC client posts the stream to (the router's route).
pub const STREAM_SECRETS_PATH: &str =
    "/envoy.service.secret.v3.SecretDiscoveryService/StreamSecrets";
/// Secrets one stream may ask for (Envoy asks for one).
pub const MAX_NAMES: usize = 16;
/// Istio's name for a proxy's own certificate: the caller's own workload, whatever
/// its name (never a workload named so).
pub const OWN_SECRET: &str = "default";

/// What a request of the stream asks of the server.
#[derive(Debug, PartialEq, Eq)]
pub enum Asked {
    /// A new set of secrets: answer it now.
    Names(Vec<WorkloadName>),
    /// Envoy took the last response.
    Ack,
    /// Envoy refused the last response, for this reason (it keeps what it had).
    Nack(String),
    /// About a response older than the last one: nothing to do.
    Stale,
}

/// One SDS stream's state of the world: the names asked for and what was sent.
#[derive(Debug, Default)]
pub struct Subscription {
    names: Vec<WorkloadName>,
    /// The last response's version and nonce (a counter: each response is new).
    sent: u64,
}

impl Subscription {
    /// Reads one request (xDS state of the world: a request that repeats the last
    /// nonce ACKs or NACKs it; one with another nonce is about an older response).
    pub fn on_request(&mut self, request: &DiscoveryRequest) -> Result<Asked, Status> {
        if !request.type_url.is_empty() && request.type_url != SECRET_TYPE {
            return Err(Status::invalid_argument(format!(
                "this server serves {SECRET_TYPE} only, not {}",
                request.type_url
            )));
        }
        if !request.response_nonce.is_empty() && request.response_nonce != self.sent.to_string() {
            return Ok(Asked::Stale);
        }
        if request.resource_names.len() > MAX_NAMES {
            return Err(Status::invalid_argument(format!(
                "at most {MAX_NAMES} secrets a stream"
            )));
        }
        let mut names = request
            .resource_names
            .iter()
            .map(|name| {
                WorkloadName::new(name).map_err(|e| {
                    Status::invalid_argument(format!("a secret is named by its workload: {e}"))
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        names.sort();
        names.dedup();
        if names != self.names || self.sent == 0 {
            self.names = names.clone();
            return Ok(Asked::Names(names));
        }
        match &request.error_detail {
            Some(status) => Ok(Asked::Nack(status.message.clone())),
            None => Ok(Asked::Ack),
        }
    }

    /// The names the stream holds.
    pub fn names(&self) -> &[WorkloadName] {
        &self.names
    }

    /// The next response, with `secrets` (every name the stream holds).
    pub fn response(&mut self, secrets: &[Secret]) -> DiscoveryResponse {
        self.sent += 1;
        DiscoveryResponse {
            version_info: self.sent.to_string(),
            resources: secrets
                .iter()
                .map(|s| Any {
                    type_url: SECRET_TYPE.to_owned(),
                    value: s.encode_to_vec(),
                })
                .collect(),
            type_url: SECRET_TYPE.to_owned(),
            nonce: self.sent.to_string(),
        }
    }
}

/// The secret Envoy loads under `name` (the workload's, or [`OWN_SECRET`]): a
/// certificate and key, PEM.
pub fn tls_secret(name: &WorkloadName, certificate_der: &[u8], key_pkcs8: &[u8]) -> Secret {
    let inline = |pem: String| DataSource {
        inline_bytes: Some(pem.into_bytes()),
    };
    Secret {
        name: name.to_string(),
        tls_certificate: Some(TlsCertificate {
            certificate_chain: Some(inline(themis_x509::pem("CERTIFICATE", certificate_der))),
            private_key: Some(inline(themis_x509::pem("PRIVATE KEY", key_pkcs8))),
        }),
    }
}

/// `POST` [`STREAM_SECRETS_PATH`]: one SDS stream (gRPC's framing and status by
/// tonic), for the caller the kernel named when it connected. Envoy's delta and fetch
/// methods are other paths: the router answers them 404 (gRPC `UNIMPLEMENTED`).
pub async fn stream_secrets(
    State(registry): State<Arc<Registry>>,
    ConnectInfo(Peer(caller)): ConnectInfo<Peer>,
    request: axum::extract::Request,
) -> Response {
    let service = StreamSecrets { registry, caller };
    tonic::server::Grpc::new(tonic_prost::ProstCodec::default())
        .streaming(service, request)
        .await
        .into_response()
}

/// One stream's service: its caller and the registry.
struct StreamSecrets {
    registry: Arc<Registry>,
    caller: Option<Caller>,
}

impl tonic::server::StreamingService<DiscoveryRequest> for StreamSecrets {
    type Response = DiscoveryResponse;
    type ResponseStream = ReceiverStream<Result<DiscoveryResponse, Status>>;
    type Future = std::future::Ready<Result<tonic::Response<Self::ResponseStream>, Status>>;

    fn call(&mut self, request: tonic::Request<Streaming<DiscoveryRequest>>) -> Self::Future {
        let (out, answers) = mpsc::channel(2);
        tokio::spawn(serve(
            self.registry.clone(),
            self.caller.take(),
            request.into_inner(),
            out,
        ));
        std::future::ready(Ok(tonic::Response::new(ReceiverStream::new(answers))))
    }
}

/// Back-off after a certificate could not be made (the workload is not known yet,
/// say): doubling from 1 s to 30 s.
const RETRY_FIRST: Duration = Duration::from_secs(1);
const RETRY_MAX: Duration = Duration::from_secs(30);

/// One stream, until Envoy or the answer channel goes.
async fn serve(
    registry: Arc<Registry>,
    caller: Option<Caller>,
    mut requests: Streaming<DiscoveryRequest>,
    out: mpsc::Sender<Result<DiscoveryResponse, Status>>,
) {
    let mut subscription = Subscription::default();
    // Each name asked for, with the workload it stands for.
    let mut targets: Vec<(WorkloadName, WorkloadName)> = Vec::new();
    let mut next: Option<tokio::time::Instant> = None;
    let mut retry = RETRY_FIRST;
    // A client that half-closes (a one-shot `curl`) still gets the answer it asked
    // for; then the stream ends.
    let (mut open, mut unanswered) = (true, false);
    loop {
        if !open && !unanswered {
            return;
        }
        let due = async {
            match next {
                Some(at) => tokio::time::sleep_until(at).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            request = requests.message(), if open => {
                let request = match request {
                    Ok(Some(request)) => request,
                    Ok(None) => {
                        open = false;
                        continue;
                    }
                    Err(_) => return,
                };
                let asked = match subscription.on_request(&request) {
                    Ok(Asked::Names(names)) => authorize(&registry, caller.as_ref(), &names)
                        .map(|resolved| {
                            targets = resolved;
                            Asked::Names(names)
                        }),
                    other => other,
                };
                match asked {
                    Ok(Asked::Names(_)) => {
                        next = Some(tokio::time::Instant::now());
                        unanswered = true;
                    }
                    Ok(Asked::Nack(reason)) => tracing::warn!(
                        names = ?subscription.names(), %reason,
                        "the proxy refused the certificate it was sent"
                    ),
                    Ok(Asked::Ack | Asked::Stale) => {}
                    Err(status) => {
                        let _ = out.send(Err(status)).await;
                        return;
                    }
                }
            }
            () = due => {
                match secrets(&registry, &targets).await {
                    Ok((secrets, renew_at_ms)) => {
                        let response = subscription.response(&secrets);
                        if out.send(Ok(response)).await.is_err() {
                            return;
                        }
                        unanswered = false;
                        retry = RETRY_FIRST;
                        let wait = Duration::from_millis(renew_at_ms.saturating_sub(unix_millis()));
                        next = Some(tokio::time::Instant::now() + wait.max(RETRY_FIRST));
                    }
                    Err(error) => {
                        registry.metrics().sign_refused(error.reason());
                        tracing::warn!(names = ?subscription.names(), %error,
                            "no certificate for the proxy yet; trying again in {}s", retry.as_secs());
                        next = Some(tokio::time::Instant::now() + retry);
                        retry = (retry * 2).min(RETRY_MAX);
                    }
                }
            }
            () = out.closed() => return,
        }
    }
}

/// Each name with the workload it stands for, if the caller may have every one; a
/// refusal is counted and logged, and ends the stream.
fn authorize(
    registry: &Registry,
    caller: Option<&Caller>,
    names: &[WorkloadName],
) -> Result<Vec<(WorkloadName, WorkloadName)>, Status> {
    let mut targets = Vec::with_capacity(names.len());
    for name in names {
        let served = match name.as_str() == OWN_SECRET {
            true => own_workload(registry, caller),
            false => registry
                .access()
                .decide(caller, Need::Owner, registry.owners().get(name).as_ref())
                .map(|()| name.clone()),
        };
        match served {
            Ok(workload) => targets.push((name.clone(), workload)),
            Err(refusal) => {
                registry.metrics().api_refused(refusal.reason());
                tracing::warn!(?caller, workload = %name, reason = refusal.reason(),
                    "refused a proxy's certificate stream (SDS)");
                return Err(Status::permission_denied(format!("{name}: {refusal}")));
            }
        }
    }
    Ok(targets)
}

/// The one workload bound to the caller's pod and uid: whose proxy the caller is.
/// The operator, who may use any, has none of its own; a caller that is the proxy of
/// two workloads (two bound to one pod) gets neither.
fn own_workload(registry: &Registry, caller: Option<&Caller>) -> Result<WorkloadName, Refusal> {
    let caller = caller.ok_or(Refusal::NotOwner)?;
    if registry.access().operators.role(caller) != crate::caller::Role::Other {
        return Err(Refusal::NotOwner);
    }
    let mut own = registry.owners().all().into_iter().filter(|(_, owner)| {
        registry
            .access()
            .decide(Some(caller), Need::Owner, Some(owner))
            .is_ok()
    });
    match (own.next(), own.next()) {
        (Some((workload, _)), None) => Ok(workload),
        (None, _) => Err(Refusal::Unbound),
        (Some(_), Some(_)) => Err(Refusal::NotOwner),
    }
}

/// A fresh certificate for each name (of the workload it stands for), and when to
/// renew the first to need it.
async fn secrets(
    registry: &Registry,
    targets: &[(WorkloadName, WorkloadName)],
) -> Result<(Vec<Secret>, u64), crate::signing::DelegateError> {
    let request = themis_contracts::api::CertificateRequest {
        lifetime_secs: None,
    };
    let mut secrets = Vec::with_capacity(targets.len());
    let mut renew_at_ms = u64::MAX;
    for (name, workload) in targets {
        let issued =
            crate::signing::certificate_for(registry, workload.as_str(), &request, unix_millis())
                .await?;
        // The agent wrote both as hex a moment ago.
        let der = hex::decode(&issued.certificate).unwrap_or_default();
        let key = zeroize::Zeroizing::new(hex::decode(&issued.private_key).unwrap_or_default());
        secrets.push(tls_secret(name, &der, &key));
        registry.metrics().signed("certificate");
        tracing::info!(%workload, secret = %name, principal = %issued.principal,
            not_after_ms = issued.not_after_ms, "served a TLS certificate to the proxy (SDS)");
        renew_at_ms = renew_at_ms.min(issued.renew_at_ms);
    }
    Ok((secrets, renew_at_ms))
}

/// The xDS messages this service speaks, declared from Envoy's protos
/// (`envoy/service/discovery/v3/discovery.proto`,
/// `envoy/extensions/transport_sockets/tls/v3/{secret,common}.proto`,
/// `envoy/config/core/v3/base.proto`, `google/protobuf/any.proto`,
/// `google/rpc/status.proto`): only the fields it reads or writes, at their field
/// numbers; a decoder skips the others. (A crate of all of Envoy's generated types
/// cost the suite minutes of compile time for these few.)
#[allow(missing_docs)] // the fields are the protos' own, named as there
pub mod xds {
    /// `envoy.service.discovery.v3.DiscoveryRequest`.
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct DiscoveryRequest {
        #[prost(string, tag = "1")]
        pub version_info: String,
        #[prost(string, repeated, tag = "3")]
        pub resource_names: Vec<String>,
        #[prost(string, tag = "4")]
        pub type_url: String,
        #[prost(string, tag = "5")]
        pub response_nonce: String,
        /// Set on a NACK.
        #[prost(message, optional, tag = "6")]
        pub error_detail: Option<RpcStatus>,
    }

    /// `envoy.service.discovery.v3.DiscoveryResponse`.
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct DiscoveryResponse {
        #[prost(string, tag = "1")]
        pub version_info: String,
        #[prost(message, repeated, tag = "2")]
        pub resources: Vec<Any>,
        #[prost(string, tag = "4")]
        pub type_url: String,
        #[prost(string, tag = "5")]
        pub nonce: String,
    }

    /// `google.protobuf.Any`.
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Any {
        #[prost(string, tag = "1")]
        pub type_url: String,
        #[prost(bytes = "vec", tag = "2")]
        pub value: Vec<u8>,
    }

    /// `google.rpc.Status`.
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct RpcStatus {
        #[prost(int32, tag = "1")]
        pub code: i32,
        #[prost(string, tag = "2")]
        pub message: String,
    }

    /// `envoy.extensions.transport_sockets.tls.v3.Secret`: its `tls_certificate`
    /// (field 2 of the `type` oneof; a oneof member is on the wire as the field).
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Secret {
        #[prost(string, tag = "1")]
        pub name: String,
        #[prost(message, optional, tag = "2")]
        pub tls_certificate: Option<TlsCertificate>,
    }

    /// `envoy.extensions.transport_sockets.tls.v3.TlsCertificate`.
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct TlsCertificate {
        #[prost(message, optional, tag = "1")]
        pub certificate_chain: Option<DataSource>,
        #[prost(message, optional, tag = "2")]
        pub private_key: Option<DataSource>,
    }

    /// `envoy.config.core.v3.DataSource`: its `inline_bytes` (field 2 of the
    /// `specifier` oneof).
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct DataSource {
        #[prost(bytes = "vec", optional, tag = "2")]
        pub inline_bytes: Option<Vec<u8>>,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(names: &[&str], nonce: &str) -> DiscoveryRequest {
        DiscoveryRequest {
            resource_names: names.iter().map(|n| (*n).to_owned()).collect(),
            type_url: SECRET_TYPE.to_owned(),
            response_nonce: nonce.to_owned(),
            ..DiscoveryRequest::default()
        }
    }

    fn names(names: &[&str]) -> Vec<WorkloadName> {
        names
            .iter()
            .map(|n| WorkloadName::new(n).unwrap())
            .collect()
    }

    /// The first request is answered; its ACK is not; a NACK is reported; a new set of
    /// names is answered again; a request about an older response is stale.
    #[test]
    fn a_stream_answers_new_names_and_takes_acks() {
        let mut s = Subscription::default();
        assert_eq!(
            s.on_request(&request(&["w-b", "w-a", "w-a"], "")).unwrap(),
            Asked::Names(names(&["w-a", "w-b"])),
            "sorted, once each"
        );
        let sent = s.response(&[]);
        assert_eq!(
            (sent.nonce.as_str(), sent.version_info.as_str()),
            ("1", "1")
        );
        assert_eq!(
            s.on_request(&request(&["w-a", "w-b"], "1")).unwrap(),
            Asked::Ack
        );
        let mut nack = request(&["w-a", "w-b"], "1");
        nack.error_detail = Some(xds::RpcStatus {
            code: 3,
            message: "bad key".into(),
        });
        assert_eq!(s.on_request(&nack).unwrap(), Asked::Nack("bad key".into()));
        assert_eq!(
            s.on_request(&request(&["w-c"], "1")).unwrap(),
            Asked::Names(names(&["w-c"]))
        );
        s.response(&[]);
        assert_eq!(s.on_request(&request(&["w-a"], "1")).unwrap(), Asked::Stale);
    }

    /// A request for nothing is answered (with nothing) so Envoy is not left waiting.
    #[test]
    fn a_first_request_is_answered_even_for_no_names() {
        let mut s = Subscription::default();
        assert_eq!(
            s.on_request(&request(&[], "")).unwrap(),
            Asked::Names(vec![])
        );
    }

    /// Another resource type, a name that is no workload's, too many names: refused.
    #[test]
    fn a_stream_refuses_what_it_does_not_serve() {
        let mut s = Subscription::default();
        let mut other = request(&["w-a"], "");
        other.type_url = "type.googleapis.com/envoy.config.cluster.v3.Cluster".into();
        assert_eq!(
            s.on_request(&other).unwrap_err().code(),
            tonic::Code::InvalidArgument
        );
        assert_eq!(
            s.on_request(&request(&["../etc"], "")).unwrap_err().code(),
            tonic::Code::InvalidArgument
        );
        let many: Vec<String> = (0..=MAX_NAMES).map(|i| format!("w-{i}")).collect();
        let many: Vec<&str> = many.iter().map(String::as_str).collect();
        assert_eq!(
            s.on_request(&request(&many, "")).unwrap_err().code(),
            tonic::Code::InvalidArgument
        );
    }

    /// The secret is what Envoy's TLS context loads: PEM certificate and key, named
    /// by the workload, and it survives the wire.
    #[test]
    fn a_secret_carries_the_certificate_and_key_as_pem() {
        let w = WorkloadName::new("w-a").unwrap();
        let secret = tls_secret(&w, b"cert", b"key");
        let decoded = Secret::decode(secret.encode_to_vec().as_slice()).unwrap();
        assert_eq!(decoded.name, "w-a");
        let tls = decoded.tls_certificate.expect("a TLS certificate");
        let text =
            |d: Option<DataSource>| String::from_utf8(d.unwrap().inline_bytes.unwrap()).unwrap();
        assert_eq!(
            text(tls.certificate_chain),
            "-----BEGIN CERTIFICATE-----\nY2VydA==\n-----END CERTIFICATE-----\n"
        );
        assert!(text(tls.private_key).starts_with("-----BEGIN PRIVATE KEY-----\n"));
    }
}
