//! The handshake's transcript hashes: what each signature covers and what the
//! session keys are derived from, domain-separated by label. Its own module (as
//! rustls' `hash_hs`) so that the handshake, the Hello guard and anything else that
//! names a message by its hash share one definition without importing each other.

use ring::digest;

pub(crate) fn hello(body_bytes: &[u8]) -> [u8; 32] {
    finish(&[b"themis/1 hello signature", body_bytes])
}

pub(crate) fn hello_reply(hello_bytes: &[u8], body_bytes: &[u8]) -> [u8; 32] {
    hello_reply_hashed(&hello_hash(hello_bytes), body_bytes)
}

/// The hash of message 1 that message 2's signature covers.
pub(crate) fn hello_hash(hello_bytes: &[u8]) -> [u8; 32] {
    finish(&[hello_bytes])
}

pub(crate) fn hello_reply_hashed(hello_hash: &[u8; 32], body_bytes: &[u8]) -> [u8; 32] {
    finish(&[b"themis/1 hello-reply signature", hello_hash, body_bytes])
}

pub(crate) fn transcript(hello_bytes: &[u8], reply_bytes: &[u8]) -> [u8; 32] {
    finish(&[b"themis/1 transcript", hello_bytes, reply_bytes])
}

pub(crate) fn finish(parts: &[&[u8]]) -> [u8; 32] {
    let mut ctx = digest::Context::new(&digest::SHA256);
    parts.iter().for_each(|p| ctx.update(p));
    let mut out = [0u8; 32];
    out.copy_from_slice(ctx.finish().as_ref());
    out
}
