//! The host agent's eBPF loader. It loads Themis's capture programs
//! (`ebpf/themis-ebpf`), attaches them to a workload's cgroup v2 directory, and pins
//! maps and links in bpffs:
//!
//! ```text
//! <pin dir>/WORKLOADS, ORIGINAL_BY_ADDR, ...      the maps (reused by a restarted agent)
//! <pin dir>/workloads/<workload>/<program>        one bpf_link per program and cgroup
//! <pin dir>/top/listener_guard4, listener_guard6  links at the top cgroup, while
//!                                                 any workload is captured
//! ```
//!
//! (`<workload>` with each `.` as `_`: bpffs refuses dots in names, and workload names
//! never contain `_`, see `themis_contracts::names::bpffs_name`.)
//!
//! The kernel holds everything capture needs: when the agent stops or crashes, capture
//! goes on (traffic never silently bypasses the proxy), and a restarted agent adopts
//! what it finds pinned. Removing a workload's pins detaches it; `rm -rf <pin dir>`
//! removes all of it.
mod spec;
mod sys;

use std::{
    collections::BTreeMap,
    fs, io,
    os::fd::AsFd,
    os::unix::fs::MetadataExt,
    path::{Path, PathBuf},
};

use aya::{
    maps::{Array, HashMap, MapData, PerCpuArray, SockHash},
    programs::{CgroupSkb, CgroupSockAddr, CgroupSockopt, ProgramError, SkMsg, SockOps},
    Ebpf, EbpfLoader,
};
use serde::Serialize;
use themis_ebpf_common::{
    maps, programs, settings, stats, ConnectionKey, ListenerOwner, SocketAddrKey, WorkloadConfig,
    AF_INET, AF_INET6,
};

pub use ipnet::IpNet;
pub use spec::{CaptureSpec, SpecError};
use sys::AttachType;

/// The programs, built for bpfel by build.rs.
static OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/themis-ebpf.o"));

/// The default pin directory.
pub const DEFAULT_PIN_DIR: &str = "/sys/fs/bpf/themis";

/// Each workload's cgroup gets one link per program, in this order.
const CGROUP_PROGRAMS: [(&str, AttachType); 5] = [
    (programs::CONNECT4, AttachType::Inet4Connect),
    (programs::CONNECT6, AttachType::Inet6Connect),
    (programs::SOCK_OPS, AttachType::SockOps),
    (programs::GETSOCKOPT, AttachType::GetSockopt),
    (programs::INBOUND, AttachType::InetIngress),
];

/// Attached once, at the top cgroup (the root of the cgroup v2 tree the agent sees),
/// so that they run for every process on the node: a connect to a workload's
/// outbound listener from outside the workload's cgroup is refused.
const GUARD_PROGRAMS: [(&str, AttachType); 2] = [
    (programs::LISTENER_GUARD4, AttachType::Inet4Connect),
    (programs::LISTENER_GUARD6, AttachType::Inet6Connect),
];

#[derive(Debug, thiserror::Error)]
pub enum CaptureError {
    /// Something the kernel or the machine lacks; the message says what and how to fix it.
    #[error("eBPF capture is unavailable: {0}")]
    Unavailable(String),
    #[error("the kernel refused the eBPF program `{program}`: {source}")]
    Program {
        program: &'static str,
        #[source]
        source: ProgramError,
    },
    #[error("loading the eBPF object: {0}")]
    Load(#[from] aya::EbpfError),
    #[error("eBPF map {map}: {source}")]
    Map {
        map: &'static str,
        #[source]
        source: aya::maps::MapError,
    },
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: io::Error,
    },
    #[error(transparent)]
    Spec(#[from] SpecError),
    #[error(
        "workload {workload} is captured in another cgroup (id {cgroup_id}); deregister it first"
    )]
    OtherCgroup { workload: String, cgroup_id: u64 },
}

fn io_error(what: impl Into<String>) -> impl FnOnce(io::Error) -> CaptureError {
    let what = what.into();
    move |source| CaptureError::Io { what, source }
}

