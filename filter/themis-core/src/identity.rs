//! Self-certifying identities.
//!
//! A workload's identity is an Ed25519 key pair; its id is
//! `SHA-256(public_key || mesh_name)`. Anyone holding the public key can check the
//! id without asking a certificate authority, and the mesh name keeps the ids of two
//! meshes apart even when they share a key.

use alloc::format;
use alloc::string::{String, ToString};
use alloc::vec::Vec;
use core::fmt;

use bech32::{primitives::decode::CheckedHrpstring, Bech32m, Hrp};
use ed25519::pkcs8::{DecodePrivateKey, EncodePrivateKey, KeypairBytes};
use ring::digest;
use ring::rand::SecureRandom;
use ring::signature::{self, Ed25519KeyPair, KeyPair};
use serde::{Deserialize, Serialize};
use zeroize::Zeroizing;

/// Length of a public key, an id and a signature share, in bytes.
pub const PUBLIC_KEY_LEN: usize = 32;
/// The longest mesh name: it is the human-readable part of a printable id, which a
/// Bech32m string bounds to 90 characters in all (59 of them are the id and checksum).
pub const MAX_MESH_NAME_LEN: usize = 31;

/// The name of a mesh (the paper's *net id*): 1 to 31 characters of `a-z`, `0-9`, `-`
/// and `.`, starting with a letter or digit.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct MeshName(String);

/// Why a mesh name was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MeshNameError {
    /// Empty name.
    #[error("the mesh name is empty")]
    Empty,
    /// Longer than [`MAX_MESH_NAME_LEN`].
    #[error("the mesh name is {0} bytes long; at most {MAX_MESH_NAME_LEN} are allowed")]
    TooLong(usize),
    /// A character outside `a-z 0-9 - .`.
    #[error("the mesh name may hold only a-z, 0-9, '-' and '.', not {0:?}")]
    BadCharacter(char),
    /// Starts with `-` or `.`.
    #[error("the mesh name must start with a letter or a digit")]
    BadStart,
}

impl MeshName {
    /// Checks and wraps a mesh name.
    pub fn new(name: &str) -> Result<Self, MeshNameError> {
        Self::check(name)?;
        Ok(MeshName(name.to_string()))
    }

    /// Checks a mesh name without keeping it.
    pub fn check(name: &str) -> Result<(), MeshNameError> {
        let first = name.chars().next().ok_or(MeshNameError::Empty)?;
        if name.len() > MAX_MESH_NAME_LEN {
            return Err(MeshNameError::TooLong(name.len()));
        }
        if let Some(bad) = name
            .chars()
            .find(|c| !(c.is_ascii_lowercase() || c.is_ascii_digit() || *c == '-' || *c == '.'))
        {
            return Err(MeshNameError::BadCharacter(bad));
        }
        if first == '-' || first == '.' {
            return Err(MeshNameError::BadStart);
        }
        Ok(())
    }

    /// The name as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for MeshName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for MeshName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "MeshName({:?})", self.0)
    }
}

impl core::str::FromStr for MeshName {
    type Err = MeshNameError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        MeshName::new(s)
    }
}

/// A self-certifying id: `SHA-256(public_key || mesh_name)`, a point on the 256-bit
/// ring of the DHT. Its `Display` is lowercase hex; [`PeerId::printable`] gives the
/// form people copy around, with the mesh name and a checksum.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct PeerId(pub [u8; 32]);

/// Why a printable id did not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PeerIdError {
    /// Not a Bech32m string, or its checksum does not match (a typo).
    #[error("not a valid Themis id (a typo? the checksum does not match): {0}")]
    Encoding(String),
    /// The mesh name part is not a valid mesh name.
    #[error("the id's mesh name is invalid: {0}")]
    MeshName(#[from] MeshNameError),
    /// The id belongs to another mesh than the one expected.
    #[error("the id belongs to mesh {found:?}, not {expected:?}")]
    WrongMesh {
        /// The mesh the caller expected.
        expected: String,
        /// The mesh named in the id.
        found: String,
    },
    /// The id is not spelled the one way [`PeerId::printable`] spells it: upper case,
    /// or non-zero padding bits (16 aliases of each id). Only the canonical spelling is
    /// accepted, so ids compare equal as text (in allow lists, logs).
    #[error("the id is not in canonical form (it must be lower case, as printed)")]
    NonCanonical,
    /// The data part does not hold exactly 32 bytes.
    #[error("the id holds {0} bytes, not 32")]
    WrongLength(usize),
}

