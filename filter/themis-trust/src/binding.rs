//! Who may serve a service on Kubernetes (docs/PROTOCOL.md §7.1): the mesh root binds
//! a service to a namespace, and optionally to some of its ServiceAccounts. A node's
//! grant says the node may endorse the service; a binding says *which pods* it may
//! endorse as it: those whose namespace and ServiceAccount (as the API server reports
//! them, never as the pod says) the newest binding for that namespace allows.
//!
//! The namespace is the boundary: whoever may create pods in a namespace may run them
//! as any of its ServiceAccounts unless admission pins it, so a ServiceAccount only
//! names a workload inside the namespace's trust.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::{TrustError, MAX_CLOCK_SKEW_MS};

/// The label service bindings are signed under.
pub const BINDING_LABEL: &str = "themis/1 service binding";
/// The record label that names the subject a workload is endorsed as
/// (`spiffe://<mesh>/ns/<namespace>/sa/<service account>`), signed by its node.
pub const SUBJECT_LABEL: &str = "themis.subject";
/// Most ServiceAccounts one binding names.
pub const MAX_BOUND_ACCOUNTS: usize = 16;

/// Root → everyone: pods of `namespace` running as one of `service_accounts` (any of
/// the namespace's when empty) may serve `service`. The newest binding of a
/// (service, namespace) replaces the older ones; one that has expired binds nothing,
/// which is how a binding is withdrawn (`themis service unbind`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Binding {
    /// The mesh.
    pub mesh: String,
    /// The service name.
    pub service: String,
    /// The Kubernetes namespace.
    pub namespace: String,
    /// The ServiceAccounts of that namespace allowed; empty: any.
    pub service_accounts: Vec<String>,
    /// Unix ms.
    pub issued_at: u64,
    /// Unix ms; `None`: until replaced.
    pub not_after: Option<u64>,
}

impl Binding {
    /// Checks the names: a service name, a namespace (a DNS label) and at most
    /// [`MAX_BOUND_ACCOUNTS`] ServiceAccount names (DNS subdomains), none twice.
    pub fn check(&self) -> Result<(), TrustError> {
        let service_ok = !self.service.is_empty() && self.service.len() <= 253;
        let accounts_ok = self.service_accounts.len() <= MAX_BOUND_ACCOUNTS
            && self.service_accounts.iter().all(|sa| is_dns_subdomain(sa))
            && (1..self.service_accounts.len())
                .all(|i| !self.service_accounts[..i].contains(&self.service_accounts[i]));
        match service_ok && is_dns_label(&self.namespace) && accounts_ok {
            true => Ok(()),
            false => Err(TrustError::Malformed),
        }
    }

    /// Whether it lets `subject` serve its service at `now_ms`.
    fn allows(&self, subject: &Subject, now_ms: u64) -> bool {
        let in_force = self.issued_at <= now_ms.saturating_add(MAX_CLOCK_SKEW_MS)
            && self.not_after.is_none_or(|t| t > now_ms);
        let account = self.service_accounts.is_empty()
            || self.service_accounts.contains(&subject.service_account);
        in_force && self.namespace == subject.namespace && account
    }
}

/// What a pod runs as, as the API server says: its namespace and ServiceAccount.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Subject {
    /// `metadata.namespace`.
    pub namespace: String,
    /// `spec.serviceAccountName`.
    pub service_account: String,
}

impl Subject {
    /// A subject, if both names are Kubernetes names (a DNS label, a DNS subdomain).
    pub fn new(namespace: &str, service_account: &str) -> Result<Subject, TrustError> {
        match is_dns_label(namespace) && is_dns_subdomain(service_account) {
            true => Ok(Subject {
                namespace: namespace.to_owned(),
                service_account: service_account.to_owned(),
            }),
            false => Err(TrustError::Malformed),
        }
    }