/// The loaded programs and maps of one agent.
pub struct Capture {
    ebpf: Ebpf,
    pin_dir: PathBuf,
    fast_path: bool,
    /// The agent's network namespace: where a workload's listeners are guarded unless
    /// its spec names another.
    netns: u64,
}

/// One program attached to a workload's cgroup, as the kernel reports it.
#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
pub struct Attachment {
    pub program: String,
    pub link_id: u32,
    pub program_id: u32,
}

/// A captured workload.
#[derive(Clone, Debug, Serialize)]
pub struct WorkloadStatus {
    pub workload: String,
    pub cgroup_id: u64,
    /// Found by walking the cgroup v2 tree; `None` if the cgroup is gone.
    pub cgroup: Option<PathBuf>,
    pub attachments: Vec<Attachment>,
    /// Programs that should be attached and are not (a partial, broken state).
    pub missing: Vec<String>,
}

/// Everything `themis capture` shows.
#[derive(Clone, Debug, Serialize)]
pub struct Status {
    pub pin_dir: PathBuf,
    pub fast_path: bool,
    pub workloads: Vec<WorkloadStatus>,
    /// The outbound listeners' guard at the top cgroup (empty without workloads).
    pub listener_guard: Vec<Attachment>,
    pub counters: BTreeMap<&'static str, u64>,
}

impl Capture {
    /// Checks the kernel and the machine, loads the programs (reusing pinned maps, so
    /// a restarted agent shares them with the links it finds), and sets the fast path.
    pub fn start(pin_dir: &Path, fast_path: bool) -> Result<Self, CaptureError> {
        preflight(pin_dir)?;
        fs::create_dir_all(pin_dir.join("workloads"))
            .map_err(io_error(format!("creating {}", pin_dir.display())))?;
        replace_short_stats(pin_dir)?;
        let mut ebpf = EbpfLoader::new().map_pin_path(pin_dir).load(OBJECT)?;
        for (name, _) in CGROUP_PROGRAMS.iter().chain(&GUARD_PROGRAMS) {
            load_program(&mut ebpf, name)?;
        }
        load_program(&mut ebpf, programs::FAST_PATH_MSG)?;
        let netns = sys::netns_cookie().map_err(|e| {
            CaptureError::Unavailable(format!(
                "the kernel gives no network namespace cookie (SO_NETNS_COOKIE, Linux 5.14): {e}"
            ))
        })?;

        let sockets: SockHash<MapData, ConnectionKey> = SockHash::try_from(
            ebpf.take_map(maps::FAST_PATH_SOCKETS)
                .expect("the object defines the sockhash"),
        )
        .map_err(map_error(maps::FAST_PATH_SOCKETS))?;
        let msg: &mut SkMsg = program(&mut ebpf, programs::FAST_PATH_MSG)?;
        let link = msg
            .attach(sockets.fd())
            .and_then(|id| msg.take_link(id))
            .map_err(program_error(programs::FAST_PATH_MSG))?;
        // The verdict program belongs to the pinned sockhash from now on; dropping the
        // link would detach it when this agent exits.
        std::mem::forget(link);

        let mut capture = Capture {
            ebpf,
            pin_dir: pin_dir.to_owned(),
            fast_path,
            netns,
        };
        let mut settings: Array<_, u32> =
            Array::try_from(capture.map(maps::SETTINGS)).map_err(map_error(maps::SETTINGS))?;
        settings
            .set(settings::FAST_PATH, u32::from(fast_path), 0)
            .map_err(map_error(maps::SETTINGS))?;
        // Workloads adopted from an older agent get their listeners guarded too.
        capture.guard_listeners(None)?;
        let adopted = capture.status()?.workloads;
        for w in &adopted {
            tracing::info!(workload = %w.workload, cgroup_id = w.cgroup_id,
                links = w.attachments.len(), "adopted pinned capture");
        }
        tracing::info!(pin_dir = %pin_dir.display(), fast_path, adopted = adopted.len(),
            "eBPF capture ready");
        Ok(capture)
    }

