//! A leaf of the log: one root-signed statement and what kind it is.

use serde::{Deserialize, Serialize};
use themis_trust::{
    AddressRange, Admission, Binding, Grant, MeshRoot, Revocation, Signed, TrustError,
    ADDRESS_RANGE_LABEL, ADMISSION_LABEL, BINDING_LABEL, GRANT_LABEL, MAX_REASON_LEN,
    REVOCATION_LABEL,
};

use crate::{decode, LogError, MAX_LEAF_LEN};

/// What a leaf says. The kind picks the label its signature is checked under, so no
/// statement can be read as another kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Kind {
    /// A node admitted to the ring.
    Admission,
    /// A key allowed to endorse instances of a service.
    Grant,
    /// A key withdrawn.
    Revocation,
    /// Addresses granted to a node (its pod range). After the first three, so that
    /// older logs decode.
    AddressRange,
    /// Which namespace (and ServiceAccounts) may serve a service. Last, likewise.
    Binding,
}

impl Kind {
    /// The label statements of this kind are signed under.
    pub fn label(self) -> &'static str {
        match self {
            Kind::Admission => ADMISSION_LABEL,
            Kind::Grant => GRANT_LABEL,
            Kind::Revocation => REVOCATION_LABEL,
            Kind::AddressRange => ADDRESS_RANGE_LABEL,
            Kind::Binding => BINDING_LABEL,
        }
    }

    /// Its name in output (`themis log show`).
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Admission => "admission",
            Kind::Grant => "grant",
            Kind::Revocation => "revocation",
            Kind::AddressRange => "address-range",
            Kind::Binding => "binding",
        }
    }
}

/// A leaf as stored and hashed: `postcard(Entry)`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Entry {
    /// What the statement is.
    pub kind: Kind,
    /// The statement, signed by the mesh root.
    pub statement: Signed,
}

/// A leaf's statement, verified and decoded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Statement {
    /// See [`Admission`].
    Admission(Admission),
    /// See [`Grant`].
    Grant(Grant),
    /// See [`Revocation`].
    Revocation(Revocation),
    /// See [`AddressRange`].
    AddressRange(AddressRange),
    /// See [`Binding`].
    Binding(Binding),
}

impl Statement {
    /// Its kind.
    pub fn kind(&self) -> Kind {
        match self {
            Statement::Admission(_) => Kind::Admission,
            Statement::Grant(_) => Kind::Grant,
            Statement::Revocation(_) => Kind::Revocation,
            Statement::AddressRange(_) => Kind::AddressRange,
            Statement::Binding(_) => Kind::Binding,
        }
    }

    /// When the root signed it (Unix ms).
    pub fn issued_at(&self) -> u64 {
        match self {
            Statement::Admission(a) => a.issued_at,
            Statement::Grant(g) => g.issued_at,
            Statement::Revocation(r) => r.issued_at,
            Statement::AddressRange(r) => r.issued_at,
            Statement::Binding(b) => b.issued_at,
        }
    }
}

impl Entry {
    /// The leaf for `statement` (encoded `Signed`) of `kind`; checks nothing.
    pub fn new(kind: Kind, statement: Signed) -> Entry {
        Entry { kind, statement }
    }

    /// The leaf bytes.
    pub fn encode(&self) -> Vec<u8> {
        postcard::to_allocvec(self).expect("entries always encode")
    }

    /// Decodes a leaf; checks no signature.
    pub fn decode(bytes: &[u8]) -> Result<Entry, LogError> {
        decode(bytes, MAX_LEAF_LEN)
    }

    /// Checks that the statement is the root's, of this mesh, and decodes it. Root
    /// statements never expire in the log: an admission's or grant's own `not_after`
    /// is checked where it is used, as before.
    pub fn verify(&self, root: &MeshRoot) -> Result<Statement, TrustError> {
        if self.statement.signer != root.key {
            return Err(TrustError::NotFromRoot);
        }
        let label = self.kind.label();
        let mesh = root.mesh.as_str();
        let (statement, its_mesh) = match self.kind {
            Kind::Admission => {
                let a: Admission = self.statement.open(label)?;
                let m = a.mesh.clone();
                (Statement::Admission(a), m)
            }
            Kind::Grant => {
                let g: Grant = self.statement.open(label)?;
                let m = g.mesh.clone();
                (Statement::Grant(g), m)
            }
            Kind::Revocation => {
                let r: Revocation = self.statement.open(label)?;
                if r.reason.len() > MAX_REASON_LEN {
                    return Err(TrustError::TooLarge);
                }
                let m = r.mesh.clone();
                (Statement::Revocation(r), m)
            }
            Kind::AddressRange => {
                let r: AddressRange = self.statement.open(label)?;
                r.net()?;
                let m = r.mesh.clone();
                (Statement::AddressRange(r), m)
            }
            Kind::Binding => {
                let b: Binding = self.statement.open(label)?;
                b.check()?;
                let m = b.mesh.clone();
                (Statement::Binding(b), m)
            }
        };
        if its_mesh != mesh {
            return Err(TrustError::WrongMesh);
        }
        Ok(statement)
    }

    /// Decodes and verifies a leaf.
    pub fn open(bytes: &[u8], root: &MeshRoot) -> Result<(Entry, Statement), TrustError> {
        let entry = Entry::decode(bytes).map_err(|_| TrustError::Malformed)?;
        let statement = entry.verify(root)?;
        Ok((entry, statement))
    }
}
