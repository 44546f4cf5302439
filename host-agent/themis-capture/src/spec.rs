//! What a registration asks of capture, checked and turned into the programs' map value.
use std::{
    net::{Ipv4Addr, SocketAddrV4, SocketAddrV6},
    path::PathBuf,
};

use ipnet::IpNet;
use serde::{Deserialize, Serialize};
use themis_ebpf_common::{
    Cidr, WorkloadConfig, AF_INET, AF_INET6, INBOUND_ALL_TCP, INBOUND_LISTED, MAX_CIDRS, MAX_PORTS,
    NO_UID,
};

/// A capture request the agent cannot carry out as asked; the message says why.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct SpecError(pub String);

/// Capture for one workload.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct CaptureSpec {
    /// The workload's cgroup v2 directory; its processes' TCP connects are captured.
    pub cgroup: PathBuf,
    /// The workload's proxy cgroup (e.g. the sidecar container's); never captured.
    #[serde(default)]
    pub proxy_cgroup: Option<PathBuf>,
    /// The proxy's uid, never captured (Istio runs Envoy as 1337).
    #[serde(default)]
    pub proxy_uid: Option<u32>,
    /// The proxy's outbound listener: where captured IPv4 connects go.
    #[serde(default = "default_outbound")]
    pub outbound: SocketAddrV4,
    /// Its IPv6 listener; without it IPv6 connects are left alone.
    #[serde(default)]
    pub outbound6: Option<SocketAddrV6>,
    /// The network namespace the proxy's listeners are in, as a namespace file
    /// (`/proc/<pid>/ns/net`, `/run/netns/<name>`); the agent's own by default. Only
    /// the workload's processes may connect to its outbound listeners there.
    #[serde(default)]
    pub netns: Option<PathBuf>,
    /// The app's ports: they accept TCP and UDP only from loopback, i.e. via the local
    /// proxy; with any, the workload takes no other protocol from the network but ICMP
    /// errors, echo replies and neighbour discovery (docs/CAPTURE.md).
    #[serde(default)]
    pub inbound_ports: Vec<u16>,
    /// Every TCP port protected instead, as Istio captures every inbound port: a
    /// connection from the network may open only at the proxy's sockets (`proxy_uid`)
    /// and at these ports, exempted; to any other port, only from loopback (the
    /// proxy). UDP is then left alone. Not with `inbound_ports`.
    #[serde(default)]
    pub inbound_all_tcp_except: Option<Vec<u16>>,
    /// Destination ports never captured.
    #[serde(default)]
    pub exclude_ports: Vec<u16>,
    /// Destinations never captured; loopback by default, as with Istio.
    #[serde(default = "default_exclusions")]
    pub exclude_cidrs: Vec<IpNet>,
}

pub const DEFAULT_OUTBOUND: SocketAddrV4 = SocketAddrV4::new(Ipv4Addr::LOCALHOST, 15001);

fn default_outbound() -> SocketAddrV4 {
    DEFAULT_OUTBOUND
}

pub fn default_exclusions() -> Vec<IpNet> {
    vec![
        "127.0.0.0/8".parse().expect("valid"),
        "::1/128".parse().expect("valid"),
    ]
}

impl CaptureSpec {
    /// A spec with the defaults for `cgroup`.
    pub fn new(cgroup: impl Into<PathBuf>) -> Self {
        CaptureSpec {
            cgroup: cgroup.into(),
            proxy_cgroup: None,
            proxy_uid: None,
            outbound: DEFAULT_OUTBOUND,
            outbound6: None,
            netns: None,
            inbound_ports: Vec::new(),
            inbound_all_tcp_except: None,
            exclude_ports: Vec::new(),
            exclude_cidrs: default_exclusions(),
        }
    }

