//! The local API: HTTP + JSON on a Unix socket, for the node's proxies (Envoy reaches
//! it as a cluster), the `themis` tool and people with `curl --unix-socket`.
//!
//! | method and path | does |
//! |---|---|
//! | `GET /v1/status` | this node: id, mesh, addresses, ring membership |
//! | `GET /v1/ring` | successor list, predecessor, fingers, objects held |
//! | `GET /v1/services/{service}` | resolve to live endorsed instances (`?fresh=true` skips the cache) |
//! | `GET /v1/services/{service}/explain` | every stored value of the service and why it is or is not trusted |
//! | `GET /v1/revocations` | the revocations this node knows |
//! | `POST /v1/revocations` | publish a root-signed revocation `{"revocation": "<PEM>"}` |
//! | `PUT /v1/services/{service}/instances/{workload}` | register `{"endpoint": "ip:port", "metadata": {..}}` |
//! | `DELETE /v1/services/{service}/instances/{workload}` | deregister |
//! | `GET /v1/workloads` | local registrations, and bound workloads' owners |
//! | `PUT /v1/workloads/{workload}` | create the workload's identity if it has none |
//! | `DELETE /v1/workloads/{workload}` | delete a workload registered nowhere: its key and owner (a later workload of the name gets a new id) |
//! | `GET /v1/workloads/{workload}/identity` | the workload's public identity, for its proxy |
//! | `POST /v1/workloads/{workload}/sign` | sign one of the workload's handshake messages, for its proxy |
//! | `POST /v1/workloads/{workload}/delegate` | delegate handshake signing to the proxy's short-lived key (wire v3), with the workload's endorsement |
//! | `POST /v1/workloads/{workload}/certificate` | a TLS certificate for the proxy (docs/PROTOCOL.md §8): a fresh P-256 key the workload key delegates, with the endorsement |
//! | `GET /v1/workloads/{workload}/key` | the workload's private key (operator only) |
//! | `POST /envoy.service.secret.v3.SecretDiscoveryService/StreamSecrets` | Envoy's SDS (gRPC, HTTP/2): the proxy's TLS certificate, renewed and pushed before it expires ([`crate::sds`]) |
//! | `GET /v1/debug/find/{key}` | raw `find` of a 64-hex-digit key |
//! | `POST /v1/debug/store` | raw `store` `{"name", "value", "hex", "replicas", "ttl_ms"}` (the ring still verifies what it keeps) |
//! | `GET /v1/debug/values/{name}` | raw `resolve` (`?replicas=k`) |
//!
//! Errors are JSON `{"error": "...", "reason": "..."}` with a fitting status.
//!
//! Every call is authorised by its caller as the kernel names it ([`crate::caller`]):
//! reads of public ring data by anyone, a workload's identity and signatures by its
//! own proxy, everything else by the node's operator.
//!
//! With `--resolve-listen`, the agent also serves `GET /v1/status`,
//! `GET /v1/services/{service}` and `GET /v1/revocations` (by page only: a plain call is the first page; nothing else) over TCP, for clients that cannot use a
//! Unix socket, such as the component under `wasmtime run`.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use themis_capture::{CaptureError, CaptureSpec};

use axum::extract::rejection::JsonRejection;
use axum::extract::{
    ConnectInfo, DefaultBodyLimit, MatchedPath, Path, Query, RawPathParams, State,
};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post, put};
use axum::{Json, Router};
use serde::{Deserialize, Serialize};
use serde_json::json;
use themis_core::PeerId;
use themis_dht::Key;

use crate::caller::{BindError, Need, Peer, Role};
use crate::names::{NameError, ServiceName, WorkloadName};
use crate::overlay::OverlayError;
use crate::registry::{Registry, RegistryError};
use themis_contracts::api as contract;

/// Largest request body accepted.
const MAX_BODY: usize = 16 * 1024;
/// The largest trust log copy the operator may post (`POST /v1/log`).
const MAX_LOG_BODY: usize = themis_log::MAX_COPY_LEN;

/// An API error: status, message, stable reason.
#[derive(Debug)]
pub struct ApiError {
    status: StatusCode,
    reason: &'static str,
    message: String,
}

impl ApiError {
    fn new(status: StatusCode, reason: &'static str, message: impl ToString) -> Self {
        ApiError {
            status,
            reason,
            message: message.to_string(),
        }
    }

