//! Prometheus metrics, served as text on a local port (`/metrics`).
//!
//! Operations are recorded as they complete. Counters that other layers keep (the
//! DHT node, the secure channel's server and client) are brought up to date just
//! before each scrape, so those layers stay free of any metrics library.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;
use themis_net::NetStats;

type Labels = Vec<(&'static str, String)>;

/// Counters the DHT node keeps, refreshed about once a second by the overlay for
/// metrics. (Defined here, not in the overlay, so that metrics import nothing of the
/// parts that report to them.)
#[derive(Debug, Clone, Default)]
pub struct Snapshot {
    /// The node's counters.
    pub stats: themis_dht::Stats,
    /// Object ids held.
    pub objects: usize,
    /// Values held over all objects.
    pub values: usize,
}

fn labels(pairs: &[(&'static str, &str)]) -> Labels {
    pairs.iter().map(|(k, v)| (*k, (*v).to_owned())).collect()
}

/// Every metric the agent exports.
pub struct Metrics {
    registry: Registry,
    operations: Family<Labels, Counter>,
    hops: Family<Labels, Histogram>,
    latency: Family<Labels, Histogram>,
    handshakes: Family<Labels, Counter>,
    requests: Family<Labels, Counter>,
    channel_failures: Family<Labels, Counter>,
    sessions: Family<Labels, Gauge>,
    joined: Gauge,
    objects: Gauge,
    values: Gauge,
    store_refreshes: Counter,
    dht_rejections: Family<Labels, Counter>,
    dht_timeouts: Counter,
    frames_refused: Family<Labels, Counter>,
    records_refused: Family<Labels, Counter>,
    api_refused: Family<Labels, Counter>,
    resolve_cache: Family<Labels, Counter>,
    resolve_cache_evictions: Counter,
    resolve_fresh_limited: Family<Labels, Counter>,
    resolve_lookups_limited: Family<Labels, Counter>,
    connections_limited: Family<Labels, Counter>,
    connections: Family<Labels, Gauge>,
    /// Listeners whose connection limits are reported, by name.
    listeners: Mutex<Vec<(&'static str, Arc<NetStats>)>>,
    revocations: Counter,
    signatures: Family<Labels, Counter>,
    sign_refused: Family<Labels, Counter>,
    log_size: Gauge,
    log_forks: Gauge,
    log_syncs: Family<Labels, Counter>,
    gossip_frames: Family<Labels, Counter>,
    gossip_bytes: Family<Labels, Counter>,
    /// Serialises scrapes, so two never add the same delta.
    sync: Mutex<()>,
}

/// Counters kept elsewhere, read at scrape time.
pub struct Sources<'a> {
    /// The DHT node's counters.
    pub dht: &'a Snapshot,
    /// Whether the node is in a ring.
    pub joined: bool,
    /// The agent-to-agent server.
    pub inbound: &'a NetStats,
    /// The agent-to-agent client.
    pub outbound: &'a NetStats,
    /// Pooled outbound sessions.
    pub outbound_sessions: usize,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// Registers every metric.
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("themis");
        let hops = Family::<Labels, Histogram>::new_with_constructor(
            (|| Histogram::new([0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 8.0, 10.0, 16.0, 32.0]))
                as fn() -> Histogram,
        );
        let latency = Family::<Labels, Histogram>::new_with_constructor(
            (|| Histogram::new(exponential_buckets(0.000_05, 2.0, 18))) as fn() -> Histogram,
        );
        let m = Metrics {
            operations: Family::default(),
            hops: hops.clone(),
            latency: latency.clone(),
            handshakes: Family::default(),
            requests: Family::default(),
            channel_failures: Family::default(),
            sessions: Family::default(),
            joined: Gauge::default(),
            objects: Gauge::default(),
            values: Gauge::default(),
            store_refreshes: Counter::default(),
            dht_rejections: Family::default(),
            dht_timeouts: Counter::default(),
            frames_refused: Family::default(),
            records_refused: Family::default(),
            api_refused: Family::default(),
            resolve_cache: Family::default(),
            resolve_cache_evictions: Counter::default(),
            resolve_fresh_limited: Family::default(),
            resolve_lookups_limited: Family::default(),
            connections_limited: Family::default(),
            connections: Family::default(),
            listeners: Mutex::default(),
            revocations: Counter::default(),
            signatures: Family::default(),
            sign_refused: Family::default(),
            log_size: Gauge::default(),
            log_forks: Gauge::default(),
            log_syncs: Family::default(),
            gossip_frames: Family::default(),
            gossip_bytes: Family::default(),
            sync: Mutex::new(()),
            registry: Registry::default(),
        };
        let r = &mut registry;
        r.register(
            "dht_operations",
            "DHT operations (find, store, resolve) by result",
            m.operations.clone(),
        );
        r.register(
            "dht_lookup_hops",
            "Remote lookup steps per successful find or resolve",
            hops,
        );
        r.register(
            "dht_operation_duration_seconds",
            "Time to complete a DHT operation",
            latency,
        );
        r.register(
            "handshakes",
            "Completed key agreements with other agents, by direction",
            m.handshakes.clone(),
        );
        r.register(
            "channel_requests",
            "Requests over the secure channel, by direction",
            m.requests.clone(),
        );
        r.register(
            "channel_failures",
            "Refused handshakes, records and failed requests, by direction and reason",
            m.channel_failures.clone(),
        );
        r.register(
            "sessions",
            "Open secure sessions with other agents, by direction",
            m.sessions.clone(),
        );
        r.register(
            "ring_joined",
            "1 when this node is in a ring",
            m.joined.clone(),
        );
        r.register(
            "dht_objects",
            "Object ids this node holds for the ring",
            m.objects.clone(),
        );
        r.register(
            "dht_values",
            "Values this node holds for the ring",
            m.values.clone(),
        );
        r.register(
            "dht_store_refreshes",
            "Owned objects re-stored: by the periodic republish, or at once when their holder left the membership",
            m.store_refreshes.clone(),
        );
        r.register(
            "dht_rejections",
            "DHT inputs the node refused, by reason",
            m.dht_rejections.clone(),
        );
        r.register(
            "dht_request_timeouts",
            "DHT requests that timed out (the peer is dropped from routing)",
            m.dht_timeouts.clone(),
        );
        r.register(
            "frames_refused",
            "Agent frames refused before reaching the DHT, by reason",
            m.frames_refused.clone(),
        );
        r.register(
            "registry_records_refused",
            "Instance records and revocations refused by verification (in resolution and at store), by reason",
            m.records_refused.clone(),
        );
        r.register(
            "api_refused",
            "Local API calls refused by the caller's kernel-attested identity, by reason",
            m.api_refused.clone(),
        );
        r.register(
            "revocations_learnt",
            "Root-signed revocations this node verified and added",
            m.revocations.clone(),
        );
        r.register(
            "handshake_signatures",
            "Handshake messages signed for local workloads' sidecars, by kind",
            m.signatures.clone(),
        );
        r.register(
            "handshake_sign_refused",
            "Signing requests refused (not a handshake message of the workload, malformed, unknown workload), by reason",
            m.sign_refused.clone(),
        );
        r.register(
            "resolve_cache",
            "Service resolutions answered from the cache (hit) or the DHT (miss)",
            m.resolve_cache.clone(),
        );
        r.register(
            "resolve_cache_evictions",
            "Services dropped from the full resolution cache (the least recently used, one at a time)",
            m.resolve_cache_evictions.clone(),
        );
        r.register(
            "resolve_fresh_limited",
            "Cache-skipping resolutions (?fresh=true) over the rate limit, by outcome (served_cached, refused)",
            m.resolve_fresh_limited.clone(),
        );
        r.register(
            "resolve_lookups_limited",
            "Resolutions missing the cache over their rate limit, by outcome (served_cached, refused)",
            m.resolve_lookups_limited.clone(),
        );
        r.register(
            "connections_limited",
            "Inbound connections refused or closed by a limit, by listener (agent, resolve) and reason",
            m.connections_limited.clone(),
        );
        r.register(
            "connections",
            "Inbound connections held now (admitted or not), by listener",
            m.connections.clone(),
        );
        r.register(
            "trust_log_size",
            "Leaves of the trust log this node holds (every statement the mesh root signed that it verified)",
            m.log_size.clone(),
        );
        r.register(
            "trust_log_forks",
            "Forks of the trust log seen: pairs of root-signed checkpoints that contradict each other (evidence in <state_dir>/log-forks); anything but 0 is an alarm",
            m.log_forks.clone(),
        );
        r.register(
            "trust_log_syncs",
            "Trust log exchanges with peers and the operator, by result (grew, consistent, behind, unreachable, fork, refused_<reason>)",
            m.log_syncs.clone(),
        );
        r.register(
            "gossip_sent_frames",
            "Gossip frames this agent sent (one-hop routing), by kind (request, answer)",
            m.gossip_frames.clone(),
        );
        r.register(
            "gossip_sent_bytes",
            "Bytes of the gossip frames this agent sent, before the secure channel's framing, by kind (request, answer): the membership's upkeep",
            m.gossip_bytes.clone(),
        );
        Metrics { registry, ..m }
    }

    /// The trust log's size and forks seen, after a change.
    pub fn trust_log(&self, size: u64, forks: usize) {
        self.log_size.set(size as i64);
        self.log_forks.set(forks as i64);
    }

    /// Counts one trust log exchange by its result.
    pub fn trust_log_sync(&self, result: &str) {
        self.log_syncs
            .get_or_create(&labels(&[("result", result)]))
            .inc();
    }

    /// Counts a gossip frame sent, `kind` `request` or `answer`, of `bytes`.
    pub fn gossip_sent(&self, kind: &str, bytes: usize) {
        let kind = labels(&[("kind", kind)]);
        self.gossip_frames.get_or_create(&kind).inc();
        self.gossip_bytes.get_or_create(&kind).inc_by(bytes as u64);
    }

    /// How many trust log exchanges ended with `result`.
    pub fn trust_log_syncs(&self, result: &str) -> u64 {
        self.log_syncs
            .get_or_create(&labels(&[("result", result)]))
            .get()
    }

    /// Reports the connection limits of a listener (`agent`, `resolve`) kept in `stats`.
    pub fn listener(&self, name: &'static str, stats: Arc<NetStats>) {
        self.listeners
            .lock()
            .expect("never poisoned")
            .push((name, stats));
    }

    /// Counts a service dropped from the full resolution cache.
    pub fn resolve_cache_evicted(&self) {
        self.resolve_cache_evictions.inc();
    }

    /// Counts a fresh resolution over the rate limit.
    pub fn resolve_fresh_limited(&self, outcome: &'static str) {
        self.resolve_fresh_limited
            .get_or_create(&labels(&[("outcome", outcome)]))
            .inc();
    }

    /// Counts a missing-the-cache resolution over the rate limit.
    pub fn resolve_lookups_limited(&self, outcome: &'static str) {
        self.resolve_lookups_limited
            .get_or_create(&labels(&[("outcome", outcome)]))
            .inc();
    }

    /// Records a completed DHT operation; `result` is `ok` or the error's reason.
    pub fn operation(
        &self,
        op: &'static str,
        result: &'static str,
        hops: Option<u32>,
        took: Duration,
    ) {
        self.operations
            .get_or_create(&labels(&[("op", op), ("result", result)]))
            .inc();
        let op = labels(&[("op", op)]);
        if let Some(hops) = hops {
            self.hops.get_or_create(&op).observe(f64::from(hops));
        }
        self.latency.get_or_create(&op).observe(took.as_secs_f64());
    }

    /// Counts an agent frame refused before reaching the DHT.
    pub fn frame_refused(&self, reason: &str) {
        self.frames_refused
            .get_or_create(&labels(&[("reason", reason)]))
            .inc();
    }

    /// How many frames were refused for `reason`.
    #[cfg(test)]
    pub fn frames_refused(&self, reason: &str) -> u64 {
        self.frames_refused
            .get_or_create(&labels(&[("reason", reason)]))
            .get()
    }

    /// Counts a stored record that failed verification.
    pub fn record_refused(&self, reason: &'static str) {
        self.records_refused
            .get_or_create(&labels(&[("reason", reason)]))
            .inc();
    }

    /// Counts a local API call refused by who the caller is.
    pub fn api_refused(&self, reason: &'static str) {
        self.api_refused
            .get_or_create(&labels(&[("reason", reason)]))
            .inc();
    }

    /// Counts a new revocation.
    pub fn revocation_learnt(&self) {
        self.revocations.inc();
    }

    /// Counts a handshake message signed for a local workload.
    pub fn signed(&self, kind: &'static str) {
        self.signatures
            .get_or_create(&labels(&[("kind", kind)]))
            .inc();
    }

    /// Counts a refused signing request.
    pub fn sign_refused(&self, reason: &'static str) {
        self.sign_refused
            .get_or_create(&labels(&[("reason", reason)]))
            .inc();
    }

    /// Counts a resolution served from the cache or not.
    pub fn resolve_cache(&self, hit: bool) {
        let result = if hit { "hit" } else { "miss" };
        self.resolve_cache
            .get_or_create(&labels(&[("result", result)]))
            .inc();
    }

    /// The text exposition, after bringing the counters kept elsewhere up to date.
    pub fn render(&self, sources: Sources<'_>) -> String {
        let _one_at_a_time = self.sync.lock().expect("never poisoned");
        let stats = &sources.dht.stats;
        catch_up(&self.store_refreshes, stats.republished);
        catch_up(&self.dht_timeouts, stats.timeouts);
        for (rejection, &n) in &stats.rejections {
            let reason = format!("{rejection:?}");
            catch_up(
                &self.dht_rejections.get_or_create(&vec![("reason", reason)]),
                n,
            );
        }
        self.joined.set(i64::from(sources.joined));
        self.objects.set(gauge(sources.dht.objects as u64));
        self.values.set(gauge(sources.dht.values as u64));
        for (direction, net) in [("inbound", sources.inbound), ("outbound", sources.outbound)] {
            let d = labels(&[("direction", direction)]);
            catch_up(&self.handshakes.get_or_create(&d), net.handshakes());
            catch_up(&self.requests.get_or_create(&d), net.requests());
            for (reason, n) in net.failures() {
                let l = labels(&[("direction", direction), ("reason", reason)]);
                catch_up(&self.channel_failures.get_or_create(&l), n);
            }
        }
        let sessions = |d| self.sessions.get_or_create(&labels(&[("direction", d)]));
        sessions("inbound").set(gauge(sources.inbound.open_connections()));
        sessions("outbound").set(gauge(sources.outbound_sessions as u64));
        for (listener, net) in self.listeners.lock().expect("never poisoned").iter() {
            for (reason, n) in net.limits() {
                let l = labels(&[("listener", listener), ("reason", reason)]);
                catch_up(&self.connections_limited.get_or_create(&l), n);
            }
            self.connections
                .get_or_create(&labels(&[("listener", listener)]))
                .set(gauge(net.connections()));
        }
        let mut text = String::new();
        encode(&mut text, &self.registry).expect("writing to a String cannot fail");
        text
    }
}

/// Raises a counter to a total counted elsewhere.
fn catch_up(counter: &Counter, total: u64) {
    counter.inc_by(total.saturating_sub(counter.get()));
}

fn gauge(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}
