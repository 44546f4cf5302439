//! What every connection of one workload's sidecar shares: its credential (a
//! delegated key with the agent's delegation and the workload's endorsement), the
//! mesh's revocations and the verified resolutions of the services its clusters
//! reach. A transport socket cannot wait on a call, so two threads per workload keep
//! them fresh from the local agent and connections read an immutable snapshot. When
//! to ask the agent what is [`themis_sidecar::upkeep`]'s to say, as in the Wasm filter:
//! one thread drives its delegation lane (and the resolutions), the other its
//! revocations lane (a long poll, so a new revocation is in force as soon as the agent
//! has it).

use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, RwLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use ring::rand::SystemRandom;
use themis_agent_client::{Client, Method};
use themis_contracts::paths;
use themis_core::delegation::Credential;
use themis_sidecar::agent::{endorsed, parse_instances, Instance};
use themis_sidecar::config::{Config, Transport};
use themis_sidecar::route::kept_for;
use themis_sidecar::upkeep::{self, Lane, Learned, Upkeep};

use crate::metrics;
use themis_trust::{MeshRoot, Revocations, Verifier};

/// Takes the instances `revoked` withdraws out of `resolutions`; the rest stays until
/// the next resolution (no call to the agent at the same moment from every worker of
/// the mesh). A service left with none is dropped, to be resolved again at once;
/// `true` if one was.
fn withdraw(
    resolutions: &mut HashMap<String, Vec<Instance>>,
    root: &MeshRoot,
    revoked: &Revocations,
) -> bool {
    let before = resolutions.len();
    resolutions.retain(|_, instances| {
        instances.retain(|i| !i.is_revoked(root, revoked));
        !instances.is_empty()
    });
    resolutions.len() < before
}

/// Unix milliseconds.
pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// What connections read: replaced whole, never changed in place.
#[derive(Default)]
pub struct Snapshot {
    /// `None` until the agent delegated a key.
    pub credential: Option<Arc<Credential>>,
    /// Shared by every snapshot until a revocation arrives: a snapshot published for
    /// a renewal or a resolution does not copy thousands of them.
    pub revocations: Arc<Revocations>,
    /// Bumped whenever the revocations change: established connections re-check
    /// their peer when they see a new value.
    pub revocation_generation: u64,
    /// Verified instances per service this sidecar's clusters reach.
    pub resolutions: HashMap<String, Vec<Instance>>,
}

/// The process's runtimes, by agent socket and workload.
type Runtimes = HashMap<(String, String), Arc<Runtime>>;

/// Runs `job` (a thread's endless loop) on a thread named `name`, and runs it again
/// whenever it panics: the credential's renewal and the revocations must never stop
/// silently. Each restart is an alarm: a critical log line and the
/// `runtime_restarts` counter; a second apart, so a job that always panics cannot
/// spin.
fn supervised(name: String, job: impl Fn() + Send + 'static) -> Result<(), String> {
    let thread = name.clone();
    std::thread::Builder::new()
        .name(thread)
        .spawn(move || loop {
            let Err(payload) = std::panic::catch_unwind(std::panic::AssertUnwindSafe(&job)) else {
                return;
            };
            crate::ffi::log(
                5,
                &format!(
                    "themis native: the runtime thread {name} panicked ({}); restarting it",
                    crate::ffi::panic_message(&*payload)
                ),
            );
            std::thread::sleep(Duration::from_secs(1));
            // Counted as it restarts (a thread that panicked at once did so before the
            // configuration installed the counters).
            metrics::count_runtime_restart();
        })
        .map(drop)
        .map_err(|e| e.to_string())
}

/// One workload's link to its agent.
pub struct Runtime {
    pub root: MeshRoot,
    workload: String,
    agent: Client,
    timeout: Duration,
    resolve_ttl: Duration,
    /// When to ask the agent for a delegation and for the revocations.
    upkeep: Mutex<Upkeep>,
    snapshot: RwLock<Arc<Snapshot>>,
    wanted: Mutex<BTreeSet<String>>,
    /// A connection found no endorsed instance where it connected: resolve again
    /// now rather than at the end of the TTL.
    stale: AtomicBool,
    /// Since when the revocations held are fresh (Unix ms; 0: not asked yet), as
    /// the upkeep says after each call: connections read it without its lock.
    revocations_fresh_since: AtomicU64,
}

