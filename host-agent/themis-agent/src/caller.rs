//! Who is calling the local API, as the kernel says, and what they may do.
//!
//! The API socket is open to every local process (mode 0666): connecting proves
//! nothing. Each connection's caller is read from the kernel when it connects —
//! `SO_PEERCRED` (pid, uid, gid) and the pid's cgroup v2 path — and every request is
//! authorised by it ([`Access::decide`]):
//!
//! * **anyone**: what the ring tells anybody anyway — status, ring, resolve, explain,
//!   revocations (read);
//! * **a workload's own proxy** (a caller inside the cgroup the workload is bound to,
//!   with its uid when one is bound): that workload's public identity and its
//!   handshake signatures (the private key never leaves the agent);
//! * **the operator** (an operator uid in an operator cgroup): everything else —
//!   workloads, keys, registration, deregistration, capture, revocations (publish),
//!   debug.
//!
//! `docs/AGENT.md` states the trust model; the decision is a pure function, tested
//! here, and the API counts every refusal by reason.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use axum::extract::connect_info::Connected;
use axum::serve::IncomingStream;
use themis_capture::CaptureSpec;
use tokio::net::UnixListener;

use crate::names::WorkloadName;

/// Where cgroup v2 is mounted (`/sys/fs/cgroup`, or `/sys/fs/cgroup/unified` on a
/// hybrid host): `/proc/<pid>/cgroup` paths are relative to it.
pub fn cgroup_root() -> &'static Path {
    static ROOT: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    ROOT.get_or_init(|| themis_capture::cgroup2_mount().unwrap_or_else(|| "/sys/fs/cgroup".into()))
}

/// A local API caller, as the kernel identified it when it connected.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Caller {
    /// Its pid in the agent's pid namespace (`None`: the kernel could not map it).
    pub pid: Option<i32>,
    /// Its effective uid and gid when it connected.
    pub uid: u32,
    /// Its gid.
    pub gid: u32,
    /// Its cgroup v2 directory (`/sys/fs/cgroup/...`), read right after it connected.
    pub cgroup: Option<PathBuf>,
}

impl Caller {
    /// The caller at the other end of a Unix stream; `None` if the kernel gave no
    /// credentials (it always does on Linux).
    pub fn of(stream: &tokio::net::UnixStream) -> Option<Caller> {
        let cred = stream.peer_cred().ok()?;
        let pid = cred.pid().filter(|&p| p > 0);
        Some(Caller {
            pid,
            uid: cred.uid(),
            gid: cred.gid(),
            cgroup: pid.and_then(cgroup_of),
        })
    }

    fn is_within(&self, dir: &Path) -> bool {
        self.cgroup.as_deref().is_some_and(|c| c.starts_with(dir))
    }
}

/// The cgroup v2 directory of a process, from its `0::/path` line.
pub fn cgroup_of(pid: i32) -> Option<PathBuf> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).ok()?;
    parse_cgroup(cgroup_root(), &text)
}

fn parse_cgroup(root: &Path, text: &str) -> Option<PathBuf> {
    let path = text.lines().find_map(|l| l.strip_prefix("0::"))?;
    // A path outside the agent's cgroup namespace shows as `/../..`: unusable.
    if !path.starts_with('/') || path.split('/').any(|part| part == "..") {
        return None;
    }
    Some(root.join(path.trim_start_matches('/')))
}

/// The connection's caller, for handlers and the authorisation layer. `None` only if
/// the kernel gave no credentials: such a caller is treated as anyone.
#[derive(Clone, Debug)]
pub struct Peer(pub Option<Caller>);

impl Connected<IncomingStream<'_, UnixListener>> for Peer {
    fn connect_info(stream: IncomingStream<'_, UnixListener>) -> Self {
        Peer(Caller::of(stream.io()))
    }
}

pub use themis_contracts::api::Owner;

/// What an endpoint asks of its caller.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Need {
    /// Anybody on the node.
    Anyone,
    /// The proxy of the workload named in the path, or the operator.
    Owner,
    /// The node's operator.
    Operator,
}

impl Need {
    /// The need of a route (its pattern as registered with the router).
    pub fn of(method: &axum::http::Method, route: &str) -> Need {
        use axum::http::Method;
        // axum answers HEAD with the GET handler.
        let read = method == Method::GET || method == Method::HEAD;
        match route {
            "/v1/status"
            | "/v1/ring"
            | "/v1/services/{service}"
            | "/v1/services/{service}/explain"
            | "/v1/revocations"
                if read =>
            {
                Need::Anyone
            }
            "/v1/workloads/{workload}/identity" if read => Need::Owner,
            "/v1/workloads/{workload}/sign" if method == Method::POST => Need::Owner,
            // Everything else, the private key and any route added later included.
            _ => Need::Operator,
        }
    }
}

