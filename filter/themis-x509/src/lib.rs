//! The TLS binding's certificate (docs/PROTOCOL.md §8): a Themis identity on Envoy's
//! own TLS 1.3, checked by a validator of ours where mTLS checks a CA. Sans-IO: DER in,
//! a verified peer or a typed refusal out; the clock is passed in.
//!
//! A sidecar's TLS key is a short-lived ECDSA P-256 key (the curve Envoy's QUIC path
//! and Istio's TLS contexts take). Its certificate is self-signed and carries one
//! critical extension, the [`Proof`]: the workload's public key, the workload key's
//! delegation of this certificate's key (named by the SHA-256 of its
//! SubjectPublicKeyInfo, under its own label: [`Purpose::TlsKey`]) and the workload's
//! endorsement. The id is `H(workload key ‖ mesh)`, as everywhere; the workload key
//! never leaves the agent. It has two names: a DNS SAN, the id's SNI name
//! ([`sni_name`]), and a URI SAN, the principal Envoy's RBAC, access logs and ext_authz
//! read ([`principal`]).
//!
//! Whoever holds the TLS key can sign new certificates with it, so nothing in one
//! counts unless the proof binds it or the verifier derives it: the validity is the
//! delegation's, not X.509's; the DNS SAN must be the proven id's; the URI SAN is the
//! caller's to compare with what the endorsement proves (the endorsement is checked
//! against the mesh root by the sidecar, with the same code as the paper's channel).
//! The self-signature shows only that the certificate is well formed; TLS's
//! CertificateVerify shows that the peer holds the key.

use ring::rand::SecureRandom;
use ring::signature::{self, EcdsaKeyPair, KeyPair};
use serde::{Deserialize, Serialize};
use themis_core::delegation::{Delegation, DelegationError, Purpose};
use themis_core::identity::PublicIdentity;
use themis_core::wire::MAX_ENDORSEMENT_LEN;
use themis_core::{MeshName, PeerId};
use x509_parser::extensions::GeneralName;
use x509_parser::x509::X509Version;
use yasna::models::{ObjectIdentifier, UTCTime};
use zeroize::Zeroizing;

/// The proof extension's OID, under the UUID arc `2.25` (ITU-T X.667): an
/// identifier that needs no registry, and is no one else's.
pub const PROOF_OID: &str = "2.25.217472442979079385825947248529875567634.1";
/// [`PROOF_OID`]'s DER content octets.
const PROOF_OID_CONTENT: [u8; 21] = [
    0x69, 0x82, 0xc7, 0x9b, 0xd5, 0xd0, 0xf5, 0xa6, 0xb2, 0x93, 0xc1, 0xaf, 0xa4, 0xa2, 0x98, 0x99,
    0x81, 0x8a, 0x88, 0x12, 0x01,
];
/// The proof format this crate writes and reads.
pub const PROOF_VERSION: u8 = 1;
/// The longest proof accepted: an endorsement and room for the rest.
pub const MAX_PROOF_LEN: usize = MAX_ENDORSEMENT_LEN + 512;
/// The longest certificate accepted, before any parsing.
pub const MAX_CERTIFICATE_LEN: usize = MAX_PROOF_LEN + 2048;
// The SNI names live in the core: the outbound pick names a TLS peer by one, and the
// Wasm build of the sidecar has no X.509.
pub use themis_core::identity::{id_of_sni_name, sni_name, SNI_SUFFIX};

/// id-ecPublicKey (RFC 5480), and its DER content octets.
const EC_PUBLIC_KEY: &[u64] = &[1, 2, 840, 10045, 2, 1];
const EC_PUBLIC_KEY_CONTENT: &[u8] = &[0x2a, 0x86, 0x48, 0xce, 0x3d, 0x02, 0x01];
/// secp256r1 (RFC 5480).
const P256: &[u64] = &[1, 2, 840, 10045, 3, 1, 7];
const P256_CONTENT: &[u8] = &[0x2a, 0x86, 0x48, 0xce, 0x3d, 0x03, 0x01, 0x07];
/// ecdsa-with-SHA256 (RFC 5758).
const ECDSA_SHA256: &[u64] = &[1, 2, 840, 10045, 4, 3, 2];
const ECDSA_SHA256_CONTENT: &[u8] = &[0x2a, 0x86, 0x48, 0xce, 0x3d, 0x04, 0x03, 0x02];
/// id-ce-subjectAltName (RFC 5280), 2.5.29.17.
const SUBJECT_ALT_NAME_CONTENT: &[u8] = &[0x55, 0x1d, 0x11];
/// id-at-commonName.
const COMMON_NAME: &[u64] = &[2, 5, 4, 3];

