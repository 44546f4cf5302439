//! Which values a node keeps, and how: the hook through which the layer above (the
//! agent's signed service records) decides what a replica stores.
//!
//! Every value offered to a node — by a peer's [`Request::Store`], by each object of a
//! [`Request::Handover`], and by the node's own `store` — goes through
//! [`ValuePolicy::place`] first. The policy refuses it (the node counts the
//! [`Rejection`] and answers [`Response::Rejected`]) or says who vouches for it
//! ([`Placement::owner`]), which of that owner's entries it is ([`Placement::slot`]),
//! its [`Placement::version`], how many entries the owner may hold under one key, and
//! how long it may live at most. The store then keeps one value per `(owner, slot)`:
//! a newer version replaces an older one, an older one is refused as
//! [`Rejection::Stale`], and an owner past its limit gets [`Rejection::OwnerFull`], so
//! junk from one owner cannot crowd out another owner's values.
//!
//! [`Request::Store`]: crate::Request::Store
//! [`Request::Handover`]: crate::Request::Handover
//! [`Response::Rejected`]: crate::Response::Rejected

use ring::digest;

use crate::key::Key;
use crate::message::MAX_VALUES_PER_KEY;
use crate::{Millis, Rejection};

/// How a node keeps a value it was offered (by `Store` or `Handover`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Placement {
    /// Who vouches for the value (e.g. the signer's key); limits are per owner.
    pub owner: [u8; 32],
    /// Which of the owner's entries under this key the value is (e.g. the instance id);
    /// a key holds one value per (owner, slot).
    pub slot: [u8; 32],
    /// Newer versions replace older ones in the same slot; older ones are refused.
    pub version: u64,
    /// Most slots this owner may hold under one key.
    pub owner_limit: usize,
    /// The value's remaining lifetime if shorter than the requested TTL (e.g. until its
    /// signed not-after).
    pub ttl_cap: Option<Millis>,
}

/// Decides whether and how to keep a value. The agent verifies signatures here.
///
/// `place` runs once for every value offered to the node (a `Store`, each object of a
/// `Handover`, the node's own `store`), before anything is kept; an `Err` is counted in
/// [`Stats::rejections`](crate::Stats::rejections) and refuses the value (the policy
/// should return [`Rejection::InvalidValue`], but any reason is counted as given). It
/// must be total on any bytes: `value` comes from the network. It is not called for the
/// values a resolve collects: the caller of [`Node::resolve`](crate::Node::resolve)
/// verifies those itself.
pub trait ValuePolicy: Send + 'static {
    /// Whether and how to keep `value` under `key`.
    fn place(&self, key: &Key, value: &[u8]) -> Result<Placement, Rejection>;
}

/// Accepts every value: one owner (all zeros), slot = SHA-256(value) (ring), version 0,
/// owner_limit = [`MAX_VALUES_PER_KEY`]. The default.
///
/// Distinct values are distinct slots and the same value refreshes its slot, so a key
/// holds a set of up to [`MAX_VALUES_PER_KEY`] values, as before policies existed; and
/// anyone may fill it. Use a real policy wherever peers are not all trusted.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct AnyValue;

impl ValuePolicy for AnyValue {
    fn place(&self, _key: &Key, value: &[u8]) -> Result<Placement, Rejection> {
        let mut slot = [0u8; 32];
        slot.copy_from_slice(digest::digest(&digest::SHA256, value).as_ref());
        Ok(Placement {
            owner: [0; 32],
            slot,
            version: 0,
            owner_limit: MAX_VALUES_PER_KEY,
            ttl_cap: None,
        })
    }
}
