//! The trust log as agents read it from peers and files: leaves, checkpoints,
//! inclusion and consistency proofs, and whole batches offered to `Log::extend`,
//! under the fixed mesh root of `src/trust.rs` (docs/PROTOCOL.md §6.13).
//!
//! Every decoder and verifier returns on any input. A copy of the log changes only
//! when what it is offered is exactly the genuine log (the root signed its
//! checkpoint; any other bytes, even ones that decode to the same statements, hash
//! to another root), and a proof passes only for what the genuine log holds. A leaf
//! that verifies as the root's is one of the genuine leaves, so the bindings a copy
//! holds (who may serve a service) are the root's alone.
#![no_main]

use std::sync::OnceLock;

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use themis_fuzz::trust::{trust, NAMESPACE, NOW, SERVICE, SERVICE_ACCOUNT};
use themis_fuzz::Edit;
use themis_log::{Entry, Kind, Log, SignedCheckpoint};
use themis_trust::Subject;

/// The genuine log: the root's admission, grant, revocation and binding, checkpointed.
struct Genuine {
    log: Log,
    checkpoint: Vec<u8>,
    leaves: Vec<Vec<u8>>,
}

fn genuine() -> &'static Genuine {
    static GENUINE: OnceLock<Genuine> = OnceLock::new();
    GENUINE.get_or_init(|| {
        let t = trust();
        let mut log = Log::new(t.root.clone());
        for (kind, statement) in [
            (Kind::Admission, &t.admission),
            (Kind::Grant, &t.grant),
            (Kind::Revocation, &t.revocation),
            (Kind::Binding, &t.binding),
        ] {
            log.append(Entry::new(kind, statement.clone()).encode()).expect("genuine");
        }
        let checkpoint = log.sign_checkpoint(&t.root_key, 1).encoded().to_vec();
        let leaves = log.leaves(0, usize::MAX).to_vec();
        Genuine { log, checkpoint, leaves }
    })
}

#[derive(Arbitrary, Debug)]
enum Input {
    /// Bytes of its own, as a leaf, a checkpoint and a proof.
    Raw { bytes: Vec<u8>, index: u8 },
    /// The genuine checkpoint and leaves, one of them (`which`: 0 the checkpoint,
    /// else a leaf) edited, offered to an empty copy.
    Edited { which: u8, edits: Vec<Edit> },
    /// A genuine leaf's inclusion proof or the consistency proof, edited.
    Proof { index: u8, edits: Vec<Edit> },
}

fuzz_target!(|input: Input| {
    let g = genuine();
    let root = &trust().root;
    let verified = SignedCheckpoint::verify(root, &g.checkpoint).expect("genuine");
    match input {
        Input::Raw { bytes, index } => {
            if let Ok((entry, _)) = Entry::open(&bytes, root) {
                // Signed by the root: then it is one of its statements, under its kind.
                let genuine = g.leaves.iter().filter_map(|l| Entry::decode(l).ok());
                assert!(
                    genuine.into_iter().any(|e| e == entry),
                    "a leaf the root never signed verified: {entry:?}"
                );
            }
            if let Ok(cp) = SignedCheckpoint::verify(root, &bytes) {
                assert_eq!(cp.encoded(), g.checkpoint.as_slice(), "a checkpoint the root never signed passed");
            }
            let index = u64::from(index);
            if verified.checkpoint.verify_inclusion(&bytes, index, &bytes).is_ok() {
                assert_eq!(g.log.leaf(index), Some(bytes.as_slice()));
            }
            let _ = verified.checkpoint.verify_extends(&verified.checkpoint, &bytes);
            let mut copy = Log::new(root.clone());
            assert!(copy.extend(&bytes, std::slice::from_ref(&bytes)).is_err());
            assert_eq!(copy.size(), 0);
        }
        Input::Edited { which, edits } => {
            let mut checkpoint = g.checkpoint.clone();
            let mut leaves = g.leaves.clone();
            let target = match usize::from(which) % (leaves.len() + 1) {
                0 => &mut checkpoint,
                n => &mut leaves[n - 1],
            };
            for edit in &edits {
                edit.apply(target);
            }
            let mut copy = Log::new(root.clone());
            match copy.extend(&checkpoint, &leaves) {
                Ok(_) => {
                    assert_eq!(leaves, g.leaves, "edited leaves were taken");
                    assert_eq!(copy.root_hash(), g.log.root_hash());
                    let bindings = copy.bindings();
                    let bound = Subject::new(NAMESPACE, SERVICE_ACCOUNT).expect("names");
                    let other = Subject::new(NAMESPACE, "default").expect("names");
                    assert!(bindings.check(SERVICE, &bound, NOW).is_ok());
                    assert!(bindings.check(SERVICE, &other, NOW).is_err());
                }
                Err(_) => assert_eq!(copy.size(), 0, "a refused batch changed the copy"),
            }
        }
        Input::Proof { index, edits } => {
            let index = u64::from(index) % g.log.size();
            let mut proof = g.log.inclusion_proof(index).expect("in the log");
            let genuine_proof = proof.clone();
            for edit in &edits {
                edit.apply(&mut proof);
            }
            let leaf = g.log.leaf(index).expect("in the log");
            if verified.checkpoint.verify_inclusion(leaf, index, &proof).is_ok() {
                assert_eq!(proof, genuine_proof, "an edited inclusion proof passed");
            }
            let mut consistency = g.log.consistency_proof(1).expect("a prefix");
            let genuine_consistency = consistency.clone();
            for edit in &edits {
                edit.apply(&mut consistency);
            }
            let mut first = Log::new(root.clone());
            first.append(g.leaves[0].clone()).expect("genuine");
            let older = first.sign_checkpoint(&trust().root_key, 0);
            if verified.checkpoint.verify_extends(&older.checkpoint, &consistency).is_ok() {
                assert_eq!(consistency, genuine_consistency, "an edited consistency proof passed");
            }
        }
    }
});
