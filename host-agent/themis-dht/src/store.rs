//! The objects a node holds: under each object id, one value per `(owner, slot)` (see
//! [`Placement`]), each with its version and absolute expiry.

use std::collections::BTreeMap;

use crate::key::{in_half_open, Key};
use crate::message::{Object, MAX_VALUES_PER_KEY};
use crate::policy::Placement;
use crate::Rejection;

/// Where a value sits under its key: who vouches for it, and which of its entries.
type SlotId = ([u8; 32], [u8; 32]);

#[derive(Debug)]
struct Entry {
    value: Vec<u8>,
    version: u64,
    /// Node clock, ms; live while `expiry > now`.
    expiry: u64,
    /// Node clock, ms: the latest expiry a refresh may give it (the policy's
    /// `ttl_cap` when it was placed, e.g. a record's signed not-after).
    deadline: u64,
}

/// Values by object id, then by `(owner, slot)`.
#[derive(Debug, Default)]
pub(crate) struct Store {
    map: BTreeMap<Key, BTreeMap<SlotId, Entry>>,
    /// Entries held, live or not yet swept.
    count: usize,
    capacity: usize,
}

impl Store {
    pub(crate) fn new(capacity: usize) -> Self {
        Store {
            map: BTreeMap::new(),
            count: 0,
            capacity,
        }
    }

    /// Offers `value` for `placement`'s slot under `key`, to live until `expiry`:
    ///
    /// * the slot is empty: taken, unless the store is full ([`Rejection::StoreFull`]),
    ///   the key holds [`MAX_VALUES_PER_KEY`] values ([`Rejection::TooManyValues`]) or
    ///   the owner holds `owner_limit` slots under the key ([`Rejection::OwnerFull`]);
    /// * it holds an older version: replaced (with the new expiry);
    /// * it holds the same version with the same bytes: refreshed (the expiry only grows);
    /// * it holds a newer version, or the same version with other bytes:
    ///   [`Rejection::Stale`]. A newer version therefore keeps refusing older bytes for
    ///   as long as it lives, which is what lets an owner withdraw a value by storing a
    ///   newer one (a tombstone).
    ///
    /// Expired entries under `key` are dropped first, so they hold no slot.
    pub(crate) fn insert(
        &mut self,
        key: Key,
        placement: &Placement,
        value: Vec<u8>,
        expiry: u64,
        now: u64,
    ) -> Result<(), Rejection> {
        let deadline = placement
            .ttl_cap
            .map_or(u64::MAX, |cap| now.saturating_add(cap));
        let set = self.map.entry(key).or_default();
        let before = set.len();
        set.retain(|_, e| e.expiry > now);
        self.count -= before - set.len();
        let result = Self::offer(
            set,
            self.count,
            self.capacity,
            placement,
            value,
            (expiry, deadline),
        );
        if result == Ok(true) {
            self.count += 1;
        }
        if set.is_empty() {
            self.map.remove(&key);
        }
        result.map(|_| ())
    }

    /// [`Store::insert`] on one key's set; `Ok(true)` when a slot was taken.
    fn offer(
        set: &mut BTreeMap<SlotId, Entry>,
        count: usize,
        capacity: usize,
        p: &Placement,
        value: Vec<u8>,
        (expiry, deadline): (u64, u64),
    ) -> Result<bool, Rejection> {
        let id = (p.owner, p.slot);
        if let Some(held) = set.get_mut(&id) {
            if p.version > held.version {
                *held = Entry {
                    value,
                    version: p.version,
                    expiry,
                    deadline,
                };
            } else if p.version == held.version && held.value == value {
                held.expiry = held.expiry.max(expiry);
            } else {
                return Err(Rejection::Stale);
            }
            return Ok(false);
        }
        if count >= capacity {
            return Err(Rejection::StoreFull);
        }
        if set.len() >= MAX_VALUES_PER_KEY {
            return Err(Rejection::TooManyValues);
        }
        let owned = set
            .range((p.owner, [0; 32])..=(p.owner, [0xff; 32]))
            .count();
        if owned >= p.owner_limit {
            return Err(Rejection::OwnerFull);
        }
        set.insert(
            id,
            Entry {
                value,
                version: p.version,
                expiry,
                deadline,
            },
        );
        Ok(true)
    }

    /// A re-store of bytes already held and live under `key` (what owners send every
    /// republish period): their expiry grows to `now + ttl`, never past the deadline
    /// they were placed with. They were checked by the policy when placed, so this
    /// costs a comparison instead of a verification. `false`: not held, place it.
    pub(crate) fn refresh(&mut self, key: &Key, value: &[u8], now: u64, ttl: u64) -> bool {
        let Some(held) = self.map.get_mut(key).and_then(|set| {
            set.values_mut()
                .find(|e| e.expiry > now && e.value == value)
        }) else {
            return false;
        };
        held.expiry = held.expiry.max(now.saturating_add(ttl).min(held.deadline));
        true
    }

