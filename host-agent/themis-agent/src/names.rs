//! Names people give: services and local workloads. Both follow the DNS subdomain
//! rules Kubernetes uses for names (`check`, `check.default.svc`), so a mesh name can
//! be taken from a Service or Pod as is, and a workload name is always a safe file
//! name.

use std::fmt;

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
    /// A character outside `a-z 0-9 - .`, or a first or last character that is not a
    /// letter or digit.
    #[error(
        "invalid {kind} name {name:?}: use lower-case letters, digits, '-' and '.', \
         starting and ending with a letter or digit"
    )]
    Characters {
        /// "service" or "workload".
        kind: &'static str,
        /// The name given.
        name: String,
    },
}

fn check(kind: &'static str, name: &str) -> Result<(), NameError> {
    if name.is_empty() || name.len() > MAX_NAME_LEN {
        return Err(NameError::Length { kind });
    }
    let alnum = |c: u8| c.is_ascii_lowercase() || c.is_ascii_digit();
    let bytes = name.as_bytes();
    let ok = bytes.iter().all(|&c| alnum(c) || c == b'-' || c == b'.')
        && alnum(bytes[0])
        && alnum(bytes[bytes.len() - 1]);
    if ok {
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

        impl std::str::FromStr for $name {
            type Err = NameError;
            fn from_str(name: &str) -> Result<Self, NameError> {
                $name::new(name)
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }
    };
}

name_type!(
    /// A service name: what callers resolve (`check`, `check.default.svc`).
    ServiceName,
    "service"
);
name_type!(
    /// A local workload's name: its key file is `workloads/<name>.key`.
    WorkloadName,
    "workload"
);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_follow_dns_rules_and_stay_inside_the_key_directory() {
        for good in ["check", "check.default.svc", "a", "handler-v2", "0"] {
            assert!(ServiceName::new(good).is_ok(), "{good}");
            assert!(WorkloadName::new(good).is_ok(), "{good}");
        }
        for bad in [
            "",
            "../etc/passwd",
            ".hidden",
            "a/b",
            "Check",
            "-x",
            "x-",
            "x.",
            "a b",
            "é",
        ] {
            assert!(WorkloadName::new(bad).is_err(), "{bad:?}");
        }
        assert!(ServiceName::new(&"a".repeat(MAX_NAME_LEN)).is_ok());
        assert_eq!(
            ServiceName::new(&"a".repeat(MAX_NAME_LEN + 1)),
            Err(NameError::Length { kind: "service" })
        );
        let parsed: Result<WorkloadName, _> = serde_json::from_str("\"../x\"");
        assert!(parsed.is_err());
    }
}
