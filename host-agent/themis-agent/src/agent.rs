//! The daemon: wires the node identity, the secure-channel server and client, the
//! overlay, the registry, the local API and the metrics endpoint, and leaves the
//! ring gracefully on `SIGTERM` or `SIGINT`.

use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use axum::routing::get;
use themis_core::SessionInfo;
use themis_dht::{Contact, Key};
use themis_net::{Client, ClientConfig, NetStats};
use tokio::net::{TcpListener, UnixListener};
use tokio::signal::unix::{signal, SignalKind};
use tracing::{debug, info, warn};

use crate::config::{ConfigError, Settings};
use crate::keystore::{KeyError, KeyStore};
use crate::metrics::{Metrics, Sources};
use crate::overlay::{Overlay, Transport};
use crate::registry::Registry;
use crate::trust::MeshTrust;

/// Why the agent could not start.
#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    /// Bad settings.
    #[error("{0}")]
    Config(#[from] ConfigError),
    /// The node key could not be used.
    #[error("{0}")]
    Key(#[from] KeyError),
    /// The mesh root, the node's admission or its grants cannot be used.
    #[error("{0}")]
    Trust(#[from] crate::trust::TrustSetupError),
    /// `--operator-own-pod` where the agent's cgroup has no pod above it.
    #[error("--operator-own-pod: {0}")]
    OperatorPod(String),
    /// A controller uid that is also the operator's: the controller would be the
    /// operator.
    #[error("--controller-uid {0} is also an operator uid (the operator's, or the agent's own): the controller would have the operator's every right")]
    ControllerIsOperator(u32),
    /// eBPF capture could not start; the message says what is missing.
    #[error("{0}")]
    Capture(#[from] themis_capture::CaptureError),
    /// A socket could not be opened.
    #[error("{what} {addr}: {source}")]
    Bind {
        /// Which socket.
        what: &'static str,
        /// Its address.
        addr: String,
        /// What the system said.
        source: std::io::Error,
    },
}

fn bind_error(
    what: &'static str,
    addr: impl ToString,
) -> impl FnOnce(std::io::Error) -> AgentError {
    let addr = addr.to_string();
    move |source| AgentError::Bind { what, addr, source }
}

/// What the read-only TCP resolution API holds at most: HTTP clients open a
/// connection or a few each, and a connection silent for 30 s is closed. (HTTP has
/// no handshake: the handshake and admission limits do not apply.)
fn resolve_limits() -> themis_net::Limits {
    themis_net::Limits {
        max_connections: 256,
        max_per_source: 32,
        idle_timeout: Duration::from_secs(30),
        ..themis_net::Limits::default()
    }
}

/// Runs the agent until `SIGTERM`/`SIGINT`, then leaves the ring and returns.
pub async fn run(settings: Settings) -> Result<(), AgentError> {
    let root = crate::trust::load_root(&settings.mesh_root_spec())?;
    let mesh = root.mesh.clone();
    let bootstrap = settings.bootstrap()?;
    // No admission, no node key: the operator's `themis node admit` generates both
    // (a key the node made itself could have been ground for a ring position).
    crate::trust::require_admission(&settings.state_dir)?;
    let keys = KeyStore::open(&settings.state_dir, mesh.clone())?;
    let (node, created) = keys.node()?;
    if created {
        info!(path = %settings.state_dir.join("node.key").display(), "created the node identity");
    }
    let node = Arc::new(node);
    raise_file_limit(&settings);
    let metrics = Arc::new(Metrics::new());
    let trust = Arc::new(MeshTrust::load(
        &settings.state_dir,
        root,
        &node,
        metrics.clone(),
    )?);

    let listener = TcpListener::bind(settings.listen)
        .await
        .map_err(bind_error("agent listener", settings.listen))?;
    let bound = listener
        .local_addr()
        .map_err(bind_error("agent listener", settings.listen))?;
    let advertise = settings.advertise.unwrap_or(bound);
    if advertise.ip().is_unspecified() {
        return Err(ConfigError::Invalid(format!(
            "listening on {bound}: set --advertise to the address other agents reach this one at"
        ))
        .into());
    }

    let client = Arc::new(Client::new(
        node.clone(),
        ClientConfig {
            max_connections: settings.max_sessions,
            idle_timeout: Duration::from_secs(settings.session_idle_secs),
            request_timeout: Duration::from_millis(settings.request_timeout_ms),
            ..ClientConfig::default()
        },
    ));
    let me = Contact {
        id: Key(node.id().0),
        addr: advertise,
    };
    let overlay = Overlay::start(
        me,
        mesh.clone(),
        bootstrap,
        Arc::new(client.clone()) as Arc<dyn Transport>,
        settings.overlay(),
        metrics.clone(),
        trust.clone(),
    );

    let inbound = Arc::new(NetStats::default());
    let handler = {
        let overlay = overlay.clone();
        move |peer: Arc<SessionInfo>, frame: bytes::BytesMut| {
            let overlay = overlay.clone();
            async move { overlay.handle_frame(peer.peer_id, &frame).await }
        }
    };
    let (inbound_config, inbound_limits) = settings.inbound();
    metrics.listener("agent", inbound.clone());
    let server = tokio::spawn(themis_net::serve_with(
        listener,
        node.clone(),
        inbound_config,
        inbound_limits,
        Arc::new(handler),
        inbound.clone(),
    ));

    let mut registry = Registry::new(
        overlay.clone(),
        keys,
        (node.clone(), trust.clone()),
        settings.state_dir.clone(),
        settings.registry(),
        metrics.clone(),
    );
    if settings.capture {
        let capture = themis_capture::Capture::start(&settings.bpf_pin_dir, settings.fast_path)?;
        registry = registry.with_capture(capture);
    }
    let operators = operators(&settings)?;
    let own_cgroup = operators.own_cgroup.clone();
    let registry = Arc::new(registry.with_operators(operators));
    let socket = settings.api_socket();
    let api = bind_unix(&socket)?;
    let api_task = tokio::spawn(serve_api(
        crate::local_socket::AttestedListener::new(api, metrics.clone(), own_cgroup),
        crate::api::router(registry.clone()),
    ));
    let resolve_task = match settings.resolve_listen {
        Some(addr) => {
            let listener = TcpListener::bind(addr)
                .await
                .map_err(bind_error("resolve listener", addr))?;
            let stats = Arc::new(NetStats::default());
            metrics.listener("resolve", stats.clone());
            Some(tokio::spawn(crate::api::serve_resolve(
                listener,
                registry.clone(),
                resolve_limits(),
                stats,
            )))
        }
        None => None,
    };

    let metrics_task = match settings.metrics_addr()? {
        Some(addr) => {
            let listener = TcpListener::bind(addr)
                .await
                .map_err(bind_error("metrics listener", addr))?;
            let (overlay, metrics, inbound, client) = (
                overlay.clone(),
                metrics.clone(),
                inbound.clone(),
                client.clone(),
            );
            let app = axum::Router::new().route(
                "/metrics",
                get(move || async move {
                    let outbound_sessions = client.connections().await;
                    let text = metrics.render(Sources {
                        dht: &overlay.snapshot(),
                        joined: *overlay.joined().borrow(),
                        inbound: &inbound,
                        outbound: client.stats(),
                        outbound_sessions,
                    });
                    (
                        [("content-type", "text/plain; version=0.0.4; charset=utf-8")],
                        text,
                    )
                }),
            );
            Some(tokio::spawn(
                async move { axum::serve(listener, app).await },
            ))
        }
        None => None,
    };

    info!(
        id = %node.printable_id(),
        mesh_root = %trust.root(),
        grants = %trust.granted_services().join(","),
        listen = %advertise,
        api = %socket.display(),
        metrics = %settings.metrics,
        "agent started"
    );

    // Re-publish what this node registered before a restart, once in the ring.
    let restore = {
        let (registry, mut joined) = (registry.clone(), overlay.joined());
        tokio::spawn(async move {
            if joined.wait_for(|j| *j).await.is_ok() {
                let n = registry.restore().await;
                if n > 0 {
                    info!(registrations = n, "restored registrations");
                }
            }
        })
    };

    // Records are renewed by their own agent (half-way through their validity), and
    // revocations are looked for in the DHT: no central service is involved in either.
    // Two tasks, so that a slow renewal never delays the revocation poll (whose
    // period is part of the stated revocation bound).
    let renewal = {
        let (registry, every) = (
            registry.clone(),
            Duration::from_secs(settings.republish_secs),
        );
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(every);
            loop {
                tick.tick().await;
                let renewed = registry.refresh().await;
                if renewed > 0 {
                    tracing::debug!(renewed, "renewed records");
                }
            }
        })
    };
    let revocation_poll = {
        let registry = registry.clone();
        let every = Duration::from_millis(settings.revocation_poll_ms());
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(every);
            loop {
                tick.tick().await;
                if let Err(error) = registry.poll_revocations().await {
                    tracing::debug!(%error, "revocation poll failed");
                }
            }
        })
    };

    // The trust log: compared with two neighbours a round, taken from whoever has
    // more (verified here), forks kept as evidence.
    let log_sync = {
        let mut sync = crate::log_sync::LogSync::new(
            client.clone(),
            overlay.clone(),
            trust.clone(),
            metrics.clone(),
        );
        let (mut joined, every) = (
            overlay.joined(),
            Duration::from_millis(settings.log_sync_ms()),
        );
        tokio::spawn(async move {
            if joined.wait_for(|j| *j).await.is_err() {
                return;
            }
            let mut tick = tokio::time::interval(every);
            loop {
                tick.tick().await;
                sync.round().await;
            }
        })
    };

    // One-hop routing: the membership and the log's growth, by gossip.
    // When this node last said goodbye: a return soon after it waits at its peers.
    let farewell_file = settings.state_dir.join("farewell-ms");
    let gossip = (settings.routing == crate::config::Routing::OneHop).then(|| {
        let (state, heard) = crate::gossip::GossipState::new(&node, advertise, trust.clone());
        overlay.serve_gossip(state.clone());
        info!(
            period_ms = settings.gossip_ms,
            "one-hop routing: gossiping the membership and the trust log"
        );
        let driver = tokio::spawn(
            crate::gossip::Driver {
                state: state.clone(),
                heard,
                node: node.clone(),
                overlay: overlay.clone(),
                client: client.clone(),
                metrics: metrics.clone(),
                bootstrap: settings.bootstrap().unwrap_or_default(),
                period: Duration::from_millis(settings.gossip_ms),
                last_farewell_ms: std::fs::read_to_string(&farewell_file)
                    .ok()
                    .and_then(|text| text.trim().parse().ok()),
            }
            .run(),
        );
        (state, driver)
    });

    wait_for_shutdown().await;
    info!("shutting down: leaving the ring");
    if let Some((_, driver)) = &gossip {
        driver.abort();
    }
    log_sync.abort();
    renewal.abort();
    revocation_poll.abort();
    restore.abort();
    // The objects are handed over before the goodbye: with one-hop routing a successor
    // that has taken our leaving announcement no longer counts us its predecessor, and
    // refuses our hand-over.
    overlay.leave().await;
    if let Some((state, _)) = gossip {
        let note = |said_at: u64| {
            if let Err(error) = std::fs::write(&farewell_file, said_at.to_string()) {
                warn!(%error, file = %farewell_file.display(), "cannot note the farewell's date");
            }
        };
        state.farewell(&node, &client, &metrics, note).await;
    }
    api_task.abort();
    server.abort();
    if let Some(task) = metrics_task {
        task.abort();
    }
    if let Some(task) = resolve_task {
        task.abort();
    }
    let _ = std::fs::remove_file(&socket);
    info!("stopped");
    Ok(())
}

