//! `kubectl tandem status NAME`: the job's phase, conditions, progress and restarts from its
//! status, its pods (role, phase, what a waiting or ended container says) and its latest Events.
//!
//! Caveat: the status carries the job-wide progress (PS 0's view: the latest step, loss and
//! accuracy over all groups), not a step per group, so groups are shown by their pods and restart
//! attempts.

use std::fmt::Write as _;
use std::io::Write;

use k8s_openapi::api::core::v1::{ContainerState, Event, Pod};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, ListParams};
use kube::{Client, ResourceExt};
use tandem_api::{Role, TrainingJob};

use crate::Error;
use crate::job::{self, JobPod};

/// Writes the status of job `name` with its last `events` Events.
pub async fn show(
    client: &Client,
    namespace: &str,
    name: &str,
    events: usize,
    out: &mut (dyn Write + Send),
) -> Result<(), Error> {
    let job = job::find(client, namespace, name).await?;
    let pods = job::pods(client, namespace, name).await?;
    let api: Api<Event> = Api::namespaced(client.clone(), namespace);
    let fields = format!("involvedObject.kind=TrainingJob,involvedObject.name={name}");
    let mut list = api
        .list(&ListParams::default().fields(&fields))
        .await
        .map_err(|e| Error::api(format!("cannot list the Events of TrainingJob {name:?}"), e))?
        .items;
    list.sort_by_key(event_time);
    let skip = list.len().saturating_sub(events);
    out.write_all(render(&job, &pods, &list[skip..], Timestamp::now()).as_bytes())?;
    Ok(())
}

/// The status as text.
fn render(job: &TrainingJob, pods: &[JobPod], events: &[Event], now: Timestamp) -> String {
    let mut s = String::new();
    let spec = &job.spec;
    let status = job.status.clone().unwrap_or_default();
    let phase = status.phase.map_or_else(|| "(none yet)".to_owned(), |p| format!("{p:?}"));
    let namespace = job.namespace().unwrap_or_default();
    let _ = writeln!(s, "TrainingJob {namespace}/{}: {phase}", job.name_any());
    let ps = spec.parameter_servers.replicas;
    let _ = writeln!(
        s,
        "  {}, {} group(s) of {} rank(s) ({}), {ps} parameter server(s)",
        as_written(&spec.training.algorithm),
        spec.workers.groups,
        spec.workers.group_size,
        as_written(&spec.workers.backend)
    );
    match &status.progress {
        Some(p) => {
            let mut line = format!("  progress: step {}, epoch {}", p.step, p.epoch);
            if let Some(loss) = p.loss {
                let _ = write!(line, ", loss {loss:.4}");
            }
            if let Some(accuracy) = p.accuracy {
                let _ = write!(line, ", accuracy {accuracy:.4}");
            }
            if let Some(rate) = p.samples_per_second {
                let _ = write!(line, ", {rate:.1} samples/s");
            }
            if let Some(t) = &status.step_time {
                let _ = write!(line, " (this step since {} ago)", age(t.0, now));
            }
            let _ = writeln!(s, "{line}");
        }
        None if ps == 0 => {
            let _ = writeln!(s, "  progress: not reported (a job without a parameter server reports none)");
        }
        None => {
            let _ = writeln!(s, "  progress: none reported yet");
        }
    }
    let _ = writeln!(s, "  restarts: {} of at most {}", status.restarts, spec.run_policy.max_restarts);
    for unit in &status.attempts {
        let when = unit.last_restart_time.as_ref().map(|t| format!(", last {} ago", age(t.0, now)));
        let _ = writeln!(s, "    {}: attempt {}{}", unit.unit, unit.attempt, when.unwrap_or_default());
    }
    if let (Some(start), end) = (&status.start_time, &status.completion_time) {
        let end = end.as_ref().map(|t| format!(", finished {} ago", age(t.0, now)));
        let _ = writeln!(s, "  started {} ago{}", age(start.0, now), end.unwrap_or_default());
    }

    let _ = writeln!(s, "\nConditions:");
    if status.conditions.is_empty() {
        let _ = writeln!(
            s,
            "  none yet (is the operator running? kubectl get pods -A -l app.kubernetes.io/name=tandem-operator)"
        );
    }
    let rows = status.conditions.iter().map(|c| {
        let since = age(c.last_transition_time.0, now);
        [c.type_.clone(), c.status.clone(), c.reason.clone(), since, c.message.clone()]
    });
    table(&mut s, ["TYPE", "STATUS", "REASON", "SINCE", "MESSAGE"], rows);

    let _ = writeln!(s, "\nPods:");
    if pods.is_empty() {
        let _ = writeln!(s, "  none");
    }
    let rows = pods.iter().map(|p| {
        let (role, group, rank) = match p.role {
            Some(Role::Ps { index }) => (format!("ps-{index}"), String::new(), String::new()),
            Some(Role::Worker { group, rank }) => ("worker".to_owned(), group.to_string(), rank.to_string()),
            Some(Role::Launcher { group }) => ("launcher".to_owned(), group.to_string(), String::new()),
            None => ("?".to_owned(), String::new(), String::new()),
        };
        let restarts: i32 = container_statuses(&p.pod).map(|c| c.restart_count).sum();
        [p.name(), role, group, rank, restarts.to_string(), pod_state(&p.pod)]
    });
    table(&mut s, ["NAME", "ROLE", "GROUP", "RANK", "RESTARTS", "STATE"], rows);

    let _ = writeln!(s, "\nEvents:");
    if events.is_empty() {
        let _ = writeln!(s, "  none");
    }
    let rows = events.iter().map(|e| {
        let when = event_time(e).map_or_else(String::new, |t| age(t, now));
        let count = e.count.filter(|&n| n > 1).map(|n| format!(" (×{n})")).unwrap_or_default();
        let message = e.message.clone().unwrap_or_default();
        [
            when,
            e.type_.clone().unwrap_or_default(),
            e.reason.clone().unwrap_or_default(),
            format!("{message}{count}"),
        ]
    });
    table(&mut s, ["AGE", "TYPE", "REASON", "MESSAGE"], rows);
    s
}

