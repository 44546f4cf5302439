//! Runs real `themis agent` processes on loopback (or in network namespaces) and
//! talks to them through their Unix-socket API, as people and proxies do.
//!
//! Every process started here is stopped by its pid when its [`Agent`] drops.
//!
//! The agents run on loopback and need nothing special; with [`Spawn::netns`] they
//! run in a network namespace ([`crate::netns`]), which needs root.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::Duration;

use serde_json::Value;
use themis_agent_client::ApiClient;

use crate::build;
pub use crate::ports::free_port;
use crate::process::{poll_until, wait_until, wait_until_or};
pub use themis_agent::config::Routing;

/// The mesh every test agent is in.
pub const MESH: &str = "test";

/// Fast timers, so rings converge in seconds: stabilise every 200 ms, records live
/// 10 s and are re-stored every 2 s, resolutions are not cached, revocations are
/// looked for and trust logs compared every 500 ms.
pub const FAST: &[&str] = &[
    "--stabilise-ms",
    "200",
    "--request-timeout-ms",
    "500",
    "--record-ttl-secs",
    "10",
    "--republish-secs",
    "2",
    "--resolve-cache-ms",
    "0",
    "--revocation-poll-ms",
    "500",
    "--log-sync-ms",
    "500",
    "--metrics",
    "off",
];

/// One agent process.
pub struct Agent {
    pub name: String,
    pub dir: PathBuf,
    child: Option<Child>,
    pub api: ApiClient,
    /// `<id>@<ip:port>`, what others join through.
    pub contact: String,
    pub id: String,
}

/// Options of one agent.
pub struct Spawn<'a> {
    pub listen: &'a str,
    pub join: Option<&'a str>,
    pub extra: &'a [&'a str],
    /// Run inside this network namespace (`ip netns exec`).
    pub netns: Option<&'a str>,
    /// `--routing`, when the test pins it (after `extra`, so it wins); `None`: the
    /// agent's default, one hop. See [`Spawn::chord`].
    pub routing: Option<Routing>,
    /// Environment variables set for the agent process (the agent's test-only fault
    /// injection, read in debug builds alone, is one).
    pub env: &'a [(&'a str, &'a str)],
}

impl Default for Spawn<'_> {
    fn default() -> Self {
        Spawn {
            listen: "127.0.0.1:0",
            join: None,
            extra: FAST,
            netns: None,
            routing: None,
            env: &[],
        }
    }
}

impl Spawn<'_> {
    /// Pins the agent to Chord routing (`--routing chord`) rather than the agent's
    /// default, one hop: for tests whose subject is Chord itself (a peer's `Notify`,
    /// joins that rewire the ring, successor lists repaired by stabilisation, lookups
    /// through other nodes).
    pub fn chord(self) -> Self {
        Spawn {
            routing: Some(Routing::Chord),
            ..self
        }
    }
}

/// The `--routing` value naming `routing`.
pub fn routing_flag(routing: Routing) -> &'static str {
    match routing {
        Routing::Chord => "chord",
        Routing::OneHop => "one-hop",
    }
}

/// The environment variable naming a prebuilt `themis` ([`themis_binary`]).
pub const TOOL: &str = "THEMIS_TOOL";

/// The `themis` binary (agent and tool) the harness runs.
///
/// For themis-cli's own tests, Cargo builds it with them, into the profile
/// directory the test executable's `deps/` is in (`target/debug/themis` beside
/// `target/debug/deps/ring-…`): that one. The tests of other crates (themis-agent,
/// themis-envoy, themis-component) run under Cargo with their own `CARGO_PKG_NAME`: Cargo does not
/// build another package's binaries for them, so it is built here
/// ([`build::themis_binary`], which needs [`crate::require::cargo_build`]). A test
/// executable run by hand (no `CARGO_PKG_NAME`) takes the one beside it.
///
/// `THEMIS_TOOL` names one to take instead: `scripts/test.sh` sets it to the `themis`
/// its `cargo test --workspace` built (for themis-cli's tests, with the workspace's
/// features), since a build here, with one package's features, compiles every
/// dependency a second time.
pub fn themis_binary() -> &'static str {
    static PATH: OnceLock<String> = OnceLock::new();
    PATH.get_or_init(|| {
        if let Some(tool) = std::env::var_os(TOOL) {
            let tool = PathBuf::from(tool);
            assert!(tool.is_file(), "{TOOL}={} is not a file", tool.display());
            return tool.to_str().expect("a UTF-8 path").to_owned();
        }
        let package = std::env::var("CARGO_PKG_NAME").ok();
        if package.as_deref().is_some_and(|p| p != "themis-cli") {
            return build::themis_binary().to_owned();
        }
        let exe = std::env::current_exe().expect("the test executable's path");
        let profile = exe
            .parent()
            .and_then(Path::parent)
            .expect("the test executable is in <target>/<profile>/deps");
        let binary = profile.join("themis");
        assert!(
            binary.is_file(),
            "{} is missing: themis-cli's tests build it (cargo test -p themis-cli)",
            binary.display()
        );
        binary
            .to_str()
            .expect("a UTF-8 target directory")
            .to_owned()
    })
}

