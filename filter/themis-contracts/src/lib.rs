//! The contracts between the parts of Themis Mesh, in one place so that they cannot
//! drift apart:
//!
//! * [`names`]: the one rule for service and workload names (a DNS subdomain, as
//!   Kubernetes names Pods), checked the same way by the agent, the `themis` tool, the
//!   Envoy filter, the component and the eBPF loader; with the shared test vectors
//!   every side's tests run ([`names::vectors`]);
//! * [`paths`]: the agent's local API paths, as clients build them and as the agent's
//!   router declares them;
//! * [`api`]: the JSON bodies of that API, requests and answers.
//!
//! `no_std` + `alloc`, serde derive only: it builds natively, for `wasm32-wasip1` (the
//! filter) and for `wasm32-wasip2` (the component).

#![no_std]
#![forbid(unsafe_code)]
#![warn(missing_docs)]

extern crate alloc;

pub mod api;
pub mod names;
pub mod paths;

pub use names::{NameError, ServiceName, WorkloadName, MAX_NAME_LEN};
