//! The agent's settings: defaults that work on one machine, a TOML file for a
//! deployment, and command-line flags over both.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::Args;
use serde::{Deserialize, Serialize};
use themis_core::{MeshName, PeerId};
use themis_dht::{Contact, Key};

use crate::overlay::{OverlayConfig, Peer};
use crate::registry::RegistryConfig;

/// How the DHT finds a key's replica holders.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum Routing {
    /// Chord's iterative lookups through other nodes.
    Chord,
    /// One hop: holders computed from the full, verified membership.
    OneHop,
}

/// Default state directory (key files, registrations, the API socket).
pub const DEFAULT_STATE_DIR: &str = "/var/lib/themis";

/// Everything the agent can be told. In a file, every field is optional.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Settings {
    /// The mesh name; every agent and workload of a mesh uses the same. Taken from
    /// the mesh root when there is one.
    pub mesh: String,
    /// The mesh root, `<mesh>:<hex key>` or a file holding it; default
    /// `<state_dir>/mesh.root` (written by `themis node admit`).
    pub mesh_root: Option<String>,
    /// How often to look for new revocations in the DHT, in milliseconds (`None`: by
    /// the routing, [`Settings::revocation_poll_ms`]).
    pub revocation_poll_ms: Option<u64>,
    /// How often to compare trust logs with a peer and take what it has more, in
    /// milliseconds (`None`: by the routing, [`Settings::log_sync_ms`]).
    pub log_sync_ms: Option<u64>,
    /// How replica holders are found: one hop from the full membership (the default:
    /// no other node can steer a lookup), or Chord lookups through other nodes
    /// (docs/PROTOCOL.md §6.14).
    pub routing: Routing,
    /// With one-hop routing, the gossip's pull period in milliseconds (news is pushed
    /// at once).
    pub gossip_ms: u64,
    /// Key files, saved registrations and (by default) the API socket live here.
    pub state_dir: PathBuf,
    /// Where to accept connections from other agents.
    pub listen: SocketAddr,
    /// The address other agents reach this one at, when `listen` is a wildcard.
    pub advertise: Option<SocketAddr>,
    /// Bootstrap agents, as `<id>@<ip:port>`; none: start a new ring.
    pub join: Vec<String>,
    /// The local API's Unix socket; default `<state_dir>/agent.sock`.
    pub api_socket: Option<PathBuf>,
    /// Where to serve Prometheus metrics, or `off`.
    pub metrics: String,
    /// Where to serve the read-only resolution API over TCP (status and resolve only),
    /// for clients without Unix sockets; off by default.
    pub resolve_listen: Option<SocketAddr>,
    /// Extra replicas of each service's records (stored `replicas + 1` times).
    pub replicas: u8,
    /// Lifetime of a stored record, in seconds.
    pub record_ttl_secs: u64,
    /// How often owners re-store their records, in seconds.
    pub republish_secs: u64,
    /// How long resolutions are cached, in milliseconds.
    pub resolve_cache_ms: u64,
    /// Most services in the resolution cache.
    pub resolve_cache_entries: usize,
    /// Most secure sessions kept open to other agents.
    pub max_sessions: usize,
    /// Most connections from other agents held at once, authenticated or not.
    pub max_inbound_connections: usize,
    /// Most connections held at once from one source (an IPv4 address, an IPv6 /64).
    pub max_inbound_per_ip: usize,
    /// An inbound connection must complete the key agreement within this, in
    /// milliseconds.
    pub handshake_timeout_ms: u64,
    /// An admitted inbound connection silent this long is closed, in seconds.
    pub inbound_idle_secs: u64,
    /// Resolutions skipping the cache (`?fresh=true`) allowed per second.
    pub resolve_fresh_per_sec: u32,
    /// Fresh resolutions allowed in a burst.
    pub resolve_fresh_burst: u32,
    /// A session unused this long is closed, in seconds.
    pub session_idle_secs: u64,
    /// A DHT request unanswered this long fails its peer, in milliseconds.
    pub request_timeout_ms: u64,
    /// Stabilisation period, in milliseconds.
    pub stabilise_ms: u64,
    /// How long an API operation may take, in milliseconds.
    pub op_timeout_ms: u64,
    /// Log format: `text` or `json`.
    pub log_format: LogFormat,
    /// Load the eBPF capture programs: registrations with a cgroup attach them.
    pub capture: bool,
    /// Where capture's maps and links are pinned (bpffs); one directory per agent.
    pub bpf_pin_dir: PathBuf,
    /// The same-node fast path (sockops + sk_msg) for captured loopback connections.
    pub fast_path: bool,
    /// The node operator's uids on the local API (kernel-attested); default root.
    pub operator_uids: Vec<u32>,
    /// The cgroups the operator calls from (their subtrees), besides exactly the
    /// agent's own cgroup, which is always one. Empty by default: only the agent's own
    /// cgroup. Never list a cgroup that contains pods.
    pub operator_cgroups: Vec<PathBuf>,
    /// The operator may also call from the agent's pod: the parent of the agent's own
    /// cgroup, i.e. the containers beside it (the node controller). Off by default.
    pub operator_own_pod: bool,
    /// The node controller's uids: from the operator's cgroups, they may mesh pods
    /// (bind, register, withdraw and delete pods' workloads) and nothing else — no
    /// key, revocation, log or debug call. Empty by default; never an operator uid.
    pub controller_uids: Vec<u32>,
    /// Endorse a workload only as a subject (its Kubernetes namespace and
    /// ServiceAccount, given by the operator) that a root-signed binding in the trust
    /// log allows for the service: a node's grant alone is not enough. On for a
    /// Kubernetes node, where a pod's author chooses its service annotation.
    pub require_binding: bool,
    /// Resolutions that miss the cache (each is `replicas + 1` DHT lookups) allowed
    /// per second, the operator's excepted.
    pub resolve_lookups_per_sec: u32,
    /// Resolutions missing the cache allowed in a burst.
    pub resolve_lookups_burst: u32,
    /// Handshakes the agent port answers per second, every source together (twice
    /// that in a burst); half is reserved for sources admitted in the last 10 minutes.
    pub inbound_handshakes_per_sec: u32,
    /// Handshakes one source (an IPv4 address, an IPv6 /64) may start per second
    /// (twice that in a burst).
    pub inbound_hellos_per_source_per_sec: u32,
    /// An authenticated inbound connection must prove its admission (send a frame
    /// carrying a valid admission) within this, in milliseconds.
    pub admission_timeout_ms: u64,
    /// The longest delegation (or TLS certificate) the agent signs for a proxy, in
    /// seconds, whatever the proxy asks: a stolen delegated key speaks for its
    /// workload, from anywhere, until then (or the workload's revocation).
    pub max_delegation_secs: u64,
    /// Delegations and certificates one workload may be given per minute on average
    /// (each Envoy VM asks at start and at every renewal, about one a minute).
    pub delegations_per_minute: u32,
    /// Delegations and certificates one workload may be given in a burst.
    pub delegation_burst: u32,
}

