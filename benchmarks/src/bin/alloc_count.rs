//! Counts heap allocations per operation with a counting global allocator, prints a
//! table, and exits non-zero if the in-place record path allocates at all.
//!
//! `cargo run --release -p themis-benchmarks --bin alloc_count`

use std::alloc::{GlobalAlloc, Layout, System};
use std::hint::black_box;
use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use ring::rand::SystemRandom;
use themis_benchmarks::noise::NoisePeers;
use themis_benchmarks::themis::{seal_open_in_place, Peers};
use themis_benchmarks::tls::Tls;
use themis_benchmarks::{size_label, RECORD_SIZES};
use themis_core::wire::RECORD_OVERHEAD;
use themis_core::HandshakeConfig;

/// `System`, counting every allocation (`alloc`, `alloc_zeroed`, `realloc`) and its bytes.
struct Counting;

static CALLS: AtomicU64 = AtomicU64::new(0);
static BYTES: AtomicU64 = AtomicU64::new(0);

fn record(size: usize) {
    CALLS.fetch_add(1, Relaxed);
    BYTES.fetch_add(size as u64, Relaxed);
}

// SAFETY: every call is forwarded unchanged to `System`; only counters are added.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        record(layout.size());
        unsafe { System.alloc(layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        record(layout.size());
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        record(new_size);
        unsafe { System.realloc(ptr, layout, new_size) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// Runs `op` once to warm up, then `runs` times; returns (allocations, bytes) per run.
fn per_run(runs: u64, mut op: impl FnMut()) -> (f64, f64) {
    op();
    let (calls, bytes) = (CALLS.load(Relaxed), BYTES.load(Relaxed));
    (0..runs).for_each(|_| op());
    let per = |now: u64, before: u64| (now - before) as f64 / runs as f64;
    (
        per(CALLS.load(Relaxed), calls),
        per(BYTES.load(Relaxed), bytes),
    )
}

fn main() -> ExitCode {
    let rng = SystemRandom::new();
    let peers = Peers::generate(&rng);
    let config = HandshakeConfig::default();
    let (mut sender, mut receiver) = peers.sessions(&config, &rng);
    let mut in_place_allocations = 0.0;

    println!("| operation | allocations / op | bytes allocated / op |");
    println!("|---|---:|---:|");
    let row = |name: String, (calls, bytes): (f64, f64)| {
        println!("| {name} | {calls:.2} | {bytes:.0} |");
    };
    for size in RECORD_SIZES {
        let mut record = vec![0u8; size + RECORD_OVERHEAD];
        let counts = per_run(1000, || {
            black_box(seal_open_in_place(&mut sender, &mut receiver, &mut record));
        });
        in_place_allocations += counts.0;
        row(
            format!(
                "themis `seal_in_place` + `open_in_place`, {}",
                size_label(size)
            ),
            counts,
        );
    }
    for size in [RECORD_SIZES[0], RECORD_SIZES[3]] {
        let payload = vec![0u8; size];
        let counts = per_run(1000, || {
            let (_, mut sealed) = sender.seal(&payload, None).expect("seal");
            black_box(
                receiver
                    .open_in_place(&mut sealed)
                    .expect("open")
                    .payload
                    .len(),
            );
        });
        row(
            format!(
                "themis `Session::seal` + `open_in_place`, {}",
                size_label(size)
            ),
            counts,
        );
    }
    row(
        "themis full handshake (both sides)".into(),
        per_run(100, || {
            black_box(peers.handshake(&config, &rng));
        }),
    );
    let tls = Tls::new();
    row(
        "rustls TLS 1.3 mTLS full handshake (both sides)".into(),
        per_run(100, || {
            black_box(tls.connected());
        }),
    );
    let noise = NoisePeers::generate();
    row(
        "snow Noise XX full handshake (both sides)".into(),
        per_run(100, || {
            black_box(noise.handshake());
        }),
    );

    if in_place_allocations > 0.0 {
        eprintln!("FAIL: the in-place record path allocates");
        return ExitCode::FAILURE;
    }
    println!("\nOK: the in-place record path allocates nothing");
    ExitCode::SUCCESS
}
