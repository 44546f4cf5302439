//! What the Envoy filter decodes (filter/themis-envoy): the local agent's answers
//! (`agent::parse_instances`, `parse_revocations`, `parse_public_identity`,
//! `parse_signature`) and the plugin configuration (`Config::parse`), from raw bytes or
//! from JSON built around fuzzed fields (then optionally edited as bytes), so the
//! fuzzer gets past serde at once; and the outbound routing table (`route::Routes`)
//! the verified instances go into.
//!
//! Beyond "returns on any input":
//! * an instance is accepted only if it is the genuine workload's record signed under
//!   the fixed mesh root (`src/trust.rs`), for the asked service, with the genuine
//!   endpoint and metadata, under the agent's id for it, and never once revoked; the
//!   genuine records under the right id are always accepted (one per listed entry);
//! * a revocation set holds only what the fixed root revoked (the genuine revocation),
//!   and the genuine list is always accepted;
//! * a public identity is accepted only for the asked workload and mesh and matching
//!   the id the answer states; the genuine one is always accepted; a signature is
//!   exactly the 64 bytes sent;
//! * an accepted configuration satisfies every documented check (names, mesh equal to
//!   the root's, time bounds, role-specific sections, canary weights, policy ids);
//! * a pick is one of the cached instances of the service that takes a transport the
//!   caller speaks, fresh, avoiding instances marked down unless all are, and follows
//!   the canary split;
//! * the reader of the agent's HTTP/1.1 answers (`themis_agent_client::exchange::answer`,
//!   every runtime's) takes any bytes, and reads a chunked body back whole.
#![no_main]

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use serde_json::{json, Map, Value};
use themis_core::{MeshName, PeerId};
use themis_sidecar::agent::{
    parse_instances, parse_public_identity, parse_revocations, parse_signature, Instance,
};
use themis_sidecar::config::{
    is_name, Canary, Config, Policy, Role, Rule, Transport, TRANSPORT_LABEL,
};
use themis_trust::Metadata;
use themis_sidecar::route::{Pick, Routes};
use themis_fuzz::trust::{trust, SERVICE};
use themis_fuzz::{mesh, Edit, MESH};

/// A JSON document: raw bytes, built from fuzzed fields, or built and then edited.
#[derive(Arbitrary, Debug)]
enum Body<T> {
    Raw(Vec<u8>),
    Built(T),
    Edited(T, Vec<Edit>),
}

#[derive(Arbitrary, Debug)]
enum Input {
    Instances { body: Body<Vec<Entry>>, service: Text, revoked: bool },
    Revocations(Body<Vec<RevEntry>>),
    Identity { body: Body<KeyIn>, workload: Text },
    Signature(Body<SigIn>),
    Config(Body<ConfigIn>),
    Routes { canary: Vec<(u8, bool, u8)>, ops: Vec<RouteOp> },
    /// The native runtime's reading of its agent's HTTP/1.1 answers: a status and a
    /// body sent chunked as the fuzzer splits it.
    AgentAnswer { status: u16, chunks: Vec<Vec<u8>> },
}

/// A string: a well-known one or the fuzzer's own.
#[derive(Arbitrary, Debug, Clone)]
enum Text {
    /// The genuine service (`check`), the genuine workload name (`w`), the mesh.
    Service,
    Workload,
    Mesh,
    Known(u8),
    Own(String),
}

const KNOWN: &[&str] = &[
    "",
    "a",
    "-a",
    "a-",
    "Check",
    "check-2",
    "x.y",
    "fuzz",
    "demo",
    "../etc",
    " check",
    "a-b-c-d-e-f-g-h-i-j-k-l-m-n-o-p-q-r-s-t-u-v-w-x-y-z-0-1-2-3-4-5-6",
    "é",
    "\u{0}",
];

impl Text {
    fn get(&self) -> String {
        match self {
            Text::Service => SERVICE.into(),
            Text::Workload => "w".into(),
            Text::Mesh => MESH.into(),
            Text::Known(i) => KNOWN[usize::from(*i) % KNOWN.len()].into(),
            Text::Own(s) => s.clone(),
        }
    }
}

