//! Themis Mesh's eBPF programs, attached by the host agent to each workload's cgroup:
//!
//! - `connect4` / `connect6` (cgroup/connect*): a workload's TCP connects go to its
//!   proxy's outbound listener; where the app meant to go is kept by socket cookie;
//! - `sock_ops`: when such a connection is established, the record moves to the app
//!   socket's address (the proxy's view of its peer); with the fast path on, local
//!   connections join the sockhash;
//! - `original_dst` (cgroup/getsockopt): answers `SO_ORIGINAL_DST` from that record,
//!   so Envoy's stock `original_dst` listener filter works unchanged;
//! - `inbound` (cgroup_skb/ingress): the app's ports take TCP and UDP only from
//!   loopback, i.e. through the local proxy; a protected workload takes from the
//!   network no other protocol but ICMP errors, echo replies and neighbour discovery
//!   (IPv6 extension headers walked, fragments and unparseable chains dropped);
//! - `fast_path_msg` (sk_msg): data between two local sockets in the sockhash goes
//!   socket to socket, without the TCP/IP stack;
//! - `listener_guard4` / `listener_guard6` (cgroup/connect*, attached once at the top
//!   cgroup, not per workload): a connect to a workload's outbound listener from a
//!   process outside that workload's cgroup (another pod sharing the network
//!   namespace, a host process) is refused, so the proxy signs only for its own pod.
//!
//! The map types are in `themis-ebpf-common`, shared with the agent.
#![no_std]
#![no_main]

use aya_ebpf::{
    bindings::{
        bpf_sock_addr, BPF_F_INGRESS, BPF_NOEXIST, BPF_SOCK_OPS_ACTIVE_ESTABLISHED_CB,
        BPF_SOCK_OPS_PASSIVE_ESTABLISHED_CB,
    },
    helpers::{
        bpf_get_current_ancestor_cgroup_id, bpf_get_current_uid_gid, bpf_get_netns_cookie,
        bpf_get_socket_cookie, bpf_skb_ancestor_cgroup_id,
    },
    macros::{cgroup_skb, cgroup_sock_addr, cgroup_sockopt, map, sk_msg, sock_ops},
    maps::{Array, HashMap, LruHashMap, PerCpuArray, SockHash},
    programs::{SkBuffContext, SkMsgContext, SockAddrContext, SockOpsContext, SockoptContext},
    EbpfContext,
};
use themis_ebpf_common::{
    settings, stats, Cidr, ConnectionKey, ListenerOwner, OriginalDst, SocketAddrKey,
    WorkloadConfig, AF_INET, AF_INET6, INBOUND_ALL_TCP, LOOPBACK_IFINDEX, MAX_CGROUP_DEPTH, NO_UID,
    SO_ORIGINAL_DST,
};

const IPPROTO_TCP: u32 = 6;
const SOL_IP: i32 = 0;
const SOL_IPV6: i32 = 41;
/// cgroup programs: 1 lets the operation go on.
const ALLOW: i32 = 1;
/// cgroup programs: 0 fails the operation with EPERM.
const REFUSE: i32 = 0;

// Pinned by name under the agent's pin directory, so a restarted agent finds them.
#[map]
static WORKLOADS: HashMap<u64, WorkloadConfig> = HashMap::pinned(1024, 0);
#[map]
static EXEMPT_CGROUPS: HashMap<u64, u8> = HashMap::pinned(1024, 0);
#[map]
static ORIGINAL_BY_COOKIE: LruHashMap<u64, OriginalDst> = LruHashMap::pinned(65536, 0);
#[map]
static ORIGINAL_BY_ADDR: LruHashMap<SocketAddrKey, OriginalDst> = LruHashMap::pinned(65536, 0);
#[map]
static FAST_PATH_SOCKETS: SockHash<ConnectionKey> = SockHash::pinned(65536, 0);
#[map]
static SETTINGS: Array<u32> = Array::pinned(settings::COUNT, 0);
#[map]
static STATS: PerCpuArray<u64> = PerCpuArray::pinned(stats::COUNT, 0);
/// Each workload's outbound listener (in the agent's network namespace) and the
/// workload's cgroup: written by the loader on attach and detach. Two per workload
/// at most (IPv4 and IPv6), for `WORKLOADS`' 1024.
#[map]
static OUTBOUND_LISTENERS: HashMap<SocketAddrKey, ListenerOwner> = HashMap::pinned(2048, 0);

