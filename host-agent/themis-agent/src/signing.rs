//! Delegated signing: a workload's private key never leaves the agent. Its sidecar
//! knows only the public identity (`GET /v1/workloads/{workload}/identity`) and asks
//! the agent to sign each handshake message it sends
//! (`POST /v1/workloads/{workload}/sign`).
//!
//! The agent is not a general signing oracle: it signs only a Themis handshake
//! message of that very workload. The request carries the unsigned message body (and,
//! for message 2, the hash of the message 1 it answers); the agent decodes the body,
//! checks version, kind and that it names the workload's own key (and id and mesh),
//! computes the protocol's domain-separated digest itself and signs that
//! ([`themis_core::handshake::sign_message`]). No other statement (a registry record,
//! a grant, a revocation) can be obtained this way: those are signed over different,
//! longer inputs. Who may call the endpoint (the workload's own proxy) is decided by
//! the API's caller authorisation, before the handler runs.
//!
//! ```text
//! POST /v1/workloads/{workload}/sign
//!   {"kind": "hello" | "hello_reply", "body": "<hex>", "hello_hash": "<hex>"?}
//!   → 200 {"signature": "<hex>"}
//! GET /v1/workloads/{workload}/identity
//!   → 200 {"workload", "mesh", "id", "public_key"}
//! POST /v1/workloads/{workload}/delegate          (wire v3)
//!   {"delegated_key": "<hex>", "lifetime_secs": n?}
//!   → 200 {"identity", "delegation", "not_after_ms", "renew_at_ms", "service", "endorsement"}
//! ```
//!
//! Wire v3 moves the signing of each handshake into the proxy: it generates a
//! short-lived key and the agent signs a delegation to it with the workload key
//! ([`themis_core::delegation`]), refused once the workload is revoked. The workload
//! key still never leaves the agent; a proxy holds a key that speaks for its workload
//! until the delegation's `not_after`: what it asks (one hour if it does not say),
//! capped at the agent's `max_delegation_secs` (one hour by default, at most a day).
//! Each workload's delegations are rate-limited (`delegations_per_minute`,
//! `delegation_burst`: 429 over them) and each delegated key is logged, so a
//! compromised proxy can neither mint keys without bound nor unseen.

use std::sync::Arc;

use axum::extract::rejection::JsonRejection;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use themis_core::delegation::{self, Delegation};
use themis_core::handshake::{self, SigningError, ToSign};
use themis_core::wire::{Kind, MAX_HANDSHAKE_LEN};
use themis_core::Identity;

use crate::names::{NameError, WorkloadName};
use crate::registry::{Registry, RegistryError};
use crate::trust::unix_millis;

pub use themis_contracts::api::{
    CertificateRequest, DelegateRequest, Delegated, IssuedCertificate, SignRequest, SignResponse,
};

