//! The authenticated key agreement: the paper's three messages (Fig. 2).
//!
//! ```text
//! initiator A                                          responder B
//!   Hello      = v, suites, mesh, id_A, pk_A, id_B, g^x, n_A, sig_A  ──▶
//!   ◀──  HelloReply = v, suite, id_A, pk_B, g^y, n_B, sig_B(H(Hello) ‖ body)
//!   Confirm    = v, session id, HMAC(k_confirm, transcript hash)     ──▶
//! ```
//!
//! Each side checks that the other's public key hashes to the id it claims (A: to
//! the id it meant to reach), verifies the signature, and only then computes the
//! shared secret. States are types: [`Initiator::start`] gives an
//! [`AwaitingHelloReply`], whose only way on is [`AwaitingHelloReply::read_hello_reply`];
//! [`respond`] gives an [`AwaitingConfirm`], which yields a [`Session`] only for a
//! valid key confirmation. The peer's ephemeral share is reachable only through
//! [`verified::Share`], which only signature verification constructs, so no code path
//! derives keys from an unverified message.

use alloc::vec::Vec;

use ring::agreement::{self, EphemeralPrivateKey, UnparsedPublicKey};
use ring::hmac;
use ring::rand::SecureRandom;

use crate::channel::{Session, SessionInfo};
use crate::delegation::{self, DelegationError, HandshakeSigner};
use crate::guard::{Freshness, HelloGuard, HelloKey};
use crate::identity::{Identity, MeshName, PeerId, PublicIdentity};
use crate::keys::SessionKeys;
pub use crate::params::{Carries, HandshakeConfig, Role, StreamOptions, DEFAULT_RECORDS_PER_KEY};
use crate::params::{CARRIES_MASK, MIN_RECORDS_PER_KEY};
use crate::suite::{Suite, SuiteSet};
use crate::transcript as digests;
use crate::wire::{
    self, Confirm, Hello, HelloBody, HelloReply, HelloReplyBody, Kind, Signature, WireError,
    MAX_ENDORSEMENT_LEN, PROTOCOL_VERSION,
};

/// Why a handshake failed. Drivers log it and count it; the peer learns nothing but
/// that the handshake was rejected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HandshakeError {
    /// The bytes do not decode as the message expected.
    #[error("bad handshake message: {0}")]
    Wire(#[from] WireError),
    /// Message 1 names another mesh.
    #[error("the peer is in another mesh")]
    WrongMesh,
    /// The message is addressed to another id than ours.
    #[error("the message is meant for another id")]
    NotForMe,
    /// A public key does not hash to the id claimed for it (or, for the responder's
    /// key, to the id the initiator meant to reach).
    #[error("the peer's public key does not match its id")]
    KeyIdMismatch,
    /// The signature does not verify under the sender's public key (or the key it
    /// delegated to).
    #[error("the handshake signature is invalid")]
    BadSignature,
    /// The message came with a delegation that is not the sender key's, not current
    /// or too long.
    #[error("the peer's key delegation is refused: {0}")]
    Delegation(DelegationError),
    /// The endorsement carried is longer than allowed.
    #[error("the peer's endorsement is too long")]
    Endorsement,
    /// The initiator offered nothing to carry that the responder takes.
    #[error("no stream protocol in common")]
    NoCommonCarries,
    /// The responder chose a stream protocol (or option) that was not offered, or
    /// several protocols.
    #[error("the responder chose a stream protocol that was not offered")]
    CarriesNotOffered,
    /// The signature a delegated signer (the node agent) returned for one of our own
    /// messages does not verify under our own public key: nothing is sent.
    #[error("the signature the signer returned for our own message is invalid")]
    BadOwnSignature,
    /// The initiator offered no suite the responder accepts.
    #[error("no cipher suite in common")]
    NoCommonSuite,
    /// The responder chose a suite the initiator did not offer.
    #[error("the responder chose a suite that was not offered")]
    SuiteNotOffered,
    /// The ephemeral share is invalid (e.g. a low-order point).
    #[error("the peer's key share is invalid")]
    BadKeyShare,
    /// Message 3 does not prove knowledge of the session keys.
    #[error("the key confirmation is invalid")]
    BadKeyConfirmation,
    /// The responder's rekey interval is larger than the initiator's own, or too
    /// small: it must be the smaller of both.
    #[error("the peer's rekey interval is invalid")]
    BadRekeyInterval,
    /// The random number generator failed.
    #[error("the random number generator failed")]
    Random,
    /// The configuration offers no suite.
    #[error("the handshake configuration offers no cipher suite")]
    NoSuitesConfigured,
    /// Message 1's timestamp is outside the responder's freshness window (an old
    /// capture, or a clock off by more than the window).
    #[error("the hello is stale: its timestamp is outside the freshness window")]
    Stale,
    /// Message 1 was seen already within the freshness window: refused before any
    /// public-key work.
    #[error("the hello was replayed")]
    Replayed,
}