/// What the certificate's critical extension holds (postcard, in an OCTET STRING).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Proof {
    /// [`PROOF_VERSION`].
    pub version: u8,
    /// The mesh the id is of.
    pub mesh: String,
    /// The workload's Ed25519 public key: the id is its hash with the mesh.
    pub workload_key: [u8; 32],
    /// The workload key's delegation ([`Purpose::TlsKey`]) of the certificate's key:
    /// its `delegated_key` is the SHA-256 of the certificate's SubjectPublicKeyInfo.
    pub delegation: Delegation,
    /// The workload's endorsement (its node-signed record with the grant chain, as
    /// the paper's channel carries it in message 1); empty for a workload of no service.
    pub endorsement: Vec<u8>,
}

impl Proof {
    /// The encoded form.
    pub fn encode(&self) -> Vec<u8> {
        postcard::to_allocvec(self).expect("encoding into a Vec cannot fail")
    }

    /// Decodes exactly one proof of at most [`MAX_PROOF_LEN`] bytes (total: any bytes
    /// in, a value or `None` out).
    pub fn decode(bytes: &[u8]) -> Option<Proof> {
        if bytes.len() > MAX_PROOF_LEN {
            return None;
        }
        match postcard::take_from_bytes::<Proof>(bytes) {
            Ok((proof, [])) => Some(proof),
            _ => None,
        }
    }
}

/// The URI SAN a certificate must carry (SPIFFE's form, which Envoy's RBAC principals
/// and Istio's AuthorizationPolicy match): `spiffe://<mesh>/svc/<service>` for a
/// workload endorsed for `service`, `spiffe://<mesh>/id/<printable id>` for one of no
/// service. (On Kubernetes, once records name their subject, §7.1:
/// `spiffe://<trust domain>/ns/<namespace>/sa/<service account>`.)
pub fn principal(mesh: &MeshName, id: &PeerId, service: Option<&str>) -> String {
    match service {
        Some(service) => format!("spiffe://{mesh}/svc/{service}"),
        None => format!("spiffe://{mesh}/id/{}", id.printable(mesh)),
    }
}

/// A certificate's ECDSA P-256 key: generated where the certificate is made, handed
/// to Envoy (SDS) as PKCS#8.
pub struct TlsKey {
    pair: EcdsaKeyPair,
    pkcs8: Zeroizing<Vec<u8>>,
    spki: Vec<u8>,
}

/// Why a certificate could not be made.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IssueError {
    /// The random number generator failed, or the key did not load.
    #[error("no ECDSA P-256 key: {0}")]
    Key(&'static str),
    /// The delegation's times do not fit an X.509 UTCTime (before 1970 or from 2050).
    #[error("the delegation's lifetime does not fit a certificate's validity")]
    Time,
    /// The proof is longer than [`MAX_PROOF_LEN`].
    #[error("the proof is {0} bytes; at most {MAX_PROOF_LEN}")]
    ProofTooLong(usize),
}

impl TlsKey {
    /// A fresh key from `rng`.
    pub fn generate(rng: &dyn SecureRandom) -> Result<TlsKey, IssueError> {
        let alg = &signature::ECDSA_P256_SHA256_ASN1_SIGNING;
        let pkcs8 = EcdsaKeyPair::generate_pkcs8(alg, rng)
            .map_err(|_| IssueError::Key("the random number generator failed"))?;
        TlsKey::from_pkcs8(pkcs8.as_ref(), rng)
    }

    /// The key of a PKCS#8 document (ring's `generate_pkcs8`, as [`TlsKey::pkcs8_der`]
    /// returns it).
    pub fn from_pkcs8(pkcs8: &[u8], rng: &dyn SecureRandom) -> Result<TlsKey, IssueError> {
        let alg = &signature::ECDSA_P256_SHA256_ASN1_SIGNING;
        let pair = EcdsaKeyPair::from_pkcs8(alg, pkcs8, rng)
            .map_err(|_| IssueError::Key("not an ECDSA P-256 PKCS#8 key"))?;
        let spki = spki_der(pair.public_key().as_ref());
        Ok(TlsKey {
            pair,
            pkcs8: Zeroizing::new(pkcs8.to_vec()),
            spki,
        })
    }

