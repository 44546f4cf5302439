//! The TLS binding's certificate validator (docs/PROTOCOL.md §8.3), for Envoy's own
//! TLS socket (`envoy.tls.cert_validator.dynamic_modules`): BoringSSL runs TLS 1.3,
//! this decides who the peer is. The caller's side (`outbound`) holds the callee to
//! the id its SNI names; the callee's side (`inbound`) decides the policy on what the
//! certificate proved, so a refused caller's handshake fails and no byte of it
//! reaches the connection manager.
//!
//! The decision is `themis_sidecar::tls` (the same checks as the sidecar core's
//! tests); this file adds the runtime's revocations and counts. Nothing is written
//! to the connection's filter state: Envoy keeps the validator's callbacks on a
//! configuration every worker shares, so a write could land on another connection.
//! What the handshake proved reaches Envoy's RBAC and logs as the certificate's
//! SANs, which the validator held to the proof.

use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::Arc;

use themis_core::PeerId;

use themis_sidecar::config::{Config, Policy, Role, Transport};
use themis_sidecar::conn::Close;
use themis_sidecar::reason::Reason;
use themis_sidecar::tls::{admit, Proven, ProvenCache};
use themis_sidecar::upkeep::revocations_stale;
use themis_trust::Verifier;

use crate::metrics;
use crate::runtime::{now_ms, Runtime};

/// Callees proven on this worker's upstream handshakes, at most: past it the map
/// starts again (a response then names its peer without a service until the next
/// handshake with it).
const MAX_PROVEN: usize = 4096;

/// Certificates a worker keeps proven (`ProvenCache`): far more peers than a sidecar
/// pools connections with.
const MAX_CACHED: usize = 1024;

thread_local! {
    /// The certificates proven on this worker's handshakes, either side: a pool's next
    /// connection from or to the same peer skips the signature checks while the
    /// revocations and the proof's life allow (`themis_sidecar::tls::ProvenCache`).
    static CACHE: RefCell<ProvenCache> = RefCell::new(ProvenCache::new(MAX_CACHED));
    /// The service each callee proved in a handshake on this worker (Envoy's pools
    /// are per worker and per SNI, so a response came over a connection this worker
    /// validated, to the id its SNI names).
    static PROVEN: RefCell<HashMap<PeerId, Option<String>>> = RefCell::new(HashMap::new());
}

/// The service `callee` proved in its last handshake on this worker (`Some(None)`:
/// it proved no service), `None` if it made none here.
pub fn proven_service(callee: &PeerId) -> Option<Option<String>> {
    PROVEN.with(|p| p.borrow().get(callee).cloned())
}

fn remember(proven: &Proven) {
    PROVEN.with(|p| {
        let mut p = p.borrow_mut();
        if p.len() >= MAX_PROVEN && !p.contains_key(&proven.id) {
            p.clear();
        }
        p.insert(proven.id, proven.service.clone());
    });
}

/// Which end of the handshake this validator checks the peer of.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Side {
    /// A listener's: the peer is a caller (Envoy's `is_server`).
    Inbound,
    /// A cluster's: the peer is the callee its SNI named.
    Outbound,
}

/// One validator configuration (per TLS context; shared by the workers).
pub struct Validator {
    side: Side,
    policy: Option<Policy>,
    revocations_max_age: std::time::Duration,
    runtime: Arc<Runtime>,
}

impl Validator {
    /// `name` is `inbound` (a listener's context, role inbound, with its policy) or
    /// `outbound` (a cluster's, role seal); `config` the role's JSON, as the
    /// transport sockets take it, with `"transport": "tls"`.
    pub fn new(name: &[u8], config: &[u8]) -> Result<Validator, String> {
        let config = Config::parse(config).map_err(|e| e.to_string())?;
        if config.transport != Transport::Tls {
            return Err("transport: a validator's configuration says \"tls\"".into());
        }
        let side = match (name, config.role) {
            (b"inbound", Role::Inbound) => Side::Inbound,
            (b"outbound", Role::Seal) => Side::Outbound,
            _ => {
                return Err(format!(
                    "validator_name {:?} with role {}: use `inbound` (role inbound) on a listener and `outbound` (role seal) on a cluster",
                    String::from_utf8_lossy(name),
                    config.role.as_str()
                ))
            }
        };
        let runtime = Runtime::of(&config)?;
        Ok(Validator {
            side,
            policy: config.policy,
            revocations_max_age: config.revocations_max_age,
            runtime,
        })
    }

    /// The counters' role: a TLS peer is counted where the Themis channel's is.
    fn role(&self) -> &'static str {
        match self.side {
            Side::Inbound => Role::Inbound.as_str(),
            Side::Outbound => Role::Seal.as_str(),
        }
    }

    /// Checks the peer's chain (leaf first) as Envoy hands it over: `host_name` is
    /// the SNI the caller sent (on the caller's side, the callee it must be);
    /// `is_server` says Envoy runs this on a listener. Counts and logs the outcome.
    pub fn verify(
        &self,
        chain: &[&[u8]],
        host_name: &[u8],
        is_server: bool,
    ) -> Result<Proven, Close> {
        let verdict = self.decide(chain, host_name, is_server);
        let role = self.role();
        match &verdict {
            Ok(proven) => {
                if self.side == Side::Outbound {
                    remember(proven);
                }
                metrics::count(role, "established");
                if self.side == Side::Inbound {
                    metrics::count(role, "allowed");
                }
            }
            Err(Close { reason, detail }) => {
                metrics::count(role, &reason.counter());
                crate::ffi::log(
                    3,
                    &format!("themis native {role} (tls): refused.{reason}: {detail}"),
                );
            }
        }
        verdict
    }

    fn decide(&self, chain: &[&[u8]], host_name: &[u8], is_server: bool) -> Result<Proven, Close> {
        if self.side == Side::Inbound {
            let since = self.runtime.revocations_fresh_since();
            if let Some(age) = revocations_stale(since, now_ms(), self.revocations_max_age) {
                return Err(Close::revocations_stale(age));
            }
        }
        if is_server != (self.side == Side::Inbound) {
            return Err(Close::new(
                Reason::Certificate,
                "the validator's name says the other end of the handshake",
            ));
        }
        // A Themis certificate is self-signed and alone: a chain is some CA's.
        let [leaf] = chain else {
            return Err(Close::new(
                Reason::Certificate,
                format!(
                    "{} certificates: a Themis peer presents exactly one",
                    chain.len()
                ),
            ));
        };
        let snapshot = self.runtime.snapshot();
        let verifier = Verifier {
            root: &self.runtime.root,
            now_ms: now_ms(),
            revoked: &snapshot.revocations,
        };
        let sni = match self.side {
            Side::Outbound => Some(
                std::str::from_utf8(host_name)
                    .map_err(|_| Close::new(Reason::WrongPeer, "the SNI is not text"))?,
            ),
            // The caller's SNI names this callee, not the caller.
            Side::Inbound => None,
        };
        let generation = snapshot.revocation_generation;
        let proven = CACHE.with(|c| c.borrow_mut().check(leaf, sni, &verifier, generation))?;
        if self.side == Side::Inbound {
            admit(self.policy.as_ref(), &proven)?;
        }
        Ok(proven)
    }
}