impl From<Freshness> for HandshakeError {
    fn from(f: Freshness) -> Self {
        match f {
            Freshness::Stale => HandshakeError::Stale,
            Freshness::Replayed => HandshakeError::Replayed,
        }
    }
}

/// Signature digests, domain-separated per message.
/// Verified values: constructible only here, and only after the checks pass.
mod verified {
    use super::*;

    /// A peer's ephemeral X25519 share from a message whose signature verified under
    /// a public key that hashes to the expected id.
    pub struct Share {
        bytes: [u8; 32],
        pub peer_key: [u8; 32],
        pub peer_id: PeerId,
    }

    /// Checks message 1 for `me`, and returns the verified share and offered suites.
    /// Freshness and replay are checked first, with no public-key work; the Hello is
    /// remembered only once its signature verified.
    pub(super) fn hello(
        me: &PublicIdentity,
        signed: &wire::Signed<'_, Hello<'_>>,
        guard: &mut HelloGuard,
        now_ms: u64,
    ) -> Result<(Share, SuiteSet, u64, Carries, StreamOptions), HandshakeError> {
        let body = &signed.message.body;
        let digest = digests::hello(signed.body_bytes);
        let mut key: HelloKey = [0; 16];
        key.copy_from_slice(&digest[..16]);
        guard.check(body.timestamp_ms, &key, now_ms)?;
        if body.mesh != me.mesh().as_str() {
            return Err(HandshakeError::WrongMesh);
        }
        if body.responder_id != me.id().0 {
            return Err(HandshakeError::NotForMe);
        }
        let peer_id = PeerId::derive(&body.initiator_key, body.mesh);
        if peer_id.0 != body.initiator_id {
            return Err(HandshakeError::KeyIdMismatch);
        }
        if body.endorsement.len() > MAX_ENDORSEMENT_LEN {
            return Err(HandshakeError::Endorsement);
        }
        let peer = PublicIdentity::new(body.initiator_key, me.mesh().clone());
        let signing_key = delegation::signing_key(&peer, body.delegation.as_ref(), now_ms)
            .map_err(HandshakeError::Delegation)?;
        if !crate::identity::verify_signature(signing_key, &digest, &signed.message.signature.0) {
            return Err(HandshakeError::BadSignature);
        }
        guard.remember(body.timestamp_ms, key, now_ms);
        if body.records_per_key < MIN_RECORDS_PER_KEY {
            return Err(HandshakeError::BadRekeyInterval);
        }
        Ok((
            Share {
                bytes: body.ephemeral,
                peer_key: body.initiator_key,
                peer_id,
            },
            SuiteSet(body.suites),
            body.records_per_key,
            Carries(body.carries & CARRIES_MASK),
            StreamOptions::of(body.carries),
        ))
    }

