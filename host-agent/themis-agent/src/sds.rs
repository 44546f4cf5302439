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
//! [`Subscription`] is the protocol (state of the world, one stream): what Envoy asked
//! for, its ACKs and NACKs; [`Sds`] drives it: it answers a new set of names at once,
//! and pushes a new certificate at the time the agent said to renew (half the
//! delegation's life, or soon after the workload's record is renewed).

use std::sync::Arc;
use std::time::Duration;

use axum::extract::ConnectInfo;
use envoy_types::pb::envoy::config::core::v3::{data_source::Specifier, DataSource};
use envoy_types::pb::envoy::extensions::transport_sockets::tls::v3::{
    secret, Secret, TlsCertificate,
};
use envoy_types::pb::envoy::service::discovery::v3::{
    DeltaDiscoveryRequest, DeltaDiscoveryResponse, DiscoveryRequest, DiscoveryResponse,
};
use envoy_types::pb::envoy::service::secret::v3::secret_discovery_service_server::{
    SecretDiscoveryService, SecretDiscoveryServiceServer,
};
use envoy_types::pb::google::protobuf::Any;
use prost::Message;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status, Streaming};

use crate::caller::{Caller, Need, Peer};
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
            ..DiscoveryResponse::default()
        }
    }
}

/// The secret Envoy loads for `workload`: its certificate and key, PEM.
pub fn tls_secret(workload: &WorkloadName, certificate_der: &[u8], key_pkcs8: &[u8]) -> Secret {
    let inline = |pem: String| DataSource {
        specifier: Some(Specifier::InlineBytes(pem.into_bytes())),
        ..DataSource::default()
    };
    Secret {
        name: workload.to_string(),
        r#type: Some(secret::Type::TlsCertificate(TlsCertificate {
            certificate_chain: Some(inline(themis_x509::pem("CERTIFICATE", certificate_der))),
            private_key: Some(inline(themis_x509::pem("PRIVATE KEY", key_pkcs8))),
            ..TlsCertificate::default()
        })),
    }
}

/// The service, on `registry`'s workloads.
#[derive(Clone)]
pub struct Sds {
    registry: Arc<Registry>,
}

impl Sds {
    /// The gRPC service for the router ([`STREAM_SECRETS_PATH`]).
    pub fn service(registry: Arc<Registry>) -> SecretDiscoveryServiceServer<Sds> {
        SecretDiscoveryServiceServer::new(Sds { registry })
    }
}

#[tonic::async_trait]
impl SecretDiscoveryService for Sds {
    type StreamSecretsStream = ReceiverStream<Result<DiscoveryResponse, Status>>;
    type DeltaSecretsStream = ReceiverStream<Result<DeltaDiscoveryResponse, Status>>;

    async fn stream_secrets(
        &self,
        request: Request<Streaming<DiscoveryRequest>>,
    ) -> Result<Response<Self::StreamSecretsStream>, Status> {
        let caller = request
            .extensions()
            .get::<ConnectInfo<Peer>>()
            .and_then(|ConnectInfo(Peer(caller))| caller.clone());
        let (out, answers) = mpsc::channel(2);
        tokio::spawn(serve(
            self.registry.clone(),
            caller,
            request.into_inner(),
            out,
        ));
        Ok(Response::new(ReceiverStream::new(answers)))
    }

    async fn delta_secrets(
        &self,
        _: Request<Streaming<DeltaDiscoveryRequest>>,
    ) -> Result<Response<Self::DeltaSecretsStream>, Status> {
        Err(Status::unimplemented(
            "state-of-the-world SDS only (api_type: GRPC)",
        ))
    }

    async fn fetch_secrets(
        &self,
        _: Request<DiscoveryRequest>,
    ) -> Result<Response<DiscoveryResponse>, Status> {
        Err(Status::unimplemented(
            "state-of-the-world SDS only (api_type: GRPC)",
        ))
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
                let asked = subscription
                    .on_request(&request)
                    .and_then(|asked| authorize(&registry, caller.as_ref(), asked));
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
                match secrets(&registry, subscription.names()).await {
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

/// `asked`, if the caller may have every name it asks for; a refusal is counted and
/// logged, and ends the stream.
fn authorize(registry: &Registry, caller: Option<&Caller>, asked: Asked) -> Result<Asked, Status> {
    let Asked::Names(names) = &asked else {
        return Ok(asked);
    };
    for name in names {
        let owner = registry.owners().get(name);
        if let Err(refusal) = registry
            .access()
            .decide(caller, Need::Owner, owner.as_ref())
        {
            registry.metrics().api_refused(refusal.reason());
            tracing::warn!(?caller, workload = %name, reason = refusal.reason(),
                "refused a proxy's certificate stream (SDS)");
            return Err(Status::permission_denied(format!("{name}: {refusal}")));
        }
    }
    Ok(asked)
}

/// A fresh certificate for each name, and when to renew the first to need it.
async fn secrets(
    registry: &Registry,
    names: &[WorkloadName],
) -> Result<(Vec<Secret>, u64), crate::signing::DelegateError> {
    let request = themis_contracts::api::CertificateRequest {
        lifetime_secs: None,
    };
    let mut secrets = Vec::with_capacity(names.len());
    let mut renew_at_ms = u64::MAX;
    for name in names {
        let issued =
            crate::signing::certificate_for(registry, name.as_str(), &request, unix_millis())
                .await?;
        // The agent wrote both as hex a moment ago.
        let der = hex::decode(&issued.certificate).unwrap_or_default();
        let key = zeroize::Zeroizing::new(hex::decode(&issued.private_key).unwrap_or_default());
        secrets.push(tls_secret(name, &der, &key));
        registry.metrics().signed("certificate");
        tracing::info!(workload = %name, principal = %issued.principal,
            not_after_ms = issued.not_after_ms, "served a TLS certificate to the proxy (SDS)");
        renew_at_ms = renew_at_ms.min(issued.renew_at_ms);
    }
    Ok((secrets, renew_at_ms))
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
        nack.error_detail = Some(envoy_types::pb::google::rpc::Status {
            message: "bad key".into(),
            ..Default::default()
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
        let Some(secret::Type::TlsCertificate(tls)) = decoded.r#type else {
            panic!("a TLS certificate")
        };
        let text = |d: Option<DataSource>| match d.and_then(|d| d.specifier) {
            Some(Specifier::InlineBytes(b)) => String::from_utf8(b).unwrap(),
            other => panic!("inline bytes, not {other:?}"),
        };
        assert_eq!(
            text(tls.certificate_chain),
            "-----BEGIN CERTIFICATE-----\nY2VydA==\n-----END CERTIFICATE-----\n"
        );
        assert!(text(tls.private_key).starts_with("-----BEGIN PRIVATE KEY-----\n"));
    }
}
