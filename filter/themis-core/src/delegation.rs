//! Delegated handshake keys (wire v3), after TLS delegated credentials (RFC 9345).
//!
//! The workload key stays in the node agent. A sidecar generates a short-lived
//! Ed25519 key of its own and the agent signs a [`Delegation`] for it with the
//! workload key: *this key may sign handshakes for this workload, in this mesh,
//! until then*. The sidecar then signs every handshake message itself and sends the
//! delegation with it; the peer checks the delegation under the workload key (whose
//! hash is the id, as ever) and the message under the delegated key. The id does not
//! change, and no handshake waits for the agent.
//!
//! What a stolen delegated key gives: handshakes as the workload until `not_after`
//! (at most [`MAX_LIFETIME_MS`]), or until the workload's id is revoked — peers check
//! revocations against the id, which a delegation cannot change.

use alloc::vec::Vec;

use ring::rand::SecureRandom;
use ring::signature::{Ed25519KeyPair, KeyPair};
use serde::{Deserialize, Serialize};
use zeroize::Zeroizing;

use crate::identity::{verify_statement, Identity, PublicIdentity};
use crate::wire::Signature;

/// The statement label a delegation is signed under (domain-separated from every
/// other statement and from handshake digests, see [`Identity::sign_statement`]).
pub const LABEL: &str = "themis/3 delegation";
/// The label of a delegation to a TLS certificate's key (docs/PROTOCOL.md §8): its
/// `delegated_key` is the SHA-256 of the certificate's SubjectPublicKeyInfo, so a
/// delegation of one kind never counts as the other.
pub const TLS_KEY_LABEL: &str = "themis/3 tls key";

/// What a delegation delegates, each under its own label.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Purpose {
    /// An Ed25519 key that signs the paper's handshake messages (wire v3).
    Handshake,
    /// A TLS certificate's key, named by the SHA-256 of its SubjectPublicKeyInfo.
    TlsKey,
}

impl Purpose {
    fn label(self) -> &'static str {
        match self {
            Purpose::Handshake => LABEL,
            Purpose::TlsKey => TLS_KEY_LABEL,
        }
    }
}
/// The longest lifetime a delegation may have: one day.
pub const MAX_LIFETIME_MS: u64 = 24 * 3600 * 1000;
/// The lifetime the agent grants when none is asked for: one hour (renewed at half).
pub const DEFAULT_LIFETIME_MS: u64 = 3600 * 1000;
/// How far apart two clocks may be: for delegations here and for the mesh's signed
/// records (`themis_trust::MAX_CLOCK_SKEW_MS` is this one).
pub const MAX_CLOCK_SKEW_MS: u64 = 60_000;

/// What the workload key signs (never sent as such: both ends rebuild it from the
/// handshake's mesh and workload key and the [`Delegation`]'s fields).
#[derive(Serialize)]
struct Statement<'a> {
    mesh: &'a str,
    workload_key: &'a [u8; 32],
    delegated_key: &'a [u8; 32],
    not_before_ms: u64,
    not_after_ms: u64,
}

/// The workload key's word that `delegated_key` may sign handshakes for it from
/// `not_before_ms` to `not_after_ms` (Unix ms).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Delegation {
    /// The short-lived Ed25519 public key the sidecar signs handshakes with.
    pub delegated_key: [u8; 32],
    /// Unix ms.
    pub not_before_ms: u64,
    /// Unix ms; at most [`MAX_LIFETIME_MS`] after `not_before_ms`.
    pub not_after_ms: u64,
    /// By the workload key, over the statement under [`LABEL`].
    pub signature: Signature,
}

/// Why a delegation was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum DelegationError {
    /// The workload key did not sign it (or signed it for another key or mesh).
    #[error("the delegation is not signed by the workload key for this key and mesh")]
    BadSignature,
    /// Not yet valid, beyond clock skew.
    #[error("the delegation is not valid yet")]
    NotYetValid,
    /// Past `not_after_ms`.
    #[error("the delegation expired")]
    Expired,
    /// Longer than [`MAX_LIFETIME_MS`], or ending before it starts.
    #[error("the delegation's lifetime is longer than allowed or empty")]
    BadLifetime,
    /// The delegated private key does not match the delegation.
    #[error("the delegated key does not match the delegation")]
    KeyMismatch,
    /// The random number generator failed.
    #[error("the random number generator failed")]
    Random,
}