/// A spec value as the manifest spells it (`hybrid`, `tcp`).
fn as_written(value: &impl serde::Serialize) -> String {
    match serde_json::to_value(value) {
        Ok(serde_json::Value::String(s)) => s,
        Ok(other) => other.to_string(),
        Err(_) => String::new(),
    }
}

/// Columns padded to their widest cell, two spaces apart and indented by two; the last column is
/// not padded.
fn table<const N: usize>(s: &mut String, head: [&str; N], rows: impl Iterator<Item = [String; N]>) {
    let rows: Vec<[String; N]> = rows.collect();
    if rows.is_empty() {
        return;
    }
    let mut width = head.map(str::len);
    for row in &rows {
        for (w, cell) in width.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let mut line = |cells: Vec<&str>| {
        let mut text = String::new();
        for (i, cell) in cells.iter().enumerate() {
            if i + 1 == N {
                let _ = write!(text, "  {cell}");
            } else {
                let _ = write!(text, "  {cell:<w$}", w = width[i]);
            }
        }
        let _ = writeln!(s, "{}", text.trim_end());
    };
    line(head.to_vec());
    for row in &rows {
        line(row.iter().map(String::as_str).collect());
    }
}

fn container_statuses(pod: &Pod) -> impl Iterator<Item = &k8s_openapi::api::core::v1::ContainerStatus> {
    pod.status.iter().flat_map(|s| s.container_statuses.iter().flatten())
}

/// The pod's phase with what its container says: the reason it waits (`ImagePullBackOff`), how it
/// ended (exit code and reason), or the scheduler's reason while it is unscheduled.
pub(crate) fn pod_state(pod: &Pod) -> String {
    let status = pod.status.as_ref();
    let phase = status.and_then(|s| s.phase.clone()).unwrap_or_else(|| "Unknown".to_owned());
    if pod.metadata.deletion_timestamp.is_some() {
        return format!("{phase} (terminating)");
    }
    for c in container_statuses(pod) {
        match &c.state {
            Some(ContainerState { waiting: Some(w), .. }) => {
                let reason = w.reason.clone().unwrap_or_default();
                return match &w.message {
                    Some(m) => format!("{phase} ({reason}: {m})"),
                    None => format!("{phase} ({reason})"),
                };
            }
            Some(ContainerState { terminated: Some(t), .. }) => {
                let reason = t.reason.as_deref().map(|r| format!(", {r}")).unwrap_or_default();
                return format!("{phase} (exit code {}{reason})", t.exit_code);
            }
            _ => {}
        }
    }
    let unscheduled = status
        .and_then(|s| s.conditions.as_ref())
        .and_then(|cs| cs.iter().find(|c| c.type_ == "PodScheduled" && c.status == "False"));
    match unscheduled {
        Some(c) => format!(
            "{phase} ({}: {})",
            c.reason.as_deref().unwrap_or("Unscheduled"),
            c.message.as_deref().unwrap_or_default()
        ),
        None => phase,
    }
}

/// When an Event last happened: its series' or last timestamp, else its event time, else when it
/// was created.
fn event_time(e: &Event) -> Option<Timestamp> {
    e.series
        .as_ref()
        .and_then(|s| s.last_observed_time.as_ref().map(|t| t.0))
        .or_else(|| e.last_timestamp.as_ref().map(|t| t.0))
        .or_else(|| e.event_time.as_ref().map(|t| t.0))
        .or_else(|| e.first_timestamp.as_ref().map(|t| t.0))
        .or_else(|| e.metadata.creation_timestamp.as_ref().map(|t| t.0))
}

/// `then` as an age like kubectl's: 45s, 3m, 2h, 4d.
pub(crate) fn age(then: Timestamp, now: Timestamp) -> String {
    let secs = now.as_second().saturating_sub(then.as_second()).max(0);
    match secs {
        s if s < 120 => format!("{s}s"),
        s if s < 2 * 3600 => format!("{}m", s / 60),
        s if s < 2 * 86_400 => format!("{}h", s / 3600),
        s => format!("{}d", s / 86_400),
    }
}
