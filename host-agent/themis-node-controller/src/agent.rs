//! What the controller asks of the local agent: bind a pod's workload, capture and
//! register it; list and withdraw what it registered.

use std::path::{Path, PathBuf};

use serde_json::Value;
use themis_agent_client::{ApiClient, ClientError, Method, StatusCode};
use themis_capture::CaptureSpec;
use themis_contracts::api::{CreateWorkload, Owner, Registration, Status, Workloads};
use themis_contracts::paths;

use crate::plan::{PodPlan, POD_UID_LABEL};

/// Why the agent did not do what was asked.
#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    /// No answer (the agent is restarting): nothing changed, try again.
    #[error("{0}")]
    Unreachable(#[from] ClientError),
    /// The agent refused: its status and reason (`not_granted`, `capture_failed`, …) and words.
    #[error("the agent refused ({status}, {reason}): {message}")]
    Refused {
        /// The HTTP status.
        status: StatusCode,
        /// The agent's machine-readable reason, if it gave one.
        reason: String,
        /// The agent's words.
        message: String,
    },
    /// The agent's answer is not what its API promises.
    #[error("the agent's answer is unreadable: {0}")]
    Unreadable(#[from] serde_json::Error),
}

/// The local agent, as the node's operator sees it.
pub struct Agent {
    api: ApiClient,
}

impl Agent {
    /// The agent serving `socket`.
    pub fn new(socket: &Path) -> Self {
        Agent {
            api: ApiClient::new(socket),
        }
    }

    async fn call(
        &self,
        method: Method,
        path: &str,
        body: Option<Value>,
    ) -> Result<Value, AgentError> {
        let (status, answer) = self.api.call(method, path, body.as_ref()).await?;
        if status.is_success() {
            return Ok(answer);
        }
        let text = |k: &str| {
            answer
                .get(k)
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_owned()
        };
        Err(AgentError::Refused {
            status,
            reason: text("reason"),
            message: text("error"),
        })
    }

    /// The node's mesh: the trust domain of its pods' subjects.
    pub async fn mesh(&self) -> Result<String, AgentError> {
        let answer = self.call(Method::GET, paths::STATUS, None).await?;
        let status: Status = serde_json::from_value(answer)?;
        Ok(status.mesh)
    }

    /// This node's registrations that belong to pods (those labelled with a pod uid),
    /// and every bound workload with its owner cgroup.
    pub async fn pod_state(
        &self,
    ) -> Result<(Vec<Registration>, Vec<(String, PathBuf)>), AgentError> {
        let answer = self.call(Method::GET, paths::WORKLOADS, None).await?;
        let workloads: Workloads = serde_json::from_value(answer)?;
        let registrations = workloads
            .registrations
            .into_iter()
            .filter(|r| r.metadata.contains_key(POD_UID_LABEL))
            .collect();
        let bound = workloads
            .owners
            .into_iter()
            .map(|(workload, owner)| (workload.to_string(), PathBuf::from(owner.cgroup)))
            .collect();
        Ok((registrations, bound))
    }

    /// Binds the pod's workload to its cgroup and the proxy's uid (creating its
    /// identity): from then on only the pod's sidecar may use it. Idempotent.
    pub async fn bind(
        &self,
        plan: &PodPlan,
        pod_cgroup: &Path,
        proxy_uid: u32,
    ) -> Result<(), AgentError> {
        let owner = CreateWorkload {
            owner: Some(Owner {
                cgroup: pod_cgroup.display().to_string(),
                uid: Some(proxy_uid),
                any_uid: false,
            }),
        };
        let owner = serde_json::to_value(owner).expect("serialises");
        self.call(Method::PUT, &paths::workload(&plan.workload), Some(owner))
            .await
            .map(drop)
    }

    /// Attaches the capture (in the pod's network namespace) and registers the pod's
    /// workload as an instance of its service, with its subject in `mesh`. Idempotent:
    /// a second call re-signs the same record.
    pub async fn register(
        &self,
        plan: &PodPlan,
        mesh: &str,
        pod_cgroup: &Path,
        netns: PathBuf,
        proxy_uid: u32,
    ) -> Result<Value, AgentError> {
        let mut capture = CaptureSpec::new(pod_cgroup.to_owned());
        capture.proxy_uid = Some(proxy_uid);
        capture.netns = Some(netns);
        // Every TCP port, declared or not (a metrics or debug port too), as Istio.
        capture.inbound_all_tcp_except = Some(plan.exempt_ports.clone());
        let register = serde_json::json!({
            "endpoint": plan.endpoint,
            "metadata": plan.metadata(mesh),
            "capture": capture,
        });
        self.call(
            Method::PUT,
            &paths::instance(&plan.service, &plan.workload),
            Some(register),
        )
        .await
    }

    /// Deletes a workload registered nowhere (its key and pod binding): a later pod of
    /// the same name gets a new identity. One already gone is no error.
    pub async fn forget(&self, workload: &str) -> Result<(), AgentError> {
        match self
            .call(Method::DELETE, &paths::workload(workload), None)
            .await
        {
            Err(AgentError::Refused {
                status: StatusCode::NOT_FOUND,
                ..
            })
            | Ok(_) => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// Withdraws a registration and detaches its capture.
    pub async fn withdraw(&self, registration: &Registration) -> Result<(), AgentError> {
        let path = paths::instance(
            registration.service.as_str(),
            registration.workload.as_str(),
        );
        match self.call(Method::DELETE, &path, None).await {
            Err(AgentError::Refused {
                status: StatusCode::NOT_FOUND,
                ..
            })
            | Ok(_) => Ok(()),
            Err(e) => Err(e),
        }
    }
}
