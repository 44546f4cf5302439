//! Positions on the 256-bit identifier ring and the interval arithmetic Chord needs.
//!
//! A [`Key`] is both a point on the ring (a node id or an object id) and, for
//! [`distance`], an unsigned 256-bit number. Keys compare as big-endian numbers, so
//! sorting keys sorts the ring.

use core::fmt;

use ring::digest;
use ruint::aliases::U256;
use serde::{Deserialize, Serialize};
use themis_core::PeerId;

/// Number of bits in a key, and so the number of fingers.
pub const KEY_BITS: usize = 256;

/// A 256-bit ring position, big-endian.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Key(pub [u8; 32]);

impl Key {
    /// The zero key (also the zero distance).
    pub const ZERO: Key = Key([0; 32]);

    fn to_u256(self) -> U256 {
        U256::from_be_bytes(self.0)
    }

    fn from_u256(v: U256) -> Key {
        Key(v.to_be_bytes())
    }

    /// The id of object replica `r` of `name`: `SHA-256(name || r)`, `r` as one byte.
    pub fn object(name: &[u8], r: u8) -> Key {
        let mut ctx = digest::Context::new(&digest::SHA256);
        ctx.update(name);
        ctx.update(&[r]);
        let mut k = [0u8; 32];
        k.copy_from_slice(ctx.finish().as_ref());
        Key(k)
    }

    /// `self + 2^i mod 2^256`: the target of finger `i`.
    ///
    /// # Panics
    /// If `i >= 256`.
    pub fn finger_target(self, i: usize) -> Key {
        assert!(i < KEY_BITS, "finger index {i} out of range");
        Key::from_u256(self.to_u256().wrapping_add(U256::from(1u8) << i))
    }

    /// The key whose value is `v` (handy for offsets and tests).
    pub fn from_low(v: u64) -> Key {
        Key::from_u256(U256::from(v))
    }

    /// `self + d mod 2^256`.
    pub fn wrapping_add(self, d: Key) -> Key {
        Key::from_u256(self.to_u256().wrapping_add(d.to_u256()))
    }
}

impl From<PeerId> for Key {
    fn from(id: PeerId) -> Key {
        Key(id.0)
    }
}

impl fmt::Debug for Key {
    // Eight hex digits are enough to tell nodes apart in logs and test failures.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for b in &self.0[..4] {
            write!(f, "{b:02x}")?;
        }
        f.write_str("…")
    }
}

impl fmt::Display for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for b in &self.0 {
            write!(f, "{b:02x}")?;
        }
        Ok(())
    }
}

/// Clockwise distance from `a` to `b`: `b - a mod 2^256` (zero when equal).
pub fn distance(a: &Key, b: &Key) -> Key {
    Key::from_u256(b.to_u256().wrapping_sub(a.to_u256()))
}

/// `x ∈ (a, b)` going clockwise. With `a == b` the interval is the whole ring but `a`.
// Plain comparisons rather than distances: this runs for every finger on every routing
// step, and comparisons stay cheap even in unoptimised builds.
pub fn in_open(x: &Key, a: &Key, b: &Key) -> bool {
    match a.cmp(b) {
        core::cmp::Ordering::Less => a < x && x < b,
        core::cmp::Ordering::Greater => x > a || x < b,
        core::cmp::Ordering::Equal => x != a,
    }
}

