//! The Themis host agent: one per node. It keeps the node's view of the mesh (by
//! default every admitted node, learnt from the root-signed trust log and membership
//! gossip, so a name resolves in one hop from its replica holders; or its place in a
//! Chord ring over self-certifying ids, every message over the secure channel), the
//! registry of the node's workloads and their keys, and a cache of resolutions, and
//! serves them on a local HTTP + JSON API over a Unix socket.
//!
//! * [`overlay`]: the tokio driver of the sans-IO `themis_dht::Node`.
//! * [`roster`]: the mesh's full membership; [`gossip`]: the membership and the log's
//!   growth, spread push-pull; [`histories`]: when to compare a member's other history
//!   of the log (a fork), retried until settled.
//! * [`trust_log`]: this agent's copy of the trust log, verified and audited;
//!   [`log_sync`]: the log's exchange with neighbours.
//! * [`registry`]: register, deregister and resolve services; the node endorses its
//!   workloads' records within its grants.
//! * [`trust`]: the mesh root, this node's admission and grants, revocations, and the
//!   checks on every peer frame and stored value.
//! * [`signing`]: delegated signing and delegations (a workload's private key never
//!   leaves the agent); [`sds`]: the proxies' TLS certificates over Envoy's SDS.
//! * [`api`]: the local API (`themis-agent-client` calls it); [`caller`]: who calls it (kernel
//!   credentials) and what they may do; [`local_socket`]: the API's listener (callers
//!   read once at accept, connections capped per cgroup).
//! * [`keystore`]: key files (0600, refused when others can read, write or replace
//!   them); [`files`]: files replaced whole (a crash leaves the old or the new);
//!   [`names`]: the names people give; [`sys`]: the system calls std does not wrap.
//! * [`metrics`]: Prometheus metrics.
//! * [`agent`]: the daemon that wires them; [`config`]: its settings.
//!
//! `docs/AGENT.md` explains the design. The daemon is the binary `themis-agent`; the
//! tool for people, `themis` (which also runs the daemon as `themis agent`), and the
//! operator's offline signing are the crate `themis-cli`.

// Only `sys` may use unsafe code (three system calls std does not wrap).
#![deny(unsafe_code)]
#![warn(missing_docs)]

pub mod agent;
pub mod api;
pub mod caller;
pub mod config;
pub mod files;
pub mod gossip;
pub mod histories;
pub mod keystore;
pub mod local_socket;
pub mod log_sync;
pub mod metrics;
pub mod names;
pub mod overlay;
pub mod registry;
pub mod roster;
pub mod sds;
pub mod signing;
pub mod sys;
pub mod trust;
pub mod trust_log;