    /// Checks message 2 against what the initiator sent and meant.
    pub(super) fn hello_reply(
        state: &AwaitingHelloReply,
        signed: &wire::Signed<'_, HelloReply>,
    ) -> Result<(Share, Suite, Carries, StreamOptions), HandshakeError> {
        let body = &signed.message.body;
        let suite = Suite::ALL
            .into_iter()
            .find(|s| s.bit() == body.suite && state.offered.contains(*s))
            .ok_or(HandshakeError::SuiteNotOffered)?;
        if body.initiator_id != state.local_id.0 {
            return Err(HandshakeError::NotForMe);
        }
        let carries = Carries(body.carries & CARRIES_MASK);
        let options = StreamOptions::of(body.carries);
        if !carries.is_single()
            || !state.config.carries.contains(carries)
            || !state.config.options.contains(options)
        {
            return Err(HandshakeError::CarriesNotOffered);
        }
        let peer_id = PeerId::derive(&body.responder_key, state.mesh.as_str());
        if peer_id != state.peer_id {
            return Err(HandshakeError::KeyIdMismatch);
        }
        if body.endorsement.len() > MAX_ENDORSEMENT_LEN {
            return Err(HandshakeError::Endorsement);
        }
        let peer = PublicIdentity::new(body.responder_key, state.mesh.clone());
        let key = delegation::signing_key(&peer, body.delegation.as_ref(), state.started_ms)
            .map_err(HandshakeError::Delegation)?;
        let digest = digests::hello_reply(&state.hello, signed.body_bytes);
        if !crate::identity::verify_signature(key, &digest, &signed.message.signature.0) {
            return Err(HandshakeError::BadSignature);
        }
        if !(MIN_RECORDS_PER_KEY..=state.config.offered_records_per_key())
            .contains(&body.records_per_key)
        {
            return Err(HandshakeError::BadRekeyInterval);
        }
        Ok((
            Share {
                bytes: body.ephemeral,
                peer_key: body.responder_key,
                peer_id,
            },
            suite,
            carries,
            options,
        ))
    }

    /// The X25519 secret with a verified share, fed straight into the key schedule.
    pub(super) fn agree(
        ephemeral: EphemeralPrivateKey,
        share: &Share,
        transcript_hash: &[u8; 32],
    ) -> Result<SessionKeys, HandshakeError> {
        agreement::agree_ephemeral(
            ephemeral,
            &UnparsedPublicKey::new(&agreement::X25519, &share.bytes),
            |secret| SessionKeys::derive(secret, transcript_hash),
        )
        .map_err(|_| HandshakeError::BadKeyShare)
    }
}

fn fresh_ephemeral(
    rng: &dyn SecureRandom,
) -> Result<(EphemeralPrivateKey, [u8; 32], [u8; 32]), HandshakeError> {
    let ephemeral = EphemeralPrivateKey::generate(&agreement::X25519, rng)
        .map_err(|_| HandshakeError::Random)?;
    let mut share = [0u8; 32];
    share.copy_from_slice(
        ephemeral
            .compute_public_key()
            .map_err(|_| HandshakeError::Random)?
            .as_ref(),
    );
    let mut nonce = [0u8; 32];
    rng.fill(&mut nonce).map_err(|_| HandshakeError::Random)?;
    Ok((ephemeral, share, nonce))
}

fn confirm_mac(confirm_key: &[u8; 32], transcript_hash: &[u8; 32]) -> hmac::Tag {
    hmac::sign(
        &hmac::Key::new(hmac::HMAC_SHA256, confirm_key),
        transcript_hash,
    )
}

/// The initiating side.
pub struct Initiator;

impl Initiator {
    /// Starts a handshake from `me` to the peer with id `peer` at `now_ms` (Unix
    /// milliseconds, signed into message 1: the responder refuses a Hello outside its
    /// freshness window). Draws 64 bytes from `rng`: the ephemeral X25519 key, then
    /// the nonce. Returns the state to keep and message 1 to send.
    pub fn start(
        me: &dyn HandshakeSigner,
        peer: PeerId,
        config: &HandshakeConfig,
        now_ms: u64,
        rng: &dyn SecureRandom,
    ) -> Result<(AwaitingHelloReply, Vec<u8>), HandshakeError> {
        let pending = Self::make(
            me.identity(),
            me.delegation().copied(),
            me.endorsement(),
            peer,
            config,
            now_ms,
            rng,
        )?;
        let signature = me.sign_digest(&pending.digest);
        Ok(pending.attach(&signature))
    }

