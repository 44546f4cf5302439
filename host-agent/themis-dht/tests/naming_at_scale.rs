//! Secure naming at scale: 10,000 nodes, a fifth of them adversaries, services stored
//! with k = 4 by honest owners, resolved from random honest nodes.
//!
//! * The ring is built converged from ground truth (`Sim::converged`: every node gets
//!   its true predecessor, successor list and fingers) rather than by 10,000 joins;
//!   it stays static during the measurement, so maintenance is switched off (periods
//!   of an hour).
//! * Adversaries sit at random positions: node ids are `SHA-256(public key ‖ mesh)`
//!   and the operator generates the keys at admission, so nobody can grind an id next
//!   to a name. They are a random fifth of the nodes.
//! * Every adversary refuses `Store`s (and keeps what it sees), answers `Get` by
//!   withholding, with junk (forged records: they lack the endorsement keys), or by
//!   replaying the old versions it kept, and answers `FindStep` with one of the lies the
//!   eclipse defence detects (no progress, backwards, a responsible node before the
//!   key, itself as a ring of one).
//! * Values are endorsed records (`sim::records`): every replica holder verifies them
//!   (its `ValuePolicy`), and the resolver keeps only the records that verify, newest
//!   per instance. Each service has three live instances, the first of them moved on to
//!   version 2 after the adversaries saw version 1, and a fourth instance whose record
//!   has expired since.
//! * A resolve succeeds when the resolver ends with exactly the live instances at
//!   their current versions.
//!
//! The default run (debug too) measures 300 services and 2,000 resolves per k;
//! `cargo test -p themis-dht --release --test naming_at_scale -- --nocapture --include-ignored`
//! adds 2,000 services and 20,000 resolves per k, and the colluding attack below.

mod sim;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use sim::records::{merge, Record, RecordPolicy};
use sim::{Adversary, FindLie, GetLie, Sim};
use themis_dht::message::MAX_VALUES_PER_KEY;
use themis_dht::{Config, Event, Key, OpId};

const OWNER_LIMIT: usize = 4;
const K: u8 = 4;
const HOUR: u64 = 3_600_000;
/// Live instances per service (plus one expired).
const INSTANCES: u64 = 3;

struct Setup {
    nodes: usize,
    /// Adversaries, in per cent of the nodes.
    adversaries: usize,
    services: usize,
    resolves: usize,
    /// FindStep lie of every adversary (`None`: a mix of the detectable ones).
    find: Option<FindLie>,
    routing: Routing,
    /// Honest nodes stopped before the stores, in per cent of the nodes: still members,
    /// they answer nothing (their peers find out by timeouts).
    dead: usize,
}

/// How nodes find a key's holder.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Routing {
    /// Chord's iterative lookup with the eclipse defence, through other nodes.
    Chord,
    /// One hop: every node knows the full membership and computes holders itself; a
    /// fourth of the adversaries are members that answer nothing at all.
    OneHop,
}

struct Figures {
    k: u8,
    /// Share of adversaries.
    share: f64,
    resolves: usize,
    exact: usize,
    /// Resolves whose every replica holder is an adversary (nothing honest to hear).
    all_bad: usize,
    /// Failures among the others.
    unexplained: usize,
    hops: Vec<u32>,
    verifications: Vec<usize>,
    answered: Vec<u8>,
    /// `Get`s sent again to the next holder after a timeout (one-hop routing).
    retries: u64,
}

impl Figures {
    fn rate(&self) -> f64 {
        self.exact as f64 / self.resolves as f64
    }

    fn print(&self, label: &str) {
        let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len() as f64;
        let p99 = |v: &mut Vec<f64>| {
            v.sort_by(f64::total_cmp);
            v[(v.len() * 99).div_ceil(100) - 1]
        };
        let mut hops: Vec<f64> = self.hops.iter().map(|&h| f64::from(h)).collect();
        let mut ver: Vec<f64> = self.verifications.iter().map(|&v| v as f64).collect();
        let answered: Vec<f64> = self.answered.iter().map(|&a| f64::from(a)).collect();
        eprintln!(
            "{label} k={}: {}/{} exact ({:.2} %); all {} replica holders adversaries in {} \
             (expected share {}^{} = {:.2} %), other failures {}; hops per resolve mean {:.1} \
             p99 {} (per replica lookup {:.2}); replicas answered mean {:.2}/{}; \
             verifications per resolve mean {:.1} p99 {}; Gets per resolve {:.3} ({} retries)",
            self.k,
            self.exact,
            self.resolves,
            100.0 * self.rate(),
            self.k + 1,
            self.all_bad,
            self.share,
            self.k + 1,
            100.0 * self.share.powi(i32::from(self.k) + 1),
            self.unexplained,
            mean(&hops),
            p99(&mut hops),
            mean(&hops) / f64::from(self.k + 1),
            mean(&answered),
            self.k + 1,
            mean(&ver),
            p99(&mut ver),
            f64::from(self.k + 1) + self.retries as f64 / self.resolves as f64,
            self.retries,
        );
    }
}