/// A printable peer id.
#[derive(Arbitrary, Debug)]
enum IdIn {
    /// The genuine workload's (whose records the fixed node signed).
    Workload,
    /// The fixed node's.
    Node,
    /// The workload's in another mesh.
    OtherMesh,
    /// The workload's, edited as bytes.
    Edited(Vec<Edit>),
    Own(String),
}

impl IdIn {
    fn get(&self) -> String {
        let t = trust();
        match self {
            IdIn::Workload => t.workload.printable_id(),
            IdIn::Node => t.node.printable_id(),
            IdIn::OtherMesh => t.workload.id().printable(&MeshName::new("demo").unwrap()),
            IdIn::Edited(edits) => {
                let mut bytes = t.workload.printable_id().into_bytes();
                edits.iter().for_each(|e| e.apply(&mut bytes));
                String::from_utf8_lossy(&bytes).into_owned()
            }
            IdIn::Own(s) => s.clone(),
        }
    }
}

/// Some bytes as the JSON string the agent sends (hex), or any JSON value.
#[derive(Arbitrary, Debug)]
enum HexIn {
    /// Genuine value / revocation number `which`, hex.
    Genuine(u8),
    /// ... in upper case.
    Upper(u8),
    /// ... edited before hex.
    Edited(u8, Vec<Edit>),
    /// Bytes of the fuzzer's own, hex.
    Bytes(Vec<u8>),
    /// Not hex (or not a string).
    Text(String),
    Number(i64),
    Null,
}

impl HexIn {
    fn get(&self, genuine: &[Vec<u8>]) -> Value {
        let pick = |i: &u8| genuine[usize::from(*i) % genuine.len()].clone();
        match self {
            HexIn::Genuine(i) => hex::encode(pick(i)).into(),
            HexIn::Upper(i) => hex::encode_upper(pick(i)).into(),
            HexIn::Edited(i, edits) => {
                let mut bytes = pick(i);
                edits.iter().for_each(|e| e.apply(&mut bytes));
                hex::encode(bytes).into()
            }
            HexIn::Bytes(b) => hex::encode(b).into(),
            HexIn::Text(s) => s.clone().into(),
            HexIn::Number(n) => (*n).into(),
            HexIn::Null => Value::Null,
        }
    }

    /// Genuine value number `n` unchanged.
    fn genuine(&self) -> Option<usize> {
        match self {
            HexIn::Genuine(i) | HexIn::Upper(i) => Some(usize::from(*i)),
            _ => None,
        }
    }
}

/// One listed instance.
#[derive(Arbitrary, Debug)]
struct Entry {
    id: IdIn,
    record: HexIn,
    /// The fields the agent adds and the filter ignores.
    extra: bool,
}

#[derive(Arbitrary, Debug)]
struct RevEntry {
    revocation: HexIn,
    extra: bool,
}

#[derive(Arbitrary, Debug)]
struct KeyIn {
    workload: Text,
    mesh: Text,
    id: IdIn,
    /// The public key: the workload's, the node's, bytes of the fuzzer's own, or any
    /// text.
    key: KeySrc,
    extra: bool,
}

#[derive(Arbitrary, Debug)]
enum KeySrc {
    Workload,
    Node,
    Bytes(Vec<u8>),
    Own(String),
}

/// A signature answer: `bytes` as hex (upper case if `upper`), or any text.
#[derive(Arbitrary, Debug)]
enum SigIn {
    Bytes { bytes: Vec<u8>, upper: bool },
    Own(String),
}

#[derive(Arbitrary, Debug)]
enum RoleIn {
    Outbound,
    Seal,
    Inbound,
    Own(Text),
}

#[derive(Arbitrary, Debug)]
enum RootIn {
    /// The fixed root, as `fuzz:<hex>`.
    Fixed,
    /// `<mesh>:<hex of key>`.
    Parts(Text, Vec<u8>),
    Own(String),
}

#[derive(Arbitrary, Debug)]
struct RuleIn {
    service: Option<Text>,
    id: Option<IdIn>,
}

#[derive(Arbitrary, Debug)]
struct CanaryIn {
    service: Text,
    matches: Vec<(Text, Text)>,
    weight_percent: i64,
}

