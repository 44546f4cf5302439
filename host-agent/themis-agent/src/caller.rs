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
//! * **the node controller** (a controller uid in an operator cgroup, on Kubernetes
//!   the controller's container beside the agent): pods' workloads only — list,
//!   create bound to a pod, register with the pod's capture, withdraw, delete — never
//!   a key, a revocation, the log or debug, nor a workload bound outside pods or to
//!   another pod ([`Access::controller_may_bind`]): what a compromised controller can
//!   do is mesh pods wrongly, not take an identity that exists;
//! * **the operator** (an operator uid in an operator cgroup): everything else —
//!   workloads, keys, registration, deregistration, capture, revocations (publish),
//!   debug.
//!
//! `docs/AGENT.md` states the trust model; the decision is a pure function, tested
//! here, and the API counts every refusal by reason.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use themis_capture::CaptureSpec;

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
            cgroup: pid.and_then(|pid| peer_cgroup(stream, pid)),
        })
    }

    fn is_within(&self, dir: &Path) -> bool {
        self.cgroup.as_deref().is_some_and(|c| c.starts_with(dir))
    }
}

/// The cgroup of the process that connected `stream` as `pid`, never another's.
///
/// `SO_PEERCRED`'s pid is only a number: if the caller exits before its cgroup is
/// read, another process (the operator's, say) may have been given the same pid, and
/// `/proc/<pid>/cgroup` would describe that one. So the kernel's pidfd of the peer
/// (`SO_PEERPIDFD`, fixed at `connect`) is taken first and checked after the read: a
/// pid still held by that process was not reused meanwhile. A peer that has exited has
/// no cgroup (the caller is "anyone"). Kernels before 6.5 have no `SO_PEERPIDFD`:
/// there the cgroup is read by pid alone, as before.
fn peer_cgroup(stream: &tokio::net::UnixStream, pid: i32) -> Option<PathBuf> {
    match crate::sys::peer_pidfd(stream) {
        Ok(pidfd) => {
            let cgroup = cgroup_of(pid)?;
            (pidfd_pid(&pidfd) == Some(pid)).then_some(cgroup)
        }
        Err(error) if error.raw_os_error() == Some(libc::ENOPROTOOPT) => cgroup_of(pid),
        Err(_) => None,
    }
}

/// The pid a pidfd stands for, from its fdinfo: `-1` (so `None` here) once the process
/// has exited and its pid is free to be reused.
fn pidfd_pid(pidfd: &std::os::fd::OwnedFd) -> Option<i32> {
    use std::os::fd::AsRawFd;
    let info = std::fs::read_to_string(format!("/proc/self/fdinfo/{}", pidfd.as_raw_fd())).ok()?;
    info.lines()
        .find_map(|line| line.strip_prefix("Pid:"))
        .and_then(|pid| pid.trim().parse().ok())
        .filter(|&pid: &i32| pid > 0)
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

pub use themis_contracts::api::Owner;

/// What an endpoint asks of its caller.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Need {
    /// Anybody on the node.
    Anyone,
    /// The proxy of the workload named in the path, or the operator.
    Owner,
    /// The node controller (within [`Access::controller_may_bind`]'s rules) or the
    /// operator.
    Controller,
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
            | "/v1/log"
            | "/v1/log/copy"
                if read =>
            {
                Need::Anyone
            }
            "/v1/workloads/{workload}/identity" if read => Need::Owner,
            // What the node controller does to mesh a pod, and to forget it.
            "/v1/workloads" if read => Need::Controller,
            "/v1/workloads/{workload}" | "/v1/services/{service}/instances/{workload}"
                if method == Method::PUT || method == Method::DELETE =>
            {
                Need::Controller
            }
            "/v1/workloads/{workload}/sign"
            | "/v1/workloads/{workload}/delegate"
            | "/v1/workloads/{workload}/certificate"
                if method == Method::POST =>
            {
                Need::Owner
            }
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
    /// The node controller acting on a workload that is not a pod's: unbound, bound
    /// to (or around) the operator's cgroups, or registered without its pod's capture.
    #[error("the node controller may act only on pods' workloads: bound to a cgroup that neither holds nor lies in the operator's, registered with the pod's capture")]
    NotAPod,
    /// The node controller binding an existing workload to another owner.
    #[error("the node controller may not move an existing workload to another owner: it deletes it (its key goes with it) and a new one is made")]
    BoundElsewhere,
}

