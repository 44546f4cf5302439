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
    /// An [`crate::AddressRange`].
    AddressRange,
}

impl PemKind {
    const ALL: [PemKind; 4] = [
        PemKind::Admission,
        PemKind::Grant,
        PemKind::Revocation,
        PemKind::AddressRange,
    ];

    fn label(self) -> &'static str {
        match self {
            PemKind::Admission => "THEMIS ADMISSION",
            PemKind::Grant => "THEMIS GRANT",
            PemKind::Revocation => "THEMIS REVOCATION",
            PemKind::AddressRange => "THEMIS ADDRESS RANGE",
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

/// The PEM text of a grant chain, root first (one block per grant).
pub fn chain_to_pem(chain: &[Signed]) -> String {
    chain.iter().map(|g| to_pem(PemKind::Grant, g)).collect()
}

/// Reads a grant chain written by [`chain_to_pem`]: one or more `THEMIS GRANT`
/// blocks, root first (signatures are not checked here).
pub fn chain_from_pem(text: &str) -> Result<Vec<Signed>, TrustError> {
    const END: &str = "-----END THEMIS GRANT-----";
    let mut chain = Vec::new();
    let mut rest = text.trim();
    while !rest.is_empty() {
        let end = rest.find(END).ok_or(TrustError::Malformed)? + END.len();
        chain.push(from_pem(PemKind::Grant, &rest[..end])?);
        if chain.len() > crate::MAX_GRANT_CHAIN {
            return Err(TrustError::ChainLength);
        }
        rest = rest[end..].trim_start();
    }
    if chain.is_empty() {
        return Err(TrustError::ChainLength);
    }
    Ok(chain)
}

/// Every credential block in `text` (a file of several: saved revocations, a grant
/// chain, files cat together), in order, each read as its label says; text between
/// blocks is ignored. Signatures are not checked here.
pub fn pem_blocks(text: &str) -> Vec<Result<(PemKind, Signed), TrustError>> {
    let mut blocks = Vec::new();
    let mut rest = text;
    while let Some(begin) = rest.find("-----BEGIN ") {
        rest = &rest[begin..];
        let kind = PemKind::ALL
            .into_iter()
            .find(|k| rest[11..].starts_with(&format!("{}-----", k.label())));
        let Some(kind) = kind else {
            blocks.push(Err(TrustError::Malformed));
            rest = &rest[11..];
            continue;
        };
        let end_marker = format!("-----END {}-----", kind.label());
        let Some(end) = rest.find(&end_marker) else {
            blocks.push(Err(TrustError::Malformed));
            break;
        };
        let end = end + end_marker.len();
        blocks.push(from_pem(kind, &rest[..end]).map(|signed| (kind, signed)));
        rest = &rest[end..];
    }
    blocks
}
