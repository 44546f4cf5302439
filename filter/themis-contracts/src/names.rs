//! Names people give: services and local workloads. One rule for both, everywhere: a
//! DNS subdomain as Kubernetes checks it for a Pod name (RFC 1123): 1 to 253
//! characters, dot-separated parts of lower-case letters, digits and `-`, each part
//! starting and ending with a letter or digit (`check`, `check.default.svc`). So a
//! mesh name can be taken from a Kubernetes Service or Pod as is, it is a valid HTTP
//! host (the outbound filter reads the service from `:authority`), and a workload
//! name is always a safe file name: no `/`, never `.` or `..`, no leading dot.
//!
//! The agent, the `themis` tool, the Envoy filter, the component and the eBPF loader
//! all check names with [`is_name`] (or the types built on it); their tests run the
//! shared [`vectors`]. Where a place cannot hold every valid name as is, its form is
//! derived from this rule, not a second rule: [`bpffs_name`] for the eBPF pins (bpffs
//! refuses dots in names).

use alloc::borrow::Cow;
use alloc::borrow::ToOwned;
use alloc::string::String;
use core::fmt;

use serde::{Deserialize, Serialize};

/// Longest name: a DNS subdomain.
pub const MAX_NAME_LEN: usize = 253;

/// Why a name was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NameError {
    /// Empty or longer than [`MAX_NAME_LEN`].
    #[error("a {kind} name must be 1 to {MAX_NAME_LEN} characters long")]
    Length {
        /// "service" or "workload".
        kind: &'static str,
    },
    /// A character outside `a-z 0-9 - .`, or a dot-separated part that is empty or
    /// does not start and end with a letter or digit.
    #[error(
        "invalid {kind} name {name:?}: use lower-case letters, digits, '-' and '.', \
         each dot-separated part starting and ending with a letter or digit"
    )]
    Characters {
        /// "service" or "workload".
        kind: &'static str,
        /// The name given (at most [`MAX_NAME_LEN`] characters of it).
        name: String,
    },
}

/// The rule: whether `name` is a valid service or workload name. Allocation-free, for
/// per-request checks.
pub fn is_name(name: &str) -> bool {
    !name.is_empty() && name.len() <= MAX_NAME_LEN && name.split('.').all(is_label)
}

/// One dot-separated part: letters, digits and `-`, a letter or digit at both ends.
fn is_label(label: &str) -> bool {
    let alnum = |c: u8| c.is_ascii_lowercase() || c.is_ascii_digit();
    let bytes = label.as_bytes();
    match (bytes.first(), bytes.last()) {
        (Some(&first), Some(&last)) => {
            alnum(first) && alnum(last) && bytes.iter().all(|&c| alnum(c) || c == b'-')
        }
        _ => false,
    }
}

fn check(kind: &'static str, name: &str) -> Result<(), NameError> {
    if name.is_empty() || name.len() > MAX_NAME_LEN {
        Err(NameError::Length { kind })
    } else if is_name(name) {
        Ok(())
    } else {
        Err(NameError::Characters {
            kind,
            name: name.chars().take(MAX_NAME_LEN).collect(),
        })
    }
}

