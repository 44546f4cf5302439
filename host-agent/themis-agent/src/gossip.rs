//! Gossip among the agents (issue 23, docs/PROTOCOL.md §6.14): the membership that
//! one-hop routing needs, and the trust log's growth, spread push-pull.
//!
//! Every exchange starts with one [`Frame::Roster`] request and its answer. Both say
//! how large a log the sender holds and summarise its roster in one digest. The
//! request carries the roster news the sender has not passed on yet (members'
//! credentials it took lately, its own announcement among them: each is passed on
//! in [`NEWS_SENDS`] requests, then dropped, the infect-and-die spreading of
//! Serf and memberlist). When the digests differ, the answer carries the peer's
//! fresh members (a push that missed the asker is the usual difference); if the
//! rosters still differ, the asker asks for the [`BUCKETS`] bucket digests
//! ([`Ask::Digests`]), then for the buckets that differ,
//! listing what it holds of them, and gets only the members it lacks or holds older
//! ([`Roster::missing`]), a page of [`PAGE`] at a time, up to [`MAX_PAGES`]. Two
//! agents that differ by one member of 10,000 exchange a few kilobytes, not the
//! roster. Who to tell and when, and whose larger log to fetch, is the sans-IO
//! [`Gossip`] of `themis-dht`: news is pushed to 3 random members at once, one random
//! member is pulled every period, the smallest claim above ours is fetched first
//! (through the trust log's own verified exchange, `log_sync`). Peers come from the
//! verified roster, never from what a peer names. Roster changes are pushed the same
//! way, and feed the DHT node's membership ([`Overlay::set_members`]).

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ring::rand::{SecureRandom, SystemRandom};
use serde::{Deserialize, Serialize};
use themis_core::{Identity, PeerId};
use themis_dht::gossip::{Action, Gossip, GossipConfig, Have};
use themis_dht::{Key, Members};
use themis_net::Client;
use themis_trust::{grant_digest, Announcement, Signed, TrustError, ANNOUNCEMENT_LABEL};
use tokio::sync::{mpsc, Notify};
use tokio::task::JoinSet;
use tracing::{debug, info};

use crate::histories::Histories;
use crate::log_sync::{exchange, Synced};
use crate::metrics::Metrics;
use crate::overlay::{Frame, Overlay, Peer};
use crate::roster::{
    top_digest, BucketDigest, BucketHave, Credentials, Roster, BUCKETS, MAX_MEMBERS, PAGE,
};
use crate::trust::{unix_millis, MeshTrust};

/// Haves from members queued for the driver at most.
const HEARD_QUEUE: usize = 256;

/// The most pages one exchange asks for: a whole roster of [`MAX_MEMBERS`], however
/// many further pages a peer says there are.
pub const MAX_PAGES: usize = MAX_MEMBERS.div_ceil(PAGE);
const _: () = assert!(MAX_PAGES * PAGE >= MAX_MEMBERS);

/// Members of one frame that may fail their checks for reasons an honest peer can
/// give (revoked or expired here first, a clock ahead) before the rest is dropped.
const MAX_FAILURES_PER_FRAME: usize = 16;

/// How many requests carry one piece of roster news (then pulls repair what missed
/// it): with a fanout of 3, about 94 % of a large mesh hears it by pushes alone.
pub const NEWS_SENDS: u8 = 3;

/// How recent an announcement must be to be passed on as news: pushes reach a mesh
/// in a few seconds, and what is older than this has had its chance.
pub const NEWS_FRESH_MS: u64 = 60_000;

/// The most pieces of news held to pass on; more are left to pulls.
const MAX_NEWS: usize = 64;

/// The most members' summaries one request of buckets lists (about 80 KiB: a
/// first request of a connection may be 140 KiB); the buckets past it are asked
/// for in the next exchange.
pub const MAX_HAVE: usize = 2048;

/// How long a log fetch may take before the next claim is taken (the fetch reports
/// its result before that, unless it hangs).
const FETCH_TIMEOUT_MS: u64 = 10_000;

/// What a member said in its request: its log's size and root hash.
type Heard = (Peer, u64, [u8; 32]);

/// The reason a peer gives for refusing a gossip request without an admission from
/// a node it does not know as a member: the asker sends it again with one.
pub const ADMISSION_WANTED: &str = "admission_wanted";

/// What a gossip request or answer carries. Most frames are a comparison of two
/// agents that agree: the request says what the asker holds (about 75 bytes), the
/// answer only that the peer holds the same (about 11).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RosterFrame {
    /// The sender's admission credential, when the receiver may not know the sender
    /// as a member: while the sender knows no other member, and when a peer refused
    /// a request without it ([`ADMISSION_WANTED`]). A member's frames need none.
    pub admission: Option<Vec<u8>>,
    /// The size of the sender's verified trust log.
    pub log_size: u64,
    /// Its tree's root hash at that size: two agents that hold as many leaves but
    /// different roots hold two histories of the root's (a fork, §6.13). Left out of
    /// an answer when the request's is the same, or the sizes differ.
    pub log_root: Option<[u8; 32]>,
    /// The sender's [`Roster::digest`]; left out of an answer when it is the
    /// request's.
    pub digest: Option<[u8; 32]>,
    /// Members' credentials: roster news in a request (in node-key order, at most
    /// [`PAGE`]); in an answer to [`RosterFrame::want`], a page of what the asker
    /// lacks.
    pub members: Vec<Credentials>,
    /// In a request: the buckets wanted (`None`: compare digests only). Ignored in an
    /// answer.
    pub want: Option<Want>,
    /// In a request: the peer's bucket digests are wanted if the rosters still
    /// differ (the asker's fresh members come along). Ignored in an answer.
    pub buckets_wanted: bool,
    /// In an answer to a request with `buckets_wanted` whose digest differs: the
    /// sender's [`Roster::bucket_digests`].
    pub buckets: Vec<BucketDigest>,
    /// In an answer, where the next page starts, if there is one.
    pub next: Option<[u8; 32]>,
}

/// The buckets an asker wants: what it holds of each (see [`Roster::missing`]), and
/// the page (the members after this node key; `None`: from the first).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Want {
    /// What the asker holds of each bucket it wants (at most [`MAX_HAVE`] members).
    pub have: Vec<BucketHave>,
    /// The page: members after this node key.
    pub after: Option<[u8; 32]>,
}

/// What one request of an exchange asks: a comparison (with the news); the bucket
/// digests, when a comparison and the fresh members it brought left the rosters apart
/// (with this agent's fresh members); or a page of the buckets that differ (counted).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ask {
    /// Compare digests; the answer to a difference carries the peer's fresh members.
    Compare,
    /// The bucket digests, if the rosters still differ.
    Digests,
    /// Members of the buckets wanted, and how many pages this exchange has had.
    Page(Want, usize),
}

/// The state gossip shares between the agent's server (answers) and its driver. The
/// roster itself is the trust state's ([`MeshTrust::enable_roster`]): records are
/// checked against it too.
pub struct GossipState {
    trust: Arc<MeshTrust>,
    /// This node's admission and newest announcement (a farewell replaces it).
    own: Mutex<Credentials>,
    /// Roster news to pass on, by node key, with the requests left to carry it.
    news: Mutex<BTreeMap<[u8; 32], (Credentials, u8)>>,
    listen: SocketAddr,
    /// What members said in their requests, for the driver (bounded: a Have is a
    /// hint, and pulls repair what is dropped).
    heard: mpsc::Sender<Heard>,
    /// The roster changed: news to push and a membership to hand the node.
    changed: Notify,
    /// The membership as last made ([`GossipState::members`]): who may send gossip
    /// without an admission, and whose requests are heard.
    members: Mutex<Members<SocketAddr>>,
}

