//! Endorsed service records for the simulations: a stand-in for the agent's signed
//! records, with an HMAC where the agent has a signature chain.
//!
//! A record names its owner (who vouches for it), the instance (the owner's slot), a
//! version, a not-after time and the service name, and carries
//! `HMAC-SHA256(grant(owner, name), body)`. The grant key stands for the endorsement:
//! only an owner granted the name holds it, so adversaries can replay what they have
//! seen but not forge a record, nor sign one for a name they were not granted.
//! [`RecordPolicy`] is what a replica holder runs; [`merge`] is what a resolver does
//! with the values a resolve returns.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use ring::hmac;
use themis_dht::message::MAX_REPLICAS;
use themis_dht::{Key, Placement, Rejection, ValuePolicy};

/// The mesh operator's secret the grants derive from; no adversary has it.
const OPERATOR: &[u8] = b"themis sim: the operator's endorsement secret";

fn grant(owner: u32, name: &[u8]) -> hmac::Key {
    let root = hmac::Key::new(hmac::HMAC_SHA256, OPERATOR);
    let mut msg = owner.to_be_bytes().to_vec();
    msg.extend_from_slice(name);
    hmac::Key::new(hmac::HMAC_SHA256, hmac::sign(&root, &msg).as_ref())
}

/// A service instance record.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Record {
    pub owner: u32,
    pub instance: u64,
    pub version: u64,
    /// Virtual-clock ms after which the record is void.
    pub not_after: u64,
    pub name: Vec<u8>,
}

const HEAD: usize = 4 + 8 + 8 + 8 + 1;
const TAG: usize = 32;

impl Record {
    fn body(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(HEAD + self.name.len() + TAG);
        b.extend_from_slice(&self.owner.to_be_bytes());
        b.extend_from_slice(&self.instance.to_be_bytes());
        b.extend_from_slice(&self.version.to_be_bytes());
        b.extend_from_slice(&self.not_after.to_be_bytes());
        b.push(u8::try_from(self.name.len()).expect("short names"));
        b.extend_from_slice(&self.name);
        b
    }

    /// The record as its owner stores it: body and tag.
    pub fn sign(&self) -> Vec<u8> {
        let mut b = self.body();
        let tag = hmac::sign(&grant(self.owner, &self.name), &b);
        b.extend_from_slice(tag.as_ref());
        b
    }

    /// The record with a tag made up by someone without the grant.
    pub fn forge(&self) -> Vec<u8> {
        let mut b = self.body();
        b.extend_from_slice(&[0xa5; TAG]);
        b
    }

    /// The record in `bytes` if its tag verifies (a total parser: any bytes).
    pub fn verify(bytes: &[u8]) -> Option<Record> {
        if bytes.len() < HEAD + TAG {
            return None;
        }
        let u64_at = |at: usize| u64::from_be_bytes(bytes[at..at + 8].try_into().expect("8"));
        let name_len = usize::from(bytes[HEAD - 1]);
        if bytes.len() != HEAD + name_len + TAG {
            return None;
        }
        let r = Record {
            owner: u32::from_be_bytes(bytes[..4].try_into().expect("4")),
            instance: u64_at(4),
            version: u64_at(12),
            not_after: u64_at(20),
            name: bytes[HEAD..HEAD + name_len].to_vec(),
        };
        let (body, tag) = bytes.split_at(HEAD + name_len);
        hmac::verify(&grant(r.owner, &r.name), body, tag).ok()?;
        Some(r)
    }

    /// Whether `key` is one of the name's replica ids.
    fn stored_under(&self, key: &Key) -> bool {
        (0..=MAX_REPLICAS).any(|r| Key::object(&self.name, r) == *key)
    }
}

/// A replica holder's policy: keep only records that verify, belong under the key, and
/// are not past their not-after; at most `owner_limit` instances per owner and key, for
/// no longer than the record is valid. Counts the verifications it makes.
pub struct RecordPolicy {
    pub clock: Arc<AtomicU64>,
    pub verifications: Arc<AtomicU64>,
    pub owner_limit: usize,
}

impl ValuePolicy for RecordPolicy {
    fn place(&self, key: &Key, value: &[u8]) -> Result<Placement, Rejection> {
        self.verifications.fetch_add(1, Ordering::Relaxed);
        let now = self.clock.load(Ordering::Relaxed);
        let r = Record::verify(value).ok_or(Rejection::InvalidValue)?;
        if !r.stored_under(key) || r.not_after <= now {
            return Err(Rejection::InvalidValue);
        }
        let mut owner = [0; 32];
        owner[..4].copy_from_slice(&r.owner.to_be_bytes());
        let mut slot = [0; 32];
        slot[..8].copy_from_slice(&r.instance.to_be_bytes());
        Ok(Placement {
            owner,
            slot,
            version: r.version,
            owner_limit: self.owner_limit,
            ttl_cap: Some(r.not_after - now),
        })
    }
}

/// What a resolver makes of a resolve's values: the records that verify, are for
/// `name` and still valid at `now`, newest version per (owner, instance). Also returns
/// how many verifications that took (one per value).
pub fn merge(name: &[u8], values: &[Vec<u8>], now: u64) -> (BTreeMap<(u32, u64), u64>, usize) {
    let mut newest = BTreeMap::new();
    for v in values {
        let Some(r) = Record::verify(v) else { continue };
        if r.name != name || r.not_after <= now {
            continue;
        }
        let e = newest.entry((r.owner, r.instance)).or_insert(r.version);
        *e = (*e).max(r.version);
    }
    (newest, values.len())
}