/// How logs are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line.
    Json,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            mesh: "themis".into(),
            mesh_root: None,
            revocation_poll_ms: None,
            log_sync_ms: None,
            routing: Routing::OneHop,
            gossip_ms: 2_000,
            state_dir: DEFAULT_STATE_DIR.into(),
            listen: "127.0.0.1:7400".parse().expect("valid"),
            advertise: None,
            join: Vec::new(),
            api_socket: None,
            metrics: "127.0.0.1:9464".into(),
            resolve_listen: None,
            replicas: 4,
            record_ttl_secs: 60,
            republish_secs: 20,
            resolve_cache_ms: 5_000,
            resolve_cache_entries: 1024,
            max_sessions: 256,
            max_inbound_connections: 1024,
            max_inbound_per_ip: 32,
            handshake_timeout_ms: 5_000,
            inbound_idle_secs: 120,
            resolve_fresh_per_sec: 20,
            resolve_fresh_burst: 40,
            session_idle_secs: 60,
            request_timeout_ms: 1_000,
            stabilise_ms: 1_000,
            op_timeout_ms: 10_000,
            log_format: LogFormat::Text,
            capture: false,
            bpf_pin_dir: themis_capture::DEFAULT_PIN_DIR.into(),
            fast_path: false,
            operator_uids: vec![0],
            operator_cgroups: Vec::new(),
            operator_own_pod: false,
            controller_uids: Vec::new(),
            require_binding: false,
            resolve_lookups_per_sec: 50,
            resolve_lookups_burst: 200,
            inbound_handshakes_per_sec: 200,
            inbound_hellos_per_source_per_sec: 50,
            admission_timeout_ms: 5_000,
            max_delegation_secs: 3_600,
            delegations_per_minute: 30,
            delegation_burst: 30,
        }
    }
}