#[inline(always)]
fn count(index: u32) {
    if let Some(counter) = STATS.get_ptr_mut(index) {
        // SAFETY: per-CPU slot, no concurrent writer.
        unsafe { *counter += 1 };
    }
}

#[inline(always)]
fn setting(index: u32) -> u32 {
    SETTINGS.get(index).copied().unwrap_or(0)
}

/// Whose socket this is: the deepest registered workload among a cgroup and its
/// ancestors, unless one of them is exempt (a proxy).
enum Owner {
    /// Points into the map: the value is too big for the 512-byte stack.
    Workload(&'static WorkloadConfig),
    Exempt,
    Unknown,
}

/// `ancestor(level)` gives the cgroup's ancestors' ids from the root down, 0 past the
/// cgroup's own level.
#[inline(always)]
fn owner(ancestor: impl Fn(i32) -> u64) -> Owner {
    let mut found = Owner::Unknown;
    let mut level = 1;
    while level <= MAX_CGROUP_DEPTH {
        let id = ancestor(level as i32);
        if id == 0 {
            break;
        }
        // SAFETY: map values stay valid for the program's run; only read.
        if unsafe { EXEMPT_CGROUPS.get(&id) }.is_some() {
            return Owner::Exempt;
        }
        if let Some(config) = unsafe { WORKLOADS.get(&id) } {
            found = Owner::Workload(config);
        }
        level += 1;
    }
    found
}

/// The owner of the task making a connect; the proxy's uid is exempt too.
#[inline(always)]
fn current_owner() -> Owner {
    // SAFETY: a helper without pointers.
    match owner(|level| unsafe { bpf_get_current_ancestor_cgroup_id(level) }) {
        Owner::Workload(config)
            if config.proxy_uid != NO_UID
                && bpf_get_current_uid_gid() as u32 == config.proxy_uid =>
        {
            Owner::Exempt
        }
        other => other,
    }
}

#[inline(always)]
fn port_listed(ports: &[u16], port: u16) -> bool {
    let mut i = 0;
    while i < ports.len() {
        if ports[i] != 0 && ports[i] == port {
            return true;
        }
        i += 1;
    }
    false
}

#[inline(always)]
fn cidr_listed(cidrs: &[Cidr], family: u16, addr: &[u32; 4]) -> bool {
    let mut i = 0;
    while i < cidrs.len() {
        let c = &cidrs[i];
        if c.family == family
            && addr[0] & c.mask[0] == c.addr[0]
            && addr[1] & c.mask[1] == c.addr[1]
            && addr[2] & c.mask[2] == c.addr[2]
            && addr[3] & c.mask[3] == c.addr[3]
        {
            return true;
        }
        i += 1;
    }
    false
}

/// Leaves the connect alone, or points it at the proxy and records the original.
#[inline(always)]
fn capture(ctx: &SockAddrContext, family: u16) -> i32 {
    let sa: *mut bpf_sock_addr = ctx.sock_addr;
    // SAFETY: the context pointer the kernel passed; fields by the verifier's rules.
    unsafe {
        if (*sa).protocol != IPPROTO_TCP {
            return ALLOW;
        }
        let config = match current_owner() {
            Owner::Workload(config) => config,
            Owner::Exempt => {
                count(stats::PROXY_EXEMPT);
                return ALLOW;
            }
            Owner::Unknown => return ALLOW,
        };
        let port = u16::from_be((*sa).user_port as u16);
        let mut addr = [0u32; 4];
        let mut record_family = family;
        if family == AF_INET {
            addr[0] = (*sa).user_ip4;
        } else {
            addr = read_ip6(sa);
            if addr[0] == 0 && addr[1] == 0 && addr[2] == u32::to_be(0xffff) {
                // An IPv4-mapped address on a dual-stack socket: an IPv4 destination.
                addr = [addr[3], 0, 0, 0];
                record_family = AF_INET;
            } else if config.capture_ipv6 == 0 {
                return ALLOW;
            }
        }
        let to_proxy = if record_family == AF_INET {
            addr[0] == config.outbound_ip4 && port == config.outbound_port
        } else {
            addr == config.outbound_ip6 && port == config.outbound_port
        };
        if to_proxy
            || port_listed(&config.exclude_ports, port)
            || cidr_listed(&config.exclude_cidrs, record_family, &addr)
        {
            count(stats::EXCLUDED);
            return ALLOW;
        }
        let original = OriginalDst {
            addr,
            port,
            family: record_family,
            _pad: 0,
        };
        let cookie = bpf_get_socket_cookie(ctx.as_ptr());
        if ORIGINAL_BY_COOKIE.insert(&cookie, &original, 0).is_err() {
            return ALLOW; // no record, no capture: the proxy could not route it
        }
        if family == AF_INET {
            (*sa).user_ip4 = config.outbound_ip4;
        } else if record_family == AF_INET {
            write_ip6(sa, [0, 0, u32::to_be(0xffff), config.outbound_ip4]);
        } else {
            write_ip6(sa, config.outbound_ip6);
        }
        (*sa).user_port = u32::from(config.outbound_port.to_be());
        count(stats::CAPTURED);
    }
    ALLOW
}

// The verifier takes only whole-word accesses to the context: no memcpy of arrays.
#[inline(always)]
unsafe fn read_ip6(sa: *mut bpf_sock_addr) -> [u32; 4] {
    let field = core::ptr::addr_of!((*sa).user_ip6) as *const u32;
    [
        core::ptr::read_volatile(field),
        core::ptr::read_volatile(field.add(1)),
        core::ptr::read_volatile(field.add(2)),
        core::ptr::read_volatile(field.add(3)),
    ]
}

#[inline(always)]
unsafe fn write_ip6(sa: *mut bpf_sock_addr, ip: [u32; 4]) {
    let field = core::ptr::addr_of_mut!((*sa).user_ip6) as *mut u32;
    core::ptr::write_volatile(field, ip[0]);
    core::ptr::write_volatile(field.add(1), ip[1]);
    core::ptr::write_volatile(field.add(2), ip[2]);
    core::ptr::write_volatile(field.add(3), ip[3]);
}

#[cgroup_sock_addr(connect4)]
pub fn connect4(ctx: SockAddrContext) -> i32 {
    capture(&ctx, AF_INET)
}

#[cgroup_sock_addr(connect6)]
pub fn connect6(ctx: SockAddrContext) -> i32 {
    capture(&ctx, AF_INET6)
}

#[cgroup_sock_addr(connect4)]
pub fn listener_guard4(ctx: SockAddrContext) -> i32 {
    guard_listener(&ctx, AF_INET)
}

#[cgroup_sock_addr(connect6)]
pub fn listener_guard6(ctx: SockAddrContext) -> i32 {
    guard_listener(&ctx, AF_INET6)
}

/// Refuses a TCP connect to a workload's outbound listener unless the connecting
/// task is in that workload's cgroup subtree. Attached at the top cgroup, so it runs
/// for every process, after the workload programs below it (a captured connect is
/// judged by where capture sent it: its own pod's listener).
#[inline(always)]
fn guard_listener(ctx: &SockAddrContext, family: u16) -> i32 {
    let sa: *mut bpf_sock_addr = ctx.sock_addr;
    // SAFETY: the context pointer the kernel passed; fields by the verifier's rules.
    let (port, netns, ip4, ip6) = unsafe {
        if (*sa).protocol != IPPROTO_TCP {
            return ALLOW;
        }
        let port = u16::from_be((*sa).user_port as u16);
        let netns = bpf_get_netns_cookie(ctx.as_ptr());
        if family == AF_INET {
            (port, netns, (*sa).user_ip4, [0u32; 4])
        } else {
            (port, netns, 0, read_ip6(sa))
        }
    };
    let destination = address_key(u32::from(family), ip4, ip6, port, netns);
    if refused_by(&destination) {
        count(stats::OUTBOUND_LISTENER_REFUSED);
        return REFUSE;
    }
    // A connect to the unspecified address (0.0.0.0, ::, ::ffff:0.0.0.0) goes to this
    // host: to loopback, or to the address the socket is bound to. Judge it as a
    // connect to each loopback listener on that port.
    let unspecified = if family == AF_INET {
        ip4 == 0
    } else {
        ip6[0] == 0 && ip6[1] == 0 && (ip6[2] == 0 || ip6[2] == u32::to_be(0xffff)) && ip6[3] == 0
    };
    if unspecified {
        let loopback4 = address_key(
            u32::from(AF_INET),
            u32::to_be(0x7f00_0001),
            [0; 4],
            port,
            netns,
        );
        let loopback6 = address_key(
            u32::from(AF_INET6),
            0,
            [0, 0, 0, u32::to_be(1)],
            port,
            netns,
        );
        if refused_by(&loopback4) || refused_by(&loopback6) {
            count(stats::OUTBOUND_LISTENER_REFUSED);
            return REFUSE;
        }
    }
    ALLOW
}

/// `destination` is a workload's outbound listener and the current task is outside
/// that workload's cgroup.
#[inline(always)]
fn refused_by(destination: &SocketAddrKey) -> bool {
    // SAFETY: a map lookup; the value is copied out at once.
    match unsafe { OUTBOUND_LISTENERS.get(destination) } {
        Some(owner) => !current_within(*owner),
        None => false,
    }
}

/// The current task's cgroup is `cgroup` or below it.
#[inline(always)]
fn current_within(cgroup: u64) -> bool {
    let mut level = 1;
    while level <= MAX_CGROUP_DEPTH {
        // SAFETY: a helper without pointers.
        let id = unsafe { bpf_get_current_ancestor_cgroup_id(level as i32) };
        if id == 0 {
            return false;
        }
        if id == cgroup {
            return true;
        }
        level += 1;
    }
    false
}

/// An address as a key; IPv4-mapped IPv6 folds into IPv4 so both sides agree.
#[inline(always)]
fn address_key(family: u32, ip4: u32, ip6: [u32; 4], port: u16, netns: u64) -> SocketAddrKey {
    SocketAddrKey::new(family, ip4, ip6, port, netns)
}

#[sock_ops]
pub fn sock_ops(ctx: SockOpsContext) -> u32 {
    let op = ctx.op();
    if op != BPF_SOCK_OPS_ACTIVE_ESTABLISHED_CB && op != BPF_SOCK_OPS_PASSIVE_ESTABLISHED_CB {
        return 1;
    }
    let family = ctx.family();
    // SAFETY: the sock_ops context the kernel passed.
    let netns = unsafe { bpf_get_netns_cookie(ctx.as_ptr()) };
    // sock_ops gives the local port in host order, the remote one in network order
    // in the upper half.
    let local = address_key(
        family,
        ctx.local_ip4(),
        ctx.local_ip6(),
        ctx.local_port() as u16,
        netns,
    );
    let remote = address_key(
        family,
        ctx.remote_ip4(),
        ctx.remote_ip6(),
        u16::from_be((ctx.remote_port() >> 16) as u16),
        netns,
    );
    if op == BPF_SOCK_OPS_ACTIVE_ESTABLISHED_CB {
        // SAFETY: the sock_ops context the kernel passed.
        let cookie = unsafe { bpf_get_socket_cookie(ctx.as_ptr()) };
        // SAFETY: plain data, copied out at once.
        if let Some(original) = unsafe { ORIGINAL_BY_COOKIE.get(&cookie) } {
            let original = *original;
            let _ = ORIGINAL_BY_ADDR.insert(&local, &original, 0);
            let _ = ORIGINAL_BY_COOKIE.remove(&cookie);
        }
    }
    if setting(settings::FAST_PATH) != 0 && is_local(&remote) {
        let mut key = ConnectionKey { local, remote };
        // SAFETY: the sock_ops context the kernel passed.
        if FAST_PATH_SOCKETS
            .update(&mut key, unsafe { &mut *ctx.ops }, u64::from(BPF_NOEXIST))
            .is_ok()
        {
            count(stats::FAST_PATH_SOCKETS);
        }
    }
    1
}

/// Loopback peers only: the fast path is for same-node connections, and the
/// app-to-proxy hop is always on loopback.
#[inline(always)]
fn is_local(key: &SocketAddrKey) -> bool {
    if key.family == AF_INET {
        u32::from_be(key.addr[0]) >> 24 == 127
    } else {
        key.addr[0] == 0 && key.addr[1] == 0 && key.addr[2] == 0 && key.addr[3] == u32::to_be(1)
    }
}

#[sk_msg]
pub fn fast_path_msg(ctx: SkMsgContext) -> u32 {
    // SAFETY: the sk_msg context the kernel passed.
    let msg = unsafe { &*ctx.msg };
    // SAFETY: the sk_msg context the kernel passed.
    let netns = unsafe { bpf_get_netns_cookie(ctx.as_ptr()) };
    // The peer's key: its local end is our remote end.
    let mut peer = ConnectionKey {
        local: address_key(
            msg.family,
            msg.remote_ip4,
            msg.remote_ip6,
            u16::from_be((msg.remote_port >> 16) as u16),
            netns,
        ),
        remote: address_key(
            msg.family,
            msg.local_ip4,
            msg.local_ip6,
            msg.local_port as u16,
            netns,
        ),
    };
    // Without the peer in the map the redirect fails and the data takes the normal
    // path: the verdict stays "pass" either way.
    let _ = FAST_PATH_SOCKETS.redirect_msg(&ctx, &mut peer, u64::from(BPF_F_INGRESS));
    1
}

#[cgroup_sockopt(getsockopt)]
pub fn original_dst(ctx: SockoptContext) -> i32 {
    // SAFETY: the context pointer the kernel passed; `sk` is a full socket here and
    // optval..optval_end is checked before any write.
    unsafe {
        let so = &mut *ctx.sockopt;
        let v6 = match (so.level, so.optname) {
            (SOL_IP, SO_ORIGINAL_DST) => false,
            (SOL_IPV6, SO_ORIGINAL_DST) => true,
            _ => return ALLOW,
        };
        let sk = so.__bindgen_anon_1.sk;
        if sk.is_null() {
            return ALLOW;
        }
        // The proxy's accepted socket: its peer is the app socket's local end.
        let peer = address_key(
            (*sk).family,
            (*sk).dst_ip4,
            (*sk).dst_ip6,
            u16::from_be((*sk).dst_port),
            bpf_get_netns_cookie(ctx.as_ptr()),
        );
        let Some(original) = ORIGINAL_BY_ADDR.get(&peer) else {
            count(stats::ORIGINAL_DST_MISSED);
            return ALLOW;
        };
        let original = *original;
        let optval = so.__bindgen_anon_2.optval as *mut u8;
        let end = so.__bindgen_anon_3.optval_end as *mut u8;
        if !v6 && original.family == AF_INET {
            // struct sockaddr_in
            if optval.add(16) > end {
                return ALLOW;
            }
            core::ptr::write_bytes(optval, 0, 16);
            *(optval as *mut u16) = AF_INET;
            *(optval.add(2) as *mut u16) = original.port.to_be();
            *(optval.add(4) as *mut u32) = original.addr[0];
            so.optlen = 16;
        } else if v6 && original.family == AF_INET6 {
            // struct sockaddr_in6
            if optval.add(28) > end {
                return ALLOW;
            }
            core::ptr::write_bytes(optval, 0, 28);
            *(optval as *mut u16) = AF_INET6;
            *(optval.add(2) as *mut u16) = original.port.to_be();
            *(optval.add(8) as *mut [u32; 4]) = original.addr;
            so.optlen = 28;
        } else {
            return ALLOW;
        }
        so.retval = 0;
        count(stats::ORIGINAL_DST_ANSWERED);
    }
    ALLOW
}

/// cgroup_skb: 1 passes the packet, 0 drops it.
const PASS: i32 = 1;
const DROP: i32 = 0;

const IPPROTO_TCP_U8: u8 = IPPROTO_TCP as u8;
const IPPROTO_HOPOPTS: u8 = 0;
const IPPROTO_ICMP: u8 = 1;
const IPPROTO_UDP: u8 = 17;
const IPPROTO_ROUTING: u8 = 43;
const IPPROTO_FRAGMENT: u8 = 44;
const IPPROTO_AH: u8 = 51;
const IPPROTO_ICMPV6: u8 = 58;
const IPPROTO_DSTOPTS: u8 = 60;
const IPPROTO_UDPLITE: u8 = 136;
/// TCP header flags (byte 13).
const TCP_SYN: u8 = 0x02;
const TCP_ACK: u8 = 0x10;
/// Most IPv6 extension headers followed before the transport header; a longer chain
/// is dropped. The kernel itself accepts at most 8 options per header, and real
/// traffic has one or two headers.
const MAX_IPV6_EXT_HEADERS: u32 = 8;

/// The ingress rule for a protected workload (one with inbound ports), for packets
/// from outside the node (a non-loopback source) to any of its sockets:
///
/// - TCP to an inbound port: dropped (`inbound_dropped`); other TCP ports pass. With
///   `INBOUND_ALL_TCP`, a connection's opening SYN to any port is dropped
///   (`inbound_dropped`) unless the port is exempted (listed) or the receiving socket
///   is the proxy's (its uid); the rest of TCP passes (the replies of the workload's
///   own connections, which no SYN from outside opened);
/// - UDP/UDP-Lite to an inbound port: dropped (`inbound_udp_dropped`); other UDP
///   ports pass (replies to the workload's own DNS and QUIC clients). With
///   `INBOUND_ALL_TCP`, UDP passes (no port of it is listed as protected);
/// - ICMP: errors (destination unreachable, time exceeded, parameter problem, IPv6
///   packet too big), echo replies and IPv6 neighbour discovery (133-137) pass, the
///   rest (echo requests, ...) is dropped (`inbound_icmp_dropped`);
/// - any other protocol, ESP included (its payload cannot be seen): dropped
///   (`inbound_other_dropped`);
/// - fragments: dropped (`inbound_fragment_dropped`); an IPv6 atomic fragment
///   (offset 0, no more fragments) is a whole packet and is judged by what it carries;
/// - IPv6 extension headers (hop-by-hop, routing, fragment, destination options, AH)
///   are walked to the transport header; a chain longer than
///   `MAX_IPV6_EXT_HEADERS` or a truncated header is dropped
///   (`inbound_malformed_dropped`).
///
/// A loopback source on another device than loopback is forged and dropped
/// (`inbound_spoofed_loopback_dropped`). Everything from loopback (a loopback
/// source on the loopback device: the local proxy) and everything to other sockets
/// (unregistered, exempt, or a workload without inbound ports) passes.
#[cgroup_skb(ingress)]
pub fn inbound(ctx: SkBuffContext) -> i32 {
    let loopback_source = loopback_source(&ctx);
    // SAFETY: the skb context the kernel passed; a readable field for cgroup_skb.
    let on_loopback = unsafe { (*ctx.skb.skb).ingress_ifindex } == LOOPBACK_IFINDEX;
    if loopback_source && on_loopback {
        return PASS;
    }
    // The receiving socket's workload, as for connects but from the packet's socket.
    // SAFETY: the skb context the kernel passed.
    let config =
        match owner(|level| unsafe { bpf_skb_ancestor_cgroup_id(ctx.as_ptr() as *mut _, level) }) {
            Owner::Workload(config)
                if config.inbound_mode == INBOUND_ALL_TCP || any_port(&config.inbound_ports) =>
            {
                config
            }
            _ => return PASS,
        };
    // A loopback source from another device is forged: the kernel lets it in only
    // with `route_localnet`, and no real peer has one.
    if loopback_source {
        count(stats::INBOUND_SPOOFED_LOOPBACK_DROPPED);
        return DROP;
    }
    // A packet whose headers cannot be followed is never passed to a protected workload.
    let (verdict, reason) =
        protected_verdict(&ctx, config).unwrap_or((DROP, stats::INBOUND_MALFORMED_DROPPED));
    if verdict == DROP {
        count(reason);
    }
    verdict
}

/// The packet's source is a loopback address. With the packet on the loopback
/// device it comes from this network namespace (the local proxy); on any other
/// device it is forged.
#[inline(always)]
fn loopback_source(ctx: &SkBuffContext) -> bool {
    // cgroup_skb sees the packet from its IP header.
    match ctx.load::<u8>(0).map(|first| first >> 4) {
        Ok(4) => ctx
            .load::<u32>(12)
            .is_ok_and(|source| u32::from_be(source) >> 24 == 127),
        Ok(6) => ctx.load::<[u32; 4]>(8).is_ok_and(|source| {
            let loopback = source == [0, 0, 0, u32::to_be(1)];
            let mapped_loopback = source[0] == 0
                && source[1] == 0
                && source[2] == u32::to_be(0xffff)
                && u32::from_be(source[3]) >> 24 == 127;
            loopback || mapped_loopback
        }),
        _ => false,
    }
}

#[inline(always)]
fn any_port(ports: &[u16]) -> bool {
    let mut i = 0;
    while i < ports.len() {
        if ports[i] != 0 {
            return true;
        }
        i += 1;
    }
    false
}

/// The verdict for a packet from outside the node to a protected workload, and the
/// counter of a drop. An error (a header beyond the packet) is the caller's to drop.
#[inline(always)]
fn protected_verdict(ctx: &SkBuffContext, config: &WorkloadConfig) -> Result<(i32, u32), i64> {
    let first: u8 = ctx.load(0)?;
    let (protocol, offset) = match first >> 4 {
        4 => {
            // Flags and fragment offset: "more fragments" or a non-zero offset.
            if u16::from_be(ctx.load::<u16>(6)?) & 0x3fff != 0 {
                return Ok((DROP, stats::INBOUND_FRAGMENT_DROPPED));
            }
            (ctx.load::<u8>(9)?, usize::from(first & 0x0f) * 4)
        }
        6 => match ipv6_transport(ctx)? {
            Ipv6Transport::Header(protocol, offset) => (protocol, offset),
            Ipv6Transport::Fragment => return Ok((DROP, stats::INBOUND_FRAGMENT_DROPPED)),
            Ipv6Transport::TooLong => return Ok((DROP, stats::INBOUND_MALFORMED_DROPPED)),
        },
        _ => return Ok((DROP, stats::INBOUND_OTHER_DROPPED)),
    };
    let verdict = match protocol {
        IPPROTO_TCP_U8 => {
            let port = u16::from_be(ctx.load::<u16>(offset + 2)?);
            let dropped = if config.inbound_mode == INBOUND_ALL_TCP {
                let flags: u8 = ctx.load(offset + 13)?;
                let opening = flags & TCP_SYN != 0 && flags & TCP_ACK == 0;
                opening && !port_listed(&config.inbound_ports, port) && !to_proxy(ctx, config)
            } else {
                port_listed(&config.inbound_ports, port)
            };
            if dropped {
                (DROP, stats::INBOUND_DROPPED)
            } else {
                (PASS, 0)
            }
        }
        IPPROTO_UDP | IPPROTO_UDPLITE => {
            let port = u16::from_be(ctx.load::<u16>(offset + 2)?);
            if config.inbound_mode != INBOUND_ALL_TCP && port_listed(&config.inbound_ports, port) {
                (DROP, stats::INBOUND_UDP_DROPPED)
            } else {
                (PASS, 0)
            }
        }
        IPPROTO_ICMP | IPPROTO_ICMPV6 => {
            let kind: u8 = ctx.load(offset)?;
            let needed = if protocol == IPPROTO_ICMP {
                // echo reply, destination unreachable (with "fragmentation needed"),
                // time exceeded, parameter problem
                matches!(kind, 0 | 3 | 11 | 12)
            } else {
                // destination unreachable, packet too big, time exceeded, parameter
                // problem, echo reply, neighbour discovery (RS, RA, NS, NA, redirect)
                matches!(kind, 1..=4 | 129 | 133..=137)
            };
            if needed {
                (PASS, 0)
            } else {
                (DROP, stats::INBOUND_ICMP_DROPPED)
            }
        }
        _ => (DROP, stats::INBOUND_OTHER_DROPPED),
    };
    Ok(verdict)
}

/// The packet is for a socket of the workload's proxy (its uid): the sidecar's
/// inbound listener, which takes the mesh's connections from the network.
#[inline(always)]
fn to_proxy(ctx: &SkBuffContext, config: &WorkloadConfig) -> bool {
    config.proxy_uid != NO_UID && ctx.get_socket_uid() == config.proxy_uid
}

/// Where an IPv6 packet's transport header is, past its extension headers.
enum Ipv6Transport {
    /// The protocol (next header) and its offset from the IPv6 header.
    Header(u8, usize),
    /// A fragment header of a real fragment: this one may carry no transport header.
    Fragment,
    /// More than `MAX_IPV6_EXT_HEADERS` extension headers.
    TooLong,
}

/// Walks the IPv6 extension headers (RFC 8200 §4; AH: RFC 4302): hop-by-hop, routing
/// and destination options are `(len + 1) * 8` bytes, fragment 8, AH `(len + 2) * 4`.
/// Any other next header (ESP, no next header, an unknown one) ends the walk: the
/// caller judges it by its protocol number.
#[inline(always)]
fn ipv6_transport(ctx: &SkBuffContext) -> Result<Ipv6Transport, i64> {
    let mut next: u8 = ctx.load(6)?;
    let mut offset: usize = 40;
    let mut walked = 0;
    while walked < MAX_IPV6_EXT_HEADERS {
        match next {
            IPPROTO_HOPOPTS | IPPROTO_ROUTING | IPPROTO_DSTOPTS => {
                let header: [u8; 2] = ctx.load(offset)?;
                next = header[0];
                offset += (usize::from(header[1]) + 1) * 8;
            }
            IPPROTO_FRAGMENT => {
                let header: [u8; 4] = ctx.load(offset)?;
                // The offset (13 bits) and the M flag: only an atomic fragment is a
                // whole packet.
                if u16::from_be_bytes([header[2], header[3]]) & 0xfff9 != 0 {
                    return Ok(Ipv6Transport::Fragment);
                }
                next = header[0];
                offset += 8;
            }
            IPPROTO_AH => {
                let header: [u8; 2] = ctx.load(offset)?;
                next = header[0];
                offset += (usize::from(header[1]) + 2) * 4;
            }
            _ => return Ok(Ipv6Transport::Header(next, offset)),
        }
        walked += 1;
    }
    match next {
        IPPROTO_HOPOPTS | IPPROTO_ROUTING | IPPROTO_DSTOPTS | IPPROTO_FRAGMENT | IPPROTO_AH => {
            Ok(Ipv6Transport::TooLong)
        }
        _ => Ok(Ipv6Transport::Header(next, offset)),
    }
}

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}
