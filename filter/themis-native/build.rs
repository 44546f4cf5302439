//! Links the module with `-z now`: every callback it declares is bound when Envoy
//! loads it, so an Envoy that lacks one refuses the module at start-up (dlopen's
//! "undefined symbol") instead of aborting on the first call of a missing callback,
//! which is what lazy binding would do. No callback reports Envoy's version; this is
//! how the module refuses an Envoy it cannot run on (`tests/faults.rs` checks it).
fn main() {
    println!("cargo:rustc-cdylib-link-arg=-Wl,-z,now");
}