impl Agent {
    /// Starts an agent with its state under `root/name` and waits until its API
    /// answers (not until it has joined: see [`Agent::wait_joined`]).
    pub fn spawn(root: &Path, name: &str, options: Spawn<'_>) -> Agent {
        let dir = root.join(name);
        std::fs::create_dir_all(&dir).unwrap();
        admit(root, &dir);
        let log = std::fs::File::create(root.join(format!("{name}.log"))).unwrap();
        let mut command = match options.netns {
            Some(ns) => {
                let mut c = Command::new("ip");
                c.args(["netns", "exec", ns, themis_binary()]);
                c
            }
            None => Command::new(themis_binary()),
        };
        command
            .args(["agent", "--mesh", MESH, "--listen", options.listen])
            .arg("--state-dir")
            .arg(&dir)
            .args(options.extra)
            .args(
                options
                    .routing
                    .iter()
                    .flat_map(|r| ["--routing", routing_flag(*r)]),
            )
            .env("RUST_LOG", "info,themis_agent=debug")
            .envs(options.env.iter().copied())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log);
        if let Some(join) = options.join {
            command.args(["--join", join]);
        }
        let child = command.spawn().expect("starting themis agent");
        let api = ApiClient::new(dir.join("agent.sock"));
        let mut agent = Agent {
            name: name.to_owned(),
            dir,
            child: Some(child),
            api,
            contact: String::new(),
            id: String::new(),
        };
        let status = agent.wait_for("its API", Duration::from_secs(20), |a| {
            a.get("/v1/status").filter(|(code, _)| *code == 200)
        });
        let status = status.1;
        agent.id = status["id"].as_str().unwrap().to_owned();
        agent.contact = format!("{}@{}", agent.id, status["listen"].as_str().unwrap());
        agent
    }

    /// `GET path` on the agent's API: `None` if the agent is not answering.
    pub fn get(&self, path: &str) -> Option<(u16, Value)> {
        self.call(hyper::Method::GET, path, None)
    }

    /// Any call on the agent's API: `None` if the agent is not answering.
    pub fn call(
        &self,
        method: hyper::Method,
        path: &str,
        body: Option<&Value>,
    ) -> Option<(u16, Value)> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime
            .block_on(self.api.call(method, path, body))
            .ok()
            .map(|(status, value)| (status.as_u16(), value))
    }

    /// Runs the `themis` tool against this agent; returns (exit code, stdout, stderr).
    /// The mesh operator revokes `id` (printable) with the root in `mesh_dir` and
    /// publishes the revocation through this agent; panics if that fails.
    pub fn revoke(&self, id: &str, mesh_dir: &Path) {
        let mesh_dir = mesh_dir.to_str().unwrap();
        let args = [
            "revoke",
            id,
            "--mesh-dir",
            mesh_dir,
            "--reason",
            "test: stolen",
            "--publish",
        ];
        let (code, out, err) = self.cli(&args);
        assert_eq!(code, 0, "themis revoke {id}: {out}{err}");
    }

    /// [`Agent::revoke`] of many ids in one checkpoint of the trust log.
    pub fn revoke_many(&self, ids: &[String], mesh_dir: &Path) {
        let (code, out, err) = self.revoke_ids(ids, mesh_dir, true);
        assert_eq!(code, 0, "themis revoke ({} ids): {out}{err}", ids.len());
    }

    /// `themis revoke IDS... --mesh-dir M [--publish]` through this agent; returns
    /// (exit code, stdout, stderr).
    pub fn revoke_ids(
        &self,
        ids: &[String],
        mesh_dir: &Path,
        publish: bool,
    ) -> (i32, String, String) {
        let mut args = vec!["revoke"];
        args.extend(ids.iter().map(String::as_str));
        args.extend([
            "--mesh-dir",
            mesh_dir.to_str().unwrap(),
            "--reason",
            "test: stolen",
        ]);
        if publish {
            args.push("--publish");
        }
        self.cli(&args)
    }

    /// `themis log publish --mesh-dir M` through this agent; panics if it fails.
    pub fn publish_log(&self, mesh_dir: &Path) {
        let (code, out, err) =
            self.cli(&["log", "publish", "--mesh-dir", mesh_dir.to_str().unwrap()]);
        assert_eq!(code, 0, "themis log publish: {out}{err}");
    }

    pub fn cli(&self, args: &[&str]) -> (i32, String, String) {
        let out = Command::new(themis_binary())
            .arg("--socket")
            .arg(self.dir.join("agent.sock"))
            .args(args)
            .output()
            .unwrap();
        (
            out.status.code().unwrap_or(-1),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }

    /// Polls `check` every 100 ms until it gives a value, or panics after `limit`
    /// naming `what` and the agent's log.
    pub fn wait_for<T>(
        &self,
        what: &str,
        limit: Duration,
        mut check: impl FnMut(&Agent) -> Option<T>,
    ) -> T {
        wait_until_or(
            &format!("{}: {what}", self.name),
            limit,
            || check(self),
            || format!("log:\n{}", self.log_tail()),
        )
    }

    /// Waits until the agent reports it is in a ring.
    /// A new admitted agent joins the ring through this one, registers `web` at
    /// 127.0.0.1:8080, and this one resolves it (each within 30 s): the ring still
    /// works for a newcomer. Returns the newcomer.
    pub fn a_newcomer_joins_registers_and_is_resolved(&self, root: &Path) -> Agent {
        let b = Agent::spawn(
            root,
            "b",
            Spawn {
                join: Some(&self.contact),
                ..Spawn::default()
            },
        );
        b.wait_joined();
        b.register("web", "web-1", "127.0.0.1:8080");
        self.wait_for("web resolved", Duration::from_secs(30), |a| {
            a.endpoints("web").filter(|e| e == &["127.0.0.1:8080"])
        });
        b
    }

    pub fn wait_joined(&self) {
        self.wait_for("join", Duration::from_secs(30), |a| {
            a.get("/v1/status").filter(|(_, s)| s["joined"] == true)
        });
    }

    /// The last lines of the agent's log.
    pub fn log_tail(&self) -> String {
        let log = self.dir.with_file_name(format!("{}.log", self.name));
        let text = std::fs::read_to_string(log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(30)..].join("\n")
    }

    /// The agent's log.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.with_file_name(format!("{}.log", self.name)))
            .unwrap_or_default()
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// SIGTERM (graceful leave), then waits for the process to exit; returns its
    /// exit status code.
    pub fn terminate(&mut self) -> Option<i32> {
        let mut child = self.child.take()?;
        signal(child.id(), "TERM");
        match poll_until(Duration::from_secs(15), || child.try_wait().unwrap()) {
            Some(status) => status.code(),
            None => {
                let _ = child.kill();
                let _ = child.wait();
                panic!("{} did not stop within 15 s of SIGTERM", self.name);
            }
        }
    }

    /// SIGKILL: the node vanishes without a word.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Registers `workload` as an instance of `service` (granting the service to
    /// this node first, as the operator would).
    pub fn register(&self, service: &str, workload: &str, endpoint: &str) -> Value {
        self.register_with(service, workload, endpoint, None)
    }

    /// [`Agent::register`] with the record's labels (`{"version":"v2"}`, or the
    /// transports its sidecar takes: `{"themis.transport":"tls"}`).
    pub fn register_with(
        &self,
        service: &str,
        workload: &str,
        endpoint: &str,
        metadata: Option<Value>,
    ) -> Value {
        self.grant(service);
        let mut body = serde_json::json!({ "endpoint": endpoint });
        if let Some(metadata) = metadata {
            body["metadata"] = metadata;
        }
        let path = format!("/v1/services/{service}/instances/{workload}");
        let (status, answer) = self.call(hyper::Method::PUT, &path, Some(&body)).unwrap();
        assert_eq!(status, 200, "{}: register {service}: {answer}", self.name);
        answer
    }

    /// The mesh operator grants `service` to this node (once).
    pub fn grant(&self, service: &str) {
        grant(self.dir.parent().unwrap(), &self.dir, service);
    }

    /// Resolves `service` (skipping the cache); `None` if the call failed.
    pub fn resolve(&self, service: &str) -> Option<Value> {
        match self.get(&format!("/v1/services/{service}?fresh=true")) {
            Some((200, answer)) => Some(answer),
            _ => None,
        }
    }

    /// Endpoints of the instances of `service` this agent resolves.
    pub fn endpoints(&self, service: &str) -> Option<Vec<String>> {
        let answer = self.resolve(service)?;
        Some(
            answer["instances"]
                .as_array()?
                .iter()
                .map(|i| i["endpoint"].as_str().unwrap().to_owned())
                .collect(),
        )
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        self.kill();
    }
}

