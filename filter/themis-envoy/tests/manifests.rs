//! The Istio manifests under `deploy/istio/` rebuild the data path of the sidecar
//! bootstrap `deploy/envoy/sidecar.yaml` (which every other test runs) inside Istio's
//! generated configuration. Checked here: every plugin configuration parses and has the
//! role of where it is patched in, every piece patched in is the bootstrap's own (Wasm
//! settings, the sealing listener, the clusters, set_filter_state, the routes, the
//! inbound header handling), the WasmPlugins agree with the EnvoyFilter, and the real
//! Envoy loads the manifests' configurations.
//!
//! `envoyfilter-native.yaml` does the same for the native runtime's bootstrap,
//! `deploy/envoy/sidecar-native.yaml`: every configuration parses with the filter's
//! parser and has the role its place calls for, the module's pieces, routes, clusters
//! (as `themis sidecar render --runtime native` renders them) and the inbound header
//! handling are the bootstrap's, the route reads the module's own filter-state keys,
//! the ProxyConfig and the mounts the header asks for find the module, and the real
//! Envoy 1.40 loads every patch, with the module.

use themis_testkit as support;

use serde::Deserialize;
use serde_yaml::Value;
use std::time::Duration;

use support::build::{filter_wasm, workspace};
use support::envoy::{render_native, AppProtocol, Envoy, Sidecar};
use support::process::wait_until;
use support::{http, require};
use themis_sidecar::config::{Config, Role};

const WASM: &str = "type.googleapis.com/envoy.extensions.filters.http.wasm.v3.Wasm";
const NETWORK_WASM: &str = "type.googleapis.com/envoy.extensions.filters.network.wasm.v3.Wasm";

fn documents(path: &str) -> Vec<Value> {
    let text = std::fs::read_to_string(workspace().join(path)).unwrap();
    // The sidecar template's placeholders are not YAML yet: a line that is only a
    // placeholder goes, any other takes a value that will do here.
    let mut text: String = text
        .lines()
        .filter(|line| {
            let t = line.trim();
            !(t.starts_with("${") && t.ends_with('}') && t.matches("${").count() == 1)
        })
        .map(|line| format!("{line}\n"))
        .collect();
    while let Some(start) = text.find("${") {
        let end = start + text[start..].find('}').unwrap();
        text.replace_range(start..=end, "0");
    }
    serde_yaml::Deserializer::from_str(&text)
        .map(|doc| Value::deserialize(doc).unwrap())
        .collect()
}

fn seq(v: &Value) -> &Vec<Value> {
    v.as_sequence()
        .unwrap_or_else(|| panic!("not a sequence: {v:?}"))
}

fn str_of(v: &Value) -> &str {
    v.as_str().unwrap_or_else(|| panic!("not a string: {v:?}"))
}

/// One configPatch of an EnvoyFilter of deploy/istio/.
#[derive(Clone, Debug)]
struct Patch {
    /// The EnvoyFilter's name and priority.
    envoyfilter: String,
    priority: i64,
    apply_to: String,
    context: String,
    operation: String,
    matching: Value,
    value: Value,
}

impl Patch {
    /// Where it applies and how: (`applyTo`, context, operation).
    fn placement(&self) -> (&str, &str, &str) {
        (&self.apply_to, &self.context, &self.operation)
    }
}

/// The inbound header handling of an EnvoyFilter, as the bootstrap's inbound HCM
/// (`inbound_hcm`) has it: caller-supplied x-themis-* headers dropped first (the
/// `themis.strip` filter), and headers with underscores dropped (x_themis_peer_id is
/// not x-themis-*).
fn assert_inbound_strips_headers(patches: &[Patch], inbound_hcm: &Value) {
    let strip = the_patch(patches, "themis.strip", |p| {
        p.value["name"] == "themis.strip"
    });
    assert_eq!(
        strip.placement(),
        ("HTTP_FILTER", "SIDECAR_INBOUND", "INSERT_FIRST")
    );
    assert_eq!(strip.value, http_filter(inbound_hcm, "themis.strip"));
    let underscores = the_patch(patches, "headers_with_underscores_action", |p| {
        p.apply_to == "NETWORK_FILTER" && p.operation == "MERGE"
    });
    assert_eq!(underscores.context, "SIDECAR_INBOUND");
    let options = "common_http_protocol_options";
    assert_eq!(
        underscores.value["typed_config"][options],
        inbound_hcm[options]
    );
}

fn envoyfilter_docs() -> Vec<Value> {
    documents("deploy/istio/envoyfilter.yaml")
}

fn envoyfilter_patches() -> Vec<Patch> {
    patches_in(&envoyfilter_docs())
}

/// The configPatches of the EnvoyFilters among `docs`, each EnvoyFilter's in its order.
fn patches_in(docs: &[Value]) -> Vec<Patch> {
    let mut patches = Vec::new();
    for doc in docs.iter().filter(|d| d["kind"] == "EnvoyFilter") {
        assert_eq!(doc["apiVersion"], "networking.istio.io/v1alpha3");
        let spec = &doc["spec"];
        assert_eq!(
            spec["workloadSelector"]["labels"]["app"], "check",
            "every EnvoyFilter selects the workload its configurations name"
        );
        for p in seq(&spec["configPatches"]) {
            patches.push(Patch {
                envoyfilter: str_of(&doc["metadata"]["name"]).to_string(),
                priority: spec["priority"].as_i64().unwrap_or(0),
                apply_to: str_of(&p["applyTo"]).to_string(),
                context: str_of(&p["match"]["context"]).to_string(),
                operation: str_of(&p["patch"]["operation"]).to_string(),
                matching: p["match"].clone(),
                value: p["patch"]["value"].clone(),
            });
        }
    }
    patches
}

/// The one patch `pred` picks.
fn the_patch(patches: &[Patch], what: &str, pred: impl Fn(&Patch) -> bool) -> Patch {
    let found: Vec<&Patch> = patches.iter().filter(|p| pred(p)).collect();
    assert_eq!(
        found.len(),
        1,
        "expected one {what} patch, found {found:#?}"
    );
    found[0].clone()
}

/// A Wasm filter (`{name, typed_config}`) of the manifests, with the role its place calls for.
struct WasmFilter {
    place: String,
    role: Role,
    filter: Value,
}

/// Every Wasm filter the EnvoyFilters put anywhere, by where it goes.
fn wasm_filters(patches: &[Patch]) -> Vec<WasmFilter> {
    let mut found = Vec::new();
    for p in patches {
        let mut filters: Vec<Value> = Vec::new();
        let wasm = |ty: &Value| *ty == WASM || *ty == NETWORK_WASM;
        collect_typed(&p.value, &wasm, &mut filters);
        for filter in filters {
            let place = format!(
                "{} {} {} ({})",
                p.apply_to, p.context, p.operation, p.envoyfilter
            );
            let role = match (p.apply_to.as_str(), p.context.as_str()) {
                ("HTTP_FILTER", "SIDECAR_OUTBOUND") => Role::Outbound,
                ("LISTENER", _) if p.value.get("internal_listener").is_some() => Role::Seal,
                ("NETWORK_FILTER", "SIDECAR_INBOUND") => Role::Inbound,
                _ => panic!("a Wasm filter where none belongs: {place}"),
            };
            found.push(WasmFilter {
                place,
                role,
                filter,
            });
        }
    }
    found
}

/// Every named extension under `v` whose `typed_config` type `wanted` takes, depth
/// first.
fn collect_typed(v: &Value, wanted: &dyn Fn(&Value) -> bool, out: &mut Vec<Value>) {
    match v {
        Value::Mapping(m) => {
            if m.contains_key("name") && wanted(&v["typed_config"]["@type"]) {
                out.push(v.clone());
            }
            for (_, child) in m {
                collect_typed(child, wanted, out);
            }
        }
        Value::Sequence(s) => s.iter().for_each(|c| collect_typed(c, wanted, out)),
        _ => {}
    }
}

fn plugin_json(filter: &Value) -> String {
    let config = &filter["typed_config"]["config"]["configuration"];
    assert_eq!(
        config["@type"],
        "type.googleapis.com/google.protobuf.StringValue"
    );
    str_of(&config["value"]).to_string()
}

