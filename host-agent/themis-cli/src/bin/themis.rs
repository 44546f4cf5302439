//! `themis`: the tool for people. Runs the agent, manages identities, and talks to a
//! running agent over its local API.

use std::net::{SocketAddrV4, SocketAddrV6};
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use ring::rand::SystemRandom;
use serde::Deserialize;
use serde_json::{json, Value};
use themis_agent::config::{AgentArgs, DEFAULT_STATE_DIR};
use themis_agent::keystore;
use themis_agent_client::ApiClient;
use themis_agent_client::{Method, StatusCode};
use themis_capture::{CaptureSpec, IpNet};
use themis_contracts::{api as contract, paths};
use themis_core::{Identity, MeshName, PeerId};

#[path = "themis/log.rs"]
mod log;
#[path = "themis/sidecar.rs"]
mod sidecar;

/// Themis Mesh: CA-less service identities and decentralised discovery.
///
/// The mesh operator creates a mesh (`themis mesh create`), admits nodes
/// (`themis node admit`) and grants them services (`themis service grant`), offline,
/// with the mesh key. Run `themis agent` on every admitted node; the other commands
/// talk to the local agent over its Unix socket (`--socket`, default
/// /var/lib/themis/agent.sock).
#[derive(Parser)]
#[command(version, propagate_version = true, args_override_self = true)]
struct Cli {
    /// The local agent's API socket.
    #[arg(long, global = true, env = "THEMIS_SOCKET", default_value_t = default_socket())]
    socket: String,
    /// Print the agent's JSON answer instead of text.
    #[arg(long, global = true)]
    json: bool,
    #[command(subcommand)]
    command: Command,
}

fn default_socket() -> String {
    format!("{DEFAULT_STATE_DIR}/agent.sock")
}

// Parsed once per run: the size of the agent's flags does not matter.
#[allow(clippy::large_enum_variant)]
#[derive(Subcommand)]
enum Command {
    /// Run the host agent (until SIGTERM or Ctrl-C, which leave the ring gracefully).
    Agent(AgentArgs),
    /// This node: id, mesh, address, ring membership.
    Status,
    /// The ring as this node sees it: predecessor, successors, fingers, objects held.
    Ring,
    /// Identity key files.
    #[command(subcommand)]
    Id(IdCommand),
    /// Create a mesh: its offline root key (operator).
    #[command(subcommand)]
    Mesh(MeshCommand),
    /// Admit a node to the mesh (operator, offline).
    #[command(subcommand)]
    Node(NodeCommand),
    /// Say who may serve a service (operator or service authority, offline).
    #[command(subcommand)]
    Service(ServiceCommand),
    /// Revoke node, authority or workload keys for good (operator, offline): the
    /// revocations enter the mesh directory's trust log under a new checkpoint; with
    /// --publish, the local agent takes the log and its peers take it from there.
    Revoke {
        /// The printable ids of the keys to revoke.
        #[arg(required = true, value_name = "ID")]
        ids: Vec<String>,
        /// The mesh directory (`themis mesh create --out`).
        #[arg(long, env = "THEMIS_MESH_DIR", value_name = "DIR")]
        mesh_dir: PathBuf,
        /// Why, for people (at most 128 bytes).
        #[arg(long, default_value = "")]
        reason: String,
        /// Also write the revocation to this file.
        #[arg(long, value_name = "FILE")]
        out: Option<PathBuf>,
        /// Publish the trust log through the local agent (`--socket`): fails unless
        /// the agent took the new checkpoint.
        #[arg(long)]
        publish: bool,
    },
    /// The mesh's trust log: every admission, grant and revocation the root signed,
    /// under root-signed checkpoints (docs/PROTOCOL.md §6.13).
    #[command(subcommand)]
    Log(LogCommand),
    /// A workload's sidecar Envoy (offline: renders, calls no agent).
    #[command(subcommand)]
    Sidecar(sidecar::SidecarCommand),
    /// Publish a revocation file through the local agent.
    Publish {
        /// The file `themis revoke --out` wrote.
        revocation: PathBuf,
    },
    /// The revocations the local agent knows.
    Revocations,
    /// Why each instance stored for a service is or is not trusted.
    Explain {
        /// Service name.
        service: String,
    },
    /// Create a local workload's identity on the agent (if it has none) and show it.
    Workload {
        /// Workload name (DNS subdomain rules: `web`, `web.prod`).
        name: String,
        /// Bind it to its pod: only callers in this cgroup v2 directory (or below) may
        /// use its identity (docs/AGENT.md, "The node's trust model"); needs
        /// --owner-uid or --any-uid.
        #[arg(long, value_name = "DIR")]
        owner_cgroup: Option<PathBuf>,
        /// Required with --owner-cgroup (unless --any-uid): the proxy's uid, which callers
        /// must run as (Istio's sidecar: 1337).
        #[arg(long, value_name = "UID", requires = "owner_cgroup")]
        owner_uid: Option<u32>,
        /// With --owner-cgroup and no --owner-uid: any uid in the cgroup may use the
        /// identity. Only where the platform gives the proxy no uid of its own.
        #[arg(long, requires = "owner_cgroup", conflicts_with = "owner_uid")]
        any_uid: bool,
    },
    /// Delete a local workload registered nowhere (deregister it first): its key and
    /// its pod binding. A workload of the same name created later gets a new key, so a
    /// new id; what it delegated lives out its lifetime. The node controller does this
    /// when a pod is gone.
    Forget {
        /// Workload name.
        name: String,
    },
    /// Delegate a local workload's handshake signing to a fresh key, written with the
    /// delegation to a new file (mode 0600), for a client outside a sidecar: the
    /// standalone component (`wasmtime run themis_component.wasm call --credential
    /// FILE`). The workload's own key stays in the agent; whoever holds the file
    /// speaks as the workload until the delegation expires, and no longer.
    Delegate {
        /// The local workload.
        workload: String,
        /// Where to write the credential (never overwritten).
        #[arg(long, value_name = "FILE")]
        out: PathBuf,
        /// How long the delegation lasts, in seconds (an hour if not given), capped by
        /// the agent's `max_delegation_secs` (an hour by default, at most a day).
        #[arg(long, value_name = "SECS")]
        lifetime_secs: Option<u64>,
    },
    /// Register a local workload as an instance of a service.
    Register {
        /// Service name, e.g. `check`.
        service: String,
        /// The local workload (its identity is created if needed).
        #[arg(long)]
        workload: String,
        /// Where the workload's proxy accepts mesh traffic, ip:port.
        #[arg(long)]
        endpoint: String,
        /// A label, key=value (repeatable), e.g. version=v2.
        #[arg(long = "meta", value_name = "KEY=VALUE")]
        metadata: Vec<String>,
        /// The transports its sidecar takes, as rendered (`themis sidecar render
        /// --transport`): `themis` (the default, no label), `tls` or `tls,themis`.
        /// Signed into its record as the label `themis.transport`: callers use only
        /// what it names.
        #[arg(long, value_name = "LIST")]
        transport: Option<String>,
        #[command(flatten)]
        capture: CaptureArgs,
    },
    /// Withdraw a registration.
    Deregister {
        /// Service name.
        service: String,
        /// The local workload.
        #[arg(long)]
        workload: String,
    },
    /// Resolve a service to its live, verified instances.
    Resolve {
        /// Service name.
        service: String,
        /// Skip the agent's resolution cache.
        #[arg(long)]
        fresh: bool,
    },
    /// Registrations of this node.
    Workloads,
    /// eBPF capture on this node: workloads, their cgroups and attached programs (from
    /// the kernel), the outbound listeners' guard, the fast path, counters.
    Capture,
    /// Raw DHT operations, for debugging.
    #[command(subcommand)]
    Debug(DebugCommand),
}

