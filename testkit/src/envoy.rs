//! A real Envoy running the Themis filter, configured by rendering
//! `deploy/envoy/sidecar.yaml` itself. Every port is chosen by the kernel (port 0);
//! the admin address comes from `--admin-address-path`, the listeners' from the
//! admin API.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use crate::build::venv_binary;
use crate::http;
use crate::module::{filter_pin, Pin};
use crate::process::{poll_until, wait_until, wait_until_or, Process};
use themis_bootstrap::Runtime;

/// How long Envoy gets to become ready (the filter is compiled by V8 per worker).
const READY_LIMIT: Duration = Duration::from_secs(60);

/// The mesh root of the test mesh whose agents live under `root` (the harness
/// creates it with the first agent).
pub fn mesh_root(root: &Path) -> String {
    std::fs::read_to_string(root.join("mesh").join("mesh.root"))
        .expect("the harness created the mesh with the first agent")
        .trim()
        .to_owned()
}

/// The plugin configuration of the outbound role in the mesh with root `mesh_root`.
pub fn outbound_config(mesh_root: &str, workload: &str, service: &str) -> String {
    format!(
        r#"{{"role":"outbound","mesh_root":"{mesh_root}","workload":"{workload}","service":"{service}","revocation_poll_secs":1}}"#
    )
}

/// The inbound policy of the tests' callees: instances of `handler` (the caller the
/// two-node tests start) may call, nobody else.
pub const ALLOW_HANDLER: &str = r#"{"allow":[{"service":"handler"}]}"#;

/// The inbound policy of a sidecar nobody is meant to call (handler's own).
pub const ALLOW_NOBODY: &str = r#"{"allow":[]}"#;

/// The plugin configuration of the inbound role, with its policy (JSON); `None`
/// leaves `policy` out, and then the sidecar refuses every caller.
pub fn inbound_config(
    mesh_root: &str,
    workload: &str,
    service: &str,
    policy: Option<&str>,
) -> String {
    let policy = policy.map_or(String::new(), |p| format!(r#","policy":{p}"#));
    format!(
        r#"{{"role":"inbound","mesh_root":"{mesh_root}","workload":"{workload}","service":"{service}","revocation_poll_secs":1{policy}}}"#
    )
}

pub use themis_bootstrap::AppProtocol;

/// What one sidecar is made of.
pub struct Sidecar<'a> {
    pub app_protocol: AppProtocol,
    /// The address both listeners bind (a free port each).
    pub ip: &'a str,
    pub agent_socket: &'a Path,
    pub app: SocketAddr,
    pub outbound_config: &'a str,
    pub inbound_config: &'a str,
}

/// `deploy/envoy/sidecar.yaml` with every placeholder filled in, the module fetched
/// from the test process's own server and pinned to the built filter's hash.
pub fn render(sidecar: &Sidecar<'_>) -> String {
    render_on(sidecar, crate::mesh::Runtime::Wasm, &Additions::default())
}

/// [`render`] with the module fetched and pinned as `pin` says.
pub fn render_pinned(sidecar: &Sidecar<'_>, pin: &Pin) -> String {
    bootstrap(sidecar, Some(pin.filter_code()), &Additions::default())
}

/// `deploy/envoy/sidecar-native.yaml` for `sidecar`, whose app calls `calls`: the
/// native module's HTTP filter picks and its transport sockets seal (one sealing
/// cluster per called service): no Wasm at all.
pub fn render_native(sidecar: &Sidecar<'_>, calls: &[&str]) -> String {
    render_on(
        sidecar,
        crate::mesh::Runtime::Native,
        &Additions {
            calls,
            ..Additions::default()
        },
    )
}

/// One TLS certificate of `workload`, from the agent at `socket` by `themis sidecar
/// certificate` (as a user runs it), as PEM files in `out`: certificate and key.
pub fn certificate_files(socket: &Path, workload: &str, out: &Path) -> [PathBuf; 2] {
    crate::agent::operator(&[
        "--socket".as_ref(),
        socket.as_os_str(),
        "sidecar".as_ref(),
        "certificate".as_ref(),
        "--workload".as_ref(),
        workload.as_ref(),
        "--out".as_ref(),
        out.as_os_str(),
    ]);
    [out.join("certificate.pem"), out.join("key.pem")]
}

/// What a rendering adds to a sidecar, as `themis sidecar render`'s `--calls` and
/// `--tcp` do.
#[derive(Default)]
pub struct Additions<'a> {
    /// The services its app calls (the native runtime's sealing clusters).
    pub calls: &'a [&'a str],
    /// A listener per TCP service, at its address, tunnelled through the outbound
    /// listener (which then needs a fixed port: `outbound`).
    pub tcp: &'a [(&'a str, SocketAddr)],
    /// The outbound listener's address (`None`: `sidecar.ip`, port 0).
    pub outbound: Option<SocketAddr>,
}

