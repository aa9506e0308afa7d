//! The test kit's one error type: each variant names the operation that failed and says what to do.

use std::path::PathBuf;

/// Everything that can go wrong while connecting to or preparing the test control plane.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// `KUBECONFIG` is not set.
    #[error(
        "KUBECONFIG is not set: start the test control plane with `make cluster-up` and run the \
         `export KUBECONFIG=...` line it prints, or run the cluster tests with `make test-cluster`"
    )]
    KubeconfigUnset,
    /// The kubeconfig file could not be read or does not describe a usable cluster.
    #[error("cannot use the kubeconfig {path}: {source}; is the control plane running (`make cluster-up`)?")]
    Kubeconfig {
        path: PathBuf,
        #[source]
        source: kube::config::KubeconfigError,
    },
    /// The client could not be built from the configuration.
    #[error("cannot build a Kubernetes client: {0}")]
    Client(#[source] kube::Error),
    /// The API server did not answer.
    #[error(
        "the API server at {server} does not answer ({source}); start the control plane with \
         `make cluster-up` and export the KUBECONFIG it prints"
    )]
    Unreachable {
        server: String,
        #[source]
        source: kube::Error,
    },
    /// A namespace prefix that cannot start a namespace name.
    #[error(
        "invalid namespace prefix {prefix:?}: {reason}; use 1-40 lowercase letters, digits or '-', \
         starting with a letter"
    )]
    InvalidPrefix { prefix: String, reason: &'static str },
    /// A request to the API server failed; [`Error::api_status`] gives the server's answer.
    #[error("{action}: {source}")]
    Api {
        action: String,
        #[source]
        source: kube::Error,
    },
    /// A file or folder could not be read.
    #[error("cannot read {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// A manifest is not valid YAML or lacks what every Kubernetes object has.
    #[error("{origin}: {problem}")]
    Manifest { origin: String, problem: String },
    /// A folder given to [`crate::TestCluster::install_crds`] holds no CRD.
    #[error("no CustomResourceDefinition found in {0} (looked at *.yaml and *.yml)")]
    NoCrds(PathBuf),
    /// Something did not happen in time.
    #[error("timed out after {seconds} s waiting for {what}")]
    Timeout { what: String, seconds: u64 },
}

impl Error {
    /// The API server's `Status` answer when the server refused a request (e.g. `403 Forbidden`,
    /// `422 Invalid` with the CEL message), `None` for every other failure.
    pub fn api_status(&self) -> Option<&kube::core::Status> {
        match self {
            Error::Api { source: kube::Error::Api(status), .. } => Some(status),
            _ => None,
        }
    }
}