    /// [`Initiator::start`] without the private key: message 1 is made but not signed.
    /// The returned [`PendingHello`] says what to sign ([`PendingHello::to_sign`], for a
    /// delegated signer such as the node agent, which runs [`sign_message`]); its
    /// [`PendingHello::finish`] takes the signature, checks it and yields what `start`
    /// does. Draws the same 64 bytes from `rng`, so with the same `rng` both paths
    /// send the same bytes.
    pub fn start_unsigned(
        me: &PublicIdentity,
        peer: PeerId,
        config: &HandshakeConfig,
        now_ms: u64,
        rng: &dyn SecureRandom,
    ) -> Result<PendingHello, HandshakeError> {
        Self::make(me, None, &[], peer, config, now_ms, rng)
    }

    fn make(
        me: &PublicIdentity,
        delegation: Option<delegation::Delegation>,
        endorsement: &[u8],
        peer: PeerId,
        config: &HandshakeConfig,
        now_ms: u64,
        rng: &dyn SecureRandom,
    ) -> Result<PendingHello, HandshakeError> {
        if config.suites.is_empty() {
            return Err(HandshakeError::NoSuitesConfigured);
        }
        let (ephemeral, share, nonce) = fresh_ephemeral(rng)?;
        let offered = SuiteSet::of(config.suites);
        let body = HelloBody {
            version: PROTOCOL_VERSION,
            kind: Kind::Hello as u8,
            suites: offered.0,
            records_per_key: config.offered_records_per_key(),
            mesh: me.mesh().as_str(),
            initiator_id: me.id().0,
            initiator_key: *me.public_key(),
            responder_id: peer.0,
            ephemeral: share,
            nonce,
            timestamp_ms: now_ms,
            carries: config.carries.0 | config.options.0,
            delegation,
            endorsement,
        };
        let body = wire::encode(&body);
        Ok(PendingHello {
            started_ms: now_ms,
            digest: digests::hello(&body),
            body,
            signer: me.clone(),
            ephemeral,
            offered,
            peer_id: peer,
            config: config.clone(),
        })
    }
}

/// What a delegated signer is asked to sign: a handshake message body (and, for
/// message 2, the hash of the message 1 it answers). The signer does not sign these
/// bytes as they are: [`signing_digest`] checks that the body is a Themis handshake
/// message of the signer's own identity and computes the domain-separated digest the
/// protocol signs, so the signer is never a general signing oracle.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ToSign {
    /// [`Kind::Hello`] or [`Kind::HelloReply`].
    pub kind: Kind,
    /// The encoded message body (everything but the signature).
    pub body: Vec<u8>,
    /// For [`Kind::HelloReply`]: SHA-256 of the whole message 1 it answers.
    pub hello_hash: Option<[u8; 32]>,
}

/// Why a delegated signer refused to sign.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SigningError {
    /// Only message 1 and message 2 are signed.
    #[error("only Hello and HelloReply messages are signed, not {0:?}")]
    Kind(Kind),
    /// The body does not decode as the body of the kind named (or is longer than a
    /// handshake message may be, or of another protocol version).
    #[error("the body is not a {kind:?} body: {error}")]
    Malformed {
        /// The kind asked for.
        kind: Kind,
        /// Why it did not decode.
        error: WireError,
    },
    /// The body names another key, id or mesh than the signer's own.
    #[error("the message is not the signer's own: it names another key, id or mesh")]
    NotMine,
    /// A HelloReply is signed together with the hash of the Hello it answers; a Hello
    /// with none.
    #[error("a HelloReply needs the hash of the Hello it answers, and a Hello takes none")]
    HelloHash,
    /// A Hello whose timestamp is outside the signer's freshness window: a signer
    /// signs no Hello for later (a compromised sidecar could stock them).
    #[error("the Hello's timestamp is outside the signer's freshness window")]
    Stale,
}

