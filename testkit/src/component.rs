//! The component embedded with the `wasmtime` crate through its WIT interface, shared
//! by themis-component's interoperability tests (`tests/host.rs`) and its
//! Wasm-against-native benchmark (`benches/wasm_vs_native.rs`). Feature `component`.
//!
//! The host bindings are generated from `wit/themis.wit` at compile time and the guest's
//! from the same file; instantiation type-checks the built component against the WIT.
//! The component is built by [`crate::build::component_wasm`] (which needs
//! [`crate::require::cargo_build`]).

use std::sync::OnceLock;

use ring::rand::SystemRandom;
use themis_core::{Identity, MeshName};
use wasmtime::component::{Component, Linker, ResourceAny, ResourceTable};
use wasmtime::{Engine, Store};
use wasmtime_wasi::{WasiCtx, WasiCtxView, WasiView};

use crate::build::component_wasm;

wasmtime::component::bindgen!({ path: "../wit", world: "themis" });

/// The host's state: WASI (the component takes its randomness from `wasi:random`).
pub struct Host {
    ctx: WasiCtx,
    table: ResourceTable,
}

impl WasiView for Host {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        WasiCtxView {
            ctx: &mut self.ctx,
            table: &mut self.table,
        }
    }
}

/// Builds the component (release, wasm32-wasip2) and compiles it with a default
/// `Engine`, once per process: Cranelift, built unoptimised in test builds, took
/// about 40 s a compile here, and every test of a binary paid it again.
fn compiled() -> (Engine, Component) {
    static COMPILED: OnceLock<(Engine, Component)> = OnceLock::new();
    COMPILED
        .get_or_init(|| {
            let engine = Engine::default();
            let component = Component::from_file(&engine, component_wasm()).unwrap();
            (engine, component)
        })
        .clone()
}

/// The component (compiled once per process) instantiated in a new store.
pub fn instantiate() -> (Store<Host>, Themis, Engine, Component) {
    let (engine, component) = compiled();
    let mut linker = Linker::new(&engine);
    wasmtime_wasi::p2::add_to_linker_sync(&mut linker).unwrap();
    let host = Host {
        ctx: WasiCtx::builder().build(),
        table: ResourceTable::new(),
    };
    let mut store = Store::new(&engine, host);
    let themis = Themis::instantiate(&mut store, &component, &linker).unwrap();
    (store, themis, engine, component)
}

/// A new identity made by the component in mesh "demo": its handle and its id.
pub fn component_identity(store: &mut Store<Host>, themis: &Themis) -> (ResourceAny, [u8; 32]) {
    let identity = themis.themis_mesh_identities().identity();
    let handle = identity
        .call_generate(&mut *store, "demo")
        .unwrap()
        .unwrap();
    let id = identity.call_id(&mut *store, handle).unwrap();
    (handle, id.try_into().unwrap())
}

/// A new identity made by the native core in `mesh`.
pub fn native(mesh: &str) -> Identity {
    Identity::generate(MeshName::new(mesh).unwrap(), &SystemRandom::new()).unwrap()
}