fn signal(pid: u32, sig: &str) {
    let status = Command::new("kill")
        .args([&format!("-{sig}"), &pid.to_string()])
        .status()
        .unwrap();
    assert!(status.success(), "kill -{sig} {pid}");
}

/// Runs the `themis` tool offline (operator commands); panics with its output if it
/// fails.
pub fn operator(args: &[&std::ffi::OsStr]) -> String {
    let out = Command::new(themis_binary()).args(args).output().unwrap();
    assert!(
        out.status.success(),
        "themis {args:?}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A stranger (a key the mesh never admitted) sends each of `requests` to the agent at
/// `contact` (`<id>@<ip:port>`) over the agents' secure channel, a fresh connection
/// each: every one must be answered `rejected`, or closed unanswered.
pub fn assert_strangers_refused(
    contact: &str,
    stranger: &std::sync::Arc<themis_core::Identity>,
    requests: &[Vec<u8>],
) {
    use themis_agent::overlay::Frame;
    let (id, addr) = contact.split_once('@').unwrap();
    let peer = themis_core::PeerId::parse_in(id, stranger.mesh()).unwrap();
    let addr: std::net::SocketAddr = addr.parse().unwrap();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    for request in requests {
        let client = themis_net::Client::new(stranger.clone(), themis_net::ClientConfig::default());
        let answer = runtime.block_on(client.request(peer, addr, request));
        match answer.map(|bytes| postcard::from_bytes::<Frame>(&bytes)) {
            Ok(Ok(Frame::Refused { reason })) => assert_eq!(reason, "rejected"),
            Err(_) => {} // closed before answering: nothing either
            other => panic!("a stranger was answered: {other:?}"),
        }
    }
}

/// A copy of the test mesh's directory under `root` (its key, root and trust log as
/// they are now) at `root/mesh-twin`: what the root signs from then on in each copy
/// is one of two histories (a fork of the log).
pub fn twin_mesh(root: &Path) -> PathBuf {
    let (mesh, twin) = (mesh_dir(root), root.join("mesh-twin"));
    std::fs::create_dir_all(&twin).unwrap();
    for file in ["mesh.key", "mesh.root", "trust-log.bin"] {
        std::fs::copy(mesh.join(file), twin.join(file)).unwrap();
    }
    twin
}

/// The test mesh's directory under `root` (its key and root), created once.
pub fn mesh_dir(root: &Path) -> PathBuf {
    let mesh = root.join("mesh");
    if !mesh.join("mesh.key").exists() {
        operator(&[
            "mesh".as_ref(),
            "create".as_ref(),
            MESH.as_ref(),
            "--out".as_ref(),
            mesh.as_os_str(),
        ]);
    }
    mesh
}

/// The operator admits the node whose state directory is `dir` (once).
pub fn admit(root: &Path, dir: &Path) {
    if !dir.join("admission.pem").exists() {
        let mesh = mesh_dir(root);
        let args: [&std::ffi::OsStr; 6] = [
            "node".as_ref(),
            "admit".as_ref(),
            "--mesh-dir".as_ref(),
            mesh.as_os_str(),
            "--out".as_ref(),
            dir.as_os_str(),
        ];
        let existing = dir.join("node.key").exists();
        if existing {
            let mut with: Vec<&std::ffi::OsStr> = args.to_vec();
            with.push("--existing-key".as_ref());
            operator(&with);
        } else {
            operator(&args);
        }
    }
}

/// The operator grants `service` to the node in `dir` (once).
pub fn grant(root: &Path, dir: &Path, service: &str) {
    if !dir.join("grants").join(format!("{service}.pem")).exists() {
        let mesh = mesh_dir(root);
        operator(&[
            "service".as_ref(),
            "grant".as_ref(),
            service.as_ref(),
            "--mesh-dir".as_ref(),
            mesh.as_os_str(),
            "--node".as_ref(),
            dir.as_os_str(),
        ]);
    }
}

/// A node the operator admitted into the test mesh under `root` (its state directory
/// `root/name`), for tests that play a peer by hand: its node key and its admission
/// credential (encoded, as a DHT frame carries it). Admitted once; later calls load it.
pub fn admitted_peer(root: &Path, name: &str) -> (themis_core::Identity, Vec<u8>) {
    let dir = root.join(name);
    admit(root, &dir);
    node_credentials(&dir)
}

/// The node key and encoded admission in a node directory `themis node admit` wrote.
pub fn node_credentials(dir: &Path) -> (themis_core::Identity, Vec<u8>) {
    let root: themis_trust::MeshRoot = std::fs::read_to_string(dir.join("mesh.root"))
        .unwrap()
        .parse()
        .unwrap();
    let key = themis_agent::keystore::load(&dir.join("node.key"), &root.mesh).unwrap();
    let pem = std::fs::read_to_string(dir.join("admission.pem")).unwrap();
    let admission = themis_trust::from_pem(themis_trust::PemKind::Admission, &pem)
        .unwrap()
        .encode();
    (key, admission)
}

/// The test mesh's root key (what only the operator holds), for tests that sign
/// credentials the `themis` tool would not (expired, from the future...).
pub fn mesh_key(root: &Path) -> themis_core::Identity {
    let mesh = mesh_dir(root);
    let name = themis_core::MeshName::new(MESH).unwrap();
    themis_agent::keystore::load(&mesh.join("mesh.key"), &name).unwrap()
}

/// [`FAST`] with metrics served on a free port of their own, then `more`; returns
/// the arguments and the metrics address.
pub fn metered(more: &[&str]) -> (Vec<String>, std::net::SocketAddr) {
    let metrics = crate::ports::listener_addr();
    let mut args: Vec<String> = FAST.iter().map(|a| (*a).to_owned()).collect();
    let at = args.iter().position(|a| a == "--metrics").unwrap();
    args[at + 1] = metrics.to_string();
    args.extend(more.iter().map(|a| (*a).to_owned()));
    (args, metrics)
}

/// `GET /metrics` over plain HTTP/1.0.
pub fn scrape(addr: std::net::SocketAddr) -> std::io::Result<String> {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(5))?;
    s.set_read_timeout(Some(Duration::from_secs(10)))?;
    s.write_all(b"GET /metrics HTTP/1.0\r\n\r\n")?;
    let mut text = String::new();
    s.read_to_string(&mut text)?;
    match text.split_once("\r\n\r\n") {
        Some((head, body)) if head.split(' ').nth(1) == Some("200") => Ok(body.to_owned()),
        _ => Err(std::io::Error::other(format!("bad answer: {text:?}"))),
    }
}

/// The value of the series `name` with exactly these labels in a Prometheus text, 0
/// if absent.
pub fn sample(text: &str, name: &str, labels: &[(&str, &str)]) -> u64 {
    let mut want: Vec<(String, String)> = labels
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect();
    want.sort();
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        let Some((series, value)) = line.rsplit_once(' ') else {
            continue;
        };
        let (series_name, series_labels) = match series.split_once('{') {
            Some((n, rest)) => (n, rest.strip_suffix('}').unwrap_or(rest)),
            None => (series, ""),
        };
        if series_name != name {
            continue;
        }
        let mut got: Vec<(String, String)> = series_labels
            .split(',')
            .filter(|kv| !kv.is_empty())
            .map(|kv| {
                let (k, v) = kv.split_once('=').unwrap();
                (k.to_owned(), v.trim_matches('"').to_owned())
            })
            .collect();
        got.sort();
        if got == want {
            return value.parse::<f64>().unwrap() as u64;
        }
    }
    0
}

