//! One connection's machine per side, sans-IO, run by both runtimes: the Wasm
//! network filters (`envoy/seal.rs`, `envoy/inbound.rs`) and the native transport
//! sockets (`themis-native`'s `socket.rs`). Bytes and the answers of agent calls go
//! in; a [`Step`] comes out: bytes for each side, an agent call to make, what to
//! count, or why to close. Time, randomness and the worker's state come in with
//! every call; the drivers move bytes and make the calls.
//!
//! ```text
//!  peer bytes ─▶ from_peer ─┐                  ┌─▶ to_app   plaintext for the local app
//!  app bytes  ─▶ from_app  ─┤                  ├─▶ to_peer  toward the peer
//!  agent answers ───────────┼─▶ machine ─▶ Step ┼─▶ ask      identity, sign, resolve
//!  (identity, signature,    │                  ├─▶ events   counted, logged
//!   resolution) ────────────┘                  └─▶ close    refused.<reason>
//! ```
//!
//! [`callee::Callee`] answers (the inbound side), [`caller::Caller`] calls (the
//! seal side); [`deadline::Deadline`] is the callee's handshake deadline.

pub mod callee;
pub mod caller;
pub mod deadline;

use themis_core::handshake::ToSign;
use themis_core::stream::Refusal;
use themis_core::PeerId;

use crate::reason::Reason;

/// An agent call the driver makes for a machine, answered through its
/// `identity_arrived`, `signed` or (the callee's) `resolved`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ask {
    /// The workload's public identity (the sidecar just started).
    Identity,
    /// The agent's signature of message 1 or 2 (no delegated key).
    Sign(ToSign),
    /// A verified resolution of the service the caller claims.
    Resolve(String),
}

/// What happened, for the drivers' counters (`themis.<role>.<counter>`) and logs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// The caller started a key agreement (message 1 made).
    Handshake,
    /// A fresh message 1 drew on the known-good sources' share.
    KnownGoodHandshake,
    /// The replay cache was full of live Hellos and forgot the oldest.
    ReplayCacheEvicted,
    /// The peer proved its id: the callee (message 2) or the caller (message 3 and
    /// its metadata).
    Established(PeerId),
    /// The policy allowed the caller.
    Allowed {
        peer: PeerId,
        /// Its verified service, if it claimed one.
        service: Option<String>,
        /// The claim was checked by the endorsement the caller carried (offline).
        by_endorsement: bool,
    },
}

impl Event {
    /// The counter it adds one to.
    pub fn counter(&self) -> &'static str {
        match self {
            Event::KnownGoodHandshake => "known_good_handshakes",
            Event::ReplayCacheEvicted => "replay_cache_evicted",
            Event::Handshake => "handshakes",
            Event::Established(_) => "established",
            Event::Allowed { .. } => "allowed",
        }
    }
}

/// Why the connection ends: counted as `refused.<reason>`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Close {
    pub reason: Reason,
    pub detail: String,
}

impl Close {
    pub fn new(reason: Reason, detail: impl Into<String>) -> Self {
        Close {
            reason,
            detail: detail.into(),
        }
    }

    /// A new caller refused because the revocations were last read `age_ms` ago,
    /// past `revocations_max_age_secs` ([`crate::upkeep::revocations_stale`]).
    pub fn revocations_stale(age_ms: u64) -> Self {
        let detail = format!(
            "the revocations were last read from the agent {} s ago, past revocations_max_age_secs: no new caller until it answers",
            age_ms / 1_000
        );
        Close::new(Reason::RevocationsStale, detail)
    }

    /// A flood's refusals: counted, not worth a log line each.
    pub fn is_flood(&self) -> bool {
        self.reason.is_flood()
    }
}

impl From<Refusal> for Close {
    fn from(refusal: Refusal) -> Self {
        Close::new(Reason::from(&refusal), refusal.to_string())
    }
}

/// What one call asks the driver to do.
#[derive(Debug, Default)]
pub struct Step {
    /// Plaintext for the local app (the connection manager, the router).
    pub to_app: Vec<u8>,
    /// Bytes for the peer.
    pub to_peer: Vec<u8>,
    pub ask: Option<Ask>,
    pub events: Vec<Event>,
    /// The connection ends: close it. Nothing more goes either way.
    pub close: Option<Close>,
}

#[cfg(test)]
mod testing {
    //! What the machines' tests share.

    use ring::rand::SecureRandom;
    use themis_core::identity::{Identity, MeshName};
    use themis_core::PeerId;
    use themis_trust::{MeshRoot, Revocation, Revocations, Signed, REVOCATION_LABEL};

    /// A mesh root of the test's own, and the revocations it signed.
    pub struct Root {
        key: Identity,
        pub root: MeshRoot,
        pub revoked: Revocations,
    }

    impl Root {
        pub fn new(mesh: &MeshName, rng: &dyn SecureRandom) -> Self {
            let key = Identity::generate(mesh.clone(), rng).unwrap();
            let root = MeshRoot {
                mesh: mesh.clone(),
                key: *key.public().public_key(),
            };
            Root {
                key,
                root,
                revoked: Revocations::new(),
            }
        }

        /// The root revokes `id`.
        pub fn revoke(&mut self, id: PeerId) {
            let revocation = Revocation {
                mesh: self.root.mesh.as_str().to_string(),
                id: id.0,
                issued_at: 1,
                reason: "test".into(),
            };
            let signed = Signed::sign(&self.key, REVOCATION_LABEL, &revocation);
            assert!(self.revoked.add(&self.root, &signed.encode()).unwrap());
        }
    }
}
