//! The Istio manifests under `deploy/istio/` rebuild the data path of the sidecar
//! bootstrap `deploy/envoy/sidecar.yaml` (which every other test runs) inside Istio's
//! generated configuration. Checked here: every plugin configuration parses and has the
//! role of where it is patched in, every piece patched in is the bootstrap's own (Wasm
//! settings, the sealing listener, the clusters, set_filter_state, the routes, the
//! inbound header handling), the WasmPlugins agree with the EnvoyFilter, and the real
//! Envoy loads the manifests' configurations.

use themis_testkit as support;

use serde::Deserialize;
use serde_yaml::Value;
use support::build::{filter_wasm, workspace};
use support::envoy::{AppProtocol, Envoy, Sidecar};
use support::require;
use themis_envoy::config::{Config, Role};

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

/// One configPatch of an EnvoyFilter of deploy/istio/envoyfilter.yaml.
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

fn envoyfilter_docs() -> Vec<Value> {
    documents("deploy/istio/envoyfilter.yaml")
}

fn envoyfilter_patches() -> Vec<Patch> {
    let mut patches = Vec::new();
    for doc in envoyfilter_docs()
        .into_iter()
        .filter(|d| d["kind"] == "EnvoyFilter")
    {
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
        collect_wasm(&p.value, &mut filters);
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

fn collect_wasm(v: &Value, out: &mut Vec<Value>) {
    match v {
        Value::Mapping(m) => {
            let ty = &v["typed_config"]["@type"];
            if m.contains_key("name") && (*ty == WASM || *ty == NETWORK_WASM) {
                out.push(v.clone());
            }
            for (_, child) in m {
                collect_wasm(child, out);
            }
        }
        Value::Sequence(s) => s.iter().for_each(|c| collect_wasm(c, out)),
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
        .unwrap_or_else(|| panic!("deploy/envoy/sidecar.yaml has no listener {name}"))
        .clone()
}

fn sidecar_cluster(sidecar: &Value, name: &str) -> Value {
    seq(&sidecar["static_resources"]["clusters"])
        .iter()
        .find(|c| c["name"] == name)
        .unwrap_or_else(|| panic!("deploy/envoy/sidecar.yaml has no cluster {name}"))
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

#[test]
fn envoyfilter_rebuilds_the_sidecar_data_path() {
    let patches = envoyfilter_patches();
    let sidecar = sidecar();
    let themis_port = |p: &Patch| -> i64 {
        let m = &p.matching;
        m["listener"]["portNumber"]
            .as_i64()
            .or(m["routeConfiguration"]["portNumber"].as_i64())
            .unwrap_or_else(|| panic!("{p:#?} names no port"))
    };

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
    let strip = the_patch(&patches, "themis.strip", |p| {
        p.value["name"] == "themis.strip"
    });
    assert_eq!(
        (strip.apply_to.as_str(), strip.context.as_str()),
        ("HTTP_FILTER", "SIDECAR_INBOUND")
    );
    assert_eq!(strip.operation, "INSERT_FIRST");
    assert_eq!(strip.value, http_filter(&inbound_hcm, "themis.strip"));
    // Inbound: headers with underscores dropped (x_themis_peer_id is not x-themis-*),
    // as the bootstrap's HCM.
    let underscores = the_patch(&patches, "headers_with_underscores_action", |p| {
        p.apply_to == "NETWORK_FILTER" && p.operation == "MERGE"
    });
    assert_eq!(underscores.context, "SIDECAR_INBOUND");
    let options = "common_http_protocol_options";
    assert_eq!(
        underscores.value["typed_config"][options],
        inbound_hcm[options]
    );
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
    let docs = envoyfilter_docs();
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
