//! Ports chosen by the kernel.

use std::net::SocketAddr;

/// A loopback port free right now.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A loopback address of the tests' own listeners that another process binds later
/// (an agent's metrics or resolve port). Found free on 127.0.0.1, such a port could be
/// taken before the bind as the ephemeral port of an outgoing connection, which the
/// kernel takes on 127.0.0.1 (it was, once: "metrics listener …: Address already in
/// use"); nothing connects from this address.
const OWN_LOOPBACK: std::net::Ipv4Addr = std::net::Ipv4Addr::new(127, 77, 0, 1);

/// An address for a listener another process binds later: a free port on a loopback
/// address no outgoing connection uses.
pub fn listener_addr() -> SocketAddr {
    std::net::TcpListener::bind((OWN_LOOPBACK, 0))
        .unwrap()
        .local_addr()
        .unwrap()
}

/// A port on `ip` nothing listens on (bound, then released).
pub fn closed_port(ip: &str) -> SocketAddr {
    std::net::TcpListener::bind((ip, 0))
        .unwrap()
        .local_addr()
        .unwrap()
}
