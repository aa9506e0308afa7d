//! Finding a job and what belongs to it: the TrainingJob by name, its pods by the operator's
//! labels, in the order a person reads them (parameter servers, then groups by rank, launchers
//! last in their group).

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams};
use kube::{Client, ResourceExt};
use tandem_api::names;
use tandem_api::{Role, TrainingJob};

use crate::Error;

/// The TrainingJob `name` in `namespace`; when there is none, an error listing the namespace's
/// jobs, or saying that the cluster does not serve TrainingJobs at all.
pub async fn find(client: &Client, namespace: &str, name: &str) -> Result<TrainingJob, Error> {
    let jobs: Api<TrainingJob> = Api::namespaced(client.clone(), namespace);
    let what = || format!("cannot read TrainingJob {name:?} in namespace {namespace:?}");
    match jobs.get_opt(name).await {
        Ok(Some(job)) => return Ok(job),
        Ok(None) => {}
        Err(e) => return Err(not_served(e).unwrap_or_else(|e| Error::api(what(), e))),
    }
    let list = jobs.list_metadata(&ListParams::default()).await.map_err(|e| {
        not_served(e).unwrap_or_else(|e| Error::api(format!("cannot list TrainingJobs in {namespace:?}"), e))
    })?;
    let mut others: Vec<String> = list.items.iter().map(|j| j.name_any()).collect();
    others.sort();
    Err(Error::JobNotFound { name: name.to_owned(), namespace: namespace.to_owned(), others })
}

/// A 404 on a list (or anything but a named object) means the CRD is not installed.
fn not_served(e: kube::Error) -> Result<Error, kube::Error> {
    match &e {
        kube::Error::Api(status) if status.code == 404 => Ok(Error::CrdMissing),
        _ => Err(e),
    }
}

/// A pod of the job with the role its labels give.
#[derive(Debug)]
pub struct JobPod {
    /// The pod's role; `None` for a pod that carries the job's label but no role the operator sets.
    pub role: Option<Role>,
    /// The pod.
    pub pod: Pod,
}

impl JobPod {
    /// The pod's name.
    pub fn name(&self) -> String {
        self.pod.name_any()
    }

    /// The worker group the pod belongs to (workers and launchers).
    pub fn group(&self) -> Option<u32> {
        match self.role? {
            Role::Worker { group, .. } | Role::Launcher { group } => Some(group),
            Role::Ps { .. } => None,
        }
    }

    /// The pod's rank in its group (workers).
    pub fn rank(&self) -> Option<u32> {
        match self.role? {
            Role::Worker { rank, .. } => Some(rank),
            _ => None,
        }
    }

    fn order(&self) -> (u8, u32, u32, String) {
        let name = self.name();
        match self.role {
            Some(Role::Ps { index }) => (0, index, 0, name),
            Some(Role::Worker { group, rank }) => (1, group, rank, name),
            Some(Role::Launcher { group }) => (1, group, u32::MAX, name),
            None => (2, 0, 0, name),
        }
    }
}

/// Every pod labelled as job `name`'s (`tandem.dev/job-name`), parameter servers first, then each
/// group's ranks and launcher.
pub async fn pods(client: &Client, namespace: &str, name: &str) -> Result<Vec<JobPod>, Error> {
    let api: Api<Pod> = Api::namespaced(client.clone(), namespace);
    let selector = format!("{}={name}", names::LABEL_JOB);
    let list = api
        .list(&ListParams::default().labels(&selector))
        .await
        .map_err(|e| Error::api(format!("cannot list the pods of TrainingJob {name:?} ({selector})"), e))?;
    let mut pods: Vec<JobPod> =
        list.items.into_iter().map(|pod| JobPod { role: names::role_of(pod.labels()), pod }).collect();
    pods.sort_by_key(JobPod::order);
    Ok(pods)
}
