//! The Themis filter for Envoy (proxy-wasm, `wasm32-wasip1`): one module, two roles
//! chosen by the plugin configuration.
//!
//! * **outbound**, on the listener the local app calls: a request to
//!   `http://<service>/…` is resolved through the local agent, one instance is picked
//!   at random (the next one is tried if it fails), the key agreement with that
//!   instance's id runs if there is no live session, and the whole request — method,
//!   path, headers, body — travels sealed; so does the response.
//! * **inbound**, on the listener peers call: only sealed requests of authenticated
//!   peers pass; the app gets the original request plus the verified peer id and
//!   service; a policy allows or denies by service or id.
//!
//! The Envoy glue is [`proxy`] (Wasm only); everything it decides with is plain Rust
//! tested natively: [`config`], [`envelope`], [`agent`], [`inbound`], [`outbound`].
//! `docs/FILTER.md` is the operator's guide.

pub mod agent;
pub mod config;
pub mod envelope;
pub mod inbound;
pub mod outbound;
pub mod protocol;

#[cfg(target_family = "wasm")]
mod proxy;