    /// The live values under `key`, in slot order.
    pub(crate) fn get(&self, key: &Key, now: u64) -> Vec<Vec<u8>> {
        self.map
            .get(key)
            .map(|set| {
                set.values()
                    .filter(|e| e.expiry > now)
                    .map(|e| e.value.clone())
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Drops expired values.
    pub(crate) fn expire(&mut self, now: u64) {
        let mut dropped = 0;
        self.map.retain(|_, set| {
            let before = set.len();
            set.retain(|_, e| e.expiry > now);
            dropped += before - set.len();
            !set.is_empty()
        });
        self.count -= dropped;
    }

    /// Live objects whose key is *not* in `(from, to]`, i.e. those a node that is
    /// responsible for `(from, to]` should pass on. `None` selects everything.
    pub(crate) fn objects_outside(&self, range: Option<(&Key, &Key)>, now: u64) -> Vec<Object> {
        let mut out = Vec::new();
        for (key, set) in &self.map {
            if range.is_some_and(|(a, b)| in_half_open(key, a, b)) {
                continue;
            }
            for e in set.values().filter(|e| e.expiry > now) {
                out.push(Object {
                    key: *key,
                    value: e.value.clone(),
                    ttl_ms: e.expiry - now,
                });
            }
        }
        out
    }

    /// Object ids held with their live value counts.
    pub(crate) fn summary(&self, now: u64) -> Vec<(Key, usize)> {
        self.map
            .iter()
            .map(|(k, set)| (*k, set.values().filter(|e| e.expiry > now).count()))
            .filter(|(_, n)| *n > 0)
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::{AnyValue, ValuePolicy};

    const K: Key = Key([1; 32]);

    /// Any value in its own slot, as the default policy places it.
    fn any(s: &mut Store, key: Key, value: &[u8], expiry: u64) -> Result<(), Rejection> {
        let p = AnyValue.place(&key, value).unwrap();
        s.insert(key, &p, value.to_vec(), expiry, 0)
    }

    fn slot(owner: u8, slot: u8, version: u64, owner_limit: usize) -> Placement {
        Placement {
            owner: [owner; 32],
            slot: [slot; 32],
            version,
            owner_limit,
            ttl_cap: None,
        }
    }

    #[test]
    fn a_refresh_of_held_bytes_skips_the_policy_but_not_the_deadline() {
        let mut s = Store::new(10);
        let capped = Placement {
            ttl_cap: Some(100),
            ..slot(1, 1, 1, 4)
        };
        s.insert(K, &capped, b"record".to_vec(), 60, 0).unwrap();
        // Held: refreshed in place, never past the deadline the policy gave it.
        assert!(s.refresh(&K, b"record", 50, 1_000));
        assert_eq!(s.get(&K, 99), vec![b"record".to_vec()]);
        assert!(s.get(&K, 100).is_empty());
        // Bytes not held, or held but expired: the caller must place them.
        assert!(!s.refresh(&K, b"other", 50, 1_000));
        assert!(!s.refresh(&K, b"record", 100, 1_000));
    }

    #[test]
    fn values_expire_and_refresh_extends() {
        let mut s = Store::new(10);
        any(&mut s, K, b"a", 100).unwrap();
        any(&mut s, K, b"a", 50).unwrap(); // does not shorten
        any(&mut s, K, b"b", 60).unwrap();
        let mut got = s.get(&K, 55);
        got.sort();
        assert_eq!(got, vec![b"a".to_vec(), b"b".to_vec()]);
        assert_eq!(s.get(&K, 70), vec![b"a".to_vec()]);
        s.expire(100);
        assert!(s.get(&K, 0).is_empty());
        assert_eq!(s.count, 0);
    }

    #[test]
    fn capacity_is_enforced() {
        let mut s = Store::new(1);
        any(&mut s, Key([1; 32]), b"a", 10).unwrap();
        assert_eq!(
            any(&mut s, Key([2; 32]), b"b", 10),
            Err(Rejection::StoreFull)
        );
        // A refresh of a held value still works when full.
        any(&mut s, Key([1; 32]), b"a", 20).unwrap();
        assert!(
            !s.map.contains_key(&Key([2; 32])),
            "no empty set left behind"
        );
    }

    #[test]
    fn values_per_key_are_bounded() {
        let mut s = Store::new(1000);
        for v in 0..MAX_VALUES_PER_KEY as u32 {
            any(&mut s, K, &v.to_be_bytes(), 10).unwrap();
        }
        assert_eq!(
            any(&mut s, K, b"one more", 10),
            Err(Rejection::TooManyValues)
        );
        assert_eq!(s.get(&K, 0).len(), MAX_VALUES_PER_KEY);
    }

    #[test]
    fn a_slot_holds_its_newest_version() {
        let mut s = Store::new(10);
        s.insert(K, &slot(1, 1, 5, 4), b"v5".to_vec(), 100, 0)
            .unwrap();
        // Older, or the same version with other bytes: stale.
        assert_eq!(
            s.insert(K, &slot(1, 1, 4, 4), b"v4".to_vec(), 100, 0),
            Err(Rejection::Stale)
        );
        assert_eq!(
            s.insert(K, &slot(1, 1, 5, 4), b"v5'".to_vec(), 100, 0),
            Err(Rejection::Stale)
        );
        // The same version and bytes refresh; a newer version replaces (count unchanged).
        s.insert(K, &slot(1, 1, 5, 4), b"v5".to_vec(), 200, 0)
            .unwrap();
        s.insert(K, &slot(1, 1, 6, 4), b"v6".to_vec(), 50, 0)
            .unwrap();
        assert_eq!(s.get(&K, 0), vec![b"v6".to_vec()]);
        assert_eq!(s.count, 1);
        // The same slot id of another owner is another slot.
        s.insert(K, &slot(2, 1, 1, 4), b"w1".to_vec(), 100, 0)
            .unwrap();
        assert_eq!(s.get(&K, 0).len(), 2);
        assert_eq!(s.count, 2);
    }

    #[test]
    fn a_newer_version_refuses_older_bytes_while_it_lives() {
        let mut s = Store::new(10);
        s.insert(K, &slot(1, 1, 1, 4), b"record".to_vec(), 100, 0)
            .unwrap();
        // The owner withdraws the record with a newer version (a tombstone) that lives
        // until 300: the old record, re-stored by anyone, is refused until then.
        s.insert(K, &slot(1, 1, 2, 4), b"tombstone".to_vec(), 300, 10)
            .unwrap();
        for now in [20, 150, 299] {
            assert_eq!(
                s.insert(K, &slot(1, 1, 1, 4), b"record".to_vec(), now + 100, now),
                Err(Rejection::Stale),
                "at {now}"
            );
        }
        assert_eq!(s.get(&K, 299), vec![b"tombstone".to_vec()]);
        // Once the tombstone has expired the slot is free again.
        s.insert(K, &slot(1, 1, 1, 4), b"record".to_vec(), 400, 300)
            .unwrap();
        assert_eq!(s.get(&K, 300), vec![b"record".to_vec()]);
        assert_eq!(s.count, 1);
    }

    #[test]
    fn owners_are_limited_separately() {
        let mut s = Store::new(1000);
        for i in 0..3 {
            s.insert(K, &slot(9, i, 0, 3), vec![i], 100, 0).unwrap();
        }
        assert_eq!(
            s.insert(K, &slot(9, 3, 0, 3), vec![3], 100, 0),
            Err(Rejection::OwnerFull)
        );
        // A held slot of a full owner still takes newer versions.
        s.insert(K, &slot(9, 0, 1, 3), vec![0, 1], 100, 0).unwrap();
        // Another owner is not affected.
        s.insert(K, &slot(1, 3, 0, 3), vec![3], 100, 0).unwrap();
        assert_eq!(s.get(&K, 0).len(), 4);
        // Expired slots no longer count against the owner.
        s.insert(K, &slot(8, 0, 0, 1), vec![8], 10, 0).unwrap();
        assert_eq!(
            s.insert(K, &slot(8, 1, 0, 1), vec![8, 1], 100, 5),
            Err(Rejection::OwnerFull)
        );
        s.insert(K, &slot(8, 1, 0, 1), vec![8, 1], 100, 10).unwrap();
    }

    #[test]
    fn handover_selects_keys_outside_the_range() {
        let mut s = Store::new(10);
        any(&mut s, Key([1; 32]), b"a", 10).unwrap();
        any(&mut s, Key([5; 32]), b"b", 10).unwrap();
        let out = s.objects_outside(Some((&Key([2; 32]), &Key([9; 32]))), 4);
        assert_eq!(
            out,
            vec![Object {
                key: Key([1; 32]),
                value: b"a".to_vec(),
                ttl_ms: 6
            }]
        );
        assert_eq!(s.objects_outside(None, 0).len(), 2);
    }
}