fn config() -> Config {
    Config {
        stabilise_every: HOUR,
        fix_finger_every: HOUR,
        check_predecessor_every: HOUR,
        republish_every: 10 * HOUR,
        ..Config::default()
    }
}

/// Builds the ring, stores the services, and resolves them with k = 4 and k = 2.
fn run(seed: u64, setup: &Setup) -> (Figures, Figures) {
    let wall = Instant::now();
    let verifications = Arc::new(AtomicU64::new(0));
    let clock = Arc::new(AtomicU64::new(0));
    let (v, c) = (verifications.clone(), clock.clone());
    let policy: sim::PolicyFactory = Box::new(move || {
        Box::new(RecordPolicy {
            clock: c.clone(),
            verifications: v.clone(),
            owner_limit: OWNER_LIMIT,
        })
    });
    let build = match setup.routing {
        Routing::Chord => Sim::converged,
        Routing::OneHop => Sim::one_hop,
    };
    let mut sim = build(seed, setup.nodes, config(), (1, 10), Some(policy));
    sim.clock = clock;
    sim.run_for(1_000);
    let built = wall.elapsed();

    // A share of the nodes (a fifth), at random.
    let bad = sim.sample(setup.nodes * setup.adversaries / 100, &[]);
    let finds = [
        FindLie::PointsAtItself,
        FindLie::PointsBackwards,
        FindLie::ResponsibleBeforeKey,
        FindLie::ClaimsItself,
    ];
    let kinds = match setup.routing {
        Routing::Chord => 3,
        Routing::OneHop => 4,
    };
    for (n, &b) in bad.iter().enumerate() {
        let get = match n % kinds {
            0 => GetLie::Withhold,
            1 => GetLie::Junk(MAX_VALUES_PER_KEY),
            _ => GetLie::Replay,
        };
        let adversary = Adversary {
            find: Some(setup.find.unwrap_or(finds[n % finds.len()])),
            get: Some(get),
            refuse_stores: true,
            silent: n % kinds == 3,
        };
        sim.adversaries.insert(b, adversary);
    }
    for d in sim.sample(setup.nodes * setup.dead / 100, &bad) {
        sim.kill(d);
    }

    // Each instance has its own honest owner node (owner id = its index).
    let names: Vec<Vec<u8>> = (0..setup.services)
        .map(|s| format!("svc-{s}.prod").into_bytes())
        .collect();
    let mut owners = BTreeMap::new();
    let mut truth: BTreeMap<Vec<u8>, BTreeMap<(u32, u64), u64>> = BTreeMap::new();
    let mut ops = Vec::new();
    let store = |sim: &mut Sim, owner: usize, value: Vec<u8>| -> (usize, OpId) {
        let name = Record::verify(&value).expect("signed").name;
        let op = sim
            .op(owner, |n, now| n.store(now, &name, value, K, HOUR))
            .expect("store");
        (owner, op)
    };
    let checks_before = verifications.load(Ordering::Relaxed);
    for name in &names {
        for i in 0..=INSTANCES {
            let owner = sim.sample(1, &bad)[0];
            owners.insert((name.clone(), i), owner);
            let not_after = if i == INSTANCES { 20_000 } else { 2 * HOUR };
            let r = Record {
                owner: owner as u32,
                instance: i,
                version: 1,
                not_after,
                name: name.clone(),
            };
            ops.push(store(&mut sim, owner, r.sign()));
            if i < INSTANCES {
                truth
                    .entry(name.clone())
                    .or_default()
                    .insert((owner as u32, i), 1);
            }
        }
    }
    let stores_v1 = ops.len();
    sim.wait_all(&ops, 60_000);
    // The adversaries keep what they saw; instance 0 of every service moves to
    // version 2 (its owner stops re-storing version 1).
    sim.record_seen = false;
    let mut ops = Vec::new();
    for name in &names {
        let owner = owners[&(name.clone(), 0)];
        let old = Record {
            owner: owner as u32,
            instance: 0,
            version: 1,
            not_after: 2 * HOUR,
            name: name.clone(),
        };
        assert!(sim.nodes[owner].unstore(name, &old.sign()));
        let new = Record { version: 2, ..old };
        ops.push(store(&mut sim, owner, new.sign()));
        truth
            .get_mut(name)
            .expect("stored")
            .insert((owner as u32, 0), 2);
    }
    sim.wait_all(&ops, 60_000);
    let stored: Vec<u8> = ops
        .iter()
        .map(|&(i, op)| match sim.event(i, op) {
            Some(Event::Stored { stored, .. }) => *stored,
            other => panic!("{other:?}"),
        })
        .collect();
    let replica_checks = verifications.load(Ordering::Relaxed) - checks_before;
    let stores = stores_v1 + ops.len();
    // The expired instance's record is past its not-after by now.
    sim.run_until(30_000);
    let stored_at = wall.elapsed();

    // Nothing honest to hear: every replica's holder is an adversary. A silent member
    // is passed over after its timeout, so its replica is held by the next member.
    let is_bad = |sim: &mut Sim, name: &[u8], k: u8| {
        (0..=k).all(|r| {
            let key = Key::object(name, r);
            let ring = sim.sorted().to_vec();
            let at = ring.partition_point(|(id, _)| *id < key);
            let holder = (0..ring.len())
                .map(|i| ring[(at + i) % ring.len()].1)
                .find(|h| !sim.adversaries.get(h).is_some_and(|a| a.silent))
                .expect("an answering node");
            sim.adversaries.contains_key(&holder)
        })
    };
    let mut figures = Vec::new();
    for k in [K, 2] {
        let mut f = Figures {
            k,
            share: setup.adversaries as f64 / 100.0,
            resolves: setup.resolves,
            exact: 0,
            all_bad: 0,
            unexplained: 0,
            hops: Vec::new(),
            verifications: Vec::new(),
            answered: Vec::new(),
            retries: 0,
        };
        for _ in 0..setup.resolves / 200 {
            let batch: Vec<(usize, usize)> = (0..200)
                .map(|_| {
                    let s = sim.rng_index(names.len());
                    (sim.sample(1, &bad)[0], s)
                })
                .collect();
            let retries_before: u64 = batch
                .iter()
                .map(|&(reader, _)| sim.nodes[reader].stats().retries)
                .sum();
            let ops: Vec<(usize, OpId)> = batch
                .iter()
                .map(|&(reader, s)| {
                    let op = sim
                        .op(reader, |n, now| n.resolve(now, &names[s], k))
                        .expect("resolve");
                    (reader, op)
                })
                .collect();
            sim.wait_all(&ops, 60_000);
            let retries_after: u64 = batch
                .iter()
                .map(|&(reader, _)| sim.nodes[reader].stats().retries)
                .sum();
            // A reader drawn twice in a batch counts its retries twice: an upper bound.
            f.retries += retries_after.saturating_sub(retries_before);
            for (&(reader, op), &(_, s)) in ops.iter().zip(&batch) {
                let Some(Event::Resolved {
                    values,
                    answered,
                    hops,
                    ..
                }) = sim.event(reader, op).cloned()
                else {
                    panic!("resolve from {reader} did not complete")
                };
                let (got, checks) = merge(&names[s], &values, sim.now);
                f.hops.push(hops);
                f.verifications.push(checks);
                f.answered.push(answered);
                if got == truth[&names[s]] {
                    f.exact += 1;
                } else if is_bad(&mut sim, &names[s], k) {
                    f.all_bad += 1;
                } else {
                    f.unexplained += 1;
                }
            }
        }
        figures.push(f);
    }
    let all_bad_services: Vec<usize> = [K, 2]
        .iter()
        .map(|&k| names.iter().filter(|n| is_bad(&mut sim, n, k)).count())
        .collect();
    let mut stored_hist = [0usize; K as usize + 2];
    for s in stored {
        stored_hist[usize::from(s)] += 1;
    }
    eprintln!(
        "{} nodes, {:?} routing ({} adversaries, FindStep lie {:?}; {} honest nodes dead), {} services x {} instances (+1 expired), \
         {stores} stores with k={K}: replicas acknowledged per store of version 2 {stored_hist:?} \
         (0..={}); policy verifications {:.2} per store (the owner's own check and every honest \
         holder's); services with only adversaries as replica holders: {} for k={K}, {} for k=2; \
         built in {:.1} s, stored by {:.1} s, total {:.1} s wall",
        setup.nodes,
        setup.routing,
        bad.len(),
        setup
            .find
            .map_or("mixed detectable".to_string(), |l| format!("{l:?}")),
        setup.nodes * setup.dead / 100,
        setup.services,
        INSTANCES,
        K + 1,
        replica_checks as f64 / stores as f64,
        all_bad_services[0],
        all_bad_services[1],
        built.as_secs_f64(),
        stored_at.as_secs_f64(),
        wall.elapsed().as_secs_f64()
    );
    let k2 = figures.pop().expect("two");
    let k4 = figures.pop().expect("two");
    (k4, k2)
}