#[derive(Arbitrary, Debug)]
struct ConfigIn {
    role: Option<RoleIn>,
    mesh_root: Option<RootIn>,
    mesh: Option<Text>,
    workload: Option<Text>,
    service: Option<Text>,
    agent_cluster: Option<Text>,
    timeout_ms: Option<i64>,
    resolve_ttl_secs: Option<i64>,
    down_secs: Option<i64>,
    revocation_poll_secs: Option<i64>,
    policy: Option<Vec<RuleIn>>,
    canary: Option<Vec<CanaryIn>>,
    hellos_per_source: Option<(i64, i64)>,
    hello_window_secs: Option<i64>,
    replay_cache_entries: Option<i64>,
    unknown: Option<Text>,
}

fn bytes<T>(body: &Body<T>, build: impl Fn(&T) -> Value) -> (Vec<u8>, Option<&T>) {
    match body {
        Body::Raw(raw) => (raw.clone(), None),
        Body::Built(fields) => (serde_json::to_vec(&build(fields)).unwrap(), Some(fields)),
        Body::Edited(fields, edits) => {
            let mut bytes = serde_json::to_vec(&build(fields)).unwrap();
            edits.iter().for_each(|e| e.apply(&mut bytes));
            (bytes, None)
        }
    }
}

fn instances(body: &Body<Vec<Entry>>, service: &str, revoked: bool) {
    let t = trust();
    let verifier = if revoked { t.revoking_verifier() } else { t.verifier() };
    let (body, built) = bytes(body, |entries| {
        let list: Vec<Value> = entries
            .iter()
            .map(|e| {
                // Every field of the agent's `api::Instance`; the filter reads id and record.
                let mut o = json!({
                    "id": e.id.get(), "record": e.record.get(&t.values),
                    "public_key": hex::encode(t.workload.public_key()),
                    "endpoint": "10.0.0.7:15006", "metadata": {},
                    "endorser": t.node.printable_id(), "not_after": 0,
                });
                if e.extra {
                    o["unknown"] = json!([1, "x"]);
                }
                o
            })
            .collect();
        json!({ "service": SERVICE, "instances": list, "cached": false, "refused": 0,
                "answered": 1, "replicas": 1 })
    });
    let Ok(results) = parse_instances(&body, service, &verifier) else {
        let strings = |e: &Entry| !matches!(e.record, HexIn::Number(_) | HexIn::Null);
        assert!(!built.is_some_and(|e| e.iter().all(strings)), "a built answer parses");
        return;
    };
    let endpoint: SocketAddr = "10.0.0.7:15006".parse().unwrap();
    let metadata = BTreeMap::from([("version".to_string(), "v2".to_string())]);
    for result in &results {
        if let Ok(instance) = result {
            // Vouched for by the node, directly or through the authority's grant.
            let direct = vec![*t.node.public_key()];
            let delegated = vec![t.delegated_chain[1].signer, *t.node.public_key()];
            let vouched_by = instance.vouched_by.clone();
            assert!(vouched_by == direct || vouched_by == delegated, "vouched by {vouched_by:?}");
            let genuine =
                Instance { id: t.workload.id(), endpoint, metadata: metadata.clone(), vouched_by };
            assert_eq!(instance, &genuine, "an instance the fixed node never endorsed");
            assert_eq!(service, SERVICE, "an instance accepted for another service");
            assert!(!revoked, "a revoked workload accepted");
        }
    }
    if let Some(entries) = built {
        assert_eq!(results.len(), entries.len(), "one result per listed instance");
        for (entry, result) in entries.iter().zip(&results) {
            // The genuine records (0: direct grant, 1: delegated; 2 is a tombstone)
            // under the workload's own id (in any spelling that parses to it) are
            // always usable; under another id, for another service or once revoked,
            // nothing is. (Other record bytes may still carry the same signed content:
            // the encoding's varints are not canonical; the check above covers them.)
            let right_id = PeerId::parse_in(&entry.id.get(), &mesh()) == Ok(t.workload.id());
            let record = entry.record.get(&t.values);
            let record = record.as_str().and_then(|h| hex::decode(h).ok());
            let genuine = record.is_some_and(|r| t.values[..2].contains(&r));
            let eligible = right_id && service == SERVICE && !revoked;
            if eligible && genuine {
                assert!(result.is_ok(), "{entry:?}: {result:?}");
            }
            if !eligible {
                assert!(result.is_err(), "{entry:?}: {result:?}");
            }
        }
    }
}