fn module_path(filter: &Value) -> String {
    str_of(&filter["typed_config"]["config"]["vm_config"]["code"]["local"]["filename"]).to_string()
}

/// Everything of a Wasm filter but the module path and the plugin JSON.
fn shape(filter: &Value) -> Value {
    let mut v = filter.clone();
    v["typed_config"]["config"]["vm_config"]["code"] = Value::Null;
    v["typed_config"]["config"]["configuration"]["value"] = Value::Null;
    v
}

fn json(text: &str) -> serde_json::Value {
    serde_json::from_str(text).unwrap_or_else(|e| panic!("{text}: {e}"))
}

/// The bootstrap the other tests run.
fn sidecar() -> Value {
    documents("deploy/envoy/sidecar.yaml").remove(0)
}

fn sidecar_listener(sidecar: &Value, name: &str) -> Value {
    seq(&sidecar["static_resources"]["listeners"])
        .iter()
        .find(|l| l["name"] == name)
        .unwrap_or_else(|| panic!("the bootstrap has no listener {name}"))
        .clone()
}

fn sidecar_cluster(sidecar: &Value, name: &str) -> Value {
    seq(&sidecar["static_resources"]["clusters"])
        .iter()
        .find(|c| c["name"] == name)
        .unwrap_or_else(|| panic!("the bootstrap has no cluster {name}"))
        .clone()
}

/// A network filter of a sidecar listener's (first) filter chain, by name.
fn network_filter(listener: &Value, name: &str) -> Value {
    seq(&listener["filter_chains"][0]["filters"])
        .iter()
        .find(|f| f["name"] == name)
        .unwrap_or_else(|| panic!("no network filter {name} in {listener:?}"))
        .clone()
}

/// The HTTP connection manager of a sidecar listener.
fn hcm(listener: &Value) -> Value {
    network_filter(listener, "envoy.filters.network.http_connection_manager")["typed_config"]
        .clone()
}

fn http_filter(hcm: &Value, name: &str) -> Value {
    seq(&hcm["http_filters"])
        .iter()
        .find(|f| f["name"] == name)
        .unwrap_or_else(|| panic!("no HTTP filter {name}"))
        .clone()
}

/// Where deploy/envoy/sidecar.yaml has the filter of `role`.
fn sidecar_wasm_filter(sidecar: &Value, role: Role) -> Value {
    match role {
        Role::Outbound => http_filter(
            &hcm(&sidecar_listener(sidecar, "themis_outbound")),
            "themis.outbound",
        ),
        Role::Seal => network_filter(&sidecar_listener(sidecar, "themis_seal"), "themis.seal"),
        Role::Inbound => network_filter(
            &sidecar_listener(sidecar, "themis_inbound"),
            "themis.inbound",
        ),
    }
}

/// The sealing role's configuration for a sidecar whose outbound role has `outbound`:
/// the convention of the sidecar harness (themis-testkit's `envoy`), which the Envoy test
/// below relies on to load the manifests' seal configuration.
fn seal_of(outbound: &serde_json::Value) -> serde_json::Value {
    let mut seal = outbound.clone();
    let map = seal.as_object_mut().unwrap();
    map.insert("role".into(), "seal".into());
    map.remove("canary");
    seal
}

/// The plugin JSON of each role in the EnvoyFilters.
fn role_configs(patches: &[Patch]) -> [(Role, String); 3] {
    let filters = wasm_filters(patches);
    [Role::Outbound, Role::Seal, Role::Inbound].map(|role| {
        let of_role: Vec<&WasmFilter> = filters.iter().filter(|f| f.role == role).collect();
        assert_eq!(of_role.len(), 1, "one {role:?} filter in the EnvoyFilters");
        (role, plugin_json(&of_role[0].filter))
    })
}

#[test]
fn envoyfilter_plugin_configurations_match_where_they_are_patched() {
    let patches = envoyfilter_patches();
    let sidecar = sidecar();
    let filters = wasm_filters(&patches);
    assert_eq!(filters.len(), 3, "outbound, seal and inbound, once each");
    let module = module_path(&filters[0].filter);
    assert!(module.starts_with('/'), "{module}");
    for WasmFilter {
        place,
        role,
        filter,
    } in &filters
    {
        let config = Config::parse(plugin_json(filter).as_bytes())
            .unwrap_or_else(|e| panic!("{place}: {e}"));
        assert_eq!(config.role, *role, "{place}");
        assert_eq!(config.workload, "check", "{place}");
        assert_eq!(
            module_path(filter),
            module,
            "{place}: one module for every role"
        );
        // Runtime, fail closed, VM id, root id, filter names: the bootstrap's.
        let twin = sidecar_wasm_filter(&sidecar, *role);
        assert_eq!(
            shape(filter),
            shape(&twin),
            "{place}: the Wasm settings differ from deploy/envoy/sidecar.yaml"
        );
        assert_eq!(
            filter["typed_config"]["config"]["fail_open"], false,
            "{place}"
        );
        // The agent the filter calls is a cluster the EnvoyFilter adds.
        the_patch(&patches, &config.agent_cluster, |p| {
            p.apply_to == "CLUSTER" && p.value["name"] == config.agent_cluster.as_str()
        });
    }

    // The roles of one sidecar: one workload, one mesh root, the seal configured like
    // the outbound role (what the harness derives).
    let [(_, outbound), (_, seal), (_, inbound)] = role_configs(&patches);
    let (outbound, seal, inbound) = (json(&outbound), json(&seal), json(&inbound));
    assert_eq!(
        seal,
        seal_of(&outbound),
        "the seal configuration is the outbound one's"
    );
    for key in ["mesh_root", "workload", "service"] {
        assert_eq!(outbound[key], inbound[key], "{key}");
    }

    // Where they go: the outbound filter before the router of the outbound HCM, the
    // inbound one first on the plaintext chains, ahead of the HCM.
    let out = the_patch(&patches, "themis.outbound", |p| {
        p.value["name"] == "themis.outbound"
    });
    assert_eq!(out.operation, "INSERT_BEFORE");
    let chain = &out.matching["listener"]["filterChain"]["filter"];
    assert_eq!(
        chain["name"],
        "envoy.filters.network.http_connection_manager"
    );
    assert_eq!(chain["subFilter"]["name"], "envoy.filters.http.router");
    let inb = the_patch(&patches, "themis.inbound", |p| {
        p.value["name"] == "themis.inbound"
    });
    assert_eq!(inb.operation, "INSERT_FIRST");
    assert_eq!(
        inb.matching["listener"]["filterChain"]["transportProtocol"],
        "raw_buffer"
    );
}

/// The port a listener, filter or route patch applies to.
fn themis_port(p: &Patch) -> i64 {
    let m = &p.matching;
    m["listener"]["portNumber"]
        .as_i64()
        .or(m["routeConfiguration"]["portNumber"].as_i64())
        .unwrap_or_else(|| panic!("{p:#?} names no port"))
}

/// The PeerAuthentication among `docs` turns Istio's mTLS off on `port` of app=check:
/// the sealed stream arrives on the plaintext chain.
fn assert_mtls_off(docs: &[Value], port: i64) {
    let auth = docs
        .iter()
        .find(|d| d["kind"] == "PeerAuthentication")
        .expect("a PeerAuthentication for the Themis port");
    assert_eq!(auth["spec"]["selector"]["matchLabels"]["app"], "check");
    let modes = auth["spec"]["portLevelMtls"].as_mapping().unwrap();
    let mode = modes
        .iter()
        .find(|(k, _)| k.as_i64() == Some(port))
        .map(|(_, v)| v["mode"].clone());
    assert_eq!(mode, Some(Value::from("DISABLE")), "mTLS on port {port}");
}