    /// Attaches capture to `spec.cgroup` for `workload` (again, with a new spec, if it
    /// is already attached there).
    pub fn attach(
        &mut self,
        workload: &str,
        spec: &CaptureSpec,
    ) -> Result<WorkloadStatus, CaptureError> {
        spec::check_name(workload)?;
        let (cgroup, cgroup_id) = open_cgroup(&spec.cgroup)?;
        refuse_own_cgroup(&spec.cgroup)?;
        let proxy_cgroup = match &spec.proxy_cgroup {
            Some(path) => open_cgroup(path)?.1,
            None => 0,
        };
        let config = spec.to_config(proxy_cgroup)?;
        let netns = match &spec.netns {
            Some(path) => sys::netns_cookie_of(path)
                .map_err(|e| SpecError(format!("network namespace {}: {e}", path.display())))?,
            None => self.netns,
        };

        let existing = self.links(workload);
        if existing.cgroup_id != 0 && existing.cgroup_id != cgroup_id {
            return Err(CaptureError::OtherCgroup {
                workload: workload.into(),
                cgroup_id: existing.cgroup_id,
            });
        }
        let mut workloads = self.workloads()?;
        let previous = workloads.get(&cgroup_id, 0).ok();
        workloads
            .insert(cgroup_id, config, 0)
            .map_err(map_error(maps::WORKLOADS))?;
        let mut exempt = self.exempt()?;
        if let Some(old) = previous.filter(|old| old.proxy_cgroup != proxy_cgroup) {
            let _ = exempt.remove(&old.proxy_cgroup);
        }
        if proxy_cgroup != 0 {
            exempt
                .insert(proxy_cgroup, 1, 0)
                .map_err(map_error(maps::EXEMPT_CGROUPS))?;
        }

        let dir = self.workload_dir(workload);
        fs::create_dir_all(&dir).map_err(io_error(format!("creating {}", dir.display())))?;
        for (name, attach) in CGROUP_PROGRAMS {
            let pin = dir.join(name);
            if pin.exists() {
                continue; // attached before (re-registration, or adopted)
            }
            if let Err(e) = self.link(name, attach, (&cgroup, &spec.cgroup), &pin) {
                let _ = self.detach(workload);
                return Err(e);
            }
        }
        if let Err(e) = self.guard_listeners(Some((cgroup_id, listener_keys(&config, netns)))) {
            let _ = self.detach(workload);
            return Err(e);
        }
        tracing::info!(workload, cgroup = %spec.cgroup.display(), cgroup_id, proxy_cgroup,
            inbound_ports = ?spec.inbound_ports, "capture attached");
        Ok(WorkloadStatus {
            cgroup: Some(spec.cgroup.clone()),
            ..self.links(workload)
        })
    }

    /// One `bpf_link` of program `name` to `cgroup`, pinned at `pin`.
    fn link(
        &self,
        name: &'static str,
        attach: AttachType,
        (cgroup, cgroup_path): (&fs::File, &Path),
        pin: &Path,
    ) -> Result<(), CaptureError> {
        let program = self
            .ebpf
            .program(name)
            .expect("the object defines every program");
        let fd = program.fd().map_err(program_error(name))?;
        let link = sys::link_create(fd.as_fd(), cgroup.as_fd(), attach).map_err(io_error(
            format!("attaching {name} to {}", cgroup_path.display()),
        ))?;
        sys::pin(link.as_fd(), pin).map_err(io_error(format!("pinning {}", pin.display())))
    }

    /// Detaches `workload`'s capture; `false` if it had none.
    pub fn detach(&mut self, workload: &str) -> Result<bool, CaptureError> {
        spec::check_name(workload)?;
        let dir = self.workload_dir(workload);
        if !dir.exists() {
            return Ok(false);
        }
        let cgroup_id = self.links(workload).cgroup_id;
        if cgroup_id != 0 {
            let mut workloads = self.workloads()?;
            let config = workloads.get(&cgroup_id, 0).ok();
            let _ = workloads.remove(&cgroup_id);
            if let Some(config) = config.filter(|c| c.proxy_cgroup != 0) {
                let _ = self.exempt()?.remove(&config.proxy_cgroup);
            }
        }
        for (name, _) in CGROUP_PROGRAMS {
            // Unlinking the pin drops the link's last reference: the kernel detaches it.
            match fs::remove_file(dir.join(name)) {
                Err(e) if e.kind() != io::ErrorKind::NotFound => {
                    return Err(io_error(format!("unpinning {name}"))(e))
                }
                _ => {}
            }
        }
        fs::remove_dir(&dir).map_err(io_error(format!("removing {}", dir.display())))?;
        self.guard_listeners(None)?;
        tracing::info!(workload, cgroup_id, "capture detached");
        Ok(true)
    }

