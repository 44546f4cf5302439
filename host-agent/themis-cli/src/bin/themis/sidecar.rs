//! `themis sidecar render`: a workload's sidecar Envoy bootstrap (`themis-bootstrap`).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::{Args, Subcommand, ValueEnum};
use serde_json::Value;
use themis_bootstrap::{AppProtocol, FilterCode, Runtime, Sidecar};

/// `themis sidecar ...`.
#[derive(Subcommand)]
pub enum SidecarCommand {
    /// Print the bootstrap of a workload's sidecar Envoy: its outbound listener seals
    /// what the app sends to mesh services, its inbound listener admits only sealed
    /// streams of authenticated peers that the policy allows.
    ///
    /// The Wasm runtime (default) loads themis_envoy.wasm, pinned to its SHA-256
    /// (--wasm with --wasm-url; --unpinned loads the file with no check). The native
    /// runtime (an Envoy 1.40 dynamic module, libthemis_native.so) seals in transport
    /// sockets, a sealing cluster per service the app calls (--calls); start Envoy
    /// with ENVOY_DYNAMIC_MODULES_SEARCH_PATH naming the module's directory.
    ///
    /// HTTP/1.1, HTTP/2, gRPC and WebSocket calls go through the outbound listener as
    /// http://<service>/...; a plain TCP service gets a listener of its own (--tcp
    /// redis=127.0.0.12:6380: what connects there reaches a redis instance, tunnelled).
    ///
    /// Example: themis sidecar render --mesh-root mesh/mesh.root --workload check
    /// --service check --agent-socket /run/themis/agent.sock --app 127.0.0.12:8080
    /// --outbound 127.0.0.12:15001 --inbound 127.0.0.12:15006 --admin-port 15000
    /// --wasm themis_envoy.wasm --wasm-url http://127.0.0.1:8099/themis_envoy.wasm
    /// --policy '{"allow":[{"service":"handler"}]}' > envoy.yaml
    Render(RenderArgs),
}

/// Who seals.
#[derive(Clone, Copy, ValueEnum)]
pub enum RuntimeArg {
    /// The proxy-wasm filter.
    Wasm,
    /// The Envoy 1.40 dynamic module.
    Native,
}

/// What the local app speaks.
#[derive(Clone, Copy, ValueEnum)]
pub enum ProtocolArg {
    /// HTTP/1.1 (WebSocket too).
    Http1,
    /// HTTP/2 (gRPC).
    Http2,
    /// Plain TCP.
    Tcp,
}

/// `themis sidecar render`'s flags.
#[derive(Args)]
pub struct RenderArgs {
    /// The mesh root: <mesh>:<hex>, or the mesh.root file `themis mesh create` wrote.
    #[arg(long, value_name = "ROOT|FILE")]
    mesh_root: String,
    /// The workload whose key the agent holds.
    #[arg(long)]
    workload: String,
    /// The service the workload is registered as.
    #[arg(long)]
    service: Option<String>,
    /// The local agent's Unix socket.
    #[arg(long, value_name = "PATH")]
    agent_socket: PathBuf,
    /// The local app.
    #[arg(long, value_name = "IP:PORT")]
    app: SocketAddr,
    /// The listener the app calls.
    #[arg(long, value_name = "IP:PORT")]
    outbound: SocketAddr,
    /// The listener peers call (the registered endpoint).
    #[arg(long, value_name = "IP:PORT")]
    inbound: SocketAddr,
    /// Envoy's admin port on 127.0.0.1.
    #[arg(long)]
    admin_port: u16,
    /// Who seals.
    #[arg(long, value_enum, default_value = "wasm")]
    runtime: RuntimeArg,
    /// The filter module (themis_envoy.wasm; --runtime wasm); with --wasm-url its
    /// SHA-256 is the pin.
    #[arg(long, value_name = "PATH")]
    wasm: Option<PathBuf>,
    /// Where Envoy fetches the module from; it refuses bytes whose SHA-256 differs
    /// from --wasm's.
    #[arg(long, value_name = "http://IP:PORT/PATH")]
    wasm_url: Option<String>,
    /// Load --wasm as a local file with no hash check, instead of --wasm-url (a
    /// swapped file would be loaded).
    #[arg(long, conflicts_with = "wasm_url")]
    unpinned: bool,
    /// What the local app speaks.
    #[arg(long, value_enum, default_value = "http1")]
    app_protocol: ProtocolArg,
    /// A listener for a TCP service: connections to IP:PORT reach SERVICE (repeatable).
    #[arg(long, value_name = "SERVICE=IP:PORT", value_parser = tcp_service)]
    tcp: Vec<(String, SocketAddr)>,
    /// Traffic splits (JSON), e.g.
    /// '[{"service":"check","match":{"version":"v2"},"weight_percent":10}]'.
    #[arg(long, value_name = "JSON", value_parser = json_value)]
    canary: Option<Value>,
    /// Who may call (JSON), e.g. '{"allow":[{"service":"handler"}]}' or
    /// '{"allow_any_caller":true}'; without it every caller is refused.
    #[arg(long, value_name = "JSON", value_parser = json_value)]
    policy: Option<Value>,
    /// Native runtime: a service the app calls (repeatable); each gets a sealing
    /// cluster.
    #[arg(long, value_name = "SERVICE")]
    calls: Vec<String>,
    /// Render this template instead of the runtime's own (deploy/envoy/): for
    /// ablations, see benchmarks/envoy/ab.sh.
    #[arg(long, value_name = "PATH")]
    template: Option<PathBuf>,
    /// The outbound listener's access log (original destination, service, status);
    /// default none.
    #[arg(long, value_name = "PATH")]
    access_log: Option<PathBuf>,
}

