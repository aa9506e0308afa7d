//! What can go wrong, each with the next thing to try.

use std::path::PathBuf;

/// A failure of a `kubectl tandem` command.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// No TrainingJob of that name in the namespace.
    #[error("TrainingJob {name:?} not found in namespace {namespace:?}; {}", listing(.namespace, .others))]
    JobNotFound { name: String, namespace: String, others: Vec<String> },
    /// The API server does not serve the TrainingJob resource.
    #[error(
        "the API server does not serve trainingjobs.tandem.dev/v1alpha1: the TrainingJob CRD is not installed in \
         this cluster (install Tandem's chart or deploy/operator.yaml, see the README)"
    )]
    CrdMissing,
    /// The job has no pods to read logs from, or none that matches the selection.
    #[error("{0}")]
    NoPods(String),
    /// The job's status has no training curve.
    #[error("{0}")]
    NoCurve(String),
    /// The output file's extension names no format this tool writes.
    #[error(
        "cannot write {}: the file name must end in .svg or .csv (for PNG, convert the SVG, e.g. rsvg-convert)",
        .0.display()
    )]
    OutputFormat(PathBuf),
    /// Writing the output failed.
    #[error("cannot write {}: {source}", .path.display())]
    Write { path: PathBuf, source: std::io::Error },
    /// Writing to the terminal failed (a closed pipe ends the command quietly in `main`).
    #[error("cannot write the output: {0}")]
    Output(#[from] std::io::Error),
    /// A request to the API server failed: what was being done and the server's (or the
    /// connection's) answer.
    #[error("{what}: {answer}")]
    Api { what: String, answer: String },
}

fn listing(namespace: &str, others: &[String]) -> String {
    if others.is_empty() {
        format!(
            "there are no TrainingJobs in it (kubectl get tj -n {namespace}; other namespaces: kubectl get tj -A)"
        )
    } else {
        format!("the TrainingJobs there are: {} (kubectl get tj -n {namespace})", others.join(", "))
    }
}

impl Error {
    /// An API failure while doing `what`: the server's message, code and reason (not the whole
    /// `Status`), with Forbidden said plainly.
    pub(crate) fn api(what: impl Into<String>, source: kube::Error) -> Self {
        let what = what.into();
        match &source {
            kube::Error::Api(status) if status.code == 403 => Error::Api {
                what: format!(
                    "{what}: your kubeconfig's user is not allowed to (ask for read access to the namespace)"
                ),
                answer: status.message.clone(),
            },
            kube::Error::Api(status) => {
                Error::Api { what, answer: format!("{} ({} {})", status.message, status.code, status.reason) }
            }
            other => Error::Api { what, answer: other.to_string() },
        }
    }
}