/// `themis log ...`.
#[derive(Subcommand)]
enum LogCommand {
    /// The history: every leaf, or those about one id or service (`themis log show
    /// check`), from the local agent's copy or the mesh directory's.
    Show {
        /// A printable id (node, authority, workload) or a service name.
        subject: Option<String>,
        /// Read the operator's copy in this mesh directory instead of asking the agent.
        #[arg(long, value_name = "DIR")]
        mesh_dir: Option<PathBuf>,
    },
    /// The checkpoint the local agent holds, and the forks it has seen.
    Status,
    /// Verify a whole copy of the log (`trust-log.bin`, or `GET /v1/log/copy`) from its
    /// first leaf against the mesh root.
    Verify {
        /// The copy.
        file: PathBuf,
        /// The mesh root, `<mesh>:<hex>` or a file holding it (`mesh.root`).
        #[arg(long, env = "THEMIS_MESH_ROOT", value_name = "ROOT")]
        mesh_root: String,
    },
    /// Hand the mesh directory's log to the local agent, which spreads it: fails
    /// unless the agent took its checkpoint.
    Publish {
        /// The mesh directory.
        #[arg(long, env = "THEMIS_MESH_DIR", value_name = "DIR")]
        mesh_dir: PathBuf,
    },
    /// Add statements the root signed before the mesh had a log (migration): PEM
    /// files such as a node's admission.pem and grants/*.pem, an agent's
    /// revocations.pem. Root-signed statements only; those already logged are skipped.
    Import {
        /// The mesh directory.
        #[arg(long, env = "THEMIS_MESH_DIR", value_name = "DIR")]
        mesh_dir: PathBuf,
        /// PEM files.
        #[arg(required = true)]
        files: Vec<PathBuf>,
    },
}

/// eBPF capture of the workload's traffic (the agent must run with `--capture`).
#[derive(clap::Args)]
#[command(next_help_heading = "Capture")]
struct CaptureArgs {
    /// The workload's cgroup v2 directory: its TCP connects go to the proxy's outbound
    /// listener, with the original destination kept for SO_ORIGINAL_DST.
    #[arg(long, value_name = "DIR")]
    cgroup: Option<PathBuf>,
    /// The proxy's cgroup (e.g. the sidecar container's): never captured.
    #[arg(long, value_name = "DIR", requires = "cgroup")]
    proxy_cgroup: Option<PathBuf>,
    /// The proxy's uid: never captured.
    #[arg(long, value_name = "UID", requires = "cgroup")]
    proxy_uid: Option<u32>,
    /// The proxy's outbound listener [default: 127.0.0.1:15001].
    #[arg(long, value_name = "IP:PORT", requires = "cgroup")]
    outbound: Option<SocketAddrV4>,
    /// The proxy's IPv6 outbound listener; without it IPv6 connects are not captured.
    #[arg(long, value_name = "[IP]:PORT", requires = "cgroup")]
    outbound6: Option<SocketAddrV6>,
    /// The network namespace the proxy's listeners are in (/proc/PID/ns/net,
    /// /run/netns/NAME): only the pod may connect to its outbound listener there
    /// [default: the agent's].
    #[arg(long, value_name = "FILE", requires = "cgroup")]
    netns: Option<PathBuf>,
    /// An app port: it takes TCP only via the local proxy, and no UDP from the network;
    /// the pod also stops taking ICMP other than errors, fragments and other protocols
    /// (docs/CAPTURE.md) (repeatable).
    #[arg(long = "inbound-port", value_name = "PORT", requires = "cgroup")]
    inbound_ports: Vec<u16>,
    /// Every TCP port instead, as Istio: connections from the network open only at the
    /// proxy's sockets (needs --proxy-uid) and at --exempt-inbound-port; UDP is left alone.
    #[arg(long, requires = "proxy_uid", conflicts_with = "inbound_ports")]
    inbound_all_tcp: bool,
    /// With --inbound-all-tcp: a port that takes connections from the network
    /// directly, unsealed (repeatable).
    #[arg(
        long = "exempt-inbound-port",
        value_name = "PORT",
        requires = "inbound_all_tcp"
    )]
    exempt_inbound_ports: Vec<u16>,
    /// A destination port never captured (repeatable).
    #[arg(long = "exclude-port", value_name = "PORT", requires = "cgroup")]
    exclude_ports: Vec<u16>,
    /// A destination CIDR never captured (repeatable) [default: 127.0.0.0/8 and ::1/128].
    #[arg(long = "exclude-cidr", value_name = "CIDR", requires = "cgroup")]
    exclude_cidrs: Vec<IpNet>,
}

