//! Prometheus metrics of the operator, served at `/metrics`.
//!
//! Families (prefix `tandem_operator_`): `reconcile_duration_seconds` (histogram),
//! `reconciles_total`, `reconcile_errors_total{category}`, `restarts_total{role}`, `stalls_total`
//! (jobs declared stalled, see `runPolicy.stallTimeoutSeconds`) and
//! `jobs{phase}` (a gauge refreshed from the controller's cache on every scrape, so it never
//! drifts from what the API server holds).

use std::sync::Arc;
use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

/// Label of the error counter.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CategoryLabel {
    /// Error category, see [`crate::Error::category`].
    pub category: String,
}

/// Label of the restart counter.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RoleLabel {
    /// `ps`, `worker` or `launcher`.
    pub role: String,
}

/// Label of the jobs gauge.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PhaseLabel {
    /// Job phase (`Pending` before the first status).
    pub phase: String,
}

/// The operator's metrics; cheap to clone.
#[derive(Clone)]
pub struct Metrics {
    /// Wall time of each reconcile.
    pub reconcile_duration: Histogram,
    /// Reconciles run.
    pub reconciles: Counter,
    /// Reconcile errors by category.
    pub errors: Family<CategoryLabel, Counter>,
    /// Unit restarts by the role of the failed pod.
    pub restarts: Family<RoleLabel, Counter>,
    /// Stalls declared (a Running job's step did not advance for its stall timeout).
    pub stalls: Counter,
    /// Jobs by phase.
    pub jobs: Family<PhaseLabel, Gauge>,
    registry: Arc<Registry>,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics").finish_non_exhaustive()
    }
}

impl Default for Metrics {
    fn default() -> Self {
        let reconcile_duration = Histogram::new(exponential_buckets(0.001, 2.0, 16));
        let reconciles = Counter::default();
        let errors = Family::<CategoryLabel, Counter>::default();
        let restarts = Family::<RoleLabel, Counter>::default();
        let stalls = Counter::default();
        let jobs = Family::<PhaseLabel, Gauge>::default();
        let mut registry = Registry::with_prefix("tandem_operator");
        registry.register_with_unit(
            "reconcile_duration",
            "Wall time of one reconcile of a TrainingJob",
            prometheus_client::registry::Unit::Seconds,
            reconcile_duration.clone(),
        );
        registry.register("reconciles", "Reconciles run", reconciles.clone());
        registry.register("reconcile_errors", "Reconcile errors by category", errors.clone());
        registry.register(
            "restarts",
            "Worker-group and PS restarts by role of the failed pod",
            restarts.clone(),
        );
        registry.register(
            "stalls",
            "Stalls declared: a Running job's step did not advance for runPolicy.stallTimeoutSeconds",
            stalls.clone(),
        );
        registry.register("jobs", "TrainingJobs by phase", jobs.clone());
        Self { reconcile_duration, reconciles, errors, restarts, stalls, jobs, registry: Arc::new(registry) }
    }
}

impl Metrics {
    /// Records one finished reconcile.
    pub fn observe(&self, took: Duration, error: Option<&str>) {
        self.reconciles.inc();
        self.reconcile_duration.observe(took.as_secs_f64());
        if let Some(category) = error {
            self.errors.get_or_create(&CategoryLabel { category: category.to_owned() }).inc();
        }
    }

    /// Replaces the jobs-by-phase gauge with `counts`.
    pub fn set_jobs(&self, counts: impl IntoIterator<Item = (&'static str, i64)>) {
        self.jobs.clear();
        for (phase, n) in counts {
            self.jobs.get_or_create(&PhaseLabel { phase: phase.to_owned() }).set(n);
        }
    }

    /// The OpenMetrics text exposition.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exposition_carries_every_family() {
        let m = Metrics::default();
        m.observe(Duration::from_millis(3), Some("apply"));
        m.restarts.get_or_create(&RoleLabel { role: "worker".into() }).inc();
        m.stalls.inc();
        m.set_jobs([("Running", 2), ("Failed", 1)]);
        let text = m.encode();
        for needle in [
            "tandem_operator_reconcile_duration_seconds_bucket",
            "tandem_operator_reconcile_errors_total{category=\"apply\"} 1",
            "tandem_operator_restarts_total{role=\"worker\"} 1",
            "tandem_operator_jobs{phase=\"Running\"} 2",
            "tandem_operator_reconciles_total 1",
            "tandem_operator_stalls_total 1",
        ] {
            assert!(text.contains(needle), "missing {needle} in\n{text}");
        }
    }
}
