//! The `themis` command's library: what the mesh operator's tooling does, apart from
//! the daemon (`themis-agent`), which never holds the mesh key nor links the code
//! that signs with it.
//!
//! * [`operator`]: the operator's offline commands (create, admit, grant, authority,
//!   endorse, revoke), each reading key files and writing credential files.
//!
//! The binary (`src/bin/themis.rs`) adds the node's commands over the agent's local
//! API and `themis agent`, which runs [`themis_agent::agent::main`].

#![deny(unsafe_code)]
#![warn(missing_docs)]

pub mod operator;