#[test]
fn envoyfilter_rebuilds_the_sidecar_data_path() {
    let patches = envoyfilter_patches();
    let sidecar = sidecar();

    // The sealing internal listener: the bootstrap's, but for the module path and the
    // plugin JSON (checked above).
    let listener = the_patch(&patches, "LISTENER", |p| p.apply_to == "LISTENER");
    assert_eq!(listener.operation, "ADD");
    let strip_wasm = |l: &Value| {
        let mut l = l.clone();
        let filters = l["filter_chains"][0]["filters"].as_sequence_mut().unwrap();
        for f in filters.iter_mut() {
            if f["name"] == "themis.seal" {
                *f = shape(f);
            }
        }
        l
    };
    assert_eq!(
        strip_wasm(&listener.value),
        strip_wasm(&sidecar_listener(&sidecar, "themis_seal")),
        "the internal listener differs from deploy/envoy/sidecar.yaml's"
    );

    // The clusters: the bootstrap's, the agent's socket at its path in the pod.
    for name in ["themis_seal", "themis_peers", "themis_agent"] {
        let cluster = the_patch(&patches, name, |p| {
            p.apply_to == "CLUSTER" && p.value["name"] == name
        });
        assert_eq!(cluster.operation, "ADD", "{name}");
        let mut mine = cluster.value.clone();
        let mut twin = sidecar_cluster(&sidecar, name);
        if name == "themis_agent" {
            let pipe = |c: &mut Value| -> Value {
                let path = &mut c["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"]
                    ["address"]["pipe"]["path"];
                std::mem::replace(path, Value::Null)
            };
            assert_eq!(pipe(&mut mine), "/var/run/themis/agent.sock");
            pipe(&mut twin);
        }
        assert_eq!(
            mine, twin,
            "cluster {name} differs from deploy/envoy/sidecar.yaml's"
        );
    }

    // Outbound: set_filter_state before the router, after themis.outbound (the
    // EnvoyFilter with themis.outbound is applied first: both insert before the router).
    let outbound_hcm = hcm(&sidecar_listener(&sidecar, "themis_outbound"));
    let sfs = the_patch(&patches, "set_filter_state", |p| {
        p.value["name"] == "envoy.filters.http.set_filter_state"
    });
    assert_eq!(
        (sfs.apply_to.as_str(), sfs.context.as_str()),
        ("HTTP_FILTER", "SIDECAR_OUTBOUND")
    );
    assert_eq!(sfs.operation, "INSERT_BEFORE");
    assert_eq!(
        sfs.matching["listener"]["filterChain"]["filter"]["subFilter"]["name"],
        "envoy.filters.http.router"
    );
    assert_eq!(
        sfs.value,
        http_filter(&outbound_hcm, "envoy.filters.http.set_filter_state")
    );
    let out = the_patch(&patches, "themis.outbound", |p| {
        p.value["name"] == "themis.outbound"
    });
    assert!(
        out.priority < sfs.priority,
        "themis.outbound ({}, priority {}) must be inserted before set_filter_state ({}, priority {})",
        out.envoyfilter,
        out.priority,
        sfs.envoyfilter,
        sfs.priority
    );
    let names: Vec<&str> = seq(&outbound_hcm["http_filters"])
        .iter()
        .map(|f| str_of(&f["name"]))
        .collect();
    assert_eq!(
        names,
        [
            "themis.outbound",
            "envoy.filters.http.set_filter_state",
            "envoy.filters.http.router"
        ],
        "the order these patches reproduce"
    );

    // Outbound: the mesh route, first, to the sealing cluster, as the bootstrap's.
    let route = the_patch(&patches, "HTTP_ROUTE", |p| p.apply_to == "HTTP_ROUTE");
    assert_eq!(
        (route.context.as_str(), route.operation.as_str()),
        ("SIDECAR_OUTBOUND", "INSERT_FIRST")
    );
    let twin_route = seq(&outbound_hcm["route_config"]["virtual_hosts"][0]["routes"])
        .iter()
        .find(|r| r["match"]["prefix"] == "/")
        .unwrap()
        .clone();
    for key in ["match", "route", "request_headers_to_remove"] {
        assert_eq!(route.value[key], twin_route[key], "outbound route: {key}");
    }
    assert_eq!(route.value["route"]["cluster"], "themis_seal");

    // Inbound: caller-supplied x-themis-* headers dropped first, then the peer headers
    // from filter state, as the bootstrap's.
    let inbound_hcm = hcm(&sidecar_listener(&sidecar, "themis_inbound"));
    assert_inbound_strips_headers(&patches, &inbound_hcm);
    let options = "common_http_protocol_options";
    assert_eq!(
        inbound_hcm[options]["headers_with_underscores_action"],
        "DROP_HEADER"
    );
    let headers = the_patch(&patches, "ROUTE_CONFIGURATION", |p| {
        p.apply_to == "ROUTE_CONFIGURATION"
    });
    assert_eq!(
        (headers.context.as_str(), headers.operation.as_str()),
        ("SIDECAR_INBOUND", "MERGE")
    );
    assert_eq!(
        headers.value["request_headers_to_add"],
        inbound_hcm["route_config"]["request_headers_to_add"]
    );

    // One Themis port for every listener and route patch, and Istio's mTLS off there
    // (the sealed stream arrives on the plaintext chain).
    let port = themis_port(&out);
    for p in patches
        .iter()
        .filter(|p| p.apply_to != "CLUSTER" && p.apply_to != "LISTENER")
    {
        assert_eq!(themis_port(p), port, "{p:#?}");
    }
    assert_mtls_off(&envoyfilter_docs(), port);
}

#[test]
fn wasmplugins_agree_with_the_envoyfilter() {
    let patches = envoyfilter_patches();
    let sidecar = sidecar();
    let mut roles = Vec::new();
    for doc in documents("deploy/istio/wasmplugin.yaml") {
        assert_eq!(doc["kind"], "WasmPlugin");
        let spec = &doc["spec"];
        let name = str_of(&doc["metadata"]["name"]);
        assert_eq!(spec["selector"]["matchLabels"]["app"], "check", "{name}");
        let json_config = serde_json::to_string(&spec["pluginConfig"]).unwrap();
        let config = Config::parse(json_config.as_bytes())
            .unwrap_or_else(|e| panic!("{name}: {json_config}: {e}"));
        // Where Istio puts it, and the role that calls for.
        let (role, apply_to, context) =
            match (spec["type"].as_str(), spec["match"][0]["mode"].as_str()) {
                (Some("HTTP"), Some("CLIENT")) => {
                    (Role::Outbound, "HTTP_FILTER", "SIDECAR_OUTBOUND")
                }
                (Some("NETWORK"), Some("SERVER")) => {
                    (Role::Inbound, "NETWORK_FILTER", "SIDECAR_INBOUND")
                }
                other => panic!("{name}: unexpected type and mode {other:?}"),
            };
        assert_eq!(config.role, role, "{name}");
        roles.push(role);
        // Its twin in the EnvoyFilter: same JSON, module, root id, port; fail closed.
        let twin = the_patch(&patches, name, |p| {
            let ty = &p.value["typed_config"]["@type"];
            p.apply_to == apply_to && p.context == context && (*ty == WASM || *ty == NETWORK_WASM)
        });
        assert_eq!(
            json(&json_config),
            json(&plugin_json(&twin.value)),
            "{name}: WasmPlugin and EnvoyFilter disagree"
        );
        assert_eq!(
            spec["url"],
            format!("file://{}", module_path(&twin.value)).as_str(),
            "{name}"
        );
        let wasm = &twin.value["typed_config"]["config"];
        assert_eq!(spec["pluginName"], wasm["root_id"], "{name}");
        assert_eq!(spec["failStrategy"], "FAIL_CLOSE", "{name}");
        assert_eq!(wasm["fail_open"], false, "{name}");
        // WasmPlugin takes Istio's default runtime: V8, the bootstrap's.
        assert!(spec["vmConfig"].get("runtime").is_none(), "{name}");
        assert_eq!(
            sidecar_wasm_filter(&sidecar, role)["typed_config"]["config"]["vm_config"]["runtime"],
            "envoy.wasm.runtime.v8"
        );
        assert_eq!(
            spec["match"][0]["ports"][0]["number"], twin.matching["listener"]["portNumber"],
            "{name}: the port the EnvoyFilter patches"
        );
        // The plumbing it relies on stays in the other EnvoyFilter, which does not
        // carry the filter the WasmPlugin replaces.
        assert_eq!(twin.envoyfilter, "themis-check-filters", "{name}");
    }
    roles.sort_by_key(|r| r.as_str());
    assert_eq!(roles, [Role::Inbound, Role::Outbound]);
    let filters_only: Vec<&Patch> = patches
        .iter()
        .filter(|p| p.envoyfilter == "themis-check-filters")
        .collect();
    assert_eq!(
        filters_only.len(),
        2,
        "themis-check-filters holds only what the WasmPlugins replace"
    );
}