/// Why a request was refused; the reason is the metric label and the API's `reason`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    /// An operator call from a caller that is not the operator.
    #[error("only the node's operator may do this (callers are identified by the kernel: uid and cgroup)")]
    NotOperator,
    /// A workload's identity asked for by a caller outside the workload's cgroup/uid.
    #[error("this caller is not the workload's proxy: it runs outside the workload's cgroup or under another uid")]
    NotOwner,
    /// A workload's identity asked for before the operator bound it to a pod.
    #[error("the workload is bound to no pod yet (the operator sets its owner cgroup, or registers it with a capture)")]
    Unbound,
}

impl Refusal {
    /// The stable label.
    pub fn reason(self) -> &'static str {
        match self {
            Refusal::NotOperator => "not_operator",
            Refusal::NotOwner => "not_owner",
            Refusal::Unbound => "unbound_workload",
        }
    }
}

/// Who the operator is: uids, and the cgroups they must call from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Operators {
    /// Operator uids (default: root).
    pub uids: Vec<u32>,
    /// Operator cgroups (their subtrees); empty: any.
    pub cgroups: Vec<PathBuf>,
    /// The agent's own cgroup: callers in exactly it are in an operator cgroup too
    /// (its readiness probe runs there). Not its subtree: the agent may run in the
    /// root cgroup.
    pub own_cgroup: Option<PathBuf>,
}

impl Operators {
    /// Is `caller` the operator?
    pub fn admit(&self, caller: &Caller) -> bool {
        self.uids.contains(&caller.uid)
            && (self.cgroups.is_empty()
                || self.cgroups.iter().any(|c| caller.is_within(c))
                || (caller.cgroup.is_some() && caller.cgroup == self.own_cgroup))
    }
}

/// The authorisation decision.
pub struct Access {
    /// Who the operator is.
    pub operators: Operators,
}

impl Access {
    /// May `caller` make a call that needs `need`, on `owner` (the bound owner of the
    /// workload in the path, if the path names one)?
    pub fn decide(
        &self,
        caller: Option<&Caller>,
        need: Need,
        owner: Option<&Owner>,
    ) -> Result<(), Refusal> {
        let is_operator = caller.is_some_and(|c| self.operators.admit(c));
        match need {
            Need::Anyone => Ok(()),
            _ if is_operator => Ok(()),
            Need::Operator => Err(Refusal::NotOperator),
            Need::Owner => {
                let owner = owner.ok_or(Refusal::Unbound)?;
                let caller = caller.ok_or(Refusal::NotOwner)?;
                let uid_ok = owner.uid.is_none_or(|uid| uid == caller.uid);
                if uid_ok && caller.is_within(Path::new(&owner.cgroup)) {
                    Ok(())
                } else {
                    Err(Refusal::NotOwner)
                }
            }
        }
    }
}

/// Why an owner or capture binding was refused.
#[derive(Debug, thiserror::Error)]
pub enum BindError {
    /// A capture outside the cgroup the workload is bound to.
    #[error(
        "capture for {workload} must stay inside its owner cgroup {owner}: {field} {path} is outside it"
    )]
    OutsideOwner {
        /// The workload.
        workload: WorkloadName,
        /// Its owner cgroup.
        owner: String,
        /// `cgroup` or `proxy_cgroup`.
        field: &'static str,
        /// The offending path.
        path: String,
    },
    /// A first capture whose cgroup is not a pod's: the cgroup root or not below it,
    /// or an exempt proxy cgroup outside it.
    #[error(
        "capture for {workload}: {cgroup} is not a cgroup v2 directory below the root {root} \
         (a pod's), or the proxy cgroup is not inside it",
        root = cgroup_root().display()
    )]
    OutsidePod {
        /// The workload.
        workload: WorkloadName,
        /// The capture's cgroup.
        cgroup: String,
    },
    /// A capture's proxy uid that is not the owner's.
    #[error("capture for {workload}: proxy uid {given} is not the owner's uid {owner}")]
    OtherUid {
        /// The workload.
        workload: WorkloadName,
        /// The uid the workload is bound to.
        owner: u32,
        /// The uid asked for.
        given: u32,
    },
    /// Not a cgroup v2 directory path.
    #[error("an owner cgroup must be an absolute path under the cgroup v2 mount ({root}), without '..': {0}", root = cgroup_root().display())]
    BadCgroup(String),
    /// The owners file could not be written.
    #[error("saving {path}: {source}")]
    Save {
        /// The file.
        path: String,
        /// Why.
        source: std::io::Error,
    },
}