impl SigningError {
    /// A short label for metrics.
    pub fn reason(&self) -> &'static str {
        match self {
            SigningError::Kind(_) => "kind",
            SigningError::Malformed { .. } => "malformed",
            SigningError::NotMine => "not_mine",
            SigningError::HelloHash => "hello_hash",
            SigningError::Stale => "stale",
        }
    }
}

/// Decodes exactly one `T` body of `kind` (version, kind, size bound, no trailing bytes).
fn decode_body<'a, T: serde::Deserialize<'a>>(
    bytes: &'a [u8],
    kind: Kind,
) -> Result<T, SigningError> {
    let malformed = |error| SigningError::Malformed { kind, error };
    match wire::peek_kind(bytes).map_err(malformed)? {
        got if got == kind => {}
        got => {
            return Err(malformed(WireError::UnexpectedKind {
                expected: kind,
                got,
            }))
        }
    }
    let (body, rest) = postcard::take_from_bytes::<T>(bytes).map_err(|e| malformed(e.into()))?;
    if !rest.is_empty() {
        return Err(malformed(WireError::TrailingBytes(rest.len())));
    }
    Ok(body)
}

/// The digest `signer` must sign for `request`, after checking that the body is a
/// handshake message of `signer`'s own: a Hello in `signer`'s mesh from `signer`'s key
/// and id, or a HelloReply from `signer`'s key (with the hash of the Hello it
/// answers). This is what the node agent runs before it signs for a workload's
/// sidecar; the digests are the protocol's, domain-separated per message kind, so no
/// other statement (a registry record, a grant) can be obtained this way.
pub fn signing_digest(signer: &PublicIdentity, request: &ToSign) -> Result<[u8; 32], SigningError> {
    match (request.kind, &request.hello_hash) {
        (Kind::Hello, None) => {
            let body: HelloBody<'_> = decode_body(&request.body, Kind::Hello)?;
            if body.mesh != signer.mesh().as_str()
                || body.initiator_key != *signer.public_key()
                || body.initiator_id != signer.id().0
                || body.delegation.is_some()
            {
                return Err(SigningError::NotMine);
            }
            Ok(digests::hello(&request.body))
        }
        (Kind::HelloReply, Some(hello_hash)) => {
            let body: HelloReplyBody = decode_body(&request.body, Kind::HelloReply)?;
            if body.responder_key != *signer.public_key() || body.delegation.is_some() {
                return Err(SigningError::NotMine);
            }
            Ok(digests::hello_reply_hashed(hello_hash, &request.body))
        }
        (Kind::Hello | Kind::HelloReply, _) => Err(SigningError::HelloHash),
        (other, _) => Err(SigningError::Kind(other)),
    }
}

/// Signs `request` as `me` after [`signing_digest`]'s checks: the delegated signer's
/// whole job (the node agent signing for a workload's sidecar).
pub fn sign_message(me: &Identity, request: &ToSign) -> Result<[u8; 64], SigningError> {
    Ok(me.sign(&signing_digest(me.public(), request)?))
}

/// [`sign_message`] for a signer with a clock (the node agent): a Hello is signed only
/// if its timestamp is within `window_ms` of `now_ms`, so no Hello signed today is
/// good tomorrow — a compromised sidecar cannot stock signed Hellos that outlive it
/// (HelloReplies are bound to the fresh Hello they answer).
pub fn sign_message_at(
    me: &Identity,
    request: &ToSign,
    now_ms: u64,
    window_ms: u64,
) -> Result<[u8; 64], SigningError> {
    if request.kind == Kind::Hello {
        let body: HelloBody<'_> = decode_body(&request.body, Kind::Hello)?;
        if body.timestamp_ms.abs_diff(now_ms) > window_ms {
            return Err(SigningError::Stale);
        }
    }
    sign_message(me, request)
}

