//! The mesh root: the mesh's name and the public half of the operator's offline key.

use std::fmt;
use std::str::FromStr;

use themis_core::{MeshName, PeerId};

/// What every agent, filter and client of a mesh is configured with. Its text form is
/// `<mesh>:<64 hex digits of the root public key>`, e.g. `demo:3b6a27bc…`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct MeshRoot {
    /// The mesh name (the protocol's net id).
    pub mesh: MeshName,
    /// The root's Ed25519 public key.
    pub key: [u8; 32],
}

/// Why a mesh root did not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RootError {
    /// No `:` between mesh name and key.
    #[error("a mesh root reads <mesh>:<64 hex digits>, e.g. as `themis mesh create` prints it")]
    Form,
    /// The mesh name part is invalid.
    #[error("the mesh root's mesh name is invalid: {0}")]
    Mesh(#[from] themis_core::identity::MeshNameError),
    /// The key part is not 64 hex digits.
    #[error("the mesh root's key must be 64 hex digits")]
    Key,
}

impl MeshRoot {
    /// The root's own id in the mesh (revoking it is meaningless; it is never looked up).
    pub fn id(&self) -> PeerId {
        PeerId::derive(&self.key, self.mesh.as_str())
    }
}

impl FromStr for MeshRoot {
    type Err = RootError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let (mesh, key) = s.trim().split_once(':').ok_or(RootError::Form)?;
        let mesh = MeshName::new(mesh)?;
        let mut bytes = [0u8; 32];
        hex::decode_to_slice(key, &mut bytes).map_err(|_| RootError::Key)?;
        Ok(MeshRoot { mesh, key: bytes })
    }
}

impl fmt::Display for MeshRoot {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.mesh, hex::encode(self.key))
    }
}