/// `x ∈ (a, b]` going clockwise. With `a == b` the interval is the whole ring (a lone
/// node is responsible for every key).
pub fn in_half_open(x: &Key, a: &Key, b: &Key) -> bool {
    a == b || x == b || in_open(x, a, b)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn k(v: u64) -> Key {
        Key::from_u256(U256::from(v))
    }
    fn max() -> Key {
        Key([0xff; 32])
    }

    #[test]
    fn intervals_without_wrap() {
        assert!(in_open(&k(5), &k(1), &k(10)));
        assert!(!in_open(&k(1), &k(1), &k(10)));
        assert!(!in_open(&k(10), &k(1), &k(10)));
        assert!(in_half_open(&k(10), &k(1), &k(10)));
        assert!(!in_half_open(&k(1), &k(1), &k(10)));
        assert!(!in_half_open(&k(11), &k(1), &k(10)));
    }

    #[test]
    fn intervals_wrap_around_zero() {
        // (max-1, 3): max, 0, 1, 2
        let a = max().wrapping_add(max()); // max - 1
        assert!(in_open(&max(), &a, &k(3)));
        assert!(in_open(&k(0), &a, &k(3)));
        assert!(in_open(&k(2), &a, &k(3)));
        assert!(!in_open(&k(3), &a, &k(3)));
        assert!(!in_open(&k(4), &a, &k(3)));
        assert!(in_half_open(&k(3), &a, &k(3)));
        assert!(!in_half_open(&a, &a, &k(3)));
    }

    #[test]
    fn degenerate_intervals_cover_the_ring() {
        assert!(in_half_open(&k(7), &k(7), &k(7)));
        assert!(in_half_open(&k(8), &k(7), &k(7)));
        assert!(!in_open(&k(7), &k(7), &k(7)));
        assert!(in_open(&k(8), &k(7), &k(7)));
    }

    #[test]
    fn distance_wraps() {
        assert_eq!(distance(&k(3), &k(10)), k(7));
        assert_eq!(
            distance(&k(10), &k(3)),
            Key::from_u256(U256::MAX - U256::from(6u8))
        );
        assert_eq!(distance(&max(), &k(0)), k(1));
        assert_eq!(distance(&k(4), &k(4)), Key::ZERO);
    }

    #[test]
    fn finger_targets() {
        assert_eq!(k(0).finger_target(0), k(1));
        assert_eq!(k(5).finger_target(3), k(13));
        assert_eq!(max().finger_target(0), k(0));
        let mut top = [0u8; 32];
        top[0] = 0x80;
        assert_eq!(k(0).finger_target(255), Key(top));
        assert_eq!(Key(top).finger_target(255), k(0));
    }

    #[test]
    fn object_ids_differ_per_replica_and_match_sha256() {
        let a = Key::object(b"payments", 0);
        assert_ne!(a, Key::object(b"payments", 1));
        let mut input = b"payments".to_vec();
        input.push(0);
        assert_eq!(
            a.0.as_slice(),
            digest::digest(&digest::SHA256, &input).as_ref()
        );
    }

    fn key() -> impl Strategy<Value = Key> {
        prop_oneof![
            any::<[u8; 32]>().prop_map(Key),
            // Small and near-max values exercise the wrap-around.
            any::<u8>().prop_map(|v| k(v.into())),
            any::<u8>().prop_map(|v| distance(&k(v.into()), &Key::ZERO)),
        ]
    }

    proptest! {
        #[test]
        fn distance_is_additive(a in key(), b in key()) {
            prop_assert_eq!(a.wrapping_add(distance(&a, &b)), b);
        }

        #[test]
        fn open_interval_splits_the_ring(x in key(), a in key(), b in key()) {
            prop_assume!(a != b && x != a && x != b);
            // Every other point lies in exactly one of (a, b) and (b, a).
            prop_assert!(in_open(&x, &a, &b) ^ in_open(&x, &b, &a));
        }

        #[test]
        fn half_open_is_open_plus_end(x in key(), a in key(), b in key()) {
            prop_assume!(a != b);
            prop_assert_eq!(in_half_open(&x, &a, &b), in_open(&x, &a, &b) || x == b);
        }

        #[test]
        fn inside_means_closer(x in key(), a in key(), b in key()) {
            prop_assume!(a != b);
            prop_assert_eq!(in_open(&x, &a, &b), x != a && distance(&x, &b) < distance(&a, &b) && x != b);
        }

        #[test]
        fn intervals_agree_with_distances(x in key(), a in key(), b in key()) {
            prop_assume!(a != b);
            let dx = distance(&a, &x);
            prop_assert_eq!(in_open(&x, &a, &b), dx != Key::ZERO && dx < distance(&a, &b));
            prop_assert_eq!(in_half_open(&x, &a, &b), dx != Key::ZERO && dx <= distance(&a, &b));
        }

        #[test]
        fn finger_target_is_at_power_of_two(a in key(), i in 0usize..256) {
            let t = a.finger_target(i);
            let d = distance(&a, &t);
            prop_assert_eq!(d, Key::from_u256(U256::from(1u8) << i));
            if i > 0 {
                prop_assert!(in_open(&a.finger_target(i - 1), &a, &t));
            }
        }
    }
}
