//! eBPF capture of local workloads' traffic, when the agent runs with `--capture`:
//! a registration with a cgroup attaches it, a deregistration detaches it. Without
//! it, asking for capture is an error and detaching is a no-op, so deregistration
//! works the same on every agent.

use std::sync::{Mutex, MutexGuard};

use themis_capture::{Capture, CaptureSpec, Status as CaptureStatus, WorkloadStatus};

use super::RegistryError;
use crate::names::WorkloadName;

/// The eBPF loader, if the agent has one.
#[derive(Default)]
pub(super) struct CaptureSlot(Option<Mutex<Capture>>);

impl CaptureSlot {
    /// With `capture`.
    pub(super) fn with(capture: Capture) -> Self {
        CaptureSlot(Some(Mutex::new(capture)))
    }

    fn loader(&self) -> Result<MutexGuard<'_, Capture>, RegistryError> {
        let capture = self.0.as_ref().ok_or(RegistryError::CaptureDisabled)?;
        // A panic mid-attach leaves pins the kernel still describes: carry on.
        Ok(capture
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner()))
    }

    /// [`RegistryError::CaptureDisabled`] when the agent runs without capture.
    pub(super) fn require(&self) -> Result<(), RegistryError> {
        self.loader().map(drop)
    }

    /// Attaches capture to a workload's cgroup (again, with a new spec, if attached).
    pub(super) fn attach(
        &self,
        workload: &WorkloadName,
        spec: &CaptureSpec,
    ) -> Result<WorkloadStatus, RegistryError> {
        Ok(self.loader()?.attach(workload.as_str(), spec)?)
    }

    /// Detaches a workload's capture; `false` when it had none (or capture is off).
    pub(super) fn detach(&self, workload: &WorkloadName) -> Result<bool, RegistryError> {
        match self.loader() {
            Ok(mut capture) => Ok(capture.detach(workload.as_str())?),
            Err(RegistryError::CaptureDisabled) => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// What is attached, from the pins and the kernel.
    pub(super) fn status(&self) -> Result<CaptureStatus, RegistryError> {
        Ok(self.loader()?.status()?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // With capture on, attaching needs root and a kernel: the `capture` integration
    // test covers it. Here, the agent without it.
    #[test]
    fn without_capture_asking_for_it_is_refused_and_detaching_is_a_no_op() {
        let slot = CaptureSlot::default();
        let workload = WorkloadName::new("web-1").unwrap();
        assert!(matches!(
            slot.require(),
            Err(RegistryError::CaptureDisabled)
        ));
        assert!(matches!(slot.status(), Err(RegistryError::CaptureDisabled)));
        let spec: CaptureSpec =
            serde_json::from_value(serde_json::json!({ "cgroup": "/sys/fs/cgroup/x" })).unwrap();
        let refused = slot.attach(&workload, &spec).unwrap_err();
        assert_eq!(
            refused.to_string(),
            "this agent runs without eBPF capture; start it with --capture"
        );
        assert!(!slot.detach(&workload).unwrap());
    }
}
