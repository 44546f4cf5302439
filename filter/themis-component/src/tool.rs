//! The component as a tool for people, run by `wasmtime run` through `wasi:cli/run`:
//! create and show identities, check that a key is the key of an id, and act as a mesh
//! client outside Envoy: resolve a service through an agent and call it over the
//! Themis channel — either with the native message-per-record exchange, or (`--http`)
//! over the sealed byte stream the Envoy sidecars speak (`themis_core::stream`), with
//! HTTP/2 inside it ([`http2`]).

use crate::http2;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::PathBuf;

use clap::{Parser, Subcommand};
use ring::rand::SecureRandom;
use ring::rand::SystemRandom;
use themis_contracts::{api, paths, ServiceName};
use themis_core::delegation::{Credential, DelegatedKey, Delegation, HandshakeSigner};
use themis_core::handshake::Initiator;
use themis_core::identity::PublicIdentity;
use themis_core::stream::{Meta, StreamInitiator};
use themis_core::{wire, HandshakeConfig, Identity, MeshName, PeerId, Session};
use themis_sidecar::agent::{self, Instance};
use themis_sidecar::config::Transport;
use themis_trust::{MeshRoot, Verifier};

/// Themis identities, from the portable component (`wasmtime run themis_component.wasm …`).
///
/// Files are reached through the directories `wasmtime run --dir` grants.
#[derive(Parser)]
#[command(name = "themis_component.wasm", version)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Identity key files.
    #[command(subcommand)]
    Id(IdCommand),
    /// Resolve a service through an agent and send it each message over the Themis
    /// channel, printing each answer; or, with `--http`, make one HTTP request to it
    /// through its Envoy sidecar. Needs `wasmtime run -S inherit-network`.
    ///
    /// With `--http`, the response's status line and headers go to stderr and its body
    /// to stdout; a status other than 2xx exits 1.
    Call {
        /// The service name.
        service: String,
        /// The agent's read-only resolution address (`themis agent --resolve-listen`).
        #[arg(long, default_value = "127.0.0.1:7480")]
        agent: SocketAddr,
        /// This client's key file (the workload key itself).
        #[arg(long, required_unless_present = "credential")]
        key: Option<PathBuf>,
        /// This client's delegated credential (`themis delegate WORKLOAD --out FILE`
        /// on the workload's node): a short-lived key the agent delegated the
        /// workload's handshakes to, so that the workload key stays in the agent.
        #[arg(long, conflicts_with = "key", value_name = "FILE")]
        credential: Option<PathBuf>,
        /// The mesh root (`<mesh>:<hex>`, as `themis mesh create` printed it): only
        /// instances it endorses for the service are called.
        #[arg(long)]
        mesh_root: String,
        /// Speak HTTP/2 in the sealed stream to the instance's sidecar (its inbound
        /// listener) instead of sending messages: `--http GET /path`.
        #[arg(long, num_args = 2, value_names = ["METHOD", "PATH"])]
        http: Option<Vec<String>>,
        /// The request body (with --http).
        #[arg(long, requires = "http")]
        body: Option<String>,
        /// A request header `name:value` (with --http); may be repeated.
        #[arg(long = "header", value_name = "NAME:VALUE", requires = "http")]
        headers: Vec<String>,
        /// The service this client claims to be an instance of (with --http): sent in
        /// the stream's metadata, and believed by the sidecar only if the DHT lists
        /// this client's id for it. None by default.
        #[arg(long = "service", value_name = "SERVICE", requires = "http")]
        claim: Option<String>,
        /// The messages, one sealed request each (without --http).
        #[arg(required_unless_present = "http", conflicts_with = "http")]
        messages: Vec<String>,
    },
}

