//! Counters for the transport sockets, under the Wasm filter's names
//! (`themis.seal.*`, `themis.inbound.*`). Envoy 1.40's transport-socket ABI has no
//! metrics, so the counters are defined by the module's HTTP filter configuration
//! (every native sidecar has one, on its outbound listener) and the sockets add to
//! them through it: Envoy's counters are atomic, so any worker may.
//!
//! The gauge `identity` is 1 once the module holds a delegated key (one per Envoy
//! process: the key is shared by its workers, where the Wasm filter's counts one per
//! worker), on whichever configuration's metrics are installed.

use std::sync::{Arc, RwLock};

use themis_sidecar::reason::Reason;

/// What the socket roles count besides refusals (`handshakes`: messages 1 sent,
/// seal only; `allowed`, `known_good_handshakes` and `replay_cache_evicted` — a live
/// Hello forgotten because the replay cache was full —, inbound only;
/// `runtime_restarts`: a runtime thread panicked and was started again, counted on
/// both roles, as the process-wide `identity` gauge is).
const EVENTS: [&str; 7] = [
    "connections",
    "handshakes",
    "established",
    "allowed",
    "known_good_handshakes",
    "replay_cache_evicted",
    "runtime_restarts",
];

/// The roles whose sockets count.
const ROLES: [&str; 2] = ["seal", "inbound"];

/// The gauges the socket roles keep: open connections, and whether the module holds
/// its delegated key.
const GAUGES: [&str; 2] = ["active", "identity"];

/// Every gauge name the sockets use.
pub fn gauge_names() -> Vec<String> {
    ROLES
        .iter()
        .flat_map(|role| GAUGES.iter().map(move |g| format!("themis.{role}.{g}")))
        .collect()
}

/// Every counter name the sockets use.
pub fn counter_names() -> Vec<String> {
    ROLES
        .iter()
        .flat_map(|role| {
            let events = EVENTS.iter().map(move |e| format!("themis.{role}.{e}"));
            // Every reason either machine or this module refuses for: one table, so
            // none can be given without a counter to count it.
            let refusals = Reason::ALL
                .iter()
                .map(move |r| format!("themis.{role}.{}", r.counter()));
            events.chain(refusals)
        })
        .collect()
}

/// One change to a metric, by its full name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Change<'a> {
    /// Add one to a counter.
    Count(&'a str),
    /// Add to (or, negative, take from) a gauge.
    Gauge(&'a str, i64),
}

/// Applies changes to Envoy's metrics.
pub type Sink = Arc<dyn Fn(Change<'_>) + Send + Sync>;

/// The installed sink and who installed it, and whether the module holds its key.
struct Installed {
    sink: Option<(usize, Sink)>,
    identity: bool,
}

static SINK: RwLock<Installed> = RwLock::new(Installed {
    sink: None,
    identity: false,
});

impl Installed {
    /// Adds `delta` to the `identity` gauges through the sink, if the key is held.
    fn identity_gauges(&self, delta: i64) {
        if let Some((_, sink)) = self.sink.as_ref().filter(|_| self.identity) {
            for role in ROLES {
                sink(Change::Gauge(&format!("themis.{role}.identity"), delta));
            }
        }
    }
}

/// Makes `sink` (owned by `owner`, a configuration's address) the one counters go to.
/// The `identity` gauges move with it: taken back from the sink it replaces (Envoy
/// creates a new configuration before destroying the old), given to the new one.
pub fn install(owner: usize, sink: Sink) {
    if let Ok(mut slot) = SINK.write() {
        slot.identity_gauges(-1);
        slot.sink = Some((owner, sink));
        slot.identity_gauges(1);
    }
}

/// `owner` is going away: counting stops until another configuration installs a
/// sink. Waits for counts in flight (they hold the read lock).
pub fn uninstall(owner: usize) {
    if let Ok(mut slot) = SINK.write() {
        if slot.sink.as_ref().is_some_and(|(o, _)| *o == owner) {
            slot.identity_gauges(-1);
            slot.sink = None;
        }
    }
}

/// The module holds a delegated key from now on (renewals change nothing).
pub fn identity_held() {
    if let Ok(mut slot) = SINK.write() {
        if !std::mem::replace(&mut slot.identity, true) {
            slot.identity_gauges(1);
        }
    }
}

/// Counts `event` for `role` (`seal` or `inbound`).
/// A runtime thread was restarted after a panic (an alarm, on both roles' counters).
pub fn count_runtime_restart() {
    for role in ROLES {
        count(role, "runtime_restarts");
    }
}

pub fn count(role: &str, event: &str) {
    apply(|sink| sink(Change::Count(&format!("themis.{role}.{event}"))));
}

/// Adds `delta` to `role`'s gauge `name`; false if no sink took it (then the caller
/// must not take it back later: a gauge must not go below what it was given).
pub fn gauge(role: &str, name: &str, delta: i64) -> bool {
    apply(|sink| sink(Change::Gauge(&format!("themis.{role}.{name}"), delta)))
}

/// Runs `f` on the installed sink, under the read lock; false if there is none.
fn apply(f: impl FnOnce(&Sink)) -> bool {
    match SINK.read() {
        Ok(slot) => slot.sink.as_ref().map(|(_, sink)| f(sink)).is_some(),
        Err(_) => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    #[test]
    fn changes_reach_the_installed_sink_until_its_owner_uninstalls_it() {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let into = seen.clone();
        let sink: Sink = Arc::new(move |change| {
            let seen = match change {
                Change::Count(name) => name.to_owned(),
                Change::Gauge(name, delta) => format!("{name} {delta:+}"),
            };
            into.lock().unwrap().push(seen)
        });
        install(1, sink.clone());
        count("seal", "established");
        assert!(gauge("inbound", "active", 1));
        uninstall(2); // not the owner: still installed
        count("inbound", "refused.policy");
        uninstall(1);
        count("seal", "connections");
        assert!(!gauge("inbound", "active", -1), "no sink took it");
        assert_eq!(
            *seen.lock().unwrap(),
            [
                "themis.seal.established",
                "themis.inbound.active +1",
                "themis.inbound.refused.policy"
            ]
        );
        assert_eq!(
            gauge_names(),
            [
                "themis.seal.active",
                "themis.seal.identity",
                "themis.inbound.active",
                "themis.inbound.identity"
            ]
        );

        // The key, held before any sink is installed: the first sink gets the gauges;
        // a second configuration takes them over; the last one going takes them back.
        seen.lock().unwrap().clear();
        identity_held();
        install(3, sink.clone());
        identity_held(); // a renewal
        install(4, sink);
        uninstall(3); // replaced already: nothing
        uninstall(4);
        assert_eq!(
            *seen.lock().unwrap(),
            [
                "themis.seal.identity +1",
                "themis.inbound.identity +1",
                "themis.seal.identity -1",
                "themis.inbound.identity -1",
                "themis.seal.identity +1",
                "themis.inbound.identity +1",
                "themis.seal.identity -1",
                "themis.inbound.identity -1",
            ]
        );
        let names = counter_names();
        assert!(names.contains(&"themis.inbound.refused.policy".to_string()));
        assert_eq!(names.len(), 2 * (EVENTS.len() + Reason::ALL.len()));
    }
}