/// Why the settings cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("{path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// What the system said.
        source: std::io::Error,
    },
    /// The file is not valid TOML for these settings.
    #[error("{path}: {source}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// What is wrong, with the line.
        source: Box<toml::de::Error>,
    },
    /// A value is out of range or malformed.
    #[error("{0}")]
    Invalid(String),
}

/// The `themis agent` flags; each overrides the file.
#[derive(Debug, Clone, Default, Args)]
pub struct AgentArgs {
    /// A TOML file with any of the settings below (flag names with `_` for `-`).
    #[arg(long, short = 'c', env = "THEMIS_CONFIG")]
    pub config: Option<PathBuf>,
    /// Mesh name [default: the mesh root's].
    #[arg(long)]
    pub mesh: Option<String>,
    /// The mesh root, `<mesh>:<64 hex>` or a file holding it, as `themis mesh create`
    /// printed it [default: <state-dir>/mesh.root].
    #[arg(long, env = "THEMIS_MESH_ROOT", value_name = "ROOT")]
    pub mesh_root: Option<String>,
    /// How often to look for new revocations in the DHT, milliseconds [default: 10000
    /// with Chord routing; 60000 with one hop, where gossip pushes them and this is
    /// the backstop]: with Chord, and the operation timeout (`op_timeout_ms`, 10 s),
    /// the bound on how long a revoked key keeps working.
    #[arg(long)]
    pub revocation_poll_ms: Option<u64>,
    /// How often to compare trust logs with a peer (two peers a round, in turn),
    /// milliseconds [default: 5000 with Chord routing; 60000 with one hop, where gossip
    /// compares logs every pull and this is the backstop]: with Chord, the bound on
    /// how long the log takes to reach this node from a neighbour, and on how long a
    /// fork shown to it goes unseen.
    #[arg(long)]
    pub log_sync_ms: Option<u64>,
    /// How replica holders are found [default: one-hop]: `one-hop`, every agent holds
    /// the full membership (admitted nodes at the addresses they signed, spread by
    /// gossip) and asks the holders directly, so no node can steer its lookups, and a
    /// record's endpoint must belong to its endorsing node (its announced IP, or the
    /// pod range the root granted it); `chord`, lookups through other nodes
    /// (docs/PROTOCOL.md §6.14).
    #[arg(long, value_enum)]
    pub routing: Option<Routing>,
    /// With one-hop routing, the gossip's pull period, ms [default: 2000]; news
    /// (a revocation, a member) is pushed at once.
    #[arg(long, value_name = "MS")]
    pub gossip_ms: Option<u64>,
    /// State directory: key files, registrations, API socket [default: /var/lib/themis].
    #[arg(long, env = "THEMIS_STATE_DIR")]
    pub state_dir: Option<PathBuf>,
    /// Address for other agents [default: 127.0.0.1:7400]. Port 0 picks a free port.
    #[arg(long)]
    pub listen: Option<SocketAddr>,
    /// Address other agents reach this one at, if `--listen` is a wildcard.
    #[arg(long)]
    pub advertise: Option<SocketAddr>,
    /// Join the ring through this agent, `<id>@<ip:port>` (repeat for fallbacks).
    /// Without it the agent starts a new ring.
    #[arg(long, value_name = "ID@ADDR")]
    pub join: Vec<String>,
    /// Unix socket of the local API [default: <state-dir>/agent.sock].
    #[arg(long, env = "THEMIS_SOCKET")]
    pub api_socket: Option<PathBuf>,
    /// Prometheus metrics address, or `off` [default: 127.0.0.1:9464].
    #[arg(long)]
    pub metrics: Option<String>,
    /// Also serve status and resolution (read-only) over TCP here, for clients that
    /// cannot reach the Unix socket (e.g. the component under `wasmtime run`).
    #[arg(long, value_name = "ADDR")]
    pub resolve_listen: Option<SocketAddr>,
    /// Extra replicas of service records [default: 4: five copies, so that with a
    /// fifth of the nodes hostile 99.9 % of resolutions still find every instance].
    #[arg(long)]
    pub replicas: Option<u8>,
    /// Lifetime of stored records, seconds [default: 60].
    #[arg(long)]
    pub record_ttl_secs: Option<u64>,
    /// Re-store period of owned records, seconds [default: 20].
    #[arg(long)]
    pub republish_secs: Option<u64>,
    /// Resolution cache lifetime, milliseconds [default: 5000].
    #[arg(long)]
    pub resolve_cache_ms: Option<u64>,
    /// DHT request timeout, milliseconds [default: 1000].
    #[arg(long)]
    pub request_timeout_ms: Option<u64>,
    /// Stabilisation period, milliseconds [default: 1000].
    #[arg(long)]
    pub stabilise_ms: Option<u64>,
    /// Most connections from other agents held at once, admitted or not
    /// [default: 1024]. At the cap, a new connection replaces the oldest one not
    /// admitted yet (in its handshake or after it); it is refused only if every held
    /// connection is admitted.
    #[arg(long, value_name = "N")]
    pub max_inbound_connections: Option<usize>,
    /// Most connections held at once from one source (an IPv4 address, an IPv6 /64)
    /// [default: 32]. Each
    /// agent keeps one connection to each peer: raise it only for many agents
    /// behind one address (NAT, one host).
    #[arg(long, value_name = "N")]
    pub max_inbound_per_ip: Option<usize>,
    /// An inbound connection that has not completed the key agreement within this is
    /// closed, milliseconds [default: 5000].
    #[arg(long, value_name = "MS")]
    pub handshake_timeout_ms: Option<u64>,
    /// An admitted inbound connection that sends nothing this long is closed,
    /// seconds [default: 120] (one not admitted yet has the admission deadline). Must exceed the outbound session idle time (60 s), so
    /// the peer that opened a connection is the one that closes it.
    #[arg(long, value_name = "SECS")]
    pub inbound_idle_secs: Option<u64>,
    /// Resolutions skipping the cache (`?fresh=true`, each k+1 DHT lookups) per second,
    /// on average [default: 20]. Over it, the cached answer is served if there is one,
    /// else 429 `rate_limited` with Retry-After.
    #[arg(long, value_name = "N")]
    pub resolve_fresh_per_sec: Option<u32>,
    /// Fresh resolutions allowed in a burst above the average [default: 40].
    #[arg(long, value_name = "N")]
    pub resolve_fresh_burst: Option<u32>,
    /// Log format [default: text].
    #[arg(long, value_enum)]
    pub log_format: Option<LogFormat>,
    /// Load the eBPF capture programs (needs root, cgroup v2, bpffs): registrations
    /// with `--cgroup` send the workload's TCP connects to its proxy.
    #[arg(long)]
    pub capture: bool,
    /// Where capture is pinned in bpffs; it outlives the agent there, and a restarted
    /// agent adopts it. One directory per agent [default: /sys/fs/bpf/themis].
    #[arg(long, value_name = "DIR")]
    pub bpf_pin_dir: Option<PathBuf>,
    /// Move data between local sockets of captured connections without the TCP/IP
    /// stack (sockops + sk_msg); off by default, see benchmarks/RESULTS.md.
    #[arg(long)]
    pub fast_path: bool,
    /// A uid that is the node's operator on the local API (repeat) [default: 0].
    /// Callers are identified by the kernel (SO_PEERCRED); see docs/AGENT.md.
    #[arg(long = "operator-uid", value_name = "UID")]
    pub operator_uids: Vec<u32>,
    /// The operator may also call from this cgroup v2 directory or below (repeat)
    /// [default: none: only from exactly the agent's own cgroup]. E.g. the host's
    /// /sys/fs/cgroup/user.slice for an admin's shell; never a cgroup holding pods.
    #[arg(long = "operator-cgroup", value_name = "DIR")]
    pub operator_cgroups: Vec<PathBuf>,
    /// The operator may also call from the agent's own pod: the cgroup that holds the
    /// agent's own (on Kubernetes, the containers of its pod, such as the node
    /// controller beside it). Refused where that parent is the cgroup root.
    #[arg(long)]
    pub operator_own_pod: bool,
    /// A uid that is the node controller on the local API (repeat), calling from where
    /// the operator may: it meshes pods (binds, registers, withdraws and deletes
    /// pods' workloads) and may do nothing else — no private key, no revocation, no
    /// log, no debug, no workload bound outside pods or already bound to another.
    /// Never an operator uid. See docs/AGENT.md.
    #[arg(long = "controller-uid", value_name = "UID")]
    pub controller_uids: Vec<u32>,
    /// Endorse a workload only as a subject (Kubernetes namespace and ServiceAccount,
    /// the registration's `themis.subject` label, set by the node controller from the
    /// API server) that a root-signed binding in the trust log allows for its service
    /// (`themis service bind`); a registration without one is refused. For Kubernetes
    /// nodes, where a pod's author picks its own service annotation.
    #[arg(long)]
    pub require_binding: bool,
    /// Resolutions missing the cache allowed per second, the operator's excepted;
    /// over it (and the burst) a resolution is refused with 429 [default: 50].
    #[arg(long, value_name = "N")]
    pub resolve_lookups_per_sec: Option<u32>,
    /// Resolutions missing the cache allowed in a burst [default: 200].
    #[arg(long, value_name = "N")]
    pub resolve_lookups_burst: Option<u32>,
    /// Handshakes the agent port answers per second, all sources together, half of
    /// them reserved for recently admitted sources [default: 200].
    #[arg(long, value_name = "N")]
    pub inbound_handshakes_per_sec: Option<u32>,
    /// Handshakes one source (IPv4 address, IPv6 /64) may start per second on the
    /// agent port [default: 50, as the sidecar's].
    #[arg(long, value_name = "N")]
    pub inbound_hellos_per_source_per_sec: Option<u32>,
    /// An inbound connection must prove its admission within this, ms [default: 5000].
    #[arg(long, value_name = "MS")]
    pub admission_timeout_ms: Option<u64>,
    /// The longest delegation or TLS certificate signed for a proxy, seconds,
    /// whatever it asks (1 to 86400) [default: 3600].
    #[arg(long, value_name = "SECS")]
    pub max_delegation_secs: Option<u64>,
    /// Delegations and certificates per workload per minute on average; over it
    /// (and the burst) a request is refused with 429 [default: 30].
    #[arg(long, value_name = "N")]
    pub delegations_per_minute: Option<u32>,
    /// Delegations and certificates per workload in a burst [default: 30].
    #[arg(long, value_name = "N")]
    pub delegation_burst: Option<u32>,
}

