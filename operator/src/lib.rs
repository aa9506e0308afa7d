//! `tandem-operator`: reconciles TrainingJobs (`tandem.dev/v1alpha1`) into parameter-server pods
//! and MPI worker groups, restarts failed groups alone, scales groups, and reports status.
//!
//! The pipeline of one reconcile (see [`controller`]): [`validate`] → [`builder`] (pure objects
//! from the spec) and [`plan`] (pure decisions from the spec and the pods that exist) → apply
//! (server-side apply, field manager `tandem-operator`) → status. [`leader`] elects one active
//! replica through a Lease; [`server`] serves `/metrics`, `/healthz` and `/readyz`.
//!
//! # Objects per job
//!
//! | object | name | when |
//! |---|---|---|
//! | headless Service | `<job>` | always; pods resolve as `<pod>.<job>.<ns>.svc` |
//! | ConfigMap | `<job>-config` | always; `job.json` is the launch contract's [`tandem_api::JobConfig`] |
//! | Secret | `<job>-token` | always; key `token`, created once |
//! | PS pods | `<job>-ps-<i>` | `parameterServers.replicas` |
//! | worker pods | `<job>-g<g>-<r>` | `workers.groups` × `workers.groupSize` |
//! | launcher pods | `<job>-g<g>-launcher` | `backend: mpi`, once all workers of group `g` are Ready |
//! | Secret | `<job>-ssh` | `backend: mpi`; Ed25519 key, created once |
//! | ConfigMap | `<job>-g<g>-hostfile` | `backend: mpi`; OpenMPI hostfile of group `g` |
//! | PodGroup | `<job>` | `runPolicy.scheduling.gang` (Volcano or scheduler-plugins) |
//!
//! # Progress from the trainer (design)
//!
//! Pods get no Kubernetes RBAC at all. Progress flows the other way: PS replica 0 aggregates the
//! step, epoch, loss, accuracy and throughput that groups push with their updates, and serves it
//! as JSON ([`tandem_api::Progress`]) on an HTTP status endpoint of the PS pod, which requires the
//! job token (`Authorization: Bearer <token>`, the token of the `<job>-token` Secret that the
//! operator created and can read). The operator polls that endpoint of running jobs on its resync
//! and writes `status.progress` — one authenticated read per job per resync, no API writes from
//! pods, no TokenReview round trips. The polling side lands with the trainer's status endpoint;
//! until then `status.progress` stays empty.

pub mod builder;
pub mod controller;
pub mod leader;
pub mod metrics;
pub mod names;
pub mod plan;
pub mod secrets;
pub mod server;
pub mod validate;

pub use controller::{Context, Error, Prepared, Scope};
pub use plan::Settings;
