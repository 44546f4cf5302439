//! Helpers shared by the integration tests: deterministic randomness, identities
//! and complete handshakes.
#![allow(dead_code)]

use core::cell::UnsafeCell;

use ring::rand::SecureRandom;
use themis_core::handshake::{self, Initiator};
use themis_core::{HandshakeConfig, HelloGuard, Identity, MeshName, Session};

/// The clock of the tests' handshakes (Unix ms). Each `respond` gets a fresh
/// [`HelloGuard`] unless a test is about the guard.
pub const NOW_MS: u64 = 1_700_000_000_000;

/// Runs `f` with a random number generator that returns `chunks`, one per call, in
/// order (the core documents how many bytes each step draws).
#[allow(deprecated)]
pub fn with_rng<T>(chunks: &[&[u8]], f: impl FnOnce(&dyn SecureRandom) -> T) -> T {
    let rng = ring::test::rand::FixedSliceSequenceRandom {
        bytes: chunks,
        current: UnsafeCell::new(0),
    };
    f(&rng)
}

/// Like [`with_rng`], but `f` may draw fewer chunks than given (a rejected message
/// draws none). ring's fixed generator asserts on drop that every chunk was drawn, so
/// it is never dropped: it owns nothing on the heap. Drawing more still panics.
#[allow(deprecated)]
pub fn with_lenient_rng<T>(chunks: &[&[u8]], f: impl FnOnce(&dyn SecureRandom) -> T) -> T {
    let rng = core::mem::ManuallyDrop::new(ring::test::rand::FixedSliceSequenceRandom {
        bytes: chunks,
        current: UnsafeCell::new(0),
    });
    f(&*rng)
}

pub fn mesh(name: &str) -> MeshName {
    MeshName::new(name).unwrap()
}

/// An identity whose key seed is 32 copies of `seed`.
pub fn identity(mesh_name: &str, seed: u8) -> Identity {
    with_rng(&[&[seed; 32]], |rng| {
        Identity::generate(mesh(mesh_name), rng)
    })
    .unwrap()
}

/// The messages of one handshake, as sent.
pub struct Transcript {
    pub hello: Vec<u8>,
    pub reply: Vec<u8>,
    pub confirm: Vec<u8>,
}

/// A complete handshake from `a` to `b` with fixed randomness derived from `salt`.
pub fn handshake_with(
    a: &Identity,
    b: &Identity,
    config: &HandshakeConfig,
    salt: u8,
) -> (Session, Session, Transcript) {
    let (waiting, hello) = with_rng(&[&[salt; 32], &[salt ^ 0x11; 32]], |rng| {
        Initiator::start(a, b.id(), config, NOW_MS, rng)
    })
    .unwrap();
    let (pending, reply) = with_rng(&[&[salt ^ 0x22; 32], &[salt ^ 0x33; 32]], |rng| {
        handshake::respond(b, &hello, config, &mut HelloGuard::default(), NOW_MS, rng)
    })
    .unwrap();
    let (sa, confirm) = waiting.read_hello_reply(&reply).unwrap();
    let sb = pending.read_confirm(&confirm).unwrap();
    (
        sa,
        sb,
        Transcript {
            hello,
            reply,
            confirm,
        },
    )
}

pub fn handshake(a: &Identity, b: &Identity) -> (Session, Session, Transcript) {
    handshake_with(a, b, &HandshakeConfig::default(), 0x42)
}

/// Opens a copy of `record` and returns the plaintext or the error.
pub fn open(session: &mut Session, record: &[u8]) -> Result<Vec<u8>, themis_core::ChannelError> {
    let mut buf = record.to_vec();
    session.open_in_place(&mut buf).map(|o| o.payload.to_vec())
}
