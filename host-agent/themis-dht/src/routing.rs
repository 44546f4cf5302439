//! The routing state: predecessor, successor list and finger table.

use crate::key::{distance, in_open, Key, KEY_BITS};
use crate::message::Contact;

/// What a node knows about the ring around it.
#[derive(Debug)]
pub(crate) struct RoutingTable<A> {
    me: Contact<A>,
    pub(crate) predecessor: Option<Contact<A>>,
    /// Sorted clockwise from `me`, without `me`, at most `len` long. Empty: we are alone.
    successors: Vec<Contact<A>>,
    len: usize,
    /// `fingers[i]` is (a guess at) the successor of `me + 2^i`.
    fingers: Vec<Option<Contact<A>>>,
    /// `me + 2^i`, computed once.
    targets: Vec<Key>,
}

impl<A: Clone + PartialEq> RoutingTable<A> {
    pub(crate) fn new(me: Contact<A>, len: usize) -> Self {
        let targets = (0..KEY_BITS).map(|i| me.id.finger_target(i)).collect();
        RoutingTable {
            me,
            predecessor: None,
            successors: Vec::new(),
            len,
            fingers: vec![None; KEY_BITS],
            targets,
        }
    }

    /// The target of finger `i`: `me + 2^i`.
    pub(crate) fn target(&self, i: usize) -> &Key {
        &self.targets[i]
    }

    /// The first successor, or ourselves when alone.
    pub(crate) fn successor(&self) -> &Contact<A> {
        self.successors.first().unwrap_or(&self.me)
    }

    pub(crate) fn successors(&self) -> &[Contact<A>] {
        &self.successors
    }

    pub(crate) fn fingers(&self) -> &[Option<Contact<A>>] {
        &self.fingers
    }

    /// Replaces the successor list: sorted clockwise from us, deduplicated, without us,
    /// truncated to the configured length.
    pub(crate) fn set_successors(&mut self, mut list: Vec<Contact<A>>) {
        let me = self.me.id;
        list.retain(|c| c.id != me);
        list.sort_by_key(|c| distance(&me, &c.id));
        list.dedup_by(|a, b| a.id == b.id);
        list.truncate(self.len);
        self.successors = list;
    }

    pub(crate) fn set_finger(&mut self, i: usize, c: Contact<A>) {
        self.fingers[i] = Some(c);
    }

    /// Forgets a peer everywhere (it failed or left).
    pub(crate) fn remove(&mut self, id: &Key) {
        self.successors.retain(|c| &c.id != id);
        if self.predecessor.as_ref().is_some_and(|p| &p.id == id) {
            self.predecessor = None;
        }
        for f in &mut self.fingers {
            if f.as_ref().is_some_and(|c| &c.id == id) {
                *f = None;
            }
        }
    }

    /// Every distinct contact we know, fingers from the farthest down.
    fn known(&self) -> impl Iterator<Item = &Contact<A>> {
        self.successors
            .iter()
            .chain(self.predecessor.iter())
            .chain(self.fingers.iter().rev().flatten())
    }

    /// The known contact in `(me, key)` closest to `key`, skipping `avoid` (Chord's
    /// `closest_preceding_node`).
    pub(crate) fn closest_preceding(&self, key: &Key, avoid: &[Key]) -> Option<&Contact<A>> {
        let mut best: Option<(&Contact<A>, Key)> = None;
        for c in self.successors.iter().chain(self.predecessor.iter()) {
            best = better(best, c, &self.me.id, key, avoid);
        }
        // Fingers are ordered by distance from us, so the first usable one from the top is
        // the closest preceding finger; later ones cannot beat it.
        if let Some(c) = self
            .fingers
            .iter()
            .rev()
            .flatten()
            .find(|c| in_open(&c.id, &self.me.id, key) && !avoid.contains(&c.id))
        {
            best = better(best, c, &self.me.id, key, avoid);
        }
        best.map(|(c, _)| c)
    }

    /// Every known contact in `(me, key)` not in `avoid`: the candidates a lookup starts
    /// with (the closest first once sorted by the lookup).
    pub(crate) fn candidates(&self, key: &Key, avoid: &[Key]) -> Vec<Contact<A>> {
        let mut out: Vec<Contact<A>> = Vec::new();
        for c in self.known() {
            if in_open(&c.id, &self.me.id, key)
                && !avoid.contains(&c.id)
                && !out.iter().any(|o| o.id == c.id)
            {
                out.push(c.clone());
            }
        }
        out
    }
}

fn better<'a, A>(
    best: Option<(&'a Contact<A>, Key)>,
    c: &'a Contact<A>,
    me: &Key,
    key: &Key,
    avoid: &[Key],
) -> Option<(&'a Contact<A>, Key)> {
    if !in_open(&c.id, me, key) || avoid.contains(&c.id) {
        return best;
    }
    let d = distance(&c.id, key);
    match best {
        Some((_, bd)) if bd <= d => best,
        _ => Some((c, d)),
    }
}