fn check(k4: &Figures, k2: &Figures) {
    // A resolve may only fail when none of its replica holders is honest.
    assert_eq!(
        k4.unexplained, 0,
        "k=4: a resolve failed with an honest replica holder"
    );
    assert_eq!(
        k2.unexplained, 0,
        "k=2: a resolve failed with an honest replica holder"
    );
    assert!(k4.rate() >= 0.999, "k=4: {:.3} % exact", 100.0 * k4.rate());
}

#[test]
fn naming_10000_nodes_a_fifth_adversarial() {
    let setup = Setup {
        nodes: 10_000,
        adversaries: 20,
        services: 300,
        resolves: 2_000,
        find: None,
        routing: Routing::Chord,
        dead: 0,
    };
    let (k4, k2) = run(11, &setup);
    k4.print("10000 nodes");
    k2.print("10000 nodes");
    check(&k4, &k2);
}

#[test]
#[ignore = "20,000 resolves: run in release (see the file's documentation)"]
fn naming_10000_nodes_a_fifth_adversarial_more_services() {
    let setup = Setup {
        nodes: 10_000,
        adversaries: 20,
        services: 2_000,
        resolves: 20_000,
        find: None,
        routing: Routing::Chord,
        dead: 0,
    };
    let (k4, k2) = run(12, &setup);
    k4.print("10000 nodes, 2000 services");
    k2.print("10000 nodes, 2000 services");
    check(&k4, &k2);
}