    fn bad_request(message: impl ToString) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "bad_request", message)
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = Json(contract::ErrorBody {
            error: self.message,
            reason: self.reason.into(),
        });
        (self.status, body).into_response()
    }
}

impl From<NameError> for ApiError {
    fn from(e: NameError) -> Self {
        ApiError::bad_request(e)
    }
}

impl From<JsonRejection> for ApiError {
    fn from(e: JsonRejection) -> Self {
        ApiError::new(e.status(), "bad_request", e.body_text())
    }
}

impl From<OverlayError> for ApiError {
    fn from(e: OverlayError) -> Self {
        let status = match e {
            OverlayError::Rejected(themis_dht::Rejection::NotJoined) | OverlayError::Stopped => {
                StatusCode::SERVICE_UNAVAILABLE
            }
            OverlayError::Rejected(_) => StatusCode::UNPROCESSABLE_ENTITY,
            OverlayError::NotFound { .. } => StatusCode::BAD_GATEWAY,
            OverlayError::Timeout => StatusCode::GATEWAY_TIMEOUT,
        };
        ApiError::new(status, e.reason(), e)
    }
}

impl From<RegistryError> for ApiError {
    fn from(e: RegistryError) -> Self {
        match e {
            RegistryError::Overlay(e) => e.into(),
            RegistryError::Record(_) => ApiError::bad_request(e),
            RegistryError::NotGranted { .. } => {
                ApiError::new(StatusCode::FORBIDDEN, "not_granted", e)
            }
            RegistryError::Revoked(_) => ApiError::new(StatusCode::FORBIDDEN, "revoked", e),
            RegistryError::NotBound { .. } => ApiError::new(StatusCode::FORBIDDEN, "not_bound", e),
            RegistryError::NoSubject { .. } => {
                ApiError::new(StatusCode::FORBIDDEN, "no_subject", e)
            }
            RegistryError::BadSubject(_) => ApiError::bad_request(e),
            RegistryError::NotRegistered { .. } | RegistryError::UnknownWorkload(_) => {
                ApiError::new(StatusCode::NOT_FOUND, "not_found", e)
            }
            RegistryError::StillRegistered { .. } => {
                ApiError::new(StatusCode::CONFLICT, "registered", e)
            }
            RegistryError::NotStored { .. } => {
                ApiError::new(StatusCode::BAD_GATEWAY, "not_stored", e)
            }
            RegistryError::CaptureDisabled => {
                ApiError::new(StatusCode::CONFLICT, "capture_disabled", e)
            }
            RegistryError::RateLimited { .. }
            | RegistryError::LookupsLimited { .. }
            | RegistryError::DelegationsLimited { .. } => {
                ApiError::new(StatusCode::TOO_MANY_REQUESTS, "rate_limited", e)
            }
            RegistryError::Capture(ref c) => match c {
                CaptureError::Spec(_) => ApiError::new(StatusCode::BAD_REQUEST, "bad_capture", e),
                CaptureError::OtherCgroup { .. } => {
                    ApiError::new(StatusCode::CONFLICT, "captured_elsewhere", e)
                }
                _ => ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "capture_failed", e),
            },
            RegistryError::Key(_) | RegistryError::Save { .. } | RegistryError::Unbind(_) => {
                ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "local_storage", e)
            }
        }
    }
}

impl From<BindError> for ApiError {
    fn from(e: BindError) -> Self {
        match e {
            BindError::Save { .. } => {
                ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "local_storage", e)
            }
            BindError::BadCgroup(_) | BindError::UidRequired => ApiError::bad_request(e),
            BindError::OutsideOwner { .. }
            | BindError::OtherUid { .. }
            | BindError::OutsidePod { .. } => {
                ApiError::new(StatusCode::FORBIDDEN, "outside_owner", e)
            }
        }
    }
}

type ApiResult = Result<Response, ApiError>;

fn ok(value: impl Serialize) -> ApiResult {
    Ok(Json(value).into_response())
}

