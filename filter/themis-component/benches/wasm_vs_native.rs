//! The protocol core as a Wasm component under `wasmtime` against the native core,
//! side by side in one run.
//!
//! * `wasm_vs_native_handshake`: a full handshake, both sides in the same engine —
//!   initiator start, responder respond, initiator reads the reply, responder reads the
//!   confirmation. `native`: `themis-core` called directly. `component`: the same four
//!   steps through the WIT resources (`initiator.start`, `responder.respond`,
//!   `initiator.finish`, `responder.finish`) of one instance, and the two session
//!   handles dropped again (native drops its sessions too).
//! * `wasm_vs_native_seal_open`: one record sealed by one session and opened by its
//!   peer, 1 KiB and 64 KiB payloads. `native`: `Session::seal` (one allocation, one copy
//!   of the payload) and `Session::open_in_place`. `component`: `session.seal` and
//!   `session.open` through the WIT, which **includes copying across the Wasm boundary**:
//!   the payload into the guest, the record out, the record back in, and the opened
//!   payload out again (plus the guest's own copy of it into the returned list).
//!   `component_copy_in_only` isolates one of those copies: one call of
//!   `channel.frame-length` with a whole sealed record, which lowers the record's bytes
//!   into the guest's memory and reads only its 30-byte header there.
//!
//! Suites: the component prefers ChaCha20-Poly1305 (no AES instructions in Wasm), so
//! two components agree on it; `native` uses the same suite, so the ratio is the cost
//! of Wasm and not of a different cipher. `native_aes256gcm` (the native default on
//! x86_64) is there for the deployment comparison: what a native agent would use.
//!
//! The component is the release build for `wasm32-wasip2` (built by themis-testkit,
//! once per process, into `$CARGO_TARGET_DIR`) under a default `wasmtime::Engine`
//! (Cranelift); compilation and instantiation happen before any measurement.

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use ring::rand::SystemRandom;
use themis_core::handshake::{self, Initiator};
use themis_core::{HandshakeConfig, HelloGuard, Identity, PeerId, Session, Suite};
use wasmtime::component::ResourceAny;
use wasmtime::Store;

use themis_testkit::component::{component_identity, instantiate, native, Host, Themis};

/// Payload sizes of the record benchmark: 1 KiB and 64 KiB.
const SIZES: [(usize, &str); 2] = [(1024, "1KiB"), (64 * 1024, "64KiB")];

/// The wall clock, Unix milliseconds (message 1's timestamp).
fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// Native configuration with one suite only.
fn native_config(suite: Suite) -> HandshakeConfig {
    HandshakeConfig {
        suites: suite.only(),
        ..HandshakeConfig::default()
    }
}

/// A full native handshake, both sides: (initiator's session, responder's session).
fn native_handshake(
    alice: &Identity,
    bob: &Identity,
    config: &HandshakeConfig,
    rng: &SystemRandom,
) -> (Session, Session) {
    let now = now_ms();
    let (waiting, hello) = Initiator::start(alice, bob.id(), config, now, rng).unwrap();
    let (pending, reply) =
        handshake::respond(bob, &hello, config, &mut HelloGuard::default(), now, rng).unwrap();
    let (alice_session, confirm) = waiting.read_hello_reply(&reply).unwrap();
    let bob_session = pending.read_confirm(&confirm).unwrap();
    (alice_session, bob_session)
}

/// Two identities inside the component and the instance's entry points.
struct Components {
    store: Store<Host>,
    themis: Themis,
    alice: ResourceAny,
    bob: ResourceAny,
    bob_id: [u8; 32],
}

impl Components {
    fn new() -> Self {
        let (mut store, themis, _, _) = instantiate();
        let (alice, _) = component_identity(&mut store, &themis);
        let (bob, bob_id) = component_identity(&mut store, &themis);
        Components {
            store,
            themis,
            alice,
            bob,
            bob_id,
        }
    }

    /// A full handshake, both sides in the component: (alice's session, bob's session).
    fn handshake(&mut self) -> (ResourceAny, ResourceAny) {
        let ka = self.themis.themis_mesh_key_agreement();
        let store = &mut self.store;
        let (waiting, hello) = ka
            .initiator()
            .call_start(&mut *store, self.alice, &self.bob_id)
            .unwrap()
            .unwrap();
        let (pending, reply) = ka
            .responder()
            .call_respond(&mut *store, self.bob, &hello)
            .unwrap()
            .unwrap();
        let (alice_session, confirm) = ka
            .initiator()
            .call_finish(&mut *store, waiting, &reply)
            .unwrap()
            .unwrap();
        let bob_session = ka
            .responder()
            .call_finish(&mut *store, pending, &confirm)
            .unwrap()
            .unwrap();
        (alice_session, bob_session)
    }

    /// One record from `sender` to `receiver`; the payload's length.
    fn seal_open(&mut self, sender: ResourceAny, receiver: ResourceAny, payload: &[u8]) -> usize {
        let session = self.themis.themis_mesh_channel().session();
        let (_, record) = session
            .call_seal(&mut self.store, sender, payload, None)
            .unwrap()
            .unwrap();
        let opened = session
            .call_open(&mut self.store, receiver, &record)
            .unwrap()
            .unwrap();
        opened.payload.len()
    }

