//! The trust log through real agents (docs/PROTOCOL.md §6.13): the operator's
//! statements enter the mesh directory's log, `--publish` hands it to one agent and
//! the ring copies it from there, each agent verifying what any peer serves; a
//! restarted agent enforces the whole log before it serves; a root that signs two
//! histories is caught by every agent that sees both.

use themis_testkit::agent as common;

use std::path::Path;
use std::time::Duration;

use common::{Agent, Spawn, MESH};
use serde_json::Value;
use themis_core::{MeshName, PeerId};

/// How long the log gets to reach every agent of a small ring (the sync runs every
/// 500 ms here, two peers a round).
const SPREAD: Duration = Duration::from_secs(60);

fn mesh() -> MeshName {
    MeshName::new(MESH).unwrap()
}

/// `n` printable ids nobody holds a key for (revoking them is what matters).
fn ids(n: u32, salt: u8) -> Vec<String> {
    (0..n)
        .map(|i| {
            let mut id = [salt; 32];
            id[..4].copy_from_slice(&i.to_be_bytes());
            PeerId(id).printable(&mesh())
        })
        .collect()
}

fn revocations_known(agent: &Agent) -> Option<usize> {
    let (_, known) = agent.get("/v1/revocations")?;
    Some(known["revocations"].as_array()?.len())
}

fn log_status(agent: &Agent) -> Value {
    agent.get("/v1/log").expect("GET /v1/log").1
}

/// 1,000 revocations in one checkpoint, published through one agent of three: every
/// agent enforces every one (there is no ceiling short of the log's size); a
/// restarted agent enforces them all from its saved copy before its first answer.
#[test]
fn a_thousand_revocations_reach_every_agent_and_survive_a_restart() {
    let dir = common::workdir();
    let root = dir.path();
    let agents = common::ring(root, 3, common::FAST);
    let mesh_dir = common::mesh_dir(root);
    let stolen = ids(1_000, 0x5a);
    let (code, out, err) = agents[0].revoke_ids(&stolen, &mesh_dir, true);
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("published"), "{out}");
    // The three admissions, then the revocations.
    let size = log_status(&agents[0])["size"].as_u64().unwrap();
    assert_eq!(size, 3 + 1_000);
    for agent in &agents {
        agent.wait_for("all 1,000 revocations", SPREAD, |a| {
            (revocations_known(a)? == 1_000).then_some(())
        });
        let status = log_status(agent);
        assert_eq!(status["size"].as_u64(), Some(size), "{}", agent.name);
        assert_eq!(status["forks"].as_array().map(Vec::len), Some(0));
    }
    // Every copy is the same log.
    let hashes: Vec<Value> = agents
        .iter()
        .map(|a| log_status(a)["root_hash"].clone())
        .collect();
    assert!(hashes.windows(2).all(|w| w[0] == w[1]), "{hashes:?}");

    // Killed, and back with every period far beyond the test: only its saved copy
    // can tell it, and it does before the first answer.
    let mut agents = agents;
    let mut third = agents.pop().unwrap();
    third.kill();
    let third = Agent::spawn(
        root,
        "agent-2",
        Spawn {
            join: Some(&agents[0].contact),
            extra: &[
                "--metrics",
                "off",
                "--revocation-poll-ms",
                "3600000",
                "--log-sync-ms",
                "3600000",
            ],
            ..Spawn::default()
        },
    );
    assert_eq!(
        revocations_known(&third),
        Some(1_000),
        "{}",
        third.log_tail()
    );
    assert!(
        third.log().contains("loaded the trust log"),
        "{}",
        third.log_tail()
    );
}

