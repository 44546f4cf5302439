//! The in-place record path allocates nothing: `seal_in_place` + `open_in_place` of
//! every record size, counted by a global allocator that counts per thread (the
//! harness's other threads allocate as they like). The table of every operation's
//! allocations is the benchmark `alloc_count` (`benchmarks/RESULTS.md`); this is the
//! claim, as a test.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::hint::black_box;

use ring::rand::SystemRandom;
use themis_benchmarks::themis::{seal_open_in_place, Peers};
use themis_benchmarks::{size_label, RECORD_SIZES};
use themis_core::wire::RECORD_OVERHEAD;
use themis_core::HandshakeConfig;

thread_local! {
    // Const-initialised: reading it never allocates.
    static ALLOCATIONS: Cell<u64> = const { Cell::new(0) };
}

/// `System`, counting this thread's allocations (`alloc`, `alloc_zeroed`, `realloc`).
struct Counting;

fn counted() {
    // `try_with`: a thread being torn down has no counter left, and is not ours.
    let _ = ALLOCATIONS.try_with(|n| n.set(n.get() + 1));
}

// SAFETY: every call is forwarded unchanged to `System`; only a counter is added.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        counted();
        unsafe { System.alloc(layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        counted();
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        counted();
        unsafe { System.realloc(ptr, layout, new_size) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

fn allocations() -> u64 {
    ALLOCATIONS.with(Cell::get)
}

#[test]
fn the_in_place_record_path_allocates_nothing() {
    let rng = SystemRandom::new();
    let peers = Peers::generate(&rng);
    let (mut sender, mut receiver) = peers.sessions(&HandshakeConfig::default(), &rng);
    for size in RECORD_SIZES {
        let mut record = vec![0u8; size + RECORD_OVERHEAD];
        // Warm up (first use may size a buffer), then count.
        black_box(seal_open_in_place(&mut sender, &mut receiver, &mut record));
        let before = allocations();
        for _ in 0..200 {
            black_box(seal_open_in_place(&mut sender, &mut receiver, &mut record));
        }
        let made = allocations() - before;
        assert_eq!(
            made,
            0,
            "{}: {made} allocations in 200 records",
            size_label(size)
        );
    }
}

/// The control: the counter sees an allocation on this thread, so a zero above is
/// a measurement, not a counter that never counts.
#[test]
fn the_counter_counts() {
    let before = allocations();
    black_box(vec![0u8; 4096]);
    let payload = vec![0u8; 1024];
    let rng = SystemRandom::new();
    let peers = Peers::generate(&rng);
    let (mut sender, _) = peers.sessions(&HandshakeConfig::default(), &rng);
    black_box(sender.seal(&payload, None).expect("seal"));
    assert!(allocations() - before >= 2);
}
