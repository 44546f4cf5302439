//! The Themis protocol core as a WebAssembly component: the WIT world
//! `themis:mesh/themis` (`wit/themis.wit`) implemented over `themis-core`, so that any
//! component host (the `wasmtime` crate, `wasmtime run`, others) gets identities, the
//! key agreement and the secure channel with the exact byte formats of the native
//! agents.
//!
//! Build: `cargo build -p themis-component --release --target wasm32-wasip2`. On other
//! targets the crate is empty: the exports only mean something in a component (and
//! their names are not valid native symbol names).

#[cfg(target_family = "wasm")]
mod component;
/// The tool's HTTP/2 client (sans-IO, so its tests and the `component_http2` fuzz
/// target run natively too).
#[cfg_attr(not(target_family = "wasm"), allow(dead_code, unused_imports))]
pub mod http2;
#[cfg(target_family = "wasm")]
mod tool;