/// `sidecar` on `runtime` (the Wasm module pinned to the built filter), with
/// `additions`.
pub fn render_on(
    sidecar: &Sidecar<'_>,
    runtime: crate::mesh::Runtime,
    additions: &Additions<'_>,
) -> String {
    match runtime {
        crate::mesh::Runtime::Wasm => {
            bootstrap(sidecar, Some(filter_pin().filter_code()), additions)
        }
        crate::mesh::Runtime::Native => {
            crate::build::native_module();
            bootstrap(sidecar, None, additions)
        }
        crate::mesh::Runtime::Tls => {
            crate::build::native_module();
            bootstrap_on(sidecar, Runtime::Tls, None, additions)
        }
        crate::mesh::Runtime::TlsAndChannel => {
            crate::build::native_module();
            render_bootstrap(sidecar, Runtime::Tls, None, additions, true)
        }
    }
}

/// The bootstrap as `themis sidecar render` writes it (one renderer,
/// `themis-bootstrap`), every port but `additions.outbound` the kernel's choice; the
/// Wasm runtime with `filter_code`, the native one without.
fn bootstrap(
    sidecar: &Sidecar<'_>,
    filter_code: Option<themis_bootstrap::FilterCode>,
    additions: &Additions<'_>,
) -> String {
    let runtime = match filter_code {
        Some(_) => Runtime::Wasm,
        None => Runtime::Native,
    };
    bootstrap_on(sidecar, runtime, filter_code, additions)
}

fn bootstrap_on(
    sidecar: &Sidecar<'_>,
    runtime: Runtime,
    filter_code: Option<themis_bootstrap::FilterCode>,
    additions: &Additions<'_>,
) -> String {
    render_bootstrap(sidecar, runtime, filter_code, additions, false)
}

/// [`bootstrap_on`]; `channel_too`: the TLS binding takes the Themis channel too.
fn render_bootstrap(
    sidecar: &Sidecar<'_>,
    runtime: Runtime,
    filter_code: Option<themis_bootstrap::FilterCode>,
    additions: &Additions<'_>,
    channel_too: bool,
) -> String {
    let ip: std::net::IpAddr = sidecar.ip.parse().expect("an IP address");
    let any_port = SocketAddr::new(ip, 0);
    let rendered = themis_bootstrap::Sidecar {
        runtime,
        admin_port: 0,
        outbound: additions.outbound.unwrap_or(any_port),
        inbound: any_port,
        app: sidecar.app,
        app_protocol: sidecar.app_protocol,
        agent_socket: sidecar.agent_socket.to_owned(),
        outbound_config: sidecar.outbound_config.to_owned(),
        inbound_config: sidecar.inbound_config.to_owned(),
        filter_code,
        calls: match runtime {
            Runtime::Wasm => Vec::new(),
            Runtime::Native | Runtime::Tls => {
                additions.calls.iter().map(|c| (*c).to_owned()).collect()
            }
        },
        tcp: additions
            .tcp
            .iter()
            .map(|(s, at)| ((*s).to_owned(), *at))
            .collect(),
        access_log: None,
        channel_too,
        rbac_principals: Vec::new(),
    };
    rendered
        .render()
        .unwrap_or_else(|e| panic!("rendering the {runtime:?} sidecar: {e}"))
}

/// A base id no other Envoy on this machine uses: from this process's pid (every
/// Envoy of the tests starts here, so one counter keeps them apart).
fn base_id() -> u32 {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let n = NEXT.fetch_add(1, Ordering::SeqCst);
    std::process::id() * 64 + n % 64
}