/// The router of the local API.
pub fn router(registry: Arc<Registry>) -> Router {
    let full = Router::new()
        .route("/v1/status", get(status))
        .route("/v1/ring", get(ring))
        .route("/v1/services/{service}", get(resolve))
        .route("/v1/services/{service}/explain", get(explain))
        .route("/v1/revocations", get(revocations).post(publish_revocation))
        .route(
            "/v1/log",
            get(log_status)
                .post(publish_log)
                .layer(DefaultBodyLimit::max(MAX_LOG_BODY)),
        )
        .route("/v1/log/copy", get(log_copy))
        .route(
            "/v1/services/{service}/instances/{workload}",
            put(register).delete(deregister),
        )
        .route("/v1/workloads", get(workloads))
        .route("/v1/capture", get(capture_status))
        .route(
            "/v1/workloads/{workload}",
            put(create_workload).delete(delete_workload),
        )
        .route("/v1/workloads/{workload}/key", get(workload_key))
        .route(
            "/v1/workloads/{workload}/identity",
            get(crate::signing::identity_route),
        )
        .route(
            "/v1/workloads/{workload}/sign",
            post(crate::signing::sign_route),
        )
        .route(
            "/v1/workloads/{workload}/delegate",
            post(crate::signing::delegate_route),
        )
        .route(
            "/v1/workloads/{workload}/certificate",
            post(crate::signing::certificate_route),
        )
        .route("/v1/debug/find/{key}", get(debug_find))
        .route("/v1/debug/store", post(debug_store))
        .route("/v1/debug/values/{name}", get(debug_values))
        // Every matched route: the caller the kernel names must be allowed to call it.
        .route_layer(axum::middleware::from_fn_with_state(
            registry.clone(),
            authorize,
        ))
        // gRPC (HTTP/2): it authorises each stream by the secrets it asks for.
        .route(
            crate::sds::STREAM_SECRETS_PATH,
            post(crate::sds::stream_secrets),
        );
    finish(full, registry)
}

/// Who made the request ([`Role`]), as [`authorize`] found; none on the TCP listener.
type CallerRole = Option<axum::Extension<Role>>;

fn role_of(role: CallerRole) -> Role {
    role.map_or(Role::Other, |axum::Extension(role)| role)
}

impl From<crate::caller::Refusal> for ApiError {
    fn from(refusal: crate::caller::Refusal) -> Self {
        ApiError::new(StatusCode::FORBIDDEN, refusal.reason(), refusal)
    }
}

/// Authorises a request by its caller ([`crate::caller`]); refusals are 403s,
/// counted by reason.
async fn authorize(
    State(r): Shared,
    ConnectInfo(Peer(caller)): ConnectInfo<Peer>,
    route: MatchedPath,
    params: RawPathParams,
    mut request: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    let need = Need::of(request.method(), route.as_str());
    let owner = params
        .iter()
        .find(|(name, _)| *name == "workload")
        .and_then(|(_, value)| WorkloadName::new(value).ok())
        .and_then(|workload| r.owners().get(&workload));
    match r.access().decide(caller.as_ref(), need, owner.as_ref()) {
        Ok(()) => {
            let role = caller
                .as_ref()
                .map_or(Role::Other, |c| r.access().operators.role(c));
            request.extensions_mut().insert(role);
            next.run(request).await
        }
        Err(refusal) => {
            r.metrics().api_refused(refusal.reason());
            tracing::warn!(
                ?caller,
                method = %request.method(),
                route = route.as_str(),
                reason = refusal.reason(),
                "refused a local API call"
            );
            ApiError::from(refusal).into_response()
        }
    }
}

/// The read-only subset for clients that cannot reach the Unix socket (a WASI tool):
/// status, resolution and revocations (the component's), nothing that changes state
/// or reveals a key, and nothing that answers a small request with a large body (the
/// log, every leaf with its proof, and its copy, up to 512 MiB, stay on the Unix
/// socket).
pub fn resolve_router(registry: Arc<Registry>) -> Router {
    let read_only = Router::new()
        .route("/v1/status", get(status))
        .route("/v1/services/{service}", get(resolve))
        .route("/v1/revocations", get(revocation_pages));
    finish(read_only, registry)
}

