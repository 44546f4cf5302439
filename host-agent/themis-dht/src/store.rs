//! The objects a node holds: for each object id, a set of values with an expiry.

use std::collections::BTreeMap;

use crate::key::{in_half_open, Key};
use crate::message::{Object, MAX_VALUES_PER_KEY};
use crate::Rejection;

/// Values by object id; each value carries its absolute expiry (node clock, ms).
#[derive(Debug, Default)]
pub(crate) struct Store {
    map: BTreeMap<Key, BTreeMap<Vec<u8>, u64>>,
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

    /// Adds or refreshes a value. A refresh only ever extends the expiry.
    pub(crate) fn insert(
        &mut self,
        key: Key,
        value: Vec<u8>,
        expiry: u64,
    ) -> Result<(), Rejection> {
        let held = self.map.get(&key);
        if let Some(e) = held.and_then(|set| set.get(&value)) {
            let e = (*e).max(expiry);
            self.map.entry(key).or_default().insert(value, e);
            return Ok(());
        }
        if self.count >= self.capacity {
            return Err(Rejection::StoreFull);
        }
        if held.is_some_and(|set| set.len() >= MAX_VALUES_PER_KEY) {
            return Err(Rejection::TooManyValues);
        }
        self.map.entry(key).or_default().insert(value, expiry);
        self.count += 1;
        Ok(())
    }

    /// The live values under `key`.
    pub(crate) fn get(&self, key: &Key, now: u64) -> Vec<Vec<u8>> {
        self.map
            .get(key)
            .map(|set| {
                set.iter()
                    .filter(|(_, &e)| e > now)
                    .map(|(v, _)| v.clone())
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Drops expired values.
    pub(crate) fn expire(&mut self, now: u64) {
        let mut dropped = 0;
        self.map.retain(|_, set| {
            let before = set.len();
            set.retain(|_, e| *e > now);
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
            for (value, &e) in set {
                if e > now {
                    out.push(Object {
                        key: *key,
                        value: value.clone(),
                        ttl_ms: e - now,
                    });
                }
            }
        }
        out
    }

    /// Object ids held with their live value counts.
    pub(crate) fn summary(&self, now: u64) -> Vec<(Key, usize)> {
        self.map
            .iter()
            .map(|(k, set)| (*k, set.values().filter(|&&e| e > now).count()))
            .filter(|(_, n)| *n > 0)
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_expire_and_refresh_extends() {
        let mut s = Store::new(10);
        let k = Key([1; 32]);
        s.insert(k, b"a".to_vec(), 100).unwrap();
        s.insert(k, b"a".to_vec(), 50).unwrap(); // does not shorten
        s.insert(k, b"b".to_vec(), 60).unwrap();
        assert_eq!(s.get(&k, 55), vec![b"a".to_vec(), b"b".to_vec()]);
        assert_eq!(s.get(&k, 70), vec![b"a".to_vec()]);
        s.expire(100);
        assert!(s.get(&k, 0).is_empty());
        assert_eq!(s.count, 0);
    }

    #[test]
    fn capacity_is_enforced() {
        let mut s = Store::new(1);
        s.insert(Key([1; 32]), b"a".to_vec(), 10).unwrap();
        assert_eq!(
            s.insert(Key([2; 32]), b"b".to_vec(), 10),
            Err(Rejection::StoreFull)
        );
        // A refresh of a held value still works when full.
        s.insert(Key([1; 32]), b"a".to_vec(), 20).unwrap();
    }

    #[test]
    fn values_per_key_are_bounded() {
        let mut s = Store::new(1000);
        for v in 0..MAX_VALUES_PER_KEY as u32 {
            s.insert(Key([1; 32]), v.to_be_bytes().to_vec(), 10)
                .unwrap();
        }
        assert_eq!(
            s.insert(Key([1; 32]), b"one more".to_vec(), 10),
            Err(Rejection::TooManyValues)
        );
        assert_eq!(s.get(&Key([1; 32]), 0).len(), MAX_VALUES_PER_KEY);
    }

    #[test]
    fn handover_selects_keys_outside_the_range() {
        let mut s = Store::new(10);
        s.insert(Key([1; 32]), b"a".to_vec(), 10).unwrap();
        s.insert(Key([5; 32]), b"b".to_vec(), 10).unwrap();
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
