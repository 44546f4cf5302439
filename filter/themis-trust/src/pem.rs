//! Credential files: the encoded statement in PEM armour (RFC 7468), so that files
//! say what they hold and survive copy and paste.

use crate::{Signed, TrustError};

/// What a credential file holds (its PEM label).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PemKind {
    /// An [`crate::Admission`].
    Admission,
    /// A [`crate::Grant`].
    Grant,
    /// A [`crate::Revocation`].
    Revocation,
}

impl PemKind {
    fn label(self) -> &'static str {
        match self {
            PemKind::Admission => "THEMIS ADMISSION",
            PemKind::Grant => "THEMIS GRANT",
            PemKind::Revocation => "THEMIS REVOCATION",
        }
    }
}

/// The PEM text of a signed statement.
pub fn to_pem(kind: PemKind, signed: &Signed) -> String {
    pem_rfc7468::encode_string(kind.label(), pem_rfc7468::LineEnding::LF, &signed.encode())
        .expect("a bounded statement always encodes")
}

/// Reads a PEM credential of `kind` (signature not checked here: see [`crate::Verifier`]).
pub fn from_pem(kind: PemKind, text: &str) -> Result<Signed, TrustError> {
    let (label, bytes) =
        pem_rfc7468::decode_vec(text.trim().as_bytes()).map_err(|_| TrustError::Malformed)?;
    if label != kind.label() {
        return Err(TrustError::Malformed);
    }
    Signed::decode(&bytes)
}