    /// The PKCS#8 document of the private key (for Envoy's `tls_certificate`).
    pub fn pkcs8_der(&self) -> &[u8] {
        &self.pkcs8
    }

    /// What the workload key delegates ([`Purpose::TlsKey`]): the SHA-256 of the
    /// certificate's SubjectPublicKeyInfo.
    pub fn spki_sha256(&self) -> [u8; 32] {
        sha256(&self.spki)
    }
}

fn sha256(bytes: &[u8]) -> [u8; 32] {
    let digest = ring::digest::digest(&ring::digest::SHA256, bytes);
    let mut out = [0; 32];
    out.copy_from_slice(digest.as_ref());
    out
}

fn oid(arcs: &[u64]) -> ObjectIdentifier {
    ObjectIdentifier::from_slice(arcs)
}

/// The SubjectPublicKeyInfo of an uncompressed P-256 point.
fn spki_der(point: &[u8]) -> Vec<u8> {
    yasna::construct_der(|w| {
        w.write_sequence(|w| {
            w.next().write_sequence(|w| {
                w.next().write_oid(&oid(EC_PUBLIC_KEY));
                w.next().write_oid(&oid(P256));
            });
            w.next().write_bitvec_bytes(point, point.len() * 8);
        })
    })
}

/// Makes the certificate of `key` for `proof` (whose delegation must be of `key`:
/// the verifier refuses it otherwise), named `principal` (its URI SAN) and by the
/// proven id's [`sni_name`], valid as long as the delegation, self-signed; DER.
pub fn issue(
    key: &TlsKey,
    proof: &Proof,
    principal: &str,
    rng: &dyn SecureRandom,
) -> Result<Vec<u8>, IssueError> {
    let encoded = proof.encode();
    if encoded.len() > MAX_PROOF_LEN {
        return Err(IssueError::ProofTooLong(encoded.len()));
    }
    let mesh = MeshName::new(&proof.mesh).map_err(|_| IssueError::Key("not a mesh name"))?;
    let id = PublicIdentity::new(proof.workload_key, mesh.clone()).id();
    let names = san_value(&[principal], &[&sni_name(&id, &mesh)]);
    let mut serial = [0u8; 16];
    rng.fill(&mut serial)
        .map_err(|_| IssueError::Key("the random number generator failed"))?;
    serial[0] &= 0x7f;
    let tbs = Tbs {
        serial: &serial,
        not_before_secs: secs(proof.delegation.not_before_ms),
        // Rounded up: the certificate never ends before its delegation.
        not_after_secs: secs(proof.delegation.not_after_ms.div_ceil(1000) * 1000),
        spki: &key.spki,
        extensions: &[
            Extension {
                oid: SUBJECT_ALT_NAME_CONTENT,
                critical: false,
                value: &names,
            },
            Extension {
                oid: &PROOF_OID_CONTENT,
                critical: true,
                value: &encoded,
            },
        ],
    };
    signed(key, &tbs.der()?, rng)
}

fn secs(ms: u64) -> i64 {
    i64::try_from(ms / 1000).unwrap_or(i64::MAX)
}

/// One extension as it is written: its OID's content octets (the proof's arcs are
/// wider than yasna's u64 ones), whether critical, its value.
struct Extension<'a> {
    oid: &'a [u8],
    critical: bool,
    value: &'a [u8],
}

/// What a Themis certificate's TBSCertificate holds beyond what is fixed (version 3,
/// ECDSA with SHA-256, the name `CN=themis` as issuer and subject). The verifier
/// rebuilds it from what it parsed and takes the certificate only if it is the same
/// bytes: one encoding of one profile, so no parser reads it another way.
struct Tbs<'a> {
    serial: &'a [u8],
    not_before_secs: i64,
    not_after_secs: i64,
    spki: &'a [u8],
    extensions: &'a [Extension<'a>],
}

