//! What the end-to-end tests of `tests/envoy.rs` run: the builds, Envoy, the echo
//! app, the man in the middle, a small HTTP client, the two-node topology, and the
//! agent harness of the themis-agent crate.

#![allow(dead_code)]

// The agent harness names its binary with `env!("CARGO_BIN_EXE_themis")`, which Cargo
// sets only for the themis-agent crate's own tests: this `env!` (a macro in textual
// scope comes before the standard prelude's) hands it the binary [`build`] makes;
// every other variable goes to the real `env!`.
macro_rules! env {
    ("CARGO_BIN_EXE_themis") => {
        super::build::themis_binary()
    };
    ($($arg:tt)*) => {
        ::std::env!($($arg)*)
    };
}

#[path = "../../../../host-agent/themis-agent/tests/common/mod.rs"]
pub mod agent_harness;
pub mod app;
pub mod apps;
pub mod build;
pub mod envoy;
pub mod http;
pub mod mesh;
pub mod mitm;
pub mod pair;
pub mod process;