/// The backstops' period with one-hop routing, ms: gossip pushes revocations and
/// compares logs every pull (docs/PROTOCOL.md §6.14), so the DHT poll and the
/// periodic log sync only catch what it missed, and at 5 and 10 s they alone would
/// send more than the membership's upkeep.
pub const ONE_HOP_BACKSTOP_MS: u64 = 60_000;

impl Settings {
    /// How often the DHT is polled for revocations, ms: as set, else 10 s with Chord
    /// routing and [`ONE_HOP_BACKSTOP_MS`] with one hop.
    pub fn revocation_poll_ms(&self) -> u64 {
        self.revocation_poll_ms.unwrap_or(match self.routing {
            Routing::Chord => 10_000,
            Routing::OneHop => ONE_HOP_BACKSTOP_MS,
        })
    }

    /// How often trust logs are compared with two peers, ms: as set, else 5 s with
    /// Chord routing and [`ONE_HOP_BACKSTOP_MS`] with one hop.
    pub fn log_sync_ms(&self) -> u64 {
        self.log_sync_ms.unwrap_or(match self.routing {
            Routing::Chord => 5_000,
            Routing::OneHop => ONE_HOP_BACKSTOP_MS,
        })
    }

    /// Defaults, then the file named by `--config` (if any), then the flags.
    pub fn load(args: &AgentArgs) -> Result<Settings, ConfigError> {
        let mut s = match &args.config {
            Some(path) => Settings::from_file(path)?,
            None => Settings::default(),
        };
        macro_rules! over {
            ($($field:ident),*) => { $( if let Some(v) = &args.$field { s.$field = v.clone(); } )* };
        }
        over!(
            mesh,
            state_dir,
            listen,
            metrics,
            replicas,
            record_ttl_secs,
            republish_secs,
            resolve_cache_ms,
            request_timeout_ms,
            stabilise_ms,
            max_inbound_connections,
            max_inbound_per_ip,
            handshake_timeout_ms,
            inbound_idle_secs,
            resolve_fresh_per_sec,
            resolve_fresh_burst,
            log_format,
            routing,
            gossip_ms,
            resolve_lookups_per_sec,
            resolve_lookups_burst,
            inbound_handshakes_per_sec,
            inbound_hellos_per_source_per_sec,
            admission_timeout_ms,
            max_delegation_secs,
            delegations_per_minute,
            delegation_burst
        );
        if args.mesh_root.is_some() {
            s.mesh_root = args.mesh_root.clone();
        }
        if args.revocation_poll_ms.is_some() {
            s.revocation_poll_ms = args.revocation_poll_ms;
        }
        if args.log_sync_ms.is_some() {
            s.log_sync_ms = args.log_sync_ms;
        }
        s.capture |= args.capture;
        s.fast_path |= args.fast_path;
        if let Some(dir) = &args.bpf_pin_dir {
            s.bpf_pin_dir = dir.clone();
        }
        if args.advertise.is_some() {
            s.advertise = args.advertise;
        }
        if args.resolve_listen.is_some() {
            s.resolve_listen = args.resolve_listen;
        }
        if args.api_socket.is_some() {
            s.api_socket = args.api_socket.clone();
        }
        if !args.join.is_empty() {
            s.join = args.join.clone();
        }
        if !args.operator_uids.is_empty() {
            s.operator_uids = args.operator_uids.clone();
        }
        if !args.operator_cgroups.is_empty() {
            s.operator_cgroups = args.operator_cgroups.clone();
        }
        s.operator_own_pod |= args.operator_own_pod;
        if !args.controller_uids.is_empty() {
            s.controller_uids = args.controller_uids.clone();
        }
        s.require_binding |= args.require_binding;
        s.adopt_root_mesh(args.mesh.is_some())?;
        s.check()?;
        Ok(s)
    }