impl Tbs<'_> {
    fn der(&self) -> Result<Vec<u8>, IssueError> {
        let time = |secs: i64| {
            let at =
                time::OffsetDateTime::from_unix_timestamp(secs).map_err(|_| IssueError::Time)?;
            UTCTime::from_datetime_opt(at).ok_or(IssueError::Time)
        };
        let (not_before, not_after) = (time(self.not_before_secs)?, time(self.not_after_secs)?);
        Ok(yasna::construct_der(|w| {
            w.write_sequence(|w| {
                w.next()
                    .write_tagged(yasna::Tag::context(0), |w| w.write_u8(2));
                w.next().write_bigint_bytes(self.serial, true);
                write_algorithm(w.next());
                write_name(w.next());
                w.next().write_sequence(|w| {
                    w.next().write_utctime(&not_before);
                    w.next().write_utctime(&not_after);
                });
                write_name(w.next());
                w.next().write_der(self.spki);
                if self.extensions.is_empty() {
                    return;
                }
                w.next().write_tagged(yasna::Tag::context(3), |w| {
                    w.write_sequence(|w| {
                        for e in self.extensions {
                            w.next().write_sequence(|w| {
                                let mut oid = vec![0x06, e.oid.len() as u8];
                                oid.extend_from_slice(e.oid);
                                w.next().write_der(&oid);
                                if e.critical {
                                    // DER leaves out a default FALSE.
                                    w.next().write_bool(true);
                                }
                                w.next().write_bytes(e.value);
                            });
                        }
                    })
                });
            })
        }))
    }
}

fn write_algorithm(w: yasna::DERWriter<'_>) {
    w.write_sequence(|w| w.next().write_oid(&oid(ECDSA_SHA256)))
}

fn write_name(w: yasna::DERWriter<'_>) {
    w.write_sequence(|w| {
        w.next().write_set(|w| {
            w.next().write_sequence(|w| {
                w.next().write_oid(&oid(COMMON_NAME));
                w.next().write_utf8_string("themis");
            })
        })
    })
}

/// A subjectAltName's value: the URIs, then the DNS names.
fn san_value(uris: &[&str], dns_names: &[&str]) -> Vec<u8> {
    yasna::construct_der(|w| {
        w.write_sequence(|w| {
            for uri in uris {
                w.next()
                    .write_tagged_implicit(yasna::Tag::context(6), |w| w.write_ia5_string(uri));
            }
            for dns in dns_names {
                w.next()
                    .write_tagged_implicit(yasna::Tag::context(2), |w| w.write_ia5_string(dns));
            }
        })
    })
}

/// The certificate: `tbs` signed by `key`.
fn signed(key: &TlsKey, tbs: &[u8], rng: &dyn SecureRandom) -> Result<Vec<u8>, IssueError> {
    let signature = key
        .pair
        .sign(rng, tbs)
        .map_err(|_| IssueError::Key("signing failed"))?;
    Ok(certificate_der(tbs, signature.as_ref()))
}

fn certificate_der(tbs: &[u8], signature: &[u8]) -> Vec<u8> {
    yasna::construct_der(|w| {
        w.write_sequence(|w| {
            w.next().write_der(tbs);
            write_algorithm(w.next());
            w.next().write_bitvec_bytes(signature, signature.len() * 8);
        })
    })
}

/// Why a peer's certificate was refused. The peer is never told which; the sidecar
/// counts and logs it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CertError {
    /// Longer than [`MAX_CERTIFICATE_LEN`].
    #[error("the certificate is {0} bytes; at most {MAX_CERTIFICATE_LEN}")]
    TooLong(usize),
    /// Not exactly one DER X.509 certificate.
    #[error("the bytes are not one X.509 certificate")]
    Malformed,
    /// Not version 3.
    #[error("not an X.509 v3 certificate")]
    NotV3,
    /// A key other than ECDSA P-256, or a signature other than ECDSA with SHA-256.
    #[error("the certificate's key or signature is not ECDSA P-256 with SHA-256")]
    NotP256,
    /// Not signed by its own key (a CA-signed certificate, or a tampered one).
    #[error("the certificate is not signed by its own key")]
    NotSelfSigned,
    /// No proof extension: not a Themis certificate (a CA's, say).
    #[error("the certificate carries no Themis proof")]
    NoProof,
    /// The proof extension more than once.
    #[error("the certificate carries the Themis proof more than once")]
    ProofTwice,
    /// The proof extension not marked critical (a validator that does not know it
    /// must not take the certificate).
    #[error("the Themis proof is not marked critical")]
    ProofNotCritical,
    /// A critical extension this verifier does not know.
    #[error("the certificate has a critical extension other than the Themis proof")]
    UnknownCritical,
    /// The proof does not decode.
    #[error("the Themis proof does not decode")]
    ProofMalformed,
    /// Another proof format.
    #[error("the Themis proof is version {0}; this verifier reads {PROOF_VERSION}")]
    ProofVersion(u8),
    /// The proof's mesh is not ours.
    #[error("the certificate is for mesh {0:?}")]
    OtherMesh(String),
    /// An endorsement over [`MAX_ENDORSEMENT_LEN`].
    #[error("the endorsement is {0} bytes; at most {MAX_ENDORSEMENT_LEN}")]
    EndorsementTooLong(usize),
    /// The delegation names another key than the certificate's.
    #[error("the delegation is of another key than the certificate's")]
    KeyMismatch,
    /// The delegation does not verify under the workload key, or not now.
    #[error("the delegation: {0}")]
    Delegation(DelegationError),
    /// Not exactly one URI SAN and one DNS SAN (and no other name).
    #[error("the certificate must name exactly one URI and one DNS name")]
    Names,
    /// The DNS SAN is not the proven id's SNI name.
    #[error("the DNS name {0:?} is not the SNI name of the id the proof proves")]
    WrongSniName(String),
    /// Not, byte for byte, the certificate this profile writes of its contents.
    #[error("the certificate is not encoded as a Themis certificate is")]
    NotCanonical,
}

