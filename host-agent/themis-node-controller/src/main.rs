//! `themis-node-controller`: meshes the pods of one Kubernetes node (docs/KUBERNETES.md).
//!
//! It watches the pods scheduled on its node and the namespaces, and makes the local
//! agent's registrations match them: a meshed pod (namespace labelled
//! `themis.io/mesh=enabled`) gets its workload bound to the pod's cgroup and the
//! sidecar's uid, the capture attached in its network namespace, and a registration;
//! a pod that goes (or stops being meshed) has its registration withdrawn and the
//! capture detached. Level-based: every pass compares the whole node with the agent,
//! so a restart adopts what exists and a missed event is made up at the next pass.
//! It is out of the data path: while it is down, meshed pods keep their identities and
//! capture; only new pods wait.

mod agent;
mod cgroup;
mod plan;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use clap::Parser;
use futures_util::StreamExt;
use k8s_openapi::api::core::v1::{Namespace, Pod};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::runtime::reflector::{self, Store};
use kube::runtime::{watcher, WatchStreamExt};
use kube::{Api, Client, Resource};
use tokio::sync::Notify;
use tracing::{info, warn};

use crate::agent::{Agent, AgentError};
use crate::plan::{Conventions, Decision, POD_UID_LABEL};

/// Meshes the pods of this Kubernetes node through the local Themis agent.
///
/// Pods in namespaces labelled themis.io/mesh=enabled, with a themis-proxy sidecar
/// container, are bound to a workload identity (<pod>.<namespace>), captured and
/// registered as the service their themis.io/service annotation (or app label) names.
/// Runs beside the agent (the DaemonSet's second container), as the agent's node
/// controller (the agent's --controller-uid, from its pod): it may mesh pods and
/// nothing else — no key, no revocation, no identity that exists.
#[derive(Parser, Debug)]
#[command(version)]
struct Args {
    /// This node's name (the DaemonSet passes spec.nodeName).
    #[arg(long, env = "NODE_NAME")]
    node: String,
    /// The local agent's API socket.
    #[arg(
        long,
        env = "THEMIS_SOCKET",
        default_value = "/var/run/themis/agent.sock"
    )]
    socket: PathBuf,
    /// The cgroup v2 hierarchy as the host mounts it [default: found from
    /// /proc/self/mountinfo].
    #[arg(long)]
    cgroup_root: Option<PathBuf>,
    /// The sidecar's uid: never captured, the only uid that may use the pod's identity.
    #[arg(long, default_value_t = 1337)]
    proxy_uid: u32,
    /// The sidecar's inbound port on the pod's IP (the registered endpoint).
    #[arg(long, default_value_t = 15006)]
    inbound_port: u16,
    /// The controller's own pod's uid (the DaemonSet passes metadata.uid): where its
    /// cgroup is shows where the kubelet puts every pod's.
    #[arg(long, env = "POD_UID")]
    pod_uid: String,
    /// A full pass over the node at least this often, besides every change.
    #[arg(long, default_value_t = 30)]
    resync_secs: u64,
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "info,kube=warn".into()),
        )
        .init();
    let args = Args::parse();
    match run(args).await {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!("{e}");
            std::process::ExitCode::FAILURE
        }
    }
}

