//! Tandem's end-to-end harness.
//!
//! There is no kubelet in the test control plane, so [`agent`] is one: `tandem-node` registers a
//! Node, binds pending pods to it and runs each pod's command as a local process with the pod's
//! environment, volumes and names ([`launch`], [`hosts`]), reporting phase, pod IP and exit code.
//! The e2e tests (`tests/e2e.rs`, feature `e2e`, run by `make e2e`) drive TrainingJobs through the
//! operator onto it.

pub mod agent;
pub mod hosts;
pub mod launch;

pub use agent::{AgentConfig, container_log, pid_file, pod_dir};