impl CaptureArgs {
    /// The registration's capture, if a cgroup was given; unset flags keep the defaults.
    fn spec(self) -> Option<CaptureSpec> {
        let defaults = CaptureSpec::new(self.cgroup?);
        Some(CaptureSpec {
            proxy_cgroup: self.proxy_cgroup,
            proxy_uid: self.proxy_uid,
            outbound: self.outbound.unwrap_or(defaults.outbound),
            outbound6: self.outbound6,
            netns: self.netns,
            inbound_ports: self.inbound_ports,
            inbound_all_tcp_except: self.inbound_all_tcp.then_some(self.exempt_inbound_ports),
            exclude_ports: self.exclude_ports,
            exclude_cidrs: if self.exclude_cidrs.is_empty() {
                defaults.exclude_cidrs
            } else {
                self.exclude_cidrs
            },
            cgroup: defaults.cgroup,
        })
    }
}

#[derive(Subcommand)]
enum IdCommand {
    /// Create a new identity key file (mode 0600; never overwrites).
    New {
        /// The mesh the identity belongs to.
        #[arg(long)]
        mesh: String,
        /// Where to write the key file.
        #[arg(long)]
        out: PathBuf,
    },
    /// Show the id and public key of a key file.
    Show {
        /// The key file (PEM PKCS#8, as `openssl genpkey -algorithm ed25519` writes).
        key: PathBuf,
        /// The mesh.
        #[arg(long)]
        mesh: String,
    },
    /// Check that a key file is the key of a printable id (exit 1 if not).
    Check {
        /// The printable id (its mesh is part of it).
        id: String,
        /// The key file.
        #[arg(long)]
        key: PathBuf,
    },
}

#[derive(Subcommand)]
enum MeshCommand {
    /// Create a new mesh: writes DIR/mesh.key (0600, keep it offline: no agent ever
    /// reads it) and DIR/mesh.root (public: every agent is configured with it).
    Create {
        /// The mesh name (1-31 of a-z 0-9 - .).
        name: String,
        /// Where to write the mesh key and root.
        #[arg(long, value_name = "DIR")]
        out: PathBuf,
    },
}

#[derive(Subcommand)]
enum NodeCommand {
    /// Admit a node: generates its key (so it cannot choose its ring position) and
    /// writes node.key, admission.pem and mesh.root into DIR, the node agent's state
    /// directory.
    Admit {
        /// The mesh directory.
        #[arg(long, env = "THEMIS_MESH_DIR", value_name = "DIR")]
        mesh_dir: PathBuf,
        /// The node's directory (its agent's --state-dir).
        #[arg(long, value_name = "DIR")]
        out: PathBuf,
        /// Admit a node.key already in DIR instead of generating one.
        #[arg(long)]
        existing_key: bool,
    },
    /// Grant an admitted node the addresses its workloads listen at besides its own:
    /// on Kubernetes its pod range (`kubectl get node NAME -o
    /// jsonpath='{.spec.podCIDR}'`). With one-hop routing, an instance endpoint must
    /// be at its node's announced address or in its range. Writes
    /// DIR/address-range.pem (the agent reads it at start; an earlier grant stays valid
    /// until the node is revoked).
    Range {
        /// The range, e.g. 10.244.1.0/24 (at most a /8 of IPv4, a /32 of IPv6).
        range: themis_trust::IpNet,
        /// The mesh directory.
        #[arg(long, env = "THEMIS_MESH_DIR", value_name = "DIR")]
        mesh_dir: PathBuf,
        /// The node's directory (its agent's --state-dir).
        #[arg(long, value_name = "DIR")]
        node: PathBuf,
    },
}

#[derive(Subcommand)]
enum ServiceCommand {
    /// The mesh root grants a service to a node: its agent may endorse local
    /// instances of it. Writes DIR/grants/<service>.pem.
    Grant {
        /// Service name.
        service: String,
        /// The mesh directory.
        #[arg(long, env = "THEMIS_MESH_DIR", value_name = "DIR")]
        mesh_dir: PathBuf,
        /// The node's directory (as `themis node admit --out` made it).
        #[arg(long, value_name = "DIR")]
        node: PathBuf,
    },
    /// The mesh root creates a per-service authority that may grant the service to
    /// nodes without the mesh key.
    Authority {
        /// Service name.
        service: String,
        /// The mesh directory.
        #[arg(long, env = "THEMIS_MESH_DIR", value_name = "DIR")]
        mesh_dir: PathBuf,
        /// Where to write the authority's key and grant.
        #[arg(long, value_name = "DIR")]
        out: PathBuf,
    },
    /// On Kubernetes: the mesh root lets pods of a namespace (and, with
    /// --service-account, only those running as one of these ServiceAccounts) serve a
    /// service. Agents started with --require-binding endorse no other pod as it,
    /// whatever its annotations say. Replaces the namespace's earlier binding of the
    /// service. Logged only: `themis log publish` hands it to the agents.
    Bind {
        /// Service name.
        service: String,
        /// The Kubernetes namespace.
        #[arg(long)]
        namespace: String,
        /// A ServiceAccount of that namespace (repeat for several); none: any.
        #[arg(long = "service-account", value_name = "NAME")]
        service_accounts: Vec<String>,
        /// The mesh directory.
        #[arg(long, env = "THEMIS_MESH_DIR", value_name = "DIR")]
        mesh_dir: PathBuf,
    },
    /// The mesh root withdraws a namespace's binding of a service: its pods are no
    /// longer endorsed as it (their records lapse within the record TTL).
    Unbind {
        /// Service name.
        service: String,
        /// The Kubernetes namespace.
        #[arg(long)]
        namespace: String,
        /// The mesh directory.
        #[arg(long, env = "THEMIS_MESH_DIR", value_name = "DIR")]
        mesh_dir: PathBuf,
    },
    /// A per-service authority grants its service to a node.
    Endorse {
        /// Service name.
        service: String,
        /// The authority's directory (`themis service authority --out`).
        #[arg(long, value_name = "DIR")]
        authority: PathBuf,
        /// The node's directory.
        #[arg(long, value_name = "DIR")]
        node: PathBuf,
    },
}