fn tcp_service(spec: &str) -> Result<(String, SocketAddr), String> {
    let (service, at) = spec
        .split_once('=')
        .ok_or_else(|| format!("{spec:?}: expected SERVICE=IP:PORT"))?;
    let at = at.parse().map_err(|e| format!("{at:?}: {e}"))?;
    Ok((service.to_owned(), at))
}

fn json_value(text: &str) -> Result<Value, String> {
    serde_json::from_str(text).map_err(|e| format!("not JSON: {e}"))
}

/// Runs one `themis sidecar` command.
pub fn command(command: SidecarCommand) -> ExitCode {
    let SidecarCommand::Render(args) = command;
    match render(args) {
        Ok(yaml) => {
            print!("{yaml}");
            ExitCode::SUCCESS
        }
        Err(message) => {
            eprintln!("error: {message}");
            ExitCode::from(2)
        }
    }
}

fn render(args: RenderArgs) -> Result<String, String> {
    let root = match args.mesh_root.contains(':') {
        true => args.mesh_root.clone(),
        false => std::fs::read_to_string(&args.mesh_root)
            .map_err(|e| format!("--mesh-root {}: {e}", args.mesh_root))?
            .trim()
            .to_owned(),
    };
    let role = |role: &str, extra: Option<(&str, &Value)>| {
        themis_bootstrap::role_config(role, &root, &args.workload, args.service.as_deref(), extra)
    };
    if args.policy.is_none() {
        eprintln!("themis sidecar render: no --policy: the sidecar refuses every caller (no policy: deny by default)");
    }
    let runtime = match args.runtime {
        RuntimeArg::Wasm => Runtime::Wasm,
        RuntimeArg::Native => Runtime::Native,
    };
    let filter_code = match runtime {
        Runtime::Wasm => Some(filter_code(&args)?),
        Runtime::Native => None,
    };
    let template = match &args.template {
        Some(path) => Some(
            std::fs::read_to_string(path)
                .map_err(|e| format!("--template {}: {e}", path.display()))?,
        ),
        None => None,
    };
    let sidecar = Sidecar {
        runtime,
        admin_port: args.admin_port,
        outbound: args.outbound,
        inbound: args.inbound,
        app: args.app,
        app_protocol: match args.app_protocol {
            ProtocolArg::Http1 => AppProtocol::Http1,
            ProtocolArg::Http2 => AppProtocol::Http2,
            ProtocolArg::Tcp => AppProtocol::Tcp,
        },
        agent_socket: absolute(&args.agent_socket)?,
        outbound_config: role("outbound", args.canary.as_ref().map(|c| ("canary", c))),
        inbound_config: role("inbound", args.policy.as_ref().map(|p| ("policy", p))),
        filter_code,
        calls: args.calls.clone(),
        tcp: args.tcp.clone(),
        access_log: args.access_log.as_deref().map(absolute).transpose()?,
    };
    let rendered = match &template {
        Some(text) => sidecar.render_template(text),
        None => sidecar.render(),
    };
    rendered.map_err(|e| e.to_string())
}

/// The module's code: fetched from --wasm-url and pinned to --wasm's SHA-256, or
/// (said explicitly) the file itself.
fn filter_code(args: &RenderArgs) -> Result<FilterCode, String> {
    let wasm = args
        .wasm
        .as_deref()
        .ok_or("--runtime wasm needs the filter module (--wasm PATH)")?;
    let wasm = absolute(wasm)?;
    let bytes = std::fs::read(&wasm).map_err(|e| {
        format!(
            "{}: {e} (cargo build -p themis-envoy --target wasm32-wasip1 --release)",
            wasm.display()
        )
    })?;
    let Some(url) = &args.wasm_url else {
        if !args.unpinned {
            return Err("the module is loaded pinned to its SHA-256: give --wasm-url http://IP:PORT/PATH where Envoy can fetch --wasm (e.g. python3 -m http.server), or --unpinned".into());
        }
        eprintln!(
            "themis sidecar render: no --wasm-url: Envoy loads {} unpinned (a swapped file would be loaded)",
            wasm.display()
        );
        return Ok(FilterCode::Unpinned(wasm));
    };
    let bad = || format!("--wasm-url {url:?}: expected http://IP:PORT/PATH");
    let rest = url.strip_prefix("http://").ok_or_else(bad)?;
    let (server, path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
    let server: SocketAddr = server.parse().map_err(|_| bad())?;
    if path.is_empty() || !path.bytes().all(|b| b.is_ascii_graphic() && b != b'"') {
        return Err(bad());
    }
    let sha256 = ring::digest::digest(&ring::digest::SHA256, &bytes);
    Ok(FilterCode::Fetched {
        server,
        path: path.to_owned(),
        sha256: hex::encode(sha256),
    })
}

fn absolute(path: &Path) -> Result<PathBuf, String> {
    std::path::absolute(path).map_err(|e| format!("{}: {e}", path.display()))
}
