//! The sidecar's own logic, sans-IO, one for every runtime (quinn-proto to the drivers'
//! quinn): the proxy-wasm filter (`themis-envoy`), the native dynamic module
//! (`themis-native`) and the component drive it, each owning its sockets, clocks and
//! Envoy callbacks, and nothing here knows which one runs it.
//!
//! * [`config`]: the plugin / module configuration, checked before a byte flows;
//! * [`agent`]: the readers of the local agent's answers, each verified against the
//!   mesh root (resolutions, credentials, delegations, revocations with their proofs);
//! * [`outbound`]: the outbound HTTP role's decisions (the service a request names,
//!   its refusals, the pick's headers);
//! * [`route`]: the outbound pick (random, canary split, avoiding instances that just
//!   failed);
//! * [`policy`]: the callee's decision once the caller has proved its id;
//! * [`conn`]: one connection machine per side, the caller's and the callee's;
//! * [`reason`]: every reason either refuses for, the one table both runtimes count;
//! * `tls` (feature `tls`): the TLS binding's decision on a peer past its
//!   certificate (docs/PROTOCOL.md §8.3);
//! * [`upkeep`]: what is kept from the agent between connections (identity,
//!   delegation, revocations) and when each is asked again.
//!
//! `docs/FILTER.md` is the operator's guide to what these decide.

pub mod agent;
pub mod config;
pub mod conn;
pub mod outbound;
pub mod policy;
pub mod reason;
pub mod route;
#[cfg(feature = "tls")]
pub mod tls;
pub mod upkeep;

#[cfg(test)]
mod testing;
