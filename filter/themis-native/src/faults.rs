//! Faults a test forces, to show that a bug in the module does not take Envoy down
//! (`tests/faults.rs`). Only in a build with the feature `fault-injection`: the
//! module users get (`cargo build -p themis-native --release`) has none of this.
//!
//! `THEMIS_NATIVE_FAULTS` (Envoy's environment) lists the points armed, comma
//! separated: `do_read` (a transport socket's read panics whenever the peer's bytes
//! start with [`TRIGGER`]) and `runtime` (the runtime's thread panics once per
//! process, on its first iteration).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::OnceLock;

/// What a peer sends to make an armed `do_read` panic.
pub const TRIGGER: &[u8] = b"THEMIS-FORCE-A-PANIC";

/// Where a fault can be forced.
#[derive(Clone, Copy)]
pub enum Point<'a> {
    /// A transport socket's read, with the bytes it read.
    DoRead(&'a [u8]),
    /// An iteration of the runtime's thread.
    Runtime,
}

fn armed(name: &str) -> bool {
    static LISTED: OnceLock<String> = OnceLock::new();
    let listed = LISTED.get_or_init(|| std::env::var("THEMIS_NATIVE_FAULTS").unwrap_or_default());
    listed.split(',').any(|point| point.trim() == name)
}

/// Panics if `point` is armed (and, for a read, its bytes ask for it).
pub fn maybe_panic(point: Point<'_>) {
    static RUNTIME_FIRED: AtomicBool = AtomicBool::new(false);
    let (name, fire) = match point {
        Point::DoRead(bytes) => ("do_read", armed("do_read") && bytes.starts_with(TRIGGER)),
        Point::Runtime => (
            "runtime",
            armed("runtime") && !RUNTIME_FIRED.swap(true, Ordering::Relaxed),
        ),
    };
    if fire {
        panic!("THEMIS_NATIVE_FAULTS: a forced panic at {name}");
    }
}
