//! Leader election through a `coordination.k8s.io/v1` Lease, so that only one operator replica
//! reconciles at a time.
//!
//! Expected flow: [`LeaderElector::acquire`] loops until this replica holds the Lease (taking it
//! over only once the holder stopped renewing for a whole lease duration); then
//! [`LeaderElector::renew_until_lost`] renews it every third of the duration and returns when
//! renewal fails past the duration (the caller then stops reconciling); [`LeaderElector::release`]
//! clears the holder on shutdown so a standby takes over at once.
//!
//! Guarantees: every write is a replace carrying the `resourceVersion` read, so two replicas
//! racing for the Lease cannot both win. Caveats: safety relies on clocks advancing at similar
//! rates on all replicas (as in client-go); a replica that loses the Lease stops within one
//! lease duration.

use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::Api;
use kube::api::PostParams;

/// The Lease could not be read or written.
#[derive(Debug, thiserror::Error)]
#[error(
    "leader election Lease {namespace}/{name}: {source}; the operator needs get, create and update on leases in that namespace"
)]
pub struct LeaseError {
    namespace: String,
    name: String,
    #[source]
    source: kube::Error,
}

/// One replica's side of the election.
#[derive(Clone)]
pub struct LeaderElector {
    api: Api<Lease>,
    namespace: String,
    name: String,
    identity: String,
    duration: Duration,
}

impl std::fmt::Debug for LeaderElector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LeaderElector").field("lease", &self.name).field("identity", &self.identity).finish()
    }
}

/// Outcome of one attempt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Attempt {
    /// This replica holds the Lease.
    Leader,
    /// Another replica holds it.
    Standby(String),
}

impl LeaderElector {
    /// An elector for Lease `namespace/name`, as `identity`, with lease `duration`.
    pub fn new(
        client: kube::Client,
        namespace: &str,
        name: &str,
        identity: &str,
        duration: Duration,
    ) -> Self {
        Self {
            api: Api::namespaced(client, namespace),
            namespace: namespace.to_owned(),
            name: name.to_owned(),
            identity: identity.to_owned(),
            duration,
        }
    }

    fn err(&self, source: kube::Error) -> LeaseError {
        LeaseError { namespace: self.namespace.clone(), name: self.name.clone(), source }
    }

    /// One try to take or renew the Lease.
    pub async fn try_acquire(&self) -> Result<Attempt, LeaseError> {
        let now = Timestamp::now();
        let seconds = i32::try_from(self.duration.as_secs()).unwrap_or(i32::MAX);
        let Some(mut lease) = self.api.get_opt(&self.name).await.map_err(|e| self.err(e))? else {
            let lease = Lease {
                metadata: ObjectMeta { name: Some(self.name.clone()), ..ObjectMeta::default() },
                spec: Some(LeaseSpec {
                    holder_identity: Some(self.identity.clone()),
                    lease_duration_seconds: Some(seconds),
                    acquire_time: Some(MicroTime(now)),
                    renew_time: Some(MicroTime(now)),
                    lease_transitions: Some(0),
                    ..LeaseSpec::default()
                }),
            };
            return match self.api.create(&PostParams::default(), &lease).await {
                Ok(_) => Ok(Attempt::Leader),
                Err(kube::Error::Api(e)) if e.code == 409 => {
                    Ok(Attempt::Standby("another replica".to_owned()))
                }
                Err(e) => Err(self.err(e)),
            };
        };
        let spec = lease.spec.get_or_insert_with(LeaseSpec::default);
        let holder = spec.holder_identity.clone().filter(|h| !h.is_empty());
        let renewed = spec.renew_time.as_ref().map(|t| t.0);
        let held_for = SignedDuration::from_secs(i64::from(spec.lease_duration_seconds.unwrap_or(seconds)));
        let expired = renewed.is_none_or(|t| t.checked_add(held_for).ok().is_none_or(|end| end < now));
        match holder {
            Some(h) if h == self.identity => {}
            Some(h) if !expired => return Ok(Attempt::Standby(h)),
            _ => {
                spec.acquire_time = Some(MicroTime(now));
                spec.lease_transitions = Some(spec.lease_transitions.unwrap_or(0) + 1);
            }
        }
        spec.holder_identity = Some(self.identity.clone());
        spec.lease_duration_seconds = Some(seconds);
        spec.renew_time = Some(MicroTime(now));
        match self.api.replace(&self.name, &PostParams::default(), &lease).await {
            Ok(_) => Ok(Attempt::Leader),
            Err(kube::Error::Api(e)) if e.code == 409 => Ok(Attempt::Standby("another replica".to_owned())),
            Err(e) => Err(self.err(e)),
        }
    }

    /// Waits until this replica leads; `on_standby` is told who leads meanwhile.
    pub async fn acquire(&self, mut on_standby: impl FnMut(&str)) {
        loop {
            match self.try_acquire().await {
                Ok(Attempt::Leader) => return,
                Ok(Attempt::Standby(holder)) => on_standby(&holder),
                Err(e) => tracing::warn!(error = %e, "leader election attempt failed"),
            }
            tokio::time::sleep(self.duration / 3).await;
        }
    }

    /// Renews the Lease until renewal has failed for a whole lease duration (or another replica
    /// took it); returns then.
    pub async fn renew_until_lost(&self) {
        let mut last_ok = tokio::time::Instant::now();
        loop {
            tokio::time::sleep(self.duration / 3).await;
            match self.try_acquire().await {
                Ok(Attempt::Leader) => last_ok = tokio::time::Instant::now(),
                Ok(Attempt::Standby(holder)) => {
                    tracing::error!(%holder, "leader Lease taken over by another replica");
                    return;
                }
                Err(e) => tracing::warn!(error = %e, "leader Lease renewal failed"),
            }
            if last_ok.elapsed() > self.duration {
                tracing::error!("leader Lease not renewed for a whole lease duration");
                return;
            }
        }
    }

    /// Gives the Lease up so a standby can take over without waiting for it to expire.
    pub async fn release(&self) -> Result<(), LeaseError> {
        let Some(mut lease) = self.api.get_opt(&self.name).await.map_err(|e| self.err(e))? else {
            return Ok(());
        };
        let Some(spec) = lease.spec.as_mut() else { return Ok(()) };
        if spec.holder_identity.as_deref() != Some(self.identity.as_str()) {
            return Ok(());
        }
        spec.holder_identity = None;
        spec.renew_time = None;
        self.api.replace(&self.name, &PostParams::default(), &lease).await.map_err(|e| self.err(e))?;
        Ok(())
    }
}