/// One Envoy process.
pub struct Envoy {
    pub admin: SocketAddr,
    /// The listener the local app calls.
    pub outbound: SocketAddr,
    /// The listener peers call.
    pub inbound: SocketAddr,
    /// Every listener's address, by name (those a test added among them).
    pub listeners: BTreeMap<String, SocketAddr>,
    /// It runs the native module (its configuration loads it).
    native: bool,
    process: Process,
}

/// Starts Envoy on a configuration (rendered YAML), without waiting for anything.
fn spawn(dir: &Path, name: &str, yaml: &str) -> (Process, PathBuf) {
    let config = dir.join(format!("{name}.yaml"));
    std::fs::write(&config, yaml).unwrap();
    let admin_file = dir.join(format!("{name}.admin"));
    let mut command = Command::new(venv_binary("envoy"));
    command
        // Where a native sidecar's module is (see `build::native_module`).
        .env(
            "ENVOY_DYNAMIC_MODULES_SEARCH_PATH",
            crate::build::native_module_dir(),
        )
        .arg("-c")
        .arg(&config)
        .args(["--concurrency", "2", "--disable-hot-restart"])
        .args(["--base-id", &base_id().to_string()])
        .arg("--admin-address-path")
        .arg(&admin_file)
        .args([
            "-l",
            "warn",
            "--component-log-level",
            "wasm:info,dynamic_modules:info",
        ]);
    let process = Process::spawn(name, command, &dir.join(format!("{name}.log")));
    (process, admin_file)
}

impl Envoy {
    /// Starts Envoy on `sidecar`, rendered, and waits until it is ready.
    pub fn start(dir: &Path, name: &str, sidecar: &Sidecar<'_>) -> Envoy {
        Envoy::start_yaml(dir, name, &render(sidecar))
    }

    /// Starts Envoy on a rendered configuration (which the test may have extended)
    /// and waits until it is ready.
    pub fn start_yaml(dir: &Path, name: &str, yaml: &str) -> Envoy {
        let (mut process, admin_file) = spawn(dir, name, yaml);
        let admin: SocketAddr =
            process.wait_running(&format!("{name}'s admin address"), READY_LIMIT, |_| {
                std::fs::read_to_string(&admin_file)
                    .ok()
                    .and_then(|text| text.trim().parse().ok())
            });
        process.wait_running(&format!("{name} to be ready"), READY_LIMIT, |_| {
            let ready = http::exchange(
                admin,
                b"GET /ready HTTP/1.1\r\nhost: admin\r\nconnection: close\r\n\r\n",
            );
            ready.ok().filter(|r| r.status == 200)
        });
        let listeners = listeners_of(admin);
        let port_of = |listener: &str| -> SocketAddr {
            let address = *listeners
                .get(listener)
                .unwrap_or_else(|| panic!("{name} has no listener {listener}: {listeners:?}"));
            assert_ne!(address.port(), 0, "{name}: {listeners:?}");
            address
        };
        let (outbound, inbound) = (port_of("themis_outbound"), port_of("themis_inbound"));
        Envoy {
            admin,
            outbound,
            inbound,
            listeners,
            native: yaml.contains("themis_native"),
            process,
        }
    }

    /// On the TLS binding: waits until Envoy serves a certificate that carries its
    /// workload's endorsement as an instance of `service` (the agent's SDS pushes one
    /// soon after the registration; until then the callee's policy refuses it).
    pub fn wait_endorsed_certificate(&self, service: &str) {
        self.wait_certificate_names(&format!("spiffe://{}/svc/{service}", crate::agent::MESH));
    }

    /// Waits until the certificate Envoy serves names `principal` (its admin `/certs`:
    /// the agent's SDS pushed a renewed one, and Envoy loaded it).
    pub fn wait_certificate_names(&self, principal: &str) {
        let admin = self.admin;
        wait_until(
            &format!("{} to serve a certificate naming {principal}", self.name()),
            READY_LIMIT,
            || {
                let certs = http::exchange(
                    admin,
                    b"GET /certs HTTP/1.1\r\nhost: admin\r\nconnection: close\r\n\r\n",
                )
                .ok()?;
                String::from_utf8_lossy(&certs.body)
                    .contains(principal)
                    .then_some(())
            },
        );
    }