/// With no agent to take it, `revoke --publish` fails loudly, and the statement
/// stays in the mesh directory's log for `themis log publish` to retry.
#[test]
fn publishing_with_every_agent_down_fails() {
    let dir = common::workdir();
    let root = dir.path();
    let mut agent = Agent::spawn(root, "agent-0", Spawn::default());
    agent.wait_joined();
    let mesh_dir = common::mesh_dir(root);
    agent.kill();
    let stolen = ids(1, 0x11);
    let (code, out, err) = agent.revoke_ids(&stolen, &mesh_dir, true);
    assert_ne!(code, 0, "published with no agent: {out}{err}");
    assert!(err.contains("NOT published"), "{err}");
    let (code, out, err) = agent.cli(&[
        "log",
        "show",
        &stolen[0],
        "--mesh-dir",
        mesh_dir.to_str().unwrap(),
    ]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(
        out.contains("revocation"),
        "the revocation is not in the mesh's log: {out}"
    );
}

/// The root signs two histories of one size (two copies of the mesh directory, each
/// revoking a different key), and each is published through a different agent: every
/// agent that sees both checkpoints reports the fork and keeps the evidence; the
/// copy it holds does not change.
///
/// The second history goes to an agent away from the others (alone in a ring of its
/// own), which then joins them: through an agent of theirs, it would meet the first
/// already there (gossip spreads a log at once) and be refused by that agent alone.
#[test]
fn a_forked_log_is_detected_by_every_agent_that_sees_both() {
    let dir = common::workdir();
    let root = dir.path();
    let mut agents = common::ring(root, 3, common::FAST);
    let mesh_dir = common::mesh_dir(root);
    // The agent away is admitted before the histories part: its admission is common.
    let away_dir = root.join("agent-3");
    std::fs::create_dir_all(&away_dir).unwrap();
    common::admit(root, &away_dir);
    let twin = common::twin_mesh(root);
    // Let every agent hold the common history first.
    agents[0].publish_log(&mesh_dir);
    let size = log_status(&agents[0])["size"].as_u64().unwrap();
    for agent in &agents {
        agent.wait_for("the common history", SPREAD, |a| {
            (log_status(a)["size"].as_u64()? == size).then_some(())
        });
    }
    let (code, out, err) = agents[0].revoke_ids(&ids(1, 0x21), &mesh_dir, true);
    assert_eq!(code, 0, "{out}{err}");
    // The other history, to the agent away, which takes it (its copy was empty), then
    // restarts with its copy and joins the others.
    let mut away = Agent::spawn(root, "agent-3", Spawn::default());
    away.wait_joined();
    let (code, out, err) = away.revoke_ids(&ids(1, 0x22), &twin, true);
    assert_eq!(code, 0, "{out}{err}");
    assert_eq!(away.terminate(), Some(0));
    let away = Agent::spawn(
        root,
        "agent-3",
        Spawn {
            join: Some(&agents[0].contact),
            ..Spawn::default()
        },
    );
    agents.push(away);
    for agent in &agents {
        agent.wait_for("the fork to be seen", SPREAD, |a| {
            (!log_status(a)["forks"].as_array()?.is_empty()).then_some(())
        });
        assert_eq!(log_status(agent)["size"].as_u64(), Some(size + 1));
        let evidence = agent.dir.join("log-forks");
        assert!(
            std::fs::read_dir(&evidence).map_or(0, |d| d.count()) >= 3,
            "{}: no evidence in {}",
            agent.name,
            evidence.display()
        );
        let (code, out, _) = agent.cli(&["log", "status"]);
        assert_ne!(code, 0, "`themis log status` succeeded with a fork: {out}");
        assert!(out.contains("FORK"), "{out}");
    }
}

/// A one-node ring granted `check`, and the mesh directory.
fn one_node_granted_check() -> (tempfile::TempDir, Agent, std::path::PathBuf) {
    let dir = common::workdir();
    let agent = Agent::spawn(dir.path(), "agent-0", Spawn::default());
    agent.wait_joined();
    agent.grant("check");
    let mesh_dir = common::mesh_dir(dir.path());
    (dir, agent, mesh_dir)
}

/// An auditor verifies a whole copy from its first leaf: the agent's copy passes,
/// one bit flipped anywhere fails; `themis log show` tells the history of a service
/// and of a key.
#[test]
fn a_whole_copy_verifies_and_the_history_reads() {
    let (dir, agent, mesh_dir) = one_node_granted_check();
    let root = dir.path();
    agent.publish_log(&mesh_dir);
    let copy = root.join("copy.bin");
    let bytes = std::fs::read(mesh_dir.join("trust-log.bin")).unwrap();
    std::fs::write(&copy, &bytes).unwrap();
    let mesh_root = mesh_dir.join("mesh.root");
    let verify = |file: &Path| {
        agent.cli(&[
            "log",
            "verify",
            file.to_str().unwrap(),
            "--mesh-root",
            mesh_root.to_str().unwrap(),
        ])
    };
    let (code, out, err) = verify(&copy);
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("verified"), "{out}");
    // Every 7th byte flipped in turn (a whole sweep is the crate's test): each fails.
    for at in (0..bytes.len()).step_by(7) {
        let mut bad = bytes.clone();
        bad[at] ^= 0x10;
        std::fs::write(&copy, &bad).unwrap();
        let (code, out, _) = verify(&copy);
        assert_ne!(code, 0, "byte {at} flipped verified: {out}");
    }
    let (code, out, err) = agent.cli(&["log", "show", "check"]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("grant") && out.contains("check"), "{out}");
    let (code, out, err) = agent.cli(&["log", "show", &agent.id]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("admission") && out.contains("grant"), "{out}");

    // `themis explain` cites the leaves behind a verdict, each proven under the
    // checkpoint it names: checked here with nothing but the mesh root.
    agent.register("check", "w1", "127.0.0.1:18001");
    let (code, out, err) = agent.cli(&["--json", "explain", "check"]);
    assert_eq!(code, 0, "{out}{err}");
    let explained: Value = serde_json::from_str(&out).unwrap();
    let root: themis_trust::MeshRoot = std::fs::read_to_string(&mesh_root)
        .unwrap()
        .parse()
        .unwrap();
    let checkpoint = themis_log::SignedCheckpoint::verify(
        &root,
        &hex::decode(explained["log_checkpoint"].as_str().unwrap()).unwrap(),
    )
    .unwrap();
    let cited = explained["values"][0]["log"].as_array().unwrap();
    let kinds: Vec<&str> = cited.iter().map(|l| l["kind"].as_str().unwrap()).collect();
    assert_eq!(kinds, ["admission", "grant"], "{explained}");
    for leaf in cited {
        let bytes = hex::decode(leaf["leaf"].as_str().unwrap()).unwrap();
        let proof = hex::decode(leaf["proof"].as_str().unwrap()).unwrap();
        let index = leaf["index"].as_u64().unwrap();
        assert_eq!(
            checkpoint
                .checkpoint
                .verify_inclusion(&bytes, index, &proof),
            Ok(())
        );
    }
    let (code, out, _) = agent.cli(&["explain", "check"]);
    assert_eq!(code, 0);
    assert!(
        out.contains("trust log #") && out.contains("grant check"),
        "{out}"
    );
}

