//! The unit tests' agent answers, built as a real agent builds them.

use themis_contracts::api;
use themis_core::delegation::Delegation;
use themis_core::Identity;

/// The tests' clock: a fixed Unix ms.
pub const NOW: u64 = 1_800_000_000_000;
/// An hour in ms: the delegations' life.
pub const HOUR: u64 = 3_600_000;

/// `workload`'s public identity as the agent names it: workload `check` of mesh
/// `demo`.
pub fn public_identity(workload: &Identity) -> api::PublicIdentity {
    api::PublicIdentity {
        workload: "check".parse().unwrap(),
        mesh: "demo".into(),
        id: workload.printable_id(),
        public_key: hex::encode(workload.public_key()),
    }
}

/// The agent's answer to a delegation request for `key`: `workload`'s key delegates it
/// from [`NOW`] for an [`HOUR`], with `endorsement` (hex in the answer).
pub fn delegated(workload: &Identity, key: [u8; 32], endorsement: Option<&[u8]>) -> api::Delegated {
    let d = Delegation::issue(workload, key, NOW, HOUR);
    api::Delegated {
        identity: public_identity(workload),
        delegation: hex::encode(d.encode()),
        not_after_ms: d.not_after_ms,
        renew_at_ms: d.renew_at_ms(),
        service: None,
        endorsement: endorsement.map(hex::encode),
    }
}