impl Runtime {
    /// The runtime of `config`'s workload (one per agent socket and workload in the
    /// process), started on first use.
    pub fn of(config: &Config) -> Result<Arc<Runtime>, String> {
        static ALL: OnceLock<Mutex<Runtimes>> = OnceLock::new();
        let socket = config
            .agent_socket
            .clone()
            .ok_or("agent_socket: the native runtime reaches the agent by its Unix socket")?;
        let key = (socket.clone(), config.workload.clone());
        let mut all = ALL
            .get_or_init(Default::default)
            .lock()
            .map_err(|e| e.to_string())?;
        if let Some(runtime) = all.get(&key) {
            if runtime.root != config.mesh_root {
                return Err("one workload, two mesh roots in one Envoy".into());
            }
            runtime.takes_role(config);
            return Ok(runtime.clone());
        }
        let runtime = Arc::new(Runtime {
            root: config.mesh_root.clone(),
            workload: config.workload.clone(),
            agent: Client::unix(&socket).timeout(config.timeout),
            timeout: config.timeout,
            resolve_ttl: config.resolve_ttl,
            // No identity lane: a delegation answer carries the identity, and a
            // transport socket cannot have the agent sign without a delegated key.
            upkeep: Mutex::new(Upkeep::new(config, &[Lane::Delegation, Lane::Revocations])),
            snapshot: RwLock::new(Arc::new(Snapshot::default())),
            wanted: Mutex::new(BTreeSet::new()),
            stale: AtomicBool::new(false),
            revocations_fresh_since: AtomicU64::new(0),
        });
        runtime.takes_role(config);
        let worker = runtime.clone();
        supervised(format!("themis-{}", config.workload), move || {
            worker.clone().run()
        })?;
        let watcher = runtime.clone();
        supervised(
            format!("themis-{}-revocations", config.workload),
            move || watcher.clone().watch_revocations(),
        )?;
        all.insert(key, runtime.clone());
        Ok(runtime)
    }

    /// A role's configuration joins the runtime: the inbound one's
    /// `revocations_max_age` is what the feed's alarm tells of (only it refuses).
    fn takes_role(&self, config: &Config) {
        if config.role == themis_sidecar::config::Role::Inbound {
            self.upkeep()
                .set_revocations_max_age(config.revocations_max_age);
        }
    }

    /// The current snapshot (an `Arc` clone: cheap on every connection).
    pub fn snapshot(&self) -> Arc<Snapshot> {
        self.snapshot
            .read()
            .map(|s| s.clone())
            .unwrap_or_else(|e| e.into_inner().clone())
    }

    /// Since when the revocations held are fresh (Unix ms), if they were asked for
    /// ([`themis_sidecar::upkeep::revocations_stale`] decides by it).
    pub fn revocations_fresh_since(&self) -> Option<u64> {
        Some(self.revocations_fresh_since.load(Ordering::Relaxed)).filter(|&at| at > 0)
    }

    /// Keeps `service` resolved from now on (a sealing cluster reaches it).
    pub fn want(&self, service: &str) {
        if let Ok(mut wanted) = self.wanted.lock() {
            wanted.insert(service.to_owned());
        }
    }

    /// True if `service` is kept resolved (a sealing cluster of this Envoy reaches it).
    pub fn wants(&self, service: &str) -> bool {
        self.wanted.lock().is_ok_and(|w| w.contains(service))
    }

    /// Asks for the wanted services to be resolved again on the next tick.
    pub fn refresh(&self) {
        self.stale.store(true, Ordering::Relaxed);
    }

    /// Replaces the snapshot with a changed copy, under the write lock: two threads
    /// publish (the revocations' long poll and the rest), and neither may lose the
    /// other's change.
    fn publish(&self, change: impl FnOnce(&mut Snapshot)) {
        let mut slot = self.snapshot.write().unwrap_or_else(|e| e.into_inner());
        let current = &**slot;
        let mut next = Snapshot {
            credential: current.credential.clone(),
            revocations: current.revocations.clone(),
            revocation_generation: current.revocation_generation,
            resolutions: current.resolutions.clone(),
        };
        change(&mut next);
        *slot = Arc::new(next);
    }

