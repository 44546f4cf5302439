//! Mesh trust: who may join the ring and who may serve a name, decided offline by
//! every node from one public key, the mesh root.
//!
//! The mesh operator holds the root's private key offline. It signs three kinds of
//! statements, each under its own label so that no signature can be read as another
//! kind:
//!
//! * an [`Admission`] lets a node key take part in the DHT;
//! * a [`Grant`] lets a key endorse instances of one service (with `delegate`, also
//!   grant that service on, one level further: a per-service authority);
//! * a [`Revocation`] withdraws a key, by id, for good;
//! * on Kubernetes, a [`Binding`] says which namespace (and ServiceAccounts) may serve
//!   a service, so a node endorses only the pods the platform says run as it.
//!
//! A node's agent holds a grant for each service it runs and signs an instance
//! [`Record`] for each local workload (its key, endpoint, metadata, a short validity
//! window). What is stored in the DHT is an [`InstanceValue`]: the record and the grant
//! chain that leads from the root to its signer. Anyone holding the root checks it with
//! [`Verifier::instance`], with no online party: no certificate authority, and no
//! central service whose absence could expire anything. Records are short-lived and
//! re-signed by their own agent; admissions and grants live until revoked (or until an
//! optional `not_after`), so a mesh has no expiry outage class.
//!
//! Time is Unix milliseconds passed in by the caller (sans-IO, like the rest of the
//! core). See `docs/PROTOCOL.md` §6 for the trust model and the security argument.

#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod announcement;
mod binding;
mod pem;
mod revocations;
mod root;
mod statement;
mod verify;

pub use announcement::{
    grant_digest, AddressRange, Announced, Announcement, ADDRESS_RANGE_LABEL, ANNOUNCEMENT_LABEL,
    BROADEST_RANGE,
};
pub use binding::{Binding, Bindings, Subject, BINDING_LABEL, MAX_BOUND_ACCOUNTS, SUBJECT_LABEL};
pub use ipnet::IpNet;
pub use pem::{chain_from_pem, chain_to_pem, from_pem, pem_blocks, to_pem, PemKind};
pub use revocations::Revocations;
pub use root::{MeshRoot, RootError};
pub use statement::{
    Admission, Grant, InstanceValue, Metadata, Record, Revocation, Signed, ADMISSION_LABEL,
    GRANT_LABEL, RECORD_LABEL, REVOCATION_LABEL,
};
pub use verify::{check_metadata, live, Instance, Verifier};

/// How far in the future a statement's `issued_at` may lie (clocks differ).
pub const MAX_CLOCK_SKEW_MS: u64 = themis_core::delegation::MAX_CLOCK_SKEW_MS;
/// The longest validity window of an instance record. Agents re-sign well before
/// their records' `not_after`; the bound is what makes a stolen or replayed record
/// useless after a day at most, whatever it says.
pub const MAX_RECORD_LIFETIME_MS: u64 = 24 * 3600 * 1000;
/// Most grants in a chain: root → node, or root → service authority → node.
pub const MAX_GRANT_CHAIN: usize = 2;
/// Longest encoded credential or stored value accepted by any decoder here.
pub const MAX_ENCODED_LEN: usize = 2048;
/// Most metadata entries on one instance.
pub const MAX_METADATA_ENTRIES: usize = 16;
/// Longest metadata key, in bytes.
pub const MAX_METADATA_KEY_LEN: usize = 63;
/// Longest metadata value, in bytes.
pub const MAX_METADATA_VALUE_LEN: usize = 255;
/// Longest revocation reason, in bytes.
pub const MAX_REASON_LEN: usize = 128;

/// Why a credential, record or revocation was not trusted. The variants are what
/// `themis explain` prints; [`TrustError::reason`] is the metrics label.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TrustError {
    /// Not the encoding expected, or over [`MAX_ENCODED_LEN`].
    #[error("malformed credential")]
    Malformed,
    /// A signature does not verify under the key that claims it.
    #[error("bad signature")]
    BadSignature,
    /// Made for another mesh.
    #[error("made for another mesh")]
    WrongMesh,
    /// A record or grant for another service than the one asked.
    #[error("made for another service")]
    WrongService,
    /// Not signed by the mesh root (an admission, a revocation, or the first grant of
    /// a chain).
    #[error("not signed by the mesh root")]
    NotFromRoot,
    /// A link of the chain is signed by a key the previous link did not grant.
    #[error("the grant chain is broken: a link is not signed by the previous grantee")]
    BrokenChain,
    /// A grant passed on by a key whose own grant does not allow delegation.
    #[error("a grant was passed on by a key not allowed to delegate")]
    NotDelegable,
    /// No grant, or more than [`MAX_GRANT_CHAIN`].
    #[error("the grant chain is empty or longer than {MAX_GRANT_CHAIN}")]
    ChainLength,
    /// The record is not signed by the key the last grant names.
    #[error("the record is not signed by the granted key")]
    NotGranted,
    /// An admission of another key than the peer's.
    #[error("the admission is for another key")]
    WrongKey,
    /// Past its `not_after`.
    #[error("expired")]
    Expired,
    /// Issued further in the future than clock skew explains.
    #[error("issued in the future")]
    FromTheFuture,
    /// A record whose validity window is empty or longer than [`MAX_RECORD_LIFETIME_MS`].
    #[error("validity window empty or longer than {} hours", MAX_RECORD_LIFETIME_MS / 3_600_000)]
    BadLifetime,
    /// A key of the chain (grantee, signer or workload) has been revoked.
    #[error("a key of the chain is revoked")]
    Revoked,
    /// Metadata or reason over its limits.
    #[error("a field is over its size limit")]
    TooLarge,
    /// Signed by a key the trust log does not admit as a node.
    #[error("not signed by an admitted node")]
    NotAdmitted,
    /// An instance endpoint that is not at the address its endorsing node announced.
    #[error("the endpoint does not belong to the node that endorsed it")]
    EndpointNotOwned,
    /// An address-range grant that is not the one the node's announcement names
    /// (dropped, or swapped for another, by whoever forwarded it).
    #[error("the address range is not the one the node announced")]
    UnboundRange,
    /// No binding of the mesh root lets the pod's namespace and ServiceAccount serve
    /// the service.
    #[error(
        "no binding of the mesh root lets this namespace and ServiceAccount serve the service"
    )]
    NotBound,
}

impl TrustError {
    /// A short, stable name for metrics labels.
    pub fn reason(&self) -> &'static str {
        match self {
            TrustError::Malformed => "malformed",
            TrustError::BadSignature => "bad_signature",
            TrustError::WrongMesh => "wrong_mesh",
            TrustError::WrongService => "wrong_service",
            TrustError::NotFromRoot => "not_from_root",
            TrustError::BrokenChain => "broken_chain",
            TrustError::NotDelegable => "not_delegable",
            TrustError::ChainLength => "chain_length",
            TrustError::NotGranted => "not_granted",
            TrustError::WrongKey => "wrong_key",
            TrustError::Expired => "expired",
            TrustError::FromTheFuture => "from_the_future",
            TrustError::BadLifetime => "bad_lifetime",
            TrustError::Revoked => "revoked",
            TrustError::TooLarge => "too_large",
            TrustError::NotAdmitted => "not_admitted",
            TrustError::EndpointNotOwned => "endpoint_not_owned",
            TrustError::UnboundRange => "unbound_range",
            TrustError::NotBound => "not_bound",
        }
    }
}