/// What every SNI name ends in: a reserved name (RFC 2606), never resolved.
pub const SNI_SUFFIX: &str = ".themis.invalid";

/// The name a caller puts in its SNI for the peer it must reach, and the DNS SAN of
/// that peer's certificate: `<the printable id past its mesh>.<mesh>.themis.invalid`
/// (a DNS label holds the 58 characters of the id and its checksum; a printable id
/// with its mesh would not fit one). An upstream pool is kept per SNI, so a pool
/// never carries a call to another id.
pub fn sni_name(id: &PeerId, mesh: &MeshName) -> String {
    let printable = id.printable(mesh);
    let tail = &printable[mesh.as_str().len() + 1..];
    format!("{tail}.{mesh}{SNI_SUFFIX}")
}

/// The id an SNI name names, checksum checked; `None` for any other name.
pub fn id_of_sni_name(name: &str) -> Option<(MeshName, PeerId)> {
    let rest = name.strip_suffix(SNI_SUFFIX)?;
    let (tail, mesh) = rest.split_once('.')?;
    let (parsed_mesh, id) = PeerId::parse(&format!("{mesh}1{tail}")).ok()?;
    (parsed_mesh.as_str() == mesh).then_some((parsed_mesh, id))
}

impl PeerId {
    /// The id of `public_key` in `mesh`.
    pub fn derive(public_key: &[u8; PUBLIC_KEY_LEN], mesh: &str) -> PeerId {
        let mut ctx = digest::Context::new(&digest::SHA256);
        ctx.update(public_key);
        ctx.update(mesh.as_bytes());
        let mut id = [0u8; 32];
        id.copy_from_slice(ctx.finish().as_ref());
        PeerId(id)
    }

    /// The printable form: Bech32m with the mesh name as its human-readable part,
    /// e.g. `demo1…`. The checksum covers the mesh name and the id.
    pub fn printable(&self, mesh: &MeshName) -> String {
        // A checked mesh name is always a valid Bech32 human-readable part, and the
        // length bound on mesh names keeps the whole string within Bech32m's 90.
        let hrp = Hrp::parse(mesh.as_str()).expect("a checked mesh name is a valid hrp");
        bech32::encode::<Bech32m>(hrp, &self.0).expect("length bounded by MAX_MESH_NAME_LEN")
    }

    /// Parses a printable id into its mesh name and id.
    pub fn parse(printable: &str) -> Result<(MeshName, PeerId), PeerIdError> {
        if printable.bytes().any(|b| b.is_ascii_uppercase()) {
            return Err(PeerIdError::NonCanonical);
        }
        let checked = CheckedHrpstring::new::<Bech32m>(printable)
            .map_err(|e| PeerIdError::Encoding(e.to_string()))?;
        let mesh = MeshName::new(&checked.hrp().to_lowercase())?;
        // 52 characters carry 260 bits for 256: the last 4 must be zero. (The check
        // is named for segwit but is the generic padding rule.)
        checked
            .validate_segwit_padding()
            .map_err(|_| PeerIdError::NonCanonical)?;
        let bytes: Vec<u8> = checked.byte_iter().collect();
        let id: [u8; 32] = bytes
            .as_slice()
            .try_into()
            .map_err(|_| PeerIdError::WrongLength(bytes.len()))?;
        Ok((mesh, PeerId(id)))
    }

    /// Parses a printable id that must belong to `expected`.
    pub fn parse_in(printable: &str, expected: &MeshName) -> Result<PeerId, PeerIdError> {
        let (mesh, id) = Self::parse(printable)?;
        if &mesh != expected {
            return Err(PeerIdError::WrongMesh {
                expected: expected.to_string(),
                found: mesh.to_string(),
            });
        }
        Ok(id)
    }

    /// The raw 32 bytes.
    pub fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }
}

impl fmt::Display for PeerId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.iter().try_for_each(|b| write!(f, "{b:02x}"))
    }
}