fn statement_bytes(workload: &PublicIdentity, d: &Delegation) -> Vec<u8> {
    postcard::to_allocvec(&Statement {
        mesh: workload.mesh().as_str(),
        workload_key: workload.public_key(),
        delegated_key: &d.delegated_key,
        not_before_ms: d.not_before_ms,
        not_after_ms: d.not_after_ms,
    })
    .expect("encoding into a Vec cannot fail")
}

impl Delegation {
    /// Signs a delegation to `delegated_key` as `workload`, valid from `now_ms` for
    /// `lifetime_ms` (capped at [`MAX_LIFETIME_MS`]). The agent's job; the caller
    /// decides whether the asker may have it (its own proxy, a workload not revoked).
    pub fn issue(
        workload: &Identity,
        delegated_key: [u8; 32],
        now_ms: u64,
        lifetime_ms: u64,
    ) -> Delegation {
        Delegation::issue_for(
            Purpose::Handshake,
            workload,
            delegated_key,
            now_ms,
            lifetime_ms,
        )
    }

    /// [`Delegation::issue`] for `purpose`.
    pub fn issue_for(
        purpose: Purpose,
        workload: &Identity,
        delegated_key: [u8; 32],
        now_ms: u64,
        lifetime_ms: u64,
    ) -> Delegation {
        let mut d = Delegation {
            delegated_key,
            not_before_ms: now_ms,
            not_after_ms: now_ms.saturating_add(lifetime_ms.clamp(1, MAX_LIFETIME_MS)),
            signature: Signature([0; 64]),
        };
        let statement = statement_bytes(workload.public(), &d);
        d.signature = Signature(workload.sign_statement(purpose.label(), &statement));
        d
    }

    /// Checks the delegation for `workload` at `now_ms`: signed by the workload key for
    /// this delegated key and mesh, within its lifetime (give or take clock skew).
    pub fn verify(&self, workload: &PublicIdentity, now_ms: u64) -> Result<(), DelegationError> {
        self.verify_for(Purpose::Handshake, workload, now_ms)
    }

    /// [`Delegation::verify`] for `purpose`.
    pub fn verify_for(
        &self,
        purpose: Purpose,
        workload: &PublicIdentity,
        now_ms: u64,
    ) -> Result<(), DelegationError> {
        if self.not_after_ms <= self.not_before_ms
            || self.not_after_ms - self.not_before_ms > MAX_LIFETIME_MS
        {
            return Err(DelegationError::BadLifetime);
        }
        if self.not_before_ms > now_ms.saturating_add(MAX_CLOCK_SKEW_MS) {
            return Err(DelegationError::NotYetValid);
        }
        if self.not_after_ms.saturating_add(MAX_CLOCK_SKEW_MS) <= now_ms {
            return Err(DelegationError::Expired);
        }
        if !verify_statement(
            workload.public_key(),
            purpose.label(),
            &statement_bytes(workload, self),
            &self.signature.0,
        ) {
            return Err(DelegationError::BadSignature);
        }
        Ok(())
    }

    /// The encoded form (what the agent returns, hex in JSON).
    pub fn encode(&self) -> Vec<u8> {
        postcard::to_allocvec(self).expect("encoding into a Vec cannot fail")
    }

    /// Decodes exactly one delegation (total: any bytes in, a value or `None` out).
    pub fn decode(bytes: &[u8]) -> Option<Delegation> {
        match postcard::take_from_bytes::<Delegation>(bytes) {
            Ok((d, [])) => Some(d),
            _ => None,
        }
    }

    /// When the holder should ask for the next one: at half its lifetime.
    pub fn renew_at_ms(&self) -> u64 {
        self.not_before_ms + (self.not_after_ms.saturating_sub(self.not_before_ms)) / 2
    }
}

/// A sidecar's short-lived signing key, before and after its delegation arrives.
pub struct DelegatedKey {
    pair: Ed25519KeyPair,
    public: [u8; 32],
}

impl DelegatedKey {
    /// A fresh key from 32 bytes of `rng`.
    pub fn generate(rng: &dyn SecureRandom) -> Result<Self, DelegationError> {
        let mut seed = Zeroizing::new([0u8; 32]);
        rng.fill(seed.as_mut())
            .map_err(|_| DelegationError::Random)?;
        DelegatedKey::from_seed(&seed)
    }