impl GossipState {
    /// The state of the agent `node`, listening on `listen`: its roster starts with
    /// itself, under an announcement signed now. The receiver gets what peers say.
    pub fn new(
        node: &Identity,
        listen: SocketAddr,
        trust: Arc<MeshTrust>,
    ) -> (Arc<GossipState>, mpsc::Receiver<Heard>) {
        let own = announce(node, listen, &trust, false);
        trust.enable_roster();
        let (heard, heard_rx) = mpsc::channel(HEARD_QUEUE);
        let state = GossipState {
            trust,
            news: Mutex::new(BTreeMap::new()),
            own: Mutex::new(own.clone()),
            listen,
            heard,
            changed: Notify::new(),
            members: Mutex::new(Members::new([])),
        };
        state.tell(&own);
        (Arc::new(state), heard_rx)
    }

    /// Passes `credentials` on in the next [`NEWS_SENDS`] requests, if their
    /// announcement is news: signed less than [`NEWS_FRESH_MS`] ago (a newcomer
    /// taking the whole roster has nothing to tell).
    fn tell(&self, credentials: &Credentials) {
        if let Ok(signed) = Signed::decode(&credentials.announcement) {
            self.tell_decoded(&signed, credentials);
        }
    }

    /// [`GossipState::tell`], with the announcement decoded already.
    fn tell_decoded(&self, signed: &Signed, credentials: &Credentials) {
        let fresh = Announcement::decode(&signed.body)
            .is_ok_and(|a| a.issued_at.saturating_add(NEWS_FRESH_MS) >= unix_millis());
        if !fresh {
            return;
        }
        let mut news = self.news.lock().expect("never poisoned");
        if news.len() < MAX_NEWS || news.contains_key(&signed.signer) {
            news.insert(signed.signer, (credentials.clone(), NEWS_SENDS));
        }
    }

    /// The news for one more request, in node-key order; what has been sent
    /// [`NEWS_SENDS`] times is dropped.
    fn news(&self) -> Vec<Credentials> {
        let mut news = self.news.lock().expect("never poisoned");
        let out = news.values().map(|(c, _)| c.clone()).collect();
        news.retain(|_, (_, left)| {
            *left -= 1;
            *left > 0
        });
        out
    }

    /// Says goodbye before the agent stops: a leaving announcement (the one liveness
    /// report peers believe, since only this node can sign it) taken into the roster
    /// and told to a few members at once, each within a second; the others learn it
    /// by their pulls. They stop choosing this node as a holder, rather than each
    /// finding out by a timeout.
    /// `note` is told the farewell's date (Unix ms) before anyone is: an agent killed
    /// while it says goodbye has it noted all the same.
    pub async fn farewell(
        &self,
        node: &Identity,
        client: &Client,
        metrics: &Metrics,
        note: impl FnOnce(u64),
    ) {
        let own = announce(node, self.listen, &self.trust, true);
        note(issued_at(&own));
        self.tell(&own);
        *self.own.lock().expect("never poisoned") = own;
        let request = Frame::Roster(self.request(&Ask::Compare)).encode();
        let me = Key(node.id().0);
        let members = self.members();
        let told = members.random_others(&me, 3, unix_millis());
        let asks = told.iter().map(|peer| {
            metrics.gossip_sent("request", request.len());
            let wait = tokio::time::timeout(
                Duration::from_secs(1),
                client.request(PeerId(peer.id.0), peer.addr, &request),
            );
            async move { wait.await.is_ok_and(|answer| answer.is_ok()) }
        });
        let answered = futures_util::future::join_all(asks).await;
        let took = answered.iter().filter(|ok| **ok).count();
        info!(
            told = took,
            of = told.len(),
            "said goodbye to the membership"
        );
    }

    /// The date of this node's announcement held now (Unix ms).
    fn own_issued_at(&self) -> u64 {
        issued_at(&self.own.lock().expect("never poisoned"))
    }