impl fmt::Debug for PeerId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Eight bytes tell ids apart in logs; the full value is one `{}` away.
        write!(f, "PeerId(")?;
        self.0[..8].iter().try_for_each(|b| write!(f, "{b:02x}"))?;
        write!(f, "…)")
    }
}

/// Why a private key file was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KeyFileError {
    /// Not a PEM `PRIVATE KEY` holding an Ed25519 PKCS#8 document.
    #[error("the key file is not an Ed25519 private key in PKCS#8 PEM form: {0}")]
    Format(String),
    /// The document carries a public key that does not belong to its private key.
    #[error("the key file's public key does not match its private key")]
    KeyMismatch,
    /// The random number generator failed.
    #[error("the random number generator failed")]
    Random,
}

/// The public half of an identity: its public key, mesh and id, without the private
/// key. A sidecar whose agent keeps the private key runs the handshake with this and
/// asks the agent for each signature (`handshake::Initiator::start_unsigned`).
#[derive(Clone, PartialEq, Eq)]
pub struct PublicIdentity {
    public_key: [u8; PUBLIC_KEY_LEN],
    mesh: MeshName,
    id: PeerId,
}

impl PublicIdentity {
    /// The public identity of `public_key` in `mesh` (its id is derived, so it always
    /// matches the key).
    pub fn new(public_key: [u8; PUBLIC_KEY_LEN], mesh: MeshName) -> Self {
        let id = PeerId::derive(&public_key, mesh.as_str());
        PublicIdentity {
            public_key,
            mesh,
            id,
        }
    }

    /// This identity's id.
    pub fn id(&self) -> PeerId {
        self.id
    }

    /// This identity's mesh.
    pub fn mesh(&self) -> &MeshName {
        &self.mesh
    }

    /// The Ed25519 public key.
    pub fn public_key(&self) -> &[u8; PUBLIC_KEY_LEN] {
        &self.public_key
    }

    /// The printable id, e.g. `demo1…`.
    pub fn printable_id(&self) -> String {
        self.id.printable(&self.mesh)
    }

    /// True if `sig` is this identity's signature over the 32-byte handshake digest.
    pub(crate) fn verifies(&self, digest: &[u8; 32], sig: &[u8; 64]) -> bool {
        verify_signature(&self.public_key, digest, sig)
    }
}

impl fmt::Debug for PublicIdentity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PublicIdentity")
            .field("mesh", &self.mesh)
            .field("id", &self.id)
            .finish()
    }
}

/// A workload's or node's identity: its key pair, its mesh and the id they give.
pub struct Identity {
    key_pair: Ed25519KeyPair,
    seed: Zeroizing<[u8; 32]>,
    public: PublicIdentity,
}

impl Identity {
    /// Creates a new identity in `mesh` from 32 bytes of `rng` (the Ed25519 seed).
    pub fn generate(mesh: MeshName, rng: &dyn SecureRandom) -> Result<Self, KeyFileError> {
        let mut seed = Zeroizing::new([0u8; 32]);
        rng.fill(seed.as_mut()).map_err(|_| KeyFileError::Random)?;
        Ok(Self::from_seed(mesh, seed))
    }

    fn from_seed(mesh: MeshName, seed: Zeroizing<[u8; 32]>) -> Self {
        let key_pair =
            Ed25519KeyPair::from_seed_unchecked(seed.as_ref()).expect("any 32 bytes are a seed");
        let mut public_key = [0u8; PUBLIC_KEY_LEN];
        public_key.copy_from_slice(key_pair.public_key().as_ref());
        Identity {
            key_pair,
            seed,
            public: PublicIdentity::new(public_key, mesh),
        }
    }

    /// Loads an identity from the text of a key file: PEM `PRIVATE KEY`, PKCS#8 v1
    /// or v2 (RFC 8410), as written by [`Identity::to_key_file`] or by
    /// `openssl genpkey -algorithm ed25519`.
    pub fn from_key_file(mesh: MeshName, pem: &str) -> Result<Self, KeyFileError> {
        let pair = KeypairBytes::from_pkcs8_pem(pem.trim())
            .map_err(|e| KeyFileError::Format(e.to_string()))?;
        let identity = Self::from_seed(mesh, Zeroizing::new(pair.secret_key));
        match pair.public_key {
            Some(public) if public.to_bytes() != identity.public.public_key => {
                Err(KeyFileError::KeyMismatch)
            }
            _ => Ok(identity),
        }
    }

