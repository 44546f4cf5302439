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
    Render(Box<RenderArgs>),
    /// Ask the local agent for one TLS certificate of the workload (the TLS binding's,
    /// as its sidecar gets them over SDS) and write it as DIR/certificate.pem and
    /// DIR/key.pem (0600): to look at (openssl x509 -text) or to call a TLS sidecar
    /// with (curl, openssl s_client). A sidecar needs none of this: the agent serves
    /// it its certificates and renews them. The key is delegated and short-lived; the
    /// workload's own key never leaves the agent.
    ///
    /// Example: themis --socket /run/themis/agent.sock sidecar certificate
    /// --workload check --out ./check-tls
    Certificate(CertificateArgs),
}

/// Who seals.
#[derive(Clone, Copy, ValueEnum)]
pub enum RuntimeArg {
    /// The proxy-wasm filter.
    Wasm,
    /// The Envoy 1.40 dynamic module, on the Themis channel.
    Native,
    /// The Envoy 1.40 dynamic module as the validator of Envoy's own TLS 1.3
    /// (docs/PROTOCOL.md §8): the certificate comes from the agent's SDS on
    /// --agent-socket. The same as `--runtime native --transport tls`.
    Tls,
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
    /// The native runtime's transports: `themis` (the paper's channel; the default),
    /// `tls` (Envoy's TLS 1.3, the module its validator), or `tls,themis` (TLS with
    /// callees whose records take it, the channel with peers that speak only it, both
    /// ways). Register the workload with the same list
    /// (`themis register --transport`): callers pick by what its record says.
    #[arg(long, value_name = "LIST")]
    transport: Option<String>,
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
    /// The TLS binding: Envoy's own network RBAC on the inbound listener admits only
    /// callers whose certificate's URI SAN is this (repeatable), e.g.
    /// spiffe://demo/svc/handler; beside --policy (both must admit).
    #[arg(long, value_name = "URI")]
    rbac_principal: Vec<String>,
    /// The outbound listener's access log (original destination, service, status);
    /// default none.
    #[arg(long, value_name = "PATH")]
    access_log: Option<PathBuf>,
}

/// `themis sidecar certificate`'s arguments.
#[derive(Args)]
pub struct CertificateArgs {
    /// The workload whose key the agent holds.
    #[arg(long)]
    workload: String,
    /// The directory to write certificate.pem and key.pem in (made if missing).
    #[arg(long, value_name = "DIR")]
    out: PathBuf,
    /// The certificate's lifetime asked for, seconds (an hour if not given), capped
    /// by the agent's `max_delegation_secs` (an hour by default).
    #[arg(long)]
    lifetime_secs: Option<u64>,
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
/// `socket`: the local agent's (`--socket`), which `certificate` asks.
pub fn command(command: SidecarCommand, socket: &str) -> ExitCode {
    let args = match command {
        SidecarCommand::Render(args) => *args,
        SidecarCommand::Certificate(args) => return certificate(args, socket),
    };
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
    let (runtime, channel_too) = runtime_of(args.runtime, args.transport.as_deref())?;
    let filter_code = match runtime {
        Runtime::Wasm => Some(filter_code(&args)?),
        Runtime::Native | Runtime::Tls => None,
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
        channel_too,
        rbac_principals: args.rbac_principal.clone(),
    };
    let rendered = match &template {
        Some(text) => sidecar.render_template(text),
        None => sidecar.render(),
    };
    rendered.map_err(|e| e.to_string())
}

/// The runtime `--runtime` and `--transport` name, and whether it takes the Themis
/// channel beside TLS.
fn runtime_of(runtime: RuntimeArg, transport: Option<&str>) -> Result<(Runtime, bool), String> {
    let names = match transport {
        Some(list) => {
            themis_contracts::api::transports(list).map_err(|e| format!("--transport: {e}"))?
        }
        None => Vec::new(),
    };
    let (tls, themis) = (names.contains(&"tls"), names.contains(&"themis"));
    match (runtime, tls, themis) {
        (RuntimeArg::Wasm, false, _) => Ok((Runtime::Wasm, false)),
        (RuntimeArg::Wasm, true, _) => {
            Err("--transport tls is the native runtime's (--runtime native): the Wasm filter speaks the Themis channel".into())
        }
        (RuntimeArg::Native, false, _) => Ok((Runtime::Native, false)),
        (RuntimeArg::Tls, false, true) => {
            Err("--runtime tls speaks TLS: --transport tls or tls,themis".into())
        }
        (RuntimeArg::Native | RuntimeArg::Tls, true, both) | (RuntimeArg::Tls, false, both) => {
            Ok((Runtime::Tls, both))
        }
    }
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

/// `themis sidecar certificate`: one certificate, as PEM files.
fn certificate(args: CertificateArgs, socket: &str) -> ExitCode {
    let client = themis_agent_client::Client::unix(socket);
    let request = themis_contracts::api::CertificateRequest {
        lifetime_secs: args.lifetime_secs,
    };
    let path = themis_contracts::paths::workload_certificate(&args.workload);
    match write_certificate(&client, &path, &request, &args.out) {
        Ok(issued) => {
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_millis() as u64);
            eprintln!(
                "themis sidecar certificate: {} ({}) for {} s, in {}",
                issued.principal,
                issued.sni_name,
                issued.not_after_ms.saturating_sub(now) / 1000,
                args.out.display(),
            );
            ExitCode::SUCCESS
        }
        Err(message) => {
            eprintln!("error: {message}");
            ExitCode::from(2)
        }
    }
}

/// Asks for a certificate and writes it into `dir`: `certificate.pem`, `key.pem`.
fn write_certificate(
    client: &themis_agent_client::Client,
    path: &str,
    request: &themis_contracts::api::CertificateRequest,
    dir: &std::path::Path,
) -> Result<themis_contracts::api::IssuedCertificate, String> {
    let issued: themis_contracts::api::IssuedCertificate = client
        .post(path, request)
        .map_err(|e| format!("the agent gave no certificate: {e}"))?;
    let der = |text: &str, what: &str| {
        hex::decode(text).map_err(|_| format!("the agent's {what} is not hex"))
    };
    let certificate = themis_x509::pem("CERTIFICATE", &der(&issued.certificate, "certificate")?);
    let key = zeroize::Zeroizing::new(themis_x509::pem(
        "PRIVATE KEY",
        &der(&issued.private_key, "private key")?,
    ));
    std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    for (name, text) in [
        ("certificate.pem", certificate.as_str()),
        ("key.pem", key.as_str()),
    ] {
        let file = dir.join(name);
        write_private(&file, text.as_bytes()).map_err(|e| format!("{}: {e}", file.display()))?;
    }
    Ok(issued)
}

/// Writes `bytes` to a new file only its owner may read (it holds a private key).
fn write_private(path: &std::path::Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let _ = std::fs::remove_file(path);
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)?;
    file.write_all(bytes)?;
    file.sync_all()
}