/// Why the agent did not sign.
#[derive(Debug, thiserror::Error)]
pub enum SignError {
    /// The workload name is not a valid name.
    #[error(transparent)]
    Name(#[from] NameError),
    /// This node has no such workload.
    #[error("no workload {0} on this node")]
    UnknownWorkload(WorkloadName),
    /// The workload's key cannot be read.
    #[error("the workload's key cannot be read: {0}")]
    Storage(RegistryError),
    /// The request body is not the JSON expected.
    #[error("{0}")]
    Json(String),
    /// `kind` is neither `hello` nor `hello_reply`.
    #[error("kind must be \"hello\" or \"hello_reply\", not {0:?}")]
    Kind(String),
    /// `body` or `hello_hash` is not hex (or the hash is not 32 bytes).
    #[error("{0} must be hexadecimal{1}")]
    Hex(&'static str, &'static str),
    /// The body is longer than any handshake message.
    #[error("the body is {0} bytes; a handshake message body is at most {MAX_HANDSHAKE_LEN}")]
    TooLarge(usize),
    /// The body is not a handshake message of this workload (see [`SigningError`]).
    #[error("refused to sign: {0}")]
    Refused(#[from] SigningError),
}

impl SignError {
    /// The stable reason: the API's `reason` and the refusal metric's label.
    pub fn reason(&self) -> &'static str {
        match self {
            SignError::Name(_) | SignError::Json(_) => "bad_request",
            SignError::UnknownWorkload(_) => "not_found",
            SignError::Storage(_) => "local_storage",
            SignError::Kind(_) => "bad_kind",
            SignError::Hex(..) => "bad_hex",
            SignError::TooLarge(_) => "too_large",
            SignError::Refused(e) => e.reason(),
        }
    }

    fn status(&self) -> StatusCode {
        match self {
            SignError::Name(_)
            | SignError::Json(_)
            | SignError::Kind(_)
            | SignError::Hex(..)
            | SignError::TooLarge(_) => StatusCode::BAD_REQUEST,
            SignError::UnknownWorkload(_) => StatusCode::NOT_FOUND,
            SignError::Storage(_) => StatusCode::INTERNAL_SERVER_ERROR,
            SignError::Refused(SigningError::NotMine) => StatusCode::FORBIDDEN,
            SignError::Refused(_) => StatusCode::UNPROCESSABLE_ENTITY,
        }
    }
}

/// The API's error answer: `{"error", "reason"}` with `status`.
fn refusal(status: StatusCode, error: impl std::fmt::Display, reason: &str) -> Response {
    let body = Json(themis_contracts::api::ErrorBody {
        error: error.to_string(),
        reason: reason.into(),
    });
    (status, body).into_response()
}

impl IntoResponse for SignError {
    fn into_response(self) -> Response {
        refusal(self.status(), &self, self.reason())
    }
}

impl From<RegistryError> for SignError {
    fn from(e: RegistryError) -> Self {
        match e {
            RegistryError::UnknownWorkload(w) => SignError::UnknownWorkload(w),
            e => SignError::Storage(e),
        }
    }
}

/// Reads a request into what [`handshake::signing_digest`] checks.
pub fn parse(request: &SignRequest) -> Result<ToSign, SignError> {
    let kind = match request.kind.as_str() {
        "hello" => Kind::Hello,
        "hello_reply" => Kind::HelloReply,
        other => return Err(SignError::Kind(other.chars().take(32).collect())),
    };
    if request.body.len() > 2 * MAX_HANDSHAKE_LEN {
        return Err(SignError::TooLarge(request.body.len() / 2));
    }
    let body = hex::decode(&request.body).map_err(|_| SignError::Hex("body", ""))?;
    let hello_hash = match &request.hello_hash {
        None => None,
        Some(h) => {
            let mut hash = [0u8; 32];
            hex::decode_to_slice(h, &mut hash)
                .map_err(|_| SignError::Hex("hello_hash", " (32 bytes)"))?;
            Some(hash)
        }
    };
    Ok(ToSign {
        kind,
        body,
        hello_hash,
    })
}

/// Signs `request` as `identity` if it is a handshake message of `identity`'s own
/// and, for a Hello, fresh by this clock.
pub fn sign(identity: &Identity, request: &SignRequest) -> Result<[u8; 64], SignError> {
    Ok(handshake::sign_message_at(
        identity,
        &parse(request)?,
        unix_millis(),
        themis_core::guard::DEFAULT_HELLO_WINDOW_MS,
    )?)
}

/// The workload's identity and the signature for `request`: what
/// `POST /v1/workloads/{workload}/sign` answers.
pub fn sign_for(
    registry: &Registry,
    workload: &str,
    request: &SignRequest,
) -> Result<SignResponse, SignError> {
    let workload = WorkloadName::new(workload)?;
    let identity = registry.workload_identity(&workload)?;
    let signature = sign(&identity, request)?;
    Ok(SignResponse {
        signature: hex::encode(signature),
    })
}

/// `POST /v1/workloads/{workload}/sign`. Who may call it is the API's caller
/// authorisation's decision (it runs before this handler); signatures and refusals
/// are counted (`themis_handshake_signatures`, `themis_handshake_sign_refused`).
pub async fn sign_route(
    State(r): State<Arc<Registry>>,
    Path(workload): Path<String>,
    body: Result<Json<SignRequest>, JsonRejection>,
) -> Response {
    let result = match body {
        Ok(Json(request)) => sign_for(&r, &workload, &request).map(|s| (request.kind, s)),
        Err(e) => {
            let status = e.status();
            let error = SignError::Json(e.body_text());
            r.metrics().sign_refused(error.reason());
            return refusal(status, &error, error.reason());
        }
    };
    match result {
        Ok((kind, signature)) => {
            r.metrics().signed(if kind == "hello" {
                "hello"
            } else {
                "hello_reply"
            });
            Json(signature).into_response()
        }
        Err(error) => {
            r.metrics().sign_refused(error.reason());
            tracing::warn!(%workload, reason = error.reason(), %error, "refused to sign");
            error.into_response()
        }
    }
}

/// Why the agent did not delegate.
#[derive(Debug, thiserror::Error)]
pub enum DelegateError {
    /// As for signing: a bad name, an unknown workload, unreadable storage.
    #[error(transparent)]
    Workload(#[from] SignError),
    /// `delegated_key` is not 32 bytes of hex.
    #[error("delegated_key must be 32 bytes of hex")]
    Key,
    /// The mesh root revoked the workload: no new delegation.
    #[error("the workload {0} is revoked")]
    Revoked(String),
    /// The workload was given too many delegations lately
    /// ([`RegistryError::DelegationsLimited`]).
    #[error(transparent)]
    Limited(RegistryError),
    /// The TLS certificate could not be made.
    #[error("no certificate: {0}")]
    Certificate(#[from] themis_x509::IssueError),
}

impl DelegateError {
    /// The stable reason (API and metric label).
    pub fn reason(&self) -> &'static str {
        match self {
            DelegateError::Workload(e) => e.reason(),
            DelegateError::Key => "bad_hex",
            DelegateError::Revoked(_) => "revoked",
            DelegateError::Limited(_) => "rate_limited",
            DelegateError::Certificate(_) => "certificate",
        }
    }

    fn status(&self) -> StatusCode {
        match self {
            DelegateError::Workload(e) => e.status(),
            DelegateError::Key => StatusCode::BAD_REQUEST,
            DelegateError::Revoked(_) => StatusCode::FORBIDDEN,
            DelegateError::Limited(_) => StatusCode::TOO_MANY_REQUESTS,
            DelegateError::Certificate(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }
}

impl IntoResponse for DelegateError {
    fn into_response(self) -> Response {
        let mut response = refusal(self.status(), &self, self.reason());
        if let DelegateError::Limited(RegistryError::DelegationsLimited { retry_after, .. }) = self
        {
            let secs = retry_after.as_secs() + u64::from(retry_after.subsec_nanos() > 0);
            response.headers_mut().insert(
                axum::http::header::RETRY_AFTER,
                axum::http::HeaderValue::from(secs.max(1)),
            );
        }
        response
    }
}

fn public_identity(
    workload: WorkloadName,
    identity: &Identity,
) -> themis_contracts::api::PublicIdentity {
    themis_contracts::api::PublicIdentity {
        workload,
        mesh: identity.mesh().as_str().to_owned(),
        id: identity.printable_id(),
        public_key: hex::encode(identity.public_key()),
    }
}

/// How soon a proxy whose workload has no record yet asks again.
pub const UNENDORSED_RENEW_MS: u64 = 5_000;

/// Delegates `workload`'s handshake signing to the proxy's key in `request` at
/// `now_ms`, with the workload's current endorsement: what
/// `POST /v1/workloads/{workload}/delegate` answers.
pub async fn delegate_for(
    registry: &Registry,
    workload: &str,
    request: &DelegateRequest,
    now_ms: u64,
) -> Result<Delegated, DelegateError> {
    let mut key = [0u8; 32];
    hex::decode_to_slice(&request.delegated_key, &mut key).map_err(|_| DelegateError::Key)?;
    let asked = Delegating::of(registry, workload, request.lifetime_secs).await?;
    let d = Delegation::issue(&asked.identity, key, now_ms, asked.lifetime_ms);
    let renew_at_ms = asked.renew_at(registry, now_ms, &d);
    // Each delegated key is logged: it speaks for the workload until `not_after_ms`.
    tracing::info!(%workload, delegated_key = %request.delegated_key,
        not_after_ms = d.not_after_ms, capped_from_ms = asked.capped_from_ms,
        service = ?asked.endorsement.as_ref().map(|(s, _, _)| s),
        "delegated handshake signing to the proxy's key");
    Ok(Delegated {
        identity: public_identity(asked.workload, &asked.identity),
        delegation: hex::encode(d.encode()),
        not_after_ms: d.not_after_ms,
        renew_at_ms,
        service: asked.endorsement.as_ref().map(|(s, _, _)| s.clone()),
        endorsement: asked.endorsement.map(|(_, value, _)| hex::encode(value)),
    })
}

/// What a delegation of either purpose rests on: the workload, its key (not revoked),
/// the lifetime (what was asked, capped at the agent's maximum), and its current
/// endorsement (service, value, when signed).
struct Delegating {
    workload: WorkloadName,
    identity: Identity,
    lifetime_ms: u64,
    /// What the proxy asked for, when more than it was given (for the log).
    capped_from_ms: Option<u64>,
    endorsement: Option<(themis_contracts::ServiceName, Vec<u8>, u64)>,
}

impl Delegating {
    async fn of(
        registry: &Registry,
        workload: &str,
        lifetime_secs: Option<u64>,
    ) -> Result<Delegating, DelegateError> {
        let workload = WorkloadName::new(workload).map_err(SignError::from)?;
        let identity = registry
            .workload_identity(&workload)
            .map_err(SignError::from)?;
        if registry.trust().is_revoked(&identity.id()) {
            return Err(DelegateError::Revoked(identity.printable_id()));
        }
        registry
            .take_delegation(&workload, std::time::Instant::now())
            .map_err(DelegateError::Limited)?;
        let asked_ms =
            lifetime_secs.map_or(delegation::DEFAULT_LIFETIME_MS, |s| s.saturating_mul(1000));
        let lifetime_ms = asked_ms.min(registry.max_delegation_ms());
        let endorsement = registry.endorsement_of(&workload).await;
        Ok(Delegating {
            workload,
            identity,
            lifetime_ms,
            capped_from_ms: (asked_ms > lifetime_ms).then_some(asked_ms),
            endorsement,
        })
    }

    /// When to ask again: at half the delegation's life, or once the record was
    /// renewed (the agent re-signs it at half its life), whichever is first; a
    /// workload with no record yet (its sidecar started before it registered) soon,
    /// so that what it presents carries the endorsement within seconds of the
    /// registration.
    fn renew_at(&self, registry: &Registry, now_ms: u64, d: &Delegation) -> u64 {
        self.endorsement
            .as_ref()
            .map_or(now_ms + UNENDORSED_RENEW_MS, |(_, _, signed)| {
                (signed + registry.record_ttl_ms() * 3 / 4).max(now_ms + 1000)
            })
            .min(d.renew_at_ms())
    }
}

/// A TLS certificate for the workload's proxy (docs/PROTOCOL.md §8): a fresh ECDSA
/// P-256 key, delegated by the workload key (`Purpose::TlsKey`), in a certificate
/// that carries the delegation and the workload's endorsement and names its
/// principal and SNI name.
pub async fn certificate_for(
    registry: &Registry,
    workload: &str,
    request: &CertificateRequest,
    now_ms: u64,
) -> Result<IssuedCertificate, DelegateError> {
    let asked = Delegating::of(registry, workload, request.lifetime_secs).await?;
    let rng = ring::rand::SystemRandom::new();
    let key = themis_x509::TlsKey::generate(&rng)?;
    let d = themis_x509::delegate(&asked.identity, &key, now_ms, asked.lifetime_ms);
    let mesh = asked.identity.mesh();
    let id = asked.identity.id();
    let service = asked.endorsement.as_ref().map(|(s, _, _)| s.clone());
    let principal = themis_x509::principal(mesh, &id, service.as_ref().map(|s| s.as_str()));
    tracing::info!(%workload, tls_key_spki_sha256 = %hex::encode(key.spki_sha256()),
        not_after_ms = d.not_after_ms, %principal, capped_from_ms = asked.capped_from_ms,
        "made a TLS certificate for the proxy");
    let proof = themis_x509::Proof {
        version: themis_x509::PROOF_VERSION,
        mesh: mesh.as_str().to_owned(),
        workload_key: *asked.identity.public_key(),
        delegation: d,
        endorsement: asked
            .endorsement
            .as_ref()
            .map(|(_, value, _)| value.clone())
            .unwrap_or_default(),
    };
    let certificate = themis_x509::issue(&key, &proof, &principal, &rng)?;
    Ok(IssuedCertificate {
        renew_at_ms: asked.renew_at(registry, now_ms, &d),
        identity: public_identity(asked.workload, &asked.identity),
        certificate: hex::encode(certificate),
        private_key: hex::encode(key.pkcs8_der()),
        principal,
        sni_name: themis_x509::sni_name(&id, mesh),
        not_after_ms: d.not_after_ms,
        service,
    })
}

/// `POST /v1/workloads/{workload}/certificate`: as `/delegate`, for a TLS key the
/// agent makes (the proxy's TLS context takes key and certificate together); counted
/// `themis_handshake_signatures{kind="certificate"}`.
pub async fn certificate_route(
    State(r): State<Arc<Registry>>,
    Path(workload): Path<String>,
    body: Result<Json<CertificateRequest>, JsonRejection>,
) -> Response {
    let result = match body {
        Ok(Json(request)) => certificate_for(&r, &workload, &request, unix_millis()).await,
        Err(e) => return bad_request(&r, e),
    };
    answer(&r, &workload, "certificate", result)
}

/// `POST /v1/workloads/{workload}/delegate`. Who may call it is the API's caller
/// authorisation's decision (the workload's own proxy, as for `/sign`); delegations
/// and refusals are counted (`themis_handshake_signatures{kind="delegation"}`,
/// `themis_handshake_sign_refused`).
pub async fn delegate_route(
    State(r): State<Arc<Registry>>,
    Path(workload): Path<String>,
    body: Result<Json<DelegateRequest>, JsonRejection>,
) -> Response {
    let result = match body {
        Ok(Json(request)) => delegate_for(&r, &workload, &request, unix_millis()).await,
        Err(e) => return bad_request(&r, e),
    };
    answer(&r, &workload, "delegation", result)
}

/// A body that does not parse: counted and refused.
fn bad_request(r: &Registry, e: JsonRejection) -> Response {
    r.metrics().sign_refused("bad_request");
    refusal(e.status(), e.body_text(), "bad_request")
}

/// A delegation's answer (of `kind`, the metric's label), or its refusal: counted,
/// and a refusal logged.
fn answer<T: serde::Serialize>(
    r: &Registry,
    workload: &str,
    kind: &'static str,
    result: Result<T, DelegateError>,
) -> Response {
    match result {
        Ok(answer) => {
            r.metrics().signed(kind);
            Json(answer).into_response()
        }
        Err(error) => {
            r.metrics().sign_refused(error.reason());
            tracing::warn!(%workload, kind, reason = error.reason(), %error, "refused");
            error.into_response()
        }
    }
}

/// `GET /v1/workloads/{workload}/identity`: the public identity, all a sidecar needs.
pub async fn identity_route(
    State(r): State<Arc<Registry>>,
    Path(workload): Path<String>,
) -> Response {
    let result = WorkloadName::new(&workload)
        .map_err(SignError::from)
        .and_then(|w| Ok((r.workload_identity(&w)?, w)));
    match result {
        Ok((identity, workload)) => Json(public_identity(workload, &identity)).into_response(),
        Err(error) => error.into_response(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ring::rand::SystemRandom;
    use themis_core::handshake::Initiator;
    use themis_core::{HandshakeConfig, MeshName};

    fn request(to_sign: &ToSign) -> SignRequest {
        SignRequest {
            kind: match to_sign.kind {
                Kind::Hello => "hello".into(),
                _ => "hello_reply".into(),
            },
            body: hex::encode(&to_sign.body),
            hello_hash: to_sign.hello_hash.map(hex::encode),
        }
    }

    #[test]
    fn signs_only_its_own_hello() {
        let rng = SystemRandom::new();
        let mesh = MeshName::new("test").unwrap();
        let me = Identity::generate(mesh.clone(), &rng).unwrap();
        let other = Identity::generate(mesh, &rng).unwrap();
        let now_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis() as u64;
        let pending = Initiator::start_unsigned(
            me.public(),
            other.id(),
            &HandshakeConfig::default(),
            now_ms,
            &rng,
        )
        .unwrap();
        let req = request(&pending.to_sign());
        let signature = sign(&me, &req).unwrap();
        assert!(pending.finish(&signature).is_ok());
        assert!(matches!(
            sign(&other, &req),
            Err(SignError::Refused(SigningError::NotMine))
        ));
        let bad_kind = SignRequest {
            kind: "confirm".into(),
            ..req.clone()
        };
        assert_eq!(sign(&me, &bad_kind).unwrap_err().reason(), "bad_kind");
        let reply_kind = SignRequest {
            kind: "hello_reply".into(),
            ..req.clone()
        };
        assert_eq!(sign(&me, &reply_kind).unwrap_err().reason(), "hello_hash");
        let huge = SignRequest {
            body: "00".repeat(MAX_HANDSHAKE_LEN + 1),
            ..req
        };
        assert_eq!(sign(&me, &huge).unwrap_err().reason(), "too_large");
    }
}
