//! The map types shared by the eBPF programs (`ebpf/themis-ebpf`, built for bpfel) and
//! the host agent's loader (`host-agent/themis-capture`). Everything is `#[repr(C)]`,
//! plain data, with explicit padding, so both sides agree byte for byte.
//!
//! Byte order: IP addresses are kept as the kernel gives them (network order, in
//! `u32` words), ports in host order.
#![no_std]

/// Most ports in one workload's inbound or exclusion list.
pub const MAX_PORTS: usize = 8;
/// Most CIDRs in one workload's exclusion list.
pub const MAX_CIDRS: usize = 8;
/// Deepest cgroup level the programs look at when finding a workload.
pub const MAX_CGROUP_DEPTH: u32 = 16;
/// `getsockopt(SOL_IP, SO_ORIGINAL_DST)` (and `IP6T_SO_ORIGINAL_DST` at `SOL_IPV6`).
pub const SO_ORIGINAL_DST: i32 = 80;
/// No proxy uid configured.
pub const NO_UID: u32 = u32::MAX;
/// [`WorkloadConfig::inbound_mode`]: the listed ports are the protected ones.
pub const INBOUND_LISTED: u8 = 0;
/// [`WorkloadConfig::inbound_mode`]: every TCP port is protected, the listed ones
/// exempted (as Istio captures every inbound port unless excluded).
pub const INBOUND_ALL_TCP: u8 = 1;

pub const AF_INET: u16 = 2;
pub const AF_INET6: u16 = 10;

/// An IPv4 or IPv6 CIDR; `family == 0` marks an unused slot.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Cidr {
    /// Network order words; IPv4 in `addr[0]`.
    pub addr: [u32; 4],
    /// Network order words; applied with `&` before comparing.
    pub mask: [u32; 4],
    pub family: u16,
    pub _pad: [u8; 6],
}

/// What capture does for one workload, keyed in [`maps::WORKLOADS`] by the cgroup
/// v2 id (the inode number) of the workload's cgroup.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WorkloadConfig {
    /// The local proxy's outbound listener, IPv4 (network order) and port (host order).
    pub outbound_ip4: u32,
    pub outbound_port: u16,
    /// Capture IPv6 connects too (to `outbound_ip6`); otherwise they are left alone.
    pub capture_ipv6: u8,
    /// How `inbound_ports` is read: [`INBOUND_LISTED`] or [`INBOUND_ALL_TCP`]. In the
    /// byte that was padding, so maps pinned by an older agent read as listed.
    pub inbound_mode: u8,
    pub outbound_ip6: [u32; 4],
    /// Connects by this uid are never captured (Istio's 1337 style); `NO_UID` = none.
    pub proxy_uid: u32,
    pub _pad1: u32,
    /// The proxy's cgroup id (also in `EXEMPT_CGROUPS`), kept for the loader's clean-up.
    pub proxy_cgroup: u64,
    /// [`INBOUND_LISTED`]: app ports that accept TCP and UDP only from loopback, i.e.
    /// via the local proxy. [`INBOUND_ALL_TCP`]: the ports exempted, which take new TCP
    /// connections from outside the node (every other port takes them only from
    /// loopback or at the proxy's own sockets). 0 = unused. A workload with at least
    /// one listed port, or in [`INBOUND_ALL_TCP`], is *protected*: the ingress program
    /// also limits what else it takes from outside the node (docs/CAPTURE.md).
    pub inbound_ports: [u16; MAX_PORTS],
    /// Destination ports never captured; 0 = unused.
    pub exclude_ports: [u16; MAX_PORTS],
    /// Destinations never captured.
    pub exclude_cidrs: [Cidr; MAX_CIDRS],
}

/// Where an app meant to connect, recorded at connect time.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct OriginalDst {
    /// Network order words; IPv4 in `addr[0]`.
    pub addr: [u32; 4],
    /// Host order.
    pub port: u16,
    pub family: u16,
    pub _pad: u32,
}

/// One end of a TCP connection, as a map key: the app socket's local address
/// (written when it is established) is the proxy's peer address (read by getsockopt).
/// The network namespace's cookie keeps pods' loopbacks apart on one node.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct SocketAddrKey {
    /// Network order words; IPv4 (also IPv4-mapped IPv6) in `addr[0]`.
    pub addr: [u32; 4],
    /// Host order.
    pub port: u16,
    pub family: u16,
    pub _pad: u32,
    /// `bpf_get_netns_cookie` of the socket's network namespace.
    pub netns: u64,
}

impl SocketAddrKey {
    /// An address as a key, as the programs and the loader both make it: an
    /// IPv4-mapped IPv6 address folds into IPv4, so both families agree.
    #[inline(always)]
    pub fn new(family: u32, ip4: u32, ip6: [u32; 4], port: u16, netns: u64) -> Self {
        if family == AF_INET6 as u32
            && !(ip6[0] == 0 && ip6[1] == 0 && ip6[2] == u32::to_be(0xffff))
        {
            SocketAddrKey {
                addr: ip6,
                port,
                family: AF_INET6,
                _pad: 0,
                netns,
            }
        } else {
            let ip = if family == AF_INET as u32 {
                ip4
            } else {
                ip6[3]
            };
            SocketAddrKey {
                addr: [ip, 0, 0, 0],
                port,
                family: AF_INET,
                _pad: 0,
                netns,
            }
        }
    }
}

/// A proxy's outbound listener in [`maps::OUTBOUND_LISTENERS`] is a [`SocketAddrKey`]
/// (its address, port and network namespace); the value is the cgroup id of the
/// workload whose processes alone may connect to it.
pub type ListenerOwner = u64;

/// Both ends of a TCP connection: the fast path's sockhash key.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct ConnectionKey {
    pub local: SocketAddrKey,
    pub remote: SocketAddrKey,
}