/// A mesh made before the log: its statements are imported from the files the
/// operator gave out (admission, grants, saved revocations), once.
#[test]
fn an_existing_mesh_moves_to_the_log_without_readmitting_its_nodes() {
    let (_dir, agent, mesh_dir) = one_node_granted_check();
    // A revocation written to a file, as `themis revoke --out` did before the log.
    let revoked = agent.dir.join("revoked.pem");
    let (code, out, err) = agent.cli(&[
        "revoke",
        &ids(1, 0x66)[0],
        "--mesh-dir",
        mesh_dir.to_str().unwrap(),
        "--out",
        revoked.to_str().unwrap(),
    ]);
    assert_eq!(code, 0, "{out}{err}");
    // As before the log: no copy in the mesh directory.
    std::fs::remove_file(mesh_dir.join("trust-log.bin")).unwrap();
    let admission = agent.dir.join("admission.pem");
    let grant = agent.dir.join("grants/check.pem");
    let import = |files: &[&Path]| {
        let mut args = vec!["log", "import", "--mesh-dir", mesh_dir.to_str().unwrap()];
        args.extend(files.iter().map(|f| f.to_str().unwrap()));
        agent.cli(&args)
    };
    let (code, out, err) = import(&[&admission, &grant, &revoked]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("imported 3"), "{out}");
    let (code, out, _) = import(&[&admission, &grant, &revoked]);
    assert_eq!(code, 0);
    assert!(out.contains("imported 0"), "imported twice: {out}");
    agent.publish_log(&mesh_dir);
    assert_eq!(log_status(&agent)["size"].as_u64(), Some(3));
    assert_eq!(revocations_known(&agent), Some(1));
}