    /// The key of a 32-byte Ed25519 seed: a client outside a sidecar keeps its
    /// delegated key in a file (`themis delegate`) as its seed.
    pub fn from_seed(seed: &[u8; 32]) -> Result<Self, DelegationError> {
        let pair =
            Ed25519KeyPair::from_seed_unchecked(seed).map_err(|_| DelegationError::Random)?;
        let mut public = [0u8; 32];
        public.copy_from_slice(pair.public_key().as_ref());
        Ok(DelegatedKey { pair, public })
    }

    /// The public key to have delegated.
    pub fn public_key(&self) -> &[u8; 32] {
        &self.public
    }
}

/// What a sidecar signs handshakes with: the workload's public identity, a delegated
/// key and the workload key's delegation to it, and the workload's endorsement (its
/// node-signed record with the grant chain, opaque here) that travels with every
/// handshake so that peers check the claimed service offline.
pub struct Credential {
    workload: PublicIdentity,
    key: DelegatedKey,
    delegation: Delegation,
    endorsement: Vec<u8>,
}

impl Credential {
    /// Puts a delegation together with its key, after checking both at `now_ms` (a
    /// confused or lying agent cannot make the sidecar send handshakes its peers
    /// refuse). `endorsement` may be empty (a caller of no service).
    pub fn new(
        workload: PublicIdentity,
        key: DelegatedKey,
        delegation: Delegation,
        endorsement: Vec<u8>,
        now_ms: u64,
    ) -> Result<Credential, DelegationError> {
        if delegation.delegated_key != key.public {
            return Err(DelegationError::KeyMismatch);
        }
        delegation.verify(&workload, now_ms)?;
        Ok(Credential {
            workload,
            key,
            delegation,
            endorsement,
        })
    }

    /// The delegation (for its expiry and renewal time).
    pub fn delegation(&self) -> &Delegation {
        &self.delegation
    }
}

/// Who signs our handshake messages: a workload or node key held here
/// ([`Identity`]: the node agent, the tests), or a sidecar's [`Credential`].
pub trait HandshakeSigner {
    /// The identity the handshake authenticates.
    fn identity(&self) -> &PublicIdentity;
    /// The delegation carried in the message, if the key signing is not the
    /// identity's own.
    fn delegation(&self) -> Option<&Delegation>;
    /// The endorsement carried in the message (empty: none).
    fn endorsement(&self) -> &[u8];
    /// Signs a 32-byte handshake digest.
    fn sign_digest(&self, digest: &[u8; 32]) -> [u8; 64];
}

impl HandshakeSigner for Identity {
    fn identity(&self) -> &PublicIdentity {
        self.public()
    }
    fn delegation(&self) -> Option<&Delegation> {
        None
    }
    fn endorsement(&self) -> &[u8] {
        &[]
    }
    fn sign_digest(&self, digest: &[u8; 32]) -> [u8; 64] {
        self.sign(digest)
    }
}

impl HandshakeSigner for Credential {
    fn identity(&self) -> &PublicIdentity {
        &self.workload
    }
    fn delegation(&self) -> Option<&Delegation> {
        Some(&self.delegation)
    }
    fn endorsement(&self) -> &[u8] {
        &self.endorsement
    }
    fn sign_digest(&self, digest: &[u8; 32]) -> [u8; 64] {
        let mut sig = [0u8; 64];
        sig.copy_from_slice(self.key.pair.sign(digest).as_ref());
        sig
    }
}

/// The key a handshake message from `signer` must be signed with: the delegated key
/// if a delegation came with it (checked first, at `now_ms`), else the identity's own.
pub(crate) fn signing_key<'a>(
    signer: &'a PublicIdentity,
    delegation: Option<&'a Delegation>,
    now_ms: u64,
) -> Result<&'a [u8; 32], DelegationError> {
    match delegation {
        Some(d) => {
            d.verify(signer, now_ms)?;
            Ok(&d.delegated_key)
        }
        None => Ok(signer.public_key()),
    }
}

impl<T: HandshakeSigner + ?Sized> HandshakeSigner for alloc::sync::Arc<T> {
    fn identity(&self) -> &PublicIdentity {
        (**self).identity()
    }
    fn delegation(&self) -> Option<&Delegation> {
        (**self).delegation()
    }
    fn endorsement(&self) -> &[u8] {
        (**self).endorsement()
    }
    fn sign_digest(&self, digest: &[u8; 32]) -> [u8; 64] {
        (**self).sign_digest(digest)
    }
}
