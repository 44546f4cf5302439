//! AEAD cipher suites of the secure channel.

use ring::aead;
use serde::{Deserialize, Serialize};

/// An AEAD suite for the secure channel. The key agreement always uses X25519,
/// Ed25519 and HKDF-SHA256; only the record cipher is negotiated.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Suite {
    /// ChaCha20-Poly1305: fast everywhere, including Wasm without AES instructions.
    ChaCha20Poly1305,
    /// AES-256-GCM: the faster choice on CPUs with AES and carry-less multiply.
    Aes256Gcm,
}

impl Suite {
    /// Every suite this implementation speaks.
    pub const ALL: [Suite; 2] = [Suite::ChaCha20Poly1305, Suite::Aes256Gcm];

    /// The preference order for this build target: AES-256-GCM first where the CPU
    /// accelerates it, ChaCha20-Poly1305 first in Wasm (no AES instructions there).
    pub const fn preferred() -> &'static [Suite] {
        if cfg!(target_family = "wasm") {
            &[Suite::ChaCha20Poly1305, Suite::Aes256Gcm]
        } else {
            &[Suite::Aes256Gcm, Suite::ChaCha20Poly1305]
        }
    }

    /// This suite alone, as a preference list for [`crate::HandshakeConfig::suites`].
    pub const fn only(self) -> &'static [Suite] {
        match self {
            Suite::ChaCha20Poly1305 => &[Suite::ChaCha20Poly1305],
            Suite::Aes256Gcm => &[Suite::Aes256Gcm],
        }
    }

    /// The suite's bit in a [`SuiteSet`] on the wire.
    pub(crate) const fn bit(self) -> u8 {
        match self {
            Suite::ChaCha20Poly1305 => 0b01,
            Suite::Aes256Gcm => 0b10,
        }
    }

    pub(crate) fn algorithm(self) -> &'static aead::Algorithm {
        match self {
            Suite::ChaCha20Poly1305 => &aead::CHACHA20_POLY1305,
            Suite::Aes256Gcm => &aead::AES_256_GCM,
        }
    }
}

/// A set of suites as the bitmask carried in the first handshake message. Unknown
/// bits are ignored, so a newer peer can offer suites this build does not know.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct SuiteSet(pub(crate) u8);

impl SuiteSet {
    pub(crate) fn of(suites: &[Suite]) -> Self {
        SuiteSet(suites.iter().fold(0, |bits, s| bits | s.bit()))
    }

    pub(crate) fn contains(self, suite: Suite) -> bool {
        self.0 & suite.bit() != 0
    }

    /// The first suite of `preference` that is in the set.
    pub(crate) fn pick(self, preference: &[Suite]) -> Option<Suite> {
        preference.iter().copied().find(|s| self.contains(*s))
    }
}