/// A temporary directory for one test's agents.
pub fn workdir() -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix("themis-agent-test-")
        .tempdir()
        .unwrap()
}

/// Starts `n` agents: the first creates the ring, the others join through it, one
/// after another. Waits until all have joined.
pub fn ring(root: &Path, n: usize, extra: &[&str]) -> Vec<Agent> {
    ring_routed(root, n, extra, None)
}

/// [`ring`], with every agent's `--routing` pinned to `routing` (`None`: the
/// agent's default, one hop); see [`Spawn::chord`].
pub fn ring_routed(root: &Path, n: usize, extra: &[&str], routing: Option<Routing>) -> Vec<Agent> {
    let first = Agent::spawn(
        root,
        "agent-0",
        Spawn {
            extra,
            routing,
            ..Spawn::default()
        },
    );
    let contact = first.contact.clone();
    let mut agents = vec![first];
    for i in 1..n {
        agents.push(Agent::spawn(
            root,
            &format!("agent-{i}"),
            Spawn {
                join: Some(&contact),
                extra,
                routing,
                ..Spawn::default()
            },
        ));
    }
    for a in &agents {
        a.wait_joined();
    }
    agents
}

/// Waits until every agent's successor list is consistent with a ring of exactly
/// these agents (each one's first successor is the next id clockwise) and, with
/// one-hop routing, its membership counts exactly these agents (gossip needs a moment
/// to tell each of every other, its successor first or not).
pub fn wait_stable(agents: &[&Agent], limit: Duration) {
    let mut ids: Vec<(String, &Agent)> = agents.iter().map(|a| (hex_of(&a.id), *a)).collect();
    ids.sort_by(|x, y| x.0.cmp(&y.0));
    wait_until("the ring to stabilise", limit, || {
        let stable = ids.iter().enumerate().all(|(i, (_, a))| {
            let next = &ids[(i + 1) % ids.len()].1.id;
            a.get("/v1/ring").is_some_and(|(_, ring)| {
                ring["successors"][0]["id"].as_str() == Some(next.as_str())
                    && ring["members"]
                        .as_u64()
                        .is_none_or(|n| n == ids.len() as u64)
            })
        });
        stable.then_some(())
    });
}