    /// Its SPIFFE form, the one Istio's principals use:
    /// `spiffe://<trust domain>/ns/<namespace>/sa/<service account>`.
    pub fn uri(&self, trust_domain: &str) -> String {
        format!(
            "spiffe://{trust_domain}/ns/{}/sa/{}",
            self.namespace, self.service_account
        )
    }

    /// Reads [`Subject::uri`]'s form back; anything else, or another trust domain, is
    /// `Malformed`.
    pub fn from_uri(uri: &str, trust_domain: &str) -> Result<Subject, TrustError> {
        let path = uri
            .strip_prefix("spiffe://")
            .and_then(|rest| rest.strip_prefix(trust_domain))
            .and_then(|rest| rest.strip_prefix("/ns/"))
            .ok_or(TrustError::Malformed)?;
        let (namespace, service_account) = path.split_once("/sa/").ok_or(TrustError::Malformed)?;
        Subject::new(namespace, service_account)
    }
}

/// The bindings in force: the newest of each (service, namespace).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Bindings {
    newest: BTreeMap<(String, String), Binding>,
}

impl Bindings {
    /// Takes `binding` if it is newer than the one held for its service and namespace
    /// (of two issued at the same millisecond, the later one added).
    pub fn add(&mut self, binding: Binding) {
        let key = (binding.service.clone(), binding.namespace.clone());
        match self.newest.get(&key) {
            Some(held) if held.issued_at > binding.issued_at => {}
            _ => {
                self.newest.insert(key, binding);
            }
        }
    }

    /// The binding that lets `subject` serve `service` at `now_ms`; `NotBound`
    /// when there is none (none for its namespace, its ServiceAccount not named, or
    /// the namespace's newest binding expired or not yet valid).
    pub fn check(
        &self,
        service: &str,
        subject: &Subject,
        now_ms: u64,
    ) -> Result<&Binding, TrustError> {
        self.newest
            .get(&(service.to_owned(), subject.namespace.clone()))
            .filter(|binding| binding.allows(subject, now_ms))
            .ok_or(TrustError::NotBound)
    }

    /// Who may serve `service` at `now_ms`, for people: `namespace` or
    /// `namespace/{sa,…}`, one per namespace.
    pub fn bound(&self, service: &str, now_ms: u64) -> Vec<String> {
        self.newest
            .values()
            .filter(|b| b.service == service)
            .filter(|b| b.issued_at <= now_ms.saturating_add(MAX_CLOCK_SKEW_MS))
            .filter(|b| b.not_after.is_none_or(|t| t > now_ms))
            .map(|b| match b.service_accounts.as_slice() {
                [] => format!("{} (any ServiceAccount)", b.namespace),
                accounts => format!("{}/{{{}}}", b.namespace, accounts.join(",")),
            })
            .collect()
    }
}

/// RFC 1123 label, as Kubernetes names namespaces: 1–63 of `[a-z0-9-]`, starting and
/// ending alphanumeric.
fn is_dns_label(name: &str) -> bool {
    let bytes = name.as_bytes();
    let alnum = |b: &u8| b.is_ascii_lowercase() || b.is_ascii_digit();
    (1..=63).contains(&bytes.len())
        && bytes.iter().all(|b| alnum(b) || *b == b'-')
        && bytes.first().is_some_and(alnum)
        && bytes.last().is_some_and(alnum)
}

