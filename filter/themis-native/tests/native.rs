//! The native runtime in the real Envoy (`.venv/bin/envoy`, 1.40) with two real
//! agents: node A (`handler`) and node B (`check`, the echo app), each sidecar on the
//! runtime a test names (`deploy/envoy/sidecar-native.yaml` or the Wasm one). The
//! module (`libthemis_native.so`, release) is built by the tests themselves.

use themis_testkit as support;

use support::app::seen_header;
use support::envoy::ALLOW_HANDLER;
use support::mesh::{Mesh, Runtime};
use support::require;

const PEER_ID: &str = "x-themis-peer-id";
const PEER_SERVICE: &str = "x-themis-peer-service";

/// `check` registered at Envoy B and resolved where A's runtime needs it.
fn mesh(a: Runtime, b: Runtime) -> Mesh {
    let mesh = Mesh::start_on(a, b, Some(ALLOW_HANDLER));
    mesh.register("check", "check", mesh.envoy_b.inbound);
    if a == Runtime::Native {
        mesh.envoy_a
            .wait_native_resolves("check", mesh.envoy_b.inbound);
    }
    if b == Runtime::Native {
        let handler_at = mesh.envoy_a.inbound;
        mesh.envoy_b.wait_native_resolves("handler", handler_at);
    }
    mesh
}

/// A call from `handler` to `check` by name: the body arrives whole, the callee's
/// app learns the caller from its sidecar only (a forged header is gone), the
/// caller learns who answered.
fn call_is_sealed_and_attributed(mesh: &Mesh) {
    let body = b"is 7 prime?";
    let r = mesh.call(
        "POST",
        "check",
        "/check?n=7",
        &[
            ("x-themis-peer-id", "forged"),
            ("content-type", "text/plain"),
        ],
        body,
    );
    assert_eq!(r.status, 200, "{r}\n{}", mesh.logs());
    let echo = r.json();
    assert_eq!(echo["body"], "is 7 prime?", "{echo}");
    assert_eq!(
        seen_header(&echo, PEER_ID),
        [mesh.handler_id.as_str()],
        "{echo}"
    );
    assert_eq!(seen_header(&echo, PEER_SERVICE), ["handler"], "{echo}");
    assert!(!echo["headers"].to_string().contains("forged"), "{echo}");
    assert_eq!(r.header(PEER_ID), Some(mesh.check_id.as_str()), "{r}");

    // 1 MiB each way, byte for byte.
    let big: Vec<u8> = (0..1 << 20)
        .map(|i: u32| b'a' + (i.wrapping_mul(2_654_435_761) >> 27) as u8 % 26)
        .collect();
    let r = mesh.call("POST", "check", "/big", &[], &big);
    assert_eq!(r.status, 200, "{r}\n{}", mesh.logs());
    let echo = r.json();
    assert_eq!(echo["body_len"], big.len());
    assert!(
        echo["body"].as_str() == Some(std::str::from_utf8(&big).unwrap()),
        "the body changed on the way"
    );
}

#[test]
fn native_sidecars_call_each_other() {
    if !require::filter_in_envoy("runs the native module in Envoy") {
        return;
    }
    call_is_sealed_and_attributed(&mesh(Runtime::Native, Runtime::Native));
}

#[test]
fn a_native_caller_reaches_a_wasm_callee() {
    if !require::filter_in_envoy("runs the native module in Envoy") {
        return;
    }
    call_is_sealed_and_attributed(&mesh(Runtime::Native, Runtime::Wasm));
}

#[test]
fn a_wasm_caller_reaches_a_native_callee() {
    if !require::filter_in_envoy("runs the native module in Envoy") {
        return;
    }
    call_is_sealed_and_attributed(&mesh(Runtime::Wasm, Runtime::Native));
}