/// Serves [`resolve_router`] on `listener` forever, holding connections within
/// `limits` (in all, per source address, and closed after `limits.idle_timeout` without
/// a byte either way), counting refusals in `stats`.
pub async fn serve_resolve(
    listener: tokio::net::TcpListener,
    registry: Arc<Registry>,
    limits: themis_net::Limits,
    stats: Arc<themis_net::NetStats>,
) -> std::io::Result<()> {
    struct Gated(tokio::net::TcpListener, Arc<themis_net::Gate>);
    impl axum::serve::Listener for Gated {
        type Io = themis_net::Guarded<tokio::net::TcpStream>;
        type Addr = SocketAddr;
        async fn accept(&mut self) -> (Self::Io, SocketAddr) {
            let (tcp, from, permit) = self.1.accept(&self.0).await;
            (themis_net::Guarded::new(tcp, permit), from)
        }
        fn local_addr(&self) -> std::io::Result<SocketAddr> {
            self.0.local_addr()
        }
    }
    let gate = themis_net::Gate::new(limits, stats);
    axum::serve(Gated(listener, gate), resolve_router(registry)).await
}

/// JSON errors for unknown endpoints and methods, the body limit, the state.
fn finish(routes: Router<Arc<Registry>>, registry: Arc<Registry>) -> Router {
    routes
        // After every route: it applies to the routes added so far.
        .method_not_allowed_fallback(|| async {
            ApiError::new(
                StatusCode::METHOD_NOT_ALLOWED,
                "method_not_allowed",
                "this endpoint does not take that method; see the Allow header",
            )
        })
        .fallback(|| async {
            ApiError::new(
                StatusCode::NOT_FOUND,
                "unknown_endpoint",
                "no such endpoint; see GET /v1/status",
            )
        })
        .layer(DefaultBodyLimit::max(MAX_BODY))
        .with_state(registry)
}

type Shared = State<Arc<Registry>>;

async fn status(State(r): Shared) -> ApiResult {
    let overlay = r.overlay();
    let snapshot = overlay.snapshot();
    ok(contract::Status {
        id: overlay.view_of(overlay.me()).id,
        mesh: overlay.mesh().as_str().to_owned(),
        mesh_root: r.trust().root().to_string(),
        granted: r.trust().granted_services(),
        revocations: r.trust().revocation_count() as u64,
        listen: overlay.me().addr,
        joined: *overlay.joined().borrow(),
        objects: snapshot.objects as u64,
        values: snapshot.values as u64,
        version: env!("CARGO_PKG_VERSION").to_owned(),
    })
}

