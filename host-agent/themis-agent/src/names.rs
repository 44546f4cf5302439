//! Names people give: services and local workloads. The rule (a DNS subdomain, as
//! Kubernetes names Pods) and its types live in `themis-contracts`, shared with the
//! Envoy filter, the component and the eBPF loader.

pub use themis_contracts::names::*;