fn revocations(body: &Body<Vec<RevEntry>>) {
    let t = trust();
    let genuine = [t.revocation.encode()];
    let (body, built) = bytes(body, |entries| {
        let list: Vec<Value> = entries
            .iter()
            .map(|e| {
                let mut o = json!({
                    "id": t.workload.printable_id(), "issued_at": 0, "reason": "fuzz",
                    "revocation": e.revocation.get(&genuine),
                });
                if e.extra {
                    o["unknown"] = json!({});
                }
                o
            })
            .collect();
        json!({ "revocations": list })
    });
    let result = parse_revocations(&body, &t.root);
    if let Ok(set) = &result {
        assert!(set.len() <= 1, "the fixed root revoked one workload");
        for (id, _, _) in set.iter() {
            assert_eq!(id, &t.workload.id(), "a revocation the root never signed");
        }
    }
    if let Some(entries) = built {
        if entries.iter().all(|e| e.revocation.genuine().is_some()) {
            let set = result.expect("the genuine revocations are accepted");
            assert_eq!(set.contains(&t.workload.id()), !entries.is_empty());
        }
    }
}

/// The fields of a key answer the checks read back.
#[derive(serde::Deserialize)]
struct Stated {
    workload: String,
    mesh: String,
    id: String,
}

fn identity(body: &Body<KeyIn>, workload: &str) {
    let t = trust();
    let (body, built) = bytes(body, |k| {
        let key = match &k.key {
            KeySrc::Workload => hex::encode(t.workload.public_key()),
            KeySrc::Node => hex::encode(t.node.public_key()),
            KeySrc::Bytes(b) => hex::encode(b),
            KeySrc::Own(s) => s.clone(),
        };
        let mut o = json!({
            "workload": k.workload.get(), "mesh": k.mesh.get(), "id": k.id.get(),
            "public_key": key,
        });
        if k.extra {
            o["private_key_pem"] = "never sent".into();
        }
        o
    });
    let result = parse_public_identity(&body, workload, &mesh());
    if let Ok(identity) = &result {
        // Any 32 bytes are a public key; what must hold is that the answer is for us
        // and its id is the key's. (Read back as the filter reads it: serde_json skips
        // ignored fields without checking their escapes, so the body need not be
        // valid JSON for `Value`.)
        let stated: Stated = serde_json::from_slice(&body).expect("the fields parse again");
        assert_eq!(stated.workload, workload);
        assert_eq!(stated.mesh, MESH);
        assert_eq!(stated.id, identity.printable_id());
        assert_eq!(identity.mesh(), &mesh());
    }
    if let Some(k) = built {
        let genuine = k.workload.get() == workload
            && is_name(workload)
            && k.mesh.get() == MESH
            && matches!(k.id, IdIn::Workload)
            && matches!(k.key, KeySrc::Workload);
        if genuine {
            assert_eq!(result.as_ref().expect("the genuine identity loads"), t.workload.public());
        }
        // The workload's key under an id that is not the workload's: refused.
        if matches!(k.key, KeySrc::Workload) && k.id.get() != t.workload.printable_id() {
            assert!(result.is_err(), "the key under another id: {k:?}");
        }
    }
}

fn signature(body: &Body<SigIn>) {
    let (body, built) = bytes(body, |sig| {
        let text = match sig {
            SigIn::Bytes { bytes, upper: false } => hex::encode(bytes),
            SigIn::Bytes { bytes, upper: true } => hex::encode_upper(bytes),
            SigIn::Own(s) => s.clone(),
        };
        json!({ "signature": text })
    });
    let result = parse_signature(&body);
    if let Some(SigIn::Bytes { bytes, .. }) = built {
        match &result {
            Ok(sig) => assert_eq!(&sig[..], &bytes[..], "the signature is the bytes sent"),
            Err(_) => assert_ne!(bytes.len(), 64, "64 bytes of hex are a signature"),
        }
    }
}