/// The ring position of a printable id, as hex (ids sort on the ring by this).
pub fn hex_of(printable: &str) -> String {
    let (_, id) = themis_core::PeerId::parse(printable).unwrap();
    hex::encode(id.0)
}

/// An agent whose Prometheus metrics are on a free port, for tests that count refusals.
pub struct Metered {
    pub agent: Agent,
    pub metrics: std::net::SocketAddr,
    /// The test's directory (the mesh and every node live under it).
    pub root: PathBuf,
}

impl Metered {
    /// Starts an agent (`FAST` timers, then `more`) with metrics on a free port, and
    /// waits until it is in a ring.
    pub fn spawn(root: &Path, name: &str, join: Option<&str>, more: &[&str]) -> Metered {
        Metered::spawn_setting(root, name, join, &[], more)
    }

    /// [`Metered::spawn`] pinned to Chord routing ([`Spawn::chord`]), for tests whose
    /// subject is Chord itself.
    pub fn spawn_chord(root: &Path, name: &str, join: Option<&str>, more: &[&str]) -> Metered {
        Metered::start(root, name, join, &[], more, Some(Routing::Chord))
    }

    /// [`Metered::spawn`], with the `FAST` flags named in `set` given new values.
    pub fn spawn_setting(
        root: &Path,
        name: &str,
        join: Option<&str>,
        set: &[(&str, &str)],
        more: &[&str],
    ) -> Metered {
        Metered::start(root, name, join, set, more, None)
    }