/// A peer whose certificate verified: who it is, proven, and what it claims.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Peer {
    /// The workload's public identity (its key hashes to the id with the mesh).
    pub identity: PublicIdentity,
    /// `H(workload key ‖ mesh)`.
    pub id: PeerId,
    /// The URI SAN as the certificate says it: Envoy's RBAC and logs read it, so the
    /// caller must check it is the [`principal`] the endorsement proves.
    pub principal: String,
    /// The workload's endorsement (unchecked here: the sidecar checks it against the
    /// mesh root and the revocations).
    pub endorsement: Vec<u8>,
    /// Unix ms: the delegation's end, after which the certificate counts for nothing.
    pub not_after_ms: u64,
    /// The SHA-256 of the certificate's SubjectPublicKeyInfo: the key the delegation
    /// names ([`TlsKey::spki_sha256`]).
    pub key_sha256: [u8; 32],
}

/// Checks a peer's DER certificate for `mesh` at `now_ms`: one self-signed ECDSA
/// P-256 v3 certificate, exactly one critical proof and no other critical extension,
/// the proof's mesh ours, its delegation of this certificate's key by the workload key
/// valid now, and its DNS name the proven id's. What is left to the caller: the
/// endorsement and the principal, revocation of the id, and the SNI it expected.
pub fn verify(der: &[u8], mesh: &MeshName, now_ms: u64) -> Result<Peer, CertError> {
    if der.len() > MAX_CERTIFICATE_LEN {
        return Err(CertError::TooLong(der.len()));
    }
    let (rest, cert) =
        x509_parser::parse_x509_certificate(der).map_err(|_| CertError::Malformed)?;
    if !rest.is_empty() {
        return Err(CertError::Malformed);
    }
    let tbs = &cert.tbs_certificate;
    if tbs.version != X509Version::V3 {
        return Err(CertError::NotV3);
    }
    let key = &tbs.subject_pki;
    let p256 = key.algorithm.algorithm.as_bytes() == EC_PUBLIC_KEY_CONTENT
        && key.algorithm.parameters.as_ref().is_some_and(|p| {
            p.header.tag() == x509_parser::der_parser::asn1_rs::Tag::Oid && p.data == P256_CONTENT
        });
    let ecdsa_sha256 = cert.signature_algorithm.algorithm.as_bytes() == ECDSA_SHA256_CONTENT
        && tbs.signature.algorithm.as_bytes() == ECDSA_SHA256_CONTENT;
    if !(p256 && ecdsa_sha256) {
        return Err(CertError::NotP256);
    }
    let point = &key.subject_public_key.data;
    signature::UnparsedPublicKey::new(&signature::ECDSA_P256_SHA256_ASN1, point.as_ref())
        .verify(tbs.as_ref(), &cert.signature_value.data)
        .map_err(|_| CertError::NotSelfSigned)?;

    let mut proofs = tbs
        .extensions()
        .iter()
        .filter(|e| e.oid.as_bytes() == PROOF_OID_CONTENT);
    let extension = proofs.next().ok_or(CertError::NoProof)?;
    if proofs.next().is_some() {
        return Err(CertError::ProofTwice);
    }
    if !extension.critical {
        return Err(CertError::ProofNotCritical);
    }
    if tbs
        .extensions()
        .iter()
        .any(|e| e.critical && e.oid.as_bytes() != PROOF_OID_CONTENT)
    {
        return Err(CertError::UnknownCritical);
    }
    let proof = Proof::decode(extension.value).ok_or(CertError::ProofMalformed)?;
    if proof.version != PROOF_VERSION {
        return Err(CertError::ProofVersion(proof.version));
    }
    if proof.mesh != mesh.as_str() {
        return Err(CertError::OtherMesh(proof.mesh));
    }
    if proof.endorsement.len() > MAX_ENDORSEMENT_LEN {
        return Err(CertError::EndorsementTooLong(proof.endorsement.len()));
    }
    let key_sha256 = sha256(key.raw);
    if proof.delegation.delegated_key != key_sha256 {
        return Err(CertError::KeyMismatch);
    }
    let identity = PublicIdentity::new(proof.workload_key, mesh.clone());
    proof
        .delegation
        .verify_for(Purpose::TlsKey, &identity, now_ms)
        .map_err(CertError::Delegation)?;
    let id = identity.id();

    let names = cert
        .subject_alternative_name()
        .map_err(|_| CertError::Names)?
        .ok_or(CertError::Names)?;
    let (mut uris, mut dns) = (Vec::new(), Vec::new());
    for name in &names.value.general_names {
        match name {
            GeneralName::URI(uri) => uris.push(*uri),
            GeneralName::DNSName(name) => dns.push(*name),
            _ => return Err(CertError::Names),
        }
    }
    let ([uri], [dns]) = (uris.as_slice(), dns.as_slice()) else {
        return Err(CertError::Names);
    };
    if *dns != sni_name(&id, mesh) {
        return Err(CertError::WrongSniName((*dns).to_owned()));
    }
    // Last, the profile: the certificate must be, byte for byte, what this crate
    // writes of what was read (the parser passes over some non-DER encodings, and
    // another parser, BoringSSL's, must not read anything else into it).
    let extensions: Vec<Extension<'_>> = tbs
        .extensions()
        .iter()
        .map(|e| Extension {
            oid: e.oid.as_bytes(),
            critical: e.critical,
            value: e.value,
        })
        .collect();
    let rebuilt = Tbs {
        serial: tbs.raw_serial(),
        not_before_secs: tbs.validity.not_before.timestamp(),
        not_after_secs: tbs.validity.not_after.timestamp(),
        spki: key.raw,
        extensions: &extensions,
    }
    .der()
    .map_err(|_| CertError::NotCanonical)?;
    let names_rebuilt = san_value(&[uri], &[dns]);
    let san_raw = tbs
        .extensions()
        .iter()
        .find(|e| e.oid.as_bytes() == SUBJECT_ALT_NAME_CONTENT)
        .map(|e| e.value);
    if rebuilt != tbs.as_ref()
        || san_raw != Some(names_rebuilt.as_slice())
        || certificate_der(tbs.as_ref(), &cert.signature_value.data) != der
    {
        return Err(CertError::NotCanonical);
    }
    Ok(Peer {
        identity,
        id,
        principal: (*uri).to_owned(),
        endorsement: proof.endorsement,
        not_after_ms: proof.delegation.not_after_ms,
        key_sha256,
    })
}

/// The delegation a workload key signs for `key`, valid from `now_ms` for
/// `lifetime_ms` (capped as every delegation is): the agent's half of [`issue`].
pub fn delegate(
    workload: &themis_core::Identity,
    key: &TlsKey,
    now_ms: u64,
    lifetime_ms: u64,
) -> Delegation {
    Delegation::issue_for(
        Purpose::TlsKey,
        workload,
        key.spki_sha256(),
        now_ms,
        lifetime_ms,
    )
}

/// `der` as a PEM block labelled `label` (RFC 7468): how Envoy's TLS context takes a
/// certificate (`CERTIFICATE`) and its key (`PRIVATE KEY`, PKCS#8).
pub fn pem(label: &str, der: &[u8]) -> String {
    use base64::Engine;
    let text = base64::engine::general_purpose::STANDARD.encode(der);
    let mut out = format!("-----BEGIN {label}-----\n");
    for line in text.as_bytes().chunks(64) {
        // Base64 is ASCII: every chunk is UTF-8.
        out.push_str(std::str::from_utf8(line).unwrap_or_default());
        out.push('\n');
    }
    out.push_str(&format!("-----END {label}-----\n"));
    out
}

#[cfg(test)]
mod tests;