    /// The roster, locked. Lock order: the roster first, then the trust state's
    /// revocations ([`MeshTrust::verify`]); never the other way round (with a
    /// revocation waiting to write, that would deadlock).
    fn roster(&self) -> std::sync::MutexGuard<'_, Roster> {
        self.trust
            .roster()
            .expect("enabled when the state was made")
    }

    /// Takes the members' credentials a peer sent; counts what does not verify. The
    /// signatures are checked without the roster's lock (records are checked against
    /// the roster too), and only for announcements newer than the ones held. The rest
    /// of a frame is dropped at its first forgery ([`forged`]): an honest peer sends
    /// only what it verified under the same root, so a peer that pads its answers
    /// with junk costs this agent one failed check per answer, not a page of them.
    fn take(&self, metrics: &Metrics, members: &[Credentials]) {
        let mut changed = false;
        let (mut last, mut failures) = (None, 0);
        for credentials in members.iter().take(PAGE) {
            // A page comes in node-key order, each member once: a peer cannot make
            // this agent check one member's credentials over and over.
            let signed = match Signed::decode(&credentials.announcement) {
                Ok(signed) => signed,
                Err(error) => {
                    metrics.frame_refused(&format!("roster_{}", error.reason()));
                    break;
                }
            };
            if last.is_some_and(|l| signed.signer <= l) {
                metrics.frame_refused("roster_out_of_order");
                break;
            }
            last = Some(signed.signer);
            let key = signed.signer;
            let known = {
                let roster = self.roster();
                roster
                    .wants(&signed, credentials.address_range.is_some())
                    .map(|wanted| {
                        wanted.then(|| (roster.admitted(&key), roster.logged_range(&key)))
                    })
            };
            let taken = known.and_then(|known| match known {
                None => Ok(false),
                Some((admitted, logged)) => self
                    .trust
                    .verify(|v| Roster::check(v, admitted, logged, credentials))
                    .and_then(|entry| self.roster().insert(entry)),
            });
            match taken {
                Ok(grew) => {
                    if grew {
                        if let Some(passed_on) = self.passed_on(&key) {
                            self.tell_decoded(&signed, &passed_on);
                        }
                    }
                    changed |= grew;
                }
                // A key this agent's trust log does not admit (yet: an honest peer's
                // log may be ahead), found before any signature was checked.
                Err(TrustError::NotAdmitted) => {
                    metrics.frame_refused("roster_not_admitted");
                }
                Err(error) => {
                    metrics.frame_refused(&format!("roster_{}", error.reason()));
                    failures += 1;
                    if forged(&error) || failures > MAX_FAILURES_PER_FRAME {
                        break;
                    }
                }
            }
        }
        if changed {
            self.changed.notify_one();
        }
    }

    /// A member's credentials as this agent passes them on (what its trust log
    /// lacks of them included).
    fn passed_on(&self, key: &[u8; 32]) -> Option<Credentials> {
        let roster = self.roster();
        self.trust.verify(|v| roster.passed_on(key, v))
    }

    /// Whether the range grant this node would announce now (the trust log may have
    /// brought a newer one) is not the one its announcement carries.
    fn range_changed(&self) -> bool {
        let told = self
            .own
            .lock()
            .expect("never poisoned")
            .address_range
            .clone();
        told != self.trust.own_address_range()
    }

    /// Signs a fresh announcement (announcements count for
    /// [`crate::roster::ANNOUNCEMENT_LIFETIME_MS`]; the driver renews at half).
    fn reannounce(&self, node: &Identity) {
        let own = announce(node, self.listen, &self.trust, false);
        self.tell(&own);
        *self.own.lock().expect("never poisoned") = own;
        self.changed.notify_one();
    }

    /// A request for what `ask` says: a comparison carries the news to pass on, a
    /// request for the bucket digests this agent's fresh members. While this agent
    /// knows no other member, its own credentials go along every time (nobody would
    /// pass them on), and so does its admission (a peer asking for it gets the
    /// request again with it: [`Driver::spawn_request`]).
    fn request(&self, ask: &Ask) -> RosterFrame {
        let (mut members, want) = match ask {
            Ask::Compare => (self.news(), None),
            Ask::Digests => (self.fresh(), None),
            Ask::Page(want, _) => (Vec::new(), Some(want.clone())),
        };
        let roster = self.roster();
        let alone = roster.len() < 2;
        let digest = self.trust.verify(|v| roster.digest(v));
        drop(roster);
        if members.is_empty() && alone {
            members.push(self.own.lock().expect("never poisoned").clone());
        }
        let (log_size, log_root) = self.trust.log().head();
        RosterFrame {
            admission: alone.then(|| self.trust.own_admission().to_vec()),
            log_size,
            log_root: Some(log_root),
            digest: Some(digest),
            members,
            want,
            buckets_wanted: *ask == Ask::Digests,
            buckets: Vec::new(),
            next: None,
        }
    }

    /// The members whose announcement this agent holds is less than
    /// [`NEWS_FRESH_MS`] old (at most [`MAX_NEWS`]): what a peer whose roster differs
    /// most likely lacks, a push that missed it.
    fn fresh(&self) -> Vec<Credentials> {
        let since = unix_millis().saturating_sub(NEWS_FRESH_MS);
        let roster = self.roster();
        self.trust.verify(|v| roster.fresh(since, MAX_NEWS, v))
    }

    /// An answer to `request`: to one of buckets, the page of members the asker
    /// lacks of them; else nothing more if the rosters agree; else this agent's fresh
    /// members (a push that missed the asker, the usual difference), or the bucket
    /// digests when they were asked for. What is the same as the request's is left
    /// out.
    fn answer_to(&self, request: &RosterFrame, ask: Ask) -> RosterFrame {
        let their_digest = request.digest.unwrap_or_default();
        let roster = self.roster();
        let (digest, buckets, (members, next)) = self.trust.verify(|v| {
            let buckets = roster.bucket_digests(v);
            let digest = top_digest(&buckets);
            match &ask {
                Ask::Page(want, _) => (
                    digest,
                    Vec::new(),
                    roster.missing(&want.have, want.after.as_ref(), v),
                ),
                _ if their_digest == digest => (digest, Vec::new(), (Vec::new(), None)),
                Ask::Digests => (digest, buckets, (Vec::new(), None)),
                Ask::Compare => (digest, Vec::new(), (Vec::new(), None)),
            }
        });
        drop(roster);
        let members = match ask == Ask::Compare && digest != their_digest {
            true => self.fresh(),
            false => members,
        };
        let (log_size, log_root) = self.trust.log().head();
        let differs = request.log_root.is_some_and(|r| r != log_root);
        RosterFrame {
            admission: None,
            log_size,
            log_root: (log_size == request.log_size && differs).then_some(log_root),
            digest: (digest != their_digest).then_some(digest),
            members,
            want: None,
            buckets_wanted: false,
            buckets,
            next,
        }
    }

    /// The request for the buckets in which `theirs` (a peer's bucket digests)
    /// differ from ours, listing what we hold of each: from a bucket picked by
    /// `start` on, so that when more differ than fit [`MAX_HAVE`], later exchanges
    /// get the others. `None`: they do not differ (or the peer sent no buckets).
    fn want(&self, theirs: &[BucketDigest], start: usize) -> Option<Want> {
        if theirs.len() != BUCKETS {
            return None;
        }
        let roster = self.roster();
        self.trust.verify(|v| {
            let ours = roster.bucket_digests(v);
            let mut have = Vec::new();
            let mut listed = 0;
            for bucket in (0..BUCKETS).map(|i| (start + i) % BUCKETS) {
                if ours[bucket] == theirs[bucket] {
                    continue;
                }
                let bucket = u8::try_from(bucket).expect("BUCKETS is 256");
                let members = roster.summary(bucket, v);
                if listed + members.len() > MAX_HAVE && !have.is_empty() {
                    break;
                }
                listed += members.len();
                have.push(BucketHave { bucket, members });
            }
            (!have.is_empty()).then_some(Want { have, after: None })
        })
    }

    /// What to ask a peer next after its `answer` to what was `asked` (its members
    /// taken already): after a comparison whose fresh members left the rosters
    /// apart, the bucket digests; after the digests, the buckets that differ
    /// ([`GossipState::want`], from `start`); after a page of buckets, the next page
    /// ([`next_page`]); or nothing.
    fn follow_up(&self, answer: &RosterFrame, asked: Ask, start: usize) -> Option<Ask> {
        match asked {
            Ask::Compare => {
                let theirs = answer.digest?;
                let roster = self.roster();
                let ours = self.trust.verify(|v| roster.digest(v));
                (ours != theirs).then_some(Ask::Digests)
            }
            Ask::Digests => self
                .want(&answer.buckets, start)
                .map(|want| Ask::Page(want, 1)),
            Ask::Page(want, pages) => next_page(answer, pages).map(|after| {
                let want = Want {
                    after: Some(after),
                    ..want
                };
                Ask::Page(want, pages + 1)
            }),
        }
    }

    /// The server side: a request from the admitted `peer`. Its news is checked as
    /// any member's credentials are ([`GossipState::take`]: bounded, dropped at the
    /// first forgery); a request listing more than [`MAX_HAVE`] members' summaries
    /// is answered as one without `want`. What it says of its log is heard only from
    /// a member, at the address the member signed (never at one the frame names).
    pub fn answer(&self, metrics: &Metrics, peer: PeerId, request: RosterFrame) -> RosterFrame {
        self.take(metrics, &request.members);
        let want = request.want.clone().filter(|w| {
            let listed: usize = w.have.iter().map(|b| b.members.len()).sum();
            let fits = listed <= MAX_HAVE && w.have.len() <= BUCKETS;
            if !fits {
                metrics.frame_refused("roster_want_too_large");
            }
            fits
        });
        let member = self.member(&peer);
        if let (Some(from), Some(root)) = (member, request.log_root) {
            // Full: the driver is behind, and a Have is only a hint (pulls repair).
            let _ = self.heard.try_send((from, request.log_size, root));
        }
        // What the request asks; one listing too much is asked the digests again.
        let ask = match want {
            Some(want) => Ask::Page(want, 0),
            None if request.buckets_wanted || request.want.is_some() => Ask::Digests,
            None => Ask::Compare,
        };
        self.answer_to(&request, ask)
    }

    /// `peer`, if it is a current member: at the address it signed. (A revocation
    /// counts at once, before the membership is made again.)
    pub fn member(&self, peer: &PeerId) -> Option<Peer> {
        if self.trust.verify(|v| v.revoked.contains(peer)) {
            return None;
        }
        let members = self.members.lock().expect("never poisoned");
        members.get(&Key(peer.0)).cloned()
    }

    /// The membership one-hop routing uses now (what no longer counts is forgotten
    /// on the way). The list held is kept when nothing changed, so that the node,
    /// the driver and this state share one copy.
    pub fn members(&self) -> Members<SocketAddr> {
        let mut roster = self.roster();
        let made = self.trust.verify(|v| {
            roster.prune(v);
            roster.members(v)
        });
        drop(roster);
        let mut held = self.members.lock().expect("never poisoned");
        if *held != made {
            *held = made;
        }
        held.clone()
    }
}

/// What the driver needs.
pub struct Driver {
    /// Shared with the server.
    pub state: Arc<GossipState>,
    /// What members said.
    pub heard: mpsc::Receiver<Heard>,
    /// This node's key (it signs the announcements it renews).
    pub node: Arc<Identity>,
    /// The DHT node's handle (its membership is set from the roster).
    pub overlay: Overlay,
    /// The agents' secure channel.
    pub client: Arc<Client>,
    /// Counters.
    pub metrics: Arc<Metrics>,
    /// Asked first, while the roster knows nobody else.
    pub bootstrap: Vec<Peer>,
    /// The pull period.
    pub period: Duration,
    /// When this node last said goodbye (Unix ms), if it did before this start.
    pub last_farewell_ms: Option<u64>,
}

