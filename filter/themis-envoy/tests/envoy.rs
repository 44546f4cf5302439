//! End-to-end tests of the filter in the real Envoy (`.venv/bin/envoy`, installed by
//! `scripts/setup.sh`), configured by rendering `deploy/envoy/sidecar.yaml`, with two
//! real `themis` agents in a DHT:
//!
//! * node A (127.0.0.31): agent A, Envoy A; workload `handler`;
//! * node B (127.0.0.32): agent B, Envoy B and an echo app; workload `check`.
//!
//! `handler`'s app calls `http://check/...` on Envoy A's outbound listener; Envoy A
//! resolves `check` through agent A, runs the handshake with the instance's id and
//! sends the request sealed to Envoy B's inbound listener, which opens it and calls
//! the app. The filter (release, wasm32-wasip1) and the `themis` binary are built by
//! the tests themselves, into `CARGO_TARGET_DIR`.

mod support;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use support::app::seen_header;
use support::envoy::{inbound_config, outbound_config, AppProtocol, Envoy, Sidecar};
use support::http;
use support::mesh::{
    closed_port, random_hex, tempdir, Mesh, IP_A, IP_B, IP_DEAD, IP_EVIL, IP_MITM,
};
use support::process::{on_path, wait_until, Process};

use support::agent_harness::MESH;
/// The headers the inbound sidecar sets from the connection's filter state.
mod header {
    pub const PEER_ID: &str = "x-themis-peer-id";
    pub const PEER_SERVICE: &str = "x-themis-peer-service";
}

fn stat_inbound(envoy: &Envoy, name: &str) -> u64 {
    envoy.stat(&format!("wasmcustom.themis.inbound.{name}"))
}

fn stat_outbound(envoy: &Envoy, name: &str) -> u64 {
    envoy.stat(&format!("wasmcustom.themis.outbound.{name}"))
}

/// A body that is not a repetition of a short pattern (so a reordering shows).
fn varied_body(len: usize) -> Vec<u8> {
    let mut x: u32 = 0x1234_5678;
    (0..len)
        .map(|_| {
            x = x.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
            b'a' + (x >> 24) as u8 % 26
        })
        .collect()
}

#[test]
fn handler_calls_check_by_name() {
    let mesh = Mesh::standard();
    let body = b"is 7 prime?";
    let r = mesh.call(
        "POST",
        "check",
        "/check?n=7",
        &[
            ("x-custom", "custom-value-1"),
            ("x-themis-peer-id", "forged"),
            ("content-type", "text/plain"),
        ],
        body,
    );
    assert_eq!(r.status, 200, "{r}\n{}", mesh.logs());
    let echo = r.json();
    assert_eq!(echo["method"], "POST", "{echo}");
    assert_eq!(echo["path"], "/check?n=7", "{echo}");
    assert_eq!(echo["body"], "is 7 prime?", "{echo}");
    assert_eq!(seen_header(&echo, "x-custom"), ["custom-value-1"], "{echo}");
    assert_eq!(seen_header(&echo, "content-type"), ["text/plain"], "{echo}");
    // The app learns who called, from the filter only: the forged value is gone.
    assert_eq!(
        seen_header(&echo, header::PEER_ID),
        [mesh.handler_id.as_str()],
        "{echo}"
    );
    assert_eq!(
        seen_header(&echo, header::PEER_SERVICE),
        ["handler"],
        "{echo}"
    );
    assert!(
        !echo["headers"].to_string().contains("forged"),
        "the forged peer id reached the app: {echo}"
    );
    // The caller learns who answered.
    assert_eq!(
        r.header(header::PEER_ID),
        Some(mesh.check_id.as_str()),
        "{r}"
    );
    assert_eq!(r.header(header::PEER_SERVICE), Some("check"), "{r}");
    assert_eq!(
        r.header("x-app"),
        Some("echo"),
        "the app's headers come back: {r}"
    );
    assert_eq!(mesh.app.count(), 1);

    // 64 KiB each way.
    let big = varied_body(64 * 1024);
    let r = mesh.call("POST", "check", "/big", &[], &big);
    assert_eq!(r.status, 200, "{r}\n{}", mesh.logs());
    let echo = r.json();
    assert_eq!(echo["body_len"], big.len(), "{}", r.text().len());
    assert!(
        echo["body"].as_str() == Some(std::str::from_utf8(&big).unwrap()),
        "the 64 KiB body changed on the way"
    );
    assert_eq!(mesh.app.count(), 2);
    // One connection carried both calls: one key agreement.
    assert_eq!(mesh.envoy_a.stat("wasmcustom.themis.seal.handshakes"), 1);
    assert_eq!(stat_inbound(&mesh.envoy_b, "allowed"), 1);
}
