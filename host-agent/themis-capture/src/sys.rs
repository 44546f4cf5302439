//! The few kernel calls aya 0.13 does not expose: cgroup bpf_links we can pin (aya
//! keeps its cgroup links private), a link's info, and filesystem magic numbers.
use std::{
    ffi::CString,
    io,
    os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd},
    os::unix::ffi::OsStrExt,
    path::Path,
};

const BPF_OBJ_PIN: libc::c_long = 6;
const BPF_OBJ_GET_INFO_BY_FD: libc::c_long = 15;
const BPF_LINK_CREATE: libc::c_long = 28;

pub const BPF_FS_MAGIC: i64 = 0xcafe_4a11;
pub const CGROUP2_SUPER_MAGIC: i64 = 0x6367_7270;

/// `enum bpf_attach_type` values (include/uapi/linux/bpf.h).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u32)]
pub enum AttachType {
    InetIngress = 0,
    SockOps = 3,
    Inet4Connect = 10,
    Inet6Connect = 11,
    GetSockopt = 21,
}

/// `union bpf_attr`, big enough for every command used here.
#[repr(C, align(8))]
struct Attr([u8; 128]);

impl Attr {
    fn new() -> Self {
        Attr([0; 128])
    }
    fn put_u32(&mut self, offset: usize, v: u32) {
        self.0[offset..offset + 4].copy_from_slice(&v.to_ne_bytes());
    }
    fn put_u64(&mut self, offset: usize, v: u64) {
        self.0[offset..offset + 8].copy_from_slice(&v.to_ne_bytes());
    }
}

fn bpf(cmd: libc::c_long, attr: &mut Attr) -> io::Result<libc::c_long> {
    // SAFETY: `attr` is a zero-initialised bpf_attr of the size passed.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            cmd,
            attr as *mut Attr,
            std::mem::size_of::<Attr>(),
        )
    };
    if ret < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(ret)
    }
}

/// `BPF_LINK_CREATE` of a cgroup program: the link lives while an fd or a pin holds it.
pub fn link_create(
    program: BorrowedFd<'_>,
    cgroup: BorrowedFd<'_>,
    attach: AttachType,
) -> io::Result<OwnedFd> {
    let mut attr = Attr::new();
    attr.put_u32(0, program.as_raw_fd() as u32);
    attr.put_u32(4, cgroup.as_raw_fd() as u32);
    attr.put_u32(8, attach as u32);
    let fd = bpf(BPF_LINK_CREATE, &mut attr)?;
    // SAFETY: the kernel returned a new fd we now own.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

/// `BPF_OBJ_PIN`: the object outlives this process under `path` in bpffs.
pub fn pin(fd: BorrowedFd<'_>, path: &Path) -> io::Result<()> {
    let path = CString::new(path.as_os_str().as_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "NUL in pin path"))?;
    let mut attr = Attr::new();
    attr.put_u64(0, path.as_ptr() as u64);
    attr.put_u32(8, fd.as_raw_fd() as u32);
    bpf(BPF_OBJ_PIN, &mut attr).map(drop)
}

/// What the kernel says of a cgroup link.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LinkInfo {
    pub id: u32,
    pub program_id: u32,
    pub cgroup_id: u64,
    pub attach_type: u32,
}

/// `BPF_OBJ_GET_INFO_BY_FD` on a link.
pub fn link_info(link: BorrowedFd<'_>) -> io::Result<LinkInfo> {
    // struct bpf_link_info: type, id, prog_id, then (8-aligned) the cgroup part.
    let mut info = [0u8; 64];
    let mut attr = Attr::new();
    attr.put_u32(0, link.as_raw_fd() as u32);
    attr.put_u32(4, info.len() as u32);
    attr.put_u64(8, info.as_mut_ptr() as u64);
    bpf(BPF_OBJ_GET_INFO_BY_FD, &mut attr)?;
    let u32_at = |o: usize| u32::from_ne_bytes(info[o..o + 4].try_into().unwrap());
    Ok(LinkInfo {
        id: u32_at(4),
        program_id: u32_at(8),
        cgroup_id: u64::from_ne_bytes(info[16..24].try_into().unwrap()),
        attach_type: u32_at(24),
    })
}

/// The filesystem magic of what `path` lives on.
pub fn fs_magic(path: &Path) -> io::Result<i64> {
    let c = CString::new(path.as_os_str().as_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "NUL in path"))?;
    // SAFETY: statfs fills the zeroed struct; the path is NUL-terminated.
    unsafe {
        let mut buf: libc::statfs = std::mem::zeroed();
        if libc::statfs(c.as_ptr(), &mut buf) != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(buf.f_type as i64)
    }
}

const BPF_OBJ_GET: libc::c_long = 7;

/// `BPF_OBJ_GET`: an fd for a pinned object.
pub fn obj_get(path: &Path) -> io::Result<OwnedFd> {
    let path = CString::new(path.as_os_str().as_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "NUL in pin path"))?;
    let mut attr = Attr::new();
    attr.put_u64(0, path.as_ptr() as u64);
    let fd = bpf(BPF_OBJ_GET, &mut attr)?;
    // SAFETY: the kernel returned a new fd we now own.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

/// `SO_NETNS_COOKIE` (Linux 5.14): the cookie of a socket's network namespace, the
/// value `bpf_get_netns_cookie` gives the programs.
const SO_NETNS_COOKIE: libc::c_int = 71;

/// The cookie of the network namespace of namespace file `path`: asked from a
/// thread that enters it (and ends), so the agent's own threads stay where they are.
pub fn netns_cookie_of(path: &Path) -> io::Result<u64> {
    let namespace = std::fs::File::open(path)?;
    std::thread::scope(|scope| {
        scope
            .spawn(|| {
                // SAFETY: setns on an fd we hold, for this thread only (CLONE_NEWNET).
                if unsafe { libc::setns(namespace.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
                    return Err(io::Error::last_os_error());
                }
                netns_cookie()
            })
            .join()
            .unwrap_or_else(|_| Err(io::Error::other("the namespace thread panicked")))
    })
}

/// The cookie of this thread's network namespace.
pub fn netns_cookie() -> io::Result<u64> {
    // SAFETY: a new socket we close below; getsockopt writes at most `len` bytes.
    unsafe {
        let fd = libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0);
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        let socket = OwnedFd::from_raw_fd(fd);
        let mut cookie = 0u64;
        let mut len = std::mem::size_of::<u64>() as libc::socklen_t;
        let ret = libc::getsockopt(
            socket.as_raw_fd(),
            libc::SOL_SOCKET,
            SO_NETNS_COOKIE,
            (&mut cookie as *mut u64).cast(),
            &mut len,
        );
        if ret != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(cookie)
    }
}