enum Done {
    /// A gossip exchange: the peer, its answer if it gave one, and what was asked
    /// (`None`: to compare; else the buckets wanted, and how many pages of them this
    /// exchange has had).
    Exchanged(Peer, Option<Box<RosterFrame>>, Ask),
    /// A log fetch from a peer: the size it claimed, and what the fetch came to.
    Fetched(u64, Synced),
    /// A comparison of a member's other history: the member, its size, and what
    /// the fetch came to.
    Compared(Key, u64, Synced),
}

impl Driver {
    /// Runs gossip until the task is aborted.
    pub async fn run(mut self) {
        let started = Instant::now();
        let now = move || u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
        let me = Key(self.node.id().0);
        let period_ms = u64::try_from(self.period.as_millis()).unwrap_or(u64::MAX);
        let config = GossipConfig {
            period: period_ms,
            fetch_timeout: FETCH_TIMEOUT_MS,
            ..GossipConfig::default()
        };
        let mut gossip = Gossip::new(me, config, self.state.trust.log().size(), now());
        let mut tasks: JoinSet<Done> = JoinSet::new();
        let mut members = self.state.members();
        let mut generation = self.state.trust.generation();
        let random = SystemRandom::new();
        let draw = || {
            let mut b = [0u8; 8];
            random.fill(&mut b).expect("the system RNG works");
            u64::from_le_bytes(b)
        };
        let mut handed = None;
        // Members' other histories of this size: compared, and again when an
        // exchange fails (first after a period).
        let mut histories = Histories::new(period_ms);
        let mut fail = injected_compare_failures();
        self.hand_members(&members, &mut handed).await;
        let mut next_bootstrap = Instant::now();
        let mut log_grew = self.state.trust.log().watch_size();
        let renew_every = Duration::from_millis(crate::roster::ANNOUNCEMENT_LIFETIME_MS / 2);
        let mut next_renewal = Instant::now() + renew_every;
        // Started within the interval of its farewell: peers holding the farewell
        // refuse the start-up announcement (`roster::MIN_REANNOUNCE_MS`), so another
        // follows the interval after it — after the farewell too, and far enough
        // after the start-up one that peers (and this roster) which took that one
        // take it as well, and every roster agrees again.
        let interval = crate::roster::MIN_REANNOUNCE_MS;
        let announced = self.state.own_issued_at();
        if self
            .last_farewell_ms
            .is_some_and(|farewell| announced < farewell.saturating_add(interval + 1_000))
        {
            let wait = (announced + interval + 100).saturating_sub(unix_millis());
            info!(
                wait_ms = wait,
                "back soon after a farewell: announcing again then"
            );
            next_renewal = Instant::now() + Duration::from_millis(wait);
        }
        loop {
            // Nobody else known yet: ask the bootstrap nodes for the roster, once a
            // period.
            if members.len() < 2 && next_bootstrap <= Instant::now() {
                next_bootstrap = Instant::now() + self.period;
                for peer in self.bootstrap.clone() {
                    self.spawn_exchange(&mut tasks, peer);
                }
            }
            let mut wake = started + Duration::from_millis(gossip.poll_timeout());
            if members.len() < 2 {
                wake = wake.min(next_bootstrap);
            }
            wake = wake.min(next_renewal);
            if let Some(retry) = histories.poll_timeout() {
                wake = wake.min(started + Duration::from_millis(retry));
            }
            tokio::select! {
                Some((peer, size, root)) = self.heard.recv() => {
                    self.compare_histories(&mut tasks, &mut histories, &mut fail, &peer, size, root);
                    gossip.on_have(now(), peer, Have { version: size });
                }
                () = self.state.changed.notified() => {
                    members = self.state.members();
                    self.hand_members(&members, &mut handed).await;
                    // Roster news: tell a few members at once (their answers carry theirs).
                    for peer in members.random_others(&me, 3, draw()) {
                        self.spawn_exchange(&mut tasks, peer);
                    }
                }
                Some(done) = tasks.join_next(), if !tasks.is_empty() => match done {
                    Ok(Done::Exchanged(peer, Some(answer), asked)) => {
                        self.state.take(&self.metrics, &answer.members);
                        let size = answer.log_size;
                        if let Some(root) = answer.log_root {
                            self.compare_histories(&mut tasks, &mut histories, &mut fail, &peer, size, root);
                        }
                        gossip.on_have(now(), peer.clone(), Have { version: size });
                        let start = usize::from(draw().to_le_bytes()[0]);
                        if let Some(next) = self.state.follow_up(&answer, asked, start) {
                            self.spawn_request(&mut tasks, peer, next);
                        }
                    }
                    Ok(Done::Exchanged(peer, None, _)) => {
                        debug!(peer = %peer.addr, "gossip exchange failed");
                    }
                    // Holding at least what was claimed settles the fetch (below: the
                    // log grew); a peer that could not be reached is no liar; one
                    // that served less than it claimed, or what does not verify, is.
                    Ok(Done::Fetched(claimed, synced)) if self.state.trust.log().size() < claimed => {
                        debug!(?synced, claimed, "log fetch brought less than claimed");
                        match synced {
                            Synced::Unreachable => gossip.fetch_done(now()),
                            _ => gossip.fetch_failed(now()),
                        }
                    }
                    Ok(Done::Fetched(..)) => {}
                    Ok(Done::Compared(member, size, synced)) => {
                        if matches!(synced, Synced::Unreachable | Synced::Refused(_)) {
                            debug!(?synced, size, "comparing another history failed: again later");
                        }
                        histories.done(now(), member, size, &synced);
                    }
                    Err(_) => {}
                },
                // Handled below, as any growth is.
                Ok(()) = log_grew.changed() => {}
                () = tokio::time::sleep_until(wake.into()) => {
                    if next_renewal <= Instant::now() {
                        next_renewal = Instant::now() + renew_every;
                        self.state.reannounce(&self.node);
                    }
                    // Announcements age and admissions expire: the membership is
                    // recomputed every period, not only when the roster changes.
                    members = self.state.members();
                    self.hand_members(&members, &mut handed).await;
                    gossip.handle_timeout(now(), &members, draw());
                }
            }
            // The log grew (a fetch, the operator, the backstop sync): news.
            let size = self.state.trust.log().size();
            if size > gossip.version() {
                gossip.learned(now(), size, &members, draw());
                // A new range grant for this node: announce it as soon as a roster
                // takes a newer announcement.
                if self.state.range_changed() {
                    info!("the trust log holds a newer address range grant for this node");
                    let soon = Instant::now()
                        + Duration::from_millis(crate::roster::MIN_REANNOUNCE_MS + 100);
                    next_renewal = next_renewal.min(soon);
                }
            }
            // Revocations change who is a member.
            if self.state.trust.generation() != generation {
                generation = self.state.trust.generation();
                members = self.state.members();
                self.hand_members(&members, &mut handed).await;
            }
            // Comparisons whose exchange failed, due again (a member no longer in the
            // membership is not asked: that counts as one more failure).
            for (member, size) in histories.due(now()) {
                match members.get(&member) {
                    Some(peer) => self.spawn_compare(&mut tasks, peer.clone(), size, &mut fail),
                    None => histories.done(now(), member, size, &Synced::Unreachable),
                }
            }
            while let Some(action) = gossip.poll_action() {
                match action {
                    Action::Send(peer, _) => self.spawn_exchange(&mut tasks, peer),
                    Action::Fetch(peer, claimed) => self.spawn_fetch(&mut tasks, peer, claimed),
                }
            }
        }
    }