    fn start(
        root: &Path,
        name: &str,
        join: Option<&str>,
        set: &[(&str, &str)],
        more: &[&str],
        routing: Option<Routing>,
    ) -> Metered {
        let (mut extra, metrics) = metered(more);
        for (flag, value) in set {
            let at = extra
                .iter()
                .position(|a| a == flag)
                .unwrap_or_else(|| panic!("{flag} is not one of the FAST flags"));
            extra[at + 1] = (*value).to_owned();
        }
        let extra: Vec<&str> = extra.iter().map(String::as_str).collect();
        let agent = Agent::spawn(
            root,
            name,
            Spawn {
                join,
                extra: &extra,
                routing,
                ..Spawn::default()
            },
        );
        agent.wait_joined();
        Metered {
            agent,
            metrics,
            root: root.to_owned(),
        }
    }

    /// Where the agent accepts agent connections.
    pub fn listen(&self) -> std::net::SocketAddr {
        self.agent
            .contact
            .split_once('@')
            .unwrap()
            .1
            .parse()
            .unwrap()
    }

    /// The agent's id.
    pub fn peer_id(&self) -> themis_core::PeerId {
        themis_core::PeerId::parse(&self.agent.id).unwrap().1
    }

    /// The Prometheus text, retrying while the metrics listener comes up.
    pub fn scrape(&self) -> String {
        let mut last = None;
        poll_until(Duration::from_secs(10), || {
            scrape(self.metrics).map_err(|e| last = Some(e)).ok()
        })
        .unwrap_or_else(|| {
            panic!(
                "{}: no metrics at {}: {:?}",
                self.agent.name, self.metrics, last
            )
        })
    }