impl Refusal {
    /// The stable label.
    pub fn reason(self) -> &'static str {
        match self {
            Refusal::NotOperator => "not_operator",
            Refusal::NotOwner => "not_owner",
            Refusal::Unbound => "unbound_workload",
            Refusal::NotAPod => "not_a_pod",
            Refusal::BoundElsewhere => "bound_elsewhere",
        }
    }
}

/// Who the operator is: uids, and the cgroups they must call from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Operators {
    /// Operator uids (default: root).
    pub uids: Vec<u32>,
    /// Operator cgroups (their subtrees), besides the agent's own. Empty by default:
    /// then only callers in exactly the agent's own cgroup are the operator.
    pub cgroups: Vec<PathBuf>,
    /// The agent's own cgroup: callers in exactly it are in an operator cgroup too
    /// (its readiness probe and `kubectl exec` into its container run there). Not its
    /// subtree: the agent may run in the root cgroup, whose subtree is every pod.
    /// `None` (unreadable): only the listed cgroups.
    pub own_cgroup: Option<PathBuf>,
    /// The node controller's uids: from an operator cgroup, the controller, not the
    /// operator. Never an operator uid (the agent refuses to start so).
    pub controller_uids: Vec<u32>,
}

/// Who a caller is on the local API.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// The node's operator.
    Operator,
    /// The node controller.
    Controller,
    /// Anyone else (a proxy is told apart by the workload it asks for).
    Other,
}

impl Operators {
    /// Who `caller` is: an operator or a controller uid calling from a listed cgroup's
    /// subtree or from exactly the agent's own cgroup is the operator or the
    /// controller; anyone else is nobody special. Root in a pod is not the operator
    /// unless the operator listed that pod's cgroup.
    pub fn role(&self, caller: &Caller) -> Role {
        let from_operator_cgroup = self.cgroups.iter().any(|c| caller.is_within(c))
            || (caller.cgroup.is_some() && caller.cgroup == self.own_cgroup);
        match from_operator_cgroup {
            true if self.uids.contains(&caller.uid) => Role::Operator,
            true if self.controller_uids.contains(&caller.uid) => Role::Controller,
            _ => Role::Other,
        }
    }

    /// Is `caller` the operator?
    pub fn admit(&self, caller: &Caller) -> bool {
        self.role(caller) == Role::Operator
    }

    /// Does an owner cgroup hold, or lie in, a cgroup the operator calls from? The
    /// operator's own processes (and the controller's) would be its proxy then. The
    /// agent's own cgroup counts only itself (below it is no operator's: the agent
    /// may run in the root).
    fn touches_operator(&self, cgroup: &Path) -> bool {
        self.cgroups
            .iter()
            .any(|c| c.starts_with(cgroup) || cgroup.starts_with(c))
            || self
                .own_cgroup
                .as_ref()
                .is_some_and(|own| own.starts_with(cgroup))
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
        let role = caller.map_or(Role::Other, |c| self.operators.role(c));
        match need {
            Need::Anyone => Ok(()),
            _ if role == Role::Operator => Ok(()),
            Need::Controller if role == Role::Controller => Ok(()),
            Need::Operator | Need::Controller => Err(Refusal::NotOperator),
            Need::Owner => {
                let owner = owner.ok_or(Refusal::Unbound)?;
                let caller = caller.ok_or(Refusal::NotOwner)?;
                // No uid: only where the operator (or a capture without a proxy uid)
                // said any uid will do; an older owners.json's uid-less entry is not
                // such a statement and admits nobody until bound again.
                let uid_ok = owner.uid.map_or(owner.any_uid, |uid| uid == caller.uid);
                if uid_ok && caller.is_within(Path::new(&owner.cgroup)) {
                    Ok(())
                } else {
                    Err(Refusal::NotOwner)
                }
            }
        }
    }
}