/// Message 1 made but not yet signed ([`Initiator::start_unsigned`]).
pub struct PendingHello {
    started_ms: u64,
    ephemeral: EphemeralPrivateKey,
    body: Vec<u8>,
    digest: [u8; 32],
    signer: PublicIdentity,
    offered: SuiteSet,
    peer_id: PeerId,
    config: HandshakeConfig,
}

impl PendingHello {
    /// What the signer must sign.
    pub fn to_sign(&self) -> ToSign {
        ToSign {
            kind: Kind::Hello,
            body: self.body.clone(),
            hello_hash: None,
        }
    }

    /// The id this handshake is meant to reach.
    pub fn peer_id(&self) -> PeerId {
        self.peer_id
    }

    /// Takes the signature over [`PendingHello::to_sign`], checks it under our own
    /// public key (a confused or lying signer cannot make us send a message that
    /// fails at the peer), and returns the state to keep and message 1 to send.
    pub fn finish(
        self,
        signature: &[u8; 64],
    ) -> Result<(AwaitingHelloReply, Vec<u8>), HandshakeError> {
        if !self.signer.verifies(&self.digest, signature) {
            return Err(HandshakeError::BadOwnSignature);
        }
        Ok(self.attach(signature))
    }

    /// Message 1 with `signature` (checked by the caller, or made with our own key).
    fn attach(self, signature: &[u8; 64]) -> (AwaitingHelloReply, Vec<u8>) {
        let mut hello = self.body;
        hello.extend_from_slice(&wire::encode(&Signature(*signature)));
        let state = AwaitingHelloReply {
            started_ms: self.started_ms,
            ephemeral: self.ephemeral,
            hello: hello.clone(),
            offered: self.offered,
            local_id: self.signer.id(),
            mesh: self.signer.mesh().clone(),
            peer_id: self.peer_id,
            config: self.config,
        };
        (state, hello)
    }
}

/// The initiator after sending message 1.
pub struct AwaitingHelloReply {
    /// When message 1 was made: the responder's delegation is checked at this time.
    started_ms: u64,
    ephemeral: EphemeralPrivateKey,
    hello: Vec<u8>,
    offered: SuiteSet,
    local_id: PeerId,
    mesh: MeshName,
    peer_id: PeerId,
    config: HandshakeConfig,
}

impl AwaitingHelloReply {
    /// The id this handshake is meant to reach.
    pub fn peer_id(&self) -> PeerId {
        self.peer_id
    }

    /// Reads message 2. On success the session is ready to use and message 3 must be
    /// sent before any record (it is what lets the responder use the session).
    pub fn read_hello_reply(self, bytes: &[u8]) -> Result<(Session, Vec<u8>), HandshakeError> {
        let signed = HelloReply::decode(bytes)?;
        let (share, suite, carries, options) = verified::hello_reply(&self, &signed)?;
        let transcript_hash = digests::transcript(&self.hello, bytes);
        let keys = verified::agree(self.ephemeral, &share, &transcript_hash)?;
        let confirm = Confirm {
            version: PROTOCOL_VERSION,
            kind: Kind::Confirm as u8,
            session_id: keys.session_id,
            mac: confirm_mac(&keys.confirm_key, &transcript_hash)
                .as_ref()
                .try_into()
                .expect("HMAC-SHA256 tags are 32 bytes"),
        };
        let info = SessionInfo {
            session_id: keys.session_id,
            suite,
            role: Role::Initiator,
            local_id: self.local_id,
            peer_id: share.peer_id,
            peer_public_key: share.peer_key,
            mesh: self.mesh,
            carries,
            options,
            peer_endorsement: signed.message.body.endorsement.clone(),
        };
        let agreed = HandshakeConfig {
            records_per_key: signed.message.body.records_per_key,
            carries,
            options,
            ..self.config
        };
        let session = Session::new(info, &keys, &agreed);
        Ok((session, wire::encode(&confirm)))
    }
}

