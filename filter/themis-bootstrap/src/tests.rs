use super::*;

fn sidecar(runtime: Runtime) -> Sidecar {
    Sidecar {
        runtime,
        admin_port: 15000,
        outbound: "127.0.0.12:15001".parse().unwrap(),
        inbound: "127.0.0.12:15006".parse().unwrap(),
        app: "127.0.0.12:8080".parse().unwrap(),
        app_protocol: AppProtocol::Http1,
        agent_socket: "/run/themis/agent.sock".into(),
        outbound_config: r#"{"role":"outbound","mesh_root":"demo:11","workload":"w","canary":[]}"#
            .into(),
        inbound_config:
            r#"{"role":"inbound","mesh_root":"demo:11","workload":"w","policy":{"allow":[]}}"#
                .into(),
        filter_code: Some(FilterCode::Fetched {
            server: "127.0.0.1:8099".parse().unwrap(),
            path: "/themis_envoy.wasm".into(),
            sha256: "ab".repeat(32),
        }),
        calls: match runtime {
            Runtime::Wasm => vec![],
            Runtime::Native | Runtime::Tls => vec!["check".into()],
        },
        tcp: vec![],
        access_log: None,
        channel_too: false,
        rbac_principals: Vec::new(),
    }
}

/// The JSON configurations in a rendered bootstrap (single-quoted `value: '...'`).
fn configs(yaml: &str) -> Vec<Value> {
    yaml.split("value: '")
        .skip(1)
        .filter_map(|rest| serde_json::from_str(&rest[..rest.find('\'')?]).ok())
        .collect()
}

#[test]
fn both_templates_are_filled_whole_for_every_app_protocol() {
    for runtime in [Runtime::Wasm, Runtime::Native, Runtime::Tls] {
        for protocol in [AppProtocol::Http1, AppProtocol::Http2, AppProtocol::Tcp] {
            let mut sidecar = sidecar(runtime);
            sidecar.app_protocol = protocol;
            let yaml = sidecar.render().unwrap();
            assert_eq!(placeholder_in(&yaml), None, "{runtime:?} {protocol:?}");
            assert!(yaml.contains("127.0.0.12"), "{runtime:?}");
            assert_eq!(
                yaml.contains("upgrade_configs: [{upgrade_type: CONNECT, connect_config: {}}]"),
                protocol == AppProtocol::Tcp,
                "a CONNECT route to the app for a TCP app only"
            );
        }
    }
}