/// Indices into [`maps::SETTINGS`].
pub mod settings {
    /// Non-zero: sockops puts local connections in the sockhash and `sk_msg` moves
    /// their data socket to socket.
    pub const FAST_PATH: u32 = 0;
    pub const COUNT: u32 = 4;
}

/// Indices into [`maps::STATS`] (per-CPU counters).
pub mod stats {
    /// Connects rewritten to the proxy.
    pub const CAPTURED: u32 = 0;
    /// Connects of a workload left alone: excluded port or CIDR, or to the proxy itself.
    pub const EXCLUDED: u32 = 1;
    /// Connects of the proxy (exempt cgroup or uid), left alone.
    pub const PROXY_EXEMPT: u32 = 2;
    /// `SO_ORIGINAL_DST` answered.
    pub const ORIGINAL_DST_ANSWERED: u32 = 3;
    /// `SO_ORIGINAL_DST` asked for a connection without a record.
    pub const ORIGINAL_DST_MISSED: u32 = 4;
    /// TCP packets to an inbound port from outside the node (IPv6 extension headers
    /// walked), dropped.
    pub const INBOUND_DROPPED: u32 = 5;
    /// Sockets added to the fast path's sockhash.
    pub const FAST_PATH_SOCKETS: u32 = 6;
    /// UDP (and UDP-Lite) datagrams to an inbound port from outside the node, dropped.
    pub const INBOUND_UDP_DROPPED: u32 = 7;
    /// ICMP/ICMPv6 messages to a protected workload from outside the node, dropped:
    /// everything but errors, echo replies and IPv6 neighbour discovery.
    pub const INBOUND_ICMP_DROPPED: u32 = 8;
    /// Other protocols (ESP, SCTP, raw IP, no next header, ...) to a protected
    /// workload from outside the node, dropped.
    pub const INBOUND_OTHER_DROPPED: u32 = 9;
    /// Fragments (IPv4, or IPv6 with a fragment header that is not atomic) to a
    /// protected workload from outside the node, dropped.
    pub const INBOUND_FRAGMENT_DROPPED: u32 = 10;
    /// Packets to a protected workload from outside the node whose headers could not be
    /// followed (too many IPv6 extension headers, truncated), dropped.
    pub const INBOUND_MALFORMED_DROPPED: u32 = 11;
    /// Packets to a protected workload with a loopback source that did not arrive on
    /// the loopback device (forged, let in by `route_localnet`), dropped.
    pub const INBOUND_SPOOFED_LOOPBACK_DROPPED: u32 = 12;
    /// Connects to a workload's outbound listener by a process outside that
    /// workload's cgroup, refused (EPERM): another pod or a host process on the node.
    pub const OUTBOUND_LISTENER_REFUSED: u32 = 13;
    pub const COUNT: u32 = 14;
    pub const NAMES: [&str; COUNT as usize] = [
        "captured",
        "excluded",
        "proxy_exempt",
        "original_dst_answered",
        "original_dst_missed",
        "inbound_dropped",
        "fast_path_sockets",
        "inbound_udp_dropped",
        "inbound_icmp_dropped",
        "inbound_other_dropped",
        "inbound_fragment_dropped",
        "inbound_malformed_dropped",
        "inbound_spoofed_loopback_dropped",
        "outbound_listener_refused",
    ];
}

/// The maps' names in the object (and in the pin directory).
pub mod maps {
    pub const WORKLOADS: &str = "WORKLOADS";
    pub const EXEMPT_CGROUPS: &str = "EXEMPT_CGROUPS";
    pub const ORIGINAL_BY_COOKIE: &str = "ORIGINAL_BY_COOKIE";
    pub const ORIGINAL_BY_ADDR: &str = "ORIGINAL_BY_ADDR";
    pub const FAST_PATH_SOCKETS: &str = "FAST_PATH_SOCKETS";
    pub const SETTINGS: &str = "SETTINGS";
    pub const STATS: &str = "STATS";
    pub const OUTBOUND_LISTENERS: &str = "OUTBOUND_LISTENERS";
}

/// The programs' names in the object.
pub mod programs {
    pub const CONNECT4: &str = "connect4";
    pub const CONNECT6: &str = "connect6";
    pub const GETSOCKOPT: &str = "original_dst";
    pub const SOCK_OPS: &str = "sock_ops";
    pub const INBOUND: &str = "inbound";
    pub const FAST_PATH_MSG: &str = "fast_path_msg";
    /// `cgroup/connect4` and `cgroup/connect6` at the top cgroup: only a workload's
    /// own processes may connect to its outbound listener.
    pub const LISTENER_GUARD4: &str = "listener_guard4";
    pub const LISTENER_GUARD6: &str = "listener_guard6";
}

/// Linux's loopback device has this ifindex in every network namespace.
pub const LOOPBACK_IFINDEX: u32 = 1;

// Both sides compile these: a layout change that breaks agreement fails the build.
const _: () = assert!(core::mem::size_of::<Cidr>() == 40);
const _: () = assert!(core::mem::size_of::<WorkloadConfig>() == 392);
const _: () = assert!(core::mem::size_of::<OriginalDst>() == 24);
const _: () = assert!(core::mem::size_of::<SocketAddrKey>() == 32);
const _: () = assert!(core::mem::size_of::<ConnectionKey>() == 64);

#[cfg(feature = "user")]
mod pod {
    use super::*;
    // SAFETY: plain `#[repr(C)]` data with explicit padding; every bit pattern is valid.
    unsafe impl aya::Pod for WorkloadConfig {}
    unsafe impl aya::Pod for OriginalDst {}
    unsafe impl aya::Pod for SocketAddrKey {}
    unsafe impl aya::Pod for ConnectionKey {}
}