/// The workloads' owners, saved beside the registrations.
pub struct Owners {
    path: PathBuf,
    map: Mutex<BTreeMap<WorkloadName, Owner>>,
}

impl Owners {
    /// The owners saved at `path` (none if it does not exist or does not parse: the
    /// operator binds them again; a workload without owner is only the operator's).
    pub fn load(path: PathBuf) -> Owners {
        let map = std::fs::read(&path)
            .ok()
            .and_then(|bytes| serde_json::from_slice(&bytes).ok())
            .unwrap_or_default();
        Owners {
            path,
            map: Mutex::new(map),
        }
    }

    /// The owner of `workload`, if bound.
    pub fn get(&self, workload: &WorkloadName) -> Option<Owner> {
        self.lock().get(workload).cloned()
    }

    /// Binds `workload` to `owner` (the operator's call; replaces a previous owner).
    pub fn bind(&self, workload: &WorkloadName, owner: Owner) -> Result<(), BindError> {
        check_cgroup(Path::new(&owner.cgroup))?;
        let mut map = self.lock();
        map.insert(workload.clone(), owner);
        self.save(&map)
    }

    /// Checks a capture against what the workload owns: its cgroups must lie inside
    /// the owner cgroup, its proxy uid must be the owner's. For a workload bound to no
    /// pod, the owner to bind once the capture is attached: the capture's cgroup (the
    /// pod) and proxy uid.
    pub fn check_capture(
        &self,
        workload: &WorkloadName,
        spec: &CaptureSpec,
    ) -> Result<Option<Owner>, BindError> {
        let Some(owner) = self.get(workload) else {
            // The pod's cgroup becomes the owner: a real cgroup below the root, and
            // the exempt proxy inside it (an exemption holds for a whole subtree).
            let pod = &spec.cgroup;
            let proxy_inside = spec
                .proxy_cgroup
                .as_ref()
                .is_none_or(|p| check_cgroup(p).is_ok() && p.starts_with(pod) && p != pod);
            if check_cgroup(pod).is_err() || pod == cgroup_root() || !proxy_inside {
                return Err(BindError::OutsidePod {
                    workload: workload.clone(),
                    cgroup: pod.display().to_string(),
                });
            }
            return Ok(Some(Owner {
                cgroup: pod.display().to_string(),
                uid: spec.proxy_uid,
            }));
        };
        let outside = |field: &'static str, path: &Path| BindError::OutsideOwner {
            workload: workload.clone(),
            owner: owner.cgroup.clone(),
            field,
            path: path.display().to_string(),
        };
        let inside =
            |path: &Path| check_cgroup(path).is_ok() && path.starts_with(Path::new(&owner.cgroup));
        if !inside(&spec.cgroup) {
            return Err(outside("cgroup", &spec.cgroup));
        }
        if let Some(proxy) = &spec.proxy_cgroup {
            if !inside(proxy) {
                return Err(outside("proxy_cgroup", proxy));
            }
        }
        match (owner.uid, spec.proxy_uid) {
            (Some(owner), Some(given)) if owner != given => Err(BindError::OtherUid {
                workload: workload.clone(),
                owner,
                given,
            }),
            _ => Ok(None),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<WorkloadName, Owner>> {
        self.map.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn save(&self, map: &BTreeMap<WorkloadName, Owner>) -> Result<(), BindError> {
        let save = |source| BindError::Save {
            path: self.path.display().to_string(),
            source,
        };
        let text = serde_json::to_vec_pretty(map).expect("owners serialise");
        let tmp = self.path.with_extension("json.tmp");
        std::fs::write(&tmp, text).map_err(save)?;
        std::fs::rename(&tmp, &self.path).map_err(save)
    }
}

/// An owner cgroup is an absolute path under the cgroup v2 mount, with no `..`.
fn check_cgroup(path: &Path) -> Result<(), BindError> {
    let ok = path.starts_with(cgroup_root())
        && !path
            .components()
            .any(|c| matches!(c, std::path::Component::ParentDir));
    if ok {
        Ok(())
    } else {
        Err(BindError::BadCgroup(path.display().to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::Method;

    fn caller(uid: u32, cgroup: &str) -> Caller {
        Caller {
            pid: Some(42),
            uid,
            gid: uid,
            cgroup: Some(PathBuf::from(cgroup)),
        }
    }

    fn access(cgroups: &[&str]) -> Access {
        Access {
            operators: Operators {
                uids: vec![0],
                cgroups: cgroups.iter().map(PathBuf::from).collect(),
                own_cgroup: Some("/sys/fs/cgroup/system.slice/themis.service".into()),
            },
        }
    }

    fn pod_owner() -> Owner {
        Owner {
            cgroup: "/sys/fs/cgroup/kubepods/pod-a".into(),
            uid: Some(1337),
        }
    }

    #[test]
    fn routes_get_their_needs() {
        assert_eq!(
            Need::of(&Method::GET, "/v1/services/{service}"),
            Need::Anyone
        );
        assert_eq!(Need::of(&Method::GET, "/v1/revocations"), Need::Anyone);
        assert_eq!(Need::of(&Method::POST, "/v1/revocations"), Need::Operator);
        assert_eq!(
            Need::of(&Method::GET, "/v1/workloads/{workload}/key"),
            Need::Operator
        );
        assert_eq!(
            Need::of(&Method::GET, "/v1/workloads/{workload}/identity"),
            Need::Owner
        );
        assert_eq!(
            Need::of(&Method::POST, "/v1/workloads/{workload}/sign"),
            Need::Owner
        );
        assert_eq!(
            Need::of(&Method::PUT, "/v1/workloads/{workload}"),
            Need::Operator
        );
        assert_eq!(Need::of(&Method::GET, "/v1/workloads"), Need::Operator);
        assert_eq!(Need::of(&Method::GET, "/v1/capture"), Need::Operator);
        assert_eq!(Need::of(&Method::POST, "/v1/debug/store"), Need::Operator);
        assert_eq!(
            Need::of(&Method::PUT, "/v1/services/{service}/instances/{workload}"),
            Need::Operator
        );
        // Anything not listed (a route added later) is the operator's.
        assert_eq!(Need::of(&Method::GET, "/v1/new-thing"), Need::Operator);
        assert_eq!(
            Need::of(&Method::GET, "/v1/workloads/{workload}/new-thing"),
            Need::Operator
        );
        assert_eq!(
            Need::of(&Method::PUT, "/v1/workloads/{workload}/identity"),
            Need::Operator
        );
        // HEAD is GET.
        assert_eq!(Need::of(&Method::HEAD, "/v1/status"), Need::Anyone);
        assert_eq!(
            Need::of(&Method::HEAD, "/v1/workloads/{workload}/key"),
            Need::Operator
        );
    }

    #[test]
    fn a_proxy_gets_only_its_own_workload() {
        let access = access(&[]);
        let owner = pod_owner();
        let proxy = caller(1337, "/sys/fs/cgroup/kubepods/pod-a/proxy");
        assert_eq!(
            access.decide(Some(&proxy), Need::Owner, Some(&owner)),
            Ok(())
        );
        // Another pod's proxy: same uid, other cgroup.
        let other = caller(1337, "/sys/fs/cgroup/kubepods/pod-b/proxy");
        assert_eq!(
            access.decide(Some(&other), Need::Owner, Some(&owner)),
            Err(Refusal::NotOwner)
        );
        // A prefix of the name is not a parent directory.
        let sneaky = caller(1337, "/sys/fs/cgroup/kubepods/pod-a-evil");
        assert_eq!(
            access.decide(Some(&sneaky), Need::Owner, Some(&owner)),
            Err(Refusal::NotOwner)
        );
        // The app in the same pod, under another uid.
        let app = caller(1000, "/sys/fs/cgroup/kubepods/pod-a/app");
        assert_eq!(
            access.decide(Some(&app), Need::Owner, Some(&owner)),
            Err(Refusal::NotOwner)
        );
        // Nobody's yet: only the operator.
        assert_eq!(
            access.decide(Some(&proxy), Need::Owner, None),
            Err(Refusal::Unbound)
        );
        assert_eq!(
            access.decide(Some(&proxy), Need::Operator, Some(&owner)),
            Err(Refusal::NotOperator)
        );
        assert_eq!(
            access.decide(None, Need::Owner, Some(&owner)),
            Err(Refusal::NotOwner)
        );
        assert_eq!(access.decide(None, Need::Anyone, None), Ok(()));
    }

    #[test]
    fn the_operator_is_a_uid_in_an_operator_cgroup() {
        let root_on_host = caller(0, "/sys/fs/cgroup/system.slice/themis-agent.service");
        let root_in_a_pod = caller(0, "/sys/fs/cgroup/kubepods/pod-b/app");
        let anywhere = access(&[]);
        assert_eq!(
            anywhere.decide(Some(&root_in_a_pod), Need::Operator, None),
            Ok(())
        );
        let confined = access(&["/sys/fs/cgroup/user.slice"]);
        let agent_itself = caller(0, "/sys/fs/cgroup/system.slice/themis.service");
        assert_eq!(
            confined.decide(Some(&agent_itself), Need::Operator, None),
            Ok(())
        );
        let below_agent = caller(0, "/sys/fs/cgroup/system.slice/themis.service/x");
        assert_eq!(
            confined.decide(Some(&below_agent), Need::Operator, None),
            Err(Refusal::NotOperator)
        );
        let confined = access(&["/sys/fs/cgroup/system.slice"]);
        assert_eq!(
            confined.decide(Some(&root_on_host), Need::Operator, None),
            Ok(())
        );
        assert_eq!(
            confined.decide(Some(&root_in_a_pod), Need::Operator, None),
            Err(Refusal::NotOperator)
        );
        let user = caller(1000, "/sys/fs/cgroup/system.slice/x");
        assert_eq!(
            confined.decide(Some(&user), Need::Operator, None),
            Err(Refusal::NotOperator)
        );
        // The operator may use any workload's identity (it could read the key files).
        assert_eq!(
            confined.decide(Some(&root_on_host), Need::Owner, None),
            Ok(())
        );
    }

    #[test]
    fn cgroup_lines_parse() {
        let root = Path::new("/sys/fs/cgroup");
        assert_eq!(
            parse_cgroup(root, "0::/kubepods/pod-a/proxy\n"),
            Some(PathBuf::from("/sys/fs/cgroup/kubepods/pod-a/proxy"))
        );
        assert_eq!(
            parse_cgroup(root, "4:memory:/x\n0::/\n"),
            Some(PathBuf::from("/sys/fs/cgroup"))
        );
        assert_eq!(parse_cgroup(root, "0::/../../pod\n"), None);
        assert_eq!(parse_cgroup(root, "1:name=systemd:/x\n"), None);
        assert_eq!(parse_cgroup(root, ""), None);
    }

    #[test]
    fn captures_stay_inside_their_owner() {
        let dir = tempfile::tempdir().unwrap();
        let owners = Owners::load(dir.path().join("owners.json"));
        let w = WorkloadName::new("check").unwrap();
        let pods = cgroup_root().join("pods");
        let mut spec = CaptureSpec::new(pods.join("check"));
        spec.proxy_cgroup = Some(pods.join("check/proxy"));
        // Unbound: the capture (once attached) binds it to its pod.
        let owner = owners.check_capture(&w, &spec).unwrap().expect("to bind");
        assert_eq!(Path::new(&owner.cgroup), spec.cgroup);
        owners.bind(&w, owner).unwrap();
        assert_eq!(owners.check_capture(&w, &spec).unwrap(), None);
        // Another pod's cgroup, for the capture or the exempt proxy: refused.
        let mut other = spec.clone();
        other.cgroup = pods.join("handler");
        assert!(matches!(
            owners.check_capture(&w, &other),
            Err(BindError::OutsideOwner {
                field: "cgroup",
                ..
            })
        ));
        let mut exempt = spec.clone();
        exempt.proxy_cgroup = Some(pods.join("handler/proxy"));
        assert!(matches!(
            owners.check_capture(&w, &exempt),
            Err(BindError::OutsideOwner {
                field: "proxy_cgroup",
                ..
            })
        ));
        // A first capture binds only a pod: not the root, not an exempt cgroup
        // outside it (an exemption covers a whole subtree, another pod's too).
        let fresh = WorkloadName::new("fresh").unwrap();
        let mut root = spec.clone();
        root.cgroup = cgroup_root().to_path_buf();
        root.proxy_cgroup = None;
        let mut wide = spec.clone();
        wide.proxy_cgroup = Some(pods.clone());
        let mut elsewhere = spec.clone();
        elsewhere.cgroup = "/tmp/x".into();
        for bad in [root, wide, elsewhere] {
            assert!(matches!(
                owners.check_capture(&fresh, &bad),
                Err(BindError::OutsidePod { .. })
            ));
        }
        let mut climb = spec.clone();
        climb.cgroup = pods.join("check/../handler");
        assert!(owners.check_capture(&w, &climb).is_err());
        // Saved, and read back by a restarted agent.
        let again = Owners::load(dir.path().join("owners.json"));
        assert_eq!(again.get(&w), owners.get(&w));
        assert!(owners
            .bind(
                &w,
                Owner {
                    cgroup: "/etc".into(),
                    uid: None
                }
            )
            .is_err());
    }
}
