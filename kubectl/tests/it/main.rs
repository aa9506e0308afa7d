//! `kubectl tandem` against a real kube-apiserver (`make cluster-up`): the built binary is run as a
//! user runs it (KUBECONFIG from the environment, `-n`), on jobs created from the README's
//! examples, with pods and statuses set through the API as the operator and a kubelet would.
//!
//! The test control plane has no kubelet, so no log is ever served here: `logs` is tested for which
//! pods it picks (the operator's labels), its notes and its errors, up to the request for a started
//! pod's log, which the API server refuses because the pod has no node.
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

mod cluster;
