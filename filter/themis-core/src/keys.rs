//! The key schedule: HKDF-SHA256 over the X25519 secret, salted with the transcript
//! hash, gives the key-confirmation key, the session id and one traffic secret per
//! direction. Each traffic secret ratchets forward every `records_per_key` records
//! (the rekeying of the secure channel); the AEAD key of an epoch is expanded from it.

use ring::{aead, hkdf};
use zeroize::Zeroizing;

use crate::suite::Suite;

/// HKDF labels. Versioned so that a future protocol never shares keys with this one.
pub(crate) mod label {
    pub const INITIATOR_TO_RESPONDER: &[u8] = b"themis/1 traffic i2r";
    pub const RESPONDER_TO_INITIATOR: &[u8] = b"themis/1 traffic r2i";
    pub const CONFIRM: &[u8] = b"themis/1 confirm";
    pub const SESSION_ID: &[u8] = b"themis/1 session id";
    pub const KEY: &[u8] = b"themis/1 key";
    pub const NEXT: &[u8] = b"themis/1 next secret";
}

/// A custom HKDF output length.
struct Len(usize);

impl hkdf::KeyType for Len {
    fn len(&self) -> usize {
        self.0
    }
}

fn expand<const N: usize>(prk: &hkdf::Prk, info: &[u8]) -> Zeroizing<[u8; N]> {
    let mut out = Zeroizing::new([0u8; N]);
    prk.expand(&[info], Len(N))
        .and_then(|okm| okm.fill(out.as_mut()))
        .expect("HKDF-SHA256 expands to 32 bytes or fewer");
    out
}

/// Everything the handshake derives from the shared secret and the transcript.
pub(crate) struct SessionKeys {
    pub session_id: u64,
    pub confirm_key: Zeroizing<[u8; 32]>,
    pub initiator_to_responder: Zeroizing<[u8; 32]>,
    pub responder_to_initiator: Zeroizing<[u8; 32]>,
}

impl SessionKeys {
    pub fn derive(shared_secret: &[u8], transcript_hash: &[u8; 32]) -> Self {
        let prk = hkdf::Salt::new(hkdf::HKDF_SHA256, transcript_hash).extract(shared_secret);
        let id_bytes: Zeroizing<[u8; 8]> = expand(&prk, label::SESSION_ID);
        SessionKeys {
            session_id: u64::from_le_bytes(*id_bytes),
            confirm_key: expand(&prk, label::CONFIRM),
            initiator_to_responder: expand(&prk, label::INITIATOR_TO_RESPONDER),
            responder_to_initiator: expand(&prk, label::RESPONDER_TO_INITIATOR),
        }
    }
}

/// The keys of one direction of a session, at some epoch of the ratchet.
pub(crate) struct DirectionKey {
    suite: Suite,
    secret: Zeroizing<[u8; 32]>,
    pub epoch: u64,
    pub key: aead::LessSafeKey,
}

impl DirectionKey {
    pub fn new(suite: Suite, secret: &[u8; 32]) -> Self {
        Self::at_epoch(suite, Zeroizing::new(*secret), 0)
    }

    fn at_epoch(suite: Suite, secret: Zeroizing<[u8; 32]>, epoch: u64) -> Self {
        let prk = hkdf::Prk::new_less_safe(hkdf::HKDF_SHA256, secret.as_ref());
        let key_bytes: Zeroizing<[u8; 32]> = expand(&prk, label::KEY);
        let unbound = aead::UnboundKey::new(suite.algorithm(), key_bytes.as_ref())
            .expect("both suites take 32-byte keys");
        DirectionKey {
            suite,
            secret,
            epoch,
            key: aead::LessSafeKey::new(unbound),
        }
    }

    /// The key of `epoch` (> this one's), and the key of `epoch - 1` unless that is
    /// this one (which the caller already holds; ring's keys do not clone).
    pub fn ratchet_to(&self, epoch: u64) -> (Option<Self>, Self) {
        let mut before = None;
        let mut at = self.next();
        while at.epoch < epoch {
            let next = at.next();
            before = Some(at);
            at = next;
        }
        (before, at)
    }

    /// The key of the next epoch. The old secret is not derivable from the new one,
    /// so dropping it gives forward secrecy within the session.
    pub fn next(&self) -> Self {
        let prk = hkdf::Prk::new_less_safe(hkdf::HKDF_SHA256, self.secret.as_ref());
        Self::at_epoch(self.suite, expand(&prk, label::NEXT), self.epoch + 1)
    }
}

/// The AEAD nonce of a record: four zero bytes then the sequence number, big-endian.
/// Sequence numbers never repeat within a direction, so nonces never repeat under a key.
pub(crate) fn nonce(seq: u64) -> aead::Nonce {
    let mut n = [0u8; aead::NONCE_LEN];
    n[4..].copy_from_slice(&seq.to_be_bytes());
    aead::Nonce::assume_unique_for_key(n)
}