    /// Where the mesh root comes from: the setting, else `<state_dir>/mesh.root`.
    pub fn mesh_root_spec(&self) -> String {
        self.mesh_root.clone().unwrap_or_else(|| {
            self.state_dir
                .join(crate::trust::ROOT_FILE)
                .display()
                .to_string()
        })
    }

    /// Takes the mesh name from the root when one can be read; a mesh named
    /// explicitly must agree with it.
    fn adopt_root_mesh(&mut self, named: bool) -> Result<(), ConfigError> {
        let Ok(root) = crate::trust::load_root(&self.mesh_root_spec()) else {
            // Reported with its reason when the agent starts.
            return Ok(());
        };
        if named && self.mesh != root.mesh.as_str() {
            return Err(ConfigError::Invalid(format!(
                "--mesh {} differs from the mesh root's mesh {}",
                self.mesh, root.mesh
            )));
        }
        self.mesh = root.mesh.to_string();
        Ok(())
    }

    /// Reads a TOML settings file.
    pub fn from_file(path: &Path) -> Result<Settings, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_owned(),
            source,
        })?;
        toml::from_str(&text).map_err(|source| ConfigError::Parse {
            path: path.to_owned(),
            source: Box::new(source),
        })
    }

    fn check(&self) -> Result<(), ConfigError> {
        let invalid = |m: String| Err(ConfigError::Invalid(m));
        self.mesh_name()?;
        self.bootstrap()?;
        self.metrics_addr()?;
        if self.replicas > themis_dht::message::MAX_REPLICAS {
            return invalid(format!(
                "replicas must be at most {}",
                themis_dht::message::MAX_REPLICAS
            ));
        }
        if self.republish_secs == 0 || self.republish_secs * 2 > self.record_ttl_secs {
            return invalid(format!(
                "republish_secs ({}) must be non-zero and at most half of record_ttl_secs ({}), \
                 so records are refreshed before they expire",
                self.republish_secs, self.record_ttl_secs
            ));
        }
        if self.request_timeout_ms == 0
            || self.stabilise_ms == 0
            || self.op_timeout_ms == 0
            || self.revocation_poll_ms() == 0
            || self.log_sync_ms() == 0
            || self.gossip_ms == 0
        {
            return invalid("timeouts and periods must be non-zero".into());
        }
        let max_secs = themis_core::delegation::MAX_LIFETIME_MS / 1000;
        if !(1..=max_secs).contains(&self.max_delegation_secs) {
            return invalid(format!(
                "max_delegation_secs = {}: a delegation lasts 1 to {max_secs} seconds",
                self.max_delegation_secs
            ));
        }
        if self.gossip_ms > 600_000 {
            return invalid(format!(
                "gossip_ms = {}: the gossip's pull period is at most 600000 (10 minutes)",
                self.gossip_ms
            ));
        }
        if self.max_inbound_connections == 0
            || self.max_inbound_per_ip == 0
            || self.handshake_timeout_ms == 0
            || self.inbound_handshakes_per_sec == 0
            || self.inbound_hellos_per_source_per_sec == 0
            || self.admission_timeout_ms == 0
        {
            return invalid(
                "max_inbound_connections, max_inbound_per_ip, handshake_timeout_ms, \
                 inbound_handshakes_per_sec, inbound_hellos_per_source_per_sec and \
                 admission_timeout_ms must be non-zero"
                    .into(),
            );
        }
        // Healthy links are used every stabilisation period, and the initiator drops
        // its idle sessions after session_idle_secs: the responder must wait longer.
        if self.inbound_idle_secs <= self.session_idle_secs
            || self.inbound_idle_secs * 1000 <= self.stabilise_ms.saturating_mul(3)
        {
            return invalid(format!(
                "inbound_idle_secs ({}) must exceed session_idle_secs ({}) and three \
                 stabilisation periods ({} ms each), or healthy links would be cut",
                self.inbound_idle_secs, self.session_idle_secs, self.stabilise_ms
            ));
        }
        Ok(())
    }

    /// The mesh name, checked.
    pub fn mesh_name(&self) -> Result<MeshName, ConfigError> {
        MeshName::new(&self.mesh)
            .map_err(|e| ConfigError::Invalid(format!("mesh {:?}: {e}", self.mesh)))
    }

    /// The bootstrap peers, parsed from `<id>@<ip:port>`.
    pub fn bootstrap(&self) -> Result<Vec<Peer>, ConfigError> {
        let mesh = self.mesh_name()?;
        self.join
            .iter()
            .map(|spec| parse_peer(spec, &mesh))
            .collect()
    }

    /// The metrics address, `None` when `off`.
    pub fn metrics_addr(&self) -> Result<Option<SocketAddr>, ConfigError> {
        if self.metrics == "off" {
            return Ok(None);
        }
        self.metrics.parse().map(Some).map_err(|_| {
            ConfigError::Invalid(format!(
                "metrics: {:?} is neither ip:port nor off",
                self.metrics
            ))
        })
    }

    /// The API socket path.
    pub fn api_socket(&self) -> PathBuf {
        self.api_socket
            .clone()
            .unwrap_or_else(|| self.state_dir.join("agent.sock"))
    }

    /// The overlay's settings.
    pub fn overlay(&self) -> OverlayConfig {
        let request_timeout = self.request_timeout_ms;
        OverlayConfig {
            dht: themis_dht::Config {
                request_timeout,
                stabilise_every: self.stabilise_ms,
                fix_finger_every: (self.stabilise_ms / 2).max(1),
                check_predecessor_every: self.stabilise_ms * 2,
                republish_every: self.republish_secs * 1000,
                max_ttl: (self.record_ttl_secs * 1000).max(3_600_000),
                ..themis_dht::Config::default()
            },
            op_timeout: Duration::from_millis(self.op_timeout_ms),
            join_retry: Duration::from_secs(1),
        }
    }

    /// The registry's settings.
    pub fn registry(&self) -> RegistryConfig {
        RegistryConfig {
            replicas: self.replicas,
            record_ttl: Duration::from_secs(self.record_ttl_secs),
            cache_ttl: Duration::from_millis(self.resolve_cache_ms),
            cache_capacity: self.resolve_cache_entries.max(1),
            fresh_per_sec: self.resolve_fresh_per_sec,
            fresh_burst: self.resolve_fresh_burst.max(1),
            lookups_per_sec: self.resolve_lookups_per_sec,
            lookups_burst: self.resolve_lookups_burst.max(1),
            require_binding: self.require_binding,
            max_delegation: Duration::from_secs(self.max_delegation_secs),
            delegations_per_minute: self.delegations_per_minute,
            delegation_burst: self.delegation_burst.max(1),
        }
    }

    /// The settings of the connections other agents open to this one.
    pub fn inbound(&self) -> (themis_net::Config, themis_net::Limits) {
        (
            themis_net::Config {
                handshake_timeout: Duration::from_millis(self.handshake_timeout_ms),
                ..themis_net::Config::default()
            },
            themis_net::Limits {
                max_connections: self.max_inbound_connections,
                max_per_source: self.max_inbound_per_ip,
                max_per_peer: themis_net::DEFAULT_MAX_PER_PEER,
                idle_timeout: Duration::from_secs(self.inbound_idle_secs),
                admission_timeout: Duration::from_millis(self.admission_timeout_ms),
                max_unadmitted_frame: crate::overlay::MAX_REQUEST_FRAME,
                hellos_per_source: themis_core::Rate {
                    per_second: self.inbound_hellos_per_source_per_sec,
                    burst: self.inbound_hellos_per_source_per_sec.saturating_mul(2),
                },
                handshake_budget: themis_core::BudgetConfig {
                    rate: themis_core::Rate {
                        per_second: self.inbound_handshakes_per_sec,
                        burst: self.inbound_handshakes_per_sec.saturating_mul(2),
                    },
                    ..themis_core::BudgetConfig::default()
                },
            },
        )
    }
}