    /// Starts Envoy on a filter configuration it must refuse and waits (bounded)
    /// until its log says `refusal` or it exits; returns how it exited (`None`: it
    /// still ran, and was stopped) and its log. With the module pinned (a `remote`
    /// source) Envoy configures the plugin only after the fetch, so a refused
    /// configuration leaves Envoy running with the filter failed closed; with a
    /// local file Envoy exits.
    pub fn start_refused(
        dir: &Path,
        name: &str,
        sidecar: &Sidecar<'_>,
        refusal: &str,
        limit: Duration,
    ) -> (Option<ExitStatus>, String) {
        let (mut process, _) = spawn(dir, name, &render(sidecar));
        // Exited, or running with the refusal logged (or past `limit`): stopped.
        let status = poll_until(limit, || {
            if let Some(status) = process.exited() {
                return Some(Some(status));
            }
            process.log().contains(refusal).then_some(None)
        })
        .flatten();
        process.stop();
        (status, process.log())
    }

    /// Every counter and gauge in the admin `/stats`, by name.
    pub fn stats(&self) -> BTreeMap<String, u64> {
        stats_of(self.admin)
    }

    /// The filter's counter `themis.<name>` (`inbound.allowed`, ...) on either
    /// runtime: Envoy prefixes it `wasmcustom.` (Wasm) or `dynamicmodulescustom.`
    /// (native). 0 until first counted (the Wasm filter defines counters on use).
    pub fn themis_counter(&self, name: &str) -> u64 {
        themis_counter_in(&self.stats(), name)
    }

    /// The filter's counters under `themis.<prefix>`, by the rest of their names.
    pub fn themis_counters(&self, prefix: &str) -> Vec<(String, u64)> {
        let prefix = format!("themis.{prefix}");
        self.stats()
            .into_iter()
            .filter_map(|(n, v)| {
                let rest = n.split_once("custom.")?.1.strip_prefix(&prefix)?;
                Some((rest.to_owned(), v))
            })
            .collect()
    }

    /// One stat; panics (listing the Themis stats) if Envoy has no such stat.
    pub fn stat(&self, name: &str) -> u64 {
        let stats = self.stats();
        match stats.get(name) {
            Some(&value) => value,
            None => {
                let themis: Vec<String> = stats
                    .iter()
                    .filter(|(n, _)| n.contains("themis"))
                    .map(|(n, v)| format!("{n}: {v}"))
                    .collect();
                panic!(
                    "{} has no stat {name}; its Themis stats:\n{}",
                    self.process.name(),
                    themis.join("\n")
                )
            }
        }
    }

    /// Waits until every worker's sealing and inbound filters hold the workload's key:
    /// their `identity` gauges, one per Wasm VM (each of the two workers' and the main
    /// thread's: the identity known and the first delegation answered, so that every
    /// worker signs its first connection as it will the later ones), one per process
    /// on the native runtime (its delegated key).
    pub fn wait_identity(&self) {
        let (prefix, needed, what) = match self.native {
            true => (
                "dynamicmodulescustom",
                1,
                "native module to hold a delegated key",
            ),
            false => ("wasmcustom", 3, "filters to load the workload key"),
        };
        let what = format!("{}'s {what}", self.name());
        wait_until(&what, READY_LIMIT, || {
            let stats = self.stats();
            let held = |role: &str| {
                stats
                    .get(&format!("{prefix}.themis.{role}.identity"))
                    .copied()
            };
            (held("seal") >= Some(needed) && held("inbound") >= Some(needed)).then_some(())
        });
    }

    /// Waits until its sealing side signs with a delegation that carries the
    /// workload's endorsement: the last delegation of every VM of the sealing role
    /// (each worker's and the main thread's) on Wasm, of the module on native. They
    /// are logged when one starts and when the endorsement comes or goes; a sidecar
    /// started before its workload was registered carries one from its next.
    pub fn wait_seal_carries_endorsement(&self) {
        let what = format!("{}'s seal to carry its endorsement", self.name());
        let (marker, vms) = match self.native {
            true => ("themis native: workload", 1),
            false => ("themis-seal", 3),
        };
        wait_until(&what, READY_LIMIT, || {
            let log = std::fs::read_to_string(self.log_path()).ok()?;
            let mut last = std::collections::BTreeMap::new();
            for line in log.lines() {
                if line.contains(marker) && line.contains("with a delegated key") {
                    // Envoy's thread, in its second bracket: one VM's lines (the
                    // module's runtime thread on native).
                    let thread = line.split("][").nth(1).unwrap_or_default().to_owned();
                    last.insert(thread, line.contains("carrying its endorsement"));
                }
            }
            (last.len() >= vms && last.values().all(|&carries| carries)).then_some(())
        });
    }