/// RFC 1123 subdomain, as Kubernetes names ServiceAccounts: at most 253 bytes of
/// dot-separated labels.
fn is_dns_subdomain(name: &str) -> bool {
    name.len() <= 253 && name.split('.').all(is_dns_label)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn binding(namespace: &str, accounts: &[&str], issued_at: u64) -> Binding {
        Binding {
            mesh: "m".into(),
            service: "payments".into(),
            namespace: namespace.into(),
            service_accounts: accounts.iter().map(|s| s.to_string()).collect(),
            issued_at,
            not_after: None,
        }
    }

    fn subject(ns: &str, sa: &str) -> Subject {
        Subject::new(ns, sa).unwrap()
    }

    #[test]
    fn a_binding_admits_its_namespace_and_accounts_only() {
        let mut bindings = Bindings::default();
        bindings.add(binding("team-a", &["payments"], 10));
        assert!(bindings
            .check("payments", &subject("team-a", "payments"), 20)
            .is_ok());
        for (ns, sa) in [("team-a", "default"), ("team-b", "payments")] {
            assert_eq!(
                bindings.check("payments", &subject(ns, sa), 20),
                Err(TrustError::NotBound),
                "{ns}/{sa}"
            );
        }
        assert_eq!(
            bindings.check("billing", &subject("team-a", "payments"), 20),
            Err(TrustError::NotBound)
        );
        bindings.add(binding("team-b", &[], 10));
        assert!(bindings
            .check("payments", &subject("team-b", "anyone"), 20)
            .is_ok());
    }

    #[test]
    fn the_newest_binding_of_a_namespace_wins_and_an_expired_one_withdraws() {
        let mut bindings = Bindings::default();
        bindings.add(binding("team-a", &[], 10));
        let mut withdrawn = binding("team-a", &[], 30);
        withdrawn.not_after = Some(30);
        bindings.add(withdrawn);
        // An older binding arriving later changes nothing.
        bindings.add(binding("team-a", &[], 20));
        assert_eq!(
            bindings.check("payments", &subject("team-a", "x"), 40),
            Err(TrustError::NotBound)
        );
        assert!(bindings.bound("payments", 40).is_empty());
        let narrower = binding("team-a", &["one"], 50);
        bindings.add(narrower);
        assert!(bindings
            .check("payments", &subject("team-a", "one"), 60)
            .is_ok());
        assert!(bindings
            .check("payments", &subject("team-a", "two"), 60)
            .is_err());
        assert_eq!(bindings.bound("payments", 60), ["team-a/{one}"]);
    }

    #[test]
    fn a_binding_from_the_future_binds_nothing_yet() {
        let mut bindings = Bindings::default();
        bindings.add(binding("team-a", &[], 10 + MAX_CLOCK_SKEW_MS + 1));
        assert!(bindings
            .check("payments", &subject("team-a", "x"), 10)
            .is_err());
        assert!(bindings
            .check("payments", &subject("team-a", "x"), 11)
            .is_ok());
    }

    #[test]
    fn subjects_print_in_istios_form_and_read_back_only_from_it() {
        let s = subject("team-a", "web.v2");
        let uri = s.uri("k8s");
        assert_eq!(uri, "spiffe://k8s/ns/team-a/sa/web.v2");
        assert_eq!(Subject::from_uri(&uri, "k8s"), Ok(s));
        for bad in [
            "spiffe://other/ns/team-a/sa/web",
            "spiffe://k8s/ns/team-a",
            "spiffe://k8s/ns/Team-A/sa/web",
            "spiffe://k8s/ns/team-a/sa/web/extra",
            "spiffe://k8s/ns//sa/web",
            "spiffe://k8s/ns/team-a/sa/",
            "https://k8s/ns/team-a/sa/web",
            "spiffe://k8s.evil/ns/team-a/sa/web",
        ] {
            assert_eq!(
                Subject::from_uri(bad, "k8s"),
                Err(TrustError::Malformed),
                "{bad}"
            );
        }
    }

    #[test]
    fn names_are_kubernetes_names() {
        assert!(binding("team-a", &["a", "b.c"], 0).check().is_ok());
        for bad in [
            binding("", &[], 0),
            binding("-a", &[], 0),
            binding(&"a".repeat(64), &[], 0),
            binding("a", &["A"], 0),
            binding("a", &["x", "x"], 0),
            binding("a", &["x"; MAX_BOUND_ACCOUNTS + 1], 0),
            Binding {
                service: String::new(),
                ..binding("a", &[], 0)
            },
        ] {
            assert_eq!(bad.check(), Err(TrustError::Malformed), "{bad:?}");
        }
    }
}