    /// Gives the DHT node the membership when it differs from the one `handed` last:
    /// the first time once it holds more than this node (or when this node starts the
    /// mesh: no bootstrap), and from then on at every change — a membership that
    /// shrinks back to this node alone is one too.
    async fn hand_members(
        &self,
        members: &Members<SocketAddr>,
        handed: &mut Option<Members<SocketAddr>>,
    ) {
        let first = members.len() >= 2 || (self.bootstrap.is_empty() && !members.is_empty());
        let changed = match handed {
            Some(last) => last != members,
            None => first,
        };
        if changed {
            *handed = Some(members.clone());
            self.overlay.set_members(members.clone()).await;
        }
    }

    /// Fetches `peer`'s log through the trust log's verified exchange (`log_sync`),
    /// which takes what extends ours and keeps a contradicting checkpoint as evidence.
    fn spawn_fetch(&self, tasks: &mut JoinSet<Done>, peer: Peer, claimed: u64) {
        let (client, trust, metrics) = (
            self.client.clone(),
            self.state.trust.clone(),
            self.metrics.clone(),
        );
        tasks.spawn(async move {
            let id = PeerId(peer.id.0);
            let synced = exchange(&client, &trust, &metrics, id, peer.addr).await;
            Done::Fetched(claimed, synced)
        });
    }

    /// A member holds as many leaves as we do under another root: one of us holds
    /// another history. Its checkpoint is fetched and compared (a fork is kept as
    /// evidence, §6.13), as [`Histories`] says: once per member and size, and again
    /// (with backoff, a bounded number of times) when that exchange fails — a member
    /// says the same root until its log grows, so a lost exchange is never made up
    /// for by gossip alone. A member that keeps saying so costs one exchange per log
    /// growth. (Sizes alone, which the gossip compares, would never show two
    /// histories of one length.)
    fn compare_histories(
        &self,
        tasks: &mut JoinSet<Done>,
        histories: &mut Histories,
        fail: &mut u32,
        peer: &Peer,
        size: u64,
        root: [u8; 32],
    ) {
        let (own_size, own_root) = self.state.trust.log().head();
        if size == 0 || size != own_size || root == own_root {
            return;
        }
        if histories.noticed(peer.id, size) {
            debug!(peer = %peer.addr, size, "a member holds another history of this size");
            self.spawn_compare(tasks, peer.clone(), size, fail);
        }
    }

    /// Compares `peer`'s history of `size` leaves with ours through the trust log's
    /// verified exchange (`log_sync`), within [`FETCH_TIMEOUT_MS`], its result
    /// reported as [`Done::Compared`]. `fail` counts exchanges still to be failed on
    /// purpose (test-only: [`injected_compare_failures`]).
    fn spawn_compare(&self, tasks: &mut JoinSet<Done>, peer: Peer, size: u64, fail: &mut u32) {
        let (client, trust, metrics) = (
            self.client.clone(),
            self.state.trust.clone(),
            self.metrics.clone(),
        );
        let injected = *fail > 0;
        *fail = fail.saturating_sub(1);
        tasks.spawn(async move {
            let limit = Duration::from_millis(FETCH_TIMEOUT_MS);
            let fetch = exchange(&client, &trust, &metrics, PeerId(peer.id.0), peer.addr);
            let synced = if injected {
                debug!(peer = %peer.addr, "failing a comparison of histories on purpose (test)");
                Synced::Unreachable
            } else {
                tokio::time::timeout(limit, fetch)
                    .await
                    .unwrap_or(Synced::Unreachable)
            };
            Done::Compared(peer.id, size, synced)
        });
    }

    fn spawn_exchange(&self, tasks: &mut JoinSet<Done>, peer: Peer) {
        self.spawn_request(tasks, peer, Ask::Compare);
    }

    /// Sends `peer` the request `asked` says. A peer that does not know this node as
    /// a member yet asks for its admission: the request goes again, with it.
    fn spawn_request(&self, tasks: &mut JoinSet<Done>, peer: Peer, asked: Ask) {
        let frame = self.state.request(&asked);
        let request = Frame::Roster(frame.clone()).encode();
        let (client, metrics, state) = (
            self.client.clone(),
            self.metrics.clone(),
            self.state.clone(),
        );
        tasks.spawn(async move {
            let ask = |request: Vec<u8>| {
                let (client, peer) = (client.clone(), peer.clone());
                metrics.gossip_sent("request", request.len());
                async move {
                    let answer = client.request(PeerId(peer.id.0), peer.addr, &request).await;
                    answer
                        .ok()
                        .and_then(|bytes| postcard::from_bytes::<Frame>(&bytes).ok())
                }
            };
            let mut answer = ask(request).await;
            if matches!(&answer, Some(Frame::Refused { reason }) if reason == ADMISSION_WANTED) {
                // The same request (its news included), with the admission; the peer
                // may have closed the connection it refused on: once more on a new one.
                let again = RosterFrame {
                    admission: Some(state.trust.own_admission().to_vec()),
                    ..frame
                };
                let request = Frame::Roster(again).encode();
                answer = ask(request.clone()).await;
                if answer.is_none() {
                    answer = ask(request).await;
                }
            }
            match answer {
                Some(Frame::Roster(answer)) => Done::Exchanged(peer, Some(Box::new(answer)), asked),
                _ => Done::Exchanged(peer, None, asked),
            }
        });
    }
}

/// Test-only fault injection: how many of this agent's first comparisons of another
/// history fail as a timed-out exchange would, without being sent, read from
/// `THEMIS_TEST_FAIL_FORK_COMPARES` in debug builds (`one_hop.rs` proves such a
/// failure is retried). Release builds never read it: always 0.
fn injected_compare_failures() -> u32 {
    #[cfg(debug_assertions)]
    if let Some(n) = std::env::var("THEMIS_TEST_FAIL_FORK_COMPARES")
        .ok()
        .and_then(|n| n.parse().ok())
    {
        info!(
            n,
            "test fault injection: failing the first comparisons of histories"
        );
        return n;
    }
    0
}

/// Whether a member's credentials failing with `error` were made up, as opposed to
/// merely no longer current here (revoked, expired: revocations reach agents at
/// different moments) or one too many.
fn forged(error: &TrustError) -> bool {
    use TrustError::*;
    matches!(
        error,
        Malformed | BadSignature | NotFromRoot | WrongKey | WrongMesh | UnboundRange
    )
}

/// Where the page after `answer` (the `pages`-th of an exchange) starts, if the
/// asker should ask for it: only after a full page whose last member is the node key
/// the answer names, and never past [`MAX_PAGES`], so a peer that always says there
/// is more cannot keep an agent asking.
fn next_page(answer: &RosterFrame, pages: usize) -> Option<[u8; 32]> {
    let next = answer.next?;
    let last = answer
        .members
        .get(PAGE - 1)
        .filter(|_| answer.members.len() == PAGE)?;
    let last_key = Signed::decode(&last.announcement).ok()?.signer;
    (pages < MAX_PAGES && last_key == next).then_some(next)
}

/// This node's credentials with an announcement signed now (taken into its own
/// The date an announcement of this node's own making says (Unix ms).
fn issued_at(own: &Credentials) -> u64 {
    Signed::decode(&own.announcement)
        .ok()
        .and_then(|signed| Announcement::decode(&signed.body).ok())
        .map_or(0, |said| said.issued_at)
}