#[derive(Subcommand)]
enum IdCommand {
    /// Create a new identity and print its key file (PEM PKCS#8) on stdout: redirect
    /// it under `umask 077`, since WASI cannot set file permissions. Its id goes to
    /// stderr.
    New {
        /// The mesh the identity belongs to.
        #[arg(long)]
        mesh: String,
    },
    /// Show the id and public key of a key file.
    Show {
        /// The key file.
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

/// Runs the tool; `Err` makes the process exit 1 (clap exits 2 on bad usage itself).
pub fn main() -> Result<(), ()> {
    let cli = Cli::parse();
    match run(cli.command) {
        Ok(()) => Ok(()),
        Err(message) => {
            eprintln!("error: {message}");
            Err(())
        }
    }
}

fn mesh(name: &str) -> Result<MeshName, String> {
    MeshName::new(name).map_err(|e| format!("mesh {name:?}: {e}"))
}

fn load(key: &PathBuf, mesh: MeshName) -> Result<Identity, String> {
    let pem = std::fs::read_to_string(key).map_err(|e| format!("{}: {e}", key.display()))?;
    Identity::from_key_file(mesh, &pem).map_err(|e| format!("{}: {e}", key.display()))
}

/// The delegated credential in `path` (what `themis delegate` wrote), checked now:
/// for this mesh, its id its key's, its delegation the workload key's for this
/// delegated key and not expired. The endorsement goes along only with a claim.
fn load_credential(path: &PathBuf, root: &MeshRoot, claim: bool) -> Result<Credential, String> {
    let at = |e: &dyn std::fmt::Display| format!("{}: {e}", path.display());
    let text = zeroize::Zeroizing::new(std::fs::read_to_string(path).map_err(|e| at(&e))?);
    let mut file: api::DelegatedCredential =
        serde_json::from_str(&text).map_err(|e| at(&format!("not a delegated credential: {e}")))?;
    let d = &file.delegated;
    if d.identity.mesh != root.mesh.as_str() {
        return Err(at(&format!(
            "a credential of mesh {:?}, not of {}",
            d.identity.mesh, root.mesh
        )));
    }
    let mut public_key = [0u8; 32];
    hex::decode_to_slice(&d.identity.public_key, &mut public_key)
        .map_err(|_| at(&"the public key is not 32 bytes of hex"))?;
    let workload = PublicIdentity::new(public_key, root.mesh.clone());
    if workload.printable_id() != d.identity.id {
        return Err(at(&format!(
            "{} is not the id of its public key",
            d.identity.id
        )));
    }
    let mut seed = zeroize::Zeroizing::new([0u8; 32]);
    let decoded = hex::decode_to_slice(&file.delegated_key_seed, seed.as_mut());
    zeroize::Zeroize::zeroize(&mut file.delegated_key_seed);
    decoded.map_err(|_| at(&"the delegated key's seed is not 32 bytes of hex"))?;
    let key = DelegatedKey::from_seed(&seed).map_err(|e| at(&e))?;
    let delegation = hex::decode(&d.delegation)
        .ok()
        .and_then(|bytes| Delegation::decode(&bytes))
        .ok_or_else(|| at(&"the delegation does not decode"))?;
    let endorsement = match (&d.endorsement, claim) {
        (Some(text), true) => hex::decode(text).map_err(|_| at(&"the endorsement is not hex"))?,
        _ => Vec::new(),
    };
    Credential::new(workload, key, delegation, endorsement, unix_millis()).map_err(|e| {
        at(&format!(
            "{e} (until {} Unix ms); ask the workload's agent for a new one: themis delegate {} --out FILE",
            d.not_after_ms, d.identity.workload
        ))
    })
}

fn run(command: Command) -> Result<(), String> {
    let command = match command {
        Command::Id(command) => command,
        Command::Call {
            service,
            agent,
            key,
            credential,
            mesh_root,
            http,
            body,
            headers,
            claim,
            messages,
        } => {
            if http.is_none() && (body.is_some() || !headers.is_empty() || claim.is_some()) {
                return Err("--body, --header and --service go with --http".into());
            }
            let root: MeshRoot = mesh_root.parse().map_err(|e| format!("--mesh-root: {e}"))?;
            let me: Box<dyn HandshakeSigner> = match (key, credential) {
                (Some(key), _) => Box::new(load(&key, root.mesh.clone())?),
                (None, Some(file)) => Box::new(load_credential(&file, &root, claim.is_some())?),
                (None, None) => return Err("--key or --credential is required".into()),
            };
            let me = &*me;
            let Some(http) = http else {
                return call(&service, agent, me, &root, &messages);
            };
            let [method, path] =
                <[String; 2]>::try_from(http).map_err(|_| "--http takes a method and a path")?;
            let mut parsed = Vec::new();
            for header in headers {
                let (name, value) = header
                    .split_once(':')
                    .ok_or_else(|| format!("--header {header:?}: expected name:value"))?;
                parsed.push((name.to_owned(), value.to_owned()));
            }
            let request = http2::Request {
                method,
                path,
                authority: service.clone(),
                headers: parsed,
                body: body.map(String::into_bytes),
            };
            return call_http(&service, agent, me, &root, &request, claim);
        }
    };
    match command {
        IdCommand::New { mesh: name } => {
            let identity = Identity::generate(mesh(&name)?, &SystemRandom::new())
                .map_err(|e| e.to_string())?;
            print!("{}", identity.to_key_file().as_str());
            eprintln!("{}", identity.printable_id());
        }
        IdCommand::Show { key, mesh: name } => {
            let identity = load(&key, mesh(&name)?)?;
            println!("id          {}", identity.printable_id());
            println!("mesh        {}", identity.mesh());
            println!("public key  {}", hex::encode(identity.public_key()));
        }
        IdCommand::Check { id, key } => {
            let (mesh, expected) = PeerId::parse(&id).map_err(|e| e.to_string())?;
            let identity = load(&key, mesh)?;
            if identity.id() != expected {
                return Err(format!(
                    "{} is the key of {}, not of {id}",
                    key.display(),
                    identity.printable_id()
                ));
            }
            println!("ok: the key matches {id}");
        }
    }
    Ok(())
}

/// `GET path` on the agent's read-only HTTP endpoint; the JSON body of a 2xx.
/// The body of the agent's 2xx answer to `GET path`.
fn agent_get(agent: SocketAddr, path: &str) -> Result<Vec<u8>, String> {
    let client = themis_agent_client::Client::tcp(agent);
    client
        .call_raw(
            themis_agent_client::Method::GET,
            path,
            b"",
            "application/json",
        )
        .and_then(|(status, body)| themis_agent_client::success(status, body))
        .map_err(|e| format!("GET {path}: {e}"))
}

fn unix_millis() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// [`resolve`], in random order (load balancing, and the next one if one fails).
fn resolve_shuffled(
    agent: SocketAddr,
    service: &str,
    root: &MeshRoot,
) -> Result<Vec<Instance>, String> {
    let mut instances = resolve(agent, service, root)?;
    if instances.is_empty() {
        return Err(format!("{service} has no instances"));
    }
    let rng = ring::rand::SystemRandom::new();
    for i in (1..instances.len()).rev() {
        let mut r = [0u8; 4];
        rng.fill(&mut r).map_err(|_| "no randomness")?;
        instances.swap(i, u32::from_le_bytes(r) as usize % (i + 1));
    }
    Ok(instances)
}

/// Resolves `service` through the agent and keeps the instances whose records the
/// mesh root endorses, minus those a revocation withdraws (their key, or one their
/// endorsement rests on): checked here by the sidecar's own readers, as the filter
/// checks them, not taken on the agent's word.
fn resolve(agent: SocketAddr, service: &str, root: &MeshRoot) -> Result<Vec<Instance>, String> {
    ServiceName::check(service).map_err(|e| e.to_string())?;
    let revoked = agent::read_revocations(root, |path| agent_get(agent, path))?;
    let verifier = Verifier {
        root,
        now_ms: unix_millis(),
        revoked: &revoked,
    };
    let body = agent_get(agent, &paths::service(service))?;
    let results = agent::parse_instances(&body, service, &verifier).map_err(|e| e.to_string())?;
    let (endorsed, refused) = agent::endorsed(results, &[Transport::Themis], &root.mesh);
    for e in refused {
        eprintln!("skipping an instance of {service} the mesh root does not endorse: {e}");
    }
    Ok(endorsed
        .into_iter()
        .filter(|i| !i.is_revoked(root, &revoked))
        .collect())
}

/// Reads one complete Themis message from `stream`, keeping what follows in `buf`.
fn read_message(stream: &mut TcpStream, buf: &mut Vec<u8>) -> Result<Vec<u8>, String> {
    loop {
        if let Some(len) = wire::frame_len(buf).map_err(|e| e.to_string())? {
            if buf.len() >= len {
                let rest = buf.split_off(len);
                return Ok(std::mem::replace(buf, rest));
            }
        }
        let mut chunk = [0u8; 16 * 1024];
        match stream.read(&mut chunk).map_err(|e| e.to_string())? {
            0 => {
                return Err(
                    "the peer closed the connection (it is not the id resolved, or it refused us)"
                        .into(),
                )
            }
            n => buf.extend_from_slice(&chunk[..n]),
        }
    }
}

/// The key agreement with `instance`, as the initiator.
fn connect(
    me: &dyn HandshakeSigner,
    instance: &Instance,
) -> Result<(TcpStream, Vec<u8>, Session), String> {
    let mut stream = TcpStream::connect(instance.endpoint).map_err(|e| e.to_string())?;
    let rng = ring::rand::SystemRandom::new();
    let (waiting, hello) = Initiator::start(
        me,
        instance.id,
        &HandshakeConfig::default(),
        unix_millis(),
        &rng,
    )
    .map_err(|e| e.to_string())?;
    stream.write_all(&hello).map_err(|e| e.to_string())?;
    let mut buf = Vec::new();
    let reply = read_message(&mut stream, &mut buf)?;
    let (session, confirm) = waiting
        .read_hello_reply(&reply)
        .map_err(|e| e.to_string())?;
    stream.write_all(&confirm).map_err(|e| e.to_string())?;
    Ok((stream, buf, session))
}

/// Resolves `service`, then tries its instances in random order (load balancing, and
/// the next one if one fails) until one completes the key agreement; sends each message
/// sealed and prints each sealed answer.
fn call(
    service: &str,
    agent: SocketAddr,
    me: &dyn HandshakeSigner,
    root: &MeshRoot,
    messages: &[String],
) -> Result<(), String> {
    let instances = resolve_shuffled(agent, service, root)?;
    let mut failures = Vec::new();
    for instance in &instances {
        let (mut stream, mut buf, mut session) = match connect(me, instance) {
            Ok(connected) => connected,
            Err(e) => {
                eprintln!(
                    "{} at {}: {e}; trying the next instance",
                    instance.id.printable(me.identity().mesh()),
                    instance.endpoint
                );
                failures.push(e);
                continue;
            }
        };
        eprintln!(
            "authenticated {} at {}",
            instance.id.printable(me.identity().mesh()),
            instance.endpoint
        );
        for message in messages {
            let (seq, record) = session
                .seal(message.as_bytes(), None)
                .map_err(|e| e.to_string())?;
            stream.write_all(&record).map_err(|e| e.to_string())?;
            let mut answer = read_message(&mut stream, &mut buf)?;
            let opened = session
                .open_in_place(&mut answer)
                .map_err(|e| e.to_string())?;
            if opened.reply_to != Some(seq) {
                return Err("the answer does not answer our request".into());
            }
            println!("{}", String::from_utf8_lossy(opened.payload));
        }
        return Ok(());
    }
    Err(format!(
        "no instance of {service} could be reached: {}",
        failures.join("; ")
    ))
}

/// How long a call waits for the peer before giving up on it.
const HTTP_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);

/// Why one instance did not answer.
enum Failure {
    /// Before the key agreement finished: the next instance may be tried.
    Unreached(String),
    /// After it: the request may have reached the service, it is not sent again.
    Failed(String),
}

/// `call --http`: resolves `service`, then tries its instances in random order until
/// one's sidecar completes the key agreement; makes the request over HTTP/2 inside
/// the sealed stream and prints the response.
fn call_http(
    service: &str,
    agent: SocketAddr,
    me: &dyn HandshakeSigner,
    root: &MeshRoot,
    request: &http2::Request,
    claim: Option<String>,
) -> Result<(), String> {
    if let Some(claim) = &claim {
        if claim.is_empty() || claim.len() > themis_core::stream::MAX_SERVICE_LEN {
            return Err(format!("--service {claim:?} is not a service name"));
        }
    }
    let instances = resolve_shuffled(agent, service, root)?;
    let mut failures = Vec::new();
    for instance in &instances {
        match exchange(me, instance, request, claim.clone()) {
            Ok(status) if (200..300).contains(&status) => return Ok(()),
            Ok(status) => return Err(format!("{service} answered {status}")),
            Err(Failure::Failed(e)) => return Err(e),
            Err(Failure::Unreached(e)) => {
                eprintln!(
                    "{} at {}: {e}; trying the next instance",
                    instance.id.printable(me.identity().mesh()),
                    instance.endpoint
                );
                failures.push(e);
            }
        }
    }
    Err(format!(
        "no instance of {service} could be reached: {}",
        failures.join("; ")
    ))
}

/// One request to one instance: the stream's key agreement as the initiator (the
/// request's first bytes held until it finishes), then HTTP/2 until the response
/// ends. Returns the status.
fn exchange(
    me: &dyn HandshakeSigner,
    instance: &Instance,
    request: &http2::Request,
    claim: Option<String>,
) -> Result<u16, Failure> {
    let unreached = |e: String| Failure::Unreached(e);
    let mut tcp = TcpStream::connect(instance.endpoint).map_err(|e| unreached(e.to_string()))?;
    // Not every WASI host supports socket timeouts: without one, a silent peer waits.
    let _ = tcp.set_read_timeout(Some(HTTP_TIMEOUT));
    let rng = SystemRandom::new();
    let meta = Meta { service: claim };
    let (mut stream, hello) = StreamInitiator::start(
        me,
        instance.id,
        meta,
        &HandshakeConfig::default(),
        unix_millis(),
        &rng,
    )
    .map_err(|e| unreached(e.to_string()))?;
    let (mut client, first) =
        http2::Client::start(request).map_err(|e| Failure::Failed(e.to_string()))?;
    // Held until message 2 verified; sealed behind message 3 and the metadata.
    stream
        .from_app(&first)
        .map_err(|e| unreached(e.to_string()))?;
    tcp.write_all(&hello)
        .map_err(|e| unreached(e.to_string()))?;

    let mut stdout = std::io::stdout().lock();
    let mut status = None;
    let mut chunk = vec![0u8; 32 * 1024];
    while !client.is_done() {
        let opened = stream.is_open();
        let fail = |e: String| match opened {
            true => Failure::Failed(e),
            false => Failure::Unreached(e),
        };
        let n = match tcp.read(&mut chunk) {
            Ok(0) if !opened => {
                return Err(unreached(
                    "the peer closed the connection during the key agreement (it is not the \
                     id resolved, or it refused us)"
                        .into(),
                ))
            }
            Ok(0) => {
                let mut why = String::from(
                    "the connection closed before the response was complete (refused by the \
                     instance's policy?)",
                );
                if let Some((code, debug)) = client.goaway() {
                    why += &format!(
                        "; the server went away with {}{}{}",
                        http2::code_name(code),
                        if debug.is_empty() { "" } else { ": " },
                        String::from_utf8_lossy(debug)
                    );
                }
                return Err(Failure::Failed(why));
            }
            Ok(n) => n,
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                return Err(fail(format!("no answer within {HTTP_TIMEOUT:?}")))
            }
            Err(e) => return Err(fail(e.to_string())),
        };
        let out = stream
            .from_peer(&chunk[..n])
            .map_err(|e| fail(format!("the sealed stream failed: {e}")))?;
        if !opened && stream.is_open() {
            eprintln!(
                "authenticated {} at {}",
                instance.id.printable(me.identity().mesh()),
                instance.endpoint
            );
        }
        let mut to_peer = out.to_peer;
        if !out.to_app.is_empty() {
            let (reply, events) = match client.receive(&out.to_app) {
                Ok(answer) => answer,
                Err(e) => {
                    if let Some(goaway) = e.goaway() {
                        if let Ok(sealed) = stream.from_app(&goaway) {
                            let _ = tcp.write_all(&sealed);
                        }
                    }
                    return Err(Failure::Failed(e.to_string()));
                }
            };
            if !reply.is_empty() {
                let sealed = stream
                    .from_app(&reply)
                    .map_err(|e| Failure::Failed(e.to_string()))?;
                to_peer.extend_from_slice(&sealed);
            }
            for event in events {
                match event {
                    http2::Event::Informational { status, headers } => {
                        print_head(&format!("HTTP/2 {status}"), &headers)
                    }
                    http2::Event::Response { status: s, headers } => {
                        print_head(&format!("HTTP/2 {s}"), &headers);
                        status = Some(s);
                    }
                    http2::Event::Data(data) => stdout
                        .write_all(&data)
                        .map_err(|e| Failure::Failed(format!("stdout: {e}")))?,
                    http2::Event::Trailers(trailers) => print_head("trailers:", &trailers),
                    http2::Event::End => {}
                }
            }
        }
        if !to_peer.is_empty() {
            tcp.write_all(&to_peer).map_err(|e| fail(e.to_string()))?;
        }
    }
    let _ = stdout.flush();
    // A polite end; the connection closes when `tcp` drops.
    if let Ok(sealed) = stream.from_app(&client.goodbye()) {
        let _ = tcp.write_all(&sealed);
    }
    status.ok_or_else(|| Failure::Failed("the response ended without a status".into()))
}

/// A status line (or a heading) and header lines, on stderr.
fn print_head(first: &str, headers: &[(String, String)]) {
    let mut err = std::io::stderr().lock();
    let _ = writeln!(err, "{first}");
    for (name, value) in headers {
        let _ = writeln!(err, "{name}: {value}");
    }
}