    /// Attachments (from the pins, checked with the kernel), the fast path, counters.
    pub fn status(&mut self) -> Result<Status, CaptureError> {
        let mut names: Vec<String> = fs::read_dir(self.pin_dir.join("workloads"))
            .map_err(io_error("listing pinned workloads"))?
            .filter_map(|e| e.ok())
            .filter_map(|e| e.file_name().into_string().ok())
            .map(|pin| themis_contracts::names::from_bpffs_name(&pin))
            .collect();
        names.sort();
        let workloads = names
            .iter()
            .map(|w| {
                let links = self.links(w);
                WorkloadStatus {
                    cgroup: find_cgroup(links.cgroup_id),
                    ..links
                }
            })
            .collect();
        Ok(Status {
            pin_dir: self.pin_dir.clone(),
            fast_path: self.fast_path,
            workloads,
            listener_guard: self.guard_links(),
            counters: self.counters()?,
        })
    }

    /// Makes `OUTBOUND_LISTENERS` hold the registered workloads' listeners, each
    /// owned by its workload's cgroup, and keeps the guard attached at the top cgroup
    /// while there is any, detached when there is none. `changed` is a workload
    /// (its cgroup id) just attached and its listeners' keys; every other workload
    /// keeps the keys it has (their namespace is only known when attached), and one
    /// with none (adopted from an older agent) gets its listeners in the agent's
    /// namespace.
    fn guard_listeners(
        &mut self,
        changed: Option<(u64, Vec<SocketAddrKey>)>,
    ) -> Result<(), CaptureError> {
        let workloads: Vec<(u64, WorkloadConfig)> = self
            .workloads()?
            .iter()
            .collect::<Result<_, _>>()
            .map_err(map_error(maps::WORKLOADS))?;
        let current: Vec<(SocketAddrKey, ListenerOwner)> = self
            .listeners()?
            .iter()
            .collect::<Result<_, _>>()
            .map_err(map_error(maps::OUTBOUND_LISTENERS))?;
        let mut wanted: Vec<(SocketAddrKey, ListenerOwner)> = Vec::new();
        for (cgroup_id, config) in &workloads {
            let keys = match &changed {
                Some((id, keys)) if id == cgroup_id => keys.clone(),
                _ => {
                    let kept: Vec<SocketAddrKey> = current
                        .iter()
                        .filter(|(_, owner)| owner == cgroup_id)
                        .map(|(key, _)| *key)
                        .collect();
                    if kept.is_empty() {
                        listener_keys(config, self.netns)
                    } else {
                        kept
                    }
                }
            };
            wanted.extend(keys.into_iter().map(|key| (key, *cgroup_id)));
        }
        if !wanted.is_empty() {
            self.attach_guard()?;
        }
        let mut listeners = self.listeners()?;
        // Insert before removing: a listener that stays is never unguarded.
        for (key, owner) in &wanted {
            listeners
                .insert(key, owner, 0)
                .map_err(map_error(maps::OUTBOUND_LISTENERS))?;
        }
        let stale: Vec<SocketAddrKey> = listeners
            .keys()
            .filter_map(Result::ok)
            .filter(|key| !wanted.iter().any(|(w, _)| w == key))
            .collect();
        for key in stale {
            let _ = listeners.remove(&key);
        }
        if wanted.is_empty() {
            self.detach_guard()?;
        }
        Ok(())
    }