/// Answers message 1 as `me` at `now_ms` (Unix milliseconds). Draws 64 bytes from
/// `rng` (ephemeral key, then nonce). Returns the state to keep and message 2 to send.
///
/// `guard` refuses, before any public-key work, a Hello outside its freshness window
/// ([`HandshakeError::Stale`]) or seen already within it ([`HandshakeError::Replayed`]),
/// and learns each Hello whose signature verifies. A replay the guard does not
/// remember (another guard's, or one forgotten when full) gets a fresh reply, but its
/// sender cannot complete message 3 without the initiator's ephemeral secret, so it
/// never yields a confirmed session.
pub fn respond(
    me: &dyn HandshakeSigner,
    hello_bytes: &[u8],
    config: &HandshakeConfig,
    guard: &mut HelloGuard,
    now_ms: u64,
    rng: &dyn SecureRandom,
) -> Result<(AwaitingConfirm, Vec<u8>), HandshakeError> {
    let pending = reply(
        me.identity(),
        me.delegation().copied(),
        me.endorsement(),
        hello_bytes,
        config,
        guard,
        now_ms,
        rng,
    )?;
    let signature = me.sign_digest(&pending.digest);
    pending.attach(&signature)
}

/// [`respond`] without the private key: message 1 is checked and message 2 made but
/// not signed. The returned [`PendingReply`] says what to sign
/// ([`PendingReply::to_sign`]); [`PendingReply::finish`] takes the signature, checks
/// it and yields what `respond` does. Same draws from `rng` as `respond`.
pub fn respond_unsigned(
    me: &PublicIdentity,
    hello_bytes: &[u8],
    config: &HandshakeConfig,
    guard: &mut HelloGuard,
    now_ms: u64,
    rng: &dyn SecureRandom,
) -> Result<PendingReply, HandshakeError> {
    reply(me, None, &[], hello_bytes, config, guard, now_ms, rng)
}

#[allow(clippy::too_many_arguments)] // the two public entry points name them
fn reply(
    me: &PublicIdentity,
    delegation: Option<delegation::Delegation>,
    endorsement: &[u8],
    hello_bytes: &[u8],
    config: &HandshakeConfig,
    guard: &mut HelloGuard,
    now_ms: u64,
    rng: &dyn SecureRandom,
) -> Result<PendingReply, HandshakeError> {
    let signed = Hello::decode(hello_bytes)?;
    let (share, offered, initiator_records_per_key, offered_carries, offered_options) =
        verified::hello(me, &signed, guard, now_ms)?;
    let suite = offered
        .pick(config.suites)
        .ok_or(HandshakeError::NoCommonSuite)?;
    let carries =
        Carries::pick(offered_carries, config.carries).ok_or(HandshakeError::NoCommonCarries)?;
    let agreed = HandshakeConfig {
        records_per_key: initiator_records_per_key.min(config.offered_records_per_key()),
        carries,
        options: offered_options.and(config.options),
        ..config.clone()
    };
    let peer_endorsement = signed.message.body.endorsement.to_vec();
    let (ephemeral, my_share, nonce) = fresh_ephemeral(rng)?;
    let body = HelloReplyBody {
        version: PROTOCOL_VERSION,
        kind: Kind::HelloReply as u8,
        suite: suite.bit(),
        records_per_key: agreed.records_per_key,
        initiator_id: share.peer_id.0,
        responder_key: *me.public_key(),
        ephemeral: my_share,
        nonce,
        carries: carries.0 | agreed.options.0,
        delegation,
        endorsement: endorsement.to_vec(),
    };
    let body = wire::encode(&body);
    let hello_hash = digests::hello_hash(hello_bytes);
    Ok(PendingReply {
        digest: digests::hello_reply_hashed(&hello_hash, &body),
        hello_hash,
        hello: hello_bytes.to_vec(),
        body,
        signer: me.clone(),
        ephemeral,
        share,
        suite,
        config: agreed,
        peer_endorsement,
    })
}