/// roster): where it listens, and whether it is leaving.
fn announce(node: &Identity, listen: SocketAddr, trust: &MeshTrust, leaving: bool) -> Credentials {
    let address_range = trust.own_address_range();
    let announcement = Signed::sign(
        node,
        ANNOUNCEMENT_LABEL,
        &Announcement {
            mesh: trust.root().mesh.as_str().into(),
            address: listen,
            issued_at: unix_millis(),
            leaving,
            address_range: address_range.as_deref().map(grant_digest),
        },
    )
    .encode();
    let own = Credentials {
        admission: Some(trust.own_admission().to_vec()),
        announcement,
        address_range,
    };
    let mut roster = trust.enable_roster().lock().expect("never poisoned");
    if let Err(error) = trust.verify(|v| roster.offer(v, &own)) {
        // Our own admission is checked at start; only a revocation gets here.
        info!(%error, "this node's own credentials do not verify: it is no member");
    }
    // All of them, whatever this node's log holds: a peer whose log lags behind takes
    // a newcomer only with its admission. (Those who pass them on drop what their
    // log holds.)
    own
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::roster::LogMembership;
    use ring::rand::SystemRandom;
    use themis_cli::operator::{self, MeshDir};
    use themis_trust::{Admission, ADMISSION_LABEL};

    struct Node {
        id: PeerId,
        state: Arc<GossipState>,
        // Kept: the state's channel closes without it.
        _heard: mpsc::Receiver<Heard>,
    }

    /// A new mesh in a temporary directory.
    fn test_mesh() -> (tempfile::TempDir, MeshDir) {
        let dir = tempfile::tempdir().unwrap();
        operator::create_mesh("test", &dir.path().join("mesh")).unwrap();
        let mesh = MeshDir::open(&dir.path().join("mesh")).unwrap();
        (dir, mesh)
    }

    /// An admitted node `name` (its directory under `dir`) with its gossip state.
    fn node(mesh: &MeshDir, dir: &tempfile::TempDir, name: &str, port: u16) -> Node {
        let dir = &dir.path().join(name);
        operator::admit_node(mesh, dir, None, false).unwrap();
        let key = crate::keystore::load(&dir.join("node.key"), &mesh.root.mesh).unwrap();
        let metrics = Arc::new(Metrics::new());
        let trust = Arc::new(MeshTrust::load(dir, mesh.root.clone(), &key, metrics).unwrap());
        let listen = SocketAddr::from(([127, 0, 0, 1], port));
        let (state, heard) = GossipState::new(&key, listen, trust);
        Node {
            id: key.id(),
            state,
            _heard: heard,
        }
    }

    /// Members the root admitted, each announcing itself (what a large mesh holds).
    fn members(mesh: &MeshDir, n: usize) -> Vec<Credentials> {
        members_with_keys(mesh, n)
            .into_iter()
            .map(|(_, c)| c)
            .collect()
    }

    /// [`members`], each with its node key, in node-key order; announced ten minutes
    /// ago (no longer fresh news).
    fn members_with_keys(mesh: &MeshDir, n: usize) -> Vec<(Identity, Credentials)> {
        let now = unix_millis() - 600_000;
        let mut out: Vec<_> = (0..n)
            .map(|i| {
                let key = Identity::generate(mesh.root.mesh.clone(), &SystemRandom::new()).unwrap();
                let admission = Admission {
                    mesh: mesh.root.mesh.to_string(),
                    node_key: *key.public_key(),
                    issued_at: now,
                    not_after: None,
                };
                let announcement = Announcement {
                    mesh: mesh.root.mesh.to_string(),
                    address: SocketAddr::from(([10, 1, (i / 250) as u8, (i % 250) as u8], 7946)),
                    issued_at: now,
                    leaving: false,
                    address_range: None,
                };
                let credentials = Credentials {
                    admission: Some(Signed::sign(&mesh.key, ADMISSION_LABEL, &admission).encode()),
                    announcement: Signed::sign(&key, ANNOUNCEMENT_LABEL, &announcement).encode(),
                    address_range: None,
                };
                (key, credentials)
            })
            .collect();
        out.sort_by_key(|(key, _)| *key.public_key());
        out
    }

    /// The members' credentials as they travel in a mesh whose agents' trust logs
    /// admit them: the announcements alone.
    fn bare(keyed: &[(Identity, Credentials)]) -> Vec<Credentials> {
        keyed
            .iter()
            .map(|(_, c)| Credentials {
                admission: None,
                ..c.clone()
            })
            .collect()
    }

    /// What a trust log admitting `keys` says of the membership.
    fn admitting<'a>(keys: impl Iterator<Item = &'a Identity>) -> LogMembership {
        LogMembership {
            admissions: keys.map(|k| (*k.public_key(), None)).collect(),
            ranges: Vec::new(),
        }
    }

    /// `member`'s credentials with its announcement signed again by `key`, now.
    fn announced_now(key: &Identity, member: &Credentials) -> Credentials {
        let signed = Signed::decode(&member.announcement).unwrap();
        let mut body = Announcement::decode(&signed.body).unwrap();
        body.issued_at = unix_millis();
        Credentials {
            announcement: Signed::sign(key, ANNOUNCEMENT_LABEL, &body).encode(),
            ..member.clone()
        }
    }

    /// `member`'s credentials with its announcement signed again by `key`, as soon
    /// as a roster takes a newer one.
    fn reannounced(key: &Identity, member: &Credentials) -> Credentials {
        let signed = Signed::decode(&member.announcement).unwrap();
        let mut body = Announcement::decode(&signed.body).unwrap();
        body.issued_at += crate::roster::MIN_REANNOUNCE_MS;
        Credentials {
            announcement: Signed::sign(key, ANNOUNCEMENT_LABEL, &body).encode(),
            ..member.clone()
        }
    }

    fn digest(node: &Node) -> [u8; 32] {
        let roster = node.state.roster();
        node.state.trust.verify(|v| roster.digest(v))
    }

    #[test]
    fn a_roster_larger_than_a_page_arrives_whole_page_by_page() {
        let (dir, mesh) = test_mesh();
        let (big, new) = (
            node(&mesh, &dir, "big", 7001),
            node(&mesh, &dir, "new", 7002),
        );
        let metrics = Metrics::new();
        // In node-key order, as pages come.
        let mut many = members(&mesh, 2 * PAGE + 100);
        many.sort_by_key(|c| Signed::decode(&c.announcement).unwrap().signer);
        big.state.take(&metrics, &many[..PAGE]);
        big.state.take(&metrics, &many[PAGE..2 * PAGE]);
        big.state.take(&metrics, &many[2 * PAGE..]);
        assert_eq!(big.state.members().len(), 2 * PAGE + 101);

        // The newcomer asks: the digests differ, so it asks for every bucket, and
        // each answer is a page.
        let requests = exchange(&new, &big, &metrics).0;
        assert_eq!(
            requests,
            1 + 1 + 3,
            "a comparison, the digests, 2 full pages and the rest"
        );
        // Both hold the same members now (the big one took the newcomer's own).
        assert_eq!(new.state.members().len(), 2 * PAGE + 102);
        assert_eq!(digest(&new), digest(&big));
        let (requests, bytes) = exchange(&new, &big, &metrics);
        assert_eq!(requests, 1, "agreeing rosters: a comparison, {bytes} bytes");
    }

    /// One exchange as the driver runs it, `asker` asking `peer`, both taking what
    /// they are sent: how many requests it took and the bytes both ways.
    fn exchange(asker: &Node, peer: &Node, metrics: &Metrics) -> (usize, usize) {
        let (mut asked, mut requests, mut bytes) = (Ask::Compare, 0, 0);
        loop {
            let request = asker.state.request(&asked);
            bytes += Frame::Roster(request.clone()).encode().len();
            let answer = peer.state.answer(metrics, asker.id, request);
            bytes += Frame::Roster(answer.clone()).encode().len();
            requests += 1;
            assert!(answer.members.len() <= PAGE);
            asker.state.take(metrics, &answer.members);
            match asker.state.follow_up(&answer, asked, 0) {
                Some(next) => asked = next,
                None => return (requests, bytes),
            }
        }
    }

    /// The traffic figure of issue 23: two agents of 10,000 members whose rosters
    /// differ by one member's newer announcement exchange a few kilobytes (a
    /// comparison, the bucket digests, one bucket's summary and the one member),
    /// where sending the roster took about 4 MB.
    #[test]
    fn rosters_of_10000_that_differ_by_one_member_exchange_kilobytes() {
        let (dir, mesh) = test_mesh();
        let (a, b) = (node(&mesh, &dir, "a", 7001), node(&mesh, &dir, "b", 7002));
        let metrics = Metrics::new();
        let keyed = members_with_keys(&mesh, 10_000);
        let many: Vec<Credentials> = keyed.iter().map(|(_, c)| c.clone()).collect();
        for page in many.chunks(PAGE) {
            a.state.take(&metrics, page);
            b.state.take(&metrics, page);
        }
        // Each learns the other's own (news): then they agree. The members are all
        // fresh news to them too: let that be passed on already.
        exchange(&a, &b, &metrics);
        exchange(&b, &a, &metrics);
        assert_eq!(digest(&a), digest(&b));
        a.state.news.lock().unwrap().clear();
        let (requests, agreeing) = exchange(&a, &b, &metrics);
        assert_eq!(requests, 1);

        // One member re-announces now, and the pushes miss `a`: the comparison's
        // answer carries `b`'s fresh members, and that is all.
        let fresh = announced_now(&keyed[4_000].0, &keyed[4_000].1);
        b.state.take(&metrics, std::slice::from_ref(&fresh));
        b.state.news.lock().unwrap().clear();
        let (requests, missed_push) = exchange(&a, &b, &metrics);
        assert_eq!(digest(&a), digest(&b), "the fresh announcement arrived");
        assert_eq!(requests, 1, "a comparison, its answer with the news");

        // An older difference (an announcement ten minutes old that `a` never took):
        // the bucket digests are asked for, then the one bucket.
        let renewed = reannounced(&keyed[5_000].0, &keyed[5_000].1);
        b.state.take(&metrics, std::slice::from_ref(&renewed));
        b.state.news.lock().unwrap().clear();
        let (requests, bytes) = exchange(&a, &b, &metrics);
        assert_eq!(digest(&a), digest(&b), "the newer announcement arrived");
        assert_eq!(requests, 3, "a comparison, the digests and one bucket");
        let roster_bytes: usize = many
            .iter()
            .map(|c| postcard::to_allocvec(c).unwrap().len())
            .sum();
        println!(
            "gossip at 10,000 members: agreeing {agreeing} B, a push missed {missed_push} B, \
             one older member apart {bytes} B (the roster itself {roster_bytes} B)"
        );
        assert!(
            bytes * 100 < roster_bytes,
            "{bytes} B for one member of {roster_bytes} B"
        );
    }

    /// The traffic figure of issue 23 (≤ 1 kbit/s sent per member to keep the
    /// membership fresh, 10,000 members, 1 % churn an hour): what each member sends,
    /// from the frames' measured sizes (postcard, before the channel's 16-byte tag
    /// and TCP) and the protocol's rates — one comparison a pull period; each change
    /// of a member (a join, a leave, a re-announcement every half lifetime) pushed
    /// in [`NEWS_SENDS`] requests by every member that takes it; and, if every join
    /// is a newly admitted node, the trust log's growth fetched once and pushed to 3.
    /// Printed for benchmarks/RESULTS.md; the sum is held to the target.
    #[test]
    fn what_keeping_the_membership_fresh_sends_per_member() {
        const N: usize = 10_000;
        let (dir, mesh) = test_mesh();
        let (a, b) = (node(&mesh, &dir, "a", 7001), node(&mesh, &dir, "b", 7002));
        let metrics = Metrics::new();
        // Admitted in the agents' trust logs: the credentials travel bare.
        let keyed = members_with_keys(&mesh, N);
        let log = admitting(keyed.iter().map(|(k, _)| k));
        let bare = bare(&keyed);
        for node in [&a, &b] {
            let mut roster = node.state.roster();
            node.state.trust.verify(|v| roster.set_log(log.clone(), v));
            drop(roster);
            for page in bare.chunks(PAGE) {
                node.state.take(&metrics, page);
            }
        }
        exchange(&a, &b, &metrics);
        exchange(&b, &a, &metrics);
        a.state.news.lock().unwrap().clear();
        b.state.news.lock().unwrap().clear();
        assert_eq!(digest(&a), digest(&b));
        let size = |frame: &RosterFrame| Frame::Roster(frame.clone()).encode().len();

        // A pull between agents that agree.
        let request = a.state.request(&Ask::Compare);
        assert!(request.admission.is_none(), "a member's request needs none");
        let answer = b.state.answer(&metrics, a.id, request.clone());
        let (compare_ask, compare_answer) = (size(&request), size(&answer));
        assert!(answer.digest.is_none() && answer.buckets.is_empty());

        // A push: one member's newer announcement, as news.
        let renewed = announced_now(&keyed[5_000].0, &bare[5_000]);
        a.state.take(&metrics, std::slice::from_ref(&renewed));
        let push = a.state.request(&Ask::Compare);
        assert_eq!(
            push.members,
            vec![renewed.clone()],
            "the announcement alone"
        );
        let answer = b.state.answer(&metrics, a.id, push.clone());
        let (push_ask, push_answer) = (size(&push), size(&answer));
        assert!(answer.digest.is_none(), "the peer took it: they agree");

        // The log's growth by one admission: fetched once (the request carries this
        // node's admission; the answer the checkpoint and the leaf), pushed to 3.
        let copy =
            std::fs::read(dir.path().join("mesh").join(themis_cli::operator::LOG_FILE)).unwrap();
        let mesh_log = themis_log::Log::from_copy(mesh.root.clone(), &copy).unwrap();
        let fetch = Frame::LogRequest {
            admission: a.state.trust.own_admission().to_vec(),
            from: mesh_log.size() - 1,
            max: crate::overlay::MAX_LOG_LEAVES,
        };
        let leaves = vec![mesh_log.leaf(mesh_log.size() - 1).unwrap().to_vec()];
        let fetched = Frame::LogAnswer {
            checkpoint: mesh_log.checkpoint().unwrap().encoded().to_vec(),
            leaves,
        };
        let (fetch_ask, fetch_answer) = (fetch.encode().len(), fetched.encode().len());
        // The backstop's exchange between logs that agree: the checkpoint only.
        let agreeing = Frame::LogAnswer {
            checkpoint: mesh_log.checkpoint().unwrap().encoded().to_vec(),
            leaves: Vec::new(),
        };
        let backstop_answer = agreeing.encode().len();

        let period_s = crate::config::Settings::default().gossip_ms as f64 / 1000.0;
        let joins_per_s = N as f64 * 0.01 / 3600.0;
        let renewals_per_s = N as f64 / (crate::roster::ANNOUNCEMENT_LIFETIME_MS as f64 / 2000.0);
        let changes_per_s = 2.0 * joins_per_s + renewals_per_s;
        let bits = |bytes: usize, per_s: f64| (bytes * 8) as f64 * per_s;
        let pulls = bits(compare_ask + compare_answer, 1.0 / period_s);
        let news = bits(
            push_ask + push_answer,
            changes_per_s * f64::from(NEWS_SENDS),
        );
        // Infect-and-die with a fanout of NEWS_SENDS misses a fraction `missed` of
        // the members (missed = e^(-f (1 - missed))): each of them hears the change
        // at its next pull, whose answer carries the peer's fresh members — the
        // comparison and the one announcement (a push's request less a comparison's).
        let fanout = f64::from(NEWS_SENDS);
        let missed = (0..100).fold(0.5, |m: f64, _| (-fanout * (1.0 - m)).exp());
        let repair_bytes = compare_ask + compare_answer + (push_ask - compare_ask);
        let repairs = bits(repair_bytes, changes_per_s * missed);
        let log_growth = bits(
            fetch_ask + fetch_answer + 3 * (compare_ask + compare_answer),
            joins_per_s,
        );
        let total = pulls + news + repairs + log_growth;
        println!(
            "membership upkeep at {N} members, 1 %/h churn: {total:.0} bit/s per member = \
             pulls {pulls:.0} (comparison {compare_ask} + {compare_answer} B every \
             {period_s} s) + news {news:.0} ({changes_per_s:.3} changes/s: \
             {renewals_per_s:.3} re-announcements, {:.3} joins and leaves; a push \
             {push_ask} + {push_answer} B, {NEWS_SENDS} per change) + repairs {repairs:.1} \
             ({:.1} % of members missed by the pushes, {repair_bytes} B each) + log growth \
             {log_growth:.0} (a fetch {fetch_ask} + {fetch_answer} B per admission); \
             not counted: the backstop log sync, 2 x ({fetch_ask} + {backstop_answer}) B \
             every {} s",
            2.0 * joins_per_s,
            missed * 100.0,
            crate::config::ONE_HOP_BACKSTOP_MS / 1000,
        );
        assert!(total <= 1_000.0, "{total:.0} bit/s per member");
    }

    #[test]
    fn an_answer_is_dropped_at_its_first_forged_member() {
        let (dir, mesh) = test_mesh();
        let taker = node(&mesh, &dir, "taker", 7001);
        let metrics = Metrics::new();
        let mut genuine = members(&mesh, 6);
        genuine.sort_by_key(|c| Signed::decode(&c.announcement).unwrap().signer);
        let mut answer = genuine.clone();
        // The second: an announcement whose signature is another member's.
        answer[1].announcement = {
            let mut signed = Signed::decode(&answer[1].announcement).unwrap();
            signed.signature = Signed::decode(&answer[2].announcement).unwrap().signature;
            signed.encode()
        };
        taker.state.take(&metrics, &answer);
        // Itself and the one before the forgery; nothing after it was checked.
        assert_eq!(taker.state.members().len(), 2);
        // The same members from an honest peer are all taken.
        taker.state.take(&metrics, &genuine);
        assert_eq!(taker.state.members().len(), 7);
    }

    /// Members this agent's trust log does not admit, sent without an admission (a
    /// peer whose log is ahead, or junk): each skipped before any signature is
    /// checked, and the frame goes on — the members after them are taken.
    #[test]
    fn members_the_log_does_not_admit_are_skipped_without_a_check() {
        let (dir, mesh) = test_mesh();
        let taker = node(&mesh, &dir, "taker", 7001);
        let metrics = Metrics::new();
        let keyed = members_with_keys(&mesh, 6);
        let log = admitting(keyed.iter().step_by(2).map(|(k, _)| k));
        let mut roster = taker.state.roster();
        taker.state.trust.verify(|v| roster.set_log(log, v));
        drop(roster);
        let bare = bare(&keyed);
        taker.state.take(&metrics, &bare);
        assert_eq!(
            taker.state.members().len(),
            1 + 3,
            "itself and the admitted three"
        );
        assert_eq!(metrics.frames_refused("roster_not_admitted"), 3);
    }

    #[test]
    fn an_answer_out_of_key_order_is_dropped_where_it_turns_back() {
        let (dir, mesh) = test_mesh();
        let taker = node(&mesh, &dir, "taker", 7001);
        let metrics = Metrics::new();
        let mut three = members(&mesh, 3);
        three.sort_by_key(|c| Signed::decode(&c.announcement).unwrap().signer);
        // One member again (a peer making this agent check it over and over), then
        // one it would take: nothing from the repeat on is looked at.
        let answer = [&three[0], &three[1], &three[0], &three[2]].map(Clone::clone);
        taker.state.take(&metrics, &answer);
        assert_eq!(taker.state.members().len(), 3, "itself and the first two");
        taker.state.take(&metrics, &three);
        assert_eq!(taker.state.members().len(), 4);
    }

    #[test]
    fn a_peer_that_always_says_there_is_more_is_asked_a_bounded_number_of_pages() {
        let (_dir, mesh) = test_mesh();
        let page = members(&mesh, PAGE);
        let last = Signed::decode(&page[PAGE - 1].announcement).unwrap().signer;
        let answer = |members: Vec<Credentials>, next| RosterFrame {
            admission: None,
            log_size: 0,
            log_root: None,
            digest: None,
            members,
            want: None,
            buckets_wanted: false,
            buckets: Vec::new(),
            next,
        };
        assert_eq!(next_page(&answer(page.clone(), Some(last)), 1), Some(last));
        // No more, a short page, a next that is not the page's last key, or past the
        // bound: the asker stops.
        assert_eq!(next_page(&answer(page.clone(), None), 1), None);
        assert_eq!(next_page(&answer(page[1..].to_vec(), Some(last)), 1), None);
        assert_eq!(next_page(&answer(page.clone(), Some([0xff; 32])), 1), None);
        assert_eq!(
            next_page(&answer(page.clone(), Some(last)), MAX_PAGES),
            None
        );
    }

    /// Roster news goes along in the next [`NEWS_SENDS`] requests (the pushes at a
    /// change), reaches a peer that way, and is dropped after.
    #[test]
    fn news_goes_along_in_three_requests_then_is_left_to_pulls() {
        let (dir, mesh) = test_mesh();
        let (teller, hearer) = (
            node(&mesh, &dir, "teller", 7001),
            node(&mesh, &dir, "hearer", 7002),
        );
        let metrics = Metrics::new();
        let two: Vec<Credentials> = members_with_keys(&mesh, 2)
            .iter()
            .map(|(key, member)| announced_now(key, member))
            .collect();
        teller.state.take(&metrics, &two);
        let first = teller.state.request(&Ask::Compare);
        // Its own announcement and the two members it took, in key order.
        assert_eq!(first.members.len(), 3);
        hearer.state.answer(&metrics, teller.id, first);
        assert_eq!(
            hearer.state.members().len(),
            4,
            "itself, the teller and two"
        );
        assert_eq!(teller.state.request(&Ask::Compare).members.len(), 3);
        assert_eq!(teller.state.request(&Ask::Compare).members.len(), 3);
        assert!(
            teller.state.request(&Ask::Compare).members.is_empty(),
            "sent 3 times"
        );
        // A request for buckets carries no news.
        teller.state.take(&metrics, &members(&mesh, 1));
        let want = Want {
            have: Vec::new(),
            after: None,
        };
        assert!(teller.state.request(&Ask::Page(want, 1)).members.is_empty());
    }

    /// A request listing more members than [`MAX_HAVE`] is answered with the bucket
    /// digests (as a request for them), not searched.
    #[test]
    fn a_request_listing_too_much_is_answered_with_digests_only() {
        let (dir, mesh) = test_mesh();
        let (asker, peer) = (
            node(&mesh, &dir, "asker", 7001),
            node(&mesh, &dir, "peer", 7002),
        );
        let metrics = Metrics::new();
        let have = vec![BucketHave {
            bucket: 0,
            members: vec![([0; 32], 0); MAX_HAVE + 1],
        }];
        let request = asker
            .state
            .request(&Ask::Page(Want { have, after: None }, 1));
        let answer = peer.state.answer(&metrics, asker.id, request);
        assert!(answer.members.is_empty());
        assert_eq!(answer.buckets.len(), BUCKETS);
        assert_eq!(metrics.frames_refused("roster_want_too_large"), 1);
    }
}