#[derive(Subcommand)]
enum DebugCommand {
    /// Find the node responsible for a 64-hex-digit key.
    Find {
        /// The key.
        key: String,
    },
    /// Store a raw value under a name.
    Store {
        /// Name.
        name: String,
        /// Value (text, or hex with --hex).
        value: String,
        /// The value is hex.
        #[arg(long)]
        hex: bool,
        /// Extra replicas.
        #[arg(long, default_value_t = 0)]
        replicas: u8,
        /// Lifetime in milliseconds.
        #[arg(long, default_value_t = 60_000)]
        ttl_ms: u64,
    },
    /// The raw values stored under a name.
    Values {
        /// Name.
        name: String,
        /// Extra replicas to try.
        #[arg(long, default_value_t = 0)]
        replicas: u8,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let command = match cli.command {
        Command::Agent(args) => return themis_agent::agent::main(&args),
        Command::Id(id) => return identity(id, cli.json),
        Command::Mesh(_) | Command::Node(_) | Command::Service(_) => {
            return offline(cli.command, cli.json)
        }
        Command::Revoke {
            ids,
            mesh_dir,
            reason,
            out,
            publish,
        } => match revocation(&ids, &mesh_dir, &reason, out.as_deref(), cli.json) {
            Ok(_) if publish => {
                return log::command(LogCommand::Publish { mesh_dir }, &cli.socket, cli.json)
            }
            Ok(_) => return ExitCode::SUCCESS,
            Err(code) => return code,
        },
        Command::Log(command) => return log::command(command, &cli.socket, cli.json),
        Command::Sidecar(command) => return sidecar::command(command, &cli.socket),
        Command::Delegate {
            workload,
            out,
            lifetime_secs,
        } => return delegate(&cli.socket, &workload, &out, lifetime_secs, cli.json),
        command => command,
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("starting the tokio runtime");
    let api = ApiClient::new(&cli.socket);
    match runtime.block_on(call(&api, command)) {
        Ok((status, answer, render)) if status.is_success() => {
            if cli.json {
                println!("{}", serde_json::to_string_pretty(&answer).expect("JSON"));
            } else {
                print!("{}", render(&answer));
            }
            ExitCode::SUCCESS
        }
        Ok((status, answer, _)) => {
            if cli.json {
                println!("{}", serde_json::to_string_pretty(&answer).expect("JSON"));
            }
            let error = contract::ErrorBody::deserialize(&answer).map(|e| e.error);
            eprintln!(
                "error: {} ({status})",
                error.as_deref().unwrap_or("no details")
            );
            ExitCode::FAILURE
        }
        Err(message) => {
            eprintln!("error: {message}");
            ExitCode::from(2)
        }
    }
}

type Render = fn(&Value) -> String;

async fn call(api: &ApiClient, command: Command) -> Result<(StatusCode, Value, Render), String> {
    let seg = |s: &str| -> Result<String, String> {
        // Names are checked by the agent; refuse here only what would break the URL.
        if s.is_empty() || s.contains(['/', '?', '#', '%']) {
            Err(format!("{s:?} is not a valid name"))
        } else {
            Ok(s.to_owned())
        }
    };
    let (method, path, body, render): (Method, String, Option<Value>, Render) = match command {
        Command::Status => (Method::GET, paths::STATUS.into(), None, render_status),
        Command::Ring => (Method::GET, paths::RING.into(), None, render_ring),
        Command::Forget { name } => (
            Method::DELETE,
            paths::workload(seg(&name)?),
            None,
            render_forgotten,
        ),
        Command::Workload {
            name,
            owner_cgroup,
            owner_uid,
            any_uid,
        } => {
            if owner_cgroup.is_some() && owner_uid.is_none() && !any_uid {
                return Err(
                    "--owner-cgroup needs --owner-uid UID (the proxy's uid, e.g. Istio's \
                     1337), or --any-uid if any process in that cgroup may use the identity"
                        .into(),
                );
            }
            let owner = owner_cgroup.map(|cgroup| contract::Owner {
                cgroup: cgroup.display().to_string(),
                uid: owner_uid,
                any_uid,
            });
            let body = owner.map(|owner| {
                serde_json::to_value(contract::CreateWorkload { owner: Some(owner) })
                    .expect("serialises")
            });
            (
                Method::PUT,
                paths::workload(seg(&name)?),
                body,
                render_workload,
            )
        }
        Command::Register {
            service,
            workload,
            endpoint,
            metadata,
            transport,
            capture,
        } => {
            let mut meta = serde_json::Map::new();
            for pair in metadata {
                let (k, v) = pair
                    .split_once('=')
                    .ok_or_else(|| format!("--meta {pair:?}: expected KEY=VALUE"))?;
                meta.insert(k.to_owned(), Value::String(v.to_owned()));
            }
            if let Some(list) = transport {
                let names = contract::transports(&list).map_err(|e| format!("--transport: {e}"))?;
                meta.insert(
                    contract::TRANSPORT_LABEL.to_owned(),
                    Value::String(names.join(",")),
                );
            }
            let path = paths::instance(seg(&service)?, seg(&workload)?);
            // `contract::Register`, with the endpoint as typed: the agent judges it.
            (
                Method::PUT,
                path,
                Some(json!({ "endpoint": endpoint, "metadata": meta, "capture": capture.spec() })),
                render_registered,
            )
        }
        Command::Deregister { service, workload } => {
            let path = paths::instance(seg(&service)?, seg(&workload)?);
            (Method::DELETE, path, None, render_deregistered)
        }
        Command::Resolve { service, fresh } => (
            Method::GET,
            paths::resolve(seg(&service)?, fresh),
            None,
            render_resolved,
        ),
        Command::Workloads => (Method::GET, paths::WORKLOADS.into(), None, render_workloads),
        Command::Publish { revocation } => {
            let pem = std::fs::read_to_string(&revocation)
                .map_err(|e| format!("{}: {e}", revocation.display()))?;
            (
                Method::POST,
                paths::REVOCATIONS.into(),
                Some(publish(pem)),
                render_published,
            )
        }
        Command::Revocations => {
            let (status, answer) = all_revocations(api).await?;
            return Ok((status, answer, render_revocations));
        }
        Command::Explain { service } => (
            Method::GET,
            paths::explain(seg(&service)?),
            None,
            render_explanation,
        ),
        Command::Capture => (Method::GET, paths::CAPTURE.into(), None, render_capture),
        Command::Debug(DebugCommand::Find { key }) => (
            Method::GET,
            paths::debug_find(seg(&key)?),
            None,
            render_json,
        ),
        Command::Debug(DebugCommand::Store {
            name,
            value,
            hex,
            replicas,
            ttl_ms,
        }) => {
            let body = json!({
                "name": name, "value": value, "hex": hex, "replicas": replicas, "ttl_ms": ttl_ms,
            });
            (
                Method::POST,
                paths::DEBUG_STORE.into(),
                Some(body),
                render_json,
            )
        }
        Command::Debug(DebugCommand::Values { name, replicas }) => (
            Method::GET,
            paths::debug_values(seg(&name)?, replicas),
            None,
            render_json,
        ),
        Command::Agent(_)
        | Command::Delegate { .. }
        | Command::Id(_)
        | Command::Mesh(_)
        | Command::Node(_)
        | Command::Service(_)
        | Command::Revoke { .. }
        | Command::Log(_)
        | Command::Sidecar(_) => unreachable!("handled without the agent"),
    };
    let (status, answer) = api
        .call(method, &path, body.as_ref())
        .await
        .map_err(|e| e.to_string())?;
    Ok((status, answer, render))
}

/// The most pages `themis revocations` reads (a million revocations): an agent that
/// keeps saying there is more cannot keep the tool forever.
const MAX_REVOCATION_PAGES: usize = 4_096;

/// `themis revocations`: the agent's list read page by page, so that no answer grows
/// with the mesh (a whole list with its proofs outgrows the client's 4 MiB limit past
/// ~3,000), joined as one answer; an agent from before pages (400), or one that lists
/// everything at once, is taken whole. Pages proven under different checkpoints (the
/// log grew meanwhile) keep none.
async fn all_revocations(api: &ApiClient) -> Result<(StatusCode, Value), String> {
    let get = |path: String| async move {
        api.call(Method::GET, &path, None)
            .await
            .map_err(|e| e.to_string())
    };
    let mut joined: Option<contract::Revocations> = None;
    let mut path = paths::revocations_since(0, 0, 0);
    for _ in 0..MAX_REVOCATION_PAGES {
        let (status, answer) = get(path.clone()).await?;
        if status == StatusCode::BAD_REQUEST && joined.is_none() {
            return get(paths::REVOCATIONS.into()).await;
        }
        if !status.is_success() {
            return Ok((status, answer));
        }
        let page: contract::Revocations = serde_json::from_value(answer)
            .map_err(|e| format!("the agent's revocations are unreadable: {e}"))?;
        let (Some(list), Some(from), Some(total)) = (page.list, page.from, page.total) else {
            return Ok((status, serde_json::to_value(page).expect("JSON")));
        };
        let next = from + page.revocations.len();
        joined = Some(match joined.take() {
            // The next page of the same list.
            Some(mut all) if all.list == Some(list) && all.total == Some(from) => {
                if all.checkpoint != page.checkpoint {
                    all.checkpoint = None;
                }
                all.revocations.extend(page.revocations);
                all
            }
            // The first page (a restarted agent's list starts again from its first).
            _ => contract::Revocations {
                from: Some(0),
                ..page
            },
        });
        let all = joined.as_mut().expect("set above");
        all.total = Some(next);
        if next >= total || next == from {
            all.total = Some(all.revocations.len());
            return Ok((status, serde_json::to_value(all).expect("JSON")));
        }
        path = paths::revocations_since(list, next, 0);
    }
    Err(format!(
        "the agent listed more than {MAX_REVOCATION_PAGES} pages of revocations"
    ))
}

/// `themis delegate`: a fresh key, its delegation from the agent, both
/// written to `out` (a new file, mode 0600, no link followed).
fn delegate(
    socket: &str,
    workload: &str,
    out: &std::path::Path,
    lifetime_secs: Option<u64>,
    json: bool,
) -> ExitCode {
    use ring::rand::SecureRandom;
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    // The file first: an existing one is refused before the agent delegates anything.
    let mut file = match std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .custom_flags(libc::O_NOFOLLOW)
        .mode(0o600)
        .open(out)
    {
        Ok(file) => file,
        Err(e) => {
            eprintln!("error: {}: {e}", out.display());
            return ExitCode::FAILURE;
        }
    };
    let result = (|| -> Result<contract::Delegated, String> {
        if workload.is_empty() || workload.contains(['/', '?', '#', '%']) {
            return Err(format!("{workload:?} is not a valid name"));
        }
        let mut seed = zeroize::Zeroizing::new([0u8; 32]);
        SystemRandom::new()
            .fill(seed.as_mut())
            .map_err(|_| "the system's randomness failed")?;
        let key =
            themis_core::delegation::DelegatedKey::from_seed(&seed).map_err(|e| e.to_string())?;
        let request = contract::DelegateRequest {
            delegated_key: hex::encode(key.public_key()),
            lifetime_secs,
        };
        let body = serde_json::to_value(request).expect("JSON");
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("starting the tokio runtime");
        let api = ApiClient::new(socket);
        let path = paths::workload_delegate(workload);
        let (status, answer) = runtime
            .block_on(api.call(Method::POST, &path, Some(&body)))
            .map_err(|e| e.to_string())?;
        if !status.is_success() {
            let error = contract::ErrorBody::deserialize(&answer).map(|e| e.error);
            return Err(format!(
                "the agent refused: {} ({status})",
                error.as_deref().unwrap_or("no details")
            ));
        }
        let delegated = contract::Delegated::deserialize(&answer)
            .map_err(|e| format!("the agent's answer does not parse: {e}"))?;
        let mut credential = contract::DelegatedCredential {
            delegated,
            delegated_key_seed: hex::encode(seed.as_ref()),
        };
        let text =
            zeroize::Zeroizing::new(serde_json::to_string_pretty(&credential).expect("JSON"));
        zeroize::Zeroize::zeroize(&mut credential.delegated_key_seed);
        file.write_all(text.as_bytes())
            .and_then(|()| file.sync_all())
            .map_err(|e| format!("{}: {e}", out.display()))?;
        Ok(credential.delegated)
    })();
    if result.is_err() {
        // Nothing half-written (part of a key) is left behind.
        let _ = std::fs::remove_file(out);
    }
    match result {
        Ok(delegated) => {
            let d = &delegated;
            if json {
                let shown = json!({
                    "identity": d.identity, "not_after_ms": d.not_after_ms,
                    "service": d.service, "out": out.display().to_string(),
                });
                println!("{}", serde_json::to_string_pretty(&shown).expect("JSON"));
            } else {
                println!(
                    "delegated {workload} ({}) to a fresh key until {} (Unix ms); wrote {}: \
                     keep it private, it speaks as {workload} until then",
                    d.identity.id,
                    d.not_after_ms,
                    out.display()
                );
            }
            ExitCode::SUCCESS
        }
        Err(message) => {
            eprintln!("error: {message}");
            ExitCode::FAILURE
        }
    }
}

/// The body of `POST /v1/revocations`.
fn publish(pem: String) -> Value {
    serde_json::to_value(contract::PublishRevocation { revocation: pem }).expect("JSON")
}

fn identity(command: IdCommand, json: bool) -> ExitCode {
    let result = match command {
        IdCommand::New { mesh, out } => MeshName::new(&mesh)
            .map_err(|e| format!("mesh {mesh:?}: {e}"))
            .and_then(|mesh| {
                Identity::generate(mesh, &SystemRandom::new()).map_err(|e| e.to_string())
            })
            .and_then(|id| {
                keystore::write(&out, &id)
                    .map(|()| id)
                    .map_err(|e| e.to_string())
            })
            .map(|id| describe(&id, Some(&out))),
        IdCommand::Show { key, mesh } => MeshName::new(&mesh)
            .map_err(|e| format!("mesh {mesh:?}: {e}"))
            .and_then(|mesh| keystore::load(&key, &mesh).map_err(|e| e.to_string()))
            .map(|id| describe(&id, Some(&key))),
        IdCommand::Check { id, key } => {
            PeerId::parse(&id)
                .map_err(|e| e.to_string())
                .and_then(|(mesh, expected)| {
                    let identity = keystore::load(&key, &mesh).map_err(|e| e.to_string())?;
                    if identity.id() == expected {
                        Ok(json!({ "id": id, "key": key, "matches": true }))
                    } else {
                        Err(format!(
                            "{} is the key of {}, not of {id}",
                            key.display(),
                            identity.printable_id()
                        ))
                    }
                })
        }
    };
    match result {
        Ok(value) => {
            if json {
                println!("{}", serde_json::to_string_pretty(&value).expect("JSON"));
            } else if value["matches"] == true {
                println!(
                    "ok: the key matches {}",
                    value["id"].as_str().unwrap_or_default()
                );
            } else {
                println!("id          {}", value["id"].as_str().unwrap_or_default());
                println!("mesh        {}", value["mesh"].as_str().unwrap_or_default());
                println!(
                    "public key  {}",
                    value["public_key"].as_str().unwrap_or_default()
                );
                println!(
                    "key file    {}",
                    value["key_file"].as_str().unwrap_or_default()
                );
            }
            ExitCode::SUCCESS
        }
        Err(message) => {
            eprintln!("error: {message}");
            ExitCode::FAILURE
        }
    }
}

/// The operator's offline commands: they read and write files, never the agent.
fn offline(command: Command, json: bool) -> ExitCode {
    use themis_cli::operator::{self, MeshDir};
    let service = |name: &str| {
        themis_agent::names::ServiceName::new(name)
            .map_err(|e| operator::OperatorError::Refused(e.to_string()))
    };
    let result = match command {
        Command::Mesh(MeshCommand::Create { name, out }) => operator::create_mesh(&name, &out),
        Command::Node(NodeCommand::Admit {
            mesh_dir,
            out,
            existing_key,
        }) => MeshDir::open(&mesh_dir)
            .and_then(|mesh| operator::admit_node(&mesh, &out, None, existing_key)),
        Command::Node(NodeCommand::Range {
            range,
            mesh_dir,
            node,
        }) => MeshDir::open(&mesh_dir)
            .and_then(|mesh| operator::grant_address_range(&mesh, &node, range, None)),
        Command::Service(ServiceCommand::Grant {
            service: name,
            mesh_dir,
            node,
        }) => service(&name)
            .and_then(|svc| operator::grant_to_node(&MeshDir::open(&mesh_dir)?, &svc, &node, None)),
        Command::Service(ServiceCommand::Authority {
            service: name,
            mesh_dir,
            out,
        }) => service(&name).and_then(|svc| {
            operator::create_authority(&MeshDir::open(&mesh_dir)?, &svc, &out, None)
        }),
        Command::Service(ServiceCommand::Endorse {
            service: name,
            authority,
            node,
        }) => service(&name).and_then(|svc| operator::endorse_node(&authority, &svc, &node, None)),
        Command::Service(ServiceCommand::Bind {
            service: name,
            namespace,
            service_accounts,
            mesh_dir,
        }) => service(&name).and_then(|svc| {
            let mesh = MeshDir::open(&mesh_dir)?;
            operator::bind_service(&mesh, &svc, &namespace, &service_accounts, false)
        }),
        Command::Service(ServiceCommand::Unbind {
            service: name,
            namespace,
            mesh_dir,
        }) => service(&name).and_then(|svc| {
            operator::bind_service(&MeshDir::open(&mesh_dir)?, &svc, &namespace, &[], true)
        }),
        _ => unreachable!("only the offline commands come here"),
    };
    match result {
        Ok(written) => {
            print_written(&written, json);
            ExitCode::SUCCESS
        }
        Err(error) => {
            eprintln!("error: {error}");
            ExitCode::FAILURE
        }
    }
}

fn print_written(written: &themis_cli::operator::Written, json: bool) {
    if json {
        println!("{}", serde_json::to_string_pretty(written).expect("JSON"));
        return;
    }
    println!("{}", written.summary);
    println!("  id         {}", written.id);
    println!("  mesh root  {}", written.mesh_root);
    for file in &written.files {
        println!("  wrote      {}", file.display());
    }
}

/// `themis revoke`: signs the revocations offline into the trust log; returns their
/// PEM text.
fn revocation(
    ids: &[String],
    mesh_dir: &std::path::Path,
    reason: &str,
    out: Option<&std::path::Path>,
    json: bool,
) -> Result<String, ExitCode> {
    use themis_cli::operator::{self, MeshDir};
    let signed = MeshDir::open(mesh_dir).and_then(|mesh| operator::revoke(&mesh, ids, reason));
    let (pem, mut written) = signed.map_err(|error| {
        eprintln!("error: {error}");
        ExitCode::FAILURE
    })?;
    if let Some(out) = out {
        std::fs::write(out, &pem).map_err(|error| {
            eprintln!("error: {}: {error}", out.display());
            ExitCode::FAILURE
        })?;
        written.files.push(out.to_owned());
    } else if !json {
        print!("{pem}");
    }
    print_written(&written, json);
    Ok(pem)
}

fn describe(id: &Identity, key_file: Option<&PathBuf>) -> Value {
    json!({
        "id": id.printable_id(),
        "mesh": id.mesh().as_str(),
        "public_key": hex::encode(id.public_key()),
        "key_file": key_file.map(|p| p.display().to_string()),
    })
}

fn s(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Null => "-".into(),
        other => other.to_string(),
    }
}

fn peer(v: &Value) -> String {
    if v.is_null() {
        "-".into()
    } else {
        format!("{} {}", s(&v["addr"]), s(&v["id"]))
    }
}

fn render_status(v: &Value) -> String {
    typed(v, |st: contract::Status| {
        format!(
            "node id  {}\nmesh     {}\nroot     {}\nmay serve {}\nrevoked  {} key(s) known\nlisten   {}\njoined   {}\nobjects  {} ({} values)\njoin as  {}@{}\n",
            st.id,
            st.mesh,
            st.mesh_root,
            if st.granted.is_empty() { "nothing (no grants)".to_owned() } else { st.granted.join(", ") },
            st.revocations,
            st.listen,
            st.joined,
            st.objects,
            st.values,
            st.id,
            st.listen,
        )
    })
}

fn render_ring(v: &Value) -> String {
    let routing = match v["members"].as_u64() {
        Some(n) => format!("one hop, over {n} members (holders computed, not looked up)"),
        None => "chord (lookups through other nodes)".into(),
    };
    let mut out = format!(
        "me           {}\nrouting      {routing}\npredecessor  {}\n",
        peer(&v["me"]),
        peer(&v["predecessor"])
    );
    for (i, p) in v["successors"].as_array().into_iter().flatten().enumerate() {
        out += &format!("successor {i:<2} {}\n", peer(p));
    }
    for f in v["fingers"].as_array().into_iter().flatten() {
        out += &format!("finger {:<5} {}\n", s(&f[0]), peer(&f[1]));
    }
    let objects = v["objects"].as_array().cloned().unwrap_or_default();
    out += &format!("objects held {}\n", objects.len());
    for o in objects {
        out += &format!("  {} ({} values)\n", s(&o[0]), s(&o[1]));
    }
    out
}

fn render_workload(v: &Value) -> String {
    typed(v, |w: contract::WorkloadIdentity| {
        let created = if w.created { " (created)" } else { "" };
        let owner = match &w.owner {
            Some(o) => match o.uid {
                Some(uid) => format!(", bound to cgroup {} uid {uid}", o.cgroup),
                None => format!(", bound to cgroup {}", o.cgroup),
            },
            None => String::new(),
        };
        format!("{} {}{created}{owner}\n", w.workload, w.id)
    })
}

fn render_registered(v: &Value) -> String {
    typed(v, |r: contract::Registered<Value>| {
        let mut out = format!(
            "registered {} as {} at {} ({} of {} replicas stored)\n",
            r.registration.workload,
            r.registration.service,
            r.registration.endpoint,
            r.stored,
            r.replicas,
        );
        if let Some(c) = &r.capture {
            out += &format!(
                "capture attached to {} ({} programs)\n",
                s(&c["cgroup"]),
                c["attachments"].as_array().map_or(0, Vec::len)
            );
        }
        out
    })
}

fn render_forgotten(v: &Value) -> String {
    typed(v, |d: contract::DeletedWorkload| {
        format!("deleted workload {} (it was {})\n", d.workload, d.id)
    })
}

fn render_deregistered(v: &Value) -> String {
    typed(v, |d: contract::Deregistered| {
        let detached = if d.capture_detached {
            ", capture detached"
        } else {
            ""
        };
        format!(
            "deregistered {} from {}{detached}\n",
            d.deregistered.workload, d.deregistered.service
        )
    })
}

fn render_capture(v: &Value) -> String {
    let mut out = format!(
        "pins {}, fast path {}\n",
        s(&v["pin_dir"]),
        if v["fast_path"] == true { "on" } else { "off" }
    );
    let workloads = v["workloads"].as_array().cloned().unwrap_or_default();
    if workloads.is_empty() {
        out += "no workload captured\n";
    }
    for w in workloads {
        let programs: Vec<String> = w["attachments"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|a| {
                format!(
                    "{} (link {}, prog {})",
                    s(&a["program"]),
                    s(&a["link_id"]),
                    s(&a["program_id"])
                )
            })
            .collect();
        out += &format!(
            "{}: cgroup {} (id {})\n  attached: {}\n",
            s(&w["workload"]),
            s(&w["cgroup"]),
            s(&w["cgroup_id"]),
            programs.join(", ")
        );
        if w["missing"].as_array().is_some_and(|m| !m.is_empty()) {
            out += &format!("  MISSING: {}\n", w["missing"]);
        }
    }
    let guard: Vec<String> = v["listener_guard"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|a| format!("{} (link {})", s(&a["program"]), s(&a["link_id"])))
        .collect();
    if !guard.is_empty() {
        out += &format!(
            "outbound listeners guarded at the top cgroup: {}\n",
            guard.join(", ")
        );
    }
    let counters: Vec<String> = v["counters"]
        .as_object()
        .into_iter()
        .flatten()
        .map(|(k, v)| format!("{k}={}", s(v)))
        .collect();
    out += &format!("counters: {}\n", counters.join(" "));
    out
}

fn render_resolved(v: &Value) -> String {
    typed(v, |r: contract::Resolution| {
        let source = if r.cached {
            "from this agent's resolution cache (--fresh asks the ring)".to_owned()
        } else {
            format!(
                "fresh from the ring: {} of {} replica holders answered",
                r.answered, r.replicas
            )
        };
        let mut out = format!(
            "{}: {} instance(s), {source}\n",
            r.service,
            r.instances.len()
        );
        for i in &r.instances {
            let meta: Vec<String> = i.metadata.iter().map(|(k, v)| format!("{k}={v}")).collect();
            out += &format!(
                "  {:<21} workload {}\n  {:<21} endorsed by node {}{}\n",
                i.endpoint.to_string(),
                i.id,
                "",
                i.endorser,
                if meta.is_empty() {
                    String::new()
                } else {
                    format!(", labels {}", meta.join(","))
                },
            );
        }
        out
    })
}

fn render_workloads(v: &Value) -> String {
    typed(v, |w: contract::Workloads| {
        let mut out = String::new();
        for r in &w.registrations {
            out += &format!(
                "{:<20} {:<20} {:<21} {}\n",
                r.service,
                r.workload,
                r.endpoint.to_string(),
                r.id
            );
        }
        if out.is_empty() {
            out = "no registrations\n".into();
        }
        out
    })
}

fn render_published(v: &Value) -> String {
    typed(v, |p: contract::Published| {
        if p.new {
            "published: this agent refuses the key now; every agent will within its revocation poll\n"
                .into()
        } else {
            "published again (this agent already knew it)\n".into()
        }
    })
}

fn render_revocations(v: &Value) -> String {
    typed(v, |list: contract::Revocations| {
        let mut out = format!("{} revocation(s)\n", list.revocations.len());
        for r in &list.revocations {
            out += &format!(
                "  {}  issued {}  {}\n",
                r.id,
                ago(Some(r.issued_at)),
                r.reason
            );
        }
        out
    })
}

/// A Unix-milliseconds timestamp as people read it: "12 s ago", "in 3 s" (clock skew).
fn ago(at: Option<u64>) -> String {
    let Some(at) = at else {
        return "-".into();
    };
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64);
    let (secs, later) = (now.abs_diff(at) / 1000, at > now);
    let amount = match secs {
        0..=119 => format!("{secs} s"),
        120..=7199 => format!("{} min", secs / 60),
        _ => format!("{} h", secs / 3600),
    };
    if later {
        format!("in {amount}")
    } else {
        format!("{amount} ago")
    }
}