impl Access {
    /// May the node controller act on a workload bound to `current` (withdraw,
    /// register, delete it)? Only if it is a pod's: bound, and not to the operator's
    /// cgroups.
    pub fn controller_owns(&self, current: Option<&Owner>) -> Result<(), Refusal> {
        match current {
            Some(owner) if !self.operators.touches_operator(Path::new(&owner.cgroup)) => Ok(()),
            _ => Err(Refusal::NotAPod),
        }
    }

    /// May the node controller bind a workload (bound to `current`, its key existing
    /// or not) to `new`? A pod's owner only, and a workload that exists only to the
    /// owner it has: a controller never hands an identity that exists (the operator's,
    /// another pod's) to a pod it names.
    pub fn controller_may_bind(
        &self,
        current: Option<&Owner>,
        exists: bool,
        new: Option<&Owner>,
    ) -> Result<(), Refusal> {
        self.controller_owns(new)?;
        match current {
            Some(current) if Some(current) == new => Ok(()),
            None if !exists => Ok(()),
            _ => Err(Refusal::BoundElsewhere),
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
    /// An owner with neither a uid nor an explicit `any_uid`.
    #[error(
        "an owner needs the proxy's uid (\"uid\": 1337; themis workload --owner-uid), or \
         \"any_uid\": true (--any-uid) if any process in the cgroup may use the identity"
    )]
    UidRequired,
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
    /// The owners saved at `path`. None if it does not exist; if it cannot be read or
    /// does not parse, none either (fail closed: a workload without owner is only the
    /// operator's, who binds it again), said in the log, and the bad file is kept
    /// beside as `owners.json.bad` for the operator to look at.
    pub fn load(path: PathBuf) -> Owners {
        let map = match std::fs::read(&path) {
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => BTreeMap::new(),
            Err(error) => {
                tracing::error!(path = %path.display(), %error, "cannot read the workloads' owners: every workload is unbound until the operator binds it again");
                BTreeMap::new()
            }
            Ok(bytes) => serde_json::from_slice(&bytes).unwrap_or_else(|error| {
                let bad = path.with_extension("json.bad");
                let _ = std::fs::rename(&path, &bad);
                tracing::error!(path = %path.display(), kept = %bad.display(), %error, "the workloads' owners file is corrupt: every workload is unbound until the operator binds it again");
                BTreeMap::new()
            }),
        };
        Owners {
            path,
            map: Mutex::new(map),
        }
    }

    /// Every bound workload's owner.
    pub fn all(&self) -> BTreeMap<WorkloadName, Owner> {
        self.lock().clone()
    }

    /// The owner of `workload`, if bound.
    pub fn get(&self, workload: &WorkloadName) -> Option<Owner> {
        self.lock().get(workload).cloned()
    }

    /// Binds `workload` to `owner` (the operator's call; replaces a previous owner).
    /// Saved before it takes effect: a binding the disk did not take is not made.
    pub fn bind(&self, workload: &WorkloadName, owner: Owner) -> Result<(), BindError> {
        check_cgroup(Path::new(&owner.cgroup))?;
        if owner.uid.is_none() && !owner.any_uid {
            return Err(BindError::UidRequired);
        }
        let mut map = self.lock();
        let mut next = map.clone();
        next.insert(workload.clone(), owner);
        self.save(&next)?;
        *map = next;
        Ok(())
    }

