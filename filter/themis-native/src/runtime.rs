//! What every connection of one workload's sidecar shares: its credential (a
//! delegated key with the agent's delegation and the workload's endorsement), the
//! mesh's revocations and the verified resolutions of the services its clusters
//! reach. A transport socket cannot wait on a call, so two threads per workload keep
//! them fresh from the local agent (one long-polls the revocations, so a new one is
//! in force as soon as the agent has it) and connections read an immutable snapshot.

use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock, RwLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use ring::rand::SystemRandom;
use themis_agent_client::{Client, Method};
use themis_contracts::{api, paths};
use themis_core::delegation::{Credential, DelegatedKey};
use themis_sidecar::agent::{
    endorsed, parse_instances, parse_new_revocations, Instance, NextPoll, REVOCATIONS_WAIT_MS,
};
use themis_sidecar::config::Config;

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
    pub revocations: Revocations,
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
    revocation_poll: Duration,
    resolve_ttl: Duration,
    snapshot: RwLock<Arc<Snapshot>>,
    wanted: Mutex<BTreeSet<String>>,
    /// A connection found no endorsed instance where it connected: resolve again
    /// now rather than at the end of the TTL.
    stale: AtomicBool,
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
            return Ok(runtime.clone());
        }
        let runtime = Arc::new(Runtime {
            root: config.mesh_root.clone(),
            workload: config.workload.clone(),
            agent: Client::unix(&socket).timeout(config.timeout),
            timeout: config.timeout,
            revocation_poll: config.revocation_poll,
            resolve_ttl: config.resolve_ttl,
            snapshot: RwLock::new(Arc::new(Snapshot::default())),
            wanted: Mutex::new(BTreeSet::new()),
            stale: AtomicBool::new(false),
        });
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

    /// The current snapshot (an `Arc` clone: cheap on every connection).
    pub fn snapshot(&self) -> Arc<Snapshot> {
        self.snapshot
            .read()
            .map(|s| s.clone())
            .unwrap_or_else(|e| e.into_inner().clone())
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

    /// The revocations' thread: a long poll the agent answers as soon as it learns a
    /// revocation, asked again at once (an agent that does not hold long polls is
    /// asked every `revocation_poll`); a failure is logged and retried a second later.
    fn watch_revocations(self: Arc<Self>) {
        let mut next = None;
        loop {
            let asked = std::time::Instant::now();
            match self.poll_revocations(next) {
                Ok((answer, changed)) => {
                    next = answer;
                    if !next.is_some_and(|n: NextPoll| n.long_poll) {
                        std::thread::sleep(self.revocation_poll);
                    } else if !changed && asked.elapsed() < Duration::from_secs(1) {
                        // Answered at once with nothing new: never a loop.
                        std::thread::sleep(Duration::from_secs(1));
                    }
                }
                Err(e) => {
                    crate::ffi::log(3, &format!("themis native: revocations: {e}"));
                    next = None;
                    std::thread::sleep(Duration::from_secs(1));
                }
            }
        }
    }

    /// The thread: renews the credential at half its life and re-resolves the wanted
    /// services, each on its own period; failures are logged and retried a second
    /// later.
    fn run(self: Arc<Self>) {
        let rng = SystemRandom::new();
        let (mut renew_at, mut resolve_at) = (0u64, 0u64);
        let mut resolved: BTreeSet<String> = BTreeSet::new();
        loop {
            #[cfg(feature = "fault-injection")]
            crate::faults::maybe_panic(crate::faults::Point::Runtime);
            let now = now_ms();
            if now >= renew_at {
                renew_at = match self.delegate(&rng, now) {
                    Ok(at) => at,
                    Err(e) => {
                        crate::ffi::log(
                            3,
                            &format!("themis native: delegation for {}: {e}", self.workload),
                        );
                        now + 1_000
                    }
                };
            }
            let wanted = self.wanted.lock().map(|w| w.clone()).unwrap_or_default();
            let stale = self.stale.swap(false, Ordering::Relaxed);
            if now >= resolve_at || wanted != resolved || stale {
                resolve_at = now + self.resolve_ttl.as_millis() as u64;
                for service in &wanted {
                    if let Err(e) = self.resolve(service) {
                        crate::ffi::log(3, &format!("themis native: resolving {service}: {e}"));
                        resolve_at = now + 1_000;
                    }
                }
                resolved = wanted;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Asks the agent to delegate a fresh key; returns when to renew.
    fn delegate(&self, rng: &SystemRandom, now: u64) -> Result<u64, String> {
        let key = DelegatedKey::generate(rng).map_err(|e| e.to_string())?;
        let request = api::DelegateRequest {
            delegated_key: hex::encode(key.public_key()),
            lifetime_secs: None,
        };
        let body = serde_json::to_vec(&request).map_err(|e| e.to_string())?;
        let answer = self.call(
            Method::POST,
            &paths::workload_delegate(&self.workload),
            &body,
        )?;
        let (credential, renew_at) = themis_sidecar::agent::parse_delegated(
            &answer,
            key,
            &self.workload,
            &self.root.mesh,
            now,
        )
        .map_err(|e| e.to_string())?;
        let not_after = credential.delegation().not_after_ms;
        self.publish(|s| s.credential = Some(Arc::new(credential)));
        crate::metrics::identity_held();
        crate::ffi::log(
            2,
            &format!(
                "themis native: {} holds a delegated key until {}",
                self.workload, not_after
            ),
        );
        Ok(renew_at)
    }

    /// One poll (long if `next` says the agent holds them); returns what the answer
    /// says of the next, and whether it brought a new list.
    fn poll_revocations(&self, next: Option<NextPoll>) -> Result<(Option<NextPoll>, bool), String> {
        let timeout = match next.is_some_and(|n| n.long_poll) {
            true => self.timeout + Duration::from_millis(REVOCATIONS_WAIT_MS),
            false => self.timeout,
        };
        let body = self.call_within(Method::GET, &NextPoll::path(next), b"", timeout)?;
        let held = self.snapshot().revocations.len();
        let revocations =
            parse_new_revocations(&body, &self.root, held).map_err(|e| e.to_string())?;
        let changed = revocations.is_some();
        if let Some(list) = revocations {
            crate::ffi::log(
                2,
                &format!(
                    "themis native: {} revocations ({} proven by the trust log's checkpoint)",
                    list.revocations.len(),
                    list.proven
                ),
            );
            let mut emptied = false;
            self.publish(|s| {
                s.revocations = list.revocations;
                s.revocation_generation += 1;
                emptied = withdraw(&mut s.resolutions, &self.root, &s.revocations);
            });
            if emptied {
                self.refresh();
            }
        }
        Ok((NextPoll::of(&body), changed))
    }

    fn resolve(&self, service: &str) -> Result<(), String> {
        let body = self.call(Method::GET, &paths::resolve(service, false), b"")?;
        let snapshot = self.snapshot();
        let trust = Verifier {
            root: &self.root,
            now_ms: now_ms(),
            revoked: &snapshot.revocations,
        };
        let results = parse_instances(&body, service, &trust).map_err(|e| e.to_string())?;
        let (good, bad) = endorsed(results);
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
        Ok(())
    }

    /// One exchange with the agent over its Unix socket: the body of a 2xx answer.
    fn call(&self, method: Method, path: &str, body: &[u8]) -> Result<Vec<u8>, String> {
        self.call_within(method, path, body, self.timeout)
    }

    /// [`Runtime::call`], answered within `timeout`.
    fn call_within(
        &self,
        method: Method,
        path: &str,
        body: &[u8],
        timeout: Duration,
    ) -> Result<Vec<u8>, String> {
        let what = format!("{method} {path}");
        self.agent
            .call_raw_within(method, path, body, "application/json", timeout)
            .and_then(|(status, body)| themis_agent_client::success(status, body))
            .map_err(|e| format!("{what}: {e}"))
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