    /// The guard's links at the top cgroup, pinned (kept if already there).
    fn attach_guard(&self) -> Result<(), CaptureError> {
        let top = cgroup2_mount()
            .ok_or_else(|| CaptureError::Unavailable("no cgroup v2 hierarchy is mounted".into()))?;
        let dir = self.guard_dir();
        fs::create_dir_all(&dir).map_err(io_error(format!("creating {}", dir.display())))?;
        let mut cgroup = None;
        for (name, attach) in GUARD_PROGRAMS {
            let pin = dir.join(name);
            if pin.exists() {
                continue;
            }
            if cgroup.is_none() {
                cgroup = Some(
                    fs::File::open(&top).map_err(io_error(format!("opening {}", top.display())))?,
                );
            }
            let file = cgroup.as_ref().expect("opened above");
            self.link(name, attach, (file, &top), &pin)?;
            tracing::info!(program = name, cgroup = %top.display(), "outbound listeners guarded");
        }
        Ok(())
    }

    /// Unpins the guard's links: the kernel detaches them.
    fn detach_guard(&self) -> Result<(), CaptureError> {
        let dir = self.guard_dir();
        if !dir.exists() {
            return Ok(());
        }
        for (name, _) in GUARD_PROGRAMS {
            match fs::remove_file(dir.join(name)) {
                Err(e) if e.kind() != io::ErrorKind::NotFound => {
                    return Err(io_error(format!("unpinning {name}"))(e))
                }
                _ => {}
            }
        }
        fs::remove_dir(&dir).map_err(io_error(format!("removing {}", dir.display())))
    }

    fn guard_links(&self) -> Vec<Attachment> {
        let dir = self.guard_dir();
        GUARD_PROGRAMS
            .iter()
            .filter_map(|(name, _)| {
                let fd = sys::obj_get(&dir.join(name)).ok()?;
                let info = sys::link_info(fd.as_fd()).ok()?;
                Some(Attachment {
                    program: (*name).into(),
                    link_id: info.id,
                    program_id: info.program_id,
                })
            })
            .collect()
    }

    fn guard_dir(&self) -> PathBuf {
        self.pin_dir.join("top")
    }

    /// A workload's pinned links as the kernel reports them (its cgroup path left out:
    /// finding it takes a walk of the cgroup tree).
    fn links(&self, workload: &str) -> WorkloadStatus {
        let dir = self.workload_dir(workload);
        let mut status = WorkloadStatus {
            workload: workload.into(),
            cgroup_id: 0,
            cgroup: None,
            attachments: Vec::new(),
            missing: Vec::new(),
        };
        for (name, _) in CGROUP_PROGRAMS {
            let info = sys::obj_get(&dir.join(name)).and_then(|fd| sys::link_info(fd.as_fd()));
            match info {
                Ok(info) => {
                    status.cgroup_id = info.cgroup_id;
                    status.attachments.push(Attachment {
                        program: name.into(),
                        link_id: info.id,
                        program_id: info.program_id,
                    });
                }
                Err(_) => status.missing.push(name.into()),
            }
        }
        status
    }

    fn counters(&mut self) -> Result<BTreeMap<&'static str, u64>, CaptureError> {
        let array: PerCpuArray<_, u64> =
            PerCpuArray::try_from(self.map(maps::STATS)).map_err(map_error(maps::STATS))?;
        let mut counters = BTreeMap::new();
        for (index, name) in stats::NAMES.iter().enumerate() {
            let values = match array.get(&(index as u32), 0) {
                Ok(values) => values,
                // An object with fewer counters than this agent knows: not shown.
                Err(aya::maps::MapError::OutOfBounds { .. }) => continue,
                Err(e) => return Err(map_error(maps::STATS)(e)),
            };
            counters.insert(*name, values.iter().sum());
        }
        Ok(counters)
    }

    fn workloads(&mut self) -> Result<HashMap<&mut MapData, u64, WorkloadConfig>, CaptureError> {
        HashMap::try_from(self.map(maps::WORKLOADS)).map_err(map_error(maps::WORKLOADS))
    }

    fn listeners(
        &mut self,
    ) -> Result<HashMap<&mut MapData, SocketAddrKey, ListenerOwner>, CaptureError> {
        HashMap::try_from(self.map(maps::OUTBOUND_LISTENERS))
            .map_err(map_error(maps::OUTBOUND_LISTENERS))
    }

    fn exempt(&mut self) -> Result<HashMap<&mut MapData, u64, u8>, CaptureError> {
        HashMap::try_from(self.map(maps::EXEMPT_CGROUPS)).map_err(map_error(maps::EXEMPT_CGROUPS))
    }

    fn map(&mut self, name: &str) -> &mut aya::maps::Map {
        self.ebpf
            .map_mut(name)
            .unwrap_or_else(|| panic!("the object defines the map {name}"))
    }

    fn workload_dir(&self, workload: &str) -> PathBuf {
        let pin = themis_contracts::names::bpffs_name(workload);
        self.pin_dir.join("workloads").join(&*pin)
    }
}

