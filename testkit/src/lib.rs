//! Test helpers for tests that need a real Kubernetes API server.
//!
//! Tandem's cluster tests run against a real kube-apiserver, etcd and kube-controller-manager (plus kwok
//! for fake nodes) on loopback, built from the Go module proxy and started by `make cluster-up`
//! (`scripts/controlplane/`). This crate connects to that control plane and gives each test what it needs:
//!
//! - [`TestCluster::connect`] reads `KUBECONFIG` (a clear error when unset) and checks the server answers.
//! - [`TestCluster::namespace`] makes a fresh namespace `<prefix>-<random>` labelled
//!   `tandem.dev/testkit=true`; [`TestNamespace::cleanup`] deletes it and waits until it is gone, and
//!   dropping a [`TestNamespace`] deletes it without waiting (also when the test panics).
//! - [`TestCluster::impersonate`] returns a client acting as a ServiceAccount
//!   (`system:serviceaccount:<ns>:<name>`, with the groups the API server adds for it), so a test can prove
//!   a chart's RBAC rules are enough — anything they do not allow is refused with `403 Forbidden`.
//! - [`TestCluster::install_crds`] server-side applies every CRD in a folder (e.g. `crds/`) and waits until
//!   each is Established and served.
//! - [`TestCluster::create`] / [`TestCluster::apply`] send any manifest (parsed with [`parse_manifests`])
//!   as it is, so the API server's own validation (schema, CEL, admission) decides.
//!
//! ```no_run
//! # async fn demo() -> Result<(), tandem_testkit::Error> {
//! use tandem_testkit::TestCluster;
//! let cluster = TestCluster::connect().await?;
//! cluster.install_crds(concat!(env!("CARGO_MANIFEST_DIR"), "/../crds")).await?;
//! let ns = cluster.namespace("my-test").await?;
//! let operator = cluster.impersonate("tandem-system", "tandem-operator")?;
//! // ... drive the test in ns.name() with cluster.client() or operator ...
//! # let _ = operator;
//! ns.cleanup().await?;
//! # Ok(()) }
//! ```
//!
//! Tests that use this crate need the control plane, so by project convention they are compiled only
//! with the crate's `cluster-tests` feature (`required-features = ["cluster-tests"]` on the `[[test]]`
//! target) and run by `make test-cluster`, which starts and stops the control plane around them.

mod cluster;
mod error;
mod manifest;
mod namespace;

pub use cluster::TestCluster;
pub use error::Error;
pub use manifest::parse_manifests;
pub use namespace::TestNamespace;

/// Label put on every namespace this crate creates, so leaked ones can be found and removed.
pub const TESTKIT_LABEL: &str = "tandem.dev/testkit";

/// Field manager for server-side apply by this crate.
pub const FIELD_MANAGER: &str = "tandem-testkit";

/// How long waits (namespace deletion, CRD establishment) last before failing. Generous: the test
/// machine is small and busy, and a slow control plane must not make tests flaky.
pub const WAIT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(90);