async fn ring(State(r): Shared) -> ApiResult {
    ok(r.overlay().view().await?)
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ResolveQuery {
    #[serde(default)]
    fresh: bool,
}

async fn resolve(
    State(r): Shared,
    Path(service): Path<String>,
    query: Result<Query<ResolveQuery>, axum::extract::rejection::QueryRejection>,
    role: CallerRole,
) -> ApiResult {
    let service = ServiceName::new(&service)?;
    let Query(query) = query.map_err(|e| ApiError::bad_request(e.body_text()))?;
    // The operator's fresh lookups are not budgeted.
    let operator = role_of(role) == Role::Operator;
    match r.resolve(&service, query.fresh, operator).await {
        // Over a budget of lookups, with nothing cached to answer: 429 with when to
        // try again (whole seconds, at least one).
        Err(
            e @ (RegistryError::RateLimited { retry_after, .. }
            | RegistryError::LookupsLimited { retry_after, .. }),
        ) => {
            let secs = retry_after.as_secs() + u64::from(retry_after.subsec_nanos() > 0);
            let mut response = ApiError::from(e).into_response();
            response.headers_mut().insert(
                axum::http::header::RETRY_AFTER,
                axum::http::HeaderValue::from(secs.max(1)),
            );
            Ok(response)
        }
        resolved => ok(resolved?),
    }
}

async fn explain(State(r): Shared, Path(service): Path<String>) -> ApiResult {
    let service = ServiceName::new(&service)?;
    ok(r.explain(&service).await?)
}

/// `?known=N&wait_ms=M`: a long poll of the whole list (`paths::revocations_after`);
/// `?list=L&from=N&wait_ms=M`: a page of it (`paths::revocations_since`).
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RevocationsQuery {
    known: Option<usize>,
    list: Option<u64>,
    from: Option<usize>,
    wait_ms: Option<u64>,
}

impl RevocationsQuery {
    /// How long the caller may be held (capped).
    fn wait(&self) -> Option<Duration> {
        let cap = themis_contracts::paths::MAX_REVOCATIONS_WAIT_MS;
        self.wait_ms.map(|ms| Duration::from_millis(ms.min(cap)))
    }
}

async fn revocations(
    State(r): Shared,
    query: Result<Query<RevocationsQuery>, axum::extract::rejection::QueryRejection>,
) -> ApiResult {
    let Query(query) = query.map_err(|e| ApiError::bad_request(e.body_text()))?;
    let wait = query.wait();
    if let Some(from) = query.from {
        return revocations_page(&r, query.list, from, wait).await;
    }
    if let (Some(held), Some(wait)) = (query.known, wait) {
        // Held until the count differs from the caller's (a revocation is learnt, or
        // it was already behind), or the wait is over.
        let mut count = r.trust().watch_revocations();
        // The watched count only: no other lock is taken under the watch's.
        let _ = tokio::time::timeout(wait, count.wait_for(|known| *known != held)).await;
    }
    let known = r.trust().revocations();
    ok(revocations_answer(&r, known.iter(), None))
}

/// The resolve listener's `GET /v1/revocations`: by page only (a plain call is the
/// first page), so a small request never brings thousands of revocations back.
async fn revocation_pages(
    State(r): Shared,
    query: Result<Query<RevocationsQuery>, axum::extract::rejection::QueryRejection>,
) -> ApiResult {
    let Query(query) = query.map_err(|e| ApiError::bad_request(e.body_text()))?;
    let wait = query.wait();
    revocations_page(&r, query.list, query.from.unwrap_or(0), wait).await
}

/// A page of this agent's revocations from `from` of `list`; when there are none past
/// it, held until one is learnt or `wait` is over.
async fn revocations_page(
    r: &Registry,
    list: Option<u64>,
    from: usize,
    wait: Option<Duration>,
) -> ApiResult {
    if let (Some(wait), true) = (wait, list == Some(r.trust().revocation_list())) {
        let mut count = r.trust().watch_revocations();
        let _ = tokio::time::timeout(wait, count.wait_for(|known| *known > from)).await;
    }
    let page = r
        .trust()
        .revocation_page(list, from, themis_contracts::paths::MAX_REVOCATIONS_PAGE);
    let listed = page
        .revocations
        .iter()
        .map(|(id, revocation, bytes)| (id, revocation, bytes.as_slice()));
    ok(revocations_answer(r, listed, Some(&page)))
}

/// The answer listing `listed`, each with its trust log proof where the log holds it;
/// of `page` if it is one.
fn revocations_answer<'a>(
    r: &Registry,
    listed: impl Iterator<Item = (&'a PeerId, &'a themis_trust::Revocation, &'a [u8])>,
    page: Option<&crate::trust::RevocationPage>,
) -> contract::Revocations {
    let proven = r.trust().log().revocation_proofs();
    let (checkpoint, proofs) = &*proven;
    let mesh = r.overlay().mesh();
    let revocations = listed
        .map(|(id, revocation, bytes)| contract::Revocation {
            id: id.printable(mesh),
            issued_at: revocation.issued_at,
            reason: revocation.reason.clone(),
            revocation: hex::encode(bytes),
            logged: proofs.get(bytes).map(|(index, proof)| contract::Logged {
                index: *index,
                proof: hex::encode(proof),
            }),
        })
        .collect();
    contract::Revocations {
        checkpoint: checkpoint.as_ref().map(hex::encode),
        revocations,
        list: page.map(|p| p.list),
        from: page.map(|p| p.from),
        total: page.map(|p| p.total),
        long_poll: true,
    }
}

async fn publish_revocation(
    State(r): Shared,
    body: Result<Json<contract::PublishRevocation>, JsonRejection>,
) -> ApiResult {
    let Json(body) = body?;
    let signed = themis_trust::from_pem(themis_trust::PemKind::Revocation, &body.revocation)
        .map_err(|_| {
            ApiError::bad_request(
                "the body must be a THEMIS REVOCATION PEM, as `themis revoke` writes",
            )
        })?;
    let new = r
        .publish_revocation(signed.encode())
        .await
        .map_err(|e| match e {
            RegistryError::Record(error) => ApiError::new(
                StatusCode::FORBIDDEN,
                "not_from_root",
                format!("the revocation does not verify under this mesh's root: {error}"),
            ),
            e => e.into(),
        })?;
    ok(contract::Published {
        published: true,
        new,
    })
}

async fn log_status(State(r): Shared) -> ApiResult {
    ok(r.trust().log().status())
}

async fn log_copy(State(r): Shared) -> ApiResult {
    match r.trust().log().copy() {
        Some(bytes) => Ok((
            [(axum::http::header::CONTENT_TYPE, "application/octet-stream")],
            bytes,
        )
            .into_response()),
        None => Err(ApiError::new(
            StatusCode::NOT_FOUND,
            "no_log",
            "this node holds no trust log checkpoint yet",
        )),
    }
}

/// The operator hands over its whole copy: verified from the first leaf; this node
/// takes what it lacks if the copy extends its own, and its peers take it from here.
async fn publish_log(State(r): Shared, body: axum::body::Bytes) -> ApiResult {
    use crate::trust_log::CopyRefused;
    let trust = r.trust();
    let offered = trust.offer_log_copy(&body).map_err(|refused| match refused {
        CopyRefused::Invalid(error) => ApiError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            error.reason(),
            format!("the trust log copy was refused: {error}"),
        ),
        CopyRefused::Fork(fork) => ApiError::new(
            StatusCode::CONFLICT,
            "fork",
            format!(
                "the copy contradicts the log this node holds ({}): the mesh root signed two histories",
                fork.why
            ),
        ),
    })?;
    let log = trust.log();
    ok(contract::LogPublished {
        took: true,
        added: offered.added,
        size: log.size(),
    })
}

