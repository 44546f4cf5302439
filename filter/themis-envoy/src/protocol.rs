//! How the two roles talk over HTTP between Envoys (docs/FILTER.md): two exchanges,
//! each a POST whose body is Themis bytes, and the headers that carry the rest.

/// The body of every exchange, and of every answer from a Themis filter: a peer's
/// response without it came from Envoy (a connection failure), not from a filter.
pub const CONTENT_TYPE: &str = "application/themis";

/// The paths of the two exchanges.
pub mod path {
    /// Message 1 in, message 2 out.
    pub const HELLO: &str = "/.themis/v1/hello";
    /// A sealed request in, its sealed response out.
    pub const REQUEST: &str = "/.themis/v1/request";
}

/// Header names.
pub mod header {
    /// Message 3 (hex), on a session's requests until the first response.
    pub const CONFIRM: &str = "x-themis-confirm";
    /// Why a peer refused an exchange, unsealed: the class only.
    pub const REJECT: &str = "x-themis-reject";
    /// Why the filter answered a request itself (to the app).
    pub const ERROR: &str = "x-themis-error";
    /// To the app: the authenticated peer's id.
    pub const PEER_ID: &str = "x-themis-peer-id";
    /// To the app: the peer's service, verified through the DHT.
    pub const PEER_SERVICE: &str = "x-themis-peer-service";
}

/// Whether a refusal means the peer lost the session (restart, expiry) and a new
/// handshake may succeed.
pub fn needs_new_session(reject_reason: &str) -> bool {
    matches!(reject_reason, "unknown_session" | "unconfirmed")
}
