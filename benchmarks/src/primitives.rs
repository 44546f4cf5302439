//! The lower limits: raw `ring` operations with none of Themis' encoding, state or
//! checks around them.

use std::hint::black_box;

use ring::aead::{self, Aad, LessSafeKey, Nonce, UnboundKey};
use ring::agreement::{self, EphemeralPrivateKey, UnparsedPublicKey};
use ring::rand::SecureRandom;
use ring::signature::{self, Ed25519KeyPair, KeyPair};
use ring::{digest, hkdf, hmac};

use crate::themis::{Completed, MESH};

/// Bytes of an Ed25519 signature (the tail of messages 1 and 2).
const SIGNATURE_LEN: usize = 64;
/// Themis binds `header (30 bytes) ‖ receiver id (32 bytes)` as associated data.
pub const RECORD_AAD_LEN: usize = 62;
/// Bytes of an AEAD tag.
pub const TAG_LEN: usize = 16;

/// Every `ring` operation of one Themis handshake (both sides), in the order
/// `themis-core/src/handshake.rs` performs them. Hashes run over inputs of the real
/// messages' lengths (captured from a real handshake), so they cost the same.
///
/// Per handshake: 2 × (X25519 generate + public key + 32-byte nonce), 2 × Ed25519
/// sign, 2 × Ed25519 verify, 10 × SHA-256 (2 id derivations, 2 message-1 digests,
/// 2 × 2 message-2 digests, 2 transcript hashes), 2 × X25519 agree, 2 × HKDF extract,
/// 12 × HKDF expand (4 per side in the key schedule + 1 per traffic key), 4 AEAD key
/// setups, 1 HMAC sign + 1 HMAC verify.
pub struct HandshakeOps {
    initiator_key: Ed25519KeyPair,
    responder_key: Ed25519KeyPair,
    hello: Vec<u8>,
    reply: Vec<u8>,
    aead: &'static aead::Algorithm,
}

impl HandshakeOps {
    /// Fresh signing keys; the message lengths and AEAD come from `real`.
    pub fn new(real: &Completed, rng: &dyn SecureRandom) -> Self {
        let key = || {
            let mut seed = [0u8; 32];
            rng.fill(&mut seed).expect("the system RNG works");
            Ed25519KeyPair::from_seed_unchecked(&seed).expect("any 32 bytes are a seed")
        };
        let aead = match real.initiator.info().suite {
            themis_core::Suite::Aes256Gcm => &aead::AES_256_GCM,
            themis_core::Suite::ChaCha20Poly1305 => &aead::CHACHA20_POLY1305,
        };
        HandshakeOps {
            initiator_key: key(),
            responder_key: key(),
            hello: real.hello.clone(),
            reply: real.reply.clone(),
            aead,
        }
    }

    /// Runs the operations once; returns the four traffic keys.
    pub fn run(&self, rng: &dyn SecureRandom) -> [LessSafeKey; 4] {
        let hello_body = &self.hello[..self.hello.len() - SIGNATURE_LEN];
        let reply_body = &self.reply[..self.reply.len() - SIGNATURE_LEN];
        let initiator_public = self.initiator_key.public_key().as_ref();
        let responder_public = self.responder_key.public_key().as_ref();

        // Initiator::start
        let (initiator_eph, initiator_share) = ephemeral(rng);
        let sig_i = self
            .initiator_key
            .sign(&sha256(&[b"themis/1 hello signature", hello_body]));

        // respond
        black_box(sha256(&[initiator_public, MESH.as_bytes()]));
        let hello_digest = sha256(&[b"themis/1 hello signature", hello_body]);
        verify(initiator_public, &hello_digest, sig_i.as_ref());
        let (responder_eph, responder_share) = ephemeral(rng);
        let sig_r = self.responder_key.sign(&self.reply_digest(reply_body));
        let transcript = sha256(&[b"themis/1 transcript", &self.hello, &self.reply]);
        let (confirm_r, [r_send, r_recv]) =
            key_schedule(responder_eph, &initiator_share, &transcript, self.aead);

        // AwaitingHelloReply::read_hello_reply
        black_box(sha256(&[responder_public, MESH.as_bytes()]));
        verify(
            responder_public,
            &self.reply_digest(reply_body),
            sig_r.as_ref(),
        );
        let transcript = sha256(&[b"themis/1 transcript", &self.hello, &self.reply]);
        let (confirm_i, [i_send, i_recv]) =
            key_schedule(initiator_eph, &responder_share, &transcript, self.aead);
        let mac = hmac::sign(&hmac::Key::new(hmac::HMAC_SHA256, &confirm_i), &transcript);

        // AwaitingConfirm::read_confirm
        hmac::verify(
            &hmac::Key::new(hmac::HMAC_SHA256, &confirm_r),
            &transcript,
            mac.as_ref(),
        )
        .expect("both sides derived the same confirmation key");
        [i_send, i_recv, r_send, r_recv]
    }