macro_rules! name_type {
    ($(#[$doc:meta])* $name:ident, $kind:literal) => {
        $(#[$doc])*
        #[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
        #[serde(try_from = "String", into = "String")]
        pub struct $name(String);

        impl $name {
            /// Checks `name` and wraps it.
            pub fn new(name: &str) -> Result<Self, NameError> {
                check($kind, name).map(|()| $name(name.to_owned()))
            }

            /// Checks `name` without keeping it (no allocation unless refused).
            pub fn check(name: &str) -> Result<(), NameError> {
                check($kind, name)
            }

            /// The name.
            pub fn as_str(&self) -> &str {
                &self.0
            }
        }

        impl TryFrom<String> for $name {
            type Error = NameError;
            fn try_from(name: String) -> Result<Self, NameError> {
                check($kind, &name).map(|()| $name(name))
            }
        }

        impl From<$name> for String {
            fn from(name: $name) -> String {
                name.0
            }
        }

        impl core::str::FromStr for $name {
            type Err = NameError;
            fn from_str(name: &str) -> Result<Self, NameError> {
                $name::new(name)
            }
        }

        impl AsRef<str> for $name {
            fn as_ref(&self) -> &str {
                &self.0
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                // `pad`: widths and alignment apply, as for `str` (tables in the CLI).
                f.pad(&self.0)
            }
        }
    };
}

name_type!(
    /// A service name: what callers resolve (`check`, `check.default.svc`), and the
    /// host of the URL an app calls through its sidecar (`http://check.default.svc/`).
    ServiceName,
    "service"
);
name_type!(
    /// A local workload's name: its key file is `workloads/<name>.key`, its eBPF pins
    /// are under `workloads/<`[`bpffs_name`]`>/`.
    WorkloadName,
    "workload"
);

/// The form of a valid workload name used as a bpffs path component: bpffs refuses
/// names with a dot (reserved by the kernel), so each `.` becomes `_`. One-to-one on
/// valid names (they never contain `_`); [`from_bpffs_name`] reverses it.
pub fn bpffs_name(workload: &str) -> Cow<'_, str> {
    if workload.contains('.') {
        Cow::Owned(workload.replace('.', "_"))
    } else {
        Cow::Borrowed(workload)
    }
}

/// The workload name a [`bpffs_name`] stands for.
pub fn from_bpffs_name(pin: &str) -> String {
    pin.replace('_', ".")
}

/// Shared test vectors for the name rule: every component that checks names runs
/// them, so a name one part accepts is accepted by all (and the same for refusals).
pub mod vectors {
    use alloc::format;
    use alloc::string::String;
    use alloc::vec::Vec;

    /// Names every part must accept.
    pub fn valid() -> Vec<String> {
        let label63 = "a".repeat(63);
        let mut names: Vec<String> = [
            "check",
            "check.default.svc",
            "a",
            "0",
            "handler-v2",
            "check-1",
            "a.b",
            "1-2.3-4",
            "x--y",
            "9lives",
        ]
        .iter()
        .map(|s| String::from(*s))
        .collect();
        // The longest: 253 characters, as one part and as DNS-sized parts.
        names.push("a".repeat(super::MAX_NAME_LEN));
        names.push(format!("{label63}.{label63}.{label63}.{}", "b".repeat(61)));
        names
    }

    /// Names every part must refuse.
    pub fn invalid() -> Vec<String> {
        let mut names: Vec<String> = [
            "",
            ".",
            "..",
            "../etc/passwd",
            ".hidden",
            "a/b",
            "Check",
            "check.Default",
            "-x",
            "x-",
            "x.",
            ".x",
            "a..b",
            "a.-b",
            "a-.b",
            "a_b",
            "a b",
            "a:80",
            "é",
            "a\0",
        ]
        .iter()
        .map(|s| String::from(*s))
        .collect();
        names.push("a".repeat(super::MAX_NAME_LEN + 1));
        names.push(format!("{}.", "a".repeat(252)));
        names
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use alloc::string::ToString;

    #[test]
    fn names_follow_dns_rules_and_stay_inside_the_key_directory() {
        for good in vectors::valid() {
            assert!(is_name(&good), "{good}");
            assert!(ServiceName::new(&good).is_ok(), "{good}");
            assert!(WorkloadName::new(&good).is_ok(), "{good}");
        }
        for bad in vectors::invalid() {
            assert!(!is_name(&bad), "{bad:?}");
            assert!(ServiceName::new(&bad).is_err(), "{bad:?}");
            assert!(WorkloadName::new(&bad).is_err(), "{bad:?}");
        }
        assert!(ServiceName::new(&"a".repeat(MAX_NAME_LEN)).is_ok());
        assert_eq!(
            ServiceName::new(&"a".repeat(MAX_NAME_LEN + 1)),
            Err(NameError::Length { kind: "service" })
        );
        let parsed: Result<WorkloadName, _> = serde_json::from_str("\"../x\"");
        assert!(parsed.is_err());
        let parsed: ServiceName = serde_json::from_str("\"check.default.svc\"").unwrap();
        assert_eq!(
            serde_json::to_string(&parsed).unwrap(),
            "\"check.default.svc\""
        );
        let message = WorkloadName::new("a..b").unwrap_err().to_string();
        assert!(
            message.contains("invalid workload name \"a..b\""),
            "{message}"
        );
    }

    #[test]
    fn bpffs_names_have_no_dots_and_map_back() {
        for good in vectors::valid() {
            let pin = bpffs_name(&good);
            assert!(!pin.contains('.'), "{pin}");
            assert_eq!(from_bpffs_name(&pin), good);
        }
        assert!(matches!(bpffs_name("check"), Cow::Borrowed("check")));
        assert_eq!(bpffs_name("web.prod"), "web_prod");
    }
}