    /// One sample (0 when the series does not exist yet).
    pub fn value(&self, name: &str, labels: &[(&str, &str)]) -> u64 {
        sample(&self.scrape(), name, labels)
    }
}

/// The body of `POST /v1/workloads/{w}/sign` a sidecar sends for a fresh Hello of its
/// workload (to a self-made peer), from the agent's `GET /v1/workloads/{w}/identity`
/// answer.
pub fn hello_sign_request(identity: &Value, mesh: &str) -> Value {
    use themis_core::identity::PublicIdentity;
    let mut key = [0u8; 32];
    hex::decode_to_slice(identity["public_key"].as_str().unwrap(), &mut key).unwrap();
    let me = PublicIdentity::new(key, themis_core::MeshName::new(mesh).unwrap());
    let peer = crate::intruder::self_made_key(mesh).id();
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64;
    let pending = themis_core::handshake::Initiator::start_unsigned(
        &me,
        peer,
        &themis_core::HandshakeConfig::default(),
        now_ms,
        &ring::rand::SystemRandom::new(),
    )
    .unwrap();
    serde_json::json!({"kind": "hello", "body": hex::encode(&pending.to_sign().body)})
}

/// GETs each of `paths` on an agent's `--resolve-listen` listener until one is refused
/// with 429: its head and body (`None`: none was). Every answer before must be 200.
pub fn first_rate_limited(
    addr: std::net::SocketAddr,
    paths: impl IntoIterator<Item = String>,
) -> Option<(String, Value)> {
    for path in paths {
        let (status, head, answer) = resolve_listener_get(addr, &path);
        if status == 429 {
            return Some((head, answer));
        }
        assert_eq!(status, 200, "{path}: {answer}");
    }
    None
}

/// `GET path` on an agent's `--resolve-listen` listener over HTTP/1.0: the status, the
/// head in lower case, and the JSON body.
pub fn resolve_listener_get(addr: std::net::SocketAddr, path: &str) -> (u16, String, Value) {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    write!(s, "GET {path} HTTP/1.0\r\n\r\n").unwrap();
    let mut text = String::new();
    s.read_to_string(&mut text).unwrap();
    let (head, body) = text.split_once("\r\n\r\n").unwrap();
    let status = head.split(' ').nth(1).unwrap().parse().unwrap();
    (
        status,
        head.to_ascii_lowercase(),
        serde_json::from_str(body).unwrap(),
    )
}
