//! The harness of Themis Mesh's tests, one crate (a dev-dependency only):
//!
//! * [`agent`]: `themis agent` processes and the operator's `themis` commands;
//! * [`build`]: the builds the tests run (the filter, the component, the agent);
//! * [`envoy`]: a real Envoy on the rendered sidecar configuration, its stats;
//! * [`module`]: the filter module served to the sidecars, pinned to its SHA-256;
//! * [`app`], [`apps`]: the apps behind the sidecars (echo, gRPC, WebSocket, an upload
//!   sink, redis) and their clients; [`http`]: a small HTTP/1.1 client;
//! * [`mesh`], [`pair`]: the two-node topologies of the end-to-end tests;
//! * [`intruder`]: a key of its own and no admission, at the agent port;
//! * [`mitm`]: a man in the middle of the sealed stream; [`capture`]: tcpdump;
//! * [`cgroup`], [`pods`]: cgroup v2 trees, bpffs, programs placed in pods;
//! * [`netns`]: network namespaces joined by a veth pair;
//! * [`process`]: child processes stopped by pid, waits; [`ports`]: free ports;
//! * [`component`] (feature `component`): the WIT component embedded in wasmtime;
//! * [`require`]: the gates of the tests that need root, Envoy, the kernel, a tool or
//!   a nested build: a plain `cargo test` as an ordinary user skips them and says
//!   why; `scripts/test.sh` (`THEMIS_REQUIRE_ALL=1`) runs them all.

pub mod agent;
pub mod app;
pub mod apps;
pub mod build;
pub mod capture;
pub mod cgroup;
#[cfg(feature = "component")]
pub mod component;
pub mod envoy;
pub mod http;
pub mod intruder;
pub mod mesh;
pub mod mitm;
pub mod module;
pub mod netns;
pub mod pair;
pub mod pods;
pub mod ports;
pub mod process;
pub mod require;
