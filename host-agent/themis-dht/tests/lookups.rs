//! Lookups in a simulated ring of 1000 nodes, before and after churn.

mod sim;

use std::time::Instant;

use sim::Sim;
use themis_dht::{Config, Event, OpId};

const N: usize = 1000;

/// Issues `count` lookups of random keys from random live nodes, all at once; returns
/// (node, op, key) for each.
fn issue_lookups(sim: &mut Sim, count: usize) -> Vec<(usize, OpId, themis_dht::Key)> {
    (0..count)
        .map(|_| {
            let (i, key) = (sim.random_live(), sim.random_key());
            let op = sim.op(i, |n, now| n.find(now, key)).expect("find");
            (i, op, key)
        })
        .collect()
}

#[test]
fn sim_1000_nodes_lookups_are_correct_and_short() {
    let wall = Instant::now();
    let mut sim = Sim::ring(1, N, Config::default(), (1, 10), 20);
    // Let every node go round its fingers a few times (about log2 N lookups a round).
    sim.run_for(30_000);

    let lookups = issue_lookups(&mut sim, 2000);
    let ops: Vec<_> = lookups.iter().map(|&(i, op, _)| (i, op)).collect();
    sim.wait_all(&ops, 60_000);

    let mut hops = Vec::new();
    for &(i, op, key) in &lookups {
        match sim.event(i, op).cloned() {
            Some(Event::Found { node, hops: h, .. }) => {
                let truth = sim.responsible(&key);
                assert_eq!(
                    node.addr, truth,
                    "lookup of {key:?} from node {i} found {} not {truth}",
                    node.addr
                );
                hops.push(h);
            }
            other => panic!("lookup of {key:?} from node {i}: {other:?}"),
        }
    }
    let mean = hops.iter().map(|&h| f64::from(h)).sum::<f64>() / hops.len() as f64;
    let max = *hops.iter().max().expect("lookups");
    let log2n = (N as f64).log2();
    eprintln!(
        "N = {N}: mean hops {mean:.2} (½·log2 N = {:.2}), max {max}; {} messages; {:.1} s wall",
        log2n / 2.0,
        sim.delivered,
        wall.elapsed().as_secs_f64()
    );
    // Chord (Stoica et al., §IV-C/§V-D): each finger hop at least halves the distance to
    // the key, so a path has O(log N) hops and about ½·log2 N on average. Our hop count is
    // the number of remote nodes asked, the paper's path length; the allowance of 1.5 covers
    // the step to the key's predecessor and sampling noise. The maximum is bounded by
    // log2 N plus a margin for the last, successor-list steps.
    assert!(
        mean <= log2n / 2.0 + 1.5,
        "mean hops {mean:.2} above ½·log2 N + 1.5 = {:.2}",
        log2n / 2.0 + 1.5
    );
    assert!(
        f64::from(max) <= 2.0 * log2n,
        "max hops {max} above 2·log2 N"
    );
}

#[test]
fn sim_1000_nodes_lookups_survive_churn() {
    let wall = Instant::now();
    let mut sim = Sim::ring(2, N, Config::default(), (1, 10), 20);
    sim.run_for(30_000);

    // Kill 10 % (never node 0, the bootstrap), then join 10 % new nodes through node 0.
    let mut killed = 0;
    while killed < N / 10 {
        let i = sim.random_live();
        if i != 0 {
            sim.kill(i);
            killed += 1;
        }
    }
    for _ in 0..N / 10 {
        let i = sim.add_node();
        sim.join(i, 0);
        sim.run_for(20);
    }
    let took = sim
        .converge(120_000)
        .unwrap_or_else(|e| panic!("after churn: {e}"));
    // No extra time for the fingers: many still point at dead nodes, so lookups meet
    // timeouts and must fall back to other candidates.

    // All at once, as in the quiet ring; then retries one by one for those that failed.
    let timeouts_before: u64 = sim.live().map(|i| sim.nodes[i].stats().timeouts).sum();
    let lookups = issue_lookups(&mut sim, 2000);
    let ops: Vec<_> = lookups.iter().map(|&(i, op, _)| (i, op)).collect();
    sim.wait_all(&ops, 60_000);
    let mut first_try = 0;
    let mut retries = 0;
    let mut hops = Vec::new();
    for (i, op, key) in lookups {
        let truth = sim.responsible(&key);
        let mut outcome = sim.event(i, op).cloned();
        let mut attempts = 1;
        loop {
            match outcome {
                Some(Event::Found { node, hops: h, .. }) if sim.alive[node.addr] => {
                    assert_eq!(
                        node.addr, truth,
                        "lookup of {key:?} from node {i} found {} not {truth}",
                        node.addr
                    );
                    hops.push(h);
                    break;
                }
                // A driver would retry when the lookup fails or names a node that turns
                // out to be dead.
                other => {
                    assert!(
                        attempts < 4,
                        "lookup of {key:?} from node {i} failed {attempts} times: {other:?}"
                    );
                    attempts += 1;
                    retries += 1;
                    let op = sim.op(i, |n, now| n.find(now, key)).expect("find");
                    outcome = Some(sim.wait(i, op, 60_000));
                }
            }
        }
        if attempts == 1 {
            first_try += 1;
        }
    }
    let timeouts: u64 = sim
        .live()
        .map(|i| sim.nodes[i].stats().timeouts)
        .sum::<u64>()
        - timeouts_before;
    let mean = hops.iter().map(|&h| f64::from(h)).sum::<f64>() / hops.len() as f64;
    let log2n = (sim.sorted().len() as f64).log2();
    eprintln!(
        "churn: ring exact again {took} ms after the last join; {first_try}/2000 right first time, \
         {retries} retries; mean hops {mean:.2} (½·log2 N = {:.2}), {timeouts} request timeouts \
         (dead peers) while they ran; {:.1} s wall",
        log2n / 2.0,
        wall.elapsed().as_secs_f64()
    );
    // A step to a dead finger counts as a hop, so allow one more than in a quiet ring.
    assert!(mean <= log2n / 2.0 + 2.5, "mean hops {mean:.2} after churn");
}
