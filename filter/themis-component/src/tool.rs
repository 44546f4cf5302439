//! The component as a tool for people, run by `wasmtime run` through `wasi:cli/run`:
//! create and show identities, check that a key is the key of an id, and act as a mesh
//! client outside Envoy: resolve a service through an agent and call it over the
//! Themis channel.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::PathBuf;

use clap::{Parser, Subcommand};
use ring::rand::SecureRandom;
use ring::rand::SystemRandom;
use themis_core::handshake::Initiator;
use themis_core::{wire, HandshakeConfig, Identity, MeshName, PeerId, Session};
use themis_trust::{MeshRoot, Revocations, Verifier};

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
    /// channel, printing each answer. Needs `wasmtime run -S inherit-network`.
    Call {
        /// The service name.
        service: String,
        /// The agent's read-only resolution address (`themis agent --resolve-listen`).
        #[arg(long, default_value = "127.0.0.1:7480")]
        agent: SocketAddr,
        /// This client's key file.
        #[arg(long)]
        key: PathBuf,
        /// The mesh root (`<mesh>:<hex>`, as `themis mesh create` printed it): only
        /// instances it endorses for the service are called.
        #[arg(long)]
        mesh_root: String,
        /// The messages, one sealed request each.
        #[arg(required = true)]
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

fn run(command: Command) -> Result<(), String> {
    let command = match command {
        Command::Id(command) => command,
        Command::Call {
            service,
            agent,
            key,
            mesh_root,
            messages,
        } => {
            let root: MeshRoot = mesh_root.parse().map_err(|e| format!("--mesh-root: {e}"))?;
            let me = load(&key, root.mesh.clone())?;
            return call(&service, agent, &me, &root, &messages);
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

/// An instance of a service, as the agent resolves it.
struct Instance {
    endpoint: SocketAddr,
    id: PeerId,
}

/// `GET path` on the agent's read-only HTTP endpoint; the JSON body of a 200.
fn agent_get(agent: SocketAddr, path: &str) -> Result<serde_json::Value, String> {
    let unreachable = |e: std::io::Error| {
        format!(
            "cannot reach the agent at {agent}: {e} (is it running with --resolve-listen {agent}?)"
        )
    };
    let mut stream = TcpStream::connect(agent).map_err(unreachable)?;
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: themis-agent\r\nConnection: close\r\n\r\n"
    )
    .map_err(unreachable)?;
    let mut raw = Vec::new();
    stream
        .take(1 << 20)
        .read_to_end(&mut raw)
        .map_err(unreachable)?;
    let mut headers = [httparse::EMPTY_HEADER; 32];
    let mut response = httparse::Response::new(&mut headers);
    let Ok(httparse::Status::Complete(body_at)) = response.parse(&raw) else {
        return Err(format!("the agent at {agent} did not answer with HTTP"));
    };
    let body: serde_json::Value = serde_json::from_slice(&raw[body_at..])
        .map_err(|e| format!("the agent's answer is not JSON: {e}"))?;
    if response.code != Some(200) {
        return Err(format!(
            "the agent refused: {}",
            body["error"].as_str().unwrap_or("no details")
        ));
    }
    Ok(body)
}

fn unix_millis() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// Resolves `service` through the agent and keeps the instances whose records the
/// mesh root endorses (checked here, not taken on the agent's word), minus revoked
/// keys (revocations fetched from the agent and checked against the root too).
fn resolve(agent: SocketAddr, service: &str, root: &MeshRoot) -> Result<Vec<Instance>, String> {
    if service.is_empty()
        || !service
            .bytes()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == b'-' || c == b'.')
    {
        return Err(format!("{service:?} is not a service name"));
    }
    let mut revoked = Revocations::new();
    let listed = agent_get(agent, "/v1/revocations")?;
    for r in listed["revocations"].as_array().into_iter().flatten() {
        let bytes = hex::decode(r["revocation"].as_str().unwrap_or_default())
            .map_err(|_| "a revocation that is not hex")?;
        revoked
            .add(root, &bytes)
            .map_err(|e| format!("a revocation the mesh root did not sign: {e}"))?;
    }
    let verifier = Verifier {
        root,
        now_ms: unix_millis(),
        revoked: &revoked,
    };
    let body = agent_get(agent, &format!("/v1/services/{service}"))?;
    let instances = body["instances"].as_array().cloned().unwrap_or_default();
    let mut endorsed = Vec::new();
    for i in &instances {
        let value = hex::decode(i["record"].as_str().unwrap_or_default())
            .map_err(|_| "an instance without a record")?;
        match verifier.instance(&value, service) {
            Ok(instance)
                if Some(instance.id.printable(&root.mesh).as_str()) == i["id"].as_str() =>
            {
                if let Some(endpoint) = instance.endpoint {
                    endorsed.push(Instance {
                        endpoint,
                        id: instance.id,
                    });
                }
            }
            Ok(_) => eprintln!("skipping an instance whose id is not its record's"),
            Err(e) => eprintln!("skipping an instance the mesh root does not endorse: {e}"),
        }
    }
    Ok(endorsed)
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
fn connect(me: &Identity, instance: &Instance) -> Result<(TcpStream, Vec<u8>, Session), String> {
    let mut stream = TcpStream::connect(instance.endpoint).map_err(|e| e.to_string())?;
    let rng = ring::rand::SystemRandom::new();
    let (waiting, hello) = Initiator::start(me, instance.id, &HandshakeConfig::default(), &rng)
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
    me: &Identity,
    root: &MeshRoot,
    messages: &[String],
) -> Result<(), String> {
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
    let mut failures = Vec::new();
    for instance in &instances {
        let (mut stream, mut buf, mut session) = match connect(me, instance) {
            Ok(connected) => connected,
            Err(e) => {
                eprintln!(
                    "{} at {}: {e}; trying the next instance",
                    instance.id.printable(me.mesh()),
                    instance.endpoint
                );
                failures.push(e);
                continue;
            }
        };
        eprintln!(
            "authenticated {} at {}",
            instance.id.printable(me.mesh()),
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