#[test]
fn envoy_loads_the_istio_filter_configuration() {
    if !require::filter_in_envoy("loads the manifests' configurations") {
        return;
    }
    let patches = envoyfilter_patches();
    let [(_, outbound), (_, seal), (_, inbound)] = role_configs(&patches);
    // The harness derives the seal configuration from the outbound one: the manifests'
    // seal JSON is exactly that, so all three are the manifests'.
    assert_eq!(json(&seal), seal_of(&json(&outbound)));
    let _ = filter_wasm();
    let dir = support::mesh::tempdir();
    let envoy = Envoy::start(
        dir.path(),
        "istio-config",
        &Sidecar {
            app_protocol: AppProtocol::Http1,
            ip: "127.0.0.39",
            agent_socket: &dir.path().join("no-agent.sock"),
            app: "127.0.0.39:9".parse().unwrap(),
            outbound_config: &outbound,
            inbound_config: &inbound,
        },
    );
    // Each worker configures every role from the manifests' JSON.
    let log = envoy.log_tail(400);
    for role in [Role::Outbound, Role::Seal, Role::Inbound] {
        let line = format!(
            "themis {} filter for workload check in mesh demo: configured",
            role.as_str()
        );
        assert!(log.contains(&line), "no {line:?} in:\n{log}");
    }
}

// ---- The native runtime: deploy/istio/envoyfilter-native.yaml -------------------------

const NATIVE_MANIFEST: &str = "deploy/istio/envoyfilter-native.yaml";
const NATIVE_HTTP_FILTER: &str =
    "type.googleapis.com/envoy.extensions.filters.http.dynamic_modules.v3.DynamicModuleFilter";
const NATIVE_NETWORK_FILTER: &str = "type.googleapis.com/envoy.extensions.filters.network.dynamic_modules.v3.DynamicModuleNetworkFilter";
const NATIVE_SOCKET: &str = "type.googleapis.com/envoy.extensions.transport_sockets.dynamic_modules.v3.DynamicModuleTransportSocket";
const STRING_VALUE: &str = "type.googleapis.com/google.protobuf.StringValue";

fn native_docs() -> Vec<Value> {
    documents(NATIVE_MANIFEST)
}

/// The patches of envoyfilter-native.yaml in the order Istio applies them: one
/// EnvoyFilter, whose patches Istio applies in the order they are listed.
fn native_patches() -> Vec<Patch> {
    let docs = native_docs();
    let envoyfilters = docs.iter().filter(|d| d["kind"] == "EnvoyFilter").count();
    assert_eq!(
        envoyfilters, 1,
        "one EnvoyFilter: the order of its list is the order of its patches"
    );
    patches_in(&docs)
}

/// The native runtime's bootstrap, deploy/envoy/sidecar-native.yaml.
fn native_sidecar() -> Value {
    documents("deploy/envoy/sidecar-native.yaml").remove(0)
}

/// A piece of the module a patch puts somewhere (`{name, typed_config}`): what the
/// module is asked to make there, with which configuration.
struct NativePiece {
    place: String,
    /// Its `filter_name` or `transport_socket_name`.
    made: String,
    /// The configuration JSON; `None` for the network filter `peer`, which takes none.
    config: Option<String>,
    piece: Value,
    patch: Patch,
}

/// The field naming what the module makes and the one holding its configuration, by
/// the piece's type; `None` for anything but the module's.
fn native_fields(ty: &Value) -> Option<(&'static str, &'static str)> {
    if *ty == NATIVE_HTTP_FILTER || *ty == NATIVE_NETWORK_FILTER {
        Some(("filter_name", "filter_config"))
    } else if *ty == NATIVE_SOCKET {
        Some(("transport_socket_name", "transport_socket_config"))
    } else {
        None
    }
}

/// Every piece of the module the patches put anywhere.
fn native_pieces(patches: &[Patch]) -> Vec<NativePiece> {
    let mut found = Vec::new();
    for p in patches {
        let mut pieces = Vec::new();
        let native = |ty: &Value| native_fields(ty).is_some();
        collect_typed(&p.value, &native, &mut pieces);
        for piece in pieces {
            let place = format!(
                "{} {} {} ({})",
                p.apply_to, p.context, p.operation, p.envoyfilter
            );
            let typed = &piece["typed_config"];
            let (made, config) = native_fields(&typed["@type"]).unwrap();
            let config = typed.get(config).map(|c| {
                assert_eq!(c["@type"], STRING_VALUE, "{place}");
                str_of(&c["value"]).to_string()
            });
            found.push(NativePiece {
                place,
                made: str_of(&typed[made]).to_string(),
                config,
                piece,
                patch: p.clone(),
            });
        }
    }
    found
}

/// Everything of a piece of the module but what it makes and its configuration JSON.
fn native_shape(piece: &Value) -> Value {
    let mut v = piece.clone();
    let typed = &mut v["typed_config"];
    for made in ["filter_name", "transport_socket_name"] {
        if typed.get(made).is_some() {
            typed[made] = Value::Null;
        }
    }
    for config in ["filter_config", "transport_socket_config"] {
        if typed.get(config).is_some() {
            typed[config]["value"] = Value::Null;
        }
    }
    v
}

/// The configurations of the native pieces, by role (the seal's by its cluster's
/// name).
struct NativeConfigs {
    outbound: serde_json::Value,
    inbound: serde_json::Value,
    seals: Vec<(String, serde_json::Value)>,
}

/// The service a sealing cluster reaches (`themis_to_<service>`, or
/// `themis_to_<service>_http1`), and whether it carries HTTP/1.1.
fn sealed_service(cluster: &str) -> (&str, bool) {
    let service = cluster
        .strip_prefix("themis_to_")
        .unwrap_or_else(|| panic!("{cluster}: a sealing cluster is themis_to_<service>"));
    match service.strip_suffix("_http1") {
        Some(service) => (service, true),
        None => (service, false),
    }
}

fn native_configs(pieces: &[NativePiece]) -> NativeConfigs {
    let of = |apply_to: &str| -> Vec<(&NativePiece, serde_json::Value)> {
        pieces
            .iter()
            .filter(|p| p.patch.apply_to == apply_to && p.config.is_some())
            .map(|p| (p, json(p.config.as_deref().unwrap())))
            .collect()
    };
    let one = |apply_to: &str| -> serde_json::Value {
        let found = of(apply_to);
        assert_eq!(found.len(), 1, "one configured piece in a {apply_to} patch");
        found[0].1.clone()
    };
    let seals = of("CLUSTER")
        .into_iter()
        .map(|(p, config)| {
            let cluster = str_of(&p.patch.value["name"]);
            sealed_service(cluster);
            (cluster.to_string(), config)
        })
        .collect();
    NativeConfigs {
        outbound: one("HTTP_FILTER"),
        inbound: one("FILTER_CHAIN"),
        seals,
    }
}

/// Where envoyfilter.yaml's themis_agent cluster reaches the agent's socket in the pod
/// (the header of both manifests mounts the node's /var/run/themis there).
fn pod_agent_socket() -> String {
    let agent = the_patch(&envoyfilter_patches(), "themis_agent", |p| {
        p.apply_to == "CLUSTER" && p.value["name"] == "themis_agent"
    });
    let endpoint = &agent.value["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"];
    str_of(&endpoint["address"]["pipe"]["path"]).to_string()
}

/// `v` with every JSON configuration in it (a string holding a JSON object) replaced
/// by what `f` makes of it.
fn map_configs(v: &Value, f: &dyn Fn(serde_json::Value) -> Value) -> Value {
    match v {
        Value::String(s) => match serde_json::from_str::<serde_json::Value>(s) {
            Ok(config) if config.is_object() => f(config),
            _ => v.clone(),
        },
        Value::Mapping(m) => Value::Mapping(
            m.iter()
                .map(|(k, child)| (k.clone(), map_configs(child, f)))
                .collect(),
        ),
        Value::Sequence(s) => Value::Sequence(s.iter().map(|c| map_configs(c, f)).collect()),
        _ => v.clone(),
    }
}