    /// Forgets the owner of `workload` (saved first, as [`Owners::bind`]).
    pub fn unbind(&self, workload: &WorkloadName) -> Result<(), BindError> {
        let mut map = self.lock();
        if !map.contains_key(workload) {
            return Ok(());
        }
        let mut next = map.clone();
        next.remove(workload);
        self.save(&next)?;
        *map = next;
        Ok(())
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
            // A capture that exempts its proxy by cgroup alone names no uid: any
            // process in the pod's proxy cgroup is the proxy, as the capture says.
            return Ok(Some(Owner {
                cgroup: pod.display().to_string(),
                uid: spec.proxy_uid,
                any_uid: spec.proxy_uid.is_none(),
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

    /// Writes the map durably: a temporary file, fsynced, renamed over the old one,
    /// and the directory fsynced, so a crash leaves the old owners or the new ones.
    fn save(&self, map: &BTreeMap<WorkloadName, Owner>) -> Result<(), BindError> {
        let text = serde_json::to_vec_pretty(map).expect("owners serialise");
        crate::files::replace(&self.path, &text).map_err(|source| BindError::Save {
            path: self.path.display().to_string(),
            source,
        })
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
    use tokio::net::UnixListener;

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
                controller_uids: vec![65532],
            },
        }
    }

    fn pod_owner() -> Owner {
        Owner {
            cgroup: "/sys/fs/cgroup/kubepods/pod-a".into(),
            uid: Some(1337),
            any_uid: false,
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
            Need::of(&Method::POST, "/v1/workloads/{workload}/delegate"),
            Need::Owner
        );
        assert_eq!(
            Need::of(&Method::GET, "/v1/workloads/{workload}/delegate"),
            Need::Operator
        );
        assert_eq!(
            Need::of(&Method::POST, "/v1/workloads/{workload}/certificate"),
            Need::Owner
        );
        assert_eq!(
            Need::of(&Method::GET, "/v1/workloads/{workload}/certificate"),
            Need::Operator
        );
        // Deleting a workload (its key) is the operator's (or, for a pod's, the
        // controller's), never its own proxy's.
        assert_eq!(
            Need::of(&Method::DELETE, "/v1/workloads/{workload}"),
            Need::Controller
        );
        assert_eq!(
            Need::of(&Method::PUT, "/v1/workloads/{workload}"),
            Need::Controller
        );
        assert_eq!(Need::of(&Method::GET, "/v1/workloads"), Need::Controller);
        assert_eq!(
            Need::of(
                &Method::DELETE,
                "/v1/services/{service}/instances/{workload}"
            ),
            Need::Controller
        );
        assert_eq!(Need::of(&Method::GET, "/v1/capture"), Need::Operator);
        assert_eq!(Need::of(&Method::POST, "/v1/debug/store"), Need::Operator);
        assert_eq!(
            Need::of(&Method::PUT, "/v1/services/{service}/instances/{workload}"),
            Need::Controller
        );
        assert_eq!(Need::of(&Method::POST, "/v1/log"), Need::Operator);
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
        let agent_itself = caller(0, "/sys/fs/cgroup/system.slice/themis.service");
        // The default: the agent's own cgroup only. Root in a pod is not the operator,
        // nor is root on the host outside the agent's cgroup.
        let default = access(&[]);
        for not_operator in [&root_in_a_pod, &root_on_host] {
            assert_eq!(
                default.decide(Some(not_operator), Need::Operator, None),
                Err(Refusal::NotOperator)
            );
        }
        assert_eq!(
            default.decide(Some(&agent_itself), Need::Operator, None),
            Ok(())
        );
        // An agent whose own cgroup could not be read has no implicit operator cgroup.
        let mut unknown = access(&[]);
        unknown.operators.own_cgroup = None;
        assert_eq!(
            unknown.decide(Some(&agent_itself), Need::Operator, None),
            Err(Refusal::NotOperator)
        );
        let confined = access(&["/sys/fs/cgroup/user.slice"]);
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

    /// The node controller meshes pods and does nothing else: no key, no revocation,
    /// no debug; no workload that is not a pod's, none moved from the owner it has.
    /// Its uid outside the operator's cgroups is nobody.
    #[test]
    fn the_controller_meshes_pods_and_takes_no_identity() {
        let access = access(&["/sys/fs/cgroup/kubepods/pod-agent"]);
        let controller = caller(65532, "/sys/fs/cgroup/kubepods/pod-agent/controller");
        assert_eq!(access.operators.role(&controller), Role::Controller);
        for need in [Need::Controller, Need::Anyone] {
            assert_eq!(access.decide(Some(&controller), need, None), Ok(()));
        }
        assert_eq!(
            access.decide(Some(&controller), Need::Operator, None),
            Err(Refusal::NotOperator),
            "a key, a revocation, the log, debug"
        );
        let owner = pod_owner();
        assert_eq!(
            access.decide(Some(&controller), Need::Owner, Some(&owner)),
            Err(Refusal::NotOwner),
            "it signs as no pod"
        );
        // Its uid in a pod is nobody's; root beside it is still the operator.
        let in_a_pod = caller(65532, "/sys/fs/cgroup/kubepods/pod-a/app");
        assert_eq!(access.operators.role(&in_a_pod), Role::Other);
        assert_eq!(
            access.decide(Some(&in_a_pod), Need::Controller, None),
            Err(Refusal::NotOperator)
        );
        let root = caller(0, "/sys/fs/cgroup/kubepods/pod-agent/agent");
        assert_eq!(access.operators.role(&root), Role::Operator);

        // A new workload bound to a pod, or bound again to the same pod: yes.
        assert_eq!(
            access.controller_may_bind(None, false, Some(&owner)),
            Ok(())
        );
        assert_eq!(
            access.controller_may_bind(Some(&owner), true, Some(&owner)),
            Ok(())
        );
        // Another pod's workload moved to a pod it names, or an unbound one (the
        // operator's) handed to a pod: no.
        let other = Owner {
            cgroup: "/sys/fs/cgroup/kubepods/pod-b".into(),
            ..pod_owner()
        };
        assert_eq!(
            access.controller_may_bind(Some(&other), true, Some(&owner)),
            Err(Refusal::BoundElsewhere)
        );
        assert_eq!(
            access.controller_may_bind(None, true, Some(&owner)),
            Err(Refusal::BoundElsewhere)
        );
        // Bound to its own pod, to the agent's cgroup, or around them (kubepods, the
        // root): the controller would be the proxy. Unbound: no pod's.
        for cgroup in [
            "/sys/fs/cgroup/kubepods/pod-agent",
            "/sys/fs/cgroup/kubepods/pod-agent/controller",
            "/sys/fs/cgroup/kubepods",
            "/sys/fs/cgroup",
            "/sys/fs/cgroup/system.slice/themis.service",
            "/sys/fs/cgroup/system.slice",
        ] {
            let near = Owner {
                cgroup: cgroup.into(),
                ..pod_owner()
            };
            assert_eq!(
                access.controller_may_bind(None, false, Some(&near)),
                Err(Refusal::NotAPod),
                "{cgroup}"
            );
            assert_eq!(access.controller_owns(Some(&near)), Err(Refusal::NotAPod));
        }
        assert_eq!(
            access.controller_may_bind(None, false, None),
            Err(Refusal::NotAPod)
        );
        assert_eq!(access.controller_owns(None), Err(Refusal::NotAPod));
        // A prefix of a name is not a parent: pod-agent-2 is another pod.
        let neighbour = Owner {
            cgroup: "/sys/fs/cgroup/kubepods/pod-agent-2".into(),
            ..pod_owner()
        };
        assert_eq!(access.controller_owns(Some(&neighbour)), Ok(()));
        // Below the agent's own cgroup is no operator's (only exactly it is).
        let below_agent = Owner {
            cgroup: "/sys/fs/cgroup/system.slice/themis.service/pod".into(),
            ..pod_owner()
        };
        assert_eq!(access.controller_owns(Some(&below_agent)), Ok(()));
    }

    /// The attack on `SO_PEERCRED` alone: a caller in a pod connects and exits, and its
    /// pid goes to a new process in the operator's cgroup before the agent reads the
    /// caller's cgroup. The caller must not be judged by the newcomer's cgroup.
    /// (The pid is handed over on purpose, through `ns_last_pid`.)
    #[tokio::test]
    async fn a_reused_pid_lends_no_cgroup() {
        use std::process::{Command, Stdio};
        if !themis_testkit::require::root("moves processes into cgroups, sets ns_last_pid") {
            return;
        }
        let pods = themis_testkit::cgroup::Tree::new("pidfd", &["pod", "operator"]);
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("api.sock");
        let listener = UnixListener::bind(&socket).unwrap();
        let in_cgroup = |cgroup: &Path, program: &str| {
            Command::new("sh")
                .arg("-c")
                .arg(format!(
                    "echo $$ > {}/cgroup.procs && exec {program}",
                    cgroup.display()
                ))
                .stdout(Stdio::null())
                .spawn()
                .unwrap()
        };
        // Other processes on the machine may take the pid first: a few tries.
        for _ in 0..20 {
            let connect = format!(
                "python3 -c 'import socket,sys; socket.socket(socket.AF_UNIX).connect(sys.argv[1])' {}",
                socket.display()
            );
            let mut caller = in_cgroup(&pods.cgroup("pod"), &connect);
            let pid = caller.id() as i32;
            assert!(caller.wait().unwrap().success());
            std::fs::write("/proc/sys/kernel/ns_last_pid", (pid - 1).to_string()).unwrap();
            let mut newcomer = in_cgroup(&pods.cgroup("operator"), "sleep 30");
            let reused = newcomer.id() as i32 == pid;
            if reused {
                // The newcomer's cgroup is in place once the shell has exec'd.
                for _ in 0..100 {
                    if cgroup_of(pid).as_deref() == Some(&*pods.cgroup("operator")) {
                        break;
                    }
                    std::thread::sleep(std::time::Duration::from_millis(10));
                }
            }
            let (stream, _) = listener.accept().await.unwrap();
            let judged = Caller::of(&stream).unwrap();
            newcomer.kill().unwrap();
            newcomer.wait().unwrap();
            if !reused {
                continue;
            }
            assert_eq!(judged.pid, Some(pid));
            assert_eq!(
                judged.cgroup, None,
                "an exited caller was judged by the cgroup of the process that got its pid"
            );
            return;
        }
        panic!("the pid was never handed over (ns_last_pid): the attack did not run");
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
                    uid: None,
                    any_uid: true,
                }
            )
            .is_err());
        // No uid and no explicit "any uid": refused, and nothing changes.
        let before = owners.get(&w);
        let no_uid = Owner {
            cgroup: pods.join("check").display().to_string(),
            uid: None,
            any_uid: false,
        };
        assert!(matches!(
            owners.bind(&w, no_uid),
            Err(BindError::UidRequired)
        ));
        assert_eq!(owners.get(&w), before);
        // A binding the disk does not take is not made.
        let dir_path = dir.path().to_path_buf();
        let unsaved = Owners::load(dir_path.join("missing-dir/owners.json"));
        assert!(unsaved.bind(&w, pod_owner_in(&pods)).is_err());
        assert_eq!(unsaved.get(&w), None);
    }

    fn pod_owner_in(pods: &Path) -> Owner {
        Owner {
            cgroup: pods.join("check").display().to_string(),
            uid: Some(1337),
            any_uid: false,
        }
    }

    #[test]
    fn a_corrupt_owners_file_binds_nothing_and_is_kept_aside() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("owners.json");
        std::fs::write(&path, b"{ not json").unwrap();
        let owners = Owners::load(path.clone());
        assert_eq!(owners.get(&WorkloadName::new("check").unwrap()), None);
        assert_eq!(
            std::fs::read(dir.path().join("owners.json.bad")).unwrap(),
            b"{ not json"
        );
    }
}
