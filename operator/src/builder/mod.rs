//! Builders: the Kubernetes objects a TrainingJob needs, as pure functions of the validated job.
//!
//! Guarantees: nothing here touches the API server, reads a clock or draws randomness (the job
//! token and SSH keys are inputs), so the same job always builds the same objects, in the same
//! order. Every object carries the job's controller owner reference and the labels of
//! [`tandem_api::names`]. A user's pod template is kept: the operator only adds its container
//! settings, environment, volumes and network presets on top of it.
//!
//! Layout: this module holds the job-wide objects (Service, ConfigMap, token Secret, PodGroup);
//! `pod.rs` builds a pod ([`pod()`]) from the parts its role and its worker backend add
//! (`mpi.rs` for `backend: mpi`, with the SSH Secret and hostfiles); `network.rs` holds the
//! interconnect presets; `user.rs` what a worker running the user's own command
//! (`workers.command`) gets instead of `tandem worker`. A new backend adds a module that returns its parts, not a branch in every
//! step of the pod.

mod mpi;
mod network;
mod pod;
mod user;

use std::collections::BTreeMap;

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{ConfigMap, Secret, Service, ServicePort, ServiceSpec};
use k8s_openapi::api::networking::v1::{
    NetworkPolicy, NetworkPolicyIngressRule, NetworkPolicyPeer, NetworkPolicyPort, NetworkPolicySpec,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::api::{ApiResource, DynamicObject, GroupVersionKind};
use tandem_api::contract;
use tandem_api::{Backend, Endpoint, JobConfig, PodGroupFlavor, Role};

use crate::validate::ValidatedJob;
pub use mpi::{SSH_HOST_CA_KEY, SSH_KNOWN_HOSTS, SSHD_COMMAND, SshKeys, hostfile, known_hosts, ssh_secret};
pub use network::{DEFAULT_RDMA_RESOURCE, EFA_HUGEPAGES, EFA_RESOURCE};
pub use pod::{
    SCHEDULER_PLUGINS_GROUP_LABEL, SCHEDULER_PLUGINS_SCHEDULER, STATUS_PORT_NAME, TRAINER_FS_GROUP,
    VOLCANO_GROUP_ANNOTATION, VOLCANO_SCHEDULER, pod, restart_policy,
};
use tandem_api::names;
pub use user::{MASTER_WAIT, PROGRESS_SIDECAR};

/// Metadata of a child object `name` of `job`: its namespace, labels and owner.
fn meta(job: &ValidatedJob<'_>, name: String, component: &str) -> ObjectMeta {
    ObjectMeta {
        name: Some(name),
        namespace: Some(job.namespace.to_owned()),
        labels: Some(names::child_labels(job.name, component)),
        owner_references: Some(vec![job.owner_reference()]),
        ..ObjectMeta::default()
    }
}

/// The headless Service through which pods find each other (`<pod>.<job>.<ns>.svc`). It
/// publishes pods before they are ready: peers must resolve while a group is still starting.
pub fn service(job: &ValidatedJob<'_>) -> Service {
    let mut ports = vec![
        port(names::PS_PORT_NAME, contract::PS_PORT),
        port(names::WORKER_PORT_NAME, contract::WORKER_PORT),
    ];
    if job.spec.workers.backend == Backend::Mpi {
        ports.push(port(names::SSH_PORT_NAME, names::SSH_PORT));
    }
    Service {
        metadata: meta(job, names::service(job.name), "job"),
        spec: Some(ServiceSpec {
            cluster_ip: Some("None".to_owned()),
            selector: Some(BTreeMap::from([(names::LABEL_JOB.to_owned(), job.name.to_owned())])),
            publish_not_ready_addresses: Some(true),
            ports: Some(ports),
            ..ServiceSpec::default()
        }),
        status: None,
    }
}

fn port(name: &str, port: u16) -> ServicePort {
    ServicePort {
        name: Some(name.to_owned()),
        port: i32::from(port),
        target_port: Some(IntOrString::Int(i32::from(port))),
        protocol: Some("TCP".to_owned()),
        ..ServicePort::default()
    }
}

/// The launch contract's shared part: endpoints of every PS and of every group in the spec, at
/// their pods' host names through the headless Service.
pub fn job_config(job: &ValidatedJob<'_>) -> JobConfig {
    JobConfig::of_spec(job.name, job.namespace, job.spec, |role| {
        let port = match role {
            Role::Ps { .. } => contract::PS_PORT,
            Role::Worker { .. } | Role::Launcher { .. } => contract::WORKER_PORT,
        };
        Endpoint::new(names::pod_host(job.name, job.namespace, role), port)
    })
}

/// Where the operator runs, and who scrapes metrics, for the NetworkPolicy's rules from outside
/// the job.
#[derive(Clone, Debug, PartialEq)]
pub struct OperatorPeer {
    /// The operator's namespace.
    pub namespace: String,
    /// Labels that select the operator's pods in it.
    pub labels: BTreeMap<String, String>,
    /// Who may scrape the metrics port (`--metrics-from`, the chart's
    /// `networkPolicy.metricsFrom`); empty: any source.
    pub metrics_from: Vec<NetworkPolicyPeer>,
}

/// The job's NetworkPolicy (`--network-policy`, the chart's `networkPolicy.enabled`): its pods
/// admit connections from the job's own pods on every port (PS, rendezvous and collectives, SSH
/// for `backend: mpi`), from the operator's pods on the status port only (a PS's, or a user
/// group's progress sidecar's), and from the scrapers of [`OperatorPeer::metrics_from`] (any
/// source when empty) on the metrics port only, which serves no secret; nothing else. It
/// restricts ingress alone, so pods still reach DNS, object stores and the API server.
pub fn network_policy(job: &ValidatedJob<'_>, operator: &OperatorPeer) -> NetworkPolicy {
    let job_pods = LabelSelector {
        match_labels: Some(BTreeMap::from([(names::LABEL_JOB.to_owned(), job.name.to_owned())])),
        ..LabelSelector::default()
    };
    let from_job = NetworkPolicyIngressRule {
        from: Some(vec![NetworkPolicyPeer {
            pod_selector: Some(job_pods.clone()),
            ..NetworkPolicyPeer::default()
        }]),
        ports: None,
    };
    let from_operator = NetworkPolicyIngressRule {
        from: Some(vec![NetworkPolicyPeer {
            namespace_selector: Some(LabelSelector {
                match_labels: Some(BTreeMap::from([(
                    "kubernetes.io/metadata.name".to_owned(),
                    operator.namespace.clone(),
                )])),
                ..LabelSelector::default()
            }),
            pod_selector: Some(LabelSelector {
                match_labels: Some(operator.labels.clone()),
                ..LabelSelector::default()
            }),
            ..NetworkPolicyPeer::default()
        }]),
        ports: Some(vec![NetworkPolicyPort {
            port: Some(IntOrString::Int(i32::from(contract::STATUS_PORT))),
            protocol: Some("TCP".to_owned()),
            ..NetworkPolicyPort::default()
        }]),
    };
    let from_scrapers = NetworkPolicyIngressRule {
        from: (!operator.metrics_from.is_empty()).then(|| operator.metrics_from.clone()),
        ports: Some(vec![NetworkPolicyPort {
            port: Some(IntOrString::Int(i32::from(contract::METRICS_PORT))),
            protocol: Some("TCP".to_owned()),
            ..NetworkPolicyPort::default()
        }]),
    };
    NetworkPolicy {
        metadata: meta(job, names::network_policy(job.name), "job"),
        spec: Some(NetworkPolicySpec {
            pod_selector: Some(job_pods),
            policy_types: Some(vec!["Ingress".to_owned()]),
            ingress: Some(vec![from_job, from_operator, from_scrapers]),
            egress: None,
        }),
    }
}

/// The job ConfigMap: `job.json` holds [`job_config`].
pub fn config_map(job: &ValidatedJob<'_>) -> ConfigMap {
    ConfigMap {
        metadata: meta(job, names::config_map(job.name), "job"),
        data: Some(BTreeMap::from([(contract::CONFIG_FILE.to_owned(), job_config(job).to_json())])),
        ..ConfigMap::default()
    }
}

/// The Secret with the job token every PS connection presents.
pub fn token_secret(job: &ValidatedJob<'_>, token: &str) -> Secret {
    Secret {
        metadata: meta(job, names::token_secret(job.name), "job"),
        type_: Some("Opaque".to_owned()),
        data: Some(BTreeMap::from([(contract::TOKEN_KEY.to_owned(), ByteString(token.as_bytes().to_vec()))])),
        ..Secret::default()
    }
}

/// The PodGroup API of a flavour.
pub fn pod_group_resource(flavor: PodGroupFlavor) -> ApiResource {
    let gvk = match flavor {
        PodGroupFlavor::Volcano => GroupVersionKind::gvk("scheduling.volcano.sh", "v1beta1", "PodGroup"),
        PodGroupFlavor::SchedulerPlugins => {
            GroupVersionKind::gvk("scheduling.x-k8s.io", "v1alpha1", "PodGroup")
        }
    };
    ApiResource::from_gvk_with_plural(&gvk, "podgroups")
}

/// Pods the gang must place together: every PS, and the workers of `workers.minGroups` groups (an
/// elastic job runs with fewer groups than it asks for, never with fewer than that; the rest are
/// placed as they fit). Launchers are left out: they start only after their workers are ready, so
/// counting them would deadlock the gang.
pub fn gang_size(job: &ValidatedJob<'_>) -> u32 {
    let spec = job.spec;
    let workers = spec.workers.min_groups.saturating_mul(spec.workers.group_size);
    spec.parameter_servers.replicas.saturating_add(workers)
}

/// The PodGroup of a gang-scheduled job, in its flavour's schema: Volcano's carries the queue and
/// the priority class; scheduler-plugins' has neither field (its pods carry the priority class).
pub fn pod_group(job: &ValidatedJob<'_>) -> DynamicObject {
    let scheduling = &job.spec.run_policy.scheduling;
    let resource = pod_group_resource(scheduling.pod_group_flavor);
    let mut spec = serde_json::Map::new();
    spec.insert("minMember".to_owned(), gang_size(job).into());
    if scheduling.pod_group_flavor == PodGroupFlavor::Volcano {
        if let Some(queue) = &scheduling.queue {
            spec.insert("queue".to_owned(), queue.clone().into());
        }
        if let Some(priority) = &scheduling.priority_class_name {
            spec.insert("priorityClassName".to_owned(), priority.clone().into());
        }
    }
    let mut object = DynamicObject::new(&names::pod_group(job.name), &resource);
    object.metadata = meta(job, names::pod_group(job.name), "job");
    object.data = serde_json::json!({ "spec": spec });
    object
}
