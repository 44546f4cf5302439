//! What the controller wants for one pod, decided from the pod and its namespace alone
//! (no I/O): leave it, wait for it, refuse it with a reason, or mesh it as this plan.

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};

use k8s_openapi::api::core::v1::Pod;
use themis_contracts::api::{transports, TRANSPORT_LABEL};
use themis_trust::{Subject, SUBJECT_LABEL};

/// The namespace label that opts a namespace's pods into the mesh (`enabled`), like
/// Istio's `istio-injection=enabled`.
pub const MESH_LABEL: &str = "themis.io/mesh";
/// The pod annotation naming its Themis service; without it, the pod's `app` label.
pub const SERVICE_ANNOTATION: &str = "themis.io/service";
/// The pod annotation naming the transports its sidecar takes (`tls`, `themis` or
/// `tls,themis`, as `themis sidecar render --transport`); signed into its record, so
/// callers pick by it. Without it, the channel alone (a record without the label).
pub const TRANSPORT_ANNOTATION: &str = "themis.io/transport";
/// The pod annotation naming the app ports (comma-separated) that take connections from
/// the network directly, unsealed, as Istio's `excludeInboundPorts`: every other port
/// takes them only through the sidecar.
pub const EXCLUDE_INBOUND_ANNOTATION: &str = "themis.io/exclude-inbound-ports";
/// The sidecar container's name, as an injector writes it (Istio's `istio-proxy`).
pub const PROXY_CONTAINER: &str = "themis-proxy";
/// The registration label that ties a registration to its pod (and lets a restarted
/// controller find what it made).
pub const POD_UID_LABEL: &str = "k8s-pod-uid";

/// The node's conventions for meshed pods.
#[derive(Debug, Clone)]
pub struct Conventions {
    /// The sidecar's uid (Istio's 1337): never captured, the only uid that may use the
    /// workload's identity.
    pub proxy_uid: u32,
    /// The sidecar's inbound listener port on the pod's IP: the registered endpoint.
    pub inbound_port: u16,
}

impl Default for Conventions {
    fn default() -> Self {
        Conventions {
            proxy_uid: 1337,
            inbound_port: 15006,
        }
    }
}

/// What to do with a pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// Not the mesh's: an unlabelled namespace, a host-network pod's, … Nothing to do.
    Leave,
    /// Meshed, but not ready to bind yet (no IP, not running): look again later.
    Wait(&'static str),
    /// Meshed, and it cannot be: the Event's reason and message.
    Refuse(&'static str, String),
    /// Bind, capture and register it.
    Mesh(PodPlan),
}

/// A meshed pod's workload and registration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodPlan {
    /// `<pod>.<namespace>`: the workload whose key the agent holds for this pod.
    pub workload: String,
    /// The Themis service it is registered as.
    pub service: String,
    /// The pod's uid: how its cgroup is found, and the registration's label.
    pub uid: String,
    /// Where its sidecar takes mesh traffic.
    pub endpoint: SocketAddr,
    /// The ports exempted from capture ([`EXCLUDE_INBOUND_ANNOTATION`]): every other
    /// TCP port of the pod, declared or not, takes connections only through the sidecar.
    pub exempt_ports: Vec<u16>,
    /// Whether the sidecar has started (its startup probe passed): only then is the pod
    /// registered, so that no caller resolves it before its inbound listener exists.
    /// Its workload is bound before, so the sidecar gets its identity as it starts.
    pub proxy_started: bool,
    /// The transports its sidecar takes ([`TRANSPORT_ANNOTATION`]), checked; `None`
    /// for the channel alone.
    pub transport: Option<String>,
    /// What it runs as, from the API server's pod object (its namespace and
    /// `spec.serviceAccountName`, which admission sets): the agent endorses it as
    /// `service` only if a root-signed binding allows this subject. Never from its
    /// annotations.
    pub subject: Subject,
}

impl PodPlan {
    /// The registration's labels, its subject in `trust_domain`'s (the mesh's) form.
    pub fn metadata(&self, trust_domain: &str) -> BTreeMap<String, String> {
        let mut labels = BTreeMap::from([
            (POD_UID_LABEL.to_owned(), self.uid.clone()),
            (SUBJECT_LABEL.to_owned(), self.subject.uri(trust_domain)),
        ]);
        if let Some(transport) = &self.transport {
            labels.insert(TRANSPORT_LABEL.to_owned(), transport.clone());
        }
        labels
    }
}