async fn register(
    State(r): Shared,
    Path((service, workload)): Path<(String, String)>,
    role: CallerRole,
    body: Result<Json<contract::Register<CaptureSpec>>, JsonRejection>,
) -> ApiResult {
    let controller = role_of(role) == Role::Controller;
    let (service, workload) = (ServiceName::new(&service)?, WorkloadName::new(&workload)?);
    let Json(body) = body?;
    if body.endpoint.ip().is_unspecified() || body.endpoint.port() == 0 {
        return Err(ApiError::bad_request(
            "the endpoint must be an address and port other agents can reach, not 0.0.0.0 or port 0",
        ));
    }
    // A node may endorse only what the mesh root granted it: checked before capture
    // is attached, so a refused registration leaves nothing behind.
    r.check_granted(&service)?;
    // Capture first: a registration whose traffic would bypass the proxy is worse
    // than none.
    let capture = match &body.capture {
        Some(spec) => {
            // A bound workload's capture must stay in its pod, whatever the agent
            // runs; an unbound one's is checked as a pod's where capture runs.
            if r.owners().get(&workload).is_none() {
                r.require_capture()?;
            }
            let unbound = r.owners().check_capture(&workload, spec)?;
            if controller {
                match &unbound {
                    None => r
                        .access()
                        .controller_owns(r.owners().get(&workload).as_ref())?,
                    Some(owner) => {
                        let exists = r.workload_identity(&workload).is_ok();
                        r.access().controller_may_bind(None, exists, Some(owner))?;
                    }
                }
            }
            let attached = r.attach_capture(&workload, spec)?;
            // The capture checked the cgroup; the pod now owns the workload.
            if let Some(owner) = unbound {
                r.owners().bind(&workload, owner)?;
            }
            Some(attached)
        }
        // The controller registers pods, and a pod's registration is captured.
        None if controller => return Err(crate::caller::Refusal::NotAPod.into()),
        None => None,
    };
    let (registration, stored) = r
        .register(service, workload, body.endpoint, body.metadata)
        .await?;
    ok(contract::Registered {
        registration,
        stored: stored.stored,
        replicas: stored.replicas,
        capture,
    })
}

async fn deregister(
    State(r): Shared,
    Path((service, workload)): Path<(String, String)>,
    role: CallerRole,
) -> ApiResult {
    let (service, workload) = (ServiceName::new(&service)?, WorkloadName::new(&workload)?);
    // A workload that does not exist is answered as for anyone (404): a controller's
    // retry after a lost answer is not refused.
    if role_of(role) == Role::Controller && r.workload_identity(&workload).is_ok() {
        r.access()
            .controller_owns(r.owners().get(&workload).as_ref())?;
    }
    let deregistered = r.deregister(service, workload.clone()).await?;
    let capture_detached = r.detach_capture(&workload)?;
    ok(contract::Deregistered {
        deregistered,
        capture_detached,
    })
}

