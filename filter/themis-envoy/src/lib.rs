//! The Themis filter for Envoy (proxy-wasm, `wasm32-wasip1`): the channel seals the
//! byte stream between sidecars, the way TLS sits under HTTP, and Envoy's own HTTP
//! connection managers, router and `tcp_proxy` do everything else. One module, three
//! roles chosen by the plugin configuration:
//!
//! * **outbound** (HTTP filter, app-facing listener): `http://<service>/…` is resolved
//!   through the local agent and verified against the mesh root; an instance is
//!   picked (random, canary split by metadata, avoiding instances that just failed)
//!   and named to the router, which connects through the internal listener;
//! * **seal** (network filter, internal listener): the key agreement with the picked
//!   instance's id, then every byte sealed;
//! * **inbound** (network filter, peer-facing listener): opens the stream in front of
//!   the stock HTTP connection manager, decides the policy once per connection and
//!   hands the verified peer id and service over as filter state.
//!
//! This crate is only the Envoy glue (`envoy`, Wasm only): everything it decides with is
//! the sans-IO sidecar in `themis_sidecar` (config, agent answers, routing, policy, the
//! connection machines), which the native runtime drives too, and
//! [`themis_core::stream`]. `docs/FILTER.md` is the operator's guide.

#[cfg(target_family = "wasm")]
mod envoy;