/// The `agent_socket` of a configuration, if it has one, set to `socket`.
fn at_socket(mut config: serde_json::Value, socket: &str) -> serde_json::Value {
    if let Some(map) = config.as_object_mut() {
        if map.contains_key("agent_socket") {
            map.insert("agent_socket".into(), socket.into());
        }
    }
    config
}

/// `v` with its JSON configurations decoded (compared as data, not text) and their
/// agent socket set to `socket`.
fn decoded(v: &Value, socket: &str) -> Value {
    map_configs(v, &|config| {
        serde_yaml::to_value(at_socket(config, socket)).unwrap()
    })
}

/// deploy/envoy/sidecar-native.yaml as `themis sidecar render --runtime native` renders
/// it (`themis-bootstrap`) for the manifest's workload, policy and agent socket,
/// calling `calls`.
fn rendered_native(configs: &NativeConfigs, calls: &[String]) -> Value {
    let out = &configs.outbound;
    let field = |key: &str| out[key].as_str().expect(key).to_string();
    let (root, workload, service) = (field("mesh_root"), field("workload"), field("service"));
    let role = |role: &str, extra| {
        themis_bootstrap::role_config(role, &root, &workload, Some(&service), extra)
    };
    let sidecar = themis_bootstrap::Sidecar {
        runtime: themis_bootstrap::Runtime::Native,
        admin_port: 15000,
        outbound: "127.0.0.1:15001".parse().unwrap(),
        inbound: "127.0.0.1:15006".parse().unwrap(),
        app: "127.0.0.1:8080".parse().unwrap(),
        app_protocol: themis_bootstrap::AppProtocol::Http1,
        agent_socket: field("agent_socket").into(),
        outbound_config: role("outbound", None),
        inbound_config: role("inbound", Some(("policy", &configs.inbound["policy"]))),
        filter_code: None,
        calls: calls.to_vec(),
        tcp: Vec::new(),
        access_log: None,
        channel_too: false,
        rbac_principals: Vec::new(),
    };
    serde_yaml::from_str(&sidecar.render().expect("renders")).unwrap()
}

/// A `pub const NAME: &str = "...";` of the native module's source (the test cannot
/// link the module: it links this crate).
fn native_const(file: &str, name: &str) -> String {
    let path = workspace().join("filter/themis-native/src").join(file);
    let text = std::fs::read_to_string(&path).unwrap();
    let decl = format!("pub const {name}: &str = \"");
    let start = text
        .find(&decl)
        .unwrap_or_else(|| panic!("{} declares no {decl}…", path.display()))
        + decl.len();
    let len = text[start..].find('"').unwrap();
    text[start..start + len].to_string()
}

/// The routes of a virtual host of Istio's as the patches leave them: `patches` (the
/// HTTP_ROUTE ones, in order) applied to Istio's own `routes`.
fn routes_after(patches: &[Patch], routes: Vec<Value>) -> Vec<Value> {
    let mut routes = routes;
    for p in patches.iter().filter(|p| p.apply_to == "HTTP_ROUTE") {
        assert_eq!(
            (p.context.as_str(), p.operation.as_str()),
            ("SIDECAR_OUTBOUND", "INSERT_FIRST"),
            "{p:#?}"
        );
        routes.insert(0, p.value.clone());
    }
    routes
}

/// The HTTP filters of Istio's outbound HCM as the patches leave them: each HTTP_FILTER
/// SIDECAR_OUTBOUND patch, in order, inserted before the router of `filters`.
fn outbound_filters_after(patches: &[Patch], filters: Vec<Value>) -> Vec<Value> {
    let mut filters = filters;
    for p in patches
        .iter()
        .filter(|p| p.apply_to == "HTTP_FILTER" && p.context == "SIDECAR_OUTBOUND")
    {
        assert_eq!(p.operation, "INSERT_BEFORE", "{p:#?}");
        let chain = &p.matching["listener"]["filterChain"]["filter"];
        assert_eq!(
            chain["name"],
            "envoy.filters.network.http_connection_manager"
        );
        assert_eq!(chain["subFilter"]["name"], "envoy.filters.http.router");
        let router = filters
            .iter()
            .position(|f| f["name"] == "envoy.filters.http.router")
            .expect("a router");
        filters.insert(router, p.value.clone());
    }
    filters
}

fn names(filters: &[Value]) -> Vec<&str> {
    filters.iter().map(|f| str_of(&f["name"])).collect()
}

#[test]
fn native_envoyfilter_configurations_match_where_they_are_patched() {
    let patches = native_patches();
    let native = native_sidecar();
    let agent_socket = pod_agent_socket();
    let inbound_listener = sidecar_listener(&native, "themis_inbound");
    let outbound_filter = http_filter(
        &hcm(&sidecar_listener(&native, "themis_outbound")),
        "themis.outbound",
    );
    let inbound_socket = inbound_listener["filter_chains"][0]["transport_socket"].clone();
    let peer = network_filter(&inbound_listener, "themis.peer");

    let pieces = native_pieces(&patches);
    let mut places = Vec::new();
    for NativePiece {
        place,
        made,
        config,
        piece,
        patch,
    } in &pieces
    {
        // What belongs where, and its twin in the bootstrap (a sealing cluster's socket
        // is the inbound one's but for what it makes; the clusters are rendered, not in
        // the template: the next test compares them whole).
        let (twin, twin_made, role) = match (patch.apply_to.as_str(), patch.context.as_str()) {
            ("HTTP_FILTER", "SIDECAR_OUTBOUND") => {
                (&outbound_filter, "filter_name", Some(Role::Outbound))
            }
            ("CLUSTER", "SIDECAR_OUTBOUND") => (&inbound_socket, "", Some(Role::Seal)),
            ("FILTER_CHAIN", "SIDECAR_INBOUND") => (
                &inbound_socket,
                "transport_socket_name",
                Some(Role::Inbound),
            ),
            ("NETWORK_FILTER", "SIDECAR_INBOUND") => (&peer, "filter_name", None),
            _ => panic!("a piece of the module where none belongs: {place}"),
        };
        places.push(patch.apply_to.as_str());
        // Type, module (its name, kept open), secure transport, Envoy's filter names:
        // the bootstrap's.
        assert_eq!(
            native_shape(piece),
            native_shape(twin),
            "{place}: differs from deploy/envoy/sidecar-native.yaml"
        );
        match role {
            Some(Role::Seal) => assert_eq!(made, "outbound", "{place}"),
            _ => assert_eq!(
                made.as_str(),
                str_of(&twin["typed_config"][twin_made]),
                "{place}"
            ),
        }
        match (role, config) {
            (None, None) => {}
            (Some(role), Some(config)) => {
                let parsed = Config::parse(config.as_bytes())
                    .unwrap_or_else(|e| panic!("{place}: {config}: {e}"));
                assert_eq!(parsed.role, role, "{place}");
                assert_eq!(parsed.workload, "check", "{place}");
                // The module reaches the agent itself: at the socket the pod mounts.
                assert_eq!(
                    parsed.agent_socket.as_deref(),
                    Some(agent_socket.as_str()),
                    "{place}"
                );
                let sealed =
                    (role == Role::Seal).then(|| sealed_service(str_of(&patch.value["name"])));
                assert_eq!(
                    parsed.peer_service.as_deref(),
                    sealed.map(|s| s.0),
                    "{place}"
                );
                let http1 = sealed.is_some_and(|s| s.1);
                assert_eq!(
                    parsed.carries == themis_core::Carries::HTTP1,
                    http1,
                    "{place}"
                );
            }
            (role, config) => panic!("{place}: role {role:?} with configuration {config:?}"),
        }
    }
    places.sort();
    places.dedup();
    assert_eq!(
        places,
        ["CLUSTER", "FILTER_CHAIN", "HTTP_FILTER", "NETWORK_FILTER"],
        "every piece of the module's data path"
    );

    // One sidecar's configurations, as themis sidecar render derives them: envoyfilter.yaml's
    // outbound and inbound ones with the agent's socket, and each sealing cluster's the
    // outbound one as the seal role, for its service.
    let configs = native_configs(&pieces);
    assert!(!configs.seals.is_empty(), "a sealing cluster");
    let [(_, outbound), _, (_, inbound)] = role_configs(&envoyfilter_patches());
    let with_socket = |wasm: &str| {
        let mut config = json(wasm);
        config["agent_socket"] = agent_socket.clone().into();
        config
    };
    assert_eq!(
        configs.outbound,
        with_socket(&outbound),
        "outbound: envoyfilter.yaml's, with the agent's socket"
    );
    let mut inbound = with_socket(&inbound);
    inbound["takes_http1"] = true.into();
    assert_eq!(
        configs.inbound, inbound,
        "inbound: envoyfilter.yaml's, with the agent's socket, taking HTTP/1.1 as is"
    );
    for (cluster, seal) in &configs.seals {
        let (service, http1) = sealed_service(cluster);
        let mut want = seal_of(&configs.outbound);
        want["peer_service"] = service.into();
        if http1 {
            want["carries"] = "http/1.1".into();
        }
        assert_eq!(*seal, want, "{cluster}");
    }
}