/// Parses `<printable id>@<ip:port>`.
pub fn parse_peer(spec: &str, mesh: &MeshName) -> Result<Peer, ConfigError> {
    let invalid = |why: String| ConfigError::Invalid(format!("join {spec:?}: {why}"));
    let (id, addr) = spec.rsplit_once('@').ok_or_else(|| {
        invalid(
            "expected <id>@<ip:port>, e.g. the `id` and `listen` that `themis status` prints"
                .into(),
        )
    })?;
    let id = PeerId::parse_in(id, mesh).map_err(|e| invalid(e.to_string()))?;
    let addr: SocketAddr = addr
        .parse()
        .map_err(|_| invalid(format!("{addr:?} is not an ip:port")))?;
    Ok(Contact {
        id: Key(id.0),
        addr,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_override_the_file_and_bad_values_are_named() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("agent.toml");
        std::fs::write(
            &file,
            "mesh = \"prod\"\nreplicas = 3\nlisten = \"127.0.0.1:7000\"\n",
        )
        .unwrap();
        let args = AgentArgs {
            config: Some(file.clone()),
            replicas: Some(1),
            // Not the default /var/lib/themis: a mesh root there names the mesh.
            state_dir: Some(dir.path().to_owned()),
            ..AgentArgs::default()
        };
        let s = Settings::load(&args).unwrap();
        assert_eq!(
            (s.mesh.as_str(), s.replicas, s.listen.port()),
            ("prod", 1, 7000)
        );

        std::fs::write(&file, "mesh = \"prod\"\nreplica = 3\n").unwrap();
        let error = Settings::load(&args).unwrap_err().to_string();
        assert!(error.contains("unknown field `replica`"), "{error}");

        for (args, expect) in [
            (
                AgentArgs {
                    replicas: Some(9),
                    ..Default::default()
                },
                "replicas",
            ),
            (
                AgentArgs {
                    mesh: Some("Bad Mesh".into()),
                    ..Default::default()
                },
                "mesh",
            ),
            (
                AgentArgs {
                    join: vec!["127.0.0.1:7400".into()],
                    ..Default::default()
                },
                "expected <id>@<ip:port>",
            ),
            (
                AgentArgs {
                    metrics: Some("nowhere".into()),
                    ..Default::default()
                },
                "metrics",
            ),
            (
                AgentArgs {
                    republish_secs: Some(50),
                    ..Default::default()
                },
                "republish_secs",
            ),
            (
                AgentArgs {
                    max_delegation_secs: Some(0),
                    ..Default::default()
                },
                "max_delegation_secs",
            ),
            (
                AgentArgs {
                    max_delegation_secs: Some(86_401),
                    ..Default::default()
                },
                "1 to 86400 seconds",
            ),
        ] {
            let error = Settings::load(&args).unwrap_err().to_string();
            assert!(error.contains(expect), "{error}");
        }
    }

    #[test]
    fn one_hop_routing_is_the_default_and_chord_is_chosen_by_file_or_flag() {
        assert_eq!(Settings::default().routing, Routing::OneHop);
        let dir = tempfile::tempdir().unwrap();
        // Not the default /var/lib/themis, whatever this machine holds there.
        let here = AgentArgs {
            state_dir: Some(dir.path().to_owned()),
            ..AgentArgs::default()
        };
        assert_eq!(Settings::load(&here).unwrap().routing, Routing::OneHop);

        let file = dir.path().join("agent.toml");
        std::fs::write(&file, "routing = \"chord\"\n").unwrap();
        let from_file = AgentArgs {
            config: Some(file.clone()),
            ..here.clone()
        };
        assert_eq!(Settings::load(&from_file).unwrap().routing, Routing::Chord);
        let flag_over_file = AgentArgs {
            routing: Some(Routing::OneHop),
            ..from_file
        };
        assert_eq!(
            Settings::load(&flag_over_file).unwrap().routing,
            Routing::OneHop
        );
        let flag = AgentArgs {
            routing: Some(Routing::Chord),
            ..here
        };
        assert_eq!(Settings::load(&flag).unwrap().routing, Routing::Chord);
    }
}