    fn reply_digest(&self, reply_body: &[u8]) -> [u8; 32] {
        let hello_hash = sha256(&[&self.hello]);
        sha256(&[b"themis/1 hello-reply signature", &hello_hash, reply_body])
    }
}

fn sha256(parts: &[&[u8]]) -> [u8; 32] {
    let mut ctx = digest::Context::new(&digest::SHA256);
    parts.iter().for_each(|p| ctx.update(p));
    ctx.finish()
        .as_ref()
        .try_into()
        .expect("SHA-256 is 32 bytes")
}

fn verify(public_key: &[u8], message: &[u8], sig: &[u8]) {
    signature::UnparsedPublicKey::new(&signature::ED25519, public_key)
        .verify(message, sig)
        .expect("the signature verifies");
}

/// An X25519 ephemeral key, its public share, and the 32-byte nonce drawn with it.
fn ephemeral(rng: &dyn SecureRandom) -> (EphemeralPrivateKey, [u8; 32]) {
    let key = EphemeralPrivateKey::generate(&agreement::X25519, rng).expect("rng");
    let share = key
        .compute_public_key()
        .expect("public key")
        .as_ref()
        .try_into()
        .expect("32");
    let mut nonce = [0u8; 32];
    rng.fill(&mut nonce).expect("rng");
    black_box(nonce);
    (key, share)
}

/// A 32-byte HKDF output length.
struct Len(usize);

impl hkdf::KeyType for Len {
    fn len(&self) -> usize {
        self.0
    }
}

fn expand<const N: usize>(prk: &hkdf::Prk, info: &[u8]) -> [u8; N] {
    let mut out = [0u8; N];
    prk.expand(&[info], Len(N))
        .and_then(|okm| okm.fill(&mut out))
        .expect("HKDF length");
    out
}

/// X25519 agree, HKDF extract salted with the transcript hash, four expands (session
/// id, confirmation key, two traffic secrets), then one AEAD key per direction.
fn key_schedule(
    mine: EphemeralPrivateKey,
    peer_share: &[u8; 32],
    transcript: &[u8; 32],
    aead: &'static aead::Algorithm,
) -> ([u8; 32], [LessSafeKey; 2]) {
    let peer = UnparsedPublicKey::new(&agreement::X25519, peer_share);
    let (confirm, i2r, r2i) = agreement::agree_ephemeral(mine, &peer, |secret| {
        let prk = hkdf::Salt::new(hkdf::HKDF_SHA256, transcript).extract(secret);
        black_box(expand::<8>(&prk, b"themis/1 session id"));
        (
            expand::<32>(&prk, b"themis/1 confirm"),
            expand::<32>(&prk, b"themis/1 traffic i2r"),
            expand::<32>(&prk, b"themis/1 traffic r2i"),
        )
    })
    .expect("valid share");
    (confirm, [traffic_key(aead, &i2r), traffic_key(aead, &r2i)])
}

fn traffic_key(aead: &'static aead::Algorithm, secret: &[u8; 32]) -> LessSafeKey {
    let prk = hkdf::Prk::new_less_safe(hkdf::HKDF_SHA256, secret);
    let key: [u8; 32] = expand(&prk, b"themis/1 key");
    LessSafeKey::new(UnboundKey::new(aead, &key).expect("32-byte key"))
}

/// Raw `ring` AEAD records: one key per side, a counter nonce, and associated data
/// as long as a Themis record's. No header, no replay window, no rekeying.
pub struct RawAead {
    sealer: LessSafeKey,
    opener: LessSafeKey,
    seq: u64,
}

impl RawAead {
    /// A random key for `aead`.
    pub fn new(aead: &'static aead::Algorithm, rng: &dyn SecureRandom) -> Self {
        let mut bytes = [0u8; 32];
        rng.fill(&mut bytes).expect("rng");
        let key = || LessSafeKey::new(UnboundKey::new(aead, &bytes).expect("32-byte key"));
        RawAead {
            sealer: key(),
            opener: key(),
            seq: 0,
        }
    }

    /// Seals the first `buf.len() - TAG_LEN` bytes in place, writes the tag after
    /// them, then opens the whole buffer in place. Returns the plaintext length.
    pub fn seal_open(&mut self, buf: &mut [u8]) -> usize {
        self.seq += 1;
        let nonce = || {
            let mut n = [0u8; aead::NONCE_LEN];
            n[4..].copy_from_slice(&self.seq.to_be_bytes());
            Nonce::assume_unique_for_key(n)
        };
        let aad = || Aad::from([0u8; RECORD_AAD_LEN]);
        let (payload, tag) = buf.split_at_mut(buf.len() - TAG_LEN);
        let sealed = self
            .sealer
            .seal_in_place_separate_tag(nonce(), aad(), payload)
            .expect("seal");
        tag.copy_from_slice(sealed.as_ref());
        self.opener
            .open_in_place(nonce(), aad(), buf)
            .expect("open")
            .len()
    }
}
