//! The Themis channel as an Envoy dynamic module (`libthemis_native.so`): the same
//! `themis_core` stream and wire as the Wasm filter, compiled natively (ring's
//! AES-NI and SIMD code paths), in the place Envoy gives TLS — transport sockets.
//!
//! * `inbound` — the transport socket of the listener peers call: responder of the
//!   key agreement; the policy is decided when the caller has proved its id (its
//!   claimed service counts when the endorsement it carried names it), and only then
//!   does plaintext reach the connection manager. The network filter `peer` hands
//!   the proven id and service to the connection manager as filter state.
//! * `outbound` — the transport socket of a sealing cluster (one per service the app
//!   calls, `ORIGINAL_DST`): initiator toward the one id the module's own verified
//!   resolution lists at the address connected to; `Connected` is raised only once
//!   that id has proved itself.
//!
//! A transport socket cannot wait on a call, so the sidecar signs its handshakes
//! itself with a key the agent delegated ([`runtime`]: one thread per workload keeps
//! the credential, the revocations and the resolutions fresh, supervised: a thread
//! that panics is restarted). `ffi` is the only `unsafe` code: the C ABI of Envoy
//! 1.40's dynamic modules, every hook behind `catch_unwind` and one rule for touching
//! a connection (`ffi/guard.rs`). The module links with `-z now` (`build.rs`): an
//! Envoy that lacks a callback it calls refuses to load it, rather than aborting on
//! the first call.

#![deny(unsafe_code)]

#[cfg(feature = "fault-injection")]
mod faults;
mod ffi;
pub mod filter;
pub mod metrics;
pub mod outbound;
pub mod runtime;
pub mod socket;
pub mod validator;