/// The same without adversaries, for the hops and verifications of an honest ring.
#[test]
#[ignore = "a baseline for the figures above: run in release"]
fn naming_10000_nodes_no_adversaries() {
    let setup = Setup {
        nodes: 10_000,
        adversaries: 0,
        services: 300,
        resolves: 2_000,
        find: None,
        routing: Routing::Chord,
        dead: 0,
    };
    let (k4, k2) = run(11, &setup);
    k4.print("10000 nodes, no adversaries");
    k2.print("10000 nodes, no adversaries");
    check(&k4, &k2);
}

/// The limit of the eclipse defence: colluding adversaries that answer `FindStep` with
/// the first adversary at or after the key (`Responsible`, a plausible answer) capture
/// every lookup that meets one of them, stores and resolves alike. Reported, not
/// asserted: what it shows is what the lookup cannot yet defend against.
#[test]
#[ignore = "a measurement of an attack the lookup does not defend against yet"]
fn naming_10000_nodes_colluding_hijackers() {
    let setup = Setup {
        nodes: 10_000,
        adversaries: 20,
        services: 300,
        resolves: 2_000,
        find: Some(FindLie::Hijack),
        routing: Routing::Chord,
        dead: 0,
    };
    let (k4, k2) = run(13, &setup);
    k4.print("10000 nodes, hijacking lookups");
    k2.print("10000 nodes, hijacking lookups");
}

/// The same colluders against one-hop routing (issue 23): every node knows the full
/// membership, so there is no lookup to hijack. The adversaries still lie in every
/// `FindStep` they get (none is sent), refuse stores, withhold, forge and replay, and a
/// fourth of them answer nothing at all; 2 % of the honest nodes are down (members
/// still, found out by timeouts). A resolve may fail only when every replica's holder
/// is an adversary.
#[test]
fn naming_10000_nodes_colluding_one_hop() {
    let setup = one_hop_setup(300, 2_000);
    let (k4, k2) = run(13, &setup);
    k4.print("10000 nodes, one hop, colluders");
    k2.print("10000 nodes, one hop, colluders");
    check(&k4, &k2);
}

#[test]
#[ignore = "20,000 resolves: run in release (see the file's documentation)"]
fn naming_10000_nodes_colluding_one_hop_more_services() {
    let setup = one_hop_setup(2_000, 20_000);
    let (k4, k2) = run(14, &setup);
    k4.print("10000 nodes, one hop, colluders, 2000 services");
    k2.print("10000 nodes, one hop, colluders, 2000 services");
    check(&k4, &k2);
}

fn one_hop_setup(services: usize, resolves: usize) -> Setup {
    Setup {
        nodes: 10_000,
        adversaries: 20,
        services,
        resolves,
        find: Some(FindLie::Hijack),
        routing: Routing::OneHop,
        dead: 2,
    }
}