#[test]
fn native_envoyfilter_rebuilds_the_native_sidecar_data_path() {
    let patches = native_patches();
    let native = native_sidecar();
    let configs = native_configs(&native_pieces(&patches));
    let socket = configs.outbound["agent_socket"]
        .as_str()
        .unwrap()
        .to_string();
    let mut services: Vec<String> = configs
        .seals
        .iter()
        .map(|(cluster, _)| sealed_service(cluster).0.to_string())
        .collect();
    services.sort();
    services.dedup();
    let rendered = rendered_native(&configs, &services);

    // Outbound: the pick, then set_filter_state, then the router, as the bootstrap's.
    let outbound_hcm = hcm(&sidecar_listener(&native, "themis_outbound"));
    let istio = vec![
        serde_yaml::from_str("{name: istio.stats}").unwrap(),
        http_filter(&outbound_hcm, "envoy.filters.http.router"),
    ];
    let filters = outbound_filters_after(&patches, istio);
    assert_eq!(
        names(&filters[1..]),
        names(seq(&outbound_hcm["http_filters"])),
        "the order of deploy/envoy/sidecar-native.yaml's outbound filters"
    );
    assert_eq!(
        names(seq(&outbound_hcm["http_filters"])),
        [
            "themis.outbound",
            "envoy.filters.http.set_filter_state",
            "envoy.filters.http.router"
        ]
    );
    assert_eq!(
        filters[2],
        http_filter(&outbound_hcm, "envoy.filters.http.set_filter_state")
    );

    // The sealing clusters: the renderer's, one per service (nothing else added).
    for p in patches.iter().filter(|p| p.apply_to == "CLUSTER") {
        let name = str_of(&p.value["name"]);
        assert_eq!(
            (p.context.as_str(), p.operation.as_str()),
            ("SIDECAR_OUTBOUND", "ADD"),
            "{name}"
        );
        // the socket is compared by its path alone (/var/run is often /run).
        assert_eq!(
            decoded(&p.value, &socket),
            decoded(&sidecar_cluster(&rendered, name), &socket),
            "cluster {name} differs from what themis sidecar render renders"
        );
    }

    // Outbound routes, in every virtual host of the route configuration of the port:
    // one per service, to its sealing cluster, as the renderer's virtual host of the
    // service; behind them the fallback, ahead of Istio's own routes.
    let istio_route: Value =
        serde_yaml::from_str("{name: istio, match: {prefix: /}, route: {cluster: istio}}").unwrap();
    let routes = routes_after(&patches, vec![istio_route.clone()]);
    for p in patches.iter().filter(|p| p.apply_to == "HTTP_ROUTE") {
        assert!(
            p.matching["routeConfiguration"].get("vhost").is_none(),
            "every virtual host: {p:#?}"
        );
    }
    let (unrouted, istio_own) = (&routes[routes.len() - 2], &routes[routes.len() - 1]);
    assert_eq!(*istio_own, istio_route);
    assert_eq!(unrouted["name"], "themis_unrouted");
    assert_eq!(
        *unrouted,
        serde_yaml::from_str::<Value>(
            "{name: themis_unrouted, match: {prefix: /}, direct_response: {status: 404}}"
        )
        .unwrap(),
        "anything left goes nowhere, as a host with no virtual host in the bootstrap"
    );
    let rendered_vhosts = hcm(&sidecar_listener(&rendered, "themis_outbound"))["route_config"]
        ["virtual_hosts"]
        .clone();
    let mut routed: Vec<String> = Vec::new();
    for route in &routes[..routes.len() - 2] {
        let cluster = str_of(&route["route"]["cluster"]);
        let (service, _) = sealed_service(cluster);
        assert_eq!(route["name"], cluster);
        let vhost = seq(&rendered_vhosts)
            .iter()
            .find(|v| v["name"] == service)
            .unwrap_or_else(|| panic!("the renderer has no virtual host for {service}"))
            .clone();
        // The host the bootstrap's virtual host takes: the service, any port.
        let domains: Vec<&str> = seq(&vhost["domains"]).iter().map(str_of).collect();
        assert_eq!(domains, [service.to_string(), format!("{service}:*")]);
        // The bootstrap's route to the same cluster, matched by the host here.
        let twin = seq(&vhost["routes"])
            .iter()
            .find(|r| r["match"]["prefix"] == "/" && r["route"]["cluster"] == cluster)
            .unwrap_or_else(|| panic!("the renderer has no route to {cluster}"))
            .clone();
        let headers = seq(&route["match"]["headers"]);
        let (authority, rest) = headers.split_first().expect("a header match");
        assert_eq!(authority["name"], ":authority");
        assert_eq!(
            authority["string_match"]["safe_regex"]["regex"],
            format!("{service}(:[0-9]+)?").as_str()
        );
        let twin_headers = twin["match"]["headers"]
            .as_sequence()
            .cloned()
            .unwrap_or_default();
        assert_eq!(rest, &twin_headers[..], "route to {cluster}: headers");
        assert_eq!(route["match"]["prefix"], twin["match"]["prefix"]);
        for key in ["route", "request_headers_to_remove"] {
            assert_eq!(route[key], twin[key], "route to {cluster}: {key}");
        }
        routed.push(cluster.to_string());
    }
    routed.sort();
    let mut sealing: Vec<String> = configs.seals.iter().map(|(c, _)| c.clone()).collect();
    sealing.sort();
    assert_eq!(routed, sealing, "one route per sealing cluster");

    // Inbound: the module's socket and the handshake deadline on the plaintext chain,
    // the module's `peer` first on it, as the bootstrap's listener.
    let inbound_listener = sidecar_listener(&native, "themis_inbound");
    let twin_chain = &inbound_listener["filter_chains"][0];
    let chain = the_patch(&patches, "FILTER_CHAIN", |p| p.apply_to == "FILTER_CHAIN");
    assert_eq!(
        (chain.context.as_str(), chain.operation.as_str()),
        ("SIDECAR_INBOUND", "MERGE")
    );
    let filter_chain = &chain.matching["listener"]["filterChain"];
    assert_eq!(filter_chain["transportProtocol"], "raw_buffer");
    assert!(
        filter_chain.get("filter").is_none(),
        "istiod ignores (and warns of) a filter match on FILTER_CHAIN"
    );
    let mut keys: Vec<&str> = chain
        .value
        .as_mapping()
        .unwrap()
        .keys()
        .map(str_of)
        .collect();
    keys.sort();
    assert_eq!(
        keys,
        ["transport_socket", "transport_socket_connect_timeout"]
    );
    // The template's deadline is rendered from the configuration's
    // handshake_timeout_secs; the EnvoyFilter's configuration leaves it at its default.
    assert_eq!(
        twin_chain["transport_socket_connect_timeout"], 0,
        "a placeholder"
    );
    assert!(
        configs.inbound.get("handshake_timeout_secs").is_none(),
        "the EnvoyFilter's listener says the default deadline: so must its configuration"
    );
    assert_eq!(
        chain.value["transport_socket_connect_timeout"],
        format!(
            "{}s",
            themis_sidecar::config::DEFAULT_HANDSHAKE_TIMEOUT_SECS
        )
        .as_str()
    );
    let peer = the_patch(&patches, "themis.peer", |p| {
        p.value["name"] == "themis.peer"
    });
    assert_eq!(
        peer.placement(),
        ("NETWORK_FILTER", "SIDECAR_INBOUND", "INSERT_FIRST")
    );
    assert_eq!(
        peer.matching["listener"]["filterChain"]["transportProtocol"],
        "raw_buffer"
    );
    assert_eq!(peer.value, network_filter(&inbound_listener, "themis.peer"));
    assert_eq!(
        names(seq(&twin_chain["filters"])),
        [
            "themis.peer",
            "envoy.filters.network.http_connection_manager"
        ]
    );

    // Inbound: caller-supplied x-themis-* and underscored headers dropped, the peer
    // headers from the filter state the module's `peer` sets, as the bootstrap's HCM.
    let inbound_hcm = hcm(&inbound_listener);
    assert_inbound_strips_headers(&patches, &inbound_hcm);
    let headers = the_patch(&patches, "ROUTE_CONFIGURATION", |p| {
        p.apply_to == "ROUTE_CONFIGURATION"
    });
    assert_eq!(
        (headers.context.as_str(), headers.operation.as_str()),
        ("SIDECAR_INBOUND", "MERGE")
    );
    let added = &headers.value["request_headers_to_add"];
    assert_eq!(
        *added,
        inbound_hcm["route_config"]["request_headers_to_add"]
    );
    for (i, (header, key)) in [
        ("x-themis-peer-id", "PEER_ID_KEY"),
        ("x-themis-peer-service", "PEER_SERVICE_KEY"),
    ]
    .into_iter()
    .enumerate()
    {
        let key = native_const("filter.rs", key);
        assert_eq!(added[i]["header"]["key"], header);
        assert_eq!(
            added[i]["header"]["value"],
            format!("%FILTER_STATE({key}:PLAIN)%").as_str(),
            "{header}: the key the module's `peer` filter sets"
        );
    }

    // One Themis port, envoyfilter.yaml's, for every listener and route patch, and
    // Istio's mTLS off there.
    let port = themis_port(&the_patch(&envoyfilter_patches(), "themis.outbound", |p| {
        p.value["name"] == "themis.outbound"
    }));
    for p in patches.iter().filter(|p| p.apply_to != "CLUSTER") {
        assert_eq!(themis_port(p), port, "{p:#?}");
    }
    assert_mtls_off(&native_docs(), port);
}

