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
//! | Kueue Workload | `trainingjob-<job>` | `--kueue` and the label `kueue.x-k8s.io/queue-name` ([`kueue`]) |
//! | NetworkPolicy | `<job>` | `--network-policy`: ingress from the job's pods, and the operator's to the status port |
//!
//! Each is adopted only if it carries the job's owner reference; an object of that name owned by
//! anyone else fails the job (`NameConflict`) and is left alone.
//!
//! # Progress from the trainer
//!
//! Pods get no Kubernetes RBAC at all. Progress flows the other way: rank 0 of each worker group
//! reports its step, loss, accuracy and samples to every PS shard; each `tandem ps` serves an
//! HTTP status endpoint on its pod (port `status`, [`tandem_api::contract::STATUS_PORT`] 7072)
//! that requires a proof of the job token (`Authorization: Tandem-HMAC …`, an HMAC of the token of the `<job>-token`
//! Secret that the operator created and can read) and answers a
//! [`tandem_api::contract::PsStatus`]: the most advanced group's progress
//! ([`tandem_api::Progress`]) with the throughput summed over member groups. For every Running job
//! the operator reads PS replica 0 at its pod IP ([`progress`]), at least every
//! [`progress::POLL_EVERY`], and writes `status.progress` with the status patch of the reconcile —
//! one authenticated read per job per poll, no API writes from pods, no TokenReview round trips.
//! A job without parameter servers, or running the user's command, is read the same way from
//! the `tandem progress` sidecar beside its lowest running group's rank 0, which follows the
//! progress lines that rank appends to its group's file.
//! A PS that cannot be reached (starting, restarting, an older image) is logged at debug and
//! leaves the last progress in place; it never fails a reconcile.

pub mod builder;
pub mod controller;
pub mod kueue;
pub mod leader;
pub mod metrics;
pub mod plan;
pub mod progress;
pub mod secrets;
pub mod server;
pub mod validate;

pub use controller::{Context, Error, JobController, Scope};
pub use plan::Settings;