/// A workload's outbound listeners as guard keys: IPv4, and IPv6 when it has one.
fn listener_keys(config: &WorkloadConfig, netns: u64) -> Vec<SocketAddrKey> {
    let port = config.outbound_port;
    let mut keys = vec![SocketAddrKey::new(
        AF_INET.into(),
        config.outbound_ip4,
        [0; 4],
        port,
        netns,
    )];
    if config.capture_ipv6 != 0 {
        keys.push(SocketAddrKey::new(
            AF_INET6.into(),
            0,
            config.outbound_ip6,
            port,
            netns,
        ));
    }
    keys
}

fn map_error(map: &'static str) -> impl FnOnce(aya::maps::MapError) -> CaptureError {
    move |source| CaptureError::Map { map, source }
}

fn program_error(program: &'static str) -> impl FnOnce(ProgramError) -> CaptureError {
    move |source| CaptureError::Program { program, source }
}

fn program<'a, T>(ebpf: &'a mut Ebpf, name: &'static str) -> Result<&'a mut T, CaptureError>
where
    &'a mut T: TryFrom<&'a mut aya::programs::Program, Error = ProgramError>,
{
    ebpf.program_mut(name)
        .expect("the object defines every program")
        .try_into()
        .map_err(program_error(name))
}

fn load_program(ebpf: &mut Ebpf, name: &'static str) -> Result<(), CaptureError> {
    let loaded = match name {
        programs::CONNECT4
        | programs::CONNECT6
        | programs::LISTENER_GUARD4
        | programs::LISTENER_GUARD6 => program::<CgroupSockAddr>(ebpf, name)?.load(),
        programs::SOCK_OPS => program::<SockOps>(ebpf, name)?.load(),
        programs::GETSOCKOPT => program::<CgroupSockopt>(ebpf, name)?.load(),
        programs::INBOUND => program::<CgroupSkb>(ebpf, name)?.load(),
        programs::FAST_PATH_MSG => program::<SkMsg>(ebpf, name)?.load(),
        _ => unreachable!("not a program of the object: {name}"),
    };
    loaded.map_err(|source| match &source {
        ProgramError::LoadError { io_error, .. }
            if io_error.raw_os_error() == Some(libc::EPERM) =>
        {
            CaptureError::Unavailable(format!(
                "loading {name} was refused ({io_error}): the agent needs CAP_BPF, CAP_NET_ADMIN \
                 and CAP_SYS_ADMIN (run it as root)"
            ))
        }
        _ => program_error(name)(source),
    })
}

/// A STATS map pinned by an older agent with fewer counters cannot hold the new ones
/// (aya reuses a pinned map as it is): unpin it so this load makes a full one. Links
/// adopted from the older agent keep counting into the old map, which goes with them.
fn replace_short_stats(pin_dir: &Path) -> Result<(), CaptureError> {
    let pin = pin_dir.join(maps::STATS);
    let Ok(old) = MapData::from_pin(&pin) else {
        return Ok(()); // none pinned yet
    };
    let entries = old.info().map_err(map_error(maps::STATS))?.max_entries();
    if entries < stats::COUNT {
        fs::remove_file(&pin).map_err(io_error(format!("unpinning {}", pin.display())))?;
        tracing::warn!(pin = %pin.display(), entries, now = stats::COUNT,
            "replaced the STATS map of an older agent; counters start again from 0");
    }
    Ok(())
}