async fn wait_for_shutdown() {
    let mut term = signal(SignalKind::terminate()).expect("installing a SIGTERM handler");
    let mut int = signal(SignalKind::interrupt()).expect("installing a SIGINT handler");
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
    }
}

/// The operator as configured; the agent's own uid and exactly its own cgroup always
/// are one (its readiness probe runs there, and it reads the key files anyway).
fn operators(settings: &Settings) -> Result<crate::caller::Operators, AgentError> {
    use std::os::unix::fs::MetadataExt;
    let mut uids = settings.operator_uids.clone();
    if let Ok(me) = std::fs::metadata("/proc/self") {
        uids.push(me.uid());
    }
    let own_cgroup = i32::try_from(std::process::id())
        .ok()
        .and_then(crate::caller::cgroup_of);
    match &own_cgroup {
        Some(own) if own.as_path() == crate::caller::cgroup_root() => warn!(
            uids = ?uids,
            "the agent runs in the cgroup v2 root, so every operator uid calling from the \
             root is the operator; where pods' processes also sit in the root (cgroup v2 \
             unused by the runtime), cgroups cannot tell a pod from the host: run the \
             agent in a cgroup of its own"
        ),
        Some(own) => info!(
            uids = ?uids,
            own_cgroup = %own.display(),
            also = ?settings.operator_cgroups,
            "the local API's operator: these uids, from exactly the agent's own cgroup or below the listed ones"
        ),
        None => warn!(
            uids = ?uids,
            also = ?settings.operator_cgroups,
            "the agent's own cgroup is unknown: only the listed operator cgroups are the operator's"
        ),
    }
    if let Some(&uid) = settings
        .controller_uids
        .iter()
        .find(|uid| uids.contains(uid))
    {
        return Err(AgentError::ControllerIsOperator(uid));
    }
    if !settings.controller_uids.is_empty() {
        info!(uids = ?settings.controller_uids, "the node controller: these uids, from where the operator calls, mesh pods and do nothing else");
    }
    let mut cgroups = settings.operator_cgroups.clone();
    if settings.operator_own_pod {
        cgroups.push(own_pod(
            crate::caller::cgroup_root(),
            own_cgroup.as_deref(),
        )?);
    }
    Ok(crate::caller::Operators {
        uids,
        cgroups,
        own_cgroup,
        controller_uids: settings.controller_uids.clone(),
    })
}