    fn upkeep(&self) -> std::sync::MutexGuard<'_, Upkeep> {
        self.upkeep.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Makes `lane`'s call if it is due (with the upkeep let go meanwhile) and acts on
    /// what the answer taught; returns when the lane wants to ask again.
    fn keep_up(&self, lane: Lane, rng: &SystemRandom) -> Option<u64> {
        let request = self.upkeep().poll_request(lane, now_ms(), rng);
        if let Some(request) = request {
            let (method, body) = match &request.json {
                Some(json) => (Method::POST, json.as_slice()),
                None => (Method::GET, &b""[..]),
            };
            let answer = self.agent.call_raw_within(
                method,
                &request.path,
                body,
                "application/json",
                request.timeout,
            );
            let (status, body) = match answer {
                Ok((status, body)) => (Some(status.as_u16()), body),
                Err(e) => (None, e.to_string().into_bytes()),
            };
            let learned = self.upkeep().handle_answer(lane, status, &body, now_ms());
            self.take_in(learned);
        }
        self.upkeep().poll_timeout(lane)
    }

    /// Acts on what the upkeep learned.
    fn take_in(&self, learned: Learned) {
        match learned {
            Learned::Nothing | Learned::Identity(_) => {}
            Learned::Credential {
                credential,
                renew_at,
                news,
            } => {
                let line = upkeep::credential_line(&self.workload, &credential, renew_at);
                self.publish(|s| s.credential = Some(Arc::new(*credential)));
                crate::metrics::identity_held();
                // Info when it starts or its endorsement comes or goes; debug else.
                crate::ffi::log(if news { 2 } else { 1 }, &format!("themis native: {line}"));
            }
            Learned::NoCredential { refused, why } => {
                if refused {
                    // The workload revoked, or this proxy no longer its owner: the
                    // key delegated before stops speaking for the workload.
                    self.publish(|s| s.credential = None);
                }
                crate::ffi::log(3, &format!("themis native: {why}"));
            }
            Learned::Revocations(list) => {
                let (read, proven) = (list.revocations.len(), list.proven);
                let mut emptied = false;
                let mut held = 0;
                self.publish(|s| {
                    // Merged: a revocation held is never taken back.
                    Arc::make_mut(&mut s.revocations).merge(list.revocations);
                    held = s.revocations.len();
                    s.revocation_generation += 1;
                    emptied = withdraw(&mut s.resolutions, &self.root, &s.revocations);
                });
                crate::ffi::log(
                    2,
                    &format!(
                        "themis native: {held} revocations in force ({read} read, {proven} of them proven by the trust log's checkpoint)"
                    ),
                );
                if emptied {
                    self.refresh();
                }
            }
            Learned::Failed(why) => crate::ffi::log(3, &format!("themis native: {why}")),
        }
    }

    /// The revocations' thread: asks when the upkeep says (at once after a long poll
    /// the agent held).
    fn watch_revocations(self: Arc<Self>) {
        let rng = SystemRandom::new();
        loop {
            let at = self.keep_up(Lane::Revocations, &rng);
            let (since, alarm) = {
                let mut upkeep = self.upkeep();
                (
                    upkeep.revocations_fresh_since(),
                    upkeep.revocations_alarm(now_ms()),
                )
            };
            self.revocations_fresh_since
                .store(since.unwrap_or(0), Ordering::Relaxed);
            if let Some(alarm) = alarm {
                // Warning while stale, error once closed, info when back.
                let level = match alarm.feed {
                    upkeep::Feed::Fresh => 2,
                    upkeep::Feed::Stale => 3,
                    upkeep::Feed::Closed => 4,
                };
                crate::ffi::log(level, &format!("themis native: {alarm}"));
            }
            let wait = at.map_or(1_000, |at| at.saturating_sub(now_ms()));
            std::thread::sleep(Duration::from_millis(wait));
        }
    }

