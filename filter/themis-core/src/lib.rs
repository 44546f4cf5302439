//! The sans-IO core of Themis Mesh: the low-level protocols of the Themis paper
//! (Aktypi et al., ARES 2022) as plain state machines.
//!
//! * [`identity`]: self-certifying identities, `id = SHA-256(public_key || mesh name)`,
//!   their printable form and the private key file.
//! * [`handshake`]: the three-message authenticated key agreement (paper Fig. 2).
//! * [`channel`]: the secure channel records (paper Fig. 3).
//! * [`wire`]: the versioned, size-bounded binary codec every message goes through.
//!
//! Nothing here owns a socket, a clock or a random number generator: randomness is
//! passed in as a [`ring::rand::SecureRandom`], bytes come in and bytes go out. The same
//! code runs natively, in Envoy's Wasm VM and as a WASI component. `docs/PROTOCOL.md`
//! specifies the formats and the key schedule.
#![no_std]
#![forbid(unsafe_code)]
#![warn(missing_docs)]

extern crate alloc;

pub mod channel;
pub mod handshake;
pub mod identity;
mod keys;
pub mod suite;
pub mod wire;

pub use channel::{ChannelError, ChannelMode, Opened, Opener, Sealer, Session, SessionInfo};
pub use handshake::{AwaitingConfirm, AwaitingHelloReply, HandshakeConfig, HandshakeError, Role};
pub use identity::{Identity, KeyFileError, MeshName, MeshNameError, PeerId, PeerIdError};
pub use suite::Suite;
pub use wire::{WireError, PROTOCOL_VERSION};
