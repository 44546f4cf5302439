//! Shared setup for the Themis Mesh benchmarks: each protocol's "both sides in
//! memory" driver lives here once, and the bench targets (`benches/`), the
//! allocation check (`src/bin/alloc_count.rs`) and the interleaved A/B check
//! (`src/bin/paired.rs`) only time or count them.
//!
//! * [`themis`]: identities and a full in-memory handshake of `themis-core`.
//! * [`primitives`]: the raw `ring` operations that handshake is made of, and raw
//!   `ring` AEAD records: the lower limits Themis is measured against.
//! * [`tls`]: rustls TLS 1.3 with client authentication (mTLS), `ring` provider.
//! * [`noise`]: snow's `Noise_XX_25519_ChaChaPoly_SHA256`.
//!
//! Randomness always comes from [`ring::rand::SystemRandom`]: nothing is seeded, so
//! no run can be faster than real use because of a fixed key or nonce.

pub mod admission_flood;
pub mod noise;
pub mod plaintext;
pub mod primitives;
pub mod themis;
pub mod tls;

/// The record payload sizes: 1 KB, 10 KB, 100 KB and 1000 KB (KB = 1024 bytes).
pub const RECORD_SIZES: [usize; 4] = [1024, 10 * 1024, 100 * 1024, 1000 * 1024];

/// `1KB`, `10KB`, ... for benchmark ids and tables.
pub fn size_label(bytes: usize) -> String {
    format!("{}KB", bytes / 1024)
}