/// The agent's pod: the cgroup holding the agent's own (its container's), which must
/// be a Kubernetes pod's as the kubelet names it (`pod<uid>` with the cgroupfs driver,
/// `kubepods-…-pod<uid>.slice` with systemd's). Any other parent (the root, a systemd
/// slice) holds more than the agent's pod, and would make all of it the operator.
fn own_pod(
    root: &std::path::Path,
    own: Option<&std::path::Path>,
) -> Result<std::path::PathBuf, AgentError> {
    let own =
        own.ok_or_else(|| AgentError::OperatorPod("the agent's own cgroup is unknown".into()))?;
    let pod = own
        .parent()
        .filter(|pod| pod.starts_with(root) && *pod != root);
    let is_pod = |name: &str| {
        name.strip_prefix("pod").is_some_and(|uid| !uid.is_empty())
            || (name.starts_with("kubepods") && name.contains("-pod") && name.ends_with(".slice"))
    };
    match pod {
        Some(pod) if pod.file_name().and_then(|n| n.to_str()).is_some_and(is_pod) => {
            info!(pod = %pod.display(), "the local API's operator may also call from the agent's own pod (--operator-own-pod)");
            Ok(pod.to_owned())
        }
        _ => Err(AgentError::OperatorPod(format!(
            "the agent's cgroup {} is not a container's in a Kubernetes pod (its parent is not named pod<uid>)",
            own.display()
        ))),
    }
}

