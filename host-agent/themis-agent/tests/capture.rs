//! eBPF capture through the agent, on the real kernel: registration with a cgroup
//! attaches, the agent is SIGKILLed and capture holds, a restarted agent adopts the
//! pins, deregistration detaches; a real Envoy gets the original destination from
//! SO_ORIGINAL_DST and its own upstream connections are not looped; app ports accept
//! only the local proxy, not the network. Needs root and a kernel with BTF (skipped
//! without them; scripts/test.sh runs them).

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use serde_json::Value;
use themis_testkit::agent::{self as common, Agent, Spawn, FAST};
use themis_testkit::build::venv_binary;
use themis_testkit::netns::Net;
use themis_testkit::pods::{client, Pod, DIRECT, PROXY};
use themis_testkit::ports::free_port;
use themis_testkit::process::wait_until;
use themis_testkit::require;

/// The gates of every test here: eBPF programs on the real kernel, attached to
/// cgroups the test creates.
fn kernel(why: &str) -> bool {
    require::root(why) && require::kernel_btf(why)
}

fn capture_agent(root: &Path, name: &str, pins: &Path) -> Agent {
    let mut extra: Vec<&str> = FAST.to_vec();
    let pins = pins.to_str().unwrap();
    extra.extend(["--capture", "--bpf-pin-dir", pins]);
    // Leaked: the Spawn options borrow for the agent's start only.
    let extra: &'static [&'static str] = Box::leak(
        extra
            .into_iter()
            .map(|s| &*Box::leak(s.to_owned().into_boxed_str()))
            .collect::<Vec<_>>()
            .into_boxed_slice(),
    );
    Agent::spawn(
        root,
        name,
        Spawn {
            extra,
            ..Spawn::default()
        },
    )
}

/// `themis register <name> --workload <name> --endpoint 127.0.0.1:15006 --cgroup <cgroup>`
/// plus `flags`; returns (exit code, stdout, stderr).
fn register(agent: &Agent, name: &str, cgroup: &Path, flags: &[&str]) -> (i32, String, String) {
    agent.grant(name);
    let mut args = vec![
        "register",
        name,
        "--workload",
        name,
        "--endpoint",
        "127.0.0.1:15006",
    ];
    args.extend(["--cgroup", cgroup.to_str().unwrap()]);
    args.extend(flags);
    agent.cli(&args)
}

fn capture_status(agent: &Agent) -> Value {
    let (status, answer) = agent.get("/v1/capture").expect("agent answers");
    assert_eq!(status, 200, "{answer}");
    answer
}