async fn capture_status(State(r): Shared) -> ApiResult {
    ok(r.capture_status()?)
}

async fn workloads(State(r): Shared) -> ApiResult {
    ok(contract::Workloads {
        registrations: r.registrations().await,
        owners: r.owners().all(),
    })
}

async fn create_workload(
    State(r): Shared,
    Path(workload): Path<String>,
    role: CallerRole,
    body: axum::body::Bytes,
) -> ApiResult {
    let workload = WorkloadName::new(&workload)?;
    // The body is optional: `themis workload W` sends none.
    let owner = match body.is_empty() {
        true => None,
        false => {
            serde_json::from_slice::<contract::CreateWorkload>(&body)
                .map_err(|e| ApiError::bad_request(format!("invalid body: {e}")))?
                .owner
        }
    };
    if role_of(role) == Role::Controller {
        let exists = r.workload_identity(&workload).is_ok();
        r.access().controller_may_bind(
            r.owners().get(&workload).as_ref(),
            exists,
            owner.as_ref(),
        )?;
    }
    let (identity, created) = r.workload(&workload)?;
    if let Some(owner) = &owner {
        r.owners().bind(&workload, owner.clone())?;
    }
    let status = if created {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    let body = contract::WorkloadIdentity {
        owner: owner.or_else(|| r.owners().get(&workload)),
        workload,
        id: identity.printable_id(),
        public_key: hex::encode(identity.public_key()),
        created,
    };
    Ok((status, Json(body)).into_response())
}

async fn delete_workload(
    State(r): Shared,
    Path(workload): Path<String>,
    role: CallerRole,
) -> ApiResult {
    let workload = WorkloadName::new(&workload)?;
    // A workload that does not exist is answered as for anyone (404): a controller's
    // retry after a lost answer is not refused.
    if role_of(role) == Role::Controller && r.workload_identity(&workload).is_ok() {
        r.access()
            .controller_owns(r.owners().get(&workload).as_ref())?;
    }
    let identity = r.delete_workload(&workload).await?;
    ok(contract::DeletedWorkload {
        workload,
        id: identity.printable_id(),
    })
}

async fn workload_key(State(r): Shared, Path(workload): Path<String>) -> ApiResult {
    let workload = WorkloadName::new(&workload)?;
    ok(r.key_material(&workload)?)
}

async fn debug_find(State(r): Shared, Path(key): Path<String>) -> ApiResult {
    let mut bytes = [0u8; 32];
    hex::decode_to_slice(&key, &mut bytes)
        .map_err(|_| ApiError::bad_request("the key must be 64 hexadecimal digits"))?;
    ok(r.overlay().find(Key(bytes)).await?)
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct StoreBody {
    name: String,
    value: String,
    /// `value` is hex (for binary values such as records).
    #[serde(default)]
    hex: bool,
    #[serde(default)]
    replicas: u8,
    ttl_ms: Option<u64>,
}

async fn debug_store(State(r): Shared, body: Result<Json<StoreBody>, JsonRejection>) -> ApiResult {
    let Json(body) = body?;
    let ttl = Duration::from_millis(body.ttl_ms.unwrap_or(60_000));
    let value = if body.hex {
        hex::decode(&body.value).map_err(|_| ApiError::bad_request("value is not hex"))?
    } else {
        body.value.into_bytes()
    };
    let stored = r
        .overlay()
        .store(body.name.as_bytes(), value, body.replicas, ttl)
        .await?;
    ok(stored)
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ValuesQuery {
    #[serde(default)]
    replicas: u8,
}

async fn debug_values(
    State(r): Shared,
    Path(name): Path<String>,
    query: Result<Query<ValuesQuery>, axum::extract::rejection::QueryRejection>,
) -> ApiResult {
    let Query(query) = query.map_err(|e| ApiError::bad_request(e.body_text()))?;
    let resolved = r.overlay().resolve(name.as_bytes(), query.replicas).await?;
    let values: Vec<BTreeMap<&str, String>> = resolved
        .values
        .iter()
        .map(|v| {
            BTreeMap::from([
                ("text", String::from_utf8_lossy(v).into_owned()),
                ("hex", hex::encode(v)),
            ])
        })
        .collect();
    ok(json!({
        "values": values,
        "answered": resolved.answered,
        "replicas": resolved.replicas,
        "hops": resolved.hops,
    }))
}