fn config(body: &Body<ConfigIn>) {
    let t = trust();
    let (body, _) = bytes(body, |c| {
        let mut o = Map::new();
        let mut put = |k: &str, v: Option<Value>| {
            if let Some(v) = v {
                o.insert(k.into(), v);
            }
        };
        put(
            "role",
            c.role.as_ref().map(|r| {
                match r {
                    RoleIn::Outbound => "outbound".into(),
                    RoleIn::Seal => "seal".into(),
                    RoleIn::Inbound => "inbound".into(),
                    RoleIn::Own(s) => s.get(),
                }
                .into()
            }),
        );
        put(
            "mesh_root",
            c.mesh_root.as_ref().map(|r| {
                match r {
                    RootIn::Fixed => t.root.to_string(),
                    RootIn::Parts(m, key) => format!("{}:{}", m.get(), hex::encode(key)),
                    RootIn::Own(s) => s.clone(),
                }
                .into()
            }),
        );
        put("mesh", c.mesh.as_ref().map(|m| m.get().into()));
        put("workload", c.workload.as_ref().map(|m| m.get().into()));
        put("service", c.service.as_ref().map(|m| m.get().into()));
        put("agent_cluster", c.agent_cluster.as_ref().map(|m| m.get().into()));
        put("timeout_ms", c.timeout_ms.map(Value::from));
        put("resolve_ttl_secs", c.resolve_ttl_secs.map(Value::from));
        put("down_secs", c.down_secs.map(Value::from));
        put("revocation_poll_secs", c.revocation_poll_secs.map(Value::from));
        put(
            "policy",
            c.policy.as_ref().map(|rules| {
                let allow: Vec<Value> = rules
                    .iter()
                    .map(|r| {
                        let mut o = Map::new();
                        if let Some(s) = &r.service {
                            o.insert("service".into(), s.get().into());
                        }
                        if let Some(id) = &r.id {
                            o.insert("id".into(), id.get().into());
                        }
                        Value::Object(o)
                    })
                    .collect();
                json!({ "allow": allow })
            }),
        );
        put(
            "canary",
            c.canary.as_ref().map(|list| {
                list.iter()
                    .map(|c| {
                        let matches: Map<String, Value> =
                            c.matches.iter().map(|(k, v)| (k.get(), v.get().into())).collect();
                        json!({ "service": c.service.get(), "match": matches,
                                "weight_percent": c.weight_percent })
                    })
                    .collect()
            }),
        );
        put(
            "hellos_per_source",
            c.hellos_per_source.map(|(p, b)| json!({ "per_second": p, "burst": b })),
        );
        put("hello_window_secs", c.hello_window_secs.map(Value::from));
        put("replay_cache_entries", c.replay_cache_entries.map(Value::from));
        if let Some(key) = &c.unknown {
            o.insert(key.get(), Value::Null);
        }
        Value::Object(o)
    });
    let Ok(config) = Config::parse(&body) else { return };
    assert_eq!(config.mesh, config.mesh_root.mesh, "the mesh is the root's");
    assert!(is_name(&config.workload), "workload {:?}", config.workload);
    if let Some(service) = &config.service {
        assert!(is_name(service), "service {service:?}");
    }
    assert!(!config.agent_cluster.is_empty());
    assert!((1..=600_000).contains(&config.timeout.as_millis()), "{:?}", config.timeout);
    assert!(config.revocation_poll.as_secs() >= 1);
    if config.policy.is_some() {
        assert_eq!(config.role, Role::Inbound, "policies are the inbound role's");
    }
    if !config.canary.is_empty() {
        assert_eq!(config.role, Role::Outbound, "canaries are the outbound role's");
    }
    let rate = config.hellos_per_source;
    assert!(rate.per_second >= 1 && rate.burst >= 1, "{rate:?}");
    assert!((1..=3_600).contains(&config.hello_window.as_secs()), "{:?}", config.hello_window);
    assert!(config.replay_cache_entries <= 1 << 20);
    for c in &config.canary {
        assert!(is_name(&c.service) && c.weight_percent <= 100 && !c.matches.is_empty());
    }
    let rules = match &config.policy {
        Some(Policy::Allow(rules)) => rules.as_slice(),
        Some(Policy::AnyCaller) | None => &[],
    };
    for rule in rules {
        match rule {
            Rule::Service(s) => assert!(is_name(s), "rule service {s:?}"),
            Rule::Id(id) => {
                // The id parsed in the configured mesh: it prints back in it.
                let printable = id.printable(&config.mesh);
                assert_eq!(PeerId::parse_in(&printable, &config.mesh), Ok(*id));
            }
        }
    }
}