async fn run(args: Args) -> Result<(), String> {
    let cgroup_root = args
        .cgroup_root
        .clone()
        .or_else(themis_capture::cgroup2_mount)
        .ok_or("no cgroup v2 hierarchy is mounted: cannot find pods' cgroups")?;
    // Our own pod exists (we run in it): the shallowest directory of its uid is the
    // kubelet's, and the kubelet's layout beside it is the only place pods are looked
    // for from now on.
    let own = cgroup::search_pod(&cgroup_root, &args.pod_uid).ok_or_else(|| {
        format!(
            "no cgroup of this controller's own pod (pod{}) under {}",
            args.pod_uid,
            cgroup_root.display()
        )
    })?;
    let kubepods = cgroup::Kubepods::of(&own).ok_or_else(|| {
        format!(
            "this controller's pod's cgroup {} is under no kubepods directory: not the kubelet's layout",
            own.display()
        )
    })?;
    let client = Client::try_default()
        .await
        .map_err(|e| format!("the Kubernetes API: {e}"))?;
    let changed = Arc::new(Notify::new());
    let pods = watch(
        Api::<Pod>::all(client.clone()),
        watcher::Config::default().fields(&format!("spec.nodeName={}", args.node)),
        changed.clone(),
    );
    let namespaces = watch(
        Api::<Namespace>::all(client.clone()),
        watcher::Config::default(),
        changed.clone(),
    );
    let reporter = Reporter {
        controller: "themis-node-controller".into(),
        instance: Some(args.node.clone()),
    };
    let mut node = Node {
        agent: Agent::new(&args.socket),
        mesh: None,
        recorder: Recorder::new(client, reporter),
        conventions: Conventions {
            proxy_uid: args.proxy_uid,
            inbound_port: args.inbound_port,
        },
        kubepods,
        said: HashMap::new(),
        bound: HashMap::new(),
        identities: HashMap::new(),
    };
    info!(node = %args.node, socket = %args.socket.display(), pods = %node.kubepods.dir().display(), "watching this node's pods");
    pods.wait_until_ready().await.map_err(|e| e.to_string())?;
    namespaces
        .wait_until_ready()
        .await
        .map_err(|e| e.to_string())?;
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .map_err(|e| e.to_string())?;
    loop {
        node.pass(&pods, &namespaces).await;
        tokio::select! {
            () = changed.notified() => tokio::time::sleep(Duration::from_millis(200)).await,
            () = tokio::time::sleep(Duration::from_secs(args.resync_secs)) => {}
            _ = term.recv() => {
                // Registrations stay: the pods keep running, and a controller restart adopts them.
                info!("SIGTERM: stopping; meshed pods keep their registrations and capture");
                return Ok(());
            }
        }
    }
}

/// The Event reason for what the agent answered.
fn event_reason(e: AgentError) -> (&'static str, String) {
    match &e {
        AgentError::Unreachable(_) => ("AgentUnavailable", e.to_string()),
        AgentError::Refused { reason, .. } if reason == "not_granted" => {
            ("NotGranted", e.to_string())
        }
        AgentError::Refused { reason, .. } if reason == "revoked" => ("Revoked", e.to_string()),
        AgentError::Refused { reason, .. } if reason == "not_bound" => ("NotBound", e.to_string()),
        AgentError::Refused { reason, .. } if reason == "no_subject" => {
            ("NoSubject", e.to_string())
        }
        // The agent's limits on the node controller: an identity that exists (the
        // operator's, another pod's) is never handed to a pod.
        AgentError::Refused { reason, .. } if reason == "bound_elsewhere" => {
            ("IdentityInUse", e.to_string())
        }
        AgentError::Refused { reason, .. } if reason == "not_a_pod" => {
            ("NotAPodsCgroup", e.to_string())
        }
        AgentError::Refused { reason, .. } if reason.contains("capture") => {
            ("CaptureFailed", e.to_string())
        }
        AgentError::Refused { .. } | AgentError::Unreadable(_) => {
            ("RegistrationRefused", e.to_string())
        }
    }
}

/// A cache of `api`'s objects, kept by a watch; every change wakes `changed`.
fn watch<K>(api: Api<K>, config: watcher::Config, changed: Arc<Notify>) -> Store<K>
where
    K: Resource<DynamicType = ()>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug
        + Send
        + Sync
        + 'static,
{
    let (store, writer) = reflector::store();
    let stream = watcher(api, config)
        .default_backoff()
        .reflect(writer)
        .touched_objects();
    tokio::spawn(async move {
        let mut stream = std::pin::pin!(stream);
        while let Some(item) = stream.next().await {
            match item {
                Ok(_) => changed.notify_one(),
                Err(e) => warn!("watching {}: {e}", K::plural(&())),
            }
        }
    });
    store
}

