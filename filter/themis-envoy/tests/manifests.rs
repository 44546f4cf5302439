//! The deployment manifests under `deploy/` configure the filter this crate builds:
//! their plugin configurations parse, their roles match where Istio puts them, the
//! Wasm settings match the sidecar bootstrap the other tests run, and the real Envoy
//! loads the Istio filter configuration.

mod support;

use serde::Deserialize;
use serde_yaml::Value;
use support::build::{filter_wasm, workspace};
use support::envoy::{AppProtocol, Envoy, Sidecar};
use themis_envoy::config::{Config, Role};

fn documents(path: &str) -> Vec<Value> {
    let mut text = std::fs::read_to_string(workspace().join(path)).unwrap();
    // The sidecar template's placeholders are not YAML yet: any value will do here.
    while let Some(start) = text.find("${") {
        let end = start + text[start..].find('}').unwrap();
        text.replace_range(start..=end, "0");
    }
    serde_yaml::Deserializer::from_str(&text)
        .map(|doc| Value::deserialize(doc).unwrap())
        .collect()
}

/// The HTTP filter patches of the EnvoyFilter: (context, the filter's `typed_config`).
fn envoyfilter_patches() -> Vec<(String, Value)> {
    let docs = documents("deploy/istio/envoyfilter.yaml");
    let patches = docs[0]["spec"]["configPatches"].as_sequence().unwrap();
    patches
        .iter()
        .filter(|p| p["applyTo"] == "HTTP_FILTER")
        .map(|p| {
            let context = p["match"]["context"].as_str().unwrap().to_string();
            (context, p["patch"]["value"]["typed_config"].clone())
        })
        .collect()
}

fn plugin_json(typed_config: &Value) -> String {
    typed_config["config"]["configuration"]["value"]
        .as_str()
        .unwrap()
        .to_string()
}

/// The Wasm filter configuration of `listener` in deploy/envoy/sidecar.yaml.
fn sidecar_filter(listener: &str) -> Value {
    let docs = documents("deploy/envoy/sidecar.yaml");
    let listeners = docs[0]["static_resources"]["listeners"]
        .as_sequence()
        .unwrap();
    let l = listeners.iter().find(|l| l["name"] == listener).unwrap();
    l["filter_chains"][0]["filters"][0]["typed_config"]["http_filters"][0]["typed_config"].clone()
}

/// Everything of a Wasm filter config but the module path and the plugin JSON.
fn shape(typed_config: &Value) -> Value {
    let mut v = typed_config.clone();
    v["config"]["vm_config"]["code"] = Value::Null;
    v["config"]["configuration"]["value"] = Value::Null;
    v
}

#[test]
fn istio_manifests_configure_the_filter() {
    let patches = envoyfilter_patches();
    assert_eq!(patches.len(), 2);
    for (context, typed_config) in &patches {
        let config = Config::parse(plugin_json(typed_config).as_bytes())
            .unwrap_or_else(|e| panic!("{context}: {e}"));
        let (role, listener) = match context.as_str() {
            "SIDECAR_OUTBOUND" => (Role::Outbound, "themis_outbound"),
            "SIDECAR_INBOUND" => (Role::Inbound, "themis_inbound"),
            other => panic!("unexpected context {other}"),
        };
        assert_eq!(config.role, role, "{context}");
        assert_eq!(
            shape(typed_config),
            shape(&sidecar_filter(listener)),
            "{context}: the EnvoyFilter's Wasm settings differ from deploy/envoy/sidecar.yaml"
        );
    }

    // The WasmPlugins carry the same configurations, as YAML.
    for doc in documents("deploy/istio/wasmplugin.yaml") {
        let spec = &doc["spec"];
        let json = serde_json::to_string(&spec["pluginConfig"]).unwrap();
        let config = Config::parse(json.as_bytes()).unwrap_or_else(|e| panic!("{json}: {e}"));
        let (role, context) = match spec["match"][0]["mode"].as_str() {
            Some("CLIENT") => (Role::Outbound, "SIDECAR_OUTBOUND"),
            Some("SERVER") => (Role::Inbound, "SIDECAR_INBOUND"),
            other => panic!("unexpected mode {other:?}"),
        };
        assert_eq!(config.role, role);
        assert_eq!(spec["failStrategy"], "FAIL_CLOSE");
        let twin = patches.iter().find(|(c, _)| c == context).unwrap();
        let twin: serde_json::Value = serde_json::from_str(&plugin_json(&twin.1)).unwrap();
        let mine: serde_json::Value = serde_json::from_str(&json).unwrap();
        assert_eq!(
            mine, twin,
            "WasmPlugin and EnvoyFilter disagree for {context}"
        );
    }
}

#[test]
fn envoy_loads_the_istio_filter_configuration() {
    let patches = envoyfilter_patches();
    let json = |context: &str| plugin_json(&patches.iter().find(|(c, _)| c == context).unwrap().1);
    let (outbound, inbound) = (json("SIDECAR_OUTBOUND"), json("SIDECAR_INBOUND"));
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
    // Each worker configures both roles from the manifests' JSON.
    let log = envoy.log_tail(400);
    for role in ["Outbound", "Inbound"] {
        let line = format!("themis {role} filter for workload check in mesh demo: configured");
        assert!(log.contains(&line), "no {line:?} in:\n{log}");
    }
}