/// Raises the soft limit on open files to the hard one, so that the connection caps
/// (not the process's descriptors) are what bounds the agent, and says so when even
/// the hard limit is below what the caps allow.
fn raise_file_limit(settings: &Settings) {
    let needed = (settings.max_inbound_connections
        + settings.max_sessions
        + crate::local_socket::MAX_CONNECTIONS
        + resolve_limits().max_connections
        + 256) as u64;
    match crate::sys::raise_nofile_limit() {
        Ok((soft, _)) if soft < needed => warn!(
            open_files = soft,
            needed,
            "the open-file limit is below what the connection caps allow: raise the hard \
             limit (ulimit -Hn, LimitNOFILE=) or lower --max-inbound-connections"
        ),
        Ok((soft, _)) => debug!(open_files = soft, "open-file limit"),
        Err(error) => warn!(%error, "could not read or raise the open-file limit"),
    }
}

/// Binds the API socket, replacing a stale one left by a crashed agent (but never a
/// socket another agent is serving, nor a file that is not a socket), with mode 0666:
/// anyone on the node may connect, and each call is authorised by the caller's
/// kernel credentials (`crate::caller`).
fn bind_unix(path: &Path) -> Result<UnixListener, AgentError> {
    if let Ok(meta) = std::fs::symlink_metadata(path) {
        let in_use = std::os::unix::net::UnixStream::connect(path).is_ok();
        if !meta.file_type().is_socket() || in_use {
            return Err(AgentError::Bind {
                what: "API socket",
                addr: path.display().to_string(),
                source: std::io::Error::new(
                    std::io::ErrorKind::AddrInUse,
                    if in_use {
                        "another agent is serving it"
                    } else {
                        "a file that is not a socket is in the way"
                    },
                ),
            });
        }
        warn!(path = %path.display(), "removing a stale API socket");
        let _ = std::fs::remove_file(path);
    }
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(bind_error("API socket directory", dir.display()))?;
    }
    let listener = UnixListener::bind(path).map_err(bind_error("API socket", path.display()))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o666))
        .map_err(bind_error("API socket", path.display()))?;
    Ok(listener)
}