#[test]
fn the_agent_socket_is_quoted_whatever_its_path() {
    let mut odd = sidecar(Runtime::Wasm);
    odd.agent_socket = "/tmp/a}, b: {c/agent.sock".into();
    let yaml = odd.render().unwrap();
    assert!(
        yaml.contains(r#"{pipe: {path: "/tmp/a}, b: {c/agent.sock"}}"#),
        "{yaml}"
    );
}

#[test]
fn the_seal_role_is_the_outbound_one_without_routing_and_native_adds_its_socket() {
    let yaml = sidecar(Runtime::Wasm).render().unwrap();
    let seal = configs(&yaml)
        .into_iter()
        .find(|c| c["role"] == "seal")
        .unwrap();
    assert_eq!(seal["workload"], "w");
    assert!(seal.get("canary").is_none(), "{seal}");

    let yaml = sidecar(Runtime::Native).render().unwrap();
    let all = configs(&yaml);
    let seals: Vec<&Value> = all.iter().filter(|c| c["role"] == "seal").collect();
    assert_eq!(
        seals.len(),
        2,
        "an HTTP/2 and an HTTP/1.1 cluster per called service"
    );
    for seal in &seals {
        assert_eq!(seal["peer_service"], "check");
        assert_eq!(seal["agent_socket"], "/run/themis/agent.sock");
        assert!(seal.get("canary").is_none());
    }
    assert_eq!(
        seals.iter().filter(|s| s["carries"] == "http/1.1").count(),
        1
    );
    let inbound = all.iter().find(|c| c["role"] == "inbound").unwrap();
    assert_eq!(inbound["takes_http1"], true);
    assert!(yaml.contains("name: themis_to_check_http1"));
}

#[test]
fn what_the_runtime_needs_is_asked_for_by_name() {
    let mut wasm = sidecar(Runtime::Wasm);
    wasm.filter_code = None;
    assert_eq!(wasm.render(), Err(RenderError::NoFilterCode));
    let mut wasm = sidecar(Runtime::Wasm);
    wasm.calls = vec!["check".into()];
    assert_eq!(wasm.render(), Err(RenderError::CallsNeedNative));
}

#[test]
fn nothing_given_can_rewrite_the_yaml_around_it() {
    for runtime in [Runtime::Wasm, Runtime::Native] {
        let mut quoted = sidecar(runtime);
        quoted.inbound_config =
            r#"{"role":"inbound","policy":{"allow":[{"service":"a' } evil"}]}}"#.into();
        assert!(
            matches!(quoted.render(), Err(RenderError::SingleQuote(_))),
            "{runtime:?}"
        );
    }
    let mut named = sidecar(Runtime::Native);
    named.calls = vec!["check}, {name: evil".into()];
    assert!(matches!(named.render(), Err(RenderError::BadName(_))));
    let mut tcp = sidecar(Runtime::Native);
    tcp.tcp = vec![("".into(), "127.0.0.12:6380".parse().unwrap())];
    assert!(matches!(tcp.render(), Err(RenderError::BadName(_))));
}

#[test]
fn a_broken_configuration_stays_as_given_for_the_filter_to_refuse() {
    let mut broken = sidecar(Runtime::Wasm);
    broken.outbound_config = "{not json".into();
    let yaml = broken.render().unwrap();
    assert_eq!(yaml.matches("{not json").count(), 2, "outbound and seal");
}

#[test]
fn tcp_services_get_a_listener_and_a_sealing_cluster_and_the_access_log_one_place() {
    let mut with_tcp = sidecar(Runtime::Native);
    with_tcp.tcp = vec![("redis".into(), "127.0.0.12:6380".parse().unwrap())];
    with_tcp.access_log = Some("/tmp/out.log".into());
    let yaml = with_tcp.render().unwrap();
    assert!(yaml.contains("name: themis_tcp_redis"));
    assert!(yaml.contains(r#"tunneling_config: {hostname: "redis:6380"}"#));
    assert!(yaml.contains("name: themis_to_redis\n"));
    assert!(yaml.contains("name: themis_outbound_self"));
    assert_eq!(yaml.matches("path: \"/tmp/out.log\"").count(), 1);
    let unmarked = with_tcp.render_template("static_resources: {}\n");
    assert_eq!(unmarked, Err(RenderError::NoAccessLogMark));
}

#[test]
fn an_unpinned_module_is_a_local_file_and_no_module_cluster() {
    let mut local = sidecar(Runtime::Wasm);
    local.filter_code = Some(FilterCode::Unpinned("/m/themis_envoy.wasm".into()));
    let yaml = local.render().unwrap();
    assert!(yaml.contains(r#"{local: {filename: "/m/themis_envoy.wasm"}}"#));
    assert!(!yaml.contains("name: themis_module"));
}

#[test]
fn a_template_with_a_placeholder_nothing_fills_is_refused() {
    let r = sidecar(Runtime::Wasm).render_template("a: ${SOMETHING_NEW}\n");
    assert_eq!(r, Err(RenderError::Unfilled("SOMETHING_NEW".into())));
}

#[test]
fn the_native_listener_closes_a_stalled_caller_at_the_configured_deadline() {
    let mut native = sidecar(Runtime::Native);
    let default = format!(
        "transport_socket_connect_timeout: {}s",
        themis_sidecar::config::DEFAULT_HANDSHAKE_TIMEOUT_SECS
    );
    assert!(native.render().unwrap().contains(&default));
    native.inbound_config =
        r#"{"role":"inbound","mesh_root":"demo:11","workload":"w","handshake_timeout_secs":3}"#
            .into();
    let yaml = native.render().unwrap();
    assert!(
        yaml.contains("transport_socket_connect_timeout: 3s"),
        "{yaml}"
    );
}

#[test]
fn the_tls_binding_says_tls_everywhere_and_needs_its_certificate() {
    let yaml = sidecar(Runtime::Tls).render().unwrap();
    let configs = configs(&yaml);
    assert_eq!(
        configs.len(),
        4,
        "outbound, inbound validator and peer filter, outbound validator"
    );
    for config in &configs {
        assert_eq!(config["transport"], "tls", "{config}");
        assert_eq!(config["agent_socket"], "/run/themis/agent.sock", "{config}");
    }
    // The outbound role keeps the called services resolved; one cluster for all.
    assert!(configs
        .iter()
        .any(|c| c["role"] == "outbound" && c["calls"] == serde_json::json!(["check"])));
    assert_eq!(yaml.matches("cluster: themis_tls").count(), 2, "{yaml}");
    // The certificate: the workload's, from the agent's SDS on its API socket.
    assert_eq!(yaml.matches(r#"- name: "w""#).count(), 2, "{yaml}");
    assert_eq!(
        yaml.matches("cluster_name: themis_sds}").count(),
        2,
        "{yaml}"
    );
    assert!(
        yaml.contains(r#"{pipe: {path: "/run/themis/agent.sock"}}"#),
        "{yaml}"
    );
    // Session resumption off on both sides (a resumed session skips the validator).
    assert!(yaml.contains("disable_stateless_session_resumption: true"));
    assert!(yaml.contains("disable_stateful_session_resumption: true"));
    assert!(yaml.contains("max_session_keys: 0"));
    let mut none = sidecar(Runtime::Tls);
    none.outbound_config = r#"{"role":"outbound","mesh_root":"demo:11"}"#.into();
    assert_eq!(none.render(), Err(RenderError::NoWorkload));
}

#[test]
fn the_tls_binding_with_the_channel_too_routes_by_the_picks_transport_and_takes_both() {
    let mut both = sidecar(Runtime::Tls);
    both.channel_too = true;
    let yaml = both.render().unwrap();
    assert_eq!(placeholder_in(&yaml), None);
    let configs = configs(&yaml);
    // The outbound role speaks both, TLS first; the sealing clusters and the
    // channel's inbound socket are the Themis channel's (no transport).
    let outbound: Vec<&Value> = configs.iter().filter(|c| c["role"] == "outbound").collect();
    assert_eq!(outbound.len(), 1, "{configs:?}");
    assert_eq!(outbound[0]["speaks"], serde_json::json!(["tls", "themis"]));
    let seals: Vec<&Value> = configs
        .iter()
        .filter(|c| c["role"] == "seal" && c["peer_service"] == "check")
        .collect();
    assert_eq!(seals.len(), 2, "h2 and http/1.1: {configs:?}");
    assert!(seals.iter().all(|c| c.get("transport").is_none()));
    let channel_inbound: Vec<&Value> = configs
        .iter()
        .filter(|c| c["role"] == "inbound" && c.get("transport").is_none())
        .collect();
    assert_eq!(channel_inbound.len(), 1, "{configs:?}");
    assert_eq!(channel_inbound[0]["takes_http1"], true);
    // The route follows the pick's transport: the channel's clusters, else TLS's.
    assert!(yaml.contains(r#"headers: [{name: x-themis-transport, string_match: {exact: "themis"}}]}, route: {cluster: themis_to_check, timeout: 0s}"#), "{yaml}");
    assert!(yaml.contains("route: {cluster: themis_tls"), "{yaml}");
    assert!(yaml.contains("- name: themis_to_check_http1"), "{yaml}");
    // Inbound: a ClientHello picks the TLS chain, anything else the channel's, with
    // the same connection manager.
    assert!(yaml.contains("envoy.filters.listener.tls_inspector"));
    assert!(yaml.contains("filter_chain_match: {transport_protocol: tls}"));
    assert!(yaml.contains("filter_chain_match: {transport_protocol: raw_buffer}"));
    assert_eq!(yaml.matches("&inbound_http").count(), 1);
    assert_eq!(yaml.matches("- *inbound_http").count(), 1);
    // TLS alone has none of it, and the Wasm or channel runtimes cannot be asked for it.
    let alone = sidecar(Runtime::Tls).render().unwrap();
    for part in [
        "tls_inspector",
        "themis_to_check",
        "raw_buffer",
        "*inbound_http",
    ] {
        assert!(!alone.contains(part), "{part}");
    }
    for runtime in [Runtime::Wasm, Runtime::Native] {
        let mut other = sidecar(runtime);
        other.channel_too = true;
        assert_eq!(other.render(), Err(RenderError::ChannelTooNeedsTls));
    }
}

#[test]
fn envoys_rbac_on_the_peers_uri_san_is_the_tls_bindings_and_goes_before_every_peer_filter() {
    let mut tls = sidecar(Runtime::Tls);
    tls.rbac_principals = vec![
        "spiffe://demo/svc/handler".into(),
        "spiffe://demo/svc/\"odd\" }, x: {".into(),
    ];
    let yaml = tls.render().unwrap();
    assert_eq!(
        yaml.matches("envoy.filters.network.rbac").count(),
        1,
        "{yaml}"
    );
    assert!(yaml.contains(
        "principals: [{authenticated: {principal_name: {exact: \"spiffe://demo/svc/handler\"}}}, {authenticated: {principal_name: {exact: \"spiffe://demo/svc/\\\"odd\\\" }, x: {\"}}}]"
    ), "{yaml}");
    let rbac = yaml.find("envoy.filters.network.rbac").unwrap();
    assert!(rbac < yaml.find("- name: themis.peer").unwrap());
    // With the channel too, its chain has the rule as well (where it refuses).
    tls.channel_too = true;
    let both = tls.render().unwrap();
    assert_eq!(both.matches("envoy.filters.network.rbac").count(), 2);
    for runtime in [Runtime::Wasm, Runtime::Native] {
        let mut other = sidecar(runtime);
        other.rbac_principals = vec!["spiffe://demo/svc/handler".into()];
        assert_eq!(other.render(), Err(RenderError::RbacNeedsTls));
    }
}
