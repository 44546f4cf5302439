//! The sidecar's secure defaults (issue 21), each as the attack it stops, with the
//! real Envoy and real `themis` agents:
//!
//! * a sidecar with no `policy` refuses every caller; admitting any member of the
//!   mesh takes `"allow_any_caller": true`, which is warned about and shown in stats.

use themis_testkit as support;

use std::time::{Duration, Instant};

use support::envoy::Envoy;
use support::mesh::Mesh;
use support::require;

/// How long a counter gets to show what just happened.
const COUNT_LIMIT: Duration = Duration::from_secs(10);

/// Waits (bounded) until `envoy`'s stat `name` reaches `at_least`.
fn wait_stat(envoy: &Envoy, name: &str, at_least: u64, what: &str) {
    let deadline = Instant::now() + COUNT_LIMIT;
    loop {
        let value = envoy.stats().get(name).copied().unwrap_or(0);
        if value >= at_least {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{what}: {name} is {value}, not {at_least}\n{}",
            envoy.log_tail(40)
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Issue 21 (4): an authenticated member of the mesh calls a sidecar that has no
/// policy. It must be refused (fail closed), counted and logged; admitting anyone is
/// an explicit, visible choice.
#[test]
fn a_sidecar_without_a_policy_refuses_every_caller() {
    if !require::filter_in_envoy("runs the filter") {
        return;
    }
    let mesh = Mesh::start(None);
    mesh.register("check", "check", mesh.envoy_b.inbound);
    let r = mesh.call("GET", "check", "/no-policy", &[], b"");
    assert_eq!(
        r.status,
        503,
        "a sidecar without a policy let an authenticated caller through: {r}\n{}",
        mesh.logs()
    );
    wait_stat(
        &mesh.envoy_b,
        "wasmcustom.themis.inbound.refused.no_policy",
        1,
        "the call to a sidecar without a policy",
    );
    assert_eq!(mesh.app.count(), 0, "a refused request reached the app");
    let log = mesh.envoy_b.log_tail(2000);
    assert!(
        log.contains("closing the connection (no_policy)")
            && log.contains("no policy: deny by default"),
        "the refusal is logged with its reason:\n{log}"
    );

    // The permissive choice, said out loud: a warning at start and a gauge.
    let open = mesh.start_envoy_b("envoy-b-any", Some(r#"{"allow_any_caller":true}"#));
    open.wait_identity();
    let log = open.log_tail(2000);
    assert!(
        log.contains("policy allow_any_caller: EVERY authenticated member of mesh"),
        "no warning about allow_any_caller:\n{log}"
    );
    assert!(open.stat("wasmcustom.themis.inbound.allow_any_caller") >= 1);
    mesh.register("check-any", "check", open.inbound);
    let r = mesh.call("GET", "check-any", "/any", &[], b"");
    assert_eq!(r.status, 200, "{r}\n{}", open.log_tail(30));
    assert_eq!(mesh.app.count(), 1);
}