/// Message 1 verified and message 2 made, not yet signed ([`respond_unsigned`]). No
/// key is derived before the signature is back (the transcript covers it).
pub struct PendingReply {
    ephemeral: EphemeralPrivateKey,
    share: verified::Share,
    suite: Suite,
    config: HandshakeConfig,
    hello: Vec<u8>,
    hello_hash: [u8; 32],
    body: Vec<u8>,
    digest: [u8; 32],
    signer: PublicIdentity,
    peer_endorsement: Vec<u8>,
}

impl PendingReply {
    /// What the signer must sign.
    pub fn to_sign(&self) -> ToSign {
        ToSign {
            kind: Kind::HelloReply,
            body: self.body.clone(),
            hello_hash: Some(self.hello_hash),
        }
    }

    /// The initiator whose message 1 verified (not yet confirmed: message 1 may be a
    /// replay).
    pub fn peer_id(&self) -> PeerId {
        self.share.peer_id
    }

    /// Takes the signature over [`PendingReply::to_sign`], checks it under our own
    /// public key, and returns the state to keep and message 2 to send.
    pub fn finish(
        self,
        signature: &[u8; 64],
    ) -> Result<(AwaitingConfirm, Vec<u8>), HandshakeError> {
        if !self.signer.verifies(&self.digest, signature) {
            return Err(HandshakeError::BadOwnSignature);
        }
        self.attach(signature)
    }

    /// Message 2 with `signature` (checked by the caller, or made with our own key),
    /// and the keys.
    fn attach(self, signature: &[u8; 64]) -> Result<(AwaitingConfirm, Vec<u8>), HandshakeError> {
        let mut reply = self.body;
        reply.extend_from_slice(&wire::encode(&Signature(*signature)));
        let transcript_hash = digests::transcript(&self.hello, &reply);
        let keys = verified::agree(self.ephemeral, &self.share, &transcript_hash)?;
        let info = SessionInfo {
            session_id: keys.session_id,
            suite: self.suite,
            role: Role::Responder,
            local_id: self.signer.id(),
            peer_id: self.share.peer_id,
            peer_public_key: self.share.peer_key,
            mesh: self.signer.mesh().clone(),
            carries: self.config.carries,
            options: self.config.options,
            peer_endorsement: self.peer_endorsement,
        };
        Ok((
            AwaitingConfirm {
                info,
                keys,
                config: self.config,
                transcript_hash,
            },
            reply,
        ))
    }
}

/// The responder after sending message 2: keys exist but are unusable until the
/// initiator proves it holds them.
pub struct AwaitingConfirm {
    pub(crate) info: SessionInfo,
    pub(crate) keys: SessionKeys,
    pub(crate) config: HandshakeConfig,
    pub(crate) transcript_hash: [u8; 32],
}

impl AwaitingConfirm {
    /// The session id message 3 will carry (for demultiplexing datagrams).
    pub fn session_id(&self) -> u64 {
        self.info.session_id
    }

    /// The authenticated initiator (its signature verified already; the session is
    /// still unconfirmed).
    pub fn peer_id(&self) -> PeerId {
        self.info.peer_id
    }

    /// Reads message 3 and, if it confirms the keys, hands over the session.
    pub fn read_confirm(self, bytes: &[u8]) -> Result<Session, HandshakeError> {
        check_confirm(
            bytes,
            self.info.session_id,
            &self.keys.confirm_key,
            &self.transcript_hash,
        )?;
        Ok(Session::new(self.info, &self.keys, &self.config))
    }
}

/// Checks message 3: the session id, and in constant time the MAC that proves the
/// initiator derived the same keys.
pub(crate) fn check_confirm(
    bytes: &[u8],
    session_id: u64,
    confirm_key: &[u8; 32],
    transcript_hash: &[u8; 32],
) -> Result<(), HandshakeError> {
    let confirm = Confirm::decode(bytes)?;
    let key = hmac::Key::new(hmac::HMAC_SHA256, confirm_key);
    if confirm.session_id != session_id
        || hmac::verify(&key, transcript_hash, &confirm.mac).is_err()
    {
        return Err(HandshakeError::BadKeyConfirmation);
    }
    Ok(())
}