    /// The map value the programs read.
    pub fn to_config(&self, proxy_cgroup: u64) -> Result<WorkloadConfig, SpecError> {
        if self.outbound.port() == 0 || self.outbound.ip().is_unspecified() {
            return Err(SpecError(
                "the outbound listener must be an address and a port, not 0.0.0.0 or port 0".into(),
            ));
        }
        let (inbound_mode, inbound_ports) = match &self.inbound_all_tcp_except {
            None => (INBOUND_LISTED, ports("inbound_ports", &self.inbound_ports)?),
            Some(_) if !self.inbound_ports.is_empty() => {
                return Err(SpecError(
                    "inbound_ports and inbound_all_tcp_except: one or the other, not both".into(),
                ))
            }
            Some(_) if self.proxy_uid.is_none() => {
                return Err(SpecError(
                    "inbound_all_tcp_except needs proxy_uid: the proxy's sockets are where the \
                     network may connect"
                        .into(),
                ))
            }
            Some(exempt) => (INBOUND_ALL_TCP, ports("inbound_all_tcp_except", exempt)?),
        };
        let mut config = WorkloadConfig {
            outbound_ip4: u32::from(*self.outbound.ip()).to_be(),
            outbound_port: self.outbound.port(),
            capture_ipv6: 0,
            inbound_mode,
            outbound_ip6: [0; 4],
            proxy_uid: self.proxy_uid.unwrap_or(NO_UID),
            _pad1: 0,
            proxy_cgroup,
            inbound_ports,
            exclude_ports: ports("exclude_ports", &self.exclude_ports)?,
            exclude_cidrs: [Cidr::default(); MAX_CIDRS],
        };
        if let Some(v6) = self.outbound6 {
            if v6.port() == 0 || v6.ip().is_unspecified() {
                return Err(SpecError("outbound6 must be an address and a port".into()));
            }
            if v6.port() != self.outbound.port() {
                return Err(SpecError(
                    "outbound and outbound6 must use the same port".into(),
                ));
            }
            config.capture_ipv6 = 1;
            config.outbound_ip6 = words(v6.ip().octets());
        }
        if self.exclude_cidrs.len() > MAX_CIDRS {
            return Err(SpecError(format!(
                "at most {MAX_CIDRS} exclude_cidrs, got {}",
                self.exclude_cidrs.len()
            )));
        }
        for (slot, net) in config.exclude_cidrs.iter_mut().zip(&self.exclude_cidrs) {
            *slot = match net.trunc() {
                IpNet::V4(n) => Cidr {
                    addr: [u32::from(n.network()).to_be(), 0, 0, 0],
                    mask: [u32::from(n.netmask()).to_be(), 0, 0, 0],
                    family: AF_INET,
                    _pad: [0; 6],
                },
                IpNet::V6(n) => Cidr {
                    addr: words(n.network().octets()),
                    mask: words(n.netmask().octets()),
                    family: AF_INET6,
                    _pad: [0; 6],
                },
            };
        }
        Ok(config)
    }
}

/// Sixteen bytes in network order as the kernel's four `u32` words.
fn words(octets: [u8; 16]) -> [u32; 4] {
    let mut out = [0u32; 4];
    for (word, chunk) in out.iter_mut().zip(octets.chunks_exact(4)) {
        *word = u32::from_ne_bytes(chunk.try_into().expect("4 bytes"));
    }
    out
}

fn ports(field: &str, list: &[u16]) -> Result<[u16; MAX_PORTS], SpecError> {
    if list.len() > MAX_PORTS {
        return Err(SpecError(format!(
            "at most {MAX_PORTS} {field}, got {}",
            list.len()
        )));
    }
    if list.contains(&0) {
        return Err(SpecError(format!("{field}: port 0 is not a port")));
    }
    let mut out = [0u16; MAX_PORTS];
    out[..list.len()].copy_from_slice(list);
    Ok(out)
}