/// The JSON of a pod annotation the manifest's header tells the user to set
/// (`#   <name>: '<json>'`).
fn header_annotation(text: &str, name: &str) -> serde_json::Value {
    let start = format!("{name}: '");
    let found: Vec<&str> = text
        .lines()
        .take_while(|l| l.starts_with('#'))
        .filter_map(|l| Some(l.split_once(&start)?.1))
        .collect();
    assert_eq!(found.len(), 1, "one {name} annotation in the header");
    json(found[0].strip_suffix('\'').expect("quoted"))
}

#[test]
fn native_envoyfilter_says_how_istio_proxy_finds_the_module_and_the_agent() {
    let docs = native_docs();
    let text = std::fs::read_to_string(workspace().join(NATIVE_MANIFEST)).unwrap();

    // The ProxyConfig puts the search path in istio-proxy's environment.
    let proxy_config = docs
        .iter()
        .find(|d| d["kind"] == "ProxyConfig")
        .expect("a ProxyConfig");
    assert_eq!(proxy_config["apiVersion"], "networking.istio.io/v1beta1");
    assert_eq!(
        proxy_config["spec"]["selector"]["matchLabels"]["app"],
        "check"
    );
    let search =
        str_of(&proxy_config["spec"]["environmentVariables"]["ENVOY_DYNAMIC_MODULES_SEARCH_PATH"]);
    assert!(search.starts_with('/'), "{search}");
    // The annotation the header offers instead says the same.
    let annotation = header_annotation(&text, "proxy.istio.io/config");
    assert_eq!(
        annotation["proxyMetadata"]["ENVOY_DYNAMIC_MODULES_SEARCH_PATH"],
        search
    );

    // Envoy loads <search>/lib<name>.so: the file the header mounts there, read-only,
    // from a file on the node (never the directory that holds the agent's keys).
    let modules: Vec<Value> = native_pieces(&native_patches())
        .iter()
        .map(|p| p.piece["typed_config"]["dynamic_module_config"].clone())
        .collect();
    assert!(modules.iter().all(|m| *m == modules[0]), "one module");
    let module = format!("{search}/lib{}.so", str_of(&modules[0]["name"]));
    let volumes = header_annotation(&text, "sidecar.istio.io/userVolume");
    let mounts = header_annotation(&text, "sidecar.istio.io/userVolumeMount");
    let volume = |name: &serde_json::Value| -> serde_json::Value {
        let all = volumes.as_array().expect("a list of volumes");
        let found: Vec<_> = all.iter().filter(|v| v["name"] == *name).collect();
        assert_eq!(found.len(), 1, "volume {name}");
        found[0]["hostPath"].clone()
    };
    let mount_at = |path: &str| -> serde_json::Value {
        let all = mounts.as_array().expect("a list of mounts");
        let found: Vec<_> = all.iter().filter(|m| m["mountPath"] == path).collect();
        assert_eq!(found.len(), 1, "one mount at {path}: {mounts}");
        found[0].clone()
    };
    let mounted = mount_at(&module);
    assert_eq!(mounted["readOnly"], true);
    let host = volume(&mounted["name"]);
    assert_eq!(host["type"], "File", "{host}");
    for v in volumes.as_array().unwrap() {
        assert_ne!(
            v["hostPath"]["path"], "/var/lib/themis",
            "the agent's keys: {v}"
        );
    }

    // The agent's socket: the directory the agent's DaemonSet serves it in, mounted
    // where the configurations name it.
    let socket = pod_agent_socket();
    let (socket_dir, socket_file) = socket.rsplit_once('/').unwrap();
    let run = mount_at(socket_dir);
    let daemonset =
        std::fs::read_to_string(workspace().join("deploy/kubernetes/agent-daemonset.yaml"))
            .unwrap();
    let served = daemonset
        .split("--api-socket=")
        .nth(1)
        .and_then(|rest| rest.split(|c: char| c.is_whitespace() || c == '"').next())
        .expect("the agent's --api-socket");
    let host_dir = volume(&run["name"])["path"].as_str().unwrap().to_string();
    assert_eq!(
        format!("{host_dir}/{socket_file}"),
        served,
        "the node's socket, mounted at {socket_dir}"
    );
}

#[test]
fn istio_manifests_name_distinct_resources() {
    // `kubectl apply -f deploy/istio/` applies every file together.
    let mut seen: std::collections::BTreeMap<(String, String, String), String> = Default::default();
    for entry in std::fs::read_dir(workspace().join("deploy/istio")).unwrap() {
        let file = entry.unwrap().file_name().into_string().unwrap();
        if !file.ends_with(".yaml") {
            continue;
        }
        for doc in documents(&format!("deploy/istio/{file}")) {
            let meta = &doc["metadata"];
            let key = (
                str_of(&doc["kind"]).to_string(),
                str_of(&meta["namespace"]).to_string(),
                str_of(&meta["name"]).to_string(),
            );
            if let Some(other) = seen.insert(key.clone(), file.clone()) {
                panic!("{key:?} is in both {other} and {file}");
            }
        }
    }
    assert!(seen.values().any(|f| f == "envoyfilter-native.yaml"));
}

/// `boot`'s listener `name`.
fn listener_mut<'a>(boot: &'a mut Value, name: &str) -> &'a mut Value {
    boot["static_resources"]["listeners"]
        .as_sequence_mut()
        .unwrap()
        .iter_mut()
        .find(|l| l["name"] == name)
        .unwrap_or_else(|| panic!("no listener {name}"))
}

/// The HCM of a listener's (first) filter chain.
fn hcm_mut(listener: &mut Value) -> &mut Value {
    let filters = listener["filter_chains"][0]["filters"]
        .as_sequence_mut()
        .unwrap();
    let hcm = filters
        .iter_mut()
        .find(|f| f["name"] == "envoy.filters.network.http_connection_manager")
        .unwrap();
    &mut hcm["typed_config"]
}