/// `"8081, 9090"` as sorted ports without repeats; `None` if any is not a port.
fn ports(list: &str) -> Option<Vec<u16>> {
    let mut ports = list
        .split(',')
        .map(|p| p.trim().parse::<u16>().ok().filter(|&p| p != 0))
        .collect::<Option<Vec<u16>>>()?;
    ports.sort_unstable();
    ports.dedup();
    Some(ports)
}

/// Decides for `pod`, in a namespace labelled `namespace_labels`.
pub fn decide(
    pod: &Pod,
    namespace_labels: Option<&BTreeMap<String, String>>,
    conventions: &Conventions,
) -> Decision {
    let meshed = namespace_labels
        .and_then(|labels| labels.get(MESH_LABEL))
        .is_some_and(|v| v == "enabled");
    let meta = &pod.metadata;
    let annotations = meta.annotations.as_ref();
    let opted_out = annotations
        .and_then(|a| a.get(MESH_LABEL))
        .is_some_and(|v| v == "disabled");
    if !meshed || opted_out {
        return Decision::Leave;
    }
    let (Some(name), Some(namespace), Some(uid)) = (&meta.name, &meta.namespace, &meta.uid) else {
        return Decision::Leave;
    };
    let Some(spec) = &pod.spec else {
        return Decision::Leave;
    };
    if spec.host_network == Some(true) {
        // Its connections cannot be told from the node's: no capture, no identity.
        return Decision::Refuse(
            "HostNetwork",
            "a host-network pod shares the node's network: it is not meshed".into(),
        );
    }
    if meta.deletion_timestamp.is_some() {
        return Decision::Wait("terminating");
    }
    let service = annotations
        .and_then(|a| a.get(SERVICE_ANNOTATION))
        .or_else(|| meta.labels.as_ref().and_then(|l| l.get("app")));
    let Some(service) = service else {
        return Decision::Refuse(
            "NoService",
            format!("no {SERVICE_ANNOTATION} annotation and no app label: which service is it?"),
        );
    };
    let transport = match annotations.and_then(|a| a.get(TRANSPORT_ANNOTATION)) {
        None => None,
        Some(list) => match transports(list) {
            Ok(names) => Some(names.join(",")),
            Err(e) => {
                return Decision::Refuse("BadTransport", format!("{TRANSPORT_ANNOTATION}: {e}"))
            }
        },
    };
    let has_proxy = spec
        .init_containers
        .iter()
        .flatten()
        .chain(&spec.containers)
        .any(|c| c.name == PROXY_CONTAINER);
    if !has_proxy {
        return Decision::Refuse(
            "NoSidecar",
            format!("no {PROXY_CONTAINER} container: nothing would seal its traffic"),
        );
    }
    // The API server's defaulting sets `serviceAccountName` on every pod; "default" is
    // what it would set.
    let account = spec.service_account_name.as_deref().unwrap_or("default");
    let Ok(subject) = Subject::new(namespace, account) else {
        return Decision::Refuse(
            "BadSubject",
            format!(
                "namespace {namespace:?} and ServiceAccount {account:?} are not Kubernetes names"
            ),
        );
    };
    let status = pod.status.as_ref();
    let ip = status
        .and_then(|s| s.pod_ip.as_deref())
        .and_then(|ip| ip.parse::<IpAddr>().ok());
    let Some(ip) = ip else {
        return Decision::Wait("no pod IP yet");
    };
    if status.and_then(|s| s.phase.as_deref()) != Some("Pending")
        && status.and_then(|s| s.phase.as_deref()) != Some("Running")
    {
        return Decision::Wait("not pending or running");
    }
    let exempt_ports = match annotations.and_then(|a| a.get(EXCLUDE_INBOUND_ANNOTATION)) {
        None => Vec::new(),
        Some(list) => match ports(list) {
            Some(ports) => ports,
            None => {
                return Decision::Refuse(
                    "BadExemptPorts",
                    format!(
                        "{EXCLUDE_INBOUND_ANNOTATION}: {list:?} is not a list of ports 1-65535"
                    ),
                )
            }
        },
    };
    let proxy_started = status
        .into_iter()
        .flat_map(|s| {
            s.init_container_statuses
                .iter()
                .flatten()
                .chain(s.container_statuses.iter().flatten())
        })
        .any(|c| c.name == PROXY_CONTAINER && c.started == Some(true));
    Decision::Mesh(PodPlan {
        workload: format!("{name}.{namespace}"),
        service: service.clone(),
        uid: uid.clone(),
        endpoint: SocketAddr::new(ip, conventions.inbound_port),
        exempt_ports,
        proxy_started,
        transport,
        subject,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(extra: serde_json::Value) -> Pod {
        let mut base = json!({
            "metadata": {"name": "check-7d9f", "namespace": "shop", "uid": "u-1",
                         "labels": {"app": "check"}},
            "spec": {"containers": [
                {"name": "app", "image": "x", "ports": [{"containerPort": 8080}, {"containerPort": 53, "protocol": "UDP"}]},
                {"name": "themis-proxy", "image": "y", "ports": [{"containerPort": 15006}]}]},
            "status": {"phase": "Running", "podIP": "10.244.0.7",
                       "containerStatuses": [{"name": "themis-proxy", "started": true, "ready": true,
                           "restartCount": 0, "image": "y", "imageID": ""}]}
        });
        merge(&mut base, extra);
        serde_json::from_value(base).unwrap()
    }

    fn merge(into: &mut serde_json::Value, from: serde_json::Value) {
        match (into, from) {
            (serde_json::Value::Object(a), serde_json::Value::Object(b)) => {
                for (k, v) in b {
                    merge(a.entry(k).or_insert(serde_json::Value::Null), v);
                }
            }
            (slot, v) => *slot = v,
        }
    }

    fn meshed() -> BTreeMap<String, String> {
        BTreeMap::from([(MESH_LABEL.to_owned(), "enabled".to_owned())])
    }

    fn decide_for(p: &Pod) -> Decision {
        decide(p, Some(&meshed()), &Conventions::default())
    }

    #[test]
    fn a_meshed_pod_gets_its_workload_endpoint_and_subject() {
        let Decision::Mesh(plan) = decide_for(&pod(json!({}))) else {
            panic!()
        };
        assert_eq!(plan.workload, "check-7d9f.shop");
        assert_eq!(plan.service, "check");
        assert_eq!(plan.endpoint, "10.244.0.7:15006".parse().unwrap());
        assert!(
            plan.exempt_ports.is_empty(),
            "no annotation: every port through the sidecar"
        );
        assert_eq!(plan.metadata("k8s")[POD_UID_LABEL], "u-1");
        assert!(
            !plan.metadata("k8s").contains_key(TRANSPORT_LABEL),
            "no annotation: the channel alone, no label"
        );
        assert!(plan.proxy_started);
        // Its subject is its namespace and ServiceAccount, in the mesh's trust domain;
        // no ServiceAccount named is the namespace's `default`.
        assert_eq!(
            plan.metadata("k8s")[SUBJECT_LABEL],
            "spiffe://k8s/ns/shop/sa/default"
        );
        // A sidecar still starting: bound now, registered once it has started.
        let starting = pod(
            json!({"status": {"containerStatuses": [{"name": "themis-proxy", "started": false,
            "ready": false, "restartCount": 0, "image": "y", "imageID": ""}]}}),
        );
        let Decision::Mesh(plan) = decide_for(&starting) else {
            panic!()
        };
        assert!(!plan.proxy_started);
        // The annotation names the service over the app label.
        let annotated = pod(json!({"metadata": {"annotations": {SERVICE_ANNOTATION: "check.v2"}}}));
        let Decision::Mesh(plan) = decide_for(&annotated) else {
            panic!()
        };
        assert_eq!(plan.service, "check.v2");
        // The transport annotation becomes the record's label, as the render reads it.
        let tls = pod(json!({"metadata": {"annotations": {TRANSPORT_ANNOTATION: "tls, themis"}}}));
        let Decision::Mesh(plan) = decide_for(&tls) else {
            panic!()
        };
        assert_eq!(plan.metadata("k8s")[TRANSPORT_LABEL], "tls,themis");
        // Ports exempted from capture only by the annotation.
        let exempt = pod(
            json!({"metadata": {"annotations": {EXCLUDE_INBOUND_ANNOTATION: "9090, 8081,9090"}}}),
        );
        let Decision::Mesh(plan) = decide_for(&exempt) else {
            panic!()
        };
        assert_eq!(plan.exempt_ports, [8081, 9090]);
        // A native sidecar (an init container that keeps running) is a sidecar too.
        let native = pod(json!({"spec": {
            "containers": [{"name": "app", "image": "x"}],
            "initContainers": [{"name": "themis-proxy", "image": "y", "restartPolicy": "Always"}]}}));
        assert!(matches!(decide_for(&native), Decision::Mesh(_)));
    }

    #[test]
    fn the_subject_comes_from_the_pod_spec_never_from_its_annotations() {
        let p = pod(json!({
            "metadata": {"annotations": {SUBJECT_LABEL: "spiffe://k8s/ns/kube-system/sa/admin",
                "themis.io/namespace": "kube-system"}},
            "spec": {"serviceAccountName": "checker"}}));
        let Decision::Mesh(plan) = decide_for(&p) else {
            panic!()
        };
        assert_eq!(plan.subject, Subject::new("shop", "checker").unwrap());
        assert_eq!(
            plan.metadata("k8s")[SUBJECT_LABEL],
            "spiffe://k8s/ns/shop/sa/checker"
        );
    }

    #[test]
    fn unlabelled_namespaces_and_opted_out_pods_are_left_alone() {
        let p = pod(json!({}));
        assert_eq!(decide(&p, None, &Conventions::default()), Decision::Leave);
        let other = BTreeMap::from([(MESH_LABEL.to_owned(), "disabled".to_owned())]);
        assert_eq!(
            decide(&p, Some(&other), &Conventions::default()),
            Decision::Leave
        );
        let out = pod(json!({"metadata": {"annotations": {MESH_LABEL: "disabled"}}}));
        assert_eq!(decide_for(&out), Decision::Leave);
    }

    #[test]
    fn pods_that_cannot_be_meshed_say_why() {
        let reason = |p: Pod| match decide_for(&p) {
            Decision::Refuse(reason, _) => reason,
            other => panic!("{other:?}"),
        };
        assert_eq!(
            reason(pod(json!({"spec": {"hostNetwork": true}}))),
            "HostNetwork"
        );
        assert_eq!(
            reason(pod(json!({"metadata": {"labels": null}}))),
            "NoService"
        );
        let bare = pod(json!({"spec": {"containers": [{"name": "app", "image": "x"}]}}));
        assert_eq!(reason(bare), "NoSidecar");
        // A transport this build does not know: refused, not registered as the channel
        // (callers would then call a sidecar that does not take it).
        for bad in ["quic", "", "tls,,themis", "TLS"] {
            let odd = pod(json!({"metadata": {"annotations": {TRANSPORT_ANNOTATION: bad}}}));
            assert_eq!(reason(odd), "BadTransport", "{bad:?}");
        }
        for bad in ["", "0", "8080,", "http", "65536", "80 443"] {
            let odd = pod(json!({"metadata": {"annotations": {EXCLUDE_INBOUND_ANNOTATION: bad}}}));
            assert_eq!(reason(odd), "BadExemptPorts", "{bad:?}");
        }
    }

    #[test]
    fn pods_without_an_ip_or_terminating_wait() {
        let no_ip = pod(json!({"status": {"podIP": null}}));
        assert_eq!(decide_for(&no_ip), Decision::Wait("no pod IP yet"));
        let done = pod(json!({"status": {"phase": "Succeeded"}}));
        assert!(matches!(decide_for(&done), Decision::Wait(_)));
        let going = pod(json!({"metadata": {"deletionTimestamp": "2026-01-01T00:00:00Z"}}));
        assert_eq!(decide_for(&going), Decision::Wait("terminating"));
    }
}