fn render_explanation(v: &Value) -> String {
    typed(v, |e: contract::Explanation| {
        let mut out = format!(
            "{}: {} live instance(s) from {} stored value(s); {} of {} replica holders answered\nchecked against mesh root {}\n",
            e.service,
            e.instances.len(),
            e.values.len(),
            e.answered,
            e.replicas,
            e.mesh_root,
        );
        let dash = |v: &Option<String>| v.clone().unwrap_or_else(|| "-".into());
        for value in &e.values {
            out += &format!(
                "\n  {:<10} workload {}\n             endorsed by {}\n             endpoint {}  issued {}\n             {}\n",
                value.verdict.to_uppercase(),
                dash(&value.id),
                dash(&value.endorser),
                value.endpoint.map_or_else(|| "-".into(), |e| e.to_string()),
                ago(value.issued_at),
                value.reason,
            );
            for leaf in &value.log {
                out +=
                    &format!(
                    "             trust log #{} {} {}{}, signed {} (inclusion proof: {} hashes)\n",
                    leaf.index,
                    leaf.kind,
                    leaf.service.as_deref().unwrap_or(""),
                    leaf.reason.as_deref().map_or(String::new(), |r| format!("reason: {r}")),
                    ago(Some(leaf.issued_at)),
                    leaf.proof.len() / 64,
                );
            }
        }
        if e.log_checkpoint.is_none() {
            out += "\n(this node holds no trust log yet: no leaf cited)\n";
        }
        out
    })
}

/// Renders the answer read as the contract's type `T`; an answer of another shape
/// (an agent of another version) is shown as JSON.
fn typed<T: serde::de::DeserializeOwned>(v: &Value, render: impl FnOnce(T) -> String) -> String {
    match T::deserialize(v) {
        Ok(answer) => render(answer),
        Err(_) => render_json(v),
    }
}

fn render_json(v: &Value) -> String {
    format!("{}\n", serde_json::to_string_pretty(v).expect("JSON"))
}
