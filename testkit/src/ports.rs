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

/// A port on `ip` nothing listens on (bound, then released).
pub fn closed_port(ip: &str) -> SocketAddr {
    std::net::TcpListener::bind((ip, 0))
        .unwrap()
        .local_addr()
        .unwrap()
}