    /// Waits until its native module resolves `service` to an instance at `endpoint`.
    pub fn wait_native_resolves(&self, service: &str, endpoint: SocketAddr) {
        wait_native_resolves_in(self.process.log_path(), service, endpoint);
    }

    /// True if its configuration loads the native module.
    pub fn is_native(&self) -> bool {
        self.native
    }

    /// The file Envoy logs to.
    pub fn log_path(&self) -> &Path {
        self.process.log_path()
    }

    /// The name it was started with (its files' and failure messages').
    pub fn name(&self) -> &str {
        self.process.name()
    }

    pub fn pid(&self) -> u32 {
        self.process.pid()
    }

    /// SIGTERM, a bounded wait, then SIGKILL (also done when it drops).
    pub fn stop(&mut self) -> Option<ExitStatus> {
        self.process.stop()
    }

    /// The last lines of its log.
    pub fn log_tail(&self, n: usize) -> String {
        self.process.log_tail(n)
    }

    /// Waits until its log holds `text` (an access log line: Envoy writes those out
    /// every `--file-flush-interval-msec`, 10 s by default); its whole log.
    pub fn wait_log(&self, text: &str) -> String {
        wait_until_or(
            &format!("{} to log {text:?}", self.name()),
            Duration::from_secs(20),
            || {
                let log = self.log_tail(usize::MAX);
                log.contains(text).then_some(log)
            },
            || self.log_tail(40),
        )
    }
}

/// `GET path` on an admin listener; panics unless it answers 200.
pub fn admin_get(admin: SocketAddr, path: &str) -> http::Response {
    let r = http::request(admin, "GET", path, &[("host", "admin")], b"");
    assert_eq!(r.status, 200, "admin {path}: {r}");
    r
}

/// Every counter and gauge in an admin `/stats`, by name.
pub fn stats_of(admin: SocketAddr) -> BTreeMap<String, u64> {
    admin_get(admin, "/stats")
        .text()
        .lines()
        .filter_map(|line| {
            let (name, value) = line.split_once(": ")?;
            Some((name.to_owned(), value.trim().parse().ok()?))
        })
        .collect()
}

/// Every listener's socket address, by name, from the admin API (the ports the
/// kernel chose); internal listeners, which have none, are left out.
fn listeners_of(admin: SocketAddr) -> BTreeMap<String, SocketAddr> {
    let listeners = admin_get(admin, "/listeners?format=json").json();
    let all = listeners["listener_statuses"].as_array();
    all.into_iter()
        .flatten()
        .filter_map(|entry| {
            let socket = &entry["local_address"]["socket_address"];
            let ip: std::net::IpAddr = socket["address"].as_str()?.parse().ok()?;
            let port = u16::try_from(socket["port_value"].as_u64()?).ok()?;
            let name = entry["name"].as_str()?.to_owned();
            Some((name, SocketAddr::new(ip, port)))
        })
        .collect()
}

/// [`Envoy::themis_counter`] in a stats map.
pub fn themis_counter_in(stats: &BTreeMap<String, u64>, name: &str) -> u64 {
    ["wasmcustom", "dynamicmodulescustom"]
        .iter()
        .filter_map(|prefix| stats.get(&format!("{prefix}.themis.{name}")))
        .sum()
}

/// Waits until the native module logging to `log` resolves `service` to an instance
/// at `endpoint` (its latest resolution of `service` lists it).
pub fn wait_native_resolves_in(log: &Path, service: &str, endpoint: SocketAddr) {
    let what = format!(
        "the native module of {} to resolve {service} at {endpoint}",
        log.display()
    );
    let said = format!("themis native: {service} resolves to");
    let at = format!(" at {endpoint}");
    wait_until(&what, READY_LIMIT, || {
        std::fs::read_to_string(log)
            .ok()?
            .lines()
            .rfind(|l| l.contains(&said))
            .filter(|l| l.contains(&at))
            .map(|_| ())
    });
}