    /// The key file text for this identity (PEM `PRIVATE KEY`, PKCS#8 v1, readable by
    /// `openssl pkey`). Secret: write it with mode 0600.
    pub fn to_key_file(&self) -> Zeroizing<String> {
        let pair = KeypairBytes {
            secret_key: *self.seed,
            public_key: None,
        };
        let pem = pair
            .to_pkcs8_pem(ed25519::pkcs8::spki::der::pem::LineEnding::LF)
            .expect("encoding a 32-byte seed cannot fail");
        Zeroizing::new(pem.as_str().to_string())
    }

    /// This identity's id.
    pub fn id(&self) -> PeerId {
        self.public.id
    }

    /// This identity's mesh.
    pub fn mesh(&self) -> &MeshName {
        &self.public.mesh
    }

    /// The Ed25519 public key.
    pub fn public_key(&self) -> &[u8; PUBLIC_KEY_LEN] {
        &self.public.public_key
    }

    /// The printable id, e.g. `demo1…`.
    pub fn printable_id(&self) -> String {
        self.public.printable_id()
    }

    /// The public half: what a sidecar needs to run a handshake whose signatures
    /// someone else (its agent) makes.
    pub fn public(&self) -> &PublicIdentity {
        &self.public
    }

    /// Signs a 32-byte handshake digest. Only the handshake calls this, and a delegated
    /// signer (the agent) reaches it only through [`crate::handshake::sign_message`],
    /// which computes the digest itself from a checked message body.
    pub(crate) fn sign(&self, digest: &[u8; 32]) -> [u8; 64] {
        let mut sig = [0u8; 64];
        sig.copy_from_slice(self.key_pair.sign(digest).as_ref());
        sig
    }

    /// Signs `message` as a statement of kind `label` (e.g. a service registry record).
    /// Statements are domain-separated from handshake signatures and from each other
    /// (see [`verify_statement`]).
    pub fn sign_statement(&self, label: &str, message: &[u8]) -> [u8; 64] {
        let mut sig = [0u8; 64];
        sig.copy_from_slice(self.key_pair.sign(&statement(label, message)).as_ref());
        sig
    }
}

/// Prefix of every signed statement. It is longer than 32 bytes, so a statement can
/// never be mistaken for the 32-byte transcript digest a handshake signs.
const STATEMENT_PREFIX: &[u8] = b"themis/1 signed statement, never a handshake digest\0";

/// The bytes a statement signature covers: prefix, label length, label, message.
fn statement(label: &str, message: &[u8]) -> alloc::vec::Vec<u8> {
    let label_len = u16::try_from(label.len()).unwrap_or(u16::MAX);
    let mut bytes =
        alloc::vec::Vec::with_capacity(STATEMENT_PREFIX.len() + 2 + label.len() + message.len());
    bytes.extend_from_slice(STATEMENT_PREFIX);
    bytes.extend_from_slice(&label_len.to_be_bytes());
    bytes.extend_from_slice(&label.as_bytes()[..usize::from(label_len)]);
    bytes.extend_from_slice(message);
    bytes
}

/// Checks a signature made by [`Identity::sign_statement`] with the same `label`.
pub fn verify_statement(
    public_key: &[u8; PUBLIC_KEY_LEN],
    label: &str,
    message: &[u8],
    sig: &[u8; 64],
) -> bool {
    signature::UnparsedPublicKey::new(&signature::ED25519, public_key)
        .verify(&statement(label, message), sig)
        .is_ok()
}

impl fmt::Debug for Identity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Never print the private key.
        f.debug_struct("Identity")
            .field("mesh", &self.public.mesh)
            .field("id", &self.public.id)
            .finish()
    }
}

/// Checks an Ed25519 signature over a 32-byte transcript digest.
pub(crate) fn verify_signature(
    public_key: &[u8; PUBLIC_KEY_LEN],
    digest: &[u8; 32],
    sig: &[u8; 64],
) -> bool {
    signature::UnparsedPublicKey::new(&signature::ED25519, public_key)
        .verify(digest, sig)
        .is_ok()
}
