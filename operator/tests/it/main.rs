//! The operator's integration tests: one binary (one link), a module per concern — what the
//! builders make from YAML fixtures (`builders`) and what is read from and written to Kueue's
//! Workloads (`kueue`), the pure reconcile plan (`plan`), the HTTP endpoint against slow peers (`server`) and the process's shutdown (`shutdown`), and, with the
//! `cluster-tests` feature (`make test-cluster` starts the control plane), the operator against a
//! real kube-apiserver (`cluster`) and the Helm chart's install and RBAC (`chart`).
#![allow(clippy::expect_used, clippy::unwrap_used)] // tests fail loudly by design

mod builders;
#[cfg(feature = "cluster-tests")]
mod chart;
#[cfg(feature = "cluster-tests")]
mod cluster;
mod kueue;
mod plan;
mod server;
mod shutdown;
#[cfg(feature = "cluster-tests")]
mod support;
