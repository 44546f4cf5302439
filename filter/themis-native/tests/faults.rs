//! A bug in the native module does not take Envoy down, and an Envoy the module
//! cannot run on does not load it (issue 39, item 4).
//!
//! The panics are forced in a build with the feature `fault-injection`
//! (`src/faults.rs`), which the test kit builds and loads only in a process that sets
//! `THEMIS_NATIVE_FAULTS` (this one); every other test, and every user, runs the
//! release module, which has no such code.

use std::ffi::CString;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use themis_testkit as support;

use support::build::{cargo_build, target_dir, NATIVE_FAULTS};
use support::envoy::ALLOW_HANDLER;
use support::mesh::{Mesh, Runtime};
use support::process::wait_until;
use support::require;

/// What a peer sends to make the armed `do_read` panic (`faults::TRIGGER`).
const TRIGGER: &[u8] = b"THEMIS-FORCE-A-PANIC";

/// A call from `handler` to `check` succeeds and is answered by `check`.
fn a_call_succeeds(mesh: &Mesh) {
    let r = mesh.call("GET", "check", "/", &[], b"");
    assert_eq!(r.status, 200, "{r}\n{}", mesh.logs());
    assert_eq!(
        r.header("x-themis-peer-id"),
        Some(mesh.check_id.as_str()),
        "{r}"
    );
}

/// Sends the trigger to `inbound` as a peer would, and reads what comes back until
/// the connection ends: nothing, since the hook that read it panicked.
fn forced_panic_closes(inbound: std::net::SocketAddr) -> Vec<u8> {
    let mut peer = TcpStream::connect(inbound).expect("connecting to the inbound listener");
    peer.set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    peer.write_all(TRIGGER).unwrap();
    let mut back = Vec::new();
    // An error is a reset: closed too. A timeout is not: the hook kept the connection.
    match peer.read_to_end(&mut back) {
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => {}
        Err(e) => panic!("the connection was not closed: {e}"),
    }
    back
}

#[test]
fn a_panic_in_a_hook_closes_its_connection_and_envoy_serves_the_next() {
    if !require::filter_in_envoy("runs the native module in Envoy") {
        return;
    }
    // Armed for this process's Envoys: every read that starts with the trigger, and
    // each runtime's thread once.
    std::env::set_var(NATIVE_FAULTS, "do_read,runtime");
    let mesh = Mesh::start_on(Runtime::Native, Runtime::Native, Some(ALLOW_HANDLER));
    mesh.register("check", "check", mesh.envoy_b.inbound);
    mesh.envoy_b
        .wait_native_resolves("handler", mesh.envoy_a.inbound);

    // Each runtime thread panicked on its first iteration and was started again (an
    // alarm: counted and logged), and the mesh works: a restarted thread got the
    // delegated key and the resolutions.
    for envoy in [&mesh.envoy_a, &mesh.envoy_b] {
        wait_until(
            "the runtime's restart counted",
            Duration::from_secs(30),
            || (envoy.themis_counter("seal.runtime_restarts") == 1).then_some(()),
        );
        let log = std::fs::read_to_string(envoy.log_path()).unwrap();
        assert!(log.contains("panicked (THEMIS_NATIVE_FAULTS"), "{log}");
        assert!(log.contains("restarting it"), "{log}");
    }
    a_call_succeeds(&mesh);

    // A panic in the inbound socket's read: that connection is closed and counted,
    // nothing reaches the app, and the same Envoy serves the next call — every time.
    let pid = mesh.envoy_b.pid();
    for forced in 1..=3 {
        let back = forced_panic_closes(mesh.envoy_b.inbound);
        assert!(back.is_empty(), "bytes came back: {back:?}");
        wait_until("the panic counted", Duration::from_secs(10), || {
            (mesh.envoy_b.themis_counter("inbound.refused.panicked") == forced).then_some(())
        });
        a_call_succeeds(&mesh);
    }
    assert_eq!(mesh.envoy_b.pid(), pid);
    assert!(
        std::path::Path::new(&format!("/proc/{pid}")).exists(),
        "Envoy B is gone\n{}",
        mesh.logs()
    );
    let log = std::fs::read_to_string(mesh.envoy_b.log_path()).unwrap();
    assert_eq!(
        log.matches("a panic in the hook do_read was caught")
            .count(),
        3,
        "{log}"
    );
}

/// The module is linked with `-z now`: a process that lacks one of the callbacks it
/// declares (anything but the Envoy it was built for: here, this test) cannot load it
/// even lazily, where lazy binding would load it and abort on the first call.
#[test]
fn the_module_refuses_to_load_where_a_callback_is_missing() {
    if !require::cargo_build("builds the native module") {
        return;
    }
    // The release module, the one users get (not this process's faults build).
    cargo_build(&["-p", "themis-native", "--release"]);
    let path = target_dir().join("release/libthemis_native.so");
    let c_path = CString::new(path.to_str().unwrap()).unwrap();
    // SAFETY: dlopen with a valid C string; a handle, if any, is closed at once.
    let handle = unsafe { libc::dlopen(c_path.as_ptr(), libc::RTLD_LAZY | libc::RTLD_LOCAL) };
    let error = match handle.is_null() {
        true => {
            // SAFETY: dlerror returns a C string owned by libc, or null.
            let text = unsafe { libc::dlerror() };
            assert!(!text.is_null(), "dlopen failed with no error");
            // SAFETY: non-null, NUL-terminated, read before any other dl call.
            unsafe { std::ffi::CStr::from_ptr(text) }
                .to_string_lossy()
                .into_owned()
        }
        false => {
            // SAFETY: the handle dlopen just returned.
            unsafe { libc::dlclose(handle) };
            panic!(
                "{} loaded in a process without Envoy's callbacks",
                path.display()
            );
        }
    };
    assert!(
        error.contains("undefined symbol: envoy_dynamic_module_callback_"),
        "{error}"
    );
}