/// What the hostile peer of [`a_peer_serving_a_changed_log_is_refused`] serves.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Serve {
    Genuine,
    /// One bit of leaf 3 flipped.
    FlippedBit,
    /// The last leaf withheld.
    Truncated,
    /// Leaves 2 and 4 swapped.
    Reordered,
    /// A valid leaf the root signed, in place of leaf 4 (from another log).
    Replaced,
    /// The genuine leaves under a checkpoint the peer signed itself.
    ForgedCheckpoint,
}

/// A peer in the mesh (admitted: it holds a real admission) serves a changed copy of
/// the log over the real agent protocol (secure channel, `Frame::LogRequest`): the
/// honest node refuses each change, counts why, and its copy stays as it was; the
/// genuine log, served next, is taken whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_serving_a_changed_log_is_refused() {
    use std::sync::{Arc, Mutex};
    use themis_agent::log_sync::{exchange, Synced};
    use themis_agent::metrics::Metrics;
    use themis_agent::overlay::Frame;
    use themis_agent::trust::MeshTrust;
    use themis_log::{Checkpoint, Log};

    let dir = common::workdir();
    let root = dir.path();
    let mesh_dir = common::mesh_dir(root);
    let (honest, _) = common::admitted_peer(root, "honest");
    let (hostile, _) = common::admitted_peer(root, "hostile");
    let mut args: Vec<String> = vec!["revoke".into()];
    args.extend(ids(5, 0x33));
    args.extend(["--mesh-dir".into(), mesh_dir.display().to_string()]);
    let args: Vec<&std::ffi::OsStr> = args.iter().map(|a| a.as_ref()).collect();
    common::operator(&args);
    let mesh_root: themis_trust::MeshRoot = std::fs::read_to_string(mesh_dir.join("mesh.root"))
        .unwrap()
        .parse()
        .unwrap();
    let genuine = Log::from_copy(
        mesh_root.clone(),
        &std::fs::read(mesh_dir.join("trust-log.bin")).unwrap(),
    )
    .unwrap();
    assert_eq!(genuine.size(), 7, "two admissions and five revocations");
    let leaves = genuine.leaves(0, usize::MAX).to_vec();
    let checkpoint = genuine.checkpoint().unwrap().encoded().to_vec();
    let forged = Checkpoint {
        mesh: MESH.into(),
        size: 7,
        root_hash: genuine.root_hash(),
        issued_at: 1,
    }
    .sign(&hostile)
    .encoded()
    .to_vec();
    // Another log's leaf, root-signed: the five revocations of another checkpoint.
    let other = {
        let mut args: Vec<String> = vec!["revoke".into()];
        args.extend(ids(1, 0x44));
        args.extend(["--mesh-dir".into(), mesh_dir.display().to_string()]);
        let args: Vec<&std::ffi::OsStr> = args.iter().map(|a| a.as_ref()).collect();
        common::operator(&args);
        let longer = Log::from_copy(
            mesh_root.clone(),
            &std::fs::read(mesh_dir.join("trust-log.bin")).unwrap(),
        )
        .unwrap();
        longer.leaf(7).unwrap().to_vec()
    };

    let hostile = Arc::new(hostile);
    let mode = Arc::new(Mutex::new(Serve::Genuine));
    let served = mode.clone();
    let handler = move |_peer: Arc<themis_core::SessionInfo>, frame: bytes::BytesMut| {
        let mode = *served.lock().unwrap();
        let (mut cp, mut all) = (checkpoint.clone(), leaves.clone());
        match mode {
            Serve::Genuine => {}
            Serve::FlippedBit => all[3][20] ^= 0x01,
            Serve::Truncated => {
                all.pop();
            }
            Serve::Reordered => all.swap(2, 4),
            Serve::Replaced => all[4] = other.clone(),
            Serve::ForgedCheckpoint => cp = forged.clone(),
        }
        async move {
            let from = match postcard::from_bytes::<Frame>(&frame) {
                Ok(Frame::LogRequest { from, .. }) => from as usize,
                _ => usize::MAX,
            };
            let leaves = all.get(from.min(all.len())..).unwrap_or_default().to_vec();
            themis_net::Answer {
                payload: Frame::LogAnswer {
                    checkpoint: cp,
                    leaves,
                }
                .encode(),
                standing: themis_net::Standing::Admitted,
            }
        }
    };
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let server = tokio::spawn(themis_net::serve_with(
        listener,
        hostile.clone(),
        themis_net::Config::default(),
        themis_net::Limits::default(),
        Arc::new(handler),
        Arc::new(themis_net::NetStats::default()),
    ));

    let metrics = Arc::new(Metrics::new());
    let trust = MeshTrust::load(&root.join("honest"), mesh_root, &honest, metrics.clone()).unwrap();
    let client = themis_net::Client::new(Arc::new(honest), themis_net::ClientConfig::default());
    let peer = hostile.id();
    for (serve, expected) in [
        (Serve::FlippedBit, Synced::Refused("bad_leaf")),
        (Serve::Truncated, Synced::Refused("incomplete")),
        (Serve::Reordered, Synced::Refused("root_mismatch")),
        (Serve::Replaced, Synced::Refused("root_mismatch")),
        (Serve::ForgedCheckpoint, Synced::Refused("not_from_root")),
    ] {
        *mode.lock().unwrap() = serve;
        let synced = exchange(&client, &trust, &metrics, peer, addr).await;
        assert_eq!(synced, expected, "{serve:?}");
        let Synced::Refused(reason) = expected else {
            unreachable!()
        };
        assert!(
            metrics.trust_log_syncs(&format!("refused_{reason}")) >= 1,
            "{serve:?} was not counted"
        );
        assert_eq!(trust.log().size(), 0, "{serve:?} changed the copy");
        assert!(
            trust.revocations().is_empty(),
            "{serve:?} revoked something"
        );
    }
    *mode.lock().unwrap() = Serve::Genuine;
    assert_eq!(
        exchange(&client, &trust, &metrics, peer, addr).await,
        Synced::Grew(7)
    );
    assert_eq!(metrics.trust_log_syncs("grew"), 1);
    assert_eq!(trust.revocations().len(), 5);
    assert_eq!(
        exchange(&client, &trust, &metrics, peer, addr).await,
        Synced::Consistent
    );
    server.abort();
}

/// The log is served to admitted nodes only: a stranger with a self-made key (it
/// completes the key agreement, it is not admitted), with no admission or with one
/// copied from a real node, asks for the leaves over the agent protocol and gets
/// `rejected`, no checkpoint and no leaf.
#[test]
fn a_stranger_gets_nothing_of_the_log() {
    use std::sync::Arc;
    use themis_agent::overlay::{Frame, MAX_LOG_LEAVES};

    let (_dir, agent, mesh_dir) = one_node_granted_check();
    agent.publish_log(&mesh_dir);
    let stolen = common::node_credentials(&agent.dir).1;
    let stranger = Arc::new(themis_testkit::intruder::self_made_key(MESH));
    let requests = [vec![0x5a; 64], stolen].map(|admission| {
        Frame::LogRequest {
            admission,
            from: 0,
            max: MAX_LOG_LEAVES,
        }
        .encode()
    });
    common::assert_strangers_refused(&agent.contact, &stranger, &requests);
}