struct Node {
    agent: Agent,
    /// The agent's mesh (asked once): the trust domain of the pods' subjects.
    mesh: Option<String>,
    recorder: Recorder,
    conventions: Conventions,
    /// Where the kubelet puts pods' cgroups.
    kubepods: cgroup::Kubepods,
    /// What was last said of each pod (by uid), so an Event is published once per change.
    said: HashMap<String, String>,
    /// Pods (by uid) whose workload is bound, waiting for their sidecar to start, with
    /// the workload and the cgroup it was bound to.
    bound: HashMap<String, (String, PathBuf)>,
    /// The workload identity made for each pod (by uid), until the pod is gone and the
    /// identity deleted with it.
    identities: HashMap<String, String>,
}

impl Node {
    /// Makes the agent's pod registrations match the pods: registers each meshed pod
    /// not registered yet, withdraws each registration whose pod is gone or no longer
    /// meshed.
    async fn pass(&mut self, pods: &Store<Pod>, namespaces: &Store<Namespace>) {
        if self.mesh.is_none() {
            match self.agent.mesh().await {
                Ok(mesh) => self.mesh = Some(mesh),
                Err(e) => {
                    warn!("the local agent: {e}; nothing changed, trying again");
                    return;
                }
            }
        }
        let (registered, bound) = match self.agent.pod_state().await {
            Ok(state) => state,
            Err(e) => {
                warn!("the local agent: {e}; nothing changed, trying again");
                return;
            }
        };
        let registered_uids: HashSet<String> = registered
            .iter()
            .filter_map(|r| r.metadata.get(POD_UID_LABEL).cloned())
            .collect();
        // A restarted controller adopts the identities of what is registered, and of
        // what is bound to a pod's cgroup where the kubelet puts pods (a pod that went
        // before its sidecar started, while the controller was away).
        for r in &registered {
            if let Some(uid) = r.metadata.get(POD_UID_LABEL) {
                self.identities
                    .entry(uid.clone())
                    .or_insert_with(|| r.workload.to_string());
            }
        }
        for (workload, cgroup) in bound {
            if let Some(uid) = self.kubepods.pod_of(&cgroup) {
                self.identities.entry(uid).or_insert(workload);
            }
        }
        let labels: BTreeMap<String, BTreeMap<String, String>> = namespaces
            .state()
            .iter()
            .filter_map(|ns| {
                Some((
                    ns.metadata.name.clone()?,
                    ns.metadata.labels.clone().unwrap_or_default(),
                ))
            })
            .collect();
        // The pods that exist at all (a terminating one too: its sidecar still serves
        // while it drains, with its identity).
        let pods_here: HashSet<String> = pods
            .state()
            .iter()
            .filter_map(|p| p.metadata.uid.clone())
            .collect();
        let mut wanted = HashSet::new();
        let mut plans = Vec::new();
        for pod in pods.state() {
            let namespace = pod.metadata.namespace.as_deref().unwrap_or_default();
            match plan::decide(&pod, labels.get(namespace), &self.conventions) {
                Decision::Leave | Decision::Wait(_) => {}
                Decision::Refuse(reason, message) => {
                    self.say(&pod, EventType::Warning, reason, message).await
                }
                Decision::Mesh(plan) => {
                    wanted.insert(plan.uid.clone());
                    plans.push((pod, plan));
                }
            }
        }
        // Withdrawals first, and the keys of pods that are gone: a new pod of the same
        // name (a StatefulSet's next, a bare pod made again) must get a new identity,
        // never the old one's.
        for registration in registered {
            let uid = &registration.metadata[POD_UID_LABEL];
            if wanted.contains(uid) {
                continue;
            }
            match self.agent.withdraw(&registration).await {
                Ok(()) => {
                    info!(workload = %registration.workload, service = %registration.service, "withdrawn: its pod is gone or no longer meshed");
                    self.said.remove(uid);
                }
                Err(e) => warn!(workload = %registration.workload, "withdrawing: {e}"),
            }
        }
        let gone: Vec<(String, String)> = self
            .identities
            .iter()
            .filter(|(uid, _)| !pods_here.contains(*uid))
            .map(|(uid, workload)| (uid.clone(), workload.clone()))
            .collect();
        for (uid, workload) in gone {
            self.bound.remove(&uid);
            match self.agent.forget(&workload).await {
                Ok(()) => {
                    info!(workload, "forgotten: its pod is gone, and so is its key");
                    self.identities.remove(&uid);
                }
                // Kept, to try again at the next pass.
                Err(e) => warn!(workload, "deleting the identity of a pod that is gone: {e}"),
            }
        }
        // A gone pod's identity not deleted yet: a new pod of its name waits for it.
        let unforgotten: HashSet<&String> = self
            .identities
            .iter()
            .filter(|(uid, _)| !pods_here.contains(*uid))
            .map(|(_, workload)| workload)
            .collect();
        let (plans, waiting): (Vec<_>, Vec<_>) = plans
            .into_iter()
            .partition(|(_, plan)| !unforgotten.contains(&plan.workload));
        for (_, plan) in &waiting {
            warn!(workload = %plan.workload, "not meshed yet: the identity of the previous pod of this name is not deleted");
        }
        for (pod, plan) in plans {
            if registered_uids.contains(&plan.uid) {
                continue;
            }
            match self.mesh(&plan).await {
                Ok(false) => {} // bound; registered once its sidecar has started
                Ok(true) => {
                    info!(workload = %plan.workload, service = %plan.service, endpoint = %plan.endpoint, "meshed");
                    let note = format!(
                        "workload {} registered as {} at {}",
                        plan.workload, plan.service, plan.endpoint
                    );
                    self.say(&pod, EventType::Normal, "Meshed", note).await;
                }
                Err((reason, message)) => {
                    warn!(workload = %plan.workload, reason, "not meshed: {message}");
                    self.say(&pod, EventType::Warning, reason, message).await;
                }
            }
        }
    }

