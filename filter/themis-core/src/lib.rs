//! The sans-IO core of Themis Mesh: the low-level protocols of the Themis paper
//! (Aktypi et al., ARES 2022) as plain state machines.
//!
//! * [`identity`]: self-certifying identities, `id = SHA-256(public_key || mesh name)`,
//!   their printable form and the private key file.
//! * [`handshake`]: the three-message authenticated key agreement (paper Fig. 2).
//! * [`channel`]: the secure channel records (paper Fig. 3).
//! * [`stream`]: a sealed byte stream over one connection (the Envoy sidecars' wire).
//! * [`guard`]: what keeps a responder cheap to flood (Hello freshness window and
//!   replay cache, per-source token buckets, the handshake budget "under load").
//! * [`wire`]: the versioned, size-bounded binary codec every message goes through.
//!
//! Nothing here owns a socket, a clock or a random number generator: randomness is
//! passed in as a [`ring::rand::SecureRandom`], the time as Unix milliseconds, bytes
//! come in and bytes go out. The same
//! code runs natively, in Envoy's Wasm VM and as a WASI component. `docs/PROTOCOL.md`
//! specifies the formats and the key schedule.
//!
//! ```
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! use ring::rand::SystemRandom;
//! use themis_core::{handshake::{self, Initiator}, HandshakeConfig, HelloGuard, Identity, MeshName};
//!
//! let rng = SystemRandom::new();
//! let mesh = MeshName::new("demo")?;
//! let (alice, bob) = (Identity::generate(mesh.clone(), &rng)?, Identity::generate(mesh, &rng)?);
//! let config = HandshakeConfig::default();
//! let mut guard = HelloGuard::default(); // bob's, kept across handshakes
//! let now_ms = 1_700_000_000_000;        // the clock is the caller's
//!
//! let (waiting, hello) = Initiator::start(&alice, bob.id(), &config, now_ms, &rng)?;      // → bob
//! let (pending, reply) = handshake::respond(&bob, &hello, &config, &mut guard, now_ms, &rng)?; // → alice
//! let (mut a, confirm) = waiting.read_hello_reply(&reply)?;                  // → bob
//! let mut b = pending.read_confirm(&confirm)?;
//!
//! let (seq, mut record) = a.seal(b"GET /check", None)?;
//! let request = b.open_in_place(&mut record)?;
//! assert_eq!(request.payload, b"GET /check");
//! # assert_eq!((seq, b.info().peer_id), (1, alice.id()));
//! # Ok(())
//! # }
//! ```
#![no_std]
#![forbid(unsafe_code)]
#![warn(missing_docs)]

extern crate alloc;

pub mod channel;
pub mod delegation;
pub mod guard;
pub mod handshake;
pub mod identity;
mod keys;
pub mod params;
pub mod stream;
pub mod suite;
mod transcript;
pub mod wire;

pub use channel::{
    ChannelError, ChannelMode, Opened, Opener, ReplayWindow, Sealer, Session, SessionInfo,
};
pub use delegation::{Credential, DelegatedKey, Delegation, HandshakeSigner};
pub use guard::{Admission, BudgetConfig, HandshakeBudget, HelloGuard, Peek, Rate, SourceLimiter};
pub use handshake::{AwaitingConfirm, AwaitingHelloReply, HandshakeConfig, HandshakeError, Role};
pub use identity::{Identity, KeyFileError, MeshName, MeshNameError, PeerId, PeerIdError};
pub use params::{Carries, StreamOptions, LARGE_RECORD_PAYLOAD, RECORD_PAYLOAD};
pub use suite::Suite;
pub use wire::{WireError, PROTOCOL_VERSION};