    /// The thread: renews the credential when the upkeep says and re-resolves the
    /// wanted services as `route::kept_for` says (an empty resolution soon, so an
    /// instance that registers is found); failures are logged and retried a second
    /// later.
    fn run(self: Arc<Self>) {
        let rng = SystemRandom::new();
        let mut resolve_at = 0u64;
        let mut resolved: BTreeSet<String> = BTreeSet::new();
        loop {
            #[cfg(feature = "fault-injection")]
            crate::faults::maybe_panic(crate::faults::Point::Runtime);
            self.keep_up(Lane::Delegation, &rng);
            let now = now_ms();
            let wanted = self.wanted.lock().map(|w| w.clone()).unwrap_or_default();
            let stale = self.stale.swap(false, Ordering::Relaxed);
            if now >= resolve_at || wanted != resolved || stale {
                let mut kept = self.resolve_ttl;
                for service in &wanted {
                    match self.resolve(service) {
                        Ok(empty) => kept = kept.min(kept_for(self.resolve_ttl, empty)),
                        Err(e) => {
                            crate::ffi::log(3, &format!("themis native: resolving {service}: {e}"));
                            kept = kept.min(Duration::from_secs(1));
                        }
                    }
                }
                resolve_at = now + kept.as_millis() as u64;
                resolved = wanted;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Resolves `service` again; `true` if it has no endorsed instance.
    fn resolve(&self, service: &str) -> Result<bool, String> {
        let body = self.get(&paths::resolve(service, false))?;
        let snapshot = self.snapshot();
        let trust = Verifier {
            root: &self.root,
            now_ms: now_ms(),
            revoked: &snapshot.revocations,
        };
        let results = parse_instances(&body, service, &trust).map_err(|e| e.to_string())?;
        // Every transport this module speaks: each outbound filter's pick keeps to
        // its own (`Outbound::on_request`).
        let (good, bad) = endorsed(
            results,
            &[Transport::Tls, Transport::Themis],
            &self.root.mesh,
        );
        for e in bad {
            crate::ffi::log(
                3,
                &format!("themis native: an instance of {service} refused: {e}"),
            );
        }
        if snapshot.resolutions.get(service) != Some(&good) {
            let at: Vec<String> = good
                .iter()
                .map(|i| format!("{} at {}", i.id.printable(&self.root.mesh), i.endpoint))
                .collect();
            crate::ffi::log(
                2,
                &format!("themis native: {service} resolves to [{}]", at.join(", ")),
            );
            self.publish(|s| {
                // Checked against the revocations of the snapshot read above; the
                // revocations' thread may have published newer ones since.
                let live = good
                    .into_iter()
                    .filter(|i| !i.is_revoked(&self.root, &s.revocations));
                s.resolutions.insert(service.to_owned(), live.collect());
            });
        }
        Ok(self
            .snapshot()
            .resolutions
            .get(service)
            .is_none_or(Vec::is_empty))
    }

    /// A GET to the agent over its Unix socket: the body of a 2xx answer.
    fn get(&self, path: &str) -> Result<Vec<u8>, String> {
        self.agent
            .call_raw_within(Method::GET, path, b"", "application/json", self.timeout)
            .and_then(|(status, body)| themis_agent_client::success(status, body))
            .map_err(|e| format!("GET {path}: {e}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_revocation_withdraws_what_rests_on_the_key_and_drops_emptied_services() {
        use themis_core::{Identity, MeshName};
        use themis_trust::{Revocation, Signed, REVOCATION_LABEL};
        let mesh = MeshName::new("demo").unwrap();
        let rng = SystemRandom::new();
        let root_key = Identity::generate(mesh.clone(), &rng).unwrap();
        let node = Identity::generate(mesh.clone(), &rng).unwrap();
        let root = MeshRoot {
            mesh: mesh.clone(),
            key: *root_key.public_key(),
        };
        let instance = |n: u8, endorser: [u8; 32]| Instance {
            id: themis_core::PeerId([n; 32]),
            endpoint: format!("127.0.0.{n}:15006").parse().unwrap(),
            metadata: Default::default(),
            vouched_by: vec![endorser],
        };
        let mut resolutions = HashMap::from([
            (
                "check".to_owned(),
                vec![instance(1, *node.public_key()), instance(2, [7; 32])],
            ),
            ("audit".to_owned(), vec![instance(3, *node.public_key())]),
        ]);
        let mut revoked = Revocations::new();
        let revocation = Signed::sign(
            &root_key,
            REVOCATION_LABEL,
            &Revocation {
                mesh: "demo".into(),
                id: node.id().0,
                issued_at: 1,
                reason: String::new(),
            },
        );
        revoked.add(&root, &revocation.encode()).unwrap();
        // The node's revocation: check keeps its other instance, audit is dropped.
        assert!(withdraw(&mut resolutions, &root, &revoked));
        assert_eq!(resolutions["check"], vec![instance(2, [7; 32])]);
        assert!(!resolutions.contains_key("audit"));
        // Nothing more rests on it: nothing else goes.
        assert!(!withdraw(&mut resolutions, &root, &revoked));
        assert_eq!(resolutions.len(), 1);
    }
}