/// The cgroup's attached programs, as bpftool sees them (independent of our loader).
fn bpftool_attached(cgroup: &Path) -> String {
    let out = Command::new("bpftool")
        .args(["cgroup", "show"])
        .arg(cgroup)
        .output()
        .expect("bpftool");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn capture_survives_an_agent_crash_and_is_adopted_then_detached() {
    if !(kernel("attaches capture to a cgroup")
        && require::tool("bpftool", "reads what is attached"))
    {
        return;
    }
    let work = common::workdir();
    let mut pod = Pod::new("agent");
    let proxy_port: u16 = pod.run("pod/proxy", PROXY).parse().unwrap();
    let direct = pod.run("outside", DIRECT);
    let mut agent = capture_agent(work.path(), "node", &pod.pins);

    let cgroup = pod.cgroup("pod");
    let proxy = pod.cgroup("pod/proxy");
    let outbound = format!("127.0.0.1:{proxy_port}");
    let (code, out, err) = register(
        &agent,
        "check",
        &cgroup,
        &[
            "--proxy-cgroup",
            proxy.to_str().unwrap(),
            "--outbound",
            &outbound,
            // The test's service addresses are on loopback, excluded by default.
            "--exclude-cidr",
            "192.0.2.0/24",
        ],
    );
    assert_eq!(code, 0, "{out}{err}\n{}", agent.log_tail());
    assert!(
        out.contains("capture attached to") && out.contains("(5 programs)"),
        "{out}"
    );
    let before = capture_status(&agent);
    let links: Vec<Value> = before["workloads"][0]["attachments"]
        .as_array()
        .unwrap()
        .clone();
    assert_eq!(links.len(), 5, "{before}");
    for program in [
        "connect4",
        "connect6",
        "sock_ops",
        "original_dst",
        "inbound",
    ] {
        assert!(
            bpftool_attached(&cgroup).contains(program),
            "{program} not attached"
        );
    }
    assert_eq!(
        pod.run("pod/app", &client(&direct)),
        format!("proxied {direct}")
    );
    // The proxy's outbound listener is the pod's alone.
    assert_eq!(pod.run("outside", &client(&outbound)), "failed EPERM");

    // The agent dies without a word: capture is in the kernel, pinned, and holds.
    agent.kill();
    assert_eq!(
        pod.run("pod/app", &client(&direct)),
        format!("proxied {direct}")
    );
    assert_eq!(pod.run("outside", &client(&outbound)), "failed EPERM");

    // A new agent finds the pins and adopts them: the very same links.
    let agent = capture_agent(work.path(), "node", &pod.pins);
    let after = capture_status(&agent);
    assert_eq!(
        after["workloads"][0]["attachments"],
        Value::Array(links),
        "{after}"
    );
    assert_eq!(after["workloads"][0]["cgroup"], cgroup.to_str().unwrap());
    assert!(
        agent.log().contains("adopted pinned capture"),
        "{}",
        agent.log_tail()
    );
    let (code, out, _) = agent.cli(&["capture"]);
    assert_eq!(code, 0);
    assert!(
        out.contains("check: cgroup") && out.contains("original_dst (link"),
        "{out}"
    );
    assert!(
        out.contains("outbound listeners guarded at the top cgroup: listener_guard4 (link"),
        "{out}"
    );
    assert_eq!(
        pod.run("pod/app", &client(&direct)),
        format!("proxied {direct}")
    );

    // Deregistration detaches: the app reaches the server itself again.
    let (code, out, err) = agent.cli(&["deregister", "check", "--workload", "check"]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("capture detached"), "{out}");
    assert_eq!(pod.run("pod/app", &client(&direct)), "direct");
    assert_eq!(
        bpftool_attached(&cgroup).lines().count(),
        0,
        "{}",
        bpftool_attached(&cgroup)
    );
    let status = capture_status(&agent);
    assert!(status["workloads"].as_array().unwrap().is_empty());
    assert!(status["listener_guard"].as_array().unwrap().is_empty());
    assert!(pod
        .run("outside", &client(&outbound))
        .starts_with("proxied"));
    let leftover: Vec<_> = std::fs::read_dir(pod.pins.join("workloads"))
        .unwrap()
        .collect();
    assert!(leftover.is_empty(), "pins left: {leftover:?}");
}

#[test]
fn capture_errors_are_clear() {
    if !kernel("creates a cgroup and a bpffs pin directory") {
        return;
    }
    let work = common::workdir();
    // Without --capture, a registration asking for it is refused, not half done.
    let plain = Agent::spawn(work.path(), "plain", Spawn::default());
    let (code, _, err) = register(&plain, "check", Path::new("/sys/fs/cgroup/unified"), &[]);
    assert_ne!(code, 0);
    assert!(err.contains("start it with --capture"), "{err}");
    assert!(plain.get("/v1/workloads").unwrap().1["registrations"]
        .as_array()
        .unwrap()
        .is_empty());

    // A pin directory off bpffs: the agent refuses to start and says why.
    common::admit(work.path(), &work.path().join("nobpf"));
    let out = Command::new(common::themis_binary())
        .args([
            "agent",
            "--mesh",
            "test",
            "--listen",
            "127.0.0.1:0",
            "--metrics",
            "off",
        ])
        .arg("--state-dir")
        .arg(work.path().join("nobpf"))
        .args(["--capture", "--bpf-pin-dir"])
        .arg(work.path().join("pins"))
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        err.contains("is not on a bpffs") && err.contains("mount -t bpf"),
        "{err}"
    );

    // A directory that is not a cgroup: named, with where cgroup v2 is.
    let pod = Pod::new("agent-errors");
    let agent = capture_agent(work.path(), "node", &pod.pins);
    let (code, _, err) = register(&agent, "check", work.path(), &[]);
    assert_ne!(code, 0);
    assert!(err.contains("is not a cgroup v2 directory"), "{err}");
}

