//! Where a member is, said by the member itself (issue 23): the trust log says which
//! node keys are admitted; each admitted node signs where its agent listens, dated, so
//! every agent can hold the full membership (one-hop routing) without believing any
//! peer about another. An instance record's endpoint must then belong to the node that
//! endorsed it: a granted node cannot point a service at somebody else's address.

use std::net::SocketAddr;

use serde::{Deserialize, Serialize};
use themis_core::PeerId;

use crate::statement::{decode, Signed};
use crate::verify::{Instance, Verifier};
use crate::TrustError;

/// The label address announcements are signed under.
pub const ANNOUNCEMENT_LABEL: &str = "themis/1 node address";

/// Admitted node → the mesh: its agent listens at `address` as of `issued_at` (the
/// newest announcement of a node replaces older ones); `leaving`: its own farewell,
/// the one liveness report a peer may believe, since only the node can sign it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Announcement {
    /// The mesh.
    pub mesh: String,
    /// Where the node's agent accepts the agents' protocol.
    pub address: SocketAddr,
    /// Unix ms; also the announcement's version.
    pub issued_at: u64,
    /// The node is leaving (it stays admitted; it is passed over until it announces
    /// again).
    pub leaving: bool,
}

/// A checked announcement: whose, and what it says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Announced {
    /// The node's ring id, `H(node key ‖ mesh)`.
    pub id: PeerId,
    /// The node's key.
    pub node_key: [u8; 32],
    /// What it announced.
    pub announcement: Announcement,
}

impl Verifier<'_> {
    /// Checks an encoded address announcement: signed under its own label by a node key
    /// that `admitted` says the trust log admits (and not revoked), made for this mesh,
    /// not dated further ahead than clock skew explains.
    pub fn announcement(
        &self,
        bytes: &[u8],
        admitted: impl Fn(&[u8; 32]) -> bool,
    ) -> Result<Announced, TrustError> {
        let signed = Signed::decode(bytes)?;
        if !admitted(&signed.signer) {
            return Err(TrustError::NotAdmitted);
        }
        let announcement: Announcement = signed.open(ANNOUNCEMENT_LABEL)?;
        if announcement.mesh != self.root.mesh.as_str() {
            return Err(TrustError::WrongMesh);
        }
        if announcement.issued_at
            > self
                .now_ms
                .saturating_add(themis_core::delegation::MAX_CLOCK_SKEW_MS)
        {
            return Err(TrustError::FromTheFuture);
        }
        if self.revoked.contains_key(self.root, &signed.signer) {
            return Err(TrustError::Revoked);
        }
        Ok(Announced {
            id: PeerId::derive(&signed.signer, self.root.mesh.as_str()),
            node_key: signed.signer,
            announcement,
        })
    }

    /// Whether `instance`'s endpoint belongs to the node that endorsed it, given that
    /// node's checked announcement: the endpoint's IP must be the one the node
    /// announced (its sidecars listen on the node's address; a tombstone names none).
    pub fn endpoint_owned(
        &self,
        instance: &Instance,
        endorser: &Announced,
    ) -> Result<(), TrustError> {
        endorser.owns(&instance.endorser, instance.endpoint)
    }
}

impl Announced {
    /// Whether `endpoint`, endorsed by the node with key `endorser`, belongs to this
    /// announcement's node: the same node, at the IP it announced (any port: its
    /// sidecars). `None` (a tombstone) names no address.
    pub fn owns(
        &self,
        endorser: &[u8; 32],
        endpoint: Option<SocketAddr>,
    ) -> Result<(), TrustError> {
        if *endorser != self.node_key {
            return Err(TrustError::EndpointNotOwned);
        }
        match endpoint {
            None => Ok(()),
            Some(e) if e.ip() == self.announcement.address.ip() => Ok(()),
            Some(_) => Err(TrustError::EndpointNotOwned),
        }
    }
}

impl Announcement {
    /// Decodes an announcement's body; checks nothing else.
    pub fn decode(bytes: &[u8]) -> Result<Announcement, TrustError> {
        decode(bytes)
    }
}
