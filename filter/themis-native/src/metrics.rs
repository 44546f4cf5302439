//! Counters for the transport sockets, under the Wasm filter's names
//! (`themis.seal.*`, `themis.inbound.*`). Envoy 1.40's transport-socket ABI has no
//! metrics, so the counters are defined by the module's HTTP filter configuration
//! (every native sidecar has one, on its outbound listener) and the sockets add to
//! them through it: Envoy's counters are atomic, so any worker may.

use std::sync::{Arc, RwLock};

/// Every refusal reason a socket can give (`refused.<reason>`): the stream's
/// (`themis_core::stream::Refusal::reason`), the policy's and the module's own.
pub const REFUSALS: [&str; 19] = [
    "malformed",
    "stale",
    "replay",
    "handshake",
    "tampered",
    "out_of_turn",
    "meta",
    "preface",
    "policy",
    "no_policy",
    "rate_limited",
    "revoked",
    "keyless",
    "address",
    "io",
    "unresolved",
    "not_endorsed",
    "ambiguous",
    "busy",
];

/// What the socket roles count besides refusals (`allowed` and
/// `known_good_handshakes`, inbound only).
const EVENTS: [&str; 4] = [
    "connections",
    "established",
    "allowed",
    "known_good_handshakes",
];

/// The roles whose sockets count.
const ROLES: [&str; 2] = ["seal", "inbound"];

/// Every counter name the sockets use.
pub fn counter_names() -> Vec<String> {
    ROLES
        .iter()
        .flat_map(|role| {
            let events = EVENTS.iter().map(move |e| format!("themis.{role}.{e}"));
            let refusals = REFUSALS
                .iter()
                .map(move |r| format!("themis.{role}.refused.{r}"));
            events.chain(refusals)
        })
        .collect()
}

/// Adds one to the counter named.
pub type Sink = Arc<dyn Fn(&str) + Send + Sync>;

/// The installed sink and who installed it.
static SINK: RwLock<Option<(usize, Sink)>> = RwLock::new(None);

/// Makes `sink` (owned by `owner`, a configuration's address) the one counters go to.
pub fn install(owner: usize, sink: Sink) {
    if let Ok(mut slot) = SINK.write() {
        *slot = Some((owner, sink));
    }
}

/// `owner` is going away: counting stops until another configuration installs a
/// sink. Waits for counts in flight (they hold the read lock).
pub fn uninstall(owner: usize) {
    if let Ok(mut slot) = SINK.write() {
        if slot.as_ref().is_some_and(|(o, _)| *o == owner) {
            *slot = None;
        }
    }
}

/// Counts `event` for `role` (`seal` or `inbound`).
pub fn count(role: &str, event: &str) {
    if let Ok(slot) = SINK.read() {
        if let Some((_, sink)) = slot.as_ref() {
            sink(&format!("themis.{role}.{event}"));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    #[test]
    fn counts_reach_the_installed_sink_until_its_owner_uninstalls_it() {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let into = seen.clone();
        install(
            1,
            Arc::new(move |name| into.lock().unwrap().push(name.to_owned())),
        );
        count("seal", "established");
        uninstall(2); // not the owner: still installed
        count("inbound", "refused.policy");
        uninstall(1);
        count("seal", "connections");
        assert_eq!(
            *seen.lock().unwrap(),
            ["themis.seal.established", "themis.inbound.refused.policy"]
        );
        let names = counter_names();
        assert!(names.contains(&"themis.inbound.refused.policy".to_string()));
        assert_eq!(names.len(), 2 * (EVENTS.len() + REFUSALS.len()));
    }
}