/// What the kernel and the machine must offer, each with what to do when it is missing.
fn preflight(pin_dir: &Path) -> Result<(), CaptureError> {
    if OBJECT.is_empty() {
        return Err(CaptureError::Unavailable(
            "this build has no eBPF programs (built without the nightly toolchain or \
             bpf-linker, or with THEMIS_EBPF=skip): run scripts/setup.sh, then rebuild"
                .into(),
        ));
    }
    if !Path::new("/sys/kernel/btf/vmlinux").exists() {
        return Err(CaptureError::Unavailable(
            "the kernel has no BTF (/sys/kernel/btf/vmlinux is missing; build it with CONFIG_DEBUG_INFO_BTF=y)".into(),
        ));
    }
    if cgroup2_mount().is_none() {
        return Err(CaptureError::Unavailable(
            "no cgroup v2 hierarchy is mounted (mount -t cgroup2 none /sys/fs/cgroup/unified)"
                .into(),
        ));
    }
    let bpffs = pin_dir.parent().unwrap_or(pin_dir);
    match sys::fs_magic(bpffs) {
        Ok(sys::BPF_FS_MAGIC) => Ok(()),
        _ => Err(CaptureError::Unavailable(format!(
            "{} is not on a bpffs, so capture could not outlive the agent (mount -t bpf bpf {})",
            bpffs.display(),
            bpffs.display()
        ))),
    }
}

/// The cgroup v2 directory, opened for attaching, and its id (the inode number).
fn open_cgroup(path: &Path) -> Result<(fs::File, u64), CaptureError> {
    match sys::fs_magic(path) {
        Ok(sys::CGROUP2_SUPER_MAGIC) => {}
        Ok(_) => {
            return Err(SpecError(format!(
                "{} is not a cgroup v2 directory (cgroup v2 is mounted at {})",
                path.display(),
                cgroup2_mount().map_or("nowhere".into(), |p| p.display().to_string())
            ))
            .into())
        }
        Err(e) => return Err(SpecError(format!("cgroup {}: {e}", path.display())).into()),
    }
    let what = || format!("opening {}", path.display());
    let dir = fs::File::open(path).map_err(io_error(what()))?;
    let id = dir.metadata().map_err(io_error(what()))?.ino();
    Ok((dir, id))
}

/// Where cgroup v2 is mounted, from /proc/self/mounts.
pub fn cgroup2_mount() -> Option<PathBuf> {
    let mounts = fs::read_to_string("/proc/self/mounts").ok()?;
    mounts.lines().find_map(|line| {
        let mut fields = line.split_whitespace();
        let (_, target, fstype) = (fields.next()?, fields.next()?, fields.next()?);
        (fstype == "cgroup2").then(|| PathBuf::from(target))
    })
}

/// The agent must never capture itself: refuse a workload cgroup that contains it.
fn refuse_own_cgroup(cgroup: &Path) -> Result<(), CaptureError> {
    let own = fs::read_to_string("/proc/self/cgroup").unwrap_or_default();
    let Some(relative) = own.lines().find_map(|l| l.strip_prefix("0::")) else {
        return Ok(());
    };
    let (Some(mount), Ok(target)) = (cgroup2_mount(), cgroup.canonicalize()) else {
        return Ok(());
    };
    let mine = mount.join(relative.trim_start_matches('/'));
    if mine.starts_with(&target) {
        return Err(SpecError(format!(
            "the agent itself runs in {} (inside {}); capturing it would loop its own traffic",
            mine.display(),
            cgroup.display()
        ))
        .into());
    }
    Ok(())
}

/// The cgroup v2 directory with this id (its inode number), by a bounded walk.
fn find_cgroup(id: u64) -> Option<PathBuf> {
    let mut stack = vec![(cgroup2_mount()?, 0)];
    let mut visited = 0;
    while let Some((dir, depth)) = stack.pop() {
        visited += 1;
        if visited > 100_000 {
            return None;
        }
        if fs::metadata(&dir).ok()?.ino() == id {
            return Some(dir);
        }
        if depth >= 16 {
            continue;
        }
        for entry in fs::read_dir(&dir).ok()?.flatten() {
            if entry.file_type().is_ok_and(|t| t.is_dir()) {
                stack.push((entry.path(), depth + 1));
            }
        }
    }
    None
}