    /// `channel.frame-length` of `buffer`: copies it into the guest, decodes a header.
    fn frame_length(&mut self, buffer: &[u8]) -> Option<u32> {
        self.themis
            .themis_mesh_channel()
            .call_frame_length(&mut self.store, buffer)
            .unwrap()
            .unwrap()
    }

    fn drop_session(&mut self, session: ResourceAny) {
        session.resource_drop(&mut self.store).unwrap();
    }
}

/// Checks, before measuring, that both sides do what the benchmark claims: the
/// component speaks to the native core, and prefers ChaCha20-Poly1305.
fn check(components: &mut Components, rng: &SystemRandom) {
    let ka = components.themis.themis_mesh_key_agreement();
    let session = components.themis.themis_mesh_channel().session();
    let store = &mut components.store;
    // A native initiator offering both suites (AES first); the component responds and
    // picks by its own preference.
    let alice = native("demo");
    let (waiting, hello) = Initiator::start(
        &alice,
        PeerId(components.bob_id),
        &HandshakeConfig::default(),
        now_ms(),
        rng,
    )
    .unwrap();
    let (pending, reply) = ka
        .responder()
        .call_respond(&mut *store, components.bob, &hello)
        .unwrap()
        .unwrap();
    let (mut alice_session, confirm) = waiting.read_hello_reply(&reply).unwrap();
    let bob_session = ka
        .responder()
        .call_finish(&mut *store, pending, &confirm)
        .unwrap()
        .unwrap();
    assert_eq!(alice_session.info().suite, Suite::ChaCha20Poly1305);
    let (_, record) = alice_session.seal(b"ping", None).unwrap();
    let opened = session
        .call_open(&mut *store, bob_session, &record)
        .unwrap()
        .unwrap();
    assert_eq!(opened.payload, b"ping");
    bob_session.resource_drop(&mut *store).unwrap();

    assert_eq!(
        components.frame_length(&record),
        Some(record.len().try_into().unwrap())
    );

    // Both sides in the component.
    let (a, b) = components.handshake();
    assert_eq!(components.seal_open(a, b, &[7; 1024]), 1024);
    components.drop_session(a);
    components.drop_session(b);
}

fn handshake_group(c: &mut Criterion) {
    let rng = SystemRandom::new();
    let (alice, bob) = (native("demo"), native("demo"));
    let chacha = native_config(Suite::ChaCha20Poly1305);
    let aes = native_config(Suite::Aes256Gcm);
    let mut components = Components::new();
    check(&mut components, &rng);

    let mut group = c.benchmark_group("wasm_vs_native_handshake");
    group.bench_function("native", |b| {
        b.iter(|| black_box(native_handshake(&alice, &bob, &chacha, &rng)))
    });
    group.bench_function("component", |b| {
        b.iter(|| {
            let (a, s) = components.handshake();
            components.drop_session(black_box(a));
            components.drop_session(black_box(s));
        })
    });
    group.bench_function("native_aes256gcm", |b| {
        b.iter(|| black_box(native_handshake(&alice, &bob, &aes, &rng)))
    });
    group.finish();
}

fn seal_open_group(c: &mut Criterion) {
    let rng = SystemRandom::new();
    let (alice, bob) = (native("demo"), native("demo"));
    let mut components = Components::new();

    let mut group = c.benchmark_group("wasm_vs_native_seal_open");
    for (size, label) in SIZES {
        group.throughput(Throughput::Bytes(size as u64));
        let payload = vec![0x5au8; size];

        let native_bench = |group: &mut criterion::BenchmarkGroup<_>, name, suite| {
            let (mut sender, mut receiver) =
                native_handshake(&alice, &bob, &native_config(suite), &rng);
            assert_eq!(sender.info().suite, suite);
            group.bench_function(BenchmarkId::new(name, label), |b| {
                b.iter(|| {
                    let (_, mut record) = sender.seal(&payload, None).unwrap();
                    let opened = receiver.open_in_place(&mut record).unwrap();
                    black_box(opened.payload.len())
                })
            });
        };

        native_bench(&mut group, "native", Suite::ChaCha20Poly1305);
        let (sender, receiver) = components.handshake();
        group.bench_function(BenchmarkId::new("component", label), |b| {
            b.iter(|| black_box(components.seal_open(sender, receiver, &payload)))
        });
        components.drop_session(sender);
        components.drop_session(receiver);
        native_bench(&mut group, "native_aes256gcm", Suite::Aes256Gcm);

        let (mut sender, _) = native_handshake(&alice, &bob, &HandshakeConfig::default(), &rng);
        let (_, record) = sender.seal(&payload, None).unwrap();
        group.bench_function(BenchmarkId::new("component_copy_in_only", label), |b| {
            b.iter(|| black_box(components.frame_length(&record)))
        });
    }
    group.finish();
}

criterion_group!(benches, handshake_group, seal_open_group);
criterion_main!(benches);