/// The agent's workload-name rule (`themis_contracts::names`); the pin directory is
/// the name's bpffs form (`names::bpffs_name`: bpffs refuses dots).
pub(crate) fn check_name(workload: &str) -> Result<(), SpecError> {
    themis_contracts::WorkloadName::check(workload)
        .map_err(|e| SpecError(format!("not a workload name: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_exclude_loopback_and_point_at_15001() {
        let spec: CaptureSpec = serde_json::from_str(r#"{"cgroup":"/x"}"#).unwrap();
        let c = spec.to_config(7).unwrap();
        assert_eq!(c.outbound_port, 15001);
        assert_eq!(c.outbound_ip4, u32::from(Ipv4Addr::LOCALHOST).to_be());
        assert_eq!(c.proxy_cgroup, 7);
        assert_eq!(c.proxy_uid, NO_UID);
        assert_eq!(c.exclude_cidrs[0].family, AF_INET);
        assert_eq!(c.exclude_cidrs[0].addr[0].to_ne_bytes(), [127, 0, 0, 0]);
        assert_eq!(c.exclude_cidrs[0].mask[0].to_ne_bytes(), [255, 0, 0, 0]);
        assert_eq!(c.exclude_cidrs[1].family, AF_INET6);
        assert_eq!(c.exclude_cidrs[2].family, 0);
    }

    #[test]
    fn bad_specs_say_what_is_wrong() {
        let too_many = CaptureSpec {
            inbound_ports: (1..=9).collect(),
            ..CaptureSpec::new("/x")
        };
        assert!(too_many.to_config(0).unwrap_err().0.contains("at most 8"));
        let zero = CaptureSpec {
            exclude_ports: vec![0],
            ..CaptureSpec::new("/x")
        };
        assert!(zero.to_config(0).unwrap_err().0.contains("port 0"));
        let unknown = serde_json::from_str::<CaptureSpec>(r#"{"cgroup":"/x","port":1}"#);
        assert!(unknown.unwrap_err().to_string().contains("unknown field"));
        assert!(check_name("../etc").is_err());
        assert!(check_name("check-1").is_ok());
    }

    #[test]
    fn all_tcp_ports_protected_lists_the_exempted_ones_and_needs_the_proxy_uid() {
        let all = CaptureSpec {
            proxy_uid: Some(1337),
            inbound_all_tcp_except: Some(vec![9091]),
            ..CaptureSpec::new("/x")
        };
        let c = all.to_config(0).unwrap();
        assert_eq!(c.inbound_mode, INBOUND_ALL_TCP);
        assert_eq!(c.inbound_ports[..2], [9091, 0]);
        let listed = CaptureSpec {
            inbound_ports: vec![8080],
            ..CaptureSpec::new("/x")
        };
        assert_eq!(listed.to_config(0).unwrap().inbound_mode, INBOUND_LISTED);
        let both = CaptureSpec {
            inbound_ports: vec![8080],
            ..all.clone()
        };
        assert!(both.to_config(0).unwrap_err().0.contains("not both"));
        let no_uid = CaptureSpec {
            proxy_uid: None,
            ..all
        };
        assert!(no_uid.to_config(0).unwrap_err().0.contains("proxy_uid"));
    }

    /// Capture takes exactly the workload names the agent registers (dotted ones
    /// too: their pins are under the name's bpffs form).
    #[test]
    fn workload_names_are_the_agents_names() {
        use themis_contracts::names::{bpffs_name, vectors};
        for name in vectors::valid() {
            assert!(check_name(&name).is_ok(), "{name:?}");
            assert!(!bpffs_name(&name).contains('.'), "{name:?}");
        }
        for name in vectors::invalid() {
            let err = check_name(&name).unwrap_err().to_string();
            assert!(err.contains("not a workload name"), "{name:?}: {err}");
        }
    }

    #[test]
    fn cidrs_are_truncated_to_their_network() {
        let spec = CaptureSpec {
            exclude_cidrs: vec!["10.1.2.3/16".parse().unwrap()],
            ..CaptureSpec::new("/x")
        };
        let c = spec.to_config(0).unwrap();
        assert_eq!(c.exclude_cidrs[0].addr[0].to_ne_bytes(), [10, 1, 0, 0]);
    }
}