    /// Finds the pod's cgroup and binds its workload (at once, so that its sidecar gets
    /// its identity as it starts), then, once the sidecar has started, attaches the
    /// capture and registers it (so that no caller resolves a pod whose inbound
    /// listener does not exist yet). Ok(true) once registered. Errors carry the Event's
    /// reason.
    async fn mesh(&mut self, plan: &plan::PodPlan) -> Result<bool, (&'static str, String)> {
        let pod_cgroup = match self.bound.get(&plan.uid) {
            Some((_, cgroup)) => cgroup.clone(),
            None => {
                let cgroup = self.kubepods.find_pod(&plan.uid).ok_or((
                    "CgroupNotFound",
                    format!(
                        "no cgroup of pod {} where the kubelet puts pods ({})",
                        plan.uid,
                        self.kubepods.dir().display()
                    ),
                ))?;
                self.agent
                    .bind(plan, &cgroup, self.conventions.proxy_uid)
                    .await
                    .map_err(event_reason)?;
                info!(workload = %plan.workload, cgroup = %cgroup.display(), "bound: only its sidecar may use its identity");
                self.bound
                    .insert(plan.uid.clone(), (plan.workload.clone(), cgroup.clone()));
                self.identities
                    .insert(plan.uid.clone(), plan.workload.clone());
                cgroup
            }
        };
        if !plan.proxy_started {
            return Ok(false);
        }
        let pid = cgroup::a_process_of(&pod_cgroup).ok_or((
            "NoProcess",
            format!(
                "no process in {} yet (its sandbox is starting)",
                pod_cgroup.display()
            ),
        ))?;
        let netns = PathBuf::from(format!("/proc/{pid}/ns/net"));
        self.agent
            .register(
                plan,
                self.mesh.as_deref().unwrap_or_default(),
                &pod_cgroup,
                netns,
                self.conventions.proxy_uid,
            )
            .await
            .map_err(event_reason)?;
        self.bound.remove(&plan.uid);
        Ok(true)
    }

    /// Publishes an Event on the pod, once per different message.
    async fn say(&mut self, pod: &Pod, type_: EventType, reason: &str, note: String) {
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        let key = format!("{reason}: {note}");
        if self.said.get(&uid) == Some(&key) {
            return;
        }
        let event = Event {
            type_,
            reason: reason.into(),
            note: Some(note.chars().take(1000).collect()),
            action: "Mesh".into(),
            secondary: None,
        };
        match self.recorder.publish(&event, &pod.object_ref(&())).await {
            Ok(()) => {
                self.said.insert(uid, key);
            }
            Err(e) => warn!("publishing an Event: {e}"),
        }
    }
}