#[derive(Arbitrary, Debug)]
enum RouteOp {
    Cache { service: u8, instances: Vec<u8>, ttl_ms: u16 },
    MarkDown { instance: u8, for_ms: u16 },
    Expire,
    Advance(u16),
    Pick { service: u8, speaks: u8, random: u32 },
    Withdraw { endorser: u8 },
}

fn service_name(n: u8) -> String {
    format!("s{}", n % 4)
}

fn pool_instance(n: u8) -> Instance {
    let n = n % 8;
    Instance {
        id: PeerId([n; 32]),
        endpoint: SocketAddr::from(([10, 0, 0, n], 15006)),
        metadata: pool_metadata(n),
        vouched_by: vec![pool_endorser(n)],
    }
}

/// Its version, and which transports it takes: by `n % 4`, the channel by default
/// (no label), TLS alone, both, or the channel named.
fn pool_metadata(n: u8) -> Metadata {
    let mut metadata = BTreeMap::from([(
        "version".to_string(),
        if n % 2 == 0 { "v1" } else { "v2" }.to_string(),
    )]);
    let takes = match n % 4 {
        0 => None,
        1 => Some("tls"),
        2 => Some("tls,themis"),
        _ => Some("themis"),
    };
    if let Some(takes) = takes {
        metadata.insert(TRANSPORT_LABEL.to_string(), takes.to_string());
    }
    metadata
}

/// What a caller speaks, by preference: the Wasm runtimes' channel, TLS alone, or the
/// native runtime's both.
fn pool_speaks(n: u8) -> &'static [Transport] {
    match n % 3 {
        0 => &[Transport::Themis],
        1 => &[Transport::Tls],
        _ => &[Transport::Tls, Transport::Themis],
    }
}

/// Whether an instance with `metadata` takes one of `speaks`, as the model reads the
/// label (independently of `config::Takes`).
fn model_takes(metadata: &Metadata, speaks: &[Transport]) -> bool {
    let takes: Vec<&str> = match metadata.get(TRANSPORT_LABEL) {
        None => vec!["themis"],
        Some(names) => names.split(',').collect(),
    };
    speaks.iter().any(|t| takes.contains(&t.as_str()))
}

/// One of three endorsing nodes (instance `n` is endorsed by `n % 3`).
fn pool_endorser(n: u8) -> [u8; 32] {
    [100 + n % 3; 32]
}

fn routes(canary: &[(u8, bool, u8)], ops: &[RouteOp]) {
    let canary: Vec<Canary> = canary
        .iter()
        .take(4)
        .map(|&(s, v2, w)| Canary {
            service: service_name(s),
            matches: BTreeMap::from([(
                "version".to_string(),
                if v2 { "v2" } else { "v1" }.to_string(),
            )]),
            weight_percent: u32::from(w % 101),
        })
        .collect();
    let mut routes = Routes::new(canary.clone());
    // The model: service -> (instances, expiry); id -> down until.
    let mut cached: HashMap<String, (Vec<Instance>, u64)> = HashMap::new();
    let mut down: HashMap<PeerId, u64> = HashMap::new();
    let mut now: u64 = 1_000_000;
    for op in ops.iter().take(256) {
        match op {
            RouteOp::Cache { service, instances, ttl_ms } => {
                let list: Vec<Instance> =
                    instances.iter().take(16).map(|&n| pool_instance(n)).collect();
                let expires = now + u64::from(*ttl_ms);
                routes.cache(&service_name(*service), list.clone(), expires);
                cached.insert(service_name(*service), (list, expires));
            }
            RouteOp::MarkDown { instance, for_ms } => {
                let id = pool_instance(*instance).id;
                routes.mark_down(id, now + u64::from(*for_ms));
                down.insert(id, now + u64::from(*for_ms));
            }
            RouteOp::Expire => {
                routes.expire(now);
                cached.retain(|_, (_, e)| *e > now);
                down.retain(|_, until| *until > now);
            }
            RouteOp::Advance(ms) => now += u64::from(*ms),
            RouteOp::Withdraw { endorser } => {
                let revoked = pool_endorser(*endorser);
                routes.withdraw(|i| i.vouched_by.contains(&revoked));
                cached.retain(|_, (list, _)| {
                    list.retain(|i| !i.vouched_by.contains(&revoked));
                    !list.is_empty()
                });
            }
            RouteOp::Pick { service, speaks, random } => {
                let name = service_name(*service);
                let speaks = pool_speaks(*speaks);
                let pick = routes.pick(&name, speaks, now, *random);
                let Some((list, _)) = cached.get(&name).filter(|(_, e)| *e > now) else {
                    assert_eq!(pick, Pick::Resolve, "{name} is not cached at {now}");
                    continue;
                };
                let callable: Vec<&Instance> =
                    list.iter().filter(|i| model_takes(&i.metadata, speaks)).collect();
                let is_up = |i: &Instance| down.get(&i.id).is_none_or(|&u| u <= now);
                let up: Vec<&Instance> = callable.iter().copied().filter(|i| is_up(i)).collect();
                let candidates: Vec<&Instance> = if up.is_empty() { callable.clone() } else { up };
                let Pick::Instance(picked) = pick else {
                    assert!(callable.is_empty(), "no pick from {callable:?}: {pick:?}");
                    assert_eq!(pick, Pick::NoInstance);
                    continue;
                };
                assert!(candidates.contains(&&picked), "picked {picked:?} of {candidates:?}");
                if let Some(split) = canary.iter().find(|c| c.service == name) {
                    let in_canary = |i: &Instance| {
                        split.matches.iter().all(|(k, v)| i.metadata.get(k) == Some(v))
                    };
                    let to_canary = (random & 0xffff) % 100 < split.weight_percent;
                    let side_exists = candidates.iter().any(|i| in_canary(i) == to_canary);
                    if side_exists {
                        assert_eq!(in_canary(&picked), to_canary, "the split was not followed");
                    }
                }
            }
        }
    }
}