/// Proto merge, as Istio's MERGE: messages merged field by field, lists appended,
/// anything else replaced.
fn merge_into(target: &mut Value, patch: &Value) {
    match (target, patch) {
        (Value::Mapping(t), Value::Mapping(p)) => {
            for (k, v) in p {
                match t.get_mut(k) {
                    Some(existing) => merge_into(existing, v),
                    None => {
                        t.insert(k.clone(), v.clone());
                    }
                }
            }
        }
        (Value::Sequence(t), Value::Sequence(p)) => t.extend(p.iter().cloned()),
        (t, p) => *t = p.clone(),
    }
}

fn remove_named(list: &mut Value, name: &str) {
    let list = list.as_sequence_mut().unwrap();
    let before = list.len();
    list.retain(|f| f["name"] != name);
    assert_eq!(list.len(), before - 1, "{name} once");
}

#[test]
fn envoy_loads_the_istio_native_configuration() {
    if !require::filter_in_envoy("loads the native manifest's patches, with the module") {
        return;
    }
    let patches = native_patches();
    let configs = native_configs(&native_pieces(&patches));
    let dir = support::mesh::tempdir();
    // Every configuration as the manifest has it, but for the agent's socket (none here:
    // the module starts, and asks it in vain).
    let socket = dir.path().join("no-agent.sock").display().to_string();
    let local = |v: &Value| map_configs(v, &|c| Value::String(at_socket(c, &socket).to_string()));
    let mut services: Vec<&str> = configs
        .seals
        .iter()
        .map(|(cluster, _)| sealed_service(cluster).0)
        .collect();
    services.sort();
    services.dedup();

    // The native bootstrap, stripped of what the patches add: Istio's side of it, as far
    // as the patches touch it (an outbound HCM whose chain ends in the router and whose
    // virtual host routes to Istio's own cluster, a plaintext inbound chain).
    let sidecar = Sidecar {
        app_protocol: AppProtocol::Http1,
        ip: "127.0.0.40",
        agent_socket: std::path::Path::new(&socket),
        app: "127.0.0.40:9".parse().unwrap(),
        outbound_config: &at_socket(configs.outbound.clone(), &socket).to_string(),
        inbound_config: &at_socket(configs.inbound.clone(), &socket).to_string(),
    };
    let mut boot: Value = serde_yaml::from_str(&render_native(&sidecar, &services)).unwrap();
    {
        let out = hcm_mut(listener_mut(&mut boot, "themis_outbound"));
        remove_named(&mut out["http_filters"], "themis.outbound");
        remove_named(
            &mut out["http_filters"],
            "envoy.filters.http.set_filter_state",
        );
        out["route_config"]["virtual_hosts"] = serde_yaml::from_str(
            "[{name: istio, domains: ['*'], routes: [{name: istio, match: {prefix: /}, route: {cluster: app}}]}]",
        )
        .unwrap();
    }
    for service in &services {
        for cluster in [
            format!("themis_to_{service}"),
            format!("themis_to_{service}_http1"),
        ] {
            remove_named(&mut boot["static_resources"]["clusters"], &cluster);
        }
    }
    {
        let chain = &mut listener_mut(&mut boot, "themis_inbound")["filter_chains"][0];
        let map = chain.as_mapping_mut().unwrap();
        map.remove("transport_socket").unwrap();
        map.remove("transport_socket_connect_timeout").unwrap();
        remove_named(&mut chain["filters"], "themis.peer");
        let inb = &mut chain["filters"][0]["typed_config"];
        remove_named(&mut inb["http_filters"], "themis.strip");
        let map = inb.as_mapping_mut().unwrap();
        map.remove("common_http_protocol_options").unwrap();
        // The patch says AUTO (Istio's own), which `takes_http1` relies on.
        map.insert("codec_type".into(), "HTTP2".into());
        let route = inb["route_config"].as_mapping_mut().unwrap();
        route.remove("request_headers_to_add").unwrap();
    }

    // Every patch, applied as Istio would, in order.
    for p in &patches {
        let value = local(&p.value);
        match p.placement() {
            ("HTTP_FILTER", "SIDECAR_OUTBOUND", "INSERT_BEFORE") => {
                let out = hcm_mut(listener_mut(&mut boot, "themis_outbound"));
                let filters = out["http_filters"].as_sequence_mut().unwrap();
                let router = filters
                    .iter()
                    .position(|f| f["name"] == "envoy.filters.http.router")
                    .unwrap();
                filters.insert(router, value);
            }
            ("CLUSTER", "SIDECAR_OUTBOUND", "ADD") => {
                boot["static_resources"]["clusters"]
                    .as_sequence_mut()
                    .unwrap()
                    .push(value);
            }
            ("HTTP_ROUTE", "SIDECAR_OUTBOUND", "INSERT_FIRST") => {
                let out = hcm_mut(listener_mut(&mut boot, "themis_outbound"));
                for vhost in out["route_config"]["virtual_hosts"]
                    .as_sequence_mut()
                    .unwrap()
                {
                    vhost["routes"]
                        .as_sequence_mut()
                        .unwrap()
                        .insert(0, value.clone());
                }
            }
            ("FILTER_CHAIN", "SIDECAR_INBOUND", "MERGE") => merge_into(
                &mut listener_mut(&mut boot, "themis_inbound")["filter_chains"][0],
                &value,
            ),
            ("NETWORK_FILTER", "SIDECAR_INBOUND", "INSERT_FIRST") => {
                listener_mut(&mut boot, "themis_inbound")["filter_chains"][0]["filters"]
                    .as_sequence_mut()
                    .unwrap()
                    .insert(0, value);
            }
            ("NETWORK_FILTER", "SIDECAR_INBOUND", "MERGE") => {
                assert_eq!(
                    value["name"],
                    "envoy.filters.network.http_connection_manager"
                );
                let mut typed = value["typed_config"].clone();
                typed.as_mapping_mut().unwrap().remove("@type");
                merge_into(hcm_mut(listener_mut(&mut boot, "themis_inbound")), &typed);
            }
            ("HTTP_FILTER", "SIDECAR_INBOUND", "INSERT_FIRST") => {
                hcm_mut(listener_mut(&mut boot, "themis_inbound"))["http_filters"]
                    .as_sequence_mut()
                    .unwrap()
                    .insert(0, value);
            }
            ("ROUTE_CONFIGURATION", "SIDECAR_INBOUND", "MERGE") => merge_into(
                &mut hcm_mut(listener_mut(&mut boot, "themis_inbound"))["route_config"],
                &value,
            ),
            other => {
                panic!("this test applies no {other:?} patch: teach it, so Envoy loads every patch")
            }
        }
    }

    assert_eq!(
        hcm(&sidecar_listener(&boot, "themis_inbound"))["codec_type"],
        "AUTO"
    );

    // Envoy takes every piece (the module refuses a configuration it cannot use, and
    // Envoy the bootstrap with it), and the module runs for the manifest's workload.
    let envoy = Envoy::start_yaml(
        dir.path(),
        "istio-native",
        &serde_yaml::to_string(&boot).unwrap(),
    );
    wait_until(
        "the module to ask the agent for check's key",
        Duration::from_secs(20),
        || {
            envoy
                .log_tail(400)
                .contains("themis native: the agent delegated no handshake key to workload check")
                .then_some(())
        },
    );
    // The pick answers on the outbound HCM: no sealing cluster for billing; handler's
    // is there, but no agent resolves it.
    let call = |host: &str| http::request(envoy.outbound, "GET", "/", &[("host", host)], b"");
    let r = call("billing");
    assert_eq!(
        (r.status, r.header("x-themis-reject")),
        (503, Some("not_routed")),
        "{r}"
    );
    for service in &services {
        let r = call(&format!("{service}:8080"));
        assert_eq!(
            (r.status, r.header("x-themis-reject")),
            (503, Some("resolve_failed")),
            "{r}"
        );
    }
    // The inbound chain's transport socket is the module's: it takes the connection.
    let _peer = std::net::TcpStream::connect(envoy.inbound).unwrap();
    wait_until(
        "the inbound socket to take a connection",
        Duration::from_secs(10),
        || (envoy.themis_counter("inbound.connections") >= 1).then_some(()),
    );
}