async fn serve_api(listener: crate::local_socket::AttestedListener, router: axum::Router) {
    let app = router.into_make_service_with_connect_info::<crate::caller::Peer>();
    if let Err(error) = axum::serve(listener, app).await {
        warn!(%error, "the local API stopped");
    }
}

/// The daemon's entry point for the binaries: settings, logs, runtime, run.
pub fn main(args: &crate::config::AgentArgs) -> std::process::ExitCode {
    let settings = match Settings::load(args) {
        Ok(settings) => settings,
        Err(error) => {
            eprintln!("error: {error}");
            return std::process::ExitCode::from(2);
        }
    };
    init_logs(settings.log_format);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("starting the tokio runtime");
    match runtime.block_on(run(settings)) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(error) => {
            tracing::error!(%error, "the agent could not start");
            eprintln!("error: {error}");
            std::process::ExitCode::FAILURE
        }
    }
}

/// Logs to stderr, filtered by `RUST_LOG` (default `info`).
fn init_logs(format: crate::config::LogFormat) {
    use tracing_subscriber::EnvFilter;
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_writer(std::io::stderr);
    match format {
        crate::config::LogFormat::Text => builder.init(),
        crate::config::LogFormat::Json => builder.json().init(),
    }
}

#[cfg(test)]
mod tests {
    use super::{operators, own_pod, AgentError};
    use std::path::Path;

    /// A controller uid that is an operator's would make the controller the operator.
    #[test]
    fn a_controller_uid_is_never_an_operators() {
        let mut settings = crate::config::Settings {
            controller_uids: vec![65532, 0],
            ..Default::default()
        };
        assert!(matches!(
            operators(&settings),
            Err(AgentError::ControllerIsOperator(0))
        ));
        settings.controller_uids = vec![65532];
        let operators = operators(&settings).unwrap();
        assert_eq!(operators.controller_uids, [65532]);
    }

    #[test]
    fn the_operators_pod_is_only_a_kubernetes_pods_cgroup() {
        let root = Path::new("/sys/fs/cgroup/unified");
        let pod = |own: &str| own_pod(root, Some(Path::new(own))).map_err(|e| e.to_string());
        // The kubelet's cgroupfs and systemd drivers.
        assert_eq!(
            pod("/sys/fs/cgroup/unified/kubepods/burstable/pod1234-ab/c0ffee").unwrap(),
            Path::new("/sys/fs/cgroup/unified/kubepods/burstable/pod1234-ab")
        );
        assert!(pod("/sys/fs/cgroup/unified/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod12_ab.slice/cri-containerd-c0.scope").is_ok());
        // Whatever else holds the agent holds more than its pod: refused, with the reason.
        for own in [
            "/sys/fs/cgroup/unified/themis-agent", // parent: the root
            "/sys/fs/cgroup/unified/system.slice/themis.service", // a systemd slice
            "/sys/fs/cgroup/unified/kubepods/burstable", // a QoS class, not a pod
            "/sys/fs/cgroup/unified/pod/agent",    // no uid
            "/sys/fs/cgroup/unified",              // the root itself
            "/elsewhere/pod12/agent",              // outside the hierarchy
        ] {
            let error = pod(own).unwrap_err();
            assert!(
                error.contains("not a container's in a Kubernetes pod"),
                "{own}: {error}"
            );
        }
        assert!(own_pod(root, None)
            .unwrap_err()
            .to_string()
            .contains("unknown"));
    }
}
