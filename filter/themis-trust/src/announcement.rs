//! Where a member is, said by the member itself (issue 23): the trust log says which
//! node keys are admitted; each admitted node signs where its agent listens, dated, so
//! every agent can hold the full membership (one-hop routing) without believing any
//! peer about another. An instance record's endpoint must then belong to the node that
//! endorsed it: a granted node cannot point a service at somebody else's address.
//!
//! On Kubernetes a node's workloads listen at their pods' own IPs, not the node's: the
//! root grants the node its pod range ([`AddressRange`], logged like every root
//! statement), and an endpoint in that range belongs to the node too.

use std::net::{IpAddr, SocketAddr};

use ipnet::IpNet;

use serde::{Deserialize, Serialize};
use themis_core::PeerId;

use crate::statement::{decode, Signed};
use crate::verify::{Instance, Verifier};
use crate::TrustError;

/// The label address announcements are signed under.
pub const ANNOUNCEMENT_LABEL: &str = "themis/1 node address";
/// The label the root's address-range grants are signed under.
pub const ADDRESS_RANGE_LABEL: &str = "themis/1 address range";
/// The broadest range a node is granted, as the shortest prefix: a /8 of IPv4, a /32
/// of IPv6. An IP in a node's range is no other node's, so one over-broad grant would
/// take every endpoint in it from every other node.
pub const BROADEST_RANGE: (u8, u8) = (8, 32);

/// What an announcement binds of the range grant the node holds: SHA-256 of the
/// encoded grant.
pub fn grant_digest(grant: &[u8]) -> [u8; 32] {
    let digest = ring::digest::digest(&ring::digest::SHA256, grant);
    digest.as_ref().try_into().expect("32 bytes")
}

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
    /// [`grant_digest`] of the root's address-range grant the node holds, if any:
    /// under the node's signature, so that whoever forwards the announcement can
    /// neither drop the range nor swap in another grant.
    pub address_range: Option<[u8; 32]>,
}

/// Root → node: the node's workloads may listen anywhere in `network/prefix_len` (on
/// Kubernetes, the node's pod range), besides the address the node announces.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AddressRange {
    /// The mesh.
    pub mesh: String,
    /// The node the range is granted to.
    pub node_key: [u8; 32],
    /// The range's first address (no host bits set).
    pub network: IpAddr,
    /// The range's prefix length.
    pub prefix_len: u8,
    /// Unix ms.
    pub issued_at: u64,
    /// Unix ms; `None`: until revoked.
    pub not_after: Option<u64>,
}

impl AddressRange {
    /// The range as a network, if it is one: a prefix length the address family
    /// allows, no host bits set (one spelling per range), and no broader than
    /// [`BROADEST_RANGE`].
    pub fn net(&self) -> Result<IpNet, TrustError> {
        let net = IpNet::new(self.network, self.prefix_len).map_err(|_| TrustError::Malformed)?;
        let broadest = match net {
            IpNet::V4(_) => BROADEST_RANGE.0,
            IpNet::V6(_) => BROADEST_RANGE.1,
        };
        match net.trunc() == net && net.prefix_len() >= broadest {
            true => Ok(net),
            false => Err(TrustError::Malformed),
        }
    }
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

    /// Checks an encoded address-range grant for the node holding `node_key`: signed
    /// by the root under its own label, for this mesh and that key, current, the node
    /// not revoked, and a well-formed range.
    pub fn address_range(
        &self,
        bytes: &[u8],
        node_key: &[u8; 32],
    ) -> Result<(AddressRange, IpNet), TrustError> {
        let signed = Signed::decode(bytes)?;
        if signed.signer != self.root.key {
            return Err(TrustError::NotFromRoot);
        }
        let range: AddressRange = signed.open(ADDRESS_RANGE_LABEL)?;
        if range.mesh != self.root.mesh.as_str() {
            return Err(TrustError::WrongMesh);
        }
        if &range.node_key != node_key {
            return Err(TrustError::WrongKey);
        }
        if range.issued_at > self.now_ms.saturating_add(crate::MAX_CLOCK_SKEW_MS) {
            return Err(TrustError::FromTheFuture);
        }
        if range.not_after.is_some_and(|t| t <= self.now_ms) {
            return Err(TrustError::Expired);
        }
        if self.revoked.contains_key(self.root, node_key) {
            return Err(TrustError::Revoked);
        }
        let net = range.net()?;
        Ok((range, net))
    }

    /// Whether `instance`'s endpoint belongs to the node that endorsed it, given that
    /// node's checked announcement and the range the root granted it, if any: the
    /// endpoint's IP must be the one the node announced (its sidecars listen on the
    /// node's address) or in its range (its pods'); a tombstone names none.
    pub fn endpoint_owned(
        &self,
        instance: &Instance,
        endorser: &Announced,
        range: Option<&IpNet>,
    ) -> Result<(), TrustError> {
        endorser.owns(&instance.endorser, instance.endpoint, range)
    }
}

impl Announced {
    /// Whether `endpoint`, endorsed by the node with key `endorser`, belongs to this
    /// announcement's node (whose granted range is `range`): the same node, at an IP
    /// it [`Announced::claims`] (any port). `None` (a tombstone) names no address.
    pub fn owns(
        &self,
        endorser: &[u8; 32],
        endpoint: Option<SocketAddr>,
        range: Option<&IpNet>,
    ) -> Result<(), TrustError> {
        if *endorser != self.node_key {
            return Err(TrustError::EndpointNotOwned);
        }
        match endpoint {
            None => Ok(()),
            Some(e) if self.claims(e.ip(), range) => Ok(()),
            Some(_) => Err(TrustError::EndpointNotOwned),
        }
    }

    /// Whether `ip` is this node's: the IP it announced, or in the range the root
    /// granted it (`range`, checked with [`Verifier::address_range`]). IPv4-mapped
    /// IPv6 addresses are compared as the IPv4 address they are.
    pub fn claims(&self, ip: IpAddr, range: Option<&IpNet>) -> bool {
        let ip = ip.to_canonical();
        ip == self.announcement.address.ip().to_canonical()
            || range.is_some_and(|r| r.contains(&ip))
    }
}

impl Announcement {
    /// Decodes an announcement's body; checks nothing else.
    pub fn decode(bytes: &[u8]) -> Result<Announcement, TrustError> {
        decode(bytes)
    }
}