/// The agent's answer, as every runtime's client reads it.
fn http_body(answer: &[u8]) -> Result<Vec<u8>, themis_agent_client::ClientError> {
    let (status, body) = themis_agent_client::exchange::answer(answer)?;
    themis_agent_client::success(status, body)
}

/// A chunked answer reads back whole when its status is 2xx, and is refused otherwise.
fn agent_answer(status: u16, chunks: &[Vec<u8>]) {
    let status = 100 + status % 900;
    let mut answer = format!("HTTP/1.1 {status} X\r\ntransfer-encoding: chunked\r\n\r\n").into_bytes();
    for chunk in chunks.iter().filter(|c| !c.is_empty()) {
        answer.extend_from_slice(format!("{:x}\r\n", chunk.len()).as_bytes());
        answer.extend_from_slice(chunk);
        answer.extend_from_slice(b"\r\n");
    }
    answer.extend_from_slice(b"0\r\n\r\n");
    match http_body(&answer) {
        Ok(body) => {
            assert!((200..300).contains(&status), "{status} accepted");
            assert_eq!(body, chunks.concat());
        }
        Err(e) => assert!(!(200..300).contains(&status), "{status} refused: {e}"),
    }
    // Every cut of it is refused or read, never a panic.
    for end in [0, answer.len() / 3, answer.len() / 2, answer.len().saturating_sub(3)] {
        let _ = http_body(&answer[..end]);
    }
}

fuzz_target!(|input: Input| {
    match &input {
        Input::Instances { body, service, revoked } => instances(body, &service.get(), *revoked),
        Input::Revocations(body) => revocations(body),
        Input::Identity { body, workload } => identity(body, &workload.get()),
        Input::Signature(body) => signature(body),
        Input::Config(body) => config(body),
        Input::Routes { canary, ops } => routes(canary, ops),
        Input::AgentAnswer { status, chunks } => agent_answer(*status, chunks),
    }
    // Raw bytes also reach every decoder, whatever the input was meant for.
    if let Input::Instances { body: Body::Raw(raw), .. }
    | Input::Revocations(Body::Raw(raw))
    | Input::Config(Body::Raw(raw)) = &input
    {
        let t = trust();
        if let Ok(results) = parse_instances(raw, SERVICE, &t.verifier()) {
            for instance in results.into_iter().flatten() {
                assert_eq!(instance.id, t.workload.id(), "an instance the root never endorsed");
            }
        }
        if let Ok(set) = parse_revocations(raw, &t.root) {
            assert!(set.iter().all(|(id, _, _)| id == &t.workload.id()));
        }
        let _ = parse_public_identity(raw, "w", &mesh());
        let _ = parse_signature(raw);
        let _ = Config::parse(raw);
        let _ = http_body(raw);
    }
});