/// A plain Envoy: an outbound listener with the stock `original_dst` listener filter
/// and an HTTP route to the ORIGINAL_DST cluster, logging the original destination.
fn envoy_config(admin: u16, outbound: u16, access_log: &Path) -> String {
    format!(
        r#"
admin: {{address: {{socket_address: {{address: 127.0.0.1, port_value: {admin}}}}}}}
static_resources:
  listeners:
  - name: outbound
    address: {{socket_address: {{address: 127.0.0.1, port_value: {outbound}}}}}
    listener_filters:
    - name: envoy.filters.listener.original_dst
      typed_config: {{"@type": type.googleapis.com/envoy.extensions.filters.listener.original_dst.v3.OriginalDst}}
    filter_chains:
    - filters:
      - name: envoy.filters.network.http_connection_manager
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
          stat_prefix: outbound
          access_log:
          - name: envoy.access_loggers.file
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.access_loggers.file.v3.FileAccessLog
              path: {log}
              log_format: {{text_format_source: {{inline_string: "original=%DOWNSTREAM_LOCAL_ADDRESS% upstream=%UPSTREAM_HOST% code=%RESPONSE_CODE%\n"}}}}
          route_config:
            virtual_hosts:
            - name: all
              domains: ["*"]
              routes: [{{match: {{prefix: "/"}}, route: {{cluster: original}}}}]
          http_filters:
          - name: envoy.filters.http.router
            typed_config: {{"@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router}}
  clusters:
  - name: original
    connect_timeout: 1s
    type: ORIGINAL_DST
    lb_policy: CLUSTER_PROVIDED
"#,
        log = access_log.display()
    )
}

/// An HTTP server at 127.0.0.77: prints its address, answers with the headers it got.
const UPSTREAM: &str = r#"
import http.server, json
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = json.dumps({"path": self.path, "via_envoy": "x-envoy-expected-rq-timeout-ms" in self.headers}).encode()
        self.send_response(200); self.send_header("content-length", str(len(body))); self.end_headers(); self.wfile.write(body)
    def log_message(self, *a): pass
s = http.server.ThreadingHTTPServer(("127.0.0.77", 0), H)
print("127.0.0.77:%d" % s.server_address[1], flush=True)
s.serve_forever()
"#;

fn http_get(url: &str) -> String {
    format!(
        r#"
import urllib.request
try:
    print(urllib.request.urlopen("{url}", timeout=5).read().decode(), flush=True)
except Exception as e:
    print("failed", e, flush=True)
"#
    )
}

#[test]
fn envoy_sees_the_original_destination_and_its_upstreams_are_not_looped() {
    if !(kernel("attaches capture to Envoy's pod") && require::envoy("the sidecar")) {
        return;
    }
    let work = common::workdir();
    let mut pod = Pod::new("envoy");
    let upstream = pod.run("outside", UPSTREAM);
    let (admin, outbound) = (free_port(), free_port());
    let config = work.path().join("envoy.yaml");
    let access_log = work.path().join("access.log");
    std::fs::write(&config, envoy_config(admin, outbound, &access_log)).unwrap();
    let base_id = (std::process::id() % 1000 + 3000).to_string();
    let config_arg = config.to_str().unwrap().to_owned();
    // Envoy runs inside the pod's cgroup subtree, as a sidecar does.
    pod.spawn(
        "pod/proxy",
        venv_binary("envoy").to_str().unwrap(),
        &[
            "-c",
            &config_arg,
            "--concurrency",
            "1",
            "--disable-hot-restart",
            "--base-id",
            &base_id,
            "-l",
            "warn",
        ],
        &work.path().join("envoy.log"),
    );
    let stats = |name: &str| -> Option<u64> {
        let out = Command::new("curl")
            .args([
                "-sf",
                &format!("http://127.0.0.1:{admin}/stats?filter={name}"),
            ])
            .output()
            .ok()?;
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        text.lines()
            .find_map(|l| l.strip_prefix(&format!("{name}: "))?.trim().parse().ok())
    };
    let ready = themis_testkit::process::poll_until(Duration::from_secs(10), || {
        stats("http.outbound.downstream_rq_total")
    });
    assert!(
        ready.is_some(),
        "Envoy did not start: {}",
        std::fs::read_to_string(work.path().join("envoy.log")).unwrap_or_default()
    );

    let agent = capture_agent(work.path(), "node", &pod.pins);
    let cgroup = pod.cgroup("pod");
    let proxy = pod.cgroup("pod/proxy");
    let outbound_addr = format!("127.0.0.1:{outbound}");
    let (code, out, err) = register(
        &agent,
        "web",
        &cgroup,
        &[
            "--proxy-cgroup",
            proxy.to_str().unwrap(),
            "--outbound",
            &outbound_addr,
            "--exclude-cidr",
            "192.0.2.0/24",
        ],
    );
    assert_eq!(code, 0, "{out}{err}");

    // The app calls the service's own address; Envoy gets it, knows where it was
    // meant to go, and goes there itself (not back into its own listener).
    let answer = pod.run("pod/app", &http_get(&format!("http://{upstream}/hello")));
    let answer: Value = serde_json::from_str(&answer).unwrap_or_else(|_| panic!("{answer}"));
    assert_eq!(answer["path"], "/hello");
    assert_eq!(
        answer["via_envoy"], true,
        "the request did not go through Envoy"
    );
    // Envoy logs when the stream ends, maybe after the app has its answer, and
    // flushes the file on its own timer.
    let logged = format!("original={upstream} upstream={upstream} code=200");
    wait_until(
        &format!("{logged:?} in Envoy's access log"),
        Duration::from_secs(15),
        || {
            let log = std::fs::read_to_string(&access_log).unwrap_or_default();
            log.contains(&logged).then_some(())
        },
    );
    // Exactly one downstream connection per app request: a loop would add more.
    assert_eq!(stats("http.outbound.downstream_rq_total"), Some(1));
    let counters = &capture_status(&agent)["counters"];
    assert_eq!(counters["captured"], 1, "{counters}");
    assert_eq!(counters["original_dst_answered"], 1, "{counters}");
    assert!(
        counters["proxy_exempt"].as_u64().unwrap() >= 1,
        "{counters}"
    );

    // Outside the pod, the same URL is reached directly.
    let answer = pod.run("outside", &http_get(&format!("http://{upstream}/hello")));
    assert!(answer.contains("\"via_envoy\": false"), "{answer}");
    assert_eq!(stats("http.outbound.downstream_rq_total"), Some(1));
}

#[test]
fn app_ports_accept_only_the_local_proxy_not_the_network() {
    if !kernel("creates network namespaces and attaches capture") {
        return;
    }
    let work = common::workdir();
    let ns = Net::create("inbound");
    let app_addr = format!("{}:8080", Net::NODE4);
    let mut pod = Pod::new("inbound");
    // The app listens on every address of its node, port 8080.
    let app = r#"
import socket, sys
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("0.0.0.0", 8080)); s.listen(16)
print("listening", flush=True)
while True:
    c, peer = s.accept(); c.recv(100); c.sendall(b"app"); c.close()
"#;
    assert_eq!(pod.run_in(Some(&ns.node), "pod/app", app), "listening");
    // Before capture, the network reaches the app directly.
    assert_eq!(
        pod.run_in(Some(&ns.peer), "outside", &client(&app_addr)),
        "app"
    );

    let agent = capture_agent(work.path(), "node", &pod.pins);
    let (code, out, err) = register(
        &agent,
        "app",
        &pod.cgroup("pod"),
        &["--inbound-port", "8080"],
    );
    assert_eq!(code, 0, "{out}{err}");

    // From the network: dropped (the SYN never reaches the app).
    let answer = pod.run_in(Some(&ns.peer), "outside", &client(&app_addr));
    assert!(answer.starts_with("failed"), "{answer}");
    // From the node's loopback, where the local proxy forwards from: accepted.
    assert_eq!(
        pod.run_in(Some(&ns.node), "outside", &client("127.0.0.1:8080")),
        "app"
    );
    assert!(
        capture_status(&agent)["counters"]["inbound_dropped"]
            .as_u64()
            .unwrap()
            >= 1
    );

    // Detached, the port is open to the network again.
    let (code, _, _) = agent.cli(&["deregister", "app", "--workload", "app"]);
    assert_eq!(code, 0);
    assert_eq!(
        pod.run_in(Some(&ns.peer), "outside", &client(&app_addr)),
        "app"
    );
}
